// The indexer ops on the CPU: every op's reference runs on its default case, invalid
// configurations are refused, and the budgets pass an emulation of the GPU's fp32 arithmetic while
// failing emulations of the seed bugs (docs/ops/indexer.md "Seed bugs covered") and of top-k window
// bugs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <regex>
#include <set>

#include "core/numeric.h"
#include "ops/op.h"
#include "reference/indexer.h"
#include "run/cases.h"
#include "run/evaluate.h"
#include "run/provenance.h"

namespace attncheck {
namespace {

namespace ix = ref::indexer;

const char* const kOps[] = {
    "indexer_k_cache",       "indexer_gather",       "indexer_q_quant",    "indexer_logits_prefill",
    "indexer_logits_decode", "indexer_topk_prefill", "indexer_topk_decode"};

const Op& op(const char* name) {
  const Op* o = find_op(name);
  if (!o) throw std::runtime_error(std::string("op not registered: ") + name);
  return *o;
}

std::vector<CheckResult> judge(const Op& o, const Problem& p, const TensorMap& expected,
                               const TensorMap& actual) {
  return check_outputs(o.checks(p, expected), expected, actual);
}
bool all_pass(const std::vector<CheckResult>& r) {
  for (const auto& c : r)
    if (!c.passed) return false;
  return !r.empty();
}

TEST(IndexerOps, DefaultCasesRunAndMatchThemselves) {
  for (const char* name : kOps) {
    const Op& o = op(name);
    const Case c = o.make_case(Params::object());
    const Problem p = o.make(c);
    EXPECT_FALSE(p.expect_refusal) << c.id;
    const TensorMap expected = o.reference(p);
    for (const auto& a : p.args)
      if (a.role != Role::input) {
        ASSERT_TRUE(expected.count(a.name)) << c.id << " " << a.name;
        EXPECT_EQ(expected.at(a.name).shape(), a.tensor.shape()) << c.id << " " << a.name;
      }
    EXPECT_TRUE(all_pass(judge(o, p, expected, expected))) << c.id;
  }
}

TEST(IndexerOps, InvalidConfigurationsAreRefused) {
  struct Invalid {
    const char* op;
    Params params;
    const char* why;  // the refusal reason, as kernels and results read it
  };
  const std::vector<Invalid> invalid = {
      {"indexer_k_cache",
       {{"block_size", 24}},
       "block size 24 is neither 1 (NORMAL) nor a multiple of 16 (SHUFFLE)"},
      {"indexer_k_cache",
       {{"pad", 6}},
       "page stride 8454 is not a multiple of 4 (fp32 scales would be misaligned)"},
      {"indexer_gather",
       {{"block_size", 8}},
       "block size 8 is neither 1 (NORMAL) nor a multiple of 16 (SHUFFLE)"},
      {"indexer_gather", {{"block_size", 8}, {"pad", 2}}, "page stride is not a multiple of 4"},
      {"indexer_logits_decode",
       {{"block_size", 32 + 1}, {"pad", 2}},
       "block size 33 is neither 1 (NORMAL) nor a multiple of 16 (SHUFFLE)"},
      {"indexer_logits_decode",
       {{"heads", 48}, {"chunk_q", 32}},
       "heads 48 not a multiple of chunk_q 32"},
      {"indexer_logits_decode", {{"chunk_q", 0}}, "chunk_q 0 < 1"},
      {"indexer_logits_decode", {{"heads", 256}}, "heads 256 outside [1, 128]"},
      {"indexer_logits_decode", {{"heads", 0}}, "heads 0 outside [1, 128]"},
      {"indexer_logits_decode", {{"pad", 2}}, "page stride is not a multiple of 4"},
      {"indexer_logits_prefill", {{"heads", 256}}, "heads 256 outside [1, 128]"},
  };
  for (const auto& [name, params, why] : invalid) {
    const Op& o = op(name);
    const Case c = o.make_case(params);
    EXPECT_EQ(o.invalid_reason(c.params).value_or(""), why) << c.id;
    // The inputs are still made (the kernel must receive them and refuse).
    EXPECT_EQ(o.problem(c).expect_refusal.value_or(""), why) << c.id;
  }
  // ChunkQ larger than the head count is clamped, not refused (docs/ops/indexer.md).
  for (int64_t h : {8, 16, 32, 64}) {
    const Problem p =
        op("indexer_logits_decode").make(op("indexer_logits_decode").make_case({{"heads", h}}));
    EXPECT_FALSE(p.expect_refusal) << h;
  }
}

// Axis combinations that describe no case are case-file errors, named with the case id.
TEST(IndexerOps, UnbuildableConfigurationsAreCaseErrors) {
  const std::vector<std::pair<const char*, Params>> unbuildable = {
      {"indexer_k_cache", {{"tokens", 0}}},       {"indexer_k_cache", {{"k_stride", 64}}},
      {"indexer_gather", {{"pad", -4}}},          {"indexer_q_quant", {{"heads", 0}}},
      {"indexer_logits_prefill", {{"qlen", 0}}},  {"indexer_logits_prefill", {{"heads", -1}}},
      {"indexer_logits_decode", {{"next_n", 0}}}, {"indexer_logits_decode", {{"heads", -1}}},
      {"indexer_topk_prefill", {{"topk", 0}}},    {"indexer_topk_prefill", {{"batch", 0}}},
      {"indexer_topk_decode", {{"max_ctx", 0}}},
  };
  for (const auto& [name, params] : unbuildable) {
    const Op& o = op(name);
    const Params full = o.complete(params);
    const auto why = o.case_error(full);
    ASSERT_TRUE(why) << name << " " << params.dump();
    try {
      (void)o.make(o.make_case(params));
      ADD_FAILURE() << name << " " << params.dump() << " made a problem";
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind(std::string(name) + "/", 0), 0u) << what;
      EXPECT_NE(what.find(*why), std::string::npos) << what;
    }
  }
  for (const char* name : kOps)
    EXPECT_FALSE(op(name).case_error(op(name).complete(Params::object()))) << name;
}

// The cache as the gfx950 seed writer leaves it: SHUFFLE offsets at every block size (writes
// past the storage are dropped; on the device they hit the guard bytes).
Tensor shuffle_writer(const Problem& p) {
  const Tensor& cache = p.arg("kv_cache");
  const int64_t bs = cache.size(1), stride = cache.stride(0);
  auto storage = std::make_shared<Storage>(*cache.storage());
  const auto q = ix::quantize_k(p.arg("k").slice(0, 0, p.arg("slot_mapping").size(0)),
                                *parse_dtype(p.kernel_params.at("fp8_format").get<std::string>()),
                                static_cast<float>(p.kernel_params.at("quant_max").get<double>()));
  auto* bytes = reinterpret_cast<uint8_t*>(storage->bytes.data());
  const auto n = static_cast<int64_t>(storage->bytes.size());
  for (int64_t i = 0; i < p.arg("slot_mapping").size(0); ++i) {
    const int64_t slot = p.arg("slot_mapping").at<int64_t>({i});
    if (slot < 0) continue;
    const int64_t base = (slot / bs) * stride;
    for (int64_t d = 0; d < ix::kHeadDim; ++d) {
      const int64_t off = base + ix::value_offset(ix::CacheLayout::shuffle, bs, slot % bs, d);
      if (off < n) bytes[off] = static_cast<uint8_t>(q.values.get_bits(Index{i, d}));
    }
    const float s = q.scales.at<float>({i});
    std::memcpy(bytes + base + ix::scale_offset(bs, slot % bs), &s, 4);
  }
  return cache.rebased(storage);
}

TEST(IndexerOps, CacheCheckCatchesShuffleAtBlockSizeOne) {
  const Op& o = op("indexer_k_cache");
  for (int64_t bs : {1, 16}) {
    const Problem p = o.make(o.make_case({{"block_size", bs}}));
    const TensorMap expected = o.reference(p);
    const bool ok = all_pass(judge(o, p, expected, {{"kv_cache", shuffle_writer(p)}}));
    EXPECT_EQ(ok, bs == 16) << "bs " << bs;  // at BS 16 the seed writer was right
  }
}

// fp32 logits as a GPU computes them: products exact, sums in float in another order.
Tensor fp32_decode_logits(const Problem& p, ix::CacheLayout read_as) {
  const Tensor& q = p.arg("q");
  const Tensor& cache = p.arg("kv_cache");
  const int64_t B = q.size(0), NN = q.size(1), H = q.size(2), bs = cache.size(1);
  const int64_t width = p.arg("logits").size(1);
  Tensor out = Tensor::full(DType::f32, {B * NN, width}, -INFINITY);
  uint8_t kb[ix::kHeadDim];
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < NN; ++n) {
      const int64_t r = b * NN + n;
      const int64_t end = ix::decode_row_end(p.arg("context_lens").at<int32_t>({b}), NN, n, width);
      for (int64_t t = 0; t < end; ++t) {
        float ks = 0;
        ix::read_token({cache, bs, read_as}, p.arg("block_table").at<int32_t>({b, t / bs}), t % bs,
                       kb, &ks);
        float acc = 0;
        for (int64_t h = H; h-- > 0;) {
          float dot = 0;
          for (int64_t d = ix::kHeadDim; d-- > 0;)
            dot += static_cast<float>(q.get({b, n, h, d}) * fp8_decode(kb[d], q.dtype()));
          acc += p.arg("weights").at<float>({r, h}) * std::max(dot * ks, 0.0f);
        }
        out.at<float>({r, t}) = acc;
      }
    }
  return out;
}

