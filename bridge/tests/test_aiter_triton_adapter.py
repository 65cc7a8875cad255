"""AITER's Triton entries (attncheck_bridge.aiter_triton_entries, served by py:aiter_triton and, with
a tree named, py:rocm_aiter) on the CPU, without torch or Triton: loading AITER files from a source
tree (fake trees here) through attncheck_bridge.upstream, the stand-ins, the AMD launch options
dropped off ROCm, bad input declining one entry at a time, both adapters serving the entries
without importing each other, the partial contracts, and the refusals that come before any device
work. The kernels themselves ran on the GPU machine (docs/results.md).
"""

import os
import re
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

import importlib.util

import attncheck_bridge as ab
from attncheck_bridge import Refuse, Unsupported, upstream
from attncheck_bridge import aiter_triton_entries as at

HERE = os.path.dirname(os.path.abspath(__file__))
BRIDGE = os.path.dirname(HERE)


class _Props:
    major, minor, multi_processor_count = 9, 0, 132
    gcnArchName = "gfx942:sramecc+:xnack-"


def _fake_torch(hip=None):
    torch = types.ModuleType("torch")
    torch.version = types.SimpleNamespace(hip=hip)
    torch.cuda = types.SimpleNamespace(current_device=lambda: 0, get_device_properties=lambda i: _Props())
    for name in ("float8_e4m3fn", "float8_e4m3fnuz", "bfloat16", "float16", "float32", "int32", "int8", "uint8"):
        setattr(torch, name, f"torch.{name}")
    return torch


