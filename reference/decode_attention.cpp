#include "decode_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "eigen_bridge.h"

namespace attncheck::ref {

namespace {

using Eigen::VectorXd;

std::string str(int64_t v) {
  return std::to_string(v);
}

// Inputs checked once and converted to contiguous f64: q [B, Hq, Lk], k [T, Hkv, Lk] and
// v [T, Hkv, Lv] with T = num_pages * P token rows (exact for every input dtype).
struct Prepared {
  int64_t B = 0, Hq = 0, Hkv = 0, G = 0, Lk = 0, Lv = 0, P = 1, num_pages = 0;
  Tensor q, k, v;
  std::vector<int64_t> lens;
  std::vector<std::vector<int64_t>> pages;  // per request, the pages it uses
  double sm_scale = 1, cap = 0, k_scale = 1, v_scale = 1;
};

// Pages `ids` of a cache ([num_pages, P, Hkv, D] or [T, Hkv, D]) as f64 rows [ids * P, Hkv, D].
Tensor used_pages(const Tensor& cache, const std::vector<int64_t>& ids, int64_t P) {
  const int64_t hkv = cache.size(-2), D = cache.size(-1);
  Tensor out = Tensor::empty(DType::f64, {static_cast<int64_t>(ids.size()) * P, hkv, D});
  const int64_t per_page = P * hkv * D;
  for (size_t u = 0; u < ids.size(); ++u) {
    const Tensor page = to_f64(cache.select(0, ids[u]));
    std::memcpy(out.data() + static_cast<int64_t>(u) * per_page * 8, page.data(),
                static_cast<size_t>(per_page) * 8);
  }
  return out;
}

Prepared prepare(const DecodeAttentionInputs& in, bool allow_empty) {
  Prepared p;
  const Tensor &q = in.q, &k = in.k_buffer, &v = in.v_buffer;
  if (q.ndim() != 3) throw std::invalid_argument("q must be [B, Hq, Lk], got " + q.describe());
  if (k.ndim() != 3 && k.ndim() != 4)
    throw std::invalid_argument("k_buffer must be [num_pages, P, Hkv, Lk] or [T, Hkv, Lk], got " +
                                k.describe());
  if (v.ndim() != k.ndim())
    throw std::invalid_argument("v_buffer and k_buffer must have the same rank");
  for (int64_t d = 0; d + 1 < k.ndim(); ++d)
    if (k.size(d) != v.size(d))
      throw std::invalid_argument("k_buffer and v_buffer differ in dim " + str(d) + ": " +
                                  k.describe() + " vs " + v.describe());
  p.B = q.size(0);
  p.Hq = q.size(1);
  p.Lk = q.size(2);
  p.Hkv = k.size(-2);
  p.Lv = v.size(-1);
  p.P = k.ndim() == 4 ? k.size(1) : 1;
  p.num_pages = k.size(0);
  if (k.size(-1) != p.Lk)
    throw std::invalid_argument("q has Lk " + str(p.Lk) + " but k_buffer " + str(k.size(-1)));
  if (p.Hkv < 1 || p.Hq % p.Hkv != 0)
    throw std::invalid_argument("Hq " + str(p.Hq) + " is not a multiple of Hkv " + str(p.Hkv));
  p.G = p.Hq / p.Hkv;
  const Tensor &table = in.req_to_token, &lens = in.seq_lens;
  if (table.dtype() != DType::i32 || lens.dtype() != DType::i32)
    throw std::invalid_argument("req_to_token and seq_lens must be int32");
  if (table.ndim() != 2 || table.size(0) != p.B || lens.ndim() != 1 || lens.size(0) != p.B)
    throw std::invalid_argument("req_to_token must be [B, W] and seq_lens [B] with B = " +
                                str(p.B));
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t len = lens.at<int32_t>({b});
    if (len < 0 || (len == 0 && !allow_empty))
      throw std::invalid_argument(
          "request " + str(b) + " has length " + str(len) +
          (len == 0 ? ": undefined (vLLM's stage 2 computes 0 / 0)" : ": negative"));
    const int64_t np = (len + p.P - 1) / p.P;
    if (np > table.size(1))
      throw std::invalid_argument("request " + str(b) + " needs " + str(np) +
                                  " pages, the table has " + str(table.size(1)));
    std::vector<int64_t> ids;
    for (int64_t j = 0; j < np; ++j) {
      const int64_t id = table.at<int32_t>({b, j});
      if (id < 0 || id >= p.num_pages)
        throw std::invalid_argument("request " + str(b) + " page " + str(j) + " is " + str(id) +
                                    ", outside [0, " + str(p.num_pages) + ")");
      ids.push_back(id);
    }
    p.lens.push_back(len);
    p.pages.push_back(std::move(ids));
  }
  // Only the pages some request reads are converted, renumbered densely in p.pages: a
  // large-offset case's cache spans gigabytes of which the host holds only those pages.
  std::vector<int64_t> used;  // dense index -> page id
  std::map<int64_t, int64_t> dense;
  for (auto& ids : p.pages)
    for (auto& id : ids) {
      const auto [it, fresh] = dense.emplace(id, static_cast<int64_t>(used.size()));
      if (fresh) used.push_back(id);
      id = it->second;
    }
  p.q = to_f64(q);
  p.k = used_pages(k, used, p.P);
  p.v = used_pages(v, used, p.P);
  p.sm_scale = in.sm_scale;
  p.cap = in.logit_cap;
  p.k_scale = in.k_scale;
  p.v_scale = in.v_scale;
  return p;
}

// Rows of `buf` ([T, Hkv, D] f64) for tokens [start, end) of request b, KV head kvh, times scale.
MatD gather(const Prepared& p, const Tensor& buf, int64_t b, int64_t kvh, int64_t start,
            int64_t end, double scale) {
  const int64_t D = buf.size(2);
  const auto* base = reinterpret_cast<const double*>(buf.data());
  MatD out(end - start, D);
  for (int64_t n = start; n < end; ++n) {
    const int64_t row = p.pages[b][n / p.P] * p.P + n % p.P;
    out.row(n - start) =
        Eigen::Map<const Eigen::RowVectorXd>(base + (row * p.Hkv + kvh) * D, D) * scale;
  }
  return out;
}

// The query heads of KV head kvh for request b: [G, Lk].
MatD query_group(const Prepared& p, int64_t b, int64_t kvh) {
  const auto* base = reinterpret_cast<const double*>(p.q.data());
  return Eigen::Map<const MatD>(base + (b * p.Hq + kvh * p.G) * p.Lk, p.G, p.Lk);
}

// Scaled, optionally soft-capped scores [G, n].
MatD scores(const Prepared& p, const MatD& q, const MatD& k) {
  MatD s = (q * k.transpose()) * p.sm_scale;
  if (p.cap > 0) s = (s.array() / p.cap).tanh() * p.cap;
  return s;
}

// Softmax over tokens [start, end): normalized output [G, Lv] and log-sum-exp [G].
void attend(const Prepared& p, int64_t b, int64_t kvh, int64_t start, int64_t end, MatD& o,
            VectorXd& lse) {
  const MatD k = gather(p, p.k, b, kvh, start, end, p.k_scale);
  const MatD v = gather(p, p.v, b, kvh, start, end, p.v_scale);
  const MatD s = scores(p, query_group(p, b, kvh), k);
  const VectorXd m = s.rowwise().maxCoeff();
  const MatD e = (s.colwise() - m).array().exp().matrix();
  const VectorXd l = e.rowwise().sum();
  o = l.cwiseInverse().asDiagonal() * (e * v);
  lse = m.array() + l.array().log();
}

}  // namespace

