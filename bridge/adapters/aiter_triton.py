"""aiter_triton: AITER's (ROCm/aiter) Triton kernels judged by attncheck on any torch GPU, from an
AITER source tree (device "cuda"; docs/adapters/aiter.md, "AITER's Triton kernels").

    ATTNCHECK_AITER_SRC=<aiter checkout or partial tree> \\
      attncheck run --tier quick --op mla_decode --op sparse_mla --op indexer_logits_prefill \\
        --op indexer_logits_decode --kernels py:rocm_aiter       # or py:aiter_triton

``py:rocm_aiter`` hands over to this module whenever ``ATTNCHECK_AITER_SRC`` is set. Entries, each
calling an unmodified AITER function on views of the harness's buffers (``torch.from_dlpack``,
strides kept):

======================  ===========================================================================
entry                   AITER function (file under aiter/ops/triton/attention/)
======================  ===========================================================================
mla_decode              ``decode_attention_fwd`` (mla_decode.py); with ATTNCHECK_AITER_MLA=decode_rope
                        ``decode_attention_fwd_grouped_rope`` (mla_decode_rope.py, use_rope=False)
sparse_mla              ``unified_attention_sparse_mla`` (unified_attention_sparse_mla.py)
indexer_logits_prefill  ``fp8_mqa_logits`` (fp8_mqa_logits.py)
indexer_logits_decode   ``deepgemm_fp8_paged_mqa_logits`` (pa_mqa_logits.py)
======================  ===========================================================================

``ATTNCHECK_AITER_IMPL=torch_ref`` runs AITER's own torch references from
``op_tests/triton_tests/attention/`` through the same mapping instead (a third opinion beside
attncheck's reference): ``reference_torch`` (test_unified_attention_sparse_mla.py) for sparse_mla,
``ref_fp8_mqa_logits`` (test_fp8_mqa_logits.py) for indexer_logits_prefill; the other entries
decline there (no torch reference in that folder).

Loading (``_AiterFinder``): every ``aiter.*`` / ``op_tests.*`` module is executed from the tree,
unmodified, except these, each named on stderr when first used:

- packages are created empty: their ``__init__.py`` is not executed (``aiter/__init__.py`` loads
  the JIT-compiled HIP extension);
- ``aiter.dtypes``: ``fp8`` is the platform's fp8 (float8_e4m3fnuz on gfx942, float8_e4m3fn
  elsewhere), as ``aiter/utility/dtypes.py`` picks it per arch;
- ``aiter.jit.utils.chip_info``: ``get_gfx()`` / ``get_gfx_runtime()`` (the device's gcnArchName,
  ``sm_XY`` on NVIDIA), ``get_cu_num()`` (the multiprocessor count); it runs rocminfo in AITER;
- off ROCm, the Gluon modules (``aiter.ops.triton.gluon.*``, ``aiter.ops.triton._gluon_kernels.*``):
  AMD-only (``triton.experimental.gluon.language.amd``); AITER selects them only on gfx942/950/1250,
  and using one raises, naming it;
- ``pytest``, when the interpreter has none (the op_tests files decorate with ``pytest.mark``).

Off ROCm, the AMD backend's launch options ``waves_per_eu``, ``matrix_instr_nonkdim`` and ``kpack``
(occupancy and MFMA-shape hints Triton's NVIDIA backend rejects as unknown keywords) are dropped at
the launches of the wrapper modules' kernels, named once per kernel on stderr. Nothing else of a
launch or a kernel changes.

Every entry first asks the op whether the case is invalid (``ab.refuse_if_invalid()``: the MLA
16-head rule, the indexer heads, chunk_q and cache rules; docs/bridge.md "Validity") and refuses
with its reason; the rules are not re-coded here (nor in the rocm_aiter checks this module shares).

A file that cannot be found or fails to import declines every case of its entries with one line
naming the file and the error; a kernel that fails to compile on this GPU fails its cases with
Triton's error. Neither hides another entry.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

import attncheck_bridge as ab
from attncheck_bridge import Refuse, Unsupported

IMPL = os.environ.get("ATTNCHECK_AITER_IMPL", "kernel")
MLA_VARIANT = os.environ.get("ATTNCHECK_AITER_MLA", "decode")
LSE_POLICY = os.environ.get("ATTNCHECK_AITER_LSE", "decline")
for _var, _val, _known in (("ATTNCHECK_AITER_IMPL", IMPL, ("kernel", "torch_ref")),
                           ("ATTNCHECK_AITER_MLA", MLA_VARIANT, ("decode", "decode_rope")),
                           ("ATTNCHECK_AITER_LSE", LSE_POLICY, ("decline", "unwritten"))):
    if _val not in _known:
        raise ValueError(f"{_var} must be one of {', '.join(_known)}, got {_val!r}")

# mla_decode.py's two stage-1 kernels round differently: the MHA one (one head per KV head, N = 1)
# sums q*k products in the 16-bit input type (tl.sum keeps a float operand's type); the grouped
# one accumulates tl.dot in fp32 and rounds p to the value type before tl.dot(p, v). The same as
# vLLM's triton_decode_attention.py, from which AITER's file is adapted (docs/adapters/vllm.md).
# mla_decode_rope.py's grouped kernel is tl.dot in fp32 with p.to(v.dtype): p-in-input-type only.
MLA_CONTRACT = "qk-products-in-input-type+p-in-input-type" if MLA_VARIANT == "decode" else "p-in-input-type"
# unified_attention_sparse_mla: tl.dot in fp32, P.to(V.dtype) before tl.dot(P, V).
SPARSE_CONTRACT = "p-in-input-type"

ADAPTER = ab.Adapter(name="aiter_triton" if IMPL == "kernel" else "aiter_triton (AITER torch references)",
                     device="cuda")

# ------------------------------------------------------------------------------------------------
# Loading AITER's files from the tree


AMD_LAUNCH_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")
_ROOTS = ("aiter", "op_tests")


def _say(msg):
    # The bridge points sys.stdout at stderr; say it on stderr in any case (worker logs).
    print(f"aiter_triton: {msg}", file=sys.stderr)


def _torch():
    import torch

    return torch


def _on_rocm():
    return getattr(_torch().version, "hip", None) is not None


def device_arch():
    """gcnArchName's gfx part under ROCm, ``sm_XY`` on NVIDIA."""
    torch = _torch()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    if _on_rocm():
        return props.gcnArchName.split(":")[0]
    return f"sm_{props.major}{props.minor}"


