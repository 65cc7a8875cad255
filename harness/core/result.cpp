#include "core/result.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace attncheck {

namespace {

constexpr std::pair<Verdict, std::string_view> kVerdictNames[] = {
    {Verdict::passed, "passed"},
    {Verdict::failed, "failed"},
    {Verdict::refused_as_expected, "refused_as_expected"},
    {Verdict::known_bug, "known_bug"},
    {Verdict::unexpected_pass, "unexpected_pass"},
    {Verdict::unsupported, "unsupported"},
    {Verdict::skipped, "skipped"},
    {Verdict::error, "error"},
};
constexpr std::pair<Mode, std::string_view> kModeNames[] = {
    {Mode::kernel, "kernel"}, {Mode::reference, "reference"}, {Mode::none, "none"}};
constexpr std::pair<Budget::Kind, std::string_view> kBudgetKinds[] = {
    {Budget::Kind::numeric, "numeric"},
    {Budget::Kind::exact, "exact"},
    {Budget::Kind::topk_set, "topk_set"}};

template <class E, size_t N>
std::string_view name_of(const std::pair<E, std::string_view> (&table)[N], E e) {
  for (const auto& [v, n] : table)
    if (v == e) return n;
  return "?";
}
template <class E, size_t N>
std::optional<E> value_of(const std::pair<E, std::string_view> (&table)[N], std::string_view s) {
  for (const auto& [v, n] : table)
    if (n == s) return v;
  return std::nullopt;
}

// The metrics stored per check; the same list serializes and parses them.
template <class F>
void for_each_metric(Metrics& m, F&& f) {
  f("count", m.count);
  f("mismatches", m.mismatches);
  f("mismatch_frac", m.mismatch_frac);
  f("max_abs", m.max_abs);
  f("max_rel", m.max_rel);
  f("rel_l2", m.rel_l2);
  f("calc_diff", m.calc_diff);
  f("cosine", m.cosine);
  f("nan_actual", m.nan_actual);
  f("nan_expected", m.nan_expected);
  f("inf_actual", m.inf_actual);
  f("neginf_mask_mismatch", m.neginf_mask_mismatch);
  f("max_ulp", m.max_ulp);
  f("bit_mismatches", m.bit_mismatches);
  f("topk_missing", m.topk_missing);
  f("topk_invalid", m.topk_invalid);
}

nlohmann::json metrics_json(Metrics m) {
  nlohmann::json j = nlohmann::json::object();
  for_each_metric(m, [&](const char* key, auto& v) {
    if constexpr (std::is_floating_point_v<std::remove_reference_t<decltype(v)>>)
      j[key] = json_number(v);
    else
      j[key] = v;
  });
  if (!m.worst.index.empty())
    j["worst"] = {{"index", m.worst.index},
                  {"expected", json_number(m.worst.expected)},
                  {"actual", json_number(m.worst.actual)},
                  {"abs_err", json_number(m.worst.abs_err)},
                  {"ratio", json_number(m.worst.ratio)}};
  return j;
}

Metrics metrics_from_json(const nlohmann::json& j) {
  Metrics m;
  for_each_metric(m, [&](const char* key, auto& v) {
    using T = std::remove_reference_t<decltype(v)>;
    if (!j.contains(key)) return;
    if constexpr (std::is_floating_point_v<T>)
      v = number_from_json(j.at(key));
    else
      v = j.at(key).get<T>();
  });
  if (j.contains("worst")) {
    const auto& w = j.at("worst");
    m.worst.index = w.at("index").get<Index>();
    m.worst.expected = number_from_json(w.at("expected"));
    m.worst.actual = number_from_json(w.at("actual"));
    m.worst.abs_err = number_from_json(w.at("abs_err"));
    m.worst.ratio = number_from_json(w.at("ratio"));
  }
  return m;
}

const nlohmann::json& field(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key))
    throw std::invalid_argument(std::string("result record has no field '") + key + "'");
  return j.at(key);
}

