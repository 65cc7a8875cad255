"""numpy_broken: numpy_reference with deliberate bugs, one per entry, so that tests can prove each of
attncheck's checks catches what it claims to (docs/verification.md) through the Python bridge.

The bug of each entry comes from $ATTNCHECK_BROKEN, a comma-separated list of ENTRY=BUG (ENTRY may
be "*"), e.g.

    ATTNCHECK_BROKEN='page_indices=guard_before,kv_gather=ignore_stride'

Entries not named keep their default bug (DEFAULT_BUGS); BUG "none" runs the correct code.

    bug              what the entry does                            the check that must catch it
    wrong_element    one output element wrong (+1 for integers,     V10 exact / V7 numeric
                     2v+1 for floats)                               comparison
    ignore_stride    reads as if the inputs were contiguous          V10 / V7 comparison
                     (kv_gather: cache strides; page_indices: the
                     table's row stride)
    guard_before     writes the element just before the output       V5 guard bytes
                     buffer (into the harness's leading guard)
    past_view        writes the element just past the output view    V6 bytes outside views (V5
                     (the trailing guard when the view ends its      when it is the guard)
                     buffer)
    unwritten        leaves one output element unwritten: the one    V3/V4 poison (inout entries:
                     the correct run changes most (rope_inplace:     the comparison)
                     it keeps its input value)
    mutate_input     changes one element of an input                 V6 inputs unchanged
    raise            raises ValueError                               host error (status 5)
    refuse           refuses a valid configuration (Refuse)          V2 refusals
    unsupported      declines every configuration (Unsupported)      reported as unsupported
    nondeterministic flips the lowest bit of one output element on    V12 determinism
                     every second call
    hang             sleeps forever                                  worker timeout
    crash            dereferences NULL (SIGSEGV)                     worker crash isolation
    none             no bug
    decode_attention only (its arithmetic contract, docs/verification.md "Arithmetic contracts"):
    undeclared_rounding  numpy_reference's arithmetic (q.k products     the default budgets, with
                     rounded to the input type) declared as the     the hint "the error would
                     default contract fp32-accumulate               fit contract
                                                                    qk-products-in-input-type"
    wrong_scale      sm_scale applied twice, under the declared     the declared contract's
                     contract qk-products-in-input-type             budgets too

decode_attention declares fp32-accumulate under undeclared_rounding (its default bug) and
qk-products-in-input-type otherwise; the choice is read when the module loads.
"""

import ctypes
import os
import time

import numpy as np

import attncheck_bridge as ab
import numpy_reference as ref
from attncheck_bridge import Refuse, Unsupported, as_numpy

ADAPTER = ab.Adapter(name="numpy_broken", device="cpu")

DEFAULT_BUGS = {
    "page_indices": "wrong_element",
    "kv_gather": "ignore_stride",
    "rope_inplace": "mutate_input",
    "rope_out_of_place": "unwritten",
    "decode_attention": "undeclared_rounding",
}
BUGS = (
    "wrong_element",
    "ignore_stride",
    "guard_before",
    "past_view",
    "unwritten",
    "mutate_input",
    "raise",
    "refuse",
    "unsupported",
    "nondeterministic",
    "hang",
    "crash",
    "none",
    "undeclared_rounding",
    "wrong_scale",
)
OUTPUTS = {
    "page_indices": ["page_indices"],
    "kv_gather": ["key", "value"],
    "rope_inplace": ["q", "k"],
    "rope_out_of_place": ["q_out", "k_out"],
    "decode_attention": ["o", "lse"],
}
INPUTS = {
    "page_indices": "seq_lens",
    "kv_gather": "block_tables",
    "rope_inplace": "positions",
    "rope_out_of_place": "q",
    "decode_attention": "q",
}

_calls = {}


def bug_for(entry):
    spec = os.environ.get("ATTNCHECK_BROKEN", "")
    chosen = DEFAULT_BUGS.get(entry, "none")
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, bug = item.partition("=")
        if bug not in BUGS:
            raise ValueError(f"ATTNCHECK_BROKEN: unknown bug {bug!r} (one of {', '.join(BUGS)})")
        if name in (entry, "*"):
            chosen = bug
    return chosen


def _first_output(t, entry):
    for n in OUTPUTS[entry]:
        if n in t and t[n].numel:
            return t[n]
    return None


def _element_bytes(x, index_from_element0):
    """A 1-element NumPy view at element offset `index_from_element0` of x (may lie outside the view)."""
    dt = ab._numpy_dtype(x.dtype_name)
    addr = x.ptr + index_from_element0 * dt.itemsize
    return np.ndarray((1,), dt, buffer=(ctypes.c_char * dt.itemsize).from_address(addr))


def _wrong(value, dtype_name):
    """A value no budget accepts in place of `value`: +1 for integers; v -> 2v + 1 for floats
    (one ulp, the obvious off-by-one on bit patterns, hides inside numeric tolerances)."""
    if dtype_name == "bf16":
        return ab.f32_to_bf16_rne(ab.bf16_to_f32(value) * 2 + 1)
    if dtype_name == "f16":
        return (np.uint16(value).view(np.float16) * 2 + 1).astype(np.float16).view(np.uint16)
    if dtype_name in ("f32", "f64"):
        return value * 2 + 1
    return value + 1


