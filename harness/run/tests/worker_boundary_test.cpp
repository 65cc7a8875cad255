// The typed boundary between the parent and its workers (run/worker.h, run/amend.h): the config
// and the hello cross it as JSON and come back whole; a malformed one is refused naming its field.
#include <gtest/gtest.h>

#include <string>

#include "core/case_json.h"
#include "run/amend.h"
#include "run/worker.h"

namespace attncheck {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(WorkerConfigJson, RoundTripsEveryField) {
  WorkerConfig c;
  c.golden_dir = "/g";
  c.kernels = "/k.so";
  c.arch = "sm_90";
  c.repro_dir = "/out/repro";
  c.repro_extra = " --cases /c";
  c.repeat = 3;
  c.allow_missing_goldens = true;
  c.stress = 7;
  c.import_timeout_s = 12.5;
  c.golden_checked = {{"rope", "123:456"}};
  c.threads = 4;
  const WorkerConfig back = WorkerConfig::from_json(nlohmann::json::parse(c.to_json().dump()));
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_EQ(back.golden_checked.at("rope"), "123:456");
  EXPECT_EQ(back.import_timeout_s, 12.5);
}

TEST(WorkerConfigJson, LeftOutFieldsKeepTheirDefaults) {
  const WorkerConfig c = WorkerConfig::from_json({{"kernels", "x.so"}});
  EXPECT_EQ(c.kernels, "x.so");
  EXPECT_EQ(c.repeat, 2);
  EXPECT_EQ(c.threads, 1);
  EXPECT_EQ(c.import_timeout_s, 120);
}

TEST(WorkerConfigJson, MalformedFieldsAreNamed) {
  EXPECT_EQ(error_of([] {
              WorkerConfig::from_json({{"repeat", "2"}});
            }),
            "worker config: 'repeat' has the wrong type");
  EXPECT_EQ(error_of([] {
              WorkerConfig::from_json({{"golden_checked", {{"rope", 1}}}});
            }),
            "worker config: 'golden_checked' is not {op: stamp}");
  EXPECT_EQ(error_of([] {
              WorkerConfig::from_json({{"repat", 2}});
            }),
            "worker config: unknown field 'repat'");
  EXPECT_EQ(error_of([] { WorkerConfig::from_json(nlohmann::json::array()); }),
            "worker config: not a JSON object");
}

TEST(WorkerHelloJson, RoundTripsAndNamesTheBackend) {
  WorkerHello h;
  h.pid = 42;
  h.library = "lib 1.0";
  h.entries = {"rope_inplace"};
  h.device = "MI300X";
  h.device_arch = h.arch = "gfx942";
  h.kernel_mode = true;
  h.threads = 8;
  h.threads_why = "because";
  const WorkerHello back = WorkerHello::from_json(h.to_json());
  EXPECT_EQ(back.to_json(), h.to_json());
  EXPECT_EQ(back.backend(), "hip");
  h.arch = "sm_90";
  EXPECT_EQ(h.backend(), "cuda");
  h.arch = "";
  EXPECT_EQ(h.backend(), "cpu");
}

TEST(WorkerHelloJson, MissingOrWrongFieldsAreNamed) {
  nlohmann::json j = WorkerHello{}.to_json();
  j.erase("arch");
  EXPECT_EQ(error_of([&] { WorkerHello::from_json(j); }), "worker hello: 'arch' is missing");
  j = WorkerHello{}.to_json();
  j["mode"] = "gpu";
  EXPECT_EQ(error_of([&] { WorkerHello::from_json(j); }),
            "worker hello: 'mode' is 'gpu', not kernel or reference");
  j["mode"] = 1;
  EXPECT_EQ(error_of([&] { WorkerHello::from_json(j); }),
            "worker hello: 'mode' has the wrong type");
}

TEST(Amend, StandInsSayWhyAndTakeTheirVerdicts) {
  Case c;
  c.op = "rope";
  c.id = "rope/x";
  RunOptions opt;
  opt.kernels_path = "/k.so";
  const Result lost = amend(c, {}, Amendment::lost, {"SIGSEGV", Mode::kernel, &opt});
  EXPECT_EQ(lost.verdict, Verdict::failed);
  EXPECT_EQ(lost.message, "SIGSEGV");
  const Result not_run = amend(c, {}, Amendment::not_run, {"not run: stop", Mode::none, &opt});
  EXPECT_EQ(not_run.verdict, Verdict::skipped);
  const Result line = amend(c, {}, Amendment::unreadable_line, {"bad", Mode::none, &opt});
  EXPECT_EQ(line.verdict, Verdict::error);
  EXPECT_EQ(line.message, "the worker's result line is unreadable: bad");
  const Result kernel_line = amend(c, {}, Amendment::unreadable_line, {"bad", Mode::kernel, &opt});
  EXPECT_EQ(kernel_line.verdict, Verdict::failed);
}

TEST(CaseJson, RoundTripsAndNamesTheBadField) {
  Case c;
  c.op = "rope";
  c.params = {{"heads", 8}};
  c.id = "rope/h8";
  c.tiers = {"smoke"};
  c.known_bug = KnownBug{"why", "gfx9"};
  c.source = "cases/rope.toml:3";
  EXPECT_EQ(case_to_json(case_from_json(case_to_json(c))), case_to_json(c));
  nlohmann::json j = case_to_json(c);
  j["id"] = 3;
  EXPECT_EQ(error_of([&] { case_from_json(j); }),
            "case JSON: 'id' is missing or of the wrong type");
}

}  // namespace
}  // namespace attncheck
