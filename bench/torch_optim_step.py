#!/usr/bin/env python3
"""PyTorch side of bench/optim_step.cpp: one optimizer step over the gpt-mini parameters
(decay / no_decay groups), foreach (multi-tensor) and single-tensor implementations.
Usage: torch_optim_step.py [--threads N] [--iters N]. One JSON line per optimizer."""
import argparse
import json
import statistics
import time

import torch


def gpt_mini_params(V=512, T=128, L=4, C=256):
    g = torch.Generator().manual_seed(0)
    shapes = [("wte", (V, C)), ("wpe", (T, C))]
    for l in range(L):
        h = f"h{l}."
        shapes += [(h + "ln_1.weight", (C,)), (h + "ln_1.bias", (C,)), (h + "attn.c_attn.weight", (3 * C, C)),
                   (h + "attn.c_attn.bias", (3 * C,)), (h + "attn.c_proj.weight", (C, C)),
                   (h + "attn.c_proj.bias", (C,)), (h + "ln_2.weight", (C,)), (h + "ln_2.bias", (C,)),
                   (h + "mlp.c_fc.weight", (4 * C, C)), (h + "mlp.c_fc.bias", (4 * C,)),
                   (h + "mlp.c_proj.weight", (C, 4 * C)), (h + "mlp.c_proj.bias", (C,))]
    shapes += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    params = []
    for _, s in shapes:
        p = (torch.randn(s, generator=g) * 0.02).requires_grad_()
        p.grad = torch.randn(s, generator=g) * 0.01
        params.append(p)
    return params


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    params = gpt_mini_params()
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    makers = {"adamw": lambda fe: torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.999), eps=1e-8, foreach=fe),
              "adam": lambda fe: torch.optim.Adam(groups, lr=3e-4, foreach=fe),
              "sgd": lambda fe: torch.optim.SGD(groups, lr=3e-4, momentum=0.9, foreach=fe)}
    for kind, make in makers.items():
        for foreach in (True, False):
            opt = make(foreach)
            for _ in range(3):
                opt.step()
            ms = []
            for _ in range(a.iters):
                t0 = time.perf_counter()
                opt.step()
                ms.append((time.perf_counter() - t0) * 1e3)
            print(json.dumps({"impl": "pytorch", "workload": "optim-gpt-mini", "optimizer": kind,
                              "foreach": foreach, "threads": a.threads, "tensors": len(params),
                              "params": sum(p.numel() for p in params),
                              "ms_per_step": round(statistics.median(ms), 3)}))


if __name__ == "__main__":
    main()
