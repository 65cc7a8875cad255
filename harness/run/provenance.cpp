#include "provenance.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#ifndef ATTNCHECK_VERSION
#define ATTNCHECK_VERSION "unknown"
#endif
#ifndef ATTNCHECK_SOURCE_DIR
#define ATTNCHECK_SOURCE_DIR "."
#endif

namespace attncheck {

namespace {
// stdout of a shell command (stderr discarded), trailing newline removed; nullopt-like "" + ok.
bool capture(const std::string& cmd, std::string& out) {
  out.clear();
  FILE* p = ::popen((cmd + " 2>/dev/null").c_str(), "r");
  if (!p) return false;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int rc = ::pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return rc == 0;
}
std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}
}  // namespace

std::string attncheck_version() {
  return ATTNCHECK_VERSION;
}

std::string default_root() {
  const char* env = std::getenv("ATTNCHECK_ROOT");
  return env && *env ? env : ATTNCHECK_SOURCE_DIR;
}

std::string git_revision(const std::string& root) {
  std::string rev, dirty;
  if (!capture("git -C " + quote(root) + " rev-parse HEAD", rev) || rev.empty()) {
    // A copy without .git (a CI artifact, a device machine): the revision the job says it runs.
    for (const char* var : {"ATTNCHECK_GIT_REVISION", "GITHUB_SHA"})
      if (const char* v = std::getenv(var); v && *v) return v;
    return "unknown";
  }
  capture("git -C " + quote(root) + " status --porcelain --untracked-files=no", dirty);
  return dirty.empty() ? rev : rev + "+dirty";
}

std::string toolchain() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("gcc ") + __VERSION__;
#else
  return "unknown compiler";
#endif
}

std::string utc_now_iso() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace attncheck
