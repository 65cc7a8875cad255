// libFuzzer target: reading a repro bundle back (run/results.h read_repro_bundle: every
// attribute, input, expected and actual dataset), in a child process as every reader of an
// untrusted HDF5 file here does. Counts as for fuzz_golden_h5.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "fuzz_util.h"
#include "run/results.h"

namespace {
attncheck::fuzz::ChildReadTally g_tally{"fuzz_bundle_h5"};
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::atexit([] { g_tally.report(); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = attncheck::fuzz::write_input("bundle.h5", data, size);
  g_tally.add(attncheck::check_repro_bundle(path, 10.0));
  return 0;
}
