"""attncheck_bridge.upstream: the one loader of upstream source trees (vLLM, AITER) on a host
without their compiled extensions. A fake project ``fk`` in a temporary tree stands for either."""

import sys

import pytest

import attncheck_bridge as ab
from attncheck_bridge import upstream


@pytest.fixture
def tree(tmp_path):
    """A Tree over tmp_path for package ``fk``, uninstalled (and fk forgotten) afterwards."""
    saved_meta = list(sys.meta_path)
    made = []

    def make(files, probes=None):
        for rel, text in files.items():
            path = tmp_path / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
        t = upstream.Tree("fk-test", ("fk",), str(tmp_path), probes=probes, say=lambda msg: None).install()
        made.append(t)
        return t

    yield make
    for t in made:
        t.uninstall()
    sys.meta_path[:] = saved_meta


def test_a_pure_python_module_the_kernel_imports_is_executed_from_the_tree(tree):
    t = tree({"fk/__init__.py": "raise ImportError('the package init loads a compiled extension')\n",
              "fk/utils/quant.py": "CALLS = []\ndef min_max():\n    CALLS.append(1)\n    return -448.0, 448.0\n",
              "fk/ops/writer.py": "from fk.utils.quant import min_max\nLO, HI = min_max()\n"})
    mod = t.load("fk.ops.writer")
    assert (mod.LO, mod.HI) == (-448.0, 448.0)
    assert sys.modules["fk.utils.quant"].CALLS == [1]  # the real module, not a stand-in
    assert t.stood_in == {}


def test_a_compiled_extension_becomes_a_stand_in_and_its_value_is_unsupported_naming_it(tree):
    t = tree({"fk/_C.cpython-312-x86_64-linux-gnu.so": b"\x7fELF",
              "fk/ops/kernel.py": "import fk._C as C\nfrom fk._C import launch\n"
                                  "def run(n):\n    return launch(n) + 1\n"
                                  "def width():\n    return int(C.WIDTH)\n"})
    mod = t.load("fk.ops.kernel")  # module-level use only imports: it loads
    assert "compiled extension" in t.stood_in["fk._C"]
    with pytest.raises(ab.Unsupported, match=r"fk._C.WIDTH is a stand-in \(module fk._C: a compiled extension\)"):
        mod.width()
    with pytest.raises(upstream.StandInUsed, match=r"fk._C.launch\(...\) is a stand-in .* used as a number"):
        mod.run(3)


def test_a_module_that_fails_to_execute_becomes_a_stand_in_saying_why(tree):
    t = tree({"fk/dep.py": "import attncheck_no_such_package_xyz\nLIMIT = 5\n",
              "fk/kernel.py": "from fk.dep import LIMIT\ndef small(n):\n    return n < LIMIT\n"})
    mod = t.load("fk.kernel")
    assert "No module named 'attncheck_no_such_package_xyz'" in t.stood_in["fk.dep"]
    with pytest.raises(ab.Unsupported, match=r"fk.dep.LIMIT is a stand-in \(module fk.dep: executing .*dep.py failed"):
        mod.small(1)


def test_a_kernel_that_needs_a_stand_ins_value_at_load_is_unsupported_naming_the_module(tree):
    t = tree({"fk/kernel.py": "from fk.missing import get_min_max\nLO, HI = get_min_max()\n"})
    with pytest.raises(ab.Unsupported, match=r"kernel.py failed to load: StandInUsed: fk.missing.get_min_max\(...\) "
                                             r"is a stand-in \(module fk.missing: not in the tree"):
        t.load("fk.kernel")
    assert "fk.kernel" not in sys.modules


def test_probes_answer_for_the_device_and_the_kernel_file_itself_is_strict(tree):
    probe = lambda name: upstream.probe_module(name, "platform probe", is_rocm=lambda: False)  # noqa: E731
    t = tree({"fk/platforms/__init__.py": "raise RuntimeError('probes the driver')\n",
              "fk/kernel.py": "from fk.platforms import is_rocm\nROCM = is_rocm()\n",
              "fk/broken.py": "raise ValueError('upstream bug at import')\n"}, probes={"fk.platforms": probe})
    assert t.load("fk.kernel").ROCM is False
    with pytest.raises(ab.Unsupported, match="broken.py failed to load: ValueError: upstream bug at import"):
        t.load("fk.broken")
    with pytest.raises(ab.Unsupported, match="lacks fk/absent.py"):
        t.load("fk.absent")


def test_a_kernel_file_stood_in_as_a_dependency_is_loaded_strictly_later(tree):
    t = tree({"fk/kernel.py": "import attncheck_no_such_package_xyz\ndef run():\n    return 1\n",
              "fk/user.py": "from fk.kernel import run\n"})
    t.load("fk.user")  # fk.kernel fails as a dependency: stood in
    assert "attncheck_no_such_package_xyz" in t.stood_in["fk.kernel"]
    with pytest.raises(ab.Unsupported, match="kernel.py failed to load: ModuleNotFoundError"):
        t.load("fk.kernel")