std::pair<int64_t, int64_t> split_bounds(int64_t len, int64_t num_splits, int64_t split) {
  if (num_splits < 1) throw std::invalid_argument("num_kv_splits must be >= 1");
  const int64_t per = (len + num_splits - 1) / num_splits;
  const int64_t start = per * split;
  return {start, std::min(start + per, len)};
}

DecodeAttentionResult decode_attention(const DecodeAttentionInputs& in) {
  const Prepared p = prepare(in, false);
  DecodeAttentionResult r{Tensor::empty(DType::f64, {p.B, p.Hq, p.Lv}),
                          Tensor::empty(DType::f64, {p.B, p.Hq})};
  auto* o = reinterpret_cast<double*>(r.o.data());
  auto* lse = reinterpret_cast<double*>(r.lse.data());
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t kvh = 0; kvh < p.Hkv; ++kvh) {
      MatD og;
      VectorXd lg;
      attend(p, b, kvh, 0, p.lens[b], og, lg);
      const int64_t h0 = b * p.Hq + kvh * p.G;
      MapD(o + h0 * p.Lv, p.G, p.Lv) = og;
      Eigen::Map<VectorXd>(lse + h0, p.G) = lg;
    }
  return r;
}

Tensor decode_stage1(const DecodeAttentionInputs& in, int64_t num_splits) {
  if (num_splits < 1) throw std::invalid_argument("num_kv_splits must be >= 1");
  const Prepared p = prepare(in, true);
  const int64_t S = num_splits, W = p.Lv + 1;
  Tensor out = Tensor::full(DType::f64, {p.B, p.Hq, S, W}, std::nan(""));
  auto* base = reinterpret_cast<double*>(out.data());
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t kvh = 0; kvh < p.Hkv; ++kvh)
      for (int64_t s = 0; s < S; ++s) {
        const auto [start, end] = split_bounds(p.lens[b], S, s);
        if (end <= start) continue;
        MatD og;
        VectorXd lg;
        attend(p, b, kvh, start, end, og, lg);
        for (int64_t g = 0; g < p.G; ++g) {
          double* slot = base + ((b * p.Hq + kvh * p.G + g) * S + s) * W;
          Eigen::Map<Eigen::RowVectorXd>(slot, p.Lv) = og.row(g);
          slot[p.Lv] = lg(g);
        }
      }
  return out;
}

