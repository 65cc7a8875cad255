// What a kernel library can do to the harness through the ABI besides its kernels (issue 38): fill
// string buffers without a terminating NUL, crash, hang or exit while it loads, hand over a table
// with NULL functions, and start processes that detach into sessions of their own. Each ends with
// a clear error naming the library, or the correct result, and nothing left running. Also: what
// run.json says about the workers, and `golden verify` over every stored attribute.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

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

const std::string kCase = "page_indices/bs16-b5-ctx130-contiguous-s0";

class LibraryIsolation : public GoldenSuite<LibraryIsolation> {
 protected:
  static void SetUpTestSuite() {
    generate_goldens("attncheck_library_isolation_");
    ASSERT_EQ(generated_.status, 0) << generated_.text;
  }
  // `text` repeated to fill `n` bytes, as the fake library fills a buffer without a NUL.
  static std::string filled(const std::string& text, size_t n) {
    std::string s(n, ' ');
    for (size_t i = 0; i < n; ++i) s[i] = text[i % text.size()];
    return s;
  }
  // Live processes whose command line is exactly `sleep <seconds>`.
  static std::vector<int> sleeping(const std::string& seconds) {
    std::vector<int> pids;
    const std::string wanted = std::string("sleep") + '\0' + seconds + '\0';
    for (const auto& e : fs::directory_iterator("/proc")) {
      const std::string name = e.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      if (read(e.path() / "cmdline") != wanted) continue;
      std::ifstream stat(e.path() / "stat");
      std::string text;
      std::getline(stat, text);
      if (text.size() > text.rfind(')') + 2 && text[text.rfind(')') + 2] != 'Z')
        pids.push_back(std::stoi(name));
    }
    return pids;
  }
};

