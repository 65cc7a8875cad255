// Shared by the fuzz targets: where an input is written when the reader under test takes a path.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace attncheck::fuzz {

// A private directory per fuzzing process (libFuzzer -jobs runs several in one directory).
inline const std::filesystem::path& work_dir() {
  static const std::filesystem::path dir = [] {
    std::string tmpl = (std::filesystem::temp_directory_path() / "attncheck-fuzz-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    return std::filesystem::path(tmpl);
  }();
  return dir;
}

// Writes the input to <work_dir>/<name> and returns the path.
inline std::string write_input(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = (work_dir() / name).string();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot write " + path);
  if (size > 0 && std::fwrite(data, 1, size, f) != size) throw std::runtime_error("short write");
  std::fclose(f);
  return path;
}

// What the targets that read a file in a child process count: inputs, inputs reported unreadable
// and, of those, the ones that ended the reading child (libhdf5 crashing or looping, expected for
// some damaged files); printed at exit.
struct ChildReadTally {
  const char* target;
  size_t inputs = 0, unreadable = 0, child_died = 0;

  void add(const std::string& why) {
    ++inputs;
    if (why.empty()) return;
    ++unreadable;
    if (why.find("crashed with signal") != std::string::npos ||
        why.find("timed out") != std::string::npos ||
        why.find("exited with status") != std::string::npos)
      ++child_died;
  }
  void report() const {
    std::fprintf(stderr,
                 "%s: %zu inputs, %zu reported unreadable, %zu of them ended the reading child "
                 "(libhdf5 crash or timeout)\n",
                 target, inputs, unreadable, child_died);
  }
};

}  // namespace attncheck::fuzz
