#!/usr/bin/env bash
# Model-parallel layouts on one machine (issue 43): step time and per-rank peak memory of
# gpt-mini and gpt2-124m trained by `fasttrain train` under each (dp, tp, pp) layout, with the
# same global batch, one thread per rank, on byte-level token shards made here from generated
# text (no download).
#
# What the figures are about: on a machine of a few cores the ranks share the cores (mpirun
# --oversubscribe), so a layout of N ranks does not get N times the compute. The step times show
# what each layout costs in communication, pipeline bubble and duplicated work (norms, the tied
# embedding's copy), not scaling; the per-rank memory is the real point of splitting a model.
#
# Per layout one JSON line (stdout and the jsonl file): {"workload", "layout", "ranks", "tp",
# "pp", "dp", "ms_per_step" (median of the timed steps' elapsed-time differences in metrics.csv),
# "peak_allocated_mb" and "max_rss_mb" per rank (summary.json's "ranks"), "bytes_per_step" per
# rank}, then a table.
# Usage: bench/compare_parallel.sh [build dir (default build/release)] [steps (default 8)]
#                                  [jsonl out (default <build>/compare_parallel.jsonl)]
# FT_PARALLEL_WORKLOADS="gpt-mini" picks the workloads; FT_PARALLEL_LAYOUTS="single tp2" the layouts.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build/release}"
steps="${2:-8}"
out="${3:-$build/compare_parallel.jsonl}"
fasttrain="$build/fasttrain"
[ -x "$fasttrain" ] || { echo "compare_parallel.sh: $fasttrain not found (build the fasttrain_cli target)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "compare_parallel.sh: mpirun not found (scripts/install-deps.sh)" >&2; exit 2; }
work="$(mktemp -d /tmp/compare_parallel.XXXXXX)"
trap 'rm -rf "$work"' EXIT

# Text with structure (words from a small vocabulary in random order), 2 MB.
/usr/bin/python3 - "$work/text.txt" <<'PY'
import random, sys
random.seed(7)
words = ["".join(random.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(random.randint(2, 9))) for _ in range(500)]
with open(sys.argv[1], "w") as f:
    n = 0
    while n < 2_000_000:
        line = " ".join(random.choice(words) for _ in range(12)) + ".\n"
        f.write(line)
        n += len(line)
PY
"$fasttrain" data --input "$work/text.txt" --output "$work/shards" --val-tokens 50000 >/dev/null

# name ranks flags: every layout keeps the global batch (dp x per-rank batch) of the single run.
layouts_all=(
  "single|1|"
  "dp2|2|"
  "zero3-dp2|2|--strategy zero3"
  "tp2|2|--tp 2"
  "pp2-gpipe|2|--pp 2 --pp-schedule gpipe"
  "pp2-1f1b|2|--pp 2 --pp-schedule 1f1b"
  "dp2xtp2|4|--tp 2"
  "tp2xpp2|4|--tp 2 --pp 2 --pp-schedule 1f1b"
  "dp2xpp2|4|--pp 2 --pp-schedule 1f1b"
)
wanted="${FT_PARALLEL_LAYOUTS:-}"
workloads="${FT_PARALLEL_WORKLOADS:-gpt-mini gpt2-124m}"
mpi=(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1)
: >"$out"
for workload in $workloads; do
  case "$workload" in
    # BENCH.md's gpt-mini at its global batch of 16 sequences.
    gpt-mini) model=(--model gpt-mini --vocab-size 512) global=16 ;;
    # GPT-2 small's blocks, vocabulary and head at a small batch: 8 sequences of 128 tokens (a
    # custom GPT of its size with 128 positions instead of 1024; 124.0M parameters).
    gpt2-124m) model=(--model custom --layers 12 --dim 768 --heads 12 --context 128 --vocab-size 50257) global=8 ;;
    *) echo "compare_parallel.sh: unknown workload $workload (gpt-mini, gpt2-124m)" >&2; exit 2 ;;
  esac
  for entry in "${layouts_all[@]}"; do
    IFS='|' read -r name ranks flags <<<"$entry"
    if [ -n "$wanted" ] && [[ " $wanted " != *" $name "* ]]; then continue; fi
    tp=1 pp=1
    [[ "$flags" =~ --tp\ ([0-9]+) ]] && tp="${BASH_REMATCH[1]}"
    [[ "$flags" =~ --pp\ ([0-9]+) ]] && pp="${BASH_REMATCH[1]}"
    dp=$((ranks / (tp * pp)))
    batch=$((global / (4 * dp)))  # per micro-batch: 4 of them per step
    run="$work/run-$workload-$name"
    launcher=()
    [ "$ranks" -gt 1 ] && launcher=("${mpi[@]}" -np "$ranks")
    # 4 micro-batches per step in every layout (the pipelines need them; the others accumulate
    # the same way, so every layout does the same work per step).
    # shellcheck disable=SC2086
    if ! OMP_NUM_THREADS=1 "${launcher[@]}" "$fasttrain" train --task lm --data "$work/shards/tokens_train_*.bin" \
      --val-data "$work/shards/tokens_val_*.bin" "${model[@]}" --batch-size "$batch" --accumulate 4 \
      --max-steps "$steps" --log-every-n-steps 1 --eval-every 0 --threads 1 --tensorboard false --progress false \
      --run-dir "$run" $flags >"$run.log" 2>&1; then
      echo "compare_parallel.sh: $workload $name failed:" >&2
      tail -5 "$run.log" >&2
      continue
    fi
    /usr/bin/python3 - "$run" "$workload" "$name" "$ranks" "$tp" "$pp" "$dp" "$steps" <<'PY' | tee -a "$out"