TEST(IndexerOps, DecodeBudgetPassesFp32AndCatchesRowMajorReadsOfShuffle) {
  const Op& o = op("indexer_logits_decode");
  for (int64_t bs : {1, 16, 64}) {
    // bs 16: fp8 special codes (saturation values in q and K, NaN codes in unread bytes).
    const Problem p = o.make(o.make_case({{"block_size", bs},
                                          {"heads", 16},
                                          {"next_n", 2},
                                          {"max_ctx", 150},
                                          {"fp8_codes", bs == 16 ? "special" : "ordinary"}}));
    const TensorMap expected = o.reference(p);
    const auto good =
        judge(o, p, expected, {{"logits", fp32_decode_logits(p, ix::layout_for_block_size(bs))}});
    EXPECT_TRUE(all_pass(good)) << "bs " << bs << ": " << good.at(0).message;
    if (bs > 1) {  // seed bug: Preshuffle off, SHUFFLE pages read row-major
      const auto bad =
          judge(o, p, expected, {{"logits", fp32_decode_logits(p, ix::CacheLayout::normal)}});
      EXPECT_FALSE(all_pass(bad)) << "bs " << bs;
    }
  }
}

TEST(IndexerOps, PrefillBudgetPassesFp32AndCatchesAnOffByOneWindow) {
  const Op& o = op("indexer_logits_prefill");
  const Problem p = o.make(o.make_case({{"heads", 8}}));
  const TensorMap expected = o.reference(p);
  const Tensor& q = p.arg("q");
  const Tensor& k = p.arg("k_fp8");
  const int64_t M = q.size(0), H = q.size(1), N = k.size(0);
  auto compute = [&](int64_t shift) {
    Tensor out = Tensor::full(DType::f32, {M, N}, -INFINITY);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = p.arg("cu_seqlen_ks").at<int32_t>({i});
           j < p.arg("cu_seqlen_ke").at<int32_t>({i}) + shift && j < N; ++j) {
        float acc = 0;
        for (int64_t h = 0; h < H; ++h) {
          float dot = 0;
          for (int64_t d = 0; d < ix::kHeadDim; ++d)
            dot += static_cast<float>(q.get({i, h, d}) * k.get({j, d}));
          acc += p.arg("weights").at<float>({i, h}) * std::max(dot, 0.0f) *
                 p.arg("k_scale").at<float>({j});
        }
        out.at<float>({i, j}) = acc;
      }
    return out;
  };
  EXPECT_TRUE(all_pass(judge(o, p, expected, {{"logits", compute(0)}})));
  EXPECT_FALSE(all_pass(judge(o, p, expected, {{"logits", compute(1)}})));
}

