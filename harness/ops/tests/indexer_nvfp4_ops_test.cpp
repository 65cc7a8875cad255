// The indexer_mxfp4 ops with format = nvfp4 on the CPU: the quick cases' budgets pass the
// reference and fail CPU emulations of the four nvfp4 mutants (kernels_under_test/
// indexer_mxfp4.mutants) on the cases their regexes name, so the quick tier can kill each of them.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <regex>
#include <set>
#include <vector>

#include "core/fp4.h"
#include "core/numeric.h"
#include "ops/op.h"
#include "reference/indexer_mxfp4.h"
#include "run/cases.h"
#include "run/evaluate.h"
#include "run/provenance.h"

namespace attncheck {
namespace {

namespace mx = ref::mxfp4;

std::vector<Case> nvfp4_cases(const std::string& op) {
  const CaseFile f = load_case_file(default_root() + "/cases/" + op + ".toml");
  std::vector<Case> out;
  std::set<std::string> ids;
  for (const char* tier : {"smoke", "quick"})
    for (const Case& c : f.tiers.at(tier))
      if (c.id.find("-nvfp4") != std::string::npos && ids.insert(c.id).second) out.push_back(c);
  return out;
}

const Op& op(const char* name) {
  const Op* o = find_op(name);
  if (!o) throw std::runtime_error(std::string(name) + " not registered");
  return *o;
}

mx::CacheGeometry geometry_of(const Problem& p, int64_t head_dim) {
  const Tensor& cache = p.arg("kv_cache");
  EXPECT_EQ(p.kernel_params.at("format"), "nvfp4");
  return {head_dim, cache.size(1), 0, mx::KeyFormat::nvfp4,
          p.kernel_params.at("global_scale").get<float>()};
}

// A copy of the cache (same strides, its own storage).
Tensor copy_of(const Tensor& cache) {
  return cache.rebased(std::make_shared<Storage>(*cache.storage()));
}

uint8_t* page_bytes(const Tensor& cache, int64_t page) {
  return reinterpret_cast<uint8_t*>(cache.element_ptr(Index{page, 0, 0}));
}

bool all_pass(const std::vector<CheckResult>& r) {
  for (const auto& c : r)
    if (!c.passed) return false;
  return !r.empty();
}

// ---- the logits reader ----

enum class ReaderBug { none, global_twice, wrong_block };

// What a reader with `bug` returns: the reference over the cache as that reader sees it.
TensorMap reader_emulation(const Problem& p, ReaderBug bug) {
  const int64_t D = 2 * p.arg("q").size(3);
  mx::CacheGeometry g = geometry_of(p, D);
  Tensor cache = p.arg("kv_cache");
  if (bug == ReaderBug::global_twice) g.global_scale = g.global_scale * g.global_scale;
  if (bug == ReaderBug::wrong_block) {  // element d scaled by scale[d / 32], not scale[d / 16]
    cache = copy_of(cache);
    for (int64_t page = 0; page < cache.size(0); ++page)
      for (int64_t t = 0; t < g.page_size; ++t) {
        uint8_t* base = page_bytes(cache, page);
        for (int64_t s = g.scale_count() - 1; s >= 0; --s)
          base[mx::scale_offset(g, t, s)] = base[mx::scale_offset(g, t, s / 2)];
      }
  }
  const Tensor logits =
      mx::paged_logits(p.arg("q"), p.arg("q_scale"), cache, g, p.arg("weights"),
                       p.arg("context_lens"), p.arg("block_table"), p.arg("logits").size(1));
  return {{"logits", logits}};
}

TEST(IndexerNvfp4Ops, LogitsQuickCasesPassTheReferenceAndKillTheReaderMutants) {
  const Op& o = op("indexer_mxfp4_logits_decode");
  struct Mutant {
    ReaderBug bug;
    const char* name;
    std::regex targets;
    int killed = 0;
    int targeted = 0;
  };
  std::vector<Mutant> mutants = {
      {ReaderBug::global_twice, "nvfp4_global_scale_twice",
       std::regex("^indexer_mxfp4_logits_decode/.*-nvfp4")},
      {ReaderBug::wrong_block, "nvfp4_scale_wrong_block",
       std::regex("^indexer_mxfp4_logits_decode/.*-nvfp4")},
  };
  const std::vector<Case> cases = nvfp4_cases("indexer_mxfp4_logits_decode");
  ASSERT_GE(cases.size(), 8u);
  for (const Case& c : cases) {
    const Problem p = o.make(c);
    ASSERT_FALSE(p.expect_refusal) << c.id << ": " << p.expect_refusal.value_or("");
    const TensorMap expected = o.reference(p);
    const auto checks = o.checks(p, expected);
    const auto good = check_outputs(checks, expected, reader_emulation(p, ReaderBug::none));
    EXPECT_TRUE(all_pass(good)) << c.id << ": " << good.at(0).message;
    for (auto& m : mutants)
      if (std::regex_search(c.id, m.targets) && ++m.targeted > 0 &&
          !all_pass(check_outputs(checks, expected, reader_emulation(p, m.bug))))
        ++m.killed;
  }
  for (const auto& m : mutants) {
    EXPECT_GT(m.killed, 0) << m.name << " survives the quick tier";
    std::cout << m.name << ": killed by " << m.killed << " of " << m.targeted << " cases\n";
  }
}

// ---- the K cache writer ----

enum class WriterBug { global_missing, scale_truncated };

// e4m3fn of v >= 0 rounded toward zero, saturating at 448: the largest byte not above v.
uint8_t e4m3_truncated(double v) {
  uint8_t best = 0;
  for (int b = 1; b <= 0x7E; ++b)
    if (fp8_decode(static_cast<uint8_t>(b), DType::e4m3fn) <= v) best = static_cast<uint8_t>(b);
  return best;
}

// The cache a writer with `bug` leaves: every mapped slot rewritten from its k row.
TensorMap writer_emulation(const Problem& p, WriterBug bug) {
  const Tensor& k = p.arg("k");
  const Tensor& slots = p.arg("slot_mapping");
  mx::CacheGeometry g = geometry_of(p, k.size(1));
  if (bug == WriterBug::global_missing) {
    g.global_scale = 1.0f;  // the reference writer with the global scale left out
    return {
        {"kv_cache", mx::write_k_cache(p.arg("kv_cache"), k, slots, g, fp4::MxScaleRule::ceil)}};
  }
  Tensor cache = copy_of(p.arg("kv_cache"));
  const int64_t D = g.head_dim, B = fp4::kNvfp4Block;
  const double gs = g.global_scale;
  for (int64_t i = 0; i < slots.size(0); ++i) {
    const int64_t slot = slots.at<int64_t>({i});
    if (slot < 0) continue;
    uint8_t* base = page_bytes(cache, slot / g.page_size);
    const int64_t t = slot % g.page_size;
    for (int64_t b = 0; b < D / B; ++b) {
      double amax = 0;
      for (int64_t d = b * B; d < (b + 1) * B; ++d)
        amax = std::fmax(amax, std::fabs(k.get({i, d})));
      const uint8_t byte = e4m3_truncated(amax / (6.0 * gs));
      const double step = fp8_decode(byte, DType::e4m3fn) * gs;
      base[mx::scale_offset(g, t, b)] = byte;
      for (int64_t d = b * B; d < (b + 1) * B; d += 2) {
        const uint8_t lo = step == 0 ? 0 : fp4::e2m1_encode(k.get({i, d}) / step);
        const uint8_t hi = step == 0 ? 0 : fp4::e2m1_encode(k.get({i, d + 1}) / step);
        base[mx::value_offset(g, t, d / 2)] = fp4::pack_nibbles(lo, hi);
      }
    }
  }
  return {{"kv_cache", cache}};
}

TEST(IndexerNvfp4Ops, KCacheQuickCasesKillTheWriterMutants) {
  const Op& o = op("indexer_mxfp4_k_cache");
  struct Mutant {
    WriterBug bug;
    const char* name;
    std::regex targets;
    int killed = 0;
    int targeted = 0;
  };
  std::vector<Mutant> mutants = {
      {WriterBug::global_missing, "nvfp4_global_scale_missing",
       std::regex("^indexer_mxfp4_k_cache/.*-nvfp4")},
      {WriterBug::scale_truncated, "nvfp4_e4m3_scale_truncated",
       std::regex("^indexer_mxfp4_k_cache/.*-nvfp4")},
  };
  const std::vector<Case> cases = nvfp4_cases("indexer_mxfp4_k_cache");
  ASSERT_GE(cases.size(), 8u);
  bool saturated = false, zero_scale = false, subnormal_scale = false;
  for (const Case& c : cases) {
    const Problem p = o.make(c);
    ASSERT_FALSE(p.expect_refusal) << c.id << ": " << p.expect_refusal.value_or("");
    // A large-offset cache (offset_log2) holds its pages past byte 2^32 only: the emulation
    // below writes whole caches, and the offset itself is what that case tests
    // (storage_offset_test.cpp, Issue37Axes.WritersReadOneFarTokenIntoFarPages).
    if (p.arg("kv_cache").storage()->sparse()) continue;
    const TensorMap expected = o.reference(p);
    const auto checks = o.checks(p, expected);
    EXPECT_TRUE(all_pass(check_outputs(checks, expected, expected))) << c.id;
    // The scale bytes the quick tier writes: 448, 0 and subnormals all occur.
    const mx::CacheGeometry g = geometry_of(p, p.arg("k").size(1));
    const Tensor& slots = p.arg("slot_mapping");
    for (int64_t i = 0; i < slots.size(0); ++i) {
      const int64_t slot = slots.at<int64_t>({i});
      if (slot < 0) continue;
      const uint8_t* base = page_bytes(expected.at("kv_cache"), slot / g.page_size);
      for (int64_t s = 0; s < g.scale_count(); ++s) {
        const uint8_t byte = base[mx::scale_offset(g, slot % g.page_size, s)];
        saturated |= byte == 0x7E;
        zero_scale |= byte == 0;
        subnormal_scale |= byte > 0 && byte < 8;
      }
    }
    for (auto& m : mutants)
      if (std::regex_search(c.id, m.targets) && ++m.targeted > 0 &&
          !all_pass(check_outputs(checks, expected, writer_emulation(p, m.bug))))
        ++m.killed;
  }
  EXPECT_TRUE(saturated);
  EXPECT_TRUE(zero_scale);
  EXPECT_TRUE(subnormal_scale);
  for (const auto& m : mutants) {
    EXPECT_GT(m.killed, 0) << m.name << " survives the quick tier";
    std::cout << m.name << ": killed by " << m.killed << " of " << m.targeted << " cases\n";
  }
}

}  // namespace
}  // namespace attncheck
