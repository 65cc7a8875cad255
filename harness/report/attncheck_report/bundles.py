"""Repro bundles read for the report in a child process, one bundle at a time under a time limit.

A bundle is an HDF5 file that may come from anywhere (a CI artifact, a colleague): h5py raises
whatever libhdf5 reports on damaged metadata (OSError, RuntimeError, KeyError, ValueError, ...),
and libhdf5 itself can crash or loop on some files (docs/fuzzing.md). The reader runs in a child
interpreter, so no bundle can end or hang the report: each one comes back as its contents or as
"unreadable: <why>". `python3 -m attncheck_report.bundles` is that child: one path per stdin line,
one JSON line per path on stdout."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

# Reading a bundle's dataset list takes milliseconds; this allows a loaded CI machine.
BUNDLE_TIMEOUT_S = 20.0
MAX_ITEMS = 24


def bundle_timeout_s(environ=os.environ) -> float:
    """BUNDLE_TIMEOUT_S, or $ATTNCHECK_BUNDLE_READ_TIMEOUT (seconds, > 0 and <= 3600)."""
    text = environ.get("ATTNCHECK_BUNDLE_READ_TIMEOUT", "")
    if not text:
        return BUNDLE_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 3600:  # also false for NaN
        raise ValueError(f"ATTNCHECK_BUNDLE_READ_TIMEOUT='{text}': expected seconds, > 0 and"
                         " <= 3600")
    return value


def describe(path: str) -> dict:
    """{"contents": "name[shape], ..."} or {"unreadable": why}; never raises."""
    try:
        import h5py  # noqa: PLC0415
    except ImportError:
        return {"contents": ""}
    items = []
    try:
        with h5py.File(path, "r") as f:
            f.visititems(lambda name, obj: items.append(f"{name}{list(obj.shape)}")
                         if isinstance(obj, h5py.Dataset) else None)
    except Exception as e:  # noqa: BLE001 - every h5py/libhdf5 failure means "unreadable"
        return {"unreadable": f"{type(e).__name__}: {e}"[:300]}
    text = ", ".join(items[:MAX_ITEMS])
    return {"contents": text + (f", … {len(items) - MAX_ITEMS} more"
                                if len(items) > MAX_ITEMS else "")}


def _die_with_parent():
    """In the child before exec: killed when the report dies (Linux PR_SET_PDEATHSIG)."""
    try:
        import ctypes  # noqa: PLC0415
        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass


class BundleReader:
    """Describes bundles through a child process, restarted after a crash or a timeout."""

    def __init__(self, timeout_s: float = None):
        self.timeout_s = bundle_timeout_s() if timeout_s is None else timeout_s
        self.child = None

    def _start(self):
        pkg_dir = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ, PYTHONPATH=pkg_dir + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.child = subprocess.Popen(
            [sys.executable, "-m", "attncheck_report.bundles"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, start_new_session=True,
            preexec_fn=_die_with_parent)

    def _stop(self):
        if self.child is None:
            return
        try:
            os.killpg(self.child.pid, 9)
        except ProcessLookupError:
            pass
        self.child.wait()
        self.child = None

    def close(self):
        self._stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def describe(self, path: Path) -> dict:
        if "\n" in str(path):
            return {"unreadable": "a newline in its path"}
        if self.child is None or self.child.poll() is not None:
            self._start()
        try:
            self.child.stdin.write((str(path) + "\n").encode())
            self.child.stdin.flush()
        except OSError:
            self._stop()
            return {"unreadable": "the reading process died"}
        line = b""
        deadline = time.monotonic() + self.timeout_s
        fd = self.child.stdout.fileno()
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                self._stop()
                return {"unreadable": f"reading it timed out after {self.timeout_s:g} s"
                                      " (libhdf5 looping on damaged metadata?)"}
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                status = self.child.wait()
                self.child = None
                why = f"signal {-status}" if status < 0 else f"exit status {status}"
                return {"unreadable": f"the reading process ended ({why}; libhdf5 crashed?)"}
            line += chunk
        try:
            return json.loads(line)
        except ValueError:
            self._stop()
            return {"unreadable": "the reading process answered garbage"}


def child_main() -> int:
    for raw in sys.stdin:
        sys.stdout.write(json.dumps(describe(raw.rstrip("\n"))) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(child_main())
