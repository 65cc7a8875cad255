"""Adapter registry, loading and exception semantics (attncheck_bridge, attncheck_bridge._host)."""

import os

import numpy as np
import pytest

import attncheck_bridge as ab
from attncheck_bridge import _host

HERE = os.path.dirname(os.path.abspath(__file__))


def test_adapter_registry():
    a = ab.Adapter(name="demo")
    assert a.device == "cpu" and a.contract == "fp32-accumulate"
    assert a.library() == "attncheck-pybridge (demo, contract fp32-accumulate)"

    @a.entry("second")
    def second(t, p):
        pass

    a.add("first", lambda t, p: None)
    assert a.ops() == ["second", "first"]
    assert a.get("second") is second and a.get("nope") is None
    with pytest.raises(ValueError, match="twice"):
        a.add("first", lambda t, p: None)
    with pytest.raises(ValueError):
        a.entry("a,b")
    with pytest.raises(ValueError, match="device"):
        ab.Adapter(name="x", device="tpu")
    with pytest.raises(ValueError):
        ab.Adapter(name="")
    assert ab.Adapter(name="c", device="cuda", contract="p-in-input-type").library() == "attncheck-pybridge (c, contract p-in-input-type)"


def test_load_by_module_and_by_path():
    a = _host.load_adapter("numpy_reference")
    assert a.name == "numpy_reference"
    assert _host.describe(a) == (
        "attncheck-pybridge (numpy_reference, contract fp32-accumulate)",
        "cpu",
        "page_indices,kv_gather,rope_inplace,rope_out_of_place,decode_attention",
    )
    assert _host.entry_contracts(a)[-1] == ("decode_attention", "qk-products-in-input-type")
    assert dict(_host.entry_contracts(a))["page_indices"] == "fp32-accumulate"
    b = _host.load_adapter(os.path.join(HERE, "adapters", "pure_python.py"))
    assert b.name == "pure_python"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "ATTNCHECK_PY_ADAPTER is not set"),
        ("no_such_adapter_module", "py adapter 'no_such_adapter_module': module not found"),
        ("/nonexistent/x.py", "py adapter '/nonexistent/x.py': no such file"),
        ("raises_on_import", "py adapter 'raises_on_import': importing it raised RuntimeError: deliberate import-time failure"),
        ("no_registry", "py adapter 'no_registry': the module"),
    ],
)
def test_load_failures_name_the_adapter(spec, message):
    with pytest.raises(_host.BridgeError) as e:
        _host.load_adapter(spec)
    assert message in str(e.value)


def test_adapter_without_entries(tmp_path):
    f = tmp_path / "empty_adapter.py"
    f.write_text("import attncheck_bridge as ab\nADAPTER = ab.Adapter(name='empty')\n")
    with pytest.raises(_host.BridgeError, match="registers no entries"):
        _host.load_adapter(str(f))
    g = tmp_path / "wrong_adapter.py"
    g.write_text("ADAPTER = object()\n")
    with pytest.raises(_host.BridgeError, match="not an attncheck_bridge.Adapter"):
        _host.load_adapter(str(g))


def test_a_failing_import_of_something_else_is_not_module_not_found(tmp_path):
    f = tmp_path / "needs_missing.py"
    f.write_text("import surely_missing_dependency_xyz\n")
    with pytest.raises(_host.BridgeError) as e:
        _host.load_adapter(str(f))
    assert "surely_missing_dependency_xyz" in str(e.value) and "module not found" not in str(e.value)


def _args(arrays):
    out = []
    for name, a in arrays.items():
        t = ab.Tensor.from_numpy(a, name)
        out.append((name, t.data, 0, t.shape, t.strides, t.dl_code, t.dl_bits, 1))
    return out


