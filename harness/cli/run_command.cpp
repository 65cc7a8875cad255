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

int cmd_worker(const Paths& p, const WorkerArgs& a) {
  WorkerConfig cfg;  // no cases_dir: each request carries its whole Case
  cfg.golden_dir = p.golden;
  cfg.kernels = a.kernels;
  cfg.arch = a.arch;
  cfg.repeat = a.repeat;
  cfg.stress = a.stress;
  cfg.repro_dir = a.repro_dir;
  cfg.repro_extra = a.repro_extra;
  cfg.allow_missing_goldens = a.allow_missing_goldens;
  cfg.import_timeout_s = a.import_timeout_s;
  cfg.threads = std::max(1, a.threads);
  for (const auto& checked : a.golden_checked) {
    const auto eq = checked.find('=');
    if (eq != std::string::npos) cfg.golden_checked[checked.substr(0, eq)] = checked.substr(eq + 1);
  }
  return worker_main(cfg);
}

namespace {

using Clock = std::chrono::steady_clock;

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

nlohmann::json describe_run(const RunDescription& d, const std::optional<nlohmann::json>& hello,
                            const Summary* done_summary, double wall_s,
                            const std::vector<PoolUse>& pools, const std::vector<Result>& results) {
  const RunArgs& a = *d.args;
  std::string manifest_sha;
  try {
    manifest_sha = sha256_file((fs::path(d.paths->golden) / "MANIFEST").string());
  } catch (const std::exception&) {
  }
  const nlohmann::json hj = hello.value_or(nlohmann::json::object());
  const std::string arch = hj.value("arch", "");
  const std::string backend = arch.rfind("gfx", 0) == 0   ? "hip"
                              : arch.rfind("sm_", 0) == 0 ? "cuda"
                                                          : "cpu";
  const bool kernel_mode = hj.value("mode", "") == "kernel";
  // The worker processes that started (said hello), replacements included: not the plan's,
  // which a run with fewer cases than jobs never reaches.
  int workers_started = 0;
  for (const auto& u : pools) workers_started += u.starts;
  nlohmann::json timings = nlohmann::json::object();  // the merge sums them
  for (const auto& [name, v] : phase_seconds(results)) timings[name] = std::round(v * 1e3) / 1e3;
  return nlohmann::json{{"attncheck_version", attncheck_version()},
                        {"git_revision", git_revision(d.paths->root)},
                        {"arch", arch},
                        {"device", hj.value("device", "")},
                        {"backend", backend},
                        {"kernels_library",
                         d.kernels.empty() ? "" : d.kernels + " (" + hj.value("library", "") + ")"},
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
                        {"kernel_skipped_reason", kernel_mode ? "" : hj.value("no_device", "")},
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

std::vector<std::string> worker_args(const Paths& paths, const RunArgs& a,
                                     const std::string& kernels, const std::string& repro_dir,
                                     const PoolPlan& plan,
                                     const std::map<std::string, std::string>& checked_goldens) {
  std::vector<std::string> args = {"--golden", fs::absolute(paths.golden).string(), "worker",
                                   "--repeat", std::to_string(a.repeat)};
  if (!kernels.empty()) args.insert(args.end(), {"--kernels", kernels});
  if (!a.arch.empty()) args.insert(args.end(), {"--arch", a.arch});
  if (!repro_dir.empty()) args.insert(args.end(), {"--repro-dir", repro_dir});
  if (!path_flags(paths).empty()) args.insert(args.end(), {"--repro-extra", path_flags(paths)});
  if (a.allow_missing_goldens) args.push_back("--allow-missing-goldens");
  if (a.stress > 0) args.insert(args.end(), {"--stress", std::to_string(a.stress)});
  if (plan.threads > 1) args.insert(args.end(), {"--threads", std::to_string(plan.threads)});
  for (const auto& [op, stamp] : checked_goldens)
    args.insert(args.end(), {"--golden-checked", op + "=" + stamp});
  return args;
}

namespace {

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

// The worker processes that evaluate shrink candidates: the run's, without a wrapper
// (compute-sanitizer's findings are not a shrink target) and without a repro directory (the
// candidates' bundles would crowd the run's).
WorkerSpec shrink_spec(WorkerSpec spec, const RunArgs& a) {
  spec.wrapper.clear();
  spec.one_case_per_worker = false;
  spec.case_timeout_s = a.timeout_s;
  spec.exe = "/proc/self/exe";
  for (size_t k = 0; k + 1 < spec.args.size(); ++k)
    if (spec.args[k] == "--repro-dir") {
      spec.args.erase(spec.args.begin() + static_cast<std::ptrdiff_t>(k),
                      spec.args.begin() + static_cast<std::ptrdiff_t>(k + 2));
      break;
    }
  return spec;
}

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

int cmd_run(const Paths& paths, const RunArgs& a) {
  Selection sel;
  sel.tier = a.tier;
  sel.ops = a.ops;
  sel.filter = a.filter;
  try {
    sel.shard = parse_shard(a.shard);
  } catch (const std::invalid_argument& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  std::optional<CaseDurations> durations;
  if (!load_durations(a.durations, durations)) return 2;
  if (durations) sel.durations = &*durations;
  std::vector<CaseFile> files;
  std::vector<Case> cases;
  if (!load_and_select(paths, sel, files, cases)) return 2;
  if (cases.empty()) {
    std::cerr << "attncheck: no case matches (tier " << a.tier << ", filter '" << a.filter
              << "', shard " << a.shard << ")\n";
    return 2;
  }
  if (!a.kernels.empty() && a.kernels.rfind("py:", 0) != 0 && !fs::exists(a.kernels)) {
    std::cerr << "attncheck: kernel library '" << a.kernels << "' does not exist\n";
    return 2;
  }
  if (!fs::is_directory(paths.golden) && !a.allow_missing_goldens) {
    std::cerr << "attncheck: golden directory '" << paths.golden
              << "' does not exist (pass --golden DIR, or --allow-missing-goldens to run "
                 "without goldens)\n";
    return 2;
  }
  // Reference mode compares with the goldens: a golden file missing for cases of the golden tiers
  // (deleted, or a typo in --golden) is an input error, unless reference-vs-nothing was asked for.
  if (a.kernels.empty() && !a.allow_missing_goldens) {
    std::map<std::string, int> missing;
    for (const auto& c : cases)
      if ((c.in_tier("smoke") || c.in_tier("quick")) &&
          !fs::exists(fs::path(paths.golden) / (c.op + ".h5")))
        ++missing[c.op];
    for (const auto& [op, n] : missing)
      std::cerr << "attncheck: golden file '" << (fs::path(paths.golden) / (op + ".h5")).string()
                << "' does not exist (" << n << " smoke/quick cases of " << op
                << "; `attncheck golden generate --op " << op
                << "`, or --allow-missing-goldens to run without it)\n";
    if (!missing.empty()) return 2;
  }
  // One verdict per golden file for the whole run: a file that fails, crashes or hangs its reader
  // is read once; its cases fail at once, naming it. A pool takes the verdicts while its workers
  // start and never sends those cases; in process they come first, and the cases are moved
  // behind the `runnable` others.
  GoldenCheck golden_check;
  try {
    if (a.in_process)
      golden_check.verdicts = check_golden_files(paths.golden, cases);
    else
      golden_check = start_golden_check(paths.golden, cases);
  } catch (const std::exception& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  const GoldenVerdicts& goldens = golden_check.verdicts;
  const size_t runnable = goldens.runnable;
  const auto& unreadable_goldens = goldens.unreadable;
  const auto& checked_goldens = goldens.checked;  // op -> stamp, for the workers
  // --out is this run's alone, until the run ends.
  std::optional<DirHandle> out_lock;
  std::optional<OutputStream> worker_log;
  std::string repro_dir;
  if (!a.out.empty()) {
    try {
      out_lock.emplace(lock_out_dir(a.out));
      repro_dir = fs::absolute(fs::path(a.out) / "repro").string();
      DirHandle::open(repro_dir);
      if (!a.in_process)  // opened safely here; the pool appends through /proc/self/fd
        worker_log.emplace(fs::path(a.out) / "worker.log", OutputStream::Mode::append);
    } catch (const std::exception& e) {
      std::cerr << "attncheck: " << e.what() << "\n";
      return 2;
    }
  }
  const std::string kernels = a.kernels.empty() || a.kernels.rfind("py:", 0) == 0
                                  ? a.kernels
                                  : fs::absolute(a.kernels).string();
  const std::string started = utc_now_iso();
  const auto t0 = Clock::now();

  const bool kernels_given = !kernels.empty();
  PoolPlan plan;
  try {
    plan = pools_for(a, kernels_given);
  } catch (const std::invalid_argument& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  if (a.in_process) plan = PoolPlan{};
  std::vector<PoolUse> pool_use = pool_uses(plan);
  double parent_s = 0;  // the parent's own time per result: parsing, writing, printing
  std::vector<Result> results(cases.size());
  const RunDescription described{&paths, &a, kernels, cases.size(), started, plan};
  const auto run_json = [&](const std::optional<nlohmann::json>& h, const Summary* done_summary,
                            double wall_s) {
    return describe_run(described, h, done_summary, wall_s, pool_use, results);
  };
  std::optional<JsonlWriter> jsonl;
  if (!a.out.empty()) {
    try {
      write_file_atomic((fs::path(a.out) / "run.json").string(),
                        run_json(std::nullopt, nullptr, 0).dump(2) + "\n");
      jsonl.emplace((fs::path(a.out) / "results.jsonl").string());
    } catch (const std::exception& e) {
      std::cerr << "attncheck: " << e.what() << "\n";
      return 2;
    }
  }
  Summary summary;
  std::vector<size_t> completion;  // result indices in the order results.jsonl got them
  std::vector<size_t> set_aside;   // cases of unreadable golden files, recorded after the run
  // --shrink: how candidates are evaluated, set by the branch that ran the cases.
  CaseEvaluator shrink_eval;
  std::unique_ptr<CaseContext> ctx;  // --in-process
  Progress progress(cases.size());
  std::optional<nlohmann::json> hello;
  size_t done = 0;

  auto announce = [&](const nlohmann::json& h) {
    if (hello) return;
    hello = h;
    std::cout << "attncheck run: " << cases.size() << " cases (tier " << a.tier;
    if (a.shard != "0/1") std::cout << ", shard " << a.shard;
    if (!a.filter.empty()) std::cout << ", filter '" << a.filter << "'";
    std::cout << ")\n";
    if (h.value("mode", "") == "kernel")
      std::cout << "  kernels: " << h.value("library", "") << " on " << h.value("device", "")
                << " (" << h.value("device_arch", "") << ")\n";
    else
      std::cout << "  REFERENCE ONLY, kernels not checked: " << h.value("no_device", "")
                << "\n  checking the reference against the goldens\n";
    if (!a.in_process) std::cout << "  pools: " << describe_pools(plan) << "\n";
    if (h.contains("threads_why") && h["threads_why"].is_string())
      std::cout << "  one case per worker process: " << h["threads_why"].get<std::string>()
                << " (the pool opens more processes instead)\n";
    std::cout << std::flush;
  };
  auto record = [&](size_t i, const Result& r) {
    const auto record_start = Clock::now();
    struct AddTime {  // the parent's time on this result, on every way out
      double& into;
      Clock::time_point since;
      ~AddTime() { into += std::chrono::duration<double>(Clock::now() - since).count(); }
    } parent_time{parent_s, record_start};
    summary.add(r);
    if (jsonl)
      jsonl->append(r.to_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    if (r.failing()) {
      progress.clear();
      std::cout << (r.verdict == Verdict::error ? "ERROR " : "FAIL  ") << r.id << "\n      "
                << first_line(r.message) << "\n      repro: " << r.repro << "\n"
                << std::flush;
    }
    results[i] = r;
    completion.push_back(i);
    progress.update(++done, summary.failures, cases[i].id);
  };

  // --max-failures: a case not started once that many failed (its own verdict, saying why).
  RunOptions not_run_opt;
  not_run_opt.kernels_path = kernels;
  not_run_opt.repro_extra = path_flags(paths);
  auto not_run = [&](const Case& c) {
    not_run_opt.arch = hello ? hello->value("arch", "") : a.arch;
    Result r = lost_case_result(c, Mode::none, not_run_opt,
                                "not run: the run stopped starting cases after " +
                                    std::to_string(a.max_failures) + " failed (--max-failures)");
    r.verdict = Verdict::skipped;
    return r;
  };

  if (a.in_process) {
    WorkerConfig cfg{"",        paths.golden,       kernels,  a.arch,
                     repro_dir, path_flags(paths),  a.repeat, a.allow_missing_goldens,
                     a.stress,  a.import_timeout_s, {}};
    try {
      ctx = make_context_within_limit(
          cfg, [](const std::string& why) { std::cerr << "attncheck: " << why << std::endl; });
    } catch (const std::exception& e) {
      std::cerr << "attncheck: " << e.what() << "\n";
      return 2;
    }
    announce(context_hello(*ctx));
    shrink_eval = [&ctx](const std::vector<Case>& batch) {
      std::vector<Result> out;
      for (const auto& c : batch) out.push_back(evaluate(c, ctx->eval));
      return out;
    };
    try {
      for (size_t i = 0; i < runnable; ++i)
        record(i, a.max_failures > 0 && summary.failures >= a.max_failures
                      ? not_run(cases[i])
                      : run_case(*ctx, cases[i]));
    } catch (const std::exception& e) {  // a results file that cannot be written
      progress.clear();
      std::cerr << "attncheck: " << e.what() << "\n";
      return 2;
    }
  } else {
    WorkerSpec spec;
    try {
      spec = pool_worker_spec(plan, a);
    } catch (const std::invalid_argument& e) {
      std::cerr << "attncheck: " << e.what() << "\n";
      return 2;
    }
    if (worker_log) spec.log_path = "/proc/self/fd/" + std::to_string(worker_log->fd());
    spec.args = worker_args(paths, a, kernels, repro_dir, plan, checked_goldens);
    std::string sanitizer_log;
    if (!a.sanitizer.empty()) {
      try {
        sanitizer_log = sanitize_workers(spec, a);
      } catch (const std::exception& e) {
        std::cerr << "attncheck: --sanitizer: " << e.what() << "\n";
        return 2;
      }
    }
    // The worker enforces the import limit itself and names what hung; the pool's start limit is
    // the backstop (a sanitizer slows everything, the import included).
    const double import_limit = a.import_timeout_s * (a.sanitizer.empty() ? 1.0 : 5.0);
    spec.args.insert(spec.args.end(), {"--import-timeout", std::to_string(import_limit)});
    spec.start_timeout_s = import_limit > 0 ? import_limit + 60 : 7 * 24 * 3600.0;
    // With measured durations the longest cases start first, so no long case starts last.
    std::vector<size_t> order(runnable);
    std::iota(order.begin(), order.end(), size_t{0});
    if (durations) {
      std::vector<std::string> ids;
      for (size_t i = 0; i < runnable; ++i) ids.push_back(cases[i].id);
      order = longest_first(ids, *durations);
    }
    std::vector<PoolTask> tasks;
    for (size_t i : order) tasks.push_back({cases[i].id, case_to_json(cases[i])});
    std::vector<double> round_trip_ms(cases.size(), 0);
    RunOptions lost_opt;
    lost_opt.kernels_path = kernels;
    lost_opt.repro_extra = path_flags(paths);
    PoolCallbacks cb;
    cb.on_hello = announce;
    cb.on_worker_started = [&](size_t slot, double start_s) {
      count_worker_start(pool_use, plan, spec.slot_env, slot, start_s);
    };
    cb.on_round_trip = [&](size_t t, size_t slot, double ms) {
      round_trip_ms[order[t]] = ms;
      count_round_trip(pool_use, plan, spec.slot_env, slot, ms,
                       std::chrono::duration<double>(Clock::now() - t0).count());
    };
    cb.on_result = [&, order](size_t t, const nlohmann::json& j) {
      const size_t i = order[t];
      try {
        Result r = Result::from_json(j);
        r.timings.ipc_ms = std::max(0.0, round_trip_ms[i] - r.timings.total_ms());
        record(i, r);
      } catch (const std::invalid_argument& e) {
        lost_opt.arch = hello ? hello->value("arch", "") : a.arch;
        Result r =
            lost_case_result(cases[i], Mode::none, lost_opt,
                             std::string("the worker's result line is unreadable: ") + e.what());
        r.verdict = Verdict::error;
        record(i, r);
      }
    };
    if (!sanitizer_log.empty())
      cb.on_worker_exit = [&](int serial, size_t, nlohmann::json& result) {
        std::string path = sanitizer_log;
        path.replace(path.find("{worker}"), 8, std::to_string(serial));
        std::ifstream in(path);
        const std::string report((std::istreambuf_iterator<char>(in)),
                                 std::istreambuf_iterator<char>());
        try {
          Result r = Result::from_json(result);
          apply_sanitizer_report(r, report, a.sanitizer, path);
          result = r.to_json();
        } catch (const std::invalid_argument&) {  // on_result reports the unreadable line
        }
      };
    // Cases of a golden file found unreadable are not sent; they are recorded after the run,
    // with those set aside in process.
    cb.before_dispatch = [&, order] {
      golden_check.finish();
      std::vector<size_t> dropped;
      for (size_t t = 0; t < order.size(); ++t)
        if (unreadable_goldens.count(cases[order[t]].op)) dropped.push_back(t);
      return dropped;
    };
    cb.on_not_run = [&, order](size_t t) {
      if (unreadable_goldens.count(cases[order[t]].op))
        set_aside.push_back(order[t]);
      else
        record(order[t], not_run(cases[order[t]]));
    };
    if (a.max_failures > 0)
      cb.stop_dispatching = [&](size_t) { return summary.failures >= a.max_failures; };
    cb.on_lost = [&, order](size_t t, const std::string& what) {
      const size_t i = order[t];
      lost_opt.arch = hello ? hello->value("arch", "") : a.arch;
      const Mode mode =
          hello && hello->value("mode", "") == "kernel" ? Mode::kernel : Mode::reference;
      record(i, lost_case_result(cases[i], mode, lost_opt, what));
    };
    try {
      run_in_workers(spec, tasks, cb);
    } catch (const std::exception& e) {
      progress.clear();
      std::cerr << "attncheck: " << e.what() << "\n";
      return 2;
    }
    // The pool's workers were told every file was checked before the checks ended; the
    // shrinker's trust only the readable ones.
    for (const auto& [op, why] : unreadable_goldens)
      for (size_t k = 0; k + 1 < spec.args.size(); ++k)
        if (spec.args[k] == "--golden-checked" && spec.args[k + 1].rfind(op + "=", 0) == 0) {
          spec.args.erase(spec.args.begin() + static_cast<std::ptrdiff_t>(k),
                          spec.args.begin() + static_cast<std::ptrdiff_t>(k) + 2);
          break;
        }
    if (a.shrink > 0) shrink_eval = worker_evaluator(shrink_spec(spec, a), lost_opt);
  }
  RunOptions set_aside_opt;
  set_aside_opt.arch = hello ? hello->value("arch", "") : a.arch;
  set_aside_opt.kernels_path = kernels;
  set_aside_opt.repro_extra = path_flags(paths);
  try {
    for (size_t i = runnable; i < cases.size(); ++i) set_aside.push_back(i);
    for (size_t i : set_aside)
      record(i, lost_case_result(cases[i], Mode::none, set_aside_opt,
                                 "not run: " + unreadable_goldens.at(cases[i].op)));
  } catch (const std::exception& e) {  // a results file that cannot be written
    progress.clear();
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  progress.clear();
  const double wall_s = std::chrono::duration<double>(Clock::now() - t0).count();

  std::cout << "\n";
  summary.print(std::cout);
  const bool kernel_mode = hello && hello->value("mode", "") == "kernel";
  if (!kernel_mode)
    std::cout << "REFERENCE ONLY: kernels not checked for any of the " << cases.size() << " cases ("
              << (hello ? hello->value("no_device", "") : "") << ")\n";
  if (summary.failures > 0) {
    std::cout << "\n" << summary.failures << " failing case(s); rerun one with:\n";
    for (const auto& r : results)
      if (r.failing()) std::cout << "  " << r.repro << "\n";
  }
  if (summary.compared == 0)
    std::cout << "\nNOTHING COMPARED: no case compared a kernel output or a golden\n";
  // Never a silently looser default: passes that needed the kernel's declared contract are
  // counted per contract (each result names it; docs/verification.md "Arithmetic contracts").
  std::map<std::string, int64_t> under_contract;
  for (const auto& r : results)
    if (r.verdict == Verdict::passed && !r.contract.empty() && r.contract != kDefaultContractName)
      ++under_contract[r.contract];
  if (!under_contract.empty()) {
    std::cout << "\npassed only under the kernel's declared arithmetic contract (the default "
              << kDefaultContractName << " budgets fail):\n";
    for (const auto& [name, n] : under_contract)
      std::cout << "  " << n << " case(s) under " << name << "\n";
  }
  print_stress_summary(results, a.stress);
  std::map<size_t, nlohmann::json> shrunk;  // result index -> results.jsonl's "shrunk"
  if (a.shrink > 0 && kernel_mode && shrink_eval) {
    try {
      shrunk = shrink_failures(cases, results, shrink_eval, a, set_aside_opt, files);
    } catch (const std::exception& e) {  // workers that cannot start
      std::cerr << "attncheck: --shrink: " << e.what() << "\n";
    }
  }
  if (a.profile)
    print_profile(results, wall_s, parent_s, pool_use, a.in_process ? 0 : plan.jobs,
                  a.in_process ? 1 : plan.processes());
  std::cout << "wall time " << std::fixed << std::setprecision(1) << wall_s << " s\n";

  if (!a.out.empty()) {
    const fs::path out(a.out);
    try {
      if (!shrunk.empty()) rewrite_results_with_shrunk(out, results, completion, shrunk);
      write_file_atomic((out / "run.json").string(),
                        run_json(hello, &summary, wall_s).dump(2) + "\n");
      std::vector<nlohmann::json> records;  // junit_xml reads the records results.jsonl holds
      for (const auto& r : results) records.push_back(r.to_json());
      write_file_atomic((out / "junit.xml").string(), junit_xml(records, "attncheck " + a.tier));
    } catch (const std::exception& e) {
      std::cerr << "attncheck: " << e.what() << "\n";
      return 2;
    }
    std::cout << "results: " << fs::absolute(out).string() << "\n";
  }
  // Nothing compared is a failed gate, unless reference-vs-nothing was asked for.
  return summary.failures > 0 || (summary.compared == 0 && !a.allow_missing_goldens) ? 1 : 0;
}

}  // namespace attncheck::cli
