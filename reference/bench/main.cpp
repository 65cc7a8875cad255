// reference_bench: the main() of the reference benchmarks plus a yardstick. Op benchmarks
// (reference/bench/<op>.cpp, one per op family) run in the same binary, so their times can be read
// against what float64 GEMM achieves on this machine in the same run:
//   build/<dir>/reference/reference_bench --benchmark_counters_tabular=true
//
// Threads: Eigen parallelizes GEMM with OpenMP (the reference links OpenMP::OpenMP_CXX). We set
// Eigen's thread count to omp_get_max_threads() explicitly -- every core, or OMP_NUM_THREADS when
// set -- and print it in the benchmark context, so a number is never read without its thread count.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <Eigen/Core>
#include <string>

#include "core/rng.h"

namespace {

using RowMajor = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

RowMajor random_matrix(Eigen::Index rows, Eigen::Index cols, const char* name) {
  const attncheck::Rng rng("reference_bench", name);
  RowMajor m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i)
    m.data()[i] = rng.uniform_at(static_cast<uint64_t>(i)) - 0.5;
  return m;
}

// Counter "GFLOP" is a rate: "GFLOP=5.7/s" reads 5.7 GFLOP per second.
// C[M,N] = A[M,K] B[K,N] in float64, row-major like the reference's tensors. The default shape is
// an MLA-decode-like product: 256 query rows x Lk = 576 against 1024 cached tokens.
// Args: M, K, N, Eigen threads (0 = the configured default).
void BM_EigenGemmF64(benchmark::State& state) {
  const auto m = state.range(0), k = state.range(1), n = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  const int saved = Eigen::nbThreads();
  if (threads > 0) Eigen::setNbThreads(threads);
  const RowMajor a = random_matrix(m, k, "a");
  const RowMajor b = random_matrix(k, n, "b");
  RowMajor c(m, n);
  for (auto _ : state) {
    c.noalias() = a * b;
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP"] = benchmark::Counter(2.0 * static_cast<double>(m * k * n) * 1e-9,
                                               benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = Eigen::nbThreads();
  Eigen::setNbThreads(saved);
}
BENCHMARK(BM_EigenGemmF64)
    ->ArgNames({"M", "K", "N", "threads"})
    ->Args({256, 576, 1024, 0})
    ->Args({256, 576, 1024, 1})
    ->Args({64, 512, 64, 0})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();  // wall time: CPU time would add up every thread's time

}  // namespace

// BENCHMARK_MAIN() with the thread setup in front of it.
int main(int argc, char** argv) {
  Eigen::setNbThreads(omp_get_max_threads());
  benchmark::AddCustomContext("eigen_threads", std::to_string(Eigen::nbThreads()));
  benchmark::AddCustomContext("omp_num_procs", std::to_string(omp_get_num_procs()));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
