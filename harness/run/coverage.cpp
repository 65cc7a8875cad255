#include "run/coverage.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <iomanip>
#include <map>
#include <ostream>
#include <set>
#include <sstream>
#include <unordered_map>

namespace attncheck {

namespace {

constexpr int64_t kElementLimit = int64_t{1} << 31;  // 32-bit signed element index
constexpr int64_t kByteLimit = int64_t{1} << 32;     // 32-bit unsigned byte offset

// The attributes of one case that its kernel sees, in a stable order: the kernel entry, the kernel
// scalars, then each tensor argument's dtype, extents, strides, storage offset and reach.
std::vector<std::pair<std::string, nlohmann::json>> kernel_attributes(const Problem& prob) {
  std::vector<std::pair<std::string, nlohmann::json>> out;
  out.emplace_back("kernel", prob.kernel);
  for (const auto& [key, value] : prob.kernel_params.items())
    out.emplace_back("params." + key, value);
  for (const auto& arg : prob.args) {
    const Tensor& t = arg.tensor;
    const std::string& n = arg.name;
    // fp8 travels as uint8 (docs/abi.md): the format is the fp8_format scalar, not the dtype.
    out.emplace_back(n + ".dtype", is_fp8(t.dtype()) ? std::string("u8 (fp8)")
                                                     : std::string(dtype_name(t.dtype())));
    for (int64_t d = 0; d < t.ndim(); ++d)
      out.emplace_back(n + ".shape[" + std::to_string(d) + "]", t.size(d));
    for (int64_t d = 0; d < t.ndim(); ++d)
      out.emplace_back(n + ".stride[" + std::to_string(d) + "]", t.stride(d));
    out.emplace_back(n + ".offset", t.offset());
    out.emplace_back(n + ".contiguous", t.is_contiguous());
    // From shapes and strides only: a sparse storage's extent is never touched.
    const auto [lo, hi] = t.extent();
    (void)lo;
    const int64_t last = t.numel() > 0 ? hi - 1 : t.offset();
    out.emplace_back(n + ".last_element", last);
    out.emplace_back(n + ".last_byte",
                     (last + 1) * static_cast<int64_t>(t.element_size()) - (t.numel() > 0 ? 1 : 0));
  }
  return out;
}

bool ends_with(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
bool is_reach(const std::string& name) {
  return ends_with(name, ".last_element") || ends_with(name, ".last_byte");
}

std::string text(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

std::string number_text(double v) {
  std::ostringstream os;
  const double a = std::fabs(v);
  if (a >= 1 << 20 && v == std::floor(v)) {
    const double l = std::log2(a);
    if (l == std::floor(l)) {
      os << (v < 0 ? "-" : "") << "2^" << static_cast<int>(l);
      return os.str();
    }
    os << std::setprecision(4) << v << " (2^" << std::setprecision(3) << l << ")";
    return os.str();
  }
  os << std::setprecision(6) << v;
  return os.str();
}

std::string value_text(const nlohmann::json& v) {
  return v.is_number() ? number_text(v.get<double>()) : text(v);
}

// The observations of one op: per attribute, each audited case's value id (0: absent).
struct Table {
  std::vector<std::string> names;
  std::vector<std::string> kinds;
  std::map<std::string, size_t> index;
  std::vector<std::vector<nlohmann::json>> values;  // per attribute: id - 1 -> value
  std::vector<std::unordered_map<std::string, int>> ids;
  std::vector<std::vector<int>> column;  // per attribute: per case
  size_t cases = 0;

  size_t attribute(const std::string& name, const std::string& kind) {
    const auto [it, fresh] = index.emplace(name, names.size());
    if (fresh) {
      names.push_back(name);
      kinds.push_back(kind);
      values.emplace_back();
      ids.emplace_back();
      column.emplace_back(cases, 0);
    }
    return it->second;
  }
  void add_case() {
    ++cases;
    for (auto& c : column) c.push_back(0);
  }
  void set(const std::string& name, const std::string& kind, const nlohmann::json& v) {
    const size_t a = attribute(name, kind);
    const auto [it, fresh] = ids[a].emplace(v.dump(), static_cast<int>(values[a].size()) + 1);
    if (fresh) values[a].push_back(v);
    column[a][cases - 1] = it->second;
  }
};

// How a scalar depends on a set of other attributes over the cases holding it.
struct Dependency {
  bool functional = false;  // never two values of the scalar within one group
  size_t groups = 0;
  size_t largest_group = 0;
};

template <class Key>
Dependency dependency(const std::vector<int>& target, const std::vector<size_t>& rows,
                      const std::function<Key(size_t)>& key_of) {
  std::map<Key, std::pair<int, size_t>> seen;  // key -> (target value, cases)
  Dependency d;
  d.functional = true;
  for (size_t r : rows) {
    auto [it, fresh] = seen.emplace(key_of(r), std::pair{target[r], size_t{0}});
    if (!fresh && it->second.first != target[r]) {
      d.functional = false;
      return d;
    }
    d.largest_group = std::max(d.largest_group, ++it->second.second);
  }
  d.groups = seen.size();
  return d;
}

// The mapping determinant value -> scalar value, for a single determinant (shown in the detail).
std::string mapping_text(const Table& t, size_t det, size_t target,
                         const std::vector<size_t>& rows) {
  std::map<int, int> m;
  for (size_t r : rows) m.emplace(t.column[det][r], t.column[target][r]);
  std::string s;
  size_t shown = 0;
  for (const auto& [k, v] : m) {
    if (shown++ == 4) {
      s += ", ...";
      break;
    }
    s += (s.empty() ? "" : ", ") +
         (k ? value_text(t.values[det][static_cast<size_t>(k - 1)]) : "absent") + " -> " +
         value_text(t.values[target][static_cast<size_t>(v - 1)]);
  }
  return s;
}

// The derived flag of scalar `s`, or nothing: equal to another argument in every case, else a
// functional dependency on one other argument, else on a pair of them, else on all the others
// together; each dependency with two or more cases per group on average (so that a determinant
// that happens to tell every case apart does not count).
std::optional<std::string> derived_detail(const Table& t, size_t s) {
  std::vector<size_t> rows;
  for (size_t r = 0; r < t.cases; ++r)
    if (t.column[s][r] != 0) rows.push_back(r);
  std::set<int> own(t.column[s].begin(), t.column[s].end());
  own.erase(0);
  if (own.size() < 2) return std::nullopt;  // never-varied already says it
  std::vector<size_t> candidates;
  for (size_t a = 0; a < t.names.size(); ++a) {
    if (a == s || t.kinds[a] == "axis" || is_reach(t.names[a])) continue;
    std::set<int> vals;
    for (size_t r : rows) vals.insert(t.column[a][r]);
    if (vals.size() >= 2) candidates.push_back(a);
  }
  const auto& target = t.column[s];
  std::ostringstream os;
  // Evidence that a value follows its determinant, not a coincidence of few cases: the cases
  // average two or more per group (a determinant that tells every case apart proves nothing).
  const auto supported = [&](const Dependency& d) {
    return d.functional && d.largest_group >= 2 && 2 * d.groups <= rows.size();
  };
  // The plainest explanation first: an argument it always equals.
  for (size_t a : candidates) {
    bool equal = true;
    for (size_t r : rows)
      if (t.column[a][r] == 0 || t.values[a][static_cast<size_t>(t.column[a][r] - 1)] !=
                                     t.values[s][static_cast<size_t>(target[r] - 1)]) {
        equal = false;
        break;
      }
    if (equal)
      return "equal to " + t.names[a] + " in all " + std::to_string(rows.size()) + " cases";
  }
  // Singles: the strongest evidence (fewest groups) first.
  std::vector<std::pair<size_t, size_t>> singles;  // (groups, attribute)
  for (size_t a : candidates) {
    const auto d = dependency<int>(target, rows, [&](size_t r) { return t.column[a][r]; });
    if (supported(d)) singles.emplace_back(d.groups, a);
  }
  if (!singles.empty()) {
    std::sort(singles.begin(), singles.end());
    os << "a function of " << t.names[singles[0].second] << " in all " << rows.size() << " cases ("
       << mapping_text(t, singles[0].second, s, rows) << ")";
    if (singles.size() > 1) {
      os << "; also of";
      for (size_t i = 1; i < singles.size() && i < 4; ++i) os << " " << t.names[singles[i].second];
      if (singles.size() > 4) os << " and " << singles.size() - 4 << " more";
    }
    return os.str();
  }
  std::vector<std::tuple<size_t, size_t, size_t>> pairs;  // (groups, a, b)
  for (size_t i = 0; i < candidates.size(); ++i)
    for (size_t j = i + 1; j < candidates.size(); ++j) {
      const size_t a = candidates[i], b = candidates[j];
      const auto d = dependency<int64_t>(target, rows, [&](size_t r) {
        return int64_t{t.column[a][r]} << 32 | static_cast<uint32_t>(t.column[b][r]);
      });
      if (supported(d)) pairs.emplace_back(d.groups, a, b);
    }
  if (!pairs.empty()) {
    std::sort(pairs.begin(), pairs.end());
    const auto [g, a, b] = pairs[0];
    os << "a function of (" << t.names[a] << ", " << t.names[b] << ") in all " << rows.size()
       << " cases (" << g << " combinations)";
    if (pairs.size() > 1) os << "; " << pairs.size() - 1 << " other pairs determine it too";
    return os.str();
  }
  const auto d = dependency<std::vector<int>>(target, rows, [&](size_t r) {
    std::vector<int> key;
    for (size_t a : candidates) key.push_back(t.column[a][r]);
    return key;
  });
  if (supported(d)) {
    os << "a function of the other arguments together: no two of the " << rows.size()
       << " cases that share every other argument (" << d.groups << " combinations, up to "
       << d.largest_group << " cases each) differ in it";
    return os.str();
  }
  return std::nullopt;
}

// Smallest and largest value an axis documents: its allowed numeric values.
std::optional<std::pair<double, double>> axis_extremes(const Axis& a) {
  if (a.allowed.empty()) {
    if (a.min == -Axis::kDefaultBound && a.max == Axis::kDefaultBound) return std::nullopt;
    return std::pair{a.min, a.max};
  }
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& v : a.allowed) {
    if (!v.is_number() || v.is_boolean()) return std::nullopt;
    lo = std::min(lo, v.get<double>());
    hi = std::max(hi, v.get<double>());
  }
  return std::pair{lo, hi};
}

CoverageArgument describe(const Table& t, size_t a) {
  CoverageArgument arg;
  arg.name = t.names[a];
  arg.kind = t.kinds[a];
  std::set<int> seen;
  for (int id : t.column[a])
    if (id) {
      ++arg.present;
      seen.insert(id);
    }
  arg.distinct = static_cast<int64_t>(seen.size());
  std::vector<nlohmann::json> vals;
  for (int id : seen) vals.push_back(t.values[a][static_cast<size_t>(id - 1)]);
  std::sort(vals.begin(), vals.end());
  for (const auto& v : vals)
    if (v.is_number()) {
      const double x = v.get<double>();
      arg.min = std::min(arg.min.value_or(x), x);
      arg.max = std::max(arg.max.value_or(x), x);
    }
  if (vals.size() > CoverageArgument::kShownValues) vals.resize(CoverageArgument::kShownValues);
  arg.values = std::move(vals);
  return arg;
}

void flag_argument(const Table& t, size_t a, const Op& op, CoverageArgument& arg) {
  const size_t n = t.cases;
  const std::string where = arg.present == static_cast<int64_t>(n)
                                ? "in all " + std::to_string(n) + " cases"
                                : "in the " + std::to_string(arg.present) + " of " +
                                      std::to_string(n) + " cases that hold it";
  if (arg.kind == "axis") {
    const auto axes = op.axes();
    const auto ax = std::find_if(axes.begin(), axes.end(),
                                 [&](const Axis& x) { return "axis." + x.name == arg.name; });
    const auto ext = ax == axes.end() ? std::nullopt : axis_extremes(*ax);
    if (!ext || !arg.min) return;
    std::string missing;
    if (*arg.min > ext->first)
      missing += "smallest allowed " + number_text(ext->first) +
                 " never audited (tier's smallest " + number_text(*arg.min) + ")";
    if (*arg.max < ext->second)
      missing += std::string(missing.empty() ? "" : "; ") + "largest allowed " +
                 number_text(ext->second) + " never audited (tier's largest " +
                 number_text(*arg.max) + ")";
    if (!missing.empty()) arg.flags.push_back({"never-extreme", missing, "", ""});
    return;
  }
  if (arg.kind == "entry") return;
  if (is_reach(arg.name)) {
    const bool bytes = ends_with(arg.name, ".last_byte");
    const int64_t limit = bytes ? kByteLimit : kElementLimit;
    if (arg.max && *arg.max < static_cast<double>(limit))
      arg.flags.push_back(
          {"never-extreme",
           std::string("largest ") + (bytes ? "byte" : "element") + " offset " +
               number_text(*arg.max) + " < " + number_text(static_cast<double>(limit)) +
               ": 32-bit " + (bytes ? "byte" : "element") + " offset arithmetic is never exercised",
           "", ""});
    return;
  }
  if (arg.distinct == 1) {
    arg.flags.push_back(
        {"never-varied", "always " + value_text(arg.values[0]) + " " + where, "", ""});
    return;
  }
  if (arg.kind == "scalar")
    if (const auto why = derived_detail(t, a)) arg.flags.push_back({"derived", *why, "", ""});
}

void judge(OpCoverage& oc, const std::vector<CoverageAcceptance>& accepts,
           const std::string& tier) {
  std::map<std::string, CoverageArgument*> by_name;
  for (auto& a : oc.arguments) by_name[a.name] = &a;
  for (const auto& acc : accepts)
    for (const auto& name : acc.arguments) {
      const auto it = by_name.find(name);
      if (it == by_name.end()) {
        oc.errors.push_back(acc.source + ": [[coverage.accept]] names '" + name +
                            "', which no kernel of op '" + oc.op + "' receives in tier '" + tier +
                            "' (`attncheck coverage --op " + oc.op + "` lists the arguments)");
        continue;
      }
      bool matched = false;
      for (auto& f : it->second->flags)
        if (f.flag == acc.flag) {
          f.reason = acc.reason;
          f.accepted_at = acc.source;
          matched = true;
        }
      if (!matched)
        oc.stale.push_back(acc.source + ": '" + name + "' is accepted as " + acc.flag +
                           ", but tier '" + tier + "' raises no such flag on it: remove the " +
                           "acceptance (or its argument)");
    }
}

}  // namespace

OpCoverage audit_op(const Op& op, const std::vector<Case>& cases,
                    const std::vector<CoverageAcceptance>& accepts, const std::string& tier) {
  OpCoverage oc;
  oc.op = op.name();
  Table t;
  for (const auto& a : op.axes()) t.attribute("axis." + a.name, "axis");
  for (const auto& c : cases) {
    Problem prob;
    try {
      prob = op.problem(c);
    } catch (const std::exception& e) {
      oc.errors.push_back(c.source + ": " + c.id + ": cannot build the problem: " + e.what());
      continue;
    }
    if (prob.expect_refusal) {
      ++oc.refused;
      continue;
    }
    t.add_case();
    for (const auto& [k, v] : c.params.items()) t.set("axis." + k, "axis", v);
    for (const auto& [name, value] : kernel_attributes(prob)) {
      const std::string kind = name == "kernel"                ? "entry"
                               : name.rfind("params.", 0) == 0 ? "scalar"
                                                               : "tensor";
      t.set(name, kind, value);
    }
  }
  oc.cases = static_cast<int64_t>(t.cases);
  for (size_t a = 0; a < t.names.size(); ++a) {
    CoverageArgument arg = describe(t, a);
    if (arg.present == 0) continue;
    flag_argument(t, a, op, arg);
    oc.arguments.push_back(std::move(arg));
  }
  judge(oc, accepts, tier);
  return oc;
}

int64_t CoverageReport::flags() const {
  int64_t n = 0;
  for (const auto& o : ops)
    for (const auto& a : o.arguments) n += static_cast<int64_t>(a.flags.size());
  return n;
}
int64_t CoverageReport::unaccepted() const {
  int64_t n = 0;
  for (const auto& o : ops)
    for (const auto& a : o.arguments)
      for (const auto& f : a.flags) n += f.accepted() ? 0 : 1;
  return n;
}
int64_t CoverageReport::stale() const {
  int64_t n = 0;
  for (const auto& o : ops) n += static_cast<int64_t>(o.stale.size());
  return n;
}
int64_t CoverageReport::errors() const {
  int64_t n = 0;
  for (const auto& o : ops) n += static_cast<int64_t>(o.errors.size());
  return n;
}

CoverageReport audit_coverage(const std::vector<CaseFile>& files, const CoverageOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (!is_tier(options.tier))
    throw std::invalid_argument("unknown tier '" + options.tier + "' (tiers: " + tier_names() +
                                ")");
  for (const auto& o : options.ops)
    if (!find_op(o)) throw std::invalid_argument("unknown op '" + o + "'");
  CoverageReport report;
  report.tier = options.tier;
  for (const auto& f : files) {
    if (!options.ops.empty() &&
        std::find(options.ops.begin(), options.ops.end(), f.op) == options.ops.end())
      continue;
    const auto it = f.tiers.find(options.tier);
    if (it == f.tiers.end()) continue;
    OpCoverage oc = audit_op(*find_op(f.op), it->second, f.coverage_accepts, options.tier);
    oc.case_file = f.path;
    report.ops.push_back(std::move(oc));
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

nlohmann::json coverage_json(const CoverageReport& report) {
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& o : report.ops) {
    nlohmann::json args = nlohmann::json::array();
    for (const auto& a : o.arguments) {
      nlohmann::json flags = nlohmann::json::array();
      for (const auto& f : a.flags)
        flags.push_back({{"flag", f.flag},
                         {"detail", f.detail},
                         {"accepted", f.accepted()},
                         {"reason", f.reason},
                         {"accepted_at", f.accepted_at}});
      args.push_back({{"name", a.name},
                      {"kind", a.kind},
                      {"present", a.present},
                      {"distinct", a.distinct},
                      {"values", a.values},
                      {"min", a.min ? nlohmann::json(*a.min) : nlohmann::json()},
                      {"max", a.max ? nlohmann::json(*a.max) : nlohmann::json()},
                      {"flags", flags}});
    }
    ops.push_back({{"op", o.op},
                   {"case_file", o.case_file},
                   {"cases", o.cases},
                   {"refused", o.refused},
                   {"arguments", args},
                   {"stale", o.stale},
                   {"errors", o.errors}});
  }
  return {{"tier", report.tier},
          {"flags", report.flags()},
          {"unaccepted", report.unaccepted()},
          {"stale", report.stale()},
          {"errors", report.errors()},
          {"seconds", report.seconds},
          {"ops", ops}};
}

namespace {
std::string values_text(const CoverageArgument& a) {
  if (a.distinct > static_cast<int64_t>(a.values.size()) && a.min && a.max)
    return number_text(*a.min) + " .. " + number_text(*a.max) + " (" + std::to_string(a.distinct) +
           " values)";
  std::string s;
  for (const auto& v : a.values) s += (s.empty() ? "" : " ") + value_text(v);
  if (a.distinct > static_cast<int64_t>(a.values.size()))
    s += " ... (" + std::to_string(a.distinct) + " values)";
  return s;
}
}  // namespace

void print_coverage(const CoverageReport& report, std::ostream& os) {
  for (const auto& o : report.ops) {
    os << "== " << o.op << ": " << o.cases << " cases audited";
    if (o.refused) os << ", " << o.refused << " refused configurations not audited";
    os << " (" << o.case_file << ")\n";
    for (const auto& a : o.arguments) {
      os << "  " << std::left << std::setw(34) << a.name << std::right << " " << values_text(a);
      if (a.present < o.cases) os << "  [in " << a.present << " cases]";
      os << "\n";
      for (const auto& f : a.flags)
        os << "      " << (f.accepted() ? "accepted " : "FLAG     ") << f.flag << ": " << f.detail
           << (f.accepted() ? "\n        reason (" + f.accepted_at + "): " + f.reason : "") << "\n";
    }
    for (const auto& s : o.stale) os << "  STALE " << s << "\n";
    for (const auto& e : o.errors) os << "  ERROR " << e << "\n";
  }
  os << "\ncoverage, tier " << report.tier << ": " << report.ops.size() << " ops, "
     << report.flags() << " flags, " << report.unaccepted() << " not accepted, " << report.stale()
     << " stale acceptances, " << report.errors() << " errors (" << std::fixed
     << std::setprecision(1) << report.seconds << " s)\n"
     << std::defaultfloat;
  if (report.unaccepted()) {
    os << "flags not accepted (accept each in cases/<op>.toml with a written reason, "
          "docs/coverage.md):\n";
    for (const auto& o : report.ops)
      for (const auto& a : o.arguments)
        for (const auto& f : a.flags)
          if (!f.accepted())
            os << "  " << o.op << " " << a.name << " " << f.flag << ": " << f.detail << "\n";
  }
}

}  // namespace attncheck
