#!/usr/bin/env bash
# Prints the CUDA toolkit root (the folder whose bin/ holds the real nvcc and whose lib64/ holds libcudart).
# `nvcc` on PATH may be a wrapper script, so torch's own guess (the wrapper's parent) can be wrong.
set -euo pipefail
if [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then echo "$CUDA_HOME"; exit 0; fi
for d in /usr/local/cuda /usr/local/cuda-*; do
  if [ -x "$d/bin/nvcc" ] && [ ! -L "$d/bin/nvcc" ] && head -c 4 "$d/bin/nvcc" | grep -q ELF; then echo "$d"; exit 0; fi
done
n=$(command -v nvcc || true)
[ -n "$n" ] || exit 1
real=$(grep -o '/[^ "]*/bin/nvcc' "$n" 2>/dev/null | head -n1 || true)
[ -n "$real" ] || real=$(readlink -f "$n")
dirname "$(dirname "$real")"
