// `attncheck run` and `attncheck worker`: cases in worker processes, live progress, summary,
// failures with repro lines, and the results directory.
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>

#include "cli/commands.h"
#include "cli/case_run.h"
#include "cli/run_parts.h"
#include "core/safe_output.h"
#include "run/cases.h"
#include "run/evaluate.h"
#include "run/golden.h"
#include "run/pool.h"
#include "run/provenance.h"
#include "run/results.h"
#include "run/scheduling.h"
#include "run/sha256.h"
#include "run/worker.h"

namespace attncheck::cli {

namespace fs = std::filesystem;

std::string path_flags(const Paths& p) {
  std::string s;
  if (p.cases_given) s += " --cases " + fs::absolute(p.cases).string();
  if (p.golden_given) s += " --golden " + fs::absolute(p.golden).string();
  return s;
}

int cmd_worker(const std::string& config, const std::string& kernels_label) {
  WorkerConfig cfg;
  try {
    cfg = WorkerConfig::from_json(nlohmann::json::parse(config));
    if (!kernels_label.empty() && kernels_label != cfg.kernels)
      throw std::invalid_argument("--kernels '" + kernels_label +
                                  "' is not the config's kernels '" + cfg.kernels + "'");
  } catch (const std::exception& e) {
    // On the channel as a fatal line too, so that the pool that started this worker names it.
    const std::string why = std::string("worker --config: ") + e.what();
    std::cout << nlohmann::json{{"fatal", why}}.dump(-1, ' ', false,
                                                     nlohmann::json::error_handler_t::replace)
              << std::endl;
    std::cerr << "attncheck: " << why << "\n";
    return 2;
  }
  return worker_main(cfg);
}

namespace {

using Clock = std::chrono::steady_clock;

// --stress: per case the nondeterminism rate (launches differing bitwise from the first).
void print_stress_summary(const std::vector<Result>& results, int stress) {
  if (stress <= 0) return;
  int cases = 0, nondeterministic = 0;
  std::ostringstream lines;
  for (const auto& r : results) {
    if (!r.stress) continue;
    ++cases;
    const StressStats& st = *r.stress;
    if (st.differing == 0 && st.failed == 0) continue;
    ++nondeterministic;
    lines << "  " << r.id << ": " << st.differing << " of " << st.launches
          << " launches differ (rate " << std::setprecision(3) << st.rate() << "), " << st.failed
          << " fail the checks\n";
  }
  std::cout << "stress: " << cases << " case(s) x " << stress << " launches; " << nondeterministic
            << " with differing or failing launches\n"
            << lines.str();
}

}  // namespace

// Declarations and their descriptions: cli/run_parts.h.
uint64_t worker_memory_limit(const std::string& text, int jobs) {
  if (text.empty()) {
    const auto pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    const uint64_t total = pages > 0 && page > 0
                               ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page)
                               : uint64_t{16} << 30;
    return std::max<uint64_t>(total / 4 * 3 / static_cast<uint64_t>(std::max(jobs, 1)),
                              uint64_t{2} << 30);
  }
  if (text == "0" || text == "none") return 0;
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (unit.size() == 2 && (unit[1] == 'i' || unit[1] == 'I')) unit.pop_back();
  const std::string units = "KMGT";
  const auto u =
      unit.empty()
          ? std::string::npos
          : units.find(static_cast<char>(std::toupper(static_cast<unsigned char>(unit[0]))));
  if (used == 0 || !(v > 0) || unit.size() > 1 || (!unit.empty() && u == std::string::npos))
    throw std::invalid_argument("--worker-memory '" + text +
                                "': expected a size such as 4G or 512M, or 0 / none for no limit");
  const double bytes = v * std::pow(1024.0, unit.empty() ? 0.0 : static_cast<double>(u + 1));
  if (bytes < double(uint64_t{64} << 20) || bytes > 1e18)
    throw std::invalid_argument("--worker-memory '" + text +
                                "': out of range (at least 64M; 0 or none for no limit)");
  return static_cast<uint64_t>(bytes);
}

std::string first_line(const std::string& s, size_t max) {
  std::string l = s.substr(0, s.find('\n'));
  return l.size() > max ? l.substr(0, max) + " ..." : l;
}

