// libFuzzer target: reading a repro bundle back (run/results.h read_repro_bundle: every
// attribute, input, expected and actual dataset), in a child process as every reader of an
// untrusted HDF5 file here does. Counts as for fuzz_golden_h5.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "fuzz_util.h"
#include "run/results.h"

namespace {
size_t g_inputs = 0, g_unreadable = 0, g_child_died = 0;
void report() {
  std::fprintf(stderr,
               "fuzz_bundle_h5: %zu inputs, %zu reported unreadable, %zu of them ended the "
               "reading child (libhdf5 crash or timeout)\n",
               g_inputs, g_unreadable, g_child_died);
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::atexit(report);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = attncheck::fuzz::write_input("bundle.h5", data, size);
  ++g_inputs;
  const std::string why = attncheck::check_repro_bundle(path, 10.0);
  if (!why.empty()) {
    ++g_unreadable;
    if (why.find("crashed with signal") != std::string::npos ||
        why.find("timed out") != std::string::npos ||
        why.find("exited with status") != std::string::npos)
      ++g_child_died;
  }
  return 0;
}
