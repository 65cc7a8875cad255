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
  cfg.allow_missing_goldens = a.allow_missing_goldens;
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
  std::string repro_dir;
  if (!a.out.empty()) {
    fs::create_directories(a.out);
    repro_dir = fs::absolute(fs::path(a.out) / "repro").string();
    fs::create_directories(repro_dir);
  }
  const std::string kernels =
      a.kernels.empty() || a.kernels.rfind("py:", 0) == 0 ? a.kernels
                                                           : fs::absolute(a.kernels).string();
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
    if (h.value("mode", "") == "kernel")
      std::cout << "  kernels: " << h.value("library", "") << " on " << h.value("device", "")
                << " (" << h.value("device_arch", "") << ")\n";
    else
      std::cout << "  REFERENCE ONLY, kernels not checked: " << h.value("no_device", "")
                << "\n  checking the reference against the goldens\n";
    std::cout << std::flush;
  };
  auto record = [&](size_t i, const Result& r) {
    summary.add(r);
    nlohmann::json j = r.to_json();
    if (jsonl.is_open())
      jsonl << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n"
            << std::flush;
    if (r.failing()) {
      progress.clear();
      std::cout << (r.verdict == Verdict::error ? "ERROR " : "FAIL  ") << r.id << "\n      "
                << first_line(r.message) << "\n      repro: " << r.repro << "\n"
                << std::flush;
    }
    results[i] = std::move(j);
    progress.update(++done, summary.failures, cases[i].id);
  };

  if (a.in_process) {
    WorkerConfig cfg{paths.cases,       paths.golden, kernels, a.arch, repro_dir,
                     path_flags(paths), a.repeat,     a.allow_missing_goldens};
    std::unique_ptr<CaseContext> ctx;
    try {
      ctx = make_context(cfg);
    } catch (const std::exception& e) {
      std::cerr << "attncheck: " << e.what() << "\n";
      return 2;
    }
    announce(context_hello(*ctx));
    for (size_t i = 0; i < cases.size(); ++i) record(i, run_case_id(*ctx, cases[i].id));
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
    if (!repro_dir.empty()) spec.args.insert(spec.args.end(), {"--repro-dir", repro_dir});
    if (!path_flags(paths).empty())
      spec.args.insert(spec.args.end(), {"--repro-extra", path_flags(paths)});
    if (a.allow_missing_goldens) spec.args.push_back("--allow-missing-goldens");
    std::vector<std::string> ids;
    for (const auto& c : cases) ids.push_back(c.id);
    RunOptions lost_opt;
    lost_opt.kernels_path = kernels;
    lost_opt.repro_extra = path_flags(paths);
    PoolCallbacks cb;
    cb.on_hello = announce;
    cb.on_result = [&](size_t i, const nlohmann::json& j) {
      try {
        record(i, Result::from_json(j));
      } catch (const std::invalid_argument& e) {
        lost_opt.arch = hello ? hello->value("arch", "") : a.arch;
        Result r = lost_case_result(cases[i], Mode::none, lost_opt,
                                    std::string("the worker's result line is unreadable: ") +
                                        e.what());
        r.verdict = Verdict::error;
        record(i, r);
      }
    };
    cb.on_lost = [&](size_t i, const std::string& what) {
      lost_opt.arch = hello ? hello->value("arch", "") : a.arch;
      const Mode mode =
          hello && hello->value("mode", "") == "kernel" ? Mode::kernel : Mode::reference;
      record(i, lost_case_result(cases[i], mode, lost_opt, what));
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
  const bool kernel_mode = hello && hello->value("mode", "") == "kernel";
  if (!kernel_mode)
    std::cout << "REFERENCE ONLY: kernels not checked for any of the " << cases.size()
              << " cases (" << (hello ? hello->value("no_device", "") : "") << ")\n";
  if (summary.failures > 0) {
    std::cout << "\n" << summary.failures << " failing case(s); rerun one with:\n";
    for (const auto& j : results)
      if (j.value("failing", false)) std::cout << "  " << j.value("repro", "") << "\n";
  }
  if (summary.compared == 0)
    std::cout << "\nNOTHING COMPARED: no case compared a kernel output or a golden\n";
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
        {"compared", summary.compared},
        {"repeat", a.repeat}};
    write_file_atomic((out / "run.json").string(), run_json.dump(2) + "\n");
    write_file_atomic((out / "junit.xml").string(), junit_xml(results, "attncheck " + a.tier));
    std::cout << "results: " << fs::absolute(out).string() << "\n";
  }
  // Nothing compared is a failed gate, unless reference-vs-nothing was asked for.
  return summary.failures > 0 || (summary.compared == 0 && !a.allow_missing_goldens) ? 1 : 0;
}

}  // namespace attncheck::cli
