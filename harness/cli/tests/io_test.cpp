// Hardened I/O, end to end through the binary (issue 13): writes never replace what is not a
// regular file and fail the command when they fail; run.json exists from the start; a kill at any
// instant of `golden generate` leaves the old set or the new one; damaged goldens are reported,
// not fatal; numeric options, axis values and case counts are bounded.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli_test_support.h"

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

std::set<std::string> names_in(const fs::path& d) {
  std::set<std::string> s;
  for (const auto& e : fs::directory_iterator(d)) s.insert(e.path().filename().string());
  return s;
}

class Io : public GoldenSuite<Io> {
 protected:
  static void SetUpTestSuite() {
    generate_goldens("attncheck_io_");
    ASSERT_EQ(generated_.status, 0) << generated_.text;
  }
};

bool is_a_fifo(const fs::path& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
}

// Regression: --bundle, bench --json, run.json and junit.xml were renamed over whatever the path
// named (as root, --bundle /dev/null replaced the device node with a regular file).
TEST_F(Io, WritesNeverReplaceWhatIsNotARegularFile) {
  const std::string id = "page_indices/bs1-b5-ctx17-contiguous-s0";
  const fs::path d = dir("targets");
  fs::create_directories(d);
  const fs::path fifo = d / "fifo.h5";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Output o = sh(at() + " repro " + id + " --bundle " + fifo.string());
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "refusing to replace '" + fifo.string() + "': it is a FIFO")) << o.text;
  EXPECT_TRUE(is_a_fifo(fifo));
  // A symbolic link is not followed or replaced either.
  const fs::path link = d / "link.h5";
  fs::create_symlink("/dev/null", link);
  o = sh(at() + " repro " + id + " --bundle " + link.string());
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "refusing to replace '" + link.string() + "': it is a symbolic link"))
      << o.text;
  EXPECT_TRUE(fs::is_symlink(link));

  const fs::path json_dir = d / "bench.json";
  fs::create_directories(json_dir);
  o = sh(at() + " bench --tier smoke --kernels " + kFake + " --iters 1 --json " +
         json_dir.string());
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "refusing to replace '" + json_dir.string() + "': it is a directory"))
      << o.text;
  EXPECT_TRUE(fs::is_directory(json_dir));

  const fs::path out = d / "out";
  fs::create_directories(out);
  ASSERT_EQ(::mkfifo((out / "junit.xml").c_str(), 0600), 0);
  o = sh(at() + " run --tier smoke --out " + out.string());
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "refusing to replace '" + (out / "junit.xml").string() + "'")) << o.text;
  EXPECT_TRUE(is_a_fifo(out / "junit.xml"));
  EXPECT_FALSE(has(o.text, "results: ")) << o.text;
}

// Regression: --out o with o/results.jsonl a directory, or a disk that fills up, exited 0 and
// printed "results: o" with nothing written.
TEST_F(Io, ResultsThatCannotBeWrittenFailTheRun) {
  const fs::path out = dir("out");
  fs::create_directories(out / "results.jsonl");
  Output o = sh(at() + " run --tier smoke --out " + out.string());
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, (out / "results.jsonl").string() + "': it is a directory")) << o.text;
  EXPECT_FALSE(has(o.text, "results: ")) << o.text;

  // A full disk, as the file-size limit: the first write that does not fit fails the run, naming
  // the file (EFBIG here, ENOSPC on a full disk: the same checked write). Which file fills first
  // (results.jsonl or run.json, whose size depends on the paths it records) does not matter.
  const fs::path out2 = dir("full");
  o = sh("ulimit -f 2; " + at() + " run --tier smoke --in-process --out " + out2.string());
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "cannot write '" + (out2 / "results.jsonl").string() + "': write: ") ||
              has(o.text, "cannot write '" + (out2 / "run.json").string() + "': write: "))
      << o.text;
  EXPECT_FALSE(has(o.text, "results: ")) << o.text;
}

// run.json is there from the start (no "finished"), so a run killed halfway stays reportable.
TEST_F(Io, RunJsonIsWrittenAtTheStart) {
  const fs::path out = dir("out");
  // Every launch hangs; the run is killed (with its workers) while the first case runs.
  const std::string cmd = "ATTNCHECK_FAKE_FAULT=hang setsid " + at() +
                          " run --tier smoke --kernels " + kFake + " --timeout 60 --out " +
                          out.string() +
                          " >/dev/null 2>&1 & pid=$!; for i in $(seq 100); do "
                          "[ -s " +
                          (out / "run.json").string() +
                          " ] && break; sleep 0.1; done; sleep 0.3; kill -9 -$pid; wait $pid";
  sh(cmd);
  ASSERT_TRUE(fs::exists(out / "run.json"));
  const auto run = nlohmann::json::parse(read(out / "run.json"));
  EXPECT_EQ(run["finished"], "") << run.dump();
  EXPECT_EQ(run["case_count"], 6) << run.dump();
  EXPECT_FALSE(run["started"].get<std::string>().empty());
  EXPECT_TRUE(fs::exists(out / "results.jsonl"));
}

