// One op family = one Op: its axes, how a case becomes kernel arguments (inputs generated
// deterministically from the case id), the reference outputs, and how each output is checked.
// Every op is a TypedOp<P> (ops/typed_op.h); Op is the type-erased face the run machinery holds.
// Adding an op touches reference/, kernels_under_test/, harness/ops/, cases/, golden/ and
// docs/ops/ (README.md "Adding an op").
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/case.h"
#include "core/policy.h"
#include "ops/graph_variant.h"
#include "ops/relation.h"

namespace attncheck {

// What an axis holds (the coverage audit and the shrinker order values by it).
enum class FieldType { integer, real, boolean, text, dtype, choice };

struct Axis {
  std::string name;    // as written in case files: "heads"
  std::string prefix;  // in case ids: "h" -> "h16"; "" prints the value alone ("bf16")
  nlohmann::json default_value;
  std::vector<nlohmann::json> allowed;  // empty: any value of the default's JSON type
  std::string help;
  // false: the axis appears in a case id only when it differs from its default, so that adding
  // an axis to an op keeps every existing case id (and golden) unchanged.
  bool in_id_at_default = true;
  // Bounds of a numeric axis, checked where case files are read (file, line and axis named): a
  // context of 1e9 or a head count of INT64_MAX must not reach make() and allocate gigabytes.
  // The default fits every shape the ops model (65536 is the largest in use); an op may narrow it.
  static constexpr double kDefaultBound = 1 << 17;
  double min = -kDefaultBound;
  double max = kDefaultBound;
  FieldType type = FieldType::integer;  // the field's C++ type (ops/typed_op.h)
};

// What is wrong with axis values (Fields<P>::check, the one validator, ops/typed_op.h).
struct ValueProblem {
  std::string what;  // "axis 'heads' value 5 is not one of 1, 2, 3, 4"
  // A numeric value outside [Axis::min, Axis::max]: part of the size budget (Op::size_error),
  // reported with the case id; every other problem means the values describe no case id.
  bool out_of_bounds = false;
};
// One value of an axis: of the axis' type (a dtype's name for a dtype), one of its allowed
// values, within its bounds; `op` names the op in the bounds message.
std::optional<ValueProblem> axis_value_problem(const std::string& op, const Axis& axis,
                                               const nlohmann::json& value);

// A named region of one output that a kernel entry may declare unspecified (its partial contract,
// docs/verification.md "Partial contracts"): "logits" / "past_context".
struct OutputRegion {
  std::string output;
  std::string region;
  std::string meaning;  // in words, for messages and docs
};

// The region "past_context" of a paged decode's `logits` [requests x next_n rows, columns]: the
// columns at or past each request's context length (`context_lens`), which a top-k over the
// context never reads. Whether element `idx` of the problem's logits lies in it.
inline constexpr const char* kPastContext = "past_context";
bool logits_past_context(const Problem& p, const Index& idx);
std::vector<OutputRegion> logits_past_context_region();

// What one case costs, declared by its op from the parameters alone, before anything is
// allocated (TypedOp::size; docs/cases.md "Size budget"): the bytes the host holds for its inputs,
// outputs and workspace (a sparse storage counts its held window, not its extent: docs/abi.md
// "Large-offset cases"), and its work (the reference's multiply-adds or element visits). An upper
// estimate, within a small factor of what make() allocates (ops/tests/case_size_test.cpp).
struct CaseSize {
  double input_bytes = 0;
  double output_bytes = 0;
  double workspace_bytes = 0;
  double work = 0;
  // Axes that count things (requests, heads, tokens): below `min` a case describes no problem.
  struct Count {
    std::string axis;
    int64_t value = 0;
    int64_t min = 1;
  };
  std::vector<Count> counts;
  CaseSize& count(std::string axis, int64_t value, int64_t min = 1) {
    counts.push_back({std::move(axis), value, min});
    return *this;
  }
  double bytes() const { return input_bytes + output_bytes + workspace_bytes; }
};
// The first count below its minimum ("axis 'batch' = 0 counts nothing: ..."), or nothing: part of
// the case error (Op::case_error), after the op's own unbuildable().
std::optional<std::string> count_error(const CaseSize& size);

// The budget every case must fit: 4 GiB of host bytes and 2^39 units of work by default (smoke,
// quick and full cases fit a quarter of it, bench cases the whole: mla_decode's take 7.3e10 of
// work). $ATTNCHECK_MAX_CASE_BYTES and $ATTNCHECK_MAX_CASE_WORK override them.
struct SizeLimits {
  double bytes = 4.0 * (1ull << 30);
  double work = static_cast<double>(1ull << 39);
};
// The defaults with the environment's overrides; throws std::invalid_argument naming the variable
// for a value that is not a positive integer.
SizeLimits size_limits();

// A case over the size budget or with a count below its minimum: bad input (exit 2), not a
// verdict. what() names the case, the axis and the limit.
struct CaseSizeError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

class Op {
 public:
  virtual ~Op() = default;
  virtual std::string name() const = 0;
  virtual std::vector<Axis> axes() const = 0;
  // The id part after "<op>/": axis prefix + value, '-' joined, in axes() order.
  virtual std::string vars(const Params& p) const;
  // The library entries this op's problems launch; make() picks one per case (Problem::kernel,
  // left empty for the op's only entry). Checked against every kernel library's list.
  virtual std::vector<std::string> kernel_entries() const { return {name()}; }
  // Inputs generated deterministically from the case. An invalid configuration still yields a
  // problem, with expect_refusal set to the op's reason (typed ops: TypedOp::invalid); the
  // reference is never asked for it.
  virtual Problem make(const Case& c) const = 0;
  // Expected final contents of every output/inout arg, from the problem's initial bytes.
  virtual TensorMap reference(const Problem& p) const = 0;
  // How each output is judged against `expected` (the reference's outputs, or the golden's).
  virtual std::vector<OutputCheck> checks(const Problem& p, const TensorMap& expected) const = 0;
  // Whether a kernel's arithmetic contract (core/policy.h, docs/verification.md "Arithmetic
  // contracts") changes this op's budgets. Exact ops (copies, index maps) ignore contracts.
  virtual bool contract_dependent() const { return false; }
  // The checks for a kernel that computes under `contract`: each budget derived from the op's
  // error model with the contract's extra roundings. The default contract's are checks().
  virtual std::vector<OutputCheck> contract_checks(const Problem& p, const TensorMap& expected,
                                                   const Contract& contract) const {
    (void)contract;
    return checks(p, expected);
  }
  // Declared deterministic kernels must repeat bitwise (--repeat).
  virtual bool deterministic() const { return true; }
  // Metamorphic relations of a valid problem (ops/relation.h, docs/verification.md
  // "Invariance"): transformed problems whose outputs, mapped back, must equal the case's.
  virtual std::vector<Relation> relations(const Problem& p) const {
    (void)p;
    return {};
  }
  // The first problem of these axis values (unknown axis, type, allowed values, bounds), or
  // nothing: Fields<P>::check (ops/typed_op.h), the one validator.
  virtual std::optional<ValueProblem> value_problem(const Params& given) const = 0;
  // Why these (completed, valid) values describe no case at all (a case-file error): the op's
  // TypedOp::unbuildable, then its counts (CaseSize::counts) below their minimum.
  virtual std::optional<std::string> case_error(const Params& params) const = 0;
  // Why the kernel must refuse the configuration of these (completed, valid) values, or nothing:
  // the op's TypedOp::invalid, also what make() puts in Problem::expect_refusal.
  virtual std::optional<std::string> invalid_reason(const Params& params) const = 0;
  // Graph replay (ops/graph_variant.h): the problem to capture the launch with, whose metadata
  // inputs (lengths, block tables, positions, slots, indices) hold other contents than `p`'s;
  // nothing for ops without mutable metadata, or when `p` leaves nothing to change.
  virtual std::optional<GraphVariant> graph_variant(const Problem& p) const {
    (void)p;
    return std::nullopt;
  }
  // Partial contracts (docs/verification.md "Partial contracts"): the regions of its outputs a
  // kernel entry may declare unspecified (none by default), and whether element `idx` of output
  // `output` of problem `p` lies in region `region` (one of output_regions()).
  virtual std::vector<OutputRegion> output_regions() const { return {}; }
  virtual bool in_region(const std::string& output, const std::string& region, const Problem& p,
                         const Index& idx) const {
    (void)output, (void)region, (void)p, (void)idx;
    return false;
  }
  // The case's declared size (CaseSize), from its completed parameters; nothing is allocated.
  virtual CaseSize size(const Params& params) const = 0;
  // Why these completed parameters are no case to build: a value value_problem() refuses (a
  // numeric axis outside its bounds), or a size over the budget (naming the axis that weighs most
  // and the limit); nothing when the case fits.
  std::optional<std::string> size_error(const Params& params, const SizeLimits& limits) const;

  // The axes as the ABI's case_context lists them: name, type, default, allowed, min, max.
  nlohmann::json field_list() const;

  // make() with the kernel entry filled in and checked against kernel_entries().
  Problem problem(const Case& c) const;

  // Fills defaults; throws std::invalid_argument("<op>: <problem>") for a value_problem() other
  // than bounds (those are make_case's, with the case id).
  Params complete(const Params& given) const;
  // complete(), the case's id, and size_error() against size_limits(): throws CaseSizeError
  // ("<id>: <why>") for a case outside its bounds or over the budget, so no caller (case files,
  // --params, shrink, coverage) builds one.
  Case make_case(const Params& given, std::vector<std::string> tiers = {}) const;
};

void register_op(std::unique_ptr<Op> op);
const Op* find_op(std::string_view name);
std::vector<const Op*> all_ops();

struct OpRegistrar {
  explicit OpRegistrar(std::unique_ptr<Op> op) { register_op(std::move(op)); }
};

}  // namespace attncheck
