// The MLA references (dense decode and sparse) at production shapes, read against
// BM_EigenGemmF64 of main.cpp in the same run: "GFLOP" is the useful QK^T + PV work per second
// (2 * keys * heads * (Lk + Lv) per query row), the same unit as the GEMM yardstick.
//   build/<dir>/reference/reference_bench --benchmark_filter='Mla|Gemm'
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/rng.h"
#include "reference/mla_decode.h"
#include "reference/page_indices.h"
#include "reference/sparse_mla.h"

namespace {

using namespace attncheck;

struct Inputs {
  Tensor q, cache, table, lens, qsl;
  double keys = 0;  // sum over query rows of visible keys
};

// B requests of kv length ctx, qlen query tokens each, bf16, block size 16, shuffled blocks.
Inputs make_inputs(int64_t heads, int64_t qlen, int64_t B, int64_t ctx) {
  const int64_t P = 16, W = (ctx + P - 1) / P, nb = B * W;
  Inputs in;
  in.q = Tensor::empty(DType::bf16, {B * qlen, heads, 576});
  fill_normal(in.q, Rng("mla_bench", "q"), 0.0, 3.0);
  in.cache = Tensor::empty(DType::bf16, {nb, P, 576});
  fill_uniform(in.cache, Rng("mla_bench", "cache"), -1.0, 1.0);
  Rng rng("mla_bench", "blocks");
  const auto ids = permutation(nb, rng);
  in.table = Tensor::empty(DType::i32, {B, W});
  in.lens = Tensor::empty(DType::i32, {B});
  in.qsl = Tensor::empty(DType::i32, {B + 1});
  for (int64_t b = 0; b < B; ++b) {
    in.lens.at<int32_t>({b}) = static_cast<int32_t>(ctx);
    for (int64_t j = 0; j < W; ++j)
      in.table.at<int32_t>({b, j}) = static_cast<int32_t>(ids[static_cast<size_t>(b * W + j)]);
    for (int64_t i = 0; i < qlen; ++i) in.keys += static_cast<double>(ctx - qlen + i + 1);
  }
  for (int64_t b = 0; b <= B; ++b) in.qsl.at<int32_t>({b}) = static_cast<int32_t>(b * qlen);
  return in;
}

void report(benchmark::State& state, double keys, int64_t heads) {
  state.counters["GFLOP"] =
      benchmark::Counter(2.0 * keys * static_cast<double>(heads) * (576 + 512) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}

// Args: heads, qlen, requests, kv length.
void BM_MlaDecodeRef(benchmark::State& state) {
  const int64_t heads = state.range(0);
  const Inputs in = make_inputs(heads, state.range(1), state.range(2), state.range(3));
  for (auto _ : state) {
    auto r = ref::mla_decode(in.q, {in.cache, 1.0}, in.table, in.lens, in.qsl, 1 / 24.0, 512);
    benchmark::DoNotOptimize(r.out.data());
  }
  report(state,
         in.keys * static_cast<double>(std::max<int64_t>(heads, 16)) / static_cast<double>(heads),
         heads);  // padded heads are computed too: count the work done
}
BENCHMARK(BM_MlaDecodeRef)
    ->ArgNames({"heads", "qlen", "B", "ctx"})
    ->Args({128, 1, 4, 1024})
    ->Args({16, 4, 8, 1024})
    ->Args({4, 1, 16, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Args: heads, tokens, topk (every token of one request of kv length 2 * topk; random selection).
void BM_SparseMlaRef(benchmark::State& state) {
  const int64_t heads = state.range(0), T = state.range(1), topk = state.range(2);
  const Inputs in = make_inputs(heads, T, 1, 2 * topk);
  Tensor local = Tensor::empty(DType::i32, {T, topk});
  Rng rng("mla_bench", "topk");
  for (int64_t t = 0; t < T; ++t) {
    const auto order = permutation(2 * topk - T + t + 1, rng);
    for (int64_t j = 0; j < topk; ++j)
      local.at<int32_t>({t, j}) = static_cast<int32_t>(order[static_cast<size_t>(j)]);
  }
  Tensor req = Tensor::zeros(DType::i32, {T});
  for (int64_t t = 0; t < T; ++t) req.at<int32_t>({t}) = 0;
  const auto idx = ref::sparse_mla_pack(ref::sparse_mla_global_indices(local, req, in.table, 16));
  for (auto _ : state) {
    auto r = ref::sparse_mla(in.q, {in.cache, 1.0}, idx, 1 / 24.0, 512);
    benchmark::DoNotOptimize(r.out.data());
  }
  report(state, static_cast<double>(T * topk), heads);
}
BENCHMARK(BM_SparseMlaRef)
    ->ArgNames({"heads", "T", "topk"})
    ->Args({128, 4, 2048})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
