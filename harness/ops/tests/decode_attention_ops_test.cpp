// decode_attention op: problem construction, refusals, and its budgets judged against a float32
// emulation of the kernel's arithmetic (sequential fp32 dots, fp32 online softmax per BLOCK_N
// tokens, p rounded to the q dtype, split partials merged by their LSE, o rounded once). The
// emulation must pass every budget; with the pre-fix tile it must fail the 320/256 MLA cases.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <regex>

#include "core/numeric.h"
#include "ops/op.h"
#include "run/cases.h"
#include "run/evaluate.h"
#include "run/provenance.h"

namespace attncheck {
namespace {

const Op& op() {
  const Op* o = find_op("decode_attention");
  if (!o) throw std::runtime_error("decode_attention not registered");
  return *o;
}

float round_to(float x, DType t) {
  return static_cast<float>(decode_value(encode_value(x, t), t));
}

int64_t pow2(int64_t x) {
  int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}

// The kernel's arithmetic on the CPU (NVIDIA tiles). mutant_tile: the pre-fix tile, with V read
// from the K tile at V's pitch (the seed bug re-created by AC_MUTANT_DECODE_TILE_FROM_LK).
// no_max: the MHA kernel's exp(s) without a max subtraction (AC_MUTANT_DECODE_SOFTMAX_NO_MAX).
TensorMap emulate(const Problem& p, bool mutant_tile, bool no_max = false) {
  const Tensor &q = p.arg("q"), &kb = p.arg("k_buffer"), &vb = p.arg("v_buffer");
  const Tensor &table = p.arg("req_to_token"), &lens = p.arg("b_seq_len");
  const auto& kp = p.kernel_params;
  const int64_t S = kp.at("num_kv_splits").get<int64_t>();
  const bool mla = kp.at("is_mla").get<bool>(), fp8 = is_fp8(kb.dtype());
  const float cap = static_cast<float>(kp.at("logit_cap").get<double>());
  const float ks = static_cast<float>(kp.at("k_scale").get<double>());
  const float vs = static_cast<float>(kp.at("v_scale").get<double>());
  const float qk_scale = static_cast<float>(kp.at("sm_scale").get<double>()) * (fp8 ? ks : 1.0f);
  const int64_t B = q.size(0), Hq = q.size(1), Lk = q.size(2), Hkv = kb.size(-2), Lv = vb.size(-1);
  const int64_t P = kb.ndim() == 4 ? kb.size(1) : 1, G = Hq / Hkv;
  const bool grouped = G > 1, k_as_v = grouped && mla;
  const float acc_scale = fp8 ? (k_as_v ? ks : vs) : 1.0f;
  const int64_t block_n = grouped ? 32 : 64;
  const int64_t dmodel = mutant_tile ? (Lk == 576   ? 512
                                        : Lk == 288 ? 256
                                                    : pow2(Lk))
                         : mla       ? (Lk == 576   ? 512
                                        : Lk == 288 ? 256
                                                    : pow2(Lv))
                                     : pow2(Lk);
  const int64_t dv = pow2(Lv);
  const DType qt = q.dtype();
  const Tensor qf = q.to(DType::f32), kf = kb.to(DType::f32), vf = vb.to(DType::f32);
  const auto* qd = reinterpret_cast<const float*>(qf.data());
  const auto* kd = reinterpret_cast<const float*>(kf.data());
  const auto* vd = reinterpret_cast<const float*>(vf.data());
  auto row = [&](int64_t b, int64_t n) {
    return static_cast<int64_t>(table.get({b, n / P})) * P + n % P;
  };
  Tensor o = Tensor::empty(qt, {B, Hq, Lv}), lse = Tensor::empty(DType::f32, {B, Hq});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kvh = h / G, L = static_cast<int64_t>(lens.get({b}));
      const int64_t per = (L + S - 1) / S;
      std::vector<float> po(static_cast<size_t>(S * Lv)), pl(static_cast<size_t>(S));
      const float* qh = qd + (b * Hq + h) * Lk;
      for (int64_t s = 0; s < S; ++s) {
        const int64_t start = per * s, end = std::min(start + per, L);
        if (end <= start) continue;
        float m = -std::numeric_limits<float>::infinity(), l = 0;
        std::vector<float> acc(static_cast<size_t>(Lv), 0.0f);
        for (int64_t n0 = start; n0 < end; n0 += block_n) {
          const int64_t nv = std::min(block_n, end - n0);
          std::vector<float> sc(static_cast<size_t>(nv));
          float mx = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < nv; ++j) {
            const float* kr = kd + (row(b, n0 + j) * Hkv + kvh) * Lk;
            float dot = 0;
            for (int64_t d = 0; d < Lk; ++d) dot += qh[d] * kr[d];
            float x = dot * qk_scale;
            if (cap > 0) x = cap * (2.0f / (1.0f + std::exp(-2.0f * (x / cap))) - 1.0f);
            sc[j] = x;
            mx = std::max(mx, x);
          }
          const float m_new = no_max && !grouped ? 0.0f : std::max(m, mx);
          float sum = 0;
          for (auto& x : sc) {
            const float e = std::exp(x - m_new);
            sum += e;
            x = grouped ? round_to(e, qt) : e;
          }
          const float alpha = std::exp(m - m_new);
          l = l * alpha + sum;
          m = m_new;
          for (auto& a : acc) a *= alpha;
          for (int64_t j = 0; j < nv; ++j)
            for (int64_t d = 0; d < Lv; ++d) {
              float val;
              if (k_as_v && mutant_tile) {  // V aliased onto a K tile of pitch BLOCK_DMODEL
                const int64_t flat = j * dv + d, r = flat / dmodel, c = flat % dmodel;
                val = r < nv && c < Lk ? kd[(row(b, n0 + r) * Hkv + kvh) * Lk + c] : 0.0f;
              } else {
                val = vd[(row(b, n0 + j) * Hkv + kvh) * Lv + d];
              }
              acc[d] += sc[j] * val;
            }
        }
        for (int64_t d = 0; d < Lv; ++d) po[s * Lv + d] = acc[d] * (acc_scale / l);
        pl[s] = m + std::log(l);
      }
      for (int64_t d = 0; d <= Lv; ++d) {
        float acc = 0, e_sum = 0, e_max = -std::numeric_limits<float>::infinity();
        for (int64_t s = 0; s < S; ++s) {
          const int64_t start = per * s, end = std::min(start + per, L);
          if (end <= start) continue;
          const float n = std::max(pl[s], e_max);
          const float alpha = std::exp(e_max - n), beta = std::exp(pl[s] - n);
          if (d < Lv) acc = acc * alpha + beta * po[s * Lv + d];
          e_sum = e_sum * alpha + beta;
          e_max = n;
        }
        if (d < Lv)
          o.set({b, h, d}, acc / e_sum);
        else
          lse.set({b, h}, e_max + std::log(e_sum));
      }
    }
  return {{"o", o}, {"lse", lse}};
}

