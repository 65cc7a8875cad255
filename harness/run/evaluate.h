// One case, end to end, in one place (docs/verification.md):
//   case -> problem (Op::problem, made once) -> expected outputs and budgets (golden or reference)
//   -> kernel launches -> comparisons -> Result.
// evaluate() owns every decision on the way: the refusal of invalid configurations, golden or
// reference, whether the kernel library has the problem's entry, known-bug marks and the repro
// line. The worker process, `repro`, `golden verify` and the device tests all call it. Afterwards
// only these touch a Result: run_case (run/worker.h) names the repro bundle it wrote (or why it
// could not), the worker and the parent add their own time (Timings::other_ms, ipc_ms), the
// worker answers a request it cannot read, or whose library cannot load, with an error Result of
// its own (run/worker.cpp), and the parent's amendments are all in run/amend.h (compute-sanitizer
// findings, and the Results it writes for cases no worker answered).
#pragma once
#include <string>
#include <vector>

#include "core/result.h"
#include "ops/op.h"
#include "run/device.h"
#include "run/golden.h"
#include "run/prepared.h"

namespace attncheck {

struct RunOptions {
  // >1: a second launch starts from flipped poison (~bytes) in every pure output, so elements the
  // kernel never writes are found even where the poison equals the expected value; declared-
  // deterministic kernels must also repeat bitwise (launches 3.. start from the first poison).
  int repeat = 2;
  std::string arch;          // for known_bug scoping
  std::string kernels_path;  // for the repro line
  std::string repro_extra;   // appended to the repro line (e.g. " --cases DIR")
  // >0: after the checks, this many more launches under varying conditions (shared-memory poison
  // patterns, L2 flush, concurrent work), each compared bitwise with the first (Result::stress).
  int stress = 0;
  // After the checks pass: the op's metamorphic relations (run/invariance.h).
  bool invariance = true;
};

struct EvalContext {
  // Kernel mode when set: the kernel's outputs are compared with the golden (when its input
  // digests match and golden_as_expected) or the reference. Reference mode otherwise: the
  // reference is compared with the golden.
  const DeviceRunner* device = nullptr;
  GoldenStore* goldens = nullptr;
  bool golden_as_expected = true;
  // Reference mode: a case of a golden tier whose golden is missing is an error, unless the user
  // asked for reference-vs-nothing (--allow-missing-goldens).
  bool require_goldens = true;
  std::string no_kernel_reason;  // reference mode: why no kernel runs, for the messages
  RunOptions options;
  // Set when the process runs the same cases against several libraries (run/prepared.h): their
  // problems and default budgets are made once and kept.
  PreparedCases* prepared = nullptr;
};

// What a case saw, for repro bundles: the problem as handed to the kernel (initial contents), the
// expected outputs and the first launch's outputs (or, in reference mode, the recomputed
// reference).
struct CaseArtifacts {
  bool present = false;  // the problem was made
  Problem problem;
  TensorMap expected;
  TensorMap actual;
};

Result evaluate(const Case& c, const EvalContext& ctx, CaseArtifacts* artifacts = nullptr);

// A case whose worker process died or hung before reporting: failed in kernel mode (the kernel is
// the prime suspect), error in reference mode (the harness itself broke).
Result lost_case_result(const Case& c, Mode mode, const RunOptions& opt, const std::string& what);

std::string repro_command(const Case& c, const RunOptions& opt);

// A copy of `p` whose pure outputs start from the bitwise complement of their initial bytes (other
// arguments sharing those storages keep their bytes).
Problem with_flipped_poison(const Problem& p);

// compute-sanitizer (`attncheck run --sanitizer TOOL`): the finding lines of a report ("=========
// Invalid __global__ read of size 4 bytes", "========= Error: Race reported between ...",
// "========= Uninitialized __global__ memory read ..."), without banners, summaries and the
// indented detail lines under each finding.
std::vector<std::string> sanitizer_findings(const std::string& report);
// Fails `r` (or prefixes its failure) with the first finding of a sanitizer report of its case.
void apply_sanitizer_report(Result& r, const std::string& report, const std::string& tool,
                            const std::string& path);

// Checks of `actual` outputs against `expected` per the op's checks.
std::vector<CheckResult> check_outputs(const std::vector<OutputCheck>& checks,
                                       const TensorMap& expected, const TensorMap& actual);

}  // namespace attncheck
