// The attncheck binary end to end: list, run on the CPU (reference vs goldens) and with the fake
// kernel library (failures, crashes, hangs, known bugs, results directory), repro bundles read by
// h5py, golden verify on good and corrupted copies, bench, the worker protocol, and clear errors
// with non-zero exits for bad arguments and bad case files.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli_test_support.h"
#include "run/cases.h"
#include "run/worker.h"

namespace {

namespace fs = std::filesystem;
using attncheck::clitest::GoldenSuite;
using attncheck::clitest::has;
using attncheck::clitest::kBin;
using attncheck::clitest::kData;
using attncheck::clitest::kFake;
using attncheck::clitest::Output;
using attncheck::clitest::read;
using attncheck::clitest::sh;

// The run summary's row for `op`: column heading -> count.
std::map<std::string, int> summary_row(const std::string& text, const std::string& op) {
  std::istringstream lines(text);
  std::string line;
  std::vector<std::string> headings;
  std::map<std::string, int> row;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string first;
    words >> first;
    if (first == "op" && headings.empty()) {
      for (std::string w; words >> w;) headings.push_back(w);
    } else if (first == op && !headings.empty()) {
      for (const auto& h : headings) words >> row[h];
      return row;
    }
  }
  return row;
}

// results.jsonl as id -> record.
std::map<std::string, nlohmann::json> results_of(const fs::path& out) {
  std::ifstream in(out / "results.jsonl");
  std::map<std::string, nlohmann::json> m;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    m[j["id"]] = j;
  }
  return m;
}

class Cli : public GoldenSuite<Cli> {
 protected:
  static void SetUpTestSuite() {
    generate_goldens("attncheck_cli_");
    ASSERT_EQ(generated_.status, 0) << generated_.text;
    ASSERT_TRUE(has(generated_.text, "page_indices")) << generated_.text;
    ASSERT_TRUE(has(generated_.text, " 12 cases ")) << generated_.text;
  }
};

TEST_F(Cli, ListShowsIdsTiersAndCounts) {
  const Output o = sh(at() + " list --tier smoke");
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_TRUE(has(o.text, "page_indices/bs16-b5-ctx17-strided-s0  [smoke,quick,full]")) << o.text;
  EXPECT_TRUE(has(o.text, "known bug on fake-cpu: test#1")) << o.text;
  EXPECT_TRUE(has(o.text, "6 cases listed (tier smoke)")) << o.text;
  EXPECT_TRUE(has(o.text, "page_indices                 6      12      12       0")) << o.text;
  // The counts go to stderr: stdout is the ids alone, one per line, for scripts.
  const Output ids = sh(at() + " list --tier smoke 2>/dev/null | grep -vc '^page_indices/'");
  EXPECT_EQ(ids.text, "0\n") << ids.text;
  const Output j = sh(at() + " list --json --filter 'bs64.*strided'");
  EXPECT_EQ(j.status, 0);
  std::istringstream lines(j.text);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    const auto r = nlohmann::json::parse(line);
    EXPECT_EQ(r["op"], "page_indices");
    ++n;
  }
  EXPECT_EQ(n, 2);
}

TEST_F(Cli, RunOnTheCpuChecksTheReferenceAgainstGoldens) {
  const fs::path out = dir("out");
  const Output o = sh(at() + " run --out " + out.string());
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_TRUE(has(o.text, "REFERENCE ONLY, kernels not checked: no kernel library")) << o.text;
  EXPECT_TRUE(has(o.text, "REFERENCE ONLY: kernels not checked for any of the 6 cases")) << o.text;
  const auto row = summary_row(o.text, "page_indices");
  EXPECT_EQ(row.at("passed"), 6) << o.text;
  EXPECT_EQ(row.at("failed"), 0) << o.text;
  EXPECT_EQ(row.at("kernel_run"), 0) << o.text;
  const auto run = nlohmann::json::parse(read(out / "run.json"));
  EXPECT_EQ(run["mode"], "reference");
  EXPECT_EQ(run["backend"], "cpu");
  EXPECT_EQ(run["case_count"], 6);
  EXPECT_EQ(run["golden_manifest_sha256"].get<std::string>().size(), 64u);
  std::istringstream lines(read(out / "results.jsonl"));
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    const auto r = nlohmann::json::parse(line);
    EXPECT_EQ(r["verdict"], "passed") << line;
    EXPECT_EQ(r["failing"], false) << line;
    EXPECT_EQ(r["mode"], "reference");
    EXPECT_EQ(r["expected_from"], "golden");
    ++n;
  }
  EXPECT_EQ(n, 6);
  const std::string junit = read(out / "junit.xml");
  EXPECT_TRUE(has(junit, "<testsuite name=\"page_indices\" tests=\"6\" failures=\"0\"")) << junit;
  EXPECT_TRUE(has(junit, "<property name=\"page_indices.bit_mismatches\" value=\"0\"/>")) << junit;
}

