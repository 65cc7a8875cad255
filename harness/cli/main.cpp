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

}  // namespace

int main(int argc, char** argv) {
  // A write past RLIMIT_FSIZE then fails with EFBIG, which the writers report naming the file,
  // instead of killing the process with SIGXFSZ.
  ::signal(SIGXFSZ, SIG_IGN);
  using namespace attncheck::cli;
  CLI::App app{"attncheck: CPU reference vs kernels under test, over case matrices and goldens"};
  app.require_subcommand(1);
  app.fallthrough();
  app.set_version_flag("--version", attncheck::attncheck_version());

  Paths paths;
  paths.root = attncheck::default_root();
  app.add_option("--root", paths.root, "repository root (cases/, golden/, harness/report)")
      ->envname("ATTNCHECK_ROOT");
  auto* cases_opt = app.add_option("--cases", paths.cases, "case file directory [<root>/cases]");
  auto* golden_opt = app.add_option("--golden", paths.golden, "golden directory [<root>/golden]");
  int64_t max_cases = 0;
  // $ATTNCHECK_MAX_CASES is read (and refused, by its own name) by case_limits(), not here.
  app.add_option("--max-cases", max_cases,
                 "most cases all case files together may hold (all tiers) [200000; "
                 "$ATTNCHECK_MAX_CASES]")
      ->check(CLI::Range(int64_t{1}, int64_t{100000000}));
  const std::vector<std::string> tiers = {"smoke", "quick", "full", "bench", "all"};

  ListArgs list;
  auto* list_cmd = app.add_subcommand("list", "list case ids of a tier");
  list_cmd->add_option("--tier", list.tier, "smoke, quick, full, bench or all")
      ->check(CLI::IsMember(tiers))
      ->capture_default_str();
  list_cmd->add_option("--op", list.ops, "only these ops (repeatable)");
  list_cmd->add_option("--filter", list.filter, "regex searched in case ids");
  list_cmd->add_flag("--json", list.json, "one JSON object per case");

  RunArgs run;
  run.kernels = env_or("ATTNCHECK_KERNELS", "");
  auto* run_cmd = app.add_subcommand(
      "run", "run cases: kernel vs reference/golden, or reference vs golden without a GPU");
  run_cmd->add_option("--tier", run.tier, "smoke, quick, full, bench or all")
      ->check(CLI::IsMember(tiers))
      ->capture_default_str();
  run_cmd->add_option("--op", run.ops, "only these ops (repeatable)");
  run_cmd->add_option("--filter", run.filter, "regex searched in case ids");
  run_cmd->add_option("--kernels", run.kernels, "kernel library (.so) [$ATTNCHECK_KERNELS]");
  run_cmd->add_option("--arch", run.arch, "arch for known-bug marks [the device's]");
  run_cmd->add_option("--shard", run.shard, "i/n: run every n-th case from the i-th (0-based)")
      ->capture_default_str();
  run_cmd
      ->add_option("--repeat", run.repeat,
                   "launches per case (>=2: never-written elements, determinism)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  run_cmd
      ->add_option("--jobs", run.jobs,
                   "cases at once in all, spread over the GPUs [a pool per GPU: the cores "
                   "shared by the GPUs, as far as its memory holds the worker processes: 6 GiB "
                   "each and 512 MiB per further thread]")
      ->check(CLI::Range(1, 1024));
  run_cmd
      ->add_option("--jobs-per-gpu", run.jobs_per_gpu,
                   "cases at once per GPU (instead of the size from cores and memory)")
      ->check(CLI::Range(1, 256));
  run_cmd
      ->add_option("--threads-per-worker", run.threads_per_worker,
                   "cases one worker process runs at once, in threads sharing its GPU context, "
                   "when the kernel library allows calls from any thread [16 with a GPU, at "
                   "most the pool's cases; 1 without one, and for py: adapters]")
      ->check(CLI::Range(1, 256));
  run_cmd
      ->add_option("--gpus", run.gpus,
                   "GPUs for the worker pools: auto (the visible ones), none, or ids (0,1)")
      ->capture_default_str();
  run_cmd->add_option("--durations", run.durations,
                      "case durations of an earlier run (ci/case-durations.json): shards "
                      "balanced by time, longest cases first");
  run_cmd->add_flag("--profile", run.profile,
                    "print where the time went: totals per phase and per op, the pools");
  run_cmd->add_option("--out", run.out,
                      "results directory (run.json, results.jsonl, junit.xml, repro/)");
  run_cmd->add_option("--timeout", run.timeout_s, "seconds per case before it counts as hung")
      ->check(finite_in(0.001, 7 * 24 * 3600.0))
      ->capture_default_str();
  run_cmd->add_flag("--allow-missing-goldens", run.allow_missing_goldens,
                    "reference mode: a case without a golden runs the reference with nothing to "
                    "compare (skipped) instead of an error");
  run_cmd
      ->add_option("--stress", run.stress,
                   "each case N more times under varying conditions (shared-memory poison "
                   "patterns, L2 flush, concurrent work), outputs compared bitwise with the first "
                   "launch; `--stress` alone: 50")
      ->expected(0, 1)
      ->default_str("50")
      ->check(CLI::Range(1, 100000));
  run_cmd
      ->add_option("--sanitizer", run.sanitizer,
                   "run the worker processes under NVIDIA compute-sanitizer with this tool; its "
                   "findings fail the case ($ATTNCHECK_COMPUTE_SANITIZER or PATH)")
      ->check(CLI::IsMember({"memcheck", "racecheck", "initcheck", "synccheck"}));
  run_cmd->add_flag("--no-smem-poison", run.no_smem_poison,
                    "do not fill shared memory / LDS with NaN before each launch "
                    "(ATTNCHECK_SMEM_POISON=off; docs/abi.md)");
  run_cmd
      ->add_option("--import-timeout", run.import_timeout_s,
                   "seconds to load the kernel library (a Python adapter's import) and its "
                   "device; past it the run stops naming the adapter")
      ->check(finite_in(0.1, 7 * 24 * 3600.0))
      ->capture_default_str();
  run_cmd->add_option("--worker-memory", run.worker_memory,
                      "resident memory per worker with every process it started, e.g. 8G; "
                      "over it the case fails [3/4 of RAM / --jobs, at least 2G; 0: none]");
  run_cmd
      ->add_option("--shrink", run.shrink,
                   "after the run, shrink the first N failures (kernel mode) toward their "
                   "simplest failing case; results.jsonl gets a \"shrunk\" field; `--shrink` "
                   "alone: 5")
      ->expected(0, 1)
      ->default_str("5")
      ->check(CLI::Range(1, 10000));
  run_cmd
      ->add_option("--max-failures", run.max_failures,
                   "start no new case once N cases failed (the rest are skipped, saying why); "
                   "0: run every case")
      ->check(CLI::Range(0, 100000000));
  run_cmd->add_option("--shrink-time", run.shrink_time_s, "seconds spent shrinking one failure")
      ->check(finite_in(1, 7 * 24 * 3600.0))
      ->capture_default_str();
  run_cmd->add_flag("--in-process", run.in_process,
                    "no worker processes (for a debugger; a crash ends the run)");

  MutantsArgs mutants;
  mutants.run.tier = "quick";
  auto* mutants_cmd = app.add_subcommand(
      "mutants",
      "run several kernel libraries (mutants) over their cases in one pool: one worker process "
      "per GPU opens them all; a results directory per library under --out");
  mutants_cmd
      ->add_option("--library", mutants.libraries,
                   "a kernel library, LIB or LIB=op,op (only those ops' cases); repeatable, "
                   "costliest first")
      ->required();
  mutants_cmd->add_option("--tier", mutants.run.tier, "smoke, quick, full, bench or all")
      ->check(CLI::IsMember(tiers))
      ->capture_default_str();
  mutants_cmd->add_option("--filter", mutants.run.filter, "regex searched in case ids");
  mutants_cmd->add_option("--out", mutants.run.out, "results directory: <out>/<library>/")
      ->required();
  mutants_cmd->add_option("--gpus", mutants.run.gpus, "auto, none, or ids (0,1)")
      ->capture_default_str();
  mutants_cmd->add_option("--jobs-per-gpu", mutants.run.jobs_per_gpu, "cases at once per GPU")
      ->check(CLI::Range(1, 256));
  mutants_cmd->add_option("--jobs", mutants.run.jobs, "cases at once in all")
      ->check(CLI::Range(1, 1024));
  mutants_cmd
      ->add_option("--threads-per-worker", mutants.run.threads_per_worker,
                   "cases one worker process runs at once [8 with a GPU: two processes per GPU]")
      ->check(CLI::Range(1, 256));
  mutants_cmd
      ->add_option("--max-failures", mutants.run.max_failures,
                   "per library: start no new case of it once N of its cases failed; 0: all")
      ->check(CLI::Range(0, 100000000));
  mutants_cmd->add_option("--durations", mutants.run.durations,
                          "case durations (ci/case-durations.json): longest cases first");
  mutants_cmd->add_option("--repeat", mutants.run.repeat, "launches per case")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  mutants_cmd->add_option("--timeout", mutants.run.timeout_s, "seconds per case")
      ->check(finite_in(0.001, 7 * 24 * 3600.0))
      ->capture_default_str();
  mutants_cmd
      ->add_option("--import-timeout", mutants.run.import_timeout_s,
                   "seconds to load the first library and its device")
      ->check(finite_in(0.1, 7 * 24 * 3600.0))
      ->capture_default_str();
  mutants_cmd->add_option("--worker-memory", mutants.run.worker_memory,
                          "resident memory per worker process, e.g. 8G [as run]");
  mutants_cmd->add_flag("--profile", mutants.run.profile, "where the time went");

  ReproArgs repro;
  repro.kernels = env_or("ATTNCHECK_KERNELS", "");
  auto* repro_cmd = app.add_subcommand("repro", "one case, verbosely, with an HDF5 bundle");
  repro_cmd->add_option("id", repro.id, "case id (see `attncheck list`)")->required();
  repro_cmd->add_option("--kernels", repro.kernels, "kernel library (.so) [$ATTNCHECK_KERNELS]");
  repro_cmd->add_option("--arch", repro.arch, "arch for known-bug marks [the device's]");
  repro_cmd->add_option("--bundle", repro.bundle, "bundle path [repro/<id>.h5]");
  repro_cmd->add_option("--repeat", repro.repeat, "launches")->check(CLI::Range(1, 1000));
  repro_cmd->add_flag("--allow-missing-goldens", repro.allow_missing_goldens,
                      "run without a golden directory");
  repro_cmd->add_flag("--no-smem-poison", repro.no_smem_poison,
                      "do not fill shared memory / LDS with NaN before each launch");
  repro_cmd->add_option("--worst", repro.worst, "worst elements shown per output")
      ->check(CLI::Range(0, 10000));
  repro_cmd
      ->add_option("--export", repro.export_format,
                   "pytest: write one self-contained pytest file of a Python adapter's call "
                   "(inputs, the upstream call, expected outputs, budgets)")
      ->check(CLI::IsMember({"pytest"}));
  repro_cmd->add_option("--out", repro.export_out,
                        "the exported file [test_<id>.py beside the bundle]");
  repro_cmd
      ->add_option("--import-timeout", repro.import_timeout_s,
                   "seconds to load the kernel library and its device (first in a process of "
                   "its own)")
      ->check(finite_in(0.1, 7 * 24 * 3600.0))
      ->capture_default_str();
  repro_cmd->add_option("--params", repro.params,
                        "an ad-hoc case (one in no tier, e.g. from `attncheck shrink`): its axis "
                        "values as JSON; the id is then the op's name or the id they describe");

  ShrinkArgs shrink;
  shrink.kernels = env_or("ATTNCHECK_KERNELS", "");
  auto* shrink_cmd = app.add_subcommand(
      "shrink", "from a failing case, the simplest case that still fails the same check");
  shrink_cmd->add_option("id", shrink.id, "case id (or, with --params, the op's name)")->required();
  shrink_cmd->add_option("--params", shrink.params,
                         "start from an ad-hoc case: axis values (JSON)");
  shrink_cmd->add_option("--kernels", shrink.kernels,
                         "kernel library (.so) or py:MODULE [$ATTNCHECK_KERNELS]");
  shrink_cmd->add_option("--check", shrink.check,
                         "the failure to keep: an output name (o) or a kind (unwritten, crash, "
                         "...) [the first failure]");
  shrink_cmd->add_option("--arch", shrink.arch, "arch for known-bug marks [the device's]");
  shrink_cmd->add_option("--repeat", shrink.repeat, "launches per candidate")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  shrink_cmd->add_option("--jobs", shrink.jobs, "worker processes evaluating candidates")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  shrink_cmd->add_option("--max-evaluations", shrink.max_evaluations, "candidates evaluated in all")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  shrink_cmd->add_option("--time", shrink.time_budget_s, "seconds after which no new pass starts")
      ->check(finite_in(1, 7 * 24 * 3600.0))
      ->capture_default_str();
  shrink_cmd->add_option("--timeout", shrink.timeout_s, "seconds per candidate before it hangs")
      ->check(finite_in(0.001, 7 * 24 * 3600.0))
      ->capture_default_str();
  shrink_cmd->add_flag("--in-process", shrink.in_process,
                       "evaluate in this process (a crashing kernel ends the search)");
  shrink_cmd->add_flag("--json", shrink.json, "also print the outcome as one JSON line");

  GoldenArgs golden;
  auto* golden_cmd = app.add_subcommand("golden", "generate, verify or diff the golden tensors");
  golden_cmd->require_subcommand(1);
  auto* gen_cmd = golden_cmd->add_subcommand("generate", "write golden/<op>.h5 and MANIFEST");
  auto* verify_cmd = golden_cmd->add_subcommand("verify", "recompute and compare; check MANIFEST");
  auto* diff_cmd = golden_cmd->add_subcommand("diff", "which cases would change, by how much");
  for (auto* c : {gen_cmd, verify_cmd, diff_cmd})
    c->add_option("--op", golden.ops, "only these ops (repeatable)");
  verify_cmd->add_flag("--manifest-only", golden.manifest_only,
                       "only MANIFEST against the files (sha256, size, nothing missing or extra)");
  diff_cmd->add_option("--against", golden.against,
                       "another golden directory (default: the recomputed reference)");

  BenchArgs bench;
  bench.kernels = env_or("ATTNCHECK_KERNELS", "");
  auto* bench_cmd = app.add_subcommand("bench", "kernel time, GB/s, TFLOP/s against the roofline");
  bench_cmd->add_option("--tier", bench.tier, "smoke, quick, full, bench or all")
      ->check(CLI::IsMember(tiers))
      ->capture_default_str();
  bench_cmd->add_option("--op", bench.ops, "only these ops (repeatable)");
  bench_cmd->add_option("--filter", bench.filter, "regex searched in case ids");
  bench_cmd->add_option("--kernels", bench.kernels, "kernel library (.so) [$ATTNCHECK_KERNELS]");
  bench_cmd->add_option("--warmup", bench.warmup, "untimed launches")->check(CLI::Range(0, 10000));
  bench_cmd->add_option("--iters", bench.iters, "timed launches")->check(CLI::Range(1, 100000));
  bench_cmd->add_option("--json", bench.json, "output file")->capture_default_str();

  std::vector<std::string> report_args;
  auto* report_cmd = app.add_subcommand(
      "report", "HTML + Markdown report: python3 -m attncheck_report RESULTS_DIR... [options]");
  report_cmd->prefix_command()->allow_extras()->fallthrough(false);
  report_cmd->set_help_flag();  // --help goes to the report tool

  WorkerArgs worker;
  auto* worker_cmd = app.add_subcommand("worker", "");  // internal: runs cases for `run`
  worker_cmd->group("");
  worker_cmd->add_option("--kernels", worker.kernels);
  worker_cmd->add_option("--arch", worker.arch);
  worker_cmd->add_option("--repeat", worker.repeat);
  worker_cmd->add_option("--stress", worker.stress);
  worker_cmd->add_option("--threads", worker.threads);
  worker_cmd->add_option("--repro-dir", worker.repro_dir);
  worker_cmd->add_option("--repro-extra", worker.repro_extra);
  worker_cmd->add_flag("--allow-missing-goldens", worker.allow_missing_goldens);
  worker_cmd->add_option("--import-timeout", worker.import_timeout_s);
  worker_cmd->add_option("--golden-checked", worker.golden_checked);

  KernelsArgs kernels;
  kernels.kernels = env_or("ATTNCHECK_KERNELS", "");
  auto* kernels_cmd = app.add_subcommand(
      "kernels", "list a kernel library's entries against those the ops ask for (no GPU needed)");
  kernels_cmd->add_option("--kernels", kernels.kernels, "kernel library (.so) [$ATTNCHECK_KERNELS]")
      ->required();
  kernels_cmd->add_flag("--check", kernels.check,
                        "exit 1 when an entry the ops ask for is missing");
  kernels_cmd
      ->add_option("--import-timeout", kernels.import_timeout_s,
                   "seconds to load the kernel library (in a process of its own)")
      ->check(finite_in(0.1, 7 * 24 * 3600.0))
      ->capture_default_str();

  LoadLibraryArgs load_library;
  auto* load_library_cmd = app.add_subcommand("load-library", "");  // internal: kernels, repro
  load_library_cmd->group("");
  load_library_cmd->add_option("--kernels", load_library.kernels)->required();
  load_library_cmd->add_flag("--device", load_library.device);
  load_library_cmd->add_option("--import-timeout", load_library.import_timeout_s);

  CoverageArgs coverage;
  auto* coverage_cmd = app.add_subcommand(
      "coverage",
      "audit what a tier passes to the kernels: flags arguments never varied, derived from "
      "others, never at their extremes (docs/coverage.md; no GPU, no reference)");
  coverage_cmd->add_option("--tier", coverage.tier, "smoke, quick, full or bench")
      ->check(CLI::IsMember({"smoke", "quick", "full", "bench"}))
      ->capture_default_str();
  coverage_cmd->add_option("--op", coverage.ops, "only these ops (repeatable)");
  coverage_cmd->add_flag("--json", coverage.json, "the audit as JSON on stdout");
  coverage_cmd->add_option("--out", coverage.out, "also write the audit as JSON to this file");

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
  // case_limits() (run/cases.h) reads it, here and in the workers, which inherit the environment.
  if (max_cases > 0) ::setenv("ATTNCHECK_MAX_CASES", std::to_string(max_cases).c_str(), 1);
  // The limits from the environment, checked once here: a bad value is bad input naming its
  // variable (exit 2), before any command reads it.
  try {
    (void)attncheck::case_limits();
    (void)attncheck::size_limits();
  } catch (const std::exception& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  paths.cases_given = cases_opt->count() > 0;
  paths.golden_given = golden_opt->count() > 0;
  if (!paths.cases_given) paths.cases = (std::filesystem::path(paths.root) / "cases").string();
  if (!paths.golden_given) paths.golden = (std::filesystem::path(paths.root) / "golden").string();

  // The kernel library reads the switch at every launch, in this process and in the workers,
  // which inherit the environment.
  if ((*run_cmd && run.no_smem_poison) || (*repro_cmd && repro.no_smem_poison))
    ::setenv("ATTNCHECK_SMEM_POISON", "off", 1);

  try {
    if (*list_cmd) return cmd_list(paths, list);
    if (*run_cmd) return cmd_run(paths, run);
    if (*mutants_cmd) return cmd_mutants(paths, mutants);
    if (*repro_cmd) return cmd_repro(paths, repro);
    if (*gen_cmd) return cmd_golden_generate(paths, golden);
    if (*verify_cmd) return cmd_golden_verify(paths, golden);
    if (*diff_cmd) return cmd_golden_diff(paths, golden);
    if (*bench_cmd) return cmd_bench(paths, bench);
    if (*report_cmd) return cmd_report(paths, report_cmd->remaining());
    if (*worker_cmd) return cmd_worker(paths, worker);
    if (*kernels_cmd) return cmd_kernels(paths, kernels);
    if (*load_library_cmd) return cmd_load_library(load_library);
    if (*coverage_cmd) return cmd_coverage(paths, coverage);
    if (*shrink_cmd) return cmd_shrink(paths, shrink);
  } catch (const std::exception& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return 2;
  }
  return 2;
}
