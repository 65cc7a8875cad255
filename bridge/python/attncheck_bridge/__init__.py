"""attncheck_bridge: the Python side of attncheck's kernel bridge (docs/bridge.md).

An *adapter* is a Python module that exposes Python-callable kernels (Triton, DeepGEMM, FlashMLA,
AITER, NumPy, ...) to attncheck through ``libattncheck_pybridge.so``, which implements the C plugin
ABI (kernels_under_test/attncheck_abi.h) by calling into the adapter::

    import attncheck_bridge as ab

    ADAPTER = ab.Adapter(name="my_kernels", device="cuda")  # contract="fp32-accumulate"

    @ADAPTER.entry("page_indices")
    def page_indices(t, p):
        # t: dict name -> Tensor (DLPack-exportable views of the harness's buffers)
        # p: dict of the kernel parameters (params_json, parsed)
        ...

    @ADAPTER.entry("decode_attention", contract="qk-products-in-input-type")
    def decode_attention(t, p):
        ...

An entry's *arithmetic contract* (``CONTRACTS``; docs/verification.md "Arithmetic contracts")
says how the kernel rounds; attncheck compares under the default ``fp32-accumulate`` budgets
first and, when they fail, under the budgets derived from the declared contract, naming it
beside the verdict.

An entry's *invariance properties* (``PROPERTIES``; docs/verification.md "Invariance") are what
the kernel promises bitwise: ``@ADAPTER.entry("decode_attention", properties=("batch-invariant",))``.
attncheck checks the op's relations (requests permuted or alone, another split count, shuffled
pages) bitwise for the declared ones and within the op's budgets for the others; declare only
what the upstream kernel guarantees.

An entry's *partial contract* (docs/verification.md "Partial contracts") declares what it leaves
out: outputs it does not produce and named regions of an output it leaves unspecified (the op
defines which regions each output can have)::

    @ADAPTER.entry("sparse_mla", partial={"not_produced": ["lse"]})
    @ADAPTER.entry("indexer_logits_decode", partial={"unspecified": {"logits": "past_context"}})

attncheck then judges everything else at full strictness, checks that a not-produced output is
left untouched and that writes to an unspecified region stay inside the output's view, and names
the contract in every result. A name the op does not have is an error at load.

An entry writes its outputs *in place* through the views it is handed, returns nothing, and
signals what it cannot do with exceptions:

- ``Unsupported(why)``: the adapter does not implement this configuration (the kernel may well be
  able to); reported as a refusal whose message starts with ``unsupported by <adapter>:``.
- ``Refuse(why)``: the configuration is invalid and the kernel refuses it, exactly as a native
  kernel's refusal (ATTNCHECK_REFUSED).
- anything else: the entry failed on the host (status 5, ATTNCHECK_HOST_ERROR), reported with the
  traceback's last lines.

Everything here is importable without the C++ side (tests build Tensors from NumPy arrays with
``Tensor.from_numpy``).
"""

from __future__ import annotations

import ctypes
import math

__all__ = [
    "Adapter",
    "Export",
    "Unsupported",
    "Refuse",
    "Tensor",
    "as_numpy",
    "as_torch",
    "bf16_to_f32",
    "f32_to_bf16_rne",
    "f16_to_f32",
    "e4m3fn_to_f32",
    "e4m3fnuz_to_f32",
    "fp8_to_f32",
    "require",
    "expect_dtype",
    "expect_ndim",
    "arg",
    "import_upstream",
    "kv_cache_write_args",
    "DEVICES",
    "CONTRACTS",
    "CONTRACT_PARTS",
    "DEFAULT_CONTRACT",
    "contract_name",
    "PROPERTIES",
    "property_names",
    "partial_contract",
    "PARTIAL_KEYS",
    "current_case",
    "invalid",
    "refuse_if_invalid",
]

DEVICES = ("cpu", "cuda")

# --------------------------------------------------------------------------------------------
# Arithmetic contracts (docs/verification.md "Arithmetic contracts"; the C++ side parses the same
# names in harness/core/policy.cpp and refuses names it does not know).

DEFAULT_CONTRACT = "fp32-accumulate"
"""Products formed exactly and accumulated in fp32; softmax probabilities kept in fp32."""

CONTRACT_PARTS = (
    # each q·k product rounded to the 16-bit input type (bf16/f16), then summed in fp32
    "qk-products-in-input-type",
    # softmax probabilities rounded to the 16-bit input type before the P·V products
    "p-in-input-type",
)
"""The deviations from the default a contract may combine with ``+``, in canonical order."""


