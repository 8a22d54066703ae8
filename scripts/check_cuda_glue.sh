#!/usr/bin/env bash
# Syntax-checks the torch glue of the CUDA kernels (csrc/**/*_cuda.cpp) on a machine without a GPU or a CUDA
# torch: g++ -fsyntax-only against the installed (CPU) torch's headers, which include c10/cuda and
# ATen/cuda, and the CUDA toolkit's headers, with the flags setup.py uses for a CUDA build (C++20,
# -DFLASHMAP_WITH_CUDA). Part of `make cuda-check`, so every CUDA-side file is compiled in CI.
#   usage: scripts/check_cuda_glue.sh [PYTHON]    (PYTHON: the interpreter whose torch to use)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
CUDA_HOME=$(scripts/cuda_home.sh)
mapfile -t torch_inc < <("$PY" -c "from torch.utils.cpp_extension import include_paths
print('\n'.join(include_paths()))" 2>/dev/null)
[ "${#torch_inc[@]}" -gt 0 ] || { echo "check_cuda_glue: $PY cannot import torch" >&2; exit 1; }
flags=(-fsyntax-only -std=c++20 -fopenmp -DFLASHMAP_WITH_CUDA -DTORCH_EXTENSION_NAME=_C -Icsrc
       -DC10_CUDA_NO_CMAKE_CONFIGURE_FILE  # a CPU torch lacks the generated c10/cuda/impl/cuda_cmake_macros.h
       "${torch_inc[@]/#/-I}" "-I$CUDA_HOME/include")
mapfile -t glue < <(find csrc -name '*_cuda.cpp' | sort)
[ "${#glue[@]}" -gt 0 ] || { echo "check_cuda_glue: no csrc/**/*_cuda.cpp found" >&2; exit 1; }
for f in "${glue[@]}"; do
  "${CXX:-c++}" "${flags[@]}" "$f"
  echo "glue ok: $f"
done
