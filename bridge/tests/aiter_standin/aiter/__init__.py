"""A stand-in for ROCm/aiter, for tests only: NumPy implementations of the AITER functions the
rocm_aiter adapter (bridge/adapters/rocm_aiter.py) calls, with AITER's signatures and the semantics
of its kernels (docs/adapters/aiter.md names the commit they were read at). Tensors are
aiter._standin.HostTensor (a NumPy view plus an attncheck dtype name) instead of torch tensors.

It is never AITER: STANDIN is True so that the adapter's NumPy backend can insist on it.
"""

STANDIN = True

__all__ = [
    "STANDIN",
    "cp_gather_indexer_k_quant_cache",
    "dtypes",
    "get_mla_metadata_info_v1",
    "get_mla_metadata_v1",
    "indexer_k_quant_and_cache",
    "mla_decode_fwd",
    "reshape_and_cache",
    "reshape_and_cache_flash",
    "reshape_and_cache_with_pertoken_quant",
    "rope_cached_positions_2c_fwd_impl",
    "rope_cached_positions_2c_fwd_inplace",
]

from . import dtypes  # noqa: E402,F401
from .mla import mla_decode_fwd  # noqa: E402,F401
from .ops.attention import get_mla_metadata_info_v1, get_mla_metadata_v1  # noqa: E402,F401
from .ops.cache import (  # noqa: E402,F401
    cp_gather_indexer_k_quant_cache,
    indexer_k_quant_and_cache,
    reshape_and_cache,
    reshape_and_cache_flash,
    reshape_and_cache_with_pertoken_quant,
)
from .ops.rope import rope_cached_positions_2c_fwd_impl, rope_cached_positions_2c_fwd_inplace  # noqa: E402,F401