def _canonical_combinations():
    out = [DEFAULT_CONTRACT]
    n = len(CONTRACT_PARTS)
    for mask in range(1, 1 << n):
        out.append("+".join(CONTRACT_PARTS[i] for i in range(n) if mask >> i & 1))
    return tuple(out)


CONTRACTS = _canonical_combinations()
"""Every known contract name in canonical spelling: the default, then each ``+`` combination of
``CONTRACT_PARTS`` (parts in ``CONTRACT_PARTS`` order)."""


# Invariance properties (docs/verification.md "Invariance"; the C++ side knows the same names in
# harness/ops/relation.h and fails the cases of an entry that declares another).

PROPERTIES = (
    "batch-invariant",  # a request's outputs do not depend on the other requests of its batch
    "batch-order-invariant",  # nor on their order
    "split-invariant",  # nor on the split count / tile parameter the op exposes
    "page-order-invariant",  # nor on where its pages lie in the cache
)
"""The invariance properties an entry may declare."""


def property_names(properties) -> tuple:
    """``properties`` (an iterable of names, or one comma-separated string) checked against
    ``PROPERTIES``, without repeats, in declaration order; ValueError naming the known ones."""
    if isinstance(properties, str):
        properties = [p.strip() for p in properties.split(",") if p.strip()]
    try:
        names = list(properties)
    except TypeError:
        raise ValueError(f"properties must be names or a comma-separated string, got {properties!r}") from None
    out = []
    for p in names:
        if p not in PROPERTIES:
            raise ValueError(f"unknown invariance property {p!r}; known: {', '.join(PROPERTIES)}")
        if p not in out:
            out.append(p)
    return tuple(out)


PARTIAL_KEYS = ("not_produced", "unspecified")
"""The keys of a partial contract declaration."""


def partial_contract(partial) -> dict:
    """``partial`` (None, or a dict with "not_produced": output names and/or "unspecified":
    output name -> region name) checked for form and returned canonical: ``{"not_produced":
    [names in declaration order, no repeats], "unspecified": {output: region}}`` (both keys always
    present, empty when nothing is declared). ValueError saying what is wrong. Whether the op has
    those outputs and regions is checked by attncheck when it loads the library (the op knows)."""
    out = {"not_produced": [], "unspecified": {}}
    if partial is None:
        return out
    if not isinstance(partial, dict):
        raise ValueError(f"partial must be a dict with keys {', '.join(PARTIAL_KEYS)}, got {partial!r}")
    unknown = [k for k in partial if k not in PARTIAL_KEYS]
    if unknown:
        raise ValueError(f"partial: unknown key {unknown[0]!r}; known: {', '.join(PARTIAL_KEYS)}")
    names = partial.get("not_produced", ())
    if isinstance(names, str) or not isinstance(names, (list, tuple)):
        raise ValueError(f"partial: not_produced must be a list of output names, got {names!r}")
    for n in names:
        if not isinstance(n, str) or not n.strip() or n != n.strip():
            raise ValueError(f"partial: not_produced holds {n!r}, not an output name")
        if n not in out["not_produced"]:
            out["not_produced"].append(n)
    regions = partial.get("unspecified", {})
    if not isinstance(regions, dict):
        raise ValueError(f"partial: unspecified must map output name -> region name, got {regions!r}")
    for o, r in regions.items():
        for what, v in (("output", o), ("region", r)):
            if not isinstance(v, str) or not v.strip() or v != v.strip():
                raise ValueError(f"partial: unspecified has {what} {v!r}, not a name")
        if o in out["not_produced"]:
            raise ValueError(f"partial: output {o!r} is both not produced and partly unspecified")
        out["unspecified"][o] = r
    return out


def contract_name(name) -> str:
    """The canonical spelling of contract ``name`` (parts of a ``+`` combination put in
    ``CONTRACT_PARTS`` order); ValueError naming the known contracts if it is not one."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"contract must be a non-empty string, got {name!r}; known: {', '.join(CONTRACTS)}")
    if name == DEFAULT_CONTRACT:
        return name
    parts = name.split("+")
    unknown = [q for q in parts if q not in CONTRACT_PARTS]
    if unknown:
        raise ValueError(f"unknown contract {name!r} (part {unknown[0]!r}); known: {', '.join(CONTRACTS)}")
    if len(set(parts)) != len(parts):
        raise ValueError(f"contract {name!r} names a part twice")
    return "+".join(q for q in CONTRACT_PARTS if q in parts)


# --------------------------------------------------------------------------------------------
# Exceptions


class Unsupported(Exception):
    """The adapter does not implement this configuration (it is not necessarily invalid)."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


