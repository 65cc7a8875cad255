// attncheck: correctness harness for attention kernels (docs/cli.md).
#include <CLI/CLI.hpp>

#include <csignal>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "run/cases.h"
#include "run/provenance.h"

using namespace attncheck::cli;
using attncheck::kTiers;

namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// A number that is finite and within [lo, hi]: CLI::Range lets NaN through (every comparison
// with NaN is false), and a timeout of 1e10 s overflows the clock.
CLI::Validator finite_in(double lo, double hi) {
  const auto text_of = [](double x) {
    std::ostringstream os;
    os << x;
    return os.str();
  };
  const std::string range = "[" + text_of(lo) + ", " + text_of(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        double v = 0;
        try {
          size_t used = 0;
          v = std::stod(text, &used);
          if (used != text.size()) return "'" + text + "' is not a number";
        } catch (const std::exception&) {
          return "'" + text + "' is not a number";
        }
        if (!std::isfinite(v) || v < lo || v > hi)
          return "'" + text + "' is not a finite number in " + range;
        return "";
      },
      "FINITE in " + range);
}

constexpr double kWeek = 7 * 24 * 3600.0;

// The tier names of --tier: kTiers (run/cases.h), and "all" where `with_all`.
std::vector<std::string> tier_names(bool with_all) {
  std::vector<std::string> names(std::begin(kTiers), std::end(kTiers));
  if (with_all) names.push_back("all");
  return names;
}

