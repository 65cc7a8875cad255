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

}  // namespace attncheck::fuzz
