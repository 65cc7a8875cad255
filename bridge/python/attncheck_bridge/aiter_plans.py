"""py:rocm_aiter's plans: AITER calls described as data (what to call, with what: views of the
harness's tensors, host-built metadata, workspaces), what AITER's HIP/ASM ops serve per arch (the
MLA kernel table, RoPE's layouts), the call sequences vLLM's ROCm backends make, and the executor
that runs a plan on a backend (torch on the GPU with the real aiter, or NumPy on
host buffers with the stand-in aiter of bridge/tests/aiter_standin). Nothing here decides what a
case means; the plans are bridge/adapters/rocm_aiter.py's entries.
"""

import importlib

import numpy as np

import attncheck_bridge as ab
from attncheck_bridge import Refuse, Unsupported
from attncheck_bridge import adapter_checks as checks

ARCHS = ("gfx942", "gfx950")


# ------------------------------------------------------------------------------------------------
# Plans: what to call, with what. Nothing here touches a device.


class Ref:
    """A tensor a plan step uses: a view of a harness argument ("arg") or of a buffer an earlier
    step made ("work"), with view operations applied in order (no copies)."""

    __slots__ = ("kind", "key", "ops")

    def __init__(self, kind, key, ops=()):
        self.kind, self.key, self.ops = kind, key, tuple(ops)

    def _then(self, op):
        return Ref(self.kind, self.key, self.ops + (op,))

    def unsqueeze(self, dim):
        return self._then(("unsqueeze", dim))

    def view(self, *shape):
        return self._then(("view", tuple(shape)))

    def slice(self, dim, start, stop, step=1):
        return self._then(("slice", dim, start, stop, step))

    def as_dtype(self, name):
        """Reinterpret the bits (uint8 as an fp8 format)."""
        return self._then(("dtype", name))

    def __eq__(self, other):
        return isinstance(other, Ref) and (self.kind, self.key, self.ops) == (other.kind, other.key, other.ops)

    def __hash__(self):
        return hash((self.kind, self.key, self.ops))

    def __repr__(self):
        s = f"{self.kind}:{self.key}"
        for op in self.ops:
            s += f".{op[0]}{op[1:]}"
        return s


def arg(name):
    return Ref("arg", name)


def work(key):
    return Ref("work", key)


class Host:
    """Metadata the plan built on the host (indptr, page indices, scales)."""

    __slots__ = ("array", "dtype")

    def __init__(self, array, dtype):
        self.array, self.dtype = np.asarray(array), dtype

    def __repr__(self):
        return f"Host({self.dtype}, {self.array.tolist() if self.array.size <= 16 else self.array.shape})"


class Dtype:
    """A dtype argument (torch.bfloat16 on the GPU, its name for the stand-in)."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __eq__(self, other):
        return isinstance(other, Dtype) and other.name == self.name

    def __repr__(self):
        return f"Dtype({self.name})"


class Alloc:
    """A workspace: ``fill`` None leaves it uninitialized, as AITER's callers do."""

    def __init__(self, key, shape, dtype, fill=None):
        self.key, self.shape, self.dtype, self.fill = key, tuple(shape), dtype, fill

    def __repr__(self):
        return f"Alloc({self.key}, {self.shape}, {self.dtype}, fill={self.fill})"


class AllocFromInfo:
    """Buffers shaped by the (shape, dtype) pairs an earlier Call returned (get_mla_metadata_info_v1)."""

    def __init__(self, keys, info):
        self.keys, self.info = tuple(keys), info

    def __repr__(self):
        return f"AllocFromInfo({self.keys} <- {self.info})"


class RepeatHeads:
    """vLLM's AiterMLAHelper padding: q.repeat_interleave(repeat, dim=1) into a new tensor."""

    def __init__(self, key, src, repeat):
        self.key, self.src, self.repeat = key, src, repeat

    def __repr__(self):
        return f"RepeatHeads({self.key} <- {self.src} x{self.repeat})"