// "smoke, quick, full, bench or all"
std::string in_words(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

// Each option several commands share, declared once: its name, type and check here, the words
// of its help where the commands differ.
void add_tier(CLI::App* cmd, std::string& tier, bool with_all = true) {
  const auto names = tier_names(with_all);
  cmd->add_option("--tier", tier, in_words(names))
      ->check(CLI::IsMember(names))
      ->capture_default_str();
}
void add_ops(CLI::App* cmd, std::vector<std::string>& ops) {
  cmd->add_option("--op", ops, "only these ops (repeatable)");
}
void add_filter(CLI::App* cmd, std::string& filter) {
  cmd->add_option("--filter", filter, "regex searched in case ids");
}
void add_kernels(CLI::App* cmd, std::string& kernels,
                 const char* what = "kernel library (.so) [$ATTNCHECK_KERNELS]") {
  kernels = env_or("ATTNCHECK_KERNELS", "");
  cmd->add_option("--kernels", kernels, what);
}
void add_arch(CLI::App* cmd, std::string& arch) {
  cmd->add_option("--arch", arch, "arch for known-bug marks [the device's]");
}
void add_repeat(CLI::App* cmd, int& repeat, const char* what) {
  cmd->add_option("--repeat", repeat, what)->check(CLI::Range(1, 1000))->capture_default_str();
}
void add_timeout(CLI::App* cmd, double& seconds, const char* what) {
  cmd->add_option("--timeout", seconds, what)
      ->check(finite_in(0.001, kWeek))
      ->capture_default_str();
}
void add_import_timeout(CLI::App* cmd, double& seconds, const char* what) {
  cmd->add_option("--import-timeout", seconds, what)
      ->check(finite_in(0.1, kWeek))
      ->capture_default_str();
}
void add_jobs(CLI::App* cmd, int& jobs, const char* what, int most) {
  cmd->add_option("--jobs", jobs, what)->check(CLI::Range(1, most));
}
void add_allow_missing_goldens(CLI::App* cmd, bool& allow, const char* what) {
  cmd->add_flag("--allow-missing-goldens", allow, what);
}
void add_no_smem_poison(CLI::App* cmd, bool& off, const char* what) {
  cmd->add_flag("--no-smem-poison", off, what);
}
void add_in_process(CLI::App* cmd, bool& in_process, const char* what) {
  cmd->add_flag("--in-process", in_process, what);
}
void add_params(CLI::App* cmd, std::string& params, const char* what) {
  cmd->add_option("--params", params, what);
}

// The options of `run` and `mutants` that plan and bound the pools, and time them.
struct PoolWords {
  const char *jobs, *jobs_per_gpu, *threads_per_worker, *gpus, *max_failures, *durations,
      *worker_memory, *profile, *timeout, *import_timeout, *out;
};
void add_pool_options(CLI::App* cmd, RunArgs& r, const PoolWords& w) {
  add_jobs(cmd, r.jobs, w.jobs, 1024);
  cmd->add_option("--jobs-per-gpu", r.jobs_per_gpu, w.jobs_per_gpu)->check(CLI::Range(1, 256));
  cmd->add_option("--threads-per-worker", r.threads_per_worker, w.threads_per_worker)
      ->check(CLI::Range(1, 256));
  cmd->add_option("--gpus", r.gpus, w.gpus)->capture_default_str();
  cmd->add_option("--max-failures", r.max_failures, w.max_failures)
      ->check(CLI::Range(0, 100000000));
  cmd->add_option("--durations", r.durations, w.durations);
  cmd->add_option("--worker-memory", r.worker_memory, w.worker_memory);
  cmd->add_flag("--profile", r.profile, w.profile);
  add_timeout(cmd, r.timeout_s, w.timeout);
  add_import_timeout(cmd, r.import_timeout_s, w.import_timeout);
  cmd->add_option("--out", r.out, w.out);
}

// Every subcommand's arguments and the subcommand that takes them.
struct Commands {
  Paths paths;
  CLI::Option *cases_opt = nullptr, *golden_opt = nullptr;
  int64_t max_cases = 0;
  ListArgs list;
  RunArgs run;
  MutantsArgs mutants;
  ReproArgs repro;
  ShrinkArgs shrink;
  GoldenArgs golden;
  BenchArgs bench;
  KernelsArgs kernels;
  LoadLibraryArgs load_library;
  CoverageArgs coverage;
  std::string worker_config, worker_kernels;
  CLI::App *list_cmd, *run_cmd, *mutants_cmd, *repro_cmd, *shrink_cmd, *gen_cmd, *verify_cmd,
      *diff_cmd, *bench_cmd, *report_cmd, *worker_cmd, *kernels_cmd, *load_library_cmd,
      *coverage_cmd;
};

void add_run(CLI::App& app, Commands& c) {
  RunArgs& r = c.run;
  auto* cmd = c.run_cmd = app.add_subcommand(
      "run", "run cases: kernel vs reference/golden, or reference vs golden without a GPU");
  add_tier(cmd, r.tier);
  add_ops(cmd, r.ops);
  add_filter(cmd, r.filter);
  add_kernels(cmd, r.kernels);
  add_arch(cmd, r.arch);
  cmd->add_option("--shard", r.shard, "i/n: run every n-th case from the i-th (0-based)")
      ->capture_default_str();
  add_repeat(cmd, r.repeat, "launches per case (>=2: never-written elements, determinism)");
  add_pool_options(
      cmd, r,
      {"cases at once in all, spread over the GPUs [a pool per GPU: the cores shared by the GPUs, "
       "as far as its memory holds the worker processes: 6 GiB each and 512 MiB per further "
       "thread]",
       "cases at once per GPU (instead of the size from cores and memory)",
       "cases one worker process runs at once, in threads sharing its GPU context, when the "
       "kernel library allows calls from any thread [16 with a GPU, at most the pool's cases; 1 "
       "without one, and for py: adapters]",
       "GPUs for the worker pools: auto (the visible ones), none, or ids (0,1)",
       "start no new case once N cases failed (the rest are skipped, saying why); 0: run every "
       "case",
       "case durations of an earlier run (ci/case-durations.json): shards balanced by time, "
       "longest cases first",
       "resident memory per worker with every process it started, e.g. 8G; over it the case "
       "fails [3/4 of RAM / --jobs, at least 2G; 0: none]",
       "print where the time went: totals per phase and per op, the pools",
       "seconds per case before it counts as hung",
       "seconds to load the kernel library (a Python adapter's import) and its device; past it "
       "the run stops naming the adapter",
       "results directory (run.json, results.jsonl, junit.xml, repro/)"});
  add_allow_missing_goldens(cmd, r.allow_missing_goldens,
                            "reference mode: a case without a golden runs the reference with "
                            "nothing to compare (skipped) instead of an error");
  cmd->add_option("--stress", r.stress,
                  "each case N more times under varying conditions (shared-memory poison "
                  "patterns, L2 flush, concurrent work), outputs compared bitwise with the first "
                  "launch; `--stress` alone: 50")
      ->expected(0, 1)
      ->default_str("50")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--sanitizer", r.sanitizer,
                  "run the worker processes under NVIDIA compute-sanitizer with this tool; its "
                  "findings fail the case ($ATTNCHECK_COMPUTE_SANITIZER or PATH)")
      ->check(CLI::IsMember({"memcheck", "racecheck", "initcheck", "synccheck"}));
  add_no_smem_poison(cmd, r.no_smem_poison,
                     "do not fill shared memory / LDS with NaN before each launch "
                     "(ATTNCHECK_SMEM_POISON=off; docs/abi.md)");
  cmd->add_option("--shrink", r.shrink,
                  "after the run, shrink the first N failures (kernel mode) toward their "
                  "simplest failing case; results.jsonl gets a \"shrunk\" field; `--shrink` "
                  "alone: 5")
      ->expected(0, 1)
      ->default_str("5")
      ->check(CLI::Range(1, 10000));
  cmd->add_option("--shrink-time", r.shrink_time_s, "seconds spent shrinking one failure")
      ->check(finite_in(1, kWeek))
      ->capture_default_str();
  add_in_process(cmd, r.in_process, "no worker processes (for a debugger; a crash ends the run)");
}