bool load_durations(const std::string& path, std::optional<CaseDurations>& into) {
  if (path.empty()) return true;
  try {
    into = CaseDurations::load(path);
  } catch (const std::exception& e) {
    std::cerr << "attncheck: --durations: " << e.what() << "\n";
    return false;
  }
  return true;
}

namespace {
// The stamps (golden_file_stamp) of these cases' golden files, taken before the run checks them:
// a worker checks again only a file that changed since (run/golden.h,
// GoldenStore::trust_checked).
std::map<std::string, std::string> golden_stamps(const std::string& dir,
                                                 const std::vector<Case>& cases) {
  std::map<std::string, std::string> stamps;
  const GoldenStore store(dir);
  for (const auto& c : cases)
    if (!stamps.count(c.op) && store.has_op(c.op))
      if (std::string stamp = golden_file_stamp(store.path_of(c.op)); !stamp.empty())
        stamps[c.op] = stamp;
  return stamps;
}
}  // namespace

GoldenVerdicts check_golden_files(const std::string& dir, std::vector<Case>& cases) {
  GoldenVerdicts v;
  v.runnable = cases.size();
  if (!fs::is_directory(dir)) return v;
  v.checked = golden_stamps(dir, cases);
  v.unreadable = set_aside_unreadable_goldens(dir, cases, v.runnable);
  for (const auto& [op, why] : v.unreadable) v.checked.erase(op);
  return v;
}

GoldenCheck start_golden_check(const std::string& dir, const std::vector<Case>& cases) {
  GoldenCheck g;
  g.verdicts.runnable = cases.size();
  if (!fs::is_directory(dir)) return g;
  g.verdicts.checked = golden_stamps(dir, cases);
  g.pending =
      std::async(std::launch::async, [dir, &cases] { return unreadable_golden_files(dir, cases); });
  return g;
}

void GoldenCheck::finish() {
  if (!pending.valid()) return;
  verdicts.unreadable = pending.get();
  for (const auto& [op, why] : verdicts.unreadable) verdicts.checked.erase(op);
}

DirHandle lock_out_dir(const std::string& out) {
  DirHandle dir = DirHandle::open(out);
  if (!dir.try_lock_exclusive())
    throw std::runtime_error("--out '" + out +
                             "' is in use by another attncheck run (it holds the directory's "
                             "lock); wait for it to finish or choose another --out");
  return dir;
}

std::vector<PoolUse> pool_uses(const PoolPlan& plan) {
  std::vector<PoolUse> use;
  if (plan.pools.empty()) use.push_back({"", plan.jobs});
  for (const auto& p : plan.pools) use.push_back({p.gpu.id, p.jobs});
  return use;
}

namespace {
// The pool of worker slot `slot`: its environment's first setting names its GPU.
PoolUse& pool_of_slot(std::vector<PoolUse>& use, const PoolPlan& plan,
                      const std::vector<std::vector<std::string>>& slot_env, size_t slot) {
  PoolUse* u = &use.front();
  if (!plan.pools.empty() && !slot_env.empty()) {
    const std::string& setting = slot_env[slot % slot_env.size()].front();  // VARIABLE=gpu
    const std::string gpu = setting.substr(setting.find('=') + 1);
    for (auto& candidate : use)
      if (candidate.gpu == gpu) u = &candidate;
  }
  return *u;
}
}  // namespace

void count_round_trip(std::vector<PoolUse>& use, const PoolPlan& plan,
                      const std::vector<std::vector<std::string>>& slot_env, size_t slot, double ms,
                      double ended_s) {
  PoolUse& u = pool_of_slot(use, plan, slot_env, slot);
  ++u.cases;
  u.busy_s += ms / 1e3;
  u.finished_s = ended_s;
}

void count_worker_start(std::vector<PoolUse>& use, const PoolPlan& plan,
                        const std::vector<std::vector<std::string>>& slot_env, size_t slot,
                        double start_s) {
  PoolUse& u = pool_of_slot(use, plan, slot_env, slot);
  ++u.starts;
  u.start_s += start_s;
  u.longest_start_s = std::max(u.longest_start_s, start_s);
}

