import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BRIDGE = os.path.dirname(HERE)
REPORT = os.path.join(os.path.dirname(BRIDGE), "harness", "report")  # the exporter's writer
for p in (REPORT, os.path.join(BRIDGE, "python"), os.path.join(BRIDGE, "adapters"), os.path.join(HERE, "adapters"), HERE):
    if p not in sys.path:
        sys.path.insert(0, p)


import pytest  # noqa: E402  (after the sys.path set-up above)

import attncheck_bridge as ab  # noqa: E402


@pytest.fixture()
def invalid_case():
    """Sets what attncheck sends before a case's launches (the ABI's case_context): the op and its
    invalid() reason; no case again after the test."""

    def set_case(op, reason):
        ab._set_case({"op": op, "id": f"{op}/test", "params": {}, "invalid": reason, "fields": []})

    yield set_case
    ab._set_case(None)