def test_run_classifies_exceptions():
    a = _host.load_adapter("pure_python")
    assert _host.run(a, "pp", "unsupported", [], "{}") == (_host.UNSUPPORTED, "unsupported by pure_python: this adapter does not implement that")
    assert _host.run(a, "pp", "refuse", [], "{}") == (_host.REFUSED, "kernel_block_size must be >= 1, got 0")
    status, msg = _host.run(a, "pp", "raise", [], "{}")
    assert status == _host.HOST_ERROR == 5
    assert msg.startswith("py adapter 'pp': entry 'raise' raised KeyError: ")
    assert "in inner" in msg and "deliberate failure" in msg
    status, msg = _host.run(a, "pp", "exit", [], "{}")
    assert status == _host.HOST_ERROR and "SystemExit" in msg
    status, msg = _host.run(a, "pp", "nope", [], "{}")
    assert status == _host.UNKNOWN_OP and "has no entry 'nope'" in msg
    status, msg = _host.run(a, "pp", "refuse", [], "[1]")
    assert status == _host.HOST_ERROR and "not a JSON object" in msg


def test_run_builds_tensors_and_params():
    a = _host.load_adapter("pure_python")
    out = np.full(6, -1, dtype=np.int32)
    args = [("out", out.__array_interface__["data"][0], 4, (2,), (2,), ab.kDLInt, 32, 1)]
    assert _host.run(a, "pp", "fill", args, '{"base": 10}') == (_host.OK, "")
    assert out.tolist() == [-1, 10, -1, 11, -1, -1]


def test_time_and_roofline_on_cpu():
    a = _host.load_adapter("pure_python")
    out = np.zeros(2, dtype=np.int32)
    status, msg, ms = _host.time(a, "pp", "fill", _args({"out": out}), '{"base": 1}', 1, 3)
    assert status == _host.OK and ms > 0
    status, msg, ms = _host.time(a, "pp", "raise", [], "{}", 1, 3)
    assert status == _host.HOST_ERROR and ms == -1
    status, msg, gbps, tflops = _host.roofline(a, "pp")
    assert status == _host.OK and gbps > 0 and tflops > 0


def test_cpu_device_info():
    a = _host.load_adapter("pure_python")
    assert _host.query_device(a, "pure_python") == (_host.OK, "", "host (py adapter pure_python)", "cpu")


def test_contracts_per_entry_and_validated():
    assert ab.CONTRACTS == (
        "fp32-accumulate",
        "qk-products-in-input-type",
        "p-in-input-type",
        "qk-products-in-input-type+p-in-input-type",
    )
    assert ab.DEFAULT_CONTRACT == "fp32-accumulate"
    # + combinations in any order come back in canonical spelling
    assert ab.contract_name("p-in-input-type+qk-products-in-input-type") == "qk-products-in-input-type+p-in-input-type"
    a = ab.Adapter(name="k", contract="p-in-input-type")
    a.add("inherits", lambda t, p: None)

    @a.entry("own", contract="qk-products-in-input-type")
    def own(t, p):
        pass

    assert a.contract_of("inherits") == "p-in-input-type"
    assert a.contract_of("own") == "qk-products-in-input-type"
    assert a.contract_of("absent") is None
    assert a.contracts == {"inherits": "p-in-input-type", "own": "qk-products-in-input-type"}
    assert ab.Adapter(name="d").contract == "fp32-accumulate"
    with pytest.raises(ValueError, match=r"adapter 'k', entry 'bad': unknown contract 'fp8-scores'.*known: fp32-accumulate"):
        a.add("bad", lambda t, p: None, contract="fp8-scores")
    assert a.contract_of("bad") is None
    with pytest.raises(ValueError, match="names a part twice"):
        a.add("bad", lambda t, p: None, contract="p-in-input-type+p-in-input-type")
    with pytest.raises(ValueError, match="part 'fp32-accumulate'"):
        a.add("bad", lambda t, p: None, contract="fp32-accumulate+p-in-input-type")
    with pytest.raises(ValueError, match="Adapter 'x': unknown contract 'f64-evaluate'"):
        ab.Adapter(name="x", contract="f64-evaluate")
    with pytest.raises(ValueError, match="non-empty"):
        ab.Adapter(name="x", contract="")


