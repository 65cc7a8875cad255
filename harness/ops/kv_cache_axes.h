// The cache axes kv_cache_write and kv_gather share (docs/ops/kv_cache_write.md,
// docs/ops/kv_gather.md): how K and V lie in their storage, the cache's element type, and the
// model dtype. Each op gives its own help text (and its own subset of cache types).
#pragma once
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "ops/typed_op.h"
#include "reference/kv_gather.h"

namespace attncheck {

// The cache's element type: the model's (a plain copy), an fp8 format (quantized), or int8
// (per-token quant only).
enum class KvDtype { model, e4m3fn, e4m3fnuz, int8 };

inline DType kv_cache_dtype(KvDtype kv, DType model) {
  switch (kv) {
    case KvDtype::model:
      return model;
    case KvDtype::e4m3fn:
      return DType::e4m3fn;
    case KvDtype::e4m3fnuz:
      return DType::e4m3fnuz;
    case KvDtype::int8:
      return DType::i8;
  }
  throw std::logic_error("KvDtype without a dtype");
}

// The ABI's fp8_format string of an fp8 cache dtype.
inline std::string fp8_format_name(DType fp8) {
  return fp8 == DType::e4m3fn ? "e4m3fn" : "e4m3fnuz";
}

// strides: contiguous | hybrid | padded | separate | packed (ref::KvStrides).
template <class P>
void add_kv_strides(Fields<P>& f, std::type_identity_t<ref::KvStrides P::*> member,
                    std::string help) {
  using S = ref::KvStrides;
  f.choice("strides", "", member,
           {{S::contiguous, "contiguous"},
            {S::hybrid, "hybrid"},
            {S::padded, "padded"},
            {S::separate, "separate"},
            {S::packed, "packed"}},
           std::move(help));
}

// kv (prefix "kv"): model | e4m3fn | e4m3fnuz, and int8 where `with_int8`.
template <class P>
void add_kv_dtype(Fields<P>& f, std::type_identity_t<KvDtype P::*> member, bool with_int8,
                  std::string help) {
  std::vector<std::pair<KvDtype, std::string>> names = {
      {KvDtype::model, "model"}, {KvDtype::e4m3fn, "e4m3fn"}, {KvDtype::e4m3fnuz, "e4m3fnuz"}};
  if (with_int8) names.emplace_back(KvDtype::int8, "int8");
  f.choice("kv", "kv", member, std::move(names), std::move(help));
}

// dtype: the model dtype, bf16 | f16.
template <class P>
void add_model_dtype(Fields<P>& f, std::type_identity_t<DType P::*> member, std::string help) {
  f.add("dtype", "", member, std::move(help)).only({"bf16", "f16"});
}

}  // namespace attncheck
