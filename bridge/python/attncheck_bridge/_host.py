"""The bridge's host side: what libattncheck_pybridge.so calls (not an adapter API).

Every function here returns plain values or raises BridgeError with a message meant for the
harness; run/time never raise: they classify the adapter's exceptions into ABI statuses.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import time as _time
import traceback

from . import Adapter, Refuse, Tensor, Unsupported, kDLCPU, kDLCUDA, kDLROCM

# ABI status codes (kernels_under_test/attncheck_abi.h).
OK, REFUSED, ERROR, UNKNOWN_OP, NO_DEVICE, HOST_ERROR, UNSUPPORTED = 0, 1, 2, 3, 4, 5, 6

TRACEBACK_LINES = 8  # last lines of a traceback kept in a message


class BridgeError(Exception):
    """A failure of the adapter as a whole (load, device); str() is the full message."""

    def __init__(self, message: str, status: int = ERROR):
        super().__init__(message)
        self.status = status


# --------------------------------------------------------------------------------------------
# Loading


def _tail(exc: BaseException, lines: int = TRACEBACK_LINES, skip_own_frame: bool = False) -> str:
    tb = exc.__traceback__
    if skip_own_frame and tb is not None and tb.tb_next is not None:
        tb = tb.tb_next  # the bridge's frame that called the entry: start at the adapter's
    text = "".join(traceback.format_exception(type(exc), exc, tb)).rstrip()
    kept = text.splitlines()[-lines:]
    return "\n".join(kept)


def _summary(exc: BaseException) -> str:
    s = str(exc)
    return f"{type(exc).__name__}: {s}" if s else type(exc).__name__


def load_adapter(spec: str) -> Adapter:
    """Imports the adapter named by ATTNCHECK_PY_ADAPTER: a module name ("numpy_reference",
    "pkg.mod") or a path to a .py file. Returns its ADAPTER; raises BridgeError naming it."""
    if not spec:
        raise BridgeError("ATTNCHECK_PY_ADAPTER is not set (a module name or a path to a .py file)")
    who = f"py adapter '{spec}'"
    is_path = spec.endswith(".py") or os.sep in spec
    try:
        if is_path:
            path = os.path.abspath(spec)
            if not os.path.isfile(path):
                raise BridgeError(f"{who}: no such file {path}")
            name = os.path.splitext(os.path.basename(path))[0]
            # Its directory first on sys.path, so the adapter can import its siblings.
            d = os.path.dirname(path)
            if d not in sys.path:
                sys.path.insert(0, d)
            mspec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(mspec)
            sys.modules[name] = module
            mspec.loader.exec_module(module)
        else:
            module = importlib.import_module(spec)
    except BridgeError:
        raise
    except ModuleNotFoundError as e:
        if e.name and (e.name == spec or spec.startswith(e.name + ".")):
            raise BridgeError(
                f"{who}: module not found (sys.path: {os.pathsep.join(p for p in sys.path if p)}; "
                "set PYTHONPATH or pass a path to the .py file)"
            ) from None
        raise BridgeError(f"{who}: importing it failed: {_summary(e)}\n{_tail(e)}") from None
    except BaseException as e:  # noqa: BLE001 - an adapter import may raise anything, even SystemExit
        raise BridgeError(f"{who}: importing it raised {_summary(e)}\n{_tail(e)}") from None
    adapter = getattr(module, "ADAPTER", None)
    if adapter is None:
        raise BridgeError(
            f"{who}: the module ({getattr(module, '__file__', '?')}) has no ADAPTER "
            "(ADAPTER = attncheck_bridge.Adapter(name=..., device=...) plus @ADAPTER.entry(...) registrations)"
        )
    if not isinstance(adapter, Adapter):
        raise BridgeError(f"{who}: ADAPTER is a {type(adapter).__name__}, not an attncheck_bridge.Adapter")
    if not adapter.entries:
        raise BridgeError(f"{who}: ADAPTER '{adapter.name}' registers no entries (@ADAPTER.entry(\"op\"))")
    return adapter


def describe(adapter: Adapter):
    """(library, device, ops csv) for the C++ side."""
    return adapter.library(), adapter.device, ",".join(adapter.ops())


def entry_contracts(adapter: Adapter):
    """[(entry, declared contract)] for the C++ side (the extension table's ``contract``)."""
    return list(adapter.contracts.items())


def entry_properties(adapter: Adapter):
    """[(entry, "name,name")] for the C++ side (the extension table's ``properties``); entries
    that declare none are left out."""
    return [(e, ",".join(p)) for e, p in adapter.properties.items() if p]


def entry_partials(adapter: Adapter):
    """[(entry, JSON of its partial contract)] for the C++ side (the extension table's
    ``partial``): ``{"not_produced": [...], "unspecified": {output: region}}``; entries that
    declare nothing are left out. attncheck checks the names against the op at load."""
    out = []
    for e in adapter.ops():
        p = adapter.partial_of(e)
        if p["not_produced"] or p["unspecified"]:
            out.append((e, json.dumps(p, separators=(",", ":"))))
    return out


# --------------------------------------------------------------------------------------------
# Device


def _torch(who: str):
    try:
        import torch
    except BaseException as e:  # noqa: BLE001
        raise BridgeError(f"{who}: device 'cuda' needs torch in the embedded Python ({sys.executable}): {_summary(e)}", NO_DEVICE) from None
    return torch


def device_info(adapter: Adapter, spec: str):
    """(name, arch) or BridgeError(status NO_DEVICE / ERROR)."""
    who = f"py adapter '{spec}'"
    if adapter.device == "cpu":
        return f"host (py adapter {spec})", "cpu"
    torch = _torch(who)
    try:
        if not torch.cuda.is_available():
            raise BridgeError(f"{who}: torch.cuda.is_available() is False (torch {torch.__version__})", NO_DEVICE)
        dev = torch.cuda.current_device()
        name = torch.cuda.get_device_name(dev)
        if getattr(torch.version, "hip", None):
            arch = str(getattr(torch.cuda.get_device_properties(dev), "gcnArchName", "gfx")).split(":")[0]
        else:
            major, minor = torch.cuda.get_device_capability(dev)
            arch = f"sm_{major}{minor}"
        return name, arch
    except BridgeError:
        raise
    except BaseException as e:  # noqa: BLE001
        raise BridgeError(f"{who}: CUDA device query failed: {_summary(e)}", NO_DEVICE) from None


def dl_device(adapter: Adapter):
    """(device_type, device_id) the tensors export."""
    if adapter.device == "cpu":
        return kDLCPU, 0
    import torch

    return (kDLROCM if getattr(torch.version, "hip", None) else kDLCUDA), torch.cuda.current_device()


class CudaMemory:
    """The harness's device buffers as torch uint8 tensors, keyed by data_ptr."""

    def __init__(self):
        import torch

        self.torch = torch
        self.blocks: dict[int, object] = {}

    def alloc(self, nbytes: int) -> int:
        t = self.torch.empty(max(int(nbytes), 1), dtype=self.torch.uint8, device="cuda")
        p = t.data_ptr()
        self.blocks[p] = t
        return p

    def release(self, ptr: int) -> bool:
        return self.blocks.pop(int(ptr), None) is not None

    def _locate(self, ptr: int, nbytes: int):
        for base, t in self.blocks.items():
            if base <= ptr and ptr + nbytes <= base + t.numel():
                return t, ptr - base
        raise BridgeError(f"0x{ptr:x} (+{nbytes} bytes) is not inside a buffer this bridge allocated")

    def copy_to_device(self, dst: int, host) -> None:
        n = len(host)
        if n == 0:
            return
        t, off = self._locate(int(dst), n)
        src = self.torch.frombuffer(host, dtype=self.torch.uint8)
        t[off : off + n].copy_(src)
        self.torch.cuda.synchronize()

    def copy_to_host(self, host, src: int) -> None:
        n = len(host)
        if n == 0:
            return
        t, off = self._locate(int(src), n)
        dst = self.torch.frombuffer(host, dtype=self.torch.uint8)
        self.torch.cuda.synchronize()
        dst.copy_(t[off : off + n])
        self.torch.cuda.synchronize()


_memory: CudaMemory | None = None


def cuda_memory() -> CudaMemory:
    global _memory
    if _memory is None:
        _memory = CudaMemory()
    return _memory


# --------------------------------------------------------------------------------------------
# Launches


def _tensors(adapter: Adapter, args) -> dict:
    dev_type, dev_id = dl_device(adapter)
    out = {}
    for name, data, byte_offset, shape, strides, code, bits, lanes in args:
        out[name] = Tensor(name, data, byte_offset, shape, strides, code, bits, lanes, adapter.device, dev_type, dev_id)
    return out


def _is_device_error(e: BaseException) -> bool:
    try:
        import torch
    except BaseException:  # noqa: BLE001
        return False
    acc = getattr(torch, "AcceleratorError", None)
    if acc is not None and isinstance(e, acc):
        return True
    if isinstance(e, RuntimeError):
        s = str(e)
        return any(k in s for k in ("CUDA error", "CUDA driver error", "HIP error", "cudaError", "hipError"))
    return False


def _classify(adapter: Adapter, spec: str, op: str, e: BaseException):
    """(status, message) for an exception an entry raised."""
    if isinstance(e, Unsupported):
        return UNSUPPORTED, f"unsupported by {adapter.name}: {e.why}"
    if isinstance(e, Refuse):
        return REFUSED, str(e.why)
    if adapter.device == "cuda" and _is_device_error(e):
        return ERROR, f"py adapter '{spec}': entry '{op}' hit a device error: {_summary(e)}\n{_tail(e, skip_own_frame=True)}"
    return HOST_ERROR, f"py adapter '{spec}': entry '{op}' raised {_summary(e)}\n{_tail(e, skip_own_frame=True)}"


def _sync(adapter: Adapter):
    if adapter.device == "cuda":
        import torch

        torch.cuda.synchronize()


def _python_threads() -> set:
    """Idents of every thread that runs Python code (threading's and _thread's alike)."""
    return set(sys._current_frames())


def _still_running(before: set, grace_s: float = 0.2) -> list:
    """Threads started since `before` that are still alive after a short grace: names."""
    deadline = _time.monotonic() + grace_s
    while True:
        left = _python_threads() - before
        if not left or _time.monotonic() >= deadline:
            break
        _time.sleep(0.01)
    import threading

    names = {t.ident: t.name for t in threading.enumerate()}
    return sorted(names.get(i, f"thread {i}") for i in left)


def _leftover_threads(spec: str, op: str, before: set):
    """(ERROR, message) when the entry returned while threads it started still run: its outputs
    may change after the harness read them, and such a thread could write into the next case's
    memory. ERROR makes the worker retire (a fresh process takes the next case)."""
    left = _still_running(before)
    if not left:
        return None
    return ERROR, (
        f"py adapter '{spec}': entry '{op}' returned while {len(left)} thread(s) it started still "
        f"run ({', '.join(left)}): its outputs may change after it returned; the worker retires so "
        "that they cannot write into the next case's memory"
    )


def _call(adapter: Adapter, spec: str, op: str, fn, tensors: dict, params: dict):
    """One synchronized call; (status, message)."""
    before = _python_threads()
    status, msg = _call_once(adapter, spec, op, fn, tensors, params)
    if status != ERROR:
        return _leftover_threads(spec, op, before) or (status, msg)
    return status, msg


def _call_once(adapter: Adapter, spec: str, op: str, fn, tensors: dict, params: dict):
    try:
        fn(tensors, params)
    except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are failures too
        status, msg = _classify(adapter, spec, op, e)
        if adapter.device == "cuda" and status != ERROR:
            try:
                _sync(adapter)
            except BaseException as e2:  # noqa: BLE001
                return ERROR, f"py adapter '{spec}': device error after '{op}': {_summary(e2)}"
        return status, msg
    try:
        _sync(adapter)
    except BaseException as e:  # noqa: BLE001
        return ERROR, f"py adapter '{spec}': device error after '{op}' (torch.cuda.synchronize): {_summary(e)}"
    return OK, ""


def _params(spec: str, params_json: str):
    try:
        p = json.loads(params_json or "{}")
    except ValueError as e:
        raise BridgeError(f"py adapter '{spec}': params_json is not JSON: {e}", HOST_ERROR) from None
    if not isinstance(p, dict):
        raise BridgeError(f"py adapter '{spec}': params_json is not a JSON object", HOST_ERROR)
    return p


def _entry(adapter: Adapter, spec: str, op: str):
    fn = adapter.get(op)
    if fn is None:
        raise BridgeError(
            f"py adapter '{spec}' ({adapter.name}) has no entry '{op}' (entries: {', '.join(adapter.entries)})",
            UNKNOWN_OP,
        )
    return fn


def set_case(case_json: str) -> None:
    """The ABI's case_context: the case whose launches follow (attncheck_bridge.current_case)."""
    from . import _set_case

    _set_case(json.loads(case_json))


def run(adapter: Adapter, spec: str, op: str, args, params_json: str):
    """(status, message)."""
    try:
        fn = _entry(adapter, spec, op)
        params = _params(spec, params_json)
        tensors = _tensors(adapter, args)
    except BridgeError as e:
        return e.status, str(e)
    return _call(adapter, spec, op, fn, tensors, params)


def time(adapter: Adapter, spec: str, op: str, args, params_json: str, warmup: int, iters: int):
    """(status, message, mean ms per call)."""
    try:
        fn = _entry(adapter, spec, op)
        params = _params(spec, params_json)
        tensors = _tensors(adapter, args)
    except BridgeError as e:
        return e.status, str(e), -1.0
    iters = max(int(iters), 1)
    for _ in range(max(int(warmup), 0)):
        status, msg = _call(adapter, spec, op, fn, tensors, params)
        if status != OK:
            return status, msg, -1.0
    if adapter.device == "cuda":
        import torch

        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            try:
                fn(tensors, params)
            except BaseException as e:  # noqa: BLE001
                status, msg = _classify(adapter, spec, op, e)
                return status, msg, -1.0
        end.record()
        try:
            torch.cuda.synchronize()
        except BaseException as e:  # noqa: BLE001
            return ERROR, f"py adapter '{spec}': device error timing '{op}': {_summary(e)}", -1.0
        return OK, "", float(start.elapsed_time(end)) / iters
    t0 = _time.perf_counter()
    for _ in range(iters):
        try:
            fn(tensors, params)
        except BaseException as e:  # noqa: BLE001
            status, msg = _classify(adapter, spec, op, e)
            return status, msg, -1.0
    return OK, "", (_time.perf_counter() - t0) * 1e3 / iters


# --------------------------------------------------------------------------------------------
# Graph capture (the extension table's graph_capture / graph_replay / graph_release; docs/bridge.md
# "Graph replay")

_graphs: dict = {}
_next_graph = [1]


def _capture_refusal(adapter: Adapter, spec: str, op: str):
    """(UNSUPPORTED, why) when entry ``op`` cannot be captured, else None."""
    if not adapter.graph_capturable(op):
        return UNSUPPORTED, (
            f"py adapter '{spec}' ({adapter.name}): entry '{op}' does not declare itself "
            "graph-capturable (Adapter.entry(..., graph_capturable=True))"
        )
    if adapter.device != "cuda":
        return UNSUPPORTED, f"py adapter '{spec}' ({adapter.name}) runs on the host: no CUDA graph"
    return None


def graph_capture(adapter: Adapter, spec: str, op: str, args, params_json: str):
    """(status, message, handle): one call of entry ``op`` run once (warm-up: Triton compiles,
    workspaces settle) and then captured into a torch.cuda.CUDAGraph; the handle names it for
    graph_replay / graph_release. UNSUPPORTED for an entry that did not declare itself
    graph-capturable: the harness skips the step with that reason."""
    try:
        fn = _entry(adapter, spec, op)
        refusal = _capture_refusal(adapter, spec, op)
        if refusal:
            return refusal + (0,)
        params = _params(spec, params_json)
        tensors = _tensors(adapter, args)
    except BridgeError as e:
        return e.status, str(e), 0
    status, msg = _call(adapter, spec, op, fn, tensors, params)
    if status != OK:
        return status, msg, 0
    import torch

    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn(tensors, params)
    except BaseException as e:  # noqa: BLE001
        status, msg = _classify(adapter, spec, op, e)
        return status, f"capturing '{op}' into a CUDA graph: {msg}", 0
    handle = _next_graph[0]
    _next_graph[0] += 1
    _graphs[handle] = (graph, tensors, params)  # the tensors stay alive as long as the graph
    return OK, "", handle


def graph_replay(spec: str, handle: int):
    """(status, message): replays a captured graph and waits for it."""
    entry = _graphs.get(handle)
    if entry is None:
        return HOST_ERROR, f"py adapter '{spec}': no captured graph {handle}"
    try:
        entry[0].replay()
        import torch

        torch.cuda.synchronize()
    except BaseException as e:  # noqa: BLE001
        return ERROR, f"py adapter '{spec}': graph replay failed: {_summary(e)}"
    return OK, ""


def graph_release(handle: int) -> None:
    _graphs.pop(handle, None)


def roofline(adapter: Adapter, spec: str):
    """(status, message, copy GB/s (read + write), matrix TFLOP/s)."""
    try:
        if adapter.device == "cpu":
            return (OK, "") + _cpu_roofline()
        return (OK, "") + _cuda_roofline()
    except BaseException as e:  # noqa: BLE001
        return ERROR, f"py adapter '{spec}': roofline failed: {_summary(e)}", 0.0, 0.0


def _best(fn, reps):
    best = float("inf")
    for _ in range(reps):
        t0 = _time.perf_counter()
        fn()
        best = min(best, _time.perf_counter() - t0)
    return best


def _cpu_roofline():
    import numpy as np

    n = 64 << 20  # bytes per copy
    src = np.ones(n, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    t = _best(lambda: np.copyto(dst, src), 5)
    gbps = 2.0 * n / t / 1e9
    m = 1024
    a = np.ones((m, m), dtype=np.float32)
    b = np.ones((m, m), dtype=np.float32)
    a @ b
    t = _best(lambda: a @ b, 5)
    tflops = 2.0 * m**3 / t / 1e12
    return gbps, tflops


def _cuda_roofline():
    import torch

    n = 256 << 20
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)

    def timed(fn, reps):
        fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e) / 1e3 / reps

    t = timed(lambda: dst.copy_(src), 10)
    gbps = 2.0 * n / t / 1e9
    m = 8192
    a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    t = timed(lambda: torch.matmul(a, b), 10)
    tflops = 2.0 * m**3 / t / 1e12
    return gbps, tflops


