// `attncheck mutants`: several kernel libraries (the mutant libraries of a build) over their cases
// in one pool, a results directory per library. One worker process per GPU opens every library
// beside the others (run/worker.h "Several libraries"), so a GPU has one context, and the
// selection, the golden checks and the workers' start are done once, not once per library
// (docs/cli.md, docs/results.md).
#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>

#include "cli/commands.h"
#include "cli/run_parts.h"
#include "core/safe_output.h"
#include "run/evaluate.h"
#include "run/golden.h"
#include "run/pool.h"
#include "run/provenance.h"
#include "run/results.h"
#include "run/worker.h"

namespace attncheck::cli {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// One library of the run and everything its results directory gets.
struct LibraryRun {
  std::string name;             // its results directory's name under --out
  std::string path;             // absolute
  std::set<std::string> ops;    // empty: every op of the selection
  std::vector<size_t> cases;    // indices into the selection
  std::vector<Result> results;  // by the selection's index (only `cases` are filled)
  Summary summary;
  std::optional<JsonlWriter> jsonl;
  fs::path out;
};

// --library LIB[=op,op...]: the path and its ops. Throws std::invalid_argument.
LibraryRun parse_library(const std::string& spec) {
  LibraryRun lib;
  const auto eq = spec.find('=');
  lib.path = spec.substr(0, eq);
  if (lib.path.empty()) throw std::invalid_argument("--library '" + spec + "': no path");
  if (lib.path.rfind("py:", 0) == 0)
    throw std::invalid_argument("--library '" + spec +
                                "': a py: adapter runs in a process of its own (attncheck run)");
  if (!fs::is_regular_file(lib.path))
    throw std::invalid_argument("--library '" + spec + "': '" + lib.path + "' is not a file");
  lib.path = fs::absolute(lib.path).string();
  if (eq != std::string::npos) {
    std::istringstream in(spec.substr(eq + 1));
    for (std::string op; std::getline(in, op, ',');) {
      if (op.empty()) continue;
      if (!find_op(op))
        throw std::invalid_argument("--library '" + spec + "': unknown op '" + op + "'");
      lib.ops.insert(op);
    }
    if (lib.ops.empty()) throw std::invalid_argument("--library '" + spec + "': no op after '='");
  }
  // libattncheck_kernels_mutant_<name>.so -> <name>; any other library by its file's stem.
  std::string stem = fs::path(lib.path).stem().string();
  if (const auto m = stem.find("_mutant_"); m != std::string::npos) stem = stem.substr(m + 8);
  // A directory under --out: one plain name ("..", "", or "a b" would not be one).
  const bool plain = !stem.empty() && stem != "." && stem != ".." &&
                     std::all_of(stem.begin(), stem.end(), [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' ||
                              c == '.' || c == '+';
                     });
  if (!plain)
    throw std::invalid_argument("--library '" + spec + "': its name '" + stem +
                                "' cannot name a results directory (letters, digits, _ - . +)");
  lib.name = stem;
  return lib;
}

}  // namespace

