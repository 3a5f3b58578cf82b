#!/usr/bin/env bash
# Runs the six CPU rows of shared/BENCH.md (mlp, cnn-mini, gpt-mini x fp32, bf16) with
# `fasttrain bench` and with the PyTorch peer alternately, row by row, in one run, and prints a
# table of ratios (fasttrain speed / PyTorch speed: > 1 means fasttrain is faster). With several
# rounds, each row's figure is the median over the rounds. Every JSON line is kept in a file.
# Usage: bench/compare_cpu.sh [build dir (default build/release)] [threads (default 2)]
#                             [steps (default 10)] [rounds (default 1)] [jsonl out (default <build>/compare_cpu.jsonl)]
# On a shared machine other jobs distort the figures badly (two spinning OpenMP threads sharing
# one free core run many times slower, in both libraries; docs/PERF.md): each pair of runs
# reports how busy the CPUs were just before it, and FT_BENCH_WAIT_IDLE=S waits up to S seconds
# for them to go idle first.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build/release}"
threads="${2:-2}"
steps="${3:-10}"
rounds="${4:-1}"
out="${5:-$build/compare_cpu.jsonl}"
fasttrain="$build/fasttrain"
[ -x "$fasttrain" ] || { echo "compare_cpu.sh: $fasttrain not found (build the fasttrain_cli target)" >&2; exit 2; }
# The peer beside the checkout is the reference (BENCH.md); the copy under bench/ is for machines
# without ../shared.
peer="$here/../../shared/peer/torch_bench.py"
[ -f "$peer" ] || peer="$here/torch_bench.py"
source "$(cd "$(dirname "$0")" && pwd)/peer_env.sh"  # same BLAS kernels for the PyTorch peer
: >"$out"
# Percent of all CPU time spent busy over the next second (from /proc/stat).
cpu_busy() {
  local a b
  read -r -a a < <(head -1 /proc/stat)
  sleep 1
  read -r -a b < <(head -1 /proc/stat)
  local idle=$(( (b[4] + b[5]) - (a[4] + a[5]) )) total=0 i
  for i in 1 2 3 4 5 6 7 8; do total=$(( total + b[i] - a[i] )); done
  echo $(( total > 0 ? 100 * (total - idle) / total : 0 ))
}
wait_idle() {
  local deadline=$(( SECONDS + ${FT_BENCH_WAIT_IDLE:-0} )) busy
  busy=$(cpu_busy)
  while (( busy > 10 && SECONDS < deadline )); do busy=$(cpu_busy); done
  (( busy <= 10 )) || echo "compare_cpu.sh: warning: CPUs ${busy}% busy before $1 $2: figures will be noisy" >&2
}
for ((r = 1; r <= rounds; r++)); do
  for workload in mlp cnn-mini gpt-mini; do
    for precision in fp32 bf16; do
      wait_idle "$workload" "$precision"
      OMP_NUM_THREADS=$threads "$fasttrain" bench --workload "$workload" --precision "$precision" \
        --threads "$threads" --steps "$steps" | tee -a "$out" >&2
      OMP_NUM_THREADS=$threads /usr/bin/python3 "$peer" --workload "$workload" --precision "$precision" \
        --threads "$threads" --steps "$steps" | tee -a "$out" >&2
    done
  done
done
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def runs(impl, w, p):
    return [r for r in rows if r["impl"].startswith(impl) and r["workload"] == w and r["precision"] == p]
print(f"{'workload':9} {'precision':9} {'fasttrain ms':>12} {'pytorch ms':>11} {'ratio':>6}  {'fasttrain loss':>14} {'pytorch loss':>12}  per-round ratios")
for w in ("mlp", "cnn-mini", "gpt-mini"):
    for p in ("fp32", "bf16"):
        ft, pt = runs("fasttrain", w, p), runs("pytorch", w, p)
        if not ft or not pt:
            print(f"{w:9} {p:9} {'missing':>12}")
            continue
        a = statistics.median(r["ms_per_step"] for r in ft)
        b = statistics.median(r["ms_per_step"] for r in pt)
        per = " ".join(f"{y['ms_per_step'] / x['ms_per_step']:.2f}" for x, y in zip(ft, pt))
        print(f"{w:9} {p:9} {a:12.1f} {b:11.1f} {b / a:6.2f}  {ft[-1]['loss']:14.4f} {pt[-1]['loss']:12.4f}  {per}")
print(f"# ratio = fasttrain speed / PyTorch speed (PyTorch ms / fasttrain ms); JSON lines in {sys.argv[1]}")
PY