TEST_F(Cli, ShardsPartitionTheTier) {
  std::multiset<std::string> ids;
  for (const char* shard : {"0/2", "1/2"}) {
    const fs::path out = dir(std::string("out") + shard[0]);
    const Output o = sh(at() + " run --shard " + shard + " --out " + out.string());
    EXPECT_EQ(o.status, 0) << o.text;
    EXPECT_TRUE(has(o.text, "3 cases (tier smoke, shard " + std::string(shard) + ")")) << o.text;
    std::istringstream lines(read(out / "results.jsonl"));
    std::string line;
    while (std::getline(lines, line)) ids.insert(nlohmann::json::parse(line)["id"]);
  }
  EXPECT_EQ(ids.size(), 6u);
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), 6u);
}

TEST_F(Cli, RunWithAFakeLibraryReportsEachFailureWithItsRepro) {
  const fs::path out = dir("out");
  const Output o =
      sh("ATTNCHECK_FAKE_FAULT=unwritten ATTNCHECK_FAKE_FAULT_WHEN='{\"kernel_block_size\":1}' " +
         at() + " run --kernels " + kFake + " --out " + out.string());
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_TRUE(has(o.text, "FAIL  page_indices/bs1-b5-ctx17-contiguous-s0")) << o.text;
  EXPECT_TRUE(
      has(o.text,
          "repro: attncheck repro 'page_indices/bs1-b5-ctx17-contiguous-s0' --kernels " + kFake))
      << o.text;
  // bs1 x2 fail; the known-bug case passes: an unexpected pass, reported but not a failure.
  const auto row = summary_row(o.text, "page_indices");
  EXPECT_EQ(row.at("passed"), 3) << o.text;
  EXPECT_EQ(row.at("failed"), 2) << o.text;
  EXPECT_EQ(row.at("xpass"), 1) << o.text;
  EXPECT_EQ(row.at("kernel_run"), 6) << o.text;
  EXPECT_TRUE(fs::exists(out / "repro" / "page_indices__bs1-b5-ctx17-contiguous-s0.h5"));
  EXPECT_FALSE(fs::exists(out / "repro" / "page_indices__bs16-b5-ctx17-strided-s0.h5"));
  const auto run = nlohmann::json::parse(read(out / "run.json"));
  EXPECT_EQ(run["mode"], "kernel");
  EXPECT_EQ(run["arch"], "fake-cpu");
  // The bundle is self-contained and readable with h5py alone.
  const Output py =
      sh("/usr/bin/python3 -c \"import h5py, numpy as np; f = h5py.File('" +
         (out / "repro" / "page_indices__bs1-b5-ctx17-contiguous-s0.h5").string() +
         "', 'r'); e = f['expected/page_indices'][...]; a = f['actual/page_indices'][...]; "
         "print(f.attrs['id'], f.attrs['verdict'], int((e != a).sum()), a[-1], "
         "sorted(f['inputs']))\"");
  EXPECT_EQ(py.status, 0) << py.text;
  EXPECT_TRUE(has(py.text,
                  "page_indices/bs1-b5-ctx17-contiguous-s0 failed 1 -1 ['block_table', "
                  "'cu_seq_lens', 'page_indices', 'seq_lens']"))
      << py.text;
}

// --max-failures N: no case starts once N failed; the cases not started are skipped, saying why,
// in pool and in-process runs alike (mutant runs: the kill is known, the rest would only cost).
TEST_F(Cli, MaxFailuresStopsStartingCases) {
  for (const std::string& how : {std::string(" --jobs 1"), std::string(" --in-process")}) {
    const fs::path out = dir("maxfail" + std::to_string(how.size()));
    const Output o = sh("ATTNCHECK_FAKE_FAULT=unwritten " + at() + " run --kernels " + kFake + how +
                        " --max-failures 1 --out " + out.string());
    EXPECT_EQ(o.status, 1) << o.text;
    int failed = 0, skipped = 0, total = 0;
    std::ifstream in(out / "results.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto r = nlohmann::json::parse(line);
      ++total;
      failed += r["verdict"] == "failed";
      if (r["verdict"] == "skipped") {
        ++skipped;
        EXPECT_TRUE(has(r["message"].get<std::string>(),
                        "not run: the run stopped starting cases after 1 failed (--max-failures)"))
            << line;
      }
    }
    EXPECT_EQ(failed, 1) << how << "\n" << o.text;
    EXPECT_GT(skipped, 0) << how << "\n" << o.text;
    // one case failed, and only the cases that were running then may have ended otherwise
    EXPECT_LE(total - failed - skipped, how == " --in-process" ? 0 : 1) << how << "\n" << o.text;
  }
}

