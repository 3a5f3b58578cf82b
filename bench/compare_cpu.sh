#!/usr/bin/env bash
# Runs the CPU rows of shared/BENCH.md (mlp, cnn-mini, gpt-mini, gpt2-124m, resnet50 x fp32, bf16)
# with `fasttrain bench` and with the PyTorch peer alternately, row by row, in one run, and prints a
# table of ratios (fasttrain speed / PyTorch speed: > 1 means fasttrain is faster), fasttrain's
# fraction of the machine's measured peak, and the CPU's ISA. With several rounds, each row's
# figure is the median over the rounds. Every JSON line is kept in a file.
# Usage: bench/compare_cpu.sh [build dir (default build/release)] [threads (default 2)]
#                             [steps (default 10)] [rounds (default 1)] [jsonl out (default <build>/compare_cpu.jsonl)]
# Rows: FT_BENCH_ROWS="workload[:precision] ..." picks them (default: all ten), e.g.
#   FT_BENCH_ROWS="gpt-mini:bf16 resnet50" bench/compare_cpu.sh build/cpu 2 10 3
# The two big rows run at BENCH.md's CPU sizes (gpt2-124m --batch 1, i.e. 1024 tokens; resnet50
# --batch 8) with at most 3 timed steps after 1 warm-up (BENCH.md); a gpt2-124m fp32 step takes
# seconds on 2 cores. FT_BENCH_CHANNELS_LAST=1 runs the convolutional rows channels-last on both
# sides (--channels-last).
# On a shared machine other jobs distort the figures badly (two spinning OpenMP threads sharing
# one free core run many times slower, in both libraries; docs/PERF.md): each pair of runs
# reports how busy the CPUs were just before it, and FT_BENCH_WAIT_IDLE=S waits up to S seconds
# for them to go idle first. FT_PEER_PYTHON picks the peer's interpreter (default /usr/bin/python3,
# Debian's PyTorch; a GPU machine's image has its own).
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
# without ../shared, and for a workload the shared peer does not define.
shared_peer="$here/../../shared/peer/torch_bench.py"
peer_for() {
  if [ -f "$shared_peer" ] && grep -q "\"$1\"" "$shared_peer"; then echo "$shared_peer"; else echo "$here/torch_bench.py"; fi
}
rows="${FT_BENCH_ROWS:-mlp cnn-mini gpt-mini gpt2-124m resnet50}"
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
  for row in $rows; do
    workload="${row%%:*}"
    precisions="fp32 bf16"
    [ "$row" = "$workload" ] || precisions="${row#*:}"
    # BENCH.md's CPU sizes of the big rows; the others at the workload's own batch.
    size=()
    row_steps="$steps"
    row_warmup=3
    case "$workload" in
      gpt2-124m) size=(--batch 1); row_steps=$(( steps < 3 ? steps : 3 )); row_warmup=1 ;;
      resnet50) size=(--batch 8); row_steps=$(( steps < 3 ? steps : 3 )); row_warmup=1 ;;
    esac
    layout=()
    case "$workload" in cnn-mini|resnet50) [ "${FT_BENCH_CHANNELS_LAST:-0}" = 1 ] && layout=(--channels-last) ;; esac
    peer="$(peer_for "$workload")"
    for precision in $precisions; do
      wait_idle "$workload" "$precision"
      OMP_NUM_THREADS=$threads "$fasttrain" bench --workload "$workload" --precision "$precision" \
        --threads "$threads" --steps "$row_steps" --warmup "$row_warmup" "${size[@]}" "${layout[@]}" | tee -a "$out" >&2
      OMP_NUM_THREADS=$threads "${FT_PEER_PYTHON:-/usr/bin/python3}" "$peer" --workload "$workload" --precision "$precision" \
        --threads "$threads" --steps "$row_steps" --warmup "$row_warmup" "${size[@]}" "${layout[@]}" | tee -a "$out" >&2
    done
  done
done
"${FT_PEER_PYTHON:-/usr/bin/python3}" - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def runs(impl, w, p):
    return [r for r in rows if r["impl"].startswith(impl) and r["workload"] == w and r["precision"] == p]
order = []
for r in rows:
    if (r["workload"], r["precision"]) not in order:
        order.append((r["workload"], r["precision"]))
print(f"{'workload':9} {'precision':9} {'batch':>5} {'fasttrain ms':>12} {'pytorch ms':>11} {'ratio':>6} {'of peak':>7}"
      f"  {'fasttrain loss':>14} {'pytorch loss':>12}  per-round ratios")
for w, p in order:
    ft, pt = runs("fasttrain", w, p), runs("pytorch", w, p)
    if not ft or not pt:
        print(f"{w:9} {p:9} {'missing':>12}")
        continue
    a = statistics.median(r["ms_per_step"] for r in ft)
    b = statistics.median(r["ms_per_step"] for r in pt)
    frac = statistics.median(r.get("peak_fraction", 0.0) for r in ft)
    per = " ".join(f"{y['ms_per_step'] / x['ms_per_step']:.2f}" for x, y in zip(ft, pt))
    print(f"{w:9} {p:9} {ft[-1]['batch']:5} {a:12.1f} {b:11.1f} {b / a:6.2f} {frac:7.1%}"
          f"  {ft[-1]['loss']:14.4f} {pt[-1]['loss']:12.4f}  {per}")
isas = sorted({r.get("cpu_isa", "?") for r in rows})
cpus = sorted({r["cpu"] for r in rows if "cpu" in r})
peaks = {}
for r in rows:
    if r["impl"] == "fasttrain":
        peaks.setdefault(r["precision"], []).append(r.get("peak_gflops", 0.0))
print("# cpu: " + ", ".join(cpus) + "; cpu_isa: " + ", ".join(isas) + "; measured peak GFLOP/s (median): " +
      ", ".join(f"{p} {statistics.median(v):.0f}" for p, v in sorted(peaks.items())))
print(f"# ratio = fasttrain speed / PyTorch speed (PyTorch ms / fasttrain ms); of peak = fasttrain's model FLOP/s"
      f" over the measured peak; JSON lines in {sys.argv[1]}")
PY
