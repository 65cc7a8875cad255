// A fake kernel library for CPU tests of the harness: it implements the plugin ABI
// (kernels_under_test/attncheck_abi.h) with malloc'd "device" memory, and its "kernels" run the
// op's own reference on the bytes they are handed, so every registered op passes unless a fault is
// injected. The faults are the silent-failure classes the harness must report:
//
//   guard_after     write the first byte after the buffer (into the harness's trailing guard)
//   guard_before    write the last byte before the buffer (leading guard)
//   past_view       write the element just past the first output view (inside the storage)
//   modify_input    flip a byte of the first input
//   unwritten       leave the last element of the first output unwritten
//   nan             write a NaN into the first element of the first floating output
//   nondeterministic  flip the lowest bit of one output element on every second launch
//   refuse          refuse a valid configuration
//   run_invalid     run an invalid configuration (the reference refuses it) instead of refusing
//   error           report a device error (ATTNCHECK_ERROR: the worker retires)
//   host_error      report an exception in the entry's host code (ATTNCHECK_HOST_ERROR)
//   abort, segfault, hang   crash or never return (for the worker-isolation tests)
//   fork            fork(); both copies return from the launch (the child into the harness)
//   spawn_and_hang  start `sleep 300` (its pid appended to $ATTNCHECK_FAKE_PID_FILE), then hang
//   detach          start `setsid sleep $ATTNCHECK_FAKE_SLEEP` (a session of its own), then run
//   detach_and_hang start it through `setsid -f` (a double fork), then hang
//   forge           write forged worker-protocol lines to fd 1 and to every pipe or socket
//                   descriptor of the process
//   beyond_default   (ops whose budgets depend on the arithmetic contract) move element 0 of the
//                    first output halfway between the default budget's limit and the limit of
//                    the contract $ATTNCHECK_FAKE_FAULT_CONTRACT (default: the declared one)
//   beyond_contract  move it to twice that contract's limit (outside both)
//   batch_of_one     flip the lowest bit of element 0 of the first output when that output's dim 0
//                    is 1 (a batch of one request): a kernel whose result depends on the batch,
//                    far within every budget
//   guard_before_at  write byte -$ATTNCHECK_FAKE_GUARD_BYTE of the leading guard (1 is the last
//                    byte before the buffer, DeviceRunner::kGuardBytes the first)
//   gap_in_view      write the first byte inside the first output's extent that none of its
//                    elements covers (the gap between the rows of a strided view)
//   write_then_refuse  (an invalid configuration) flip a byte of the first input, then refuse
//
// Graph capture (docs/abi.md "Graph capture") records the call and replays it on the buffers'
// current contents, as a correct capture would; $ATTNCHECK_FAKE_GRAPH, read at each call, varies
// it: "bake" replays with the input contents the capture saw (a wrapper that read its metadata on
// the host at capture), "off" answers unsupported. $ATTNCHECK_FAKE_EXT_SIZE=before_graph, read
// when the extension table is fetched, returns a table that ends before the graph fields (a
// library built against the older table); =before_copy_within one that ends before
// copy_within_device (the harness then uploads every storage with its own copy).
//
// $ATTNCHECK_FAKE_CONTRACT, when set, is the arithmetic contract every entry declares through the
// extension table's `contract` (passed through unchecked, so a test can declare a bad name);
// unset, the library declares none (the default).
// $ATTNCHECK_FAKE_PROPERTIES, when set, is the invariance property list every entry declares
// through the extension table's `properties` (passed through unchecked).
// $ATTNCHECK_FAKE_PARTIAL, when set, is the partial contract every entry declares through the
// extension table's `partial` (passed through unchecked), and the kernel keeps it: it leaves a
// not-produced output and the elements of an unspecified region (the op's in_region) unwritten.
// With $ATTNCHECK_FAKE_PARTIAL_WRITES=1 it writes them all the same (a kernel that breaks its
// declaration).
//
// A fault is selected by the kernel parameter "fault", by the library's file name
// (libattncheck_kernels_mutant_<fault>.so: a copy of this library), or by $ATTNCHECK_FAKE_FAULT,
// optionally only for launches whose kernel parameters contain every key/value of the JSON object
// in $ATTNCHECK_FAKE_FAULT_WHEN. $ATTNCHECK_FAKE_ARCH sets the reported arch (default "fake-cpu");
// $ATTNCHECK_FAKE_NO_DEVICE=1 makes the library report no device; $ATTNCHECK_FAKE_OMIT (comma-
// separated entries) leaves entries out of its list; $ATTNCHECK_FAKE_STICKY_ERROR=1 makes an
// injected "error" break the process's context (every later launch fails, as on a GPU);
// $ATTNCHECK_FAKE_ALLOC_FAILS=N fails the process's first N allocations with "out of memory" (a
// GPU whose memory other processes hold for a moment), or with $ATTNCHECK_FAKE_ALLOC_MESSAGE. It
// lists entries as a real library does.
//
// The kernel rebuilds the op's Problem from the arguments it is handed: dtypes from DLPack, where
// uint8 is an fp8 format ("fp8_format" parameter, else the op's default case) unless the op's
// default case has a raw uint8 buffer of that name; roles from the op's default case. It refuses
// what the op calls invalid (the ABI's case context) and what the reference rejects on those
// bytes and parameters.
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "attncheck_abi.h"
#include "core/numeric.h"
#include "ops/op.h"
#include "run/device.h"

