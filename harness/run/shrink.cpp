#include "run/shrink.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <tuple>

#include "run/amend.h"
#include "run/worker.h"

namespace attncheck {

namespace {

using Clock = std::chrono::steady_clock;

// One problem of a failure message ("; "-joined, evaluate.cpp) in words a signature can hold.
std::string problem_kind(const std::string& problem) {
  struct Marker {
    const char* text;
    const char* kind;
  };
  static constexpr Marker kMarkers[] = {
      {"were never written", "unwritten"},
      {"not deterministic", "nondeterministic"},
      {"guard before buffer", "guard"},
      {"guard after buffer", "guard"},
      {"the kernel must not write there", "outside-view"},
      {"worker process died", "crash"},
      {"timed out after", "timeout"},
      {"of memory, over the limit", "memory"},
      {"kernel refused a valid configuration", "refused-valid"},
      {"kernel ran an invalid configuration", "ran-invalid"},
      {"does not know entry", "missing-entry"},
      {"has no entry", "missing-entry"},
      {"kernel error", "kernel-error"},
      {"failed on the host", "kernel-error"},
  };
  for (const auto& m : kMarkers)
    if (problem.find(m.text) != std::string::npos) return m.kind;
  return "other";
}

// The output a problem line names ("... elements of 'o' were never written"), or "".
std::string quoted_output(const std::string& problem) {
  const auto open = problem.find('\'');
  if (open == std::string::npos) return "";
  const auto close = problem.find('\'', open + 1);
  return close == std::string::npos ? "" : problem.substr(open + 1, close - open - 1);
}

std::string_view budget_kind_name(Budget::Kind k) {
  switch (k) {
    case Budget::Kind::exact:
      return "exact";
    case Budget::Kind::topk_set:
      return "topk_set";
    default:
      return "numeric";
  }
}

std::vector<std::string> split_problems(const std::string& message) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= message.size()) {
    const auto end = message.find("; ", start);
    out.push_back(
        message.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 2;
  }
  return out;
}

// How simple a value of an axis is (smaller is simpler): numbers by magnitude, then the default
// first; listed values by being the default, then by their place in the list.
using Rank = std::tuple<double, int, int>;

Rank rank_of(const Axis& axis, const nlohmann::json& v) {
  const int not_default = v == axis.default_value ? 0 : 1;
  if (v.is_number() && (axis.type == FieldType::integer || axis.type == FieldType::real))
    return {std::fabs(v.get<double>()), not_default, v.get<double>() < 0 ? 1 : 0};
  const auto it = std::find(axis.allowed.begin(), axis.allowed.end(), v);
  const int place = it == axis.allowed.end() ? static_cast<int>(axis.allowed.size())
                                             : static_cast<int>(it - axis.allowed.begin());
  return {static_cast<double>(not_default), place, 0};
}

bool allowed_value(const Axis& axis, const nlohmann::json& v) {
  if (!axis.allowed.empty() &&
      std::find(axis.allowed.begin(), axis.allowed.end(), v) == axis.allowed.end())
    return false;
  if (v.is_number()) {
    const double x = v.get<double>();
    return x >= axis.min && x <= axis.max;
  }
  return true;
}

std::vector<nlohmann::json> numeric_candidates(const Axis& axis, const nlohmann::json& current) {
  std::vector<nlohmann::json> out(axis.allowed.begin(), axis.allowed.end());
  out.push_back(axis.default_value);
  if (axis.type == FieldType::integer && current.is_number_integer()) {
    const int64_t cur = current.get<int64_t>();
    for (int64_t v : {int64_t{0}, int64_t{1}, static_cast<int64_t>(axis.min), cur / 2,
                      cur - cur / 4, cur > 0 ? cur - 1 : cur + 1})
      out.emplace_back(v);
  } else {
    const double cur = current.get<double>();
    for (double v : {0.0, 1.0, axis.min, cur / 2}) out.emplace_back(v);
  }
  return out;
}

}  // namespace

