// Indexer quantizers (docs/ops/indexer.md, Quantization and Weights): fp32 arithmetic on the
// bf16 inputs exactly as the kernels do it, so scales and bytes compare bitwise.
#include <algorithm>
#include <cmath>
#include <vector>

#include "indexer.h"
#include "indexer_internal.h"

namespace attncheck::ref::indexer {

using detail::expect;

float quant_max(DType fp8, QuantMaxVariant variant) {
  if (fp8 == DType::e4m3fn) return 448.0f;
  if (fp8 == DType::e4m3fnuz) return variant == QuantMaxVariant::vllm ? 224.0f : 240.0f;
  throw std::invalid_argument("quant_max: not an e4m3 format: " + std::string(dtype_name(fp8)));
}

float ue8m0_scale(float amax, float floor, float quant_max_value) {
  const float s = std::max(amax, floor) / quant_max_value;  // one fp32 rounding, as on the GPU
  int e = 0;
  const float m = std::frexp(s, &e);  // s = m * 2^e, m in [0.5, 1)
  return m == 0.5f ? s : std::ldexp(1.0f, e);
}

float quantize_group(const float* x, int64_t n, float floor, float quant_max_value, DType fp8,
                     bool clamp, uint8_t* bytes) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = ue8m0_scale(amax, floor, quant_max_value);
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i] / scale;  // exact: scale is a power of two
    if (clamp) v = std::clamp(v, -quant_max_value, quant_max_value);
    bytes[i] = fp8_encode(static_cast<double>(v), fp8, Saturation::saturate);
  }
  return scale;
}

QuantizedK quantize_k(const Tensor& k, DType fp8, float qmax) {
  detail::expect_dtype(k, DType::bf16, "k");
  expect(k.ndim() == 2 && k.size(1) == kHeadDim, "k must be [T, 128], got " + k.describe());
  const int64_t T = k.size(0);
  QuantizedK out{Tensor::empty(fp8, {T, kHeadDim}), Tensor::empty(DType::f32, {T})};
  auto* bytes = reinterpret_cast<uint8_t*>(out.values.data());
  std::vector<float> row(kHeadDim);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t d = 0; d < kHeadDim; ++d)
      row[d] = bf16_to_float(static_cast<uint16_t>(k.get_bits(Index{t, d})));
    out.scales.at<float>({t}) = quantize_group(row.data(), kHeadDim, kKAmaxFloor, qmax, fp8,
                                               /*clamp=*/false, bytes + t * kHeadDim);
  }
  return out;
}

QuantizedQ quantize_q(const Tensor& q, const Tensor& weights_raw, DType fp8, float qmax) {
  detail::expect_dtype(q, DType::bf16, "q");
  detail::expect_dtype(weights_raw, DType::bf16, "weights_raw");
  expect(q.ndim() == 3 && q.size(2) == kHeadDim, "q must be [T, H, 128], got " + q.describe());
  const int64_t T = q.size(0), H = q.size(1);
  expect(weights_raw.ndim() == 2 && weights_raw.size(0) == T && weights_raw.size(1) == H,
         "weights_raw must be [T, H], got " + weights_raw.describe());
  QuantizedQ out{Tensor::empty(fp8, {T, H, kHeadDim}), Tensor::empty(DType::f32, {T, H}),
                 Tensor::empty(DType::f32, {T, H})};
  auto* bytes = reinterpret_cast<uint8_t*>(out.q_fp8.data());
  // Python scalars reach the fp32 multiply rounded to fp32.
  const auto softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kHeadDim)));
  const auto head_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(H)));
  std::vector<float> group(kHeadDim);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t d = 0; d < kHeadDim; ++d)
        group[d] = bf16_to_float(static_cast<uint16_t>(q.get_bits(Index{t, h, d})));
      const float scale = quantize_group(group.data(), kHeadDim, kQAmaxFloor, qmax, fp8,
                                         /*clamp=*/true, bytes + (t * H + h) * kHeadDim);
      out.q_scale.at<float>({t, h}) = scale;
      const float raw = bf16_to_float(static_cast<uint16_t>(weights_raw.get_bits(Index{t, h})));
      float w = raw * scale;
      w = w * softmax_scale;
      w = w * head_scale;
      out.weights.at<float>({t, h}) = w;
    }
  return out;
}

}  // namespace attncheck::ref::indexer