struct Judged {
  bool passed = true;
  double worst_ratio = 0;  // max over outputs of the worst element's error / allowance
  double atol_o = 0, atol_lse = 0;
  std::string message;
};

Judged judge(const Case& c, bool mutant_tile, bool no_max = false) {
  const Problem p = op().make(c);
  const TensorMap expected = op().reference(p);
  const auto results =
      check_outputs(op().checks(p, expected), expected, emulate(p, mutant_tile, no_max));
  Judged j;
  for (const auto& r : results) {
    j.passed = j.passed && r.passed;
    j.worst_ratio = std::max(j.worst_ratio, r.metrics.worst.ratio);
    (r.name == "o" ? j.atol_o : j.atol_lse) = r.budget.atol;
    j.message += r.name + ": " + r.message + "\n";
  }
  return j;
}

TEST(DecodeAttentionOp, MlaCaseAliasesVOntoK) {
  const Case c = op().make_case(Params::object());
  EXPECT_EQ(c.id,
            "decode_attention/d576x512-mla1-h16-hkv1-p16-sp4-cap0-bf16-kvsame-b4-ctx70-"
            "contiguous-s0");
  const Problem p = op().make(c);
  EXPECT_FALSE(p.expect_refusal);
  const Tensor &k = p.arg("k_buffer"), &v = p.arg("v_buffer");
  EXPECT_EQ(k.storage(), v.storage());
  EXPECT_EQ(v.shape(), (Shape{k.size(0), 16, 1, 512}));
  EXPECT_EQ(v.strides(), k.strides());
  EXPECT_TRUE(std::isnan(p.arg("o").get({0, 0, 0})));
  EXPECT_TRUE(std::isnan(p.arg("lse").get({3, 15})));
  EXPECT_EQ(p.kernel_params.at("is_mla"), true);
  EXPECT_FALSE(p.kernel_params.contains("fp8_format"));
}

