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
size_t g_inputs = 0, g_unreadable = 0, g_child_died = 0;
void report() {
  std::fprintf(stderr,
               "fuzz_golden_h5: %zu inputs, %zu reported unreadable, %zu of them ended the "
               "reading child (libhdf5 crash or timeout)\n",
               g_inputs, g_unreadable, g_child_died);
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::atexit(report);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto dir = attncheck::fuzz::work_dir() / "golden";
  std::filesystem::create_directories(dir);
  attncheck::fuzz::write_input("golden/page_indices.h5", data, size);
  ++g_inputs;
  const std::string why = attncheck::probe_golden_file(dir.string(), "page_indices", 10.0);
  if (!why.empty()) {
    ++g_unreadable;
    if (why.find("crashed with signal") != std::string::npos ||
        why.find("timed out") != std::string::npos ||
        why.find("exited with status") != std::string::npos)
      ++g_child_died;
  }
  return 0;
}
