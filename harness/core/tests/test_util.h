// Small helpers shared by the core tests.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <stdexcept>
#include <string>

#include <unistd.h>

namespace attncheck::testing_util {

// EXPECT_TRUE(Contains(message, "expected bf16")) prints the whole message when it fails.
inline ::testing::AssertionResult Contains(const std::string& haystack, const std::string& needle) {
  if (haystack.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "\"" << haystack << "\" does not contain \"" << needle << "\"";
}

// The message of the exception of type E that `fn` throws; a test failure (and "") if none.
template <class E = std::exception, class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception thrown";
  return "";
}

// Same value, NaN equal to NaN, and the sign of zero respected (codec tests against a definition).
inline ::testing::AssertionResult SameValue(double expected, double actual) {
  if (std::isnan(expected) && std::isnan(actual)) return ::testing::AssertionSuccess();
  if (expected == actual && std::signbit(expected) == std::signbit(actual))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected " << expected << ", got " << actual;
}

// An empty directory of the running test's own: <tmp>/attncheck_<what>_<pid>_<test name>, removed
// first when an earlier run left it.
inline std::filesystem::path fresh_test_dir(const std::string& what) {
  const std::filesystem::path d = std::filesystem::temp_directory_path() /
                                  ("attncheck_" + what + "_" + std::to_string(::getpid()) + "_" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace attncheck::testing_util
