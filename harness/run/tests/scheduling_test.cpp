// Worker pools per GPU, case durations and shards balanced by them (run/scheduling.h).
#include "run/scheduling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "core/result.h"

namespace attncheck {
namespace {

constexpr uint64_t GiB = uint64_t{1} << 30;

TEST(PoolPlan, OnePoolPerGpuFromCoresAndMemory) {
  // 32 cores, two 141 GiB GPUs: the cores bound each pool (16), not the memory (23).
  const auto plan = plan_pools({{"0", 141 * GiB}, {"1", 141 * GiB}}, 32, 0, 0);
  ASSERT_EQ(plan.pools.size(), 2u);
  EXPECT_EQ(plan.pools[0].jobs, 16);
  EXPECT_EQ(plan.pools[1].jobs, 16);
  EXPECT_EQ(plan.jobs, 32);
  EXPECT_EQ(plan.cpu_threads, 1);
  // A small GPU: one worker per kGpuMemoryPerWorker of its memory.
  const auto small = plan_pools({{"0", 24 * GiB}}, 64, 0, 0);
  EXPECT_EQ(small.jobs, static_cast<int>(24 * GiB / kGpuMemoryPerWorker));
  EXPECT_EQ(small.cpu_threads, 64 / small.jobs);  // the idle cores go to the references
  // Threads share a process's context and hold the GPU one case at a time: an 80 GiB GPU takes
  // the 16 cases its cores allow in one process (6 GiB + 15 x 512 MiB), one-case processes 13.
  const auto h100 = plan_pools({{"0", 80 * GiB}}, 16, 0, 0, 16);
  EXPECT_EQ(h100.jobs, 16);
  EXPECT_EQ(h100.processes(), 1);
  EXPECT_EQ(plan_pools({{"0", 80 * GiB}}, 16, 0, 0, 1).jobs, 13);
  EXPECT_EQ(cases_fitting(24 * GiB, 16), 16);  // 13.5 GiB: one process of 16
  EXPECT_EQ(cases_fitting(12 * GiB, 16), 2);   // not one such process: one-case processes
  EXPECT_EQ(cases_fitting(1 * GiB, 4), 1);
}

TEST(PoolPlan, OverridesAndNoGpu) {
  const std::vector<VisibleGpu> two = {{"3", 0}, {"5", 0}};
  const auto per_gpu = plan_pools(two, 16, 0, 3);
  EXPECT_EQ(per_gpu.jobs, 6);
  EXPECT_EQ(per_gpu.cpu_threads, 2);
  const auto spread = plan_pools(two, 16, 5, 0);  // --jobs 5 over two GPUs: 3 + 2
  ASSERT_EQ(spread.pools.size(), 2u);
  EXPECT_EQ(spread.pools[0].jobs + spread.pools[1].jobs, 5);
  EXPECT_EQ(spread.pools[0].jobs, 3);
  const auto one_job = plan_pools(two, 16, 1, 0);  // the second GPU gets no worker
  EXPECT_EQ(one_job.pools.size(), 1u);
  const auto none = plan_pools({}, 12, 0, 0);
  EXPECT_TRUE(none.pools.empty());
  EXPECT_EQ(none.jobs, 12);
  EXPECT_EQ(none.cpu_threads, 1);
}

TEST(PoolPlan, CasesPerWorkerProcess) {
  // A GPU's pool is one process of up to kThreadsPerWorker cases unless told.
  const auto plan = plan_pools({{"0", 141 * GiB}, {"1", 141 * GiB}}, 32, 0, 0, 0);
  EXPECT_EQ(plan.jobs, 32);
  EXPECT_EQ(plan.threads, 16);
  EXPECT_EQ(plan.processes(), 2);
  // 13 cases at once, 8 per process asked: 2 processes of 7 (evened out).
  const auto odd = plan_pools({{"0", 0}}, 16, 0, 13, 8);
  EXPECT_EQ(odd.threads, 7);
  EXPECT_EQ(odd.processes(), 2);
  PoolPlan named = odd;
  named.variable = "CUDA_VISIBLE_DEVICES";
  EXPECT_EQ(named.slot_env().size(), 2u);  // one environment per process
  // Without a GPU there is no context to share: a process per case.
  const auto cpu = plan_pools({}, 12, 0, 0, 0);
  EXPECT_EQ(cpu.threads, 1);
  EXPECT_EQ(cpu.processes(), 12);
  // One thread asked: the plan of processes, as before threads.
  const auto one = plan_pools({{"0", 0}}, 16, 0, 0, 1);
  EXPECT_EQ(one.threads, 1);
  EXPECT_EQ(one.processes(), 16);
}

TEST(PoolPlan, SlotsInterleaveThePoolsAndSetTheThreads) {
  PoolPlan plan = plan_pools({{"0", 0}, {"1", 0}}, 6, 0, 0);
  plan.variable = "CUDA_VISIBLE_DEVICES";
  const auto env = plan.slot_env();
  ASSERT_EQ(env.size(), 6u);
  // Three processes per GPU of unknown memory: none keeps sparse blocks.
  EXPECT_EQ(env[0], (std::vector<std::string>{"CUDA_VISIBLE_DEVICES=0", "OMP_NUM_THREADS=1",
                                              "ATTNCHECK_SPARSE_BLOCK_CACHE_BYTES=0"}));
  EXPECT_EQ(env[1].front(), "CUDA_VISIBLE_DEVICES=1");
  EXPECT_EQ(std::count_if(env.begin(), env.end(),
                          [](const auto& e) { return e.front() == "CUDA_VISIBLE_DEVICES=1"; }),
            3);
}

// Each process on a GPU may keep a share of a quarter of its memory in sparse blocks, since the
// processes cannot release each other's blocks when an allocation fails.
TEST(PoolPlan, SparseBlocksKeptAreAShareOfTheGpu) {
  const uint64_t gib = uint64_t{1} << 30;
  EXPECT_EQ(sparse_block_cache_share(140 * gib, 1), kSparseBlockCacheMax);
  EXPECT_EQ(sparse_block_cache_share(140 * gib, 2), 140 * gib / 8);
  EXPECT_EQ(sparse_block_cache_share(140 * gib, 7), 5 * gib);
  EXPECT_EQ(sparse_block_cache_share(0, 1), kSparseBlockCacheMax);
  EXPECT_EQ(sparse_block_cache_share(0, 2), 0u);
  PoolPlan plan = plan_pools({{"0", 80 * gib}}, 4, 0, 0, 2);
  plan.variable = "CUDA_VISIBLE_DEVICES";
  const auto env = plan.slot_env();
  ASSERT_EQ(env.size(), 2u);
  EXPECT_EQ(env[1].back(), "ATTNCHECK_SPARSE_BLOCK_CACHE_BYTES=" + std::to_string(10 * gib));
}

TEST(CaseDurations, EstimatesUnmeasuredCasesFromTheirOp) {
  const auto d =
      CaseDurations::from_map({{"rope/a", 1}, {"rope/b", 3}, {"rope/c", 5}, {"mla_decode/x", 100}});
  EXPECT_EQ(d.estimate_ms("rope/b"), 3);
  EXPECT_EQ(d.estimate_ms("rope/new"), 3);       // the op's median
  EXPECT_EQ(d.estimate_ms("kv_gather/new"), 5);  // no measured case of the op: all cases' median
  EXPECT_EQ(CaseDurations::from_map({}).estimate_ms("x/y"), 1);
}

TEST(CaseDurations, LoadNamesTheBadField) {
  const auto path = std::filesystem::temp_directory_path() / "attncheck_durations_test.json";
  std::ofstream(path) << R"({"format": "attncheck-case-durations/1", "cases": {"rope/a": "slow"}})";
  try {
    (void)CaseDurations::load(path.string());
    FAIL() << "a string duration was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cases.\"rope/a\""), std::string::npos) << e.what();
  }
  std::ofstream(path) << R"({"cases": {"rope/a": 2.5}})";
  EXPECT_EQ(CaseDurations::load(path.string()).estimate_ms("rope/a"), 2.5);
  std::filesystem::remove(path);
  EXPECT_THROW((void)CaseDurations::load(path.string()), std::runtime_error);
}