TEST(IndexerOps, TopkChecksCatchWindowAndFillBugs) {
  const Op& o = op("indexer_topk_decode");
  const Problem p = o.make(o.make_case({{"data", "ties"}, {"next_n", 2}}));
  const TensorMap expected = o.reference(p);
  EXPECT_TRUE(all_pass(judge(o, p, expected, expected)));
  const Tensor& logits = p.arg("logits");
  const Tensor& lens = p.arg("seq_lens");
  const int64_t rows = logits.size(0), k = expected.at("topk_indices").size(1);
  // Ties broken the other way (highest column first) still pass.
  Tensor other = Tensor::full(DType::i32, {rows, k}, -1);
  // Reading one column past the window fails; so does skipping the -1 fill.
  Tensor overshoot = Tensor::full(DType::i32, {rows, k}, -1);
  Tensor unfilled = expected.at("topk_indices").clone();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t end = ix::decode_row_end(lens.at<int32_t>({r / 2}), 2, r % 2, logits.size(1));
    std::vector<float> reversed;
    for (int64_t j = end; j-- > 0;) reversed.push_back(logits.at<float>({r, j}));
    const auto idx = ix::topk_window(reversed.data(), 0, end, k);
    for (size_t j = 0; j < idx.size(); ++j)
      other.at<int32_t>({r, static_cast<int64_t>(j)}) = static_cast<int32_t>(end - 1 - idx[j]);
    const auto wide =
        ix::topk_window(reinterpret_cast<const float*>(logits.data()) + r * logits.stride(0), 0,
                        std::min(end + 1, logits.size(1)), k);
    for (size_t j = 0; j < wide.size(); ++j)
      overshoot.at<int32_t>({r, static_cast<int64_t>(j)}) = wide[j];
    for (int64_t j = end; j < k; ++j) unfilled.at<int32_t>({r, j}) = 0x5A5A5A5A;
  }
  EXPECT_TRUE(all_pass(judge(o, p, expected, {{"topk_indices", other}})));
  EXPECT_FALSE(all_pass(judge(o, p, expected, {{"topk_indices", overshoot}})));
  EXPECT_FALSE(all_pass(judge(o, p, expected, {{"topk_indices", unfilled}})));
}

}  // namespace
}  // namespace attncheck