// Regression: a library that filled the device name, the arch or a 2048-byte message without a
// terminating NUL put the stack bytes after the buffer into run.json, results.jsonl and bundles.
TEST_F(LibraryIsolation, StringsFilledWithoutANulStayWithinTheirBuffers) {
  const fs::path out = dir("out");
  const std::string env =
      "ATTNCHECK_FAKE_UNTERMINATED=1 ATTNCHECK_FAKE_FAULT=refuse "
      "ATTNCHECK_FAKE_FAULT_WHEN='{\"kernel_block_size\":16}' ";
  const Output o =
      sh(env + at() + " run --tier smoke --kernels " + kFake + " --out " + out.string());
  EXPECT_EQ(o.status, 1) << o.text;
  const std::string name = filled("fake CPU device (attncheck test library)", 256);
  const std::string arch = filled("fake-cpu", 64);
  const auto run = nlohmann::json::parse(read(out / "run.json"));
  EXPECT_EQ(run["device"], name) << run;
  EXPECT_EQ(run["arch"], arch) << run;
  const std::string refusal = "fake kernel refuses (injected)";
  const std::string message = filled(refusal, 2048);
  int refused = 0;
  std::istringstream lines(read(out / "results.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const auto r = nlohmann::json::parse(line);
    const std::string m = r["message"];
    const auto at_message = m.find(message);
    if (at_message == std::string::npos) continue;
    ++refused;
    // The message ends where the buffer ends: the next byte is not the text's continuation.
    EXPECT_NE(m.substr(at_message + 2048, 1), std::string(1, refusal[2048 % refusal.size()])) << m;
  }
  EXPECT_EQ(refused, 2) << read(out / "results.jsonl");

  // A failing case still gets its bundle, and repro shows the name as the library wrote it.
  const fs::path bundle = dir("bundle.h5");
  const Output r = sh("ATTNCHECK_FAKE_UNTERMINATED=1 ATTNCHECK_FAKE_FAULT=unwritten " + at() +
                      " repro " + kCase + " --kernels " + kFake + " --bundle " + bundle.string());
  EXPECT_EQ(r.status, 1) << r.text;
  EXPECT_TRUE(has(r.text, " on " + name + " (" + arch + ")\n")) << r.text;
  EXPECT_TRUE(fs::exists(bundle)) << r.text;
  const Output meta = sh("/usr/bin/python3 -c \"import h5py, json; f = h5py.File('" +
                         bundle.string() + "'); m = json.loads(f.attrs['meta']); " +
                         "print(len(m['device']), len(m['device_arch']))\"");
  EXPECT_EQ(meta.text, "256 64\n") << meta.text;
}

// A contract string with no NUL within 4096 bytes is read no further: the entry's cases are
// errors naming it.
TEST_F(LibraryIsolation, AContractStringIsReadUpToItsBound) {
  const fs::path out = dir("out");
  const Output o =
      sh("ATTNCHECK_FAKE_CONTRACT=" + std::string(5000, 'x') + " " + at() +
         " run --tier smoke --op page_indices --kernels " + kFake + " --out " + out.string());
  EXPECT_EQ(o.status, 1) << o.text;
  const std::string results = read(out / "results.jsonl");
  EXPECT_TRUE(has(results, "(not NUL-terminated within 4096 bytes)")) << results;
  EXPECT_FALSE(has(results, std::string(4097, 'x'))) << results;
}

// Regression: `kernels` and `repro` loaded the library in their own process: a NULL function in
// its table crashed them (SIGSEGV), a constructor or device query that hung hung them, and a
// constructor that called _exit(0) ended them with status 0 and no output.
TEST_F(LibraryIsolation, KernelsAndReproNameALibraryThatCannotLoad) {
  struct Load {
    std::string how, reason;
    bool device_only;  // only a device query hangs: `kernels` asks for none
  };
  const std::vector<Load> loads = {
      {"null_table", "has NULL function pointers: run, roofline", false},
      {"segfault", "ended with SIGSEGV", false},
      {"exit", "ended with exit status 0 before it reported the library", false},
      {"hang", "did not finish loading within 2 s", false},
      {"hang_device", "did not finish loading within 2 s", true}};
  for (const auto& l : loads) {
    const std::string env = "ATTNCHECK_FAKE_LOAD=" + l.how + " timeout 120 ";
    if (!l.device_only) {
      const Output k = sh(env + at() + " kernels --import-timeout 2 --kernels " + kFake);
      EXPECT_EQ(k.status, 2) << l.how << "\n" << k.text;
      EXPECT_TRUE(has(k.text, kFake)) << l.how << "\n" << k.text;
      EXPECT_TRUE(has(k.text, l.reason)) << l.how << "\n" << k.text;
    }
    const Output r = sh(env + at() + " repro " + kCase + " --import-timeout 2 --kernels " + kFake);
    EXPECT_EQ(r.status, 2) << l.how << "\n" << r.text;
    EXPECT_TRUE(has(r.text, kFake)) << l.how << "\n" << r.text;
    EXPECT_TRUE(has(r.text, l.reason)) << l.how << "\n" << r.text;
  }
  // Loaded cleanly, the library is listed as before.
  const Output ok = sh(at() + " kernels --check --kernels " + kFake);
  EXPECT_EQ(ok.status, 0) << ok.text;
  EXPECT_TRUE(has(ok.text, "every entry the ops ask for is present")) << ok.text;
}

// Regression: `run` said only "the worker process (...) failed to start three times", naming
// neither the library nor what ended its workers.
TEST_F(LibraryIsolation, RunNamesTheLibraryWhoseWorkersCannotStart) {
  const Output o =
      sh("ATTNCHECK_FAKE_LOAD=exit timeout 120 " + at() + " run --tier smoke --kernels " + kFake +
         " --jobs 1 --out " + dir("out").string());
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "of kernel library '" + kFake + "' failed to start three times"))
      << o.text;
  EXPECT_TRUE(has(o.text, "died with exit status 0 before its hello")) << o.text;
  const Output t = sh("ATTNCHECK_FAKE_LOAD=null_table timeout 120 " + at() +
                      " run --tier smoke --kernels " + kFake + " --out " + dir("out2").string());
  EXPECT_EQ(t.status, 2) << t.text;
  EXPECT_TRUE(has(t.text, kFake + "': its table (attncheck_plugin_v1) has NULL function pointers"))
      << t.text;
}

