#include "core/case.h"

#include <algorithm>

namespace attncheck {

bool Case::in_tier(std::string_view tier) const {
  return std::find(tiers.begin(), tiers.end(), tier) != tiers.end();
}

const Tensor& Problem::arg(std::string_view name) const {
  for (const auto& a : args)
    if (a.name == name) return a.tensor;
  throw std::out_of_range("problem has no argument '" + std::string(name) + "'");
}
Tensor& Problem::arg(std::string_view name) {
  for (auto& a : args)
    if (a.name == name) return a.tensor;
  throw std::out_of_range("problem has no argument '" + std::string(name) + "'");
}
bool Problem::has_arg(std::string_view name) const {
  return std::any_of(args.begin(), args.end(), [&](const Arg& a) { return a.name == name; });
}

}  // namespace attncheck
