#!/usr/bin/env bash
# Which oneDNN kernels a command runs and how long they take: runs the command with oneDNN's own
# verbose log (ONEDNN_VERBOSE=1: one line per primitive creation and execution, with the
# implementation's name, e.g. "brg:avx512_core_amx" or "jit:avx512_core_bf16", and its time) and
# sums the execution times by primitive kind, implementation and propagation kind, then by problem.
# For machines where a step is slower than the instruction rates promise (issue 14's AMX host):
# a reference ("ref:any") or gemm-based ("gemm:jit") kernel, or reorders run every step, show at
# once. The first lines of each table are the costliest.
#
#   scripts/onednn-summary.sh [--top N] -- COMMAND [ARGS...]
# e.g. scripts/onednn-summary.sh -- build/cpu/fasttrain bench --workload gpt-mini --precision bf16
#        --threads 2 --steps 2 --warmup 1
# The times include the warm-up steps'; run few steps (the log has a line per call).
set -euo pipefail
top=20
if [ "${1:-}" = "--top" ]; then
  top="$2"
  shift 2
fi
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || {
  echo "usage: $0 [--top N] -- COMMAND [ARGS...]" >&2
  exit 2
}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
ONEDNN_VERBOSE=1 DNNL_VERBOSE=1 "$@" >"$log" 2>&1 || {
  echo "onednn-summary: the command failed; its last lines:" >&2
  grep -v '_verbose,' "$log" | tail -5 >&2
  exit 1
}
# oneDNN 2.x exec lines: <tag>,exec,cpu,<kind>,<impl>,<prop>,<memory descs>,<attrs>,<aux>,<problem>,<ms>
# (tag onednn_verbose or dnnl_verbose); the time is the last field.
awk -F, -v top="$top" '
  $1 ~ /_verbose$/ && $2 == "exec" {
    ms = $NF + 0; total += ms; n++
    k = $4 "  " $5 "  " $6; by_impl[k] += ms; calls_impl[k]++
    p = $4 "  " $5 "  " $(NF - 1); by_prob[p] += ms; calls_prob[p]++
  }
  $1 ~ /_verbose$/ && $2 == "info" { sub(/^[^,]*,info,/, ""); print "oneDNN: " $0 }
  END {
    if (n == 0) { print "onednn-summary: no oneDNN executions logged"; exit }
    printf "oneDNN: %d executions, %.1f ms in all\n", n, total
    print "by kind, implementation, propagation (ms, calls, share):"
    for (k in by_impl) printf "  %10.2f %7d %5.1f%%  %s\n", by_impl[k], calls_impl[k], 100 * by_impl[k] / total, k | "sort -rn | head -n " top
    close("sort -rn | head -n " top)
    print "by kind, implementation, problem (ms, calls, share):"
    for (p in by_prob) printf "  %10.2f %7d %5.1f%%  %s\n", by_prob[p], calls_prob[p], 100 * by_prob[p] / total, p | "sort -rn | head -n " top
    close("sort -rn | head -n " top)
  }' "$log"
