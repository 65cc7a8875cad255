// Running one case the way `attncheck run` does, shared by the worker process and `repro`:
//   kernel mode   (a library with a device and this op): kernel vs golden when the golden's input
//                 digests match, else vs the reference;
//   reference mode (no library, no device, or the library lacks the op): reference vs golden, or
//                 the reference alone when the case has no golden; the kernel check is reported
//                 as skipped with the reason.
#pragma once
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "run/cases.h"
#include "run/device.h"
#include "run/golden.h"
#include "run/runner.h"

namespace attncheck {

struct CaseContext {
  std::vector<CaseFile> files;
  std::unique_ptr<KernelLibrary> lib;
  std::optional<DeviceInfo> device;
  std::string no_device_reason;  // why there is no kernel check
  std::string arch;              // known-bug scope: --arch, else the device's
  std::unique_ptr<GoldenStore> goldens;
  RunOptions options;
  bool golden_as_expected = true;  // kernel mode: compare with the golden when valid
};

struct WorkerConfig {
  std::string cases_dir, golden_dir, kernels, arch, repro_dir, repro_extra;
  int repeat = 2;
};

// Loads case files, the kernel library and the device. Throws with a clear message.
CaseContext make_context(const WorkerConfig& cfg);

struct CaseOutcome {
  Result result;
  CaseArtifacts artifacts;
  bool has_artifacts = false;
  std::string expected_from;   // "golden" | "reference" | ""
  std::string kernel_skipped;  // reason, when the kernel was not checked
  nlohmann::json to_json() const;
};
CaseOutcome run_one(CaseContext& ctx, const Case& c);

// The hello line's payload: pid, library, device, arch, ops, no_device.
nlohmann::json context_hello(const CaseContext& ctx);

// `attncheck worker`: hello, then one result line per case id read from stdin, until EOF.
int worker_main(const WorkerConfig& cfg);

}  // namespace attncheck