DecodeAttentionResult decode_stage2(const Tensor& partials, const Tensor& seq_lens) {
  if (partials.ndim() != 4 || seq_lens.ndim() != 1 || seq_lens.size(0) != partials.size(0))
    throw std::invalid_argument("decode_stage2 needs partials [B, Hq, S, Lv + 1] and seq_lens [B]");
  const int64_t B = partials.size(0), Hq = partials.size(1), S = partials.size(2);
  const int64_t Lv = partials.size(3) - 1;
  const Tensor part = to_f64(partials);
  const auto* pb = reinterpret_cast<const double*>(part.data());
  DecodeAttentionResult r{Tensor::empty(DType::f64, {B, Hq, Lv}),
                          Tensor::empty(DType::f64, {B, Hq})};
  auto* o = reinterpret_cast<double*>(r.o.data());
  auto* lse = reinterpret_cast<double*>(r.lse.data());
  for (int64_t b = 0; b < B; ++b) {
    const auto len = static_cast<int64_t>(seq_lens.get({b}));
    for (int64_t h = 0; h < Hq; ++h) {
      Eigen::RowVectorXd acc = Eigen::RowVectorXd::Zero(Lv);
      double e_sum = 0, e_max = -std::numeric_limits<double>::infinity();
      for (int64_t s = 0; s < S; ++s) {
        const auto [start, end] = split_bounds(len, S, s);
        if (end <= start) continue;
        const double* slot = pb + ((b * Hq + h) * S + s) * (Lv + 1);
        const double n = std::max(slot[Lv], e_max);
        const double alpha = std::exp(e_max - n), beta = std::exp(slot[Lv] - n);
        acc = acc * alpha + beta * Eigen::Map<const Eigen::RowVectorXd>(slot, Lv);
        e_sum = e_sum * alpha + beta;
        e_max = n;
      }
      Eigen::Map<Eigen::RowVectorXd>(o + (b * Hq + h) * Lv, Lv) = acc / e_sum;
      lse[b * Hq + h] = e_max + std::log(e_sum);
    }
  }
  return r;
}

DecodeErrorTerms decode_error_terms(const DecodeAttentionInputs& in) {
  const Prepared p = prepare(in, false);
  auto bh = [&] { return Tensor::empty(DType::f64, {p.B, p.Hq}); };
  DecodeErrorTerms t{bh(), bh(), bh(), bh(), bh(), bh()};
  auto ptr = [](const Tensor& x) { return reinterpret_cast<double*>(x.data()); };
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t kvh = 0; kvh < p.Hkv; ++kvh) {
      const MatD q = query_group(p, b, kvh);
      const MatD k = gather(p, p.k, b, kvh, 0, p.lens[b], p.k_scale);
      const MatD v = gather(p, p.v, b, kvh, 0, p.lens[b], p.v_scale);
      const MatD s = scores(p, q, k);
      const VectorXd m = s.rowwise().maxCoeff();
      MatD w = (s.colwise() - m).array().exp().matrix();
      w = w.rowwise().sum().cwiseInverse().asDiagonal() * w;
      const MatD abs_v = v.cwiseAbs();
      const MatD o = w * v;
      const VectorXd abs_scores =
          ((q.cwiseAbs() * k.cwiseAbs().transpose()) * std::fabs(p.sm_scale)).rowwise().maxCoeff();
      const double v_max = abs_v.maxCoeff();
      for (int64_t g = 0; g < p.G; ++g) {
        const int64_t i = b * p.Hq + kvh * p.G + g;
        Eigen::Index top = 0;
        s.row(g).maxCoeff(&top);
        double second = -std::numeric_limits<double>::infinity();
        for (Eigen::Index n = 0; n < s.cols(); ++n)
          if (n != top) second = std::max(second, s(g, n));
        const Eigen::RowVectorXd w1 = w.row(g) * abs_v;
        ptr(t.score_abs)[i] = abs_scores(g);
        ptr(t.weighted_abs_v)[i] = w1.maxCoeff();
        ptr(t.weighted_abs_v_rest)[i] = (w1 - w(g, top) * abs_v.row(top)).maxCoeff();
        ptr(t.weighted_spread)[i] = (w.row(g) * (v.rowwise() - o.row(g)).cwiseAbs()).maxCoeff();
        ptr(t.score_gap)[i] = s(g, top) - second;
        ptr(t.v_abs_max)[i] = v_max;
      }
    }
  return t;
}

}  // namespace attncheck::ref