TEST_F(Cli, CrashesAndHangsFailOnlyTheirCase) {
  auto expect_row = [](const std::string& text, int passed, int failed, int known_bug, int xpass) {
    const auto row = summary_row(text, "page_indices");
    EXPECT_EQ(row.at("passed"), passed) << text;
    EXPECT_EQ(row.at("failed"), failed) << text;
    EXPECT_EQ(row.at("known_bug"), known_bug) << text;
    EXPECT_EQ(row.at("xpass"), xpass) << text;
  };
  Output o =
      sh("ATTNCHECK_FAKE_FAULT=segfault ATTNCHECK_FAKE_FAULT_WHEN='{\"kernel_block_size\":16}' " +
         at() + " run --kernels " + kFake);
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_TRUE(
      has(o.text,
          "FAIL  page_indices/bs16-b5-ctx17-strided-s0\n      worker process died with SIGSEGV"))
      << o.text;
  expect_row(o.text, 3, 2, 0, 1);

  o = sh("ATTNCHECK_FAKE_FAULT=abort ATTNCHECK_FAKE_FAULT_WHEN='{\"kernel_block_size\":1}' " +
         at() + " run --kernels " + kFake + " --jobs 2");
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_TRUE(has(o.text, "worker process died with SIGABRT")) << o.text;
  expect_row(o.text, 3, 2, 0, 1);

  o = sh("ATTNCHECK_FAKE_FAULT=hang ATTNCHECK_FAKE_FAULT_WHEN='{\"kernel_block_size\":64}' " +
         at() + " run --kernels " + kFake + " --timeout 1");
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_TRUE(has(o.text, "timed out after 1 s")) << o.text;
  // The known-bug case (bs64 ... strided, arch fake-cpu) hangs too: it is a known bug, not a
  // failure.
  expect_row(o.text, 4, 1, 1, 0);
}

// Regression: after a kernel error the worker exited, but the parent had already handed it the next
// case, which was reported "worker process died with exit status 0". A device error fails its own
// case only; the worker retires and the next case runs in a fresh one.
TEST_F(Cli, KernelErrorFailsOnlyItsOwnCase) {
  const fs::path err = dir("err");
  const Output o =
      sh("ATTNCHECK_FAKE_FAULT=error ATTNCHECK_FAKE_FAULT_WHEN='{\"kernel_block_size\":1}' " +
         at() + " run --kernels " + kFake + " --out " + err.string());
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_FALSE(has(o.text, "worker process died")) << o.text;
  for (const auto& [id, r] : results_of(err)) {
    const bool bs1 = has(id, "/bs1-");
    EXPECT_EQ(r["failing"], bs1) << id << ": " << r["message"];
    if (bs1) {
      EXPECT_TRUE(has(r["message"], "kernel error: fake kernel error (injected)")) << r;
      EXPECT_EQ(r["device_error"], true) << r;
    } else {
      EXPECT_EQ(r["mode"], "kernel") << r;
    }
  }
  EXPECT_EQ(results_of(err).size(), 6u);
  EXPECT_EQ(read(err / "worker.log"), "");
  // A host-side exception in the entry is the kernel's failure, and no reason to replace the
  // worker.
  const fs::path host = dir("host");
  const Output h =
      sh("ATTNCHECK_FAKE_FAULT=host_error ATTNCHECK_FAKE_FAULT_WHEN='{\"kernel_block_size\":1}' " +
         at() + " run --kernels " + kFake + " --out " + host.string());
  EXPECT_EQ(h.status, 1) << h.text;
  for (const auto& [id, r] : results_of(host)) {
    EXPECT_EQ(r["failing"], has(id, "/bs1-")) << id;
    EXPECT_FALSE(r.contains("device_error")) << r;
  }
}

TEST_F(Cli, KnownBugsFollowTheArch) {
  Output o = sh("ATTNCHECK_FAKE_FAULT=nondeterministic " + at() + " run --kernels " + kFake +
                " --filter bs64-b5-ctx130-strided");
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_EQ(summary_row(o.text, "page_indices").at("known_bug"), 1) << o.text;
  o = sh(at() + " run --kernels " + kFake + " --filter bs64-b5-ctx130-strided");
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_EQ(summary_row(o.text, "page_indices").at("xpass"), 1) << o.text;
  o = sh("ATTNCHECK_FAKE_FAULT=nondeterministic " + at() + " run --kernels " + kFake +
         " --filter bs64-b5-ctx130-strided --arch gfx950");
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_TRUE(has(o.text, "not deterministic")) << o.text;
}

