// What a kernel entry sees: named tensors (DLPack, already offset), scalar parameters, and a way
// to refuse. Each op family's .hip file registers its entries with KernelRegistrar.
#pragma once
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "attncheck_abi.h"

namespace ack {

struct KTensor {
  void* data = nullptr;  // element 0 of the view (byte_offset applied)
  int ndim = 0;
  int64_t shape[8] = {0};
  int64_t strides[8] = {0};  // in elements
  DLDataType dtype{};
  int64_t size(int d) const { return shape[d < 0 ? d + ndim : d]; }
  int64_t stride(int d) const { return strides[d < 0 ? d + ndim : d]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  bool is_contiguous() const;
  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

// Thrown by a kernel entry for a configuration it cannot serve: becomes ATTNCHECK_REFUSED.
struct Refusal : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class KArgs {
 public:
  explicit KArgs(const attncheck_arg* args, int n);
  const KTensor& get(const std::string& name) const;  // refuses if missing
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }

 private:
  std::map<std::string, KTensor> tensors_;
};

class KParams {
 public:
  explicit KParams(const char* json);  // flat JSON object: numbers, strings, booleans
  int64_t i(const std::string& key) const;
  double f(const std::string& key) const;
  bool b(const std::string& key) const;
  const std::string& s(const std::string& key) const;
  bool has(const std::string& key) const { return num_.count(key) || str_.count(key); }
  int64_t i_or(const std::string& key, int64_t dflt) const {
    return num_.count(key) ? i(key) : dflt;
  }

 private:
  std::map<std::string, double> num_;
  std::map<std::string, std::string> str_;
};

// Entry: launches and synchronizes; throws Refusal for unsupported configs, std::exception on
// errors.
using KernelFn = void (*)(const KParams& params, const KArgs& args);

// kGraphSafe: the entry may be captured into a graph (docs/abi.md "Graph capture"): it launches
// only on launch_stream() and, once its workspaces exist, makes no synchronous host read,
// allocation or copy.
enum GraphSafety { kNotGraphSafe = 0, kGraphSafe = 1 };

// `properties`: the invariance properties the entry promises bitwise (the ABI's `properties`,
// docs/abi.md), comma-separated; declare only what the kernel's code guarantees.
struct KernelRegistrar {
  KernelRegistrar(const char* op, KernelFn fn, GraphSafety graph = kNotGraphSafe,
                  const char* properties = nullptr);
  KernelRegistrar(const char* op, KernelFn fn, const char* properties)
      : KernelRegistrar(op, fn, kNotGraphSafe, properties) {}
};
KernelFn find_kernel(const std::string& op);
bool graph_safe(const std::string& op);
// The ABI's `properties`: what `op`'s registration declared, or NULL.
const char* kernel_properties(const char* op);
std::string kernel_names();

// The stream entries launch on (a hipStream_t / cudaStream_t): the capturing stream while the
// runtime captures a graph, else nullptr (the default stream).
void* launch_stream();
void set_launch_stream(void* stream);
// Whether a graph capture is in progress: workspaces must not grow then (their new buffer would
// outlive nothing the graph refers to).
inline bool capturing() {
  return launch_stream() != nullptr;
}

// Validation helpers: each throws Refusal naming the tensor and what is wrong.
void expect_dtype(const KTensor& t, const char* name, DLDataTypeCode code, int bits);
void expect_ndim(const KTensor& t, const char* name, int ndim);
void expect_contiguous_last(const KTensor& t, const char* name);  // innermost stride 1

}  // namespace ack
