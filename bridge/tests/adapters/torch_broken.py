"""torch_broken: real Python GPU kernels with one deliberate fault each, so that a GPU run shows each of
attncheck's buffer checks catching a fault in a Python kernel (the GPU proof of docs/adapters/vllm.md).

decode_attention, kv_cache_write, indexer_k_cache and indexer_gather call vllm_triton's entries (vLLM's
Triton kernels; ATTNCHECK_VLLM_SRC etc. as there); kv_gather is a plain torch gather written from
docs/ops/kv_gather.md (so that its fault-free run passes every case, SHUFFLE and strided tables
included). The fault comes from $ATTNCHECK_BROKEN, a comma-separated list of ENTRY=FAULT (ENTRY may
be "*"; unnamed entries run without a fault):

    fault          what the entry does after the kernel ran        the check that must catch it
    guard_before   writes the byte just before its first output's  V5 guard bytes
                   buffer (the harness's leading guard)
    unwritten      puts its first output back as it was handed      V3/V4 poison (inout outputs:
                   over (poisoned)                                  the comparison)
    mutate_input   changes one element of an input                  V6 inputs unchanged
    none           nothing
"""

import os

import attncheck_bridge as ab
import vllm_triton

ADAPTER = ab.Adapter(name="torch_broken", device="cuda")

FAULTS = ("guard_before", "unwritten", "mutate_input", "none")
OUTPUTS = {
    "decode_attention": "o",
    "kv_cache_write": "key_cache",
    "kv_gather": "key",
    "indexer_k_cache": "kv_cache",
    "indexer_gather": "k_fp8",
}
INPUTS = {
    "decode_attention": "b_seq_len",
    "kv_cache_write": "slot_mapping",
    "kv_gather": "block_tables",
    "indexer_k_cache": "slot_mapping",
    "indexer_gather": "cu_seq_lens",
}


def fault_for(entry):
    chosen = "none"
    for item in filter(None, (s.strip() for s in os.environ.get("ATTNCHECK_BROKEN", "").split(","))):
        name, _, fault = item.partition("=")
        if fault not in FAULTS:
            raise ValueError(f"ATTNCHECK_BROKEN: unknown fault {fault!r} (one of {', '.join(FAULTS)})")
        if name in (entry, "*"):
            chosen = fault
    return chosen


def _run(entry, kernel, t, p):
    import torch

    fault = fault_for(entry)
    out = t[OUTPUTS[entry]] if OUTPUTS[entry] in t else None
    handed = torch.from_dlpack(out).clone() if fault == "unwritten" and out is not None and out.numel else None
    kernel(t, p)
    if fault == "guard_before" and out is not None:
        guard = ab.Tensor("guard", out.data - 1, 0, (1,), (1,), ab.kDLUInt, 8, 1, "cuda",
                          out.device_type, out.device_id)
        torch.from_dlpack(guard).fill_(0xA5)
    elif handed is not None:
        torch.from_dlpack(out).copy_(handed)
    elif fault == "mutate_input":
        x = t[INPUTS[entry]]
        if x.numel:
            v = torch.from_dlpack(x)
            first = (0,) * x.ndim
            v[first] = v[first] + 1


def _torch_kv_gather(t, p):
    """docs/ops/kv_gather.md, Semantics, in torch on the harness's views (their strides kept)."""
    import torch

    c = vllm_triton._kv_gather_checks(t, p)  # the op contract's refusals
    total, P = c["total"], c["P"]
    if total == 0:
        return
    t2b = torch.from_dlpack(c["t2b"])[:total].long()
    cu, starts = torch.from_dlpack(c["cu"]).long(), torch.from_dlpack(c["starts"]).long()
    dev = t2b.device
    pos = torch.arange(total, device=dev) - cu[t2b] + starts[t2b]
    blk = torch.from_dlpack(c["bt"]).long()[t2b, pos // P]
    slot = pos % P
    h = torch.arange(c["Hkv"], device=dev)[None, :, None]
    d = torch.arange(c["D"], device=dev)[None, None, :]
    b3, s3 = blk[:, None, None], slot[:, None, None]
    for cache, scale, out, is_key in ((c["kc"], c["ks"], c["key"], True), (c["vc"], c["vs"], c["value"], False)):
        ct = ab.as_torch(cache, c["fmt"]) if c["dequant"] else torch.from_dlpack(cache)
        if c["layout"] == "NHD":
            vals = ct[blk, slot]  # [total, Hkv, D]
        else:
            x = ct.shape[-1]
            vals = ct[b3, h, d // x, s3, d % x] if is_key else ct[b3, h, s3 // x, d, s3 % x]
        o = torch.from_dlpack(out)
        if c["dequant"]:
            vals = vals.float() * torch.from_dlpack(scale)[0]  # one fp32 product, then one rounding
        o[:total] = vals.to(o.dtype)


@ADAPTER.entry("decode_attention")
def decode_attention(t, p):
    _run("decode_attention", vllm_triton.decode_attention, t, p)


@ADAPTER.entry("kv_cache_write")
def kv_cache_write(t, p):
    _run("kv_cache_write", vllm_triton.kv_cache_write, t, p)


@ADAPTER.entry("kv_gather")
def kv_gather(t, p):
    _run("kv_gather", _torch_kv_gather, t, p)


@ADAPTER.entry("indexer_k_cache")
def indexer_k_cache(t, p):
    _run("indexer_k_cache", vllm_triton.indexer_k_cache, t, p)


@ADAPTER.entry("indexer_gather")
def indexer_gather(t, p):
    _run("indexer_gather", vllm_triton.indexer_gather, t, p)
