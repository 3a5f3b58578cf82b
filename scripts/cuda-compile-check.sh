#!/usr/bin/env bash
# Compiles CUDA backend sources alone, with the flags the build gives them, to catch errors
# (and CUDA tests) without a full build; no GPU needed.
# Usage: scripts/cuda-compile-check.sh src/backend/cuda/x.cu tests/cuda/test_cuda_x.cpp ...
set -euo pipefail
cd "$(dirname "$0")/.."
for f in "$@"; do
  case "$f" in
    *.cu) /usr/local/cuda/bin/nvcc -std=c++20 --expt-relaxed-constexpr -O3 -gencode=arch=compute_90,code=sm_90 \
            -Isrc -Iinclude -Xcompiler -Wall -c "$f" -o /tmp/cuda-check-$$.o ;;
    *) g++ -std=c++20 -O2 -Wall -Wno-unknown-pragmas -Isrc -Iinclude -Itests -I/usr/local/cuda/include -c "$f" -o /tmp/cuda-check-$$.o ;;
  esac
  echo "ok: $f"
done
rm -f /tmp/cuda-check-$$.o
