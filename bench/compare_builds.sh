#!/usr/bin/env bash
# Two builds of fasttrain against each other on the CPU rows, alternating row by row and round by
# round, so that drift of a shared machine's speed falls on both alike (docs/PERF.md: a
# reshaping's "before and after" tables). Prints one line per run, "round workload precision side
# ms_per_step half_gemm", then per row the median of each side over the rounds.
# Usage: bench/compare_builds.sh BEFORE_BINARY AFTER_BINARY [rounds (default 3)] [steps (default 10)]
# Rows: FT_BENCH_ROWS="workload:precision ..." (default: mlp, cnn-mini, gpt-mini at fp32 and bf16).
# Both sides run with the environment of docs/PERF.md's CPU rows: OMP_NUM_THREADS=2,
# OPENBLAS_CORETYPE=Cooperlake, glibc's mmap and trim thresholds at 4 GiB.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: bench/compare_builds.sh BEFORE_BINARY AFTER_BINARY [rounds] [steps]" >&2; exit 2; }
before="$1" after="$2" rounds="${3:-3}" steps="${4:-10}"
for b in "$before" "$after"; do [ -x "$b" ] || { echo "compare_builds.sh: $b is not an executable" >&2; exit 2; }; done
rows="${FT_BENCH_ROWS:-mlp:fp32 mlp:bf16 cnn-mini:fp32 cnn-mini:bf16 gpt-mini:fp32 gpt-mini:bf16}"
export OMP_NUM_THREADS=2 OPENBLAS_CORETYPE=Cooperlake MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296
results="$(mktemp)"
trap 'rm -f "$results"' EXIT
field() { grep -o "\"$1\": \"\{0,1\}[^,\"}]*" | sed 's/.*: "\{0,1\}//'; }
for round in $(seq 1 "$rounds"); do
  for row in $rows; do
    workload="${row%%:*}" precision="${row##*:}"
    for side in before after; do
      bin="$before"; [ "$side" = after ] && bin="$after"
      line="$("$bin" bench --workload "$workload" --precision "$precision" --threads 2 --steps "$steps" --warmup 3 \
              2>/dev/null | tail -1)"
      echo "$round $workload $precision $side $(echo "$line" | field ms_per_step) $(echo "$line" | field half_gemm)" |
        tee -a "$results"
    done
  done
done
echo "median ms per step over $rounds rounds: workload precision before after"
for row in $rows; do
  workload="${row%%:*}" precision="${row##*:}"
  median() {
    awk -v w="$workload" -v p="$precision" -v s="$1" '$2 == w && $3 == p && $4 == s { print $5 }' "$results" |
      sort -n | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
  }
  echo "$workload $precision $(median before) $(median after)"
done