def platform_fp8():
    """aiter.dtypes.fp8's choice: e4m3fnuz on gfx942 (MI300), e4m3fn elsewhere."""
    return "e4m3fnuz" if device_arch() == "gfx942" else "e4m3fn"


class StandInUsed(RuntimeError):
    pass


class _AmdOnly:
    """An attribute of a stood-in AMD-only module: importable, unusable."""

    def __init__(self, name):
        self._name = name

    def _fail(self, *a, **k):
        raise StandInUsed(f"{self._name} is an AMD-only Gluon kernel (stood in off ROCm)")

    __call__ = __getitem__ = _fail

    def __getattr__(self, attr):
        return _AmdOnly(f"{self._name}.{attr}")


def _standin_module(name, attrs=None, permissive=False, why=""):
    mod = types.ModuleType(name)
    mod.__attncheck_standin__ = why or True
    for k, v in (attrs or {}).items():
        setattr(mod, k, v)
    if permissive:
        mod.__getattr__ = lambda attr: _AmdOnly(f"{name}.{attr}")
    return mod


def _dtypes_module(name):
    torch = _torch()
    fp8 = torch.float8_e4m3fnuz if platform_fp8() == "e4m3fnuz" else torch.float8_e4m3fn
    return _standin_module(name, dict(fp8=fp8, bf16=torch.bfloat16, fp16=torch.float16, fp32=torch.float32,
                                      i32=torch.int32, i8=torch.int8, u8=torch.uint8),
                           why="fp8 = the platform's fp8 (aiter/utility/dtypes.py picks it per gfx arch)")


