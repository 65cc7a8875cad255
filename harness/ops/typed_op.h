// An op whose parameters are one typed struct P (llama.cpp's test-backend-ops cases are the model:
// the struct's fields are the op's axes, and its vars() are the case id and the filter).
//
//   fields()          the fields of P: axis name, id prefix, member, help, allowed values or
//                     bounds; the default of each axis is the member's value in P{}
//   check(values)     (Fields<P>::check) the one validator of axis values: unknown axes, type,
//                     allowed values, bounds
//   bind(case) -> P   the only reader of a case's values, once check() has accepted them
//   unbuildable(P)    combinations of (valid) values that describe no case: an error in the case
//                     file
//   invalid(P)        the configuration's refusal reason, or nothing (PyTorch OpInfo's error
//                     inputs): decided here once; evaluate(), golden generation and the bridge's
//                     adapters all ask this, and references never decide validity
//   size(P)           what a case costs (CaseSize, ops/op.h): bytes of inputs, outputs and
//                     workspace, and work, from P alone; Op::make_case refuses a case over the
//                     budget before anything is allocated
//   make(case, P)     inputs, generated deterministically from the case (also for invalid P: the
//                     kernel must receive them and refuse)
//   kernel_params(P, inputs)
//                     the only writer of the kernel's JSON scalars
//   reference(prob, P), checks(prob, P, expected)
//
// The fields double as the reflection the coverage audit and the shrinker need (Op::axes(), each
// axis with its FieldType).
#pragma once
#include <algorithm>
#include <any>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "ops/op.h"
#include "ops/storage_offset.h"

namespace attncheck {

// One field of P: its axis, and how a case's JSON value is read into P and back. read() converts
// values Fields<P>::check has accepted; it judges nothing.
template <class P>
struct Field {
  Axis axis;
  FieldType type = FieldType::integer;
  std::function<void(P&, const nlohmann::json&)> read;
  std::function<nlohmann::json(const P&)> write;
};

// The field list of P, built in the op's fields(): each `add` names one member.
template <class P>
class Fields {
 public:
  // An int64_t, double, bool, std::string or DType member.
  template <class T>
  Fields& add(std::string name, std::string prefix, T P::*member, std::string help) {
    static_assert(std::is_same_v<T, int64_t> || std::is_same_v<T, double> ||
                      std::is_same_v<T, bool> || std::is_same_v<T, std::string> ||
                      std::is_same_v<T, DType>,
                  "a field is an int64_t, double, bool, std::string or DType (or an enum: choice)");
    Field<P> f;
    f.type = type_of<T>();
    f.write = [member](const P& p) -> nlohmann::json {
      if constexpr (std::is_same_v<T, DType>)
        return std::string(dtype_name(p.*member));
      else
        return p.*member;
    };
    f.read = [member](P& p, const nlohmann::json& v) {
      if constexpr (std::is_same_v<T, DType>) {
        const auto t = parse_dtype(v.get<std::string>());
        if (!t) throw std::logic_error("bind: unchecked dtype " + v.dump());
        p.*member = *t;
      } else {
        p.*member = v.get<T>();
      }
    };
    push(std::move(name), std::move(prefix), std::move(f), std::move(help));
    return *this;
  }

  // An enum member; its values are the names listed, in this order (the first is not implied to
  // be the default: P{} says which is).
  template <class E>
  Fields& choice(std::string name, std::string prefix, E P::*member,
                 std::vector<std::pair<E, std::string>> names, std::string help) {
    static_assert(std::is_enum_v<E>);
    Field<P> f;
    f.type = FieldType::choice;
    f.write = [member, names](const P& p) -> nlohmann::json {
      for (const auto& [value, text] : names)
        if (value == p.*member) return text;
      throw std::logic_error("enum value without a name");
    };
    f.read = [member, names](P& p, const nlohmann::json& v) {
      for (const auto& [value, text] : names)
        if (v == text) {
          p.*member = value;
          return;
        }
      throw std::logic_error("bind: unchecked choice " + v.dump());
    };
    push(std::move(name), std::move(prefix), std::move(f), std::move(help));
    for (const auto& [value, text] : names) fields_.back().axis.allowed.emplace_back(text);
    return *this;
  }

  // Modifiers of the field added last: the only values a case may give it; bounds of a numeric
  // field (Axis::min / max); staying out of case ids at its default (Axis::in_id_at_default).
  Fields& only(std::vector<nlohmann::json> values) {
    fields_.back().axis.allowed = std::move(values);
    return *this;
  }
  Fields& bounds(double min, double max) {
    fields_.back().axis.min = min;
    fields_.back().axis.max = max;
    return *this;
  }
  Fields& out_of_id_at_default() {
    fields_.back().axis.in_id_at_default = false;
    return *this;
  }

