#include "run/worker.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>
#include <type_traits>

#include "run/pool.h"
#include "run/results.h"

namespace attncheck {

namespace fs = std::filesystem;

std::unique_ptr<CaseContext> make_context(const WorkerConfig& cfg) {
  auto ctx = std::make_unique<CaseContext>();
  if (!cfg.cases_dir.empty()) ctx->files = load_case_dir(cfg.cases_dir);
  ctx->repro_dir = cfg.repro_dir;
  if (fs::is_directory(cfg.golden_dir)) {
    ctx->goldens = std::make_unique<GoldenStore>(cfg.golden_dir);
    for (const auto& [op, stamp] : cfg.golden_checked) ctx->goldens->trust_checked(op, stamp);
  } else if (!cfg.allow_missing_goldens)
    throw std::runtime_error("golden directory '" + cfg.golden_dir +
                             "' does not exist (pass --golden DIR, or --allow-missing-goldens to "
                             "run without goldens)");
  EvalContext& e = ctx->eval;
  e.goldens = ctx->goldens.get();
  e.require_goldens = !cfg.allow_missing_goldens;
  e.options.repeat = cfg.repeat;
  e.options.stress = cfg.stress;
  e.options.kernels_path = cfg.kernels;
  e.options.repro_extra = cfg.repro_extra;
  if (cfg.kernels.empty()) {
    e.no_kernel_reason = "no kernel library (pass --kernels or set ATTNCHECK_KERNELS)";
  } else {
    ctx->lib = KernelLibrary::open(cfg.kernels);
    std::string why;
    ctx->device = ctx->lib->device(&why);
    if (!ctx->device) {
      const bool py = cfg.kernels.rfind("py:", 0) == 0;
      throw std::runtime_error(
          "--kernels " + cfg.kernels + (py ? ": the adapter cannot run (" : ": no usable GPU (") +
          (why.empty() ? std::string("the library gave no reason") : why) + ")");
    }
  }
  e.options.arch = !cfg.arch.empty() ? cfg.arch : ctx->device ? ctx->device->arch : "";
  if (ctx->device) {
    ctx->runner = std::make_unique<DeviceRunner>(*ctx->lib, e.options.arch);
    e.device = ctx->runner.get();
  }
  ctx->threads = std::max(1, cfg.threads);
  if (ctx->threads > 1 && ctx->lib && !ctx->lib->any_thread()) {
    ctx->threads = 1;
    ctx->threads_why = "the kernel library " + ctx->lib->library() +
                       " does not declare calls from any thread (extension table, any_thread)";
  } else if (ctx->threads > 1 && cfg.stress > 0) {
    ctx->threads = 1;
    ctx->threads_why = "--stress: its L2 flushes and background work are device-wide";
  }
  return ctx;
}

namespace {
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}
}  // namespace

std::vector<std::string> nearest_case_ids(const std::vector<CaseFile>& files, const std::string& id,
                                          size_t n) {
  // Bounded: only the id's first kNearestIdChars characters are compared (case ids are far
  // shorter), and each id is scored once, so a 100,000-character id answers at once.
  constexpr size_t kNearestIdChars = 256;
  const std::string probe = id.substr(0, kNearestIdChars);
  std::vector<std::pair<size_t, std::string>> scored;
  std::set<std::string_view> seen;
  for (const auto& f : files)
    for (const auto& [tier, cases] : f.tiers)
      for (const auto& c : cases)
        if (seen.insert(c.id).second) scored.emplace_back(edit_distance(probe, c.id), c.id);
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<std::string> out;
  for (size_t i = 0; i < std::min(n, scored.size()); ++i) out.push_back(scored[i].second);
  return out;
}

Result run_case(CaseContext& ctx, const Case& c) {
  return run_case(ctx, ctx.eval, c);
}

Result run_case(CaseContext& ctx, const EvalContext& eval, const Case& c) {
  CaseArtifacts artifacts;
  Result r = evaluate(c, eval, &artifacts);
  if (r.failing() && artifacts.present && !ctx.repro_dir.empty()) {
    const std::string path = (fs::path(ctx.repro_dir) / (id_to_filename(c.id) + ".h5")).string();
    try {
      nlohmann::json meta = context_hello(ctx).to_json();
      if (eval.device) {  // the library this case ran, which may not be the worker's own
        meta["kernels"] = eval.options.kernels_path;
        meta["library"] = eval.device->library().library();
      }
      write_repro_bundle(path, r, artifacts, meta);
      r.bundle = path;
    } catch (const std::exception& e) {
      r.message += "; the repro bundle could not be written: " + std::string(e.what());
    }
  }
  return r;
}