def _chip_info_module(name):
    def get_cu_num():
        torch = _torch()
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count

    return _standin_module(name, dict(get_gfx=device_arch, get_gfx_runtime=device_arch, get_cu_num=get_cu_num),
                           why="get_gfx() = the device's arch, get_cu_num() = its multiprocessor count (AITER runs rocminfo)")


_STANDINS = {"aiter.dtypes": _dtypes_module, "aiter.jit.utils.chip_info": _chip_info_module}


def _is_gluon(name):
    return name.startswith("aiter.ops.triton.gluon.") or name.startswith("aiter.ops.triton._gluon_kernels.")


class _AiterFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves aiter.* and op_tests.* against the tree; everything else is the interpreter's."""

    def __init__(self, root):
        self.root = root
        self.told = set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in _ROOTS:
            return None
        rel = os.path.join(self.root, *fullname.split("."))
        if fullname in _STANDINS or (_is_gluon(fullname) and not _on_rocm()):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=os.path.isdir(rel))
        if os.path.isdir(rel) or any(name.startswith(fullname + ".") for name in _STANDINS):
            spec = importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            spec.submodule_search_locations = [rel]
            return spec
        if os.path.isfile(rel + ".py"):
            return importlib.util.spec_from_file_location(fullname, rel + ".py")
        raise ModuleNotFoundError(f"{fullname}: {rel}.py is not in ATTNCHECK_AITER_SRC={self.root}", name=fullname)

    def create_module(self, spec):
        name = spec.name
        if name in _STANDINS:
            mod = _STANDINS[name](name)
        elif _is_gluon(name):
            mod = _standin_module(name, permissive=True, why="AMD-only Gluon kernels, stood in off ROCm")
        else:
            mod = types.ModuleType(name)  # a package: __init__.py is not executed
            mod.__path__ = list(spec.submodule_search_locations or [])
            return mod
        if name not in self.told:
            self.told.add(name)
            _say(f"stand-in {name}: {mod.__attncheck_standin__}")
        if spec.submodule_search_locations is not None:
            mod.__path__ = []
        return mod

    def exec_module(self, module):
        pass


_finder = {"root": None, "finder": None}


def aiter_root():
    """The tree ATTNCHECK_AITER_SRC names; Unsupported naming the problem when there is none."""
    src = os.environ.get("ATTNCHECK_AITER_SRC")
    if not src:
        raise Unsupported("ATTNCHECK_AITER_SRC is not set: point it at an AITER checkout or a tree holding its files")
    src = os.path.abspath(src)
    if not os.path.isdir(os.path.join(src, "aiter")):
        raise Unsupported(f"ATTNCHECK_AITER_SRC={src} holds no aiter/ folder")
    return src


def _install(root):
    if _finder["root"] == root:
        return
    for name in [m for m in sys.modules if m.split(".")[0] in _ROOTS]:
        del sys.modules[name]
    if _finder["finder"] is not None:
        sys.meta_path.remove(_finder["finder"])
    _finder["finder"] = _AiterFinder(root)
    sys.meta_path.insert(0, _finder["finder"])
    _finder["root"] = root
    if "pytest" not in sys.modules and importlib.util.find_spec("pytest") is None:
        sys.modules["pytest"] = _PytestStandIn("pytest")
        _say("stand-in pytest: the op_tests files only decorate with it")


class _PytestStandIn(types.ModuleType):
    """pytest.mark.<anything>(...) as a no-op decorator, for module-level code of op_tests files."""

    def __getattr__(self, attr):
        return _Decorator()


class _Decorator:
    def __getattr__(self, attr):
        return _Decorator()

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _Decorator()


