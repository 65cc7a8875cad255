#include "run/invariance.h"

#include <algorithm>
#include <chrono>

#include "run/evaluate.h"
#include "run/partial.h"

namespace attncheck {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

bool declares_any(const std::vector<std::string>& declared, const std::vector<std::string>& any) {
  return std::any_of(any.begin(), any.end(), [&](const std::string& p) {
    return std::find(declared.begin(), declared.end(), p) != declared.end();
  });
}

// The first output of `mapped` that differs bitwise from `first`, in words ("" when none).
std::string bitwise_difference(const TensorMap& first, const TensorMap& mapped) {
  for (const auto& [name, t] : first) {
    const auto m = mapped.find(name);
    if (m == mapped.end()) return "'" + name + "' missing from the relation's outputs";
    const auto cmp = compare_exact(name, t, m->second);
    if (!cmp.passed) return "'" + name + "' differs bitwise from the case's launch: " + cmp.message;
  }
  return "";
}

// The op's checks of `mapped` against `expected` with `checks` (the default contract's budgets),
// then the declared contract's budgets of `budget_problem` where those fail.
std::string budget_failure(const Op& op, const Problem& budget_problem,
                           const std::vector<OutputCheck>& checks, const TensorMap& expected,
                           const TensorMap& mapped, const std::optional<Contract>& contract,
                           const PartialContract& partial, Timings& timings) {
  const auto t0 = std::chrono::steady_clock::now();
  auto results = check_outputs(checks, expected, mapped);
  auto failed = [&] {
    return std::any_of(results.begin(), results.end(),
                       [](const CheckResult& c) { return !c.passed; });
  };
  if (failed() && contract && !contract->is_default())
    results = check_outputs(
        produced_checks(op.contract_checks(budget_problem, expected, *contract), partial), expected,
        mapped);
  timings.compare_ms += ms_since(t0);
  for (const auto& c : results)
    if (!c.passed) return c.name + " outside the op's budget: " + c.message;
  return "";
}

// Whether any argument lives on a sparse storage (large-offset cases): their launches move the
// whole multi-GB extent, and what they guard (offsets past 2^31) no relation changes.
bool on_sparse_storage(const Problem& p) {
  return std::any_of(p.args.begin(), p.args.end(),
                     [](const Arg& a) { return a.tensor.storage()->sparse(); });
}

// Whether the entry's declared properties are all known; the unknown ones, in words, otherwise.
std::string unknown_properties(const std::vector<std::string>& declared) {
  const auto known = known_properties();
  std::string out;
  for (const auto& p : declared)
    if (std::find(known.begin(), known.end(), p) == known.end())
      out += (out.empty() ? "'" : ", '") + p + "'";
  return out;
}

}  // namespace

void check_invariance(Result& r, const Op& op, const Problem& p, const TensorMap& expected,
                      const TensorMap& first, const std::optional<Contract>& contract,
                      const DeviceRunner& device, std::vector<std::string>& problems) {
  const auto declared = device.library().declared_properties(p.kernel);
  if (const auto unknown = unknown_properties(declared); !unknown.empty()) {
    std::string known;
    for (const auto& k : known_properties()) known += (known.empty() ? "" : ", ") + k;
    problems.push_back("invariance: kernel library " + device.library().library() + ": entry '" +
                       p.kernel + "' declares unknown properties " + unknown + " (known: " + known +
                       ")");
    return;
  }
  if (on_sparse_storage(p)) return;
  // Checked before the case's launches (evaluate.cpp): not-produced outputs are never compared.
  const PartialContract partial = entry_partial(device.library(), p.kernel, op);
  const auto t0 = std::chrono::steady_clock::now();
  auto relations = op.relations(p);
  r.timings.generate_ms += ms_since(t0);
  // The case's budgets, derived once for the relations that keep them.
  std::optional<std::vector<OutputCheck>> case_checks;
  auto checks_of = [&](const Relation& rel) {
    const auto tb = std::chrono::steady_clock::now();
    std::vector<OutputCheck> own;
    if (rel.own_budgets)
      own = produced_checks(op.checks(rel.problem, expected), partial);
    else if (!case_checks)
      case_checks = produced_checks(op.checks(p, expected), partial);
    r.timings.budgets_ms += ms_since(tb);
    return rel.own_budgets ? own : *case_checks;
  };
  for (const Relation& rel : relations) {
    RelationOutcome out;
    out.relation = rel.name;
    const bool bitwise = declares_any(declared, rel.bitwise_under);
    out.mode = bitwise ? "bitwise" : "budget";
    const auto o = device.run(rel.problem);
    std::string why;
    if (o.status != ATTNCHECK_OK) {
      r.device_error = r.device_error || o.status == ATTNCHECK_ERROR;
      why = "launch status " + std::to_string(o.status) + ": " + o.message;
    } else if (!o.violations.empty()) {
      why = o.violations.front();
    } else {
      const TensorMap mapped = rel.back(o.outputs, first);
      if (bitwise) {
        const auto tc = std::chrono::steady_clock::now();
        why = bitwise_difference(first, mapped);
        r.timings.compare_ms += ms_since(tc);
      } else {
        why = budget_failure(op, rel.own_budgets ? rel.problem : p, checks_of(rel), expected,
                             mapped, contract, partial, r.timings);
      }
    }
    out.passed = why.empty();
    out.message = out.passed ? (bitwise ? "same bits as the case's launch"
                                        : "within the op's budgets (no bitwise property declared)")
                             : why;
    if (!out.passed) problems.push_back("invariance: " + rel.name + ": " + why);
    r.invariance.push_back(std::move(out));
    if (o.status == ATTNCHECK_ERROR) break;  // the device may be unusable
  }
}

}  // namespace attncheck
