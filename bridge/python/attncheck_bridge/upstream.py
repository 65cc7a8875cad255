"""One loader for upstream source trees (vLLM, AITER) whose package import fails on a bare GPU host
(no compiled extensions): the kernel file and the pure-Python modules it imports are executed,
unmodified, from the tree; stand-ins take the place only of what cannot load (docs/bridge.md
"Loading upstream source trees").

``Tree(project, roots, root, probes)`` is a meta-path finder for the top-level packages ``roots``:

- a module whose file is in the tree is executed from it; if executing it fails (a compiled
  extension or a missing third-party package somewhere below it), it becomes a stand-in that
  records why;
- a package's ``__init__.py`` is not executed (both projects load their compiled extensions and
  re-export eagerly there); a name taken from a package is its submodule, or a stand-in;
- a module with no file in the tree (absent from a slim tree, or a compiled extension ``*.so``) is
  a stand-in saying so;
- ``probes`` (name -> factory) are the platform probes that must answer for this process's device
  (vllm.platforms, aiter.dtypes, ...): modules built here, with real answers.

Stand-ins are permissive so that module-level code runs (import, subclass, subscript, call,
decorate); using one as a *value* (truth, number, arithmetic, iteration, length) raises
``StandInUsed``, an ``Unsupported`` naming the stood-in module and why it is one: an entry whose
kernel needs a stand-in's value is reported unsupported, naming the module, never judged on it.

The kernel module itself is loaded strictly (``Tree.load``): any failure executing it is an
``Unsupported`` naming the file and the error.
"""

import builtins
import logging
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

from attncheck_bridge import Unsupported


class StandInUsed(Unsupported):
    """A stood-in upstream name was used as a value."""


def _used(name, why, what):
    raise StandInUsed(f"{name} is a stand-in ({why}) and was used as a {what}")


def _raiser(what):
    def method(self, *args):
        return _used(self._standin_name, self._standin_why, what)

    return method


_VALUE_USES = {
    "__bool__": "truth value", "__int__": "number", "__index__": "number", "__float__": "number",
    "__iter__": "sequence", "__len__": "sequence", "__add__": "number", "__radd__": "number",
    "__sub__": "number", "__rsub__": "number", "__mul__": "number", "__rmul__": "number",
    "__truediv__": "number", "__floordiv__": "number", "__mod__": "number", "__neg__": "number",
    "__lt__": "number", "__le__": "number", "__gt__": "number", "__ge__": "number",
}


class _StandInMeta(type):
    """Metaclass of stand-in classes. Only the stand-ins themselves (``_standin_root``) are
    permissive; classes an upstream file derives from them behave normally."""

    def _root(cls):
        return "_standin_root" in cls.__dict__

    def __getattr__(cls, attr):
        if attr.startswith("__") or not cls._root():
            raise AttributeError(attr)
        return standin_class(f"{cls._standin_name}.{attr}", cls._standin_why)

    def __getitem__(cls, item):
        return cls

    def __call__(cls, *args, **kwargs):
        if cls._root():
            return _StandInObject(f"{cls._standin_name}(...)", cls._standin_why)
        return super().__call__(*args, **kwargs)

    def __or__(cls, other):
        return cls

    __ror__ = __or__


def _meta_raiser(what):
    def method(cls, *args):
        if cls._root():
            return _used(cls._standin_name, cls._standin_why, what)
        raise TypeError(f"class {cls.__name__} used as a {what}")

    return method


for _dunder, _what in _VALUE_USES.items():
    if _dunder != "__bool__":
        setattr(_StandInMeta, _dunder, _meta_raiser(_what))
_StandInMeta.__bool__ = lambda cls: _used(cls._standin_name, cls._standin_why, "truth value") if cls._root() else True


def standin_class(name, why):
    return _StandInMeta(name.rpartition(".")[2] or name, (), {
        "_standin_root": True, "_standin_name": name, "_standin_why": why, "__module__": "upstream_stand_in"})