int cmd_mutants(const Paths& paths, const MutantsArgs& m) {
  const RunArgs& a = m.run;
  std::vector<LibraryRun> libs;
  try {
    std::set<std::string> names;
    for (const auto& spec : m.libraries) {
      libs.push_back(parse_library(spec));
      if (!names.insert(libs.back().name).second)
        throw std::invalid_argument("--library '" + spec + "': a second library named '" +
                                    libs.back().name + "' (their results directories would clash)");
    }
  } catch (const std::invalid_argument& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  if (libs.empty()) {
    std::cerr << "attncheck: mutants: no --library given\n";
    return 2;
  }
  if (a.out.empty()) {
    std::cerr << "attncheck: mutants: --out is required (a results directory per library)\n";
    return 2;
  }
  Selection sel;
  sel.tier = a.tier;
  sel.filter = a.filter;
  std::optional<CaseDurations> durations;
  if (!load_durations(a.durations, durations)) return 2;
  if (durations) sel.durations = &*durations;
  // The union of the libraries' ops, selected once.
  const bool every_op =
      std::any_of(libs.begin(), libs.end(), [](const LibraryRun& l) { return l.ops.empty(); });
  if (!every_op)
    for (const auto& l : libs) sel.ops.insert(sel.ops.end(), l.ops.begin(), l.ops.end());
  std::sort(sel.ops.begin(), sel.ops.end());
  sel.ops.erase(std::unique(sel.ops.begin(), sel.ops.end()), sel.ops.end());
  std::vector<CaseFile> files;
  std::vector<Case> cases;
  if (!load_and_select(paths, sel, files, cases)) return 2;
  if (!fs::is_directory(paths.golden)) {
    std::cerr << "attncheck: golden directory '" << paths.golden << "' does not exist\n";
    return 2;
  }
  GoldenVerdicts goldens;
  try {
    goldens = check_golden_files(paths.golden, cases);
  } catch (const std::exception& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  const size_t runnable = goldens.runnable;
  const auto& unreadable_goldens = goldens.unreadable;
  const auto& checked_goldens = goldens.checked;
  // Each library's cases, the longest first (the selection's order without durations).
  std::vector<size_t> order(cases.size());
  std::iota(order.begin(), order.end(), size_t{0});
  if (durations) {
    std::vector<std::string> ids;
    for (const auto& c : cases) ids.push_back(c.id);
    order = longest_first(ids, *durations);
  }
  for (auto& l : libs) {
    for (size_t i : order)
      if (l.ops.empty() || l.ops.count(cases[i].op)) l.cases.push_back(i);
    l.results.resize(cases.size());
  }
  // Every directory this command writes is locked, each library's too: a `run --out D/<library>`
  // beside it is refused instead of replacing a mutant's results under its run.json.
  std::optional<DirHandle> out_lock;
  std::vector<DirHandle> library_locks;
  try {
    out_lock.emplace(lock_out_dir(a.out));
    for (auto& l : libs) {
      l.out = fs::path(a.out) / l.name;
      library_locks.push_back(lock_out_dir(l.out.string()));
    }
  } catch (const std::exception& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }

  PoolPlan plan;
  RunArgs first = a;
  first.kernels = libs.front().path;
  try {
    plan = pools_for(first, true);
    // Two worker processes per GPU unless told: the mutants' cases are small, and a process's
    // launches take its one launch lock in turn, which then bounds the run (on one H100: 22.0 s
    // with one process of 16 threads, 17.1 s with two of 8; docs/results.md).
    if (a.threads_per_worker == 0 && !plan.pools.empty()) {
      first.threads_per_worker = kMutantThreadsPerWorker;
      plan = pools_for(first, true);
    }
  } catch (const std::invalid_argument& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  const std::string started = utc_now_iso();
  const auto t0 = Clock::now();
  std::vector<PoolUse> pool_use = pool_uses(plan);
  auto run_json = [&](const LibraryRun& l, const std::optional<nlohmann::json>& hello,
                      const Summary* done, double wall_s) {
    std::optional<nlohmann::json> h = hello;
    if (h) (*h)["library"] = l.name;  // the hello names the worker's first library
    const RunDescription d{&paths, &a, l.path, l.cases.size(), started, plan};
    return describe_run(d, h, done, wall_s, pool_use, l.results);
  };
  try {
    for (auto& l : libs) {
      write_file_atomic((l.out / "run.json").string(),
                        run_json(l, std::nullopt, nullptr, 0).dump(2) + "\n");
      l.jsonl.emplace((l.out / "results.jsonl").string());
    }
  } catch (const std::exception& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }

  // Tasks: the libraries in as many lanes as cases run at once (interleave_in_lanes), in the
  // order given (the costliest first).
  struct Task {
    size_t lib, index;
  };
  std::vector<Task> task_of;
  std::vector<PoolTask> tasks;
  std::vector<std::vector<size_t>> runnable_cases(libs.size());
  for (size_t k = 0; k < libs.size(); ++k)
    for (size_t i : libs[k].cases)
      if (i < runnable) runnable_cases[k].push_back(i);  // unreadable golden files: below
  // The tasks of the libraries from `from` on (the ones before could not be loaded, below).
  auto plan_tasks = [&](size_t from) {
    task_of.clear();
    tasks.clear();
    std::vector<std::vector<size_t>> left(runnable_cases.size());
    for (size_t k = from; k < libs.size(); ++k) left[k] = runnable_cases[k];
    for (const auto& [k, i] :
         interleave_in_lanes(left, static_cast<size_t>(std::max(1, plan.jobs)))) {
      task_of.push_back({k, i});
      tasks.push_back({cases[i].id, case_to_json(cases[i]), {{"kernels", libs[k].path}}});
    }
  };

  std::optional<nlohmann::json> hello;
  double parent_s = 0;
  std::vector<Result> all;  // every library's results, for --profile
  // Library k's result for case i.
  auto record_for = [&](size_t k, size_t i, Result r) {
    const auto since = Clock::now();
    LibraryRun& l = libs[k];
    l.summary.add(r);
    l.jsonl->append(r.to_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    if (a.profile) all.push_back(r);
    l.results[i] = std::move(r);
    parent_s += std::chrono::duration<double>(Clock::now() - since).count();
  };
  auto record = [&](size_t t, Result r) {
    record_for(task_of[t].lib, task_of[t].index, std::move(r));
  };
  auto options_for = [&](size_t k) {
    RunOptions opt;
    opt.kernels_path = libs[k].path;
    opt.repro_extra = path_flags(paths);
    opt.arch = hello ? hello->value("arch", "") : a.arch;
    return opt;
  };
  auto options_of = [&](size_t t) { return options_for(task_of[t].lib); };
  std::vector<double> round_trip_ms;
  WorkerSpec spec;
  try {
    spec = pool_worker_spec(plan, a);
  } catch (const std::invalid_argument& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  // As many waiting as running: a thread that finished finds its library's next case among the
  // next ones in lane order (one per lane).
  spec.queued_per_worker = plan.threads;
  std::optional<OutputStream> worker_log;
  try {
    worker_log.emplace(fs::path(a.out) / "worker.log", OutputStream::Mode::append);
  } catch (const std::exception& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  spec.log_path = "/proc/self/fd/" + std::to_string(worker_log->fd());
  spec.start_timeout_s = a.import_timeout_s > 0 ? a.import_timeout_s + 60 : 7 * 24 * 3600.0;

  PoolCallbacks cb;
  cb.on_hello = [&](const nlohmann::json& h) {
    if (hello) return;
    hello = h;
    std::cout << "attncheck mutants: " << libs.size() << " libraries, " << tasks.size()
              << " runs of " << runnable << " cases (tier " << a.tier << ")\n";
    if (h.value("mode", "") == "kernel")
      std::cout << "  on " << h.value("device", "") << " (" << h.value("device_arch", "") << ")\n";
    else
      std::cout << "  NO DEVICE: " << h.value("no_device", "") << "\n";
    std::cout << "  pools: " << describe_pools(plan) << "\n" << std::flush;
  };
  cb.on_worker_started = [&](size_t slot, double start_s) {
    count_worker_start(pool_use, plan, spec.slot_env, slot, start_s);
  };
  cb.on_round_trip = [&](size_t t, size_t slot, double ms) {
    round_trip_ms[t] = ms;
    count_round_trip(pool_use, plan, spec.slot_env, slot, ms,
                     std::chrono::duration<double>(Clock::now() - t0).count());
  };
  cb.on_result = [&](size_t t, const nlohmann::json& j) {
    try {
      Result r = Result::from_json(j);
      r.timings.ipc_ms = std::max(0.0, round_trip_ms[t] - r.timings.total_ms());
      record(t, std::move(r));
    } catch (const std::invalid_argument& e) {
      Result r =
          lost_case_result(cases[task_of[t].index], Mode::none, options_of(t),
                           std::string("the worker's result line is unreadable: ") + e.what());
      r.verdict = Verdict::error;
      record(t, std::move(r));
    }
  };
  cb.on_lost = [&](size_t t, const std::string& what) {
    const Mode mode =
        hello && hello->value("mode", "") == "kernel" ? Mode::kernel : Mode::reference;
    record(t, lost_case_result(cases[task_of[t].index], mode, options_of(t), what));
  };
  // --max-failures counts per library: a mutant is killed by its first failures, and the other
  // libraries' cases go on.
  if (a.max_failures > 0) {
    cb.stop_dispatching = [&](size_t t) {
      return libs[task_of[t].lib].summary.failures >= a.max_failures;
    };
    cb.on_not_run = [&](size_t t) {
      Result r = lost_case_result(cases[task_of[t].index], Mode::none, options_of(t),
                                  "not run: this library's run stopped starting cases after " +
                                      std::to_string(a.max_failures) + " failed (--max-failures)");
      r.verdict = Verdict::skipped;
      record(t, std::move(r));
    };
  }
  // The workers' own library (their --kernels) is the first that loads. When they cannot start
  // on it before any case ran (its worker's fatal line names why), its cases fail with that
  // reason and the run starts again on the next library: one broken library hides no other.
  for (size_t own = 0;; ++own) {
    plan_tasks(own);
    round_trip_ms.assign(tasks.size(), 0);
    spec.args = worker_args(paths, a, libs[own].path, "", plan, checked_goldens);
    spec.args.insert(spec.args.end(), {"--import-timeout", std::to_string(a.import_timeout_s)});
    try {
      run_in_workers(spec, tasks, cb);
      break;
    } catch (const std::exception& e) {
      if (hello || own + 1 == libs.size()) {
        std::cerr << "attncheck: " << e.what() << "\n";
        return 2;
      }
      for (size_t i : runnable_cases[own])
        record_for(own, i,
                   lost_case_result(
                       cases[i], Mode::none, options_for(own),
                       std::string("the workers could not start on this library: ") + e.what()));
      std::cerr << "attncheck: " << libs[own].name << ": the workers could not start on it ("
                << first_line(e.what()) << "); its cases fail, the run goes on with "
                << libs[own + 1].name << "\n";
    }
  }
  const double wall_s = std::chrono::duration<double>(Clock::now() - t0).count();

  int status = 0;
  std::cout << "\n  library                                  cases  compared  failing  skipped\n";
  for (auto& l : libs) {
    try {
      for (size_t i : l.cases)
        if (i >= runnable) {
          RunOptions opt;
          opt.kernels_path = l.path;
          opt.repro_extra = path_flags(paths);
          opt.arch = hello ? hello->value("arch", "") : a.arch;
          Result r = lost_case_result(cases[i], Mode::none, opt,
                                      "not run: " + unreadable_goldens.at(cases[i].op));
          l.summary.add(r);
          l.jsonl->append(
              r.to_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
          l.results[i] = std::move(r);
        }
      write_file_atomic((l.out / "run.json").string(),
                        run_json(l, hello, &l.summary, wall_s).dump(2) + "\n");
      std::vector<nlohmann::json> records;
      for (size_t i : l.cases) records.push_back(l.results[i].to_json());
      write_file_atomic((l.out / "junit.xml").string(),
                        junit_xml(records, "attncheck " + a.tier + " " + l.name));
    } catch (const std::exception& e) {
      std::cerr << "attncheck: " << e.what() << "\n";
      status = 2;
    }
    int64_t skipped = 0;
    for (const auto& [op, verdicts] : l.summary.per_op)
      if (const auto it = verdicts.find(Verdict::skipped); it != verdicts.end())
        skipped += it->second;
    std::cout << "  " << std::left << std::setw(40) << l.name << std::right << std::setw(6)
              << l.cases.size() << std::setw(10) << l.summary.compared << std::setw(9)
              << l.summary.failures << std::setw(9) << skipped << "\n";
    l.summary.print_not_provided(std::cout);  // a Python adapter's ops it lacks, once
  }
  if (a.profile) print_profile(all, wall_s, parent_s, pool_use, plan.jobs, plan.processes());
  std::cout << "wall time " << std::fixed << std::setprecision(1) << wall_s
            << " s\nresults: " << fs::absolute(a.out).string() << "/<library>\n";
  // Failing cases are what a mutant is for: the report judges them (mutation analysis). Only a
  // run that compared nothing at all is a failed gate here.
  const bool compared = std::any_of(libs.begin(), libs.end(),
                                    [](const LibraryRun& l) { return l.summary.compared > 0; });
  if (status == 0 && !compared) {
    std::cout << "NOTHING COMPARED: no library compared a kernel output\n";
    status = 1;
  }
  return status;
}

}  // namespace attncheck::cli
