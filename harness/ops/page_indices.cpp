// page_indices: block table -> per-token flat slots (docs/ops/mla_decode.md "Semantics": page-index
// expansion). Exact op: compared bitwise. What it guards against: kernels that read table columns
// past the request's last block, ignore the table's row stride, or write past the request's tokens
// (rows of the next request, padding), and slots computed past int32 (block ids past 2^31 / K must
// be refused, not wrapped).
#include <algorithm>

#include "core/rng.h"
#include "core/policy.h"
#include "ops/op.h"
#include "ops/paged.h"
#include "reference/page_indices.h"

namespace attncheck {
namespace {

class PageIndicesOp final : public Op {
 public:
  std::string name() const override { return "page_indices"; }
  std::vector<Axis> axes() const override {
    return {
        {"block_size", "bs", 16, {1, 16, 64}, "kernel block size K"},
        {"batch", "b", 4, {}, "requests"},
        {"max_ctx", "ctx", 300, {}, "longest request; lengths are ragged with block-edge cases"},
        {"table",
         "",
         "contiguous",
         {"contiguous", "strided"},
         "strided: row stride wider than the table"},
        {"seed", "s", 0, {}, "input seed"},
        {"block_ids",
         "ids",
         "low",
         {"low", "top", "over"},
         "low: ids below the block pool size; top: the largest id in use is the largest whose "
         "slots fit int32 (2^31 / K - 1, its last slot up to 2^31 - 1); over: one past it (slots "
         "past 2^31 - 1: refused, block_size > 1)",
         false},
    };
  }

  Problem make(const Case& c) const override {
    const int64_t K = param_int(c.params, "block_size");
    const auto layout =
        paged_layout(c.id, param_int(c.params, "batch"), param_int(c.params, "max_ctx"), K,
                     param_str(c.params, "table") == "strided", param_int(c.params, "seed"));
    const std::string ids = param_str(c.params, "block_ids");
    Problem p;
    if (ids != "low") {
      // Move the pool so that its largest id in use is 2^31 / K - 1 (top) or 2^31 / K (over).
      if (ids == "over" && K == 1)
        throw std::invalid_argument(c.id +
                                    ": block_ids = over needs block_size > 1 (an int32 "
                                    "block id times 1 always fits)");
      int64_t largest = -1;
      for (int64_t r = 0; r < layout.seq_lens.size(0); ++r)
        for (int64_t j = 0; j < (layout.seq_lens.at<int32_t>({r}) + K - 1) / K; ++j)
          largest = std::max<int64_t>(largest, layout.block_table.at<int32_t>({r, j}));
      const int64_t target = (int64_t{1} << 31) / K - (ids == "top" ? 1 : 0);
      if (largest >= 0) shift_block_ids(layout, target - largest);
      if (ids == "over" && largest >= 0) {
        for (int64_t r = 0; r < layout.seq_lens.size(0) && p.expect_refusal.empty(); ++r)
          for (int64_t j = 0; j < (layout.seq_lens.at<int32_t>({r}) + K - 1) / K; ++j)
            if (layout.block_table.at<int32_t>({r, j}) == target) {
              p.expect_refusal = ref::page_indices_overflow_message(r, target, K);
              break;
            }
      }
    }
    int64_t total = 0;
    for (int64_t r = 0; r < layout.seq_lens.size(0); ++r) total += layout.seq_lens.at<int32_t>({r});
    // The output buffer is longer than the tokens: the tail is outside the view and must stay
    // untouched.
    Tensor out_buf = Tensor::filled_bytes(DType::i32, {total + 37}, std::byte{0xFF});
    p.args = {{"block_table", layout.block_table, Role::input},
              {"seq_lens", layout.seq_lens, Role::input},
              {"cu_seq_lens", ref::cumulative_lengths(layout.seq_lens), Role::input},
              {"page_indices", out_buf.slice(0, 0, total), Role::output}};
    p.kernel_params = {{"kernel_block_size", K}};
    p.bytes = static_cast<double>(total) * 8.0;
    return p;
  }

  TensorMap reference(const Problem& p) const override {
    const int64_t K = p.kernel_params.at("kernel_block_size").get<int64_t>();
    return {{"page_indices", ref::page_indices(p.arg("block_table"), p.arg("seq_lens"), K)}};
  }

  std::vector<OutputCheck> checks(const Problem&, const TensorMap&) const override {
    return {{"page_indices", exact_budget("index arithmetic: bitwise"), {}, {}}};
  }
};

const OpRegistrar kRegister(std::make_unique<PageIndicesOp>());

}  // namespace
}  // namespace attncheck
