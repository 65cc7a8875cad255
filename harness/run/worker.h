// The process that runs cases (`attncheck worker`, started by `run`; also used in-process by `run
// --in-process` and `repro`): it loads the case files, the goldens and the kernel library once,
// then turns case ids into Results through evaluate() (run/evaluate.h).
//
// Protocol (run/pool.h): one hello line, then per case id read from stdin one line
// {"result": <Result JSON>, "retire": bool}. retire: the launch hit a device error that may have
// left the GPU context unusable; the worker exits after this line and the parent hands the next
// case to a fresh worker (never to this one).
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "run/cases.h"
#include "run/device.h"
#include "run/evaluate.h"
#include "run/golden.h"

namespace attncheck {

struct WorkerConfig {
  std::string cases_dir, golden_dir, kernels, arch, repro_dir, repro_extra;
  int repeat = 2;
  // Run without goldens where they are missing (reference vs nothing), instead of an error.
  bool allow_missing_goldens = false;
  int stress = 0;  // RunOptions::stress
};

struct CaseContext {
  std::vector<CaseFile> files;
  std::unique_ptr<KernelLibrary> lib;
  std::optional<DeviceInfo> device;
  std::unique_ptr<DeviceRunner> runner;
  std::unique_ptr<GoldenStore> goldens;
  EvalContext eval;  // points into the members above
  std::string repro_dir;
};

// Loads case files, goldens, the kernel library and the device. Throws std::runtime_error with one
// clear line: a bad case file, a golden directory that does not exist (unless allowed), a kernel
// library that cannot be loaded, or --kernels given with no usable GPU.
std::unique_ptr<CaseContext> make_context(const WorkerConfig& cfg);

// The case's Result; a repro bundle is written (and named in the Result) for a failing case when
// the context has a repro directory. An unknown id is an error Result naming the nearest ids.
Result run_case_id(CaseContext& ctx, const std::string& id);

// The hello line's payload: pid, kernels, library, device, device_arch, arch, entries, mode,
// no_device.
nlohmann::json context_hello(const CaseContext& ctx);

// `attncheck worker`: hello, then one result line per case id read from stdin, until EOF.
int worker_main(const WorkerConfig& cfg);

// The ids of `files` closest to `id` by edit distance (at most `n`), for "did you mean".
std::vector<std::string> nearest_case_ids(const std::vector<CaseFile>& files, const std::string& id,
                                          size_t n = 5);

}  // namespace attncheck