TEST(DecodeAttentionOp, PageSizeOneIsATokenTableOverA3dCache) {
  const Problem p = op().make(op().make_case({{"page_size", 1}, {"is_mla", false}}));
  EXPECT_EQ(p.arg("k_buffer").ndim(), 3);
  EXPECT_EQ(p.arg("v_buffer").ndim(), 3);
  EXPECT_NE(p.arg("k_buffer").storage(), p.arg("v_buffer").storage());
}

TEST(DecodeAttentionOp, StridedAndCrossLayerViews) {
  const Problem s = op().make(op().make_case({{"layout", "strided"}}));
  EXPECT_EQ(s.arg("q").strides(), (Shape{16 * 624, 624, 1}));
  EXPECT_EQ(s.arg("q").offset(), 16);
  EXPECT_EQ(s.arg("o").strides(), (Shape{18 * 536, 536, 1}));
  EXPECT_EQ(s.arg("lse").strides(), (Shape{21, 1}));
  EXPECT_NE(s.arg("req_to_token").stride(0), s.arg("req_to_token").size(1));
  const Problem x = op().make(op().make_case({{"layout", "cross_layer"}, {"kv_heads", 2}}));
  const Tensor& k = x.arg("k_buffer");
  EXPECT_EQ(k.strides(), (Shape{2 * 16 * 2 * 579, 2 * 579, 579, 1}));
}

TEST(DecodeAttentionOp, Fp8CachesCarryFormatAndScales) {
  const Problem p = op().make(op().make_case({{"kv_dtype", "e4m3fnuz"}}));
  EXPECT_EQ(p.arg("k_buffer").dtype(), DType::e4m3fnuz);
  EXPECT_EQ(p.kernel_params.at("fp8_format"), "e4m3fnuz");
  const double ks = p.kernel_params.at("k_scale").get<double>();
  EXPECT_EQ(ks, static_cast<double>(static_cast<float>(ks)));  // exactly an fp32 value
  EXPECT_EQ(p.kernel_params.at("v_scale").get<double>(), ks);  // MLA: V is K
  const Problem n = op().make(op().make_case({{"kv_dtype", "e4m3fn"}, {"is_mla", false}}));
  EXPECT_NE(n.kernel_params.at("v_scale").get<double>(),
            n.kernel_params.at("k_scale").get<double>());
}

// The op's invalid() decides refusals (the reference does not): the problem carries its reason.
TEST(DecodeAttentionOp, InvalidConfigurationsExpectRefusal) {
  auto refusal = [](const Case& c) -> std::string {
    const Problem p = op().problem(c);
    EXPECT_EQ(op().invalid_reason(c.params), p.expect_refusal) << c.id;
    return p.expect_refusal.value_or("");
  };
  EXPECT_EQ(refusal(op().make_case({{"heads", 12}, {"kv_heads", 8}, {"is_mla", false}})),
            "heads 12 is not a multiple of kv_heads 8");
  EXPECT_EQ(refusal(op().make_case({{"lk_lv", "128x128"}})),
            "is_mla needs Lv < Lk (V is the latent prefix of K), got 128/128");
  EXPECT_EQ(refusal(op().make_case({{"lk_lv", "128x128"}, {"is_mla", false}})), "");
  EXPECT_FALSE(op().invalid_reason(op().make_case(Params::object()).params));
}