const KernelLibrary& library_for(CaseContext& ctx, const std::string& path) {
  if (path.empty() || path == ctx.eval.options.kernels_path) {
    if (!ctx.lib) throw std::runtime_error("this worker has no kernel library");
    return *ctx.lib;
  }
  const std::lock_guard<std::mutex> lock(ctx.more_libs_mutex);
  if (const auto it = ctx.more_libs.find(path); it != ctx.more_libs.end()) return *it->second;
  const std::string named = "kernel library " + path + ": ";
  if (!ctx.lib || !ctx.device)
    throw std::runtime_error(named + "this worker has no device to run it on");
  if (path.rfind("py:", 0) == 0)
    throw std::runtime_error(named +
                             "a py: adapter cannot share a worker with another library "
                             "(the Python bridge is one per process)");
  // Loading and asking for the device are calls into a runtime that shares the process's context
  // with the launches of the other threads.
  const auto launch_lock = ctx.lib->exclusive();
  auto lib = KernelLibrary::open(path);
  std::string why;
  const auto device = lib->device(&why);
  if (!device)
    throw std::runtime_error(named + "no usable GPU (" +
                             (why.empty() ? std::string("the library gave no reason") : why) + ")");
  if (device->name != ctx.device->name || device->arch != ctx.device->arch)
    throw std::runtime_error(named + "it sees " + device->name + " (" + device->arch +
                             "), not this worker's " + ctx.device->name + " (" + ctx.device->arch +
                             ")");
  if (ctx.threads > 1 && !lib->any_thread())
    throw std::runtime_error(named +
                             "it does not declare calls from any thread (extension table, "
                             "any_thread), and this worker runs cases in threads");
  return *ctx.more_libs.emplace(path, std::move(lib)).first->second;
}

Result run_case_id(CaseContext& ctx, const std::string& id) {
  const auto c = find_case(ctx.files, id);
  if (!c) {
    Result r;
    r.id = id;
    r.op = id.substr(0, id.find('/'));
    r.verdict = Verdict::error;
    r.message = "no case with id '" + id + "'";
    const auto near = nearest_case_ids(ctx.files, id, 3);
    if (!near.empty()) {
      r.message += "; nearest:";
      for (const auto& s : near) r.message += " " + s;
    }
    return r;
  }
  return run_case(ctx, *c);
}

WorkerHello context_hello(const CaseContext& ctx) {
  WorkerHello h;
  h.pid = ::getpid();
  h.kernels = ctx.eval.options.kernels_path;
  h.library = ctx.lib ? ctx.lib->library() : "";
  h.entries = ctx.lib ? ctx.lib->entries() : std::vector<std::string>{};
  h.device = ctx.device ? ctx.device->name : "";
  h.device_arch = ctx.device ? ctx.device->arch : "";
  h.arch = ctx.eval.options.arch;
  h.kernel_mode = ctx.device.has_value();
  h.no_device = ctx.eval.no_kernel_reason;
  h.threads = ctx.threads;
  h.threads_why = ctx.threads_why;
  return h;
}

std::string WorkerHello::backend() const {
  return arch.rfind("gfx", 0) == 0 ? "hip" : arch.rfind("sm_", 0) == 0 ? "cuda" : "cpu";
}

nlohmann::json WorkerHello::to_json() const {
  nlohmann::json j = {{"pid", pid},
                      {"kernels", kernels},
                      {"library", library},
                      {"entries", entries},
                      {"device", device},
                      {"device_arch", device_arch},
                      {"arch", arch},
                      {"mode", kernel_mode ? "kernel" : "reference"},
                      {"no_device", no_device},
                      {"threads", threads}};
  if (!threads_why.empty()) j["threads_why"] = threads_why;
  return j;
}

