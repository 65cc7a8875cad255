// The coverage audit (`attncheck coverage`, docs/coverage.md): every argument a kernel receives,
// with the values a tier passes, and the blind spots of that tier flagged:
//   never-varied   one value in every case (a kernel may hard-code it);
//   derived        a kernel scalar that is a function of other arguments the kernel sees (a
//                  kernel may ignore it and re-derive it);
//   never-extreme  a tensor never reaching element offset 2^31 / byte offset 2^32 (32-bit index
//                  arithmetic passes), or a numeric axis never at its smallest or largest allowed
//                  value.
// A flag is accepted with a written reason in the op's case file ([[coverage.accept]]). The audit
// makes every case's problem (inputs included) but runs no reference; large-offset cases build
// sparse storages, whose extents the audit reads from shapes and strides only.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "run/cases.h"

namespace attncheck {

struct CoverageFlag {
  std::string flag;         // never-varied | derived | never-extreme
  std::string detail;       // why, with the values ("always 1", "= f(q.shape[2]): ...")
  std::string reason;       // the acceptance's reason; empty: not accepted
  std::string accepted_at;  // "path:line" of the acceptance
  bool accepted() const { return !reason.empty(); }
};

// One argument of an op's kernels: an axis ("axis.heads"), a kernel scalar ("params.scale"), or an
// attribute of a tensor argument ("q.dtype", "q.shape[0]", "q.stride[1]", "q.offset" (the storage
// offset, in elements), "q.contiguous", "q.last_element" / "q.last_byte" (the largest element /
// byte offset from the storage's start that the view touches)).
struct CoverageArgument {
  std::string name;
  std::string kind;                    // axis | scalar | tensor
  int64_t present = 0;                 // audited cases holding it
  int64_t distinct = 0;                // distinct values
  std::vector<nlohmann::json> values;  // the distinct values, sorted; at most kShownValues
  std::optional<double> min, max;      // over numeric values
  std::vector<CoverageFlag> flags;
  static constexpr size_t kShownValues = 8;
};

struct OpCoverage {
  std::string op;
  std::string case_file;
  int64_t cases = 0;    // audited: cases the kernel must serve
  int64_t refused = 0;  // invalid configurations (the kernel must refuse): not audited
  std::vector<CoverageArgument> arguments;
  std::vector<std::string> stale;   // acceptances that match no flag of this tier
  std::vector<std::string> errors;  // acceptances naming no argument; cases that failed to build
};

struct CoverageReport {
  std::string tier;
  std::vector<OpCoverage> ops;
  double seconds = 0;
  int64_t flags() const;
  int64_t unaccepted() const;
  int64_t stale() const;
  int64_t errors() const;
  // 0: every flag accepted, no stale acceptance, no error; 1 otherwise.
  int exit_status() const { return unaccepted() || stale() || errors() ? 1 : 0; }
};

struct CoverageOptions {
  std::string tier = "quick";
  std::vector<std::string> ops;  // empty: every op with a case file
};

// Audits the selected ops' cases of the tier. Throws std::invalid_argument for an unknown tier or
// op.
CoverageReport audit_coverage(const std::vector<CaseFile>& files, const CoverageOptions& options);

// The audit of one op over `cases` (all of one op, from `tier`), judged against `accepts`.
OpCoverage audit_op(const Op& op, const std::vector<Case>& cases,
                    const std::vector<CoverageAcceptance>& accepts, const std::string& tier);

nlohmann::json coverage_json(const CoverageReport& report);
// Per op: every argument with its values and flags, then the unaccepted flags, stale acceptances
// and errors, then one summary line.
void print_coverage(const CoverageReport& report, std::ostream& os);

}  // namespace attncheck