// Axis combinations that describe no case are the case file's error, named with the case id.
TEST(DecodeAttentionOp, RejectsBadAxisValues) {
  const std::vector<std::pair<Params, std::string>> bad = {
      {{{"splits", 0}},
       "decode_attention: splits, heads, kv_heads, batch must be >= 1 and logit_cap >= 0"},
      {{{"fp8_codes", "special"}}, "decode_attention: fp8_codes = special needs an fp8 kv_dtype"},
      {{{"offset_log2", 31}, {"layout", "strided"}},
       "decode_attention: offset_log2 needs the contiguous layout"},
  };
  for (const auto& [params, why] : bad) {
    const Case c = op().make_case(params);
    EXPECT_EQ(op().case_error(c.params).value_or(""), why) << c.id;
    try {
      op().make(c);
      ADD_FAILURE() << c.id << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(e.what(), c.id + ": " + why);
    }
  }
}

// Cases the emulation is judged on: every shape, MHA/GQA/MQA, both dtypes, fp8 both formats,
// soft-cap, splits 1..16 (more than tokens), page sizes 1/16/64 and every layout.
std::vector<Params> emulation_cases() {
  return {
      Params::object(),
      {{"lk_lv", "320x256"}},
      {{"lk_lv", "320x256"}, {"dtype", "f16"}, {"page_size", 1}, {"splits", 16}},
      {{"lk_lv", "288x256"}, {"kv_dtype", "e4m3fn"}, {"logit_cap", 30}},
      {{"lk_lv", "576x512"}, {"kv_dtype", "e4m3fnuz"}, {"dtype", "f16"}, {"layout", "strided"}},
      {{"lk_lv", "576x512"}, {"is_mla", false}, {"kv_heads", 4}, {"splits", 1}},
      {{"lk_lv", "576x128"}, {"is_mla", false}, {"kv_heads", 2}, {"page_size", 64}},
      {{"lk_lv", "192x128"}, {"is_mla", false}, {"kv_heads", 16}, {"logit_cap", 30}},
      {{"lk_lv", "128x128"},
       {"is_mla", false},
       {"kv_heads", 2},
       {"dtype", "f16"},
       {"max_ctx", 1027}},
      {{"lk_lv", "128x128"}, {"is_mla", false}, {"heads", 48}, {"kv_heads", 2}},
      {{"lk_lv", "192x128"},
       {"is_mla", false},
       {"kv_heads", 4},
       {"kv_dtype", "e4m3fn"},
       {"layout", "cross_layer"},
       {"splits", 8}},
  };
}

TEST(DecodeAttentionOp, Fp32EmulationOfTheKernelPassesEveryBudget) {
  double worst = 0;
  for (const auto& params : emulation_cases()) {
    const Case c = op().make_case(params);
    const Judged j = judge(c, false);
    EXPECT_TRUE(j.passed) << c.id << "\n" << j.message;
    std::printf("%-90s error/budget %.3f (atol o %.2g, lse %.2g)\n", c.id.c_str(), j.worst_ratio,
                j.atol_o, j.atol_lse);
    worst = std::max(worst, j.worst_ratio);
  }
  std::printf("worst emulated error / budget: %.3f\n", worst);
}

TEST(DecodeAttentionOp, PreFixTileEmulationFailsOnlyThe320x256MlaCases) {
  for (const auto& params : emulation_cases()) {
    const Case c = op().make_case(params);
    const bool target = c.id.find("d320x256-mla1-") != std::string::npos;
    const Judged j = judge(c, true);
    EXPECT_EQ(j.passed, !target) << c.id << "\n" << j.message;
  }
}

