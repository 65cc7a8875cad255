// Every file attncheck writes goes through here (results.jsonl, run.json, junit.xml, worker.log,
// MANIFEST, goldens, repro bundles, bench JSON): runs happen as root in CI, often into shared
// directories, so a write must never follow a planted symbolic link, block on a FIFO, write into a
// device, or truncate a file it did not create.
//
// - Names are opened relative to a handle on their directory (openat), with O_NOFOLLOW: a symbolic
//   link as the final component is refused, not followed; so are directories, FIFOs, sockets and
//   devices (opened O_NONBLOCK, checked with fstat before a byte is written).
// - Replaced files are written to an unpredictable temporary name in the same directory, created
//   with O_EXCL (nothing planted there in advance can receive the data), fsynced and renamed onto
//   the final name (rename replaces a link, never writes through it), then the directory is synced.
// - Streams written as they go (results.jsonl) are fresh files: an existing one is unlinked and a
//   new one created with O_EXCL, so no other file's contents are ever truncated.
// Every failure throws std::runtime_error naming the path.
#pragma once
#include <filesystem>
#include <string>
#include <string_view>

namespace attncheck {

// A directory opened once; names are resolved relative to it.
class DirHandle {
 public:
  // Opens `dir` (created with its parents when missing and `create` is set). A `dir` that is a
  // symbolic link to a directory is accepted (a symlinked results directory is a user's choice);
  // what is written inside it is not followed.
  static DirHandle open(const std::filesystem::path& dir, bool create = true);
  // The directory that holds `file` (".", when it has none).
  static DirHandle parent_of(const std::filesystem::path& file, bool create = true);

  DirHandle(DirHandle&& o) noexcept;
  DirHandle& operator=(DirHandle&& o) noexcept;
  DirHandle(const DirHandle&) = delete;
  DirHandle& operator=(const DirHandle&) = delete;
  ~DirHandle();

  int fd() const { return fd_; }
  const std::filesystem::path& path() const { return path_; }
  // Takes an exclusive advisory lock on the directory (flock), held until this handle closes;
  // false when another process holds it. Children started with fork + exec do not keep it
  // (close-on-exec).
  bool try_lock_exclusive();

 private:
  DirHandle() = default;
  std::filesystem::path path_;
  int fd_ = -1;
};

// "" when `name` in `dir` is missing or a regular file, else what it is ("a symbolic link",
// "a FIFO", "a directory", ...).
std::string unsafe_kind(const DirHandle& dir, const std::string& name);
// Throws naming the path unless unsafe_kind() is "".
void require_replaceable_at(const DirHandle& dir, const std::string& name);

// Replaces <dir>/<name> with `text` atomically (temporary name, fsync, rename, directory fsync).
void write_file_atomic_at(const DirHandle& dir, const std::string& name, std::string_view text);
// The same for a path; its directory is created when missing.
void write_file_safely(const std::filesystem::path& path, std::string_view text);

// A file made by a writer that takes a path (libhdf5): an unpredictable temporary name is reserved
// in the target's directory (created empty with O_EXCL), the writer writes there, and commit()
// renames it onto the target. Destroyed without commit(), the temporary file is removed.
class StagedFile {
 public:
  explicit StagedFile(const std::filesystem::path& target);
  StagedFile(StagedFile&& o) noexcept;
  StagedFile& operator=(StagedFile&& o) noexcept;
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;
  ~StagedFile();

  const std::filesystem::path& target() const { return target_; }
  std::filesystem::path temp_path() const;  // what the writer opens
  // fsyncs the temporary file, checks the target again (missing or regular) and renames.
  void commit();
  void discard() noexcept;

 private:
  std::filesystem::path target_;
  DirHandle dir_;
  std::string temp_name_;
};

// A file written as it goes (results.jsonl, worker.log). Every write is checked (ENOSPC, EFBIG).
class OutputStream {
 public:
  enum class Mode {
    fresh,   // any existing regular file is replaced by a new, empty one
    append,  // an existing regular file (one hard link) is appended to; created when missing
  };
  OutputStream(const std::filesystem::path& path, Mode mode);
  OutputStream(OutputStream&& o) noexcept;
  OutputStream& operator=(OutputStream&& o) noexcept;
  OutputStream(const OutputStream&) = delete;
  OutputStream& operator=(const OutputStream&) = delete;
  ~OutputStream();

  void write(std::string_view text);  // one write(2) loop, no user-space buffer
  int fd() const { return fd_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace attncheck
