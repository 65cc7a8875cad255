#include "op.h"

#include <algorithm>
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
      {"invalid", p.expect_refusal.empty() ? nlohmann::json() : nlohmann::json(p.expect_refusal)},
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
  if (!given.is_object()) throw std::invalid_argument(name() + ": case parameters must be a table");
  const auto ax = axes();
  for (const auto& item : given.items()) {
    const std::string& k = item.key();  // a plain name: clang 14 cannot capture a binding
    if (std::none_of(ax.begin(), ax.end(), [&](const Axis& a) { return a.name == k; })) {
      std::string known;
      for (const auto& a : ax) known += (known.empty() ? "" : ", ") + a.name;
      throw std::invalid_argument(name() + ": unknown axis '" + k + "' (known: " + known + ")");
    }
  }
  Params p = Params::object();
  for (const auto& a : ax) {
    nlohmann::json v = given.contains(a.name) ? given.at(a.name) : a.default_value;
    const bool num_ok = v.is_number() && a.default_value.is_number();
    if (v.type() != a.default_value.type() && !num_ok)
      throw std::invalid_argument(name() + ": axis '" + a.name + "' expects a " +
                                  a.default_value.type_name() + ", got " + v.dump());
    if (a.default_value.is_number_integer() && !v.is_number_integer())
      throw std::invalid_argument(name() + ": axis '" + a.name + "' expects an integer, got " +
                                  v.dump());
    if (!a.allowed.empty() && std::find(a.allowed.begin(), a.allowed.end(), v) == a.allowed.end()) {
      std::string ok;
      for (const auto& x : a.allowed) ok += (ok.empty() ? "" : ", ") + x.dump();
      throw std::invalid_argument(name() + ": axis '" + a.name + "' value " + v.dump() +
                                  " is not one of " + ok);
    }
    p[a.name] = v;
  }
  return p;
}

Case Op::make_case(const Params& given, std::vector<std::string> tiers) const {
  Case c;
  c.op = name();
  c.params = complete(given);
  c.id = name() + "/" + vars(c.params);
  c.tiers = std::move(tiers);
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

}  // namespace attncheck
