// Device half of the plugin: the exported ABI table, memory, launches with error capture, timing.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gpu_compat.h"
#include "kernel_api.h"
#include "roofline.h"

namespace {

void put(char* dst, size_t n, const std::string& s) {
  if (!dst || n == 0) return;
  std::snprintf(dst, n, "%s", s.c_str());
}

std::string gpu_error(const char* what, hipError_t e) {
  return std::string(what) + ": " + hipGetErrorString(e);
}

const char* ops() {
  static std::string names = ack::kernel_names();
  return names.c_str();
}

int device_info(char* name, size_t name_len, char* arch, size_t arch_len, char* msg,
                size_t msg_len) {
  int n = 0;
  hipError_t e = hipGetDeviceCount(&n);
  if (e != hipSuccess || n == 0) {
    (void)hipGetLastError();
    // The reason alone: attncheck's message already starts "no GPU: ".
    put(msg, msg_len,
        e != hipSuccess ? gpu_error("hipGetDeviceCount", e) : "hipGetDeviceCount found 0 devices");
    return ATTNCHECK_NO_DEVICE;
  }
  int dev = 0;
  (void)hipGetDevice(&dev);
  hipDeviceProp_t prop;
  e = hipGetDeviceProperties(&prop, dev);
  if (e != hipSuccess) {
    put(msg, msg_len, gpu_error("device properties", e));
    return ATTNCHECK_NO_DEVICE;
  }
  put(name, name_len, prop.name);
#if defined(AC_HIP)
  std::string a = prop.gcnArchName;
  put(arch, arch_len, a.substr(0, a.find(':')));  // "gfx942:sramecc+:xnack-" -> "gfx942"
#else
  put(arch, arch_len, "sm_" + std::to_string(prop.major) + std::to_string(prop.minor));
#endif
  return ATTNCHECK_OK;
}

int alloc(size_t bytes, void** ptr, char* msg, size_t msg_len) {
  hipError_t e = hipMalloc(ptr, bytes ? bytes : 1);
  if (e != hipSuccess) {
    put(msg, msg_len, gpu_error("hipMalloc", e));
    return ATTNCHECK_ERROR;
  }
  return ATTNCHECK_OK;
}

int release(void* ptr) {
  return hipFree(ptr) == hipSuccess ? ATTNCHECK_OK : ATTNCHECK_ERROR;
}

int host_alloc(size_t bytes, void** ptr, char* msg, size_t msg_len) {
  const hipError_t e = hipHostMalloc(ptr, bytes ? bytes : 1, hipHostMallocDefault);
  if (e != hipSuccess) {
    put(msg, msg_len, gpu_error("hipHostMalloc", e));
    return ATTNCHECK_ERROR;
  }
  return ATTNCHECK_OK;
}

void host_release(void* ptr) {
  if (ptr) (void)hipHostFree(ptr);
}

int copy(void* dst, const void* src, size_t bytes, bool to_device, char* msg, size_t msg_len) {
  hipError_t e =
      hipMemcpy(dst, src, bytes, to_device ? hipMemcpyHostToDevice : hipMemcpyDeviceToHost);
  if (e != hipSuccess) {
    put(msg, msg_len, gpu_error("hipMemcpy", e));
    return ATTNCHECK_ERROR;
  }
  return ATTNCHECK_OK;
}
int copy_to_device(void* dst, const void* src, size_t bytes, char* msg, size_t msg_len) {
  return copy(dst, src, bytes, true, msg, msg_len);
}
int copy_to_host(void* dst, const void* src, size_t bytes, char* msg, size_t msg_len) {
  return copy(dst, src, bytes, false, msg, msg_len);
}
// Queued on the legacy default stream, where run() launches (launch_stream() is null outside a
// capture) and hipMemcpy/fill synchronize: ordered before them, no host wait.
int copy_within_device(void* dst, const void* src, size_t bytes, char* msg, size_t msg_len) {
  const hipError_t e = hipMemcpyAsync(dst, src, bytes, hipMemcpyDeviceToDevice, 0);
  if (e != hipSuccess) {
    put(msg, msg_len, gpu_error("hipMemcpyAsync (device to device)", e));
    return ATTNCHECK_ERROR;
  }
  return ATTNCHECK_OK;
}

// ---- shared-memory poison (docs/abi.md, "Shared-memory poison") ----
// Before every launch a kernel fills the shared memory of every SM/CU with a NaN pattern, so a
// kernel that reads shared memory it did not write in this launch reads NaN (or an absurd index)
// deterministically instead of whatever the previous kernel left there.
constexpr uint32_t kDefaultSmemPoison = 0x7FFF7FFFu;  // NaN as f32, as both bf16/f16 halves, and
                                                      // 0x7F/0xFF bytes (e4m3fn NaN codes)

__global__ void fill_shared_memory(uint32_t pattern, uint32_t words) {
  extern __shared__ uint32_t poison_smem[];
  for (uint32_t i = threadIdx.x; i < words; i += blockDim.x) poison_smem[i] = pattern;
  __syncthreads();
  // Keeps the stores: a block that exits without using them could have them elided.
  if (threadIdx.x == 0 && poison_smem[words - 1] != pattern) poison_smem[0] = 0;
}

// $ATTNCHECK_SMEM_POISON, read at every launch so that the harness can vary it: unset or "on" ->
// the default pattern, "off" or "0" -> no poison, "0x7fc07fc0" (hex) -> that 32-bit pattern.
bool smem_poison_pattern(uint32_t* pattern) {
  const char* env = std::getenv("ATTNCHECK_SMEM_POISON");
  *pattern = kDefaultSmemPoison;
  if (!env || !*env || !std::strcmp(env, "on") || !std::strcmp(env, "1")) return true;
  if (!std::strcmp(env, "off") || !std::strcmp(env, "0")) return false;
  char* end = nullptr;
  const unsigned long v = std::strtoul(env, &end, 16);
  if (end && *end == '\0') *pattern = static_cast<uint32_t>(v);
  return true;
}

// Launches enough blocks of the largest dynamic shared memory a block may have to occupy every
// SM/CU (two per multiprocessor: one resident at a time each, the second catches a scheduler that
// doubled up). The sizes are queried once.
hipError_t poison_shared_memory(hipStream_t stream = 0) {
  uint32_t pattern = 0;
  if (!smem_poison_pattern(&pattern)) return hipSuccess;
  static int bytes = -1, blocks = 0;
  if (bytes < 0) {
    int dev = 0;
    hipDeviceProp_t prop;
    hipError_t e = hipGetDevice(&dev);
    if (e == hipSuccess) e = hipGetDeviceProperties(&prop, dev);
    if (e != hipSuccess) return e;
#if defined(AC_HIP)
    bytes = static_cast<int>(prop.maxSharedMemoryPerMultiProcessor);  // LDS per CU (64/160 KiB)
    if (static_cast<int>(prop.sharedMemPerBlock) < bytes)
      bytes = static_cast<int>(prop.sharedMemPerBlock);
#else
    bytes = static_cast<int>(prop.sharedMemPerBlockOptin);  // 227 KiB on sm_90
#endif
    blocks = 2 * prop.multiProcessorCount;
    if (bytes > 48 * 1024) {
      e = hipFuncSetAttribute(reinterpret_cast<const void*>(fill_shared_memory),
                              hipFuncAttributeMaxDynamicSharedMemorySize, bytes);
      if (e != hipSuccess) return e;
    }
  }
  hipLaunchKernelGGL(fill_shared_memory, dim3(blocks), dim3(256), static_cast<size_t>(bytes),
                     stream, pattern, static_cast<uint32_t>(bytes / 4));
  return hipGetLastError();
}

// Runs the entry `times` times; refusals and exceptions become status codes with messages.
int launch(const char* op, const char* params_json, const attncheck_arg* args, int n_args,
           int times, bool poison, char* msg, size_t msg_len) {
  try {
    ack::KernelFn fn = ack::find_kernel(op ? op : "");
    if (!fn) {
      put(msg, msg_len, std::string("no kernel for op '") + (op ? op : "") + "'");
      return ATTNCHECK_UNKNOWN_OP;
    }
    const ack::KParams params(params_json);
    const ack::KArgs kargs(args, n_args);
    hipError_t e = hipSuccess;
    for (int i = 0; i < times && e == hipSuccess; ++i) {
      if (poison) e = poison_shared_memory();
      if (e != hipSuccess) {
        put(msg, msg_len, gpu_error("shared-memory poison", e));
        return ATTNCHECK_ERROR;
      }
      fn(params, kargs);
    }
    e = hipDeviceSynchronize();
    if (e == hipSuccess) e = hipGetLastError();
    if (e != hipSuccess) {
      put(msg, msg_len, gpu_error(op, e));
      return ATTNCHECK_ERROR;
    }
    return ATTNCHECK_OK;
  } catch (const ack::Refusal& r) {
    put(msg, msg_len, r.what());
    return ATTNCHECK_REFUSED;
  } catch (const std::exception& ex) {
    // An exception from the entry's host code: a device fault only if the device reports one.
    hipError_t e = hipDeviceSynchronize();
    if (e == hipSuccess) e = hipGetLastError();
    if (e != hipSuccess) {
      put(msg, msg_len, std::string(ex.what()) + "; " + gpu_error(op, e));
      return ATTNCHECK_ERROR;
    }
    put(msg, msg_len, ex.what());
    return ATTNCHECK_HOST_ERROR;
  }
}

int run(const char* op, const char* params_json, const attncheck_arg* args, int n_args, char* msg,
        size_t msg_len) {
  return launch(op, params_json, args, n_args, 1, /*poison=*/true, msg, msg_len);
}

int time(const char* op, const char* params_json, const attncheck_arg* args, int n_args, int warmup,
         int iters, double* ms, char* msg, size_t msg_len) {
  // Timed launches run without the poison kernel between them: it would be timed too.
  int st = launch(op, params_json, args, n_args, warmup > 0 ? warmup : 1, false, msg, msg_len);
  if (st != ATTNCHECK_OK) return st;
  hipEvent_t t0, t1;
  (void)hipEventCreate(&t0);
  (void)hipEventCreate(&t1);
  (void)hipEventRecord(t0, 0);
  st = launch(op, params_json, args, n_args, iters > 0 ? iters : 1, false, msg, msg_len);
  (void)hipEventRecord(t1, 0);
  (void)hipEventSynchronize(t1);
  float elapsed = 0;
  (void)hipEventElapsedTime(&elapsed, t0, t1);
  (void)hipEventDestroy(t0);
  (void)hipEventDestroy(t1);
  if (ms) *ms = static_cast<double>(elapsed) / (iters > 0 ? iters : 1);
  return st;
}

int roofline(double* copy_gbps, double* matrix_tflops, char* msg, size_t msg_len) {
  try {
    *copy_gbps = ack::measure_copy_gbps();
    *matrix_tflops = ack::measure_matrix_tflops();
    return ATTNCHECK_OK;
  } catch (const std::exception& ex) {
    put(msg, msg_len, ex.what());
    return ATTNCHECK_ERROR;
  }
}

// ---- graph capture (docs/abi.md "Graph capture") ----
// One captured run of an entry: the non-blocking stream it was captured on (and is replayed on),
// the graph and its executable instance.
struct CapturedGraph {
  hipStream_t stream = nullptr;
  hipGraph_t graph = nullptr;
  hipGraphExec_t exec = nullptr;
  ~CapturedGraph() {
    if (exec) (void)hipGraphExecDestroy(exec);
    if (graph) (void)hipGraphDestroy(graph);
    if (stream) (void)hipStreamDestroy(stream);
  }
};

// Entries launch on the capturing stream for the lifetime of this object, however the capture
// ends; the capture is ended (its partial graph dropped) if nothing else ended it.
class CaptureScope {
 public:
  explicit CaptureScope(CapturedGraph& g) : g_(g) { ack::set_launch_stream(g.stream); }
  ~CaptureScope() {
    ack::set_launch_stream(nullptr);
    if (open_) {
      hipGraph_t dropped = nullptr;
      if (hipStreamEndCapture(g_.stream, &dropped) == hipSuccess && dropped)
        (void)hipGraphDestroy(dropped);
      (void)hipGetLastError();
    }
  }
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;
  hipError_t end() {
    open_ = false;
    ack::set_launch_stream(nullptr);
    return hipStreamEndCapture(g_.stream, &g_.graph);
  }

