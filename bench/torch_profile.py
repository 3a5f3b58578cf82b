"""PyTorch's side of `fasttrain bench --profile`: one BENCH.md workload's training step, as
torch_bench.py runs it, under torch.profiler, printed op by op (self CPU time per step, by input
shapes) so each fasttrain kernel can be set beside the PyTorch op doing the same work.

Usage: /usr/bin/python3 bench/torch_profile.py --workload cnn-mini [--precision bf16]
       [--channels-last] [--threads 2] [--batch N] [--warmup 5] [--steps 10] [--rows 30]
(source bench/peer_env.sh first, as for torch_bench.py).
"""
import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_bench  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True, choices=sorted(torch_bench.workloads()))
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rows", type=int, default=30)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    make_model, make_batch, lossf, batch, _, _ = torch_bench.workloads()[a.workload]
    model = make_model()
    x, y = make_batch(a.batch or batch, "cpu")
    if a.channels_last and x.dim() == 4:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = lossf(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        for _ in range(a.steps):
            step()
    print(f"{a.workload} {a.precision}{' channels-last' if a.channels_last else ''}: {a.steps} steps; "
          f"divide the times by {a.steps} for a step")
    print(p.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=a.rows,
                                                          max_name_column_width=40, max_shapes_column_width=70))


if __name__ == "__main__":
    main()
