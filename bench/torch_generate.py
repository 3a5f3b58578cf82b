#!/usr/bin/env python3
"""Generation speed in PyTorch: the peer of bench/generate_tokens.cpp.

BENCH.md's gpt-mini and llama-mini (torch_bench.py's modules, random weights), batch 1, greedy: the
prompt in one forward, then one token per step, each attending over a cache of the earlier keys
and values, as Hugging Face's generate loop runs with past_key_values (keys and values grow by
torch.cat each step; Llama's cache keeps its kv_heads heads and repeats them for attention, as
transformers' repeat_kv does). Run with Debian's interpreter and the OpenMP OpenBLAS (BENCH.md):

    LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp OMP_NUM_THREADS=2 \\
        /usr/bin/python3 bench/torch_generate.py --model gpt-mini --prompt 32 --new 96

Prints one JSON line: the median of --rounds runs after --warmup ones, with the fields of
generate_tokens' line.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_bench  # noqa: E402  (the workloads' modules, beside this file)


def attend(q, k, v, past_len):
    """Causal attention of q [B, H, T, D] at positions past_len.. over k, v [B, H, past_len + T, D]."""
    T, S = q.size(2), k.size(2)
    if hasattr(F, "scaled_dot_product_attention"):
        if T == 1:
            return F.scaled_dot_product_attention(q, k, v)
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=past_len)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    if T > 1:  # PyTorch < 2.0
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=past_len)
        att = att.masked_fill(~mask, float("-inf"))
    return att.softmax(-1) @ v


def gpt_forward(model, idx, past):
    """torch_bench.GPT on idx [B, T] after the cached positions: logits and the grown cache."""
    B, T = idx.shape
    start = past[0][0].size(2) if past else 0
    x = model.wte(idx) + model.wpe(torch.arange(start, start + T, device=idx.device))
    cache = []
    for i, b in enumerate(model.blocks):
        C = x.size(-1)
        q, k, v = b.qkv(b.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, b.h, C // b.h).transpose(1, 2) for t in (q, k, v))
        if past:
            k, v = torch.cat((past[i][0], k), dim=2), torch.cat((past[i][1], v), dim=2)
        cache.append((k, v))
        y = attend(q, k, v, start)
        x = x + b.proj(y.transpose(1, 2).reshape(B, T, C))
        x = x + b.fc2(F.gelu(b.fc(b.ln2(x)), approximate="tanh"))
    return model.head(model.lnf(x)), cache


def llama_forward(model, idx, past):
    """torch_bench.Llama on idx [B, T] after the cached positions: logits and the grown cache."""
    B, T = idx.shape
    start = past[0][0].size(2) if past else 0
    inv = 1.0 / (model.theta ** (torch.arange(0, model.hd, 2, device=idx.device).float() / model.hd))
    f = torch.outer(torch.arange(start, start + T, device=idx.device).float(), inv)
    emb = torch.cat((f, f), dim=-1)
    x = model.embed(idx)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    cache = []
    for i, b in enumerate(model.blocks):
        a = b.n1(x)
        q = b.q(a).view(B, T, b.h, b.hd).transpose(1, 2)
        k = b.k(a).view(B, T, b.kvh, b.hd).transpose(1, 2)
        v = b.v(a).view(B, T, b.kvh, b.hd).transpose(1, 2)
        q = q * cos + torch_bench.rotate_half(q) * sin
        k = k * cos + torch_bench.rotate_half(k) * sin
        if past:
            k, v = torch.cat((past[i][0], k), dim=2), torch.cat((past[i][1], v), dim=2)
        cache.append((k, v))  # kv_heads heads: repeated for the product only
        y = attend(q, k.repeat_interleave(b.h // b.kvh, dim=1), v.repeat_interleave(b.h // b.kvh, dim=1), start)
        x = x + b.o(y.transpose(1, 2).reshape(B, T, -1))
        m = b.n2(x)
        x = x + b.down(F.silu(b.gate(m)) * b.up(m))
    return model.head(model.norm(x)), cache


MODELS = {
    # name: (model, its cached forward, vocabulary); sizes as torch_bench.workloads()
    "gpt-mini": (lambda: torch_bench.GPT(512, 128, 4, 256, 4), gpt_forward, 512),
    "llama-mini": (lambda: torch_bench.Llama(1000, 4, 256, 8, 2, 688, tied=False), llama_forward, 1000),
}


def generate(model, forward, prompt, new_tokens):
    """Greedy: the prompt in one forward, then new_tokens - 1 single-token forwards."""
    logits, past = forward(model, prompt, None)
    out = []
    for i in range(new_tokens):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        out.append(int(nxt))
        if i + 1 == new_tokens:
            break
        logits, past = forward(model, nxt, past)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt-mini", choices=sorted(MODELS))
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--check", action="store_true",
                    help="also check that the cached loop's tokens equal a full forward's for every step")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    make, forward, vocab = MODELS[a.model]
    model = make().to(dev).eval()
    prompt = torch.randint(0, vocab, (1, a.prompt), device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    totals, prefills = [], []
    with torch.inference_mode():
        if a.check:
            ids, got = prompt, generate(model, forward, prompt, a.new)
            for t in got:
                assert int(model(ids)[:, -1].argmax(-1)) == t, "the cached loop differs from the full forward"
                ids = torch.cat((ids, torch.tensor([[t]], device=dev)), dim=1)
        for r in range(a.warmup + a.rounds):
            t0 = time.perf_counter()
            generate(model, forward, prompt, a.new)
            sync()
            total = time.perf_counter() - t0
            t0 = time.perf_counter()
            float(forward(model, prompt, None)[0][0, -1, 0])  # the prompt alone, its logits read back
            sync()
            prefill = time.perf_counter() - t0
            if r >= a.warmup:
                totals.append(total)
                prefills.append(prefill)
    total, prefill = statistics.median(totals), statistics.median(prefills)
    out = {
        "impl": "pytorch-" + torch.__version__, "workload": a.model, "task": "generate", "cache": True,
        "device": a.device, "precision": "fp32", "batch": 1, "threads": torch.get_num_threads(),
        "prompt_tokens": a.prompt, "new_tokens": a.new, "ms_total": round(total * 1e3, 2),
        "prefill_ms": round(prefill * 1e3, 2), "ms_per_new_token": round((total - prefill) * 1e3 / max(a.new - 1, 1), 3),
        "tokens_per_s": round(a.new / total, 1), "params": sum(p.numel() for p in model.parameters()),
    }
    if dev.type == "cpu":
        out["cpu_isa"] = torch_bench.cpu_isa()
        out["blas"] = torch_bench.blas_library()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
