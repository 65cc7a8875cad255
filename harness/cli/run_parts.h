// What `run` and `mutants` share (run_command.cpp): the pools, the worker processes' arguments,
// run.json and the profile.
#pragma once
#include <cstdint>
#include <future>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/safe_output.h"
#include "run/pool.h"
#include "run/results.h"
#include "run/scheduling.h"
#include "run/worker.h"

namespace attncheck::cli {

// The pools of a run: GPUs from --gpus (auto: the visible ones; none in reference mode), sizes
// from --jobs / --jobs-per-gpu or the cores and each GPU's memory. Throws std::invalid_argument
// for a bad --gpus.
PoolPlan pools_for(const RunArgs& a, bool kernel_mode);
// "GPU 0: 13 case(s) at once (CUDA_VISIBLE_DEVICES) in 1 worker process(es) of 13 threads, ..."
std::string describe_pools(const PoolPlan& plan);

// --worker-memory: "0" or "none" (no limit), bytes with an optional K/M/G/T suffix (powers of
// 1024), or "" for the default: three quarters of the machine's memory shared by the workers, at
// least 2 GiB each. Throws std::invalid_argument.
uint64_t worker_memory_limit(const std::string& text, int jobs);

// --durations FILE into `into` (left empty without one); false, having said why, when the file
// cannot be read.
bool load_durations(const std::string& path, std::optional<CaseDurations>& into);

// The run's one verdict per golden file (set_aside_unreadable_goldens: the cases of unreadable
// files are moved behind the `runnable` others) and the stamps of the readable ones, for the
// workers' config (WorkerConfig::golden_checked). Nothing is checked without a golden directory.
// Throws std::runtime_error naming what failed.
struct GoldenVerdicts {
  size_t runnable = 0;
  std::map<std::string, std::string> unreadable;  // op -> why
  std::map<std::string, std::string> checked;     // op -> stamp
};
GoldenVerdicts check_golden_files(const std::string& dir, std::vector<Case>& cases);
// A pool's way to the same verdicts: the stamps now, the checks in the background, taken while the
// workers start (PoolCallbacks::before_dispatch). The cases stay in place (runnable: all of them).
struct GoldenCheck {
  GoldenVerdicts verdicts;
  std::future<std::map<std::string, std::string>> pending;  // op -> why, unreadable files
  // Waits for the checks (once): fills verdicts.unreadable and drops those files' stamps.
  void finish();
};
GoldenCheck start_golden_check(const std::string& dir, const std::vector<Case>& cases);

// --out, opened and locked until the handle closes: a second run into it is refused instead of
// interleaving or replacing results. Throws std::runtime_error naming it.
DirHandle lock_out_dir(const std::string& out);

// The pool's WorkerSpec for `plan`: its processes and threads, each slot's environment, the case
// timeout and the memory limit (--worker-memory: std::invalid_argument when malformed).
WorkerSpec pool_worker_spec(const PoolPlan& plan, const RunArgs& a);

// The first line of `s`, cut at `max` characters.
std::string first_line(const std::string& s, size_t max = 400);

// Per pool (GPU): cases, the sum of their round trips, and when its last case ended.
struct PoolUse {
  std::string gpu;
  int jobs = 0;
  int64_t cases = 0;
  double busy_s = 0;
  double finished_s = 0;
  int starts = 0;      // worker processes that said hello: the first ones and replacements
  double start_s = 0;  // their seconds from spawn to hello, in all
  double longest_start_s = 0;
};
nlohmann::json pools_json(const std::vector<PoolUse>& use);
// One PoolUse per pool of the plan (one without GPUs), nothing used yet.
std::vector<PoolUse> pool_uses(const PoolPlan& plan);
// A case's round trip of `ms`, ended `ended_s` into the run, counted to the pool of worker slot
// `slot` (`slot_env`, plan.slot_env(): the pools interleaved, the GPU's variable first).
void count_round_trip(std::vector<PoolUse>& use, const PoolPlan& plan,
                      const std::vector<std::vector<std::string>>& slot_env, size_t slot, double ms,
                      double ended_s);
// A worker of slot `slot` said hello `start_s` after its spawn: counted to its pool.
void count_worker_start(std::vector<PoolUse>& use, const PoolPlan& plan,
                        const std::vector<std::vector<std::string>>& slot_env, size_t slot,
                        double start_s);

// Seconds per phase over every result.
std::map<std::string, double> phase_seconds(const std::vector<Result>& results);

// --profile: where the time went, per phase and per op, the launch lock's share of each worker
// process's wall, and the pools' balance.
void print_profile(const std::vector<Result>& results, double wall_s, double parent_s,
                   const std::vector<PoolUse>& pools, int jobs, int processes);

// What run.json says of a run besides its outcome.
struct RunDescription {
  const Paths* paths = nullptr;
  const RunArgs* args = nullptr;
  std::string kernels;  // the library's absolute path, or py:<module>, or ""
  size_t case_count = 0;
  std::string started;
  PoolPlan plan;
};

// run.json: written at the start (no "finished", no hello yet) so that a run killed halfway
// still leaves a directory the report reads, and again, complete, at the end.
nlohmann::json describe_run(const RunDescription& d, const std::optional<WorkerHello>& hello,
                            const Summary* done_summary, double wall_s,
                            const std::vector<PoolUse>& pools, const std::vector<Result>& results);

}  // namespace attncheck::cli
