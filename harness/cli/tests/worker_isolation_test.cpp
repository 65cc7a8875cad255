// Worker isolation with a native kernel library (docs/verification.md "Worker isolation"): the
// fake library forks, leaves a process behind a hang, and forges protocol lines; each fails at
// most its own case. bridge/tests/hostile_adapters.py does the same and more through a Python
// adapter.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli_test_support.h"

namespace {

namespace fs = std::filesystem;
using attncheck::clitest::GoldenSuite;
using attncheck::clitest::has;
using attncheck::clitest::kFake;
using attncheck::clitest::Output;
using attncheck::clitest::sh;

class WorkerIsolation : public GoldenSuite<WorkerIsolation> {
 protected:
  static void SetUpTestSuite() {
    generate_goldens("attncheck_isolation_");
    ASSERT_EQ(generated_.status, 0) << generated_.text;
  }
  // results.jsonl as its list of (id, record), in file order.
  static std::vector<nlohmann::json> records(const fs::path& out) {
    std::ifstream in(out / "results.jsonl");
    std::vector<nlohmann::json> v;
    for (std::string line; std::getline(in, line);) v.push_back(nlohmann::json::parse(line));
    return v;
  }
  // Every one of the 6 smoke cases once; the ids of those not passed.
  static std::set<std::string> not_passed(const std::vector<nlohmann::json>& rs) {
    std::set<std::string> ids, bad;
    for (const auto& r : rs) {
      ids.insert(r["id"].get<std::string>());
      if (r["verdict"] != "passed" && r["verdict"] != "known_bug" &&
          r["verdict"] != "unexpected_pass")
        bad.insert(r["id"].get<std::string>());
    }
    EXPECT_EQ(rs.size(), 6u);
    EXPECT_EQ(ids.size(), 6u) << "a case answered twice, or one never";
    EXPECT_EQ(ids.count("page_indices/forged"), 0u);
    return bad;
  }
  static bool alive(int pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string text;
    if (!std::getline(in, text)) return false;
    return text.substr(text.rfind(')') + 2, 1) != "Z";
  }
};

// Regression: a library that forked left two copies of the worker answering on one channel; two
// cases were never evaluated and their slots held duplicates of other results.
TEST_F(WorkerIsolation, AForkingLibraryEvaluatesEachCaseOnce) {
  const fs::path out = dir("out");
  const Output o = sh("ATTNCHECK_FAKE_FAULT=fork " + at() + " run --kernels " + kFake + " --out " +
                      out.string());
  const auto bad = not_passed(records(out));
  EXPECT_TRUE(bad.empty()) << o.text;
}

// Regression: only the worker's pid was killed at the timeout; `sleep` the library started lived
// on.
TEST_F(WorkerIsolation, ATimeoutKillsEveryProcessTheWorkerStarted) {
  const fs::path out = dir("out");
  const fs::path pids = dir("pids");
  const Output o =
      sh("ATTNCHECK_FAKE_FAULT=spawn_and_hang ATTNCHECK_FAKE_PID_FILE=" + pids.string() +
         " ATTNCHECK_FAKE_FAULT_WHEN='{\"kernel_block_size\":16}' " + at() + " run --kernels " +
         kFake + " --timeout 1 --out " + out.string());
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_TRUE(has(o.text, "the worker was killed with every process it started")) << o.text;
  std::ifstream in(pids);
  std::vector<int> started;
  for (int pid; in >> pid;) started.push_back(pid);
  ASSERT_FALSE(started.empty()) << o.text;
  for (int i = 0; i < 50 && alive(started.front()); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (int pid : started) {
    EXPECT_FALSE(alive(pid)) << "sleep " << pid << " outlived the timeout";
    if (alive(pid)) ::kill(pid, SIGKILL);
  }
}

// Regression: a protocol-shaped line from a kernel ended the run ({"fatal"}, exit 2) or replaced
// the result of the case being run (no check of the id).
TEST_F(WorkerIsolation, ForgedProtocolLinesFailOnlyTheirCase) {
  const fs::path out = dir("out");
  const Output o =
      sh("ATTNCHECK_FAKE_FAULT=forge ATTNCHECK_FAKE_FAULT_WHEN='{\"kernel_block_size\":16}' " +
         at() + " run --kernels " + kFake + " --out " + out.string());
  EXPECT_EQ(o.status, 1) << o.text;
  const auto bad = not_passed(records(out));
  EXPECT_EQ(bad.size(), 2u) << o.text;  // the two kernel_block_size 16 cases
  EXPECT_TRUE(has(o.text, "the worker's protocol line was rejected")) << o.text;
}

}  // namespace
