// The process that runs cases (`attncheck worker --config JSON`, started by `run`, `mutants` and
// the shrinker; also used in-process by `run --in-process`, `shrink --in-process` and `repro`): it
// loads the goldens and the kernel library once, then turns each Case it is sent into a Result
// through run_case and evaluate() (run/evaluate.h), and does nothing else to it.
//
// The boundary with the parent is typed on both sides and crossed once each way as JSON: the
// parent's WorkerConfig travels as one object (--config, WorkerConfig::to_json / from_json), the
// worker answers with one WorkerHello, then per request ({"seq", "id", "case": case_to_json,
// core/case_json.h}) one line {"seq", "id", "result": Result::to_json, "retire": bool}
// (run/pool.h). retire: the launch hit a device error that may have left the GPU context unusable;
// the worker exits after this line and the parent hands the next case to a fresh worker (never to
// this one).
//
// Several libraries (`attncheck mutants`): a request may name another kernel library
// ("kernels": path). The worker opens each such library once, beside its own, in the same process
// and GPU context (one launch lock for all of them, run/device.h). Each thread keeps a runner for
// the library of its last case, and takes, of the requests waiting, the oldest for that library;
// else the oldest for a library no other thread runs; else the oldest: a runner made anew for
// another library starts with no device blocks kept (run/device.cpp).
//
// Threads (WorkerConfig::threads > 1, when the kernel library allows calls from any thread,
// docs/abi.md): the worker runs that many cases at once, each thread with its own DeviceRunner,
// sharing the library, its one GPU context and the goldens; answers come in the order cases end,
// matched to requests by seq. A launch's device calls hold the library's launch lock, so nothing
// of another case is live on the GPU while a kernel runs. What cannot be pinned on one case is
// not: a case whose launch failed only because another case's fault broke the context, a
// request that arrives after the worker decided to retire, and processes left running while
// other cases ran are answered {"requeue": why, "isolate": bool} instead of a result, and the
// parent runs the case again (alone in its worker when isolate).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "core/case_json.h"
#include "run/cases.h"
#include "run/device.h"
#include "run/evaluate.h"
#include "run/golden.h"

namespace attncheck {

// Everything a worker is told, as one value: built by the parent, sent as JSON, read back whole.
struct WorkerConfig {
  std::string cases_dir;    // only in process (run_case_id reads case files); workers get Cases
  std::string golden_dir;   // absolute in a worker's config
  std::string kernels;      // library path, py:<module>, or "" (reference mode)
  std::string arch;         // known-bug scope override ("" = the device's)
  std::string repro_dir;    // repro bundles of failing cases ("" = none)
  std::string repro_extra;  // appended to repro lines (" --cases DIR --golden DIR")
  int repeat = 2;
  // Run without goldens where they are missing (reference vs nothing), instead of an error.
  bool allow_missing_goldens = false;
  int stress = 0;  // RunOptions::stress
  // Loading the kernel library (a Python adapter's import, a library's constructors) and the
  // device may take this long; past it the process reports what hung and exits. 0: no limit.
  double import_timeout_s = 120;
  // Golden files the parent checked (GoldenStore::trust_checked): op -> stamp.
  std::map<std::string, std::string> golden_checked;
  // Cases at once in threads (see above); 1 when the library does not allow calls from any
  // thread or the stress mode runs (its background work and L2 flushes are device-wide).
  int threads = 1;

  // One JSON object holding every field above.
  nlohmann::json to_json() const;
  // Reads what to_json writes; a field left out keeps its default. Throws std::invalid_argument
  // naming the field that has the wrong type, and any field the config does not have.
  static WorkerConfig from_json(const nlohmann::json& j);
};

// A worker's first line, {"hello": ...}: what it loaded and how it runs cases. The parent parses it
// once (from_json) and reads these fields (the pool, which runs any worker, reads only its
// `threads`); the repro bundles keep it as metadata (to_json).
struct WorkerHello {
  int64_t pid = 0;
  std::string kernels;               // the config's kernels
  std::string library;               // the library's own name and version
  std::vector<std::string> entries;  // the library's entries
  std::string device, device_arch;   // "" without a device
  std::string arch;                  // for known-bug marks: the config's, else the device's
  bool kernel_mode = false;          // "mode": "kernel", else "reference"
  std::string no_device;             // reference mode: why no kernel runs
  int threads = 1;                   // cases at once
  std::string threads_why;           // why fewer than asked ("" when as asked)