class Refuse(Exception):
    """The configuration is invalid and the kernel refuses it (like a native ATTNCHECK_REFUSED)."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


def require(cond, why: str) -> None:
    """Refuse(why) unless cond."""
    if not cond:
        raise Refuse(why)


# --------------------------------------------------------------------------------------------
# The case being run (the ABI's case_context, set by the bridge before each case's launches).
# attncheck decides an op's validity once (its invalid(), docs/verification.md); adapters ask it
# here instead of re-coding the op's rules, and decline only what their upstream kernel does not
# serve.

_current_case = None


def _set_case(case) -> None:
    global _current_case
    _current_case = case


def current_case():
    """The case whose launches are running: a dict with "op", "id", "params" (axis values),
    "invalid" (the op's refusal reason, or None) and "fields" (each axis's name, type, default,
    allowed values and bounds); None outside attncheck (e.g. an adapter called from a test)."""
    return _current_case


def invalid():
    """The op's refusal reason for the running case, or None (also outside attncheck)."""
    return None if _current_case is None else _current_case.get("invalid")


def refuse_if_invalid() -> None:
    """Refuse with the op's reason when the running case is invalid by the op's contract: for
    upstream kernels that do not check their arguments themselves."""
    why = invalid()
    if why:
        raise Refuse(why)


# --------------------------------------------------------------------------------------------
# The adapter registry


class Export:
    """How an entry calls its upstream function, for ``attncheck repro ID --kernels py:ADAPTER
    --export pytest`` (docs/bridge.md "Exporting a finding"): the generated test imports
    ``function`` from ``module`` (a name, or a list tried in order) and calls it as the entry
    does, with the case's inputs rebuilt from the repro bundle.

    framework  "torch": each argument is a torch tensor on ``device`` (bf16 as torch.bfloat16,
               f16 as torch.float16, fp8 codes as torch.uint8); "numpy": a NumPy array as
               ``as_numpy`` gives it (16-bit floats as uint16 bits, fp8 as uint8 codes)
    args       Python expressions, one per positional argument, over ``t`` (argument name ->
               tensor view of the bundle's layout: strides, offset, shared storages), ``p`` (the
               kernel parameters, a dict), ``ARGS`` (argument name -> dtype name, shape,
               strides, offset), ``torch``/``np`` and the names ``setup`` binds
    kwargs     keyword name -> expression, as ``args``; the key "**" passes a dict expression
    setup      statements run before the call (allocations the entry makes, derived scalars)
    device     "cuda" or "cpu" (default: the adapter's device)
    """

    def __init__(self, module, function: str, args=(), kwargs=None, setup=(),
                 framework: str = "torch", device: str | None = None):
        modules = [module] if isinstance(module, str) else list(module)
        if not modules or not all(isinstance(m, str) and m for m in modules):
            raise ValueError(f"Export: module must be a name or a list of names, got {module!r}")
        if not isinstance(function, str) or not function.isidentifier():
            raise ValueError(f"Export: function must be an identifier, got {function!r}")
        if framework not in ("torch", "numpy"):
            raise ValueError(f"Export: framework must be torch or numpy, got {framework!r}")
        for code in [*args, *(kwargs or {}).values()]:
            compile(code, "<export expression>", "eval")
        for code in setup:
            compile(code, "<export setup>", "exec")
        self.modules = modules
        self.function = function
        self.args = list(args)
        self.kwargs = dict(kwargs or {})
        self.setup = list(setup)
        self.framework = framework
        self.device = device

    def to_json(self, default_device: str) -> dict:
        return {"modules": self.modules, "function": self.function, "args": self.args,
                "kwargs": self.kwargs, "setup": self.setup, "framework": self.framework,
                "device": self.device or default_device}