// results.jsonl's "timings_ms" keys, one per phase of Timings.
constexpr std::pair<const char*, double Timings::*> kTimingKeys[] = {
    {"generate", &Timings::generate_ms},   {"golden", &Timings::golden_ms},
    {"reference", &Timings::reference_ms}, {"budgets", &Timings::budgets_ms},
    {"upload", &Timings::upload_ms},       {"kernel", &Timings::kernel_ms},
    {"relaunch", &Timings::relaunch_ms},   {"download", &Timings::download_ms},
    {"guards", &Timings::guards_ms},       {"compare", &Timings::compare_ms},
    {"other", &Timings::other_ms},         {"ipc", &Timings::ipc_ms}};

// Rounded to microseconds: the file stays small and nothing finer is meaningful.
nlohmann::json timings_json(const Timings& t) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [key, member] : kTimingKeys)
    if (t.*member != 0 || member == &Timings::generate_ms)
      j[key] = std::round(t.*member * 1e3) / 1e3;
  return j;
}

Timings timings_from_json(const nlohmann::json& j) {
  Timings t;
  for (const auto& [key, member] : kTimingKeys) t.*member = j.value(key, 0.0);
  return t;
}

}  // namespace

std::string_view verdict_name(Verdict v) {
  return name_of(kVerdictNames, v);
}
std::optional<Verdict> parse_verdict(std::string_view name) {
  return value_of(kVerdictNames, name);
}
bool is_failing(Verdict v) {
  return v == Verdict::failed || v == Verdict::error;
}
std::string_view mode_name(Mode m) {
  return name_of(kModeNames, m);
}
std::optional<Mode> parse_mode(std::string_view name) {
  return value_of(kModeNames, name);
}

nlohmann::json json_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}
double number_from_json(const nlohmann::json& j) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const auto s = j.get<std::string>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  throw std::invalid_argument("not a number: " + j.dump());
}

double Timings::total_ms() const {
  double sum = 0;
  for (const auto& [key, member] : kTimingKeys) sum += this->*member;
  return sum;
}

std::vector<std::string> timing_phase_names() {
  std::vector<std::string> names;
  for (const auto& [key, member] : kTimingKeys) names.emplace_back(key);
  return names;
}

double timing_of(const Timings& t, const std::string& phase) {
  for (const auto& [key, member] : kTimingKeys)
    if (phase == key) return t.*member;
  return 0;
}

nlohmann::json Result::to_json() const {
  nlohmann::json checks_j = nlohmann::json::array();
  for (const auto& c : checks) {
    const nlohmann::json b = {{"kind", name_of(kBudgetKinds, c.budget.kind)},
                              {"atol", json_number(c.budget.atol)},
                              {"rtol", json_number(c.budget.rtol)},
                              {"max_mismatch_frac", json_number(c.budget.max_mismatch_frac)},
                              {"max_calc_diff", json_number(c.budget.max_calc_diff)},
                              {"tie_tol", json_number(c.budget.tie_tol)},
                              {"why", c.budget.why}};
    checks_j.push_back({{"name", c.name},
                        {"passed", c.passed},
                        {"message", c.message},
                        {"budget", b},
                        {"metrics", metrics_json(c.metrics)},
                        {"margin", json_number(check_margin(c))}});
  }
  nlohmann::json j = {{"id", id},
                      {"op", op},
                      {"params", params},
                      {"verdict", verdict_name(verdict)},
                      {"failing", failing()},
                      {"mode", mode_name(mode)},
                      {"message", message},
                      {"checks", checks_j},
                      {"timings_ms", timings_json(timings)},
                      {"arch", arch},
                      {"repro", repro},
                      {"kernel_entry", kernel_entry},
                      {"expected_from", expected_from}};
  if (timings.launches) j["launches"] = timings.launches;
  if (timings.locked_ms > 0) j["locked_ms"] = std::round(timings.locked_ms * 1e3) / 1e3;
  if (!bundle.empty()) j["bundle"] = bundle;
  if (!contract.empty()) j["contract"] = contract;
  if (!partial.is_null()) j["partial"] = partial;
  if (!not_provided_by.empty()) j["not_provided_by"] = not_provided_by;
  if (device_error) j["device_error"] = true;
  if (stress)
    j["stress"] = {
        {"launches", stress->launches},     {"differing", stress->differing},
        {"failed", stress->failed},         {"nondeterminism_rate", stress->rate()},
        {"conditions", stress->conditions}, {"first_difference", stress->first_difference}};
  if (!invariance.empty()) {
    j["invariance"] = nlohmann::json::array();
    for (const auto& o : invariance)
      j["invariance"].push_back({{"relation", o.relation},
                                 {"mode", o.mode},
                                 {"passed", o.passed},
                                 {"message", o.message}});
  }
  return j;
}

