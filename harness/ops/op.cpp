#include "op.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <sstream>

#include "core/dtype.h"

namespace attncheck {

namespace {
std::vector<std::unique_ptr<Op>>& registry() {
  static std::vector<std::unique_ptr<Op>> ops;
  return ops;
}
std::string value_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "1" : "0";
  return v.dump();
}
}  // namespace

void register_op(std::unique_ptr<Op> op) {
  if (find_op(op->name())) throw std::logic_error("op registered twice: " + op->name());
  registry().push_back(std::move(op));
}

const Op* find_op(std::string_view name) {
  for (const auto& op : registry())
    if (op->name() == name) return op.get();
  return nullptr;
}

std::vector<const Op*> all_ops() {
  std::vector<const Op*> v;
  for (const auto& op : registry()) v.push_back(op.get());
  std::sort(v.begin(), v.end(), [](const Op* a, const Op* b) { return a->name() < b->name(); });
  return v;
}

namespace {
const char* field_type_name(FieldType t) {
  switch (t) {
    case FieldType::integer:
      return "integer";
    case FieldType::real:
      return "real";
    case FieldType::boolean:
      return "boolean";
    case FieldType::text:
      return "text";
    case FieldType::dtype:
      return "dtype";
    case FieldType::choice:
      return "choice";
  }
  return "integer";
}
}  // namespace

nlohmann::json Op::field_list() const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& a : axes())
    out.push_back({{"name", a.name},
                   {"type", field_type_name(a.type)},
                   {"default", a.default_value},
                   {"allowed", a.allowed},
                   {"min", a.min},
                   {"max", a.max}});
  return out;
}

Problem Op::problem(const Case& c) const {
  Problem p = make(c);
  p.case_context = {
      {"op", name()},
      {"id", c.id},
      {"params", c.params},
      {"invalid", p.expect_refusal ? nlohmann::json(*p.expect_refusal) : nlohmann::json()},
      {"fields", field_list()}};
  if (p.kernel.empty()) p.kernel = name();
  const auto entries = kernel_entries();
  if (std::find(entries.begin(), entries.end(), p.kernel) == entries.end())
    throw std::logic_error(name() + ": make() chose kernel entry '" + p.kernel +
                           "', which kernel_entries() does not declare");
  return p;
}

std::string Op::vars(const Params& p) const {
  std::ostringstream os;
  bool first = true;
  for (const auto& ax : axes()) {
    if (!ax.in_id_at_default && p.at(ax.name) == ax.default_value) continue;
    os << (first ? "" : "-") << ax.prefix << value_text(p.at(ax.name));
    first = false;
  }
  return os.str();
}

Params Op::complete(const Params& given) const {
  if (const auto problem = value_problem(given); problem && !problem->out_of_bounds)
    throw std::invalid_argument(name() + ": " + problem->what);
  Params p = Params::object();
  for (const auto& a : axes())
    p[a.name] = given.contains(a.name) ? given.at(a.name) : a.default_value;
  return p;
}

Case Op::make_case(const Params& given, std::vector<std::string> tiers) const {
  Case c;
  c.op = name();
  c.params = complete(given);
  c.id = name() + "/" + vars(c.params);
  c.tiers = std::move(tiers);
  if (const auto why = size_error(c.params, size_limits())) throw CaseSizeError(c.id + ": " + *why);
  return c;
}

bool logits_past_context(const Problem& p, const Index& idx) {
  const Tensor& lens = p.arg("context_lens");
  const int64_t requests = lens.size(0), rows = p.arg("logits").size(0);
  if (requests <= 0 || idx.size() != 2) return false;
  const int64_t next_n = std::max<int64_t>(rows / requests, 1);
  const int64_t request = std::min(idx[0] / next_n, requests - 1);
  return idx[1] >= lens.at<int32_t>({request});
}

std::vector<OutputRegion> logits_past_context_region() {
  return {{"logits", kPastContext,
           "the columns at or past each request's context length (context_lens), which a top-k "
           "over the context never reads"}};
}

namespace {

double env_size_limit(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v, &end, 10);
  if (*end || n <= 0 || errno == ERANGE)
    throw std::invalid_argument(std::string("$") + name + "='" + v +
                                "': expected a positive integer");
  return static_cast<double>(n);
}