// fp8_codes = special: the tokens read hold the saturation codes (and -0 in e4m3fn), the slots no
// request reads hold NaN codes; the axis stays out of ids at its default.
TEST(DecodeAttentionOp, Fp8SpecialCodesSitWhereTheContractSays) {
  EXPECT_EQ(op().make_case(Params::object()).id.find("fp8"), std::string::npos);
  for (const char* kv : {"e4m3fn", "e4m3fnuz"}) {
    const Case c = op().make_case({{"lk_lv", "128x128"},
                                   {"is_mla", false},
                                   {"kv_heads", 2},
                                   {"kv_dtype", kv},
                                   {"fp8_codes", "special"}});
    EXPECT_NE(c.id.find("-fp8special"), std::string::npos) << c.id;
    const Problem p = op().make(c);
    const Tensor &k = p.arg("k_buffer"), &table = p.arg("req_to_token"), &lens = p.arg("b_seq_len");
    const bool fn = std::string(kv) == "e4m3fn";
    const int64_t P = k.size(1);
    std::map<int64_t, int64_t> read_until;  // page -> slots read
    for (int64_t b = 0; b < lens.size(0); ++b)
      for (int64_t n = 0; n < lens.at<int32_t>({b}); ++n) {
        auto& r = read_until[static_cast<int64_t>(table.get({b, n / P}))];
        r = std::max(r, n % P + 1);
      }
    int64_t saturated = 0, neg_zero = 0, nan_read = 0, nan_unread = 0, unread = 0;
    k.for_each_index([&](const Index& idx, int64_t) {
      const uint64_t bits = k.get_bits(idx);
      const bool is_nan = fn ? (bits & 0x7F) == 0x7F : bits == 0x80;
      const auto it = read_until.find(idx[0]);
      const bool read = it != read_until.end() && idx[1] < it->second;
      if (!read) {
        ++unread;
        nan_unread += is_nan;
        return;
      }
      nan_read += is_nan;
      saturated += std::abs(k.get(idx)) == max_finite(k.dtype());
      neg_zero += fn && bits == 0x80;
    });
    EXPECT_EQ(nan_read, 0) << kv;
    EXPECT_EQ(nan_unread, unread) << kv;
    EXPECT_GT(saturated, 100) << kv;
    EXPECT_EQ(neg_zero > 0, fn) << kv;
    const Judged j = judge(c, false);  // the budgets stay sound with saturated inputs
    EXPECT_TRUE(j.passed) << c.id << "\n" << j.message;
  }
}

// offset_log2: every page read starts past byte 2^31 (2^32) of its cache; the host holds only
// those pages and the reference reads only them.
TEST(DecodeAttentionOp, LargeOffsetCasesReadPagesPastTheOffset) {
  for (int64_t log2 : {31, 32}) {
    const Case c = op().make_case({{"lk_lv", "128x128"},
                                   {"is_mla", false},
                                   {"kv_heads", 2},
                                   {"kv_dtype", "e4m3fn"},
                                   {"offset_log2", log2}});
    EXPECT_NE(c.id.find("-offlog" + std::to_string(log2)), std::string::npos) << c.id;
    const Problem p = op().make(c);
    const Tensor &k = p.arg("k_buffer"), &table = p.arg("req_to_token");
    ASSERT_TRUE(k.storage()->sparse());
    EXPECT_GT(k.storage()->size(), uint64_t{1} << log2);
    EXPECT_LT(k.storage()->bytes.size(), size_t{1} << 20);  // the pages read, not the extent
    const int64_t page_bytes = k.stride(0) * static_cast<int64_t>(k.element_size());
    table.for_each_index([&](const Index& idx, int64_t) {
      const auto id = static_cast<int64_t>(table.get(idx));
      if (id >= 0) {
        EXPECT_GT(id * page_bytes, int64_t{1} << log2);
      }
    });
    const TensorMap out = op().reference(p);
    out.at("o").for_each_index(
        [&](const Index& idx, int64_t) { ASSERT_TRUE(std::isfinite(out.at("o").get(idx))); });
  }
  EXPECT_THROW((void)op().make(op().make_case({{"offset_log2", 31}, {"layout", "strided"}})),
               std::invalid_argument);
}