import csv, json, statistics, sys
run, workload, name, ranks, tp, pp, dp, steps = sys.argv[1:]
rows = [r for r in csv.DictReader(open(run + "/metrics.csv")) if r["split"] == "train"]
elapsed = [float(r["elapsed_s"]) for r in rows]
# The first two steps warm up (allocator pools, oneDNN primitives): timed from the third on.
deltas = [b - a for a, b in zip(elapsed[2:], elapsed[3:])]
summary = json.load(open(run + "/summary.json"))
per_rank = summary.get("ranks", [{"rank": 0, "peak_allocated_bytes": summary["peak_allocated_bytes"],
                                  "max_rss_bytes": 0, "bytes_communicated": 0}])
mb = lambda b: round(b / 2**20, 1)
print(json.dumps({
    "impl": "fasttrain", "workload": workload, "layout": name, "ranks": int(ranks), "tp": int(tp), "pp": int(pp),
    "dp": int(dp), "steps": int(steps), "ms_per_step": round(1e3 * statistics.median(deltas), 1) if deltas else None,
    "peak_allocated_mb": [mb(r["peak_allocated_bytes"]) for r in per_rank],
    "max_rss_mb": [mb(r["max_rss_bytes"]) for r in per_rank],
    "bytes_per_step": [r["bytes_communicated"] // int(steps) for r in per_rank],
}))
PY
  done
done
/usr/bin/python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"\n{'workload':10} {'layout':10} {'ranks':>5} {'ms/step':>9} {'peak MiB per rank':>24} {'MB sent per step per rank':>28}")
for r in rows:
    peaks = "/".join(f"{m:.0f}" for m in r["peak_allocated_mb"])
    sent = "/".join(f"{b / 1e6:.1f}" for b in r["bytes_per_step"])
    print(f"{r['workload']:10} {r['layout']:10} {r['ranks']:5} {r['ms_per_step'] or 0:9.1f} {peaks:>24} {sent:>28}")
print(f"# 1 thread per rank, ranks oversubscribed on this machine's cores: overhead, not scaling. JSON lines in {sys.argv[1]}")
PY
