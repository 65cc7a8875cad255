// libFuzzer target: the kernel-parameter JSON every kernel entry parses (ack::KParams,
// kernels_under_test/kernel_api.h). Malformed or hostile parameters must become a refusal or an
// exception the entry wrapper turns into an error, never undefined behaviour.
#include <cstdint>
#include <exception>
#include <string>

#include "kernel_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string json(reinterpret_cast<const char*>(data), size);
  try {
    const ack::KParams p(json.c_str());
    // The accessors the entries use, on the keys they use and on a missing one.
    for (const char* key : {"heads", "block_size", "scale", "fp8_format", "causal", "missing"}) {
      try {
        (void)p.i(key);
      } catch (const ack::Refusal&) {
      }
      try {
        (void)p.f(key);
        (void)p.b(key);
      } catch (const ack::Refusal&) {
      }
      try {
        (void)p.s(key);
      } catch (const ack::Refusal&) {
      }
      (void)p.i_or(key, 7);
    }
  } catch (const std::exception&) {
    // nlohmann::json::parse_error, ack::Refusal: the entry reports these as errors or refusals.
  }
  return 0;
}
