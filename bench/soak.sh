#!/usr/bin/env bash
# Soak benchmark of the "nothing is lost under faults" promise (not run in CI; docs/RELIABILITY.md
# holds the figures). For --minutes, it runs the default training (`fasttrain train` with
# checkpoints) and kills it with SIGKILL at random moments, each time restarting it from the newest
# complete checkpoint in the same run folder, as a job scheduler that requeues a job would. It counts:
#   cycles      processes started (the first of each run plus every resume)
#   resumes     restarts from a checkpoint
#   kills       SIGKILLs that landed (in_writes: those that left a half-written file or folder)
#   runs        runs that reached their last step
#   mismatches  metrics.csv rows (step, split, loss, accuracy, lr, momentum, grad_norm, loss scale)
#               that differ from an uninterrupted run's, checked after every kill and every run
#   leaks       half-written files or folders (*.tmp*) left after a finished run, and checkpoint
#               folders beyond keep_last + keep_best
#   RSS         resident memory of each process once it trains (its first new metrics row) and just
#               before it is killed: growth within a cycle, and the drift of the end figure
# and ends with one JSON line of the totals.
#
#   bench/soak.sh [--minutes 60] [--bin build/release/fasttrain] [--work DIR] [--kill-min 5]
#                 [--kill-max 40] [--seed N] [-- extra options for fasttrain train]
#
# The reference run is part of the time budget. Defaults: --checkpoint-every 25 (the log interval,
# so checkpoints carry no partial loss sums; any value works), keep_last 2, keep_best 1.
set -euo pipefail

minutes=60
bin=build/release/fasttrain
work=""
kill_min=5
kill_max=40
seed=$RANDOM
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --kill-min) kill_min=$2; shift 2 ;;
    --kill-max) kill_max=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "soak.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "soak.sh: $bin is not an executable (build fasttrain_cli or pass --bin)" >&2; exit 2; }
bin=$(realpath "$bin")
[ -n "$work" ] || work=$(mktemp -d "${TMPDIR:-/tmp}/fasttrain-soak.XXXXXX")
mkdir -p "$work"
RANDOM=$seed
train=("$bin" train --progress false)
[[ " ${extra[*]} " == *" --checkpoint-every "* ]] || train+=(--checkpoint-every 25)
train+=("${extra[@]}")
deadline=$(( $(date +%s) + minutes * 60 ))

# The rows that must match, complete lines only (a kill can cut the last one short).
rows() {
  local f=$1
  [ -f "$f" ] || return 0
  if [ -n "$(tail -c1 "$f")" ]; then sed '$d' "$f"; else cat "$f"; fi | cut -d, -f1-9
}
newest_checkpoint() {
  local d
  d=$(ls -d "$1"/checkpoints/step-[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9] 2>/dev/null | sort | tail -n1 || true)
  echo "$d"
}
rss_kb() { awk '/^VmRSS:/ {r = $2} END {print r + 0}' "/proc/$1/status" 2>/dev/null || echo 0; }
# Running (not exited and waiting to be reaped).
alive() { local s; s=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true); [ -n "$s" ] && [ "$s" != Z ]; }
now() { date +%s.%N; }
seconds_since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}'; }

echo "soak: $minutes min, seed $seed, work folder $work, kills every ${kill_min}-${kill_max} s"
echo "soak: reference run: ${train[*]} --run-dir $work/reference"
t0=$(date +%s)
"${train[@]}" --run-dir "$work/reference" >"$work/reference.log" 2>&1 || {
  echo "soak: the reference run failed:" >&2
  tail -n 5 "$work/reference.log" >&2
  exit 1
}
rows "$work/reference/metrics.csv" >"$work/reference.rows"
echo "soak: reference done in $(( $(date +%s) - t0 )) s, $(wc -l <"$work/reference.rows") rows"

cycles=0 resumes=0 runs=0 mismatches=0 leaks=0 kills=0 in_writes=0 failures=0
rss_growth_max=0 rss_growth_sum=0 rss_first_end=0 rss_last_end=0 rss_end_max=0
run="$work/run"
rm -rf "$run"
: >"$work/cycles.csv"
echo "cycle,resumed_from_step,seconds,outcome,rss_start_kb,rss_end_kb" >>"$work/cycles.csv"

# Counts metrics rows that differ from the reference's first rows.
check_rows() {
  rows "$run/metrics.csv" >"$work/got.rows"
  local n bad
  n=$(wc -l <"$work/got.rows")
  bad=$(diff <(head -n "$n" "$work/reference.rows") "$work/got.rows" | grep -c '^>' || true)
  if [ "$bad" -gt 0 ]; then
    echo "soak: cycle $cycles: $bad metrics rows differ from the uninterrupted run" >&2
    diff <(head -n "$n" "$work/reference.rows") "$work/got.rows" | head -n 6 >&2 || true
  fi
  mismatches=$((mismatches + bad))
}

