#include "run/amend.h"

#include <fstream>
#include <iterator>

namespace attncheck {

Result amend(const Case& c, Result worker, Amendment why, const AmendWith& with) {
  switch (why) {
    case Amendment::sanitizer: {
      std::ifstream in(with.detail);
      const std::string report((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
      apply_sanitizer_report(worker, report, with.sanitizer_tool, with.detail);
      return worker;
    }
    case Amendment::lost:
      return lost_case_result(c, with.mode, *with.options, with.detail);
    case Amendment::not_run: {
      Result r = lost_case_result(c, Mode::none, *with.options, with.detail);
      r.verdict = Verdict::skipped;
      return r;
    }
    case Amendment::unreadable_line: {
      Result r = lost_case_result(c, with.mode, *with.options,
                                  "the worker's result line is unreadable: " + with.detail);
      if (with.mode != Mode::kernel) r.verdict = Verdict::error;
      return r;
    }
  }
  return worker;
}

}  // namespace attncheck