std::string ShrinkStep::describe() const {
  std::string s;
  for (const auto& name : axes)
    s += (s.empty() ? "" : ", ") + name + " " + from.at(name).dump() + " -> " + to.at(name).dump();
  return s;
}

std::string FailureSignature::describe() const {
  if (check.empty()) return kind;
  return check + " (" + kind + ")";
}

std::vector<FailureSignature> failure_signatures(const Result& r) {
  std::vector<FailureSignature> out;
  if (r.verdict != Verdict::failed) return out;
  auto add = [&](FailureSignature s) {
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(std::move(s));
  };
  for (const auto& ch : r.checks)
    if (!ch.passed) add({ch.name, std::string(budget_kind_name(ch.budget.kind))});
  for (const auto& problem : split_problems(r.message)) {
    const std::string kind = problem_kind(problem);
    // The first launch's output checks are the checks above; a later launch's ("launch 2: o:")
    // failure of them, and the contract's preamble, fall under "other" and are not targets.
    if (kind == "other") {
      const bool check_line = std::any_of(r.checks.begin(), r.checks.end(), [&](const auto& ch) {
        return !ch.passed && problem.find(ch.name + ": ") != std::string::npos;
      });
      if (check_line) continue;
    }
    const bool per_output = kind == "unwritten" || kind == "nondeterministic";
    add({per_output ? quoted_output(problem) : "", kind});
  }
  return out;
}

FailureSignature pick_target(const Result& r, const std::string& check) {
  const auto all = failure_signatures(r);
  if (all.empty())
    throw std::invalid_argument("case " + r.id + " does not fail (verdict " +
                                std::string(verdict_name(r.verdict)) + "): nothing to shrink");
  if (check.empty()) return all.front();
  for (const auto& s : all)
    if (s.check == check || s.kind == check || s.describe() == check) return s;
  std::string known;
  for (const auto& s : all) known += (known.empty() ? "" : ", ") + s.describe();
  throw std::invalid_argument("case " + r.id + " has no failing check '" + check +
                              "' (it fails: " + known + ")");
}

bool fails_with(const Result& r, const FailureSignature& target) {
  const auto all = failure_signatures(r);
  return std::find(all.begin(), all.end(), target) != all.end();
}

std::vector<nlohmann::json> simpler_values(const Axis& axis, const nlohmann::json& current) {
  std::vector<nlohmann::json> raw;
  const bool numeric =
      current.is_number() && (axis.type == FieldType::integer || axis.type == FieldType::real);
  if (numeric)
    raw = numeric_candidates(axis, current);
  else
    raw = axis.allowed.empty()
              ? std::vector<nlohmann::json>{axis.default_value}
              : std::vector<nlohmann::json>(axis.allowed.begin(), axis.allowed.end());
  if (!numeric && axis.type == FieldType::boolean) raw = {axis.default_value};
  const Rank now = rank_of(axis, current);
  std::vector<nlohmann::json> out;
  for (auto& v : raw) {
    if (axis.type == FieldType::real && v.is_number()) v = v.get<double>();
    if (v == current || !allowed_value(axis, v) || !(rank_of(axis, v) < now)) continue;
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
  }
  std::stable_sort(out.begin(), out.end(), [&](const auto& a, const auto& b) {
    return rank_of(axis, a) < rank_of(axis, b);
  });
  return out;
}