  // The one validator of axis values (Op::complete, Op::size_error, case files and make() ask
  // it, through Op::value_problem): the first of `given`'s axes that P has no field for, else the
  // first value of the wrong type or outside its allowed values, else the first numeric value
  // outside its bounds (axis_value_problem, ops/op.h); nothing when every value is one of its
  // field's. `op` names the op in messages.
  std::optional<ValueProblem> check(const std::string& op, const Params& given) const {
    if (!given.is_object()) return ValueProblem{"case parameters must be a table"};
    for (const auto& item : given.items()) {
      const std::string& k = item.key();  // a plain name: clang 14 cannot capture a binding
      if (std::none_of(fields_.begin(), fields_.end(),
                       [&](const Field<P>& f) { return f.axis.name == k; })) {
        std::string known;
        for (const auto& f : fields_) known += (known.empty() ? "" : ", ") + f.axis.name;
        return ValueProblem{"unknown axis '" + k + "' (known: " + known + ")"};
      }
    }
    std::optional<ValueProblem> out_of_bounds;
    for (const auto& f : fields_) {
      const auto it = given.find(f.axis.name);
      if (it == given.end()) continue;
      auto problem = axis_value_problem(op, f.axis, *it);
      if (problem && !problem->out_of_bounds) return problem;
      if (problem && !out_of_bounds) out_of_bounds = std::move(problem);
    }
    return out_of_bounds;
  }

  const std::vector<Field<P>>& list() const& { return fields_; }
  std::vector<Field<P>> list() && { return std::move(fields_); }

 private:
  template <class T>
  static constexpr FieldType type_of() {
    if constexpr (std::is_same_v<T, int64_t>) return FieldType::integer;
    if constexpr (std::is_same_v<T, double>) return FieldType::real;
    if constexpr (std::is_same_v<T, bool>) return FieldType::boolean;
    if constexpr (std::is_same_v<T, DType>) return FieldType::dtype;
    return FieldType::text;
  }

  void push(std::string name, std::string prefix, Field<P> f, std::string help) {
    f.axis.name = std::move(name);
    f.axis.prefix = std::move(prefix);
    f.axis.default_value = f.write(P{});
    f.axis.help = std::move(help);
    f.axis.type = f.type;
    fields_.push_back(std::move(f));
  }

  std::vector<Field<P>> fields_;
};

template <class P>
class TypedOp : public Op {
 public:
  virtual Fields<P> fields() const = 0;
  virtual std::optional<std::string> unbuildable(const P&) const { return std::nullopt; }
  virtual std::optional<std::string> invalid(const P&) const { return std::nullopt; }
  virtual CaseSize size(const P&) const = 0;
  virtual Problem make(const Case& c, const P& p) const = 0;
  virtual nlohmann::json kernel_params(const P& p, const Problem& inputs) const = 0;
  virtual TensorMap reference(const Problem& prob, const P& p) const = 0;
  virtual std::vector<OutputCheck> checks(const Problem& prob, const P& p,
                                          const TensorMap& expected) const = 0;
  // Contract-dependent ops (core/policy.h) derive their budgets for any contract here; checks()
  // of such an op are those of the default contract.
  virtual std::vector<OutputCheck> contract_checks(const Problem& prob, const P& p,
                                                   const TensorMap& expected,
                                                   const Contract& contract) const {
    (void)contract;
    return checks(prob, p, expected);
  }

  // The only reader of a case's values, which value_problem() has accepted: fields missing from
  // `params` keep P{}'s defaults.
  P bind(const attncheck::Params& params) const {
    P p{};
    for (const auto& f : field_list().list()) {
      const auto it = params.find(f.axis.name);
      if (it != params.end()) f.read(p, *it);
    }
    return p;
  }
  P bind(const Case& c) const { return bind(c.params); }
  // The inverse of bind: every field's value.
  attncheck::Params to_params(const P& p) const {
    attncheck::Params out = attncheck::Params::object();
    for (const auto& f : field_list().list()) out[f.axis.name] = f.write(p);
    return out;
  }
  // The id of the case these parameters describe (inputs are seeded by it).
  std::string case_id(const P& p) const { return name() + "/" + vars(to_params(p)); }

  // The P a problem was made from (Problem::params).
  static const P& typed(const Problem& prob) {
    const P* p = std::any_cast<P>(&prob.params);
    if (!p) throw std::logic_error("problem was not made by this op (no typed parameters)");
    return *p;
  }

  // pad_strides (ops/storage_offset.h): the arguments whose outer strides the op's contract
  // leaves free.
  virtual std::vector<std::string> padded_args(const P&) const { return {}; }
  // far_rows (ops/storage_offset.h): the row-independent arguments placed past 2^31.
  virtual FarRows far_rows_args(const P&) const { return {}; }
  // compact (ops/storage_offset.h): the arguments the op builds strided that may be contiguous.
  virtual std::vector<std::string> compacted_args(const P&) const { return {}; }
  // interleave (ops/storage_offset.h): the arguments whose innermost stride the contract leaves
  // free.
  virtual std::vector<std::string> interleaved_args(const P&) const { return {}; }