namespace attncheck {
namespace {

// Every indexer case file loads; the smoke and quick tiers run their reference (or refuse) within a
// time and golden-size budget, and cover each seed-bug configuration.
TEST(IndexerOps, CaseFilesExpandAndStaySmall) {
  const std::string root = default_root();  // not __FILE__: ccache's base_dir makes it relative
  double golden_bytes = 0, seconds = 0;
  std::set<std::string> ids;
  for (const char* name : kOps) {
    const CaseFile f = load_case_file(root + "/cases/" + name + ".toml");
    EXPECT_EQ(f.op, name);
    for (const char* tier : {"smoke", "quick"}) {
      ASSERT_TRUE(f.tiers.count(tier)) << name << " has no " << tier << " tier";
      for (const Case& c : f.tiers.at(tier)) {
        if (!ids.insert(c.id).second) continue;  // in both tiers
        const Op& o = op(name);
        const auto t0 = std::chrono::steady_clock::now();
        const Problem p = o.make(c);
        if (p.expect_refusal) continue;  // refused: no reference
        const TensorMap expected = o.reference(p);
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        for (const auto& [out, t] : expected)
          golden_bytes += static_cast<double>(t.numel() * t.element_size());
      }
    }
  }
  std::printf(
      "indexer smoke+quick: %zu cases, %.2f s generate+reference, %.2f MB of expected outputs\n",
      ids.size(), seconds, golden_bytes / 1e6);
  // The indexer's share of golden/ (whose whole budget golden/MANIFEST's check enforces):
  // 3.98 MB before the two far-row K writer cases of issue 37 (15 KB each).
  EXPECT_LT(golden_bytes, 4.1e6);
  for (const char* must :
       {"indexer_k_cache/bs1-", "indexer_gather/bs1-", "indexer_logits_decode/h8-",
        "indexer_logits_decode/h16-", "indexer_logits_decode/h32-nn1-bs16-"})
    EXPECT_TRUE(std::any_of(ids.begin(), ids.end(), [&](const std::string& id) {
      return id.rfind(must, 0) == 0;
    })) << must;
}

}  // namespace
}  // namespace attncheck