class Adapter:
    """A named set of kernel entries on one device ("cpu" or "cuda").

    name      shown in the plugin's ``library`` string and in every message
    device    "cpu": the harness's buffers are host memory (aligned malloc), tensors export
              kDLCPU; "cuda": the buffers are torch CUDA allocations, tensors export kDLCUDA
              (kDLROCM under a ROCm build of torch)
    contract  the arithmetic contract its entries declare unless an entry names its own: one of
              ``CONTRACTS`` (default "fp32-accumulate"); ops without contract-dependent
              arithmetic (copies, index maps) ignore it
    """

    def __init__(self, name: str, device: str = "cpu", contract: str = DEFAULT_CONTRACT):
        if not isinstance(name, str) or not name:
            raise ValueError("Adapter(name=...) must be a non-empty string")
        if device not in DEVICES:
            raise ValueError(f"Adapter {name!r}: device must be one of {DEVICES}, got {device!r}")
        try:
            contract = contract_name(contract)
        except ValueError as e:
            raise ValueError(f"Adapter {name!r}: {e}") from None
        self.name = name
        self.device = device
        self.contract = contract
        self._entries: dict[str, object] = {}
        self._contracts: dict[str, str] = {}
        self._properties: dict[str, tuple] = {}
        self._partials: dict[str, dict] = {}
        self._exports: dict[str, Export] = {}
        self._graph_capturable: set[str] = set()

    def entry(self, name: str, contract: str | None = None, properties=(),
              export: Export | None = None, graph_capturable: bool = False, partial=None):
        """Decorator registering ``fn(tensors, params)`` as kernel entry ``name`` (the name the
        harness passes as ``op``: "page_indices", "rope_inplace", "rope_out_of_place", ...),
        declaring arithmetic contract ``contract`` (one of ``CONTRACTS``; None: the adapter's),
        the invariance ``properties`` it promises bitwise (names of ``PROPERTIES``) and, with
        ``export``, how it calls its upstream function (``Export``).

        ``graph_capturable=True`` declares that one call may be captured into a
        ``torch.cuda.CUDAGraph`` and replayed after the arguments' contents changed (no host read
        of argument contents, no host synchronization): the graph-replay step (docs/bridge.md
        "Graph replay") then judges the replay. Only a "cuda" adapter's entries can be.

        ``partial`` declares the entry's partial contract (``partial_contract``): outputs it does
        not produce (``{"not_produced": ["lse"]}``) and regions of an output it leaves
        unspecified (``{"unspecified": {"logits": "past_context"}}``); docs/bridge.md."""
        if export is not None and not isinstance(export, Export):
            raise TypeError(f"entry {name!r}: export must be an attncheck_bridge.Export")
        if not isinstance(name, str) or not name or "," in name or any(c.isspace() for c in name):
            raise ValueError(f"entry name must be a non-empty word without commas, got {name!r}")
        if not isinstance(graph_capturable, bool):
            raise TypeError(f"entry {name!r}: graph_capturable must be True or False, got {graph_capturable!r}")
        if graph_capturable and self.device != "cuda":
            raise ValueError(
                f"adapter {self.name!r}, entry {name!r}: graph_capturable needs device 'cuda' "
                f"(torch.cuda.CUDAGraph), the adapter's device is {self.device!r}"
            )
        if contract is None:
            contract = self.contract
        else:
            try:
                contract = contract_name(contract)
            except ValueError as e:
                raise ValueError(f"adapter {self.name!r}, entry {name!r}: {e}") from None
        try:
            properties = property_names(properties)
            partial = partial_contract(partial)
        except ValueError as e:
            raise ValueError(f"adapter {self.name!r}, entry {name!r}: {e}") from None

        def register(fn):
            if not callable(fn):
                raise TypeError(f"entry {name!r}: {fn!r} is not callable")
            if name in self._entries:
                raise ValueError(f"adapter {self.name!r}: entry {name!r} registered twice")
            self._entries[name] = fn
            self._contracts[name] = contract
            self._properties[name] = properties
            self._partials[name] = partial
            if export is not None:
                self._exports[name] = export
            if graph_capturable:
                self._graph_capturable.add(name)
            return fn

        return register

    def add(self, name: str, fn, contract: str | None = None, properties=(),
            graph_capturable: bool = False, partial=None):
        """Non-decorator form of entry()."""
        return self.entry(name, contract, properties, graph_capturable=graph_capturable, partial=partial)(fn)

    def graph_capturable(self, name: str) -> bool:
        """Whether entry ``name`` declared itself graph-capturable (entry(graph_capturable=True))."""
        return name in self._graph_capturable

    def properties_of(self, name: str) -> tuple | None:
        """The invariance properties entry ``name`` declares, None if no such entry."""
        return self._properties.get(name)

    def partial_of(self, name: str) -> dict | None:
        """The partial contract entry ``name`` declares, canonical (``partial_contract``: both
        keys present, empty when it declares nothing; a copy), None if no such entry."""
        p = self._partials.get(name)
        if p is None:
            return None
        return {"not_produced": list(p["not_produced"]), "unspecified": dict(p["unspecified"])}

    @property
    def properties(self) -> dict:
        """entry name -> declared invariance properties (a tuple), in registration order."""
        return dict(self._properties)

    def export_of(self, name: str) -> Export | None:
        """How entry ``name`` calls its upstream function, None when it does not say."""
        return self._exports.get(name)

    def contract_of(self, name: str) -> str | None:
        """The contract entry ``name`` declares (canonical spelling), None if no such entry."""
        return self._contracts.get(name)

    @property
    def contracts(self) -> dict:
        """entry name -> declared contract, in registration order."""
        return dict(self._contracts)

    @property
    def entries(self) -> dict:
        return dict(self._entries)

    def get(self, name: str):
        return self._entries.get(name)

    def ops(self) -> list[str]:
        """The entry names, in registration order (what the plugin's ops() lists)."""
        return list(self._entries)

    def library(self) -> str:
        return f"attncheck-pybridge ({self.name}, contract {self.contract})"

    def __repr__(self):
        return f"Adapter(name={self.name!r}, device={self.device!r}, contract={self.contract!r}, entries={list(self._entries)})"