while [ "$(date +%s)" -lt "$deadline" ]; do
  from=$(newest_checkpoint "$run")
  args=(--run-dir "$run")
  from_step=0
  if [ -n "$from" ]; then
    args+=(--resume "$from")
    from_step=$((10#${from##*step-}))
    resumes=$((resumes + 1))
  fi
  cycles=$((cycles + 1))
  rows_before=$(rows "$run/metrics.csv" | wc -l)
  start=$(now)
  "${train[@]}" "${args[@]}" >"$work/cycle.log" 2>&1 &
  pid=$!
  delay=$(( kill_min + RANDOM % (kill_max - kill_min + 1) ))
  rss_start=0 rss_end=0 outcome=exited
  # Poll every 0.2 s: the RSS once training runs (a row beyond those the resume keeps), then the
  # last figure before the kill.
  until_s=$(( $(date +%s) + delay ))
  while [ "$(date +%s)" -lt "$until_s" ]; do
    alive "$pid" || break
    r=$(rss_kb "$pid")
    [ "$r" -gt 0 ] && rss_end=$r
    if [ "$rss_start" -eq 0 ] && [ "$(rows "$run/metrics.csv" | wc -l)" -gt "$rows_before" ]; then rss_start=$r; fi
    sleep 0.2
  done
  if alive "$pid" && kill -9 "$pid" 2>/dev/null; then outcome=killed; kills=$((kills + 1)); fi
  code=0
  { wait "$pid"; } 2>/dev/null || code=$?
  if [ "$code" -eq 137 ] && [ -n "$(find "$run" -name '*.tmp*' -print -quit)" ]; then in_writes=$((in_writes + 1)); fi
  seconds=$(seconds_since "$start")
  if [ "$code" -eq 0 ]; then
    outcome=finished
  elif [ "$code" -ne 137 ]; then
    outcome="failed($code)"
    failures=$((failures + 1))
    echo "soak: cycle $cycles ended with status $code:" >&2
    tail -n 5 "$work/cycle.log" >&2
  fi
  echo "$cycles,$from_step,$seconds,$outcome,$rss_start,$rss_end" >>"$work/cycles.csv"
  check_rows
  if [ "$rss_start" -gt 0 ] && [ "$rss_end" -gt 0 ]; then
    growth=$((rss_end - rss_start))
    rss_growth_sum=$((rss_growth_sum + growth))
    [ "$growth" -gt "$rss_growth_max" ] && rss_growth_max=$growth
    [ "$rss_first_end" -eq 0 ] && rss_first_end=$rss_end
    rss_last_end=$rss_end
    [ "$rss_end" -gt "$rss_end_max" ] && rss_end_max=$rss_end
  fi
  if [ "$outcome" = finished ]; then
    runs=$((runs + 1))
    if ! cmp -s "$work/reference.rows" "$work/got.rows"; then
      echo "soak: run $runs: metrics.csv differs from the uninterrupted run's" >&2
      mismatches=$((mismatches + 1))
    fi
    stray=$(find "$run" -name '*.tmp*' | wc -l)
    folders=$(find "$run/checkpoints" -mindepth 1 -maxdepth 1 -type d | wc -l)
    extra_folders=$(( folders > 3 ? folders - 3 : 0 ))
    if [ $((stray + extra_folders)) -gt 0 ]; then
      echo "soak: run $runs left $stray half-written entries and $extra_folders checkpoint folders too many" >&2
      find "$run" -name '*.tmp*' >&2
    fi
    leaks=$((leaks + stray + extra_folders))
    rm -rf "$run"
  fi
  echo "soak: cycle $cycles: from step $from_step, $outcome after $seconds s, RSS $((rss_start / 1024)) -> $((rss_end / 1024)) MiB"
done

mb() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; }
echo "soak: $cycles cycles ($resumes resumes, $kills kills, $in_writes inside a write), $runs runs finished, failures $failures," \
  "mismatches $mismatches, leaks $leaks"
echo "soak: RSS growth within a cycle: max $(mb $rss_growth_max) MiB, mean $(mb $((cycles > 0 ? rss_growth_sum / cycles : 0))) MiB;" \
  "RSS before the kill: first $(mb $rss_first_end) MiB, last $(mb $rss_last_end) MiB, max $(mb $rss_end_max) MiB"
printf '{"impl": "fasttrain", "bench": "soak", "minutes": %s, "seed": %s, "cycles": %d, "resumes": %d, "kills": %d, "kills_in_writes": %d, "runs": %d, "failures": %d, "mismatches": %d, "leaks": %d, "rss_growth_max_mib": %s, "rss_end_first_mib": %s, "rss_end_last_mib": %s, "rss_end_max_mib": %s}\n' \
  "$minutes" "$seed" "$cycles" "$resumes" "$kills" "$in_writes" "$runs" "$failures" "$mismatches" "$leaks" "$(mb $rss_growth_max)" \
  "$(mb $rss_first_end)" "$(mb $rss_last_end)" "$(mb $rss_end_max)"