PoolPlan pools_for(const RunArgs& a, bool kernel_mode) {
  std::string variable;
  std::vector<VisibleGpu> gpus;
  if (kernel_mode && a.gpus != "none") {
    // GPU memory sizes the pools only when the workers per GPU are not given.
    const bool workers_given = a.gpus != "auto" && a.jobs_per_gpu > 0;
    std::vector<VisibleGpu> visible;
    if (workers_given)
      variable = gpu_variable();
    else
      visible = visible_gpus(&variable);
    if (a.gpus == "auto") {
      gpus = visible;
    } else {
      std::istringstream in(a.gpus);
      for (std::string id; std::getline(in, id, ',');) {
        if (id.empty()) throw std::invalid_argument("--gpus '" + a.gpus + "': an empty id");
        VisibleGpu g{id, 0};
        for (const auto& v : visible)
          if (v.id == id) g = v;
        gpus.push_back(g);
      }
      if (variable.empty()) variable = "CUDA_VISIBLE_DEVICES";
      // A device backend with its own variable: the ids are that backend's.
      if (std::getenv("HIP_VISIBLE_DEVICES") && !std::getenv("CUDA_VISIBLE_DEVICES"))
        variable = "HIP_VISIBLE_DEVICES";
    }
  }
  // The cores this process may run on (taskset, cgroups' cpusets), not the host's.
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const int cores = ::sched_getaffinity(0, sizeof allowed, &allowed) == 0
                        ? CPU_COUNT(&allowed)
                        : static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  // The Python bridge does not declare calls from any thread (docs/bridge.md): a process per case.
  const std::string kernels = !a.kernels.empty()                 ? a.kernels
                              : std::getenv("ATTNCHECK_KERNELS") ? std::getenv("ATTNCHECK_KERNELS")
                                                                 : "";
  // The stress mode's device-wide conditions and a sanitizer's one case per process: one thread.
  const int threads = !a.sanitizer.empty() || a.stress > 0 ? 1
                      : a.threads_per_worker > 0           ? a.threads_per_worker
                      : kernels.rfind("py:", 0) == 0       ? 1
                                                           : 0;
  PoolPlan plan = plan_pools(gpus, std::max(cores, 1), a.jobs, a.jobs_per_gpu, threads);
  plan.variable = variable;
  if (const char* omp = std::getenv("OMP_NUM_THREADS"); omp && std::atoi(omp) > 0)
    plan.cpu_threads = std::atoi(omp);  // the user's choice stands
  return plan;
}

std::string describe_pools(const PoolPlan& plan) {
  std::ostringstream os;
  if (plan.pools.empty()) {
    os << plan.jobs << " case(s) at once";
  } else {
    for (size_t i = 0; i < plan.pools.size(); ++i)
      os << (i ? ", " : "") << "GPU " << plan.pools[i].gpu.id << ": " << plan.pools[i].jobs;
    os << " case(s) at once (" << plan.variable << ")";
  }
  os << " in " << plan.processes() << " worker process(es)";
  if (plan.threads > 1) os << " of " << plan.threads << " threads";
  os << ", " << plan.cpu_threads << " reference thread(s) each; " << plan.why;
  return os.str();
}

nlohmann::json pools_json(const std::vector<PoolUse>& use) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& u : use) {
    j.push_back({{"gpu", u.gpu},
                 {"jobs", u.jobs},
                 {"cases", u.cases},
                 {"busy_s", std::round(u.busy_s * 1e3) / 1e3},
                 {"finished_s", std::round(u.finished_s * 1e3) / 1e3}});
    j.back()["worker_starts"] = u.starts;
    j.back()["worker_start_s"] = std::round(u.start_s * 1e3) / 1e3;
  }
  return j;
}

std::map<std::string, double> phase_seconds(const std::vector<Result>& results) {
  std::map<std::string, double> s;
  for (const auto& name : timing_phase_names()) s[name] = 0;
  for (const auto& r : results)
    for (const auto& name : timing_phase_names()) s[name] += timing_of(r.timings, name) / 1e3;
  return s;
}

