// The worker pool's rules (run/pool.h, docs/verification.md "Worker isolation") against a fake
// worker: a bash script that speaks the protocol and does what each case's id says (crash, hang,
// hog memory, forge its answer, ask to be run again). The CLI tests run the same rules through the
// real worker and the fake kernel library (harness/cli/tests/worker_isolation_test.cpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "run/pool.h"
#include "core/tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using attncheck::PoolCallbacks;
using attncheck::PoolTask;
using attncheck::run_in_workers;
using attncheck::WorkerSpec;

// $1: the threads its hello says; $2: how it starts (fatal, nohello, slowstart, or normally).
// Reads one request, then with several threads whatever else arrives within 0.3 s, and answers
// them in order.
constexpr const char* kFakeWorker = R"sh(
threads=$1
case "$2" in
  fatal) echo '{"fatal":"no device here"}'; exit 1 ;;
  nohello) echo "dying early" >&2; exit 3 ;;
  slowstart) sleep 100 ;;
esac
echo "{\"hello\":{\"threads\":$threads}}"
answer() {
  local seq id
  seq=$(sed 's/.*"seq":\([0-9]*\).*/\1/' <<<"$1")
  id=$(sed 's/.*"id":"\([^"]*\)".*/\1/' <<<"$1")
  case "$id" in
    crash*) echo "crashing on $id" >&2; kill -SEGV $$ ;;
    hang*) sleep 100 ;;
    slow*) sleep 1 ;;
    hog*) { head -c 48M /dev/zero; sleep 100; } | tail -c 48M >/dev/null ;;
    forge*) echo "{\"seq\":$((seq + 100)),\"id\":\"$id\",\"result\":{\"id\":\"$id\"}}"; return ;;
    requeue*) echo "{\"seq\":$seq,\"id\":\"$id\",\"requeue\":\"context broken\"}"; return ;;
    unstarted*) echo "{\"seq\":$seq,\"id\":\"$id\",\"requeue\":\"retiring\",\"blameless\":true}"; return ;;
    badflag*) echo "{\"seq\":$seq,\"id\":\"$id\",\"requeue\":\"x\",\"isolate\":\"yes\"}"; return ;;
  esac
  echo "{\"seq\":$seq,\"id\":\"$id\",\"result\":{\"id\":\"$id\",\"pid\":$$}}"
}
while IFS= read -r first; do
  batch=("$first")
  while (( ${#batch[@]} < threads )) && IFS= read -r -t 0.3 more; do batch+=("$more"); done
  for line in "${batch[@]}"; do answer "$line"; done
done
)sh";

class WorkerPool : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = attncheck::testing_util::fresh_test_dir("pool");
    spec_.exe = "/bin/bash";
    spec_.log_path = (dir_ / "worker.log").string();
    spec_.case_timeout_s = 20;
    spec_.start_timeout_s = 20;
    worker(1);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The fake worker, saying `threads` in its hello, starting as `start` says.
  void worker(int threads, const std::string& start = "") {
    spec_.args = {"-c", kFakeWorker, "fake-worker", std::to_string(threads), start};
  }
  static std::vector<PoolTask> tasks(const std::vector<std::string>& ids) {
    std::vector<PoolTask> t;
    for (const auto& id : ids)
      t.push_back({id, nlohmann::json{{"n", t.size()}}, nlohmann::json::object()});
    return t;
  }
  // Runs the tasks; results_ and lost_ by task index.
  void run(const std::vector<PoolTask>& t) {
    cb_.on_result = [&](size_t idx, const nlohmann::json& r) {
      EXPECT_EQ(r["id"], t[idx].id);
      EXPECT_EQ(results_.count(idx) + lost_.count(idx), 0u) << t[idx].id << " ended twice";
      results_[idx] = r;
    };
    cb_.on_lost = [&](size_t idx, const std::string& what) {
      EXPECT_EQ(results_.count(idx) + lost_.count(idx), 0u) << t[idx].id << " ended twice";
      lost_[idx] = what;
    };
    run_in_workers(spec_, t, cb_);
  }
  std::string log() const {
    std::ifstream in(spec_.log_path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static bool has(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  }
  static size_t occurrences(const std::string& text, const std::string& part) {
    size_t n = 0;
    for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
    return n;
  }
  // The message of what `f` throws ("" when nothing).
  template <class F>
  static std::string thrown(F&& f) {
    try {
      f();
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
  WorkerSpec spec_;
  PoolCallbacks cb_;
  std::map<size_t, nlohmann::json> results_;
  std::map<size_t, std::string> lost_;
};

TEST_F(WorkerPool, EveryTaskEndsOnceWithItsResult) {
  spec_.jobs = 2;
  int hellos = 0, round_trips = 0;
  cb_.on_hello = [&](const nlohmann::json& hello) {
    EXPECT_EQ(hello["threads"], 1);
    ++hellos;
  };
  cb_.on_round_trip = [&](size_t, size_t slot, double ms) {
    EXPECT_LT(slot, 2u);
    EXPECT_GE(ms, 0.0);
    ++round_trips;
  };
  run(tasks({"a", "b", "c", "d", "e"}));
  EXPECT_EQ(results_.size(), 5u);
  EXPECT_TRUE(lost_.empty());
  EXPECT_EQ(hellos, 2);
  EXPECT_EQ(round_trips, 5);
}

TEST_F(WorkerPool, ACaseLostAloneFailsNamingTheSignalAndTheLastOutput) {
  run(tasks({"a", "crash", "b"}));
  ASSERT_EQ(lost_.size(), 1u);
  EXPECT_TRUE(has(lost_[1], "worker process died with SIGSEGV")) << lost_[1];
  EXPECT_TRUE(has(lost_[1], "while running this case")) << lost_[1];
  EXPECT_TRUE(has(lost_[1], "crashing on crash")) << lost_[1];
  EXPECT_EQ(results_.size(), 2u);
}

// Nothing can be pinned on one of several cases in flight: each runs again alone, where the
// crash is its own case's only.
TEST_F(WorkerPool, CasesInFlightWithACrashRunAgainEachAlone) {
  spec_.threads = 2;
  worker(2);
  run(tasks({"crash", "a"}));
  ASSERT_EQ(lost_.size(), 1u);
  EXPECT_TRUE(has(lost_[0], "SIGSEGV")) << lost_[0];
  ASSERT_EQ(results_.count(1), 1u);
  EXPECT_TRUE(has(log(), "its 2 cases in flight run again, each alone in a worker")) << log();
  // Named by its pid, not by the -1 of a worker already reaped.
  EXPECT_TRUE(
      std::regex_search(log(), std::regex(R"(\[attncheck\] worker [1-9][0-9]*: worker )"
                                          R"(process died with SIGSEGV[^\n]*; its 2 cases)")))
      << log();
}

// A case run alone runs in a solo worker beside the pool: the pool's worker goes on with the
// other cases meanwhile (before, it took the case alone and its other threads waited).
TEST_F(WorkerPool, CasesRunAloneRunInSoloWorkersBesideThePool) {
  spec_.threads = 2;
  worker(2);
  std::vector<std::string> ids = {"crash", "slow-alone"};
  for (int k = 0; k < 8; ++k) ids.push_back("a" + std::to_string(k));
  run(tasks(ids));
  ASSERT_EQ(lost_.size(), 1u);
  EXPECT_TRUE(has(lost_[0], "SIGSEGV")) << lost_[0];
  ASSERT_EQ(results_.size(), ids.size() - 1);
  const auto slow_pid = results_[1]["pid"];
  for (size_t k = 2; k < ids.size(); ++k)
    EXPECT_NE(results_[k]["pid"], slow_pid) << ids[k] << " ran in the worker of the case alone";
}

TEST_F(WorkerPool, ARequeuedCaseRunsAgainAndIsLostAfterThreeRequeues) {
  spec_.threads = 2;
  worker(2);
  int started = 0;
  cb_.on_worker_started = [&](size_t, double) { ++started; };
  run(tasks({"requeue", "a"}));
  ASSERT_EQ(lost_.count(0), 1u);
  EXPECT_EQ(lost_[0], "answered 'run it again' 3 times; the last: context broken");
  EXPECT_EQ(results_.count(1), 1u);
  // Again beside others once, then alone (from its second requeue on).
  const std::string text = log();
  EXPECT_EQ(occurrences(text, "requeue runs again: context broken"), 1u) << text;
  EXPECT_EQ(occurrences(text, "requeue runs again alone: context broken"), 2u) << text;
  EXPECT_GE(started, 4) << "each requeue retires its worker";
}

// A requeue that says nothing of the case (never started, or hit by another case's fault): it
// runs again beside others, alone only from its third such answer, lost after the sixth (a
// forging worker).
TEST_F(WorkerPool, ABlamelessRequeueRunsAgainBesideOthersUntilItsThird) {
  spec_.threads = 2;
  worker(2);
  run(tasks({"unstarted", "a"}));
  ASSERT_EQ(lost_.count(0), 1u);
  EXPECT_EQ(lost_[0], "answered 'run it again, not its doing' 6 times; the last: retiring");
  EXPECT_EQ(results_.count(1), 1u);
  const std::string text = log();
  EXPECT_EQ(occurrences(text, "unstarted runs again: retiring"), 2u) << text;
  EXPECT_EQ(occurrences(text, "unstarted runs again alone: retiring"), 4u) << text;
}

TEST_F(WorkerPool, ARequeueWhoseFlagIsNotABooleanIsRejected) {
  spec_.threads = 2;
  worker(2);
  run(tasks({"badflag", "a"}));
  ASSERT_EQ(lost_.count(0), 1u);
  EXPECT_TRUE(has(lost_[0], "its \"isolate\" is not true or false")) << lost_[0];
  EXPECT_EQ(results_.count(1), 1u);
}

TEST_F(WorkerPool, AForgedAnswerIsRejectedAndFailsOnlyItsCase) {
  run(tasks({"forge", "a"}));
  ASSERT_EQ(lost_.count(0), 1u);
  EXPECT_TRUE(has(lost_[0],
                  "the worker's protocol line was rejected (its seq is not 1 (the "
                  "request's); the request was seq 1 for 'forge')"))
      << lost_[0];
  EXPECT_EQ(results_.count(1), 1u);
  EXPECT_TRUE(has(log(), ": rejected protocol line (its seq is not 1")) << log();
}

TEST_F(WorkerPool, AHangTimesOutAndTheNextCaseGetsAFreshWorker) {
  spec_.case_timeout_s = 1;
  run(tasks({"hang", "a"}));
  ASSERT_EQ(lost_.count(0), 1u);
  EXPECT_TRUE(has(lost_[0], "timed out after 1 s")) << lost_[0];
  EXPECT_EQ(results_.count(1), 1u);
}

TEST_F(WorkerPool, AWorkerOverTheMemoryLimitFailsItsCase) {
  spec_.memory_limit = 32ull << 20;
  run(tasks({"hog", "a"}));
  ASSERT_EQ(lost_.count(0), 1u);
  EXPECT_TRUE(has(lost_[0], "over the limit of 32 MiB (--worker-memory); the worker was killed"))
      << lost_[0];
  EXPECT_EQ(results_.count(1), 1u);
}

TEST_F(WorkerPool, WorkersThatCannotStartEndTheRunNamingWhy) {
  worker(1, "fatal");
  EXPECT_EQ(thrown([&] { run(tasks({"a"})); }), "no device here");
  worker(1, "nohello");
  const std::string three = thrown([&] { run(tasks({"a"})); });
  EXPECT_TRUE(has(three,
                  "failed to start three times: worker process died with exit status 3 "
                  "before its hello"))
      << three;
  EXPECT_TRUE(has(three, "dying early")) << three;
  worker(1, "slowstart");
  spec_.start_timeout_s = 1;
  const std::string slow = thrown([&] { run(tasks({"a"})); });
  EXPECT_TRUE(has(slow, "did not start: no hello within 1 s; the worker was killed")) << slow;
}

TEST_F(WorkerPool, AOneCaseWorkersResultArrivesAfterItsExit) {
  spec_.one_case_per_worker = true;
  std::vector<int> serials;
  cb_.on_worker_exit = [&](int serial, size_t idx, nlohmann::json& result) {
    EXPECT_EQ(results_.count(idx), 0u) << "the result came before the exit";
    serials.push_back(serial);
    result["serial"] = serial;
  };
  run(tasks({"a", "b"}));
  ASSERT_EQ(results_.size(), 2u);
  EXPECT_EQ(serials, (std::vector<int>{0, 1}));
  EXPECT_EQ(results_[0]["serial"], 0);
  EXPECT_EQ(results_[1]["serial"], 1);
  EXPECT_NE(results_[0]["pid"], results_[1]["pid"]) << "one worker per case";
}

// Workers yet to say hello count at the threads asked: each hello of one thread opens one slot
// more, until four can run the four cases at once asked for (the cases last long enough for
// three starts in a row on a busy host).
TEST_F(WorkerPool, WorkersWithFewerThreadsThanAskedOpenMoreSlots) {
  spec_.threads = 4;
  worker(1);
  std::set<size_t> slots;
  cb_.on_worker_started = [&](size_t slot, double) { slots.insert(slot); };
  run(tasks({"slow1", "slow2", "slow3", "slow4", "slow5", "slow6", "slow7", "slow8"}));
  EXPECT_EQ(results_.size(), 8u);
  EXPECT_EQ(slots, (std::set<size_t>{0, 1, 2, 3}));
  const std::string text = log();
  size_t grown = 0;
  const std::string line = "a worker runs 1 case(s) at once, not 4: the pool opens 1 more worker";
  for (size_t at = 0; (at = text.find(line, at)) != std::string::npos; ++at) ++grown;
  EXPECT_EQ(grown, 3u) << text;
}

TEST_F(WorkerPool, StoppedAndSetAsideTasksAreNotRun) {
  std::vector<size_t> not_run;
  cb_.before_dispatch = [] { return std::vector<size_t>{3}; };
  cb_.stop_dispatching = [&](size_t) { return !lost_.empty(); };
  cb_.on_not_run = [&](size_t idx) { not_run.push_back(idx); };
  run(tasks({"crash", "a", "b", "c"}));
  EXPECT_EQ(lost_.size(), 1u);
  EXPECT_TRUE(results_.empty());
  std::sort(not_run.begin(), not_run.end());
  EXPECT_EQ(not_run, (std::vector<size_t>{1, 2, 3}));
}

}  // namespace