  static bool far_rows_case(const Problem& prob) {
    if constexpr (requires(const P& p) { p.far_rows; })
      return typed(prob).far_rows;
    else
      return false;
  }
  Problem host_view(const Problem& prob) const {
    if constexpr (requires(const P& p) { p.far_rows; }) {
      const P& p = typed(prob);
      if (p.far_rows) return last_rows_view(prob, far_rows_args(p));
    }
    return prob;
  }

  // ---- Op ----
  std::vector<Axis> axes() const final {
    std::vector<Axis> out;
    for (const auto& f : field_list().list()) out.push_back(f.axis);
    return out;
  }
  std::optional<ValueProblem> value_problem(const attncheck::Params& given) const final {
    return field_list().check(name(), given);
  }
  std::optional<std::string> invalid_reason(const attncheck::Params& params) const final {
    return invalid(bind(params));
  }
  CaseSize size(const attncheck::Params& params) const final { return size(bind(params)); }
  // The op's unbuildable(), then its counts (CaseSize::counts) below their minimum.
  std::optional<std::string> case_error(const attncheck::Params& params) const final {
    const P p = bind(params);
    if (auto why = unbuildable(p)) return why;
    return count_error(size(p));
  }
  Problem make(const Case& c) const final {
    if (const auto problem = value_problem(c.params))
      throw std::invalid_argument(c.id + ": " + problem->what);
    const P p = bind(c);
    if (const auto why = case_error(c.params)) throw std::invalid_argument(c.id + ": " + *why);
    Problem prob = make(c, p);
    // The pad_strides and storage_offset axes of the ops that declare them (ops/storage_offset.h).
    if constexpr (requires { p.far_rows; })
      if (p.far_rows) place_far_rows(prob, far_rows_args(p));
    if constexpr (requires { p.pad_strides; })
      if (p.pad_strides) pad_outer_strides(prob, padded_args(p));
    if constexpr (requires { p.compact; })
      if (p.compact) compact_args(prob, compacted_args(p));
    if constexpr (requires { p.interleave; })
      if (p.interleave) interleave_args(prob, interleaved_args(p));
    if constexpr (requires { p.storage_offset; })
      if (p.storage_offset) shift_storages(prob);
    prob.params = p;
    prob.kernel_params = kernel_params(p, prob);
    prob.expect_refusal = invalid(p);
    return prob;
  }
  // far_rows cases: the reference and the budgets see the last row (all the host holds).
  TensorMap reference(const Problem& prob) const final {
    TensorMap out = reference(host_view(prob), typed(prob));
    if (!far_rows_case(prob)) return out;
    // An op whose far rows are outputs only computes them all: keep the rows the kernel's hold.
    for (auto& [name, expected] : out)
      for (const auto& a : prob.args)
        if (a.name == name && a.tensor.storage() && a.tensor.storage()->sparse() &&
            expected.ndim() > 0 && expected.size(0) == a.tensor.size(0) && a.tensor.size(0) > 1)
          expected = held_rows_of(expected, a.tensor);
    return out;
  }
  std::vector<OutputCheck> checks(const Problem& prob, const TensorMap& expected) const final {
    return checks(host_view(prob), typed(prob), expected);
  }
  std::vector<OutputCheck> contract_checks(const Problem& prob, const TensorMap& expected,
                                           const Contract& contract) const final {
    return contract_checks(host_view(prob), typed(prob), expected, contract);
  }

 private:
  // fields(), built once: bind, to_params and axes() read it for every case loaded.
  const Fields<P>& field_list() const {
    std::call_once(fields_once_, [this] { fields_cache_.emplace(fields()); });
    return *fields_cache_;
  }
  mutable std::once_flag fields_once_;
  mutable std::optional<Fields<P>> fields_cache_;
};

// A contract-dependent typed op: it derives its budgets for any contract in contract_checks(P);
// its checks() are the default contract's.
template <class P>
class ContractDependentTypedOp : public TypedOp<P> {
 public:
  bool contract_dependent() const final { return true; }
  std::vector<OutputCheck> checks(const Problem& prob, const P& p,
                                  const TensorMap& expected) const final {
    return this->contract_checks(prob, p, expected, Contract{});
  }
  std::vector<OutputCheck> contract_checks(const Problem& prob, const P& p,
                                           const TensorMap& expected,
                                           const Contract& contract) const override = 0;
  using TypedOp<P>::checks;
  using TypedOp<P>::contract_checks;
};

}  // namespace attncheck
