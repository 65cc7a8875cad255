#include "decode_tiles.h"

#include <algorithm>
#include <stdexcept>

namespace attncheck::ref {

int64_t next_pow2(int64_t x) {
  if (x < 1) throw std::invalid_argument("next_pow2 needs x >= 1, got " + std::to_string(x));
  int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}

namespace {

// The normal kernel (kv_group_num == 1): one head per program, element-wise dot products. PR #41119
// changed only the grouped wrapper, so this is the same before and after.
DecodeTiles normal_tiles(int64_t lk, int64_t lv, GpuVendor vendor) {
  DecodeTiles t;
  t.grouped = false;
  t.block_dmodel = next_pow2(lk);
  t.block_dpe = 0;
  t.block_dv = next_pow2(lv);
  t.block_n = vendor == GpuVendor::amd ? 8 : 64;
  t.block_h = 1;
  t.valid_block_h = 1;
  t.num_warps = 4;
  t.num_stages = 2;
  return t;
}

// Pre-fix grouped wrapper: hard-coded 576 and 288 splits, independent of is_mla.
void before_fix_dims(int64_t lk, DecodeTiles& t) {
  if (lk == 576) {
    t.block_dmodel = 512;
    t.block_dpe = 64;
  } else if (lk == 288) {
    t.block_dmodel = 256;
    t.block_dpe = 32;
  } else {
    t.block_dmodel = next_pow2(lk);
    t.block_dpe = 0;
  }
}

// Post-fix: MLA tiles follow Lv (the latent rank) so that the K main tile is exactly V; NVIDIA
// keeps the two historical special cases.
void after_fix_dims(int64_t lk, int64_t lv, bool is_mla, GpuVendor vendor, DecodeTiles& t) {
  if (!is_mla) {
    t.block_dmodel = next_pow2(lk);
    t.block_dpe = 0;
  } else if (vendor == GpuVendor::nvidia && lk == 576) {
    t.block_dmodel = 512;
    t.block_dpe = 64;
  } else if (vendor == GpuVendor::nvidia && lk == 288) {
    t.block_dmodel = 256;
    t.block_dpe = 32;
  } else {
    t.block_dmodel = next_pow2(lv);
    t.block_dpe = lk > lv ? next_pow2(lk - lv) : 0;
  }
}

}  // namespace

DecodeTiles choose_decode_tiles(int64_t lk, int64_t lv, bool is_mla, int64_t kv_group_num,
                                GpuVendor vendor, TileRule rule) {
  if (lk < 1 || lv < 1 || kv_group_num < 1)
    throw std::invalid_argument("choose_decode_tiles: Lk, Lv and kv_group_num must be >= 1, got " +
                                std::to_string(lk) + ", " + std::to_string(lv) + ", " +
                                std::to_string(kv_group_num));
  if (kv_group_num == 1) return normal_tiles(lk, lv, vendor);
  const bool amd = vendor == GpuVendor::amd;
  DecodeTiles t;
  t.grouped = true;
  t.block_dv = next_pow2(lv);
  t.block_h = 16;
  t.valid_block_h = std::min<int64_t>(t.block_h, kv_group_num);
  t.num_warps = 4;
  if (rule == TileRule::before_fix) {
    before_fix_dims(lk, t);
    t.block_n = amd && lk >= 576 ? 16 : 32;  // "work around shmem limit on MI3xx"
    t.num_stages = amd ? 1 : 2;
  } else {
    after_fix_dims(lk, lv, is_mla, vendor, t);
    t.block_n = amd ? 16 : 32;
    // NVIDIA: a 1024-wide tile with two stages overflows 101376 B (whether this line is part of
    // #41119 itself is UNCONFIRMED).
    t.num_stages = amd ? 1 : (t.block_dmodel >= 1024 ? 1 : 2);
  }
  return t;
}

std::string tile_inconsistency(const DecodeTiles& t, int64_t lk, int64_t lv, bool is_mla) {
  if (t.block_dmodel + t.block_dpe < lk)
    return "Q/K tiles cover dims [0, " + std::to_string(t.block_dmodel + t.block_dpe) +
           ") but Lk is " + std::to_string(lk);
  if (t.block_dv < lv)
    return "BLOCK_DV " + std::to_string(t.block_dv) + " is narrower than Lv " + std::to_string(lv);
  if (t.grouped && is_mla) {
    if (lv > lk)
      return "IS_MLA takes V from the K tile, which needs Lv <= Lk, got Lk " + std::to_string(lk) +
             ", Lv " + std::to_string(lv);
    if (t.block_dmodel != t.block_dv)
      return "IS_MLA reuses the K main tile as V (v = trans(k)), which needs BLOCK_DMODEL == "
             "BLOCK_DV, got " +
             std::to_string(t.block_dmodel) + " vs " + std::to_string(t.block_dv) +
             " (tile sized from Lk instead of Lv; vLLM #40966)";
  }
  return "";
}

int64_t decode_smem_estimate(const DecodeTiles& t, bool is_mla, int64_t elem_bytes) {
  if (!t.grouped) return 0;
  const int64_t row = t.block_dmodel + t.block_dpe + (is_mla ? 0 : t.block_dv);
  return elem_bytes * t.num_stages * t.block_n * row;
}

const std::vector<ArchSmemLimit>& arch_smem_limits() {
  static const std::vector<ArchSmemLimit> limits = {
      {"gfx942", GpuVendor::amd, 64 * 1024, false, "MI300: 64 KiB LDS per CU (spec B.7)"},
      {"gfx950", GpuVendor::amd, 160 * 1024, false, "MI355: 160 KiB LDS per CU (spec B.7)"},
      {"sm_70", GpuVendor::nvidia, 98304, true, "V100: 96 KiB (spec B.7)"},
      {"sm_89", GpuVendor::nvidia, 101376, true, "Ada: the limit quoted in vLLM's comment"},
      {"sm_90", GpuVendor::nvidia, 232448, true,
       "H100/H200: 227 KiB per block with the opt-in attribute (CUDA guide; not in the spec)"},
      {"sm_120", GpuVendor::nvidia, 101376, true, "Blackwell consumer: as sm_89"},
  };
  return limits;
}

const ArchSmemLimit& arch_smem_limit(const std::string& arch) {
  for (const auto& l : arch_smem_limits())
    if (l.arch == arch) return l;
  throw std::invalid_argument("no shared-memory limit known for arch '" + arch + "'");
}

}  // namespace attncheck::ref
