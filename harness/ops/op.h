// One op family = one Op: its axes, how a case becomes kernel arguments (inputs generated
// deterministically from the case id), the reference outputs, and how each output is checked.
// Adding an op touches reference/, kernels_under_test/, harness/ops/ and cases/ once each.
#pragma once
#include <map>
#include <memory>
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

struct Axis {
  std::string name;    // as written in case files: "heads"
  std::string prefix;  // in case ids: "h" -> "h16"; "" prints the value alone ("bf16")
  nlohmann::json default_value;
  std::vector<nlohmann::json> allowed;  // empty: any value of the default's JSON type
  std::string help;
};

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
  std::string kernel;                       // plugin entry, defaults to the op name
  std::string expect_refusal;  // non-empty: invalid configuration, the kernel must refuse (reason)
  double flops = 0;            // useful work, for bench
  double bytes = 0;            // minimum bytes moved, for bench

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

// Thrown by references and op setup for configurations the real kernel must refuse.
struct InvalidConfig : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

class Op {
 public:
  virtual ~Op() = default;
  virtual std::string name() const = 0;
  virtual std::vector<Axis> axes() const = 0;
  // The id part after "<op>/": axis prefix + value, '-' joined, in axes() order.
  virtual std::string vars(const Params& p) const;
  virtual Problem make(const Case& c) const = 0;
  // Expected final contents of every output/inout arg, from the problem's initial bytes.
  virtual TensorMap reference(const Problem& p) const = 0;
  virtual std::vector<OutputCheck> checks(const Problem& p, const TensorMap& expected) const = 0;
  // Declared deterministic kernels must repeat bitwise (--repeat).
  virtual bool deterministic() const { return true; }

  // Fills defaults, rejects unknown axes and disallowed values (message names the axis).
  Params complete(const Params& given) const;
  Case make_case(const Params& given, std::vector<std::string> tiers = {}) const;
};

void register_op(std::unique_ptr<Op> op);
const Op* find_op(std::string_view name);
std::vector<const Op*> all_ops();

struct OpRegistrar {
  explicit OpRegistrar(std::unique_ptr<Op> op) { register_op(std::move(op)); }
};

// Small helpers for op implementations.
int64_t param_int(const Params& p, const char* key);
double param_double(const Params& p, const char* key);
std::string param_str(const Params& p, const char* key);
bool param_bool(const Params& p, const char* key);
DType param_dtype(const Params& p, const char* key);

}  // namespace attncheck