// Regression: `setsid sleep 3600` started by a library survived the worker (it left the worker's
// process group): 5 processes per run were left behind.
TEST_F(LibraryIsolation, ProcessesThatDetachEndWithTheirWorker) {
  const std::string seconds = "3600." + std::to_string(::getpid());
  for (const std::string fault : {"detach", "detach_and_hang"}) {
    const fs::path out = dir("out_" + fault);
    const Output o =
        sh("ATTNCHECK_FAKE_FAULT=" + fault + " ATTNCHECK_FAKE_SLEEP=" + seconds +
           " ATTNCHECK_FAKE_FAULT_WHEN='{\"kernel_block_size\":16}' " + at() +
           " run --tier smoke --kernels " + kFake + " --timeout 3 --out " + out.string());
    EXPECT_TRUE(o.status == 0 || o.status == 1) << fault << "\n" << o.text;
    for (int i = 0; i < 20 && !sleeping(seconds).empty(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto left = sleeping(seconds);
    EXPECT_TRUE(left.empty()) << fault << ": " << left.size() << " `setsid sleep` left running\n"
                              << o.text;
    for (int pid : left) ::kill(pid, SIGKILL);
    if (fault == "detach")
      EXPECT_TRUE(has(read(out / "worker.log"), "still run")) << read(out / "worker.log");
    else
      EXPECT_TRUE(has(read(out / "results.jsonl"), "timed out after 3 s")) << o.text;
  }
}

// Regression: run.json said "workers": 1024 for --jobs 1024 when the run started 111.
TEST_F(LibraryIsolation, RunJsonCountsTheWorkersStarted) {
  const fs::path out = dir("out");
  const Output o =
      sh(at() + " run --tier smoke --kernels " + kFake + " --jobs 64 --out " + out.string());
  EXPECT_EQ(o.status, 0) << o.text;
  const auto run = nlohmann::json::parse(read(out / "run.json"));
  int started = 0;
  for (const auto& p : run["pools"]) started += p["worker_starts"].get<int>();
  EXPECT_GE(started, 1) << run;
  EXPECT_LE(started, 6) << run;  // six cases
  EXPECT_EQ(run["workers"], started) << run;
}

// Regression: `golden verify` read only what evaluation reads; a golden whose root `op`,
// `generator`, or a case's `params` were edited (MANIFEST updated to match) still verified.
TEST_F(LibraryIsolation, GoldenVerifyCoversEveryStoredAttribute) {
  const std::vector<std::pair<std::string, std::string>> edits = {
      {"f.attrs['op'] = 'other_op'", "attribute 'op' is 'other_op', not 'page_indices'"},
      {"f.attrs['generator'] = 'by hand'", "attribute 'generator' is 'by hand'"},
      {"f.attrs['comment'] = 'x'", "attributes 'comment' are not written"},
      {"g = f['cases'][sorted(f['cases'])[0]]; p = json.loads(g.attrs['params']); "
       "p['edited'] = 1; g.attrs['params'] = json.dumps(p)",
       "are not the case's"},
      {"f.attrs['case_count'] = 99", "attribute 'case_count' is 99, but the file holds"}};
  for (const auto& [edit, expected] : edits) {
    const fs::path copy = golden_copy();
    const fs::path file = copy / "page_indices.h5";
    // The edit, then MANIFEST made to match it, as someone hiding a change would.
    const Output e =
        sh("/usr/bin/python3 -c \"import h5py, json, hashlib, os\n"
           "f = h5py.File('" +
           file.string() + "', 'r+')\n" + edit +
           "\nf.close()\n"
           "m = '" +
           (copy / "MANIFEST").string() +
           "'\n"
           "data = open('" +
           file.string() +
           "', 'rb').read()\n"
           "lines = []\n"
           "for l in open(m).read().splitlines():\n"
           "    p = l.split()\n"
           "    if p and p[-1] == 'page_indices.h5':\n"
           "        l = ' '.join([hashlib.sha256(data).hexdigest(), str(len(data)), p[2], p[3]])\n"
           "    lines.append(l)\n"
           "open(m, 'w').write(chr(10).join(lines) + chr(10))\"");
    ASSERT_EQ(e.status, 0) << e.text;
    const Output o = sh(kBin + " --cases " + kData + "/cases --golden " + copy.string() +
                        " golden verify --op page_indices");
    EXPECT_EQ(o.status, 1) << edit << "\n" << o.text;
    EXPECT_TRUE(has(o.text, "FAIL " + file.string() + ": ")) << edit << "\n" << o.text;
    EXPECT_TRUE(has(o.text, expected)) << edit << "\n" << o.text;
  }
  // The unedited set verifies.
  const Output clean = sh(at() + " golden verify --op page_indices");
  EXPECT_EQ(clean.status, 0) << clean.text;
}

}  // namespace
