// Case files (cases/<op>.toml, format in docs/cases.md): groups of axis values expanded per tier
// into Cases (cartesian, pairwise covering array, or an explicit list), exclude rules, known-bug
// marks; then selection by op, id regex and shard.
//
// Loading validates everything up front and expands every tier once, so a bad file fails with
// "path:line:column: what" before any case runs, and duplicate ids are found wherever they are.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ops/op.h"

namespace attncheck {

// bench: production-sized shapes for `attncheck bench` (timed, not part of the accuracy tiers).
inline constexpr std::string_view kTiers[] = {"smoke", "quick", "full", "bench"};
bool is_tier(std::string_view t);
std::string tier_names();  // "smoke, quick, full, bench"

// A malformed case file; what() starts with "path:line:column:".
struct CaseFileError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct KnownBugRule {
  std::string id_regex;  // searched in case ids
  std::string arch;      // regex over the arch; empty = every arch
  std::string reason;
  std::string source;  // "path:line"
};

struct CaseGroup {
  std::string name;
  std::string source;                        // "path:line" of the [[group]]
  std::map<std::string, std::string> tiers;  // tier -> "cartesian" | "pairwise" | "list"
  // Axes varied by the group, in the op's axis order, each with its values in file order.
  std::vector<std::pair<std::string, std::vector<nlohmann::json>>> axes;
  bool has_axes = false;
  // Exclude rules: axis -> values (a scalar in the file is a one-value list).
  std::vector<std::map<std::string, std::vector<nlohmann::json>>> excludes;
  std::vector<std::string> exclude_sources;
  std::vector<Params> cases;  // `list` entries (given axes only)
  std::vector<std::string> case_sources;
  std::string note;
};

// A coverage-audit flag the case file accepts with a written reason (`[[coverage.accept]]`,
// docs/coverage.md). The loader checks the form (flag name, reason, axis names); the audit checks
// the argument names against what the op's kernels receive and reports stale acceptances.
inline constexpr std::string_view kCoverageFlags[] = {"never-varied", "derived", "never-extreme"};
struct CoverageAcceptance {
  std::vector<std::string> arguments;  // "params.scale", "q.stride[0]", "axis.heads", ...
  std::string flag;                    // one of kCoverageFlags
  std::string reason;                  // non-empty
  std::string source;                  // "path:line"
};

struct CaseFile {
  std::string path;
  std::string op;
  Params defaults = Params::object();  // the file's [defaults] (given axes only)
  std::vector<CaseGroup> groups;
  std::vector<KnownBugRule> known_bugs;
  std::vector<CoverageAcceptance> coverage_accepts;
  // Expanded cases per tier, in group order; Case::tiers lists every tier the id appears in.
  std::map<std::string, std::vector<Case>> tiers;
};

// How many cases one file may expand to, per tier and in all its tiers together, and all the files
// of a case directory together: a file or a directory that expands to a million cases is a mistake
// (and would take gigabytes in every worker). Defaults 20000, 50000 and 200000;
// $ATTNCHECK_MAX_CASES_PER_TIER, $ATTNCHECK_MAX_CASES_PER_FILE and $ATTNCHECK_MAX_CASES (the
// `--max-cases` option sets it) override them.
struct CaseLimits {
  int64_t per_tier = 20000;
  int64_t per_file = 50000;
  int64_t total = 200000;
};
CaseLimits case_limits();  // the defaults with the environment's overrides

// Parses, validates and expands one file. Throws CaseFileError.
CaseFile load_case_file(const std::string& path);
// Every *.toml of a directory, sorted by file name; duplicate ids of one tier across files are an
// error naming both sources, and so is a directory whose files together hold more than
// CaseLimits::total cases (naming the file that crossed it). Throws CaseFileError (also when the
// directory is missing or empty).
std::vector<CaseFile> load_case_dir(const std::string& dir);

// Expands one group for one tier (already done by load_case_file; exposed for tests).
std::vector<Case> expand_group(const Op& op, const CaseFile& file, const CaseGroup& group,
                               std::string_view tier);

class CaseDurations;

struct Shard {
  int index = 0;  // 0-based
  int count = 1;
};
// "i/n" with 0 <= i < n. Throws std::invalid_argument with the reason.
Shard parse_shard(std::string_view text);

// A regular expression over case ids (or arches), searched anywhere in the text. RE2 syntax and
// engine: matching takes time linear in the text whatever the pattern (no backtracking: no
// backreferences or lookaround), and compiling refuses what it cannot take (nesting deeper than
// 1000, a program over its memory budget) instead of recursing.
class IdRegex {
 public:
  // Throws std::invalid_argument("<what> regex '<pattern>': <why> (...)").
  IdRegex(const std::string& pattern, const std::string& what);
  bool search(std::string_view text) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::shared_ptr<const void> re_;  // re2::RE2 (kept out of this header)
};

struct Selection {
  std::string tier = "smoke";    // a tier, or "all" (every case of any tier, ids unique)
  std::vector<std::string> ops;  // empty: every op
  std::string filter;            // IdRegex searched in case ids; empty: all
  Shard shard;
  // Measured durations (--durations): shards balanced by time instead of by count.
  const CaseDurations* durations = nullptr;
};

// Cases of the selection in file order, then group order. Sharding is over the tier's full list
// (before --op/--filter), so the same case lands in the same shard whatever the filters: by
// position (index % count == shard index), or with durations by balanced_shards
// (run/scheduling.h). Throws std::invalid_argument for an unknown tier/op or bad
// regex.
std::vector<Case> select_cases(const std::vector<CaseFile>& files, const Selection& sel);

// An id as error messages show it: whole up to 200 characters, else its start and its length
// (an unknown id of 100,000 characters is not echoed back).
std::string shown_id(std::string_view id);

// The case with this id in any tier, or nullopt.
std::optional<Case> find_case(const std::vector<CaseFile>& files, std::string_view id);

}  // namespace attncheck
