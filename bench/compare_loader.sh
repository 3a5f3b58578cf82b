#!/usr/bin/env bash
# Runs bench/loader (fasttrain) and bench/torch_loader.py (PyTorch DataLoader, same transforms and
# data) alternately for the image and token pipelines with 0, 1, 2 and 4 workers, and prints
# samples/s and the ratio fasttrain / PyTorch (> 1: fasttrain is faster), for each fair peer of
# bench/peer_env.sh (Debian 12's 1.13 with the OpenMP OpenBLAS, Debian 13's 2.6 where its root
# exists; FT_PEERS picks them). Every JSON line is kept, the peers' with their name ("peer").
# Usage: bench/compare_loader.sh [build dir (default build)] [seconds per run (default 2)]
#                                [jsonl out (default <build>/compare_loader.jsonl)] [device: cpu|cuda]
# With cuda, batches are delivered to the GPU (page-locked buffers, copies on a side stream); set
# FT_PEER_PYTHON to the interpreter whose PyTorch has CUDA (a GPU machine's image).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build}"
seconds="${2:-2}"
out="${3:-$build/compare_loader.jsonl}"
device="${4:-cpu}"
loader="$build/loader"
[ -x "$loader" ] || { echo "compare_loader.sh: $loader not found (build the loader target)" >&2; exit 2; }
source "$here/peer_env.sh"
fair_peers "torch-1.13 torch-2.6"
: >"$out"
field() { sed -E "s/.*\"$1\": ([0-9.]+).*/\1/" <<<"$2"; }
printf '%-8s %8s %16s %16s %8s  %s\n' pipeline workers fasttrain/s pytorch/s ratio peer
for pipeline in image token; do
  for workers in 0 1 2 4; do
    ft=$("$loader" --pipeline "$pipeline" --workers "$workers" --seconds "$seconds" --device "$device")
    printf '%s\n' "$ft" >>"$out"
    for peer in "${peers[@]}"; do
      pt=$(peer_lines "$peer" torch_loader.py --pipeline "$pipeline" --workers "$workers" --seconds "$seconds" --device "$device")
      printf '%s\n' "$pt" >>"$out"
      a=$(field samples_per_s "$ft") b=$(field samples_per_s "$pt")
      printf '%-8s %8d %16.0f %16.0f %7.1fx  %s\n' "$pipeline" "$workers" "$a" "$b" \
        "$(awk -v a="$a" -v b="$b" 'BEGIN { print a / b }')" "$peer"
    done
  done
done
echo "JSON lines: $out"