 private:
  CapturedGraph& g_;
  bool open_ = true;
};

// Relaxed mode on a non-blocking stream: a wrapper that reads argument contents on the host while
// capturing is not stopped by the runtime, it bakes what it read, and the replay's outputs show it.
int capture_entry(ack::KernelFn fn, const char* op, const char* params_json,
                  const attncheck_arg* args, int n_args, CapturedGraph& g, char* msg,
                  size_t msg_len) {
  const ack::KParams params(params_json);
  const ack::KArgs kargs(args, n_args);
  hipError_t e = hipStreamCreateWithFlags(&g.stream, hipStreamNonBlocking);
  if (e == hipSuccess) e = hipStreamBeginCapture(g.stream, hipStreamCaptureModeRelaxed);
  if (e != hipSuccess) {
    put(msg, msg_len, gpu_error("begin graph capture", e));
    return ATTNCHECK_ERROR;
  }
  CaptureScope scope(g);
  e = poison_shared_memory(g.stream);
  if (e == hipSuccess) fn(params, kargs);
  const hipError_t ended = scope.end();
  if (e == hipSuccess) e = ended;
  if (e == hipSuccess) e = hipGraphInstantiateWithFlags(&g.exec, g.graph, 0);
  if (e != hipSuccess) {
    (void)hipGetLastError();
    put(msg, msg_len, gpu_error((std::string("graph capture of ") + op).c_str(), e));
    return ATTNCHECK_ERROR;
  }
  return ATTNCHECK_OK;
}

int graph_capture(const char* op, const char* params_json, const attncheck_arg* args, int n_args,
                  void** graph, char* msg, size_t msg_len) {
  *graph = nullptr;
  const std::string name = op ? op : "";
  ack::KernelFn fn = ack::find_kernel(name);
  if (!fn) {
    put(msg, msg_len, "no kernel for op '" + name + "'");
    return ATTNCHECK_UNKNOWN_OP;
  }
  if (!ack::graph_safe(name)) {
    put(msg, msg_len,
        "entry '" + name +
            "' is not capturable in this library: its wrapper reads metadata on the host or "
            "allocates per launch");
    return ATTNCHECK_UNSUPPORTED;
  }
  // Warm-up: an ordinary run allocates the workspaces the captured launches will use.
  const int warm = launch(op, params_json, args, n_args, 1, /*poison=*/true, msg, msg_len);
  if (warm != ATTNCHECK_OK) return warm;
  auto g = std::make_unique<CapturedGraph>();
  try {
    const int st = capture_entry(fn, op, params_json, args, n_args, *g, msg, msg_len);
    if (st != ATTNCHECK_OK) return st;
  } catch (const ack::Refusal& r) {
    put(msg, msg_len, std::string("refused while capturing: ") + r.what());
    return ATTNCHECK_REFUSED;
  } catch (const std::exception& ex) {
    put(msg, msg_len, std::string("failed while capturing: ") + ex.what());
    return ATTNCHECK_HOST_ERROR;
  }
  *graph = g.release();
  return ATTNCHECK_OK;
}

int graph_replay(void* graph, char* msg, size_t msg_len) {
  auto* g = static_cast<CapturedGraph*>(graph);
  if (!g || !g->exec) {
    put(msg, msg_len, "graph_replay: no captured graph");
    return ATTNCHECK_HOST_ERROR;
  }
  // The graph's stream is non-blocking: nothing orders it after the harness's re-upload of the
  // contents (on the legacy stream; a copy from pageable memory returns once staged, before its
  // DMA lands), so wait for the device first. Without this the replay raced the upload of the
  // outputs' poison and came back all NaN now and then (full tier, kv_gather).
  hipError_t e = hipDeviceSynchronize();
  if (e == hipSuccess) e = hipGraphLaunch(g->exec, g->stream);
  if (e == hipSuccess) e = hipStreamSynchronize(g->stream);
  if (e == hipSuccess) e = hipGetLastError();
  if (e != hipSuccess) {
    put(msg, msg_len, gpu_error("graph replay", e));
    return ATTNCHECK_ERROR;
  }
  return ATTNCHECK_OK;
}

void graph_release(void* graph) {
  delete static_cast<CapturedGraph*>(graph);
}

__global__ void fill_bytes(uint8_t* dst, size_t bytes, uint32_t pattern) {
  const size_t step = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes; i += step)
    dst[i] = static_cast<uint8_t>(pattern >> (8 * (i % 4)));
}

