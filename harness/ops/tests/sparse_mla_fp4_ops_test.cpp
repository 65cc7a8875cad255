// sparse_mla_fp4 on the CPU: every smoke/quick case builds and its reference is finite where a
// row has keys; the budgets pass the reference rounded to the output dtype and fail CPU
// emulations of the kernel mutants (kernels_under_test/sparse_mla_fp4.mutants) on the cases their
// regexes name, so the quick tier can kill each of them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <regex>
#include <set>
#include <vector>

#include "core/fp4.h"
#include "core/numeric.h"
#include "ops/op.h"
#include "reference/sparse_mla_fp4.h"
#include "run/cases.h"
#include "run/evaluate.h"
#include "run/provenance.h"

namespace attncheck {
namespace {

namespace rec = ref::fp4_record;

const Op& op() {
  const Op* o = find_op("sparse_mla_fp4");
  if (!o) throw std::runtime_error("sparse_mla_fp4 not registered");
  return *o;
}

std::vector<Case> quick_cases() {
  const CaseFile f = load_case_file(default_root() + "/cases/sparse_mla_fp4.toml");
  std::vector<Case> all;
  std::set<std::string> ids;
  for (const char* tier : {"smoke", "quick"})
    for (const Case& c : f.tiers.at(tier))
      if (ids.insert(c.id).second) all.push_back(c);
  return all;
}

enum class Bug {
  none,
  nibble_swap,
  scale_wrong_block,
  e8m0_zero_byte,
  interleaved_record,
  e4m3_subnormal_as_normal
};

// The cache decoded as a kernel with `bug` reads it.
Tensor decode_with(const Tensor& cache, rec::Format f, Bug bug) {
  const int64_t pages = cache.size(0), P = cache.size(1), block = rec::block_elems(f),
                blocks = rec::scale_bytes(f), rb = rec::record_bytes(f);
  Tensor out = Tensor::empty(DType::f64, {pages, P, rec::kDims});
  auto* dst = reinterpret_cast<double*>(out.data());
  for (int64_t g = 0; g < pages; ++g) {
    const auto* base = reinterpret_cast<const uint8_t*>(cache.element_ptr(Index{g, 0, 0}));
    for (int64_t t = 0; t < P; ++t)
      for (int64_t i = 0; i < rec::kDims; ++i) {
        int64_t b = i / block;
        if (bug == Bug::scale_wrong_block) b = (b + 1) % blocks;
        const bool aos = bug == Bug::interleaved_record;
        const uint8_t byte = base[aos ? t * rb + i / 2 : rec::data_offset(t, i / 2)];
        const uint8_t sb = base[aos ? t * rb + rec::kDataBytes + b : rec::scale_offset(f, P, t, b)];
        const int nib = static_cast<int>(i % 2) ^ (bug == Bug::nibble_swap ? 1 : 0);
        double scale = 0;
        if (f == rec::Format::mxfp4) {
          scale = bug == Bug::e8m0_zero_byte && sb == 0 ? 0.0 : fp4::e8m0_decode(sb);
        } else if (bug == Bug::e4m3_subnormal_as_normal && (sb & 0x78) == 0) {
          scale = (1.0 + (sb & 7) / 8.0) * std::ldexp(1.0, -6);
        } else {
          scale = fp8_decode(sb, DType::e4m3fn);
        }
        dst[(g * P + t) * rec::kDims + i] = fp4::e2m1_decode(fp4::unpack_nibble(byte, nib)) * scale;
      }
  }
  return out;
}

// What a kernel with `bug` returns, rounded as the kernel stores it. Large offsets: the pages the
// host holds (from page `first`), slots made relative to them; far_rows (q on a sparse storage):
// the last token only, as the reference sees it.
TensorMap kernel_emulation(const Problem& p, rec::Format f, Bug bug) {
  const bool far = p.arg("q").storage()->sparse();
  auto token_rows = [&](const char* name) {
    const Tensor& t = p.arg(name);
    return far ? t.slice(0, t.size(0) - 1, t.size(0)) : t;
  };
  const Tensor q = token_rows("q");
  const Tensor& cache = p.arg("kv_cache");
  const Tensor held = cache.held_rows();
  const int64_t P = cache.size(1), first = (held.offset() - cache.offset()) / cache.stride(0);
  auto idx = ref::sparse_mla_pack(ref::sparse_mla_global_indices(
      token_rows("topk_indices"), token_rows("req_id_per_token"), p.arg("block_table"), P));
  for (int64_t i = 0; i < idx.indices.numel(); ++i)
    idx.indices.at<int32_t>({i}) -= static_cast<int32_t>(first * P);
  const double scale = p.kernel_params.at("scale").get<double>();
  const auto r = ref::sparse_mla(q, {decode_with(held, f, bug), 1.0}, idx, scale, rec::kDims);
  return {{"out", r.out.to(q.dtype()).to(DType::f64)},
          {"lse", r.lse.to(DType::f32).to(DType::f64)}};
}

bool all_pass(const std::vector<CheckResult>& r) {
  for (const auto& c : r)
    if (!c.passed) return false;
  return !r.empty();
}

rec::Format format_of(const Case& c) {
  return c.id.find("-mxfp4-") != std::string::npos ? rec::Format::mxfp4 : rec::Format::nvfp4;
}

TEST(SparseMlaFp4Ops, QuickCasesPassTheRoundedReferenceAndKillEveryMutant) {
  const Op& o = op();
  struct Mutant {
    Bug bug;
    const char* name;
    std::regex targets;
    int killed = 0;
  };
  std::vector<Mutant> mutants = {
      {Bug::nibble_swap, "nibble_swap", std::regex("^sparse_mla_fp4/")},
      {Bug::scale_wrong_block, "scale_wrong_block", std::regex("^sparse_mla_fp4/")},
      {Bug::e8m0_zero_byte, "e8m0_zero_byte", std::regex("^sparse_mla_fp4/.*-mxfp4-.*-sctiny")},
      {Bug::interleaved_record, "interleaved_record", std::regex("^sparse_mla_fp4/.*-bs(16|64)-")},
      {Bug::e4m3_subnormal_as_normal, "e4m3_subnormal",
       std::regex("^sparse_mla_fp4/.*-nvfp4-.*-sctiny")},
  };
  int refused = 0;
  for (const Case& c : quick_cases()) {
    const Problem p = o.make(c);
    if (p.expect_refusal) {
      ++refused;
      continue;
    }
    const TensorMap expected = o.reference(p);
    const Tensor& lse = expected.at("lse");
    const Tensor& out = expected.at("out");
    for (int64_t t = 0; t < lse.size(0); ++t)
      for (int64_t h = 0; h < lse.size(1); ++h) {
        const double l = lse.at<double>({t, h});
        ASSERT_TRUE(std::isfinite(l) || l == -INFINITY) << c.id << " lse " << t << " " << h;
        for (int64_t d = 0; d < rec::kDims; ++d)
          ASSERT_TRUE(std::isfinite(out.at<double>({t, h, d}))) << c.id;
      }
    const auto checks = o.checks(p, expected);
    const auto good = check_outputs(checks, expected, kernel_emulation(p, format_of(c), Bug::none));
    EXPECT_TRUE(all_pass(good)) << c.id << ": " << good.at(0).message;
    for (auto& m : mutants) {
      if (!std::regex_search(c.id, m.targets)) continue;
      if (!all_pass(check_outputs(checks, expected, kernel_emulation(p, format_of(c), m.bug))))
        ++m.killed;
    }
  }
  EXPECT_EQ(refused, 1);
  for (const auto& m : mutants) EXPECT_GT(m.killed, 0) << m.name << " survives the quick tier";
}

}  // namespace
}  // namespace attncheck