namespace attncheck {
namespace {

// The ChunkQ seed bug as the mutant runs it: ChunkQ = 64 > H heads, so row r also scores
// the 64 - H heads that follow it in memory (the next row's q and weights; zero past the end).
Problem with_unclamped_chunk(const Problem& p) {
  Problem wide = p;
  const Tensor q = p.arg("q").contiguous();
  const Tensor w = p.arg("weights").contiguous();
  const int64_t B = q.size(0), NN = q.size(1), H = q.size(2), rows = B * NN;
  Tensor q64 = Tensor::zeros(q.dtype(), {B, NN, 64, ix::kHeadDim});
  Tensor w64 = Tensor::zeros(DType::f32, {rows, 64});
  const auto* qs = reinterpret_cast<const uint8_t*>(q.data());
  const auto* ws = reinterpret_cast<const float*>(w.data());
  auto* qd = reinterpret_cast<uint8_t*>(q64.data());
  auto* wd = reinterpret_cast<float*>(w64.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < 64 && r * H + h < rows * H; ++h) {
      std::memcpy(qd + (r * 64 + h) * ix::kHeadDim, qs + (r * H + h) * ix::kHeadDim, ix::kHeadDim);
      wd[r * 64 + h] = ws[r * H + h];
    }
  wide.arg("q") = q64;
  wide.arg("weights") = w64;
  return wide;
}

TEST(IndexerOps, DecodeBudgetCatchesUnclampedChunkQ) {
  const Op& o = op("indexer_logits_decode");
  for (const Params& params : {Params{{"heads", 8}}, Params{{"heads", 16}, {"block_size", 1}},
                               Params{{"heads", 32}, {"next_n", 2}, {"block_size", 16}}}) {
    const Problem p = o.make(o.make_case(params));
    const TensorMap expected = o.reference(p);
    const Tensor wrong = o.reference(with_unclamped_chunk(p)).at("logits");
    const auto r = judge(o, p, expected, {{"logits", wrong}});
    EXPECT_FALSE(all_pass(r)) << params.dump();
    // How tight the budget is: atol against the median |logit|.
    std::vector<double> mags;
    const Tensor& e = expected.at("logits");
    for (int64_t i = 0; i < e.size(0); ++i)
      for (int64_t j = 0; j < e.size(1); ++j)
        if (std::isfinite(e.get({i, j}))) mags.push_back(std::fabs(e.get({i, j})));
    std::nth_element(mags.begin(), mags.begin() + static_cast<std::ptrdiff_t>(mags.size() / 2),
                     mags.end());
    std::printf("%s: atol %.3g, median |logit| %.3g, mismatches %lld/%lld\n", params.dump().c_str(),
                r.at(0).budget.atol, mags[mags.size() / 2],
                static_cast<long long>(r.at(0).metrics.mismatches),
                static_cast<long long>(r.at(0).metrics.count));
  }
}

// Every quick case the chunkq mutant's regex names must fail under the emulated mutant.
TEST(IndexerOps, UnclampedChunkQFailsEveryTargetedQuickCase) {
  const std::string root = default_root();  // not __FILE__: ccache's base_dir makes it relative
  const CaseFile f = load_case_file(root + "/cases/indexer_logits_decode.toml");
  const std::regex re("^indexer_logits_decode/h(8|16|32)-.*-cq64-");
  const Op& o = op("indexer_logits_decode");
  int targeted = 0;
  for (const Case& c : f.tiers.at("quick")) {
    // far_rows cases hold one row of q and pad_strides cases pad its rows: the emulation widens
    // every request's dense q (the mutant's regex still names them, for the device).
    if (!std::regex_search(c.id, re) || c.params.value("far_rows", false) ||
        c.params.value("pad_strides", false))
      continue;
    const Problem p = o.make(c);
    if (p.expect_refusal) continue;  // invalid configurations are refused either way
    ++targeted;
    try {
      const TensorMap expected = o.reference(p);
      const auto r =
          judge(o, p, expected, {{"logits", o.reference(with_unclamped_chunk(p)).at("logits")}});
      EXPECT_FALSE(all_pass(r)) << c.id << " escapes the emulated mutant";
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.id << ": " << e.what();
    }
  }
  EXPECT_GT(targeted, 0);
}

}  // namespace
}  // namespace attncheck
