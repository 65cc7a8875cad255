"""`attncheck repro ID --kernels py:ADAPTER --export pytest` (attncheck_bridge/export_pytest.py):
the generated file runs and passes against numpy_reference under this interpreter, and its check
fails once the expected output moves beyond the budget attncheck derived (and not within it).
Needs the attncheck binary (ATTNCHECK_BIN, set by ctest's bridge.pytest)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import attncheck_bridge as ab
from attncheck_bridge import export_pytest

BIN = os.environ.get("ATTNCHECK_BIN", "")
BRIDGE = Path(__file__).resolve().parent.parent
needs_bin = pytest.mark.skipif(not BIN, reason="needs the attncheck binary (ATTNCHECK_BIN)")

PAGE_CASE = "page_indices/bs1-b9-ctx63-strided-s0"
ROPE_CASE = "rope/gptj-back-out_of_place-bf16-csf32-poslarge-h4-hd128-rot64-t8-s100"


def _env():
    paths = [str(BRIDGE / "python"), str(BRIDGE / "adapters"), str(BRIDGE.parent / "harness" / "report")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), PYTHONDONTWRITEBYTECODE="1")


def export(tmp_path, case_id, name, kernels="py:numpy_reference"):
    out = tmp_path / name
    proc = subprocess.run([BIN, "repro", case_id, "--kernels", kernels, "--export", "pytest",
                           "--out", str(out), "--bundle", str(tmp_path / (name + ".h5"))],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    return out, proc


def load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.path[:0] = [str(BRIDGE / "python"), str(BRIDGE / "adapters")]
    spec.loader.exec_module(mod)
    return mod


def run_generated(path):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(path)], capture_output=True, text=True, env=_env(), timeout=300)


@needs_bin
def test_exact_output_runs_passes_and_fails_when_moved(tmp_path):
    path, proc = export(tmp_path, PAGE_CASE, "test_page.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(inputs and expected outputs embedded)" in proc.stdout
    assert not path.with_suffix(".npz").exists()
    ran = run_generated(path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "1 passed" in ran.stdout
    mod = load(path)
    assert mod.ARGS["block_table"]["strides"][0] > mod.ARGS["block_table"]["shape"][1]  # strided
    actual, expected = mod.run_upstream(), mod.expected_outputs()
    mod.check_outputs(actual, expected)
    moved = {k: v.copy() for k, v in expected.items()}
    moved["page_indices"][5] += 1
    with pytest.raises(AssertionError, match="1 of .* elements differ bitwise"):
        mod.check_outputs(actual, moved)


@needs_bin
def test_an_upstream_that_ignores_the_row_stride_fails_the_exported_test(tmp_path, monkeypatch):
    """What a finding's file is for: the upstream function with a stride bug fails it."""
    path, proc = export(tmp_path, PAGE_CASE, "test_page.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    mod = load(path)
    import numpy_reference

    right = numpy_reference.page_indices_arrays

    def ignores_row_stride(tab, n, c, o, K):
        rows = np.lib.stride_tricks.as_strided(tab, tab.shape, (tab.shape[1] * tab.itemsize, tab.itemsize))
        right(rows, n, c, o, K)

    monkeypatch.setattr(numpy_reference, "page_indices_arrays", ignores_row_stride)
    with pytest.raises(AssertionError, match="elements differ bitwise"):
        mod.check_outputs(mod.run_upstream(), mod.expected_outputs())


@needs_bin
def test_numeric_output_goes_to_an_npz_and_holds_the_derived_budget(tmp_path):
    path, proc = export(tmp_path, ROPE_CASE, "test_rope.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert path.with_suffix(".npz").is_file(), proc.stdout  # the cos/sin cache is large
    ran = run_generated(path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    mod = load(path)
    budget = mod.BUDGETS["q_out"]
    assert budget["kind"] == "numeric" and budget["rtol"] > 0
    actual, expected = mod.run_upstream(), mod.expected_outputs()
    mod.check_outputs(actual, expected)
    values = mod.values(expected["q_out"], "bf16").reshape(-1)
    i = int(np.argmax((np.abs(values) > 0.5) & (np.abs(values) < 1.5)))
    # One bf16 step away from zero is within rtol |e| (one ulp); three steps are beyond it.
    within = {k: v.copy() for k, v in expected.items()}
    within["q_out"].reshape(-1)[i] += 1
    mod.check_outputs(actual, within)
    beyond = {k: v.copy() for k, v in expected.items()}
    beyond["q_out"].reshape(-1)[i] += 3
    with pytest.raises(AssertionError, match=r"q_out: 1 of \d+ elements beyond"):
        mod.check_outputs(actual, beyond)


@needs_bin
def test_what_cannot_be_exported_is_refused_with_the_reason(tmp_path):
    _, proc = export(tmp_path, PAGE_CASE, "x.py", kernels="/nonexistent/lib.so")
    assert proc.returncode == 2 and "needs a Python adapter" in proc.stderr
    gather = subprocess.run([BIN, "list", "--tier", "smoke", "--op", "kv_gather"],
                            capture_output=True, text=True).stdout.split()[0]
    _, proc = export(tmp_path, gather, "y.py")
    assert proc.returncode == 2
    assert "entry 'kv_gather' has no export description" in proc.stderr


@needs_bin
def test_a_torch_export_of_vllm_triton_is_generated_and_compiles(tmp_path):
    """The GPU call itself runs only where vLLM and a GPU are (docs/bridge.md); here: the file of
    a decode_attention bundle through vllm_triton's description, compiled."""
    case = subprocess.run([BIN, "list", "--tier", "smoke", "--op", "decode_attention"],
                          capture_output=True, text=True).stdout.split()[0]
    bundle = tmp_path / "d.h5"
    subprocess.run([BIN, "repro", case, "--kernels", "py:numpy_reference", "--bundle", str(bundle)],
                   capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert bundle.is_file()
    out = tmp_path / "test_decode.py"
    sys.path[:0] = [str(BRIDGE / "adapters")]
    export_pytest.generate(str(bundle), "vllm_triton", str(out))
    text = out.read_text()
    compile(text, str(out), "exec")
    assert "'function': 'decode_attention_fwd'" in text
    assert "fn(t['q'], k, v, t['o'], t['lse'], t['req_to_token'], t['b_seq_len'], logits," in text
    assert "**extra)" in text


def test_export_descriptions_are_checked():
    with pytest.raises(ValueError, match="framework"):
        ab.Export("m", "f", framework="jax")
    with pytest.raises(SyntaxError):
        ab.Export("m", "f", args=["t['q'"])
    adapter = ab.Adapter("x")
    with pytest.raises(TypeError):
        adapter.entry("e", export={"module": "m"})(lambda t, p: None)


# ------------------------------------------------------------------------------------------------
# Writes go through attncheck_report.safe_write (issue 38 item 1): no symlink followed, no FIFO
# opened, no device written, replacement atomic; checked before the bundle is even read.


def _main_refuses(tmp_path, out, capsys):
    rc = export_pytest.main([str(tmp_path / "no-bundle.h5"), "numpy_reference", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, err
    return err


def test_a_symlink_at_out_is_refused_and_its_target_untouched(tmp_path, capsys):
    decoy = tmp_path / "decoy"
    decoy.write_text("precious\n")
    out = tmp_path / "out.py"
    out.symlink_to(decoy)
    assert "a symbolic link" in _main_refuses(tmp_path, out, capsys)
    assert decoy.read_text() == "precious\n" and out.is_symlink()


def test_a_fifo_at_out_is_refused_without_blocking(tmp_path, capsys):
    out = tmp_path / "test_x.py"
    os.mkfifo(out)
    assert "a FIFO" in _main_refuses(tmp_path, out, capsys)


def test_a_device_at_out_is_refused(tmp_path, capsys):
    assert "a character device" in _main_refuses(tmp_path, "/dev/null", capsys)


def test_a_symlink_at_the_npz_beside_out_is_refused(tmp_path, capsys):
    decoy = tmp_path / "decoy"
    decoy.write_text("precious\n")
    (tmp_path / "test_x.npz").symlink_to(decoy)
    assert "test_x.npz': it is a symbolic link" in _main_refuses(tmp_path, tmp_path / "test_x.py", capsys)
    assert decoy.read_text() == "precious\n"


def test_safe_writes_replace_atomically_and_leave_no_temporary(tmp_path):
    from attncheck_report import safe_write  # the exporter's writer, shared with the report

    target = tmp_path / "sub" / "t.py"
    safe_write.make_directory(target.parent, "--out")
    safe_write.write_text(target, "one\n")
    hard = tmp_path / "other-name"
    os.link(target, hard)  # a second name of the old file must keep the old contents
    safe_write.write_text(target, "two\n")
    assert target.read_text() == "two\n" and hard.read_text() == "one\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["t.py"]
    with pytest.raises(safe_write.UnsafeTarget, match="a directory"):
        safe_write.write_text(tmp_path / "sub", "x")


@needs_bin
def test_a_symlink_at_the_default_repro_path_is_refused(tmp_path):
    decoy = tmp_path / "decoy"
    decoy.write_text("precious\n")
    (tmp_path / "repro").mkdir()
    name = "test_" + PAGE_CASE.replace("/", "__") + ".py"  # attncheck's id_to_filename
    (tmp_path / "repro" / name).symlink_to(decoy)
    proc = subprocess.run([BIN, "repro", PAGE_CASE, "--kernels", "py:numpy_reference", "--export", "pytest"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2 and "a symbolic link" in proc.stderr, proc.stdout + proc.stderr
    assert decoy.read_text() == "precious\n"


@needs_bin
def test_the_exporter_runs_under_attncheck_python(tmp_path):
    """On a GPU host the interpreter with torch is rarely /usr/bin/python3: $ATTNCHECK_PYTHON wins."""
    marker = tmp_path / "ran"
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f"#!/bin/sh\necho \"$@\" > {marker}\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    out = tmp_path / "t.py"
    proc = subprocess.run([BIN, "repro", PAGE_CASE, "--kernels", "py:numpy_reference", "--export", "pytest",
                           "--out", str(out), "--bundle", str(tmp_path / "b.h5")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env=dict(os.environ, ATTNCHECK_PYTHON=str(wrapper)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "attncheck_bridge.export_pytest" in marker.read_text() and out.is_file()
    missing = subprocess.run([BIN, "repro", PAGE_CASE, "--kernels", "py:numpy_reference", "--export", "pytest",
                              "--out", str(tmp_path / "u.py"), "--bundle", str(tmp_path / "c.h5")],
                             capture_output=True, text=True, cwd=tmp_path, timeout=300,
                             env=dict(os.environ, ATTNCHECK_PYTHON=str(tmp_path / "no-such-python")))
    assert missing.returncode == 2 and "no-such-python" in missing.stderr, missing.stdout + missing.stderr


def test_the_exporter_needs_no_h5py():
    """The GPU hosts kernel developers use have torch and pytest, not h5py."""
    code = ("import sys; sys.modules['h5py'] = None; "
            "import attncheck_bridge.export_pytest, attncheck_bridge.hdf5_reader; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env())
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


# ------------------------------------------------------------------------------------------------
# The exported file against an upstream source tree (no package installed) and under a partial
# contract, without a binary: the bundle's contents are given directly.


def _fake_bundle(monkeypatch, budgets):
    meta = {"id": "decode_attention/fake", "op": "decode_attention", "kernel": "decode_attention",
            "verdict": "failed", "message": "m", "repro": "r", "params": {}, "kernel_params": {"n": 3}}
    args = {"x": {"dtype": "f32", "shape": [2], "strides": [1], "offset": 0, "storage": 0, "role": "input"},
            "out": {"dtype": "f32", "shape": [2], "strides": [1], "offset": 0, "storage": 1, "role": "output"},
            "lse": {"dtype": "f32", "shape": [2], "strides": [1], "offset": 0, "storage": 2, "role": "output"}}
    storages = {0: np.array([1, 2], np.float32).tobytes(), 1: bytes(8), 2: bytes(8)}
    expected = {"out": ("f32", np.array([2, 4], np.float32)), "lse": ("f32", np.array([7, 7], np.float32))}
    monkeypatch.setattr(export_pytest, "_read_bundle", lambda path: (meta, args, storages, expected, budgets))


FAKE_ADAPTER = '''
import attncheck_bridge as ab

ADAPTER = ab.Adapter("fake_vllm")


@ADAPTER.entry("decode_attention", partial=PARTIAL, export=ab.Export(
    "vllm.v1.attention.ops.triton_decode_attention", "double", args=["t['x']", "t['out']"], framework="numpy"))
def decode_attention(t, p):
    pass
'''


def test_the_exported_file_loads_the_upstream_function_from_a_source_tree(tmp_path, monkeypatch):
    exact = {"kind": "exact"}
    _fake_bundle(monkeypatch, {"out": exact, "lse": exact})
    adapter = tmp_path / "fake_vllm.py"
    adapter.write_text(FAKE_ADAPTER.replace("PARTIAL", '{"not_produced": ["lse"]}'))
    out = tmp_path / "test_fake.py"
    export_pytest.generate("bundle.h5", str(adapter), str(out))
    kernel = tmp_path / "tree" / "vllm" / "v1" / "attention" / "ops" / "triton_decode_attention.py"
    kernel.parent.mkdir(parents=True)
    kernel.write_text("from vllm.platforms import current_platform\n"
                      "def double(x, out):\n    out[...] = 2 * x\n")
    monkeypatch.setenv("ATTNCHECK_VLLM_SRC", str(tmp_path / "tree"))
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(out)],
                         capture_output=True, text=True, env=_env(), timeout=300)
    assert ran.returncode == 0 and "1 passed" in ran.stdout, ran.stdout + ran.stderr
    mod = load(out)
    assert mod.NOT_PRODUCED == ["lse"] and list(mod.BUDGETS) == ["out"]  # lse: never written, not checked
    kernel.write_text("def double(x, out):\n    out[...] = 3 * x\n")  # the bug: the test fails
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(out)],
                         capture_output=True, text=True, env=_env(), timeout=300)
    assert ran.returncode == 1 and "out: 2 of 2 elements differ bitwise" in ran.stdout, ran.stdout


def test_an_unspecified_region_is_refused_with_the_reason(tmp_path, monkeypatch):
    _fake_bundle(monkeypatch, {"out": {"kind": "exact"}})
    adapter = tmp_path / "fake_vllm2.py"
    adapter.write_text(FAKE_ADAPTER.replace("PARTIAL", '{"unspecified": {"out": "past_context"}}'))
    with pytest.raises(export_pytest.ExportError, match=r"leaves out \(past_context\) unspecified"):
        export_pytest.generate("bundle.h5", str(adapter), str(tmp_path / "test_x.py"))


def test_a_large_offset_storage_is_exported_as_its_window_for_torch_only(tmp_path, monkeypatch):
    exact = {"kind": "exact"}
    _fake_bundle(monkeypatch, {"out": exact})
    meta, args, storages, expected, budgets = export_pytest._read_bundle("b.h5")
    meta = dict(meta, sparse={1: {"extent_bytes": 1 << 33, "window_begin_bytes": (1 << 33) - 8,
                                  "poison": "nan", "dtype": "f32"}})
    args = dict(args, out=dict(args["out"], offset=(1 << 31) - 2))
    monkeypatch.setattr(export_pytest, "_read_bundle", lambda path: (meta, args, storages, expected, budgets))
    adapter = tmp_path / "fake_vllm3.py"
    adapter.write_text(FAKE_ADAPTER.replace("PARTIAL", "None"))
    with pytest.raises(export_pytest.ExportError, match="only torch exports rebuild its extent"):
        export_pytest.generate("b.h5", str(adapter), str(tmp_path / "test_n.py"))
    adapter.write_text(FAKE_ADAPTER.replace("PARTIAL", "None").replace('framework="numpy"', 'framework="torch"'))
    out = tmp_path / "test_t.py"
    export_pytest.generate("b.h5", str(adapter), str(out))
    mod = load(out)
    assert mod.SPARSE == {1: {"extent_bytes": 1 << 33, "window_begin_bytes": (1 << 33) - 8, "poison": "nan", "dtype": "f32"}}
    assert mod.ARGS["out"]["offset"] == (1 << 31) - 2 and mod._blob("storage_1").size == 8  # the window only
