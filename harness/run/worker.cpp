#include "run/worker.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <thread>

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
  std::vector<std::pair<size_t, std::string>> scored;
  for (const auto& f : files)
    for (const auto& [tier, cases] : f.tiers)
      for (const auto& c : cases)
        if (std::none_of(scored.begin(), scored.end(),
                         [&](const auto& s) { return s.second == c.id; }))
          scored.emplace_back(edit_distance(id, c.id), c.id);
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<std::string> out;
  for (size_t i = 0; i < std::min(n, scored.size()); ++i) out.push_back(scored[i].second);
  return out;
}

Result run_case(CaseContext& ctx, const Case& c) {
  CaseArtifacts artifacts;
  Result r = evaluate(c, ctx.eval, &artifacts);
  if (r.failing() && artifacts.present && !ctx.repro_dir.empty()) {
    const std::string path = (fs::path(ctx.repro_dir) / (id_to_filename(c.id) + ".h5")).string();
    try {
      write_repro_bundle(path, r, artifacts, context_hello(ctx));
      r.bundle = path;
    } catch (const std::exception& e) {
      r.message += "; the repro bundle could not be written: " + std::string(e.what());
    }
  }
  return r;
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

nlohmann::json context_hello(const CaseContext& ctx) {
  return {{"pid", ::getpid()},
          {"kernels", ctx.eval.options.kernels_path},
          {"library", ctx.lib ? ctx.lib->library() : ""},
          {"entries", ctx.lib ? ctx.lib->entries() : std::vector<std::string>{}},
          {"device", ctx.device ? ctx.device->name : ""},
          {"device_arch", ctx.device ? ctx.device->arch : ""},
          {"arch", ctx.eval.options.arch},
          {"mode", ctx.device ? "kernel" : "reference"},
          {"no_device", ctx.eval.no_kernel_reason}};
}

nlohmann::json case_to_json(const Case& c) {
  nlohmann::json known = nullptr;
  if (c.known_bug) known = {{"reason", c.known_bug->reason}, {"arch", c.known_bug->arch}};
  return {{"op", c.op},       {"params", c.params}, {"id", c.id},
          {"tiers", c.tiers}, {"known_bug", known}, {"source", c.source}};
}

Case case_from_json(const nlohmann::json& j) {
  auto field = [&](const char* name, nlohmann::json::value_t type) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(name) || j[name].type() != type)
      throw std::invalid_argument(std::string("case JSON: '") + name + "' is missing or of the " +
                                  "wrong type");
    return j[name];
  };
  using T = nlohmann::json::value_t;
  Case c;
  c.op = field("op", T::string).get<std::string>();
  c.params = field("params", T::object);
  c.id = field("id", T::string).get<std::string>();
  for (const auto& t : field("tiers", T::array)) {
    if (!t.is_string()) throw std::invalid_argument("case JSON: a tier is not a string");
    c.tiers.push_back(t.get<std::string>());
  }
  c.source = field("source", T::string).get<std::string>();
  if (j.contains("known_bug") && !j["known_bug"].is_null()) {
    const auto& k = j["known_bug"];
    if (!k.is_object() || !k.contains("reason") || !k["reason"].is_string() ||
        !k.contains("arch") || !k["arch"].is_string())
      throw std::invalid_argument("case JSON: 'known_bug' is not {reason, arch}");
    c.known_bug = KnownBug{k["reason"].get<std::string>(), k["arch"].get<std::string>()};
  }
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

// Processes started during a case that still run after it (the worker's own process group,
// without the worker and a wrapper that started it); none when the worker is not a group leader
// (run by hand from a shell).
std::vector<pid_t> leftover_processes() {
  const pid_t group = ::getpgrp();
  if (group != ::getpid() && group != ::getppid()) return {};
  auto pids = live_group_members(group, ::getpid());
  std::erase(pids, ::getppid());
  return pids;
}

}  // namespace

std::unique_ptr<CaseContext> make_context_within_limit(
    const WorkerConfig& cfg, const std::function<void(const std::string&)>& report) {
  if (!(cfg.import_timeout_s > 0)) return make_context(cfg);
  std::mutex m;
  std::condition_variable cv;
  bool finished = false;
  const std::string message = import_timeout_message(cfg);
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(m);
    const auto limit = std::chrono::duration<double>(cfg.import_timeout_s);
    if (cv.wait_for(lock, limit, [&] { return finished; })) return;
    report(message);
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
    auto ctx = make_context(cfg);
    stop();
    return ctx;
  } catch (...) {
    stop();
    throw;
  }
}

int worker_main(const WorkerConfig& cfg) {
  WorkerChannel& channel = WorkerChannel::claim();
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a wrapper between the run and this worker dies with it
  auto emit = [&](const nlohmann::json& j) {
    channel.write_line(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  };
  std::unique_ptr<CaseContext> ctx;
  try {
    ctx = make_context_within_limit(cfg, [&](const std::string& why) { emit({{"fatal", why}}); });
  } catch (const std::exception& e) {
    emit({{"fatal", e.what()}});
    return 2;
  }
  emit({{"hello", context_hello(*ctx)}});
  std::string line;
  while (channel.read_line(line)) {
    if (line.empty()) continue;
    const auto received = std::chrono::steady_clock::now();
    nlohmann::json seq = nullptr;
    std::string id;
    Result r;
    try {
      const auto request = nlohmann::json::parse(line);
      seq = request.at("seq");
      id = request.at("id").get<std::string>();
      const Case c = case_from_json(request.at("case"));
      if (c.id != id) throw std::invalid_argument("its case is '" + c.id + "', not '" + id + "'");
      r = run_case(*ctx, c);
    } catch (const std::exception& e) {
      r = unreadable_request(id, e.what());
    }
    // A copy of this process forked by a kernel or an adapter that returned into the harness:
    // it must neither answer (its channel is closed) nor take the next request.
    if (channel.forked_copy()) ::_exit(0);
    const auto leftovers = leftover_processes();
    if (!leftovers.empty()) {
      std::cerr << "attncheck worker: " << leftovers.size() << " process(es) started during case "
                << id << " still run (pid";
      for (pid_t p : leftovers) std::cerr << " " << p;
      std::cerr << "); this worker retires and they are killed with its process group, so that "
                   "they cannot touch the next case\n"
                << std::flush;
    }
    // The request's parsing and the process scan are this worker's time on the case too: the
    // parent's round trip minus the phases is then the channel's and the queue's alone.
    const double worker_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - received)
            .count();
    r.timings.other_ms += std::max(0.0, worker_ms - r.timings.total_ms());
    const bool retire = r.device_error || !leftovers.empty();
    emit({{"seq", seq}, {"id", id}, {"result", r.to_json()}, {"retire", retire}});
    // A GPU fault can leave the context unusable for every later launch: this worker ends, and
    // the parent, told so above, gives the next case to a fresh one. Nothing is left to clean up
    // (the parent writes the results), and threads an adapter left running must not delay it.
    if (retire) {
      std::fflush(nullptr);
      ::_exit(0);
    }
  }
  return 0;
}

}  // namespace attncheck