// --sanitizer: each case in a worker of its own under the sanitizer (here a stand-in script that
// writes compute-sanitizer's log format only when its process ends); a finding fails exactly the
// case whose worker reported it, with the report's first finding line.
TEST_F(Cli, SanitizerFindingsFailTheirCase) {
  const fs::path d = dir("san");
  fs::create_directories(d);
  const fs::path tool = d / "compute-sanitizer";
  {
    std::ofstream f(tool);
    f << "#!/bin/sh\n"
         "log=$4; shift 6\n"
         "echo '========= COMPUTE-SANITIZER' > \"$log\"\n"
         "\"$@\"; rc=$?\n"
         "case \"$log\" in *worker-0.*) echo '========= Invalid __global__ read of size 4 bytes' "
         ">> \"$log\";; esac\n"
         "echo '========= ERROR SUMMARY: 0 errors' >> \"$log\"\n"
         "exit $rc\n";
  }
  fs::permissions(tool, fs::perms::owner_all);
  const Output o =
      sh("ATTNCHECK_COMPUTE_SANITIZER=" + tool.string() + " " + at() + " run --kernels " + kFake +
         " --sanitizer memcheck --jobs 2 --out " + (d / "out").string());
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_TRUE(has(o.text,
                  "compute-sanitizer memcheck: 1 finding(s); first: Invalid __global__ "
                  "read of size 4 bytes"))
      << o.text;
  int failing = 0;
  for (const auto& [id, r] : results_of(d / "out")) failing += r["failing"].get<bool>();
  EXPECT_EQ(failing, 1);
  EXPECT_TRUE(fs::exists(d / "out" / "sanitizer" / "worker-0.memcheck.log"));
  EXPECT_TRUE(fs::exists(d / "out" / "sanitizer" / "worker-5.memcheck.log"));  // one per case
  const Output missing = sh("ATTNCHECK_COMPUTE_SANITIZER= PATH=/nonexistent " + at() +
                            " run --kernels " + kFake + " --sanitizer racecheck");
  EXPECT_EQ(missing.status, 2) << missing.text;
}

// --stress N: every case N more times; the summary names the cases with differing launches.
TEST_F(Cli, StressReportsTheNondeterminismRate) {
  const Output o = sh("ATTNCHECK_FAKE_FAULT=nondeterministic " + at() + " run --kernels " + kFake +
                      " --repeat 1 --stress 4 --filter bs16-b5-ctx17-strided --arch gfx950");
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_TRUE(has(o.text, "stress: 1 case(s) x 4 launches; 1 with differing or failing launches"))
      << o.text;
  EXPECT_TRUE(has(o.text, "2 of 4 launches differ (rate 0.5)")) << o.text;
  // run.json records the stress count and the shared-memory poison switch.
  const fs::path out = dir("out");
  const Output plain = sh(at() + " run --kernels " + kFake + " --stress 3 --no-smem-poison " +
                          "--filter bs16-b5-ctx17-strided --out " + out.string());
  EXPECT_EQ(plain.status, 0) << plain.text;
  std::ifstream f(out / "run.json");
  const auto run = nlohmann::json::parse(f);
  EXPECT_EQ(run["stress"], 3);
  EXPECT_EQ(run["smem_poison"], false);
  EXPECT_EQ(run["sanitizer"], "");
}

TEST_F(Cli, ReproPrintsBudgetsWorstElementsAndWritesABundle) {
  const fs::path bundle = dir("bundle.h5");
  const Output o = sh("ATTNCHECK_FAKE_FAULT=unwritten " + at() +
                      " repro page_indices/bs16-b5-ctx130-contiguous-s0 --kernels " + kFake +
                      " --bundle " + bundle.string());
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_TRUE(has(o.text,
                  "params   "
                  "{\"batch\":5,\"block_ids\":\"low\",\"block_size\":16,\"max_ctx\":130,\"seed\":0,"
                  "\"storage_offset\":false,\"table\":\"contiguous\"}"))
      << o.text;
  EXPECT_TRUE(has(o.text, "check page_indices: FAILED\n  budget   bitwise")) << o.text;
  EXPECT_TRUE(has(o.text, "worst elements (index: expected, actual, |err|, err/allowed):"))
      << o.text;
  EXPECT_TRUE(has(o.text, "were never written")) << o.text;
  EXPECT_TRUE(has(o.text, "bundle   " + bundle.string())) << o.text;
  EXPECT_TRUE(has(
      o.text,
      "rerun    attncheck repro 'page_indices/bs16-b5-ctx130-contiguous-s0' --kernels " + kFake))
      << o.text;
  const Output py =
      sh("/usr/bin/python3 -c \"import h5py, json; f = h5py.File('" + bundle.string() +
         "', 'r'); print(json.loads(f.attrs['params'])['block_size'], "
         "json.loads(f.attrs['checks'])[0]['passed'], f['inputs/block_table'].shape)\"");
  EXPECT_EQ(py.status, 0) << py.text;
  EXPECT_TRUE(has(py.text, "16 False (5, 10)")) << py.text;

  const Output cpu =
      sh(at() + " repro page_indices/bs16-b5-ctx130-contiguous-s0 --bundle " + bundle.string());
  EXPECT_EQ(cpu.status, 0) << cpu.text;
  EXPECT_TRUE(has(cpu.text, "mode     reference (expected from the golden)")) << cpu.text;
  EXPECT_TRUE(has(cpu.text, "kernel not checked: no kernel library")) << cpu.text;
  EXPECT_TRUE(has(cpu.text, "kernels  REFERENCE ONLY, kernels not checked")) << cpu.text;

  const Output missing = sh(at() + " repro page_indices/bs16-b5-ctx131-contiguous-s0");
  EXPECT_EQ(missing.status, 2) << missing.text;
  EXPECT_TRUE(
      has(missing.text, "no case 'page_indices/bs16-b5-ctx131-contiguous-s0' in " + kData +
                            "/cases; nearest:\n  page_indices/bs16-b5-ctx130-contiguous-s0"))
      << missing.text;
  // Nearest by edit distance, not by common prefix: a typo early in the id still finds it.
  const Output typo = sh(at() + " repro page_indces/bs16-b5-ctx130-contiguous-s0");
  EXPECT_EQ(typo.status, 2) << typo.text;
  EXPECT_TRUE(has(typo.text, "nearest:\n  page_indices/bs16-b5-ctx130-contiguous-s0")) << typo.text;
}

