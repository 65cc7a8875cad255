// The run object of `run` and `mutants` (cli/case_run.h).
#include "cli/case_run.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <sstream>

#include "core/case_json.h"
#include "run/device.h"
#include "run/golden.h"
#include "run/provenance.h"

namespace attncheck::cli {

namespace fs = std::filesystem;

// A live progress line on a terminal; nothing in CI logs (no tty, or $CI set).
class Progress {
 public:
  explicit Progress(size_t total) : total_(total), live_(::isatty(2) && !std::getenv("CI")) {}
  void update(size_t done, int64_t failures, const std::string& id) {
    if (!live_) return;
    std::cerr << "\r\033[K[" << done << "/" << total_ << "] " << failures << " failed  " << id
              << std::flush;
  }
  void clear() {
    if (live_) std::cerr << "\r\033[K" << std::flush;
  }

 private:
  size_t total_;
  bool live_;
};

WorkerConfig worker_config(const Paths& paths, const std::string& kernels, const std::string& arch,
                           int repeat) {
  WorkerConfig cfg;
  cfg.golden_dir = paths.golden;
  cfg.kernels = kernels;
  cfg.arch = arch;
  cfg.repeat = repeat;
  cfg.repro_extra = path_flags(paths);
  return cfg;
}

std::vector<std::string> worker_command(const WorkerConfig& cfg) {
  std::vector<std::string> args = {"worker"};
  // The library as a label only (the config carries it): the pool names a worker that cannot
  // start by its --kernels (run/pool.cpp), and ps shows which library a worker runs.
  if (!cfg.kernels.empty()) args.insert(args.end(), {"--kernels", cfg.kernels});
  args.insert(args.end(), {"--config", cfg.to_json().dump()});
  return args;
}

namespace {

// --sanitizer TOOL: every case runs in a worker process of its own under compute-sanitizer, which
// writes its report to a log file per worker; once the worker has exited (the report is complete
// only then), a finding in it fails the case. Sanitized kernels run 10-100x slower, so the
// per-case time limit grows 20x. Returns the log path pattern ("{worker}" = the worker's serial).
std::string sanitize_workers(WorkerSpec& spec, const RunArgs& a) {
  std::string tool_path;
  if (const char* env = std::getenv("ATTNCHECK_COMPUTE_SANITIZER"); env && *env) tool_path = env;
  for (const char* dir : {"/usr/local/cuda/bin", "/opt/cuda/bin"})
    if (tool_path.empty() && fs::exists(fs::path(dir) / "compute-sanitizer"))
      tool_path = (fs::path(dir) / "compute-sanitizer").string();
  if (tool_path.empty())
    if (const char* path = std::getenv("PATH")) {
      std::istringstream dirs(path);
      for (std::string d; tool_path.empty() && std::getline(dirs, d, ':');)
        if (!d.empty() && fs::exists(fs::path(d) / "compute-sanitizer"))
          tool_path = (fs::path(d) / "compute-sanitizer").string();
    }
  if (tool_path.empty())
    throw std::runtime_error(
        "compute-sanitizer not found (set ATTNCHECK_COMPUTE_SANITIZER, or put it on PATH)");
  if (a.in_process) throw std::runtime_error("needs worker processes (drop --in-process)");
  const fs::path dir = a.out.empty() ? fs::temp_directory_path() /
                                           ("attncheck-sanitizer-" + std::to_string(::getpid()))
                                     : fs::path(a.out) / "sanitizer";
  fs::create_directories(dir);
  const std::string log = fs::absolute(dir / ("worker-{worker}." + a.sanitizer + ".log")).string();
  spec.exe = fs::read_symlink("/proc/self/exe").string();  // the wrapper execs it by path
  spec.wrapper = {tool_path, "--tool", a.sanitizer, "--log-file", log, "--print-limit", "100"};
  spec.one_case_per_worker = true;
  spec.case_timeout_s *= 20;
  std::cout << "  workers under " << tool_path << " --tool " << a.sanitizer << " (reports: " << log
            << ")\n";
  return log;
}

// Reference mode compares with the goldens: a golden file missing for cases of the golden tiers
// (deleted, or a typo in --golden) is an input error. True when one is missing, having said so.
bool golden_files_missing(const std::string& golden, const std::vector<Case>& cases) {
  std::map<std::string, int> missing;
  for (const auto& c : cases)
    if (std::any_of(std::begin(kGoldenTiers), std::end(kGoldenTiers),
                    [&](std::string_view t) { return c.in_tier(t); }) &&
        !fs::exists(fs::path(golden) / (c.op + ".h5")))
      ++missing[c.op];
  for (const auto& [op, n] : missing)
    std::cerr << "attncheck: golden file '" << (fs::path(golden) / (op + ".h5")).string()
              << "' does not exist (" << n << " smoke/quick cases of " << op
              << "; `attncheck golden generate --op " << op
              << "`, or --allow-missing-goldens to run without it)\n";
  return !missing.empty();
}

}  // namespace

CaseRun::CaseRun(const Paths& p, const RunArgs& a, std::vector<LibraryRun> libraries, bool several)
    : paths(p), args(a), libs(std::move(libraries)), several_(several) {}

CaseRun::~CaseRun() = default;

double CaseRun::elapsed_s() const {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int CaseRun::prepare() {
  if (int status = select()) return status;
  if (int status = check_inputs()) return status;
  if (int status = check_goldens()) return status;
  // Each library's cases, the longest first (the selection's order without durations).
  std::vector<size_t> order(cases.size());
  std::iota(order.begin(), order.end(), size_t{0});
  if (durations_) {
    std::vector<std::string> ids;
    for (const auto& c : cases) ids.push_back(c.id);
    order = longest_first(ids, *durations_);
  }
  for (auto& l : libs) {
    for (size_t i : order)
      if (l.ops.empty() || l.ops.count(cases[i].op)) l.cases.push_back(i);
    // A mutant's expected killers first: with --max-failures it stops after them instead of
    // after its longest cases. The verdict is the same, since a survivor still runs them all.
    if (l.first)
      std::stable_partition(l.cases.begin(), l.cases.end(),
                            [&](size_t i) { return l.first->search(cases[i].id); });
    l.results.resize(cases.size());
  }
  if (int status = open_outputs()) return status;
  if (int status = plan_pools()) return status;
  if (!several_) progress_ = std::make_unique<Progress>(cases.size());
  started = utc_now_iso();
  t0 = Clock::now();
  pool_use = pool_uses(plan);
  try {
    for (size_t k = 0; k < libs.size(); ++k) {
      if (libs[k].out.empty()) continue;
      write_file_atomic((libs[k].out / "run.json").string(),
                        run_json(k, nullptr, 0).dump(2) + "\n");
      libs[k].jsonl.emplace((libs[k].out / "results.jsonl").string());
    }
  } catch (const std::exception& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  return 0;
}

int CaseRun::select() {
  Selection sel = selection(args.tier, args.ops, args.filter);
  try {
    sel.shard = parse_shard(args.shard);
  } catch (const std::invalid_argument& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  if (!load_durations(args.durations, durations_)) return 2;
  if (durations_) sel.durations = &*durations_;
  // Several libraries: the union of their ops, selected once.
  if (several_) {
    if (std::none_of(libs.begin(), libs.end(), [](const LibraryRun& l) { return l.ops.empty(); }))
      for (const auto& l : libs) sel.ops.insert(sel.ops.end(), l.ops.begin(), l.ops.end());
    std::sort(sel.ops.begin(), sel.ops.end());
    sel.ops.erase(std::unique(sel.ops.begin(), sel.ops.end()), sel.ops.end());
  }
  if (!load_and_select(paths, sel, files, cases)) return 2;
  if (cases.empty() && !several_) {
    std::cerr << "attncheck: no case matches (tier " << args.tier << ", filter '" << args.filter
              << "', shard " << args.shard << ")\n";
    return 2;
  }
  return 0;
}

int CaseRun::check_inputs() {
  const std::string& kernels = args.kernels;
  try {  // read by the workers: a bad setting is refused here, once
    (void)device_memory_wait_s();
  } catch (const std::invalid_argument& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  if (!several_ && !kernels.empty() && kernels.rfind("py:", 0) != 0 && !fs::exists(kernels)) {
    std::cerr << "attncheck: kernel library '" << kernels << "' does not exist\n";
    return 2;
  }
  if (!fs::is_directory(paths.golden) && (several_ || !args.allow_missing_goldens)) {
    std::cerr << "attncheck: golden directory '" << paths.golden << "' does not exist"
              << (several_ ? ""
                           : " (pass --golden DIR, or --allow-missing-goldens to run without "
                             "goldens)")
              << "\n";
    return 2;
  }
  if (!several_ && kernels.empty() && !args.allow_missing_goldens &&
      golden_files_missing(paths.golden, cases))
    return 2;
  return 0;
}

// One verdict per golden file for the whole run: a file that fails, crashes or hangs its reader
// is read once; its cases fail at once, naming it. A pool of `run` takes the verdicts while its
// workers start and never sends those cases; otherwise they come first, and the cases are moved
// behind the `runnable` others.
int CaseRun::check_goldens() {
  try {
    if (several_ || args.in_process)
      golden_check.verdicts = check_golden_files(paths.golden, cases);
    else
      golden_check = start_golden_check(paths.golden, cases);
  } catch (const std::exception& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  return 0;
}

// --out is this run's alone, until the run ends; with several libraries, each library's directory
// too: a `run --out D/<library>` beside it is refused instead of replacing a mutant's results.
int CaseRun::open_outputs() {
  if (args.out.empty()) return 0;
  try {
    out_lock_.emplace(lock_out_dir(args.out));
    if (several_) {
      for (auto& l : libs) {
        l.out = fs::path(args.out) / l.name;
        library_locks_.push_back(lock_out_dir(l.out.string()));
      }
    } else {
      libs.front().out = args.out;
      repro_dir_ = fs::absolute(fs::path(args.out) / "repro").string();
      DirHandle::open(repro_dir_);
    }
    if (!args.in_process)  // opened safely here; the pool appends through /proc/self/fd
      worker_log_.emplace(fs::path(args.out) / "worker.log", OutputStream::Mode::append);
  } catch (const std::exception& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  return 0;
}

int CaseRun::plan_pools() {
  RunArgs first = args;  // the pools are planned for the first library
  first.kernels = libs.front().path;
  try {
    plan = pools_for(first, !first.kernels.empty());
    // Mutants: two worker processes per GPU unless told: their cases are small, and a process's
    // launches take its one launch lock in turn, which then bounds the run (on one H100: 22.0 s
    // with one process of 16 threads, 17.1 s with two of 8; docs/results.md).
    if (several_ && args.threads_per_worker == 0 && !plan.pools.empty()) {
      first.threads_per_worker = kMutantThreadsPerWorker;
      plan = pools_for(first, true);
    }
  } catch (const std::invalid_argument& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  if (args.in_process) plan = PoolPlan{};
  return 0;
}

// The pool's processes and the config they start with: the run's options, the goldens checked,
// the import limit (the worker enforces it and names what hung; the pool's start limit is the
// backstop; a sanitizer slows everything, the import included).
int CaseRun::make_spec() {
  try {
    spec = pool_worker_spec(plan, args);
  } catch (const std::invalid_argument& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  if (worker_log_) spec.log_path = "/proc/self/fd/" + std::to_string(worker_log_->fd());
  // Mutants: as many waiting as running, so that a thread that finished finds its library's next
  // case among the next ones in lane order (one per lane).
  if (several_) spec.queued_per_worker = plan.threads;
  if (!args.sanitizer.empty()) {
    try {
      sanitizer_log_ = sanitize_workers(spec, args);
    } catch (const std::exception& e) {
      std::cerr << "attncheck: --sanitizer: " << e.what() << "\n";
      return 2;
    }
  }
  config = base_config();
  config.golden_dir = fs::absolute(paths.golden).string();
  config.threads = std::max(1, plan.threads);
  config.golden_checked = golden_check.verdicts.checked;
  config.import_timeout_s *= args.sanitizer.empty() ? 1.0 : 5.0;
  spec.start_timeout_s =
      config.import_timeout_s > 0 ? config.import_timeout_s + 60 : 7 * 24 * 3600.0;
  return 0;
}

// The tasks of the libraries from `from` on (the ones before could not be started on): the
// libraries in as many lanes as cases run at once (interleave_in_lanes), in the order given (the
// costliest first); one library's in its own order. Cases of unreadable golden files: below.
void CaseRun::plan_tasks(size_t from) {
  task_of_.clear();
  tasks_.clear();
  std::vector<std::vector<size_t>> left(libs.size());
  for (size_t k = from; k < libs.size(); ++k)
    for (size_t i : libs[k].cases)
      if (i < golden_check.verdicts.runnable) left[k].push_back(i);
  for (const auto& [k, i] :
       interleave_in_lanes(left, static_cast<size_t>(std::max(1, plan.jobs)))) {
    task_of_.push_back({k, i});
    tasks_.push_back({cases[i].id, case_to_json(cases[i])});
    if (several_) tasks_.back().request = {{"kernels", libs[k].path}};
  }
  round_trip_ms_.assign(tasks_.size(), 0);
}

RunOptions CaseRun::options_for(size_t k) const {
  RunOptions opt;
  opt.kernels_path = libs[k].path;
  opt.repro_extra = path_flags(paths);
  opt.arch = hello ? hello->arch : args.arch;
  return opt;
}

Result CaseRun::stand_in(size_t k, size_t i, Amendment why, const std::string& detail,
                         Mode mode) const {
  const RunOptions opt = options_for(k);
  return amend(cases[i], Result{}, why, AmendWith{detail, mode, &opt, ""});
}

std::string CaseRun::not_run_reason() const {
  return std::string("not run: ") + (several_ ? "this library's run" : "the run") +
         " stopped starting cases after " + std::to_string(args.max_failures) +
         " failed (--max-failures)";
}

void CaseRun::announce(const WorkerHello& h) {
  hello = h;
  if (several_) {
    std::cout << "attncheck mutants: " << libs.size() << " libraries, " << tasks_.size()
              << " runs of " << golden_check.verdicts.runnable << " cases (tier " << args.tier
              << ")\n";
    if (h.kernel_mode)
      std::cout << "  on " << h.device << " (" << h.device_arch << ")\n";
    else
      std::cout << "  NO DEVICE: " << h.no_device << "\n";
    std::cout << "  pools: " << describe_pools(plan) << "\n" << std::flush;
    return;
  }
  std::cout << "attncheck run: " << cases.size() << " cases (tier " << args.tier;
  if (args.shard != "0/1") std::cout << ", shard " << args.shard;
  if (!args.filter.empty()) std::cout << ", filter '" << args.filter << "'";
  std::cout << ")\n";
  if (h.kernel_mode)
    std::cout << "  kernels: " << h.library << " on " << h.device << " (" << h.device_arch << ")\n";
  else
    std::cout << "  REFERENCE ONLY, kernels not checked: " << h.no_device
              << "\n  checking the reference against the goldens\n";
  if (!args.in_process) std::cout << "  pools: " << describe_pools(plan) << "\n";
  if (!h.threads_why.empty())
    std::cout << "  one case per worker process: " << h.threads_why
              << " (the pool opens more processes instead)\n";
  std::cout << std::flush;
}

void CaseRun::record(size_t k, size_t i, Result r) {
  struct AddTime {  // the parent's time on this result, on every way out
    double& into;
    Clock::time_point since;
    ~AddTime() { into += std::chrono::duration<double>(Clock::now() - since).count(); }
  } parent_time{parent_s, Clock::now()};
  LibraryRun& l = libs[k];
  l.summary.add(r);
  if (l.jsonl)
    l.jsonl->append(r.to_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  if (!several_ && r.failing()) {
    progress_->clear();
    std::cout << (r.verdict == Verdict::error ? "ERROR " : "FAIL  ") << r.id << "\n      "
              << first_line(r.message) << "\n      repro: " << r.repro << "\n"
              << std::flush;
  }
  if (several_ && args.profile) all.push_back(r);
  l.results[i] = std::move(r);
  l.completion.push_back(i);
  if (progress_) progress_->update(l.completion.size(), l.summary.failures, cases[i].id);
}

void CaseRun::record_set_aside(size_t k) {
  const LibraryRun& l = libs[k];
  const size_t runnable = golden_check.verdicts.runnable;
  std::vector<size_t> left = l.set_aside;
  if (several_) {
    for (size_t i : l.cases)
      if (i >= runnable) left.push_back(i);
  } else {
    for (size_t i = runnable; i < cases.size(); ++i) left.push_back(i);
  }
  for (size_t i : left)
    record(k, i,
           stand_in(k, i, Amendment::lost,
                    "not run: " + golden_check.verdicts.unreadable.at(cases[i].op), Mode::none));
  if (progress_) progress_->clear();
}

int CaseRun::execute() {
  const int status = args.in_process ? run_in_process() : run_pool();
  wall_s = elapsed_s();
  return status;
}

WorkerConfig CaseRun::base_config() const {
  WorkerConfig cfg = worker_config(paths, libs.front().path, args.arch, args.repeat);
  cfg.repro_dir = repro_dir_;
  cfg.allow_missing_goldens = args.allow_missing_goldens;
  cfg.stress = args.stress;
  cfg.import_timeout_s = args.import_timeout_s;
  return cfg;
}

int CaseRun::run_in_process() {
  try {
    ctx_ = make_context_within_limit(base_config(), [](const std::string& why) {
      std::cerr << "attncheck: " << why << std::endl;
    });
  } catch (const std::exception& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  announce(context_hello(*ctx_));
  shrink_eval = in_process_evaluator(ctx_->eval);
  try {
    for (size_t i = 0; i < golden_check.verdicts.runnable; ++i)
      record(0, i,
             args.max_failures > 0 && libs[0].summary.failures >= args.max_failures
                 ? stand_in(0, i, Amendment::not_run, not_run_reason(), Mode::none)
                 : run_case(*ctx_, cases[i]));
  } catch (const std::exception& e) {  // a results file that cannot be written
    progress_->clear();
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  return 0;
}

PoolCallbacks CaseRun::callbacks() {
  PoolCallbacks cb;
  cb.on_hello = [this](const nlohmann::json& h) {
    if (!hello) announce(WorkerHello::from_json(h));
  };
  cb.on_worker_started = [this](size_t slot, double start_s) {
    count_worker_start(pool_use, plan, spec.slot_env, slot, start_s);
  };
  cb.on_round_trip = [this](size_t t, size_t slot, double ms) {
    round_trip_ms_[t] = ms;
    count_round_trip(pool_use, plan, spec.slot_env, slot, ms, elapsed_s());
  };
  cb.on_result = [this](size_t t, const nlohmann::json& j) { on_result(t, j); };
  if (!sanitizer_log_.empty())  // the report is complete once its worker exited, before on_result
    cb.on_worker_exit = [this](int serial, size_t t, nlohmann::json&) {
      std::string path = sanitizer_log_;
      path.replace(path.find("{worker}"), 8, std::to_string(serial));
      sanitizer_[t] = path;
    };
  // Cases of a golden file found unreadable are not sent; they are recorded after the run.
  cb.before_dispatch = [this] {
    golden_check.finish();
    std::vector<size_t> dropped;
    for (size_t t = 0; t < tasks_.size(); ++t)
      if (golden_check.verdicts.unreadable.count(cases[task_of_[t].index].op)) dropped.push_back(t);
    return dropped;
  };
  cb.on_not_run = [this](size_t t) {
    const auto [k, i] = task_of_[t];
    if (golden_check.verdicts.unreadable.count(cases[i].op))
      libs[k].set_aside.push_back(i);
    else
      record(k, i, stand_in(k, i, Amendment::not_run, not_run_reason(), Mode::none));
  };
  // --max-failures counts per library: a mutant is stopped by its first failures, and the other
  // libraries' cases go on.
  if (args.max_failures > 0)
    cb.stop_dispatching = [this](size_t t) {
      return libs[task_of_[t].lib].summary.failures >= args.max_failures;
    };
  cb.on_lost = [this](size_t t, const std::string& what) {
    const auto [k, i] = task_of_[t];
    record(k, i,
           stand_in(k, i, Amendment::lost, what, kernel_mode() ? Mode::kernel : Mode::reference));
  };
  return cb;
}

// The worker's answer, read once into a Result; what the parent adds goes through amend.
void CaseRun::on_result(size_t t, const nlohmann::json& j) {
  const auto [k, i] = task_of_[t];
  Result r;
  try {
    r = Result::from_json(j);
    r.timings.ipc_ms = std::max(0.0, round_trip_ms_[t] - r.timings.total_ms());
    if (const auto s = sanitizer_.find(t); s != sanitizer_.end()) {
      r = amend(cases[i], std::move(r), Amendment::sanitizer,
                AmendWith{s->second, Mode::none, nullptr, args.sanitizer});
      sanitizer_.erase(s);
    }
  } catch (const std::invalid_argument& e) {
    r = stand_in(k, i, Amendment::unreadable_line, e.what(), Mode::none);
  }
  record(k, i, std::move(r));
}

// The workers' own library (their config's kernels) is the first that loads. When they cannot
// start on it before any case ran (its worker's fatal line names why), its cases fail with that
// reason and the run starts again on the next library: one broken library hides no other.
int CaseRun::run_pool() {
  if (int status = make_spec()) return status;
  const PoolCallbacks cb = callbacks();
  for (size_t own = 0;; ++own) {
    plan_tasks(own);
    config.kernels = libs[own].path;
    spec.args = worker_command(config);
    try {
      run_in_workers(spec, tasks_, cb);
      break;
    } catch (const std::exception& e) {
      if (hello || own + 1 == libs.size()) {
        if (progress_) progress_->clear();
        std::cerr << "attncheck: " << e.what() << "\n";
        return 2;
      }
      for (size_t i : libs[own].cases)
        if (i < golden_check.verdicts.runnable)
          record(own, i,
                 stand_in(own, i, Amendment::lost,
                          std::string("the workers could not start on this library: ") + e.what(),
                          Mode::none));
      std::cerr << "attncheck: " << libs[own].name << ": the workers could not start on it ("
                << first_line(e.what()) << "); its cases fail, the run goes on with "
                << libs[own + 1].name << "\n";
    }
  }
  // The pool's workers were told every file was checked before the checks ended; the
  // shrinker's trust only the readable ones.
  for (const auto& [op, why] : golden_check.verdicts.unreadable) config.golden_checked.erase(op);
  if (args.shrink > 0) shrink_eval = worker_evaluator(shrink_spec(), options_for(0));
  return 0;
}

// The worker processes that evaluate shrink candidates: the run's, without a wrapper
// (compute-sanitizer's findings are not a shrink target) and without a repro directory (the
// candidates' bundles would crowd the run's).
WorkerSpec CaseRun::shrink_spec() const {
  WorkerSpec s = spec;
  s.wrapper.clear();
  s.one_case_per_worker = false;
  s.case_timeout_s = args.timeout_s;
  s.exe = "/proc/self/exe";
  WorkerConfig c = config;
  c.repro_dir.clear();
  s.args = worker_command(c);
  return s;
}

nlohmann::json CaseRun::run_json(size_t k, const Summary* done, double wall) const {
  std::optional<WorkerHello> h = hello;
  if (h && several_) h->library = libs[k].name;  // the hello names the worker's first library
  const RunDescription d{&paths, &args, libs[k].path, libs[k].cases.size(), started, plan};
  return describe_run(d, h, done, wall, pool_use, libs[k].results);
}

void CaseRun::write_outputs(size_t k, bool selection_order, const Summary* done) const {
  const LibraryRun& l = libs[k];
  write_file_atomic((l.out / "run.json").string(), run_json(k, done, wall_s).dump(2) + "\n");
  std::vector<const Result*> junit;
  if (selection_order)
    for (const auto& r : l.results) junit.push_back(&r);
  else
    for (size_t i : l.cases) junit.push_back(&l.results[i]);
  write_file_atomic((l.out / "junit.xml").string(),
                    junit_xml(junit, "attncheck " + args.tier + (several_ ? " " + l.name : "")));
}

}  // namespace attncheck::cli
