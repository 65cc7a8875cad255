// Small helpers shared by the core tests.
#pragma once
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

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

}  // namespace attncheck::testing_util