def _drop_amd_options(kernel, where):
    """Makes ``kernel[grid](...)`` drop the AMD backend's options (off ROCm only). Triton's
    ``kernel[grid]`` calls ``self.run``, so the instance gets a ``run`` of its own; the object stays
    the JITFunction it was, so kernels that call it as a device function compile unchanged."""
    original = kernel.run
    told = []

    def run(*args, **kwargs):
        gone = [k for k in AMD_LAUNCH_OPTIONS if k in kwargs]
        for k in gone:
            del kwargs[k]
        if gone and not told:
            told.append(True)
            _say(f"{where}: AMD launch options {', '.join(gone)} dropped (unknown to Triton's NVIDIA backend)")
        return original(*args, **kwargs)

    kernel.run = run


def _shim_launch_options(mod):
    if _on_rocm():
        return
    from triton.runtime.jit import KernelInterface

    for name, value in list(vars(mod).items()):
        if isinstance(value, KernelInterface) and "run" not in vars(value):
            _drop_amd_options(value, f"{mod.__name__}.{name}")


_loaded = {}


def load(modname, fn_name):
    """``fn_name`` of AITER module ``modname`` from the tree; Unsupported with one line naming the
    file and the error when the tree lacks it or it fails to import."""
    key = (modname, fn_name)
    if key in _loaded:
        return _loaded[key]
    root = aiter_root()
    _install(root)
    path = os.path.join(root, *modname.split(".")) + ".py"
    if not os.path.isfile(path):
        raise Unsupported(f"ATTNCHECK_AITER_SRC={root} lacks {os.path.relpath(path, root)}")
    try:
        mod = importlib.import_module(modname)
    except Exception as e:  # noqa: BLE001 - any import failure declines this entry, names it
        raise Unsupported(f"{os.path.relpath(path, root)} failed to load: {type(e).__name__}: {e}") from e
    if modname.startswith("aiter."):
        _shim_launch_options(mod)
    fn = getattr(mod, fn_name, None)
    if fn is None:
        raise Unsupported(f"{os.path.relpath(path, root)} defines no {fn_name}")
    _loaded[key] = fn
    _say(f"{fn_name} <- {path}")
    return fn


# ------------------------------------------------------------------------------------------------
# Shared checks


def _ra():
    """rocm_aiter holds the MLA refusals the op contracts share (imported at call time: rocm_aiter
    hands over to this module, so neither may import the other at load)."""
    import rocm_aiter

    return rocm_aiter


def _fp8_dtype(fmt):
    torch = _torch()
    return {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}[fmt]


def _expect_platform_fp8(fmt, who):
    want = platform_fp8()
    if fmt != want:
        raise Unsupported(
            f"fp8_format {fmt}: {who} reads the platform's fp8 ({want} on {device_arch()}); "
            + ("Triton's fp8e4b8 (e4m3fnuz) is an AMD backend type" if fmt == "e4m3fnuz" else "AITER's dtypes.fp8 is fnuz here")
        )


def _host(t, name):
    return _torch().from_dlpack(t[name]).cpu()


def _lse_not_produced(fn_desc):
    """The entry's AITER function stores no LSE; decline unless ATTNCHECK_AITER_LSE=unwritten."""
    if LSE_POLICY != "unwritten":
        raise Unsupported(
            f"{fn_desc} stores no LSE, which attncheck's contract includes (ATTNCHECK_AITER_LSE=unwritten runs it "
            "anyway: 'out' is judged, 'lse' fails as unwritten)"
        )


