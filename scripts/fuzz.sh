#!/usr/bin/env bash
# Builds the libFuzzer targets of the file parsers with clang (the library instrumented with
# AddressSanitizer) in build/fuzz and runs each for a short time (default 10 s). Called by the
# test suite (CTest test `fuzz_parsers`); exits 77 (skipped) when clang is not installed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-10}"
if ! command -v clang++ >/dev/null 2>&1; then
  echo "SKIP: clang++ not installed (apt-get install clang); parser fuzzing skipped"
  exit 77
fi
build="$root/build/fuzz"
CXX=clang++ cmake -S "$root" -B "$build" -DFASTTRAIN_FUZZ=ON -DFASTTRAIN_CUDA=OFF -DFASTTRAIN_TESTS=OFF \
  -DFASTTRAIN_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
# Only the fuzz targets (and the library they link): not the program, which nothing here runs.
targets=()
for src in "$root"/tests/fuzz/fuzz_*.cpp; do targets+=(--target "$(basename "$src" .cpp)"); done
cmake --build "$build" -j"$(nproc)" "${targets[@]}" >/dev/null
cd "$build"
for f in fuzz_*; do
  [ -x "$f" ] || continue
  echo "fuzzing $f for ${seconds}s"
  # Inputs are written to per-process temp files by the targets; run in a scratch dir.
  work="$(mktemp -d)"
  (cd "$work" && "$build/$f" -max_total_time="$seconds" -rss_limit_mb=4096 2>&1 | tail -n 3)

  rm -rf "$work" /tmp/fasttrain_fuzz_* 2>/dev/null || true
done
echo "fuzzing finished: no crash, no sanitizer report"
