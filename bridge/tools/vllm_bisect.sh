#!/usr/bin/env bash
# One attncheck case as a `git bisect run` predicate over a vLLM checkout (docs/adapters/vllm.md):
#
#   cd <vllm checkout> && git bisect start <bad> <good> -- <file of the kernel>
#   git bisect run <attncheck>/bridge/tools/vllm_bisect.sh '<case id>'
#
# Runs the case through py:vllm_triton with ATTNCHECK_VLLM_SRC = the checkout being bisected (the
# current directory's work tree unless ATTNCHECK_VLLM_SRC is set) and exits with git bisect's codes:
#   0    good: passed, refused as expected (or an unexpected pass)
#   1    bad:  failed, error, or a known bug's failure
#   125  skip: this revision cannot be judged (vLLM did not load, the adapter declines the case,
#        or the case is skipped)
#   255  abort: the setup is wrong (no attncheck, unknown case id, no verdict: the adapter could not
#        run at all, e.g. no GPU or no torch)
# Environment: ATTNCHECK_BIN (default: attncheck on PATH), ATTNCHECK_ROOT (default: the attncheck
# checkout holding this script), ATTNCHECK_PYBRIDGE (when the bridge is not beside the binary),
# VLLM_BISECT_TIMEOUT (seconds for the case, default 600), VLLM_BISECT_KERNELS (default
# py:vllm_triton).
exec "$(dirname "$0")/bisect_case.sh" vllm ATTNCHECK_VLLM_SRC py:vllm_triton "$@"
