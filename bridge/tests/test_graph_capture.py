"""Graph capture in the bridge (docs/bridge.md "Graph replay"): the entries' declaration, and the
refusal paths that make the harness skip the step. Capturing itself needs torch and a GPU (the
lead's GPU run: attncheck run --op decode_attention --kernels py:vllm_triton)."""

import pytest

import attncheck_bridge as ab
from attncheck_bridge import _host


def test_declaration_is_per_entry_and_off_by_default():
    a = ab.Adapter(name="g", device="cuda")

    @a.entry("captured", graph_capturable=True)
    def captured(t, p):
        pass

    a.add("plain", lambda t, p: None)
    a.add("added", lambda t, p: None, graph_capturable=True)
    assert a.graph_capturable("captured") and a.graph_capturable("added")
    assert not a.graph_capturable("plain") and not a.graph_capturable("nope")


def test_declaration_needs_a_cuda_adapter_and_a_bool():
    with pytest.raises(ValueError, match="graph_capturable needs device 'cuda'"):
        ab.Adapter(name="h").entry("x", graph_capturable=True)
    with pytest.raises(TypeError, match="graph_capturable must be True or False"):
        ab.Adapter(name="h", device="cuda").entry("x", graph_capturable="yes")


def test_undeclared_entry_is_unsupported_not_failed():
    a = _host.load_adapter("numpy_reference")
    status, msg, handle = _host.graph_capture(a, "numpy_reference", "page_indices", [], "{}")
    assert status == _host.UNSUPPORTED and handle == 0
    assert "entry 'page_indices' does not declare itself graph-capturable" in msg


def test_unknown_entry_is_unknown():
    a = _host.load_adapter("numpy_reference")
    status, msg, handle = _host.graph_capture(a, "numpy_reference", "nope", [], "{}")
    assert status == _host.UNKNOWN_OP and handle == 0


def test_a_host_adapter_never_captures():
    a = ab.Adapter(name="g", device="cuda")
    a.add("x", lambda t, p: None, graph_capturable=True)
    a.device = "cpu"  # as if it had been declared on the host: refused before any tensor exists
    status, msg, handle = _host.graph_capture(a, "g", "x", [], "{}")
    assert status == _host.UNSUPPORTED and "runs on the host" in msg and handle == 0


def test_replay_and_release_of_no_graph():
    status, msg = _host.graph_replay("spec", 987654)
    assert status == _host.HOST_ERROR and "no captured graph 987654" in msg
    _host.graph_release(987654)  # nothing to release: no error


def test_vllm_triton_declares_decode_attention_only():
    # The adapter imports without vLLM (test_vllm_triton_adapter.py does so at its top) and this
    # bridge has graph capture: neither may turn into a skip, or losing the declaration would pass.
    import vllm_triton

    adapter = vllm_triton.ADAPTER
    assert adapter.graph_capturable("decode_attention")
    for entry in adapter.ops():
        if entry != "decode_attention":
            assert not adapter.graph_capturable(entry), entry