class Contiguous:
    """A contiguous copy of an input the kernel reads as packed rows (RoPE's cos/sin halves)."""

    def __init__(self, key, src):
        self.key, self.src = key, src

    def __repr__(self):
        return f"Contiguous({self.key} <- {self.src})"


class Call:
    """``fn`` is "module:function" under the aiter package; ``result`` names what it returns
    (a key, a tuple of keys, or None)."""

    def __init__(self, fn, args, kwargs=None, result=None):
        self.fn, self.args, self.kwargs, self.result = fn, tuple(args), dict(kwargs or {}), result

    def __repr__(self):
        return f"Call({self.fn}, {len(self.args)} args, {sorted(self.kwargs)}, -> {self.result})"


class Copy:
    def __init__(self, dst, src):
        self.dst, self.src = dst, src

    def __repr__(self):
        return f"Copy({self.dst} <- {self.src})"


class Localize:
    """vLLM's _localize_aiter_prefill_topk: indices >= 0 become indices - row_start, in place."""

    def __init__(self, indices, starts):
        self.indices, self.starts = indices, starts

    def __repr__(self):
        return f"Localize({self.indices} - {self.starts})"


class Plan:
    def __init__(self, steps, path=""):
        self.steps, self.path = list(steps), path

    def calls(self):
        return [s for s in self.steps if isinstance(s, Call)]

    def call(self, fn):
        found = [c for c in self.calls() if c.fn == fn]
        if len(found) != 1:
            raise KeyError(f"plan has {len(found)} calls of {fn}: {self.calls()}")
        return found[0]

    def __repr__(self):
        return f"Plan({self.path}: {self.steps})"