void add_mutants(CLI::App& app, Commands& c) {
  RunArgs& r = c.mutants.run;
  r.tier = "quick";
  auto* cmd = c.mutants_cmd = app.add_subcommand(
      "mutants",
      "run several kernel libraries (mutants) over their cases in one pool: one worker process "
      "per GPU opens them all; a results directory per library under --out");
  cmd->add_option("--library", c.mutants.libraries,
                  "a kernel library, LIB or LIB=op,op (only those ops' cases); repeatable, "
                  "costliest first")
      ->required();
  cmd->add_option("--first", c.mutants.first,
                  "NAME=REGEX: library NAME's cases whose ids match REGEX are sent before its "
                  "others (a mutant's expected killers: with --max-failures it stops sooner); "
                  "repeatable");
  add_tier(cmd, r.tier);
  add_filter(cmd, r.filter);
  add_repeat(cmd, r.repeat, "launches per case");
  add_pool_options(cmd, r,
                   {"cases at once in all", "cases at once per GPU",
                    "cases one worker process runs at once [8 with a GPU: two processes per GPU]",
                    "auto, none, or ids (0,1)",
                    "per library: start no new case of it once N of its cases failed; 0: all",
                    "case durations (ci/case-durations.json): longest cases first",
                    "resident memory per worker process, e.g. 8G [as run]", "where the time went",
                    "seconds per case", "seconds to load the first library and its device",
                    "results directory: <out>/<library>/"});
  cmd->get_option("--out")->required();
}

void add_repro(CLI::App& app, Commands& c) {
  ReproArgs& r = c.repro;
  auto* cmd = c.repro_cmd = app.add_subcommand("repro", "one case, verbosely, with an HDF5 bundle");
  cmd->add_option("id", r.id, "case id (see `attncheck list`)")->required();
  add_kernels(cmd, r.kernels);
  add_arch(cmd, r.arch);
  cmd->add_option("--bundle", r.bundle, "bundle path [repro/<id>.h5]");
  add_repeat(cmd, r.repeat, "launches");
  add_allow_missing_goldens(cmd, r.allow_missing_goldens, "run without a golden directory");
  add_no_smem_poison(cmd, r.no_smem_poison,
                     "do not fill shared memory / LDS with NaN before each launch");
  cmd->add_option("--worst", r.worst, "worst elements shown per output")
      ->check(CLI::Range(0, 10000));
  cmd->add_option("--export", r.export_format,
                  "pytest: write one self-contained pytest file of a Python adapter's call "
                  "(inputs, the upstream call, expected outputs, budgets)")
      ->check(CLI::IsMember({"pytest"}));
  cmd->add_option("--out", r.export_out, "the exported file [test_<id>.py beside the bundle]");
  add_import_timeout(cmd, r.import_timeout_s,
                     "seconds to load the kernel library and its device (first in a process of "
                     "its own)");
  add_params(cmd, r.params,
             "an ad-hoc case (one in no tier, e.g. from `attncheck shrink`): its axis values as "
             "JSON; the id is then the op's name or the id they describe");
}

void add_shrink(CLI::App& app, Commands& c) {
  ShrinkArgs& s = c.shrink;
  auto* cmd = c.shrink_cmd = app.add_subcommand(
      "shrink", "from a failing case, the simplest case that still fails the same check");
  cmd->add_option("id", s.id, "case id (or, with --params, the op's name)")->required();
  add_params(cmd, s.params, "start from an ad-hoc case: axis values (JSON)");
  add_kernels(cmd, s.kernels, "kernel library (.so) or py:MODULE [$ATTNCHECK_KERNELS]");
  cmd->add_option("--check", s.check,
                  "the failure to keep: an output name (o) or a kind (unwritten, crash, ...) "
                  "[the first failure]");
  add_arch(cmd, s.arch);
  add_repeat(cmd, s.repeat, "launches per candidate");
  add_jobs(cmd, s.jobs, "worker processes evaluating candidates", 256);
  cmd->get_option("--jobs")->capture_default_str();
  cmd->add_option("--max-evaluations", s.max_evaluations, "candidates evaluated in all")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--time", s.time_budget_s, "seconds after which no new pass starts")
      ->check(finite_in(1, kWeek))
      ->capture_default_str();
  add_timeout(cmd, s.timeout_s, "seconds per candidate before it hangs");
  add_in_process(cmd, s.in_process, "evaluate in this process (a crashing kernel ends the search)");
  cmd->add_flag("--json", s.json, "also print the outcome as one JSON line");
}

