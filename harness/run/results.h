// What a run leaves behind (docs/cli.md "Results directory"): run.json, results.jsonl, junit.xml,
// repro/<id>.h5 bundles; and the per-op summary table printed at the end of a run.
#pragma once
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"
#include "core/safe_output.h"
#include "run/evaluate.h"

namespace attncheck {

// "mla_decode/h8-bs16" -> "mla_decode__h8-bs16": the repro bundle's name. Always one plain file
// name, whatever the id holds: '/' becomes "__", any byte other than [A-Za-z0-9._+=-] becomes
// '_', a leading '.' or '-' is prefixed with '_', and a name over 180 bytes is cut and ends
// in 16 hex digits of the id's sha256 (so it cannot leave the directory it is joined to).
std::string id_to_filename(const std::string& id);

// results.jsonl: one line per case, appended and flushed as it comes; every write is checked
// (ENOSPC, EFBIG, EIO) and throws std::runtime_error naming the file.
class JsonlWriter {
 public:
  // Creates `path` anew (OutputStream::Mode::fresh, core/safe_output.h): an existing regular
  // file is replaced, anything else (a symbolic link, FIFO, directory) refused.
  explicit JsonlWriter(const std::string& path);
  void append(const std::string& line);  // adds the newline
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  OutputStream out_;
};

// Counts per op and verdict, and how many cases compared a kernel's output.
struct Summary {
  std::map<std::string, std::map<Verdict, int64_t>> per_op;  // op -> verdict -> count
  std::map<std::string, int64_t> kernel_mode;                // op -> cases in kernel mode
  int64_t compared = 0;                                      // cases that compared anything
  int64_t failures = 0;                                      // Result::failing()
  // Cases judged under a declared partial contract: entry -> the contract in words -> cases.
  std::map<std::string, std::map<std::string, int64_t>> partial;
  // Cases a Python adapter does not provide (not run, not in per_op): adapter -> op -> cases.
  std::map<std::string, std::map<std::string, int64_t>> not_provided;
  void add(const Result& r);
  // The table, one row per op and a total; then the ops not provided, once per adapter, and the
  // partial contracts cases were judged under, per entry.
  void print(std::ostream& out) const;
  void print_not_provided(std::ostream& out) const;
};

// JUnit XML: one testsuite per op, one testcase per result (classname = op, name = id); check
// metrics and budgets as properties; failed/error as <failure>/<error> with the repro line;
// skipped and known_bug as <skipped>.
std::string junit_xml(const std::vector<nlohmann::json>& results, const std::string& suite_name);
// The same from the run's typed Results, each read as the record results.jsonl holds of it (so
// that the two files agree), in the order given.
std::string junit_xml(const std::vector<const Result*>& results, const std::string& suite_name);

// Writes `text` to path via an unpredictable temporary file, fsync and rename
// (write_file_safely, core/safe_output.h). Refuses a path that exists and is not a regular file
// (a directory, device, FIFO, symlink: it is never replaced or followed); every write is checked.
// Throws std::runtime_error naming the path.
void write_file_atomic(const std::string& path, const std::string& text);

// A self-contained HDF5 bundle of one case: attributes id, op, params, kernel_params, verdict,
// message, checks (JSON), repro, plus `meta`; groups inputs/ (every argument's initial view
// contents, with role and layout attributes), expected/, actual/. Readable by h5py + numpy.
void write_repro_bundle(const std::string& path, const Result& r, const CaseArtifacts& a,
                        const nlohmann::json& meta);

// Reads a repro bundle back completely (every attribute, and every dataset of inputs/, expected/
// and actual/) in a child process (read_in_child), as any reader of an HDF5 file that came from
// elsewhere must. "" when it reads cleanly as a bundle, else why not.
std::string check_repro_bundle(const std::string& path, double timeout_s);

// The n elements with the largest error ratio (numeric: |a-e| / (atol + rtol |e|), NaN and
// mismatched infinities first; exact: the first n that differ bitwise), multi-dimensional indices.
std::vector<WorstElement> worst_elements(const Tensor& expected, const Tensor& actual,
                                         const Budget& b, size_t n);

}  // namespace attncheck
