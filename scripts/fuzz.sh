#!/usr/bin/env bash
# Builds the libFuzzer targets of the file parsers in the sanitizer build (preset `debug`: clang,
# ASan + UBSan, coverage feedback on the parser sources) and runs each for a short time (default
# 10 s). Called by the test suite (CTest test `fuzz_parsers`); exits 77 (skipped) when clang is not
# installed. It configures build/debug exactly as scripts/sanitizers.sh does, so in CI the library
# built here is the one the sanitizer job then tests: one instrumented copy, not two.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-10}"
if ! command -v clang++ >/dev/null 2>&1; then
  echo "SKIP: clang++ not installed (apt-get install clang); parser fuzzing skipped"
  exit 77
fi
build="$root/build/debug"
(cd "$root" && cmake --preset debug -DFASTTRAIN_BENCH=OFF >/dev/null)
# Only the fuzz targets (and the library they link): the tests are the sanitizer job's.
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