void add_list_and_golden(CLI::App& app, Commands& c) {
  c.list.tier = "all";
  c.list_cmd = app.add_subcommand("list", "list case ids of a tier");
  add_tier(c.list_cmd, c.list.tier);
  add_ops(c.list_cmd, c.list.ops);
  add_filter(c.list_cmd, c.list.filter);
  c.list_cmd->add_flag("--json", c.list.json, "one JSON object per case");

  auto* golden_cmd = app.add_subcommand("golden", "generate, verify or diff the golden tensors");
  golden_cmd->require_subcommand(1);
  c.gen_cmd = golden_cmd->add_subcommand("generate", "write golden/<op>.h5 and MANIFEST");
  c.verify_cmd = golden_cmd->add_subcommand("verify", "recompute and compare; check MANIFEST");
  c.diff_cmd = golden_cmd->add_subcommand("diff", "which cases would change, by how much");
  for (auto* g : {c.gen_cmd, c.verify_cmd, c.diff_cmd}) add_ops(g, c.golden.ops);
  c.verify_cmd->add_flag(
      "--manifest-only", c.golden.manifest_only,
      "only MANIFEST against the files (sha256, size, nothing missing or extra)");
  c.diff_cmd->add_option("--against", c.golden.against,
                         "another golden directory (default: the recomputed reference)");
}

void add_bench_report_coverage(CLI::App& app, Commands& c) {
  BenchArgs& b = c.bench;
  c.bench_cmd = app.add_subcommand("bench", "kernel time, GB/s, TFLOP/s against the roofline");
  add_tier(c.bench_cmd, b.tier);
  add_ops(c.bench_cmd, b.ops);
  add_filter(c.bench_cmd, b.filter);
  add_kernels(c.bench_cmd, b.kernels);
  c.bench_cmd->add_option("--warmup", b.warmup, "untimed launches")->check(CLI::Range(0, 10000));
  c.bench_cmd->add_option("--iters", b.iters, "timed launches")->check(CLI::Range(1, 100000));
  c.bench_cmd->add_option("--json", b.json, "output file")->capture_default_str();

  c.report_cmd = app.add_subcommand(
      "report", "HTML + Markdown report: python3 -m attncheck_report RESULTS_DIR... [options]");
  c.report_cmd->prefix_command()->allow_extras()->fallthrough(false);
  c.report_cmd->set_help_flag();  // --help goes to the report tool

  c.coverage_cmd = app.add_subcommand(
      "coverage",
      "audit what a tier passes to the kernels: flags arguments never varied, derived from "
      "others, never at their extremes (docs/coverage.md; no GPU, no reference)");
  add_tier(c.coverage_cmd, c.coverage.tier, false);
  add_ops(c.coverage_cmd, c.coverage.ops);
  c.coverage_cmd->add_flag("--json", c.coverage.json, "the audit as JSON on stdout");
  c.coverage_cmd->add_option("--out", c.coverage.out, "also write the audit as JSON to this file");
}

void add_kernels_and_internal(CLI::App& app, Commands& c) {
  c.kernels_cmd = app.add_subcommand(
      "kernels", "list a kernel library's entries against those the ops ask for (no GPU needed)");
  add_kernels(c.kernels_cmd, c.kernels.kernels);
  c.kernels_cmd->get_option("--kernels")->required();
  c.kernels_cmd->add_flag("--check", c.kernels.check,
                          "exit 1 when an entry the ops ask for is missing");
  add_import_timeout(c.kernels_cmd, c.kernels.import_timeout_s,
                     "seconds to load the kernel library (in a process of its own)");

  // Internal: a pool's worker (its WorkerConfig as JSON, run/worker.h), and a library loaded in
  // a process of its own (kernels, repro).
  c.worker_cmd = app.add_subcommand("worker", "");
  c.worker_cmd->group("");
  c.worker_cmd->add_option("--config", c.worker_config)->required();
  c.worker_cmd->add_option("--kernels", c.worker_kernels);
  c.load_library_cmd = app.add_subcommand("load-library", "");
  c.load_library_cmd->group("");
  c.load_library_cmd->add_option("--kernels", c.load_library.kernels)->required();
  c.load_library_cmd->add_flag("--device", c.load_library.device);
  c.load_library_cmd->add_option("--import-timeout", c.load_library.import_timeout_s);
}

