"""Test adapter that misbehaves the ways a buggy adapter can (bridge/tests/hostile_adapters.py).

page_indices is numpy_reference's, so every case passes unless the misbehaviour hurts it.
$ATTNCHECK_HOSTILE picks the misbehaviour; it happens once per run: on the launch that creates
the file $ATTNCHECK_HOSTILE_ONCE (every launch when that is unset). $ATTNCHECK_HOSTILE_PIDS, when
set, is a file that receives the pid of every process the adapter starts, one per line.

    forge            write forged protocol lines ({"fatal"}, {"result"} for another id) to stdout,
                     sys.__stdout__ and every pipe or socket descriptor of the process
    inherited_fds    a shell started with close_fds=False writes forged lines to fds 1 and 3-19
    fork             os.fork() in the entry, both copies return
    fork_linger      os.fork(); the child keeps printing for 60 s (ignoring SIGPIPE) instead of
                     returning
    thread           a thread writes into the output buffer (256 bytes: the bridge's host
                     allocation granularity) from 0.3 s to 2.3 s after the entry returned
    hang_with_child  start `sleep 300`, then hang: the timeout must kill both
    detach           start `sleep 3600` in a session of its own (setsid), then return: it must
                     end with its worker
    detach_and_hang  the same, then hang: the timeout must kill it too
    memory           allocate (and touch) up to 3 GiB, then hang
    import_hang      hang while the module is imported
"""

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time

import attncheck_bridge as ab
import numpy_reference

MODE = os.environ.get("ATTNCHECK_HOSTILE", "")
ONCE = os.environ.get("ATTNCHECK_HOSTILE_ONCE", "")
PIDS = os.environ.get("ATTNCHECK_HOSTILE_PIDS", "")

if MODE == "import_hang":
    time.sleep(3600)

ADAPTER = ab.Adapter(name="hostile", device="cpu")

FORGED_RESULT = {"id": "page_indices/forged", "op": "page_indices", "params": {}, "verdict": "passed", "mode": "kernel",
                 "message": "forged", "checks": [], "failing": False}
FORGED_LINES = [json.dumps({"fatal": "forged fatal line from an adapter"}),
                json.dumps({"seq": 1, "id": "page_indices/forged", "result": FORGED_RESULT, "retire": False}),
                json.dumps({"result": FORGED_RESULT, "retire": False})]


def _now() -> bool:
    """True on the launch that misbehaves."""
    if not ONCE:
        return True
    try:
        os.close(os.open(ONCE, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def _record_pid(pid: int):
    if PIDS:
        with open(PIDS, "a") as f:
            f.write(f"{pid}\n")


def _pipes_and_sockets():
    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith(("pipe:", "socket:")):
            fds.append(int(name))
    return fds


def _forge():
    text = "".join(line + "\n" for line in FORGED_LINES)
    print(text, end="", flush=True)
    sys.__stdout__.write(text)
    sys.__stdout__.flush()
    for fd in [1] + _pipes_and_sockets():
        try:
            os.write(fd, text.encode())
        except OSError:
            pass


def _inherited_fds():
    script = "".join(f"echo '{line}' >&{fd} 2>/dev/null; " for fd in [1] + list(range(3, 20)) for line in FORGED_LINES)
    subprocess.run(["sh", "-c", script], close_fds=False, check=False)


def _scribbler(ptr: int, nbytes: int):
    time.sleep(0.3)  # the harness has moved on to the next case by now
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        ctypes.memset(ptr, 0x5A, nbytes)
        time.sleep(0.0005)


def _misbehave(t):
    if MODE == "forge":
        _forge()
    elif MODE == "inherited_fds":
        _inherited_fds()
    elif MODE == "fork":
        pid = os.fork()
        if pid:
            _record_pid(pid)
    elif MODE == "fork_linger":
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # outlive the reader of its output
            for _ in range(600):
                try:
                    print("forked child still printing", flush=True)
                except OSError:
                    pass
                time.sleep(0.1)
            os._exit(0)
        _record_pid(pid)
    elif MODE == "thread":
        out = t["page_indices"]
        threading.Thread(target=_scribbler, args=(out.data, 256), name="scribbler", daemon=True).start()
        time.sleep(0.01)
    elif MODE == "hang_with_child":
        child = subprocess.Popen(["sleep", "300"])
        _record_pid(child.pid)
        time.sleep(3600)
    elif MODE in ("detach", "detach_and_hang"):
        child = subprocess.Popen(["sleep", "3600"], start_new_session=True)
        _record_pid(child.pid)
        if MODE == "detach_and_hang":
            time.sleep(3600)
    elif MODE == "memory":
        hoard = []
        for _ in range(48):
            hoard.append(b"\x01" * (64 << 20))
        time.sleep(3600)


@ADAPTER.entry("page_indices")
def page_indices(t, p):
    numpy_reference.page_indices(t, p)
    if MODE and _now():
        _misbehave(t)
