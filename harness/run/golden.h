// Golden tensors (docs/goldens.md): the reference's expected outputs for the smoke and quick tiers,
// frozen in golden/<op>.h5 with the digests of the inputs they were computed from, plus
// golden/MANIFEST (file, sha256, size, cases).
//
// Storage: float64/float32 outputs as float32; every other dtype exactly (bf16/f16/fp8 as raw bits
// with a "dtype" attribute, integers as themselves). Verification recomputes the reference and
// allows exactly the float32 storage rounding for float32-stored outputs (|r - s| <= 2^-24 |s|,
// plus 2^-44 |s| for re-association noise of float64 reductions and 2^-150 for subnormals) and
// nothing for exact outputs: reference drift is reported, never absorbed.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/hdf5io.h"
#include "run/cases.h"
#include "core/result.h"
#include "ops/op.h"

namespace attncheck {

inline constexpr int64_t kGoldenFormat = 1;
inline constexpr std::string_view kGoldenTiers[] = {"smoke", "quick"};
// The root attribute "storage" of every golden file, as generate writes it.
inline constexpr std::string_view kGoldenStorageNote =
    "float64 outputs as float32; every other dtype exactly (raw bits + dtype attribute for "
    "bf16/f16/fp8)";
inline constexpr uint64_t kGoldenBudgetBytes = 26ull * 1000 * 1000;
// Output bytes a GoldenStore keeps of the cases it read (GoldenStore::load).
inline constexpr uint64_t kGoldenKeptBytes = uint64_t{1} << 30;
// How long reading one golden file may take before its reader counts as hung (it takes well
// under a second; this allows a loaded 2-core CI machine and sanitizer builds).
inline constexpr double kGoldenReadTimeoutS = 120;
// kGoldenReadTimeoutS, or $ATTNCHECK_GOLDEN_READ_TIMEOUT (seconds, > 0 and <= 86400; tests use a
// short one). Throws std::invalid_argument naming the variable for any other value.
double golden_read_timeout_s();

// SHA-256 of everything a case hands the kernel: per argument its name, dtype, shape, strides,
// offset and the bytes of its whole storage; plus the kernel parameters and the refusal reason.
// {"args": {name: hex}, "kernel_params": {...}, "expect_refusal": "..."}
nlohmann::json input_digests(const Problem& p);

// How an expected output is stored (float64/float32 -> float32; anything else unchanged).
Tensor golden_storage_form(const Tensor& expected);
// The budget a recomputed output must meet against its stored form.
Budget golden_budget(DType stored);

struct GoldenCase {
  std::string id;
  Params params;
  nlohmann::json input_digests;
  std::optional<std::string> expect_refusal;  // stored "" for a valid configuration
  TensorMap outputs;  // as the reference produced them (float32-stored f64 widened back)
  std::map<std::string, DType> stored_dtypes;
};

// Parses golden <dir>/<op>.h5 completely (every case's attributes and outputs, as
// GoldenStore::load does) in a child process with a timeout (read_in_child, core/hdf5io.h), so a
// file on which libhdf5 crashes or loops is reported. "" when it reads cleanly, else why not.
// MANIFEST is not consulted (check_golden_file does that first).
std::string probe_golden_file(const std::string& dir, const std::string& op,
                              double timeout_s = golden_read_timeout_s());
// What must hold before a golden is parsed at all: <dir>/<op>.h5 is a regular file whose size and
// sha256 match its line in <dir>/MANIFEST. "" when they do, else why not (naming the file).
std::string golden_manifest_problem(const std::string& dir, const std::string& op);

// Whether <dir>/<op>.h5 can be read at all: golden_manifest_problem(), then probe_golden_file().
// "" when it can, else why not, naming the file ("<path>: unreadable (read in a child process):
// timed out after 120 s (killed)").
std::string golden_file_verdict(const std::string& dir, const std::string& op);

// A run's verdict on its golden files, taken once before any case runs (issue 26): the golden
// file of each op of `cases` that has one, through golden_file_verdict(). Cases whose file is
// unreadable are moved to the end of `cases` (the order is otherwise kept); returns op -> why for
// those files and sets `runnable` to the number of cases left in front. No worker reads such a
// file again, and each of its cases fails at once, naming it.
std::map<std::string, std::string> set_aside_unreadable_goldens(const std::string& dir,
                                                                std::vector<Case>& cases,
                                                                size_t& runnable);
// The same verdicts, the cases left as they are: op -> why for each unreadable golden file (every
// file at once, each hashed and read in a child process).
std::map<std::string, std::string> unreadable_golden_files(const std::string& dir,
                                                           const std::vector<Case>& cases);

// Reads golden/<op>.h5 files on demand (read-only, one open file per op). A file is parsed only
// after golden_file_verdict() found nothing wrong with it; that verdict is taken once per file and
// kept: a file found unreadable (its read failed, crashed or timed out) is not read again, every
// later load() of it throws at once with the first verdict.
class GoldenStore {
 public:
  explicit GoldenStore(std::string dir) : dir_(std::move(dir)) {}
  const std::string& dir() const { return dir_; }
  bool has_op(const std::string& op) const;
  // nullopt when the op has no golden file or the file has no group for this case. Throws
  // std::runtime_error naming the file when it is unreadable (corrupt, truncated). A case read
  // once is kept (up to kGoldenKeptBytes of outputs in all, sharing their storage with the copies
  // returned): a worker running several libraries (`attncheck mutants`) loads each case once per
  // library, and the reads take the process's one HDF5 lock.
  std::optional<GoldenCase> load(const std::string& op, const std::string& id);
  std::vector<std::string> case_ids(const std::string& op);  // ids stored for op
  // Every attribute of golden <op>.h5 against what `golden generate` writes for `cases` (the
  // op's smoke/quick cases): the root's (format, op, generator, tiers, case_count, storage),
  // each stored case group's (id, params, tiers, input_digests, expect_refusal: params and tiers
  // equal to its case's) and each output dataset's names (dtype, encoding, reference_dtype); an
  // attribute generate does not write is a problem too. What evaluation reads (input digests,
  // refusals, outputs) it checks itself. One line per problem, naming the file and object.
  std::vector<std::string> metadata_problems(const std::string& op, const std::vector<Case>& cases);
  // The file of `op` was checked (MANIFEST and a parse in a child process) by the process that
  // started this one, and had this stamp (golden_file_stamp): while the file keeps it, the check
  // is not repeated here (`attncheck run` checks each file once for all its workers).
  void trust_checked(const std::string& op, const std::string& stamp) { trusted_[op] = stamp; }
  // An in-memory golden that load() returns instead of the file's (tests of the comparison).
  void put(const std::string& op, GoldenCase g) { overrides_[op + "\n" + g.id] = std::move(g); }
  std::string path_of(const std::string& op) const;

