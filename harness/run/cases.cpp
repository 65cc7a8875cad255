#include "cases.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <set>
#include <sstream>

#include <re2/re2.h>

#include <toml++/toml.h>

#include "run/covering.h"
#include "run/scheduling.h"

namespace attncheck {

namespace {

// An exclude rule becomes one forbidden assignment per combination of its listed values.
constexpr uint64_t kMaxExcludeCombinations = 100000;

// [[known_bug]] arch patterns are short alternatives of arch names ("gfx942|gfx950").
constexpr size_t kMaxArchRegexBytes = 256;

std::string at(const std::string& path, const toml::source_region& src) {
  return path + ":" + std::to_string(src.begin.line) + ":" + std::to_string(src.begin.column);
}
std::string line_of(const std::string& path, const toml::source_region& src) {
  return path + ":" + std::to_string(src.begin.line);
}

[[noreturn]] void fail(const std::string& path, const toml::node& node, const std::string& what) {
  throw CaseFileError(at(path, node.source()) + ": " + what);
}

std::string join_keys(std::initializer_list<std::string_view> keys) {
  std::string s;
  for (auto k : keys) s += (s.empty() ? "" : ", ") + std::string(k);
  return s;
}

void allow_keys(const std::string& path, const toml::table& t, const std::string& where,
                std::initializer_list<std::string_view> keys) {
  for (const auto& [k, v] : t) {
    if (std::find(keys.begin(), keys.end(), k.str()) == keys.end())
      fail(path, v,
           where + ": unknown field '" + std::string(k.str()) + "' (allowed: " + join_keys(keys) +
               ")");
  }
}

nlohmann::json scalar(const std::string& path, const toml::node& n, const std::string& field) {
  if (auto v = n.as_integer()) return v->get();
  if (auto v = n.as_floating_point()) return v->get();
  if (auto v = n.as_string()) return v->get();
  if (auto v = n.as_boolean()) return v->get();
  fail(path, n, field + ": expected a number, string or boolean");
}

const toml::table& as_table(const std::string& path, const toml::node& n,
                            const std::string& field) {
  if (auto t = n.as_table()) return *t;
  fail(path, n, field + ": expected a table");
}

std::string as_string(const std::string& path, const toml::node& n, const std::string& field) {
  if (auto s = n.as_string()) return s->get();
  fail(path, n, field + ": expected a string");
}

// Values of a table entry: a scalar, or an array of scalars (non-empty).
std::vector<nlohmann::json> value_list(const std::string& path, const toml::node& n,
                                       const std::string& field, bool scalar_ok) {
  std::vector<nlohmann::json> out;
  if (auto arr = n.as_array()) {
    if (arr->empty()) fail(path, n, field + ": empty list of values");
    for (const auto& e : *arr) out.push_back(scalar(path, e, field));
    return out;
  }
  if (!scalar_ok) fail(path, n, field + ": expected a list of values, e.g. [1, 16, 64]");
  out.push_back(scalar(path, n, field));
  return out;
}

// One axis value as the file gives it, judged by the op's one validator (Op::value_problem:
// unknown axis, type, allowed values, bounds); the error names `node` and `field`.
void check_value(const std::string& path, const Op& op, const std::string& axis,
                 const nlohmann::json& value, const toml::node& node, const std::string& field) {
  Params one = Params::object();
  one[axis] = value;
  if (const auto problem = op.value_problem(one))
    fail(path, node, field + ": " + op.name() + ": " + problem->what);
}

int64_t env_limit(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (*end || n <= 0)
    throw CaseFileError(std::string("$") + name + "='" + v + "': expected a positive integer");
  return n;
}

// Upper bound of the rows a group's tier expands to, without expanding it (a cartesian product
// of a million rows must be refused before it is built).
uint64_t row_bound(const CaseGroup& g, const std::string& how) {
  if (how == "list") return g.cases.size();
  uint64_t n = 1;
  for (const auto& [axis, values] : g.axes)
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(values.size()), &n)) return UINT64_MAX;
  return n;  // pairwise covers with fewer rows than the product
}

// What a pairwise expansion of the group costs before it is built: the value pairs of any two
// axes it must cover (its time and memory grow with them), and the rows that the two largest axes
// alone need (each of their pairs takes a row of its own).
struct PairwiseCost {
  uint64_t pairs = 0, axis_pairs = 0, floor = 0;
};
PairwiseCost pairwise_cost(const CaseGroup& g) {
  PairwiseCost c;
  for (size_t a = 0; a < g.axes.size(); ++a)
    for (size_t b = a + 1; b < g.axes.size(); ++b) {
      const uint64_t n = static_cast<uint64_t>(g.axes[a].second.size()) *
                         static_cast<uint64_t>(g.axes[b].second.size());
      c.pairs += n;
      c.floor = std::max(c.floor, n);
      ++c.axis_pairs;
    }
  if (g.axes.size() == 1) c.floor = g.axes.front().second.size();
  return c;
}

std::string json_text(const nlohmann::json& v) {
  return v.is_string() ? "\"" + v.get<std::string>() + "\"" : v.dump();
}