namespace attncheck {
namespace {

// The writer op: its reference writes exactly the mapped records (every other byte kept), each
// written record decodes close to its row, and every writer mutant changes a byte somewhere in the
// cases its regex names (so the bitwise check kills it): some nvfp4 scale rounds up (truncation
// differs), an nvfp4 extreme case has a zero block (the floor matters), neighbouring scales differ
// (wrong block), some byte holds two different nibbles (swap) and, at block size > 1, some record
// sits in a token other than the page's first (interleaved layout).
TEST(SparseMlaFp4Ops, WriterQuickCasesMakeEveryWriterMutantVisible) {
  const Op* o = find_op("sparse_mla_fp4_k_cache");
  ASSERT_NE(o, nullptr);
  const CaseFile f = load_case_file(default_root() + "/cases/sparse_mla_fp4_k_cache.toml");
  bool rounds_up = false, zero_block = false, scales_differ = false, nibbles_differ = false,
       later_token = false;
  std::set<std::string> seen;
  for (const char* tier : {"smoke", "quick"})
    for (const Case& c : f.tiers.at(tier)) {
      if (!seen.insert(c.id).second) continue;
      const Problem p = o->make(c);
      // The pages the host holds (a large-offset cache: from page `first`), which the reference
      // returns; slots are made relative to them.
      const Tensor& full = p.arg("kv_cache");
      const Tensor before = full.held_rows();
      const Tensor after = o->reference(p).at("kv_cache");
      const rec::Format fmt = format_of(c);
      const int64_t P = before.size(1);
      const int64_t first = (before.offset() - full.offset()) / full.stride(0);
      const Tensor& slots = p.arg("slot_mapping");
      std::set<int64_t> written;
      for (int64_t i = 0; i < slots.size(0); ++i)
        if (slots.at<int64_t>({i}) >= 0) written.insert(slots.at<int64_t>({i}) - first * P);
      for (int64_t g = 0; g < before.size(0); ++g)
        for (int64_t t = 0; t < P; ++t) {
          if (written.count(g * P + t)) continue;
          const auto* b = reinterpret_cast<const uint8_t*>(before.element_ptr(Index{g, 0, 0}));
          const auto* a = reinterpret_cast<const uint8_t*>(after.element_ptr(Index{g, 0, 0}));
          for (int64_t c2 = 0; c2 < rec::kDataBytes; ++c2)
            ASSERT_EQ(a[rec::data_offset(t, c2)], b[rec::data_offset(t, c2)]) << c.id;
          for (int64_t s = 0; s < rec::scale_bytes(fmt); ++s)
            ASSERT_EQ(a[rec::scale_offset(fmt, P, t, s)], b[rec::scale_offset(fmt, P, t, s)]);
        }
      std::vector<double> y(rec::kDims);
      for (int64_t i = 0; i < slots.size(0); ++i) {
        if (slots.at<int64_t>({i}) < 0) continue;
        const int64_t s = slots.at<int64_t>({i}) - first * P;
        later_token |= P > 1 && s % P > 0;
        rec::read_record(after, fmt, s / P, s % P, y.data());
        const auto* page = reinterpret_cast<const uint8_t*>(after.element_ptr(Index{s / P, 0, 0}));
        for (int64_t b = 0; b < rec::scale_bytes(fmt); ++b) {
          const int64_t blk = rec::block_elems(fmt);
          double amax = 0;
          for (int64_t d = b * blk; d < (b + 1) * blk; ++d)
            amax = std::max(amax, std::fabs(p.arg("kv").get({i, d})));
          const uint8_t sb = page[rec::scale_offset(fmt, P, s % P, b)];
          if (fmt == rec::Format::nvfp4) {
            rounds_up |= fp8_decode(sb, DType::e4m3fn) > amax / 6 && amax / 6 > 0.01;
            zero_block |= amax == 0 && c.id.find("-vextreme") != std::string::npos;
          }
          scales_differ |=
              sb != page[rec::scale_offset(fmt, P, s % P, (b + 1) % rec::scale_bytes(fmt))];
          const double scale =
              fmt == rec::Format::nvfp4 ? fp8_decode(sb, DType::e4m3fn) : fp4::e8m0_decode(sb);
          for (int64_t d = b * blk; d < (b + 1) * blk; ++d) {
            const double x = p.arg("kv").get({i, d});
            const double bound =
                std::max({0.25 * scale, std::fabs(x) / 4, std::fabs(x) - 6 * scale});
            ASSERT_LE(std::fabs(x - y[static_cast<size_t>(d)]), bound * (1 + 1e-12)) << c.id;
          }
        }
        for (int64_t c2 = 0; c2 < rec::kDataBytes; ++c2) {
          const uint8_t byte = page[rec::data_offset(s % P, c2)];
          nibbles_differ |= (byte & 0xF) != (byte >> 4);
        }
      }
    }
  EXPECT_TRUE(rounds_up);
  EXPECT_TRUE(zero_block);
  EXPECT_TRUE(scales_differ);
  EXPECT_TRUE(nibbles_differ);
  EXPECT_TRUE(later_token);
}

}  // namespace
}  // namespace attncheck