namespace {
// The member `name` of `j` as a T, or std::invalid_argument naming it (`what`: whose member).
template <typename T>
T member(const nlohmann::json& j, const char* name, const char* what, bool required) {
  if (!j.contains(name)) {
    if (required) throw std::invalid_argument(std::string(what) + ": '" + name + "' is missing");
    return T{};
  }
  const nlohmann::json& v = j[name];
  bool fits = false;
  if constexpr (std::is_same_v<T, std::string>)
    fits = v.is_string();
  else if constexpr (std::is_same_v<T, bool>)
    fits = v.is_boolean();
  else if constexpr (std::is_integral_v<T>)
    fits = v.is_number_integer();
  else if constexpr (std::is_floating_point_v<T>)
    fits = v.is_number();
  else
    fits = v.is_array() &&
           std::all_of(v.begin(), v.end(), [](const auto& e) { return e.is_string(); });
  if (!fits) throw std::invalid_argument(std::string(what) + ": '" + name + "' has the wrong type");
  return v.get<T>();
}
}  // namespace

WorkerHello WorkerHello::from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw std::invalid_argument("worker hello: not a JSON object");
  const char* w = "worker hello";
  WorkerHello h;
  h.pid = member<int64_t>(j, "pid", w, true);
  h.kernels = member<std::string>(j, "kernels", w, true);
  h.library = member<std::string>(j, "library", w, true);
  h.entries = member<std::vector<std::string>>(j, "entries", w, true);
  h.device = member<std::string>(j, "device", w, true);
  h.device_arch = member<std::string>(j, "device_arch", w, true);
  h.arch = member<std::string>(j, "arch", w, true);
  const std::string mode = member<std::string>(j, "mode", w, true);
  if (mode != "kernel" && mode != "reference")
    throw std::invalid_argument("worker hello: 'mode' is '" + mode + "', not kernel or reference");
  h.kernel_mode = mode == "kernel";
  h.no_device = member<std::string>(j, "no_device", w, true);
  h.threads = member<int>(j, "threads", w, true);
  h.threads_why = member<std::string>(j, "threads_why", w, false);
  return h;
}

nlohmann::json WorkerConfig::to_json() const {
  return {{"cases_dir", cases_dir},
          {"golden_dir", golden_dir},
          {"kernels", kernels},
          {"arch", arch},
          {"repro_dir", repro_dir},
          {"repro_extra", repro_extra},
          {"repeat", repeat},
          {"allow_missing_goldens", allow_missing_goldens},
          {"stress", stress},
          {"import_timeout_s", import_timeout_s},
          {"golden_checked", golden_checked},
          {"threads", threads}};
}

WorkerConfig WorkerConfig::from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw std::invalid_argument("worker config: not a JSON object");
  const char* w = "worker config";
  WorkerConfig c;
  const auto text = [&](const char* name, std::string& into) {
    if (j.contains(name)) into = member<std::string>(j, name, w, true);
  };
  text("cases_dir", c.cases_dir);
  text("golden_dir", c.golden_dir);
  text("kernels", c.kernels);
  text("arch", c.arch);
  text("repro_dir", c.repro_dir);
  text("repro_extra", c.repro_extra);
  if (j.contains("repeat")) c.repeat = member<int>(j, "repeat", w, true);
  if (j.contains("allow_missing_goldens"))
    c.allow_missing_goldens = member<bool>(j, "allow_missing_goldens", w, true);
  if (j.contains("stress")) c.stress = member<int>(j, "stress", w, true);
  if (j.contains("import_timeout_s"))
    c.import_timeout_s = member<double>(j, "import_timeout_s", w, true);
  if (j.contains("threads")) c.threads = member<int>(j, "threads", w, true);
  if (j.contains("golden_checked")) {
    const auto& g = j["golden_checked"];
    if (!g.is_object() ||
        !std::all_of(g.begin(), g.end(), [](const auto& v) { return v.is_string(); }))
      throw std::invalid_argument("worker config: 'golden_checked' is not {op: stamp}");
    c.golden_checked = g.get<std::map<std::string, std::string>>();
  }
  const nlohmann::json known = c.to_json();
  for (const auto& [name, value] : j.items())
    if (!known.contains(name))
      throw std::invalid_argument("worker config: unknown field '" + name + "'");
  return c;
}

