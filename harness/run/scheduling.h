// How a run spreads its cases (docs/ci.md "Throughput"): worker pools per visible GPU, sized from
// the cores and the GPU's memory, and case durations measured by an earlier run, so that shards
// (CI matrix jobs) take about the same time and each pool starts the longest cases first.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace attncheck {

struct VisibleGpu {
  std::string id;             // as the visibility variable takes it ("0", "GPU-<uuid>", ...)
  uint64_t memory_bytes = 0;  // 0: unknown
};

// The GPUs this process may use, without initializing a GPU runtime: the list in
// CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES when set, else nvidia-smi's
// list, else the AMD GPUs in /sys/class/kfd. *variable: the variable that selects one of them
// for a worker. Empty when there is none.
// The device-selection variable of this machine's GPUs, as visible_gpus() would name it, without
// asking nvidia-smi for memory sizes (a process per run: slow on a busy host, and not needed
// when the workers per GPU are given).
std::string gpu_variable();
std::vector<VisibleGpu> visible_gpus(std::string* variable);

struct GpuPool {
  VisibleGpu gpu;
  int jobs = 0;  // cases at once on this GPU
};

struct PoolPlan {
  std::vector<GpuPool> pools;  // empty: one pool, no GPU selected per worker
  int jobs = 1;                // cases at once, in all
  // Cases one worker process runs at once, in threads sharing its GPU context (run/worker.h):
  // a pool of J cases at once is ceil(J / threads) processes.
  int threads = 1;
  int cpu_threads = 1;  // OpenMP threads of each case's CPU reference
  // Worker processes in all.
  int processes() const;
  std::string variable;  // CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES
  std::string why;       // how the sizes were chosen, in words
  // Per worker process slot: the settings of its environment (WorkerSpec::slot_env), the pools
  // interleaved so that the first workers spread over every GPU.
  std::vector<std::vector<std::string>> slot_env() const;
};

// ctest's resource allocation (`ctest --resource-spec-file ci/ctest-resources.json`): when
// CTEST_RESOURCE_GROUP_0_GPUS is set ("id:3,slots:1"), this process sees only that GPU
// (HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES). Call before any GPU runtime is initialized.
void use_ctest_gpu();

// The memory one worker process may hold on a GPU: its context and one case's buffers (a launch
// holds the launch lock from its first allocation until it has given its buffers back, so the
// cases of a process's threads are on the GPU one at a time, run/device.h); the largest problems
// (sparse caches past 2^31 bytes) need a few GiB.
constexpr uint64_t kGpuMemoryPerWorker = uint64_t{6} << 30;
// The sparse blocks (large-offset cases' extents, run/device.cpp SparseBlockCache) one worker
// process may keep between launches: a quarter of its GPU's memory shared by the processes on it,
// at most kSparseBlockCacheMax; none when the memory is unknown and several processes share it
// (they cannot release each other's blocks when an allocation fails).
constexpr uint64_t kSparseBlockCacheMax = uint64_t{24} << 30;
uint64_t sparse_block_cache_share(uint64_t memory_bytes, int processes);
// And per further thread of it: the device blocks its runner keeps between launches (at most
// DeviceBlockCache::kKept, run/device.cpp).
constexpr uint64_t kGpuMemoryPerThread = uint64_t{512} << 20;

// Cases at once that fit `memory_bytes` of a GPU in worker processes of `threads` threads each (in
// one-case processes when not even one such process fits); at least 1.
int cases_fitting(uint64_t memory_bytes, int threads);

// Cases a worker process runs at once on a GPU unless told (--threads-per-worker): one process,
// so one context, per GPU of up to this many cases. The contexts of many processes are created
// one at a time host-wide and time-slice the GPU (docs/results.md).
constexpr int kThreadsPerWorker = 16;
// `attncheck mutants`: two processes per GPU of up to this many cases each (its cases wait for the
// launch lock more than for the cores).
constexpr int kMutantThreadsPerWorker = 8;

// Pools for `gpus` on a host of `cores` cores. jobs > 0: that many cases at once in all, spread
// over the GPUs; else jobs_per_gpu > 0 per GPU; else per GPU min(cores / GPUs, the cases that
// fit its memory in processes of the threads asked: cases_fitting), at least 1. No GPU: `jobs` (or
// `cores`) cases at once in one pool. Each case's reference gets cores / cases-at-once threads (at
// least 1), so that they never oversubscribe the host. threads > 0: cases per worker process; 0:
// kThreadsPerWorker with GPUs, 1 without (no context to share). The threads per process are evened
// out: 13 cases at once with 8 threads are 2 processes of 7.
PoolPlan plan_pools(const std::vector<VisibleGpu>& gpus, int cores, int jobs, int jobs_per_gpu,
                    int threads = 1);

// ci/case-durations.json: milliseconds per case id, as a run measured them.
class CaseDurations {
 public:
  // Throws std::runtime_error naming the file and the field.
  static CaseDurations load(const std::string& path);
  static CaseDurations from_map(std::map<std::string, double> ms);
  // The case's measured duration; for an unmeasured case, the median of its op's measured cases
  // (the op is the id's part before '/'), else of all, else 1 ms.
  double estimate_ms(const std::string& id) const;
  size_t size() const { return ms_.size(); }

 private:
  std::map<std::string, double> ms_;
  std::map<std::string, double> op_median_;
  double median_ = 1;
};

// Shard of each of `ids` (0..count-1): longest first, each to the shard with the least time so
// far (ties: the lower shard, then the earlier case), so shards end close together. Deterministic
// for one list and one durations file.
std::vector<int> balanced_shards(const std::vector<std::string>& ids, int count,
                                 const CaseDurations& durations);

// Indices of `ids`, longest estimated first (stable): the order a pool starts them in.
std::vector<size_t> longest_first(const std::vector<std::string>& ids,
                                  const CaseDurations& durations);

// Several libraries' cases as one task order (`attncheck mutants`): `lanes` lanes, each holding a
// library until its cases are given out and then taking the next non-empty one in order, give one
// case each in turn. With as many lanes as cases run at once, each library has about one case in
// flight: its first failures can stop it before many more started, and a worker thread can keep
// to one library. (library, case) pairs; every case once, each library's in its own order.
std::vector<std::pair<size_t, size_t>> interleave_in_lanes(
    const std::vector<std::vector<size_t>>& cases_per_library, size_t lanes);

}  // namespace attncheck