class _KernelInterface:
    """Triton's KernelInterface as far as the shim relies on it: kernel[grid] calls self.run."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.run(*args, grid=grid, **kwargs)


class _Kernel(_KernelInterface):
    def __init__(self):
        self.launches = []

    def run(self, *args, **kwargs):
        self.launches.append(kwargs)
        return "compiled"


@pytest.fixture()
def env(monkeypatch):
    """Fake torch/triton, and aiter*/op_tests* modules and the finder restored afterwards (the
    stand-in tests import a stand-in 'aiter' into this process)."""
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] in ("aiter", "op_tests")}
    meta = list(sys.meta_path)
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    triton = types.ModuleType("triton")
    runtime = types.ModuleType("triton.runtime")
    jit = types.ModuleType("triton.runtime.jit")
    jit.KernelInterface = _KernelInterface
    for name, mod in (("triton", triton), ("triton.runtime", runtime), ("triton.runtime.jit", jit)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setitem(sys.modules, "_attncheck_test_kernels", types.SimpleNamespace(Kernel=_Kernel))
    upstream.aiter_reset()
    yield monkeypatch
    upstream.aiter_reset()
    for k in [k for k in sys.modules if k.split(".")[0] in ("aiter", "op_tests")]:
        del sys.modules[k]
    sys.modules.update(saved)
    sys.meta_path[:] = meta


def tree(tmp_path, files):
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return str(tmp_path)


ATT = "aiter/ops/triton/attention/"
MLA = ("aiter.ops.triton.attention.mla_decode", "decode_attention_fwd")
LOGITS = ("aiter.ops.triton.attention.fp8_mqa_logits", "fp8_mqa_logits")


def test_no_tree_named_declines(env):
    env.delenv("ATTNCHECK_AITER_SRC", raising=False)
    with pytest.raises(Unsupported, match="ATTNCHECK_AITER_SRC is not set"):
        at.load(*MLA)


def test_a_missing_tree_declines_naming_it(env):
    env.setenv("ATTNCHECK_AITER_SRC", "/nonexistent/aiter")
    with pytest.raises(Unsupported, match=r"ATTNCHECK_AITER_SRC=/nonexistent/aiter holds no aiter/ folder"):
        at.load(*MLA)


def test_a_missing_or_broken_file_declines_its_entry_only(env, tmp_path):
    root = tree(tmp_path, {ATT + "fp8_mqa_logits.py": "def fp8_mqa_logits():\n    return 'ran'\n",
                           ATT + "pa_mqa_logits.py": "def deepgemm_fp8_paged_mqa_logits(:\n"})
    env.setenv("ATTNCHECK_AITER_SRC", root)
    with pytest.raises(Unsupported, match=r"lacks aiter/ops/triton/attention/mla_decode\.py"):
        at.load(*MLA)
    with pytest.raises(Unsupported, match=r"aiter/ops/triton/attention/pa_mqa_logits\.py failed to load: SyntaxError"):
        at.load("aiter.ops.triton.attention.pa_mqa_logits", "deepgemm_fp8_paged_mqa_logits")
    assert at.load(*LOGITS)() == "ran"


def test_a_file_missing_what_it_imports_loads_and_using_it_names_the_module(env, tmp_path):
    root = tree(tmp_path, {ATT + "mla_decode.py": "from aiter.ops.triton.utils.nowhere import x\n"
                                                  "def decode_attention_fwd():\n    return x + 1\n"})
    env.setenv("ATTNCHECK_AITER_SRC", root)
    fn = at.load(*MLA)
    with pytest.raises(Unsupported, match=r"aiter\.ops\.triton\.utils\.nowhere\.x is a stand-in \(module "
                                          r"aiter\.ops\.triton\.utils\.nowhere: not in the tree"):
        fn()


def test_files_run_unmodified_with_named_stand_ins(env, tmp_path, capsys):
    root = tree(tmp_path, {
        "aiter/__init__.py": "raise RuntimeError('the JIT extension must not load')\n",
        "aiter/ops/triton/utils/helper.py": "VALUE = 7\n",
        "aiter/ops/triton/gluon/fast.py": "raise RuntimeError('AMD only')\n",
        ATT + "mla_decode.py": """
            from aiter import dtypes
            from aiter.jit.utils.chip_info import get_gfx, get_cu_num
            from aiter.ops.triton.gluon.fast import gluon_kernel
            from aiter.ops.triton.utils.helper import VALUE

            def decode_attention_fwd():
                return dtypes.fp8, get_gfx(), get_cu_num(), VALUE, gluon_kernel
        """,
    })
    env.setenv("ATTNCHECK_AITER_SRC", root)
    fp8, gfx, cus, value, gluon = at.load(*MLA)()
    assert (fp8, gfx, cus, value) == ("torch.float8_e4m3fn", "sm_90", 132, 7)
    with pytest.raises(at.StandInUsed, match=r"aiter\.ops\.triton\.gluon\.fast\.gluon_kernel is an AMD-only Gluon kernel"):
        gluon[1]
    err = capsys.readouterr().err
    for name in ("aiter.dtypes", "aiter.jit.utils.chip_info", "aiter.ops.triton.gluon.fast"):
        assert f"stand-in {name}:" in err
    assert f"decode_attention_fwd <- {os.path.join(root, ATT, 'mla_decode.py')}" in err


def test_the_platform_fp8_follows_aiters_choice(env):
    assert at.platform_fp8() == "e4m3fn"
    env.setitem(sys.modules, "torch", _fake_torch(hip="6.2"))
    assert (at.device_arch(), at.platform_fp8()) == ("gfx942", "e4m3fnuz")


KERNEL_FILE = """
    from _attncheck_test_kernels import Kernel
    _kernel = Kernel()

    def fp8_mqa_logits():
        return _kernel[(4,)](1, num_warps=4, waves_per_eu=2, matrix_instr_nonkdim=16, kpack=2), _kernel