// Regression: kill -9 during `golden generate` left golden/<op>.h5.tmp.<pid> files, or new files
// next to the old MANIFEST. Now every instant leaves the old set or the new one, and nothing else.
TEST_F(Io, KillAtAnyInstantOfGenerateLeavesTheOldOrTheNewSet) {
  // The old set: other cases (a smaller file), so old and new differ in every file.
  const fs::path old_cases = dir("old_cases");
  fs::create_directories(old_cases);
  std::ofstream(old_cases / "page_indices.toml") << R"(op = "page_indices"
[[group]]
name = "few"
tiers = { smoke = "pairwise" }
axes = { block_size = [1, 16], max_ctx = [40] }
)";
  const fs::path old_set = dir("old_set");
  Output o = sh(kBin + " --cases " + old_cases.string() + " --golden " + old_set.string() +
                " golden generate");
  ASSERT_EQ(o.status, 0) << o.text;
  // The new set: enough cases (480) that writing it takes a while, so the kills land inside it.
  const fs::path new_cases = dir("new_cases");
  fs::create_directories(new_cases);
  std::ofstream(new_cases / "page_indices.toml") << R"(op = "page_indices"
[[group]]
name = "many"
tiers = { smoke = "cartesian" }
axes = { block_size = [1, 16, 64], table = ["contiguous", "strided"], batch = [1, 2, 3, 4, 5, 6, 7, 8], max_ctx = [1, 7, 16, 17, 33, 64, 65, 100, 130, 257] }
)";
  const fs::path new_set = dir("new_set");
  o = sh(kBin + " --cases " + new_cases.string() + " --golden " + new_set.string() +
         " golden generate");
  ASSERT_EQ(o.status, 0) << o.text;
  const std::string old_manifest = read(old_set / "MANIFEST");
  const std::string new_manifest = read(new_set / "MANIFEST");
  ASSERT_NE(old_manifest, new_manifest);

  const fs::path g = dir("golden");
  const std::string generate =
      kBin + " --cases " + new_cases.string() + " --golden " + g.string() + " golden generate";
  // How long one uninterrupted generate takes, to spread the kills over it.
  fs::copy(old_set, g, fs::copy_options::recursive);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(sh(generate + " >/dev/null").status, 0);
  const double full_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(read(g / "MANIFEST"), new_manifest);

  int saw_old = 0, saw_new = 0;
  constexpr int kKills = 16;
  for (int k = 0; k < kKills; ++k) {
    fs::remove_all(g);
    fs::copy(old_set, g, fs::copy_options::recursive);
    const double delay = full_s * (k + 0.5) / kKills;
    o = sh(generate + " >/dev/null 2>&1 & pid=$!; sleep " + std::to_string(delay) +
           "; kill -9 $pid 2>/dev/null; wait $pid; true");
    EXPECT_EQ(names_in(g), (std::set<std::string>{"MANIFEST", "page_indices.h5"}))
        << "after a kill at " << delay << " s";
    const std::string manifest = read(g / "MANIFEST");
    EXPECT_TRUE(manifest == old_manifest || manifest == new_manifest)
        << "after a kill at " << delay << " s:\n"
        << manifest;
    saw_old += manifest == old_manifest;
    saw_new += manifest == new_manifest;
    // Whichever set it is, its files match its MANIFEST.
    o = sh(kBin + " --cases " + (manifest == old_manifest ? old_cases : new_cases).string() +
           " --golden " + g.string() + " golden verify --manifest-only");
    EXPECT_EQ(o.status, 0) << "after a kill at " << delay << " s:\n" << o.text;
  }
  EXPECT_GT(saw_old, 0);
  RecordProperty("kills_leaving_old_set", saw_old);
  RecordProperty("kills_leaving_new_set", saw_new);
  // The next generate completes and removes what a killed one staged.
  ASSERT_EQ(sh(generate).status, 0);
  EXPECT_EQ(read(g / "MANIFEST"), new_manifest);
  EXPECT_FALSE(fs::exists(g.parent_path() / ("." + g.filename().string() + ".staging")));
}

// Regression: `golden verify` stopped (exit 2) at the first golden that was not a regular file,
// and hung on a FIFO.
TEST_F(Io, VerifyReportsFilesThatAreNotRegularAndGoesOn) {
  for (const std::string kind : {"directory", "fifo", "dev_zero"}) {
    const fs::path g = golden_copy();
    const fs::path file = g / "page_indices.h5";
    fs::remove(file);
    if (kind == "directory") fs::create_directories(file);
    if (kind == "fifo") {
      ASSERT_EQ(::mkfifo(file.c_str(), 0600), 0);
    }
    if (kind == "dev_zero") fs::create_symlink("/dev/zero", file);
    std::ofstream(g / "page_indices.h5.tmp.12345") << "left by a killed generate";
    const Output o = sh("timeout 60 " + at(g) + " golden verify");
    EXPECT_EQ(o.status, 1) << kind << ":\n" << o.text;
    EXPECT_TRUE(has(o.text, file.string() + " is a")) << kind << ":\n" << o.text;
    EXPECT_TRUE(has(o.text, "page_indices.h5.tmp.12345: not a golden file")) << o.text;
  }
}

