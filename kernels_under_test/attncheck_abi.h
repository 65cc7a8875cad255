/* attncheck kernel plugin ABI, version 1 (C, no HIP or CUDA types).
 *
 * A kernel library is a shared object exporting one symbol:
 *     const attncheck_plugin_v1* attncheck_plugin_v1_get(void);
 * The harness dlopen()s it, checks abi_version, and from then on only calls through the table.
 * Device memory is owned by the harness but allocated through the plugin (alloc/free/copy), so the
 * harness can surround every buffer with guard bytes and poison outputs without linking HIP.
 *
 * Tensors are DLPack DLTensors (dlpack/dlpack.h, v0.6): data = device pointer of the buffer,
 * byte_offset = where element 0 of the view starts, strides in elements (never NULL). Arguments
 * are passed by name; which names an op expects, and which JSON parameters, is documented per op
 * in docs/abi.md. A vendor adapter (e.g. around AITER) implements this table and nothing else.
 */
#ifndef ATTNCHECK_ABI_H
#define ATTNCHECK_ABI_H

#include <dlpack/dlpack.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ATTNCHECK_ABI_VERSION 1u

/* Status codes returned by every entry. */
enum attncheck_status {
  ATTNCHECK_OK = 0,
  ATTNCHECK_REFUSED = 1,     /* the kernel cannot serve this configuration; msg says why */
  ATTNCHECK_ERROR = 2,       /* launch or runtime failure on the device; msg says what. The
                                harness starts a fresh process for the next case (sticky faults) */
  ATTNCHECK_UNKNOWN_OP = 3,  /* the library has no entry of this name */
  ATTNCHECK_NO_DEVICE = 4,   /* no usable GPU */
  ATTNCHECK_HOST_ERROR = 5,  /* the entry failed on the host before or without a device fault
                                (an exception in argument handling); the device is still usable */
  ATTNCHECK_UNSUPPORTED = 6, /* the kernel does not serve this configuration although it is valid
                                (an adapter's upstream kernel has no path for it); msg says why.
                                Not a failure: the case is reported unsupported */
};

typedef struct attncheck_arg {
  const char* name; /* "q", "kv_cache", "out", ... */
  DLTensor tensor;
} attncheck_arg;

typedef struct attncheck_plugin_v1 {
  uint32_t abi_version; /* ATTNCHECK_ABI_VERSION */
  const char* library;  /* e.g. "attncheck-kernels 0.1.0 (cuda sm_90)" */
  /* Comma-separated kernel entry names this library implements ("mla_decode,rope_inplace,...").
     Listing entries must not need a GPU. */
  const char* (*ops)(void);
  /* Device name and arch ("gfx942", "sm_90"); returns ATTNCHECK_NO_DEVICE without a GPU. */
  int (*device_info)(char* name, size_t name_len, char* arch, size_t arch_len, char* msg,
                     size_t msg_len);
  int (*alloc)(size_t bytes, void** ptr, char* msg, size_t msg_len);
  int (*release)(void* ptr);
  int (*copy_to_device)(void* dst, const void* src, size_t bytes, char* msg, size_t msg_len);
  int (*copy_to_host)(void* dst, const void* src, size_t bytes, char* msg, size_t msg_len);
  /* Runs op once and waits for it. params_json: a JSON object of scalar parameters. */
  int (*run)(const char* op, const char* params_json, const attncheck_arg* args, int n_args,
             char* msg, size_t msg_len);
  /* Runs op `iters` times after `warmup` runs; *ms = mean device time per run (events). */
  int (*time)(const char* op, const char* params_json, const attncheck_arg* args, int n_args,
              int warmup, int iters, double* ms, char* msg, size_t msg_len);
  /* Measures the device's copy bandwidth (GB/s, bytes read + written) and dense 16-bit matrix rate
     (TFLOP/s) with the library's own kernels, for roofline floors. */
  int (*roofline)(double* copy_gbps, double* matrix_tflops, char* msg, size_t msg_len);
} attncheck_plugin_v1;

typedef const attncheck_plugin_v1* (*attncheck_plugin_v1_get_fn)(void);

/* Optional extension, same ABI version: a library may also export
 *     const attncheck_plugin_ext_v1* attncheck_plugin_ext_v1_get(void);
 * The harness uses what it finds there and falls back to the v1 table when the symbol is absent
 * (older libraries and adapters keep working unchanged). */