namespace {

// What make_context loads that may hang, for the import limit's message.
std::string import_timeout_message(const WorkerConfig& cfg) {
  const std::string n = std::to_string(static_cast<int64_t>(cfg.import_timeout_s));
  const std::string how = " (--import-timeout; the import, or the device query after it, hangs)";
  if (cfg.kernels.rfind("py:", 0) == 0)
    return "adapter " + cfg.kernels.substr(3) + " did not finish importing within " + n + " s" +
           how;
  if (!cfg.kernels.empty())
    return "kernel library " + cfg.kernels + " did not finish loading within " + n + " s" + how;
  return "the worker did not finish loading the goldens within " + n + " s (--import-timeout)";
}

// The request's error Result: the case could not even be read.
Result unreadable_request(const std::string& id, const std::string& why) {
  Result r;
  r.id = id;
  r.op = id.substr(0, id.find('/'));
  r.verdict = Verdict::error;
  r.message = "the worker could not read the request: " + why;
  return r;
}

// Processes started during a case that still run after it: the worker's own process group,
// without the worker and a wrapper that started it (none when the worker is not a group leader:
// run by hand from a shell), and the processes below it that detached into sessions of their own.
std::vector<pid_t> leftover_processes() {
  const pid_t group = ::getpgrp();
  const bool leads = group == ::getpid() || group == ::getppid();
  return detached_descendants(::getpid(), leads ? group : 0, ::getppid());
}

}  // namespace

namespace {
// Runs `load`; past `seconds` (0: no limit), `report` gets {"fatal": message} and the process
// exits with status 2, since a hung load cannot be interrupted.
void within_limit(double seconds, const std::string& message,
                  const std::function<void(const nlohmann::json&)>& report,
                  const std::function<void()>& load) {
  if (!(seconds > 0)) return load();
  std::mutex m;
  std::condition_variable cv;
  bool finished = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(m);
    const auto limit = std::chrono::duration<double>(seconds);
    if (cv.wait_for(lock, limit, [&] { return finished; })) return;
    report({{"fatal", message}});
    std::fflush(nullptr);
    ::_exit(2);  // the hung import holds its thread; nothing can unwind it
  });
  auto stop = [&] {
    {
      std::lock_guard<std::mutex> lock(m);
      finished = true;
    }
    cv.notify_all();
    watchdog.join();
  };
  try {
    load();
    stop();
  } catch (...) {
    stop();
    throw;
  }
}
}  // namespace

std::unique_ptr<CaseContext> make_context_within_limit(
    const WorkerConfig& cfg, const std::function<void(const std::string&)>& report) {
  std::unique_ptr<CaseContext> ctx;
  within_limit(
      cfg.import_timeout_s, import_timeout_message(cfg),
      [&](const nlohmann::json& j) { report(j["fatal"].get<std::string>()); },
      [&] { ctx = make_context(cfg); });
  return ctx;
}

namespace {

// A request's "kernels" as one name per library: "" for the worker's own.
std::string library_key(const CaseContext& ctx, const std::string& kernels) {
  return kernels == ctx.eval.options.kernels_path ? "" : kernels;
}

// What one of the worker's threads runs cases with: the worker's own library and runner, or a
// runner of its own for the library the last request named (several libraries: worker.h). A
// switch drops the previous runner and its kept device blocks first.
struct Seat {
  EvalContext eval;
  std::unique_ptr<DeviceRunner> runner;  // null while `eval` uses the context's own runner
  std::string library;                   // library_key of the library `eval` runs

  const EvalContext& for_library(CaseContext& ctx, const std::string& path) {
    // A request that names its library: the process runs several (mutants), each over the same
    // cases, which are prepared once (run/prepared.h).
    if (!path.empty()) eval.prepared = &ctx.prepared;
    const std::string key = library_key(ctx, path);
    if (key == library) return eval;
    const KernelLibrary& wanted = library_for(ctx, path);
    runner.reset();
    runner = std::make_unique<DeviceRunner>(wanted, ctx.eval.options.arch);
    eval = ctx.eval;
    eval.prepared = &ctx.prepared;
    eval.device = runner.get();
    eval.options.kernels_path = wanted.path();
    library = key;
    return eval;
  }
};

// The answers of one worker process, from one thread or several.
class Answering {
 public:
  Answering(WorkerChannel& channel, CaseContext& ctx) : channel_(channel), ctx_(ctx) {}