int fill(void* dst, size_t bytes, uint32_t pattern, char* msg, size_t msg_len) {
  if (bytes == 0) return ATTNCHECK_OK;
  hipLaunchKernelGGL(fill_bytes, dim3(4096), dim3(256), 0, 0, static_cast<uint8_t*>(dst), bytes,
                     pattern);
  hipError_t e = hipDeviceSynchronize();
  if (e == hipSuccess) e = hipGetLastError();
  if (e != hipSuccess) {
    put(msg, msg_len, gpu_error("fill", e));
    return ATTNCHECK_ERROR;
  }
  return ATTNCHECK_OK;
}

// Busy-waits on the device's real-time clock (CUDA %globaltimer in ns; AMD s_memrealtime, 100 MHz
// on CDNA) for `ns`.
__global__ void spin_for(uint64_t ns) {
#if defined(AC_CUDA)
  auto now = [] {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  };
  const uint64_t end = now() + ns;
  while (now() < end) {
  }
#elif defined(__HIP_DEVICE_COMPILE__)
  // s_memrealtime: the 100 MHz real-time counter of gfx9 (gfx90a, gfx942, gfx950).
  const uint64_t end = __builtin_amdgcn_s_memrealtime() + ns / 10;
  while (__builtin_amdgcn_s_memrealtime() < end) {
  }
#else
  (void)ns;
#endif
}

