// `attncheck mutants` with copies of the fake library whose file names inject a fault each
// (libattncheck_kernels_mutant_<fault>.so, harness/run/tests/fake_plugin.cpp): several libraries
// in one worker process give each library the verdicts it gets in a run of its own, and what one
// library does (failures, a crash, a library that cannot load) touches no other's results.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_support.h"

namespace {

namespace fs = std::filesystem;
using attncheck::clitest::GoldenSuite;
using attncheck::clitest::has;
using attncheck::clitest::kFake;
using attncheck::clitest::Output;
using attncheck::clitest::read;
using attncheck::clitest::sh;

class MutantsCli : public GoldenSuite<MutantsCli> {
 protected:
  static void SetUpTestSuite() {
    generate_goldens("attncheck_mutants_");
    ASSERT_EQ(generated_.status, 0) << generated_.text;
    for (const char* fault : {"past_view", "unwritten", "segfault"})
      fs::copy_file(kFake, library(std::string("libattncheck_kernels_mutant_") + fault),
                    fs::copy_options::overwrite_existing);
    fs::copy_file(kFake, library("libclean"), fs::copy_options::overwrite_existing);
    std::ofstream(library("libattncheck_kernels_mutant_broken")) << "not a shared library\n";
  }
  static std::string library(const std::string& stem) { return (tmp_ / (stem + ".so")).string(); }
  static std::string mutant(const std::string& fault) {
    return library("libattncheck_kernels_mutant_" + fault);
  }
  // id -> verdict of a results directory.
  static std::map<std::string, std::string> verdicts(const fs::path& out) {
    std::map<std::string, std::string> v;
    std::ifstream in(out / "results.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto r = nlohmann::json::parse(line);
      EXPECT_EQ(v.count(r["id"]), 0u) << "answered twice: " << r["id"];
      v[r["id"]] = r["verdict"];
    }
    return v;
  }
  static std::map<std::string, int> counts(const std::map<std::string, std::string>& v) {
    std::map<std::string, int> c;
    for (const auto& [id, verdict] : v) ++c[verdict];
    return c;
  }
  static std::string threaded() { return " --jobs 3 --threads-per-worker 3"; }
};

TEST_F(MutantsCli, EachLibraryGetsTheVerdictsOfARunOfItsOwn) {
  const fs::path out = dir("out");
  const Output o = sh(at() + " mutants --tier smoke --library " + mutant("past_view") +
                      " --library " + mutant("unwritten") + " --library " + library("libclean") +
                      threaded() + " --out " + out.string());
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_TRUE(has(o.text, "in 1 worker process(es) of 3 threads")) << o.text;
  for (const std::string name : {"past_view", "unwritten", "libclean"}) {
    const fs::path alone = dir("alone_" + name);
    const std::string lib = name == "libclean" ? library(name) : mutant(name);
    sh(at() + " run --tier smoke --kernels " + lib + " --jobs 1 --out " + alone.string());
    const auto mine = verdicts(out / name);
    EXPECT_EQ(mine.size(), 6u) << name << "\n" << o.text;
    EXPECT_EQ(mine, verdicts(alone)) << name << "\n" << o.text;
    const auto run = nlohmann::json::parse(read(out / name / "run.json"));
    EXPECT_EQ(run["case_count"], 6) << run;
    EXPECT_EQ(run["mode"], "kernel") << run;
    EXPECT_TRUE(has(run["kernels_library"].get<std::string>(), fs::path(lib).filename().string()))
        << run;
    EXPECT_TRUE(fs::exists(out / name / "junit.xml"));
    // The pools are the run's, shared by the libraries: every library's cases went through them.
    ASSERT_EQ(run["pools"].size(), 1u) << run;
    EXPECT_EQ(run["pools"][0]["cases"], 18) << run;
  }
  // The faults fail the case everywhere but where the case is marked a known bug.
  EXPECT_EQ(counts(verdicts(out / "past_view"))["failed"], 5) << o.text;
  EXPECT_EQ(counts(verdicts(out / "unwritten"))["failed"], 5) << o.text;
  EXPECT_EQ(counts(verdicts(out / "libclean"))["passed"], 5) << o.text;
}

TEST_F(MutantsCli, MaxFailuresStopsOnlyTheLibraryThatFailed) {
  const fs::path out = dir("out");
  const Output o =
      sh(at() + " mutants --tier smoke --library " + mutant("unwritten") + " --library " +
         library("libclean") + " --max-failures 1 --jobs 1 --out " + out.string());
  EXPECT_EQ(o.status, 0) << o.text;
  const auto unwritten = counts(verdicts(out / "unwritten"));
  EXPECT_EQ(unwritten.at("failed"), 1) << o.text;
  EXPECT_EQ(unwritten.at("skipped"), 5) << o.text;
  const auto clean = verdicts(out / "libclean");
  EXPECT_EQ(clean.size(), 6u);
  EXPECT_EQ(counts(clean)["skipped"], 0) << o.text;
}

TEST_F(MutantsCli, ACrashingLibraryFailsOnlyItsOwnCases) {
  const fs::path out = dir("out");
  const Output o = sh(at() + " mutants --tier smoke --library " + library("libclean") +
                      " --library " + mutant("segfault") + threaded() + " --out " + out.string());
  EXPECT_EQ(o.status, 0) << o.text;
  const auto clean = counts(verdicts(out / "libclean"));
  EXPECT_EQ(clean.at("passed"), 5) << o.text;
  const auto crashed = verdicts(out / "segfault");
  EXPECT_EQ(crashed.size(), 6u) << o.text;
  EXPECT_EQ(counts(crashed)["passed"], 0) << o.text;
  EXPECT_TRUE(has(read(out / "segfault" / "results.jsonl"), "SIGSEGV")) << o.text;
}

TEST_F(MutantsCli, ALibraryThatCannotLoadIsAnErrorOfItsOwnCases) {
  const fs::path out = dir("out");
  const Output o = sh(at() + " mutants --tier smoke --library " + library("libclean") +
                      " --library " + mutant("broken") + threaded() + " --out " + out.string());
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_EQ(counts(verdicts(out / "libclean")).at("passed"), 5) << o.text;
  const auto broken = verdicts(out / "broken");
  EXPECT_EQ(counts(broken)["error"], 6) << o.text;
  EXPECT_TRUE(has(read(out / "broken" / "results.jsonl"), mutant("broken"))) << o.text;
}

// The first library is the workers' own: when they cannot start on it, its cases fail and the
// run goes on with the next.
TEST_F(MutantsCli, AFirstLibraryThatCannotLoadHidesNoOther) {
  const fs::path out = dir("out");
  const Output o = sh(at() + " mutants --tier smoke --library " + mutant("broken") + " --library " +
                      library("libclean") + threaded() + " --out " + out.string());
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_TRUE(has(o.text, "broken: the workers could not start on it")) << o.text;
  const auto broken = verdicts(out / "broken");
  EXPECT_EQ(counts(broken)["error"], 6) << o.text;
  EXPECT_TRUE(has(read(out / "broken" / "results.jsonl"), "the workers could not start")) << o.text;
  EXPECT_EQ(counts(verdicts(out / "libclean")).at("passed"), 5) << o.text;
}

// --first puts a library's matching cases ahead of its others: with --max-failures 1 the one
// case a failing library runs is the one --first names, not its first in the usual order.
TEST_F(MutantsCli, FirstSendsALibrarysMatchingCasesFirst) {
  const fs::path all = dir("all");
  sh(at() + " mutants --tier smoke --library " + mutant("unwritten") + " --jobs 1 --out " +
     all.string());
  std::vector<std::string> failed;
  for (const auto& [id, verdict] : verdicts(all / "unwritten"))
    if (verdict == "failed") failed.push_back(id);
  ASSERT_GE(failed.size(), 2u);
  const fs::path usual = dir("usual");
  sh(at() + " mutants --tier smoke --library " + mutant("unwritten") +
     " --max-failures 1 --jobs 1 --out " + usual.string());
  std::string usual_failed;
  for (const auto& [id, verdict] : verdicts(usual / "unwritten"))
    if (verdict == "failed") usual_failed = id;
  // A failing case other than the one the usual order reaches first, matched exactly.
  const std::string chosen = failed.front() == usual_failed ? failed.back() : failed.front();
  std::string exact = "^";
  for (char ch : chosen) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) exact += '\\';
    exact += ch;
  }
  exact += "$";
  const fs::path out = dir("out");
  const Output o = sh(at() + " mutants --tier smoke --library " + mutant("unwritten") +
                      " --library " + library("libclean") + " --first 'unwritten=" + exact +
                      "' --max-failures 1 --jobs 1 --out " + out.string());
  EXPECT_EQ(o.status, 0) << o.text;
  const auto mine = verdicts(out / "unwritten");
  EXPECT_EQ(counts(mine)["failed"], 1) << o.text;
  EXPECT_EQ(mine.at(chosen), "failed") << o.text;
  EXPECT_EQ(counts(verdicts(out / "libclean"))["skipped"], 0) << o.text;
}