"""


def test_amd_launch_options_are_dropped_off_rocm_and_nothing_else(env, tmp_path, capsys):
    env.setenv("ATTNCHECK_AITER_SRC", tree(tmp_path, {ATT + "fp8_mqa_logits.py": KERNEL_FILE}))
    result, kernel = at.load(*LOGITS)()
    assert result == "compiled"
    assert kernel.launches == [{"grid": (4,), "num_warps": 4}]
    assert "AMD launch options waves_per_eu, matrix_instr_nonkdim, kpack dropped" in capsys.readouterr().err
    assert isinstance(kernel, _Kernel)  # still the kernel object: device-function calls compile unchanged


def test_amd_launch_options_stay_on_rocm(env, tmp_path):
    env.setitem(sys.modules, "torch", _fake_torch(hip="6.2"))
    env.setenv("ATTNCHECK_AITER_SRC", tree(tmp_path, {ATT + "fp8_mqa_logits.py": KERNEL_FILE}))
    _, kernel = at.load(*LOGITS)()
    assert kernel.launches == [{"grid": (4,), "num_warps": 4, "waves_per_eu": 2, "matrix_instr_nonkdim": 16, "kpack": 2}]


def test_op_tests_files_load_without_pytest(env, tmp_path):
    # As on a GPU host without pytest: a stand-in lets the files' pytest.mark decorators run.
    find_spec = importlib.util.find_spec
    env.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pytest" else find_spec(name, *a))
    env.delitem(sys.modules, "pytest")
    env.setenv("ATTNCHECK_AITER_SRC", tree(tmp_path, {"aiter/ops/__init__.py": "", "op_tests/triton_tests/attention/test_x.py": """
        import pytest

        @pytest.mark.parametrize("n", [1, 2])
        def ref(n):
            return n + 1
    """}))
    assert at.load("op_tests.triton_tests.attention.test_x", "ref")(2) == 3


def _python(env_extra, code):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(BRIDGE, "python"), os.path.join(BRIDGE, "adapters")]),
               PYTHONDONTWRITEBYTECODE="1", **env_extra)
    env.pop("ATTNCHECK_AITER_BACKEND", None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def test_rocm_aiter_serves_the_triton_entries_when_a_tree_is_named_without_importing_aiter_triton():
    code = ("import sys, rocm_aiter; print('aiter_triton' in sys.modules, rocm_aiter.ADAPTER.name, "
            "*sorted(rocm_aiter.ADAPTER.entries))")
    assert _python({"ATTNCHECK_AITER_SRC": "/some/tree"}, code).stdout.split() == [
        "False", "aiter_triton", "indexer_logits_decode", "indexer_logits_prefill", "mla_decode", "sparse_mla"]
    r = _python({}, "import os; os.environ.pop('ATTNCHECK_AITER_SRC', None); import rocm_aiter; print(rocm_aiter.ADAPTER.name)")
    assert r.stdout.split() == ["rocm_aiter"]


def test_no_upstream_adapter_imports_another():
    """(numpy_broken derives from numpy_reference on purpose: it is the mutant of the reference.)"""
    adapters = os.path.join(BRIDGE, "adapters")
    names = {"vllm_triton", "rocm_aiter", "aiter_triton", "deepgemm", "flashmla"}
    for f in sorted(names):
        with open(os.path.join(adapters, f + ".py")) as fh:
            text = fh.read()
        for other in names - {f}:
            assert not re.search(rf"^\s*(import {other}\b|from {other}\b)", text, re.M), f"{f}.py imports {other}"


def test_sparse_mla_declares_lse_not_produced_and_logits_decode_the_past_context():
    for adapter in (at.adapter(), at.register(ab.Adapter("x", device="cuda"))):
        assert adapter.partial_of("sparse_mla")["not_produced"] == ["lse"]
        assert adapter.partial_of("indexer_logits_decode")["unspecified"] == {"logits": "past_context"}
        assert adapter.partial_of("mla_decode") == {"not_produced": [], "unspecified": {}}


def test_contracts_follow_the_kernels_and_bad_settings_fail_at_load():
    code = "import aiter_triton as a; print(*(a.ADAPTER.contract_of(n) for n in ('mla_decode', 'sparse_mla', 'indexer_logits_prefill')))"
    assert _python({}, code).stdout.split() == [
        "qk-products-in-input-type+p-in-input-type", "p-in-input-type", "fp32-accumulate"]
    assert _python({"ATTNCHECK_AITER_MLA": "decode_rope"}, code).stdout.split()[0] == "p-in-input-type"
    r = _python({"ATTNCHECK_AITER_IMPL": "hip"}, "import aiter_triton")
    assert r.returncode != 0 and "ATTNCHECK_AITER_IMPL must be one of kernel, torch_ref, got 'hip'" in r.stderr


# --- refusals before any device work: the op contracts' invalid configurations ---------------------

T_ = ab.Tensor.from_numpy


def mla_tensors(heads=12, T=2, lk=96, lv=64):
    bf = np.zeros((T, heads, lk), np.uint16)
    return {
        "q": T_(bf, "q", "bf16"),
        "kv_cache": T_(np.zeros((4, 16, lk), np.uint16), "kv_cache", "bf16"),
        "block_table": T_(np.zeros((T, 2), np.int32), "block_table"),
        "seq_lens": T_(np.full(T, 5, np.int32), "seq_lens"),
        "query_start_loc": T_(np.arange(T + 1, dtype=np.int32), "query_start_loc"),
        "req_id_per_token": T_(np.arange(T, dtype=np.int32), "req_id_per_token"),
        "topk_indices": T_(np.zeros((T, 16), np.int32), "topk_indices"),
        "out": T_(np.zeros((T, heads, lv), np.uint16), "out", "bf16"),
        "lse": T_(np.zeros((T, heads), np.float32), "lse"),
    }


MLA_PARAMS = {"scale": 0.1, "kv_scale": 1.0, "kernel_block_size": 16, "lv": 64}
# The op's reason for an invalid head count (reference/mla_decode.cpp, mla_num_heads_message).
MLA_HEADS_12 = ("Aiter MLA requires that num_heads be multiples or divisors of 16, but provided 12 number of heads.\n"
                "Try adjusting tensor_parallel_size value.")


@pytest.mark.parametrize("entry", ["mla_decode", "sparse_mla"])
def test_mla_head_counts_the_op_calls_invalid_are_refused_with_its_reason(invalid_case, entry):
    invalid_case(entry, MLA_HEADS_12)
    with pytest.raises(Refuse) as refused:
        getattr(at, entry)(mla_tensors(heads=12), MLA_PARAMS)
    assert refused.value.why == MLA_HEADS_12


@pytest.mark.parametrize("change, why", [
    ({"kernel_block_size": 64}, "kernel_block_size 64 is not the cache block size 16"),
    ({"kv_scale": 2.0}, "kv_scale must be 1 for a 16-bit cache"),
    ({"lv": 32}, "lv=32 but out holds 64"),
])
def test_mla_parameters_the_contract_calls_invalid_are_refused(change, why):
    with pytest.raises(Refuse, match=why):
        at.mla_decode(mla_tensors(heads=4), dict(MLA_PARAMS, **change))


def logits_tensors(heads=8, fmt_rows=4):
    u8 = np.zeros((fmt_rows, heads, 128), np.uint8)
    return {
        "q": T_(u8, "q"), "k_fp8": T_(np.zeros((6, 128), np.uint8), "k_fp8"), "k_scale": T_(np.ones(6, np.float32), "k_scale"),
        "weights": T_(np.ones((fmt_rows, heads), np.float32), "weights"),
        "cu_seqlen_ks": T_(np.zeros(fmt_rows, np.int32), "cu_seqlen_ks"), "cu_seqlen_ke": T_(np.full(fmt_rows, 6, np.int32), "cu_seqlen_ke"),
        "logits": T_(np.zeros((fmt_rows, 6), np.float32), "logits"),
    }


def test_prefill_logits_refusals():
    with pytest.raises(Refuse, match="fp8_format must be e4m3fn or e4m3fnuz"):
        at.indexer_logits_prefill(logits_tensors(heads=8), {})


@pytest.mark.parametrize("entry, reason", [
    ("indexer_logits_prefill", "heads 256 outside [1, 128]"),
    ("indexer_logits_decode", "heads 48 not a multiple of chunk_q 32"),
    ("indexer_logits_decode", "block size 24 is neither 1 (NORMAL) nor a multiple of 16 (SHUFFLE)"),
])
def test_logits_entries_ask_the_op_whether_the_case_is_invalid(invalid_case, entry, reason):
    """The op's reason (indexer_scores.cpp's invalid()), before any argument is read."""
    invalid_case(entry, reason)
    with pytest.raises(Refuse) as refused:
        getattr(at, entry)({}, {"fp8_format": "e4m3fn"})
    assert refused.value.why == reason
