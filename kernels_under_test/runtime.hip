// Device half of the plugin: the exported ABI table, memory, launches with error capture, timing.
#include <cstdio>
#include <cstring>
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
    put(msg, msg_len, e != hipSuccess ? gpu_error("hipGetDeviceCount", e)
                                      : "hipGetDeviceCount found 0 devices");
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

// Runs the entry `times` times; refusals and exceptions become status codes with messages.
int launch(const char* op, const char* params_json, const attncheck_arg* args, int n_args,
           int times, char* msg, size_t msg_len) {
  try {
    ack::KernelFn fn = ack::find_kernel(op ? op : "");
    if (!fn) {
      put(msg, msg_len, std::string("no kernel for op '") + (op ? op : "") + "'");
      return ATTNCHECK_UNKNOWN_OP;
    }
    const ack::KParams params(params_json);
    const ack::KArgs kargs(args, n_args);
    for (int i = 0; i < times; ++i) fn(params, kargs);
    hipError_t e = hipDeviceSynchronize();
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
  return launch(op, params_json, args, n_args, 1, msg, msg_len);
}

int time(const char* op, const char* params_json, const attncheck_arg* args, int n_args, int warmup,
         int iters, double* ms, char* msg, size_t msg_len) {
  int st = launch(op, params_json, args, n_args, warmup > 0 ? warmup : 1, msg, msg_len);
  if (st != ATTNCHECK_OK) return st;
  hipEvent_t t0, t1;
  (void)hipEventCreate(&t0);
  (void)hipEventCreate(&t1);
  (void)hipEventRecord(t0, 0);
  st = launch(op, params_json, args, n_args, iters > 0 ? iters : 1, msg, msg_len);
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
