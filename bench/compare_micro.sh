#!/usr/bin/env bash
# Runs the op micro-benchmark with fasttrain and each fair PyTorch peer (bench/peer_env.sh:
# Debian 12's 1.13 on the OpenMP OpenBLAS, Debian 13's 2.6 where its root exists; FT_PEERS picks
# them) alternately, case by case, in one run, and prints a table with each side's time and the
# ratio to the fastest peer (its ms / fasttrain's ms: > 1 means fasttrain is faster).
# Usage: bench/compare_micro.sh [build dir (default build/release)] [threads (default 2)] [iters (default 10)]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build/release}"
threads="${2:-2}"
iters="${3:-10}"
ops=$(/usr/bin/python3 -c "import json;print(' '.join(sorted({c['name'] for c in json.load(open('$here/micro_cases.json'))['cases']})))")
source "$here/peer_env.sh"
fair_peers "torch-1.13 torch-2.6"
out=$(mktemp)
for name in $ops; do
  OMP_NUM_THREADS=$threads "$build/micro_ops" --threads "$threads" --iters "$iters" --filter "$name" >>"$out"
  for peer in "${peers[@]}"; do
    OMP_NUM_THREADS=$threads peer_lines "$peer" torch_micro.py --threads "$threads" --iters "$iters" --filter "$name" >>"$out"
  done
done
/usr/bin/python3 - "$out" "${peers[@]}" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
peers = sys.argv[2:]
key = lambda r: (r["op"], r["case"], r["layout"], r["dtype"], r["mode"])
ft = {key(r): r for r in rows if r["impl"] == "fasttrain"}
pt = {q: {key(r): r for r in rows if r.get("peer") == q} for q in peers}
print(f"{'op':10} {'case':16} {'layout':6} {'dtype':5} {'mode':8} {'fasttrain ms':>13} "
      + " ".join(f"{q + ' ms':>14}" for q in peers) + f" {'ratio':>7}")
for k, r in ft.items():
    a = r.get("ms")
    ms = [pt[q].get(k, {}).get("ms") for q in peers]
    best = min((b for b in ms if b), default=None)
    ratio = f"{best / a:7.2f}" if a and best else "    n/a"
    fa = f"{a:13.3f}" if a else f"{'error':>13}"
    print(f"{k[0]:10} {k[1]:16} {k[2]:6} {k[3]:5} {k[4]:8} {fa} "
          + " ".join(f"{b:14.3f}" if b else f"{'error':>14}" for b in ms) + f" {ratio}")
print("# ratio = the fastest peer's ms / fasttrain's ms")
for r in rows:
    if "error" in r:
        print(f"# {r.get('peer', r['impl'])} {r['op']} {r['case']} {r['dtype']} {r['mode']}: {r['error']}", file=sys.stderr)
PY
rm -f "$out"