def test_properties_per_entry_validated_and_handed_to_the_plugin():
    assert ab.PROPERTIES == ("batch-invariant", "batch-order-invariant", "split-invariant", "page-order-invariant")
    a = ab.Adapter(name="k")
    a.add("none", lambda t, p: None)

    @a.entry("decode_attention", properties=("batch-invariant", "page-order-invariant"))
    def decode(t, p):
        pass

    a.add("text", lambda t, p: None, properties=" split-invariant, split-invariant ")
    assert a.properties_of("none") == ()
    assert a.properties_of("decode_attention") == ("batch-invariant", "page-order-invariant")
    assert a.properties_of("text") == ("split-invariant",)  # trimmed, repeats dropped
    assert a.properties_of("absent") is None
    # What the C++ side reads (the extension table's `properties`): entries declaring none left out.
    assert _host.entry_properties(a) == [("decode_attention", "batch-invariant,page-order-invariant"), ("text", "split-invariant")]
    with pytest.raises(ValueError, match=r"adapter 'k', entry 'bad': unknown invariance property 'order-free'; known: batch-invariant"):
        a.add("bad", lambda t, p: None, properties=("order-free",))
    with pytest.raises(ValueError, match="comma-separated string"):
        a.add("bad", lambda t, p: None, properties=7)
    assert a.properties_of("bad") is None


def test_shipped_adapters_declare_what_their_code_guarantees():
    # numpy_reference computes each request alone, ignores num_kv_splits and gathers pages by id.
    ref = _host.load_adapter("numpy_reference")
    assert ref.properties_of("decode_attention") == ("batch-invariant", "split-invariant", "page-order-invariant")
    assert dict(_host.entry_properties(ref)) == {"decode_attention": "batch-invariant,split-invariant,page-order-invariant"}


def test_partial_contracts_per_entry_validated_and_handed_to_the_plugin():
    a = ab.Adapter(name="k")
    a.add("full", lambda t, p: None)
    a.add("sparse_mla", lambda t, p: None, partial={"not_produced": ["lse", "lse"]})

    @a.entry("indexer_logits_decode", partial={"unspecified": {"logits": "past_context"}})
    def logits(t, p):
        pass

    assert a.partial_of("full") == {"not_produced": [], "unspecified": {}}
    assert a.partial_of("sparse_mla") == {"not_produced": ["lse"], "unspecified": {}}  # repeat dropped
    assert a.partial_of("indexer_logits_decode") == {"not_produced": [], "unspecified": {"logits": "past_context"}}
    assert a.partial_of("absent") is None
    a.partial_of("sparse_mla")["not_produced"].append("out")  # a copy: the declaration stays
    assert a.partial_of("sparse_mla")["not_produced"] == ["lse"]
    # What the C++ side reads (the extension table's `partial`): entries declaring nothing left out.
    assert _host.entry_partials(a) == [
        ("sparse_mla", '{"not_produced":["lse"],"unspecified":{}}'),
        ("indexer_logits_decode", '{"not_produced":[],"unspecified":{"logits":"past_context"}}'),
    ]


@pytest.mark.parametrize(
    "partial, message",
    [
        ({"not_produce": ["lse"]}, "unknown key 'not_produce'; known: not_produced, unspecified"),
        ({"not_produced": "lse"}, "not_produced must be a list of output names"),
        ({"not_produced": [""]}, "not_produced holds '', not an output name"),
        ({"not_produced": [" lse"]}, "not_produced holds ' lse'"),
        ({"unspecified": ["logits"]}, "unspecified must map output name -> region name"),
        ({"unspecified": {"logits": 3}}, "unspecified has region 3, not a name"),
        ({"not_produced": ["logits"], "unspecified": {"logits": "past_context"}}, "both not produced and partly unspecified"),
        (["lse"], "partial must be a dict"),
    ],
)
def test_bad_partial_declarations_name_the_entry_and_what_is_wrong(partial, message):
    a = ab.Adapter(name="k")
    with pytest.raises(ValueError, match=r"adapter 'k', entry 'bad': partial") as e:
        a.add("bad", lambda t, p: None, partial=partial)
    assert message in str(e.value)
    assert a.partial_of("bad") is None