void add_global_options(CLI::App& app, Commands& c) {
  app.require_subcommand(1);
  app.fallthrough();
  app.set_version_flag("--version", attncheck::attncheck_version());
  c.paths.root = attncheck::default_root();
  app.add_option("--root", c.paths.root, "repository root (cases/, golden/, harness/report)")
      ->envname("ATTNCHECK_ROOT");
  c.cases_opt = app.add_option("--cases", c.paths.cases, "case file directory [<root>/cases]");
  c.golden_opt = app.add_option("--golden", c.paths.golden, "golden directory [<root>/golden]");
  // $ATTNCHECK_MAX_CASES is read (and refused, by its own name) by case_limits(), not here.
  app.add_option("--max-cases", c.max_cases,
                 "most cases all case files together may hold (all tiers) [200000; "
                 "$ATTNCHECK_MAX_CASES]")
      ->check(CLI::Range(int64_t{1}, int64_t{100000000}));
}

// After parsing: the limits from the environment checked once (a bad value is bad input naming
// its variable, exit 2, before any command reads it), the default directories, the smem switch.
// 0 to go on, else the exit status.
int settle(Commands& c) {
  // case_limits() (run/cases.h) reads it, here and in the workers, which inherit the environment.
  if (c.max_cases > 0) ::setenv("ATTNCHECK_MAX_CASES", std::to_string(c.max_cases).c_str(), 1);
  try {
    (void)attncheck::case_limits();
    (void)attncheck::size_limits();
  } catch (const std::exception& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  Paths& p = c.paths;
  p.cases_given = c.cases_opt->count() > 0;
  p.golden_given = c.golden_opt->count() > 0;
  if (!p.cases_given) p.cases = (std::filesystem::path(p.root) / "cases").string();
  if (!p.golden_given) p.golden = (std::filesystem::path(p.root) / "golden").string();
  // The kernel library reads the switch at every launch, in this process and in the workers,
  // which inherit the environment.
  if ((*c.run_cmd && c.run.no_smem_poison) || (*c.repro_cmd && c.repro.no_smem_poison))
    ::setenv("ATTNCHECK_SMEM_POISON", "off", 1);
  return 0;
}

int dispatch(const Commands& c) {
  const Paths& p = c.paths;
  if (*c.list_cmd) return cmd_list(p, c.list);
  if (*c.run_cmd) return cmd_run(p, c.run);
  if (*c.mutants_cmd) return cmd_mutants(p, c.mutants);
  if (*c.repro_cmd) return cmd_repro(p, c.repro);
  if (*c.gen_cmd) return cmd_golden_generate(p, c.golden);
  if (*c.verify_cmd) return cmd_golden_verify(p, c.golden);
  if (*c.diff_cmd) return cmd_golden_diff(p, c.golden);
  if (*c.bench_cmd) return cmd_bench(p, c.bench);
  if (*c.report_cmd) return cmd_report(p, c.report_cmd->remaining());
  if (*c.worker_cmd) return cmd_worker(c.worker_config, c.worker_kernels);
  if (*c.kernels_cmd) return cmd_kernels(p, c.kernels);
  if (*c.load_library_cmd) return cmd_load_library(c.load_library);
  if (*c.coverage_cmd) return cmd_coverage(p, c.coverage);
  if (*c.shrink_cmd) return cmd_shrink(p, c.shrink);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  // A write past RLIMIT_FSIZE then fails with EFBIG, which the writers report naming the file,
  // instead of killing the process with SIGXFSZ.
  ::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"attncheck: CPU reference vs kernels under test, over case matrices and goldens"};
  Commands c;
  add_global_options(app, c);
  add_list_and_golden(app, c);
  add_run(app, c);
  add_mutants(app, c);
  add_repro(app, c);
  add_shrink(app, c);
  add_bench_report_coverage(app, c);
  add_kernels_and_internal(app, c);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // "attncheck frobnicate": say which word was not understood, not only that a command is needed.
    if (app.get_subcommands().empty() && !app.remaining().empty() &&
        app.remaining().front().rfind("-", 0) != 0) {
      std::cerr
          << "attncheck: unknown command '" << app.remaining().front()
          << "' (commands: list, run, repro, shrink, golden, bench, kernels, coverage, report)\n";
      return 2;
    }
    return app.exit(e);
  }
  if (const int status = settle(c)) return status;
  try {
    return dispatch(c);
  } catch (const std::exception& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
}
