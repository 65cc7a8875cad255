// One case, end to end: generate, reference (or golden), kernel, checks, verdict.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "run/device.h"

namespace attncheck {

enum class Verdict {
  passed,  // every check within budget
  failed,  // a check failed, the kernel crashed, refused a valid case or ran an invalid one
  refused_as_expected,  // invalid configuration, refused by reference and kernel
  known_bug,            // failed, and the case carries a known_bug mark for this arch
  unexpected_pass,      // passed although marked known_bug for this arch
  skipped,              // no kernel check (no GPU / op not in the library); reason in message
  error,                // the harness itself could not run the case (bad case, I/O)
};
std::string_view verdict_name(Verdict v);
bool verdict_is_failure(Verdict v);  // failed, error

struct Timings {
  double generate_ms = 0;
  double reference_ms = 0;
  double kernel_ms = 0;  // wall time of the first launch
};

struct Result {
  std::string id;
  std::string op;
  Params params;
  Verdict verdict = Verdict::error;
  std::string
      mode;  // "kernel" (kernel vs reference/golden), "reference" (reference vs golden), "none"
  std::string message;
  std::vector<CheckResult> checks;
  Timings timings;
  std::string arch;
  std::string repro;  // one-line command that reruns this case
  // The launch returned ATTNCHECK_ERROR or device I/O failed: the GPU context may be unusable
  // (sticky faults), so a worker process starts afresh before the next case.
  bool device_error = false;
  nlohmann::json to_json() const;
};

struct RunOptions {
  // >1: a second launch starts from flipped poison (~bytes) in every pure output, so elements the
  // kernel never writes are found even where the poison equals the expected value; declared-
  // deterministic kernels must also repeat bitwise (launches 3.. start from the first poison).
  int repeat = 1;
  std::string arch;          // for known_bug scoping
  std::string kernels_path;  // for the repro line
  std::string repro_extra;   // appended to the repro line (e.g. " --cases DIR")
};

// What a kernel-mode case saw, for repro bundles: the problem as handed to the kernel (initial
// contents), the expected outputs and the first launch's outputs.
struct CaseArtifacts {
  Problem problem;
  TensorMap expected;
  TensorMap actual;
};

// expected_override: golden outputs to compare against instead of running the reference.
// artifacts: filled as far as the case got (problem, expected, actual).
Result run_case(const Op& op, const Case& c, const DeviceRunner* device, const RunOptions& opt,
                const TensorMap* expected_override = nullptr, CaseArtifacts* artifacts = nullptr);

// Turns failed into known_bug and passed into unexpected_pass when the case carries a known_bug
// mark whose arch regex matches `arch`.
void apply_known_bug(Result& r, const Case& c, const std::string& arch);

// A copy of `p` whose pure outputs start from the bitwise complement of their initial bytes (other
// arguments sharing those storages keep their bytes).
Problem with_flipped_poison(const Problem& p);

// JSON has no NaN or infinity: they are written as the strings "nan", "inf", "-inf".
nlohmann::json json_number(double v);

// Checks of `actual` outputs against `expected` per the op's checks (shared by kernel and golden
// paths).
std::vector<CheckResult> check_outputs(const std::vector<OutputCheck>& checks,
                                       const TensorMap& expected, const TensorMap& actual);

std::string repro_command(const Case& c, const RunOptions& opt);

}  // namespace attncheck