# --------------------------------------------------------------------------------------------
# Tensors

# DLPack type codes (dlpack.h). The harness speaks DLPack 0.6, where fp8 travels as uint8 and its
# format is the kernel parameter "fp8_format"; the fp8 codes of DLPack >= 1.0 are named too, in case
# a later ABI passes them.
kDLInt, kDLUInt, kDLFloat, kDLOpaqueHandle, kDLBfloat, kDLComplex, kDLBool = 0, 1, 2, 3, 4, 5, 6
_FP8_CODES = {
    10: "e4m3fn",  # kDLFloat8_e4m3fn
    11: "e4m3fnuz",  # kDLFloat8_e4m3fnuz
    12: "e5m2",  # kDLFloat8_e5m2
    13: "e5m2fnuz",  # kDLFloat8_e5m2fnuz
}
kDLCPU, kDLCUDA, kDLROCM = 1, 2, 10


def dtype_name_of(code: int, bits: int, lanes: int = 1) -> str:
    """attncheck's dtype name of a DLPack dtype ("bf16", "f32", "i32", "u8", "e4m3fn", ...)."""
    if lanes != 1:
        return f"dl{code}x{bits}x{lanes}"
    if code == kDLFloat and bits in (16, 32, 64):
        return f"f{bits}"
    if code == kDLBfloat and bits == 16:
        return "bf16"
    if code == kDLInt and bits in (8, 16, 32, 64):
        return f"i{bits}"
    if code == kDLUInt and bits in (8, 16, 32, 64):
        return f"u{bits}"
    if code == kDLBool and bits == 8:
        return "bool"
    if code in _FP8_CODES and bits == 8:
        return _FP8_CODES[code]
    return f"dl{code}x{bits}"


_DL_OF_NAME = {
    "f64": (kDLFloat, 64),
    "f32": (kDLFloat, 32),
    "f16": (kDLFloat, 16),
    "bf16": (kDLBfloat, 16),
    "i8": (kDLInt, 8),
    "i16": (kDLInt, 16),
    "i32": (kDLInt, 32),
    "i64": (kDLInt, 64),
    "u8": (kDLUInt, 8),
    "u16": (kDLUInt, 16),
    "u32": (kDLUInt, 32),
    "u64": (kDLUInt, 64),
    "bool": (kDLBool, 8),
    "e4m3fn": (10, 8),
    "e4m3fnuz": (11, 8),
    "e5m2": (12, 8),
    "e5m2fnuz": (13, 8),
}


