#!/usr/bin/env bash
# One attncheck case as a `git bisect run` predicate over an AITER checkout (docs/adapters/aiter.md,
# "AITER's Triton kernels"):
#
#   cd <aiter checkout> && git bisect start <bad> <good> -- aiter/ops/triton/
#   git bisect run <attncheck>/bridge/tools/aiter_bisect.sh '<case id>'
#
# Runs the case through py:rocm_aiter with ATTNCHECK_AITER_SRC = the checkout being bisected (the
# current directory's work tree unless ATTNCHECK_AITER_SRC is set), so AITER's Triton files are
# executed from that revision, and exits with git bisect's codes:
#   0    good: passed, refused as expected (or an unexpected pass)
#   1    bad:  failed, error, or a known bug's failure
#   125  skip: this revision cannot be judged (a file did not load, the adapter declines the case,
#        or the case is skipped)
#   255  abort: the setup is wrong (no attncheck, unknown case id, no verdict: the adapter could not
#        run at all, e.g. no GPU or no torch)
# Environment: ATTNCHECK_BIN (default: attncheck on PATH), ATTNCHECK_ROOT (default: the attncheck
# checkout holding this script), ATTNCHECK_PYBRIDGE (when the bridge is not beside the binary),
# AITER_BISECT_TIMEOUT (seconds for the case, default 600), AITER_BISECT_KERNELS (default
# py:rocm_aiter); ATTNCHECK_AITER_MLA / _IMPL / _LSE pass through to the adapter.
exec "$(dirname "$0")/bisect_case.sh" aiter ATTNCHECK_AITER_SRC py:rocm_aiter "$@"
