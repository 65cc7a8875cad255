// `attncheck run` and `attncheck worker`: cases in worker processes, live progress, summary,
// failures with repro lines, and the results directory.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>

#include "cli/commands.h"
#include "run/cases.h"
#include "run/pool.h"
#include "run/provenance.h"
#include "run/results.h"
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
  WorkerConfig cfg;
  cfg.cases_dir = p.cases;
  cfg.golden_dir = p.golden;
  cfg.kernels = a.kernels;
  cfg.arch = a.arch;
  cfg.repeat = a.repeat;
  cfg.repro_dir = a.repro_dir;
  cfg.repro_extra = a.repro_extra;
  return worker_main(cfg);
}

namespace {

using Clock = std::chrono::steady_clock;

std::string first_line(const std::string& s, size_t max = 400) {
  std::string l = s.substr(0, s.find('\n'));
  return l.size() > max ? l.substr(0, max) + " ..." : l;
}

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
  std::vector<CaseFile> files;
  std::vector<Case> cases;
  if (!load_and_select(paths, sel, files, cases)) return 2;
  if (cases.empty()) {
    std::cerr << "attncheck: no case matches (tier " << a.tier << ", filter '" << a.filter
              << "', shard " << a.shard << ")\n";
    return 2;
  }
  if (!a.kernels.empty() && !fs::exists(a.kernels)) {
    std::cerr << "attncheck: kernel library '" << a.kernels << "' does not exist\n";
    return 2;
  }
  std::string repro_dir;
  if (!a.out.empty()) {
    fs::create_directories(a.out);
    repro_dir = (fs::path(a.out) / "repro").string();
    fs::create_directories(repro_dir);
  }
  const std::string kernels = a.kernels.empty() ? "" : fs::absolute(a.kernels).string();
  const std::string started = utc_now_iso();
  const auto t0 = Clock::now();

