// The types a case flows through, from the case file to the report (docs/verification.md):
//   Case (axis values, id) -> Problem (typed inputs, kernel entry) -> expected outputs + the
//   OutputCheck budgets -> Result (core/result.h).
// They live in core so that the reference, the ops, the runner and the tests share them without
// depending on each other.
#pragma once
#include <any>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/compare.h"
#include "core/tensor.h"

namespace attncheck {

using Params = nlohmann::json;  // a JSON object: axis name -> value
using TensorMap = std::map<std::string, Tensor>;

struct KnownBug {
  std::string reason;
  std::string arch;  // regex over the arch name ("gfx942", "sm_90"); empty = every arch
};

struct Case {
  std::string op;
  Params params;   // every axis present (defaults filled in)
  std::string id;  // "<op>/<vars>", stable, usable as a filter and in `attncheck repro`
  std::vector<std::string> tiers;
  std::optional<KnownBug> known_bug;
  std::string source;  // "cases/mla_decode.toml:12", for error messages
  bool in_tier(std::string_view tier) const;
};

enum class Role { input, output, inout };

struct Arg {
  std::string name;
  Tensor tensor;
  Role role = Role::input;
};

// What a kernel receives for one case. Output and inout tensors hold their initial contents
// (poison, sentinels, or real data for inout); the reference works from the same bytes.
struct Problem {
  std::vector<Arg> args;
  Params kernel_params = Params::object();  // scalars for the kernel (JSON object)
  std::string kernel;                       // the kernel entry to launch (Op::make sets it)
  // Set for an invalid configuration: the kernel must refuse it, for this reason (the op's
  // TypedOp::invalid).
  std::optional<std::string> expect_refusal;
  std::any params;  // the op's typed parameters (ops/typed_op.h), for reference() and checks()
  // What the kernel library may learn of the case (the ABI's case_context): set by Op::problem.
  nlohmann::json case_context;
  double flops = 0;  // useful work, for bench
  double bytes = 0;  // minimum bytes moved, for bench

  const Tensor& arg(std::string_view name) const;
  Tensor& arg(std::string_view name);
  bool has_arg(std::string_view name) const;
};

// How one output is judged.
struct OutputCheck {
  std::string name;  // output arg name
  Budget budget;
  // top-k only: reference values the indices point into, and per-row column offsets.
  Tensor topk_values;
  std::vector<int64_t> topk_row_offsets;
};

// Thrown by reference functions (reference/) that check their own arguments, for a configuration
// the kernel must refuse. Ops decide validity before (TypedOp::invalid): a reference that throws
// it for a case the op called valid fails that case (evaluate.cpp).
struct InvalidConfig : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

}  // namespace attncheck
