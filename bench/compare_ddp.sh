#!/usr/bin/env bash
# Data-parallel scaling on one machine (shared/BENCH.md, "Data-parallel runs"): gpt-mini and
# cnn-mini at their global batch, 1 rank x 1 thread and N ranks x 1 thread, with `fasttrain
# bench` (alone, then under mpirun: DDP over Open MPI) and with PyTorch DDP over Gloo
# (bench/torch_ddp_bench.py, the shared peer's copy) under each fair peer of bench/peer_env.sh
# (Debian 12's 1.13 with the OpenMP OpenBLAS, Debian 13's 2.6 where its root exists; FT_PEERS picks
# them), alternately in one run; prints ms per step and the scaling efficiency,
# (1-rank ms) / (N x N-rank ms), of each. Every JSON line is kept in a file, the peers' with
# their name ("peer").
# Usage: bench/compare_ddp.sh [build dir (default build/release)] [ranks (default 2)]
#                             [steps (default 10)] [jsonl out (default <build>/compare_ddp.jsonl)]
# On a shared machine other jobs distort the figures (see compare_cpu.sh); run it on an idle one.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build/release}"
ranks="${2:-2}"
steps="${3:-10}"
out="${4:-$build/compare_ddp.jsonl}"
fasttrain="$build/fasttrain"
[ -x "$fasttrain" ] || { echo "compare_ddp.sh: $fasttrain not found (build the fasttrain_cli target)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "compare_ddp.sh: mpirun not found (scripts/install-deps.sh)" >&2; exit 2; }
source "$here/peer_env.sh"
# torch.compile is not a data-parallel strategy: the eager peers only.
fair_peers "torch-1.13 torch-2.6"
# peer_ddp PEER ARGS...: one torch_ddp_bench.py line, tagged with the peer's name.
peer_ddp() {
  local peer="$1"
  shift
  OMP_NUM_THREADS=1 peer_lines "$peer" torch_ddp_bench.py "$@" | tee -a "$out" >&2
}
# As root in a container Open MPI needs --allow-run-as-root; --oversubscribe when ranks > cores.
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to core -np "$ranks" -x OMP_NUM_THREADS=1)
: >"$out"
for workload in gpt-mini cnn-mini; do
  OMP_NUM_THREADS=1 "$fasttrain" bench --workload "$workload" --threads 1 --steps "$steps" | tee -a "$out" >&2
  OMP_NUM_THREADS=1 "${mpi[@]}" "$fasttrain" bench --workload "$workload" --threads 1 --steps "$steps" |
    tee -a "$out" >&2
  for peer in "${peers[@]}"; do
    peer_ddp "$peer" --workload "$workload" --world-size 1 --threads 1 --steps "$steps"
    peer_ddp "$peer" --workload "$workload" --world-size "$ranks" --threads 1 --steps "$steps"
  done
done
# ZeRO at N ranks on gpt-mini: stage 1 beside PyTorch's ZeroRedundancyOptimizer (its only CPU
# ZeRO: 1.13 has no CPU FSDP); stages 2 and 3 fasttrain's alone. Per-rank peak memory is
# fasttrain's peak_mem_mb (the peer does not report one).
for strategy in zero1 zero2 zero3; do
  OMP_NUM_THREADS=1 "${mpi[@]}" "$fasttrain" bench --workload gpt-mini --threads 1 --steps "$steps" \
    --strategy "$strategy" | tee -a "$out" >&2
done
for peer in "${peers[@]}"; do
  peer_ddp "$peer" --workload gpt-mini --world-size "$ranks" --threads 1 --steps "$steps" --strategy zero1
done
/usr/bin/python3 - "$out" "$ranks" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
n = int(sys.argv[2])
who = lambda r: r.get("peer", "fasttrain")
impls = []
for r in rows:
    if who(r) not in impls:
        impls.append(who(r))
def ms(impl, w, ranks):
    for r in rows:
        if who(r) == impl and r["workload"] == w and r.get("world_size", 1) == ranks and r.get("strategy", "ddp") in ("ddp", "single"):
            return r["ms_per_step"]
    return None
print(f"{'workload':9} {'impl':11} {'1 rank ms':>10} {f'{n} ranks ms':>11} {'efficiency':>10}")
for w in ("gpt-mini", "cnn-mini"):
    for impl in impls:
        one, many = ms(impl, w, 1), ms(impl, w, n)
        eff = f"{one / (n * many):10.2f}" if one and many else f"{'missing':>10}"
        print(f"{w:9} {impl:11} {one or 0:10.1f} {many or 0:11.1f} {eff}")
print(f"# efficiency = (1-rank ms) / ({n} x {n}-rank ms), same global batch, 1 thread per rank; JSON lines in {sys.argv[1]}")
print(f"\ngpt-mini at {n} ranks by strategy: ms per step (peak MiB per rank, fasttrain)")
for r in rows:
    if r["workload"] == "gpt-mini" and r.get("world_size", 1) == n:
        mem = f" ({r['peak_mem_mb']:.1f} MiB)" if "peak_mem_mb" in r else ""
        print(f"  {who(r):11} {r.get('strategy', 'ddp'):6} {r['ms_per_step']:8.1f}{mem}")
PY