int background(uint32_t microseconds, char* msg, size_t msg_len) {
  static hipStream_t stream = nullptr;
  static int blocks = 0;
  hipError_t e = hipSuccess;
  if (!stream) {
    int dev = 0;
    hipDeviceProp_t prop;
    e = hipGetDevice(&dev);
    if (e == hipSuccess) e = hipGetDeviceProperties(&prop, dev);
#if defined(AC_CUDA)
    if (e == hipSuccess) e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
#else
    if (e == hipSuccess) e = hipStreamCreateWithFlags(&stream, hipStreamNonBlocking);
#endif
    if (e != hipSuccess) {
      stream = nullptr;
      put(msg, msg_len, gpu_error("background stream", e));
      return ATTNCHECK_ERROR;
    }
    blocks = prop.multiProcessorCount / 2 > 0 ? prop.multiProcessorCount / 2 : 1;
  }
  hipLaunchKernelGGL(spin_for, dim3(blocks), dim3(256), 0, stream,
                     static_cast<uint64_t>(microseconds) * 1000u);
  e = hipGetLastError();
  if (e != hipSuccess) {
    put(msg, msg_len, gpu_error("background kernel", e));
    return ATTNCHECK_ERROR;
  }
  return ATTNCHECK_OK;
}

// contract NULL: every entry computes under the default arithmetic contract (fp32-accumulate);
// partial NULL: no entry declares a partial contract (docs/verification.md "Partial contracts").
// properties: what each entry's registration declares (kernel_api.h); graph capture of the
// entries registered graph-safe.
const attncheck_plugin_ext_v1 kExtension = {
    .size = sizeof(attncheck_plugin_ext_v1),
    .fill = fill,
    .background = background,
    .contract = nullptr,
    .case_context = nullptr,
    .properties = ack::kernel_properties,
    .graph_capture = graph_capture,
    .graph_replay = graph_replay,
    .graph_release = graph_release,
    .copy_within_device = copy_within_device,
    // Its state (the capture stream, cached device properties) is process-wide, never per thread.
    .any_thread = 1,
    .host_alloc = host_alloc,
    .host_release = host_release,
    // Every entry of this library produces each of its op's outputs in full.
    .partial = nullptr,
};

const attncheck_plugin_v1 kTable = {
    ATTNCHECK_ABI_VERSION,
    "attncheck-kernels 0.1.0 (" AC_DEVICE_KIND ")",
    ops,
    device_info,
    alloc,
    release,
    copy_to_device,
    copy_to_host,
    run,
    time,
    roofline,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const attncheck_plugin_v1*
attncheck_plugin_v1_get(void) {
  return &kTable;
}

extern "C" __attribute__((visibility("default"))) const attncheck_plugin_ext_v1*
attncheck_plugin_ext_v1_get(void) {
  return &kExtension;
}