class _StandInObject:
    """What calling a stand-in returns: permissive in every use but as a value."""

    __slots__ = ("_standin_name", "_standin_why")

    def __init__(self, name, why):
        object.__setattr__(self, "_standin_name", name)
        object.__setattr__(self, "_standin_why", why)

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return standin_class(f"{self._standin_name}.{attr}", self._standin_why)

    def __call__(self, *args, **kwargs):
        return _StandInObject(f"{self._standin_name}(...)", self._standin_why)

    def __getitem__(self, key):
        return self

    def __mro_entries__(self, bases):
        return (standin_class(self._standin_name, self._standin_why),)

    def __or__(self, other):
        return self

    __ror__ = __or__

    def __repr__(self):
        return f"<stand-in {self._standin_name}>"


for _dunder, _what in _VALUE_USES.items():
    setattr(_StandInObject, _dunder, _raiser(_what))


class StandInModule(types.ModuleType):
    """A module that could not be loaded; ``__attncheck_standin__`` says why."""

    def __init__(self, name, why):
        super().__init__(name)
        self.__attncheck_standin__ = why

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        value = standin_class(f"{self.__name__}.{attr}", f"module {self.__name__}: {self.__attncheck_standin__}")
        setattr(self, attr, value)
        return value


class _Package(types.ModuleType):
    """A package of the tree, its __init__.py not executed: names are its submodules (or stand-ins)."""

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return importlib.import_module(f"{self.__name__}.{attr}")


class _FileLoader(importlib.machinery.SourceFileLoader):
    """Executes a tree file; a failure makes the module a stand-in, except for the modules the
    tree loads strictly (the kernel files). ``import_hook`` replaces the file's __import__."""

    def __init__(self, tree, fullname, path, import_hook=None):
        super().__init__(fullname, path)
        self.tree, self.import_hook = tree, import_hook

    def exec_module(self, module):
        if self.import_hook is not None:
            # exec() takes builtins from the module's globals: the file's imports, and those of the
            # functions it defines, go through the hook.
            module.__dict__["__builtins__"] = dict(builtins.__dict__, __import__=self.import_hook)
        try:
            super().exec_module(module)
        except Exception as e:
            if module.__name__ in self.tree.strict:
                raise
            why = f"executing {self.path} failed: {type(e).__name__}: {e}"
            keep = {k: module.__dict__[k] for k in ("__name__", "__spec__", "__loader__", "__file__")
                    if k in module.__dict__}
            module.__dict__.clear()
            module.__dict__.update(keep)
            module.__class__ = StandInModule
            module.__attncheck_standin__ = why
            self.tree.note(module.__name__, why)


