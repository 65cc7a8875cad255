// libFuzzer target: the case-file loader (run/cases.h) on arbitrary bytes. A bad file must end in
// CaseFileError naming it; anything else (a sanitizer report, an uncaught exception, a hang, more
// than the RSS limit) is a bug.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "fuzz_util.h"
#include "run/cases.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = attncheck::fuzz::write_input("case.toml", data, size);
  try {
    const attncheck::CaseFile f = attncheck::load_case_file(path);
    // Selection reads every expanded case, as `attncheck list` does.
    size_t n = 0;
    for (const auto& [tier, cases] : f.tiers) n += cases.size();
    (void)n;
  } catch (const attncheck::CaseFileError&) {
  }
  return 0;
}