TEST_F(Cli, GoldenVerifyPassesAndFailsOnACorruptedCopy) {
  Output o = sh(at() + " golden verify");
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_TRUE(has(o.text, "ok   page_indices")) << o.text;
  EXPECT_TRUE(has(o.text, " 12/12 cases verified")) << o.text;
  const fs::path copy = dir("golden");
  fs::copy(golden_, copy, fs::copy_options::recursive);
  const fs::path file = copy / "page_indices.h5";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(file) - 100));
    f.put('\x5a');
  }
  o = sh(kBin + " --cases " + kData + "/cases --golden " + copy.string() + " golden verify");
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_TRUE(has(o.text, "FAIL " + file.string() + ": sha256 ")) << o.text;
  EXPECT_TRUE(has(o.text, "does not match MANIFEST")) << o.text;
  fs::resize_file(file, 1000);
  o = sh(kBin + " --cases " + kData + "/cases --golden " + copy.string() + " golden verify");
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_TRUE(has(o.text, file.string() + ": 1000 bytes, MANIFEST says")) << o.text;
  // A file that does not match MANIFEST is never parsed (docs/goldens.md).
  EXPECT_TRUE(has(o.text, "not parsed: the file does not match MANIFEST")) << o.text;
  // A run against a corrupt golden is an error for each case, naming the file.
  o = sh(kBin + " --cases " + kData + "/cases --golden " + copy.string() + " run");
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_TRUE(has(o.text, "not run: " + file.string() + ": not read: 1000 bytes")) << o.text;

  o = sh(at() + " golden diff");
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_TRUE(has(o.text, "0 case(s) differ")) << o.text;
}

// A pool checks the golden files while its workers start (PoolCallbacks::before_dispatch): the
// cases of a corrupt file are not sent, and get the verdict they get in process, once each.
TEST_F(Cli, APoolSetsAsideTheCasesOfACorruptGoldenAsInProcess) {
  const fs::path copy = dir("golden");
  fs::copy(golden_, copy, fs::copy_options::recursive);
  const fs::path file = copy / "page_indices.h5";
  fs::resize_file(file, 1000);
  std::map<std::string, std::map<std::string, std::string>> got;  // mode -> id -> message
  for (const std::string mode : {"--jobs 2", "--jobs 2 --threads-per-worker 2", "--in-process"}) {
    const fs::path out = dir("out" + std::to_string(got.size()));
    const Output o =
        sh(kBin + " --cases " + kData + "/cases --golden " + copy.string() +
           " run --tier smoke --kernels " + kFake + " " + mode + " --out " + out.string());
    EXPECT_EQ(o.status, 1) << mode << "\n" << o.text;
    std::istringstream lines(read(out / "results.jsonl"));
    auto& mine = got[mode];
    for (std::string line; std::getline(lines, line);) {
      const auto r = nlohmann::json::parse(line);
      EXPECT_EQ(mine.count(r["id"]), 0u) << "recorded twice: " << r["id"];
      EXPECT_EQ(r["verdict"], "error") << line;
      EXPECT_EQ(r["mode"], "none") << line;
      mine[r["id"]] = r["message"];
    }
    EXPECT_FALSE(mine.empty()) << mode << "\n" << o.text;
    for (const auto& [id, message] : mine)
      EXPECT_TRUE(has(message, "not run: " + file.string() + ": not read: 1000 bytes")) << message;
  }
  EXPECT_EQ(got["--jobs 2"], got["--in-process"]);
  EXPECT_EQ(got["--jobs 2 --threads-per-worker 2"], got["--in-process"]);
}

