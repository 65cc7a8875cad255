// One run of cases over one or several kernel libraries, in three steps: prepare (select the
// cases, check the goldens, lock the results directories, plan the pools), execute (the cases in
// worker processes, or in this one), finish (the command's own summary and files: finish_run,
// finish_mutants). `run` is a run of one library (its --kernels, or none: reference mode);
// `mutants` one of N, each with its results directory under --out, in one pool whose workers
// open them all (run/worker.h "Several libraries"). `shrink` and `repro` reuse its parts: the
// worker config (worker_config) and, for shrink, the worker command (worker_command) and the
// candidates' evaluation in workers (run/shrink.h worker_evaluator), as the run's --shrink.
#pragma once
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/run_parts.h"
#include "core/safe_output.h"
#include "run/amend.h"
#include "run/cases.h"
#include "run/results.h"
#include "run/shrink.h"
#include "run/worker.h"

namespace attncheck::cli {

// One library of a run and everything its results go to.
struct LibraryRun {
  std::string name;                // mutants: its results directory's name under --out
  std::string path;                // absolute, py:<module>, or "" (reference mode)
  std::set<std::string> ops;       // empty: every op of the selection
  std::optional<IdRegex> first;    // its cases whose ids match are sent before the others
  std::vector<size_t> cases;       // indices into the selection, in the order they are sent
  std::vector<Result> results;     // by the selection's index (only `cases` are filled)
  std::vector<size_t> completion;  // indices in the order results.jsonl got them
  std::vector<size_t> set_aside;   // cases of unreadable golden files, recorded after the pool
  Summary summary;
  std::optional<JsonlWriter> jsonl;
  std::filesystem::path out;  // its results directory; "" for none
};

class Progress;

class CaseRun {
 public:
  using Clock = std::chrono::steady_clock;
  // `libraries`: one for `run` (its path may be empty), N for `mutants` (`several`).
  CaseRun(const Paths& paths, const RunArgs& args, std::vector<LibraryRun> libraries, bool several);
  ~CaseRun();
  CaseRun(const CaseRun&) = delete;  // the golden check in the background reads `cases`
  CaseRun& operator=(const CaseRun&) = delete;

  // 0 when the run can start, else the exit status, having said why.
  int prepare();
  // Every case to a Result, recorded as it comes; 0, or 2 having said why.
  int execute();
  // Records the cases of unreadable golden files (not run, saying why) of library `k`.
  void record_set_aside(size_t k);
  // run.json (complete) and junit.xml of library `k`; `selection_order`: junit's records in the
  // selection's order (run), else in the library's.
  void write_outputs(size_t k, bool selection_order, const Summary* done) const;
  // The Result the parent writes for case `i` of library `k` (run/amend.h: lost, not_run,
  // unreadable_line), with the library's repro line and the run's arch.
  Result stand_in(size_t k, size_t i, Amendment why, const std::string& detail, Mode mode) const;
  bool kernel_mode() const { return hello && hello->kernel_mode; }

  // What the finish steps read.
  const Paths& paths;
  const RunArgs& args;
  std::vector<LibraryRun> libs;
  std::vector<CaseFile> files;
  std::vector<Case> cases;
  std::optional<WorkerHello> hello;  // the first worker's (or this process's, in process)
  GoldenCheck golden_check;
  PoolPlan plan;
  std::vector<PoolUse> pool_use;
  std::string started;
  Clock::time_point t0;
  double wall_s = 0;          // from the start of the cases to the end of execute()
  double parent_s = 0;        // the parent's own time per result: parsing, writing, printing
  std::vector<Result> all;    // mutants --profile: every Result in the order it came
  WorkerConfig config;        // the workers' (their library: the last they started on)
  WorkerSpec spec;            // the pool's
  CaseEvaluator shrink_eval;  // --shrink: candidates, in the run's workers or in process

  // The RunOptions of library k's records (its path, the workers' arch, the path flags).
  RunOptions options_for(size_t k) const;

 private:
  // The worker config both ways of running start from (the pool adds its own fields).
  WorkerConfig base_config() const;
  int select();
  int check_inputs();
  int check_goldens();
  int open_outputs();
  int plan_pools();
  int make_spec();
  void plan_tasks(size_t from);
  PoolCallbacks callbacks();
  void on_result(size_t task, const nlohmann::json& j);
  void announce(const WorkerHello& h);
  void record(size_t k, size_t i, Result r);
  int run_in_process();
  int run_pool();
  WorkerSpec shrink_spec() const;
  std::string not_run_reason() const;
  double elapsed_s() const;
  nlohmann::json run_json(size_t k, const Summary* done, double wall) const;

  bool several_;
  std::optional<CaseDurations> durations_;
  std::optional<DirHandle> out_lock_;
  std::vector<DirHandle> library_locks_;
  std::optional<OutputStream> worker_log_;
  std::string repro_dir_;
  std::string sanitizer_log_;
  std::unique_ptr<CaseContext> ctx_;  // --in-process
  struct Task {
    size_t lib, index;
  };
  std::vector<Task> task_of_;
  std::vector<PoolTask> tasks_;
  std::vector<double> round_trip_ms_;        // per task
  std::map<size_t, std::string> sanitizer_;  // task -> the log of the worker that ran it
  std::unique_ptr<Progress> progress_;       // run: a live line on a terminal
};

// What every worker config of a command holds: the golden directory (as given; a pool's is made
// absolute), the library, the known-bug arch, the launches per case and the repro lines' paths.
WorkerConfig worker_config(const Paths& paths, const std::string& kernels, const std::string& arch,
                           int repeat);

// `attncheck worker`'s arguments for a config: {"worker", "--kernels", <its kernels, a label>,
// "--config", <the config as one JSON object>}.
std::vector<std::string> worker_command(const WorkerConfig& cfg);

}  // namespace attncheck::cli
