#!/usr/bin/env bash
# Runs the CPU rows of shared/BENCH.md (mlp, cnn-mini, gpt-mini, gpt2-124m, resnet50, llama-mini,
# smollm-135m x fp32, bf16)
# with `fasttrain bench` and with each fair PyTorch peer (bench/peer_env.sh: Debian 12's 1.13 with
# the OpenMP OpenBLAS; Debian 13's 2.6 eager and torch.compile'd, where its root exists)
# alternately, row by row, in one run. Prints, per row, the milliseconds per step of fasttrain and
# of each peer, the ratio to the fastest peer (its ms / fasttrain's ms: > 1 means fasttrain is
# faster), fasttrain's fraction of the machine's measured peak, and the max RSS of fasttrain and
# of that fastest peer (GNU time, the whole process). With several rounds, each figure is the
# median over the rounds. Every JSON line is kept in a file, the peers' with their name ("peer"),
# torch version ("impl"), BLAS ("blas") and max RSS ("max_rss_mb"); a peer run that fails is a
# line with its "error".
# Usage: bench/compare_cpu.sh [build dir (default build/release)] [threads (default 2)]
#                             [steps (default 10)] [rounds (default 1)] [jsonl out (default <build>/compare_cpu.jsonl)]
# Rows: FT_BENCH_ROWS="workload[:precision] ..." picks them (default: all fourteen), e.g.
#   FT_BENCH_ROWS="gpt-mini:bf16 resnet50" bench/compare_cpu.sh build/cpu 2 10 3
# Peers: FT_PEERS="torch-1.13 torch-2.6 torch-2.6-compile" (the default) picks them;
# FT_PEER_PYTHON=PATH runs one peer with that interpreter instead (a GPU machine's image).
# The big rows run at BENCH.md's CPU sizes (gpt2-124m and smollm-135m --batch 1, i.e. 1024 tokens; resnet50
# --batch 8) with at most 3 timed steps after 1 warm-up (BENCH.md); a gpt2-124m fp32 step takes
# seconds on 2 cores. FT_BENCH_CHANNELS_LAST=1 runs the convolutional rows channels-last on both
# sides (--channels-last).
# On a shared machine other jobs distort the figures badly (two spinning OpenMP threads sharing
# one free core run many times slower, in both libraries; docs/PERF.md): each row reports how
# busy the CPUs were just before it, and FT_BENCH_WAIT_IDLE=S waits up to S seconds for them to
# go idle first.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build/release}"
threads="${2:-2}"
steps="${3:-10}"
rounds="${4:-1}"
out="${5:-$build/compare_cpu.jsonl}"
fasttrain="$build/fasttrain"
[ -x "$fasttrain" ] || { echo "compare_cpu.sh: $fasttrain not found (build the fasttrain_cli target)" >&2; exit 2; }
# GNU time measures each side's max RSS; without it (a GPU machine's image) the RSS columns stay empty.
timer=(/usr/bin/time -f %M -o)
[ -x /usr/bin/time ] || { echo "compare_cpu.sh: /usr/bin/time not found (apt-get install time): no RSS figures" >&2; timer=(); }
rows="${FT_BENCH_ROWS:-mlp cnn-mini gpt-mini gpt2-124m resnet50 llama-mini smollm-135m}"
source "$here/peer_env.sh"
fair_peers
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
# measured PEER WORKLOAD PRECISION CMD...: runs CMD under GNU time and appends its JSON line to
# $out with the peer's name and the max RSS; a failed run appends a line with the error instead.
measured() {
  local peer="$1" workload="$2" precision="$3" rss err line status=0
  shift 3
  rss=$(mktemp) err=$(mktemp)
  line=$(OMP_NUM_THREADS=$threads "${timer[@]}" ${timer:+"$rss"} "$@" 2>"$err") || status=$?
  /usr/bin/python3 - "$peer" "$workload" "$precision" "$line" "$(tail -1 "$rss")" "$status" "$err" >>"$out" <<'PY'
import json, sys
peer, workload, precision, line, rss, status, err = sys.argv[1:]
try:
    row = json.loads(line.strip().splitlines()[-1])
except (ValueError, IndexError):
    last = [l for l in open(err).read().splitlines() if l.strip()]
    row = {"impl": peer, "workload": workload, "precision": precision,
           "error": f"exit {status}: " + (last[-1][:300] if last else "no output")}
if peer != "fasttrain":
    row["peer"] = peer
if rss.isdigit():
    row["max_rss_mb"] = round(int(rss) / 1024, 1)
print(json.dumps(row))
PY
  tail -1 "$out" >&2
  rm -f "$rss" "$err"
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
      gpt2-124m|smollm-135m) size=(--batch 1); row_steps=$(( steps < 3 ? steps : 3 )); row_warmup=1 ;;
      resnet50) size=(--batch 8); row_steps=$(( steps < 3 ? steps : 3 )); row_warmup=1 ;;
    esac
    layout=()
    case "$workload" in cnn-mini|resnet50) [ "${FT_BENCH_CHANNELS_LAST:-0}" = 1 ] && layout=(--channels-last) ;; esac
    args=(--workload "$workload" --threads "$threads" --steps "$row_steps" --warmup "$row_warmup" "${size[@]}" "${layout[@]}")
    for precision in $precisions; do
      wait_idle "$workload" "$precision"
      measured fasttrain "$workload" "$precision" "$fasttrain" bench --precision "$precision" "${args[@]}"
      for peer in "${peers[@]}"; do
        peer_command "$peer" torch_bench.py
        measured "$peer" "$workload" "$precision" "${peer_cmd[@]}" --precision "$precision" "${args[@]}"
      done
    done
  done
done
/usr/bin/python3 "$here/compare_cpu_table.py" "$out"