namespace {

using namespace attncheck;

// $ATTNCHECK_FAKE_UNTERMINATED=1: every string buffer (device name, arch, messages) is filled to
// its last byte with the text repeated and no terminating NUL, as the ABI's length allows; the
// contract and properties strings are 5000 bytes before their NUL.
void put(char* dst, size_t n, const std::string& s) {
  if (!dst || !n) return;
  if (std::getenv("ATTNCHECK_FAKE_UNTERMINATED") && !s.empty()) {
    for (size_t i = 0; i < n; ++i) dst[i] = s[i % s.size()];
    return;
  }
  std::snprintf(dst, n, "%s", s.c_str());
}

std::mutex g_mutex;
Params g_case_params = Params::object();  // the last case context (guarded by g_mutex)
std::string g_case_invalid;               // its "invalid": the op's refusal reason, or empty
std::map<std::byte*, size_t> g_allocs;    // base -> bytes
int g_calls = 0;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// $ATTNCHECK_FAKE_FAREWELL: printed on stderr as the library is unloaded (the worker's exit), after
// its last answer: what a worker says on its way out must still reach worker.log.
// $ATTNCHECK_FAKE_TIMELINE=1: "fake library: loaded by <pid>" as the library is loaded, the order
// in which workers start (with $ATTNCHECK_FAKE_SLOW_WHEN, below).
// $ATTNCHECK_FAKE_LOAD, how loading the library goes wrong: "segfault", "hang" or "exit" (_exit(0))
// in its constructor, "null_table" (a table whose run and roofline are NULL), "hang_device"
// (device_info never returns).
struct Farewell {
  Farewell() {
    const char* load = std::getenv("ATTNCHECK_FAKE_LOAD");
    const std::string how = load ? load : "";
    if (how == "segfault") ::raise(SIGSEGV);
    if (how == "exit") ::_exit(0);
    if (how == "hang")
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    if (std::getenv("ATTNCHECK_FAKE_TIMELINE")) {
      std::fprintf(stderr, "fake library: loaded by %d\n", static_cast<int>(::getpid()));
      std::fflush(stderr);
    }
  }
  ~Farewell() {
    if (const char* text = std::getenv("ATTNCHECK_FAKE_FAREWELL")) {
      std::fprintf(stderr, "%s\n", text);
      std::fflush(stderr);
    }
  }
} g_farewell;

// Forged answers ({"fatal"}, a result for another id) on fd 1 and every pipe or socket.
void forge_protocol_lines() {
  const std::string lines =
      "{\"fatal\": \"forged by the fake library\"}\n"
      "{\"seq\": 1, \"id\": \"page_indices/forged\", \"result\": {\"id\": "
      "\"page_indices/forged\", \"verdict\": \"passed\"}, \"retire\": false}\n";
  for (int fd = 1; fd < 64; ++fd) {
    char link[64], target[256];
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t n = ::readlink(link, target, sizeof target - 1);
    if (n <= 0) continue;
    const std::string t(target, static_cast<size_t>(n));
    if (fd == 1 || t.rfind("pipe:", 0) == 0 || t.rfind("socket:", 0) == 0) [[maybe_unused]]
      auto w = ::write(fd, lines.data(), lines.size());
  }
}

// A copy of this library whose file is named ..._mutant_<fault>.so injects <fault> into every
// launch (after a "fault" kernel parameter): mutant libraries side by side in one process, each
// with a fault of its own (`attncheck mutants`), where the environment is the process's.
std::string fault_of_file_name() {
  static const std::string fault = [] {
    Dl_info info{};
    if (!::dladdr(reinterpret_cast<void*>(&fault_of_file_name), &info) || !info.dli_fname)
      return std::string();
    const std::string stem = std::filesystem::path(info.dli_fname).stem().string();
    const auto at = stem.find("_mutant_");
    return at == std::string::npos ? std::string() : stem.substr(at + 8);
  }();
  return fault;
}

// Whether the kernel parameters contain every key/value of the JSON object in `when` ("" matches
// every launch).
bool params_match(const nlohmann::json& params, const std::string& when) {
  if (when.empty()) return true;
  const auto w = nlohmann::json::parse(when);
  for (const auto& [k, v] : w.items())
    if (!params.contains(k) || params[k] != v) return false;
  return true;
}

// The injected fault for this launch, or "".
std::string fault_for(const nlohmann::json& params) {
  if (params.contains("fault") && params["fault"].is_string()) return params["fault"];
  if (const std::string named = fault_of_file_name(); !named.empty()) return named;
  const std::string f = env("ATTNCHECK_FAKE_FAULT");
  if (f.empty()) return "";
  if (!params_match(params, env("ATTNCHECK_FAKE_FAULT_WHEN"))) return "";
  // $ATTNCHECK_FAKE_FAULT_ONCE=<file>: only the run's first such launch faults (the one that
  // creates the file).
  if (const std::string once = env("ATTNCHECK_FAKE_FAULT_ONCE"); !once.empty()) {
    const int fd = ::open(once.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
    if (fd < 0) return "";
    ::close(fd);
  }
  return f;
}

std::pair<std::byte*, size_t> allocation_of(const void* p) {
  const auto* b = static_cast<const std::byte*>(p);
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_allocs.upper_bound(const_cast<std::byte*>(b));
  if (it == g_allocs.begin()) return {nullptr, 0};
  --it;
  if (b < it->first || b >= it->first + it->second) return {nullptr, 0};
  return *it;
}

std::optional<DType> dtype_of(const DLDataType& t, const std::string& fp8_format) {
  if (t.lanes != 1) return std::nullopt;
  if (t.code == kDLFloat && t.bits == 64) return DType::f64;
  if (t.code == kDLFloat && t.bits == 32) return DType::f32;
  if (t.code == kDLFloat && t.bits == 16) return DType::f16;
  if (t.code == kDLBfloat && t.bits == 16) return DType::bf16;
  if (t.code == kDLInt && t.bits == 8) return DType::i8;
  if (t.code == kDLInt && t.bits == 32) return DType::i32;
  if (t.code == kDLInt && t.bits == 64) return DType::i64;
  if (t.code == kDLUInt && t.bits == 8) {
    if (fp8_format == "e4m3fn") return DType::e4m3fn;
    if (fp8_format == "e4m3fnuz") return DType::e4m3fnuz;
    return DType::u8;
  }
  return std::nullopt;
}

// Host mirrors of the allocations the arguments live in.
struct Mirror {
  std::byte* base = nullptr;
  size_t bytes = 0;
  std::shared_ptr<Storage> host;
};

// The mirrors' bytes written back to the "device".
void write_back(const std::vector<Mirror>& mirrors) {
  for (const auto& m : mirrors) std::memcpy(m.base, m.host->bytes.data(), m.bytes);
}

// The op that declares this kernel entry.
const Op* op_for_kernel(const std::string& kernel) {
  for (const Op* o : all_ops())
    for (const auto& e : o->kernel_entries())
      if (e == kernel) return o;
  return nullptr;
}

// The op's default case, made once: which dtype and role each argument name has. uint8 on the wire
// is fp8 exactly where the template's argument is fp8 (raw byte buffers stay uint8).
const Problem& template_problem(const Op& op) {
  static std::map<std::string, Problem> made;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = made.find(op.name());
  if (it == made.end()) it = made.emplace(op.name(), op.make(op.make_case(Params::object()))).first;
  return it->second;
}
// The op's typed parameters (Problem::params) for case parameters `given` (the last case
// context's, or a launch's variant of them): those of the problem the op makes for them, made
// once per parameters. The caller holds g_mutex.
const std::any& case_typed_params(const Op& op, const Params& given) {
  static std::string made_for;
  static std::any made;
  const std::string key = op.name() + given.dump();
  if (key != made_for) {
    made = op.make(op.make_case(given)).params;
    made_for = key;
  }
  return made;
}
// $ATTNCHECK_FAKE_PARTIAL as JSON (null when unset or not JSON: the harness reports the
// declaration itself).
nlohmann::json declared_partial() {
  const std::string text = env("ATTNCHECK_FAKE_PARTIAL");
  if (text.empty()) return nullptr;
  const auto j = nlohmann::json::parse(text, nullptr, false);
  return j.is_object() ? j : nlohmann::json();
}

// Whether the kernel leaves output `name` unwritten: declared not produced, and kept so.
bool leaves_unwritten(const nlohmann::json& partial, const std::string& name) {
  if (!partial.contains("not_produced") || !partial["not_produced"].is_array() ||
      env("ATTNCHECK_FAKE_PARTIAL_WRITES") == "1")
    return false;
  for (const auto& n : partial["not_produced"])
    if (n == name) return true;
  return false;
}

// write_then_refuse: the first input's first element changed on the "device" before the refusal.
void write_first_input(const Problem& p, const std::vector<Mirror>& mirrors) {
  for (const auto& a : p.args) {
    if (a.role != Role::input || a.tensor.numel() == 0) continue;
    Index zero(a.tensor.shape().size(), 0);
    a.tensor.set_bits(zero, a.tensor.get_bits(zero) ^ 1u);
    break;
  }
  write_back(mirrors);
}

// gap_in_view: the first element offset inside the view's extent that no element of the view
// has (none for a dense view: nothing is written).
void write_first_gap(const Tensor& view, std::vector<std::byte>& bytes) {
  const auto [lo, hi] = view.extent();
  std::vector<bool> covered(static_cast<size_t>(hi - lo), false);
  view.for_each_index([&](const Index& idx, int64_t) {
    covered[static_cast<size_t>(view.element_offset(idx) - lo)] = true;
  });
  const auto gap = std::find(covered.begin(), covered.end(), false);
  if (gap == covered.end()) return;
  const auto offset = (lo + (gap - covered.begin())) * static_cast<int64_t>(view.element_size());
  bytes[static_cast<size_t>(offset)] ^= std::byte{0x5A};
}

// spawn_and_hang: `sleep 300` started (its pid appended to $ATTNCHECK_FAKE_PID_FILE), then a hang.
void spawn_and_hang() {
  if (const pid_t child = ::fork(); child == 0) {
    ::execlp("sleep", "sleep", "300", static_cast<char*>(nullptr));
    ::_exit(127);
  } else if (const std::string file = env("ATTNCHECK_FAKE_PID_FILE"); !file.empty()) {
    if (FILE* f = std::fopen(file.c_str(), "a")) {
      std::fprintf(f, "%d\n", static_cast<int>(child));
      std::fclose(f);
    }
  }
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// `setsid sleep S` (S: $ATTNCHECK_FAKE_SLEEP, default 3600), a process in a session of its own;
// detach_and_hang starts it through a double fork (`setsid -f`: its parent exits at once) and
// hangs, detach returns normally.
void start_detached_sleep(const std::string& fault) {
  const std::string seconds =
      env("ATTNCHECK_FAKE_SLEEP").empty() ? "3600" : env("ATTNCHECK_FAKE_SLEEP");
  if (const pid_t child = ::fork(); child == 0) {
    if (fault == "detach")
      ::execlp("setsid", "setsid", "sleep", seconds.c_str(), static_cast<char*>(nullptr));
    else
      ::execlp("setsid", "setsid", "-f", "sleep", seconds.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  } else if (fault == "detach_and_hang") {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

// The faults on the process itself, before the launch runs: a crash, a hang, a fork, a child
// process, forged protocol lines.
void apply_process_fault(const std::string& fault) {
  if (fault == "abort") std::abort();
  if (fault == "segfault") ::raise(SIGSEGV);
  if (fault == "hang")
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  if (fault == "fork") ::fork();
  if (fault == "spawn_and_hang") spawn_and_hang();
  if (fault == "detach" || fault == "detach_and_hang") start_detached_sleep(fault);
  if (fault == "forge") forge_protocol_lines();
}

// The answer of a launch that does not run: an injected error or refusal, or a context an earlier
// error broke; nullopt for a launch that runs.
std::optional<int> injected_answer(const std::string& fault, char* msg, size_t msg_len) {
  // A real device fault breaks the process's GPU context: with $ATTNCHECK_FAKE_STICKY_ERROR every
  // later launch of the process fails too, as other threads' launches do on a GPU.
  static std::atomic<bool> context_broken{false};
  if (context_broken.load()) {
    put(msg, msg_len, "fake context broken by an earlier launch's error");
    return ATTNCHECK_ERROR;
  }
  if (fault == "error") {
    if (std::getenv("ATTNCHECK_FAKE_STICKY_ERROR")) context_broken.store(true);
    put(msg, msg_len, "fake kernel error (injected)");
    return ATTNCHECK_ERROR;
  }
  if (fault == "host_error") {
    put(msg, msg_len, "fake kernel entry threw on the host (injected)");
    return ATTNCHECK_HOST_ERROR;
  }
  if (fault == "refuse") {
    put(msg, msg_len, "fake kernel refuses (injected)");
    return ATTNCHECK_REFUSED;
  }
  return std::nullopt;
}

// $ATTNCHECK_FAKE_SLOW_WHEN (a JSON object, as $ATTNCHECK_FAKE_FAULT_WHEN): launches whose kernel
// parameters contain it take 200 ms and then say so on stderr.
void slow_launch(const nlohmann::json& params) {
  if (const std::string slow = env("ATTNCHECK_FAKE_SLOW_WHEN");
      !slow.empty() && params_match(params, slow)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::fprintf(stderr, "fake library: a slow launch of %d ends\n", static_cast<int>(::getpid()));
    std::fflush(stderr);
  }
}

// The launch's Problem before its arguments: the kernel, its parameters, and the typed parameters
// of the last case context.
Problem launch_problem(const Op& op, const char* op_name, const nlohmann::json& params) {
  Problem p;
  p.kernel_params = params;
  p.kernel = op_name;
  std::lock_guard<std::mutex> lock(g_mutex);
  Params typed = g_case_params;
  // The launch's kernel block size wins over the case's: an invariance relation re-views the
  // MLA cache at block size 1 (ops/mla_inputs.h at_block_size_one) within the same case.
  if (params.contains("kernel_block_size") && typed.contains("block_size"))
    typed["block_size"] = params["kernel_block_size"];
  p.params = case_typed_params(op, typed);
  return p;
}

// The dtype of argument `name`: DLPack's, where uint8 is fp8 ($fp8_format, or the template's
// argument's fp8 format) unless the template's argument is a raw uint8 buffer.
std::optional<DType> arg_dtype(const Problem& tmpl, const char* name, const DLDataType& t,
                               const std::string& fp8) {
  const bool raw_bytes = tmpl.has_arg(name) && tmpl.arg(name).dtype() == DType::u8;
  auto dt = dtype_of(t, raw_bytes ? "" : fp8);
  if (dt == DType::u8 && !raw_bytes && tmpl.has_arg(name) && is_fp8(tmpl.arg(name).dtype()))
    dt = tmpl.arg(name).dtype();
  return dt;
}

// The role of argument `name`: the template's, else input.
Role arg_role(const Problem& tmpl, const std::string& name) {
  return tmpl.has_arg(name) ? std::find_if(tmpl.args.begin(), tmpl.args.end(),
                                           [&](const Arg& x) { return x.name == name; })
                                  ->role
                            : Role::input;
}

// The host mirror of the allocation at `base`, made on its first argument.
const Mirror& mirror_at(std::vector<Mirror>& mirrors, std::byte* base, size_t bytes) {
  auto m =
      std::find_if(mirrors.begin(), mirrors.end(), [&](const Mirror& x) { return x.base == base; });
  if (m == mirrors.end()) {
    Mirror nm{base, bytes, std::make_shared<Storage>()};
    nm.host->bytes.assign(base, base + bytes);
    mirrors.push_back(nm);
    m = mirrors.end() - 1;
  }
  return *m;
}

// Tensor `t` of dtype `dt`, a view of the mirror `m` of its allocation (`base`, `bytes`).
Tensor mirrored_view(const DLTensor& t, DType dt, std::byte* base, size_t bytes, const Mirror& m) {
  const size_t es = dtype_size(dt);
  const auto first_byte =
      static_cast<size_t>(static_cast<const std::byte*>(t.data) - base) + t.byte_offset;
  Tensor whole = Tensor::empty(dt, {static_cast<int64_t>(bytes / es)});
  auto shared = m.host;
  if (whole.storage()->bytes.size() != shared->bytes.size()) {
    // Allocation not a multiple of the element size: widen a private mirror (never written back
    // past `bytes`).
    shared = std::make_shared<Storage>(*m.host);
    shared->bytes.resize(whole.storage()->bytes.size());
  }
  whole = whole.rebased(shared);
  Shape shape(t.shape, t.shape + t.ndim), strides(t.strides, t.strides + t.ndim);
  return whole.as_strided(shape, strides, static_cast<int64_t>(first_byte / es));
}

// The launch's arguments as p's args, views of host mirrors of their allocations; the answer for
// an argument the library cannot take, or nullopt.
std::optional<int> mirror_args(const Problem& tmpl, const std::string& fp8,
                               const attncheck_arg* args, int n_args, Problem& p,
                               std::vector<Mirror>& mirrors, char* msg, size_t msg_len) {
  for (int i = 0; i < n_args; ++i) {
    const DLTensor& t = args[i].tensor;
    const auto dt = arg_dtype(tmpl, args[i].name, t.dtype, fp8);
    if (!dt) {
      put(msg, msg_len, std::string("fake library: unsupported dtype of '") + args[i].name + "'");
      return ATTNCHECK_REFUSED;
    }
    const auto [base, bytes] = allocation_of(t.data);
    if (!base) {
      put(msg, msg_len, std::string("fake library: '") + args[i].name + "' is not device memory");
      return ATTNCHECK_ERROR;
    }
    const Mirror& m = mirror_at(mirrors, base, bytes);
    p.args.push_back(
        {args[i].name, mirrored_view(t, *dt, base, bytes, m), arg_role(tmpl, args[i].name)});
  }
  return std::nullopt;
}

// The op decides validity (the case context's "invalid"), as a wrapped kernel that checks
// nothing itself would ask it (docs/bridge.md "Validity"): the answer for an invalid case, or
// nullopt.
std::optional<int> refusal(const std::string& fault, const Problem& p,
                           const std::vector<Mirror>& mirrors, char* msg, size_t msg_len) {
  std::string invalid;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    invalid = g_case_invalid;
  }
  if (invalid.empty()) return std::nullopt;
  if (fault == "run_invalid") return ATTNCHECK_OK;
  if (fault == "write_then_refuse") write_first_input(p, mirrors);
  put(msg, msg_len, "fake kernel refuses: " + invalid);
  return ATTNCHECK_REFUSED;
}

// The op's reference outputs for p into `expected`; the answer when the reference rejects the
// arguments or fails, or nullopt.
std::optional<int> reference_outputs(const Op& op, const Problem& p, const std::string& fault,
                                     TensorMap& expected, char* msg, size_t msg_len) {
  try {
    expected = op.reference(p);
  } catch (const std::invalid_argument& e) {  // InvalidConfig, or arguments the reference rejects
    if (fault == "run_invalid") return ATTNCHECK_OK;
    put(msg, msg_len, std::string("fake kernel refuses: ") + e.what());
    return ATTNCHECK_REFUSED;
  } catch (const std::exception& e) {
    put(msg, msg_len, std::string("fake kernel: reference failed: ") + e.what());
    return ATTNCHECK_ERROR;
  }
  return std::nullopt;
}

// The unspecified region of output `name` the kernel leaves unwritten (the declared partial
// contract `keeps`, kept), or "".
std::string unwritten_region(const nlohmann::json& keeps, const std::string& name) {
  std::string region;
  if (keeps.contains("unspecified") && keeps["unspecified"].contains(name) &&
      keeps["unspecified"][name].is_string() && env("ATTNCHECK_FAKE_PARTIAL_WRITES") != "1")
    region = keeps["unspecified"][name].get<std::string>();
  return region;
}

// Output `name` of p written with `value`, less the elements of `region` ("": none).
void write_output(const Op& op, const Problem& p, const std::string& name, const Tensor& value,
                  const std::string& region) {
  const Tensor& out = p.arg(name);
  // Same dtype, or same-size integer/fp8 codes (uint8 vs fp8): copy bits; else round the value.
  auto wide_float = [](DType t) { return is_floating(t) && !is_fp8(t); };
  const bool bitwise =
      value.dtype() == out.dtype() || (value.element_size() == out.element_size() &&
                                       !wide_float(value.dtype()) && !wide_float(out.dtype()));
  out.for_each_index([&](const Index& idx, int64_t) {
    if (!region.empty() && op.in_region(name, region, p, idx)) return;
    if (bitwise)
      out.set_bits(idx, value.get_bits(idx));
    else
      out.set(idx, value.get(idx));
  });
}

// The expected outputs written into p's, less what the declared partial contract leaves
// unwritten; the first output written, or nullptr.
const Tensor* write_expected(const Op& op, const Problem& p, const TensorMap& expected) {
  const Tensor* first_out = nullptr;
  const nlohmann::json keeps = declared_partial();
  for (const auto& [name, value] : expected) {
    if (!p.has_arg(name) || leaves_unwritten(keeps, name)) continue;
    write_output(op, p, name, value, unwritten_region(keeps, name));
    if (!first_out) first_out = &p.arg(name);
  }
  return first_out;
}

// The mirror tensor `t` views (the first one if none).
Mirror& mirror_of(std::vector<Mirror>& mirrors, const Tensor& t) {
  for (auto& m : mirrors)
    if (m.host == t.storage() || m.host->bytes.data() == t.storage()->bytes.data()) return m;
  return mirrors.front();
}

// The faults in the first output's elements (unwritten, nondeterministic, batch_of_one, nan).
void apply_element_fault(const std::string& fault, int call, const Tensor& out,
                         std::vector<Mirror>& mirrors,
                         const std::vector<std::vector<std::byte>>& initial) {
  if (fault == "unwritten") {
    Mirror& m = mirror_of(mirrors, out);
    const auto es = static_cast<int64_t>(out.element_size());
    Index last;
    for (auto d : out.shape()) last.push_back(d - 1);
    const auto off = static_cast<size_t>(out.element_offset(last) * es);
    const size_t mi = static_cast<size_t>(&m - mirrors.data());
    std::memcpy(m.host->bytes.data() + off, initial[mi].data() + off, static_cast<size_t>(es));
  } else if (fault == "nondeterministic" && call % 2 == 0) {
    Index zero(out.shape().size(), 0);
    out.set_bits(zero, out.get_bits(zero) ^ 1u);
  } else if (fault == "batch_of_one" && out.size(0) == 1) {
    Index zero(out.shape().size(), 0);
    out.set_bits(zero, out.get_bits(zero) ^ 1u);
  } else if (fault == "nan" && is_floating(out.dtype())) {
    Index zero(out.shape().size(), 0);
    out.set_bits(zero, nan_bits(out.dtype()));
  }
}

// The faults in the bytes of the first output's mirror outside its elements (past_view, the
// guards, gap_in_view).
void apply_byte_fault(const std::string& fault, const Tensor& out, std::vector<Mirror>& mirrors) {
  Mirror& m = mirror_of(mirrors, out);
  const auto es = static_cast<int64_t>(out.element_size());
  const size_t G = DeviceRunner::kGuardBytes;
  if (fault == "past_view") {
    const auto hi = static_cast<size_t>(out.extent().second * es);
    if (hi < m.bytes) m.host->bytes[hi] ^= std::byte{0x5A};
  } else if (fault == "guard_after") {
    m.host->bytes[m.bytes - G] ^= std::byte{0x5A};
  } else if (fault == "guard_before") {
    m.host->bytes[G - 1] ^= std::byte{0x5A};
  } else if (fault == "guard_before_at") {
    const size_t back = std::strtoul(env("ATTNCHECK_FAKE_GUARD_BYTE").c_str(), nullptr, 10);
    if (back >= 1 && back <= G) m.host->bytes[G - back] ^= std::byte{0x5A};
  } else if (fault == "gap_in_view") {
    write_first_gap(out, m.host->bytes);
  }
}

// beyond_default, beyond_contract: element 0 of the first output with a numeric budget moved
// between the default budget's limit and the contract's, or past both; the answer for an op or
// contract these faults cannot use, or nullopt.
std::optional<int> apply_contract_fault(const Op& op, const Problem& p, const TensorMap& expected,
                                        const std::string& fault, char* msg, size_t msg_len) {
  std::string name = env("ATTNCHECK_FAKE_FAULT_CONTRACT");
  if (name.empty()) name = env("ATTNCHECK_FAKE_CONTRACT");
  const auto contract = parse_contract(name);
  if (!op.contract_dependent() || !contract || contract->is_default()) {
    put(msg, msg_len,
        "fake library: " + fault +
            " needs an op with contract-dependent budgets "
            "and a non-default contract, got '" +
            name + "'");
    return ATTNCHECK_HOST_ERROR;
  }
  const auto base = op.checks(p, expected);
  const auto wide = op.contract_checks(p, expected, *contract);
  for (size_t i = 0; i < base.size() && i < wide.size(); ++i) {
    const Budget &bd = base[i].budget, &bc = wide[i].budget;
    if (bd.kind != Budget::Kind::numeric || !p.has_arg(base[i].name)) continue;
    const Tensor& out = p.arg(base[i].name);
    const Index zero(out.shape().size(), 0);
    const double e = expected.at(base[i].name).get(zero);
    const double lim_default = bd.atol + bd.rtol * std::fabs(e);
    const double lim_contract = bc.atol + bc.rtol * std::fabs(e);
    out.set(zero,
            e + (fault == "beyond_default" ? (lim_default + lim_contract) / 2 : 2 * lim_contract));
    break;
  }
  return std::nullopt;
}

// modify_input: a bit of the first input's first element flipped.
void modify_first_input(const Problem& p, const TensorMap& expected) {
  for (const auto& a : p.args) {
    if (a.role != Role::input || expected.count(a.name) || a.tensor.numel() == 0) continue;
    Index zero(a.tensor.shape().size(), 0);
    a.tensor.set_bits(zero, a.tensor.get_bits(zero) ^ 1u);
    break;
  }
}

// write_before_input, read_before_input: the element just before the first input's first one (a
// sparse storage's poison): zeroed, or added to the first output's first element.
void touch_before_input(const std::string& fault, const Problem& p, const Tensor* first_out) {
  for (const auto& a : p.args) {
    if (a.role != Role::input || a.tensor.numel() == 0 || a.tensor.offset() == 0) continue;
    const Tensor before = a.tensor.as_strided({1}, {1}, a.tensor.offset() - 1);
    if (fault == "write_before_input") {
      before.set_bits({0}, 0);
    } else if (first_out && first_out->numel() > 0) {
      Index zero(first_out->shape().size(), 0);
      first_out->set(zero, first_out->get(zero) + before.get({0}));
    }
    break;
  }
}

// A launch of kernel entry `op_name`: the op's reference run on the bytes it is handed, with the
// launch's fault injected.
int run_impl(const char* op_name, const char* params_json, const attncheck_arg* args, int n_args,
             char* msg, size_t msg_len) {
  const Op* op = op_for_kernel(op_name ? op_name : "");
  if (!op) {
    put(msg, msg_len, std::string("fake library: no op '") + (op_name ? op_name : "") + "'");
    return ATTNCHECK_UNKNOWN_OP;
  }
  const nlohmann::json params = nlohmann::json::parse(params_json ? params_json : "{}");
  const std::string fault = fault_for(params);
  int call = 0;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    call = ++g_calls;
  }
  apply_process_fault(fault);
  if (const auto answer = injected_answer(fault, msg, msg_len)) return *answer;
  slow_launch(params);

  const std::string fp8 = params.value("fp8_format", std::string());
  const Problem& tmpl = template_problem(*op);
  std::vector<Mirror> mirrors;
  Problem p = launch_problem(*op, op_name, params);
  if (const auto answer = mirror_args(tmpl, fp8, args, n_args, p, mirrors, msg, msg_len))
    return *answer;
  // Initial bytes, for "unwritten".
  std::vector<std::vector<std::byte>> initial;
  for (const auto& m : mirrors) initial.push_back(m.host->bytes);

  if (const auto answer = refusal(fault, p, mirrors, msg, msg_len)) return *answer;
  TensorMap expected;
  if (const auto answer = reference_outputs(*op, p, fault, expected, msg, msg_len)) return *answer;
  const Tensor* first_out = write_expected(*op, p, expected);

  if (first_out && first_out->numel() > 0) {
    apply_element_fault(fault, call, *first_out, mirrors, initial);
    apply_byte_fault(fault, *first_out, mirrors);
  }
  if (fault == "beyond_default" || fault == "beyond_contract") {
    if (const auto answer = apply_contract_fault(*op, p, expected, fault, msg, msg_len))
      return *answer;
  }
  if (fault == "modify_input") modify_first_input(p, expected);
  if (fault == "write_before_input" || fault == "read_before_input")
    touch_before_input(fault, p, first_out);
  write_back(mirrors);
  return ATTNCHECK_OK;
}

// Entries exactly as a real library lists them: every op's kernel_entries(), less those named in
// ATTNCHECK_FAKE_OMIT (comma-separated), read at each call so a test can open a partial library.
const char* ops() {
  static std::string names;
  const std::string omit = "," + env("ATTNCHECK_FAKE_OMIT") + ",";
  std::lock_guard<std::mutex> lock(g_mutex);
  names.clear();
  for (const Op* o : all_ops())
    for (const auto& e : o->kernel_entries())
      if (omit.find("," + e + ",") == std::string::npos) names += (names.empty() ? "" : ",") + e;
  return names.c_str();
}

int device_info(char* name, size_t name_len, char* arch, size_t arch_len, char* msg,
                size_t msg_len) {
  if (env("ATTNCHECK_FAKE_LOAD") == "hang_device")
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  if (env("ATTNCHECK_FAKE_NO_DEVICE") == "1") {
    put(msg, msg_len, "fake library: no device (ATTNCHECK_FAKE_NO_DEVICE=1)");
    return ATTNCHECK_NO_DEVICE;
  }
  put(name, name_len, "fake CPU device (attncheck test library)");
  const std::string a = env("ATTNCHECK_FAKE_ARCH");
  put(arch, arch_len, a.empty() ? "fake-cpu" : a);
  return ATTNCHECK_OK;
}

int alloc(size_t bytes, void** ptr, char* msg, size_t msg_len) {
  static std::atomic<long> failed{0};
  if (const std::string n = env("ATTNCHECK_FAKE_ALLOC_FAILS");
      !n.empty() && failed.fetch_add(1) < std::atol(n.c_str())) {
    const std::string why = env("ATTNCHECK_FAKE_ALLOC_MESSAGE");
    put(msg, msg_len, why.empty() ? "alloc: out of memory ($ATTNCHECK_FAKE_ALLOC_FAILS)" : why);
    return ATTNCHECK_ERROR;
  }
  auto* p = static_cast<std::byte*>(std::malloc(bytes ? bytes : 1));
  if (!p) return ATTNCHECK_ERROR;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_allocs[p] = bytes ? bytes : 1;
  *ptr = p;
  return ATTNCHECK_OK;
}

int release(void* ptr) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_allocs.erase(static_cast<std::byte*>(ptr));
  std::free(ptr);
  return ATTNCHECK_OK;
}

int copy_to_device(void* dst, const void* src, size_t bytes, char*, size_t) {
  std::memcpy(dst, src, bytes);
  return ATTNCHECK_OK;
}
int copy_to_host(void* dst, const void* src, size_t bytes, char*, size_t) {
  std::memcpy(dst, src, bytes);
  return ATTNCHECK_OK;
}

int run(const char* op, const char* params_json, const attncheck_arg* args, int n_args, char* msg,
        size_t msg_len) {
  try {
    return run_impl(op, params_json, args, n_args, msg, msg_len);
  } catch (const std::exception& e) {
    put(msg, msg_len, std::string("fake library: ") + e.what());
    return ATTNCHECK_ERROR;
  }
}

int time_fn(const char* op, const char* params_json, const attncheck_arg* args, int n_args,
            int warmup, int iters, double* ms, char* msg, size_t msg_len) {
  for (int i = 0; i < std::max(warmup, 0); ++i) {
    const int st = run(op, params_json, args, n_args, msg, msg_len);
    if (st != ATTNCHECK_OK) return st;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const int n = std::max(iters, 1);
  for (int i = 0; i < n; ++i) {
    const int st = run(op, params_json, args, n_args, msg, msg_len);
    if (st != ATTNCHECK_OK) return st;
  }
  *ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / n;
  return ATTNCHECK_OK;
}

// Host memcpy bandwidth and a small float matrix product: ceilings of the fake "device".
int roofline(double* copy_gbps, double* matrix_tflops, char*, size_t) {
  const size_t bytes = size_t{32} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 0);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 4; ++i) std::memcpy(b.data(), a.data(), bytes);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *copy_gbps = 4.0 * 2.0 * static_cast<double>(bytes) / s / 1e9;
  const int n = 128;
  std::vector<float> x(n * n, 1.0f), y(n * n, 0.5f), z(n * n, 0.0f);
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < n; ++k)
      for (int j = 0; j < n; ++j)
        z[static_cast<size_t>(i * n + j)] +=
            x[static_cast<size_t>(i * n + k)] * y[static_cast<size_t>(k * n + j)];
  s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *matrix_tflops = 2.0 * n * n * n / s / 1e12 + 0.0 * static_cast<double>(z[0]);
  return ATTNCHECK_OK;
}

const attncheck_plugin_v1 kTable = {
    ATTNCHECK_ABI_VERSION,
    "attncheck fake CPU kernels (tests only)",
    ops,
    device_info,
    alloc,
    release,
    copy_to_device,
    copy_to_host,
    run,
    time_fn,
    roofline,
};

// The declared contract: $ATTNCHECK_FAKE_CONTRACT for every entry, read at each call.
const char* contract(const char* op) {
  (void)op;
  static std::string name;
  std::lock_guard<std::mutex> lock(g_mutex);
  name = env("ATTNCHECK_FAKE_CONTRACT");
  return name.empty() ? nullptr : name.c_str();
}

// The declared invariance properties: $ATTNCHECK_FAKE_PROPERTIES for every entry.
const char* properties(const char* op) {
  (void)op;
  static std::string list;
  std::lock_guard<std::mutex> lock(g_mutex);
  list = env("ATTNCHECK_FAKE_PROPERTIES");
  return list.empty() ? nullptr : list.c_str();
}

// The declared partial contract: $ATTNCHECK_FAKE_PARTIAL for every entry.
const char* partial(const char* op) {
  (void)op;
  static std::string text;
  std::lock_guard<std::mutex> lock(g_mutex);
  text = env("ATTNCHECK_FAKE_PARTIAL");
  return text.empty() ? nullptr : text.c_str();
}

// The case context (the ABI's case_context): the fake rebuilds a problem from the wire, and the
// op's typed parameters of that problem come from the case's axis values.
int case_context(const char* case_json, char* msg, size_t msg_len) {
  try {
    auto j = nlohmann::json::parse(case_json ? case_json : "null");
    std::lock_guard<std::mutex> lock(g_mutex);
    g_case_params = j.is_object() ? j.value("params", Params::object()) : Params::object();
    g_case_invalid = j.is_object() && j.contains("invalid") && j.at("invalid").is_string()
                         ? j.at("invalid").get<std::string>()
                         : std::string();
    return ATTNCHECK_OK;
  } catch (const std::exception& e) {
    put(msg, msg_len, std::string("fake library: bad case context: ") + e.what());
    return ATTNCHECK_HOST_ERROR;
  }
}

// ---- graph capture: "record the call, replay it" ----
struct RecordedCall {
  std::string op, params;
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes, strides;
  std::vector<attncheck_arg> args;
  // "bake": the bytes of the input-only allocations at capture.
  std::vector<std::pair<std::byte*, std::vector<std::byte>>> baked;
};

// The allocations that hold only pure inputs of the op (by its default case's roles).
std::vector<std::pair<std::byte*, size_t>> input_allocations(const RecordedCall& call) {
  const Op* op = op_for_kernel(call.op);
  if (!op) return {};
  const Problem& tmpl = template_problem(*op);
  std::map<std::byte*, std::pair<size_t, bool>> allocs;  // base -> bytes, only inputs
  for (const auto& a : call.args) {
    const auto [base, bytes] = allocation_of(a.tensor.data);
    if (!base) continue;
    const bool input =
        tmpl.has_arg(a.name) && std::find_if(tmpl.args.begin(), tmpl.args.end(), [&](const Arg& x) {
                                  return x.name == a.name;
                                })->role == Role::input;
    auto [it, fresh] = allocs.emplace(base, std::make_pair(bytes, input));
    if (!fresh) it->second.second = it->second.second && input;
  }
  std::vector<std::pair<std::byte*, size_t>> out;
  for (const auto& [base, info] : allocs)
    if (info.second) out.emplace_back(base, info.first);
  return out;
}

int graph_capture(const char* op, const char* params_json, const attncheck_arg* args, int n_args,
                  void** graph, char* msg, size_t msg_len) {
  *graph = nullptr;
  const std::string mode = env("ATTNCHECK_FAKE_GRAPH");
  if (mode == "off") {
    put(msg, msg_len, "fake library: graph capture off (ATTNCHECK_FAKE_GRAPH=off)");
    return ATTNCHECK_UNSUPPORTED;
  }
  const int warm = run(op, params_json, args, n_args, msg, msg_len);  // the warm-up launch
  if (warm != ATTNCHECK_OK) return warm;
  auto call = std::make_unique<RecordedCall>();
  call->op = op ? op : "";
  call->params = params_json ? params_json : "{}";
  for (int i = 0; i < n_args; ++i) {
    call->names.emplace_back(args[i].name);
    call->shapes.emplace_back(args[i].tensor.shape, args[i].tensor.shape + args[i].tensor.ndim);
    call->strides.emplace_back(args[i].tensor.strides,
                               args[i].tensor.strides + args[i].tensor.ndim);
  }
  for (int i = 0; i < n_args; ++i) {
    attncheck_arg a = args[i];
    a.name = call->names[static_cast<size_t>(i)].c_str();
    a.tensor.shape = call->shapes[static_cast<size_t>(i)].data();
    a.tensor.strides = call->strides[static_cast<size_t>(i)].data();
    call->args.push_back(a);
  }
  if (mode == "bake")
    for (const auto& [base, bytes] : input_allocations(*call))
      call->baked.emplace_back(base, std::vector<std::byte>(base, base + bytes));
  *graph = call.release();
  return ATTNCHECK_OK;
}

int graph_replay(void* graph, char* msg, size_t msg_len) {
  auto* call = static_cast<RecordedCall*>(graph);
  // "bake": the launch sees the inputs as captured; the buffers get their current bytes back.
  std::vector<std::vector<std::byte>> current;
  for (auto& [base, bytes] : call->baked) {
    current.emplace_back(base, base + bytes.size());
    std::memcpy(base, bytes.data(), bytes.size());
  }
  const int st = run(call->op.c_str(), call->params.c_str(), call->args.data(),
                     static_cast<int>(call->args.size()), msg, msg_len);
  for (size_t i = 0; i < current.size(); ++i)
    std::memcpy(call->baked[i].first, current[i].data(), current[i].size());
  return st;
}

void graph_release(void* graph) {
  delete static_cast<RecordedCall*>(graph);
}

// The "device" is host memory: a copy within it is a memcpy (the harness's packed upload).
int copy_within_device(void* dst, const void* src, size_t bytes, char*, size_t) {
  std::memcpy(dst, src, bytes);
  return ATTNCHECK_OK;
}

// "Page-locked" host memory is ordinary memory here; the harness stages through it as it would
// through a GPU runtime's.
int host_alloc(size_t bytes, void** ptr, char* msg, size_t msg_len) {
  *ptr = std::malloc(bytes ? bytes : 1);
  if (*ptr) return ATTNCHECK_OK;
  put(msg, msg_len, "host_alloc: out of memory");
  return ATTNCHECK_ERROR;
}

void host_release(void* ptr) {
  std::free(ptr);
}

// Neither fill nor background work: the contract, the case context, the properties, graph
// capture, copies within the device, calls from any thread (the harness's launch lock keeps a
// case context and the launches after it together), and host memory to stage copies through.
const attncheck_plugin_ext_v1 kExtension = {sizeof(attncheck_plugin_ext_v1),
                                            nullptr,
                                            nullptr,
                                            contract,
                                            case_context,
                                            properties,
                                            graph_capture,
                                            graph_replay,
                                            graph_release,
                                            copy_within_device,
                                            1,  // any_thread: its state is under g_mutex
                                            host_alloc,
                                            host_release,
                                            partial};
// The table as a library built against a shorter header reports it: `size` ends at `field_offset`
// and the fields from there on do not exist (zeroed here).
attncheck_plugin_ext_v1 built_before(size_t field_offset) {
  attncheck_plugin_ext_v1 t = kExtension;
  t.size = static_cast<uint32_t>(field_offset);
  std::memset(reinterpret_cast<char*>(&t) + field_offset, 0, sizeof t - field_offset);
  return t;
}
// Before copy_within_device (one copy_to_device per storage); before the graph fields.
const attncheck_plugin_ext_v1 kExtensionBeforeCopyWithin =
    built_before(offsetof(attncheck_plugin_ext_v1, copy_within_device));
const attncheck_plugin_ext_v1 kExtensionBeforeGraph =
    built_before(offsetof(attncheck_plugin_ext_v1, graph_capture));

}  // namespace

extern "C" __attribute__((visibility("default"))) const attncheck_plugin_ext_v1*
attncheck_plugin_ext_v1_get(void) {
  if (env("ATTNCHECK_FAKE_EXT_SIZE") == "before_graph") return &kExtensionBeforeGraph;
  if (env("ATTNCHECK_FAKE_EXT_SIZE") == "before_copy_within") return &kExtensionBeforeCopyWithin;
  return &kExtension;
}

extern "C" __attribute__((visibility("default"))) const attncheck_plugin_v1*
attncheck_plugin_v1_get(void) {
  if (env("ATTNCHECK_FAKE_LOAD") == "null_table") {
    static attncheck_plugin_v1 partial = [] {
      attncheck_plugin_v1 t = kTable;
      t.run = nullptr;
      t.roofline = nullptr;
      return t;
    }();
    return &partial;
  }
  return &kTable;
}
