// A Case as JSON, and back: how the parent hands a case to a worker process (run/pool.h) and how
// `list --json` and the repro tools see one. Beside Case (core/case.h) so that every side of the
// worker boundary reads and writes it the same way.
#pragma once
#include <nlohmann/json.hpp>

#include "core/case.h"

namespace attncheck {

// {op, params, id, tiers, known_bug: null or {reason, arch}, source}.
nlohmann::json case_to_json(const Case& c);
// Throws std::invalid_argument naming the field that is missing or of the wrong type.
Case case_from_json(const nlohmann::json& j);

}  // namespace attncheck
