"""aiter_triton: AITER's (ROCm/aiter) Triton kernels judged by attncheck on any torch GPU, from an
AITER source tree (device "cuda"; docs/adapters/aiter.md, "AITER's Triton kernels").

    ATTNCHECK_AITER_SRC=<aiter checkout or partial tree> \\
      attncheck run --tier quick --op mla_decode --op sparse_mla --op indexer_logits_prefill \\
        --op indexer_logits_decode --kernels py:aiter_triton       # or py:rocm_aiter

The entries (mla_decode, sparse_mla, indexer_logits_prefill, indexer_logits_decode), their partial
contracts and the AITER functions they call are attncheck_bridge.aiter_triton_entries'; py:rocm_aiter
serves the same entries whenever ATTNCHECK_AITER_SRC is set. AITER's files are executed unmodified
from the tree by attncheck_bridge.upstream: its pure-Python modules for real, stand-ins only for the
package __init__ files (they load the HIP extension), the platform probes (aiter.dtypes,
aiter.jit.utils.chip_info), the AMD-only Gluon modules off ROCm and whatever the tree lacks, each
named on stderr; off ROCm the AMD launch options waves_per_eu, matrix_instr_nonkdim and kpack are
dropped at the wrapper modules' launches.
"""

from attncheck_bridge import aiter_triton_entries

ADAPTER = aiter_triton_entries.adapter()
