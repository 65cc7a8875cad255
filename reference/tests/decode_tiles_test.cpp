#include "reference/decode_tiles.h"

#include <gtest/gtest.h>

namespace attncheck::ref {
namespace {

constexpr auto kAmd = GpuVendor::amd;
constexpr auto kNv = GpuVendor::nvidia;
constexpr auto kBefore = TileRule::before_fix;
constexpr auto kAfter = TileRule::after_fix;

struct Dims {
  int64_t dmodel, dpe, dv;
};

// One row of docs/ops/decode_attention.md's tile table: (Lk, Lv, is_mla) and the (BLOCK_DMODEL,
// BLOCK_DPE, BLOCK_DV) before the fix (both vendors), after the fix on HIP and after the fix on
// NVIDIA.
struct B6Row {
  const char* what;
  int64_t lk, lv;
  bool is_mla;
  Dims before, after_hip, after_nvidia;
};

const B6Row kTable[] = {
    {"DeepSeek/Kimi MLA", 576, 512, true, {512, 64, 512}, {512, 64, 512}, {512, 64, 512}},
    {"MLA R_kv 256 rope 32", 288, 256, true, {256, 32, 256}, {256, 32, 256}, {256, 32, 256}},
    {"Mistral-Small-4 MLA", 320, 256, true, {512, 0, 256}, {256, 64, 256}, {256, 64, 256}},
    {"non-MLA GQA 128/128", 128, 128, false, {128, 0, 128}, {128, 0, 128}, {128, 0, 128}},
    {"non-MLA 192/128", 192, 128, false, {256, 0, 128}, {256, 0, 128}, {256, 0, 128}},
    {"non-MLA 576/512", 576, 512, false, {512, 64, 512}, {1024, 0, 512}, {1024, 0, 512}},
    {"non-MLA 576/128", 576, 128, false, {512, 64, 128}, {1024, 0, 128}, {1024, 0, 128}},
};

void expect_dims(const DecodeTiles& t, const Dims& d, const std::string& where) {
  EXPECT_EQ(t.block_dmodel, d.dmodel) << where;
  EXPECT_EQ(t.block_dpe, d.dpe) << where;
  EXPECT_EQ(t.block_dv, d.dv) << where;
}

TEST(DecodeTiles, SpecTableB6EveryRowBeforeAndAfterBothVendors) {
  for (const auto& r : kTable) {
    const std::string w = r.what;
    // The table is about the grouped kernel (GQA/MQA/MLA); 16 heads share one KV head.
    expect_dims(choose_decode_tiles(r.lk, r.lv, r.is_mla, 16, kAmd, kBefore), r.before,
                w + " before, HIP");
    expect_dims(choose_decode_tiles(r.lk, r.lv, r.is_mla, 16, kNv, kBefore), r.before,
                w + " before, NVIDIA");
    expect_dims(choose_decode_tiles(r.lk, r.lv, r.is_mla, 16, kAmd, kAfter), r.after_hip,
                w + " after, HIP");
    expect_dims(choose_decode_tiles(r.lk, r.lv, r.is_mla, 16, kNv, kAfter), r.after_nvidia,
                w + " after, NVIDIA");
  }
}

TEST(DecodeTiles, OnlyThePreFix320x256MlaTileIsInconsistent) {
  for (const auto& r : kTable)
    for (auto v : {kAmd, kNv})
      for (auto rule : {kBefore, kAfter}) {
        const auto t = choose_decode_tiles(r.lk, r.lv, r.is_mla, 16, v, rule);
        const std::string why = tile_inconsistency(t, r.lk, r.lv, r.is_mla);
        const bool bad = r.lk == 320 && rule == kBefore;
        EXPECT_EQ(!why.empty(), bad) << r.what << ": " << why;
      }
  const auto pre = choose_decode_tiles(320, 256, true, 16, kAmd, kBefore);
  EXPECT_EQ(tile_inconsistency(pre, 320, 256, true),
            "IS_MLA reuses the K main tile as V (v = trans(k)), which needs BLOCK_DMODEL == "
            "BLOCK_DV, got 512 vs 256 (tile sized from Lk instead of Lv; vLLM #40966)");
  // The same pre-fix tile is fine when V is loaded from its own buffer (not MLA).
  EXPECT_EQ(tile_inconsistency(pre, 320, 256, false), "");
}

TEST(DecodeTiles, PredicateNamesTilesThatDoNotCoverTheHeadDims) {
  DecodeTiles t = choose_decode_tiles(576, 512, true, 16, kNv, kAfter);
  t.block_dpe = 32;
  EXPECT_EQ(tile_inconsistency(t, 576, 512, true), "Q/K tiles cover dims [0, 544) but Lk is 576");
  t = choose_decode_tiles(192, 128, false, 8, kNv, kAfter);
  t.block_dv = 64;
  EXPECT_EQ(tile_inconsistency(t, 192, 128, false), "BLOCK_DV 64 is narrower than Lv 128");
  t = choose_decode_tiles(128, 256, false, 8, kNv, kAfter);
  EXPECT_EQ(tile_inconsistency(t, 128, 256, true),
            "IS_MLA takes V from the K tile, which needs Lv <= Lk, got Lk 128, Lv 256");
}

TEST(DecodeTiles, BlockNAndStagesBeforeAndAfter) {
  // Before: BLOCK_N 32, 16 on HIP only for Lk >= 576; HIP one stage, NVIDIA two.
  auto t = choose_decode_tiles(576, 512, true, 16, kAmd, kBefore);
  EXPECT_EQ(t.block_n, 16);
  EXPECT_EQ(t.num_stages, 1);
  t = choose_decode_tiles(320, 256, true, 16, kAmd, kBefore);
  EXPECT_EQ(t.block_n, 32);
  t = choose_decode_tiles(576, 512, true, 16, kNv, kBefore);
  EXPECT_EQ(t.block_n, 32);
  EXPECT_EQ(t.num_stages, 2);
  // After: 16 on every HIP shape, 32 on NVIDIA; NVIDIA drops to one stage for a 1024-wide tile.
  for (const auto& r : kTable) {
    EXPECT_EQ(choose_decode_tiles(r.lk, r.lv, r.is_mla, 16, kAmd, kAfter).block_n, 16) << r.what;
    EXPECT_EQ(choose_decode_tiles(r.lk, r.lv, r.is_mla, 16, kAmd, kAfter).num_stages, 1) << r.what;
    const auto nv = choose_decode_tiles(r.lk, r.lv, r.is_mla, 16, kNv, kAfter);
    EXPECT_EQ(nv.block_n, 32) << r.what;
    EXPECT_EQ(nv.num_stages, nv.block_dmodel >= 1024 ? 1 : 2) << r.what;
    EXPECT_EQ(nv.block_h, 16);
    EXPECT_EQ(nv.num_warps, 4);
  }
  EXPECT_EQ(choose_decode_tiles(576, 128, false, 8, kNv, kAfter).num_stages, 1);
}

TEST(DecodeTiles, ValidBlockHIsTheGroupCappedAtBlockH) {
  EXPECT_EQ(choose_decode_tiles(128, 128, false, 4, kNv, kAfter).valid_block_h, 4);
  EXPECT_EQ(choose_decode_tiles(128, 128, false, 16, kNv, kAfter).valid_block_h, 16);
  EXPECT_EQ(choose_decode_tiles(576, 512, true, 128, kAmd, kAfter).valid_block_h, 16);
}

TEST(DecodeTiles, GroupOfOneUsesTheNormalKernel) {
  for (auto rule : {kBefore, kAfter}) {
    const auto amd = choose_decode_tiles(576, 512, true, 1, kAmd, rule);
    EXPECT_FALSE(amd.grouped);
    EXPECT_EQ(amd.block_dmodel, 1024);
    EXPECT_EQ(amd.block_dpe, 0);
    EXPECT_EQ(amd.block_dv, 512);
    EXPECT_EQ(amd.block_n, 8);
    EXPECT_EQ(amd.block_h, 1);
    const auto nv = choose_decode_tiles(192, 128, false, 1, kNv, rule);
    EXPECT_EQ(nv.block_n, 64);
    EXPECT_EQ(nv.block_dmodel, 256);
    EXPECT_EQ(nv.num_stages, 2);
    // The normal kernel loads V from v_buffer even for MLA: no K-as-V reuse to break.
    EXPECT_EQ(
        tile_inconsistency(choose_decode_tiles(320, 256, true, 1, kAmd, rule), 320, 256, true), "");
  }
}

TEST(DecodeTiles, GeneralizedPostFixMlaRuleCoversExactlyLk) {
  for (int64_t lv : {64, 96, 128, 200, 256, 384, 512})
    for (int64_t rope : {16, 32, 48, 64})
      for (auto v : {kAmd, kNv}) {
        const int64_t lk = lv + rope;
        const auto t = choose_decode_tiles(lk, lv, true, 16, v, kAfter);
        EXPECT_EQ(tile_inconsistency(t, lk, lv, true), "") << lk << "/" << lv;
        EXPECT_GE(t.block_dmodel + t.block_dpe, lk);
      }
}

TEST(DecodeTiles, SmemEstimateMatchesTheUpstreamFacts) {
  const auto& gfx942 = arch_smem_limit("gfx942");
  const auto& sm89 = arch_smem_limit("sm_89");
  // Pre-fix Lk 576 on MI3xx with V loaded separately: BLOCK_N 32 overflows 64 KiB, 16 fits.
  auto t = choose_decode_tiles(576, 512, false, 16, kAmd, kBefore);
  EXPECT_EQ(t.block_n, 16);
  EXPECT_EQ(decode_smem_estimate(t, false), 34816);
  EXPECT_LE(decode_smem_estimate(t, false), gfx942.bytes);
  t.block_n = 32;
  EXPECT_EQ(decode_smem_estimate(t, false), 69632);
  EXPECT_GT(decode_smem_estimate(t, false), gfx942.bytes);
  // Post-fix non-MLA 576 on NVIDIA: 1024-wide tile fits 101376 B with one stage, not with two.
  t = choose_decode_tiles(576, 512, false, 16, kNv, kAfter);
  EXPECT_EQ(t.num_stages, 1);
  EXPECT_EQ(decode_smem_estimate(t, false), 98304);
  EXPECT_LE(decode_smem_estimate(t, false), sm89.bytes);
  t.num_stages = 2;
  EXPECT_GT(decode_smem_estimate(t, false), sm89.bytes);
  // The normal kernel keeps its tiles in registers.
  EXPECT_EQ(decode_smem_estimate(choose_decode_tiles(576, 512, false, 1, kNv, kAfter), false), 0);
}

TEST(DecodeTiles, EveryPostFixB6TileFitsEveryArchOfItsVendor) {
  for (const auto& r : kTable)
    for (const auto& lim : arch_smem_limits()) {
      const auto t = choose_decode_tiles(r.lk, r.lv, r.is_mla, 16, lim.vendor, kAfter);
      EXPECT_LE(decode_smem_estimate(t, r.is_mla), lim.bytes) << r.what << " on " << lim.arch;
    }
}

TEST(DecodeTiles, ArchLimitsMarkTheSpecsUnconfirmedNumbers) {
  EXPECT_EQ(arch_smem_limit("gfx942").bytes, 65536);
  EXPECT_FALSE(arch_smem_limit("gfx942").confirmed);
  EXPECT_EQ(arch_smem_limit("gfx950").bytes, 163840);
  EXPECT_FALSE(arch_smem_limit("gfx950").confirmed);
  EXPECT_EQ(arch_smem_limit("sm_89").bytes, 101376);
  EXPECT_EQ(arch_smem_limit("sm_120").bytes, 101376);
  EXPECT_EQ(arch_smem_limit("sm_90").bytes, 232448);
  EXPECT_TRUE(arch_smem_limit("sm_90").confirmed);
  try {
    arch_smem_limit("gfx1100");
    FAIL() << "unknown arch accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "no shared-memory limit known for arch 'gfx1100'");
  }
}

TEST(DecodeTiles, RejectsNonPositiveDims) {
  try {
    choose_decode_tiles(0, 512, true, 16, kAmd, kAfter);
    FAIL() << "Lk 0 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "choose_decode_tiles: Lk, Lv and kv_group_num must be >= 1, got 0, 512, 16");
  }
  EXPECT_EQ(next_pow2(1), 1);
  EXPECT_EQ(next_pow2(320), 512);
  EXPECT_EQ(next_pow2(512), 512);
}

}  // namespace
}  // namespace attncheck::ref
