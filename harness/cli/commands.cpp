// `attncheck list | repro | golden | bench | report`.
#include "cli/commands.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>

#include "cli/case_run.h"
#include "core/case_json.h"
#include "run/cases.h"
#include "run/coverage.h"
#include "run/golden.h"
#include "run/partial.h"
#include "run/provenance.h"
#include "run/results.h"
#include "run/shrink.h"
#include "run/worker.h"

namespace attncheck::cli {

namespace fs = std::filesystem;

namespace {

// Case files or exit status 2 with the located error.
bool load(const Paths& p, std::vector<CaseFile>& files) {
  try {
    files = load_case_dir(p.cases);
    return true;
  } catch (const CaseFileError& e) {
    std::cerr << "attncheck: bad case file: " << e.what() << "\n";
    return false;
  }
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

std::string num(double v, int precision = 4) {
  std::ostringstream os;
  os << std::setprecision(precision) << v;
  return os.str();
}

}  // namespace

Selection selection(const std::string& tier, const std::vector<std::string>& ops,
                    const std::string& filter) {
  Selection sel;
  sel.tier = tier;
  sel.ops = ops;
  sel.filter = filter;
  return sel;
}

bool load_and_select(const Paths& p, const Selection& sel, std::vector<CaseFile>& files,
                     std::vector<Case>& cases) {
  if (!load(p, files)) return false;
  try {
    cases = select_cases(files, sel);
    return true;
  } catch (const std::invalid_argument& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return false;
  }
}

int cmd_list(const Paths& p, const ListArgs& a) {
  const Selection sel = selection(a.tier, a.ops, a.filter);
  std::vector<CaseFile> files;
  std::vector<Case> cases;
  if (!load_and_select(p, sel, files, cases)) return 2;
  std::map<std::string, std::map<std::string, int>> counts;  // op -> tier -> n (same op/filter)
  for (std::string_view t : kTiers) {
    Selection per_tier = sel;
    per_tier.tier = std::string(t);
    for (const auto& c : select_cases(files, per_tier)) ++counts[c.op][per_tier.tier];
  }
  for (const auto& c : cases) {
    if (a.json) {
      std::cout << case_to_json(c).dump() << "\n";  // core/case_json.h
      continue;
    }
    std::cout << c.id << "  [" << join(c.tiers, ",") << "]";
    if (c.known_bug)
      std::cout << "  known bug" << (c.known_bug->arch.empty() ? "" : " on " + c.known_bug->arch)
                << ": " << c.known_bug->reason;
    std::cout << "\n";
  }
  if (a.json) return 0;
  // The table goes to stderr: stdout stays a plain list of ids for scripts.
  std::cerr << "\n" << std::left << std::setw(22) << "op" << std::right;
  for (std::string_view t : kTiers) std::cerr << std::setw(8) << t;
  std::cerr << "   groups (file)\n";
  for (const auto& f : files) {
    if (!counts.count(f.op)) continue;
    std::cerr << std::left << std::setw(22) << f.op << std::right;
    for (std::string_view t : kTiers) std::cerr << std::setw(8) << counts[f.op][std::string(t)];
    std::cerr << "   " << f.groups.size() << " (" << f.path << ")\n";
  }
  std::cerr << cases.size() << " cases listed (tier " << a.tier << ")\n";
  return 0;
}

namespace {

// The exporter runs under $ATTNCHECK_PYTHON, else the interpreter the build was configured with
// (-DPython3_EXECUTABLE, the one the bridge embeds): on a GPU host that is the interpreter with
// the kernel developer's torch, which the exported test also needs.
std::string export_python() {
  if (const char* env = std::getenv("ATTNCHECK_PYTHON"); env && *env) return env;
  return ATTNCHECK_EXPORT_PYTHON;
}

// `repro --export pytest`: PYTHON -m attncheck_bridge.export_pytest BUNDLE ADAPTER OUT
// (bridge/python/attncheck_bridge/export_pytest.py), with the bridge and its adapters on the path.
int export_pytest(const Paths& p, const std::string& bundle, const std::string& adapter,
                  const std::string& out) {
  const std::string python = export_python();
  const fs::path bridge = fs::path(p.root) / "bridge";
  const char* old = std::getenv("PYTHONPATH");
  const std::string pythonpath = (bridge / "python").string() + ":" +
                                 (bridge / "adapters").string() + ":" +
                                 (fs::path(p.root) / "harness" / "report").string() +
                                 (old && *old ? ":" + std::string(old) : "");
  std::vector<std::string> argv_s = {python, "-m",    "attncheck_bridge.export_pytest",
                                     bundle, adapter, out};
  std::cout << std::flush;
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::cerr << "attncheck: --export: cannot fork: " << std::strerror(errno) << "\n";
    return 2;
  }
  if (pid == 0) {
    ::setenv("PYTHONPATH", pythonpath.c_str(), 1);
    std::vector<char*> argv;
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    ::execv(python.c_str(), argv.data());
    std::cerr << "attncheck: --export: cannot run " << python << ": " << std::strerror(errno)
              << "\n";
    ::_exit(2);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 2;
}

}  // namespace

namespace {

// repro's context, in this process: the library loaded first in a process of its own, where a
// constructor or device query that crashes, hangs or exits is named instead of ending this one.
// 0, or the exit status having said why.
int repro_context(const Paths& p, const ReproArgs& a, std::unique_ptr<CaseContext>& ctx) {
  const bool py = a.kernels.rfind("py:", 0) == 0;
  if (!a.export_format.empty() && !py) {
    std::cerr << "attncheck: --export " << a.export_format
              << " needs a Python adapter's failure (--kernels py:MODULE): the file calls the "
                 "adapter's upstream function\n";
    return 2;
  }
  if (!a.kernels.empty() && !py && !fs::exists(a.kernels)) {
    std::cerr << "attncheck: kernel library '" << a.kernels << "' does not exist\n";
    return 2;
  }
  WorkerConfig cfg = worker_config(
      p, a.kernels.empty() || py ? a.kernels : fs::absolute(a.kernels).string(), a.arch, a.repeat);
  cfg.cases_dir = p.cases;  // in this process: the id is looked up in the case files
  cfg.allow_missing_goldens = a.allow_missing_goldens;
  cfg.import_timeout_s = a.import_timeout_s;
  try {
    if (!cfg.kernels.empty()) load_library_isolated(cfg.kernels, true, a.import_timeout_s);
    ctx = make_context_within_limit(
        cfg, [](const std::string& why) { std::cerr << "attncheck: " << why << "\n"; });
  } catch (const CaseFileError& e) {
    std::cerr << "attncheck: bad case file: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  ctx->eval.golden_as_expected = false;  // the reference is the authority when reproducing
  return 0;
}

// The case of the id, or the ad-hoc one of --params; nullopt having said why not.
std::optional<Case> repro_case(const Paths& p, const ReproArgs& a, const CaseContext& ctx) {
  std::optional<Case> found;
  if (!a.params.empty()) {
    try {
      found = adhoc_case(a.id, nlohmann::json::parse(a.params));
    } catch (const std::exception& e) {
      std::cerr << "attncheck: --params: " << e.what() << "\n";
      return std::nullopt;
    }
  } else {
    found = find_case(ctx.files, a.id);
  }
  if (!found) {
    std::cerr << "attncheck: no case '" << shown_id(a.id) << "' in " << p.cases << "; nearest:";
    for (const auto& id : nearest_case_ids(ctx.files, a.id)) std::cerr << "\n  " << id;
    std::cerr << "\n";
  }
  return found;
}

void print_repro_header(const Case& c, const CaseContext& ctx) {
  std::cout << "case     " << c.id << "\n"
            << "source   " << c.source << "  tiers [" << join(c.tiers, ",") << "]\n"
            << "params   " << c.params.dump() << "\n";
  if (c.known_bug)
    std::cout << "known    " << c.known_bug->reason
              << (c.known_bug->arch.empty() ? "" : " (arch " + c.known_bug->arch + ")") << "\n";
  if (ctx.device)
    std::cout << "kernels  " << ctx.lib->library() << " on " << ctx.device->name << " ("
              << ctx.device->arch << ")\n";
  else
    std::cout << "kernels  REFERENCE ONLY, kernels not checked: " << ctx.eval.no_kernel_reason
              << "\n";
}

// One check: its budget, what was measured, and the worst elements.
void print_repro_check(const CheckResult& ch, const Result& r, const CaseArtifacts& artifacts,
                       int worst_count) {
  const auto& b = ch.budget;
  const auto& m = ch.metrics;
  std::cout << "\ncheck " << ch.name << ": " << (ch.passed ? "PASSED" : "FAILED") << "\n";
  // The arithmetic contract the budget was derived for (docs/verification.md).
  const std::string contract = r.contract.empty() ? "" : "  (contract " + r.contract + ")";
  if (b.kind == Budget::Kind::numeric)
    std::cout << "  budget   |a-e| <= " << num(b.atol) << " + " << num(b.rtol) << "*|e|"
              << (b.max_mismatch_frac > 0
                      ? ", up to " + num(b.max_mismatch_frac) + " of elements beyond"
                      : "")
              << (b.max_calc_diff >= 0 ? ", calc_diff <= " + num(b.max_calc_diff) : "") << contract
              << "\n";
  else
    std::cout << "  budget   " << (b.kind == Budget::Kind::exact ? "bitwise" : "top-k as sets")
              << "\n";
  if (!b.why.empty()) std::cout << "  why      " << b.why << "\n";
  std::cout << "  measured count " << m.count << ", mismatches " << m.mismatches << " ("
            << num(m.mismatch_frac) << "), max_abs " << num(m.max_abs) << ", max_rel "
            << num(m.max_rel) << ", rel_l2 " << num(m.rel_l2) << ", calc_diff " << num(m.calc_diff)
            << ", cosine " << num(m.cosine, 8);
  if (m.nan_actual) std::cout << ", NaN " << m.nan_actual;
  if (m.inf_actual) std::cout << ", inf " << m.inf_actual;
  if (m.neginf_mask_mismatch) std::cout << ", -inf mask mismatches " << m.neginf_mask_mismatch;
  if (b.kind == Budget::Kind::exact) std::cout << ", bit mismatches " << m.bit_mismatches;
  if (b.kind == Budget::Kind::topk_set)
    std::cout << ", missing " << m.topk_missing << ", invalid " << m.topk_invalid;
  std::cout << "\n";
  if (!artifacts.expected.count(ch.name) || !artifacts.actual.count(ch.name)) return;
  const auto worst = worst_elements(artifacts.expected.at(ch.name), artifacts.actual.at(ch.name), b,
                                    static_cast<size_t>(worst_count));
  if (worst.empty()) return;
  std::cout << "  worst elements (index: expected, actual, |err|, err/allowed):\n";
  for (const auto& w : worst)
    std::cout << "    " << std::left << std::setw(18) << format_index(w.index) << std::right << " "
              << std::setw(14) << num(w.expected, 8) << " " << std::setw(14) << num(w.actual, 8)
              << " " << std::setw(11) << num(w.abs_err, 3) << " "
              << (std::isinf(w.ratio) ? std::string("inf") : num(w.ratio, 3)) << "\n";
}

void print_repro_verdict(const Result& r) {
  std::cout << "\nverdict  " << verdict_name(r.verdict)
            << (r.contract.empty() ? "" : " (budgets of contract " + r.contract + ")") << "\n";
  std::string msg = r.message;
  size_t pos;
  std::cout << "  - ";
  while ((pos = msg.find("; ")) != std::string::npos) {
    std::cout << msg.substr(0, pos) << "\n  - ";
    msg.erase(0, pos + 2);
  }
  std::cout << msg << "\n";
}

// The bundle, and with --export the pytest file beside it; 0, or 2 having said why.
int write_repro_files(const Paths& p, const ReproArgs& a, const Case& c, const Result& r,
                      const CaseArtifacts& artifacts, const CaseContext& ctx) {
  if (!artifacts.present) {
    if (a.export_format.empty()) return 0;
    std::cerr << "attncheck: --export: the case's problem could not be made: nothing to export\n";
    return 2;
  }
  const std::string bundle =
      a.bundle.empty() ? (fs::path("repro") / (id_to_filename(c.id) + ".h5")).string() : a.bundle;
  try {
    write_repro_bundle(bundle, r, artifacts, context_hello(ctx).to_json());
    std::cout << "bundle   " << fs::absolute(bundle).string()
              << " (inputs/, expected/, actual/ + metadata; h5py reads it)\n";
  } catch (const std::exception& e) {
    std::cerr << "attncheck: cannot write the bundle: " << e.what() << "\n";
    return 2;
  }
  if (a.export_format.empty()) return 0;
  const std::string out =
      a.export_out.empty()
          ? (fs::path(bundle).parent_path() / ("test_" + id_to_filename(c.id) + ".py")).string()
          : a.export_out;
  return export_pytest(p, fs::absolute(bundle).string(), a.kernels.substr(3), out) != 0 ? 2 : 0;
}

}  // namespace

int cmd_repro(const Paths& p, const ReproArgs& a) {
  std::unique_ptr<CaseContext> ctx;
  if (const int status = repro_context(p, a, ctx)) return status;
  const std::optional<Case> found = repro_case(p, a, *ctx);
  if (!found) return 2;
  const Case& c = *found;
  print_repro_header(c, *ctx);
  CaseArtifacts artifacts;
  const Result r = evaluate(c, ctx->eval, &artifacts);
  std::cout << "mode     " << mode_name(r.mode)
            << (r.expected_from.empty() ? "" : " (expected from the " + r.expected_from + ")")
            << "\n";
  if (artifacts.present)
    std::cout << "kernel   " << artifacts.problem.kernel << " "
              << artifacts.problem.kernel_params.dump() << "\n";
  std::cout << "timings  generate " << num(r.timings.generate_ms) << " ms, reference "
            << num(r.timings.reference_ms) << " ms, kernel " << num(r.timings.kernel_ms) << " ms\n";
  for (const auto& ch : r.checks) print_repro_check(ch, r, artifacts, a.worst);
  print_repro_verdict(r);
  if (const int status = write_repro_files(p, a, c, r, artifacts, *ctx)) return status;
  // An ad-hoc case is in no case file: its rerun line carries its axis values.
  std::cout << "rerun    "
            << (a.params.empty() ? r.repro
                                 : shrunk_repro_command(*find_op(c.op), c, ctx->eval.options))
            << "\n";
  return r.failing() ? 1 : 0;
}

namespace {
GoldenOptions golden_options(const Paths& p, const GoldenArgs& a) {
  GoldenOptions o;
  o.dir = p.golden;
  o.root = p.root;
  o.ops = a.ops;
  o.against = a.against;
  o.manifest_only = a.manifest_only;
  return o;
}
}  // namespace

int cmd_golden_generate(const Paths& p, const GoldenArgs& a) {
  std::vector<CaseFile> files;
  if (!load(p, files)) return 2;
  std::cout << "golden generate -> " << p.golden << "\n";
  try {
    return golden_generate(files, golden_options(p, a), std::cout);
  } catch (const std::invalid_argument& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
}

int cmd_golden_verify(const Paths& p, const GoldenArgs& a) {
  std::vector<CaseFile> files;
  if (!load(p, files)) return 2;
  std::cout << "golden verify " << p.golden << "\n";
  int problems = 0;
  try {
    problems = golden_verify(files, golden_options(p, a), std::cout);
  } catch (const std::invalid_argument& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  if (problems) {
    std::cout << problems
              << " problem(s). A golden is changed only by `attncheck golden generate`, "
                 "and a change of expected values must be explained in its commit.\n";
    return 1;
  }
  std::cout << "goldens verified\n";
  return 0;
}

int cmd_golden_diff(const Paths& p, const GoldenArgs& a) {
  std::vector<CaseFile> files;
  if (!load(p, files)) return 2;
  std::cout << "golden diff " << p.golden << " vs "
            << (a.against.empty() ? std::string("the recomputed reference") : a.against) << "\n";
  try {
    return golden_diff(files, golden_options(p, a), std::cout) ? 1 : 0;
  } catch (const std::invalid_argument& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
}

namespace {

struct Roofline {
  double copy_gbps = 0, matrix_tflops = 0;
};

// One case timed: its row printed and added to `rows`; false when it could not be timed (no
// entry, a launch error). Cases whose configuration the kernel must refuse are left out.
bool bench_case(const Case& c, const KernelLibrary& lib, DeviceRunner& runner, const BenchArgs& a,
                const Roofline& roof, nlohmann::json& rows) {
  const Problem prob = find_op(c.op)->problem(c);
  if (prob.expect_refusal) return true;
  if (!lib.has_entry(prob.kernel)) {
    std::cout << std::left << std::setw(60) << c.id << "  not run: the library has no entry '"
              << prob.kernel << "'\n";
    rows.push_back({{"id", c.id}, {"op", c.op}, {"error", "no entry '" + prob.kernel + "'"}});
    return false;
  }
  std::string err;
  const double ms = runner.time(prob, a.warmup, a.iters, &err);
  if (ms < 0) {
    std::cout << std::left << std::setw(60) << c.id << "  error: " << err << "\n";
    rows.push_back({{"id", c.id}, {"op", c.op}, {"error", err}});
    return false;
  }
  const double s = ms / 1e3;
  const double gbps = prob.bytes / s / 1e9, tflops = prob.flops / s / 1e12;
  const double floor_s =
      std::max(roof.copy_gbps > 0 ? prob.bytes / (roof.copy_gbps * 1e9) : 0.0,
               roof.matrix_tflops > 0 ? prob.flops / (roof.matrix_tflops * 1e12) : 0.0);
  const double frac = s > 0 ? floor_s / s : 0;
  std::cout << std::left << std::setw(60) << c.id << std::right << std::setw(11) << num(ms * 1e3)
            << std::setw(10) << num(gbps) << std::setw(10) << num(tflops) << std::setw(11)
            << num(floor_s * 1e6) << std::setw(8) << num(frac * 100, 3) << "%\n";
  rows.push_back({{"id", c.id},
                  {"op", c.op},
                  {"params", c.params},
                  {"time_ms", ms},
                  {"bytes", prob.bytes},
                  {"flops", prob.flops},
                  {"gbps", gbps},
                  {"tflops", tflops},
                  {"roofline_floor_ms", floor_s * 1e3},
                  {"roofline_fraction", frac}});
  return true;
}

}  // namespace

int cmd_bench(const Paths& p, const BenchArgs& a) {
  const Selection sel = selection(a.tier, a.ops, a.filter);
  std::vector<CaseFile> files;
  std::vector<Case> cases;
  if (!load_and_select(p, sel, files, cases)) return 2;
  if (a.kernels.empty()) {
    std::cerr << "attncheck: bench needs a kernel library (--kernels or ATTNCHECK_KERNELS)\n";
    return 2;
  }
  if (a.kernels.rfind("py:", 0) != 0 && !fs::exists(a.kernels)) {
    std::cerr << "attncheck: kernel library '" << a.kernels << "' does not exist\n";
    return 2;
  }
  // In-process: timing is for cases that already pass `run`; a crash here ends the bench. The
  // load is tried in a process of its own first (load_library_isolated).
  const std::string kernels =
      a.kernels.rfind("py:", 0) == 0 ? a.kernels : fs::absolute(a.kernels).string();
  try {
    load_library_isolated(kernels, true, 120);
  } catch (const std::exception& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  const auto lib = KernelLibrary::open(kernels);
  std::string why;
  const auto dev = lib->device(&why);
  if (!dev) {
    std::cerr << "attncheck: bench needs a GPU: " << why << "\n";
    return 2;
  }
  double copy_gbps = 0, matrix_tflops = 0;
  char msg[2048] = {0};
  if (lib->api().roofline(&copy_gbps, &matrix_tflops, msg, sizeof msg) != ATTNCHECK_OK) {
    std::cerr << "attncheck: roofline measurement failed: " << abi_text(msg) << "\n";
    return 2;
  }
  std::cout << "bench on " << dev->name << " (" << dev->arch << "), " << lib->library()
            << "\nroofline: copy " << num(copy_gbps) << " GB/s, matrix " << num(matrix_tflops)
            << " TFLOP/s (measured now, same library)\n\n"
            << std::left << std::setw(60) << "case" << std::right << std::setw(11) << "time_us"
            << std::setw(10) << "GB/s" << std::setw(10) << "TFLOP/s" << std::setw(11) << "floor_us"
            << std::setw(9) << "of_roof"
            << "\n";
  DeviceRunner runner(*lib, dev->arch);
  nlohmann::json rows = nlohmann::json::array();
  int errors = 0;
  for (const auto& c : cases)
    if (!bench_case(c, *lib, runner, a, {copy_gbps, matrix_tflops}, rows)) ++errors;
  const nlohmann::json out = {
      {"attncheck_version", attncheck_version()},
      {"git_revision", git_revision(p.root)},
      {"device", dev->name},
      {"arch", dev->arch},
      {"kernels_library", lib->library()},
      {"started", utc_now_iso()},
      {"warmup", a.warmup},
      {"iters", a.iters},
      {"roofline", {{"copy_gbps", copy_gbps}, {"matrix_tflops", matrix_tflops}}},
      {"cases", rows}};
  write_file_atomic(a.json, out.dump(2) + "\n");
  std::cout << "\n" << rows.size() << " cases timed -> " << a.json << "\n";
  return errors ? 1 : 0;
}

namespace {

// The partial contracts the library's entries declare (docs/verification.md "Partial
// contracts"; `declared`: entry -> the library's text, as the isolated load reported it), each
// checked against its op; how many are bad.
int print_partial_contracts(const std::string& library, const nlohmann::json& declared) {
  int bad = 0;
  for (const auto& [entry, text] : declared.items()) {
    const Op* op = op_of_entry(entry);
    if (!op) continue;
    try {
      const std::string described =
          parse_partial(text.get<std::string>(), *op, entry, library).describe();
      std::cout << "partial contract: " << entry << ": " << described << "\n";
    } catch (const PartialContractError& e) {
      ++bad;
      std::cout << "BAD partial contract: " << e.what() << "\n";
    }
  }
  if (bad) std::cout << bad << " entries declare a partial contract their op cannot have\n";
  return bad;
}

}  // namespace

int cmd_kernels(const Paths&, const KernelsArgs& a) {
  // Loaded in a process of its own, never in this one: the listing is all this command needs.
  std::string library;
  std::vector<std::string> entries;
  nlohmann::json partial = nlohmann::json::object();
  try {
    const nlohmann::json loaded = load_library_isolated(a.kernels, false, a.import_timeout_s);
    library = loaded.at("library").get<std::string>();
    entries = loaded.at("entries").get<std::vector<std::string>>();
    partial = loaded.value("partial", nlohmann::json::object());
  } catch (const std::exception& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  std::cout << library << " (" << a.kernels << ")\n";
  std::cout << "entries: " << join(entries, ", ") << "\n\n";
  int missing = 0;
  for (const Op* op : all_ops()) {
    for (const auto& entry : op->kernel_entries()) {
      const bool has = std::find(entries.begin(), entries.end(), entry) != entries.end();
      missing += has ? 0 : 1;
      std::cout << "  " << (has ? "ok      " : "MISSING ") << std::left << std::setw(26) << entry
                << std::right << " op " << op->name() << "\n";
    }
  }
  std::cout << (missing ? std::to_string(missing) + " entries the ops ask for are missing\n"
                        : "every entry the ops ask for is present\n");
  const int bad = print_partial_contracts(library, partial);
  return a.check && (missing || bad) ? 1 : 0;
}

int cmd_load_library(const LoadLibraryArgs& a) {
  return load_library_main(a.kernels, a.device, a.import_timeout_s);
}

int cmd_coverage(const Paths& p, const CoverageArgs& a) {
  std::vector<CaseFile> files;
  if (!load(p, files)) return 2;
  CoverageOptions options;
  options.tier = a.tier;
  options.ops = a.ops;
  CoverageReport report;
  try {
    report = audit_coverage(files, options);
  } catch (const std::invalid_argument& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  const nlohmann::json j = coverage_json(report);
  if (!a.out.empty()) write_file_atomic(a.out, j.dump(1) + "\n");
  if (a.json)
    std::cout << j.dump(1) << "\n";
  else
    print_coverage(report, std::cout);
  return report.exit_status();
}

int cmd_report(const Paths& p, const std::vector<std::string>& args) {
  const std::string python = "/usr/bin/python3";
  if (::access(python.c_str(), X_OK) != 0) {
    std::cerr << "attncheck: " << python
              << " not found: the report needs Debian's python3 with python3-h5py, "
                 "python3-numpy, python3-matplotlib, python3-jinja2 (ci/install-deps)\n";
    return 2;
  }
  const std::string pkg = (fs::path(p.root) / "harness" / "report").string();
  const char* old = std::getenv("PYTHONPATH");
  const std::string pythonpath = pkg + (old && *old ? ":" + std::string(old) : "");
  ::setenv("PYTHONPATH", pythonpath.c_str(), 1);
  std::vector<std::string> argv_s = {python, "-m", "attncheck_report"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::cout << std::flush;
  ::execv(python.c_str(), argv.data());
  std::cerr << "attncheck: cannot run " << python << ": " << std::strerror(errno) << "\n";
  return 2;
}

}  // namespace attncheck::cli