// Params for one row: the file's defaults, then the group's values.
Params merged(const Params& defaults, const Params& given) {
  Params p = defaults;
  for (const auto& [k, v] : given.items()) p[k] = v;
  return p;
}

bool exclude_matches(const std::map<std::string, std::vector<nlohmann::json>>& rule,
                     const Params& complete) {
  for (const auto& [axis, values] : rule)
    if (std::find(values.begin(), values.end(), complete.at(axis)) == values.end()) return false;
  return true;
}

std::string where_group(const CaseGroup& g) {
  return "group '" + g.name + "'";
}

std::string registered_ops() {
  std::string s;
  for (const Op* o : all_ops()) s += (s.empty() ? "" : ", ") + o->name();
  return s;
}

bool has_axis(const Op& op, const std::string& name) {
  const auto axes = op.axes();
  return std::any_of(axes.begin(), axes.end(), [&](const Axis& a) { return a.name == name; });
}

std::string axis_names_of(const Op& op) {
  std::string s;
  for (const auto& a : op.axes()) s += (s.empty() ? "" : ", ") + a.name;
  return s;
}

// `[coverage]` with `[[coverage.accept]]` entries: { argument = "..." | arguments = [...],
// flag = "...", reason = "..." }. Argument names other than "axis.<axis>" are checked by the audit,
// which knows what the op's kernels receive.
std::vector<CoverageAcceptance> parse_coverage(const std::string& path, const toml::node& node,
                                               const Op& op) {
  const auto& t = as_table(path, node, "[coverage]");
  allow_keys(path, t, "[coverage]", {"accept"});
  std::vector<CoverageAcceptance> out;
  const toml::node* acc = t.get("accept");
  if (!acc) return out;
  const auto* arr = acc->as_array();
  if (!arr) fail(path, *acc, "coverage.accept: expected [[coverage.accept]] entries");
  std::set<std::pair<std::string, std::string>> seen;  // (argument, flag)
  for (const auto& e : *arr) {
    const std::string w = "[[coverage.accept]]";
    const auto& et = as_table(path, e, w);
    allow_keys(path, et, w, {"argument", "arguments", "flag", "reason"});
    CoverageAcceptance a;
    a.source = line_of(path, e.source());
    const toml::node* one = et.get("argument");
    const toml::node* many = et.get("arguments");
    if (!one == !many) fail(path, e, w + ": needs exactly one of 'argument' or 'arguments'");
    if (one) a.arguments.push_back(as_string(path, *one, w + " argument"));
    if (many) {
      const auto* list = many->as_array();
      if (!list || list->empty()) fail(path, *many, w + " arguments: expected a non-empty list");
      for (const auto& n : *list) a.arguments.push_back(as_string(path, n, w + " arguments"));
    }
    const toml::node* flag = et.get("flag");
    if (!flag) fail(path, e, w + ": missing 'flag' (never-varied, derived or never-extreme)");
    a.flag = as_string(path, *flag, w + " flag");
    if (std::find(std::begin(kCoverageFlags), std::end(kCoverageFlags), a.flag) ==
        std::end(kCoverageFlags))
      fail(
          path, *flag,
          w + " flag: unknown flag '" + a.flag + "' (flags: never-varied, derived, never-extreme)");
    const toml::node* reason = et.get("reason");
    if (!reason) fail(path, e, w + ": missing 'reason' (an acceptance needs a written reason)");
    a.reason = as_string(path, *reason, w + " reason");
    if (a.reason.find_first_not_of(" \t\n") == std::string::npos)
      fail(path, *reason, w + " reason: empty (an acceptance needs a written reason)");
    for (const auto& arg : a.arguments) {
      if (arg.empty()) fail(path, e, w + ": empty argument name");
      if (arg.rfind("axis.", 0) == 0) {
        const auto axes = op.axes();
        if (std::none_of(axes.begin(), axes.end(),
                         [&](const Axis& ax) { return "axis." + ax.name == arg; }))
          fail(path, e,
               w + ": '" + arg + "' names no axis of op '" + op.name() +
                   "' (axes: " + axis_names_of(op) + ")");
      }
      if (!seen.emplace(arg, a.flag).second)
        fail(path, e, w + ": '" + arg + "' flag '" + a.flag + "' is accepted twice");
    }
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace

std::string tier_names() {
  std::string s;
  for (std::string_view t : kTiers) s += (s.empty() ? "" : ", ") + std::string(t);
  return s;
}

bool is_tier(std::string_view t) {
  return std::find(std::begin(kTiers), std::end(kTiers), t) != std::end(kTiers);
}

// Exclude rules become forbidden partial assignments over the group's axes; axes the group
// does not vary are fixed at their default, so a rule naming them fires or never does.
std::vector<CoverConstraint> exclude_constraints(const CaseGroup& g, const Params& base) {
  std::vector<CoverConstraint> constraints;
  for (const auto& rule : g.excludes) {
    bool can_fire = true;
    std::vector<std::vector<std::pair<int, int>>> choices;
    for (const auto& [axis, values] : rule) {
      const std::string& axis_name = axis;  // clang 14 cannot capture a binding
      const auto ax = std::find_if(g.axes.begin(), g.axes.end(),
                                   [&](const auto& a) { return a.first == axis_name; });
      if (ax == g.axes.end()) {
        can_fire =
            can_fire && std::find(values.begin(), values.end(), base.at(axis)) != values.end();
        continue;
      }
      std::vector<std::pair<int, int>> options;
      for (size_t vi = 0; vi < ax->second.size(); ++vi)
        if (std::find(values.begin(), values.end(), ax->second[vi]) != values.end())
          options.emplace_back(static_cast<int>(ax - g.axes.begin()), static_cast<int>(vi));
      if (options.empty()) can_fire = false;
      choices.push_back(options);
    }
    if (!can_fire) continue;
    // One forbidden assignment per combination of the rule's values: bounded before expanding.
    uint64_t combinations = 1;
    for (const auto& options : choices)
      if (__builtin_mul_overflow(combinations, static_cast<uint64_t>(options.size()),
                                 &combinations) ||
          combinations > kMaxExcludeCombinations)
        throw std::invalid_argument("an exclude rule lists more than " +
                                    std::to_string(kMaxExcludeCombinations) +
                                    " combinations of values (split it, or list fewer values)");
    std::vector<CoverConstraint> expanded = {{}};
    for (const auto& options : choices) {
      std::vector<CoverConstraint> next;
      for (const auto& c : expanded)
        for (const auto& o : options) {
          auto c2 = c;
          c2.push_back(o);
          next.push_back(std::move(c2));
        }
      expanded = std::move(next);
    }
    for (auto& c : expanded) constraints.push_back(std::move(c));
  }
  return constraints;
}

std::vector<Case> expand_group(const Op& op, const CaseFile& file, const CaseGroup& g,
                               std::string_view tier) {
  const auto it = g.tiers.find(std::string(tier));
  if (it == g.tiers.end()) return {};
  const std::string& how = it->second;
  const Params base = op.complete(file.defaults);

  std::vector<Params> rows;
  std::vector<std::string> sources;
  if (how == "list") {
    for (size_t i = 0; i < g.cases.size(); ++i) {
      rows.push_back(merged(file.defaults, g.cases[i]));
      sources.push_back(g.case_sources[i]);
    }
  } else {
    std::vector<int> counts;
    for (const auto& [name, values] : g.axes) counts.push_back(static_cast<int>(values.size()));
    const std::vector<CoverConstraint> constraints = exclude_constraints(g, base);
    // A rule over non-varied axes only that fires excludes everything.
    for (const auto& c : constraints)
      if (c.empty()) return {};
    const auto picked = how == "pairwise" ? pairwise_rows(counts, constraints)
                                          : cartesian_rows(counts, constraints);
    for (const auto& r : picked) {
      Params given = Params::object();
      for (size_t a = 0; a < g.axes.size(); ++a)
        given[g.axes[a].first] = g.axes[a].second[static_cast<size_t>(r[a])];
      rows.push_back(merged(file.defaults, given));
      sources.push_back(g.source);
    }
  }

  std::vector<Case> out;
  for (size_t i = 0; i < rows.size(); ++i) {
    Case c;
    try {
      c = op.make_case(rows[i]);  // bounds and size budget (CaseSizeError): before any row runs
    } catch (const CaseSizeError& e) {
      throw CaseSizeError(sources[i] + ": " + e.what());
    }
    if (how == "list" && std::any_of(g.excludes.begin(), g.excludes.end(), [&](const auto& rule) {
          return exclude_matches(rule, c.params);
        }))
      continue;
    if (const auto why = op.case_error(c.params))
      throw std::invalid_argument(sources[i] + ": " + c.id + ": " + *why);
    c.source = sources[i];
    out.push_back(std::move(c));
  }
  return out;
}

CaseLimits case_limits() {
  CaseLimits l;
  l.per_tier = env_limit("ATTNCHECK_MAX_CASES_PER_TIER", l.per_tier);
  l.per_file = env_limit("ATTNCHECK_MAX_CASES_PER_FILE", l.per_file);
  l.total = env_limit("ATTNCHECK_MAX_CASES", l.total);
  return l;
}

IdRegex::IdRegex(const std::string& pattern, const std::string& what) : pattern_(pattern) {
  re2::RE2::Options opt;
  opt.set_log_errors(false);
  auto re = std::make_shared<re2::RE2>(pattern, opt);
  if (!re->ok())
    throw std::invalid_argument(
        "bad " + what + " regex '" +
        (pattern.size() > 200 ? pattern.substr(0, 200) + "..." : pattern) + "': " + re->error() +
        " (RE2 syntax, matched in linear time: no backreferences or lookaround, repeat counts "
        "up to 1000)");
  re_ = std::move(re);
}

bool IdRegex::search(std::string_view text) const {
  return re2::RE2::PartialMatch(re2::StringPiece(text.data(), text.size()),
                                *static_cast<const re2::RE2*>(re_.get()));
}

namespace {

toml::table parse_toml(const std::string& path) {
  try {
    return toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << path << ":" << e.source().begin.line << ":" << e.source().begin.column
       << ": TOML syntax error: " << e.description();
    throw CaseFileError(os.str());
  } catch (const std::exception& e) {
    throw CaseFileError(path + ": cannot read: " + e.what());
  }
}

// The file's `op = "<name>"`, a registered op.
const Op& file_op(const std::string& path, const toml::table& root, std::string& name) {
  const toml::node* op_node = root.get("op");
  if (!op_node) throw CaseFileError(path + ":1:1: missing 'op = \"<op name>\"'");
  name = as_string(path, *op_node, "op");
  const Op* op = find_op(name);
  if (!op)
    fail(path, *op_node, "op: unknown op '" + name + "' (registered: " + registered_ops() + ")");
  return *op;
}

// `[defaults]`: axis values for every group of the file.
Params parse_defaults(const std::string& path, const toml::node& node, const Op& op) {
  Params defaults = Params::object();
  for (const auto& [k, v] : as_table(path, node, "[defaults]")) {
    const std::string axis(k.str());
    const nlohmann::json value = scalar(path, v, "[defaults] " + axis);
    check_value(path, op, axis, value, v, "[defaults] " + axis);
    defaults[axis] = value;
  }
  return defaults;
}

// One `[[known_bug]]`: { id = "<regex>", arch = "<regex>", reason = "..." }.
KnownBugRule parse_known_bug(const std::string& path, const toml::node& e) {
  const auto& t = as_table(path, e, "[[known_bug]]");
  allow_keys(path, t, "[[known_bug]]", {"id", "arch", "reason"});
  KnownBugRule r;
  r.source = line_of(path, e.source());
  const toml::node* id = t.get("id");
  const toml::node* reason = t.get("reason");
  if (!id || !reason) fail(path, e, "[[known_bug]]: needs 'id' (a regex) and 'reason'");
  r.id_regex = as_string(path, *id, "[[known_bug]] id");
  r.reason = as_string(path, *reason, "[[known_bug]] reason");
  if (const toml::node* a = t.get("arch")) r.arch = as_string(path, *a, "[[known_bug]] arch");
  for (const auto& [field, text] : {std::pair{"id", r.id_regex}, std::pair{"arch", r.arch}}) {
    try {
      (void)IdRegex(text, std::string("[[known_bug]] ") + field);
      // Arches are short words: a long arch pattern is a mistake, said as such.
      if (std::string(field) == "arch" && text.size() > kMaxArchRegexBytes)
        throw std::invalid_argument("[[known_bug]] arch regex longer than " +
                                    std::to_string(kMaxArchRegexBytes) + " bytes");
    } catch (const std::exception& ex) {
      fail(path, *t.get(field), ex.what());
    }
  }
  return r;
}

std::vector<KnownBugRule> parse_known_bugs(const std::string& path, const toml::node& node) {
  const auto* arr = node.as_array();
  if (!arr) fail(path, node, "known_bug: expected [[known_bug]] entries");
  std::vector<KnownBugRule> rules;
  for (const auto& e : *arr) rules.push_back(parse_known_bug(path, e));
  return rules;
}

// A group's `tiers = { <tier> = "cartesian" | "pairwise" | "list" }`.
void parse_group_tiers(const std::string& path, const toml::table& t, const toml::node& gnode,
                       CaseGroup& g) {
  const std::string gw = where_group(g);
  const toml::node* tiers = t.get("tiers");
  if (!tiers) fail(path, gnode, gw + ": missing 'tiers', e.g. tiers = { smoke = \"pairwise\" }");
  const auto& tt = as_table(path, *tiers, gw + " tiers");
  if (tt.empty()) fail(path, *tiers, gw + " tiers: empty (name at least one tier)");
  for (const auto& [tier, how_node] : tt) {
    const std::string tier_name(tier.str());
    if (!is_tier(tier_name))
      fail(path, how_node,
           gw + " tiers: unknown tier '" + tier_name + "' (tiers: " + tier_names() + ")");
    const std::string how = as_string(path, how_node, gw + " tiers." + tier_name);
    if (how != "cartesian" && how != "pairwise" && how != "list")
      fail(path, how_node,
           gw + " tiers." + tier_name + ": unknown expansion '" + how +
               "' (expansions: cartesian, pairwise, list)");
    g.tiers[tier_name] = how;
  }
}

// A group's `axes = { <axis> = [values] }`, each value valid and listed once; stored in the op's
// axis order, so rows and ids do not depend on how the file orders its keys.
void parse_group_axes(const std::string& path, const toml::node& node, const Op& op,
                      const std::string& op_name, CaseGroup& g) {
  const std::string gw = where_group(g);
  for (const auto& [k, v] : as_table(path, node, gw + " axes")) {
    const std::string axis(k.str());
    const std::string field = gw + " axis '" + axis + "'";
    if (!has_axis(op, axis))
      fail(path, v,
           field + ": unknown axis of op '" + op_name + "' (axes: " + axis_names_of(op) + ")");
    auto values = value_list(path, v, field, false);
    const auto* arr = v.as_array();
    std::set<nlohmann::json> listed;  // n log n: an axis of 100,000 values answers at once
    for (size_t i = 0; i < values.size(); ++i) {
      check_value(path, op, axis, values[i], *arr->get(i), field);
      if (!listed.insert(values[i]).second)
        fail(path, *arr->get(i), field + ": value " + json_text(values[i]) + " listed twice");
    }
    g.axes.emplace_back(axis, std::move(values));
  }
  std::vector<std::pair<std::string, std::vector<nlohmann::json>>> ordered;
  for (const auto& a : op.axes())
    for (auto& ax : g.axes)
      if (ax.first == a.name) ordered.push_back(std::move(ax));
  g.axes = std::move(ordered);
}

// A group's `cases = [ { <axis> = value, ... } ]`, for its `list` tiers.
void parse_group_cases(const std::string& path, const toml::node& node, const Op& op,
                       const std::string& op_name, CaseGroup& g) {
  const std::string gw = where_group(g);
  const auto* arr = node.as_array();
  if (!arr || arr->empty())
    fail(path, node, gw + " cases: expected a non-empty list of tables, e.g. [ { heads = 4 } ]");
  for (const auto& e : *arr) {
    const auto& ct = as_table(path, e, gw + " cases entry");
    Params p = Params::object();
    for (const auto& [k, v] : ct) {
      const std::string axis(k.str());
      if (!has_axis(op, axis))
        fail(path, v,
             gw + " case: unknown axis '" + axis + "' of op '" + op_name +
                 "' (axes: " + axis_names_of(op) + ")");
      p[axis] = scalar(path, v, gw + " case axis '" + axis + "'");
      check_value(path, op, axis, p[axis], v, gw + " case axis '" + axis + "'");
    }
    g.cases.push_back(std::move(p));
    g.case_sources.push_back(line_of(path, e.source()));
  }
}

// Why an exclude rule can never fire in the group (a typo or a stale line), or nothing.
std::optional<std::string> dead_rule(const std::map<std::string, std::vector<nlohmann::json>>& rule,
                                     const Op& op, const CaseFile& f, const CaseGroup& g,
                                     bool uses_axes) {
  const Params base = op.complete(f.defaults);
  bool live = false;
  std::string why_dead;
  if (g.has_axes && uses_axes) {
    live = true;
    for (const auto& [axis, values] : rule) {
      const std::string& axis_name = axis;  // clang 14 cannot capture a binding
      const auto ax = std::find_if(g.axes.begin(), g.axes.end(),
                                   [&](const auto& a) { return a.first == axis_name; });
      const auto& pool =
          ax != g.axes.end() ? ax->second : std::vector<nlohmann::json>{base.at(axis)};
      const bool any = std::any_of(values.begin(), values.end(), [&](const auto& v) {
        return std::find(pool.begin(), pool.end(), v) != pool.end();
      });
      if (!any) {
        live = false;
        why_dead = axis + " takes none of the listed values in this group";
        break;
      }
    }
  }
  for (const auto& c : g.cases) {
    if (live) break;
    live = exclude_matches(rule, op.complete(merged(f.defaults, c)));
  }
  if (live) return std::nullopt;
  return why_dead.empty() ? "" : " (" + why_dead + ")";
}

// A group's `exclude = [ { <axis> = value or [values] } ]`: each rule names axes of the op and
// matches some case of the group.
void parse_group_excludes(const std::string& path, const toml::node& node, const Op& op,
                          const CaseFile& f, bool uses_axes, CaseGroup& g) {
  const std::string gw = where_group(g);
  const auto* arr = node.as_array();
  if (!arr) fail(path, node, gw + " exclude: expected a list of tables");
  for (const auto& e : *arr) {
    const auto& et = as_table(path, e, gw + " exclude entry");
    if (et.empty()) fail(path, e, gw + " exclude: an empty rule would exclude every case");
    std::map<std::string, std::vector<nlohmann::json>> rule;
    for (const auto& [k, v] : et) {
      const std::string axis(k.str());
      if (!has_axis(op, axis))
        fail(path, v, gw + " exclude: unknown axis '" + axis + "' of op '" + f.op + "'");
      rule[axis] = value_list(path, v, gw + " exclude axis '" + axis + "'", true);
    }
    if (const auto dead = dead_rule(rule, op, f, g, uses_axes))
      fail(path, e, gw + " exclude: the rule matches no case of the group" + *dead);
    g.excludes.push_back(std::move(rule));
    g.exclude_sources.push_back(line_of(path, e.source()));
  }
}

CaseGroup parse_group(const std::string& path, const toml::node& gnode, const Op& op,
                      const CaseFile& f) {
  const auto& t = as_table(path, gnode, "[[group]]");
  CaseGroup g;
  g.source = line_of(path, gnode.source());
  allow_keys(path, t, "[[group]]", {"name", "tiers", "axes", "exclude", "cases", "note"});
  const toml::node* name = t.get("name");
  if (!name) fail(path, gnode, "[[group]]: missing 'name'");
  g.name = as_string(path, *name, "[[group]] name");
  const std::string gw = where_group(g);
  if (const toml::node* n = t.get("note")) g.note = as_string(path, *n, gw + " note");
  parse_group_tiers(path, t, gnode, g);
  const bool uses_list = std::any_of(g.tiers.begin(), g.tiers.end(),
                                     [](const auto& kv) { return kv.second == "list"; });
  const bool uses_axes = std::any_of(g.tiers.begin(), g.tiers.end(),
                                     [](const auto& kv) { return kv.second != "list"; });
  if (const toml::node* axes = t.get("axes")) {
    g.has_axes = true;
    parse_group_axes(path, *axes, op, f.op, g);
    if (!uses_axes)
      fail(path, *axes, gw + ": has 'axes' but every tier uses 'list' (the axes would be unused)");
  } else if (uses_axes) {
    fail(path, gnode,
         gw + ": a tier expands 'cartesian' or 'pairwise' but the group has no 'axes'");
  }
  if (const toml::node* cases = t.get("cases")) {
    parse_group_cases(path, *cases, op, f.op, g);
    if (!uses_list)
      fail(path, *cases, gw + ": has 'cases' but no tier uses 'list' (the cases would be unused)");
  } else if (uses_list) {
    fail(path, gnode, gw + ": a tier uses 'list' but the group has no 'cases'");
  }
  if (const toml::node* ex = t.get("exclude")) parse_group_excludes(path, *ex, op, f, uses_axes, g);
  return g;
}

std::vector<CaseGroup> parse_groups(const std::string& path, const toml::table& root, const Op& op,
                                    const CaseFile& f) {
  const toml::node* groups = root.get("group");
  if (!groups) throw CaseFileError(path + ":1:1: no [[group]]: the file defines no case");
  const auto* garr = groups->as_array();
  if (!garr) fail(path, *groups, "group: expected [[group]] entries");
  std::vector<CaseGroup> out;
  for (const auto& gnode : *garr) out.push_back(parse_group(path, gnode, op, f));
  return out;
}

uint64_t saturating_add(uint64_t x, uint64_t y) {
  return x > UINT64_MAX - y ? UINT64_MAX : x + y;
}

// The running case counts of one file's expansion, checked against CaseLimits as they grow.
struct ExpansionCount {
  CaseLimits limits = case_limits();
  std::map<std::string, uint64_t> per_tier;
  uint64_t in_file = 0;

  // Throws when `in_tier` cases in `tier` or `in_file` in the file are over the limits.
  void check(const CaseGroup& g, const std::string& tier, uint64_t in_tier,
             uint64_t in_file_now) const {
    const bool tier_over = in_tier > static_cast<uint64_t>(limits.per_tier);
    if (!tier_over && in_file_now <= static_cast<uint64_t>(limits.per_file)) return;
    std::ostringstream os;
    os << g.source << ": " << where_group(g) << " tier '" << tier
       << "': " << (tier_over ? "tier '" + tier + "' of this file" : std::string("this file"))
       << " would hold " << (tier_over ? in_tier : in_file_now) << " cases, over the limit of "
       << (tier_over ? limits.per_tier : limits.per_file) << " per "
       << (tier_over ? "tier" : "file") << " (narrow the axes, use pairwise, or raise "
       << (tier_over ? "$ATTNCHECK_MAX_CASES_PER_TIER" : "$ATTNCHECK_MAX_CASES_PER_FILE") << ")";
    throw CaseFileError(os.str());
  }

  // Before a tier of a group is built: what its rows can cost at most (cartesian) or at least
  // (pairwise) must fit.
  void check_before(const CaseGroup& g, const std::string& tier, const std::string& how) {
    if (how == "cartesian") {
      const uint64_t bound = row_bound(g, how);
      check(g, tier, saturating_add(per_tier[tier], bound), saturating_add(in_file, bound));
    } else if (how == "pairwise") {
      // Sized before it is built: more pairs than the tier's limit of rows could cover (each
      // row covers one pair of every two axes) is refused, and so are rows the two largest axes
      // need alone.
      const PairwiseCost cost = pairwise_cost(g);
      const auto room = static_cast<uint64_t>(limits.per_tier);
      if (cost.pairs > room * std::max<uint64_t>(cost.axis_pairs, 1))
        throw CaseFileError(g.source + ": " + where_group(g) + " tier '" + tier +
                            "' (pairwise): its axes hold " + std::to_string(cost.pairs) +
                            " value pairs to cover, more than " + std::to_string(room) +
                            " cases (the limit per tier) can cover; the two largest axes "
                            "alone need " +
                            std::to_string(cost.floor) +
                            " cases (narrow the axes, or raise $ATTNCHECK_MAX_CASES_PER_TIER)");
      check(g, tier, saturating_add(per_tier[tier], cost.floor),
            saturating_add(in_file, cost.floor));
    }
  }

  void add(const CaseGroup& g, const std::string& tier, size_t cases) {
    per_tier[tier] += cases;
    in_file += cases;
    check(g, tier, per_tier[tier], in_file);
  }
};

using SeenIds = std::map<std::string, std::map<std::string, std::string>>;  // tier -> id -> source

// Every tier of every group, expanded now: empty expansions and duplicate ids are file errors.
void expand_tiers(const Op& op, CaseFile& f, SeenIds& seen) {
  ExpansionCount count;
  for (const auto& g : f.groups) {
    for (const auto& [tier, how] : g.tiers) {
      count.check_before(g, tier, how);
      std::vector<Case> cs;
      try {
        cs = expand_group(op, f, g, tier);
      } catch (const std::exception& e) {
        throw CaseFileError(g.source + ": " + where_group(g) + " tier '" + tier + "': " + e.what());
      }
      if (cs.empty())
        throw CaseFileError(g.source + ": " + where_group(g) + " tier '" + tier + "' (" + how +
                            ") expands to no case: every combination is excluded");
      count.add(g, tier, cs.size());
      for (auto& c : cs) {
        auto [it, fresh] = seen[tier].emplace(c.id, c.source);
        if (!fresh)
          throw CaseFileError(c.source + ": duplicate case id '" + c.id + "' in tier '" + tier +
                              "', also produced at " + it->second +
                              " (drop one, or exclude it from one group)");
        f.tiers[tier].push_back(std::move(c));
      }
    }
  }
}

// The accuracy tiers nest, smoke within quick within full, so the PR gate (quick) and the
// nightly run (full) never skip a case the smoke tier checks. Inherited cases follow the tier's
// own, in file order.
void nest_tiers(CaseFile& f, SeenIds& seen) {
  for (const auto& [lower, upper] : {std::pair{"smoke", "quick"}, std::pair{"quick", "full"}}) {
    const auto it = f.tiers.find(lower);
    if (it == f.tiers.end()) continue;
    const std::vector<Case> inherited = it->second;
    for (const auto& c : inherited)
      if (seen[upper].emplace(c.id, c.source).second) f.tiers[upper].push_back(c);
  }
}

// The known-bug mark of the rules that match a case: several marks hold on any of their arches,
// each reason naming its arch.
KnownBug known_bug_of(const std::vector<const KnownBugRule*>& hits) {
  if (hits.size() == 1) return KnownBug{hits[0]->reason, hits[0]->arch};
  std::string reason, arch;
  bool any_arch = false;
  for (const auto* r : hits) {
    reason += (reason.empty() ? "" : "; ") + r->reason +
              (r->arch.empty() ? "" : " [arch " + r->arch + "]");
    any_arch = any_arch || r->arch.empty();
    arch += (arch.empty() ? "" : "|") + ("(?:" + r->arch + ")");
  }
  return KnownBug{reason, any_arch ? "" : arch};
}

// Each case's tier membership and known-bug mark; a [[known_bug]] that marks no case is an error.
void mark_cases(CaseFile& f, const SeenIds& seen) {
  std::vector<char> rule_used(f.known_bugs.size(), 0);
  std::vector<IdRegex> rule_ids;
  for (const auto& r : f.known_bugs) rule_ids.emplace_back(r.id_regex, "[[known_bug]] id");
  for (auto& [tier, cs] : f.tiers) {
    for (auto& c : cs) {
      for (std::string_view t : kTiers) {
        const auto in = seen.find(std::string(t));
        if (in != seen.end() && in->second.count(c.id)) c.tiers.emplace_back(t);
      }
      std::vector<const KnownBugRule*> hits;
      for (size_t i = 0; i < f.known_bugs.size(); ++i) {
        if (!rule_ids[i].search(c.id)) continue;
        rule_used[i] = 1;
        hits.push_back(&f.known_bugs[i]);
      }
      if (!hits.empty()) c.known_bug = known_bug_of(hits);
    }
  }
  for (size_t i = 0; i < f.known_bugs.size(); ++i)
    if (!rule_used[i])
      throw CaseFileError(f.known_bugs[i].source + ": [[known_bug]] id regex '" +
                          f.known_bugs[i].id_regex + "' matches no case of this file");
}

}  // namespace

CaseFile load_case_file(const std::string& path) {
  const toml::table root = parse_toml(path);
  CaseFile f;
  f.path = path;
  allow_keys(path, root, "case file", {"op", "defaults", "group", "known_bug", "coverage"});
  const Op& op = file_op(path, root, f.op);
  if (const toml::node* d = root.get("defaults")) f.defaults = parse_defaults(path, *d, op);
  if (const toml::node* kb = root.get("known_bug")) f.known_bugs = parse_known_bugs(path, *kb);
  if (const toml::node* cov = root.get("coverage"))
    f.coverage_accepts = parse_coverage(path, *cov, op);
  f.groups = parse_groups(path, root, op, f);
  SeenIds seen;
  expand_tiers(op, f, seen);
  nest_tiers(f, seen);
  mark_cases(f, seen);
  return f;
}

std::vector<CaseFile> load_case_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw CaseFileError(dir + ": case directory not found");
  std::vector<std::string> paths;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".toml") paths.push_back(e.path().string());
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) throw CaseFileError(dir + ": no *.toml case files");
  std::vector<CaseFile> files;
  std::map<std::string, std::map<std::string, std::string>> seen;  // tier -> id -> source
  const int64_t max_total = case_limits().total;
  int64_t total = 0;
  // Parsed and expanded at once, one thread per file (a run's start waits for the largest file,
  // not for all of them); checked in path order, so the first bad file is the one reported.
  std::vector<std::future<CaseFile>> loading;
  for (const auto& p : paths)
    loading.push_back(std::async(std::launch::async, [p] { return load_case_file(p); }));
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string& p = paths[i];
    files.push_back(loading[i].get());
    for (const auto& [tier, cs] : files.back().tiers) total += static_cast<int64_t>(cs.size());
    if (total > max_total)
      throw CaseFileError(p + ": the case files of " + dir + " up to this one hold " +
                          std::to_string(total) + " cases (all tiers), over the limit of " +
                          std::to_string(max_total) +
                          " for all files together (narrow the axes, or raise it with "
                          "--max-cases or $ATTNCHECK_MAX_CASES)");
    for (std::string_view t : kTiers) {  // smallest tier first: the one a duplicate starts in
      const std::string tier(t);
      const auto found = files.back().tiers.find(tier);
      if (found == files.back().tiers.end()) continue;
      for (const auto& c : found->second) {
        auto [it, fresh] = seen[tier].emplace(c.id, c.source);
        if (!fresh)
          throw CaseFileError(c.source + ": duplicate case id '" + c.id + "' in tier '" + tier +
                              "', also produced at " + it->second +
                              " (drop one, or exclude it from one group)");
      }
    }
  }
  return files;
}