def _mla_metadata(t, f):
    """Validated per-token metadata of a dense MLA case: (request of every token, causal kv length of
    every token, qlens). Refusals as docs/ops/mla_decode.md."""
    torch = _torch()
    sl, qsl = t["seq_lens"], t["query_start_loc"]
    for x in (sl, qsl):
        ab.expect_dtype(x, "i32")
        if x.ndim != 1 or not x.is_contiguous():
            raise Refuse(f"'{x.name}' must be a contiguous 1-D tensor")
    B = sl.shape[0]
    if qsl.shape[0] != B + 1 or t["block_table"].shape[0] != B:
        raise Refuse(f"seq_lens [{B}], query_start_loc {qsl.shape}, block_table {t['block_table'].shape} disagree")
    lens, starts, table = _host(t, "seq_lens").long(), _host(t, "query_start_loc").long(), _host(t, "block_table")
    qlens = starts[1:] - starts[:-1]
    if starts[0] != 0 or starts[-1] != f["T"] or bool((qlens < 0).any()):
        raise Refuse(f"query_start_loc must run from 0 to T={f['T']} without decreasing")
    if bool((lens < qlens).any()):
        raise Refuse("a request's kv length is shorter than its query tokens")
    need = (lens + f["P"] - 1) // f["P"]
    if bool((need > table.shape[1]).any()):
        raise Refuse(f"the block table ({table.shape[1]} columns) is too narrow for a request")
    for r in range(B):
        used = table[r, : int(need[r])]
        if bool(((used < 0) | (used >= f["nb"])).any()):
            raise Refuse("the block table names a block outside the cache")
    req = torch.repeat_interleave(torch.arange(B), qlens)
    pos = torch.arange(f["T"]) - starts[req]  # local position i of every token
    causal = lens[req] - qlens[req] + pos + 1
    return req, causal, qlens