 private:
  friend std::string probe_golden_file(const std::string&, const std::string&, double);
  H5File& file(const std::string& op);
  std::string dir_;
  bool checked_ = true;  // false only inside probe_golden_file's child (it is the check)
  std::map<std::string, std::unique_ptr<H5File>> open_;
  std::map<std::string, std::string> unreadable_;  // op -> golden_file_verdict()
  std::map<std::string, GoldenCase> overrides_;
  std::map<std::string, GoldenCase> kept_;  // op + "\n" + id -> what load() read
  uint64_t kept_bytes_ = 0;
  std::map<std::string, std::string> trusted_;  // op -> stamp (trust_checked)
};

// "<bytes>:<mtime in ns>" of a file, "" when it cannot be read: what trust_checked compares.
std::string golden_file_stamp(const std::string& path);

// What differs between two input-digest records, in words; empty when equal.
std::string digest_difference(const nlohmann::json& golden, const nlohmann::json& now);
// A recomputed output against its stored golden, under golden_budget() of its reference dtype.
CheckResult compare_golden_output(const std::string& name, const Tensor& golden,
                                  DType golden_ref_dtype, const Tensor& now);
// Every recomputed output against the golden's; outputs present on one side only go to `problems`.
std::vector<CheckResult> compare_with_golden(const GoldenCase& g, const TensorMap& now,
                                             std::vector<std::string>& problems);

struct ManifestEntry {
  std::string file;  // name inside the golden directory
  std::string sha256;
  uint64_t size = 0;
  int64_t cases = 0;
};
std::vector<ManifestEntry> read_manifest(const std::string& dir);  // throws naming the line
void write_manifest(const std::string& dir, const std::vector<ManifestEntry>& entries);

struct GoldenOptions {
  std::string dir;               // golden directory
  std::string root;              // repository (for git provenance)
  std::vector<std::string> ops;  // empty: every op with smoke/quick cases
  std::string against;           // diff: another golden directory instead of the reference
  bool manifest_only = false;    // verify: MANIFEST and files only (sha256, size, file set)
};

// Cases of the golden tiers per op, in tier order, ids unique.
std::map<std::string, std::vector<Case>> golden_cases(const std::vector<CaseFile>& files,
                                                      const std::vector<std::string>& ops);

// Writes <dir>/<op>.h5 for each selected op and MANIFEST as one transaction: every file is staged
// in a sibling directory (golden_staging_dir, git-ignored) with the files it keeps, and the two
// directories are swapped at once (renameat2 RENAME_EXCHANGE), so a kill at any instant leaves
// the old set or the new one in <dir> and nothing else. Prints one line per op (cases, bytes,
// seconds) and the total against the size budget. Returns 0, or 1 when the total exceeds the
// budget (files are still written). Throws on reference errors and write errors.
int golden_generate(const std::vector<CaseFile>& files, const GoldenOptions& opt,
                    std::ostream& out);
// Checks MANIFEST (every file listed with its sha256 and size, nothing missing or extra), the set
// of cases per file against the case files, input digests and every output. Prints every problem,
// returns the number of problems (0 = verified).
int golden_verify(const std::vector<CaseFile>& files, const GoldenOptions& opt, std::ostream& out);
// Which cases would change (recomputed reference, or opt.against) and by how much. Returns the
// number of cases that differ.
int golden_diff(const std::vector<CaseFile>& files, const GoldenOptions& opt, std::ostream& out);

// Where generate stages a new golden set for `dir`: "<parent>/.<name>.staging" (same file system,
// so the swap is a rename; ignored by git).
std::string golden_staging_dir(const std::string& dir);

// The group name of a case inside golden/<op>.h5 and repro bundles ("cases/<vars>").
std::string golden_group(const std::string& id);

}  // namespace attncheck
