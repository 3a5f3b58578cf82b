"""Reference cases for scaled_dot_product_attention (tests/test_attention.cpp).

PyTorch 1.13 has no F.scaled_dot_product_attention, so the reference is written out:
softmax(q @ k^T * scale + causal_mask(-inf)) @ v, differentiated by autograd. The causal mask is
top-left aligned (key j visible to query i iff j <= i), as torch's is_causal.

Grouped-query cases (k and v with Hkv < H heads) repeat K and V over each group of H / Hkv query
heads with repeat_interleave on dim 1 (torch 1.13 has no enable_gqa); autograd sums the repeated
heads' gradients, which is what the fused kernel's dK/dV must equal.

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


def repeat_kv(t, heads):
    """[B, Hkv, T, D] -> [B, heads, T, D]: KV head j serves query heads j * g .. j * g + g - 1.
    16-bit inputs are repeated in f32, so the backward sums a group's gradients in f32 and rounds
    once, as the fused kernel does (summed in bf16, the reference moved dk/dv elements by up to 27%)."""
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.float()
    return t.repeat_interleave(heads // t.shape[1], dim=1)


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
# grouped-query attention: name -> (B, H, Hkv, Tq, Tk, D, causal, scale, layout: "contig" or "bthd")
GQA_CONFIGS = {
    "gqa": (2, 6, 2, 33, 33, 16, True, None, "contig"),
    "gqa_cross": (1, 4, 2, 37, 53, 16, False, 0.3, "contig"),
    "gqa_causal_q_gt_k": (1, 4, 2, 53, 37, 64, True, None, "contig"),
    "gqa_kv1": (2, 4, 1, 20, 29, 16, True, None, "contig"),
    "gqa_bthd": (2, 8, 2, 45, 45, 16, True, None, "bthd"),
}
DTYPE_CONFIGS = {
    "f32": list(CONFIGS) + list(GQA_CONFIGS),
    "f64": list(CONFIGS) + list(GQA_CONFIGS),
    "bf16": list(CONFIGS) + list(GQA_CONFIGS),
    "f16": ["self", "cross_causal", "bthd", "gqa", "gqa_bthd"],
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


def make_gqa(name, dtype, cfg):
    B, H, Hkv, Tq, Tk, D, causal, scale, layout = cfg
    params = {"causal": causal, "scale": scale if scale is not None else -1.0, "layout": layout}
    amp = 1.5
    if layout == "bthd":
        q = amp * randn(name + "q", B, Tq, H, D)
        k, v = (amp * randn(name + s, B, Tk, Hkv, D) for s in ("k", "v"))

        def fn(q, k, v):
            return sdpa_ref(bhtd(q), repeat_kv(bhtd(k), H), repeat_kv(bhtd(v), H), causal, scale)

        return case(name, fn, {"q": q, "k": k, "v": v}, dtype=dtype, params=params)
    q = amp * randn(name + "q", B, H, Tq, D)
    k, v = (amp * randn(name + s, B, Hkv, Tk, D) for s in ("k", "v"))

    def fn(q, k, v):
        return sdpa_ref(q, repeat_kv(k, H), repeat_kv(v, H), causal, scale)

    return case(name, fn, {"q": q, "k": k, "v": v}, dtype=dtype, params=params)


def cases():
    for dtype, names in DTYPE_CONFIGS.items():
        for cfg_name in names:
            if cfg_name in GQA_CONFIGS:
                yield make_gqa(f"sdpa_{cfg_name}_{dtype}", dtype, GQA_CONFIGS[cfg_name])
            else:
                yield make(f"sdpa_{cfg_name}_{dtype}", dtype, CONFIGS[cfg_name])
