// The registered op of a name, for the op tests (which all link into ops_tests): a missing one
// is an error naming it, not a null dereference.
#pragma once
#include <stdexcept>
#include <string>
#include <string_view>

#include "ops/op.h"

namespace attncheck {

inline const Op& registered_op(std::string_view name) {
  const Op* o = find_op(name);
  if (!o) throw std::runtime_error(std::string(name) + " not registered");
  return *o;
}

}  // namespace attncheck
