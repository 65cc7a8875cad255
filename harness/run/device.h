// The GPU side of a run, seen from a harness that never includes HIP: a kernel library loaded at
// run time (kernels_under_test/attncheck_abi.h) and a runner that gives each host storage a device
// buffer with guard bytes on both sides, launches, copies everything back and reports what the
// kernel touched that it must not have.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "attncheck_abi.h"
#include "ops/op.h"

namespace attncheck {

class DeviceBlockCache;
class PinnedStaging;

// A string a kernel library wrote into a buffer of `size` bytes (device name, arch, a message):
// its bytes up to the first NUL or the buffer's end (a library that fills the buffer without a
// NUL must not make the harness read past it), with invalid UTF-8 replaced by U+FFFD, since it
// ends up in JSON and HDF5 attributes.
std::string abi_text(const char* buf, size_t size);
template <size_t N>
std::string abi_text(const char (&buf)[N]) {
  return abi_text(buf, N);
}
// A string a library returned (library name, entry list, contract, properties), read up to its
// NUL but never more than `max` bytes; one with no NUL within them comes back truncated, with
// " ... (not NUL-terminated within N bytes)" appended, and *terminated false. NULL: "".
std::string abi_returned_text(const char* s, size_t max, bool* terminated = nullptr);

struct DeviceInfo {
  std::string name;
  std::string arch;  // "gfx942", "sm_90"
};

class KernelLibrary {
 public:
  // Throws std::runtime_error naming the path (missing file, missing symbol, ABI mismatch).
  // "py:<module>" opens the Python bridge (docs/bridge.md) with that adapter module.
  static std::unique_ptr<KernelLibrary> open(const std::string& path);
  ~KernelLibrary();
  KernelLibrary(const KernelLibrary&) = delete;
  KernelLibrary& operator=(const KernelLibrary&) = delete;

  const attncheck_plugin_v1& api() const { return *api_; }
  // The optional extension table (attncheck_plugin_ext_v1_get), or nullptr.
  const attncheck_plugin_ext_v1* extension() const { return ext_; }
  const std::string& path() const { return path_; }
  // The table's `library` string, read at open (abi_returned_text); "?" when NULL.
  const std::string& library() const { return name_; }
  // The kernel entries the library lists (no GPU needed).
  const std::vector<std::string>& entries() const { return entries_; }
  bool has_entry(const std::string& entry) const;
  // The arithmetic contract the library declares for `entry` (extension table, `contract`), as
  // written; "" when it declares none (no extension, an older table, NULL): the default contract.
  // Asked once per entry and kept (the answer must stay valid while the library is loaded): a
  // query waits for the launch lock, which other threads hold over whole launches.
  std::string declared_contract(const std::string& entry) const;
  // The invariance properties the library declares for `entry` (extension table, `properties`),
  // as written; empty when it declares none.
  std::vector<std::string> declared_properties(const std::string& entry) const;
  // The partial contract the library declares for `entry` (extension table, `partial`), as the
  // JSON text it wrote; "" when it declares none (run/partial.h reads and checks it).
  std::string declared_partial(const std::string& entry) const;
  // nullopt when there is no usable device; `why` gets the library's message.
  std::optional<DeviceInfo> device(std::string* why = nullptr) const;
  // Whether the library may be called from several threads, one call at a time (extension table,
  // `any_thread`): a worker then runs cases in threads that share it (run/worker.h).
  bool any_thread() const;

  // Held by a thread over one launch's calls, from its first allocation to its last copy back
  // (DeviceRunner): launches of different threads never interleave in the library or on the GPU,
  // so nothing of another case is live on the device while a kernel runs, and the case context
  // and shared-memory poison a launch set are the ones its kernel sees. Recursive: releases made
  // inside a launch lock again. One lock for every library of the process: libraries loaded side
  // by side (a worker running several mutant libraries) share the process's GPU context.
  std::unique_lock<std::recursive_mutex> exclusive() const {
    return std::unique_lock<std::recursive_mutex>(launch_mutex());
  }
  // A launch of the calling thread ended in a device error (ATTNCHECK_ERROR, or a failed
  // allocation or copy); called while holding exclusive(). The first such thread is kept: a
  // fault leaves the context unusable, and other threads' later launches fail because of it.
  void note_device_error() const;
  // Whether the calling thread's launch was the process's first to end in a device error (of any
  // library: the context is the process's).
  bool first_device_error_was_mine() const;
  // Whether any launch of this process ended in a device error (its context may be broken).
  bool device_error_seen() const;

