"""Reference cases for scaled_dot_product_attention (tests/test_attention.cpp).

PyTorch 1.13 has no F.scaled_dot_product_attention, so the reference is written out:
softmax(q @ k^T * scale + causal_mask(-inf)) @ v, differentiated by autograd. The causal mask is
top-left aligned (key j visible to query i iff j <= i), as torch's is_causal.

Grouped-query cases (k and v with Hkv < H heads) repeat K and V over each group of H / Hkv query
heads with repeat_interleave on dim 1 (torch 1.13 has no enable_gqa); autograd sums the repeated
heads' gradients, which is what the fused kernel's dK/dV must equal.

Document-mask cases (DocumentMask, Llama 3's packed-document mask) build the boolean mask
explicitly: key j is visible to query i iff j <= i and doc_ids[b, j] == doc_ids[b, i], the [T, T]
mask that the fused kernel never forms. Their documents have different lengths per batch row,
with boundaries inside and at the kernel's 64-row tiles, and a row holding a single document.

Low-precision references compute in f32 on the rounded inputs and round the output: that is
what a fused attention kernel does (torch 2.x's CPU flash kernel accumulates bf16 in f32), and
it keeps the comparison at the default bf16 tolerance instead of absorbing the rounding of a
bf16 [T, T] score matrix that a fused kernel never forms.
"""
import math

import numpy as np
import torch

from parity_lib import case, randn, transposed


def sdpa_ref(q, k, v, causal=False, scale=None, doc_ids=None):
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
    if doc_ids is not None:
        # visible iff j <= i (above) and the same document: [B, 1, T, T], broadcast over heads
        same = doc_ids[:, None, :, None] == doc_ids[:, None, None, :]
        s = s.masked_fill(~same, float("-inf"))
    return (torch.softmax(s, dim=-1) @ v).to(dtype)


def doc_ids_of(lengths_per_row):
    """[B, T] int32 document ids from each row's document lengths (ids count up from 0)."""
    rows = [np.repeat(np.arange(len(ls), dtype=np.int32), ls) for ls in lengths_per_row]
    assert len({len(r) for r in rows}) == 1, "every row must have T tokens"
    return np.stack(rows).astype(np.int32)


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
# document mask: name -> (H, Hkv, D, layout, document lengths of each batch row). T = 150 runs over
# three 64-row tiles; boundaries fall inside tiles, at a tile edge (64, 128), at position 1 (a
# one-token document first), and row 1 of "doc" is one document (the causal mask).
DOC_CONFIGS = {
    "doc": (3, 3, 16, "contig", [[20, 44, 1, 63, 22], [150], [1, 5, 58, 86]]),
    "doc_gqa": (4, 2, 32, "contig", [[64, 64, 22], [37, 40, 3, 70]]),
    "doc_bthd": (4, 1, 16, "bthd", [[10, 140], [128, 22]]),
    "doc_qkv": (2, 2, 64, "qkv", [[70, 80], [1, 1, 148]]),
}
DTYPE_CONFIGS = {
    "f32": list(CONFIGS) + list(GQA_CONFIGS) + list(DOC_CONFIGS),
    "f64": list(CONFIGS) + list(GQA_CONFIGS) + list(DOC_CONFIGS),
    "bf16": list(CONFIGS) + list(GQA_CONFIGS) + list(DOC_CONFIGS),
    "f16": ["self", "cross_causal", "bthd", "gqa", "gqa_bthd", "doc_gqa"],
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


def make_doc(name, dtype, cfg):
    H, Hkv, D, layout, lengths = cfg
    docs = doc_ids_of(lengths)
    B, T = docs.shape
    params = {"causal": True, "scale": -1.0, "layout": layout}
    # bf16 at the default tolerance, though dK/dV of a key sum up to (document length) x H / Hkv
    # terms (560 in doc_bthd): the probabilities enter dV += Z^T dO in f32. (Rounded to bf16, as
    # an earlier kernel fed them, one such sum cancelling to -0.049 came out 0.011 off.)
    amp = 1.5
    if layout == "qkv":  # as GPT hands them over: one [B, T, 3, H, D] projection (H == Hkv)
        qkv = amp * randn(name, B, T, 3, H, D)

        def fn(qkv, doc_ids):
            return sdpa_ref(bhtd(qkv[:, :, 0]), bhtd(qkv[:, :, 1]), bhtd(qkv[:, :, 2]), True, None, doc_ids)

        return case(name, fn, {"qkv": qkv, "doc_ids": docs}, dtype=dtype, params=params)
    if layout == "bthd":  # as Llama hands them over: [B, T, H, D] projections viewed as heads
        q = amp * randn(name + "q", B, T, H, D)
        k, v = (amp * randn(name + s, B, T, Hkv, D) for s in ("k", "v"))

        def fn(q, k, v, doc_ids):
            return sdpa_ref(bhtd(q), repeat_kv(bhtd(k), H), repeat_kv(bhtd(v), H), True, None, doc_ids)

        return case(name, fn, {"q": q, "k": k, "v": v, "doc_ids": docs}, dtype=dtype, params=params)
    q = amp * randn(name + "q", B, H, T, D)
    k, v = (amp * randn(name + s, B, Hkv, T, D) for s in ("k", "v"))

    def fn(q, k, v, doc_ids):
        return sdpa_ref(q, repeat_kv(k, H), repeat_kv(v, H), True, None, doc_ids)

    return case(name, fn, {"q": q, "k": k, "v": v, "doc_ids": docs}, dtype=dtype, params=params)


def cases():
    for dtype, names in DTYPE_CONFIGS.items():
        for cfg_name in names:
            if cfg_name in DOC_CONFIGS:
                yield make_doc(f"sdpa_{cfg_name}_{dtype}", dtype, DOC_CONFIGS[cfg_name])
            elif cfg_name in GQA_CONFIGS:
                yield make_gqa(f"sdpa_{cfg_name}_{dtype}", dtype, GQA_CONFIGS[cfg_name])
            else:
                yield make(f"sdpa_{cfg_name}_{dtype}", dtype, CONFIGS[cfg_name])