  std::ofstream jsonl;
  if (!a.out.empty()) jsonl.open(fs::path(a.out) / "results.jsonl");
  std::vector<nlohmann::json> results(cases.size());
  Summary summary;
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
    if (!h.value("device", "").empty())
      std::cout << "  kernels: " << h.value("library", "") << " on " << h.value("device", "")
                << " (" << h.value("device_arch", "") << ")\n";
    else
      std::cout << "  KERNEL CHECKS SKIPPED: " << h.value("no_device", "")
                << "\n  checking the reference against the goldens only\n";
    std::cout << std::flush;
  };
  auto record = [&](size_t i, nlohmann::json j) {
    summary.add(j);
    if (jsonl.is_open())
      jsonl << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n"
            << std::flush;
    const std::string v = j.value("verdict", "error");
    if (v == "failed" || v == "error") {
      progress.clear();
      std::cout << (v == "failed" ? "FAIL  " : "ERROR ") << j.value("id", "?") << "\n      "
                << first_line(j.value("message", "")) << "\n      repro: " << j.value("repro", "")
                << "\n"
                << std::flush;
    }
    results[i] = std::move(j);
    progress.update(++done, summary.failures, cases[i].id);
  };

  RunOptions opt;
  opt.repeat = a.repeat;
  opt.kernels_path = kernels;
  opt.repro_extra = path_flags(paths);
  if (a.in_process) {
    WorkerConfig cfg{paths.cases, paths.golden,      kernels, a.arch,
                     repro_dir,   path_flags(paths), a.repeat};
    CaseContext ctx = make_context(cfg);
    announce(context_hello(ctx));
    for (size_t i = 0; i < cases.size(); ++i) {
      CaseOutcome o = run_one(ctx, cases[i]);
      nlohmann::json j = o.to_json();
      if (o.has_artifacts && !repro_dir.empty() && verdict_is_failure(o.result.verdict)) {
        const auto path = (fs::path(repro_dir) / (id_to_filename(cases[i].id) + ".h5")).string();
        write_repro_bundle(path, o.result, o.artifacts, context_hello(ctx));
        j["bundle"] = path;
      }
      record(i, std::move(j));
    }
  } else {
    WorkerSpec spec;
    spec.jobs = a.jobs;
    spec.case_timeout_s = a.timeout_s;
    spec.start_timeout_s = std::max(120.0, a.timeout_s);
    if (!a.out.empty()) spec.log_path = (fs::path(a.out) / "worker.log").string();
    spec.args = {"--cases",
                 fs::absolute(paths.cases).string(),
                 "--golden",
                 fs::absolute(paths.golden).string(),
                 "worker",
                 "--repeat",
                 std::to_string(a.repeat)};
    if (!kernels.empty()) spec.args.insert(spec.args.end(), {"--kernels", kernels});
    if (!a.arch.empty()) spec.args.insert(spec.args.end(), {"--arch", a.arch});
    if (!repro_dir.empty())
      spec.args.insert(spec.args.end(), {"--repro-dir", fs::absolute(repro_dir).string()});
    if (!path_flags(paths).empty())
      spec.args.insert(spec.args.end(), {"--repro-extra", path_flags(paths)});
    std::vector<std::string> ids;
    for (const auto& c : cases) ids.push_back(c.id);
    PoolCallbacks cb;
    cb.on_hello = announce;
    cb.on_result = [&](size_t i, const nlohmann::json& j) { record(i, j); };
    cb.on_lost = [&](size_t i, const std::string& what) {
      const Case& c = cases[i];
      Result r;
      r.id = c.id;
      r.op = c.op;
      r.params = c.params;
      r.mode = hello && !hello->value("device", "").empty() ? "kernel" : "reference";
      r.verdict = Verdict::failed;
      r.message = what;
      r.arch = hello ? hello->value("arch", "") : a.arch;
      opt.arch = r.arch;
      r.repro = repro_command(c, opt);
      if (r.mode == "kernel") apply_known_bug(r, c, r.arch);
      record(i, r.to_json());
    };
    try {
      run_in_workers(spec, ids, cb);
    } catch (const std::exception& e) {
      progress.clear();
      std::cerr << "attncheck: " << e.what() << "\n";
      return 2;
    }
  }
  progress.clear();
  const double wall_s = std::chrono::duration<double>(Clock::now() - t0).count();

  std::cout << "\n";
  summary.print(std::cout);
  const bool kernel_mode = hello && !hello->value("device", "").empty();
  if (!kernel_mode)
    std::cout << "kernel checks were skipped for all " << cases.size()
              << " cases: " << (hello ? hello->value("no_device", "") : "") << "\n";
  if (summary.failures > 0) {
    std::cout << "\n" << summary.failures << " failing case(s); rerun one with:\n";
    for (const auto& j : results)
      if (j.value("verdict", "") == "failed" || j.value("verdict", "") == "error")
        std::cout << "  " << j.value("repro", "") << "\n";
  }
  std::cout << "wall time " << std::fixed << std::setprecision(1) << wall_s << " s\n";

  if (!a.out.empty()) {
    const fs::path out(a.out);
    std::string manifest_sha;
    try {
      manifest_sha = sha256_file((fs::path(paths.golden) / "MANIFEST").string());
    } catch (const std::exception&) {
    }
    const nlohmann::json h = hello.value_or(nlohmann::json::object());
    const std::string arch = h.value("arch", "");
    const std::string backend = arch.rfind("gfx", 0) == 0   ? "hip"
                                : arch.rfind("sm_", 0) == 0 ? "cuda"
                                                            : "cpu";
    const nlohmann::json run_json = {
        {"attncheck_version", attncheck_version()},
        {"git_revision", git_revision(paths.root)},
        {"arch", arch},
        {"device", h.value("device", "")},
        {"backend", backend},
        {"kernels_library", kernels.empty() ? "" : kernels + " (" + h.value("library", "") + ")"},
        {"toolchain", toolchain()},
        {"tier", a.tier},
        {"filter", a.filter},
        {"shard", a.shard},
        {"case_count", cases.size()},
        {"golden_manifest_sha256", manifest_sha},
        {"started", started},
        {"finished", utc_now_iso()},
        {"wall_s", wall_s},
        {"mode", kernel_mode ? "kernel" : "reference"},
        {"kernel_skipped_reason", kernel_mode ? "" : h.value("no_device", "")},
        {"repeat", a.repeat}};
    write_file_atomic((out / "run.json").string(), run_json.dump(2) + "\n");
    write_file_atomic((out / "junit.xml").string(), junit_xml(results, "attncheck " + a.tier));
    std::cout << "results: " << fs::absolute(out).string() << "\n";
  }
  return summary.failures > 0 ? 1 : 0;
}

}  // namespace attncheck::cli
