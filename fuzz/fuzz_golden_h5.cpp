// libFuzzer target: reading a golden file (run/golden.h probe_golden_file), as `golden verify`,
// `run` and `repro` do once its MANIFEST line matched: every case's attributes and outputs, parsed
// in a child process so that libhdf5 crashing or looping on damaged metadata is reported, not
// fatal. The fuzzer counts a crash or hang of this process (the parent) or a sanitizer report in
// our code; a child that libhdf5 kills is the expected outcome for some inputs and is counted
// separately (printed at exit).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "fuzz_util.h"
#include "run/golden.h"

namespace {
attncheck::fuzz::ChildReadTally g_tally{"fuzz_golden_h5"};
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::atexit([] { g_tally.report(); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto dir = attncheck::fuzz::work_dir() / "golden";
  std::filesystem::create_directories(dir);
  attncheck::fuzz::write_input("golden/page_indices.h5", data, size);
  g_tally.add(attncheck::probe_golden_file(dir.string(), "page_indices", 10.0));
  return 0;
}
