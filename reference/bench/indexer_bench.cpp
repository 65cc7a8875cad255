// The indexer references at model shapes (64 heads, head dim 128), read against BM_EigenGemmF64 of
// main.cpp in the same run: "GFLOP" is the useful q.k work per second, 2 * 128 * heads per visible
// (query, key) pair, the same unit as the GEMM yardstick. BM_IndexerScoreGemm is the f64 GEMM of
// exactly the logits' shape ([rows*H, 128] x [128, keys]), the ceiling the logits can approach.
//   OMP_NUM_THREADS=2 build/<dir>/reference/reference_bench --benchmark_filter='Indexer|Gemm'
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <vector>

#include "core/rng.h"
#include "reference/indexer.h"

namespace {

using namespace attncheck;
namespace ix = ref::indexer;

constexpr int64_t D = ix::kHeadDim;

struct Scores {
  Tensor q, weights, k, k_scale;
};

Scores make_scores(int64_t rows, int64_t heads, int64_t keys) {
  Tensor qb = Tensor::empty(DType::bf16, {rows, heads, D});
  Tensor raw = Tensor::empty(DType::bf16, {rows, heads});
  Tensor kb = Tensor::empty(DType::bf16, {keys, D});
  fill_normal(qb, Rng("indexer_bench", "q"));
  fill_normal(raw, Rng("indexer_bench", "w"));
  fill_normal(kb, Rng("indexer_bench", "k"));
  const auto q = ix::quantize_q(qb, raw, DType::e4m3fn, 448.0f);
  const auto k = ix::quantize_k(kb, DType::e4m3fn, 448.0f);
  return {q.q_fp8, q.weights, k.values, k.scales};
}

void rate(benchmark::State& state, double pairs, int64_t heads) {
  state.counters["GFLOP"] = benchmark::Counter(2.0 * static_cast<double>(D * heads) * pairs * 1e-9,
                                               benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = Eigen::nbThreads();
}

Tensor i32(std::vector<int64_t> v) {
  Tensor t = Tensor::empty(DType::i32, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i)
    t.at<int32_t>({static_cast<int64_t>(i)}) = static_cast<int32_t>(v[i]);
  return t;
}

// Prefill logits, every query seeing every key. Args: queries, heads, keys.
void BM_IndexerMqaLogits(benchmark::State& state) {
  const int64_t M = state.range(0), H = state.range(1), N = state.range(2);
  const Scores s = make_scores(M, H, N);
  const Tensor ks = i32(std::vector<int64_t>(static_cast<size_t>(M), 0));
  const Tensor ke = i32(std::vector<int64_t>(static_cast<size_t>(M), N));
  for (auto _ : state) {
    Tensor out = ix::mqa_logits(s.q, s.k, s.k_scale, s.weights, ks, ke);
    benchmark::DoNotOptimize(out.data());
  }
  rate(state, static_cast<double>(M * N), H);
}
BENCHMARK(BM_IndexerMqaLogits)
    ->ArgNames({"M", "H", "N"})
    ->Args({64, 64, 4096})
    ->Args({256, 32, 2048})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The f64 product of the same shape: [M*H, 128] x [128, N]. Args: queries, heads, keys.
void BM_IndexerScoreGemm(benchmark::State& state) {
  const int64_t M = state.range(0), H = state.range(1), N = state.range(2);
  using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Mat q = Mat::Random(M * H, D), k = Mat::Random(N, D);
  Mat s(M * H, N);
  for (auto _ : state) {
    s.noalias() = q * k.transpose();
    benchmark::DoNotOptimize(s.data());
  }
  rate(state, static_cast<double>(M * N), H);
}
BENCHMARK(BM_IndexerScoreGemm)
    ->ArgNames({"M", "H", "N"})
    ->Args({64, 64, 4096})
    ->Args({256, 32, 2048})
    ->Args({1, 64, 8192})  // one decode request: the paged reference's product
    ->Args({2, 32, 16384})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Paged decode logits through a SHUFFLE cache (block size 64). Args: requests, next_n, heads, ctx.
void BM_IndexerPagedLogits(benchmark::State& state) {
  const int64_t B = state.range(0), NN = state.range(1), H = state.range(2), ctx = state.range(3);
  const int64_t bs = 64, W = (ctx + bs - 1) / bs;
  const Scores s = make_scores(B * NN, H, 1);
  Tensor cache = Tensor::zeros(DType::u8, {B * W, bs, ix::kTokenBytes});
  Tensor kb = Tensor::empty(DType::bf16, {B * ctx, D});
  fill_normal(kb, Rng("indexer_bench", "cache_k"));
  Tensor slots = Tensor::empty(DType::i64, {B * ctx});
  Tensor table = Tensor::empty(DType::i32, {B, W});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < W; ++j)
      table.at<int32_t>({b, j}) = static_cast<int32_t>(b * W + (j * 7) % W);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t p = 0; p < ctx; ++p)
      slots.at<int64_t>({b * ctx + p}) = table.at<int32_t>({b, p / bs}) * bs + p % bs;
  cache = ix::write_k_cache(cache, kb, slots, ix::CacheLayout::shuffle, DType::e4m3fn, 448.0f);
  const Tensor lens = i32(std::vector<int64_t>(static_cast<size_t>(B), ctx));
  const Tensor q = s.q.reshape({B, NN, H, D});
  for (auto _ : state) {
    Tensor out =
        ix::paged_mqa_logits(q, {cache, bs, ix::CacheLayout::shuffle}, s.weights, lens, table, ctx);
    benchmark::DoNotOptimize(out.data());
  }
  double pairs = 0;
  for (int64_t n = 0; n < NN; ++n)
    pairs += static_cast<double>(B * ix::decode_row_end(ctx, NN, n, ctx));
  rate(state, pairs, H);
}
BENCHMARK(BM_IndexerPagedLogits)
    ->ArgNames({"B", "next_n", "H", "ctx"})
    ->Args({8, 1, 64, 8192})
    ->Args({4, 2, 32, 16384})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Top-k over decode rows. Args: rows, width, k.
void BM_IndexerTopk(benchmark::State& state) {
  const int64_t rows = state.range(0), width = state.range(1), k = state.range(2);
  Tensor logits = Tensor::empty(DType::f32, {rows, width});
  fill_normal(logits, Rng("indexer_bench", "logits"));
  const Tensor lens = i32(std::vector<int64_t>(static_cast<size_t>(rows), width));
  for (auto _ : state) {
    Tensor out = ix::topk_decode(logits, lens, 1, k);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["Melem"] = benchmark::Counter(static_cast<double>(rows * width) * 1e-6,
                                               benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_IndexerTopk)
    ->ArgNames({"rows", "W", "k"})
    ->Args({16, 65536, 2048})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
