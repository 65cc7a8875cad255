// Tile choice of vLLM's Triton split-KV decode attention (docs/ops/decode_attention.md, Tile
// rule) as a pure function of the shape, before and after PR #41119, for AMD and NVIDIA; a
// shared-memory estimate per tile; and the predicate that says whether a tile can compute a shape.
// The seed bug it pins down: a tile sized from Lk while the IS_MLA path reuses the K tile as V
// (320/256 MLA: BLOCK_DMODEL 512 against BLOCK_DV 256).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace attncheck::ref {

enum class GpuVendor { amd, nvidia };
enum class TileRule { before_fix, after_fix };  // vLLM PR #41119

// Launch geometry of the stage-1 kernel. The grouped kernel (kv_group_num > 1) runs BLOCK_H heads
// per program and multiplies tiles with tl.dot; the normal kernel (kv_group_num == 1) runs one head
// per program with element-wise products.
struct DecodeTiles {
  bool grouped = true;
  int64_t block_dmodel = 0;   // Q/K main tile: dims [0, BLOCK_DMODEL) masked < Lk
  int64_t block_dpe = 0;      // Q/K rope tile: dims [BLOCK_DMODEL, +BLOCK_DPE) masked < Lk
  int64_t block_dv = 0;       // V / accumulator tile width, masked < Lv
  int64_t block_n = 0;        // tokens per step
  int64_t block_h = 0;        // heads per program (1 for the normal kernel)
  int64_t valid_block_h = 0;  // min(BLOCK_H, kv_group_num)
  int num_warps = 0;
  int num_stages = 0;
  bool operator==(const DecodeTiles&) const = default;
};

int64_t next_pow2(int64_t x);  // smallest power of two >= x (x >= 1)

// Throws std::invalid_argument for Lk, Lv or kv_group_num < 1.
DecodeTiles choose_decode_tiles(int64_t lk, int64_t lv, bool is_mla, int64_t kv_group_num,
                                GpuVendor vendor, TileRule rule);

// Empty when the tile computes attention for (lk, lv, is_mla) correctly; otherwise the reason.
// The grouped IS_MLA path takes V as the first BLOCK_DV columns of the loaded K main tile
// (v = trans(k)); that is only the same data when BLOCK_DMODEL == BLOCK_DV.
std::string tile_inconsistency(const DecodeTiles& t, int64_t lk, int64_t lv, bool is_mla);

// Estimated shared-memory bytes of the grouped kernel's operand staging: K main + rope tiles and
// (non-MLA) the V tile, BLOCK_N rows each, 16-bit elements, one copy per pipeline stage; Q and P
// stay in registers. It reproduces both upstream facts it can be checked against: pre-fix Lk 576 on
// MI3xx needs BLOCK_N 16 for 64 KiB, and post-fix non-MLA 576 (BLOCK_DMODEL 1024) on NVIDIA fits
// 101376 B with one stage but not two. The normal kernel keeps its tiles in registers: 0.
int64_t decode_smem_estimate(const DecodeTiles& t, bool is_mla, int64_t elem_bytes = 2);

struct ArchSmemLimit {
  std::string arch;  // "gfx942", "sm_90"
  GpuVendor vendor;
  int64_t bytes;   // per workgroup / block (NVIDIA: the opt-in maximum)
  bool confirmed;  // false: spec marks the number UNCONFIRMED
  std::string note;
};
const std::vector<ArchSmemLimit>& arch_smem_limits();
const ArchSmemLimit& arch_smem_limit(const std::string& arch);  // throws for an unknown arch

}  // namespace attncheck::ref
