// Eigen views over attncheck tensors, for reference code only (Eigen never reaches headers that
// kernels see). References convert inputs to contiguous f64 once (exact for every input dtype) and
// then work on Eigen maps.
#pragma once
#include <stdexcept>

#include <Eigen/Dense>

#include "core/tensor.h"

namespace attncheck::ref {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapD = Eigen::Map<MatD>;
using ConstMapD = Eigen::Map<const MatD>;

// Contiguous f64 copy of any tensor (exact: every supported dtype embeds in double).
inline Tensor to_f64(const Tensor& t) {
  return t.dtype() == DType::f64 && t.is_contiguous() ? t : t.to(DType::f64);
}

// Row-major [rows, cols] map over a contiguous f64 tensor (leading dims folded into rows).
inline MapD as_matrix(const Tensor& t) {
  if (t.dtype() != DType::f64 || !t.is_contiguous())
    throw std::invalid_argument("as_matrix needs a contiguous f64 tensor, got " + t.describe());
  const int64_t cols = t.ndim() ? t.size(-1) : 1;
  const int64_t rows = cols ? t.numel() / cols : 0;
  return MapD(reinterpret_cast<double*>(t.data()), rows, cols);
}

}  // namespace attncheck::ref