TEST_F(MutantsCli, ABadFirstIsRefusedBeforeAnyCase) {
  const fs::path out = dir("out");
  const std::string lib = " --library " + mutant("unwritten") + " --out " + out.string();
  Output o = sh(at() + " mutants" + lib + " --first 'nosuch=^a'");
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "no --library named 'nosuch'")) << o.text;
  o = sh(at() + " mutants" + lib + " --first 'unwritten=(unclosed'");
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "--first unwritten regex '(unclosed'")) << o.text;
  o = sh(at() + " mutants" + lib + " --first unwritten");
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "expected NAME=REGEX")) << o.text;
  o = sh(at() + " mutants" + lib + " --first 'unwritten=a' --first 'unwritten=b'");
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "a second --first for 'unwritten'")) << o.text;
  EXPECT_FALSE(fs::exists(out / "unwritten" / "results.jsonl"));
}

TEST_F(MutantsCli, BadLibrariesAreRefusedBeforeAnyCase) {
  const fs::path out = dir("out");
  Output o = sh(at() + " mutants --library " + mutant("unwritten") + " --library " +
                mutant("unwritten") + " --out " + out.string());
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "a second library named 'unwritten'")) << o.text;
  o = sh(at() + " mutants --library " + mutant("unwritten") + "=no_such_op --out " + out.string());
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "unknown op 'no_such_op'")) << o.text;
  o = sh(at() + " mutants --library " + (tmp_ / "missing.so").string() + " --out " + out.string());
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "is not a file")) << o.text;
  // "...so" would be the results directory "..": outside --out.
  fs::copy_file(kFake, tmp_ / "...so", fs::copy_options::overwrite_existing);
  o = sh(at() + " mutants --library " + (tmp_ / "...so").string() + " --out " + out.string());
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "cannot name a results directory")) << o.text;
  EXPECT_FALSE(fs::exists(tmp_ / "run.json"));
}

