// `attncheck shrink` and the shrinking of `run --shrink` (run/shrink.h, docs/cli.md "shrink").
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/case_run.h"
#include "cli/commands.h"
#include "run/shrink.h"
#include "run/worker.h"

namespace attncheck::cli {

namespace fs = std::filesystem;

namespace {
// The worker processes that evaluate `attncheck shrink`'s candidates.
WorkerSpec shrink_worker_spec(const Paths& paths, const ShrinkArgs& a, const std::string& kernels) {
  WorkerConfig cfg = worker_config(paths, kernels, a.arch, a.repeat);
  cfg.golden_dir = fs::absolute(paths.golden).string();  // workers may start elsewhere
  WorkerSpec spec;
  spec.jobs = std::max(a.jobs, 1);
  spec.case_timeout_s = a.timeout_s;
  spec.args = worker_command(cfg);
  return spec;
}
}  // namespace

Params file_defaults_of(const std::vector<CaseFile>& files, const std::string& op) {
  for (const auto& f : files)
    if (f.op == op) return f.defaults;
  return Params::object();
}

void print_shrink_outcome(std::ostream& out, const Op& op, const ShrinkOutcome& s,
                          const RunOptions& opt, const Params& file_defaults,
                          const std::string& indent) {
  out << indent << "original  " << s.original.id << "\n"
      << indent << "check     " << s.target.describe() << "\n";
  if (!s.shrunk()) {
    out << indent << "minimal   (no simpler case fails the same way: the original is minimal)\n";
  } else {
    out << indent << "minimal   " << s.minimal.id << "\n"
        << indent << "case      " << case_file_entry(op, s.minimal.params, file_defaults)
        << "   (an entry of a case file's `cases = [...]` list)\n"
        << indent << "params    " << non_default_params(op, s.minimal.params).dump() << "\n"
        << indent << "fails     " << s.minimal_result.message.substr(0, 400) << "\n"
        << indent << "repro     " << shrunk_repro_command(op, s.minimal, opt) << "\n";
  }
  out << indent << "search    " << s.evaluations << " evaluations, " << s.steps.size()
      << " steps; stopped: " << s.stopped << "\n";
}

namespace {

// The case to shrink: from the case files, or ad hoc (--params); false having said why not.
bool starting_case(const Paths& paths, const ShrinkArgs& a, std::vector<CaseFile>& files,
                   std::optional<Case>& start) {
  try {
    files = load_case_dir(paths.cases);
  } catch (const CaseFileError& e) {
    std::cerr << "attncheck: bad case file: " << e.what() << "\n";
    return false;
  }
  try {
    start = a.params.empty()
                ? find_case(files, a.id)
                : std::optional<Case>(adhoc_case(a.id, nlohmann::json::parse(a.params)));
  } catch (const std::exception& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return false;
  }
  if (!start) {
    std::cerr << "attncheck: no case '" << shown_id(a.id) << "' in " << paths.cases
              << " (an ad-hoc case needs --params JSON); nearest:";
    for (const auto& id : nearest_case_ids(files, a.id)) std::cerr << "\n  " << id;
    std::cerr << "\n";
    return false;
  }
  // The kernel's failure is what is shrunk: a known-bug mark would turn it into a pass.
  start->known_bug.reset();
  return true;
}

// How candidates are evaluated: in worker processes (`run`'s, run/shrink.h worker_evaluator), or
// in this process (`ctx` holds its context); false having said why not.
bool candidate_evaluator(const Paths& paths, const ShrinkArgs& a, const std::string& kernels,
                         const RunOptions& opt, std::unique_ptr<CaseContext>& ctx,
                         CaseEvaluator& evaluate_cases) {
  if (!a.in_process) {
    evaluate_cases = worker_evaluator(shrink_worker_spec(paths, a, kernels), opt);
    return true;
  }
  try {
    ctx = make_context(worker_config(paths, kernels, a.arch, a.repeat));
  } catch (const std::exception& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return false;
  }
  evaluate_cases = in_process_evaluator(ctx->eval);
  return true;
}

// The first evaluation of the case and the failure to keep; 0 to go on shrinking, else the exit
// status (0: nothing to shrink).
int first_failure(const Case& start, const ShrinkArgs& a, const CaseEvaluator& evaluate_cases,
                  Result& r0, FailureSignature& target) {
  try {
    r0 = evaluate_cases({start}).at(0);
  } catch (const std::exception& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  if (r0.mode == Mode::reference) {
    std::cerr << "attncheck: shrink needs the kernel to run (mode " << mode_name(r0.mode)
              << ", verdict " << verdict_name(r0.verdict) << "): " << r0.message << "\n";
    return 2;
  }
  if (r0.verdict != Verdict::failed) {
    std::cout << "  the case does not fail (verdict " << verdict_name(r0.verdict)
              << "): nothing to shrink\n";
    return -1;
  }
  try {
    target = pick_target(r0, a.check);
  } catch (const std::invalid_argument& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  std::cout << "  fails   " << target.describe() << ": " << r0.message.substr(0, 300) << "\n"
            << std::flush;
  return 0;
}

}  // namespace

int cmd_shrink(const Paths& paths, const ShrinkArgs& a) {
  if (a.kernels.empty()) {
    std::cerr << "attncheck: shrink needs --kernels LIB.so|py:MODULE (it reruns the kernel)\n";
    return 2;
  }
  const bool py = a.kernels.rfind("py:", 0) == 0;
  if (!py && !fs::exists(a.kernels)) {
    std::cerr << "attncheck: kernel library '" << a.kernels << "' does not exist\n";
    return 2;
  }
  const std::string kernels = py ? a.kernels : fs::absolute(a.kernels).string();
  std::vector<CaseFile> files;
  std::optional<Case> start;
  if (!starting_case(paths, a, files, start)) return 2;
  const Op* op = find_op(start->op);
  RunOptions opt;
  opt.kernels_path = kernels;
  opt.repro_extra = path_flags(paths);
  opt.arch = a.arch;
  CaseEvaluator evaluate_cases;
  std::unique_ptr<CaseContext> ctx;
  if (!candidate_evaluator(paths, a, kernels, opt, ctx, evaluate_cases)) return 2;
  std::cout << "attncheck shrink " << start->id << "\n  kernels " << kernels << "\n" << std::flush;
  Result r0;
  FailureSignature target;
  if (const int status = first_failure(*start, a, evaluate_cases, r0, target))
    return status < 0 ? 0 : status;
  ShrinkOptions so;
  so.max_evaluations = a.max_evaluations;
  so.time_budget_s = a.time_budget_s;
  so.on_step = [](const ShrinkStep& st, const Case& now, int evaluations) {
    std::cout << "  step    " << st.describe() << "  (" << evaluations << " evaluations) -> "
              << now.id << "\n"
              << std::flush;
  };
  ShrinkOutcome s;
  try {
    s = shrink(*op, *start, r0, target, evaluate_cases, so);
  } catch (const std::exception& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  std::cout << "\n";
  const Params defaults = file_defaults_of(files, op->name());
  print_shrink_outcome(std::cout, *op, s, opt, defaults, "");
  if (a.json) std::cout << shrunk_json(*op, s, opt, defaults).dump() << "\n";
  return 1;  // the case (and its minimal form) fails
}

}  // namespace attncheck::cli
