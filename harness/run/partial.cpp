#include "run/partial.h"

#include <algorithm>
#include <mutex>

#include "core/compare.h"

namespace attncheck {

namespace {

std::string join_names(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "none" : s;
}

std::vector<std::string> regions_of(const Op& op, const std::string& output) {
  std::vector<std::string> out;
  for (const auto& r : op.output_regions())
    if (r.output == output) out.push_back(r.region);
  return out;
}

// The names of a JSON array of strings; throws naming `what` otherwise.
std::vector<std::string> name_list(const nlohmann::json& j, const std::string& what) {
  if (!j.is_array()) throw std::invalid_argument(what + " must be a list of output names");
  std::vector<std::string> out;
  for (const auto& n : j) {
    if (!n.is_string() || n.get<std::string>().empty())
      throw std::invalid_argument(what + " holds " + n.dump() + ", not an output name");
    if (std::find(out.begin(), out.end(), n.get<std::string>()) == out.end())
      out.push_back(n.get<std::string>());
  }
  return out;
}

// The declaration's form (not yet its names): throws std::invalid_argument saying what is wrong.
PartialContract read_form(const std::string& json) {
  const auto j = nlohmann::json::parse(json);  // nlohmann's parse_error names the position
  if (!j.is_object()) throw std::invalid_argument("not a JSON object");
  PartialContract c;
  for (const auto& [key, value] : j.items()) {
    if (key == "not_produced") {
      c.not_produced = name_list(value, "not_produced");
    } else if (key == "unspecified") {
      if (!value.is_object())
        throw std::invalid_argument("unspecified must map output name -> region name");
      for (const auto& [output, region] : value.items()) {
        if (!region.is_string() || region.get<std::string>().empty())
          throw std::invalid_argument("unspecified['" + output + "'] is " + region.dump() +
                                      ", not a region name");
        c.unspecified[output] = region.get<std::string>();
      }
    } else {
      throw std::invalid_argument("unknown key '" + key + "' (known: not_produced, unspecified)");
    }
  }
  return c;
}

}  // namespace

bool PartialContract::produces(const std::string& output) const {
  return std::find(not_produced.begin(), not_produced.end(), output) == not_produced.end();
}

nlohmann::json PartialContract::to_json() const {
  if (empty()) return nullptr;
  nlohmann::json regions = nlohmann::json::object();
  for (const auto& [output, region] : unspecified) regions[output] = region;
  return {{"not_produced", not_produced}, {"unspecified", regions}};
}

std::string PartialContract::describe() const {
  std::string s;
  for (const auto& n : not_produced) s += (s.empty() ? "'" : "; '") + n + "' not produced";
  for (const auto& [output, region] : unspecified)
    s += (s.empty() ? "'" : "; '") + output + "' " + region + " unspecified";
  return s;
}

PartialContract partial_from_json(const nlohmann::json& j) {
  PartialContract c;
  if (!j.is_object()) return c;
  if (const auto it = j.find("not_produced"); it != j.end() && it->is_array())
    for (const auto& n : *it)
      if (n.is_string()) c.not_produced.push_back(n.get<std::string>());
  if (const auto it = j.find("unspecified"); it != j.end() && it->is_object())
    for (const auto& [output, region] : it->items())
      if (region.is_string()) c.unspecified[output] = region.get<std::string>();
  return c;
}

namespace {

// The problems of the op's default case and of the default case with one axis changed to each
// of its allowed values: together they launch every entry of the ops (rope's `contract` picks
// rope_inplace or rope_out_of_place). Unbuildable combinations are left out.
std::vector<Problem> sample_problems(const Op& op) {
  std::vector<Params> variants = {Params::object()};
  for (const auto& axis : op.axes())
    for (const auto& value : axis.allowed) variants.push_back({{axis.name, value}});
  std::vector<Problem> out;
  for (const auto& given : variants) {
    try {
      out.push_back(op.problem(op.make_case(given)));
    } catch (const std::exception&) {  // a combination that describes no case
    }
  }
  return out;
}

}  // namespace

const std::vector<std::string>& op_outputs(const Op& op, const std::string& entry) {
  static std::mutex mutex;
  static std::map<std::pair<const Op*, std::string>, std::vector<std::string>> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(&op, entry);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  std::vector<std::string> mine, any;  // the entry's problems' outputs; every problem's
  for (const auto& p : sample_problems(op))
    for (const auto& a : p.args) {
      if (a.role == Role::input) continue;
      auto& into = p.kernel == entry ? mine : any;
      if (std::find(into.begin(), into.end(), a.name) == into.end()) into.push_back(a.name);
    }
  return known.emplace(key, mine.empty() ? any : mine).first->second;
}

const Op* op_of_entry(const std::string& entry) {
  for (const Op* op : all_ops()) {
    const auto entries = op->kernel_entries();
    if (std::find(entries.begin(), entries.end(), entry) != entries.end()) return op;
  }
  return nullptr;
}

PartialContract parse_partial(const std::string& json, const Op& op, const std::string& entry,
                              const std::string& library) {
  const std::string who = "kernel library " + library + ": entry '" + entry + "' (op " + op.name() +
                          ") declares a partial contract ";
  PartialContract c;
  try {
    c = read_form(json);
  } catch (const std::exception& e) {
    throw PartialContractError(who +
                               "that is not {\"not_produced\": [outputs], "
                               "\"unspecified\": {output: region}}: " +
                               e.what() + " (declared: " + json + ")");
  }
  const auto& outputs = op_outputs(op, entry);
  auto check_output = [&](const std::string& name) {
    if (std::find(outputs.begin(), outputs.end(), name) == outputs.end())
      throw PartialContractError(who + "naming output '" + name + "', which the op does not have" +
                                 " (outputs: " + join_names(outputs) + ")");
  };
  for (const auto& n : c.not_produced) check_output(n);
  for (const auto& [output, region] : c.unspecified) {
    check_output(output);
    if (!c.produces(output))
      throw PartialContractError(who + "with output '" + output +
                                 "' both not produced and partly unspecified");
    const auto known = regions_of(op, output);
    if (std::find(known.begin(), known.end(), region) == known.end())
      throw PartialContractError(who + "naming region '" + region + "' of output '" + output +
                                 "', which the op does not define (regions of '" + output +
                                 "': " + join_names(known) + ")");
  }
  return c;
}

PartialContract entry_partial(const KernelLibrary& lib, const std::string& entry, const Op& op) {
  const std::string json = lib.declared_partial(entry);
  if (json.empty()) return {};
  return parse_partial(json, op, entry, lib.library());
}

namespace {

void zero_region(const Op& op, const std::string& output, const std::string& region,
                 const Problem& p, const Tensor& t) {
  t.for_each_index([&](const Index& idx, int64_t) {
    if (op.in_region(output, region, p, idx)) t.set_bits(idx, 0);
  });
}

// The elements of `now` that differ bitwise from `before`, in words ("" when none).
std::string written_elements(const std::string& name, const std::string& entry,
                             const Tensor& before, const Tensor& now) {
  int64_t count = 0;
  Index first;
  now.for_each_index([&](const Index& idx, int64_t) {
    if (now.get_bits(idx) != before.get_bits(idx) && count++ == 0) first = idx;
  });
  if (count == 0) return "";
  return "wrote " + std::to_string(count) + " of " + std::to_string(now.numel()) +
         " elements of '" + name + "' (first at " + format_index(first) + "), which entry '" +
         entry + "' declares not produced: a not-produced output must be left untouched";
}

}  // namespace

void settle_launch(const KernelLibrary& lib, const Problem& launched, DeviceOutcome& o) {
  if (o.status != ATTNCHECK_OK || lib.declared_partial(launched.kernel).empty()) return;
  const Op* op = op_of_entry(launched.kernel);
  if (!op) return;
  PartialContract c;
  try {
    c = entry_partial(lib, launched.kernel, *op);
  } catch (const PartialContractError& e) {
    o.violations.push_back(e.what());
    return;
  }
  for (const auto& name : c.not_produced) {
    const auto it = o.outputs.find(name);
    if (it == o.outputs.end()) continue;
    const auto w =
        written_elements(name, launched.kernel, launched.arg(name).held_rows(), it->second);
    if (!w.empty()) o.violations.push_back(w);
    o.outputs.erase(it);
  }
  for (const auto& [output, region] : c.unspecified)
    if (const auto it = o.outputs.find(output); it != o.outputs.end())
      zero_region(*op, output, region, launched, it->second);
}

void settle_expected(const PartialContract& c, const Op& op, const Problem& p,
                     TensorMap& expected) {
  for (const auto& name : c.not_produced) expected.erase(name);
  for (const auto& [output, region] : c.unspecified) {
    const auto it = expected.find(output);
    if (it == expected.end()) continue;
    it->second = it->second.clone();  // a golden's tensors are shared with its cache
    zero_region(op, output, region, p, it->second);
  }
}

std::vector<OutputCheck> produced_checks(std::vector<OutputCheck> checks,
                                         const PartialContract& c) {
  std::erase_if(checks, [&](const OutputCheck& k) { return !c.produces(k.name); });
  return checks;
}

}  // namespace attncheck