void print_profile(const std::vector<Result>& results, double wall_s, double parent_s,
                   const std::vector<PoolUse>& pools, int jobs, int processes) {
  const auto phases = phase_seconds(results);
  double sum = 0;
  for (const auto& [name, v] : phases) sum += v;
  std::cout << "\nprofile: " << results.size() << " cases in " << std::fixed << std::setprecision(1)
            << wall_s
            << " s wall = " << (wall_s > 0 ? static_cast<double>(results.size()) / wall_s : 0.0)
            << " cases/s with " << jobs << " worker(s); case time " << sum
            << " s in all (worker-seconds), the parent's result handling " << std::setprecision(2)
            << parent_s << " s\n";
  std::cout << "  phase        seconds   share   (summed over cases)\n";
  for (const auto& name : timing_phase_names()) {
    const double v = phases.at(name);
    std::cout << "  " << std::left << std::setw(11) << name << std::right << std::setw(9)
              << std::setprecision(2) << v << std::setw(7) << std::setprecision(1)
              << (sum > 0 ? 100 * v / sum : 0) << "%\n";
  }
  // Held inside upload..download; near 100% of the wall in each process, the lock bounds it.
  double locked_s = 0;
  for (const auto& r : results) locked_s += r.timings.locked_ms / 1e3;
  if (locked_s > 0) {
    const int n = std::max(processes, 1);
    std::cout << "  the launch lock held " << std::setprecision(2) << locked_s
              << " s in all: " << std::setprecision(0)
              << (wall_s > 0 ? 100 * locked_s / (n * wall_s) : 0) << "% of the wall in each of "
              << n << " worker process(es)\n";
  }
  // Workers started beyond the first ones replace retired ones (a device error, processes left
  // running, a lost case): their starts cost their slots.
  int starts = 0;
  double start_s = 0, longest = 0;
  for (const auto& p : pools) {
    starts += p.starts;
    start_s += p.start_s;
    longest = std::max(longest, p.longest_start_s);
  }
  if (starts > 0)
    std::cout << "  worker processes started: " << starts << " (" << std::max(0, starts - processes)
              << " beyond the first " << processes << "), " << std::setprecision(2) << start_s
              << " s from spawn to hello in all, the longest " << longest << " s\n";
  std::map<std::string, std::vector<const Result*>> per_op;
  for (const auto& r : results) per_op[r.op].push_back(&r);
  std::cout << "  op                            cases  seconds  ms/case  largest phases\n";
  for (const auto& [op, rs] : per_op) {
    std::map<std::string, double> ph;
    double total = 0;
    for (const Result* r : rs)
      for (const auto& name : timing_phase_names()) {
        ph[name] += timing_of(r->timings, name) / 1e3;
        total += timing_of(r->timings, name) / 1e3;
      }
    std::vector<std::pair<double, std::string>> top;
    for (const auto& [name, v] : ph) top.emplace_back(v, name);
    std::sort(top.rbegin(), top.rend());
    std::ostringstream largest;
    for (size_t i = 0; i < std::min<size_t>(3, top.size()); ++i)
      if (top[i].first > 0)
        largest << (i ? ", " : "") << top[i].second << " " << std::setprecision(0) << std::fixed
                << (total > 0 ? 100 * top[i].first / total : 0) << "%";
    std::cout << "  " << std::left << std::setw(28) << op << std::right << std::setw(7) << rs.size()
              << std::setw(9) << std::setprecision(2) << total << std::setw(9)
              << std::setprecision(1) << 1e3 * total / static_cast<double>(rs.size()) << "  "
              << largest.str() << "\n";
  }
  if (pools.size() > 1) {
    double first = 1e300, last = 0;
    for (const auto& p : pools) {
      std::cout << "  pool GPU " << p.gpu << ": " << p.jobs << " worker(s), " << p.cases
                << " cases, busy " << std::setprecision(1) << p.busy_s << " s, last case ended at "
                << p.finished_s << " s\n";
      first = std::min(first, p.finished_s);
      last = std::max(last, p.finished_s);
    }
    std::cout << "  pools ended within " << std::setprecision(1)
              << (last > 0 ? 100 * (last - first) / last : 0) << "% of each other\n";
  }
  std::cout << std::defaultfloat;
}

