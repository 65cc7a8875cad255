// core_bench: the input generators' cost per element, the batched fills (core/rng.cpp) under each
// Philox kernel against their per-element definition (rng_definition.h, the generators before
// batching). A benchmark, not a test: read "s/elem" (seconds per element) across rows of one run.
//   build/<dir>/harness/core_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <string>

#include "core/rng.h"
#include "core/tests/rng_definition.h"

namespace {

using namespace attncheck;

// Which implementation a row times.
enum Impl : int64_t { kDefinition, kPortable, kAvx2 };

// Selects the kernel of `impl` for the benchmark's duration; false (row skipped) if unavailable.
bool use(benchmark::State& state, Impl impl) {
  const PhiloxKernel k = impl == kAvx2 ? PhiloxKernel::avx2 : PhiloxKernel::portable;
  if (!philox_kernel_available(k)) {
    state.SkipWithError("this CPU lacks the kernel");
    return false;
  }
  set_philox_kernel(k);
  return true;
}

void label(benchmark::State& state, const Tensor& t, Impl impl) {
  const char* names[] = {"per-element definition", "batched, portable", "batched, avx2"};
  state.SetLabel(std::string(dtype_name(t.dtype())) + " " + std::to_string(t.numel()) + " el, " +
                 names[impl]);
  state.counters["s/elem"] = benchmark::Counter(
      static_cast<double>(t.numel()),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// Times `fill` (the per-element definition's or the batched one's, by impl) over `t`.
template <class Definition, class Batched>
void time_fill(benchmark::State& state, const Tensor& t, Impl impl, Definition definition,
               Batched batched) {
  const Rng rng("core_bench", "x");
  if (impl != kDefinition && !use(state, impl)) return;
  for (auto _ : state) {
    if (impl == kDefinition)
      definition(t, rng);
    else
      batched(t, rng);
    benchmark::DoNotOptimize(t.data());
  }
  label(state, t, impl);
  reset_philox_kernel();
}

auto normal_definition = [](const Tensor& t, const Rng& rng) {
  rng_definition::fill_normal(t, rng);
};
auto normal_batched = [](const Tensor& t, const Rng& rng) { fill_normal(t, rng); };

// Args: dtype, elements, Impl. About 4 MB of bf16 / f16, 4 MB of fp8, 8 MB of f32.
void BM_FillNormal(benchmark::State& state) {
  const Tensor t = Tensor::empty(static_cast<DType>(state.range(0)), {state.range(1) / 1024, 1024});
  time_fill(state, t, static_cast<Impl>(state.range(2)), normal_definition, normal_batched);
}

// The same over a transposed view (every element in its own run of one).
void BM_FillNormalTransposed(benchmark::State& state) {
  const Tensor t = Tensor::empty(DType::bf16, {1024, 2048}).permute({1, 0});
  time_fill(state, t, static_cast<Impl>(state.range(0)), normal_definition, normal_batched);
}

void BM_FillUniform(benchmark::State& state) {
  time_fill(
      state, Tensor::empty(DType::bf16, {2048, 1024}), static_cast<Impl>(state.range(0)),
      [](const Tensor& t, const Rng& rng) { rng_definition::fill_uniform(t, rng, -1.0, 1.0); },
      [](const Tensor& t, const Rng& rng) { fill_uniform(t, rng, -1.0, 1.0); });
}

void BM_FillFp8Codes(benchmark::State& state) {
  time_fill(
      state, Tensor::empty(DType::e4m3fn, {4096, 1024}), static_cast<Impl>(state.range(0)),
      [](const Tensor& t, const Rng& rng) { rng_definition::fill_fp8_codes(t, rng, 448.0); },
      [](const Tensor& t, const Rng& rng) { fill_fp8_codes(t, rng, 448.0); });
}

void normal_args(benchmark::internal::Benchmark* b) {
  const std::pair<DType, int64_t> sizes[] = {{DType::bf16, 2 << 20},
                                             {DType::f16, 2 << 20},
                                             {DType::e4m3fn, 4 << 20},
                                             {DType::f32, 2 << 20}};
  for (const auto& [dt, n] : sizes)
    for (Impl impl : {kDefinition, kPortable, kAvx2}) b->Args({static_cast<int64_t>(dt), n, impl});
}

void impl_args(benchmark::internal::Benchmark* b) {
  for (Impl impl : {kDefinition, kPortable, kAvx2}) b->Arg(impl);
}

BENCHMARK(BM_FillNormal)->Apply(normal_args)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FillNormalTransposed)->Apply(impl_args)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FillUniform)->Apply(impl_args)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FillFp8Codes)->Apply(impl_args)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
