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
  nlohmann::json to_json() const;
};

struct RunOptions {
  int repeat = 1;            // >1: declared-deterministic kernels must repeat bitwise
  std::string arch;          // for known_bug scoping
  std::string kernels_path;  // for the repro line
};

// expected_override: golden outputs to compare against instead of running the reference.
Result run_case(const Op& op, const Case& c, const DeviceRunner* device, const RunOptions& opt,
                const TensorMap* expected_override = nullptr);

// Checks of `actual` outputs against `expected` per the op's checks (shared by kernel and golden
// paths).
std::vector<CheckResult> check_outputs(const std::vector<OutputCheck>& checks,
                                       const TensorMap& expected, const TensorMap& actual);

std::string repro_command(const Case& c, const RunOptions& opt);

}  // namespace attncheck