class Tree(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The finder for ``roots`` (top-level package names) over ``root`` (a directory, or None: every
    module is a stand-in but the files loaded with ``exec_file``)."""

    def __init__(self, project, roots, root, probes=None, say=None):
        self.project, self.roots, self.root = project, tuple(roots), root
        self.probes = probes if probes is not None else {}
        self.strict = set()
        self.stood_in = {}  # module -> why
        self._say = say or (lambda msg: print(f"{project}: {msg}", file=sys.stderr))

    # -- installing ---------------------------------------------------------------------------
    def install(self):
        """First on sys.meta_path; every module of ``roots`` imported before is forgotten."""
        self.purge()
        for f in [f for f in sys.meta_path if isinstance(f, Tree) and set(f.roots) & set(self.roots)]:
            sys.meta_path.remove(f)
        sys.meta_path.insert(0, self)
        return self

    def uninstall(self):
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        self.purge()

    def purge(self):
        for name in [m for m in sys.modules if m.split(".")[0] in self.roots]:
            del sys.modules[name]

    def note(self, name, why):
        if name not in self.stood_in:
            self.stood_in[name] = why
            self._say(f"stand-in {name}: {why}")

    # -- the finder ---------------------------------------------------------------------------
    def _path(self, fullname):
        return os.path.join(self.root, *fullname.split(".")) if self.root else None

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.roots:
            return None
        rel = self._path(fullname)
        if fullname in self.probes:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=bool(rel and os.path.isdir(rel)))
        if rel and os.path.isdir(rel):
            spec = importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            spec.submodule_search_locations = [rel]
            return spec
        if rel and os.path.isfile(rel + ".py"):
            return importlib.util.spec_from_file_location(
                fullname, rel + ".py", loader=_FileLoader(self, fullname, rel + ".py"))
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def _why_missing(self, fullname):
        rel = self._path(fullname)
        if rel is None:
            return f"only single files of {self.project} are loaded"
        parent = os.path.dirname(rel)
        base = os.path.basename(rel)
        if os.path.isdir(parent) and any(n.startswith(base + ".") and n.endswith((".so", ".pyd"))
                                         for n in os.listdir(parent)):
            return "a compiled extension"
        return f"not in the tree {self.root}"

    def create_module(self, spec):
        name = spec.name
        if name in self.probes:
            mod = self.probes[name](name)
            self.note(name, getattr(mod, "__attncheck_standin__", "platform probe, answered for this device"))
        elif spec.submodule_search_locations and spec.submodule_search_locations != [] and \
                self.root and os.path.isdir(spec.submodule_search_locations[0]):
            mod = _Package(name)
        else:
            why = self._why_missing(name)
            mod = StandInModule(name, why)
            self.note(name, why)
        mod.__path__ = list(spec.submodule_search_locations or [])
        return mod

    def exec_module(self, module):
        pass

    # -- loading the kernel modules -----------------------------------------------------------
    def load(self, modname):
        """Module ``modname`` executed strictly from the tree; Unsupported naming the file and the
        error when it is missing or fails."""
        rel = self._path(modname)
        if not (rel and os.path.isfile(rel + ".py")):
            raise Unsupported(f"{self.project} tree {self.root} lacks {modname.replace('.', '/')}.py")
        self.strict.add(modname)
        if isinstance(sys.modules.get(modname), StandInModule):
            # Imported before as another module's dependency and stood in: execute it again, strictly
            # (a stand-in's functions would "run" without computing anything).
            del sys.modules[modname]
        try:
            return importlib.import_module(modname)
        except Exception as e:  # noqa: BLE001 - any failure declines the entry, naming it
            sys.modules.pop(modname, None)
            raise Unsupported(f"{rel}.py failed to load: {type(e).__name__}: {e}") from e

    def exec_file(self, modname, path, import_hook=None):
        """The file ``path`` executed strictly as module ``modname`` (its imports through this
        tree); ``import_hook`` replaces the file's own __import__."""
        existing = sys.modules.get(modname)
        if existing is not None and getattr(existing, "__file__", None) == path and import_hook is None:
            return existing
        self.strict.add(modname)
        loader = _FileLoader(self, modname, path, import_hook)
        spec = importlib.util.spec_from_file_location(modname, path, loader=loader)
        mod = importlib.util.module_from_spec(spec)
        parent = modname.rpartition(".")[0]
        if parent.split(".")[0] in self.roots:
            importlib.import_module(parent)
        sys.modules[modname] = mod
        try:
            loader.exec_module(mod)
        except Exception as e:
            del sys.modules[modname]
            raise Unsupported(f"{path}: executing it failed: {type(e).__name__}: {e}") from e
        return mod


class ModuleView(types.ModuleType):
    """``mod`` with some attributes answered differently (a view one file's imports see)."""

    def __init__(self, mod, **overrides):
        super().__init__(mod.__name__)
        self.__dict__.update(overrides)
        self._mod = mod

    def __getattr__(self, name):
        return getattr(self._mod, name)


def probe_module(name, why, **attrs):
    """A platform probe's module with real answers ``attrs``; its other names are stand-ins."""
    mod = StandInModule(name, why)
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


# ------------------------------------------------------------------------------------------------
# vLLM's platform probes (docs/adapters/vllm.md "Stand-ins"): the answers its kernel files ask for.


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def gcn_arch():
    torch = _torch()
    if torch is None or getattr(torch.version, "hip", None) is None:
        return ""
    return str(torch.cuda.get_device_properties(0).gcnArchName)


class VllmPlatform:
    """vllm.platforms.current_platform's answers for a process whose GPU torch drives."""

    device_type = "cuda"

    def is_rocm(self):
        torch = _torch()
        return torch is not None and getattr(torch.version, "hip", None) is not None

    def is_cuda(self):
        torch = _torch()
        return torch is not None and getattr(torch.version, "cuda", None) is not None and not self.is_rocm()

    def is_cuda_alike(self):
        return self.is_cuda() or self.is_rocm()

    def is_xpu(self):
        return False

    def is_cpu(self):
        return False

    def is_tpu(self):
        return False

    def is_fp8_fnuz(self):
        return self.is_rocm() and gcn_arch().startswith("gfx94")

    def fp8_dtype(self):
        torch = _torch()
        if torch is None:
            raise RuntimeError("current_platform.fp8_dtype() needs torch")
        return torch.float8_e4m3fnuz if self.is_fp8_fnuz() else torch.float8_e4m3fn

    def get_device_capability(self, device_id=0):
        major, minor = _torch().cuda.get_device_capability(device_id)
        return types.SimpleNamespace(major=major, minor=minor, to_int=lambda: major * 10 + minor)

    def has_device_capability(self, capability, device_id=0):
        major, minor = _torch().cuda.get_device_capability(device_id)
        want = capability if isinstance(capability, int) else capability[0] * 10 + capability[1]
        return major * 10 + minor >= want

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return standin_class(f"vllm.platforms.current_platform.{attr}", "platform probe: no answer for it")


def _vllm_platforms(name):
    return probe_module(name, "platform probe: current_platform answers for this device", current_platform=VllmPlatform())


def _vllm_platforms_rocm(name):
    arch = gcn_arch()
    return probe_module(name, "platform probe: _ON_GFX* from the device's gcnArchName",
                        _ON_GFX9=arch.startswith(("gfx90a", "gfx942", "gfx950")),
                        _ON_GFX942=arch.startswith("gfx942"), _ON_GFX950=arch.startswith("gfx950"))


def _vllm_triton_utils(name):
    import triton
    import triton.language as tl

    return probe_module(name, "probe of Triton: the installed triton", triton=triton, tl=tl, HAS_TRITON=True)


class _OnceLogger(logging.LoggerAdapter):
    """vLLM's logger methods that log a message once per process."""

    _seen = set()

    def process(self, msg, kwargs):
        kwargs.pop("scope", None)
        return msg, kwargs

    def _once(self, level, msg, *args, **kwargs):
        key = (level, msg, args)
        if key not in self._seen:
            self._seen.add(key)
            self.log(level, msg, *args, **kwargs)

    def debug_once(self, msg, *args, **kwargs):
        self._once(logging.DEBUG, msg, *args, **kwargs)

    def info_once(self, msg, *args, **kwargs):
        self._once(logging.INFO, msg, *args, **kwargs)

    def warning_once(self, msg, *args, **kwargs):
        self._once(logging.WARNING, msg, *args, **kwargs)


def _vllm_logger(name):
    return probe_module(name, "vLLM's logger configures the process's logging at import: a plain logging logger",
                        init_logger=lambda logger_name: _OnceLogger(logging.getLogger(logger_name), {}))


VLLM_PROBES = {
    "vllm.platforms": _vllm_platforms,
    "vllm.platforms.rocm": _vllm_platforms_rocm,
    "vllm.triton_utils": _vllm_triton_utils,
    "vllm.logger": _vllm_logger,
}


class _RocmView:
    """A platform answering is_rocm() True and everything else as ``platform`` does."""

    def __init__(self, platform):
        self._platform = platform

    def is_rocm(self):
        return True

    def __getattr__(self, name):
        return getattr(self._platform, name)


def rocm_view_import(name, globals=None, locals=None, fromlist=(), level=0):
    """An __import__ under which ``from vllm.platforms import current_platform`` answers is_rocm()
    True (one file's view; nothing else sees it)."""
    mod = builtins.__import__(name, globals, locals, fromlist, level)
    if level == 0 and name == "vllm.platforms" and fromlist and "current_platform" in fromlist:
        return ModuleView(mod, current_platform=_RocmView(mod.current_platform))
    return mod


# ------------------------------------------------------------------------------------------------
# AITER (ROCm/aiter) from ATTNCHECK_AITER_SRC (docs/adapters/aiter.md "AITER's Triton kernels").
# The package is never imported as a whole: aiter/__init__.py loads (and may JIT-build) the HIP
# extension. Its platform probes answer for this device; off ROCm its Gluon modules are AMD-only.

AMD_LAUNCH_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")
AITER_ROOTS = ("aiter", "op_tests")


def _say_aiter(msg):
    print(f"aiter_triton: {msg}", file=sys.stderr)


def on_rocm():
    return getattr(_torch().version, "hip", None) is not None


def device_arch():
    """gcnArchName's gfx part under ROCm, ``sm_XY`` on NVIDIA."""
    torch = _torch()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    if on_rocm():
        return props.gcnArchName.split(":")[0]
    return f"sm_{props.major}{props.minor}"


def platform_fp8():
    """aiter.dtypes.fp8's choice: e4m3fnuz on gfx942 (MI300), e4m3fn elsewhere."""
    return "e4m3fnuz" if device_arch() == "gfx942" else "e4m3fn"


class AmdOnlyUsed(StandInUsed):
    pass


class _AmdOnly:
    """An attribute of a stood-in AMD-only module: importable, unusable (calling or launching it
    raises: a silent stand-in launch would leave outputs unwritten)."""

    def __init__(self, name):
        self._name = name

    def _fail(self, *a, **k):
        raise AmdOnlyUsed(f"{self._name} is an AMD-only Gluon kernel (stood in off ROCm)")

    __call__ = __getitem__ = _fail

    def __getattr__(self, attr):
        return _AmdOnly(f"{self._name}.{attr}")


def _aiter_dtypes(name):
    torch = _torch()
    fp8 = torch.float8_e4m3fnuz if platform_fp8() == "e4m3fnuz" else torch.float8_e4m3fn
    return probe_module(name, "fp8 = the platform's fp8 (aiter/utility/dtypes.py picks it per gfx arch)",
                        fp8=fp8, bf16=torch.bfloat16, fp16=torch.float16, fp32=torch.float32,
                        i32=torch.int32, i8=torch.int8, u8=torch.uint8)


def _aiter_chip_info(name):
    def get_cu_num():
        torch = _torch()
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count

    return probe_module(name, "get_gfx() = the device's arch, get_cu_num() = its multiprocessor count "
                        "(AITER runs rocminfo)", get_gfx=device_arch, get_gfx_runtime=device_arch, get_cu_num=get_cu_num)


def _gluon_module(name):
    mod = types.ModuleType(name)
    mod.__attncheck_standin__ = "AMD-only Gluon kernels, stood in off ROCm"
    mod.__getattr__ = lambda attr: _AmdOnly(f"{name}.{attr}")
    return mod


class _AiterProbes(dict):
    """The AITER probes: two modules by name, and off ROCm every Gluon module."""

    def __init__(self):
        super().__init__({"aiter.dtypes": _aiter_dtypes, "aiter.jit.utils.chip_info": _aiter_chip_info})

    @staticmethod
    def _gluon(name):
        return name.startswith(("aiter.ops.triton.gluon.", "aiter.ops.triton._gluon_kernels.")) and not on_rocm()

    def __contains__(self, name):
        return super().__contains__(name) or self._gluon(name)

    def __getitem__(self, name):
        return _gluon_module if not super().__contains__(name) and self._gluon(name) else super().__getitem__(name)


_aiter = {"tree": None, "loaded": {}}


def aiter_root():
    """The tree ATTNCHECK_AITER_SRC names; Unsupported naming the problem when there is none."""
    src = os.environ.get("ATTNCHECK_AITER_SRC")
    if not src:
        raise Unsupported("ATTNCHECK_AITER_SRC is not set: point it at an AITER checkout or a tree holding its files")
    src = os.path.abspath(src)
    if not os.path.isdir(os.path.join(src, "aiter")):
        raise Unsupported(f"ATTNCHECK_AITER_SRC={src} holds no aiter/ folder")
    return src


def _aiter_tree(root):
    t = _aiter["tree"]
    if t is None or t.root != root:
        if t is not None:
            t.uninstall()
        t = Tree("aiter_triton", AITER_ROOTS, root, probes=_AiterProbes(), say=_say_aiter).install()
        _aiter["tree"], _aiter["loaded"] = t, {}
        if "pytest" not in sys.modules and importlib.util.find_spec("pytest") is None:
            sys.modules["pytest"] = _PytestStandIn("pytest")
            _say_aiter("stand-in pytest: the op_tests files only decorate with it")
    return t


class _PytestStandIn(types.ModuleType):
    """pytest.mark.<anything>(...) as a no-op decorator, for module-level code of op_tests files."""

    def __getattr__(self, attr):
        return _Decorator()


class _Decorator:
    def __getattr__(self, attr):
        return _Decorator()

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _Decorator()


def _drop_amd_options(kernel, where):
    """Makes ``kernel[grid](...)`` drop the AMD backend's options (off ROCm only). Triton's
    ``kernel[grid]`` calls ``self.run``, so the instance gets a ``run`` of its own; the object stays
    the JITFunction it was, so kernels that call it as a device function compile unchanged."""
    original = kernel.run
    told = []

    def run(*args, **kwargs):
        gone = [k for k in AMD_LAUNCH_OPTIONS if k in kwargs]
        for k in gone:
            del kwargs[k]
        if gone and not told:
            told.append(True)
            _say_aiter(f"{where}: AMD launch options {', '.join(gone)} dropped (unknown to Triton's NVIDIA backend)")
        return original(*args, **kwargs)

    kernel.run = run


def _shim_launch_options(mod):
    if on_rocm():
        return
    from triton.runtime.jit import KernelInterface

    for name, value in list(vars(mod).items()):
        if isinstance(value, KernelInterface) and "run" not in vars(value):
            _drop_amd_options(value, f"{mod.__name__}.{name}")


def aiter_load(modname, fn_name):
    """``fn_name`` of AITER module ``modname`` from ATTNCHECK_AITER_SRC; Unsupported with one line
    naming the file and the error when the tree lacks it or it fails to load."""
    root = aiter_root()
    tree = _aiter_tree(root)
    key = (modname, fn_name)
    if key in _aiter["loaded"]:
        return _aiter["loaded"][key]
    path = os.path.join(root, *modname.split(".")) + ".py"
    if not os.path.isfile(path):
        raise Unsupported(f"ATTNCHECK_AITER_SRC={root} lacks {os.path.relpath(path, root)}")
    mod = tree.load(modname)
    if modname.startswith("aiter."):
        _shim_launch_options(mod)
    fn = getattr(mod, fn_name, None)
    if fn is None:
        raise Unsupported(f"{os.path.relpath(path, root)} defines no {fn_name}")
    _aiter["loaded"][key] = fn
    _say_aiter(f"{fn_name} <- {path}")
    return fn


def aiter_reset():
    """Forgets the AITER tree and everything loaded from it (tests)."""
    if _aiter["tree"] is not None:
        _aiter["tree"].uninstall()
    _aiter["tree"], _aiter["loaded"] = None, {}


# ------------------------------------------------------------------------------------------------
# Where vLLM comes from (docs/adapters/vllm.md "Where vLLM comes from").

_vllm = {"tree": None, "why": ""}  # the Tree in force; why a checkout's import failed


def vllm_reset():
    """Forgets the vLLM tree and every vllm module (tests)."""
    if _vllm["tree"] is not None:
        _vllm["tree"].uninstall()
    _vllm["tree"], _vllm["why"] = None, ""
    _purge_vllm()


def _purge_vllm():
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]


