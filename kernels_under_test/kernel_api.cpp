// Host-only half of the plugin: argument and parameter unpacking, the kernel registry, and the
// exported ABI table (its device half, runtime.hip, provides memory, timing and rooflines).
#include "kernel_api.h"

#include <cmath>
#include <nlohmann/json.hpp>

namespace ack {

bool KTensor::is_contiguous() const {
  int64_t expect = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

KArgs::KArgs(const attncheck_arg* args, int n) {
  for (int i = 0; i < n; ++i) {
    const DLTensor& d = args[i].tensor;
    if (d.ndim > 8)
      throw Refusal(std::string("tensor '") + args[i].name + "' has more than 8 dimensions");
    KTensor t;
    t.data = static_cast<char*>(d.data) + d.byte_offset;
    t.ndim = d.ndim;
    t.dtype = d.dtype;
    for (int k = 0; k < d.ndim; ++k) {
      t.shape[k] = d.shape[k];
      t.strides[k] = d.strides ? d.strides[k] : 0;
    }
    if (!d.strides) {  // DLPack: NULL strides means compact row-major
      int64_t s = 1;
      for (int k = d.ndim - 1; k >= 0; --k) {
        t.strides[k] = s;
        s *= d.shape[k];
      }
    }
    tensors_[args[i].name] = t;
  }
}

const KTensor& KArgs::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw Refusal("missing tensor argument '" + name + "'");
  return it->second;
}

KParams::KParams(const char* json) {
  const auto j = nlohmann::json::parse(json ? json : "{}");
  if (!j.is_object()) throw Refusal("kernel parameters must be a JSON object");
  for (const auto& [k, v] : j.items()) {
    if (v.is_number())
      num_[k] = v.get<double>();
    else if (v.is_boolean())
      num_[k] = v.get<bool>() ? 1.0 : 0.0;
    else if (v.is_string())
      str_[k] = v.get<std::string>();
    else
      throw Refusal("kernel parameter '" + k + "' must be a number, boolean or string");
  }
}

int64_t KParams::i(const std::string& key) const {
  auto it = num_.find(key);
  if (it == num_.end()) throw Refusal("missing integer parameter '" + key + "'");
  // Converting a double outside int64's range (1e300, NaN) is undefined behaviour (found by
  // fuzz_kernel_params, docs/fuzzing.md): such a parameter is refused instead.
  const double v = it->second;
  if (!(v >= -9.2e18 && v <= 9.2e18) || v != std::trunc(v))
    throw Refusal("integer parameter '" + key + "' is " + nlohmann::json(v).dump() +
                  ", not an integer in range");
  return static_cast<int64_t>(v);
}
double KParams::f(const std::string& key) const {
  auto it = num_.find(key);
  if (it == num_.end()) throw Refusal("missing number parameter '" + key + "'");
  return it->second;
}
bool KParams::b(const std::string& key) const {
  return f(key) != 0.0;
}
const std::string& KParams::s(const std::string& key) const {
  auto it = str_.find(key);
  if (it == str_.end()) throw Refusal("missing string parameter '" + key + "'");
  return it->second;
}

namespace {
struct Entry {
  KernelFn fn = nullptr;
  GraphSafety graph = kNotGraphSafe;
  std::string properties;  // empty: none declared
};
std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> r;
  return r;
}
thread_local void* current_stream = nullptr;
}  // namespace

KernelRegistrar::KernelRegistrar(const char* op, KernelFn fn, GraphSafety graph,
                                 const char* properties) {
  registry()[op] = Entry{fn, graph, properties ? properties : ""};
}
KernelFn find_kernel(const std::string& op) {
  auto it = registry().find(op);
  return it == registry().end() ? nullptr : it->second.fn;
}
bool graph_safe(const std::string& op) {
  auto it = registry().find(op);
  return it != registry().end() && it->second.graph == kGraphSafe;
}
const char* kernel_properties(const char* op) {
  const auto it = registry().find(op ? op : "");
  return it == registry().end() || it->second.properties.empty() ? nullptr
                                                                 : it->second.properties.c_str();
}
void* launch_stream() {
  return current_stream;
}
void set_launch_stream(void* stream) {
  current_stream = stream;
}
std::string kernel_names() {
  std::string s;
  for (const auto& [k, v] : registry()) s += (s.empty() ? "" : ",") + k;
  return s;
}

static const char* dtype_text(DLDataType t) {
  static thread_local char buf[32];
  const char* c = t.code == kDLFloat    ? "float"
                  : t.code == kDLBfloat ? "bfloat"
                  : t.code == kDLInt    ? "int"
                                        : "uint";
  snprintf(buf, sizeof buf, "%s%d", c, t.bits);
  return buf;
}

void expect_dtype(const KTensor& t, const char* name, DLDataTypeCode code, int bits) {
  if (t.dtype.code != code || t.dtype.bits != bits) {
    DLDataType want{static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1};
    throw Refusal(std::string("tensor '") + name + "' has dtype " + dtype_text(t.dtype) +
                  ", expected " + dtype_text(want));
  }
}
void expect_ndim(const KTensor& t, const char* name, int ndim) {
  if (t.ndim != ndim)
    throw Refusal(std::string("tensor '") + name + "' has " + std::to_string(t.ndim) +
                  " dimensions, expected " + std::to_string(ndim));
}
void expect_contiguous_last(const KTensor& t, const char* name) {
  if (t.ndim > 0 && t.shape[t.ndim - 1] > 1 && t.strides[t.ndim - 1] != 1)
    throw Refusal(std::string("tensor '") + name + "' must have unit stride in its last dimension");
}

}  // namespace ack