TEST_F(Cli, BenchTimesEveryCaseAgainstTheRoofline) {
  const fs::path json = dir("bench.json");
  const Output o =
      sh(at() + " bench --tier smoke --kernels " + kFake + " --iters 2 --json " + json.string());
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_TRUE(has(o.text, "roofline: copy ")) << o.text;
  const auto b = nlohmann::json::parse(read(json));
  EXPECT_GT(b["roofline"]["copy_gbps"].get<double>(), 0);
  ASSERT_EQ(b["cases"].size(), 6u);
  for (const auto& c : b["cases"]) {
    EXPECT_GT(c["time_ms"].get<double>(), 0) << c.dump();
    EXPECT_GT(c["gbps"].get<double>(), 0) << c.dump();
    EXPECT_GT(c["roofline_fraction"].get<double>(), 0) << c.dump();
  }
  const Output none = sh(at() + " bench");
  EXPECT_EQ(none.status, 2);
  EXPECT_TRUE(has(none.text, "bench needs a kernel library")) << none.text;
  const Output nodev = sh("ATTNCHECK_FAKE_NO_DEVICE=1 " + at() + " bench --kernels " + kFake);
  EXPECT_EQ(nodev.status, 2);
  EXPECT_TRUE(has(nodev.text, "bench needs a GPU: fake library: no device")) << nodev.text;
}

// Regression: an explicit --kernels on a machine without a usable GPU exited 0 ("KERNEL CHECKS
// SKIPPED"). Asking for kernels and getting none is an error, said once.
TEST_F(Cli, ExplicitKernelsWithoutAGpuIsAnError) {
  for (const char* mode : {"", " --in-process"}) {
    const Output o = sh("{ ATTNCHECK_FAKE_NO_DEVICE=1 " + at() + " run --kernels " + kFake + mode +
                        " 2>&1 >/dev/null; }");  // stderr alone
    EXPECT_EQ(o.status, 2) << o.text;
    EXPECT_EQ(o.text,
              "attncheck: --kernels " + kFake +
                  ": no usable GPU (fake library: no device (ATTNCHECK_FAKE_NO_DEVICE=1))\n")
        << mode;
  }
}

// Regression: a mistyped --golden or a deleted golden file ran with nothing compared and exit 0.
TEST_F(Cli, MissingGoldensAreErrorsUnlessAskedFor) {
  Output o = sh(kBin + " --cases " + kData + "/cases --golden /nonexistent/golden run");
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "golden directory '/nonexistent/golden' does not exist")) << o.text;

  const fs::path copy = dir("golden");
  fs::copy(golden_, copy, fs::copy_options::recursive);
  fs::remove(copy / "page_indices.h5");
  const fs::path out = dir("out");
  o = sh(kBin + " --cases " + kData + "/cases --golden " + copy.string() + " run --out " +
         out.string());
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "golden file '" + (copy / "page_indices.h5").string() +
                              "' does not exist (6 smoke/quick cases of page_indices"))
      << o.text;

  o = sh(kBin + " --cases " + kData + "/cases --golden /nonexistent/golden run " +
         "--allow-missing-goldens --out " + out.string());
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_EQ(summary_row(o.text, "page_indices").at("skipped"), 6) << o.text;
  EXPECT_TRUE(has(o.text, "NOTHING COMPARED")) << o.text;
  for (const auto& [id, r] : results_of(out)) EXPECT_EQ(r["mode"], "none") << id;
}

// `attncheck kernels`: a library's entries against those the ops ask for, without a GPU.
TEST_F(Cli, KernelsListsEntriesAndChecksThem) {
  Output o = sh("ATTNCHECK_FAKE_NO_DEVICE=1 " + kBin + " kernels --check --kernels " + kFake);
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_TRUE(has(o.text, "ok      rope_inplace               op rope")) << o.text;
  EXPECT_TRUE(has(o.text, "every entry the ops ask for is present")) << o.text;
  o = sh("ATTNCHECK_FAKE_OMIT=rope_out_of_place " + kBin + " kernels --check --kernels " + kFake);
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_TRUE(has(o.text, "MISSING rope_out_of_place          op rope")) << o.text;
}

// The worker's config is one JSON object (run/worker.h); a malformed one is refused naming the
// field, on stderr and as the fatal line a pool reports.
TEST_F(Cli, WorkerRefusesAMalformedConfigNamingTheField) {
  const Output o = sh(kBin + " worker --config '{\"repeat\": \"two\"}' < /dev/null");
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(
      has(o.text, "{\"fatal\":\"worker --config: worker config: 'repeat' has the wrong type\"}"))
      << o.text;
  const Output unknown = sh(kBin + " worker --config '{\"kernel\": \"x.so\"}' < /dev/null");
  EXPECT_EQ(unknown.status, 2) << unknown.text;
  EXPECT_TRUE(has(unknown.text, "unknown field 'kernel'")) << unknown.text;
  const Output other = sh(kBin + " worker --kernels a.so --config '{\"kernels\": \"b.so\"}'");
  EXPECT_EQ(other.status, 2) << other.text;
  EXPECT_TRUE(has(other.text, "--kernels 'a.so' is not the config's kernels 'b.so'")) << other.text;
}

