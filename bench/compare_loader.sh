#!/usr/bin/env bash
# Runs bench/loader (fasttrain) and bench/torch_loader.py (PyTorch DataLoader, same transforms and
# data) alternately for the image and token pipelines with 0, 1, 2 and 4 workers, and prints
# samples/s and the ratio fasttrain / PyTorch (> 1: fasttrain is faster). Every JSON line is kept.
# Usage: bench/compare_loader.sh [build dir (default build)] [seconds per run (default 2)]
#                                [jsonl out (default <build>/compare_loader.jsonl)] [device: cpu|cuda]
# With cuda, batches are delivered to the GPU (page-locked buffers, copies on a side stream); the
# peer runs with the python named by $FT_PEER_PYTHON (default Debian's /usr/bin/python3).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build}"
seconds="${2:-2}"
out="${3:-$build/compare_loader.jsonl}"
device="${4:-cpu}"
loader="$build/loader"
[ -x "$loader" ] || { echo "compare_loader.sh: $loader not found (build the loader target)" >&2; exit 2; }
python="${FT_PEER_PYTHON:-/usr/bin/python3}"  # Debian's has python3-torch and numpy (CPU only)
: >"$out"
field() { sed -E "s/.*\"$1\": ([0-9.]+).*/\1/" <<<"$2"; }
printf '%-8s %8s %16s %16s %8s\n' pipeline workers fasttrain/s pytorch/s ratio
for pipeline in image token; do
  for workers in 0 1 2 4; do
    ft=$("$loader" --pipeline "$pipeline" --workers "$workers" --seconds "$seconds" --device "$device")
    pt=$("$python" "$here/torch_loader.py" --pipeline "$pipeline" --workers "$workers" --seconds "$seconds" --device "$device")
    printf '%s\n%s\n' "$ft" "$pt" >>"$out"
    a=$(field samples_per_s "$ft") b=$(field samples_per_s "$pt")
    printf '%-8s %8d %16.0f %16.0f %7.1fx\n' "$pipeline" "$workers" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN { print a / b }')"
  done
done
echo "JSON lines: $out"
