#include "core/case_json.h"

#include <stdexcept>
#include <string>

namespace attncheck {

nlohmann::json case_to_json(const Case& c) {
  nlohmann::json known = nullptr;
  if (c.known_bug) known = {{"reason", c.known_bug->reason}, {"arch", c.known_bug->arch}};
  return {{"op", c.op},       {"params", c.params}, {"id", c.id},
          {"tiers", c.tiers}, {"known_bug", known}, {"source", c.source}};
}

Case case_from_json(const nlohmann::json& j) {
  auto field = [&](const char* name, nlohmann::json::value_t type) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(name) || j[name].type() != type)
      throw std::invalid_argument(std::string("case JSON: '") + name + "' is missing or of the " +
                                  "wrong type");
    return j[name];
  };
  using T = nlohmann::json::value_t;
  Case c;
  c.op = field("op", T::string).get<std::string>();
  c.params = field("params", T::object);
  c.id = field("id", T::string).get<std::string>();
  for (const auto& t : field("tiers", T::array)) {
    if (!t.is_string()) throw std::invalid_argument("case JSON: a tier is not a string");
    c.tiers.push_back(t.get<std::string>());
  }
  c.source = field("source", T::string).get<std::string>();
  if (j.contains("known_bug") && !j["known_bug"].is_null()) {
    const auto& k = j["known_bug"];
    if (!k.is_object() || !k.contains("reason") || !k["reason"].is_string() ||
        !k.contains("arch") || !k["arch"].is_string())
      throw std::invalid_argument("case JSON: 'known_bug' is not {reason, arch}");
    c.known_bug = KnownBug{k["reason"].get<std::string>(), k["arch"].get<std::string>()};
  }
  return c;
}

}  // namespace attncheck
