// The invariance check (docs/verification.md "Invariance"), beside the reference comparison: the
// op's metamorphic relations (Op::relations, ops/relation.h) launched after a case's checks pass.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "core/policy.h"
#include "core/result.h"
#include "ops/op.h"
#include "run/device.h"

namespace attncheck {

// Each relation of `p`: its transformed problem launched once, the outputs mapped back and
// compared with the first launch's (`first`) bitwise where the entry declares the relation's
// property, else with the op's checks against `expected` (the declared arithmetic `contract`'s
// when the default budgets fail). Outcomes go to r.invariance; each violation to `problems`,
// naming its relation ("invariance: batch permutation [2,0,3,1]: 'o': ..."). Problems with an
// argument on a sparse storage (large-offset cases) run none.
void check_invariance(Result& r, const Op& op, const Problem& p, const TensorMap& expected,
                      const TensorMap& first, const std::optional<Contract>& contract,
                      const DeviceRunner& device, std::vector<std::string>& problems);

}  // namespace attncheck
