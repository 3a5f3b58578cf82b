#!/usr/bin/env bash
# Runs the op micro-benchmark with fasttrain and PyTorch alternately, case by case, in one run,
# and prints a table with the ratio (PyTorch ms / fasttrain ms: > 1 means fasttrain is faster).
# Usage: bench/compare_micro.sh [build dir (default build/release)] [threads (default 2)] [iters (default 10)]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build/release}"
threads="${2:-2}"
iters="${3:-10}"
ops=$(/usr/bin/python3 -c "import json;print(' '.join(sorted({c['name'] for c in json.load(open('$here/micro_cases.json'))['cases']})))")
source "$(cd "$(dirname "$0")" && pwd)/peer_env.sh"  # same BLAS kernels for the PyTorch peer
out=$(mktemp)
for name in $ops; do
  OMP_NUM_THREADS=$threads "$build/micro_ops" --threads "$threads" --iters "$iters" --filter "$name" >>"$out"
  OMP_NUM_THREADS=$threads /usr/bin/python3 "$here/torch_micro.py" --threads "$threads" --iters "$iters" --filter "$name" >>"$out"
done
/usr/bin/python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
key = lambda r: (r["op"], r["case"], r["layout"], r["dtype"], r["mode"])
ft = {key(r): r for r in rows if r["impl"] == "fasttrain"}
pt = {key(r): r for r in rows if r["impl"] == "pytorch"}
print(f"{'op':10} {'case':16} {'layout':6} {'dtype':5} {'mode':8} {'fasttrain ms':>13} {'pytorch ms':>11} {'ratio':>7}")
for k, r in ft.items():
    p = pt.get(k, {})
    a, b = r.get("ms"), p.get("ms")
    ratio = f"{b / a:7.2f}" if a and b else "    n/a"
    fa = f"{a:13.3f}" if a else f"{'error':>13}"
    fb = f"{b:11.3f}" if b else f"{'error':>11}"
    print(f"{k[0]:10} {k[1]:16} {k[2]:6} {k[3]:5} {k[4]:8} {fa} {fb} {ratio}")
for r in rows:
    if "error" in r:
        print(f"# {r['impl']} {r['op']} {r['case']} {r['dtype']} {r['mode']}: {r['error']}", file=sys.stderr)
PY
rm -f "$out"