namespace {

// The case of these values, if it is one the kernel must run (not refuse) and that differs from
// every case already tried.
std::optional<Case> candidate_case(const Op& op, const Params& params,
                                   std::set<std::string>& seen) {
  try {
    Case c = op.make_case(params);
    if (op.case_error(c.params) || op.invalid_reason(c.params)) return std::nullopt;
    if (!seen.insert(c.id).second) return std::nullopt;
    c.source = "shrink";
    return c;
  } catch (const std::exception&) {  // a value complete() or bind() does not take
    return std::nullopt;
  }
}

struct Candidate {
  size_t axis;
  nlohmann::json value;
  Case c;
};

// One pass's candidates: per axis (in the op's order) each simpler value, simplest first, as a
// case not seen before.
std::vector<Candidate> candidates(const Op& op, const std::vector<Axis>& axes,
                                  const Params& current, std::set<std::string>& seen) {
  std::vector<Candidate> cands;
  for (size_t i = 0; i < axes.size(); ++i) {
    const auto& axis = axes[i];
    if (!current.contains(axis.name)) continue;
    for (const auto& v : simpler_values(axis, current.at(axis.name))) {
      Params p = current;
      p[axis.name] = v;
      if (auto c = candidate_case(op, p, seen)) cands.push_back({i, v, std::move(*c)});
    }
  }
  return cands;
}

}  // namespace

ShrinkOutcome shrink(const Op& op, const Case& failing, const Result& failing_result,
                     const FailureSignature& target, const CaseEvaluator& evaluate_cases,
                     const ShrinkOptions& options) {
  ShrinkOutcome s;
  s.original = failing;
  s.minimal = failing;
  s.minimal_result = failing_result;
  s.target = target;
  const auto t0 = Clock::now();
  const auto axes = op.axes();
  std::set<std::string> seen{failing.id};
  while (true) {
    if (s.evaluations >= options.max_evaluations) {
      s.stopped = "evaluation limit (" + std::to_string(options.max_evaluations) + ") reached";
      break;
    }
    if (options.time_budget_s > 0 &&
        std::chrono::duration<double>(Clock::now() - t0).count() >= options.time_budget_s) {
      s.stopped = "time budget spent";
      break;
    }
    std::vector<Candidate> cands = candidates(op, axes, s.minimal.params, seen);
    if (cands.empty()) {
      s.stopped = "no simpler value fails the same way";
      break;
    }
    const size_t room = static_cast<size_t>(options.max_evaluations - s.evaluations);
    if (cands.size() > room) cands.resize(room);
    std::vector<Case> batch;
    for (const auto& c : cands) batch.push_back(c.c);
    const auto results = evaluate_cases(batch);
    s.evaluations += static_cast<int>(batch.size());
    // Per axis the simplest candidate that still fails (candidates come simplest first).
    std::vector<size_t> winners;
    for (size_t k = 0; k < cands.size() && k < results.size(); ++k) {
      if (!fails_with(results[k], target)) continue;
      if (std::none_of(winners.begin(), winners.end(),
                       [&](size_t w) { return cands[w].axis == cands[k].axis; }))
        winners.push_back(k);
    }
    if (winners.empty()) {
      s.stopped = "no simpler value fails the same way";
      break;
    }
    ++s.passes;
    ShrinkStep step;
    step.from = nlohmann::json::object();
    step.to = nlohmann::json::object();
    std::optional<std::pair<Case, Result>> taken;
    if (winners.size() > 1 && s.evaluations < options.max_evaluations) {
      Params all = s.minimal.params;
      for (size_t w : winners) all[axes[cands[w].axis].name] = cands[w].value;
      if (auto combo = candidate_case(op, all, seen)) {
        const auto r = evaluate_cases({*combo});
        ++s.evaluations;
        if (!r.empty() && fails_with(r.front(), target)) {
          for (size_t w : winners) step.axes.push_back(axes[cands[w].axis].name);
          taken.emplace(*combo, r.front());
        }
      }
    }
    if (!taken) {
      const size_t w = winners.front();
      step.axes = {axes[cands[w].axis].name};
      taken.emplace(cands[w].c, results[w]);
    }
    for (const auto& name : step.axes) {
      step.from[name] = s.minimal.params.at(name);
      step.to[name] = taken->first.params.at(name);
    }
    s.steps.push_back(step);
    s.minimal = taken->first;
    s.minimal_result = taken->second;
    if (options.on_step) options.on_step(step, s.minimal, s.evaluations);
  }
  return s;
}

