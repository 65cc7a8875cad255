// Issue 14's detection cases of the paged ops (mla_decode, sparse_mla, kv_gather, the indexer
// cache, gather and logits, page_indices), on the CPU:
//   - large offsets: every quick-tier case's blocks lie past byte 2^31 / 2^32 of a sparse cache
//   whose
//     host window holds only them, their element offsets pass 2^31 (what the *_offset_int32 mutants
//     need), the reference reads nothing else (pointing a table entry elsewhere throws), each case
//     costs at most a few seconds, and a repro bundle holds the window;
//   - fp8 special codes: the saturation codes, -0 and NaN codes sit where docs/formats.md says, and
//   a
//     dequant exact only on ordinary codes (the *_fp8_ordinary_only mutants, emulated by remapping
//     the input codes and running the reference) fails every special case while passing the same
//     case with ordinary codes;
//   - page_indices: block ids up to 2^31 / K - 1 expand exactly, one past is refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>

#include "core/hdf5io.h"
#include "core/numeric.h"
#include "ops/op.h"
#include "reference/indexer.h"
#include "reference/page_indices.h"
#include "reference/sparse_mla.h"
#include "run/cases.h"
#include "run/evaluate.h"
#include "run/provenance.h"
#include "run/results.h"

namespace attncheck {
namespace {

namespace ix = ref::indexer;

const Op& op(const std::string& name) {
  const Op* o = find_op(name);
  if (!o) throw std::runtime_error(name + " not registered");
  return *o;
}

std::vector<Case> quick_cases(const std::string& name) {
  return load_case_file(default_root() + "/cases/" + name + ".toml").tiers.at("quick");
}

bool passes(const Op& o, const Problem& p, const TensorMap& expected, const TensorMap& actual,
            std::string* why = nullptr) {
  bool ok = true;
  for (const auto& r : check_outputs(o.checks(p, expected), expected, actual)) {
    ok = ok && r.passed;
    if (why && !r.passed) *why += r.name + ": " + r.message + "\n";
  }
  return ok;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---------------------------------------------------------------------------------------------
// Large offsets

// The caches of each op and what names the block ids its problems use.
struct PagedOp {
  std::string name;
  std::vector<std::string> caches;
  std::string table;  // int32 block table (entries < 0 are fillers), or "" for slot_mapping
};
const std::vector<PagedOp>& paged_ops() {
  static const std::vector<PagedOp> ops = {
      {"mla_decode", {"kv_cache"}, "block_table"},
      {"sparse_mla", {"kv_cache"}, "block_table"},
      {"kv_gather", {"key_cache", "value_cache"}, "block_tables"},
      {"indexer_k_cache", {"kv_cache"}, ""},
      {"indexer_gather", {"kv_cache"}, "block_table"},
      {"indexer_logits_decode", {"kv_cache"}, "block_table"},
  };
  return ops;
}

// Block ids a problem uses: the table's entries >= 0, or slot_mapping's pages.
std::vector<int64_t> block_ids(const PagedOp& po, const Problem& p) {
  std::vector<int64_t> ids;
  if (po.table.empty()) {
    const Tensor& slots = p.arg("slot_mapping");
    const int64_t bs = p.arg("kv_cache").size(1);
    for (int64_t i = 0; i < slots.size(0); ++i)
      if (slots.at<int64_t>({i}) >= 0) ids.push_back(slots.at<int64_t>({i}) / bs);
    return ids;
  }
  const Tensor& t = p.arg(po.table);
  t.for_each_index([&](const Index& idx, int64_t) {
    if (t.at<int32_t>(idx) >= 0) ids.push_back(t.at<int32_t>(idx));
  });
  return ids;
}

TEST(LargeOffsets, QuickCasesHoldOnlyBlocksPastTheOffset) {
  for (const PagedOp& po : paged_ops()) {
    const Op& o = op(po.name);
    std::set<int64_t> offsets_seen;
    for (const Case& c : quick_cases(po.name)) {
      const int64_t log2 = c.params.at("offset_log2").get<int64_t>();
      if (log2 == 0) continue;
      offsets_seen.insert(log2);
      EXPECT_NE(c.id.find("-offlog" + std::to_string(log2)), std::string::npos) << c.id;
      const auto t0 = std::chrono::steady_clock::now();
      const Problem p = o.problem(c);
      const auto ids = block_ids(po, p);
      ASSERT_FALSE(ids.empty()) << c.id;
      for (const std::string& name : po.caches) {
        const Tensor& cache = p.arg(name);
        const Storage& st = *cache.storage();
        ASSERT_TRUE(st.sparse()) << c.id << " " << name;
        EXPECT_GT(st.size(), uint64_t{1} << log2) << c.id;
        EXPECT_LT(st.bytes.size(), size_t{4} << 20) << c.id << ": the blocks read, not the extent";
        const auto es = static_cast<int64_t>(cache.element_size());
        for (int64_t id : ids) {
          // Byte offset past 2^log2, and element offset past 2^31: an int32 element offset wraps.
          ASSERT_GT(id * cache.stride(0) * es, int64_t{1} << log2) << c.id << " block " << id;
          ASSERT_GT(id * cache.stride(0), int64_t{INT32_MAX}) << c.id << " block " << id;
        }
      }
      // The reference reads the held blocks only (anything else throws) and its outputs pass
      // their own checks.
      const TensorMap expected = o.reference(p);
      EXPECT_TRUE(passes(o, p, expected, expected)) << c.id;
      const double s = seconds_since(t0);
      std::printf("%-100s make + reference + budgets %.2f s, host cache bytes %zu\n", c.id.c_str(),
                  s, p.arg(po.caches[0]).storage()->bytes.size());
      EXPECT_LT(s, 5.0) << c.id;
    }
    EXPECT_EQ(offsets_seen, (std::set<int64_t>{31, 32}))
        << po.name << ": quick needs 2^31 and 2^32";
  }
}

// Pointing one used table entry (or slot) at block 0, which the host does not hold, makes the
// reference throw: it reads the blocks the requests use and nothing else.
TEST(LargeOffsets, TheReferenceReadsOnlyTheHeldBlocks) {
  for (const PagedOp& po : paged_ops()) {
    const Op& o = op(po.name);
    for (const Case& c : quick_cases(po.name)) {
      if (c.params.at("offset_log2").get<int64_t>() == 0) continue;
      const Problem p = o.problem(c);
      if (po.table.empty()) {
        const Tensor& slots = p.arg("slot_mapping");
        for (int64_t i = 0; i < slots.size(0); ++i)
          if (slots.at<int64_t>({i}) >= 0) {
            slots.at<int64_t>({i}) = 0;
            break;
          }
      } else {
        const Tensor& t = p.arg(po.table);
        t.at<int32_t>({t.size(0) - 1, 0}) = 0;  // the last request is the longest
      }
      EXPECT_THROW((void)o.reference(p), std::out_of_range) << c.id;
      break;  // one case per op
    }
  }
}

// A repro bundle of a large-offset case holds the host window of each sparse storage, flat, and
// says so in the layout attribute; it reads back cleanly.
TEST(LargeOffsets, ReproBundlesHoldTheHostWindow) {
  const Op& o = op("mla_decode");
  Case c;
  for (const Case& q : quick_cases("mla_decode"))
    if (q.params.at("offset_log2").get<int64_t>() == 32) c = q;
  ASSERT_FALSE(c.id.empty());
  CaseArtifacts a;
  a.present = true;
  a.problem = o.problem(c);
  a.expected = o.reference(a.problem);
  a.actual = a.expected;
  Result r;
  r.id = c.id;
  r.op = c.op;
  const auto dir =
      std::filesystem::temp_directory_path() / ("detect_bundle_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "b.h5").string();
  write_repro_bundle(path, r, a, nlohmann::json::object());
  EXPECT_EQ(check_repro_bundle(path, 30.0), "");
  const H5File f = H5File::open(path);
  const Storage& st = *a.problem.arg("kv_cache").storage();
  const Tensor held = f.read_tensor("inputs/kv_cache");
  EXPECT_EQ(held.numel() * static_cast<int64_t>(held.element_size()),
            static_cast<int64_t>(st.bytes.size()));
  const auto layout = f.attr_json("inputs/kv_cache", "layout");
  EXPECT_EQ(layout.at("sparse").at("extent_bytes").get<uint64_t>(), st.extent);
  EXPECT_EQ(layout.at("sparse").at("window_begin_bytes").get<uint64_t>(), st.window_begin);
  EXPECT_FALSE(f.attr_json("inputs/q", "layout").contains("sparse"));  // dense: as before
  std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------------------------------------
// fp8 special codes

// What a dequant exact only on ordinary codes reads in place of `code` (the *_fp8_ordinary_only
// mutants): the saturation codes (and e4m3fn's NaN) one step smaller, fnuz's NaN 0x80 as zero.
uint8_t ordinary_only(uint8_t code, DType fp8) {
  const uint8_t top = fp8 == DType::e4m3fn ? 0x7E : 0x7F;
  if ((code & 0x7F) >= top) return static_cast<uint8_t>((code & 0x80) | (top - 1));
  if (fp8 == DType::e4m3fnuz && code == 0x80) return 0x00;
  return code;
}

// A copy of the problem in which the bytes `select(byte index of the storage window)` of the
// storage of `arg` are remapped with ordinary_only (a new storage; other args keep theirs).
Problem with_ordinary_only(const Problem& p, const std::string& arg, DType fp8,
                           const std::function<bool(size_t)>& select = {}) {
  Problem m = p;
  const Tensor& t = p.arg(arg);
  auto st = std::make_shared<Storage>(*t.storage());
  for (size_t i = 0; i < st->bytes.size(); ++i)
    if (!select || select(i))
      st->bytes[i] = static_cast<std::byte>(ordinary_only(static_cast<uint8_t>(st->bytes[i]), fp8));
  for (auto& a : m.args)
    if (a.tensor.storage() == t.storage()) a.tensor = a.tensor.rebased(st);
  return m;
}

bool is_nan_code(uint8_t code, DType fp8) {
  return fp8 == DType::e4m3fn ? (code & 0x7F) == 0x7F : code == 0x80;
}
bool is_saturated(uint8_t code, DType fp8) {
  return (code & 0x7F) == (fp8 == DType::e4m3fn ? 0x7E : 0x7F);
}

struct CodeCounts {
  int64_t saturated = 0, neg_zero = 0, nan = 0, elements = 0;
};

// The same case with ordinary codes (fp8_codes removed).
Case ordinary_twin(const Op& o, const Case& c) {
  Params given = c.params;
  given["fp8_codes"] = "ordinary";
  if (given.contains("offset_log2")) given["offset_log2"] = 0;
  return o.make_case(given);
}

// Special cases of `name`: codes where the contract puts them (checked by `inspect`), the emulated
// mutant fails them, the ordinary twin (same case, ordinary codes) passes it. `mutate` builds the
// mutated problem.
void expect_specials_kill_the_mutant(
    const std::string& name, const std::function<void(const Case&, const Problem&)>& inspect,
    const std::function<Problem(const Problem&)>& mutate) {
  const Op& o = op(name);
  int special_cases = 0;
  std::set<std::string> formats;
  for (const Case& c : quick_cases(name)) {
    if (c.params.at("fp8_codes") != "special") continue;
    ++special_cases;
    const Problem p = o.problem(c);
    inspect(c, p);
    const TensorMap expected = o.reference(p);
    EXPECT_TRUE(passes(o, p, expected, expected)) << c.id;
    std::string why;
    EXPECT_FALSE(passes(o, p, expected, o.reference(mutate(p)), &why))
        << c.id << ": a dequant exact only on ordinary codes passes";
    const Case twin = ordinary_twin(o, c);
    const Problem q = o.problem(twin);
    const TensorMap twin_expected = o.reference(q);
    const bool twin_fn = c.id.find("e4m3fnuz") == std::string::npos;
    // Ordinary e4m3fn indexer rows reach 448 through the quantizer already; elsewhere ordinary
    // codes stay below the top code and the mutant is invisible.
    if (!(twin_fn && name.rfind("indexer_logits", 0) == 0)) {
      EXPECT_TRUE(passes(o, q, twin_expected, o.reference(mutate(q)), &why)) << twin.id << why;
    }
    formats.insert(twin_fn ? "e4m3fn" : "e4m3fnuz");
    std::printf("%-100s special codes: the emulated ordinary-only dequant fails (%s)\n",
                c.id.c_str(), why.substr(0, why.find('\n')).c_str());
  }
  EXPECT_GE(special_cases, 2) << name;
  EXPECT_EQ(formats.size(), 2u) << name << ": both formats need special cases";
}

// MLA caches: the slots requests read hold the saturation codes (and -0 in e4m3fn), no NaN;
// mla_decode's unread slots are NaN codes throughout (sparse_mla: somewhere).
void inspect_mla_cache(const std::string& name, const Problem& p, const std::string& id) {
  const Tensor& cache = p.arg("kv_cache");
  const DType fp8 = cache.dtype();
  const int64_t P = cache.size(1), Lk = cache.size(2);
  std::set<int64_t> read;
  if (name == "mla_decode") {
    const Tensor s = ref::page_indices(p.arg("block_table"), p.arg("seq_lens"), P);
    for (int64_t i = 0; i < s.numel(); ++i) read.insert(s.at<int32_t>({i}));
  } else {
    const auto idx = ref::sparse_mla_pack(ref::sparse_mla_global_indices(
        p.arg("topk_indices"), p.arg("req_id_per_token"), p.arg("block_table"), P));
    for (int64_t i = 0; i < idx.indices.numel(); ++i) read.insert(idx.indices.at<int32_t>({i}));
  }
  const Tensor held = cache.held_rows();
  const int64_t first = (held.offset() / cache.stride(0));
  CodeCounts in_read, unread;
  for (int64_t s = 0; s < held.size(0) * P; ++s) {
    const bool is_read = read.count(first * P + s) > 0;
    CodeCounts& n = is_read ? in_read : unread;
    for (int64_t d = 0; d < Lk; ++d) {
      const auto code = static_cast<uint8_t>(held.get_bits({s / P, s % P, d}));
      ++n.elements;
      n.saturated += is_saturated(code, fp8);
      n.neg_zero += fp8 == DType::e4m3fn && code == 0x80;
      n.nan += is_nan_code(code, fp8);
    }
  }
  EXPECT_EQ(in_read.nan, 0) << id;
  EXPECT_GT(in_read.saturated, in_read.elements / 20) << id;
  EXPECT_EQ(in_read.neg_zero > 0, fp8 == DType::e4m3fn) << id;
  EXPECT_GT(unread.nan, 0) << id;
  if (name == "mla_decode") {
    EXPECT_EQ(unread.nan, unread.elements) << id;
  }
}

TEST(Fp8Specials, MlaDecodeAndSparseMla) {
  for (const std::string name : {"mla_decode", "sparse_mla"})
    expect_specials_kill_the_mutant(
        name, [&](const Case& c, const Problem& p) { inspect_mla_cache(name, p, c.id); },
        [](const Problem& p) {
          return with_ordinary_only(p, "kv_cache", p.arg("kv_cache").dtype());
        });
}

TEST(Fp8Specials, KvGather) {
  expect_specials_kill_the_mutant(
      "kv_gather",
      [](const Case& c, const Problem& p) {
        // -0 dequantizes to -0 (an IEEE product), bit for bit: find one in the output.
        const Tensor& k = p.arg("key_cache");
        const DType fp8 = k.dtype();
        CodeCounts n;
        const Tensor held = k.held_rows();
        held.for_each_index([&](const Index& idx, int64_t) {
          const auto code = static_cast<uint8_t>(held.get_bits(idx));
          n.saturated += is_saturated(code, fp8);
          n.nan += is_nan_code(code, fp8);
          n.neg_zero += fp8 == DType::e4m3fn && code == 0x80;
        });
        EXPECT_GT(n.saturated, 0) << c.id;
        EXPECT_GT(n.nan, 0) << c.id << ": slots not gathered hold NaN codes";
        EXPECT_EQ(n.neg_zero > 0, fp8 == DType::e4m3fn) << c.id;
        const TensorMap out = op("kv_gather").reference(p);
        int64_t neg_zero_out = 0, sat_out = 0;
        const double top = max_finite(fp8) * p.arg("k_scale").get({0});
        out.at("key").for_each_index([&](const Index& idx, int64_t) {
          const double v = out.at("key").get(idx);
          EXPECT_FALSE(std::isnan(v)) << c.id;
          neg_zero_out += v == 0 && std::signbit(v);
          sat_out += std::fabs(v) ==
                     decode_value(encode_value(top, out.at("key").dtype()), out.at("key").dtype());
        });
        EXPECT_EQ(neg_zero_out > 0, fp8 == DType::e4m3fn) << c.id;
        EXPECT_GT(sat_out, 0) << c.id;
      },
      [](const Problem& p) {
        const DType fp8 = p.arg("key_cache").dtype();
        Problem m = with_ordinary_only(p, "key_cache", fp8);
        return p.arg("value_cache").storage() == p.arg("key_cache").storage()
                   ? m
                   : with_ordinary_only(m, "value_cache", fp8);
      });
}

// Value bytes (not the fp32 scales) of every page of an indexer cache.
std::function<bool(size_t)> value_bytes(const Tensor& cache) {
  const auto stride = static_cast<size_t>(cache.stride(0));
  const auto values = static_cast<size_t>(cache.size(1) * ix::kHeadDim);
  return [=](size_t i) { return i % stride < values; };
}

void inspect_q(const Case& c, const Tensor& q) {
  CodeCounts n;
  const Tensor d = q.contiguous();
  const auto* bytes = reinterpret_cast<const uint8_t*>(d.data());
  for (int64_t i = 0; i < d.numel(); ++i) {
    n.saturated += is_saturated(bytes[i], q.dtype());
    n.nan += is_nan_code(bytes[i], q.dtype());
  }
  EXPECT_EQ(n.nan, 0) << c.id;
  EXPECT_GT(n.saturated, d.numel() / 20) << c.id;
}

TEST(Fp8Specials, IndexerLogits) {
  expect_specials_kill_the_mutant(
      "indexer_logits_decode",
      [](const Case& c, const Problem& p) {
        inspect_q(c, p.arg("q"));
        // Tokens read carry saturation codes, never NaN; unwritten value bytes are NaN codes.
        const Tensor& cache = p.arg("kv_cache");
        const int64_t bs = cache.size(1);
        const DType fp8 = p.arg("q").dtype();
        const Tensor& lens = p.arg("context_lens");
        const Tensor& table = p.arg("block_table");
        int64_t saturated = 0;
        uint8_t bytes[ix::kHeadDim];
        for (int64_t b = 0; b < lens.size(0); ++b)
          for (int64_t t = 0; t < lens.at<int32_t>({b}); ++t) {
            float s = 0;
            ix::read_token({cache, bs, ix::layout_for_block_size(bs)},
                           table.at<int32_t>({b, t / bs}), t % bs, bytes, &s);
            for (uint8_t x : bytes) {
              ASSERT_FALSE(is_nan_code(x, fp8)) << c.id;
              saturated += is_saturated(x, fp8);
            }
          }
        EXPECT_GT(saturated, 0) << c.id;
      },
      [](const Problem& p) {
        const DType fp8 = p.arg("q").dtype();
        return with_ordinary_only(with_ordinary_only(p, "q", fp8), "kv_cache", fp8,
                                  value_bytes(p.arg("kv_cache")));
      });
  expect_specials_kill_the_mutant(
      "indexer_logits_prefill",
      [](const Case& c, const Problem& p) {
        inspect_q(c, p.arg("q"));
        inspect_q(c, p.arg("k_fp8"));
      },
      [](const Problem& p) {
        const DType fp8 = p.arg("q").dtype();
        return with_ordinary_only(with_ordinary_only(p, "q", fp8), "k_fp8", fp8);
      });
}

// The gather copies bytes: the saturation codes, -0 and NaN codes of the tokens read arrive bit
// for bit; a copy through float (decode, re-encode) turns e4m3fn's 0xFF into 0x7F and fails the
// exact check.
TEST(Fp8Specials, IndexerGatherCopiesEveryCode) {
  const Op& o = op("indexer_gather");
  int cases = 0;
  for (const Case& c : quick_cases("indexer_gather")) {
    if (c.params.at("fp8_codes") != "special") continue;
    ++cases;
    const Problem p = o.problem(c);
    const TensorMap expected = o.reference(p);
    const Tensor& values = expected.at("k_fp8");
    const DType fp8 = values.dtype();
    CodeCounts n;
    Tensor through_float = values.contiguous();
    values.for_each_index([&](const Index& idx, int64_t) {
      const auto code = static_cast<uint8_t>(values.get_bits(idx));
      n.saturated += is_saturated(code, fp8);
      n.nan += is_nan_code(code, fp8);
      n.neg_zero += fp8 == DType::e4m3fn && code == 0x80;
      through_float.set_bits(idx, encode_value(decode_value(code, fp8), fp8));
    });
    EXPECT_GT(n.saturated, 0) << c.id;
    EXPECT_GT(n.nan, 0) << c.id;
    EXPECT_EQ(n.neg_zero > 0, fp8 == DType::e4m3fn) << c.id;
    EXPECT_TRUE(passes(o, p, expected, expected)) << c.id;
    // e4m3fnuz has one NaN code and no -0, so every code survives float; e4m3fn's 0xFF does not.
    TensorMap actual = expected;
    actual["k_fp8"] = through_float;
    EXPECT_EQ(passes(o, p, expected, actual), fp8 == DType::e4m3fnuz) << c.id;
  }
  EXPECT_GE(cases, 2);
}

// ---------------------------------------------------------------------------------------------
// page_indices: int32 slots

TEST(PageIndicesIds, TopIdsExpandExactlyAndOneMoreIsRefused) {
  const Op& o = op("page_indices");
  int top = 0, over = 0;
  int64_t largest_slot = 0;
  for (const Case& c : quick_cases("page_indices")) {
    const std::string ids = c.params.at("block_ids");
    if (ids == "low") continue;
    const Problem p = o.problem(c);
    const int64_t K = p.kernel_params.at("kernel_block_size").get<int64_t>();
    if (ids == "top") {
      ++top;
      EXPECT_FALSE(p.expect_refusal) << c.id;
      const Tensor out = o.reference(p).at("page_indices");
      const Tensor& table = p.arg("block_table");
      const Tensor& lens = p.arg("seq_lens");
      int64_t i = 0;
      for (int64_t r = 0; r < lens.size(0); ++r)
        for (int64_t t = 0; t < lens.at<int32_t>({r}); ++t, ++i) {
          const int64_t want = int64_t{table.at<int32_t>({r, t / K})} * K + t % K;
          ASSERT_EQ(out.at<int32_t>({i}), want) << c.id;
          largest_slot = std::max(largest_slot, want);
          EXPECT_GE(table.at<int32_t>({r, t / K}), (int64_t{1} << 31) / K - 4096) << c.id;
        }
    } else {
      ++over;
      EXPECT_TRUE(p.expect_refusal) << c.id;
      try {
        (void)o.reference(p);
        ADD_FAILURE() << c.id << ": the reference expanded a slot past int32";
      } catch (const InvalidConfig& e) {
        EXPECT_EQ(e.what(), p.expect_refusal.value_or("")) << c.id;
      }
    }
  }
  EXPECT_EQ(largest_slot, INT32_MAX) << "no top case reaches the last int32 slot";
  EXPECT_GE(top, 2);
  EXPECT_GE(over, 2);
  EXPECT_THROW((void)o.make(o.make_case({{"block_size", 1}, {"block_ids", "over"}})),
               std::invalid_argument);
  EXPECT_EQ(o.make_case(Params::object()).id.find("ids"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Mutants

// Every mutant of kernels_under_test/*.mutants names quick-tier cases that run (refusals, for
// the one that runs what must be refused): the quick tier can kill it. The issue 14 mutants
// (*_fp8_ordinary_only, *_offset_int32) name special-code or large-offset cases only (caches
// past 2^31, -offlog3[12], or outputs, issue 21's -ooff31, or split partials, issue 37's
// -plog31, or inputs, -qoff31 / -far1), so the other quick cases are their controls.
TEST(Mutants, EveryMutantNamesQuickCasesThatCanKillIt) {
  std::vector<Case> quick;
  for (const CaseFile& f : load_case_dir(default_root() + "/cases"))
    for (const Case& c : f.tiers.at("quick")) quick.push_back(c);
  int mutants = 0;
  std::map<std::string, bool> refused;  // id -> the case is an invalid configuration
  for (const auto& entry :
       std::filesystem::directory_iterator(default_root() + "/kernels_under_test")) {
    if (entry.path().extension() != ".mutants") continue;
    std::ifstream in(entry.path());
    for (std::string line; std::getline(in, line);) {
      if (line.empty() || line[0] == '#') continue;
      const auto first = line.find('|'), second = line.find('|', first + 1);
      ASSERT_NE(second, std::string::npos) << entry.path() << ": " << line;
      std::string name = line.substr(0, first), re = line.substr(second + 1);
      name.erase(name.find_last_not_of(" \t") + 1);
      re.erase(0, re.find_first_not_of(" \t"));
      re.erase(re.find_last_not_of(" \t\r") + 1);
      ++mutants;
      const bool specials = name.find("fp8_ordinary_only") != std::string::npos;
      const bool offsets = name.find("offset_int32") != std::string::npos;
      int valid = 0, refusals = 0;
      const std::regex names(re);
      for (const Case& c : quick) {
        if (!std::regex_search(c.id, names)) continue;
        auto [it, fresh] = refused.try_emplace(c.id, false);
        if (fresh) it->second = op(c.op).problem(c).expect_refusal.has_value();
        (it->second ? refusals : valid) += 1;
        if (specials) {
          EXPECT_NE(c.id.find("-fp8special"), std::string::npos) << name << " names " << c.id;
        }
        if (offsets) {
          EXPECT_TRUE(c.id.find("-offlog31") != std::string::npos ||
                      c.id.find("-offlog32") != std::string::npos ||
                      c.id.find("-ooff31") != std::string::npos ||
                      c.id.find("-plog31") != std::string::npos ||
                      c.id.find("-qoff31") != std::string::npos ||
                      c.id.find("-far1") != std::string::npos)
              << name << " names " << c.id;
        }
      }
      const bool refusal_killed = name == "page_indices_unchecked_int32";  // V2 kills it
      EXPECT_GT(refusal_killed ? refusals : valid, 0) << name << " (" << re << ") names no case";
      std::printf("mutant %-36s names %3d quick cases that run, %d refusals\n", name.c_str(), valid,
                  refusals);
    }
  }
  EXPECT_GE(mutants, 22);
}

}  // namespace
}  // namespace attncheck
