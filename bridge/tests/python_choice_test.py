"""The bridge embeds exactly the interpreter a build directory was last configured with (issue 26).

Configures the project in a scratch directory the way the README's order does on a machine with
another python3 first on PATH (pyenv, conda): first with that one found on PATH, then again with
-DPython3_EXECUTABLE=<wanted>. FindPython used to keep the first interpreter's headers and
libpython; the bridge then loaded one installation's libpython with the other's standard library.
The cached headers and libpython must now be the wanted interpreter's own (its sysconfig).

    python_choice_test.py CMAKE SOURCE_DIR SCRATCH_DIR WANTED_PYTHON

Exit 77 (skipped) when this machine has no second interpreter with its own headers.
"""
import glob
import os
import shutil
import subprocess
import sys


def own_paths(python):
    """(include dir, libpython) as the interpreter itself reports them, real paths."""
    code = (
        "import os, sysconfig as s\n"
        "print(s.get_paths()['include'])\n"
        "print(os.path.join(s.get_config_var('LIBDIR') or '', s.get_config_var('LDLIBRARY') or ''))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    include, library = out.stdout.splitlines()[:2]
    return os.path.realpath(include), os.path.realpath(library)


def candidates():
    seen = set()
    paths = []
    for d in os.environ.get("PATH", "").split(os.pathsep):
        paths.append(os.path.join(d, "python3"))
    paths += glob.glob(os.path.expanduser("~/.pyenv/versions/*/bin/python3"))
    paths += ["/opt/conda/bin/python3", "/usr/local/bin/python3"]
    if os.environ.get("CONDA_PREFIX"):
        paths.append(os.path.join(os.environ["CONDA_PREFIX"], "bin", "python3"))
    for p in paths:
        if os.path.isfile(p) and os.access(p, os.X_OK) and p not in seen:
            seen.add(p)
            yield p


def other_interpreter(wanted):
    """A python3 whose headers and libpython are not `wanted`'s (same minor version first)."""
    want_inc, want_lib = own_paths(wanted)
    found = []
    for p in candidates():
        try:
            inc, lib = own_paths(p)
            ver = subprocess.run([p, "-c", "import sys; print(sys.version_info[:2])"],
                                 capture_output=True, text=True, check=True).stdout
        except (subprocess.CalledProcessError, OSError, ValueError):
            continue
        if inc != want_inc and os.path.exists(os.path.join(inc, "Python.h")) and os.path.exists(lib):
            found.append((p, ver))
    want_ver = subprocess.run([wanted, "-c", "import sys; print(sys.version_info[:2])"],
                              capture_output=True, text=True, check=True).stdout
    found.sort(key=lambda pv: pv[1] != want_ver)
    return found[0][0] if found else None


def cache_value(build, name):
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split("=", 1)[1].strip()
    return None


def configure(cmake, source, build, env, extra):
    cmd = [cmake, "-S", source, "-B", build, "-G", "Ninja", "-DATTNCHECK_CUDA=OFF",
           "-DATTNCHECK_ROCM=OFF", "-DATTNCHECK_BENCH=OFF"] + extra
    return subprocess.run(cmd, env=env, capture_output=True, text=True)


def main():
    cmake, source, scratch, wanted = sys.argv[1:5]
    other = other_interpreter(wanted)
    if other is None:
        print("skipped: no second python3 with its own headers and libpython on this machine")
        return 77
    build = os.path.join(scratch, "build")
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    # First configure: the other interpreter is the first python3 on PATH, as with pyenv/conda.
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(other) + os.pathsep + env.get("PATH", "")
    first = configure(cmake, source, build, env, [])
    if first.returncode != 0:
        print(first.stdout + first.stderr)
        return 1
    first_inc = cache_value(build, "_Python3_INCLUDE_DIR")
    print(f"first configure (python3 on PATH: {other}): headers {first_inc}")
    # Second configure: the wanted interpreter, named explicitly (what ci/test does).
    second = configure(cmake, source, build, env, [f"-DPython3_EXECUTABLE={wanted}"])
    if second.returncode != 0:
        print(second.stdout + second.stderr)
        return 1
    want_inc, want_lib = own_paths(wanted)
    inc = os.path.realpath(cache_value(build, "_Python3_INCLUDE_DIR") or "")
    lib = os.path.realpath(cache_value(build, "_Python3_LIBRARY_RELEASE") or "")
    print(f"second configure (-DPython3_EXECUTABLE={wanted}): headers {inc}, libpython {lib}")
    ok = inc == want_inc and lib == want_lib
    if not ok:
        print(f"FAILED: {wanted}'s own headers are {want_inc}, its libpython {want_lib}")
    shutil.rmtree(scratch, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
