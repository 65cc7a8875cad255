#include "safe_output.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace attncheck {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail_errno(const fs::path& path, const std::string& what, int err) {
  throw std::runtime_error("cannot write '" + path.string() + "': " + what + ": " +
                           std::strerror(err));
}

const char* kind_of(mode_t mode) {
  return S_ISDIR(mode)    ? "a directory"
         : S_ISLNK(mode)  ? "a symbolic link"
         : S_ISCHR(mode)  ? "a character device"
         : S_ISBLK(mode)  ? "a block device"
         : S_ISFIFO(mode) ? "a FIFO"
         : S_ISSOCK(mode) ? "a socket"
                          : "not a regular file";
}

[[noreturn]] void refuse(const fs::path& path, const std::string& kind) {
  throw std::runtime_error("refusing to replace '" + path.string() + "': it is " + kind +
                           " (only missing paths and regular files are written)");
}

void write_all(int fd, std::string_view text, const fs::path& path) {
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_errno(path, "write", n < 0 ? errno : EIO);
    off += static_cast<size_t>(n);
  }
}

// 16 hex digits from the kernel's random source: a temporary name nobody can plant in advance.
std::string random_suffix() {
  unsigned char bytes[8];
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(std::string("getrandom: ") + std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char b : bytes) {
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

// Creates "<name>.tmp.<random>" in dir with O_EXCL | O_NOFOLLOW; returns its fd and sets `temp`.
int create_temp(const DirHandle& dir, const std::string& name, std::string& temp) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    temp = name + ".tmp." + random_suffix();
    const int fd = ::openat(dir.fd(), temp.c_str(),
                            O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0) return fd;
    if (errno != EEXIST) fail_errno(dir.path() / name, "cannot create a temporary file", errno);
  }
  fail_errno(dir.path() / name, "cannot create a temporary file", EEXIST);
}

void fsync_dir(const DirHandle& dir) {
  ::fsync(dir.fd());  // best effort: some file systems refuse fsync on directories
}

void rename_into_place(const DirHandle& dir, const std::string& temp, const std::string& name) {
  try {
    require_replaceable_at(dir, name);  // again: the target may have changed while we wrote
  } catch (...) {
    ::unlinkat(dir.fd(), temp.c_str(), 0);
    throw;
  }
  if (::renameat(dir.fd(), temp.c_str(), dir.fd(), name.c_str()) != 0) {
    const int err = errno;
    ::unlinkat(dir.fd(), temp.c_str(), 0);
    fail_errno(dir.path() / name, "rename", err);
  }
  fsync_dir(dir);
}

std::string file_name_of(const fs::path& path) {
  const std::string name = path.filename().string();
  if (name.empty() || name == "." || name == "..")
    throw std::runtime_error("cannot write '" + path.string() + "': not a file name");
  return name;
}

}  // namespace

DirHandle DirHandle::open(const fs::path& dir, bool create) {
  const fs::path d = dir.empty() ? fs::path(".") : dir;
  if (create) {
    std::error_code ec;
    fs::create_directories(d, ec);
    if (ec)
      throw std::runtime_error("cannot create directory '" + d.string() + "': " + ec.message());
  }
  DirHandle h;
  h.path_ = d;
  h.fd_ = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (h.fd_ < 0)
    throw std::runtime_error("cannot open directory '" + d.string() + "': " + std::strerror(errno));
  return h;
}

DirHandle DirHandle::parent_of(const fs::path& file, bool create) {
  return open(file.has_parent_path() ? file.parent_path() : fs::path("."), create);
}

DirHandle::DirHandle(DirHandle&& o) noexcept
    : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)) {}

DirHandle& DirHandle::operator=(DirHandle&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

DirHandle::~DirHandle() {
  if (fd_ >= 0) ::close(fd_);
}

bool DirHandle::try_lock_exclusive() {
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) return false;
    throw std::runtime_error("cannot lock directory '" + path_.string() +
                             "': " + std::strerror(errno));
  }
  return true;
}