def expand_pages(table, lens, P):
    """vLLM's _expand_page_indices_kernel: slot of token t of request r = table[r, t / P] * P + t % P."""
    out = []
    for r, n in enumerate(lens):
        tok = np.arange(int(n), dtype=np.int64)
        out.append(table[r, tok // P].astype(np.int64) * P + tok % P)
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def mla_steps(f, path, heads, qo_indptr, kv_indptr, kv_indices, max_seqlen_q, batch):
    """The calls shared by dense and sparse MLA: pad heads, (persistent metadata,) mla_decode_fwd,
    copy the LSE (and the un-padded output) into the harness's views."""
    N, T, Lk, Lv = f["N"], f["T"], f["Lk"], f["Lv"]
    steps = []
    r = heads // N
    if N < 16 and heads % N:
        # Outside attncheck only (the op refuses such head counts first): vLLM's padding repeats
        # each head 16 / N times.
        raise Unsupported(f"{N} heads: vLLM pads fewer than 16 heads by repeating each 16 / N times")
    if N < 16:
        steps.append(RepeatHeads("q_pad", arg("q"), r))
        steps.append(Alloc("o_pad", (T, heads, Lv), "bf16"))
        q_ref, o_ref = work("q_pad"), work("o_pad")
    else:
        q_ref, o_ref = arg("q"), arg("out")
    # vLLM's kv_buffer: page size 1, one flat slot per page. Only bf16 caches get here: every fp8
    # one is declined (_mla_path), so no kv_scale is passed.
    assert f["fmt"] is None
    kv_ref = arg("kv_cache").view(-1, 1, 1, Lk)
    last = Host(np.ones(batch, np.int32), "i32")
    qo, kvp, idx = Host(qo_indptr, "i32"), Host(kv_indptr, "i32"), Host(kv_indices, "i32")
    kwargs = dict(page_size=1, nhead_kv=1, sm_scale=f["scale"], logit_cap=0.0, return_lse=True)
    if path == "persistent":
        buffers = ("work_meta_data", "work_indptr", "work_info_set", "reduce_indptr", "reduce_final_map", "reduce_partial_map")
        steps.append(
            Call(
                "aiter.ops.attention:get_mla_metadata_info_v1",
                (batch, max_seqlen_q, heads, Dtype("bf16"), Dtype("bf16"), False),
                dict(fast_mode=True),
                result="mla_metadata_info",
            )
        )
        steps.append(AllocFromInfo(buffers, "mla_metadata_info"))
        steps.append(
            Call(
                "aiter.ops.attention:get_mla_metadata_v1",
                (qo, kvp, last, heads, 1, True, work("work_meta_data"), work("work_info_set"), work("work_indptr"),
                 work("reduce_indptr"), work("reduce_final_map"), work("reduce_partial_map")),
                dict(page_size=1, kv_granularity=16, max_seqlen_qo=max_seqlen_q, uni_seqlen_qo=max_seqlen_q,
                     fast_mode=True, dtype_q=Dtype("bf16"), dtype_kv=Dtype("bf16")),
            )
        )
        for b in buffers:
            kwargs[b] = work(b)
    steps.append(
        Call("aiter.mla:mla_decode_fwd", (q_ref, kv_ref, o_ref, qo, kvp, idx, last, max_seqlen_q), kwargs,
             result=("mla_logits", "final_lse"))
    )
    if N < 16:
        steps.append(Copy(arg("out"), work("o_pad").slice(1, 0, heads, r)))  # vLLM's o[:, ::r]
        steps.append(Copy(arg("lse"), work("final_lse").slice(1, 0, heads, r)))
    else:
        steps.append(Copy(arg("lse"), work("final_lse")))
    return steps



# ------------------------------------------------------------------------------------------------
# What AITER's HIP/ASM ops serve, and the calls vLLM's ROCm backends make (read at AITER e4048607)


def platform_fp8(arch):
    """aiter.dtypes.fp8: float8_e4m3fnuz on gfx942 (MI300), float8_e4m3fn on gfx950 (MI355)."""
    return "e4m3fnuz" if arch == "gfx942" else "e4m3fn"




def arch_supported(arch):
    if arch not in ARCHS:
        raise Unsupported(f"arch {arch}: this adapter maps AITER's gfx942 (MI300) and gfx950 (MI355) kernels only")


def platform_format(fmt, arch, who):
    want = platform_fp8(arch)
    if fmt != want:
        raise Unsupported(f"fp8_format {fmt}: {who} uses {arch}'s fp8, {want} (aiter.dtypes.fp8 / opus::fp8_t)")


def mla_path(arch, kv_kind, heads, qlen):
    """How mla_decode_fwd can serve (kv dtype, padded heads, qlen) *with* an LSE on ``arch``:
    "split" (split-KV ASM stage 1 + Triton stage 2, which returns the LSE), "persistent"
    (get_mla_metadata_v1 + an ASM kernel with an LSE variant), or the reason it cannot.

    From the decode rows of hsa/<arch>/mla/mla_asm.csv as mla_decode_stage1_asm_fwd looks them up
    (csrc/py_itfs_cu/asm_mla.cu): split-KV bf16/bf16 kernels exist for 16 heads at qlen 1, <=4,
    <=8 (one kernel each), for 32 and 128 heads at any qlen, for 64 heads at any qlen on gfx950
    and at qlen > 1 on gfx942 (the gfx942 table has no 64-head qlen-1 split kernel); the persistent
    path asks for an LSE variant only in persistent mode and gfx942 has none for a bf16 q, while
    gfx950 runs every bf16 head count natively with LSE variants (qSeqLen 1 x 64 heads, qSeqLen
    4 x 32 heads). A bf16 q with an fp8 cache has persistent kernels only (qSeqLen 4, 16 heads),
    none with an LSE."""
    if kv_kind == "fp8":
        return None, (
            "a bf16 q with an fp8 cache has only persistent kernels in mla_asm.csv (16 heads, qSeqLen 4) "
            "and none of them has an LSE variant; attncheck's contract includes the LSE"
        )
    if heads == 16 and qlen <= 8:
        return "split", None
    if heads in (32, 128):
        return "split", None
    if heads == 64 and (qlen > 1 or arch == "gfx950"):
        return "split", None
    if arch == "gfx950":
        return "persistent", None
    if heads == 64:
        return None, "gfx942 has no split-KV kernel for 64 heads at qlen 1 (mla_asm.csv) and no persistent bf16 kernel with an LSE"
    return None, (
        f"no split-KV kernel for {heads} heads at qlen {qlen} on gfx942 (mla_asm.csv: 16 heads up to qlen 8, "
        "32/64/128 heads) and no persistent bf16 kernel with an LSE"
    )


def mla_declines(t, f, arch, *, qlen, sparse):
    arch_supported(arch)
    q = t["q"]
    if (f["Lk"], f["Lv"]) != (576, 512):
        raise Unsupported(
            f"Lk={f['Lk']}, Lv={f['Lv']}: AITER's MLA decode kernels are hand-written assembly for "
            "DeepSeek's 576/512 latent (kv_lora_rank 512 + rope 64; op_tests/test_mla.py)"
        )
    if q.dtype_name != "bf16":
        raise Unsupported(f"q is {q.dtype_name}: mla_decode_stage1_asm_fwd takes a bf16 or fp8 q ('unsupport Q dtype')")
    if f["fmt"] is not None:
        platform_format(f["fmt"], arch, "mla_decode_fwd's fp8 cache")
    heads = max(f["N"], 16)
    kind = "fp8" if f["fmt"] else "bf16"
    if sparse and kind == "fp8":
        raise Unsupported("an fp8 cache: vLLM's ROCM_AITER_MLA_SPARSE serves bf16 caches, and AITER has no split-KV kernel for a bf16 q with an fp8 cache")
    path, why = mla_path(arch, kind, heads, qlen)
    if path is None:
        raise Unsupported(why)
    if sparse and path != "split":
        raise Unsupported(f"{heads} heads: the sparse path is split-KV (one query row per request) and {arch} has no split-KV kernel for them")
    if f["N"] >= 16:
        for x in (t["q"], t["out"]):
            if not x.is_contiguous():
                raise Unsupported(
                    f"'{x.name}' strides {x.strides}: mla_decode_fwd needs a contiguous q (AITER_CHECK Q.is_contiguous()) "
                    "and writes o through o.view(total_s, num_kv_splits, nhead, v_head_dim)"
                )
    return path, heads


def sparse_indices(topk, req, table, P):
    """triton_convert_req_index_to_global_index, then row-order packing of the valid entries
    (attncheck's contract: -1 anywhere in a row; vLLM's fetch_id_to_ragged assumes them at the end)."""
    T, K = topk.shape
    W = table.shape[1]
    rows = []
    for i in range(T):
        tok = topk[i].astype(np.int64)
        blk = np.where(tok >= 0, tok // P, -1)
        ok = (tok >= 0) & (blk >= 0) & (blk < W)
        g = np.where(ok, table[int(req[i]), np.clip(blk, 0, W - 1)].astype(np.int64) * P + tok % P, -1)
        rows.append(g[g != -1])
    lens = np.array([len(r) for r in rows], np.int64)
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32), (np.concatenate(rows) if rows else np.zeros(0)).astype(np.int32)


def rope_common(t, p, arch, q_name, k_name):
    pos, cache, q, k = (ab.arg(t, n) for n in ("positions", "cos_sin_cache", q_name, k_name))
    if "is_neox" not in p:
        raise Refuse("missing parameter is_neox")
    ab.expect_dtype(q, "bf16", "f16")
    if k.dtype_name != q.dtype_name:
        raise Refuse(f"'{q_name}' is {q.dtype_name} but '{k_name}' is {k.dtype_name}")
    ab.expect_ndim(pos, 1)
    ab.expect_dtype(pos, "i32", "i64")
    if not checks.contiguous_1d(pos):
        raise Refuse("positions must be contiguous")
    ab.expect_ndim(cache, 2)
    ab.expect_dtype(cache, "f32", "bf16", "f16")
    rot = cache.shape[1]
    if rot % 2:
        raise Refuse(f"rot = {rot} is odd")
    return pos, cache, q, k, rot


def rope_declines(t, arch, views):
    arch_supported(arch)
    if t["positions"].dtype_name != "i64":
        raise Unsupported("int32 positions: AITER's RoPE kernels are built for int64 positions (ENABLE_ROPE_POSITIONS_INT32 unset)")
    for x in views:
        if x.shape[-1] > 1 and x.strides[-1] != 1:
            raise Unsupported(f"'{x.name}' strides {x.strides}: rope_cached_positions_2c_fwd_impl requires all stride_d to be 1")


def rope_tables(rot):
    """cos/sin as AITER reads them: [max_pos, 1, 1, rot/2] rows of contiguous values, from the two
    halves of attncheck's [max_pos, rot] = [cos | sin] cache, in the cache's dtype."""
    half = rot // 2
    steps = [Contiguous("cos", arg("cos_sin_cache").slice(1, 0, half)), Contiguous("sin", arg("cos_sin_cache").slice(1, half, rot))]
    return steps, work("cos").unsqueeze(1).unsqueeze(1), work("sin").unsqueeze(1).unsqueeze(1)


def rope_qk(t, q_name, k_name, rot, front_slice):
    """vLLM's layout: s = 1, b = tokens: q [T, H, rot] -> [1, T, H, rot], k -> [1, T, 1, rot]
    (``front_slice``: the first rot dims of wider heads)."""
    k = t[k_name]
    x = arg(q_name)
    y = arg(k_name)
    if front_slice:
        x = x.slice(2, 0, rot)
        y = y.slice(k.ndim - 1, 0, rot)
    x = x.unsqueeze(0)
    y = y.unsqueeze(0) if k.ndim == 3 else y.unsqueeze(1).unsqueeze(0)
    return x, y


# ------------------------------------------------------------------------------------------------
# Backends and the executor


class TorchBackend:
    """The real aiter on a ROCm torch: zero-copy views of the harness's device buffers."""

    def __init__(self, device=None):
        import torch

        self.torch = torch
        self.device = torch.device(device) if device else torch.device("cuda", torch.cuda.current_device())
        self.dtypes = {
            "bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "i8": torch.int8, "i32": torch.int32,
            "i64": torch.int64, "u8": torch.uint8, "u64": torch.uint64,
            "e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz,
        }

    def module(self, name):
        return importlib.import_module(name)

    def dtype(self, name):
        return self.dtypes[name]

    def arg(self, t):
        return self.torch.from_dlpack(t)

    def host_array(self, t):
        return self.torch.from_dlpack(t).cpu().numpy()

    def host(self, array, dtype):
        return self.torch.as_tensor(np.ascontiguousarray(array), dtype=self.dtypes[dtype], device=self.device)

    def alloc(self, shape, dtype, fill):
        dt = self.dtypes[dtype] if isinstance(dtype, str) else dtype
        if fill is None:
            return self.torch.empty(shape, dtype=dt, device=self.device)
        return self.torch.full(shape, fill, dtype=dt, device=self.device)

    def apply(self, x, op):
        if op[0] == "unsqueeze":
            return x.unsqueeze(op[1])
        if op[0] == "view":
            return x.view(*op[1])
        if op[0] == "slice":
            _, dim, start, stop, step = op
            idx = [slice(None)] * x.dim()
            idx[dim] = slice(start, stop, step)
            return x[tuple(idx)]
        if op[0] == "dtype":
            return x.view(self.dtypes[op[1]])
        raise ValueError(f"unknown view op {op}")

    def repeat_heads(self, x, r):
        return x.repeat_interleave(r, dim=1)

    def contiguous(self, x):
        return x.contiguous()

    def copy(self, dst, src):
        dst.copy_(src)

    def localize(self, idx, starts):
        torch = self.torch
        idx.copy_(torch.where(idx < 0, idx, idx - starts.to(idx.dtype).unsqueeze(1)))


class NumpyBackend:
    """The stand-in aiter on host buffers (ATTNCHECK_AITER_BACKEND=numpy; tests only)."""

    def __init__(self):
        aiter = importlib.import_module("aiter")
        if not getattr(aiter, "STANDIN", False):
            raise Unsupported(
                f"ATTNCHECK_AITER_BACKEND=numpy runs the NumPy stand-in only, but 'aiter' is {getattr(aiter, '__file__', '?')}: "
                "put bridge/tests/aiter_standin first on PYTHONPATH"
            )
        self.S = importlib.import_module("aiter._standin")

    def module(self, name):
        return importlib.import_module(name)

    def dtype(self, name):
        return name

    def arg(self, t):
        return self.S.HostTensor(ab.as_numpy(t), t.dtype_name)

    def host_array(self, t):
        return np.array(ab.as_numpy(t))

    def host(self, array, dtype):
        return self.S.HostTensor(np.ascontiguousarray(array).astype(self.S._STORAGE[dtype]), dtype)

    def alloc(self, shape, dtype, fill):
        return self.S.HostTensor.empty(shape, dtype, fill)

    def apply(self, x, op):
        if op[0] == "unsqueeze":
            return x.unsqueeze(op[1])
        if op[0] == "view":
            return x.view(*op[1])
        if op[0] == "slice":
            _, dim, start, stop, step = op
            idx = [slice(None)] * x.ndim
            idx[dim] = slice(start, stop, step)
            return x[tuple(idx)]
        if op[0] == "dtype":
            return x.view_dtype(op[1])
        raise ValueError(f"unknown view op {op}")

    def repeat_heads(self, x, r):
        return self.S.HostTensor(np.repeat(x.arr, r, axis=1), x.dtype)

    def contiguous(self, x):
        return self.S.HostTensor(np.ascontiguousarray(x.arr), x.dtype)

    def copy(self, dst, src):
        if dst.dtype != src.dtype or dst.shape != src.shape:
            raise ValueError(f"copy {src} into {dst}: dtype or shape differ")
        dst.arr[...] = src.arr

    def localize(self, idx, starts):
        a = idx.arr
        a[...] = np.where(a < 0, a, a - starts.arr.astype(a.dtype)[:, None])


def execute(plan, tensors, backend):
    """Runs a plan's steps in order on ``backend``."""
    env = {}

    def resolve(ref):
        x = backend.arg(tensors[ref.key]) if ref.kind == "arg" else env[ref.key]
        for op in ref.ops:
            x = backend.apply(x, op)
        return x

    def value(v):
        if isinstance(v, Ref):
            return resolve(v)
        if isinstance(v, Host):
            return backend.host(v.array, v.dtype)
        if isinstance(v, Dtype):
            return backend.dtype(v.name)
        if isinstance(v, tuple):
            return tuple(value(x) for x in v)
        return v

    for step in plan.steps:
        if isinstance(step, Alloc):
            env[step.key] = backend.alloc(step.shape, step.dtype, step.fill)
        elif isinstance(step, AllocFromInfo):
            info = env[step.info]
            if len(info) != len(step.keys):
                raise ValueError(f"{step}: {len(info)} buffers described, {len(step.keys)} expected")
            for key, (shape, dtype) in zip(step.keys, info):
                env[key] = backend.alloc(tuple(shape) if isinstance(shape, (tuple, list)) else (shape,), dtype, None)
        elif isinstance(step, RepeatHeads):
            env[step.key] = backend.repeat_heads(resolve(step.src), step.repeat)
        elif isinstance(step, Contiguous):
            env[step.key] = backend.contiguous(resolve(step.src))
        elif isinstance(step, Call):
            mod, _, name = step.fn.partition(":")
            fn = getattr(backend.module(mod), name)
            out = fn(*[value(a) for a in step.args], **{k: value(v) for k, v in step.kwargs.items()})
            if isinstance(step.result, tuple):
                for key, val in zip(step.result, out):
                    env[key] = val
            elif step.result is not None:
                env[step.result] = out
        elif isinstance(step, Copy):
            backend.copy(resolve(step.dst), resolve(step.src))
        elif isinstance(step, Localize):
            backend.localize(resolve(step.indices), resolve(step.starts))
        else:
            raise TypeError(f"unknown plan step {step!r}")
    return env