typedef struct attncheck_plugin_ext_v1 {
  uint32_t size; /* sizeof(attncheck_plugin_ext_v1) as the library was built */
  /* Fills `bytes` device bytes at dst with the little-endian 32-bit `pattern` repeated (byte i
     of the range gets byte i % 4 of the pattern), synchronously. The harness poisons the parts of
     a sparse storage that the host does not hold with it (multi-GB caches of large-offset cases);
     without it, the harness uploads the poison through copy_to_device. */
  int (*fill)(void* dst, size_t bytes, uint32_t pattern, char* msg, size_t msg_len);
  /* Starts a kernel that keeps about half of the SMs/CUs busy for `microseconds` on a stream of
     its own and returns without waiting; the next `run` synchronizes with it. The stress mode
     uses it to launch the kernel under test beside concurrent work (other block placement and
     timing). NULL: not offered. */
  int (*background)(uint32_t microseconds, char* msg, size_t msg_len);
  /* The arithmetic contract kernel entry `op` computes under (docs/verification.md "Arithmetic
     contracts"): "fp32-accumulate" (the default: products exact, fp32 sums),
     "qk-products-in-input-type", "p-in-input-type", or both joined by '+'. The harness compares
     with the default budgets first and, when they fail, with the budgets derived from this
     contract, naming it beside the verdict. NULL (the function or its result), or a library
     whose `size` ends before this field: the default. An unknown name makes the entry's cases
     errors. The string must stay valid while the library is loaded, and the answer the same:
     the harness asks once per entry. */
  const char* (*contract)(const char* op);
  /* The case whose launches follow, as a JSON object: {"op", "id", "params": the case's axis
     values, "invalid": the op's refusal reason for this configuration or null, "fields": [{"name",
     "type", "default", "allowed", "min", "max"}]}. The harness decides validity once per op
     (docs/verification.md); a library wrapping kernels that do not check their arguments (the
     Python bridge's adapters) uses "invalid" instead of re-coding the op's rules. Called before
     the launches of every case ("null" for a problem made by hand, with no case); the string is
     valid during the call only. NULL: not wanted. */
  int (*case_context)(const char* case_json, char* msg, size_t msg_len);
  /* The invariance properties kernel entry `op` promises bitwise (docs/verification.md
     "Invariance"), comma-separated: "batch-invariant" (a request's outputs do not depend on the
     other requests of its batch), "batch-order-invariant" (nor on their order),
     "split-invariant" (nor on the split count or tile parameter the op exposes),
     "page-order-invariant" (nor on where its pages lie in the cache). The harness checks the
     op's relations bitwise for the declared ones and within the op's budgets for the others.
     NULL (the function or its result), or a library whose `size` ends before this field: none.
     An unknown name fails the entry's cases. Asked once per entry. The string must stay valid
     while the library is loaded. */
  const char* (*properties)(const char* op);
  /* Graph replay (docs/abi.md "Graph capture"): captures the launches one `run` of entry `op`
     makes into a CUDA/HIP graph (or, for Python adapters, a torch.cuda.CUDAGraph) without
     running them as part of the capture; *graph gets a handle. The library may run the entry
     once beforehand (warm-up: workspaces are allocated outside the capture). The harness then
     changes the contents (never the addresses or shapes) of the arguments' buffers and calls
     graph_replay, which runs the captured launches and waits for them; a kernel or wrapper that
     read argument contents on the host at capture time replays stale values. Returns
     ATTNCHECK_UNSUPPORTED (msg says why) for an entry that cannot be captured: the harness skips
     the step with that reason. graph_release frees a handle (NULL is ignored). NULL, or a library
     whose `size` ends before these fields: no graph replay. */
  int (*graph_capture)(const char* op, const char* params_json, const attncheck_arg* args,
                       int n_args, void** graph, char* msg, size_t msg_len);
  int (*graph_replay)(void* graph, char* msg, size_t msg_len);
  void (*graph_release)(void* graph);
  /* Copies `bytes` from device memory src to device memory dst, queued in the order of the
     library's own work (the stream `run` launches on): it may return before the copy is done,
     and the next run, graph_replay, fill or copy_to_host sees its bytes. The harness uploads a
     launch's storages with one copy_to_device into a staging block and spreads them with this:
     every synchronous host-to-device copy waits for the GPU, which is slow when many processes
     share one (docs/results.md). NULL, or a library whose `size` ends before this field: one
     copy_to_device per storage. */
  int (*copy_within_device)(void* dst, const void* src, size_t bytes, char* msg, size_t msg_len);
  /* 1: every entry may be called from any thread of the process, one call at a time (the harness
     never makes two calls at once, and a launch's sequence of calls, from its allocations and
     uploads through case_context, run or graph_replay to its last copy back, is never interleaved
     with another thread's). A worker then runs several cases at once in threads that share the
     library and one GPU context: a context per process is created one at a time, host-wide, and
     contexts time-slice the GPU (docs/results.md). Any other value, or a library whose `size`
     ends before this field: the harness calls from one thread only. Not a function, so not
     tested with ATTNCHECK_EXT_HAS. */
  uint32_t any_thread;
  /* Page-locked host memory (hipHostMalloc / cudaHostAlloc) of `bytes`, and its release. The
     harness stages a launch's packed upload and its read-back through such a buffer, kept per
     runner: copies from and to it are DMA transfers, where copies of ordinary memory go through
     the driver's staging on the CPU, so a launch holds the launch lock for less (docs/abi.md
     "Threads"). copy_to_device and copy_to_host are then called with it as the host side. NULL,
     or a library whose `size` ends before these fields: ordinary memory. */
  int (*host_alloc)(size_t bytes, void** ptr, char* msg, size_t msg_len);
  void (*host_release)(void* ptr);
  /* The partial contract of kernel entry `op` (docs/verification.md "Partial contracts"): a JSON
     object {"not_produced": [output names], "unspecified": {"<output>": "<region>"}} (either key
     may be absent). A not-produced output must be left untouched (a write there fails the case);
     an unspecified region of an output is not compared, though writes must stay inside the
     output's view. Outputs must be outputs of the op, regions ones the op defines for that output
     (docs/abi.md lists them): any other name makes the entry's cases errors and `attncheck
     kernels --check` fail. Every other output and region is judged in full; the contract is
     named in every result. NULL (the function or its result), or a library whose `size` ends
     before this field: the entry produces everything. Asked once per entry; the string must stay
     valid while the library is loaded. */
  const char* (*partial)(const char* op);
} attncheck_plugin_ext_v1;

/* Whether `ext` (may be NULL) holds a non-NULL `field`: a library built against an older, shorter
   table reports a smaller `size`, and fields past it are absent. */
#define ATTNCHECK_EXT_HAS(ext, field)                                                \
  ((ext) != NULL &&                                                                  \
   (ext)->size >= offsetof(attncheck_plugin_ext_v1, field) + sizeof((ext)->field) && \
   (ext)->field != NULL)

typedef const attncheck_plugin_ext_v1* (*attncheck_plugin_ext_v1_get_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* ATTNCHECK_ABI_H */