# --------------------------------------------------------------------------------------------
# Never-raising wrappers for the C++ side: (status, message, ...) tuples.


def query_device(adapter: Adapter, spec: str):
    """(status, message, name, arch)."""
    try:
        name, arch = device_info(adapter, spec)
        return OK, "", name, arch
    except BridgeError as e:
        return e.status, str(e), "", ""
    except BaseException as e:  # noqa: BLE001
        return NO_DEVICE, f"py adapter '{spec}': device query failed: {_summary(e)}", "", ""


def cuda_alloc(nbytes: int):
    """(status, message, pointer)."""
    try:
        return OK, "", cuda_memory().alloc(nbytes)
    except BaseException as e:  # noqa: BLE001
        return ERROR, f"torch.empty({nbytes}, uint8, cuda) failed: {_summary(e)}", 0


def cuda_release(ptr: int) -> bool:
    try:
        return cuda_memory().release(ptr)
    except BaseException:  # noqa: BLE001
        return False


def cuda_copy_to_device(dst: int, host):
    try:
        cuda_memory().copy_to_device(dst, host)
        return OK, ""
    except BaseException as e:  # noqa: BLE001
        return ERROR, f"copy to device failed: {_summary(e)}"


def cuda_copy_to_host(src: int, host):
    try:
        cuda_memory().copy_to_host(host, src)
        return OK, ""
    except BaseException as e:  # noqa: BLE001
        return ERROR, f"copy to host failed: {_summary(e)}"
