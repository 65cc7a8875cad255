// Shrinking (`attncheck shrink`, `attncheck run --shrink`; docs/cli.md): from a failing case, move
// its axes toward smaller and simpler values while the same check still fails, and report the
// smallest failing case found with the lines that rerun it.
//
// Candidates come from the op's axes (Op::axes(): type, allowed values, bounds, default): an
// integer or real tries the smallest allowed value, 0 and 1, its default when smaller, half and
// three quarters of its value and one less; a choice, dtype or boolean its default and the values
// listed before it. A candidate must describe a case (Op::complete, Op::case_error) that the
// kernel must not refuse (Op::invalid_reason): a refusal is never the same failure.
//
// One pass evaluates, from the current case, every candidate of every axis (one batch, so a pool
// of workers runs them side by side), keeps per axis the simplest candidate that still fails the
// same way, then tries all those moves together; when the combination does not fail that way, the
// move of the first axis (in the op's axis order) is taken alone. Passes repeat until no move
// helps, the evaluations run out, or the time budget is spent.
#pragma once
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"
#include "ops/op.h"
#include "run/evaluate.h"
#include "run/pool.h"

namespace attncheck {

// One way a case fails: an output's check of a budget kind ("o", "numeric"), or a problem that no
// output check names (check empty): "unwritten", "nondeterministic", "guard", "outside-view",
// "crash", "timeout", "memory", "refused-valid", "ran-invalid", "kernel-error", "missing-entry",
// "other".
struct FailureSignature {
  std::string check;
  std::string kind;
  bool operator==(const FailureSignature&) const = default;
  std::string describe() const;  // "o (numeric)", "unwritten", "o (unwritten)"
};

// Every way a failing result fails, first launch's output checks first; empty for a result that is
// not `failed`.
std::vector<FailureSignature> failure_signatures(const Result& r);

// The failure to keep: the one named by `check` (an output name or a kind), else the first.
// Throws std::invalid_argument naming the failures there are when `check` names none, or when the
// result does not fail.
FailureSignature pick_target(const Result& r, const std::string& check);

// Whether `r` still fails the way `target` says (other failures besides it are allowed).
bool fails_with(const Result& r, const FailureSignature& target);

// The simpler values of one axis than `current`, simplest first (see the top of this file).
std::vector<nlohmann::json> simpler_values(const Axis& axis, const nlohmann::json& current);

// Evaluates cases, one Result per case in the same order (kernel mode).
using CaseEvaluator = std::function<std::vector<Result>(const std::vector<Case>&)>;

struct ShrinkStep {
  std::vector<std::string> axes;  // the axes moved together in this step
  nlohmann::json from, to;        // their values before and after ({axis: value})
  std::string describe() const;   // "heads 32 -> 8, batch 6 -> 1"
};

struct ShrinkOptions {
  int max_evaluations = 300;  // candidates evaluated in all
  double time_budget_s = 0;   // > 0: no new pass starts after this many seconds
  // Called after every step taken, with the new current case and the evaluations so far.
  std::function<void(const ShrinkStep&, const Case&, int evaluations)> on_step;
};

struct ShrinkOutcome {
  Case original;
  Case minimal;           // == original when no move kept the failure
  Result minimal_result;  // its evaluation (the original's when nothing moved)
  FailureSignature target;
  std::vector<ShrinkStep> steps;
  int evaluations = 0;
  int passes = 0;
  std::string stopped;  // why the search ended: "no simpler value fails the same way", ...
  bool shrunk() const { return minimal.id != original.id; }
};

ShrinkOutcome shrink(const Op& op, const Case& failing, const Result& failing_result,
                     const FailureSignature& target, const CaseEvaluator& evaluate_cases,
                     const ShrinkOptions& options);

// The case's axes as one entry of a case file's `cases = [...]` list: `{ heads = 8, page_size =
// 64 }`, every axis that differs from the op's default or that the file's [defaults] set.
std::string case_file_entry(const Op& op, const Params& params,
                            const Params& file_defaults = Params::object());

// The axes of `params` that differ from the op's defaults (a JSON object), for `--params`.
Params non_default_params(const Op& op, const Params& params);

// `attncheck repro` of an ad-hoc case: repro_command plus --params with its non-default axes.
std::string shrunk_repro_command(const Op& op, const Case& c, const RunOptions& opt);

// The ad-hoc case of an op from axis values (`repro --params`): `id_or_op` is the op's name or
// the full id, which must then be the id the values describe. Throws std::invalid_argument
// naming the axis, the value or the id that does not fit.
Case adhoc_case(const std::string& id_or_op, const nlohmann::json& params);

// results.jsonl's "shrunk" field: id, params (complete), case_file_entry, repro, failing check,
// original id, steps, evaluations, passes, stopped, message.
nlohmann::json shrunk_json(const Op& op, const ShrinkOutcome& s, const RunOptions& opt,
                           const Params& file_defaults = Params::object());

// Evaluates cases in worker processes (run/pool.h) as `run` does: a case whose worker dies or
// hangs comes back as lost_case_result in kernel mode. `opt` makes those results' repro lines.
CaseEvaluator worker_evaluator(const WorkerSpec& spec, const RunOptions& opt);
// Cases evaluated one after another in this process (`--in-process`); `eval` must outlive it.
CaseEvaluator in_process_evaluator(const EvalContext& eval);

}  // namespace attncheck
