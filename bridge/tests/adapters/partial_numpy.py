"""Test adapter: numpy_reference's rope_out_of_place declaring a partial contract (bridge/tests/
partial_caught.py). It provides no other entry (the rest of the ops: not provided).

$ATTNCHECK_PARTIAL_DECLARE  JSON of the declaration (default: {"not_produced": ["k_out"]})
$ATTNCHECK_PARTIAL_MODE     "keep" (default): k_out left untouched, as declared; "write": k_out
                            written all the same (a kernel that breaks its declaration)
"""

import json
import os

import attncheck_bridge as ab
import numpy_reference as ref

DECLARED = json.loads(os.environ.get("ATTNCHECK_PARTIAL_DECLARE", '{"not_produced": ["k_out"]}'))

ADAPTER = ab.Adapter(name="partial_numpy", device="cpu")


@ADAPTER.entry("rope_out_of_place", partial=DECLARED)
def rope_out_of_place(t, p):
    if os.environ.get("ATTNCHECK_PARTIAL_MODE", "keep") == "write":
        return ref.rope_out_of_place(t, p)
    neox, rot, cos, sin, (q, _k), (q_out, _k_out) = ref._rope_prepare(t, p, ("q_out", "k_out"))
    ref._rotate(q, q_out, neox, rot, cos, sin)
    return None