 private:
  KernelLibrary() = default;
  void* handle_ = nullptr;
  const attncheck_plugin_v1* api_ = nullptr;
  const attncheck_plugin_ext_v1* ext_ = nullptr;
  std::string path_;
  std::string name_;
  std::vector<std::string> entries_;
  // What declared_contract / declared_properties asked the library, per entry.
  std::string declared(std::map<std::string, std::string>& asked, const std::string& entry,
                       const std::function<const char*()>& ask) const;
  mutable std::mutex declared_mutex_;
  mutable std::map<std::string, std::string> contracts_, properties_, partials_;
  static std::recursive_mutex& launch_mutex();
  static std::optional<std::thread::id> first_device_error_;  // guarded by launch_mutex()
};

struct DeviceOutcome {
  int status = ATTNCHECK_OK;
  std::string message;                  // the kernel's message on refusal or error
  TensorMap outputs;                    // output and inout views, read back
  std::vector<std::string> violations;  // guards, untouched bytes, modified inputs
  double wall_ms = 0;
};

// What else happens around one launch (the stress mode varies these; docs/verification.md V12b).
struct LaunchConditions {
  bool flush_l2 = false;       // overwrite a 512 MiB scratch buffer between the uploads and the
                               // launch, so the kernel starts with its inputs evicted from L2
  uint32_t background_us = 0;  // concurrent work on another stream during the launch
  // The shared-memory poison the library applies in this launch ($ATTNCHECK_SMEM_POISON's
  // values, docs/abi.md: "0x7FFF7FFF", "off", ...); empty: the run's setting.
  std::string smem_poison;
};

// Where the launches' time went since the last take_timings() (the case's Timings).
struct LaunchTimings {
  double upload_ms = 0;    // allocations and host-to-device copies
  double launch_ms = 0;    // the library's run(), every launch
  double download_ms = 0;  // device-to-host copies and releases
  double guards_ms = 0;    // guard bytes and bytes the kernel must not write
  double locked_ms = 0;    // held the launch lock (inside the three above and the launches)
  int launches = 0;
};

class DeviceRunner {
 public:
  explicit DeviceRunner(const KernelLibrary& lib, std::string arch = "");
  ~DeviceRunner();
  DeviceRunner(const DeviceRunner&) = delete;
  DeviceRunner& operator=(const DeviceRunner&) = delete;
  // One launch of the problem's kernel. Device I/O failures (allocation, copies) come back as
  // status ATTNCHECK_ERROR, never as exceptions.
  DeviceOutcome run(const Problem& p, const LaunchConditions& when = {}) const;
  // Whether the library can produce these conditions (its extension table has fill / background).
  bool can_flush_l2() const;
  bool can_run_background() const;
  // Whether the library offers graph capture (extension table: graph_capture, graph_replay,
  // graph_release; docs/abi.md "Graph capture").
  bool can_capture_graphs() const;
  // Graph replay (run/graph_replay.h): captures the launch of `captured` into a graph, uploads
  // the contents of `replayed` (same arguments, shapes and strides; its own storages) into the
  // same device buffers, replays the graph, and reads back and checks like run(). Status
  // ATTNCHECK_UNSUPPORTED: the library cannot capture this entry (message: why).
  DeviceOutcome replay(const Problem& captured, const Problem& replayed) const;
  // Mean device time per launch (ms), via the library's timer.
  double time(const Problem& p, int warmup, int iters, std::string* err) const;
  const KernelLibrary& library() const { return lib_; }
  const std::string& arch() const { return arch_; }
  // The launches' timings since the last call, and a fresh start.
  LaunchTimings take_timings() const { return std::exchange(timings_, LaunchTimings{}); }

  static constexpr size_t kGuardBytes = 4096;

 private:
  DeviceOutcome run_unguarded(const Problem& p, const LaunchConditions& when) const;
  void prepare_launch(const LaunchConditions& when) const;
  const KernelLibrary& lib_;
  std::string arch_;
  mutable void* l2_scratch_ = nullptr;  // allocated on the first flush
  mutable LaunchTimings timings_;
  // Device buffers kept from one launch for the next (every byte is uploaded again each time).
  std::unique_ptr<DeviceBlockCache> blocks_;
  // The page-locked host buffer uploads and read-backs are staged through (device.cpp).
  std::unique_ptr<PinnedStaging> pinned_;
};

// How long a device allocation or fill that failed for lack of memory is tried again
// ($ATTNCHECK_DEVICE_MEMORY_WAIT_S, default 10 s; device.cpp). Throws std::invalid_argument naming
// the variable for a value that is not seconds from 0 to 3600.
double device_memory_wait_s();

// The byte the guard region holds at position i (a pattern no plausible kernel write reproduces).
std::byte guard_byte(size_t i);

// The 32-bit pattern that fills the device bytes a sparse storage's host window does not cover:
// the NaN code of the storage's dtype, repeated (fp8 e4m3fn 0x7F, e4m3fnuz 0x80, bf16 0x7FC0, ...;
// integer dtypes 0xFF bytes, i.e. -1).
uint32_t sparse_poison_pattern(DType dtype);

}  // namespace attncheck