class Tensor:
    """One argument: a strided view of a buffer the harness owns.

    name        the argument's name ("block_table", "q", ...)
    dtype_name  attncheck dtype name: "f64" "f32" "f16" "bf16" "i8" "i32" "i64" "u8" ...; fp8
                arrives as "u8" under ABI v1 (its format is params["fp8_format"])
    shape       tuple of sizes
    strides     tuple of strides in *elements* (DLPack's convention; NumPy's are in bytes)
    byte_offset where element 0 starts, from ``data``
    data        address of the buffer (a device pointer for cuda adapters)
    ptr         data + byte_offset: the address of element 0
    device      "cpu" or "cuda"

    ``__dlpack__``/``__dlpack_device__`` make it consumable by ``torch.from_dlpack`` and
    ``numpy.from_dlpack`` (no copy; the consumer must not outlive the entry call).
    """

    __slots__ = (
        "name",
        "data",
        "byte_offset",
        "shape",
        "strides",
        "dl_code",
        "dl_bits",
        "dl_lanes",
        "dtype_name",
        "device",
        "device_type",
        "device_id",
        "_owner",
    )

    def __init__(
        self,
        name,
        data,
        byte_offset,
        shape,
        strides,
        code,
        bits,
        lanes=1,
        device="cpu",
        device_type=None,
        device_id=0,
        owner=None,
    ):
        self.name = str(name)
        self.data = int(data)
        self.byte_offset = int(byte_offset)
        self.shape = tuple(int(s) for s in shape)
        self.strides = tuple(int(s) for s in strides)
        if len(self.strides) != len(self.shape):
            raise ValueError(f"tensor {self.name!r}: {len(self.shape)} sizes but {len(self.strides)} strides")
        self.dl_code, self.dl_bits, self.dl_lanes = int(code), int(bits), int(lanes)
        self.dtype_name = dtype_name_of(self.dl_code, self.dl_bits, self.dl_lanes)
        self.device = device
        self.device_type = int(device_type) if device_type is not None else (kDLCPU if device == "cpu" else kDLCUDA)
        self.device_id = int(device_id)
        self._owner = owner  # keeps a NumPy array alive for tensors made by from_numpy

    # -- geometry --------------------------------------------------------------------------
    @property
    def ptr(self) -> int:
        return self.data + self.byte_offset

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return (self.dl_bits * self.dl_lanes + 7) // 8

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def extent(self) -> tuple[int, int]:
        """[lo, hi) in elements relative to element 0 that the view touches ((0, 0) when empty)."""
        if self.numel == 0:
            return (0, 0)
        lo = sum(min(0, (n - 1) * s) for n, s in zip(self.shape, self.strides))
        hi = sum(max(0, (n - 1) * s) for n, s in zip(self.shape, self.strides)) + 1
        return (lo, hi)

    def is_contiguous(self) -> bool:
        """Row-major packed; a dimension of size 1 may have any stride and an empty view is
        contiguous (as torch says)."""
        if self.numel == 0:
            return True
        expect = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides)):
            if n != 1 and s != expect:
                return False
            expect *= n
        return True

    # -- DLPack ----------------------------------------------------------------------------
    def __dlpack__(self, stream=None, **kwargs):  # noqa: ARG002 - stream: launches are synchronous
        if self._owner is not None and hasattr(self._owner, "__dlpack__"):
            return self._owner.__dlpack__()
        try:
            import _attncheck_native  # provided by libattncheck_pybridge.so
        except ImportError as e:
            raise BufferError(
                f"tensor {self.name!r}: DLPack export needs the bridge's native module "
                "(_attncheck_native, inside libattncheck_pybridge.so)"
            ) from e
        return _attncheck_native.dlpack_capsule(
            self.data,
            self.byte_offset,
            self.device_type,
            self.device_id,
            self.dl_code,
            self.dl_bits,
            self.dl_lanes,
            self.shape,
            self.strides,
        )

    def __dlpack_device__(self):
        return (self.device_type, self.device_id)

    # -- construction for tests ------------------------------------------------------------
    @classmethod
    def from_numpy(cls, arr, name="t", dtype_name=None):
        """A Tensor viewing a NumPy array (no copy). ``dtype_name`` relabels the bits, e.g. a
        uint16 array as "bf16"; the itemsize must match."""
        import numpy as np

        if not isinstance(arr, np.ndarray):
            raise TypeError("from_numpy needs a numpy.ndarray")
        if dtype_name is None:
            dtype_name = _numpy_name(arr.dtype)
        if dtype_name not in _DL_OF_NAME:
            raise ValueError(f"unknown dtype name {dtype_name!r}")
        code, bits = _DL_OF_NAME[dtype_name]
        if bits // 8 != arr.itemsize:
            raise ValueError(f"{dtype_name} has {bits // 8}-byte elements, the array {arr.itemsize}")
        for s in arr.strides:
            if s % arr.itemsize:
                raise ValueError("from_numpy: strides must be multiples of the itemsize")
        data = arr.__array_interface__["data"][0]
        return cls(
            name,
            data,
            0,
            arr.shape,
            [s // arr.itemsize for s in arr.strides],
            code,
            bits,
            1,
            device="cpu",
            owner=arr if dtype_name == _numpy_name(arr.dtype) else _Keep(arr),
        )

    def __repr__(self):
        return (
            f"Tensor({self.name!r}, {self.dtype_name}, shape={self.shape}, strides={self.strides}, "
            f"offset={self.byte_offset}, device={self.device})"
        )


class _Keep:
    """Holds an array alive without exposing its (differently typed) __dlpack__."""

    __slots__ = ("arr",)

    def __init__(self, arr):
        self.arr = arr


def _numpy_name(dt) -> str:
    import numpy as np

    table = {
        np.dtype(np.float64): "f64",
        np.dtype(np.float32): "f32",
        np.dtype(np.float16): "f16",
        np.dtype(np.int8): "i8",
        np.dtype(np.int16): "i16",
        np.dtype(np.int32): "i32",
        np.dtype(np.int64): "i64",
        np.dtype(np.uint8): "u8",
        np.dtype(np.uint16): "u16",
        np.dtype(np.uint32): "u32",
        np.dtype(np.uint64): "u64",
        np.dtype(np.bool_): "bool",
    }
    if np.dtype(dt) not in table:
        raise ValueError(f"no attncheck dtype for numpy {dt}")
    return table[np.dtype(dt)]


def _numpy_dtype(name: str):
    """The NumPy dtype as_numpy uses: raw bits for 16-bit floats (uint16) and fp8 (uint8)."""
    import numpy as np

    table = {
        "f64": np.float64,
        "f32": np.float32,
        "f16": np.uint16,
        "bf16": np.uint16,
        "i8": np.int8,
        "i16": np.int16,
        "i32": np.int32,
        "i64": np.int64,
        "u8": np.uint8,
        "u16": np.uint16,
        "u32": np.uint32,
        "u64": np.uint64,
        "bool": np.bool_,
        "e4m3fn": np.uint8,
        "e4m3fnuz": np.uint8,
        "e5m2": np.uint8,
        "e5m2fnuz": np.uint8,
    }
    if name not in table:
        raise Unsupported(f"as_numpy: no NumPy view for dtype {name}")
    return np.dtype(table[name])


def as_numpy(t: Tensor):
    """A NumPy view of a host tensor that honours its strides and offset: writes land in the
    harness's buffer in place. 16-bit floats come back as uint16 bit patterns (``bf16_to_f32``,
    ``f16_to_f32``, ``.view(numpy.float16)``), fp8 as uint8 codes (``e4m3fn_to_f32``, ...).

    Only for cpu adapters; a cuda adapter's buffers are device memory (use ``as_torch``)."""
    import numpy as np

    if t.device != "cpu":
        raise TypeError(f"as_numpy: tensor {t.name!r} lives on {t.device}; use as_torch(t)")
    dt = _numpy_dtype(t.dtype_name)
    es = dt.itemsize
    if t.numel == 0:
        return np.empty(t.shape, dt)
    lo, hi = t.extent()
    buf = (ctypes.c_char * ((hi - lo) * es)).from_address(t.ptr + lo * es)
    buf._attncheck_tensor = t  # the view keeps the Tensor (and a from_numpy owner) alive
    return np.ndarray(t.shape, dt, buffer=buf, offset=-lo * es, strides=[s * es for s in t.strides])


def as_torch(t: Tensor, fp8_format: str | None = None):
    """``torch.from_dlpack(t)`` (no copy; bf16 comes back as torch.bfloat16). With
    ``fp8_format`` ("e4m3fn" / "e4m3fnuz"), a uint8 tensor is reinterpreted as that torch fp8
    dtype."""
    import torch

    x = torch.from_dlpack(t)
    if fp8_format is not None and x.dtype == torch.uint8:
        fp8 = {"e4m3fn": "float8_e4m3fn", "e4m3fnuz": "float8_e4m3fnuz", "e5m2": "float8_e5m2", "e5m2fnuz": "float8_e5m2fnuz"}
        if fp8_format not in fp8 or not hasattr(torch, fp8[fp8_format]):
            raise Unsupported(f"as_torch: this torch has no {fp8_format} dtype")
        x = x.view(getattr(torch, fp8[fp8_format]))
    return x


def expect_dtype(t: Tensor, *names: str) -> None:
    """Refuse unless t's dtype is one of names (message names the tensor)."""
    if t.dtype_name not in names:
        raise Refuse(f"'{t.name}' must be {' or '.join(names)}, got {t.dtype_name}")


def expect_ndim(t: Tensor, *ndims: int) -> None:
    if t.ndim not in ndims:
        raise Refuse(f"'{t.name}' must have {' or '.join(map(str, ndims))} dims, got {t.ndim}")


def arg(t: dict, name: str) -> Tensor:
    """The argument `name` of an entry's tensors; Refuse naming it when the harness did not pass it."""
    if name not in t:
        raise Refuse(f"missing argument '{name}'")
    return t[name]


def import_upstream(module: str, src_env: str, how: str):
    """Imports an upstream package, first putting the source tree named by $`src_env` (if set)
    on sys.path; any import failure becomes Unsupported naming the module and `how` to get it."""
    import importlib
    import os
    import sys

    src = os.environ.get(src_env)
    if src and src not in sys.path:
        sys.path.insert(0, src)
    try:
        return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure is the reason to decline
        raise Unsupported(f"{module} not importable ({type(e).__name__}: {e}); {how} and set {src_env}") from e


def kv_cache_write_args(t: dict, p: dict):
    """What docs/ops/kv_cache_write.md calls valid, checked once for every writer adapter: the
    layout and cache dtype params, the 16-bit key/value pair, int64 slot_mapping [T], caches of one
    dtype (u8 with f32 scales for fp8, else the key's). Refuse otherwise. Returns a namespace of
    the tensors (key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale) and `layout`,
    `kv_dtype`; shapes and the fp8 format are the adapter's to check (its layouts differ)."""
    from types import SimpleNamespace

    names = ("key", "value", "key_cache", "value_cache", "slot_mapping", "k_scale", "v_scale")
    a = SimpleNamespace(**{n: arg(t, n) for n in names})
    a.layout = p.get("kv_cache_layout")
    if a.layout not in ("NHD", "SHUFFLE"):
        raise Refuse(f"kv_cache_layout must be NHD or SHUFFLE, got {a.layout!r}")
    a.kv_dtype = p.get("kv_cache_dtype")
    if a.kv_dtype not in ("auto", "fp8"):
        raise Refuse(f"kv_cache_dtype must be auto or fp8, got {a.kv_dtype!r}")
    expect_dtype(a.key, "bf16", "f16")
    if a.value.dtype_name != a.key.dtype_name:
        raise Refuse(f"'key' is {a.key.dtype_name} but 'value' is {a.value.dtype_name}")
    expect_dtype(a.slot_mapping, "i64")
    expect_ndim(a.slot_mapping, 1)
    if a.key_cache.dtype_name != a.value_cache.dtype_name:
        raise Refuse("key_cache and value_cache dtypes differ")
    if a.kv_dtype == "fp8":
        expect_dtype(a.key_cache, "u8")
        expect_dtype(a.k_scale, "f32")
        expect_dtype(a.v_scale, "f32")
    elif a.key_cache.dtype_name != a.key.dtype_name:
        raise Refuse(f"kv_cache_dtype auto needs {a.key.dtype_name} caches, got {a.key_cache.dtype_name}")
    return a


# --------------------------------------------------------------------------------------------
# Codecs (bit patterns <-> float32), vectorized over NumPy arrays.


def bf16_to_f32(bits):
    """uint16 bf16 bit patterns -> float32 (exact)."""
    import numpy as np

    b = np.asarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16_rne(x):
    """float32 -> uint16 bf16 bit patterns, round to nearest even; NaN stays a quiet NaN of the
    same sign, overflow goes to inf."""
    import numpy as np

    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = (u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    nan = np.isnan(f)
    quiet = ((u >> np.uint64(16)) | np.uint64(0x0040)) & np.uint64(0xFFFF)
    return np.where(nan, quiet, rounded).astype(np.uint16)


def f16_to_f32(bits):
    """uint16 IEEE half bit patterns -> float32 (exact)."""
    import numpy as np

    return np.asarray(bits, dtype=np.uint16).view(np.float16).astype(np.float32)


def _fp8_table(bias: int, fnuz: bool):
    import numpy as np

    out = np.empty(256, dtype=np.float32)
    for c in range(256):
        sign = -1.0 if c & 0x80 else 1.0
        e = (c >> 3) & 0xF
        m = c & 0x7
        if fnuz and c == 0x80:
            out[c] = np.nan
            continue
        if not fnuz and (c & 0x7F) == 0x7F:
            out[c] = np.nan
            continue
        if e == 0:
            v = (m / 8.0) * 2.0 ** (1 - bias)
        else:
            v = (1.0 + m / 8.0) * 2.0 ** (e - bias)
        out[c] = sign * v
    return out


_TABLES: dict = {}


def _table(fmt: str):
    if fmt not in _TABLES:
        if fmt == "e4m3fn":
            _TABLES[fmt] = _fp8_table(7, fnuz=False)
        elif fmt == "e4m3fnuz":
            _TABLES[fmt] = _fp8_table(8, fnuz=True)
        else:
            raise Unsupported(f"no codec for fp8 format {fmt!r}")
    return _TABLES[fmt]


def e4m3fn_to_f32(codes):
    """OCP fp8 E4M3 codes (uint8) -> float32: bias 7, max 448, NaN 0x7F/0xFF, no inf."""
    import numpy as np

    return _table("e4m3fn")[np.asarray(codes, dtype=np.uint8)]


def e4m3fnuz_to_f32(codes):
    """fp8 E4M3 FNUZ codes (uint8) -> float32: bias 8, max 240, NaN 0x80 only, no -0, no inf."""
    import numpy as np

    return _table("e4m3fnuz")[np.asarray(codes, dtype=np.uint8)]


def fp8_to_f32(codes, fp8_format: str):
    """Decode by the ABI's "fp8_format" parameter ("e4m3fn" | "e4m3fnuz")."""
    import numpy as np

    return _table(fp8_format)[np.asarray(codes, dtype=np.uint8)]