// 12.3 GB, 4294 MB, 65536 bytes: bytes as people read them.
std::string bytes_text(double b) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1);
  if (b >= 1e9)
    os << b / 1e9 << " GB";
  else if (b >= 1e6)
    os << b / 1e6 << " MB";
  else
    os << static_cast<int64_t>(b) << " bytes";
  return os.str();
}

// Whole numbers in full (bounds, limits: 131072, not 1.31e+05); others with six digits.
std::string number_text(double v) {
  std::ostringstream os;
  if (std::fabs(v) < 1e18 && v == std::floor(v))
    os << static_cast<int64_t>(v);
  else
    os << std::setprecision(6) << v;
  return os.str();
}

}  // namespace

std::optional<std::string> count_error(const CaseSize& size) {
  for (const auto& c : size.counts)
    if (c.value < c.min)
      return "axis '" + c.axis + "' = " + std::to_string(c.value) + " counts nothing: it must be " +
             "at least " + std::to_string(c.min);
  return std::nullopt;
}

SizeLimits size_limits() {
  SizeLimits l;
  l.bytes = env_size_limit("ATTNCHECK_MAX_CASE_BYTES", l.bytes);
  l.work = env_size_limit("ATTNCHECK_MAX_CASE_WORK", l.work);
  return l;
}

std::optional<ValueProblem> axis_value_problem(const std::string& op, const Axis& a,
                                               const nlohmann::json& v) {
  const bool num_ok = v.is_number() && a.default_value.is_number();
  if (v.type() != a.default_value.type() && !num_ok)
    return ValueProblem{"axis '" + a.name + "' expects a " + a.default_value.type_name() +
                        ", got " + v.dump()};
  if (a.default_value.is_number_integer() && !v.is_number_integer())
    return ValueProblem{"axis '" + a.name + "' expects an integer, got " + v.dump()};
  if (a.type == FieldType::dtype && !parse_dtype(v.get<std::string>()))
    return ValueProblem{"axis '" + a.name + "' value " + v.dump() + " is no dtype name"};
  if (!a.allowed.empty() && std::find(a.allowed.begin(), a.allowed.end(), v) == a.allowed.end()) {
    std::string ok;
    for (const auto& x : a.allowed) ok += (ok.empty() ? "" : ", ") + x.dump();
    return ValueProblem{"axis '" + a.name + "' value " + v.dump() + " is not one of " + ok};
  }
  if (v.is_number() && !(v.get<double>() >= a.min && v.get<double>() <= a.max))
    return ValueProblem{"axis '" + a.name + "' = " + v.dump() + " is outside op '" + op +
                            "''s bounds [" + number_text(a.min) + ", " + number_text(a.max) + "]",
                        true};
  return std::nullopt;
}

std::optional<std::string> Op::size_error(const Params& params, const SizeLimits& limits) const {
  if (const auto problem = value_problem(params)) return problem->what;
  const auto ax = axes();
  const CaseSize s = size(params);
  const bool bytes_over = !(s.bytes() <= limits.bytes);
  const bool work_over = !(s.work <= limits.work);
  if (!bytes_over && !work_over) return std::nullopt;
  const auto measure = [&](const CaseSize& x) { return bytes_over ? x.bytes() : x.work; };
  // The axis that weighs most: the numeric axis whose return to its default (or to 1) cuts the
  // size most.
  std::string heaviest;
  double least = measure(s);
  for (const auto& a : ax) {
    const auto& v = params.at(a.name);
    if (!v.is_number_integer()) continue;
    for (const nlohmann::json& smaller : {a.default_value, nlohmann::json(1)}) {
      if (!smaller.is_number_integer() || smaller.get<int64_t>() >= v.get<int64_t>()) continue;
      Params p = params;
      p[a.name] = smaller;
      double m = 0;
      try {
        m = measure(size(p));
      } catch (const std::exception&) {
        continue;
      }
      if (m < least) {
        least = m;
        heaviest = "axis '" + a.name + "' = " + v.dump();
      }
    }
  }
  std::string why = bytes_over
                        ? bytes_text(s.bytes()) +
                              " of inputs, outputs and workspace, over "
                              "the limit of " +
                              bytes_text(limits.bytes) + " per case ($ATTNCHECK_MAX_CASE_BYTES)"
                        : number_text(s.work) + " units of work, over the limit of " +
                              number_text(limits.work) + " per case ($ATTNCHECK_MAX_CASE_WORK)";
  return "too large: " + (heaviest.empty() ? "" : heaviest + " makes ") + why +
         " (narrow the axes, or raise the limit)";
}

}  // namespace attncheck
