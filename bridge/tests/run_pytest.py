"""ctest driver: runs bridge/tests/test_*.py with this interpreter; exit 77 (skipped) without pytest
or numpy."""

import os
import sys

try:
    import numpy  # noqa: F401
    import pytest
except ImportError as e:
    print(f"bridge.pytest skipped: {sys.executable} lacks {e.name}", file=sys.stderr)
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", here]))
