#!/usr/bin/env bash
# Test peer_env: the benchmarks' guard against an unfair PyTorch peer (bench/peer_env.sh). Debian's
# python3-torch run as is multiplies with the pthreads OpenBLAS (Debian's default alternative,
# installed by scripts/install-deps.sh) and must be refused (exit 3) by check_peer_blas; the
# torch-1.13 peer, the same torch with LD_LIBRARY_PATH on the OpenMP build, must be accepted and
# report it. Skipped (77) without Debian's PyTorch or the two OpenBLAS builds.
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "SKIP: Debian's python3-torch not installed"; exit 77; }
for d in openblas-openmp openblas-pthread; do
  [ -d "/usr/lib/x86_64-linux-gnu/$d" ] || { echo "SKIP: /usr/lib/x86_64-linux-gnu/$d missing"; exit 77; }
done
# The default alternative must be the pthreads build for the refusal to be tested at all.
default=$(FT_PEER_PYTHON=/usr/bin/python3 bash -c "source '$here/bench/peer_env.sh'; peer_run torch torch_bench.py --blas")
case "$default" in
  *openblas-pthread*) ;;
  *) echo "SKIP: Debian's torch does not load the pthreads OpenBLAS here ($default)"; exit 77 ;;
esac
out=$(FT_PEER_PYTHON=/usr/bin/python3 bash -c "source '$here/bench/peer_env.sh'; check_peer_blas torch" 2>&1)
rc=$?
[ "$rc" -eq 3 ] || { echo "FAIL: the pthreads peer was not refused (exit $rc): $out"; exit 1; }
grep -q "an unfair peer" <<<"$out" || { echo "FAIL: no reason given: $out"; exit 1; }
out=$(env -u FT_PEER_PYTHON bash -c "source '$here/bench/peer_env.sh'; check_peer_blas torch-1.13" 2>&1)
rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL: the torch-1.13 peer was refused (exit $rc): $out"; exit 1; }
grep -q '"blas": "openblas-openmp"' <<<"$out" || { echo "FAIL: torch-1.13 does not report the OpenMP build: $out"; exit 1; }
echo "peer_env: the pthreads peer refused, torch-1.13 on the OpenMP OpenBLAS accepted"
