#!/usr/bin/env python3
"""PyTorch side of the op micro-benchmark: the cases of micro_cases.json, timed the same way as
bench/micro_ops.cpp (warm-up 3, then the median of --iters runs). One JSON line per case.
--device cuda runs on the GPU (each run ends with torch.cuda.synchronize()); --sdpa picks the
fused attention backend of scaled_dot_product_attention there (cudnn, flash, efficient, math;
default: PyTorch's own choice), to measure cuDNN's fused attention beside the engine's kernel."""
import contextlib
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

DT = {"f32": torch.float32, "bf16": torch.bfloat16}


def attention(q, k, v, causal):
    # PyTorch 1.13 (Debian) has no fused scaled_dot_product_attention; newer PyTorch does.
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    s = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
    if causal:
        T = q.shape[-2]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def doc_mask(B, T, L, device):
    """[B, 1, T, T] bool, True where key j is visible to query i: j <= i in the same document, the
    documents of micro_ops.cpp's bench_doc_ids (lengths cycling L/2, 3L/2, 3L/4, 5L/4, L; row b
    from entry b % 5)."""
    cycle = [L // 2, 3 * L // 2, 3 * L // 4, 5 * L // 4, L]
    rows = []
    for b in range(B):
        ids, d, k = [], 0, b % 5
        while len(ids) < T:
            ids += [d] * max(1, cycle[k % 5])
            d, k = d + 1, k + 1
        rows.append(ids[:T])
    docs = torch.tensor(rows)
    same = docs[:, None, :, None] == docs[:, None, None, :]
    return (same & torch.ones(T, T, dtype=torch.bool).tril()).to(device)


def masked_attention(q, k, v, mask):
    """Attention under an explicit boolean mask; k and v repeated over grouped query heads."""
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    s = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
    return torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v


def make(case, dtype, layout, device):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype).to(device)
    op = case["op"]
    if op == "matmul":
        a, b = r(case["M"], case["K"]), r(case["K"], case["N"])
        return [a, b], lambda a, b: a @ b
    if op == "conv2d":
        x, w = r(case["N"], case["C"], case["H"], case["W"]), r(case["O"], case["C"], case["k"], case["k"]) * 0.1
        if layout == "nhwc":
            x = x.contiguous(memory_format=torch.channels_last)
            w = w.contiguous(memory_format=torch.channels_last)
        return [x, w], lambda x, w: F.conv2d(x, w, None, case["stride"], case["pad"])
    if op in ("batch_norm", "max_pool2d"):
        x = r(case["N"], case["C"], case["H"], case["W"])
        if layout == "nhwc":
            x = x.contiguous(memory_format=torch.channels_last)
        if op == "max_pool2d":
            return [x], lambda x: F.max_pool2d(x, case["k"], case["stride"], case["pad"])
        w, b = r(case["C"]), r(case["C"])
        if case.get("residual"):
            res = r(case["N"], case["C"], case["H"], case["W"])
            if layout == "nhwc":
                res = res.contiguous(memory_format=torch.channels_last)
            return [x, res, w, b], lambda x, res, w, b: torch.relu(F.batch_norm(x, None, None, w, b, training=True) + res)
        act = torch.relu if case["relu"] else (lambda y: y)
        return [x, w, b], lambda x, w, b: act(F.batch_norm(x, None, None, w, b, training=True))
    if op == "layer_norm":
        x, w, b = r(case["rows"], case["cols"]), r(case["cols"]), r(case["cols"])
        return [x, w, b], lambda x, w, b: F.layer_norm(x, (case["cols"],), w, b)
    if op == "softmax":
        return [r(case["rows"], case["cols"])], lambda x: torch.softmax(x, -1)
    if op == "attention":
        shape = (case["B"], case["H"], case["T"], case["D"])
        if case.get("qkv", False):
            # q, k, v as permuted views of one [B, T, 3, H, D] projection, as GPT's layers pass them.
            def views(qkv):
                q, k, v = (qkv.select(2, i).permute(0, 2, 1, 3) for i in range(3))
                return attention(q, k, v, case["causal"])
            return [r(case["B"], case["T"], 3, case["H"], case["D"])], views
        kv = (case["B"], case.get("Hkv", case["H"]), case["T"], case["D"])
        if case.get("bthd", False):
            # q, k, v as [B, T, H, D] tensors read through transposed views, as the Llama layers pass them.
            causal = torch.ones(case["T"], case["T"], dtype=torch.bool, device=device).tril()
            def transposed(q, k, v):
                q, k, v = (t.transpose(1, 2) for t in (q, k, v))
                if k.shape[1] != q.shape[1]:
                    return masked_attention(q, k, v, causal)
                return attention(q, k, v, case["causal"])
            bthd = lambda s: (s[0], s[2], s[1], s[3])
            return [r(*bthd(shape)), r(*bthd(kv)), r(*bthd(kv))], transposed
        if "doc_len" in case or "Hkv" in case:
            mask = doc_mask(case["B"], case["T"], case["doc_len"], device) if "doc_len" in case else \
                torch.ones(case["T"], case["T"], dtype=torch.bool, device=device).tril()
            return [r(*shape), r(*kv), r(*kv)], lambda q, k, v: masked_attention(q, k, v, mask)
        return [r(*shape), r(*shape), r(*shape)], lambda q, k, v: attention(q, k, v, case["causal"])
    if op == "cat":
        shape = (case["B"], case["H"], case["T"], case["D"])
        return [r(*shape), r(*shape), r(*shape)], lambda *xs: torch.cat([x.permute(0, 2, 1, 3).unsqueeze(2) for x in xs], 2)
    if op == "activation":
        fns = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "silu": F.silu, "gelu": F.gelu,
               "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "softplus": F.softplus,
               "mish": F.mish, "log": torch.log}
        x = r(case["rows"], case["cols"])
        if case["fn"] == "log":
            x = x.abs() + 0.01  # log's domain
        return [x], fns[case["fn"]]
    if op == "swiglu":
        # F.silu(gate) * up on the two halves of one [rows, 2F] projection (PyTorch has no fused form).
        f = case["cols"]
        return [r(case["rows"], 2 * f)], lambda gu: F.silu(gu[:, :f]) * gu[:, f:]
    if op == "rope":
        # Hugging Face Llama's q * cos + rotate_half(q) * sin on q [B, T, H, D].
        t, d = case["T"], case["D"]
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        emb = torch.outer(torch.arange(t, dtype=torch.float64), inv).repeat(1, 2)
        cos, sin = (e.float().to(device)[:, None, :] for e in (emb.cos(), emb.sin()))

        def rope(q):
            rot = torch.cat((-q[..., d // 2:], q[..., : d // 2]), -1)
            return q * cos.to(q.dtype) + rot * sin.to(q.dtype)
        return [r(case["B"], t, case["H"], d)], rope
    raise ValueError(op)


def sdpa_backend(name):
    if not name:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel({"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                        "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name])


def time_case(case, dtype_name, layout, mode, iters, device):
    inputs, fn = make(case, DT[dtype_name], layout, device)
    wait = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    backward = mode == "fwd+bwd"
    if backward:
        for t in inputs:
            t.requires_grad_(True)
    times = []
    for i in range(3 + iters):
        for t in inputs:
            t.grad = None
        wait()
        t0 = time.perf_counter()
        if backward:
            out = fn(*inputs)
            out.backward(torch.ones_like(out))
        else:
            with torch.no_grad():
                out = fn(*inputs)
        wait()
        dt = time.perf_counter() - t0
        if i >= 3:
            times.append(dt * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--filter", default="", help="run only cases whose op or name contains this")
    ap.add_argument("--cases", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "micro_cases.json"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sdpa", default="", choices=["", "cudnn", "flash", "efficient", "math"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    spec = json.load(open(args.cases))
    for case in spec["cases"]:
        if args.filter and args.filter not in case["op"] and args.filter not in case["name"]:
            continue
        for layout in spec["layouts"].get(case["op"], [""]):
            for dt in spec["dtypes"]:
                for mode in spec["modes"]:
                    try:
                        with sdpa_backend(args.sdpa):
                            ms = time_case(case, dt, layout, mode, args.iters, args.device)
                        res = {"ms": round(ms, 4)}
                    except RuntimeError as e:  # e.g. a bf16 kernel missing in this PyTorch build
                        res = {"error": str(e).split("\n")[0]}
                    extra = {"device": args.device, "sdpa": args.sdpa} if args.device != "cpu" else {}
                    print(json.dumps({"impl": "pytorch", "version": torch.__version__, "op": case["op"],
                                      "case": case["name"], "layout": layout, "dtype": dt, "mode": mode,
                                      "threads": args.threads, **extra, **res}), flush=True)


if __name__ == "__main__":
    main()
