"""``attncheck repro ID --kernels py:ADAPTER --export pytest``: one self-contained pytest file from
a repro bundle (docs/bridge.md "Exporting a finding").

    python3 -m attncheck_bridge.export_pytest BUNDLE ADAPTER OUT

The exporter reads the bundle through the HDF5 library attncheck is linked with
(attncheck_bridge.hdf5_reader: no h5py) and writes through attncheck_report.safe_write, the
project's Python writer (symbolic links, FIFOs and devices refused at OUT and at the .npz beside
it; atomic replacement; attncheck puts harness/report on the path). The file
needs numpy, the upstream package (the entry's ``Export``: module, function, how the
arguments are passed) and, for a torch export, torch. It holds the case's inputs (every
argument's storage rebuilt from the bundle's view contents and layouts, zlib-compressed and
base64-encoded; past EMBED_LIMIT bytes they go to OUT with the suffix .npz instead), the call into
the upstream function as the adapter makes it, the expected outputs and each output's budget as
attncheck derived it, checked the way attncheck checks them.
"""

import base64
import importlib
import importlib.util
import io
import json
import pprint
import re
import sys
import zlib
from pathlib import Path

import numpy as np

from attncheck_bridge import hdf5_reader
from attncheck_report.safe_write import make_directory, require_replaceable, write_bytes, write_text

EMBED_LIMIT = 1 << 20  # encoded bytes embedded in the file; more go to a .npz beside it

_ITEMSIZE = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i8": 1, "u8": 1,
             "fp8_e4m3fn": 1, "fp8_e4m3fnuz": 1, "fp8_e5m2": 1, "fp8_e5m2fnuz": 1}


class ExportError(Exception):
    pass


def _adapter(spec: str):
    """The adapter module of ``py:SPEC`` (a module name or a path to a .py file)."""
    if spec.endswith(".py"):
        path = Path(spec)
        loaded = importlib.util.spec_from_file_location(path.stem, path)
        mod = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(mod)
        return mod
    return importlib.import_module(spec)


def _json_attr(node, name):
    return json.loads(node.attr(name))