def _vllm_tree(root):
    """The loader over ``root`` (None: single files, every vllm module stood in), installed."""
    t = _vllm["tree"]
    if t is None or t.root != root:
        if t is not None:
            t.uninstall()
        t = Tree("vllm_triton", ("vllm",), root, probes=VLLM_PROBES).install()
        _vllm["tree"] = t
    return t


def _checkout_import(src, candidates, errors):
    """A full checkout's normal import (vLLM built there); None when it fails (then loaded from
    the tree)."""
    if src not in sys.path:
        sys.path.insert(0, src)
    for modname, _, fn in candidates:
        try:
            mod = importlib.import_module(modname)
        except Exception as e:  # noqa: BLE001 - dependencies missing: load from the tree
            errors.append(f"{modname}: {type(e).__name__}: {e}")
            continue
        if not os.path.abspath(mod.__file__).startswith(src + os.sep):
            errors.append(f"{modname} came from {mod.__file__}, not from {src}")
            continue
        return mod, fn
    _vllm["why"] = "; ".join(errors)
    _purge_vllm()
    return None


def vllm_load(candidates, single_file=False):
    """(function, module, description) of the first of ``candidates`` ((module name, repository
    path, function) each) that vLLM gives, from (first match wins) ATTNCHECK_VLLM_SRC exclusively
    (a full checkout's import, else the tree through this loader), an installed vllm, or
    ATTNCHECK_VLLM_FILE when ``single_file``; Unsupported with the reason when none does."""
    src = os.environ.get("ATTNCHECK_VLLM_SRC")
    errors = []
    if src:
        src = os.path.abspath(src)
        if not os.path.isdir(src):
            raise Unsupported(f"ATTNCHECK_VLLM_SRC={src} is not a directory")
        if os.path.isfile(os.path.join(src, "vllm", "__init__.py")) and _vllm["tree"] is None:
            got = _checkout_import(src, candidates, errors)
            if got is not None:
                mod, fn = got
                return _vllm_function(mod, fn, f"{mod.__name__} ({mod.__file__}, checkout import)")
        for modname, relpath, fn in candidates:
            path = os.path.join(src, relpath)
            if os.path.isfile(path):
                mod = _vllm_tree(src).load(modname)
                why = f"; checkout import failed: {_vllm['why']}" if _vllm["why"] else ""
                return _vllm_function(mod, fn, f"{path} (from the tree, its pure-Python imports "
                                 f"executed, stand-ins named on stderr{why})")
        raise Unsupported(
            f"ATTNCHECK_VLLM_SRC={src} holds none of "
            + ", ".join(r for _, r, _ in candidates)
            + (f" ({'; '.join(errors)})" if errors else "")
        )
    for modname, _, fn in candidates:
        try:
            mod = importlib.import_module(modname)
        except Exception as e:  # noqa: BLE001 - any import failure: try the next module path
            errors.append(f"{modname}: {type(e).__name__}: {e}")
            continue
        return _vllm_function(mod, fn, f"{modname} ({mod.__file__}, installed vllm)")
    path = os.environ.get("ATTNCHECK_VLLM_FILE")
    if path and single_file:
        if not os.path.isfile(path):
            raise Unsupported(f"ATTNCHECK_VLLM_FILE={path} is not a file")
        mod = _vllm_tree(None).exec_file("vllm_triton_reshape_and_cache_flash", path)
        return _vllm_function(mod, candidates[0][2], f"{path} (standalone, vLLM stand-ins)")
    raise Unsupported(
        "vLLM not found: set ATTNCHECK_VLLM_SRC to a checkout or a partial tree"
        + (" or ATTNCHECK_VLLM_FILE to triton_reshape_and_cache_flash.py" if single_file else "")
        + " (" + "; ".join(errors) + ")"
    )


def _vllm_function(mod, fn_name, description):
    fn = getattr(mod, fn_name, None)
    if fn is None and _guarded_by_rocm(mod):
        # Off ROCm the file is executed a second time with is_rocm() answering True for its own
        # import of current_platform (the Triton kernel itself is portable).
        tree = _vllm["tree"] or Tree("vllm_triton", ("vllm",), None)
        mod = tree.exec_file("_attncheck_rocm_view_" + mod.__name__.replace(".", "_"), mod.__file__,
                             import_hook=rocm_view_import)
        fn = getattr(mod, fn_name, None)
        description += "; ROCm-guarded definitions loaded with is_rocm() answering True"
    if fn is None:
        raise Unsupported(f"{description} defines no {fn_name}")
    return fn, mod, description


def _guarded_by_rocm(mod):
    try:
        with open(mod.__file__) as f:
            return "current_platform.is_rocm()" in f.read()
    except (OSError, TypeError):
        return False


