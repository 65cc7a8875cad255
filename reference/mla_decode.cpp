#include "mla_decode.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "core/numeric.h"
#include "eigen_bridge.h"
#include "core/case.h"
#include "page_indices.h"

namespace attncheck::ref {

// ---- the 16-head rule ----
bool mla_num_heads_valid(int64_t n) {
  if (n < 1) return false;
  return n >= kMlaHeadTile ? n % kMlaHeadTile == 0 : kMlaHeadTile % n == 0;
}

std::string mla_num_heads_message(int64_t n) {
  return "Aiter MLA requires that num_heads be multiples or divisors of 16, but provided " +
         std::to_string(n) + " number of heads.\nTry adjusting tensor_parallel_size value.";
}

void mla_check_num_heads(int64_t n) {
  if (!mla_num_heads_valid(n)) throw InvalidConfig(mla_num_heads_message(n));
}

int64_t mla_padded_heads(int64_t n) {
  return n < kMlaHeadTile ? kMlaHeadTile : n;
}

Tensor mla_pad_q(const Tensor& q) {
  if (q.ndim() != 3)
    throw std::invalid_argument("mla_pad_q: q must be [T, N, L], got " + q.describe());
  const int64_t N = q.size(1);
  mla_check_num_heads(N);
  if (N >= kMlaHeadTile) return q;
  const int64_t r = kMlaHeadTile / N;
  Tensor out = Tensor::empty(q.dtype(), {q.size(0), kMlaHeadTile, q.size(2)});
  for (int64_t j = 0; j < kMlaHeadTile; ++j)  // bit copies: padding never rounds
    out.select(1, j).copy_from(q.select(1, j / r));
  return out;
}

Tensor mla_unpad_o(const Tensor& o, int64_t num_heads) {
  mla_check_num_heads(num_heads);
  if (num_heads >= kMlaHeadTile) {
    if (o.ndim() < 2 || o.size(1) != num_heads)
      throw std::invalid_argument("mla_unpad_o: expected " + std::to_string(num_heads) +
                                  " heads in dim 1, got " + o.describe());
    return o;
  }
  if (o.ndim() < 2 || o.size(1) != kMlaHeadTile)
    throw std::invalid_argument("mla_unpad_o: expected 16 padded heads in dim 1, got " +
                                o.describe());
  return o.slice(1, 0, kMlaHeadTile, kMlaHeadTile / num_heads);
}

// ---- element decoding (fast paths; the Tensor accessors go through an index vector) ----
namespace {

using DecodeFn = double (*)(const std::byte*);

template <DType T>
double decode_fp8(const std::byte* p) {
  static const std::array<double, 256> lut = [] {
    std::array<double, 256> t{};
    for (int c = 0; c < 256; ++c)
      t[static_cast<size_t>(c)] = fp8_decode(static_cast<uint8_t>(c), T);
    return t;
  }();
  return lut[static_cast<uint8_t>(*p)];
}

DecodeFn decoder(DType t) {
  switch (t) {
    case DType::f64:
      return [](const std::byte* p) {
        double v;
        std::memcpy(&v, p, 8);
        return v;
      };
    case DType::f32:
      return [](const std::byte* p) {
        float v;
        std::memcpy(&v, p, 4);
        return static_cast<double>(v);
      };
    case DType::bf16:
      return [](const std::byte* p) {
        uint16_t v;
        std::memcpy(&v, p, 2);
        return static_cast<double>(bf16_to_float(v));
      };
    case DType::f16:
      return [](const std::byte* p) {
        uint16_t v;
        std::memcpy(&v, p, 2);
        return static_cast<double>(f16_to_float(v));
      };
    case DType::e4m3fn:
      return decode_fp8<DType::e4m3fn>;
    case DType::e4m3fnuz:
      return decode_fp8<DType::e4m3fnuz>;
    case DType::e5m2:
      return decode_fp8<DType::e5m2>;
    case DType::e5m2fnuz:
      return decode_fp8<DType::e5m2fnuz>;
    default:
      throw std::invalid_argument("MLA reference: " + std::string(dtype_name(t)) +
                                  " is not a float dtype");
  }
}

}  // namespace

void check_rows_held(const Tensor& cache, const std::vector<int64_t>& slots) {
  const int64_t P = cache.size(1), Lk = cache.size(2);
  if (!cache.storage()->sparse() || Lk == 0) return;
  for (const int64_t s : slots) {
    (void)cache.element_ptr(Index{s / P, s % P, 0});
    (void)cache.element_ptr(Index{s / P, s % P, Lk - 1});
  }
}

Tensor gather_latent_rows(const LatentCache& kv, const std::vector<int64_t>& slots) {
  const Tensor& c = kv.cache;
  if (c.ndim() != 3)
    throw std::invalid_argument("latent cache must be [num_blocks, P, Lk], got " + c.describe());
  const int64_t P = c.size(1), Lk = c.size(2), num_slots = c.size(0) * P;
  const DecodeFn dec = decoder(c.dtype());
  const auto step = static_cast<int64_t>(c.element_size()) * c.stride(2);
  Tensor rows = Tensor::empty(DType::f64, {static_cast<int64_t>(slots.size()), Lk});
  double* out = reinterpret_cast<double*>(rows.data());
  for (size_t i = 0; i < slots.size(); ++i) {
    const int64_t s = slots[i];
    if (s < 0 || s >= num_slots)
      throw std::invalid_argument("cache slot " + std::to_string(s) + " outside [0, " +
                                  std::to_string(num_slots) + ")");
    // Both ends of the row are checked: a sparse cache (large offsets) holds only the blocks the
    // requests read, and reading any other row throws instead of reading garbage.
    const std::byte* row = c.element_ptr(Index{s / P, s % P, 0});
    (void)c.element_ptr(Index{s / P, s % P, Lk - 1});
    for (int64_t d = 0; d < Lk; ++d)
      out[static_cast<int64_t>(i) * Lk + d] = kv.kv_scale * dec(row + d * step);
  }
  return rows;
}

Tensor query_rows(const Tensor& q, int64_t token) {
  const int64_t N = q.size(1), Lk = q.size(2);
  const DecodeFn dec = decoder(q.dtype());
  const auto step = static_cast<int64_t>(q.element_size()) * q.stride(2);
  Tensor rows = Tensor::empty(DType::f64, {N, Lk});
  double* out = reinterpret_cast<double*>(rows.data());
  for (int64_t h = 0; h < N; ++h) {
    const std::byte* row = q.element_ptr(Index{token, h, 0});
    (void)q.element_ptr(Index{token, h, Lk - 1});
    for (int64_t d = 0; d < Lk; ++d) out[h * Lk + d] = dec(row + d * step);
  }
  return rows;
}

void attend_rows(const Tensor& q, const Tensor& k, const std::vector<int64_t>& visible,
                 double scale, int64_t lv, const Tensor& out, const Tensor& lse) {
  const auto Q = as_matrix(q);
  const auto K = as_matrix(k);
  auto O = as_matrix(out);
  auto Lse = as_matrix(lse.reshape({lse.numel(), 1}));
  const int64_t R = Q.rows(), L = K.rows();
  MatD S = (scale * Q) * K.transpose();  // [R, L]
  for (int64_t r = 0; r < R; ++r) {
    const int64_t vis = visible[static_cast<size_t>(r)];
    if (vis > L) throw std::invalid_argument("attend_rows: visible count beyond the key rows");
    if (vis <= 0) {
      S.row(r).setZero();
      Lse(r, 0) = -std::numeric_limits<double>::infinity();
      continue;
    }
    const double m = S.row(r).head(vis).maxCoeff();
    double l = 0;
    for (int64_t t = 0; t < vis; ++t) l += (S(r, t) = std::exp(S(r, t) - m));
    S.row(r).head(vis) /= l;
    S.row(r).tail(L - vis).setZero();
    Lse(r, 0) = m + std::log(l);
  }
  O.noalias() = S * K.leftCols(lv);
}

MlaResult mla_decode(const Tensor& q, const LatentCache& kv, const Tensor& block_table,
                     const Tensor& seq_lens, const Tensor& query_start_loc, double scale,
                     int64_t lv) {
  if (q.ndim() != 3) throw std::invalid_argument("q must be [T, N, Lk], got " + q.describe());
  const int64_t T = q.size(0), N = q.size(1), Lk = q.size(2);
  mla_check_num_heads(N);
  const Tensor& c = kv.cache;
  if (c.ndim() != 3 || c.size(2) != Lk)
    throw std::invalid_argument("cache must be [num_blocks, P, " + std::to_string(Lk) + "], got " +
                                c.describe());
  if (lv < 1 || lv > Lk) throw std::invalid_argument("Lv must be in [1, Lk]");
  const int64_t B = seq_lens.size(0), P = c.size(1);
  if (query_start_loc.size(0) != B + 1)
    throw std::invalid_argument("query_start_loc must have B + 1 entries");
  if (query_start_loc.at<int32_t>({0}) != 0 || query_start_loc.at<int32_t>({B}) != T)
    throw std::invalid_argument("query_start_loc must run from 0 to T = " + std::to_string(T));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t qlen = query_start_loc.at<int32_t>({b + 1}) - query_start_loc.at<int32_t>({b});
    if (qlen < 0)
      throw std::invalid_argument("query_start_loc decreases at request " + std::to_string(b));
    if (qlen > 0 && seq_lens.at<int32_t>({b}) < qlen)
      throw std::invalid_argument("request " + std::to_string(b) + ": kv length " +
                                  std::to_string(seq_lens.at<int32_t>({b})) +
                                  " is shorter than its " + std::to_string(qlen) + " query tokens");
  }
  // Padded heads, flat page-size-1 slots (as the AITER path does it).
  const Tensor qp = mla_pad_q(q);
  const int64_t Np = qp.size(1);
  const Tensor slots_t = page_indices(block_table, seq_lens, P);
  const Tensor cu = cumulative_lengths(seq_lens);
  std::vector<int64_t> slots(static_cast<size_t>(slots_t.numel()));
  for (size_t i = 0; i < slots.size(); ++i) {
    slots[i] = slots_t.at<int32_t>({static_cast<int64_t>(i)});
    if (slots[i] < 0 || slots[i] >= c.size(0) * P)
      throw std::invalid_argument("block table points outside the cache (flat slot " +
                                  std::to_string(slots[i]) + ")");
  }
  check_rows_held(c, slots);
  Tensor out_p = Tensor::zeros(DType::f64, {T, Np, lv});
  Tensor lse_p = Tensor::zeros(DType::f64, {T, Np});
  // Step 3, one request at a time: rows (i, h) of its qlen x Np query block.
  auto request = [&](int64_t b) {
    const int64_t q0 = query_start_loc.at<int32_t>({b});
    const int64_t qlen = query_start_loc.at<int32_t>({b + 1}) - q0;
    const int64_t L = seq_lens.at<int32_t>({b});
    if (qlen == 0) return;
    const auto first = slots.begin() + cu.at<int32_t>({b});
    const Tensor keys = gather_latent_rows(kv, std::vector<int64_t>(first, first + L));
    Tensor rows = Tensor::empty(DType::f64, {qlen * Np, Lk});
    std::vector<int64_t> visible(static_cast<size_t>(qlen * Np));
    for (int64_t i = 0; i < qlen; ++i) {
      as_matrix(rows).middleRows(i * Np, Np) = as_matrix(query_rows(qp, q0 + i));
      for (int64_t h = 0; h < Np; ++h) visible[static_cast<size_t>(i * Np + h)] = L - qlen + i + 1;
    }
    attend_rows(rows, keys, visible, scale, lv, out_p.slice(0, q0, q0 + qlen),
                lse_p.slice(0, q0, q0 + qlen));
  };
  if (B > 1) {
#pragma omp parallel for schedule(dynamic)
    for (int64_t b = 0; b < B; ++b) request(b);
  } else if (B == 1) {
    request(0);  // outside a parallel region, so Eigen's GEMM may use every core
  }
  // Step 4: strided un-pad (a view), materialized for the caller.
  return {mla_unpad_o(out_p, N).contiguous(),
          mla_unpad_o(lse_p.unsqueeze(2), N).select(2, 0).contiguous()};
}

MlaInputScales mla_input_scales(const Tensor& q, const LatentCache& kv,
                                const std::vector<int64_t>& slots, int64_t lv, int64_t keys_max) {
  MlaInputScales s;
  s.keys_max = keys_max;
  for (int64_t t = 0; t < q.size(0); ++t) {
    const Tensor rows = query_rows(q, t);
    s.q_norm_max = std::max(s.q_norm_max, as_matrix(rows).rowwise().norm().maxCoeff());
  }
  constexpr size_t kChunk = 4096;
  for (size_t i = 0; i < slots.size(); i += kChunk) {
    const std::vector<int64_t> part(
        slots.begin() + static_cast<std::ptrdiff_t>(i),
        slots.begin() + static_cast<std::ptrdiff_t>(std::min(slots.size(), i + kChunk)));
    const Tensor rows = gather_latent_rows(kv, part);
    const auto M = as_matrix(rows);
    if (M.rows() == 0) continue;
    s.kv_norm_max = std::max(s.kv_norm_max, M.rowwise().norm().maxCoeff());
    s.v_abs_max = std::max(s.v_abs_max, M.leftCols(lv).cwiseAbs().maxCoeff());
  }
  return s;
}

}  // namespace attncheck::ref