// Regression: damaged HDF5 metadata crashed libhdf5 inside `golden verify` and `repro`. A
// golden that does not match MANIFEST is not parsed at all; one that does (MANIFEST rewritten for
// it) is parsed in a child process first, and its crash is reported.
TEST_F(Io, DamagedGoldensAreReportedNotFatal) {
  const fs::path g = golden_copy();
  const fs::path file = g / "page_indices.h5";
  const std::string damaged = read(fs::path(ATTNCHECK_TEST_DATA) / "damaged" / "page_indices.h5");
  ASSERT_FALSE(damaged.empty());
  std::ofstream(file, std::ios::binary | std::ios::trunc) << damaged;
  Output o = sh(at(g) + " golden verify");
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_TRUE(has(o.text, "does not match MANIFEST")) << o.text;
  EXPECT_TRUE(has(o.text, "not parsed")) << o.text;

  // The MANIFEST now vouches for the damaged file: the child that parses it dies, verify says so.
  o = sh("cd " + g.string() + " && sha256sum page_indices.h5");
  const std::string sha = o.text.substr(0, 64);
  std::ofstream(g / "MANIFEST") << sha << ' ' << damaged.size() << " 12 page_indices.h5\n";
  o = sh(at(g) + " golden verify");
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_TRUE(has(o.text, "unreadable (read in a child process)")) << o.text;
  o = sh(at(g) + " repro page_indices/bs1-b5-ctx17-contiguous-s0 --bundle " +
         (dir("bundle") / "b.h5").string());
  EXPECT_LT(o.status, 128) << o.text;  // no crash
  EXPECT_TRUE(has(o.text, "unreadable (read in a child process)")) << o.text;
}

// Regression: --timeout nan reported every case "timed out after -9223372036854775808 s", and an
// axis value of INT64_MAX or a file of a million cases went straight to allocation.
TEST_F(Io, NumbersAreCheckedBeforeUse) {
  for (const std::string t : {"nan", "inf", "1e10", "-1", "0"}) {
    const Output o = sh(at() + " run --tier smoke --timeout " + t);
    EXPECT_NE(o.status, 0) << t << ": " << o.text;
    EXPECT_TRUE(has(o.text, "--timeout")) << t << ": " << o.text;
    EXPECT_FALSE(has(o.text, "timed out")) << t << ": " << o.text;
  }
  const fs::path cases = dir("cases");
  fs::create_directories(cases);
  std::ofstream(cases / "page_indices.toml") << R"(op = "page_indices"
[[group]]
name = "huge"
tiers = { smoke = "list" }
cases = [ { batch = 2, max_ctx = 9223372036854775807 } ]
)";
  Output o = sh(kBin + " --cases " + cases.string() + " list");
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, (cases / "page_indices.toml").string() + ":5:")) << o.text;
  EXPECT_TRUE(has(o.text,
                  "axis 'max_ctx' = 9223372036854775807 is outside op 'page_indices''s "
                  "bounds"))
      << o.text;

  // 3 x 10 x 10 x 100 = 30000 cases in one tier: over the default limit of 20000 per tier.
  std::ostringstream seeds;
  for (int i = 0; i < 100; ++i) seeds << (i ? ", " : "") << i;
  std::ofstream(cases / "page_indices.toml")
      << "op = \"page_indices\"\n[[group]]\nname = \"many\"\ntiers = { full = \"cartesian\" }\n"
         "axes = { block_size = [1, 16, 64], batch = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "
         "max_ctx = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], seed = ["
      << seeds.str() << "] }\n";
  o = sh(kBin + " --cases " + cases.string() + " list --tier full");
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "over the limit of 20000 per tier")) << o.text;
  EXPECT_TRUE(has(o.text, (cases / "page_indices.toml").string() + ":2")) << o.text;
  // The limit is configurable.
  o = sh("ATTNCHECK_MAX_CASES_PER_TIER=40000 " + kBin + " --cases " + cases.string() +
         " list --tier full >/dev/null");
  EXPECT_EQ(o.status, 0) << o.text;
}

// Hostile case ids: a value that is not one of an axis's allowed values never becomes an id, and
// whatever an id holds, its bundle name is one plain file name inside the results directory.
TEST_F(Io, HostileIdsCannotEscapeTheOutputDirectory) {
  const fs::path cases = dir("cases");
  fs::create_directories(cases);
  std::ofstream(cases / "page_indices.toml") << R"(op = "page_indices"
[[group]]
name = "hostile"
tiers = { smoke = "list" }
cases = [ { table = "../../../../tmp/escaped" } ]
)";
  const Output o = sh(kBin + " --cases " + cases.string() + " list");
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, (cases / "page_indices.toml").string() + ":5:")) << o.text;
}

}  // namespace