TEST(BalancedShards, ShardsEndWithinTenPercentWhereCountsDoNot) {
  // A tier whose slow cases sit together, as groups of one op do: every 8th position by count
  // takes them all into one shard.
  std::map<std::string, double> ms;
  std::vector<std::string> ids;
  for (int i = 0; i < 400; ++i) {
    ids.push_back("op" + std::to_string(i % 5) + "/case" + std::to_string(i));
    ms[ids.back()] = i % 8 == 0 ? 200.0 + i : 3.0 + i % 7;
  }
  const auto d = CaseDurations::from_map(ms);
  auto spread = [&](const std::vector<int>& shard_of, int n) {
    std::vector<double> load(static_cast<size_t>(n), 0);
    for (size_t i = 0; i < ids.size(); ++i) load[static_cast<size_t>(shard_of[i])] += ms[ids[i]];
    const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    return (*hi - *lo) / *hi;
  };
  std::vector<int> by_count(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) by_count[i] = static_cast<int>(i % 8);
  EXPECT_GT(spread(by_count, 8), 0.5);
  const auto balanced = balanced_shards(ids, 8, d);
  EXPECT_LT(spread(balanced, 8), 0.10);
  EXPECT_EQ(balanced, balanced_shards(ids, 8, d));  // deterministic
  EXPECT_EQ(balanced_shards(ids, 1, d), std::vector<int>(ids.size(), 0));
}