std::string unsafe_kind(const DirHandle& dir, const std::string& name) {
  struct stat st {};
  if (::fstatat(dir.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return "";
    return std::string("not inspectable (") + std::strerror(errno) + ")";
  }
  return S_ISREG(st.st_mode) ? "" : kind_of(st.st_mode);
}

void require_replaceable_at(const DirHandle& dir, const std::string& name) {
  if (const std::string kind = unsafe_kind(dir, name); !kind.empty())
    refuse(dir.path() / name, kind);
}

void write_file_atomic_at(const DirHandle& dir, const std::string& name, std::string_view text) {
  const fs::path path = dir.path() / name;
  require_replaceable_at(dir, name);
  std::string temp;
  const int fd = create_temp(dir, name, temp);
  try {
    write_all(fd, text, path);
    if (::fsync(fd) != 0) fail_errno(path, "fsync", errno);
  } catch (...) {
    ::close(fd);
    ::unlinkat(dir.fd(), temp.c_str(), 0);
    throw;
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlinkat(dir.fd(), temp.c_str(), 0);
    fail_errno(path, "close", err);
  }
  rename_into_place(dir, temp, name);
}

void write_file_safely(const fs::path& path, std::string_view text) {
  const std::string name = file_name_of(path);
  write_file_atomic_at(DirHandle::parent_of(path), name, text);
}

StagedFile::StagedFile(const fs::path& target)
    : target_(target), dir_(DirHandle::parent_of(target)) {
  const std::string name = file_name_of(target);
  require_replaceable_at(dir_, name);
  const int fd = create_temp(dir_, name, temp_name_);
  ::close(fd);
}

StagedFile::StagedFile(StagedFile&& o) noexcept
    : target_(std::move(o.target_)),
      dir_(std::move(o.dir_)),
      temp_name_(std::exchange(o.temp_name_, "")) {}

StagedFile& StagedFile::operator=(StagedFile&& o) noexcept {
  if (this != &o) {
    discard();
    target_ = std::move(o.target_);
    dir_ = std::move(o.dir_);
    temp_name_ = std::exchange(o.temp_name_, "");
  }
  return *this;
}

StagedFile::~StagedFile() {
  discard();
}

fs::path StagedFile::temp_path() const {
  return dir_.path() / temp_name_;
}

void StagedFile::discard() noexcept {
  if (temp_name_.empty() || dir_.fd() < 0) return;
  ::unlinkat(dir_.fd(), temp_name_.c_str(), 0);
  temp_name_.clear();
}

void StagedFile::commit() {
  if (temp_name_.empty()) throw std::logic_error("StagedFile::commit: nothing staged");
  // The writer may have replaced the reserved file by name (libhdf5 truncates, it does not
  // re-create): it must still be a regular file, not a link planted in its place.
  const int fd = ::openat(dir_.fd(), temp_name_.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = fd < 0 ? errno : EINVAL;
    if (fd >= 0) ::close(fd);
    discard();
    fail_errno(target_, "the staged file is gone or was replaced", err);
  }
  const bool synced = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!synced) {
    discard();
    fail_errno(target_, "fsync of the staged file", err);
  }
  const std::string temp = std::exchange(temp_name_, "");
  rename_into_place(dir_, temp, file_name_of(target_));
}

OutputStream::OutputStream(const fs::path& path, Mode mode) : path_(path) {
  const std::string name = file_name_of(path);
  const DirHandle dir = DirHandle::parent_of(path);
  require_replaceable_at(dir, name);
  int flags = O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
  if (mode == Mode::fresh) {
    // Never truncate an inode we did not create (a hard link planted under this name would pass
    // every check): remove the name, then create it anew, failing if anything took it meanwhile.
    if (::unlinkat(dir.fd(), name.c_str(), 0) != 0 && errno != ENOENT)
      fail_errno(path, "cannot remove the previous file", errno);
    flags |= O_EXCL;
  } else {
    flags |= O_APPEND;
  }
  fd_ = ::openat(dir.fd(), name.c_str(), flags, 0644);
  if (fd_ < 0) {
    const int err = errno;
    if (err == ELOOP) refuse(path, "a symbolic link");
    if (err == EEXIST) fail_errno(path, "created by another process meanwhile", err);
    fail_errno(path, "open", err);
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string kind = kind_of(st.st_mode);
    ::close(std::exchange(fd_, -1));
    refuse(path, kind);
  }
  if (st.st_nlink > 1) {
    ::close(std::exchange(fd_, -1));
    throw std::runtime_error("refusing to append to '" + path.string() + "': it has " +
                             std::to_string(st.st_nlink) +
                             " hard links (another file's contents would change)");
  }
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);  // blocking writes from here on
}

OutputStream::OutputStream(OutputStream&& o) noexcept
    : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)) {}

OutputStream& OutputStream::operator=(OutputStream&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

OutputStream::~OutputStream() {
  if (fd_ >= 0) ::close(fd_);
}

void OutputStream::write(std::string_view text) {
  if (fd_ < 0) throw std::logic_error("OutputStream::write on a closed stream");
  write_all(fd_, text, path_);
}

}  // namespace attncheck