def _read_bundle(path):
    """Storages (bytes, rebuilt from the views), argument layouts, expected outputs, budgets."""
    with hdf5_reader.File(path) as f:
        meta = {k: f.attr(k) for k in ("id", "op", "kernel", "verdict", "message", "repro")}
        meta["params"] = _json_attr(f, "params")
        meta["kernel_params"] = _json_attr(f, "kernel_params")
        checks = _json_attr(f, "checks")
        if f.attr("expect_refusal"):
            raise ExportError("an invalid configuration (the kernel must refuse it): nothing to check")
        args, storages, sparse = {}, {}, {}
        inputs = f.child("inputs")
        for name in inputs.names():
            ds = inputs.child(name)
            layout = json.loads(ds.attr("layout"))
            dtype = ds.attr("dtype")
            if "sparse" in layout:
                # A large-offset storage: the dataset is its host-held window, flat; the view's
                # offset and strides index the whole extent (poison outside the window).
                k = int(layout["storage"])
                storages.setdefault(k, bytearray(np.ascontiguousarray(ds.read()).tobytes()))
                sp = layout["sparse"]
                sparse[k] = {"extent_bytes": int(sp["extent_bytes"]),
                             "window_begin_bytes": int(sp["window_begin_bytes"]),
                             "poison": "nan" if dtype in ("f64", "f32", "f16", "bf16") else "0xff",
                             "dtype": dtype}
                args[name] = {"dtype": dtype, "shape": layout["shape"], "strides": layout["strides"],
                              "offset": layout["offset"], "storage": k,
                              "role": ds.attr("role").split(" ")[0]}
                continue
            es = _ITEMSIZE[dtype]
            k = int(layout.get("storage", len(storages) + 1000))
            buf = storages.setdefault(k, bytearray(int(layout["storage_bytes"])))
            raw = np.ascontiguousarray(ds.read())
            if raw.size:  # the view's contents back at their places in the storage
                flat = np.frombuffer(buf, dtype=raw.dtype, count=len(buf) // es)
                np.lib.stride_tricks.as_strided(
                    flat[layout["offset"]:], shape=tuple(layout["shape"]),
                    strides=tuple(s * es for s in layout["strides"]), writeable=True)[...] = raw
            args[name] = {"dtype": dtype, "shape": layout["shape"], "strides": layout["strides"],
                          "offset": layout["offset"], "storage": k,
                          "role": ds.attr("role").split(" ")[0]}
        expected = {}
        exp = f.child("expected")
        for name in exp.names():
            ds = exp.child(name)
            expected[name] = (ds.attr("dtype"), np.ascontiguousarray(ds.read()))
    budgets = {c["name"]: c["budget"] for c in checks}
    meta["sparse"] = sparse
    return meta, args, {k: bytes(v) for k, v in storages.items()}, expected, budgets


def _encode(data: bytes) -> list:
    text = base64.b64encode(zlib.compress(data, 9)).decode()
    return [text[i:i + 96] for i in range(0, len(text), 96)]


def _literal(lines, indent="    "):
    return "(\n" + "".join(f'{indent}"{x}"\n' for x in lines) + indent[:-4] + ")"


class _NonFinite(float):
    def __repr__(self):
        return f"float('{float.__repr__(self)}')"


def _finite_reprs(value):
    if isinstance(value, float) and not np.isfinite(value):
        return _NonFinite(value)
    if isinstance(value, dict):
        return {k: _finite_reprs(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_reprs(v) for v in value]
    return value


def _py(value):
    """A Python literal of JSON data (True/False/None; nan/inf as float('nan'), float('inf'))."""
    return pprint.pformat(_finite_reprs(value), width=100, sort_dicts=False)


def _test_name(case_id):
    return "test_" + re.sub(r"[^0-9a-zA-Z_]", "_", case_id)[:80]


def generate(bundle, adapter_spec, out):
    for target in (Path(out), Path(out).with_suffix(".npz")):
        require_replaceable(target)  # before the bundle is read or the adapter imported
    meta, args, storages, expected, budgets = _read_bundle(bundle)
    mod = _adapter(adapter_spec)
    adapter = getattr(mod, "ADAPTER", None)
    if adapter is None:
        raise ExportError(f"adapter {adapter_spec} has no ADAPTER")
    entry = meta["kernel"]
    ex = adapter.export_of(entry)
    if ex is None:
        raise ExportError(f"adapter {adapter.name}: entry '{entry}' has no export description "
                          "(attncheck_bridge.Export: module, function, arguments)")
    desc = ex.to_json(adapter.device)
    sparse = meta.get("sparse", {})
    if sparse and desc["framework"] != "torch":
        raise ExportError("a large-offset (sparse) storage: only torch exports rebuild its extent on the device")
    partial = adapter.partial_of(entry) or {"not_produced": [], "unspecified": {}}
    if partial["unspecified"]:
        raise ExportError(f"adapter {adapter.name}: entry '{entry}' leaves "
                          + ", ".join(f"{o} ({r})" for o, r in partial["unspecified"].items())
                          + " unspecified: the exported check cannot mask such a region")
    # An output the entry declares not produced is not checked (attncheck checks it is untouched).
    budgets = {n: b for n, b in budgets.items() if n not in partial["not_produced"]}
    outputs = [n for n in expected if n in budgets]
    out = Path(out)
    data = {f"storage_{k}": np.frombuffer(v, np.uint8) for k, v in storages.items()}
    data.update({f"expected_{n}": expected[n][1] for n in outputs})
    encoded = {k: _encode(v.tobytes()) for k, v in data.items()}
    sidecar = sum(len(x) for lines in encoded.values() for x in lines) > EMBED_LIMIT
    if sidecar:
        packed = io.BytesIO()
        np.savez_compressed(packed, **data)
        write_bytes(out.with_suffix(".npz"), packed.getvalue())
        blobs = "DATA_FILE = Path(__file__).with_suffix('.npz')  # the inputs and expected outputs\n"
    else:
        blobs = "DATA_FILE = None\nBLOBS = {\n" + "".join(
            f"    {k!r}: ({str(v.dtype)!r}, {list(v.shape)!r}, {_literal(encoded[k], ' ' * 8)}),\n"
            for k, v in data.items()) + "}\n"
    call_args = ", ".join([*desc["args"], *(f"**{v}" if k == "**" else f"{k}={v}"
                                            for k, v in desc["kwargs"].items())])
    setup = "".join(f"    {line}\n" for line in desc["setup"])
    text = _TEMPLATE.format(
        id=meta["id"], verdict=meta["verdict"], adapter=adapter.name, entry=entry,
        repro=meta["repro"], message=meta["message"].replace('"""', "'''")[:2000],
        where="the .npz beside this file" if sidecar else "this file (zlib + base64)",
        case=_py({"id": meta["id"], "op": meta["op"], "params": meta["params"]}),
        kernel_params=_py(meta["kernel_params"]), args=_py(args), budgets=_py(budgets),
        not_produced=_py(partial["not_produced"]), sparse=_py(sparse),
        expected_dtypes=_py({n: expected[n][0] for n in outputs}), export=_py(desc), blobs=blobs, setup=setup,
        function=desc["function"], call_args=call_args, test_name=_test_name(meta["id"]),
        framework=desc["framework"], device=desc["device"])
    compile(text, str(out), "exec")
    make_directory(out.parent, "--out")
    write_text(out, text)
    return sidecar


_TEMPLATE = '''"""attncheck finding: {id} ({verdict} through py:{adapter}, entry {entry}).

Exported by `attncheck repro --export pytest`. Self-contained: the inputs and expected outputs are
in {where}; the call below is the one the attncheck adapter makes. Needs torch (or NumPy for a
NumPy adapter) and pytest. Run it where the upstream package is importable, or against a source
tree without its compiled extensions: ATTNCHECK_VLLM_SRC / ATTNCHECK_AITER_SRC=<tree> with
attncheck's bridge/python on PYTHONPATH: `python3 -m pytest THIS_FILE`. It passes when every output
is within the budget attncheck derived for it (per element |actual - expected| <= atol + rtol
|expected|, a bounded fraction of elements beyond, calc_diff; bitwise for exact outputs; top-k rows
as sets, ties not excused here).

attncheck said:
    {message}
Rerun in attncheck:
    {repro}
"""

import base64
import importlib
import inspect  # noqa: F401 - the call's set-up may ask the upstream signature
import os
import zlib
from pathlib import Path

import numpy as np
import pytest

CASE = {case}
KERNEL_PARAMS = {kernel_params}
# Every argument: dtype, view shape / strides / offset (elements) in its storage; role.
ARGS = {args}
BUDGETS = {budgets}
# Outputs the entry declares it does not produce (a partial contract): not checked here.
NOT_PRODUCED = {not_produced}
# Large-offset storages (storage -> extent, where the held window begins, poison): the blob is the
# window; the rest of the extent is rebuilt on the device as poison (NaN, or 0xFF bytes), as
# attncheck runs the case.
SPARSE = {sparse}
EXPECTED_DTYPES = {expected_dtypes}
EXPORT = {export}
{blobs}

def _blob(name):
    if DATA_FILE is not None:
        with np.load(DATA_FILE) as z:
            return z[name].copy()
    dtype, shape, text = BLOBS[name]
    raw = zlib.decompress(base64.b64decode("".join(text)))
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


_ITEMSIZE = {{"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i8": 1, "u8": 1,
             "fp8_e4m3fn": 1, "fp8_e4m3fnuz": 1, "fp8_e5m2": 1, "fp8_e5m2fnuz": 1}}
# As attncheck's bridge hands them to NumPy: 16-bit floats as uint16 bits, fp8 as uint8 codes.
_NUMPY = {{"f64": np.float64, "f32": np.float32, "f16": np.uint16, "bf16": np.uint16,
          "i64": np.int64, "i32": np.int32, "i8": np.int8, "u8": np.uint8}}


def _numpy_views(storages):
    t = {{}}
    for name, a in ARGS.items():
        dt = np.dtype(_NUMPY.get(a["dtype"], np.uint8))
        flat = storages[a["storage"]][: storages[a["storage"]].size // dt.itemsize * dt.itemsize]
        flat = flat.view(dt)[a["offset"]:]
        t[name] = np.lib.stride_tricks.as_strided(
            flat, shape=tuple(a["shape"]), strides=tuple(s * dt.itemsize for s in a["strides"]))
    return t


def _torch_views(storages, torch, device):
    dtypes = {{"f64": torch.float64, "f32": torch.float32, "f16": torch.float16,
              "bf16": torch.bfloat16, "i64": torch.int64, "i32": torch.int32, "i8": torch.int8}}
    on_device = {{k: torch.from_numpy(v).to(device) for k, v in storages.items() if k not in SPARSE}}
    for k, sp in SPARSE.items():
        st = torch.empty(sp["extent_bytes"], dtype=torch.uint8, device=device)
        if sp["poison"] == "nan":
            es = _ITEMSIZE[sp["dtype"]]
            st[: st.numel() // es * es].view(dtypes[sp["dtype"]]).fill_(float("nan"))
        else:
            st.fill_(0xFF)
        window = torch.from_numpy(storages[k]).to(device)
        st[sp["window_begin_bytes"]: sp["window_begin_bytes"] + window.numel()].copy_(window)
        on_device[k] = st
    t = {{}}
    for name, a in ARGS.items():
        dt = dtypes.get(a["dtype"], torch.uint8)
        es = _ITEMSIZE[a["dtype"]]
        st = on_device[a["storage"]]
        typed = st[: st.numel() // es * es].view(dt)
        t[name] = typed.as_strided(tuple(a["shape"]), tuple(a["strides"]), a["offset"])
    return t


def _upstream():
    """The upstream function. With ATTNCHECK_VLLM_SRC / ATTNCHECK_AITER_SRC set and attncheck's
    bridge importable (bridge/python on PYTHONPATH), from that source tree through attncheck's
    loader (attncheck_bridge.upstream: the tree's files, no compiled extensions needed), and
    nothing else; otherwise the installed package."""
    errors = []
    root = EXPORT["modules"][0].split(".")[0]
    src = os.environ.get({{"vllm": "ATTNCHECK_VLLM_SRC", "aiter": "ATTNCHECK_AITER_SRC"}}.get(root, ""), "")
    if src:
        try:
            from attncheck_bridge import upstream
        except ImportError as e:
            pytest.fail(f"{{root}} source tree {{src}} given, but attncheck_bridge is not importable: {{e}}")
        try:
            if root == "vllm":
                return upstream.vllm_load([(m, m.replace(".", "/") + ".py", EXPORT["function"])
                                           for m in EXPORT["modules"]])[0]
            return upstream.aiter_load(EXPORT["modules"][0], EXPORT["function"])
        except Exception as e:  # noqa: BLE001 - named below
            pytest.fail(f"cannot load {function} from {{src}}: {{type(e).__name__}}: {{e}}")
    for module in EXPORT["modules"]:
        try:
            return getattr(importlib.import_module(module), EXPORT["function"])
        except Exception as e:  # noqa: BLE001 - the next module path may hold it
            errors.append(f"{{module}}: {{type(e).__name__}}: {{e}}")
    pytest.fail("cannot import {function}: " + "; ".join(errors))


def _call(fn, t, p, torch):
{setup}    fn({call_args})


def run_upstream():
    """The upstream function on the case's inputs; the outputs' raw contents as NumPy arrays."""
    storages = {{int(k.split("_")[1]): _blob(k) for k in _blob_names() if k.startswith("storage_")}}
    if EXPORT["framework"] == "torch":
        torch = pytest.importorskip("torch")
        if EXPORT["device"] == "cuda" and not torch.cuda.is_available():
            pytest.skip("the upstream kernel runs on a GPU and torch sees none")
        t = _torch_views(storages, torch, EXPORT["device"])
    else:
        torch = None
        t = _numpy_views(storages)
    _call(_upstream(), t, dict(KERNEL_PARAMS), torch)
    if torch is not None:
        if EXPORT["device"] == "cuda":
            torch.cuda.synchronize()
        return {{n: _torch_raw(t[n], torch) for n in BUDGETS}}
    return {{n: np.array(t[n]) for n in BUDGETS}}


def _blob_names():
    if DATA_FILE is not None:
        with np.load(DATA_FILE) as z:
            return list(z.files)
    return list(BLOBS)


def _torch_raw(x, torch):
    x = x.detach().cpu()
    if x.dtype in (torch.bfloat16, torch.float16):
        return x.contiguous().view(torch.int16).numpy().view(np.uint16)
    if x.dtype.itemsize == 1 and x.dtype not in (torch.int8, torch.uint8):
        return x.contiguous().view(torch.uint8).numpy()
    return x.contiguous().numpy()


def _fp8_table(name):
    e, m, bias, fnuz = {{"fp8_e4m3fn": (4, 3, 7, False), "fp8_e4m3fnuz": (4, 3, 8, True),
                        "fp8_e5m2": (5, 2, 15, False), "fp8_e5m2fnuz": (5, 2, 16, True)}}[name]
    table = np.empty(256)
    for c in range(256):
        sign = -1.0 if c & 0x80 else 1.0
        ex, man = (c >> m) & ((1 << e) - 1), c & ((1 << m) - 1)
        if fnuz and c == 0x80 or name == "fp8_e4m3fn" and ex == 15 and man == 7:
            table[c] = np.nan
        elif name == "fp8_e5m2" and ex == 31:
            table[c] = sign * np.inf if man == 0 else np.nan
        elif ex == 0:
            table[c] = sign * man / 2.0**m * 2.0 ** (1 - bias)
        else:
            table[c] = sign * (1 + man / 2.0**m) * 2.0 ** (ex - bias)
    return table


def values(raw, dtype):
    """Raw contents (as the bundle holds them) as float64 values."""
    raw = np.asarray(raw)
    if dtype == "bf16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype == "f16":
        return raw.view(np.float16).astype(np.float64)
    if dtype.startswith("fp8_"):
        return _fp8_table(dtype)[raw.astype(np.int64)]
    return raw.astype(np.float64)


def expected_outputs():
    return {{n: _blob("expected_" + n) for n in BUDGETS}}


def check_outputs(actual, expected):
    """Every output within its budget, as attncheck checks it; AssertionError naming each miss."""
    problems = []
    for name, b in BUDGETS.items():
        dtype = EXPECTED_DTYPES[name]
        a_raw, e_raw = np.asarray(actual[name]), np.asarray(expected[name])
        if a_raw.shape != e_raw.shape:
            problems.append(f"{{name}}: shape {{a_raw.shape}}, expected {{e_raw.shape}}")
            continue
        if b["kind"] == "exact":
            bad = int((a_raw.view(np.uint8) != e_raw.view(np.uint8)).reshape(a_raw.shape + (-1,)).any(-1).sum())
            if bad:
                problems.append(f"{{name}}: {{bad}} of {{a_raw.size}} elements differ bitwise (budget: bitwise)")
            continue
        if b["kind"] == "topk_set":
            rows = a_raw.reshape(a_raw.shape[0], -1), e_raw.reshape(e_raw.shape[0], -1)
            bad = sum(set(x[x >= 0].tolist()) != set(y[y >= 0].tolist()) for x, y in zip(*rows))
            if bad:
                problems.append(f"{{name}}: {{bad}} top-k rows differ as sets")
            continue
        a, e = values(a_raw, dtype), values(e_raw, dtype)
        same_special = (np.isnan(a) & np.isnan(e)) | (np.isinf(a) & (a == e))
        with np.errstate(invalid="ignore"):
            within = np.abs(a - e) <= b["atol"] + b["rtol"] * np.abs(e)
        bad = ~(within | same_special)
        allowed = int(b.get("max_mismatch_frac", 0) * a.size)
        if int(bad.sum()) > allowed:
            i = np.unravel_index(int(np.argmax(bad)), a.shape)
            problems.append(f"{{name}}: {{int(bad.sum())}} of {{a.size}} elements beyond |a - e| <= "
                            f"{{b['atol']:.4g}} + {{b['rtol']:.4g}} |e| (allowed {{allowed}}); first at "
                            f"{{list(i)}}: expected {{e[i]!r}}, actual {{a[i]!r}}")
        if b.get("max_calc_diff", -1) >= 0:
            x, y = np.where(np.isneginf(e), 0, e), np.where(np.isneginf(a), 0, a)
            denom = float((x * x + y * y).sum())
            calc_diff = 1 - 2 * float((x * y).sum()) / denom if denom else 0.0
            if not calc_diff <= b["max_calc_diff"]:
                problems.append(f"{{name}}: calc_diff {{calc_diff:.4g}} > {{b['max_calc_diff']:.4g}}")
    assert not problems, "; ".join(problems)


def {test_name}():
    check_outputs(run_upstream(), expected_outputs())
'''


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3:
        print("usage: python3 -m attncheck_bridge.export_pytest BUNDLE ADAPTER OUT", file=sys.stderr)
        return 2
    try:
        sidecar = generate(*argv)
    except (ExportError, hdf5_reader.Hdf5Error, OSError, KeyError) as e:
        print(f"attncheck: --export pytest: {e}", file=sys.stderr)
        return 2
    out = Path(argv[2])
    print(f"pytest   {out.resolve()}" + (f" (data: {out.with_suffix('.npz').resolve()})" if sidecar else
                                         " (inputs and expected outputs embedded)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