  void emit(const nlohmann::json& j) {
    const std::lock_guard<std::mutex> lock(write_);
    channel_.write_line(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
  bool retiring() const { return retiring_.load(); }

  // One request line, run on the calling thread with its seat; answers it. True when the worker
  // retires after this answer.
  bool answer(const std::string& line, Seat& seat) {
    const auto received = std::chrono::steady_clock::now();
    nlohmann::json seq = nullptr;
    std::string id;
    Result r;
    const bool threaded = ctx_.threads > 1;
    bool counted = false;  // in running_
    if (!run_request(line, seat, seq, id, r, counted)) return false;
    // A copy of this process forked by a kernel or an adapter that returned into the harness:
    // it must neither answer (its channel is closed) nor take the next request.
    if (channel_.forked_copy()) ::_exit(0);
    const bool others_running = running_.load() > (counted ? 1 : 0);
    const auto leftovers = leftover_processes();
    if (!leftovers.empty()) report_leftovers(leftovers, id, others_running);
    // The request's parsing and the process scan are this worker's time on the case too: the
    // parent's round trip minus the phases is then the channel's and the queue's alone.
    const double worker_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - received)
            .count();
    r.timings.other_ms += std::max(0.0, worker_ms - r.timings.total_ms());
    if (counted) running_.fetch_sub(1);
    const std::string retire_why = r.device_error       ? "a launch failed on the device"
                                   : !leftovers.empty() ? "processes were left running"
                                                        : "";
    if (!threaded) {
      emit({{"seq", seq}, {"id", id}, {"result", r.to_json()}, {"retire", !retire_why.empty()}});
      return !retire_why.empty();
    }
    // Several cases at once: a device error is this case's only when its launch was the first to
    // fail (KernelLibrary::first_device_error_was_mine); processes left running are this case's
    // only when no other case ran beside it.
    // blameless: the launch lock orders the launches, so one that failed after another case's
    // device error failed by it (the pool counts such answers apart, pool.cpp).
    auto requeue = [&](const std::string& why, bool isolate, bool blameless) {
      retire_because(retire_why);
      emit({{"seq", seq},
            {"id", id},
            {"requeue", why},
            {"isolate", isolate},
            {"blameless", blameless}});
      return true;
    };
    if (r.device_error && !ctx_.lib->first_device_error_was_mine())
      return requeue(
          "its launch failed after another case's device error in the same worker (the GPU "
          "context is shared): it runs again in a fresh worker",
          false, true);
    if (!leftovers.empty() && others_running)
      return requeue(
          "processes were left running while it and other cases ran: it runs again alone in a "
          "fresh worker, where they can be pinned on one case",
          true, false);
    const bool retire = !retire_why.empty();
    if (retire) retire_because(retire_why);
    emit({{"seq", seq}, {"id", id}, {"result", r.to_json()}, {"retire", retire}});
    return retire;
  }

  // Parses the request and runs its case into `r` (an error Result when the request cannot be
  // read). False when it was answered already: requeued, the worker retiring before it started.
  bool run_request(const std::string& line, Seat& seat, nlohmann::json& seq, std::string& id,
                   Result& r, bool& counted) {
    try {
      const auto request = nlohmann::json::parse(line);
      seq = request.at("seq");
      id = request.at("id").get<std::string>();
      // Decided to retire before this case started: the context may be broken; the parent runs
      // it in a fresh worker.
      if (ctx_.threads > 1 && retiring()) {
        emit({{"seq", seq},
              {"id", id},
              {"requeue", retire_reason()},
              {"isolate", false},
              {"blameless", true}});
        return false;
      }
      const Case c = case_from_json(request.at("case"));
      if (c.id != id) throw std::invalid_argument("its case is '" + c.id + "', not '" + id + "'");
      const std::string kernels = request.value("kernels", "");
      running_.fetch_add(1);
      counted = true;
      const EvalContext* eval = nullptr;
      try {
        eval = &seat.for_library(ctx_, kernels);
      } catch (const std::exception& e) {  // an error naming the library, not the case's fault
        RunOptions named = ctx_.eval.options;
        if (!kernels.empty()) named.kernels_path = kernels;
        r = lost_case_result(c, Mode::none, named, e.what());
      }
      if (eval) r = run_case(ctx_, *eval, c);
    } catch (const std::exception& e) {
      r = unreadable_request(id, e.what());
    }
    return true;
  }

  static void report_leftovers(const std::vector<pid_t>& leftovers, const std::string& id,
                               bool others_running) {
    std::cerr << "attncheck worker: " << leftovers.size() << " process(es) started during case "
              << id << (others_running ? " or a case beside it" : "") << " still run (pid";
    for (pid_t p : leftovers) std::cerr << " " << p;
    std::cerr << "); this worker retires and they are killed with it, so that they cannot touch "
                 "the next case\n"
              << std::flush;
  }

 private:
  void retire_because(const std::string& why) {
    const std::lock_guard<std::mutex> lock(reason_mutex_);
    if (!retiring_.exchange(true)) reason_ = why;
  }
  std::string retire_reason() {
    const std::lock_guard<std::mutex> lock(reason_mutex_);
    return "the worker retires (" + reason_ +
           ") before running it: it runs again in a fresh "
           "worker";
  }

  WorkerChannel& channel_;
  CaseContext& ctx_;
  std::mutex write_;
  std::atomic<bool> retiring_{false};
  std::atomic<int> running_{0};
  std::mutex reason_mutex_;
  std::string reason_;
};

}  // namespace

int load_library_main(const std::string& kernels, bool with_device, double timeout_s) {
  WorkerChannel& channel = WorkerChannel::claim();  // what the library prints goes to stderr
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  auto emit = [&](const nlohmann::json& j) {
    channel.write_line(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  };
  WorkerConfig cfg;
  cfg.kernels = kernels;
  cfg.import_timeout_s = timeout_s;
  try {
    std::unique_ptr<KernelLibrary> lib;
    std::optional<DeviceInfo> device;
    std::string why;
    nlohmann::json partial = nlohmann::json::object();  // entry -> declared text, where one is
    within_limit(timeout_s, import_timeout_message(cfg), emit, [&] {
      lib = KernelLibrary::open(kernels);
      for (const auto& entry : lib->entries())
        if (auto text = lib->declared_partial(entry); !text.empty()) partial[entry] = text;
      if (with_device) device = lib->device(&why);
    });
    nlohmann::json hello = {
        {"library", lib->library()}, {"entries", lib->entries()}, {"partial", partial}};
    if (device) {
      hello["device"] = device->name;
      hello["arch"] = device->arch;
    } else if (with_device) {  // the command says what no device means for it
      hello["no_device"] = why.empty() ? std::string("the library gave no reason") : why;
    }
    emit({{"hello", hello}});
  } catch (const std::exception& e) {
    emit({{"fatal", e.what()}});
    std::fflush(nullptr);
    ::_exit(2);
  }
  std::fflush(nullptr);
  ::_exit(0);  // the library's destructors and atexit handlers are no business of the probe's
}

nlohmann::json load_library_isolated(const std::string& kernels, bool with_device,
                                     double timeout_s) {
  std::vector<std::string> args = {"load-library", "--kernels", kernels, "--import-timeout",
                                   std::to_string(timeout_s)};
  if (with_device) args.push_back("--device");
  // The child reports a hang itself at timeout_s; this limit is the backstop.
  const SelfRun run = run_self(args, timeout_s > 0 ? timeout_s + 30 : 0);
  const std::string named = "kernel library '" + kernels + "'";
  auto output = [&] {
    std::string tail = run.err;
    while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
    return tail.empty() ? std::string() : "; its output ends:\n" + tail;
  };
  nlohmann::json line;
  try {
    line = nlohmann::json::parse(run.out.substr(0, run.out.find('\n')));
  } catch (const std::exception&) {
  }
  if (line.is_object() && line.contains("fatal") && line["fatal"].is_string())
    throw std::runtime_error(line["fatal"].get<std::string>());
  if (run.timed_out)
    throw std::runtime_error(named + " did not finish loading within " +
                             std::to_string(static_cast<int64_t>(timeout_s + 30)) +
                             " s; the process loading it was killed" + output());
  if (!line.is_object() || !line.contains("hello") || !line["hello"].is_object() ||
      !WIFEXITED(run.status) || WEXITSTATUS(run.status) != 0)
    throw std::runtime_error(named + " could not be loaded: the process loading it ended with " +
                             describe_wait_status(run.status) + " before it reported the library" +
                             (with_device ? " and its device" : "") +
                             " (a constructor of the library, or its device query, ended it)" +
                             output());
  return line["hello"];
}

namespace {
// Several threads, each with its own seat, answer the requests, which queue here as the parent
// sends them (never more than the threads and queued_per_worker: run/pool.h); returns when the
// requests end and every thread is done.
void serve_in_threads(WorkerChannel& channel, Answering& answering, CaseContext& ctx,
                      std::vector<Seat>& seats) {
  std::mutex m;
  std::condition_variable cv;
  struct Waiting {
    std::string line;
    std::string library;  // library_key of its "kernels"
  };
  std::deque<Waiting> queue;
  // The library each thread runs or ran last (guarded by m).
  std::vector<std::string> claimed(seats.size());
  bool closed = false;
  std::string line;
  std::vector<std::thread> threads;
  for (size_t t = 0; t < seats.size(); ++t)
    threads.emplace_back([&, t] {
      while (true) {
        std::string request;
        {
          std::unique_lock<std::mutex> lock(m);
          cv.wait(lock, [&] { return closed || !queue.empty(); });
          if (queue.empty()) return;
          // The oldest request for this thread's library; else the oldest for a library no
          // other thread runs; else the oldest.
          auto it = std::find_if(queue.begin(), queue.end(),
                                 [&](const Waiting& w) { return w.library == claimed[t]; });
          if (it == queue.end())
            it = std::find_if(queue.begin(), queue.end(), [&](const Waiting& w) {
              return std::find(claimed.begin(), claimed.end(), w.library) == claimed.end();
            });
          if (it == queue.end()) it = queue.begin();
          claimed[t] = it->library;
          request = std::move(it->line);
          queue.erase(it);
        }
        answering.answer(request, seats[t]);
      }
    });
  // After a retiring answer the parent sends nothing more and closes the channel: the requests
  // already here are answered (requeued), and the worker exits once its threads are done.
  while (channel.read_line(line)) {
    if (line.empty()) continue;
    std::string library;
    try {  // an unreadable request is answered as such by whichever thread takes it
      library = library_key(ctx, nlohmann::json::parse(line).value("kernels", ""));
    } catch (const std::exception&) {
    }
    {
      const std::lock_guard<std::mutex> lock(m);
      queue.push_back({line, library});
    }
    cv.notify_one();
  }
  {
    const std::lock_guard<std::mutex> lock(m);
    closed = true;
  }
  cv.notify_all();
  for (auto& t : threads) t.join();
}
}  // namespace

int worker_main(const WorkerConfig& cfg) {
  WorkerChannel& channel = WorkerChannel::claim();
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a wrapper between the run and this worker dies with it
  // What the library starts stays below the worker even when it detaches (leftover_processes).
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  auto emit_alone = [&](const nlohmann::json& j) {
    channel.write_line(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  };
  std::unique_ptr<CaseContext> ctx;
  try {
    ctx = make_context_within_limit(cfg, [&](const std::string& why) {
      emit_alone({{"fatal", why}});
    });
  } catch (const std::exception& e) {
    emit_alone({{"fatal", e.what()}});
    return 2;
  }
  Answering answering(channel, *ctx);
  answering.emit({{"hello", context_hello(*ctx).to_json()}});
  // A GPU fault can leave the context unusable for every later launch: a retiring worker ends,
  // and the parent, told so in the answer, gives the next case to a fresh one. Nothing is left to
  // clean up (the parent writes the results), and threads an adapter left running must not delay
  // it.
  auto retire_now = [] {
    std::fflush(nullptr);
    ::_exit(0);
  };
  std::string line;
  // Thread 0 starts on the context's own runner, the others on runners of their own.
  std::vector<Seat> seats(static_cast<size_t>(ctx->threads));
  for (size_t t = 0; t < seats.size(); ++t) {
    seats[t].eval = ctx->eval;
    if (t > 0 && ctx->device) {
      seats[t].runner = std::make_unique<DeviceRunner>(*ctx->lib, ctx->eval.options.arch);
      seats[t].eval.device = seats[t].runner.get();
    }
  }
  if (ctx->threads <= 1) {
    while (channel.read_line(line)) {
      if (line.empty()) continue;
      if (answering.answer(line, seats[0])) retire_now();
    }
    return 0;
  }
  serve_in_threads(channel, answering, *ctx, seats);
  if (answering.retiring()) retire_now();
  seats.clear();
  return 0;
}

}  // namespace attncheck
