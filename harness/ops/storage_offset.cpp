#include "ops/storage_offset.h"

#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>

namespace attncheck {

void shift_storages(Problem& prob, int64_t bytes) {
  if (bytes <= 0 || bytes % 16 != 0)
    throw std::invalid_argument("shift_storages: " + std::to_string(bytes) +
                                " bytes is not a positive multiple of 16");
  std::map<const Storage*, Tensor> moved;  // old storage -> the new one, as a flat u8 tensor
  for (auto& a : prob.args) {
    const auto& old = a.tensor.storage();
    if (!old || old->sparse()) continue;
    auto it = moved.find(old.get());
    if (it == moved.end()) {
      const auto size = static_cast<int64_t>(old->bytes.size());
      Tensor flat = Tensor::filled_bytes(DType::u8, {bytes + size}, std::byte{0xFF});
      if (size > 0) std::memcpy(flat.data() + bytes, old->bytes.data(), old->bytes.size());
      it = moved.emplace(old.get(), flat).first;
    }
    const auto es = static_cast<int64_t>(a.tensor.element_size());
    const Tensor& flat = it->second;
    if (flat.numel() % es != 0)
      throw std::logic_error("shift_storages: storage of '" + a.name +
                             "' is not a whole number of its elements");
    const Tensor typed = flat.view_as(a.tensor.dtype());
    a.tensor = typed.as_strided(a.tensor.shape(), a.tensor.strides(),
                                a.tensor.offset() + bytes / es);
  }
}

}  // namespace attncheck