namespace {

std::string toml_value(const nlohmann::json& v) {
  if (v.is_number_float()) {
    std::ostringstream os;
    os << v.dump();
    std::string t = os.str();
    if (t.find_first_of(".eE") == std::string::npos && t.find_first_of("ni") == std::string::npos)
      t += ".0";
    return t;
  }
  return v.dump();  // integers, booleans and strings read the same in TOML
}

}  // namespace

std::string case_file_entry(const Op& op, const Params& params, const Params& file_defaults) {
  std::string s;
  for (const auto& axis : op.axes()) {
    if (!params.contains(axis.name)) continue;
    const auto& v = params.at(axis.name);
    if (v == axis.default_value && !file_defaults.contains(axis.name)) continue;
    s += (s.empty() ? "" : ", ") + axis.name + " = " + toml_value(v);
  }
  return s.empty() ? "{}" : "{ " + s + " }";
}

Params non_default_params(const Op& op, const Params& params) {
  Params out = Params::object();
  for (const auto& axis : op.axes())
    if (params.contains(axis.name) && params.at(axis.name) != axis.default_value)
      out[axis.name] = params.at(axis.name);
  return out;
}

std::string shrunk_repro_command(const Op& op, const Case& c, const RunOptions& opt) {
  return repro_command(c, opt) + " --params '" + non_default_params(op, c.params).dump() + "'";
}

Case adhoc_case(const std::string& id_or_op, const nlohmann::json& params) {
  const std::string op_name = id_or_op.substr(0, id_or_op.find('/'));
  const Op* op = find_op(op_name);
  if (!op) throw std::invalid_argument("--params: unknown op '" + shown_id(op_name) + "'");
  if (!params.is_object())
    throw std::invalid_argument("--params: expected a JSON object of axis values, got " +
                                params.dump());
  Case c = op->make_case(params);
  if (const auto why = op->case_error(c.params)) throw std::invalid_argument(c.id + ": " + *why);
  if (id_or_op.find('/') != std::string::npos && id_or_op != c.id)
    throw std::invalid_argument("--params describe case '" + c.id + "', not '" +
                                shown_id(id_or_op) + "'");
  c.source = "--params";
  return c;
}

nlohmann::json shrunk_json(const Op& op, const ShrinkOutcome& s, const RunOptions& opt,
                           const Params& file_defaults) {
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& st : s.steps)
    steps.push_back({{"axes", st.axes}, {"from", st.from}, {"to", st.to}});
  return {{"id", s.minimal.id},
          {"original_id", s.original.id},
          {"params", s.minimal.params},
          {"case_file_entry", case_file_entry(op, s.minimal.params, file_defaults)},
          {"repro", shrunk_repro_command(op, s.minimal, opt)},
          {"check", s.target.describe()},
          {"message", s.minimal_result.message},
          {"steps", steps},
          {"evaluations", s.evaluations},
          {"passes", s.passes},
          {"stopped", s.stopped}};
}

CaseEvaluator in_process_evaluator(const EvalContext& eval) {
  return [&eval](const std::vector<Case>& cases) {
    std::vector<Result> out;
    for (const auto& c : cases) out.push_back(evaluate(c, eval));
    return out;
  };
}

CaseEvaluator worker_evaluator(const WorkerSpec& spec, const RunOptions& opt) {
  return [spec, opt](const std::vector<Case>& cases) {
    std::vector<Result> out(cases.size());
    std::vector<PoolTask> tasks;
    for (const auto& c : cases) tasks.push_back({c.id, case_to_json(c)});
    PoolCallbacks cb;
    cb.on_result = [&](size_t i, const nlohmann::json& j) {
      try {
        out[i] = Result::from_json(j);
      } catch (const std::invalid_argument& e) {
        out[i] = amend(cases[i], {}, Amendment::unreadable_line, {e.what(), Mode::kernel, &opt});
      }
    };
    cb.on_lost = [&](size_t i, const std::string& what) {
      out[i] = amend(cases[i], {}, Amendment::lost, {what, Mode::kernel, &opt});
    };
    run_in_workers(spec, tasks, cb);
    return out;
  };
}

}  // namespace attncheck