// values (harness/ops/values.h): the fp32 emulation passes every budget for every distribution
// (the budgets are derived from the inputs, so they stay valid), and the overflow-unsafe softmax
// (AC_MUTANT_DECODE_SOFTMAX_NO_MAX) fails exactly where logits pass exp's fp32 range: values =
// large on the MHA kernel without a soft-cap. Typical inputs never show it.
TEST(DecodeAttentionOp, ValuesKindsPassTheEmulationAndOnlyLargeKillsNoMax) {
  const std::vector<Params> shapes = {
      {{"lk_lv", "576x512"}, {"splits", 8}},
      {{"lk_lv", "320x256"}, {"kv_dtype", "e4m3fn"}, {"dtype", "f16"}, {"page_size", 1}},
      {{"lk_lv", "128x128"}, {"is_mla", false}, {"kv_heads", 16}},
      {{"lk_lv", "128x128"}, {"is_mla", false}, {"kv_heads", 16}, {"logit_cap", 30}},
      {{"lk_lv", "192x128"}, {"is_mla", false}, {"kv_heads", 2}, {"kv_dtype", "e4m3fnuz"}},
      {{"lk_lv", "192x128"}, {"is_mla", false}, {"kv_heads", 16}, {"dtype", "f16"}, {"splits", 1}},
  };
  for (const char* kind : {"typical", "large", "peaked", "ties", "tiny", "cancel"})
    for (Params params : shapes) {
      params["values"] = kind;
      const Case c = op().make_case(params);
      const Judged j = judge(c, false);
      EXPECT_TRUE(j.passed) << c.id << "\n" << j.message;
      const bool mha = params.contains("kv_heads") && params.at("kv_heads") == 16;
      const bool capped = params.contains("logit_cap");
      const bool overflows = std::string(kind) == "large" && mha && !capped;
      const Judged m = judge(c, false, true);
      EXPECT_EQ(m.passed, !overflows) << c.id << " (no max)\n" << m.message;
      std::printf("%-100s error/budget %.3g, no-max %s\n", c.id.c_str(), j.worst_ratio,
                  m.passed ? "passes" : "fails");
    }
}

// The quick tier's typical MHA-kernel cases (the no-max emulation changes only that kernel) all
// pass the no-max emulation: the mutant survived them (logits below 30), while values cases fail.
TEST(DecodeAttentionOp, NoMaxSurvivesEveryTypicalQuickCase) {
  const CaseFile f = load_case_file(default_root() + "/cases/decode_attention.toml");
  int killed = 0, typical = 0;
  for (const Case& c : f.tiers.at("quick")) {
    if (op().problem(c).expect_refusal.has_value() || c.params.value("offset_log2", 0) != 0 ||
        c.params.value("q_offset_log2", 0) != 0 || c.params.value("partials_log2", 0) != 0 ||
        c.params.value("o_offset_log2", 0) != 0 || c.params.value("max_ctx", 0) > 100 ||
        c.params.at("heads") != c.params.at("kv_heads"))
      continue;  // refusals; sparse storages; long contexts (slow on the CPU, same logits); GQA
    const bool is_typical = c.params.value("values", "typical") == "typical";
    const bool fails = !judge(c, false, true).passed;
    // The regex of decode_softmax_no_max in kernels_under_test/decode_attention.mutants.
    const bool named = std::regex_search(c.id, std::regex("^decode_attention/.*-hkv16-.*-vlarge$"));
    if (is_typical) {
      ++typical;
      EXPECT_FALSE(fails) << c.id;
    } else {
      killed += fails;
    }
    if (named) {
      EXPECT_TRUE(fails) << c.id << " is named by the mutant's regex";
    }
  }
  std::printf("no-max emulation: %d typical quick cases pass, %d values cases fail\n", typical,
              killed);
  EXPECT_GT(killed, 0);
}

}  // namespace
}  // namespace attncheck
