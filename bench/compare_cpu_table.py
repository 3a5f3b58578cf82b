#!/usr/bin/env python3
"""The table of bench/compare_cpu.sh from its JSON lines: per row (workload, precision), the median
ms per step of fasttrain and of each PyTorch peer, the ratio to the fastest peer (its ms /
fasttrain's ms: > 1 means fasttrain is faster), fasttrain's fraction of the measured peak, and the
max RSS of fasttrain and of that fastest peer. Peer runs that failed are listed under the table
with their error.

usage: compare_cpu_table.py FILE.jsonl [--markdown]
"""
import json
import statistics
import sys


def main():
    path = sys.argv[1]
    markdown = "--markdown" in sys.argv[2:]
    lines = [json.loads(l) for l in open(path) if l.strip()]
    ok = [r for r in lines if "error" not in r]
    order, peers = [], []
    for r in lines:
        if (r["workload"], r["precision"]) not in order:
            order.append((r["workload"], r["precision"]))
        if "peer" in r and r["peer"] not in peers:
            peers.append(r["peer"])

    def runs(who, w, p):
        return [r for r in ok if r.get("peer", "fasttrain") == who and r["workload"] == w and r["precision"] == p]

    def median(rs, key):
        v = [r[key] for r in rs if key in r]
        return statistics.median(v) if v else None

    head = ["workload", "precision", "batch", "fasttrain ms"] + [f"{p} ms" for p in peers] + [
        "best peer", "ratio", "of peak", "fasttrain RSS MB", "best peer RSS MB"]
    table = []
    for w, p in order:
        ft = runs("fasttrain", w, p)
        ft_ms = median(ft, "ms_per_step")
        peer_ms = {q: median(runs(q, w, p), "ms_per_step") for q in peers}
        present = {q: v for q, v in peer_ms.items() if v is not None}
        best = min(present, key=present.get) if present else None
        failed = {r.get("peer", "fasttrain") for r in lines if "error" in r and r["workload"] == w and r["precision"] == p}
        cells = [w, p, str(ft[-1]["batch"]) if ft else "?", f"{ft_ms:.1f}" if ft_ms else "failed" if "fasttrain" in failed else "-"]
        cells += [f"{peer_ms[q]:.1f}" if peer_ms[q] else "failed" if q in failed else "-" for q in peers]
        cells.append(best or "none")
        cells.append(f"{present[best] / ft_ms:.2f}" if best and ft_ms else "-")
        frac = median(ft, "peak_fraction")
        cells.append(f"{frac:.1%}" if frac is not None else "-")
        rss = median(ft, "max_rss_mb")
        cells.append(f"{rss:.0f}" if rss else "-")
        best_rss = median(runs(best, w, p), "max_rss_mb") if best else None
        cells.append(f"{best_rss:.0f}" if best_rss else "-")
        table.append(cells)

    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join("---" for _ in head) + "|")
        for cells in table:
            print("| " + " | ".join(cells) + " |")
    else:
        widths = [max(len(h), *(len(c[i]) for c in table)) if table else len(h) for i, h in enumerate(head)]
        print("  ".join(h.rjust(n) for h, n in zip(head, widths)))
        for cells in table:
            print("  ".join(c.rjust(n) for c, n in zip(cells, widths)))
    for r in lines:
        if "error" in r:
            print(f"# {r.get('peer', 'fasttrain')} {r['workload']} {r['precision']}: failed: {r['error']}")
    versions = sorted({f"{r['peer']}: {r['impl']} with {r.get('blas', '?')}" for r in ok if "peer" in r})
    isas = sorted({r.get("cpu_isa", "?") for r in ok})
    cpus = sorted({r["cpu"] for r in ok if "cpu" in r})
    peaks = {}
    for r in ok:
        if r.get("impl") == "fasttrain" and "peak_gflops" in r:
            peaks.setdefault(r["precision"], []).append(r["peak_gflops"])
    print("# cpu: " + ", ".join(cpus) + "; cpu_isa: " + ", ".join(isas) + "; measured peak GFLOP/s (median): " +
          ", ".join(f"{p} {statistics.median(v):.0f}" for p, v in sorted(peaks.items())))
    print("# peers: " + "; ".join(versions))
    print(f"# ratio = fastest peer's ms / fasttrain's ms (> 1: fasttrain faster); of peak = fasttrain's model FLOP/s"
          f" over the measured peak; RSS = max resident set of the whole process; JSON lines in {path}")


if __name__ == "__main__":
    main()
