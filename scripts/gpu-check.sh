#!/usr/bin/env bash
# One call on a GPU machine: build with CUDA, run the CUDA tests (and the rest of the suite, fuzzing
# aside), then the GPU benchmarks next to PyTorch in the same run. Results go to $OUT (the device
# tool's folder) or build/gpu/results.
# Usage: scripts/gpu-check.sh [seconds per loader run (default 2)]
# Needs the Debian -dev packages scripts/install-deps.sh installs (GoogleTest, nlohmann-json,
# toml++, CLI11, OpenBLAS); configure stops naming the first one missing. The PyTorch peer is the
# `python3` on PATH (it must see the GPU), or $FT_PEER_PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-2}"
build=build/gpu
out="${OUT:-$build/results}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DFASTTRAIN_CUDA=ON -DFASTTRAIN_FUZZ=OFF >"$out/configure.log"
cmake --build "$build" -j"$(nproc)" >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
# CUDA tests first: a skip here means the binary saw no GPU, which on this machine is a failure.
"$build"/tests/cuda_test_cuda_runtime --gtest_brief=1 | tee "$out/cuda_tests.txt"
"$build"/tests/cuda_test_cuda_prefetch --gtest_brief=1 | tee -a "$out/cuda_tests.txt"
if grep -q SKIPPED "$out/cuda_tests.txt"; then echo "gpu-check: CUDA tests were skipped: no GPU seen" >&2; exit 1; fi
ctest --test-dir "$build" -j"$(nproc)" -E fuzz_parsers --output-on-failure >"$out/ctest.txt" 2>&1 || {
  tail -40 "$out/ctest.txt"; exit 1; }
tail -3 "$out/ctest.txt"
FT_PEER_PYTHON="${FT_PEER_PYTHON:-python3}" bench/compare_loader.sh "$build" "$seconds" "$out/loader_cuda.jsonl" cuda
