// The attncheck subcommands (docs/cli.md). main.cpp parses arguments (CLI11) into these structs;
// each command returns the process exit status: 0 success, 1 a case or check failed, 2 bad
// arguments or inputs (unknown op, bad case file, missing library).
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include "run/cases.h"
#include "run/pool.h"
#include "run/shrink.h"

namespace attncheck::cli {

struct Paths {
  std::string root;    // repository: cases/, golden/, harness/report
  std::string cases;   // default <root>/cases
  std::string golden;  // default <root>/golden
  bool cases_given = false, golden_given = false;
};

struct ListArgs {
  std::string tier = "all";
  std::vector<std::string> ops;
  std::string filter;
  bool json = false;
};

struct RunArgs {
  std::string tier = "smoke";
  std::vector<std::string> ops;
  std::string filter;
  std::string kernels;  // default $ATTNCHECK_KERNELS
  std::string arch;     // known-bug scope override
  std::string shard = "0/1";
  int repeat = 2;
  int jobs = 0;                // cases at once in all; 0: pools per GPU from cores and memory
  int jobs_per_gpu = 0;        // --jobs-per-gpu: cases at once per GPU; 0: from cores and memory
  int threads_per_worker = 0;  // --threads-per-worker: cases per worker process; 0: the default
  std::string gpus = "auto";   // --gpus: auto, none, or a list of ids ("0,1")
  std::string durations;       // --durations: ci/case-durations.json (shards by time)
  bool profile = false;        // --profile: where the time went, per phase and per op
  std::string out;
  double timeout_s = 120;
  bool in_process = false;
  bool allow_missing_goldens = false;
  bool no_smem_poison = false;
  int stress = 0;                 // --stress N: N more launches per case under varying conditions
  std::string sanitizer;          // --sanitizer TOOL: workers under compute-sanitizer
  double import_timeout_s = 120;  // --import-timeout: loading the kernel library or adapter
  std::string worker_memory;      // --worker-memory: "" = the default (run_command.cpp)
  int shrink = 0;                 // --shrink N: shrink the first N failures (run/shrink.h)
  double shrink_time_s = 300;     // --shrink-time: seconds per shrunk failure
  int max_failures = 0;           // --max-failures N: no new case after N failing ones; 0: all
};

// `attncheck mutants`: the run's options (tier, filter, pools, --max-failures per library, --out
// holding a directory per library) and the libraries, "LIB" or "LIB=op,op" (only those ops).
struct MutantsArgs {
  RunArgs run;
  std::vector<std::string> libraries;
  std::vector<std::string> first;  // --first NAME=REGEX: library NAME's matching cases go first
};

struct ReproArgs {
  std::string id;
  std::string kernels;
  std::string arch;
  std::string bundle;  // default repro/<id>.h5
  int repeat = 2;
  int worst = 10;
  bool allow_missing_goldens = false;
  bool no_smem_poison = false;
  std::string params;             // --params JSON: an ad-hoc case of the op the id names
  std::string export_format;      // --export pytest: a self-contained test of a py: adapter's call
  std::string export_out;         // --out FILE of the export [beside the bundle]
  double import_timeout_s = 120;  // --import-timeout: loading the kernel library and its device
};

struct ShrinkArgs {
  std::string id;
  std::string params;  // --params JSON: start from an ad-hoc case
  std::string kernels;
  std::string arch;
  std::string check;  // the failure to keep: an output name or a kind; "" = the first
  int repeat = 2;
  int jobs = 1;
  int max_evaluations = 300;
  double time_budget_s = 600;
  double timeout_s = 120;
  bool in_process = false;
  bool json = false;
};

struct GoldenArgs {
  std::vector<std::string> ops;
  std::string against;
  bool manifest_only = false;
};

struct BenchArgs {
  std::string tier = "bench";
  std::vector<std::string> ops;
  std::string filter;
  std::string kernels;
  int warmup = 3;
  int iters = 20;
  std::string json = "bench.json";
};

struct KernelsArgs {
  std::string kernels;
  bool check = false;
  double import_timeout_s = 120;  // --import-timeout: loading the kernel library
};

// `attncheck load-library` (internal): a kernel library loaded in a process of its own.
struct LoadLibraryArgs {
  std::string kernels;
  bool device = false;
  double import_timeout_s = 120;
};

struct CoverageArgs {
  std::string tier = "quick";
  std::vector<std::string> ops;
  bool json = false;  // the audit as JSON on stdout instead of the listing
  std::string out;    // also write the JSON here (e.g. <results>/coverage.json)
};

// The cases of a tier, of these ops (none: all) whose ids match `filter`.
Selection selection(const std::string& tier, const std::vector<std::string>& ops,
                    const std::string& filter);
// Loads <cases>/*.toml and selects `sel`; on a bad case file or selection prints the reason
// ("attncheck: ...") and returns false.
bool load_and_select(const Paths& p, const Selection& sel, std::vector<CaseFile>& files,
                     std::vector<Case>& cases);

int cmd_list(const Paths& p, const ListArgs& a);
int cmd_run(const Paths& p, const RunArgs& a);
int cmd_mutants(const Paths& p, const MutantsArgs& a);
int cmd_repro(const Paths& p, const ReproArgs& a);
int cmd_golden_generate(const Paths& p, const GoldenArgs& a);
int cmd_golden_verify(const Paths& p, const GoldenArgs& a);
int cmd_golden_diff(const Paths& p, const GoldenArgs& a);
int cmd_bench(const Paths& p, const BenchArgs& a);
int cmd_report(const Paths& p, const std::vector<std::string>& args);
// `attncheck worker [--kernels LIB] --config JSON` (internal): the worker of a pool, its
// WorkerConfig as one JSON object (run/worker.h); --kernels is a label that must match the
// config's. A malformed config is refused naming the field, on stderr and as the worker's fatal
// line.
int cmd_worker(const std::string& config, const std::string& kernels_label);
int cmd_kernels(const Paths& p, const KernelsArgs& a);
int cmd_load_library(const LoadLibraryArgs& a);
int cmd_coverage(const Paths& p, const CoverageArgs& a);
int cmd_shrink(const Paths& p, const ShrinkArgs& a);

// " --cases X --golden Y" when they differ from the defaults, for repro lines.
std::string path_flags(const Paths& p);

// Shrinking (shrink_command.cpp): the outcome in words (original, check, minimal case, case-file
// entry, repro line).
void print_shrink_outcome(std::ostream& out, const Op& op, const ShrinkOutcome& s,
                          const RunOptions& opt, const Params& file_defaults,
                          const std::string& indent);
// The [defaults] of the op's case file (its cases' entries inherit them).
Params file_defaults_of(const std::vector<CaseFile>& files, const std::string& op);

}  // namespace attncheck::cli