TEST(BalancedShards, LongestFirstIsStable) {
  const auto d = CaseDurations::from_map({{"a/1", 5}, {"a/2", 9}, {"a/3", 5}});
  EXPECT_EQ(longest_first({"a/1", "a/2", "a/3"}, d), (std::vector<size_t>{1, 0, 2}));
}

TEST(InterleaveInLanes, EachLaneKeepsOneLibraryAndTakesTheNextWhenItEnds) {
  using Order = std::vector<std::pair<size_t, size_t>>;
  // Libraries 0..3 with 3, 1, 0 and 2 cases; two lanes.
  const std::vector<std::vector<size_t>> cases = {{10, 11, 12}, {20}, {}, {40, 41}};
  EXPECT_EQ(interleave_in_lanes(cases, 2),
            (Order{{0, 10}, {1, 20}, {0, 11}, {3, 40}, {0, 12}, {3, 41}}));
  // One lane: library after library; more lanes than libraries: round robin.
  EXPECT_EQ(interleave_in_lanes(cases, 1),
            (Order{{0, 10}, {0, 11}, {0, 12}, {1, 20}, {3, 40}, {3, 41}}));
  EXPECT_EQ(interleave_in_lanes(cases, 8),
            (Order{{0, 10}, {1, 20}, {3, 40}, {0, 11}, {3, 41}, {0, 12}}));
  EXPECT_TRUE(interleave_in_lanes({{}, {}}, 3).empty());
}

TEST(Timings, PhasesRoundTripThroughJsonAndSumToTheTotal) {
  Result r;
  r.id = "rope/x";
  r.op = "rope";
  r.verdict = Verdict::passed;
  r.mode = Mode::kernel;
  r.timings.generate_ms = 1.5;
  r.timings.golden_ms = 0.25;
  r.timings.upload_ms = 2;
  r.timings.kernel_ms = 0.125;
  r.timings.relaunch_ms = 0.5;
  r.timings.compare_ms = 3;
  r.timings.ipc_ms = 0.75;
  r.timings.launches = 2;
  const auto j = r.to_json();
  EXPECT_EQ(j["timings_ms"]["upload"], 2);
  EXPECT_FALSE(j["timings_ms"].contains("reference"));  // phases that took no time are left out
  const Result back = Result::from_json(j);
  EXPECT_EQ(back.timings.launches, 2);
  EXPECT_DOUBLE_EQ(back.timings.total_ms(), 1.5 + 0.25 + 2 + 0.125 + 0.5 + 3 + 0.75);
  for (const auto& phase : timing_phase_names())
    EXPECT_DOUBLE_EQ(timing_of(back.timings, phase), timing_of(r.timings, phase)) << phase;
}

}  // namespace
}  // namespace attncheck