Shard parse_shard(std::string_view text) {
  const auto slash = text.find('/');
  auto number = [&](std::string_view s, int& out) {
    if (s.empty() || s.size() > 6 ||
        !std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      return false;
    out = std::stoi(std::string(s));
    return true;
  };
  Shard sh;
  if (slash == std::string_view::npos || !number(text.substr(0, slash), sh.index) ||
      !number(text.substr(slash + 1), sh.count))
    throw std::invalid_argument("shard '" + std::string(text) + "': expected i/n, e.g. 0/4");
  if (sh.count < 1 || sh.index >= sh.count)
    throw std::invalid_argument("shard '" + std::string(text) +
                                "': need 0 <= i < n (shards are numbered from 0)");
  return sh;
}

std::vector<Case> select_cases(const std::vector<CaseFile>& files, const Selection& sel) {
  if (sel.tier != "all" && !is_tier(sel.tier))
    throw std::invalid_argument("unknown tier '" + sel.tier + "' (tiers: " + tier_names() +
                                ", all)");
  for (const auto& o : sel.ops)
    if (!find_op(o)) {
      throw std::invalid_argument("unknown op '" + o + "' (registered: " + registered_ops() + ")");
    }
  std::optional<IdRegex> re;
  if (!sel.filter.empty()) re.emplace(sel.filter, "--filter");
  std::vector<const Case*> all;  // the tier's full list, before --op and --filter
  std::set<std::string> ids;
  for (const auto& f : files) {
    std::vector<const Case*> list;
    if (sel.tier == "all") {
      for (std::string_view t : kTiers) {
        const auto it = f.tiers.find(std::string(t));
        if (it == f.tiers.end()) continue;
        for (const auto& c : it->second)
          if (ids.insert(c.id).second) list.push_back(&c);
      }
    } else if (const auto it = f.tiers.find(sel.tier); it != f.tiers.end()) {
      for (const auto& c : it->second) list.push_back(&c);
    }
    all.insert(all.end(), list.begin(), list.end());
  }
  std::vector<int> shard_of;
  if (sel.durations && sel.shard.count > 1) {
    std::vector<std::string> all_ids;
    for (const Case* c : all) all_ids.push_back(c->id);
    shard_of = balanced_shards(all_ids, sel.shard.count, *sel.durations);
  }
  std::vector<Case> out;
  for (size_t pos = 0; pos < all.size(); ++pos) {
    const Case* c = all[pos];
    const int shard = shard_of.empty()
                          ? static_cast<int>(pos % static_cast<size_t>(sel.shard.count))
                          : shard_of[pos];
    if (shard != sel.shard.index) continue;
    if (!sel.ops.empty() && std::find(sel.ops.begin(), sel.ops.end(), c->op) == sel.ops.end())
      continue;
    if (re && !re->search(c->id)) continue;
    out.push_back(*c);
  }
  return out;
}

std::string shown_id(std::string_view id) {
  constexpr size_t kShown = 200;
  if (id.size() <= kShown) return std::string(id);
  return std::string(id.substr(0, kShown)) + "... (" + std::to_string(id.size()) + " characters)";
}

std::optional<Case> find_case(const std::vector<CaseFile>& files, std::string_view id) {
  for (const auto& f : files)
    for (std::string_view t : kTiers) {
      const auto it = f.tiers.find(std::string(t));
      if (it == f.tiers.end()) continue;
      for (const auto& c : it->second)
        if (c.id == id) return c;
    }
  return std::nullopt;
}

}  // namespace attncheck