Result Result::from_json(const nlohmann::json& j) {
  Result r;
  try {
    r.id = field(j, "id").get<std::string>();
    r.op = field(j, "op").get<std::string>();
    r.params = j.value("params", Params::object());
    const auto v = parse_verdict(field(j, "verdict").get<std::string>());
    if (!v) throw std::invalid_argument("unknown verdict " + j.at("verdict").dump());
    r.verdict = *v;
    const auto m = parse_mode(field(j, "mode").get<std::string>());
    if (!m) throw std::invalid_argument("unknown mode " + j.at("mode").dump());
    r.mode = *m;
    r.message = j.value("message", "");
    for (const auto& c : j.value("checks", nlohmann::json::array())) {
      CheckResult cr;
      cr.name = field(c, "name").get<std::string>();
      cr.passed = field(c, "passed").get<bool>();
      cr.message = c.value("message", "");
      const auto& b = field(c, "budget");
      const auto kind = value_of(kBudgetKinds, field(b, "kind").get<std::string>());
      if (!kind) throw std::invalid_argument("unknown budget kind " + b.at("kind").dump());
      cr.budget.kind = *kind;
      cr.budget.atol = number_from_json(field(b, "atol"));
      cr.budget.rtol = number_from_json(field(b, "rtol"));
      cr.budget.max_mismatch_frac = number_from_json(field(b, "max_mismatch_frac"));
      cr.budget.max_calc_diff = number_from_json(field(b, "max_calc_diff"));
      cr.budget.tie_tol = number_from_json(b.value("tie_tol", nlohmann::json(0.0)));
      cr.budget.why = b.value("why", "");
      cr.metrics = metrics_from_json(c.value("metrics", nlohmann::json::object()));
      r.checks.push_back(std::move(cr));
    }
    r.timings = timings_from_json(j.value("timings_ms", nlohmann::json::object()));
    r.timings.launches = j.value("launches", 0);
    r.timings.locked_ms = j.value("locked_ms", 0.0);
    r.arch = j.value("arch", "");
    r.repro = j.value("repro", "");
    r.kernel_entry = j.value("kernel_entry", "");
    r.expected_from = j.value("expected_from", "");
    r.bundle = j.value("bundle", "");
    r.contract = j.value("contract", "");
    r.partial = j.value("partial", nlohmann::json());
    if (!r.partial.is_null() && !r.partial.is_object())
      throw std::invalid_argument("\"partial\" must be an object or null, got " + r.partial.dump());
    r.not_provided_by = j.value("not_provided_by", "");
    r.device_error = j.value("device_error", false);
    if (j.contains("stress")) {
      const auto& st = j.at("stress");
      StressStats ss;
      ss.launches = field(st, "launches").get<int>();
      ss.differing = field(st, "differing").get<int>();
      ss.failed = st.value("failed", 0);
      ss.conditions = st.value("conditions", "");
      ss.first_difference = st.value("first_difference", "");
      r.stress = ss;
    }
    for (const auto& o : j.value("invariance", nlohmann::json::array()))
      r.invariance.push_back({field(o, "relation").get<std::string>(),
                              field(o, "mode").get<std::string>(), field(o, "passed").get<bool>(),
                              o.value("message", "")});
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("malformed result record: ") + e.what());
  }
  return r;
}

}  // namespace attncheck