nlohmann::json describe_run(const RunDescription& d, const std::optional<WorkerHello>& hello,
                            const Summary* done_summary, double wall_s,
                            const std::vector<PoolUse>& pools, const std::vector<Result>& results) {
  const RunArgs& a = *d.args;
  std::string manifest_sha;
  try {
    manifest_sha = sha256_file((fs::path(d.paths->golden) / "MANIFEST").string());
  } catch (const std::exception&) {
  }
  const WorkerHello h = hello.value_or(WorkerHello{});
  const bool kernel_mode = hello && h.kernel_mode;
  // The worker processes that started (said hello), replacements included: not the plan's,
  // which a run with fewer cases than jobs never reaches.
  int workers_started = 0;
  for (const auto& u : pools) workers_started += u.starts;
  nlohmann::json timings = nlohmann::json::object();  // the merge sums them
  for (const auto& [name, v] : phase_seconds(results)) timings[name] = std::round(v * 1e3) / 1e3;
  return nlohmann::json{
      {"attncheck_version", attncheck_version()},
      {"git_revision", git_revision(d.paths->root)},
      {"arch", h.arch},
      {"device", h.device},
      {"backend", h.backend()},
      {"kernels_library", d.kernels.empty() ? "" : d.kernels + " (" + h.library + ")"},
      {"toolchain", toolchain()},
      {"tier", a.tier},
      {"filter", a.filter},
      {"shard", a.shard},
      {"case_count", d.case_count},
      {"golden_manifest_sha256", manifest_sha},
      {"started", d.started},
      {"finished", done_summary ? utc_now_iso() : ""},
      {"wall_s", wall_s},
      {"mode", kernel_mode ? "kernel" : "reference"},
      {"kernel_skipped_reason", kernel_mode ? "" : h.no_device},
      {"compared", done_summary ? done_summary->compared : 0},
      {"repeat", a.repeat},
      {"stress", a.stress},
      {"sanitizer", a.sanitizer},
      {"smem_poison", !a.no_smem_poison},
      {"jobs", a.in_process ? 0 : d.plan.jobs},
      {"workers", a.in_process ? 0 : workers_started},
      {"threads_per_worker", a.in_process ? 0 : d.plan.threads},
      {"cpu_threads", d.plan.cpu_threads},
      {"pools", pools_json(pools)},
      {"durations", a.durations},
      {"timings_s", timings}};
}

WorkerSpec pool_worker_spec(const PoolPlan& plan, const RunArgs& a) {
  WorkerSpec spec;
  spec.jobs = plan.processes();
  spec.threads = plan.threads;
  spec.slot_env = plan.slot_env();
  spec.case_timeout_s = a.timeout_s;
  spec.memory_limit = worker_memory_limit(a.worker_memory, plan.processes());
  return spec;
}

