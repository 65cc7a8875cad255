"""Writes of the report (report.html, summary.md, merged results): never through a symbolic link,
into a FIFO or device, or over a directory; always a fresh temporary file with an unpredictable
name (mkstemp) in the target's directory, fsynced and renamed onto the target. The same rules as
the C++ writers (harness/core/safe_output.h)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path


class UnsafeTarget(OSError):
    """The target exists and is not a regular file."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def require_replaceable(path: Path) -> None:
    """Raises UnsafeTarget unless `path` is missing or a regular file (a link is not followed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeTarget(f"refusing to replace '{path}': it is {_kind(st.st_mode)} (only missing"
                           " paths and regular files are written)")


def make_directory(path: Path, name: str) -> None:
    """Creates the directory `path` (and its parents) for writing into; OSError with a one-line
    reason, naming it as `name` (the option it came from), when it cannot be one: a file or device
    there, a file above it, a read-only file system."""
    path = Path(path)
    try:
        st = path.stat()  # a link to a directory is followed: the files are written inside it
    except FileNotFoundError:
        st = None
    except OSError as e:  # a file above it (ENOTDIR), a loop of links, ...
        raise OSError(f"{name} '{path}': cannot be used ({e.strerror or e})") from None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{name} '{path}': exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(f"{name} '{path}': cannot be created ({e.strerror or e})") from None


def _replace_with(path: Path, fill) -> None:
    path = Path(path)
    require_replaceable(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as fh:
            fill(fh)
            fh.flush()
            os.fsync(fh.fileno())
        require_replaceable(path)  # again: it may have changed while we wrote
        os.replace(tmp, path)  # replaces a link planted meanwhile, never writes through it
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_text(path: Path, text: str) -> None:
    """Replaces `path` with `text` (UTF-8)."""
    data = text.encode("utf-8")
    _replace_with(path, lambda fh: fh.write(data))


def write_bytes(path: Path, data: bytes) -> None:
    """Replaces `path` with `data`."""
    _replace_with(path, lambda fh: fh.write(data))


def read_regular(path: Path) -> bytes:
    """The bytes of the regular file `path`; OSError (UnsafeTarget among them) for a link, a FIFO
    or anything else there: a planted link must not pull another file into a report."""
    with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW | os.O_NONBLOCK)) as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeTarget(f"refusing to read '{path}': it is {_kind(st.st_mode)}")
        return fh.read()


def copy_file(src: Path, dst: Path) -> None:
    """Copies the regular file `src` to `dst` (a link at `src` is not followed either)."""
    src_st = os.lstat(src)
    if not stat.S_ISREG(src_st.st_mode):
        raise UnsafeTarget(f"refusing to copy '{src}': it is {_kind(src_st.st_mode)}")

    def fill(fh):
        with open(src, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW | os.O_NONBLOCK)) as s:
            shutil.copyfileobj(s, fh)

    _replace_with(dst, fill)
