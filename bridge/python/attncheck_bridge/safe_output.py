"""The bridge's one way to write a file, the Python side of harness/core/safe_output.cpp.

``attncheck repro --export pytest`` runs as whoever runs attncheck, often root on a shared CI
runner, into directories others can write: a write must never follow a planted symbolic link, block
on a FIFO, write into a device (/dev/null included) or truncate a file it did not create.

- The target's directory is opened once (created with its parents when missing); the name is
  checked relative to that handle with lstat: only a missing name or a regular file is replaced.
- The bytes go to an unpredictable temporary name in the same directory, created with O_EXCL and
  O_NOFOLLOW (nothing planted in advance receives them), fsynced, then renamed onto the name
  (rename replaces a link, never writes through it); the directory is fsynced last.

Every refusal raises ``UnsafeOutput`` naming the path and what is there.
"""

import os
import secrets
import stat


class UnsafeOutput(OSError):
    """The output path cannot be written safely; the message names the path and why."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def _require_replaceable(dir_fd: int, name: str, path: str) -> None:
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeOutput(f"{path}: refusing to write: it is {_kind(st.st_mode)}")


def check_replaceable(path) -> None:
    """Raises ``UnsafeOutput`` unless ``path`` is missing or a regular file (checked before any of
    several files is written, so that a refused one never leaves the others half done)."""
    path = os.fspath(path)
    directory, name = os.path.split(path)
    try:
        dir_fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # created on write
    try:
        _require_replaceable(dir_fd, name, path)
    finally:
        os.close(dir_fd)


def write_bytes_safely(path, data: bytes) -> None:
    """Replaces ``path`` with ``data`` atomically (see the module docstring)."""
    path = os.fspath(path)
    directory, name = os.path.split(path)
    if not name or name in (".", ".."):
        raise UnsafeOutput(f"{path}: not a file name")
    directory = directory or "."
    os.makedirs(directory, exist_ok=True)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _require_replaceable(dir_fd, name, path)
        temp = f".{name}.tmp-{secrets.token_hex(8)}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                     dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb", closefd=True) as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            _require_replaceable(dir_fd, name, path)  # again: something may have been planted since
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(temp, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            raise
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_text_safely(path, text: str) -> None:
    write_bytes_safely(path, text.encode())