// The worker gets whole Cases (it reads no case file: --cases points nowhere) and answers each
// request with its seq and id.
TEST_F(Cli, WorkerSpeaksOneJsonLinePerCase) {
  const auto files = attncheck::load_case_dir(kData + "/cases");
  const auto c = attncheck::find_case(files, "page_indices/bs1-b5-ctx17-contiguous-s0");
  ASSERT_TRUE(c);
  const fs::path requests = dir("requests.jsonl");
  {
    std::ofstream out(requests);
    out << nlohmann::json{{"seq", 7}, {"id", c->id}, {"case", attncheck::case_to_json(*c)}}.dump()
        << "\n"
        << nlohmann::json{{"seq", 8}, {"id", "nope/x"}, {"case", {{"op", "nope"}}}}.dump() << "\n";
  }
  attncheck::WorkerConfig cfg;
  cfg.golden_dir = golden_;
  cfg.kernels = kFake;
  const Output o = sh(kBin + " --cases " + dir("no_cases").string() + " worker --config '" +
                      cfg.to_json().dump() + "' < " + requests.string());
  EXPECT_EQ(o.status, 0) << o.text;
  std::istringstream lines(o.text);
  std::string hello, first, second;
  std::getline(lines, hello);
  std::getline(lines, first);
  std::getline(lines, second);
  EXPECT_EQ(nlohmann::json::parse(hello)["hello"]["arch"], "fake-cpu") << o.text;
  const auto a = nlohmann::json::parse(first), b = nlohmann::json::parse(second);
  EXPECT_EQ(a["seq"], 7) << o.text;
  EXPECT_EQ(a["id"], c->id) << o.text;
  EXPECT_EQ(a["result"]["id"], c->id) << o.text;
  EXPECT_EQ(a["result"]["verdict"], "passed") << o.text;
  EXPECT_EQ(a["retire"], false) << o.text;
  EXPECT_EQ(b["seq"], 8) << o.text;
  EXPECT_EQ(b["result"]["id"], "nope/x") << o.text;
  EXPECT_EQ(b["result"]["verdict"], "error") << o.text;
  EXPECT_TRUE(has(second, "the worker could not read the request: case JSON: 'params'")) << o.text;
}

TEST_F(Cli, BadArgumentsAndBadCaseFilesFailClearly) {
  struct Bad {
    std::string args;
    int status;
    std::string expect;
  };
  const std::vector<Bad> bad = {
      {" run --tier nightly", 105, "--tier: nightly not in {smoke,quick,full,bench,all}"},
      {" run --shard 3/2", 2, "shard '3/2': need 0 <= i < n"},
      {" run --op mla_decodee", 2, "unknown op 'mla_decodee' (registered: "},
      {" run --filter 'h(1'", 2, "bad --filter regex 'h(1'"},
      {" run --filter nothing-matches-this", 2,
       "no case matches (tier smoke, filter 'nothing-matches-this'"},
      {" run --kernels /nonexistent/lib.so", 2,
       "kernel library '/nonexistent/lib.so' does not exist"},
      {" run --repeat 0", 105, "--repeat: Value 0 not in range"},
      {" run --bogus", 109, "The following argument was not expected: --bogus"},
      {" frobnicate", 2,
       "unknown command 'frobnicate' (commands: list, run, repro, shrink, golden, bench, kernels, "
       "coverage, report)"},
      {"", 106, "A subcommand is required"},
      {" golden verify --op nope", 2, "unknown op 'nope'"},
      {" repro", 106, "id is required"},
  };
  for (const auto& b : bad) {
    const Output o = sh(at() + b.args);
    EXPECT_EQ(o.status, b.status) << b.args << "\n" << o.text;
    EXPECT_TRUE(has(o.text, b.expect)) << b.args << ": lacks \"" << b.expect << "\"\n" << o.text;
  }
  // Not a shared library: the workers cannot start, and the run says why.
  const fs::path junk = dir("junk.so");
  std::ofstream(junk) << "not a library";
  const Output lib = sh(at() + " run --kernels " + junk.string());
  EXPECT_EQ(lib.status, 2) << lib.text;
  EXPECT_TRUE(has(lib.text, "cannot load kernel library '" + junk.string() + "'")) << lib.text;
  // A malformed case file: every command that reads cases says where.
  const fs::path cases = dir("cases");
  fs::create_directories(cases);
  std::ofstream(cases / "page_indices.toml")
      << "op = \"page_indices\"\n[[group]]\nname = \"g\"\n"
         "tiers = { smoke = \"pairwise\" }\naxes = { block_size = [1, 2] }\n";
  for (const std::string cmd : {" list", " run", " golden verify"}) {
    const Output o = sh(kBin + " --cases " + cases.string() + cmd);
    EXPECT_EQ(o.status, 2) << cmd << "\n" << o.text;
    EXPECT_TRUE(
        has(o.text, "attncheck: bad case file: " + (cases / "page_indices.toml").string() +
                        ":5:27: group 'g' axis 'block_size': page_indices: axis 'block_size' "
                        "value 2 is not one of 1, 16, 64"))
        << cmd << "\n"
        << o.text;
  }
}