def _values(bits, dtype_name):
    """Elements as float64 (16-bit floats decoded from their bit patterns)."""
    if dtype_name == "bf16":
        return ab.bf16_to_f32(bits).astype(np.float64)
    if dtype_name == "f16":
        return bits.view(np.float16).astype(np.float64)
    return bits.astype(np.float64)


def _last_index(x):
    return tuple(n - 1 for n in x.shape)


DECODE_ONLY = ("undeclared_rounding", "wrong_scale")


def _run(entry, correct, t, p):
    bug = bug_for(entry)
    _calls[entry] = _calls.get(entry, 0) + 1
    if bug in DECODE_ONLY and entry != "decode_attention":
        raise ValueError(f"numpy_broken: bug {bug} applies to decode_attention only, not {entry}")
    if bug == "raise":
        raise ValueError(f"numpy_broken: deliberate exception in {entry}")
    if bug == "refuse":
        raise Refuse(f"numpy_broken refuses a valid {entry} configuration (deliberate)")
    if bug == "unsupported":
        raise Unsupported(f"numpy_broken declines every {entry} configuration (deliberate)")
    if bug == "hang":
        while True:
            time.sleep(1)
    if bug == "crash":
        ctypes.memset(0, 0, 1)  # a store through NULL: SIGSEGV
    if bug == "ignore_stride":
        return _ignore_stride(entry, correct, t, p)

    out = _first_output(t, entry)
    before = as_numpy(out).copy() if bug == "unwritten" and out is not None else None
    correct(t, p)
    if out is None:
        return
    view = as_numpy(out)
    last = _last_index(out)
    if bug == "wrong_element":
        view[last] = _wrong(view[last], out.dtype_name)
    elif bug == "unwritten":
        # Put back the element the correct run changed most (a poisoned output: any element; an
        # inout one: the element whose expected value is furthest from its input).
        change = np.abs(_values(view, out.dtype_name) - _values(before, out.dtype_name))
        change = np.nan_to_num(change, nan=np.inf)
        if change.size and change.max() > 0:
            idx = np.unravel_index(int(np.argmax(change)), change.shape)
            view[idx] = before[idx]
    elif bug == "guard_before":
        # The element just before the buffer's first byte: the harness's leading guard.
        _element_bytes(out, -(out.byte_offset // out.itemsize) - 1)[0] = 0
    elif bug == "past_view":
        off = sum((n - 1) * s for n, s in zip(out.shape, out.strides)) + 1
        cell = _element_bytes(out, off)
        cell[0] = cell[0] ^ 1
    elif bug == "mutate_input":
        x = t[INPUTS[entry]]
        if x.numel:
            v = as_numpy(x)
            idx = tuple(0 for _ in x.shape)
            v[idx] = v[idx] ^ 1 if v.dtype.kind in "iu" else v[idx] + 1
    elif bug == "nondeterministic" and _calls[entry] % 2 == 0:
        view[last] = view[last] ^ 1


def _contiguous_view(x):
    """The same tensor as if it were contiguous (the stride-ignoring kernel's reading)."""
    strides, acc = [], 1
    for n in reversed(x.shape):
        strides.append(acc)
        acc *= n
    return ab.Tensor(x.name, x.data, x.byte_offset, x.shape, tuple(reversed(strides)), x.dl_code, x.dl_bits, x.dl_lanes, x.device)


def _ignore_stride(entry, correct, t, p):
    names = {"kv_gather": ("key_cache", "value_cache"), "page_indices": ("block_table",)}.get(entry, ("q",))
    t2 = dict(t)
    for n in names:
        if n in t2:
            t2[n] = _contiguous_view(t[n])
    correct(t2, p)


ADAPTER.add("page_indices", lambda t, p: _run("page_indices", ref.page_indices, t, p))
ADAPTER.add("kv_gather", lambda t, p: _run("kv_gather", ref.kv_gather, t, p))
ADAPTER.add("rope_inplace", lambda t, p: _run("rope_inplace", ref.rope_inplace, t, p))
ADAPTER.add("rope_out_of_place", lambda t, p: _run("rope_out_of_place", ref.rope_out_of_place, t, p))


def _decode_contract():
    """decode_attention's declared contract, fixed when the module loads (the harness reads it
    once): the default under undeclared_rounding (the bug is the missing declaration), else the
    one numpy_reference declares."""
    try:
        bug = bug_for("decode_attention")
    except ValueError:
        bug = "none"  # the entry raises the ValueError when called
    return "fp32-accumulate" if bug == "undeclared_rounding" else ref.ADAPTER.contract_of("decode_attention")


def _decode_attention_broken(t, p):
    bug = bug_for("decode_attention")
    if bug == "wrong_scale":
        return ref._decode_attention(t, p, sm_scale_power=2)
    # undeclared_rounding: numpy_reference's arithmetic, declared as the default contract
    return ref.decode_attention(t, p)


ADAPTER.add("decode_attention", lambda t, p: _run("decode_attention", _decode_attention_broken, t, p), contract=_decode_contract())