// Regression: mutants locked --out but not the libraries' directories below it; a `run --out
// D/<library>` beside it replaced a mutant's results.jsonl under the mutant's run.json, and both
// exited 0.
TEST_F(MutantsCli, ARunIntoALibrarysDirectoryIsRefusedWhileMutantsWritesIt) {
  const fs::path out = dir("out");
  // The mutants run hangs in its first launch until it is killed; setsid: its own process group,
  // killed as a whole at the end.
  const std::string first = "ATTNCHECK_FAKE_FAULT=hang setsid " + at() +
                            " mutants --tier smoke --library " + library("libclean") +
                            " --timeout 60 --out " + out.string();
  const fs::path run_json = out / "libclean" / "run.json";
  const Output o =
      sh(first + " >/dev/null 2>&1 & pid=$!; for i in $(seq 100); do [ -s " + run_json.string() +
         " ] && break; sleep 0.1; done; " + at() + " run --tier smoke --kernels " +
         library("libclean") + " --out " + (out / "libclean").string() +
         " 2>&1; echo status=$?; kill -9 -$pid; wait $pid 2>/dev/null; true");
  EXPECT_TRUE(has(o.text, "status=2")) << o.text;
  EXPECT_TRUE(has(o.text, "--out '" + (out / "libclean").string() + "' is in use")) << o.text;
  EXPECT_FALSE(fs::exists(out / "libclean" / "results.jsonl") &&
               has(read(out / "libclean" / "results.jsonl"), "\"passed\""))
      << "the run wrote into the mutant's directory";
}
}  // namespace
