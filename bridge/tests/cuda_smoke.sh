#!/usr/bin/env bash
# The bridge's cuda path on a GPU host that lacks attncheck's build dependencies: builds
# libattncheck_pybridge.so and tests/cuda_smoke.cpp with g++ against the python3 on PATH (the one
# holding torch), then runs the smoke driver with tests/adapters/torch_cuda.py.
#   bridge/tests/cuda_smoke.sh [build dir, default /tmp/pybridge-cuda-smoke]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-/tmp/pybridge-cuda-smoke}
mkdir -p "$out/inc/dlpack"
py=$(command -v python3)
exe='' inc='' libdir='' ver='' torch_inc=''
eval "$("$py" - <<'PY'
import os, sys, sysconfig
v = sysconfig.get_config_var
print(f"exe='{sys.executable}' inc='{sysconfig.get_paths()['include']}' libdir='{v('LIBDIR')}' ver='{v('LDVERSION')}'")
try:
    import torch
    print(f"torch_inc='{os.path.join(os.path.dirname(torch.__file__), 'include')}'")
except ImportError:
    print("torch_inc=''")
PY
)"
# dlpack/dlpack.h: the system's, else torch's copy.
if ! echo '#include <dlpack/dlpack.h>' | g++ -x c++ -fsyntax-only - 2>/dev/null; then
  if [ -f "$torch_inc/dlpack/dlpack.h" ]; then cp "$torch_inc/dlpack/dlpack.h" "$out/inc/dlpack/"
  else cp "$torch_inc/ATen/dlpack.h" "$out/inc/dlpack/dlpack.h"; fi
fi
echo "python $exe (libpython$ver in $libdir)"
g++ -std=c++20 -O2 -fPIC -shared -fvisibility=hidden -Wall -Wextra \
  -I"$here" -I"$here/../kernels_under_test" -I"$out/inc" -I"$inc" \
  -DATTNCHECK_BRIDGE_PYTHON_DIR="\"$here/python\"" -DATTNCHECK_BRIDGE_ADAPTERS_DIR="\"$here/adapters\"" \
  -DATTNCHECK_PYTHON_EXECUTABLE="\"$exe\"" \
  "$here/pybridge.cpp" -o "$out/libattncheck_pybridge.so" -L"$libdir" -lpython"$ver" -ldl -Wl,-rpath,"$libdir"
g++ -std=c++20 -O2 -Wall -I"$here" -I"$here/../kernels_under_test" -I"$out/inc" \
  "$here/tests/cuda_smoke.cpp" -o "$out/pybridge_cuda_smoke" -ldl
PYTHONPATH="$here/tests/adapters${PYTHONPATH:+:$PYTHONPATH}" ATTNCHECK_PY_ADAPTER=torch_cuda \
  "$out/pybridge_cuda_smoke" "$out/libattncheck_pybridge.so"
