// The outcome of one case (docs/verification.md "Verdicts"): built once by evaluate()
// (run/evaluate.h), written as one JSON line of results.jsonl, read back by the parent process
// and the report from that JSON. What counts as failing is decided here and nowhere else: the
// JSON carries it as "failing".
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/case.h"
#include "core/compare.h"

namespace attncheck {

enum class Verdict {
  passed,               // a kernel output (or, in reference mode, the reference) was compared and
                        // every check was within budget
  failed,               // a check failed; the kernel crashed, hung, refused a valid case, ran an
                        // invalid one; or the kernel entry was missing from the library
  refused_as_expected,  // invalid configuration, refused by the reference and the kernel
  known_bug,            // failed, and the case carries a known_bug mark for this arch
  unexpected_pass,      // passed although marked known_bug for this arch
  unsupported,          // the kernel under test declined the case ("unsupported by <adapter>")
  skipped,              // nothing compared; the message says why
  error,                // the harness itself could not run the case (bad case, I/O, golden)
};
std::string_view verdict_name(Verdict v);
std::optional<Verdict> parse_verdict(std::string_view name);
// The one definition of a failing case: the gate goes red for these.
bool is_failing(Verdict v);

// What was compared: a kernel's output (against the golden or the reference), the reference
// against a golden, or nothing.
enum class Mode { kernel, reference, none };
std::string_view mode_name(Mode m);
std::optional<Mode> parse_mode(std::string_view name);

// Where a case's time went (results.jsonl "timings_ms"; `attncheck run --profile` sums them).
// The phases are disjoint: their sum is the case's round trip as the parent saw it.
struct Timings {
  double generate_ms = 0;   // the problem: inputs generated, quantized, laid out
  double reference_ms = 0;  // the CPU reference (0 when the golden was the expectation)
  double kernel_ms = 0;     // wall time of the first launch
  double golden_ms = 0;     // the golden read (first read of an op's file checks it too)
  double budgets_ms = 0;    // the comparison budgets derived from the expected outputs
  double upload_ms = 0;     // device allocations and host-to-device copies, every launch
  double relaunch_ms = 0;   // launches after the first (repeat, stress, refusal probes)
  double download_ms = 0;   // device-to-host copies and releases, every launch
  double guards_ms = 0;     // guard bytes, bytes the kernel must not write, every launch
  double compare_ms = 0;    // outputs against the expected ones, and launches against each other
  double other_ms = 0;      // the rest of the worker's time on the case (bundles, known bugs)
  double ipc_ms = 0;        // parent-side: the round trip minus the worker's time (queueing,
                            // JSON, pipes); 0 in-process
  int launches = 0;
  // Not a phase: how long the case's launches held the process's launch lock (run/device.h),
  // inside upload, kernel, relaunch and download. Against a pool's wall time it says whether
  // the lock bounds a worker process.
  double locked_ms = 0;
  double total_ms() const;  // the sum of the phases
};
// The phases' names as results.jsonl writes them ("generate", "golden", ...), in the order of a
// case's life, and one phase's value by that name.
std::vector<std::string> timing_phase_names();
double timing_of(const Timings& t, const std::string& phase);

// The stress mode's record (`attncheck run --stress N`, docs/verification.md V12b): N more
// launches under varying conditions, each output compared bitwise with the first launch's.
struct StressStats {
  int launches = 0;        // stress launches made (N, fewer when one failed to launch)
  int differing = 0;       // launches whose outputs differ bitwise from the first launch's
  int failed = 0;          // launches whose outputs fail the checks against the expected outputs
  std::string conditions;  // what was varied ("smem poison patterns, L2 flush, ...")
  std::string first_difference;  // the first differing launch, in words ("" when none)
  double rate() const { return launches ? static_cast<double>(differing) / launches : 0.0; }
};

// One metamorphic relation of a case (docs/verification.md "Invariance"): its transformed
// problem's outputs, mapped back, against the first launch's.
struct RelationOutcome {
  std::string relation;  // "batch permutation [2,0,3,1]"
  std::string mode;      // "bitwise" (the entry declares the property) or "budget"
  bool passed = false;
  std::string message;  // why it failed, or what was compared
};

struct Result {
  std::string id;
  std::string op;
  Params params;
  Verdict verdict = Verdict::error;
  Mode mode = Mode::none;
  std::string message;
  std::vector<CheckResult> checks;
  Timings timings;
  std::string arch;
  std::string repro;          // one-line command that reruns this case
  std::string kernel_entry;   // the library entry the case launches ("rope_inplace")
  std::string expected_from;  // "golden" | "reference" | "" (nothing expected)
  std::string bundle;         // repro bundle written for a failing case
  // The arithmetic contract whose budgets `checks` hold (docs/verification.md "Arithmetic
  // contracts"): "fp32-accumulate" (the default), or the kernel's declared contract when the
  // default budgets failed and the declared ones were applied; "" for ops whose budgets no
  // contract changes, and when nothing was compared.
  std::string contract;
  // The partial contract the kernel entry declared and the case was judged under
  // (docs/verification.md "Partial contracts"): {"not_produced": [outputs], "unspecified":
  // {output: region}}; null when the entry produces everything, or nothing was judged.
  nlohmann::json partial;
  // The Python adapter (`--kernels py:NAME`) that provides no entry for this case: NAME. Such a
  // case is not run (verdict unsupported) and summed up once per op; "" otherwise.
  std::string not_provided_by;
  // The launch returned ATTNCHECK_ERROR or device I/O failed: the GPU context may be unusable
  // (sticky faults), so the worker process that ran it retires after reporting it.
  bool device_error = false;
  std::optional<StressStats> stress;        // only with --stress
  std::vector<RelationOutcome> invariance;  // the op's relations, after the checks passed

  bool failing() const { return is_failing(verdict); }
  nlohmann::json to_json() const;
  // Throws std::invalid_argument naming the field that is missing or malformed.
  static Result from_json(const nlohmann::json& j);
};

// JSON has no NaN or infinity: they are written as the strings "nan", "inf", "-inf".
nlohmann::json json_number(double v);
double number_from_json(const nlohmann::json& j);

}  // namespace attncheck
