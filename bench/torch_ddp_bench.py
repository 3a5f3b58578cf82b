#!/usr/bin/env python3
"""Data-parallel peer: the BENCH.md workloads of torch_bench.py trained with PyTorch DDP over Gloo.

N processes on this machine, each with --threads threads, split the global batch evenly (per-rank
batch = global / N). Strategies: `ddp` (DistributedDataParallel, 25 MiB buckets, AdamW) and `zero1`
(DDP + ZeroRedundancyOptimizer: optimizer state sharded). PyTorch 1.13 has no CPU FSDP, so ZeRO
stages 2 and 3 have no peer here. Rank 0 prints one JSON line:

    python3 torch_ddp_bench.py --workload gpt-mini --world-size 2 --threads 1 [--strategy zero1]

`--world-size 1` runs the same step without a process group: the denominator of scaling efficiency.

The project's copy (bench/) of shared/peer/torch_ddp_bench.py, beside the torch_bench.py it imports,
so the comparison scripts can run it under each peer of bench/peer_env.sh.
"""
import argparse, json, os, sys, tempfile, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_bench import workloads  # noqa: E402  (same models, batches and losses)


def run(rank, a, init_file):
    torch.set_num_threads(a.threads)
    make_model, make_batch, lossf, B, per, unit = workloads()[a.workload]
    B = a.batch or B
    assert B % a.world_size == 0, f"global batch {B} does not divide by {a.world_size} ranks"
    local = B // a.world_size
    torch.manual_seed(0)
    model = make_model()
    distributed = a.world_size > 1
    if distributed:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=a.world_size)
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)
    params = list(model.parameters())
    if a.strategy == "zero1" and distributed:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=3e-4, weight_decay=0.1)
    else:
        opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1)
    torch.manual_seed(1 + rank)  # each rank its own part of the batch
    x, y = make_batch(local, "cpu")
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.precision == "bf16" else None

    def step():
        opt.zero_grad(set_to_none=True)
        if ctx:
            with ctx():
                loss = lossf(model(x), y)
        else:
            loss = lossf(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    times = []
    for _ in range(a.steps):
        if distributed:
            dist.barrier()
        t = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t)
    if distributed:  # the slowest rank sets the pace: take each step's maximum over ranks
        tt = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX)
        times = tt.tolist()
    times.sort()
    med = times[len(times) // 2]
    if rank == 0:
        print(json.dumps({
            "impl": "pytorch-" + torch.__version__ + ("-ddp-gloo" if distributed else ""),
            "workload": a.workload, "device": "cpu", "precision": a.precision,
            "strategy": a.strategy if distributed else "single", "world_size": a.world_size,
            "threads_per_rank": a.threads, "batch": B, "ms_per_step": round(med * 1e3, 3),
            f"{unit}_per_s": round(B * per / med, 1), "loss": round(float(loss), 4),
        }), flush=True)
    if distributed:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", required=True, choices=sorted(workloads()))
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="threads per rank")
    ap.add_argument("--strategy", default="ddp", choices=["ddp", "zero1"])
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--batch", type=int, default=0, help="global batch (default: the workload's)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        init_file = os.path.join(d, "rendezvous")
        if a.world_size == 1:
            run(0, a, init_file)
        else:
            mp.spawn(run, args=(a, init_file), nprocs=a.world_size, join=True)


if __name__ == "__main__":
    main()