namespace {

// --shrink N: the first N failures of the run in kernel mode, each shrunk within --shrink-time
// seconds; printed, and returned as results.jsonl's "shrunk" field per result index.
std::map<size_t, nlohmann::json> shrink_failures(const std::vector<Case>& cases,
                                                 const std::vector<Result>& results,
                                                 const CaseEvaluator& evaluate_cases,
                                                 const RunArgs& a, const RunOptions& opt,
                                                 const std::vector<CaseFile>& files) {
  std::map<size_t, nlohmann::json> out;
  int tried = 0;
  for (size_t i = 0; i < results.size() && tried < a.shrink; ++i) {
    const Result& r = results[i];
    if (r.verdict != Verdict::failed || r.mode != Mode::kernel) continue;
    const Op* op = find_op(r.op);
    if (!op) continue;
    ++tried;
    const FailureSignature target = pick_target(r, "");
    std::cout << "\nshrinking " << r.id << " (" << target.describe() << ")\n" << std::flush;
    ShrinkOptions so;
    so.time_budget_s = a.shrink_time_s;
    const ShrinkOutcome s = shrink(*op, cases[i], r, target, evaluate_cases, so);
    const Params defaults = file_defaults_of(files, op->name());
    print_shrink_outcome(std::cout, *op, s, opt, defaults, "  ");
    out[i] = shrunk_json(*op, s, opt, defaults);
  }
  return out;
}

// results.jsonl again, in the order its lines were written, with each shrunk failure's field.
void rewrite_results_with_shrunk(const fs::path& out, const std::vector<Result>& results,
                                 const std::vector<size_t>& completion,
                                 const std::map<size_t, nlohmann::json>& shrunk) {
  std::string text;
  for (size_t i : completion) {
    nlohmann::json j = results[i].to_json();
    if (const auto it = shrunk.find(i); it != shrunk.end()) j["shrunk"] = it->second;
    text += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  write_file_atomic((out / "results.jsonl").string(), text);
}

}  // namespace

namespace {

// The run's summary on stdout: the table, what was not checked, the failures' repro lines, the
// passes that needed a declared contract, --stress's rates.
void print_run_summary(const CaseRun& run) {
  const LibraryRun& l = run.libs.front();
  std::cout << "\n";
  l.summary.print(std::cout);
  if (!run.kernel_mode())
    std::cout << "REFERENCE ONLY: kernels not checked for any of the " << run.cases.size()
              << " cases (" << (run.hello ? run.hello->no_device : "") << ")\n";
  if (l.summary.failures > 0) {
    std::cout << "\n" << l.summary.failures << " failing case(s); rerun one with:\n";
    for (const auto& r : l.results)
      if (r.failing()) std::cout << "  " << r.repro << "\n";
  }
  if (l.summary.compared == 0)
    std::cout << "\nNOTHING COMPARED: no case compared a kernel output or a golden\n";
  // Never a silently looser default: passes that needed the kernel's declared contract are
  // counted per contract (each result names it; docs/verification.md "Arithmetic contracts").
  std::map<std::string, int64_t> under_contract;
  for (const auto& r : l.results)
    if (r.verdict == Verdict::passed && !r.contract.empty() && r.contract != kDefaultContractName)
      ++under_contract[r.contract];
  if (!under_contract.empty()) {
    std::cout << "\npassed only under the kernel's declared arithmetic contract (the default "
              << kDefaultContractName << " budgets fail):\n";
    for (const auto& [name, n] : under_contract)
      std::cout << "  " << n << " case(s) under " << name << "\n";
  }
  print_stress_summary(l.results, run.args.stress);
}

// After the cases: the set-aside ones, the summary, --shrink, --profile, and the results
// directory's run.json and junit.xml (results.jsonl again when failures were shrunk).
int finish_run(CaseRun& run) {
  const RunArgs& a = run.args;
  try {
    run.record_set_aside(0);
  } catch (const std::exception& e) {  // a results file that cannot be written
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  print_run_summary(run);
  const LibraryRun& l = run.libs.front();
  std::map<size_t, nlohmann::json> shrunk;  // result index -> results.jsonl's "shrunk"
  if (a.shrink > 0 && run.kernel_mode() && run.shrink_eval) {
    const RunOptions opt = run.options_for(0);
    try {
      shrunk = shrink_failures(run.cases, l.results, run.shrink_eval, a, opt, run.files);
    } catch (const std::exception& e) {  // workers that cannot start
      std::cerr << "attncheck: --shrink: " << e.what() << "\n";
    }
  }
  if (a.profile)
    print_profile(l.results, run.wall_s, run.parent_s, run.pool_use,
                  a.in_process ? 0 : run.plan.jobs, a.in_process ? 1 : run.plan.processes());
  std::cout << "wall time " << std::fixed << std::setprecision(1) << run.wall_s << " s\n";
  if (!a.out.empty()) {
    try {
      if (!shrunk.empty()) rewrite_results_with_shrunk(l.out, l.results, l.completion, shrunk);
      run.write_outputs(0, true, &l.summary);
    } catch (const std::exception& e) {
      std::cerr << "attncheck: " << e.what() << "\n";
      return 2;
    }
    std::cout << "results: " << fs::absolute(l.out).string() << "\n";
  }
  // Nothing compared is a failed gate, unless reference-vs-nothing was asked for.
  return l.summary.failures > 0 || (l.summary.compared == 0 && !a.allow_missing_goldens) ? 1 : 0;
}

}  // namespace

int cmd_run(const Paths& paths, const RunArgs& a) {
  std::vector<LibraryRun> one(1);
  one[0].path = a.kernels.empty() || a.kernels.rfind("py:", 0) == 0
                    ? a.kernels
                    : fs::absolute(a.kernels).string();
  CaseRun run(paths, a, std::move(one), false);
  if (const int status = run.prepare()) return status;
  if (const int status = run.execute()) return status;
  return finish_run(run);
}

}  // namespace attncheck::cli