  // "hip" for a gfx arch, "cuda" for an sm_ one, else "cpu".
  std::string backend() const;
  nlohmann::json to_json() const;
  // Throws std::invalid_argument naming the field that is missing or of the wrong type.
  static WorkerHello from_json(const nlohmann::json& j);
};

struct CaseContext {
  std::vector<CaseFile> files;
  std::unique_ptr<KernelLibrary> lib;
  std::optional<DeviceInfo> device;
  std::unique_ptr<DeviceRunner> runner;
  std::unique_ptr<GoldenStore> goldens;
  EvalContext eval;  // points into the members above
  std::string repro_dir;
  int threads = 1;          // cases at once (WorkerConfig::threads, as the library allows)
  std::string threads_why;  // why fewer than asked, in words ("" when as asked)
  // Libraries requests named besides `lib` (see above), by path; opened on first use and kept.
  std::map<std::string, std::unique_ptr<KernelLibrary>> more_libs;
  std::mutex more_libs_mutex;
  PreparedCases prepared;  // cases made once for every library's launch (run/prepared.h)
};

// The library a request names: ctx.lib for "" or the worker's own path, else one of
// ctx.more_libs, opened now if it is not yet. Throws std::runtime_error naming the path: no
// device in this worker, a py: adapter (the bridge is one per process), a library that cannot be
// loaded, sees another device, or (threads > 1) does not declare calls from any thread.
const KernelLibrary& library_for(CaseContext& ctx, const std::string& path);

// Loads the case files (only when cfg.cases_dir is set: run_case_id needs them), the goldens, the
// kernel library and the device. Throws std::runtime_error with one clear line: a bad case file,
// a golden directory that does not exist (unless allowed), a kernel library that cannot be
// loaded, or --kernels given with no usable GPU.
std::unique_ptr<CaseContext> make_context(const WorkerConfig& cfg);

// make_context within cfg.import_timeout_s: past it, `report` gets "adapter <name> did not finish
// importing within N s ..." (or the kernel library's path) and the process exits with status 2,
// since a hung import cannot be interrupted.
std::unique_ptr<CaseContext> make_context_within_limit(
    const WorkerConfig& cfg, const std::function<void(const std::string&)>& report);

// The case's Result; a repro bundle is written (and named in the Result) for a failing case when
// the context has a repro directory.
Result run_case(CaseContext& ctx, const Case& c);
// The same on one of the worker's threads: `eval` is that thread's (its own DeviceRunner).
Result run_case(CaseContext& ctx, const EvalContext& eval, const Case& c);

// The case's Result; a repro bundle is written (and named in the Result) for a failing case when
// the context has a repro directory. An unknown id is an error Result naming the nearest ids.
Result run_case_id(CaseContext& ctx, const std::string& id);

// The hello of this context (its JSON: pid, kernels, library, device, device_arch, arch, entries,
// mode, no_device, threads, and threads_why when fewer than asked).
WorkerHello context_hello(const CaseContext& ctx);

// A kernel library loaded in a process of its own (`attncheck load-library`), before a command
// loads it in its own process (`kernels`, `repro`, `bench`): what can end or stall a process
// while a library loads (a constructor that crashes, hangs or exits, a NULL function in its table,
// a device query that hangs) ends that process instead, and comes back here as a
// std::runtime_error naming the library's path and the reason. Returns {"library", "entries",
// and with `with_device`, "device" and "arch", or "no_device": the library's reason}. Past
// `timeout_s` (the import limit) the load is reported as hung.
nlohmann::json load_library_isolated(const std::string& kernels, bool with_device,
                                     double timeout_s);

// `attncheck load-library`: loads the library (and asks for the device), writes one line,
// {"hello": {...}} or {"fatal": why}, and exits.
int load_library_main(const std::string& kernels, bool with_device, double timeout_s);

// `attncheck worker`: hello, then one answer per request, until the end of the requests.
int worker_main(const WorkerConfig& cfg);

// The ids of `files` closest to `id` by edit distance (at most `n`), for "did you mean".
std::vector<std::string> nearest_case_ids(const std::vector<CaseFile>& files, const std::string& id,
                                          size_t n = 5);

}  // namespace attncheck
