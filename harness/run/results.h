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
#include "run/evaluate.h"

namespace attncheck {

// "mla_decode/h8-bs16" -> "mla_decode__h8-bs16": the repro bundle's name.
std::string id_to_filename(const std::string& id);

// Counts per op and verdict, and how many cases compared a kernel's output.
struct Summary {
  std::map<std::string, std::map<Verdict, int64_t>> per_op;  // op -> verdict -> count
  std::map<std::string, int64_t> kernel_mode;                // op -> cases in kernel mode
  int64_t compared = 0;                                      // cases that compared anything
  int64_t failures = 0;                                      // Result::failing()
  void add(const Result& r);
  void print(std::ostream& out) const;  // the table, one row per op and a total
};

// JUnit XML: one testsuite per op, one testcase per result (classname = op, name = id); check
// metrics and budgets as properties; failed/error as <failure>/<error> with the repro line;
// skipped and known_bug as <skipped>.
std::string junit_xml(const std::vector<nlohmann::json>& results, const std::string& suite_name);

// Writes `text` to path via a temporary file and rename.
void write_file_atomic(const std::string& path, const std::string& text);

// A self-contained HDF5 bundle of one case: attributes id, op, params, kernel_params, verdict,
// message, checks (JSON), repro, plus `meta`; groups inputs/ (every argument's initial view
// contents, with role and layout attributes), expected/, actual/. Readable by h5py + numpy.
void write_repro_bundle(const std::string& path, const Result& r, const CaseArtifacts& a,
                        const nlohmann::json& meta);

// The n elements with the largest error ratio (numeric: |a-e| / (atol + rtol |e|), NaN and
// mismatched infinities first; exact: the first n that differ bitwise), multi-dimensional indices.
std::vector<WorstElement> worst_elements(const Tensor& expected, const Tensor& actual,
                                         const Budget& b, size_t n);

}  // namespace attncheck