// The package is part of the repository: if it is not where `attncheck report` looks, that is a
// failure here, not a skip that would let the command break unnoticed.
TEST_F(Cli, ReportRunsTheDebianPythonPackage) {
  const fs::path package = fs::path(kData).parent_path().parent_path().parent_path() / "report" /
                           "attncheck_report" / "__main__.py";
  ASSERT_TRUE(fs::exists(package)) << package << " is missing";
  const fs::path out = dir("results"), rep = dir("report");
  ASSERT_EQ(sh(at() + " run --out " + out.string()).status, 0);
  const Output o = sh(at() + " report " + out.string() + " --out " + rep.string());
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_TRUE(fs::exists(rep / "report.html")) << o.text;
  EXPECT_TRUE(fs::exists(rep / "summary.md")) << o.text;
}

}  // namespace

// Worker pools per GPU (--gpus, --jobs-per-gpu): each pool's workers get their GPU through the
// environment; run.json records the pools and the seconds per phase, every result its phases;
// --profile prints them; a durations file with a bad field stops the run naming it.
TEST_F(Cli, PoolsPerGpuProfileAndDurations) {
  const fs::path d = dir("pools");
  fs::create_directories(d);
  const Output o =
      sh("env -u CUDA_VISIBLE_DEVICES -u HIP_VISIBLE_DEVICES " + at() + " run --kernels " + kFake +
         " --gpus 0,1 --jobs-per-gpu 2 --profile --out " + (d / "out").string());
  EXPECT_NE(o.status, 2) << o.text;
  // A GPU's cases run in threads of one worker process (the fake declares any_thread).
  EXPECT_TRUE(has(o.text,
                  "pools: GPU 0: 2, GPU 1: 2 case(s) at once (CUDA_VISIBLE_DEVICES) in 2 "
                  "worker process(es) of 2 threads"))
      << o.text;
  EXPECT_TRUE(has(o.text, "\nprofile: ")) << o.text;
  EXPECT_TRUE(has(o.text, "pools ended within")) << o.text;
  const auto run = nlohmann::json::parse(read(d / "out" / "run.json"));
  EXPECT_EQ(run["jobs"], 4);
  EXPECT_EQ(run["workers"], 2);
  EXPECT_EQ(run["threads_per_worker"], 2);
  ASSERT_EQ(run["pools"].size(), 2u);
  const auto results = results_of(d / "out");
  EXPECT_EQ(run["pools"][0]["cases"].get<int>() + run["pools"][1]["cases"].get<int>(),
            static_cast<int>(results.size()));
  EXPECT_TRUE(run["timings_s"].contains("upload")) << run.dump();
  int launched = 0;
  for (const auto& [id, r] : results)
    if (r.value("launches", 0) > 0) {
      ++launched;
      EXPECT_TRUE(r["timings_ms"].contains("kernel")) << r.dump();
      // The launch lock's hold, inside the device phases and not one of them.
      const auto& t = r["timings_ms"];
      const double device_ms = t.value("upload", 0.0) + t.value("kernel", 0.0) +
                               t.value("relaunch", 0.0) + t.value("download", 0.0);
      EXPECT_GT(r.value("locked_ms", 0.0), 0.0) << r.dump();
      EXPECT_LE(r.value("locked_ms", 0.0), device_ms + 1.0) << r.dump();  // + the case context
      EXPECT_FALSE(t.contains("locked")) << r.dump();
    }
  EXPECT_GT(launched, 0);
  EXPECT_TRUE(has(o.text, "% of the wall in each of 2 worker process(es)")) << o.text;
  EXPECT_TRUE(has(o.text, "worker processes started: 2 (0 beyond the first 2), ")) << o.text;
  EXPECT_EQ(run["pools"][0]["worker_starts"], 1) << run.dump();
  EXPECT_EQ(run["pools"][1]["worker_starts"], 1) << run.dump();

  std::ofstream(d / "durations.json") << R"({"cases": {"page_indices/x": -1}})";
  const Output bad = sh(at() + " run --kernels " + kFake + " --durations " +
                        (d / "durations.json").string() + " --shard 0/2");
  EXPECT_EQ(bad.status, 2) << bad.text;
  EXPECT_TRUE(has(bad.text, "--durations: ")) << bad.text;
  EXPECT_TRUE(has(bad.text, "cases.\"page_indices/x\"")) << bad.text;
}