def _num_kv_splits(p, max_len):
    s = int(p.get("num_kv_splits", 0) or 0)
    if s < 0 or s > 65535:
        raise Refuse(f"num_kv_splits = {s} outside [0, 65535]")
    return s or max(1, min(16, -(-int(max_len) // 256)))


# ------------------------------------------------------------------------------------------------
# mla_decode


@ADAPTER.entry("mla_decode", contract=MLA_CONTRACT)
def mla_decode(t, p):
    """docs/ops/mla_decode.md. AITER's Triton decode kernels have one query row per batch entry and
    no qlen: every query token becomes its own entry over its causal prefix (b_seq_len / kv_indptr
    = kv_len - qlen + i + 1) with its request's pages; fewer than 16 heads run as they are (the
    kernels mask head tiles with BLOCK_H; nothing to pad)."""
    ab.refuse_if_invalid()
    ra = _ra()
    f = ra._mla_common(t, p)
    req, causal, qlens = _mla_metadata(t, f)
    if IMPL == "torch_ref":
        raise Unsupported("op_tests/triton_tests/attention has no torch reference of MLA decode "
                          "(op_tests/triton_tests/utils/mla_decode_ref.py is Triton)")
    if f["fmt"] is not None:
        _expect_platform_fp8(f["fmt"], "mla_decode.py's fp8 cache")
    if MLA_VARIANT == "decode_rope":
        return _mla_decode_rope(t, f, req, causal)
    torch = _torch()
    fn = load("aiter.ops.triton.attention.mla_decode", "decode_attention_fwd")
    if f["N"] > 1 and t["lse"].strides[1] != 1:
        raise Unsupported(f"lse strides {t['lse'].strides}: stage 2 stores lse + b * stride(0) + h")
    table = t["block_table"]
    if bool((qlens == 1).all()) and f["T"] == table.shape[0]:
        if table.shape[1] > 1 and table.strides[1] != 1:
            raise Unsupported(f"block_table strides {table.strides}: the kernels read Req_to_tokens + b * stride(0) + page")
        req_to_token = torch.from_dlpack(table)
    else:
        # Spec-decode rows: every token reads its request's row of pages (host-built, contiguous).
        req_to_token = _host(t, "block_table")[req].to(torch.int32).contiguous().cuda()
    q, out, lse = (torch.from_dlpack(t[n]) for n in ("q", "out", "lse"))
    kv = torch.from_dlpack(t["kv_cache"])
    if f["fmt"] is not None:
        kv = kv.view(_fp8_dtype(f["fmt"]))
    k_buffer = kv.view(-1, 1, f["Lk"])  # page-size-1 rows; PAGE_SIZE addresses them as page * P + t % P
    v_buffer = k_buffer[..., : f["Lv"]]
    S = _num_kv_splits(p, int(causal.max()) if f["T"] else 1)
    attn_logits = torch.full((f["T"], f["N"], S, f["Lv"] + 1), float("nan"), dtype=torch.float32, device=q.device)
    b_seq_len = causal.to(torch.int32).cuda()
    scales = {}
    if f["fmt"] is not None:
        scales = {"k_scale": torch.tensor([f["kv_scale"]], dtype=torch.float32, device=q.device)}
        scales["v_scale"] = scales["k_scale"]
    fn(q, k_buffer, v_buffer, out, lse, req_to_token, b_seq_len, attn_logits, S, f["scale"],
       page_size=f["P"], logit_cap=0.0, **scales)


def _mla_decode_rope(t, f, req, causal):
    """mla_decode_rope.py with use_rope=False: paged through kv_indptr/kv_indices (page size 1),
    one KV split, because stage 2 merges the splits without storing the LSE and stage 1's record
    (e_max + log e_sum at offset kv_lora_rank) is the row's LSE only when there is one split."""
    torch = _torch()
    if f["fmt"] is not None:
        raise Unsupported("decode_attention_fwd_grouped_rope takes no kv scale: bf16/f16 caches only")
    fn = load("aiter.ops.triton.attention.mla_decode_rope", "decode_attention_fwd_grouped_rope")
    table = _host(t, "block_table").long()
    P = f["P"]
    rows = []
    for i in range(f["T"]):
        tok = torch.arange(int(causal[i]))
        rows.append(table[int(req[i]), tok // P] * P + tok % P)
    kv_indptr = torch.zeros(f["T"] + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(causal, 0).to(torch.int32)
    kv_indices = (torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)).to(torch.int32).cuda()
    q, out, lse = (torch.from_dlpack(t[n]) for n in ("q", "out", "lse"))
    kv = torch.from_dlpack(t["kv_cache"]).view(-1, 1, f["Lk"])
    attn_logits = torch.full((f["T"], f["N"], 1, f["Lv"] + 1), float("nan"), dtype=torch.float32, device=q.device)
    config = _rope_config()
    fn(q, kv, kv[..., : f["Lv"]], out, kv_indptr.cuda(), kv_indices, None, f["Lv"], 0, None, None, attn_logits, 1,
       f["scale"], logit_cap=0.0, use_rope=False, is_neox_style=False, config=config)
    lse.copy_(attn_logits[:, :, 0, f["Lv"]])


def _rope_config():
    """The tree's gfx950 tuning of mla_decode_rope (NVIDIA has none; _get_config() looks one up by
    arch_info.get_arch()); AMD launch options in it are dropped at launch off ROCm."""
    import json

    arch = device_arch() if _on_rocm() else "gfx950"
    path = os.path.join(aiter_root(), "aiter", "ops", "triton", "configs", f"{arch}-MLA_DECODE_ROPE-DEFAULT.json")
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError) as e:
        raise Unsupported(f"{path}: {e}") from e


# ------------------------------------------------------------------------------------------------
# sparse_mla


def _sparse_common(t, p):
    """Refusals of docs/ops/sparse_mla.md and the converted top-k: [T, topk] global slots, -1 where
    the contract's conversion gives -1 (triton_convert_req_index_to_global_index's rule)."""
    ra = _ra()
    f = ra._mla_common(t, p)
    req, topk = t["req_id_per_token"], t["topk_indices"]
    ab.expect_dtype(req, "i32")
    ab.expect_dtype(topk, "i32")
    if req.ndim != 1 or not req.is_contiguous() or req.shape[0] != f["T"]:
        raise Refuse(f"req_id_per_token must be a contiguous [T={f['T']}]")
    ab.expect_ndim(topk, 2)
    if topk.shape[0] != f["T"]:
        raise Refuse(f"topk_indices {topk.shape} is not [T={f['T']}, topk]")
    torch = _torch()
    table = _host(t, "block_table").long()
    r = _host(t, "req_id_per_token").long()
    if bool(((r < 0) | (r >= table.shape[0])).any()):
        raise Refuse("req_id_per_token names a request outside the block table")
    tok = _host(t, "topk_indices").long()
    P, W = f["P"], table.shape[1]
    blk = torch.where(tok >= 0, tok // P, torch.full_like(tok, -1))
    ok = (tok >= 0) & (blk >= 0) & (blk < W)
    page = table[r.unsqueeze(1).expand_as(tok), blk.clamp(0, W - 1)]
    slots = torch.where(ok, page * P + tok % P, torch.full_like(tok, -1))
    if bool(((slots >= f["nb"] * P) | ((slots < 0) & (slots != -1))).any()):
        raise ValueError("a converted slot lies outside the cache (a block table entry names a missing block)")
    return f, r, tok.masked_fill(~ok, -1), slots


@ADAPTER.entry("sparse_mla", contract=SPARSE_CONTRACT)
def sparse_mla(t, p):
    """docs/ops/sparse_mla.md. Every token is its own request (cu_seqlens_q = 0..T, max_seqlen_q 1,
    as AITER's op test feeds decode); its top-k converted to global slots (the kernel's note:
    "topk_indices index the KV cache, not block_table"), -1 where invalid."""
    ab.refuse_if_invalid()
    f, r, local, slots = _sparse_common(t, p)
    if f["fmt"] is not None:
        raise Unsupported("an fp8 cache: unified_attention_sparse_mla takes no kv scale (KV bfloat16)")
    if IMPL == "torch_ref":
        return _sparse_mla_torch_ref(t, f, r, local)
    torch = _torch()
    fn = load("aiter.ops.triton.attention.unified_attention_sparse_mla", "unified_attention_sparse_mla")
    _lse_not_produced("unified_attention_sparse_mla")
    T = f["T"]
    q, out = torch.from_dlpack(t["q"]), torch.from_dlpack(t["out"])
    kv = torch.from_dlpack(t["kv_cache"]).unsqueeze(2)  # [num_blocks, P, 1, Lk]
    cu = torch.arange(T + 1, dtype=torch.int32, device=q.device)
    used = torch.ones(T, dtype=torch.int32, device=q.device)  # seqused_k: read by no kernel line
    fn(q, kv, out, cu, 1, used, 1, f["scale"], slots.to(torch.int32).contiguous().cuda(),
       torch.from_dlpack(t["block_table"]), f["Lv"])


def _sparse_mla_torch_ref(t, f, r, local):
    """AITER's reference_torch over every token as its own batch (s_q = 1): block table row of its
    request, cache_seqlens = one past its largest valid index, request-local indices (-1 invalid).
    It runs on CPU tensors (its masks are built on the default device); the cache blocks it reads
    are gathered into a compact copy."""
    torch = _torch()
    if t["q"].dtype_name != "bf16":
        raise Unsupported("reference_torch returns bf16: f16 cases are not comparable")
    fn = load("op_tests.triton_tests.attention.test_unified_attention_sparse_mla", "reference_torch")
    _lse_not_produced("reference_torch (test_unified_attention_sparse_mla.py)")
    T, P = f["T"], f["P"]
    table = _host(t, "block_table").long()[r]  # [T, W]
    seqlens = (local.max(dim=1).values + 1).clamp(min=0)
    nblk = (seqlens + P - 1) // P
    W = int(nblk.max()) if T else 0
    cache = torch.from_dlpack(t["kv_cache"])
    blocks = sorted({int(b) for i in range(T) for b in table[i, : int(nblk[i])].tolist()})
    where = {b: j for j, b in enumerate(blocks)}
    compact = cache[torch.tensor(blocks, dtype=torch.long, device=cache.device)].cpu().unsqueeze(2) if blocks else \
        torch.zeros(0, P, 1, f["Lk"], dtype=torch.bfloat16)
    remap = torch.zeros(T, max(W, 1), dtype=torch.int32)
    for i in range(T):
        for j in range(int(nblk[i])):
            remap[i, j] = where[int(table[i, j])]
    q = torch.from_dlpack(t["q"]).cpu().unsqueeze(1)  # [T, 1, N, Lk]
    ref = fn(seqlens.to(torch.int32), remap, q, compact, f["Lv"], f["scale"], False, local.to(torch.int32).unsqueeze(1))
    torch.from_dlpack(t["out"]).copy_(ref[:, 0].to(torch.from_dlpack(t["out"]).device))


# ------------------------------------------------------------------------------------------------
# indexer logits: the arguments are checked by rocm_aiter's indexer_logits_*_args (shared)


@ADAPTER.entry("indexer_logits_prefill")
def indexer_logits_prefill(t, p):
    """docs/ops/indexer.md through fp8_mqa_logits (its logits, allocated by it, copied into the
    harness's view)."""
    ab.refuse_if_invalid()
    fmt, (q, kf, ks, w, ks_, ke, logits), H = _ra().indexer_logits_prefill_args(t, p)
    if IMPL == "kernel":
        _expect_platform_fp8(fmt, "fp8_mqa_logits")
    torch = _torch()
    dt = _fp8_dtype(fmt)
    qv, kv = torch.from_dlpack(q).view(dt), torch.from_dlpack(kf).view(dt)
    args = [torch.from_dlpack(x) for x in (ks, w, ks_, ke)]
    if IMPL == "torch_ref":
        fn = load("op_tests.triton_tests.attention.test_fp8_mqa_logits", "ref_fp8_mqa_logits")
        # The reference takes the keys as values: the fp8 codes times their per-token scale, in fp32.
        k_values = kv.float() * args[0].unsqueeze(1)
        got, _ = fn(qv, k_values, args[1], args[2], args[3])
    else:
        if H & (H - 1):
            raise Unsupported(f"{H} heads: fp8_mqa_logits asserts a power-of-two head count")
        fn = load("aiter.ops.triton.attention.fp8_mqa_logits", "fp8_mqa_logits")
        got = fn(qv, kv, args[0], args[1], args[2], args[3])
    torch.from_dlpack(logits).copy_(got)


@ADAPTER.entry("indexer_logits_decode")
def indexer_logits_decode(t, p):
    """docs/ops/indexer.md through deepgemm_fp8_paged_mqa_logits as vLLM's ROCm path calls it
    (ChunkK 256, ChunkQ = the head count, KVBlockSize = the block size), written into the harness's
    logits."""
    ab.refuse_if_invalid()
    torch = _torch()
    ra = _ra()
    fmt, (q, cache, w, lens, table, logits), (B, nn, H, D), chunk, (nb, bs) = ra.indexer_logits_decode_args(t, p)
    if IMPL == "torch_ref":
        raise Unsupported("op_tests/triton_tests/attention has no torch reference of the paged MQA logits")
    _expect_platform_fp8(fmt, "deepgemm_fp8_paged_mqa_logits")
    if chunk != H:
        raise Unsupported(f"ChunkQ {chunk} < {H} heads: deepgemm_fp8_paged_mqa_logits' ChunkQ is the head count")
    if bs > 1 and not _on_rocm():
        raise Unsupported(
            f"block size {bs} is the SHUFFLE layout, read with Preshuffle=True: pa_mqa_logits.py asserts "
            "'Preshuffle mode is only supported on gluon kernel' and its Gluon kernels are AMD-only"
        )
    ra._packed_pages(cache, "deepgemm_fp8_paged_mqa_logits (kv_cache.view(-1, KVBlockSize * index_dim))")
    if table.shape[0] > 1 and not (table.strides[0] == table.shape[1] and (table.shape[1] <= 1 or table.strides[1] == 1)):
        raise Unsupported(f"block_table strides {table.strides}: the kernel reads kv_indices + batch * max_blk_len + i")
    if logits.shape[1] > 1 and logits.strides[1] != 1:
        raise Unsupported("logits must have a unit column stride")
    fn = load("aiter.ops.triton.attention.pa_mqa_logits", "deepgemm_fp8_paged_mqa_logits")
    dt = _fp8_dtype(fmt)
    fn(torch.from_dlpack(q).view(dt), torch.from_dlpack(cache).unsqueeze(2), torch.from_dlpack(w),
       torch.from_dlpack(logits), torch.from_dlpack(lens), torch.from_dlpack(table), logits.shape[1],
       Preshuffle=bs > 1, KVBlockSize=bs, ChunkK=256, WavePerEU=2)
