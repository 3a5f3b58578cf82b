"""Reference cases for scaled_dot_product_attention (tests/test_attention.cpp).

PyTorch 1.13 has no F.scaled_dot_product_attention, so the reference is written out:
softmax(q @ k^T * scale + causal_mask(-inf)) @ v, differentiated by autograd. The causal mask is
top-left aligned (key j visible to query i iff j <= i), as torch's is_causal.

Low-precision references compute in f32 on the rounded inputs and round the output: that is
what a fused attention kernel does (torch 2.x's CPU flash kernel accumulates bf16 in f32), and
it keeps the comparison at the default bf16 tolerance instead of absorbing the rounding of a
bf16 [T, T] score matrix that a fused kernel never forms.
"""
import math

import numpy as np
import torch

from parity_lib import case, randn, transposed


def sdpa_ref(q, k, v, causal=False, scale=None):
    dtype = q.dtype
    if dtype != torch.float64:
        q, k, v = q.float(), k.float(), v.float()
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    s = (q @ k.transpose(-2, -1)) * scale
    if causal:
        tq, tk = s.shape[-2:]
        mask = torch.ones(tq, tk, dtype=torch.bool).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    return (torch.softmax(s, dim=-1) @ v).to(dtype)


def bhtd(t):
    """[B, T, H, D] storage viewed as [B, H, T, D] (the layout a fused qkv projection yields)."""
    return t.permute(0, 2, 1, 3)


# name -> (B, H, Tq, Tk, D, causal, scale, layout)
#   layout: "contig"; "transposed" (all dims reversed: head dim not dense, kernel packs tiles);
#   "bthd" (q, k, v stored [B, T, H, D] and permuted); "qkv" (one [B, T, 3, H, D] tensor split);
#   "mqa" (k and v are [B, 1, T, D] broadcast over the heads: zero head stride).
CONFIGS = {
    "self": (2, 3, 40, 40, 16, False, None, "contig"),
    "causal": (2, 2, 70, 70, 64, True, None, "contig"),
    "long": (1, 2, 130, 130, 16, False, None, "contig"),
    "cross": (2, 2, 37, 53, 16, False, 0.3, "contig"),
    "cross_causal": (1, 2, 37, 53, 64, True, None, "contig"),
    "causal_q_gt_k": (1, 2, 53, 37, 16, True, 0.5, "contig"),
    "transposed": (2, 2, 37, 53, 16, True, None, "transposed"),
    "bthd": (2, 3, 45, 45, 16, True, None, "bthd"),
    "qkv": (2, 2, 33, 33, 16, True, None, "qkv"),
    "mqa": (2, 3, 20, 29, 16, False, None, "mqa"),
}
DTYPE_CONFIGS = {
    "f32": list(CONFIGS),
    "f64": list(CONFIGS),
    "bf16": list(CONFIGS),
    "f16": ["self", "cross_causal", "bthd"],
}


def make(name, dtype, cfg):
    B, H, Tq, Tk, D, causal, scale, layout = cfg
    params = {"causal": causal, "scale": scale if scale is not None else -1.0, "layout": layout}
    # inputs scaled so that scores spread over a few units: a softmax far from uniform
    amp = 1.5
    if layout == "qkv":
        qkv = amp * randn(name, B, Tq, 3, H, D)

        def fn(qkv):
            return sdpa_ref(bhtd(qkv[:, :, 0]), bhtd(qkv[:, :, 1]), bhtd(qkv[:, :, 2]), causal, scale)

        return case(name, fn, {"qkv": qkv}, dtype=dtype, params=params)
    if layout == "bthd":
        q, k, v = (amp * randn(name + s, B, T, H, D) for s, T in (("q", Tq), ("k", Tk), ("v", Tk)))

        def fn(q, k, v):
            return sdpa_ref(bhtd(q), bhtd(k), bhtd(v), causal, scale)

        return case(name, fn, {"q": q, "k": k, "v": v}, dtype=dtype, params=params)
    if layout == "mqa":
        q = amp * randn(name + "q", B, H, Tq, D)
        k, v = (amp * randn(name + s, B, 1, Tk, D) for s in ("k", "v"))

        def fn(q, k, v):
            return sdpa_ref(q, k.expand(B, H, Tk, D), v.expand(B, H, Tk, D), causal, scale)

        return case(name, fn, {"q": q, "k": k, "v": v}, dtype=dtype, params=params)
    q, k, v = (amp * randn(name + s, B, H, T, D) for s, T in (("q", Tq), ("k", Tk), ("v", Tk)))
    wrap = transposed if layout == "transposed" else (lambda a: a)

    def fn(q, k, v):
        return sdpa_ref(q, k, v, causal, scale)

    return case(name, fn, {"q": wrap(q), "k": wrap(k), "v": wrap(v)}, dtype=dtype, params=params)


def cases():
    for dtype, names in DTYPE_CONFIGS.items():
        for cfg_name in names:
            yield make(f"sdpa_{cfg_name}_{dtype}", dtype, CONFIGS[cfg_name])
