// The parent's side of a Result: every Result is evaluate()'s (run/evaluate.h), made in a worker
// or in process, except where the parent has to speak for a case or add what only it sees. Those
// amendments are all here, so that what a result says is either evaluate()'s or named below.
#pragma once
#include <string>
#include <utility>

#include "core/result.h"
#include "run/evaluate.h"

namespace attncheck {

enum class Amendment {
  sanitizer,        // the worker's Result, failed by compute-sanitizer's findings in its report
  lost,             // no Result came: the worker died or hung, or could not start (`mode`)
  not_run,          // never started (--max-failures): skipped
  unreadable_line,  // the worker's answer held no readable Result: error
};

// What the parent knows that the amendment needs.
struct AmendWith {
  AmendWith(std::string detail_, Mode mode_, const RunOptions* options_, std::string tool = "")
      : detail(std::move(detail_)),
        mode(mode_),
        options(options_),
        sanitizer_tool(std::move(tool)) {}
  std::string detail;          // sanitizer: the report's path; else why, in words
  Mode mode = Mode::none;      // lost: the run's mode (kernel: the kernel is the prime suspect)
  const RunOptions* options;   // stand-ins: their repro line and arch
  std::string sanitizer_tool;  // sanitizer: memcheck, racecheck, ...
};

// `worker` is the worker's Result (sanitizer) or ignored (the others make a Result for `c`).
Result amend(const Case& c, Result worker, Amendment why, const AmendWith& with);

}  // namespace attncheck
