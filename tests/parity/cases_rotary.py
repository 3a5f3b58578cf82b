"""Reference cases for rotary_embedding and rope_tables (tests/test_rotary.cpp).

Hugging Face Llama's formulas written out in torch (transformers is not a dependency): inverse
frequencies theta^(-2i/D), optionally rescaled as _compute_llama3_parameters does, emb =
cat(freqs, freqs), cos = emb.cos(), sin = emb.sin(), and q * cos + rotate_half(q) * sin with
rotate_half(x) = cat(-x[D/2:], x[:D/2]), applied to [B, T, H, D] (unsqueeze_dim=2).

The tables are computed in f64, as rope_tables does (HF forms the angles in f32; see
include/fasttrain/ops/rotary.h), and handed to the kernel in f32 (f64 for f64 x), so the references
use the f64 tables rounded the same way. Low-precision x is rotated in f32 on the rounded inputs
and rounded once, as the kernel does.
"""
import math

import numpy as np
import torch

from parity_lib import Layout, case, randn, transposed

LLAMA32 = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
SHORT = {"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 2.0, "original_max_position_embeddings": 32}


def inv_freq(dim, theta, scaling):
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if scaling is None:
        return inv
    factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / lo, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / hi) * ~(wavelen > old / lo)
    return torch.where(medium, smoothed, scaled)


def hf_tables(positions, dim, theta, scaling):
    """HF's [T, D] cos and sin (each half repeated), from integer positions."""
    freqs = torch.outer(positions.to(torch.float64), inv_freq(dim, theta, scaling))
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rope(x, theta, scaling):
    """x [B, T, H, D]; tables in f64 rounded to f32 (f64 for f64 x), math in x's compute type."""
    dtype = x.dtype
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    cos, sin = hf_tables(torch.arange(x.shape[1]), x.shape[-1], theta, scaling)
    cos, sin = cos.to(compute)[:, None, :], sin.to(compute)[:, None, :]
    xc = x.to(compute)
    return (xc * cos + rotate_half(xc) * sin).to(dtype)


def bthd_of_qkv(qkv):
    """q of a fused [B, T, 3, H, D] projection output: strides no single row stride describes."""
    return qkv[:, :, 0]


# name -> (B, T, H, D, theta, scaling, layout)
CONFIGS = {
    "basic": (2, 7, 3, 16, 10000.0, None, "contig"),
    "llama32": (1, 9, 2, 64, 500000.0, LLAMA32, "contig"),
    "short_scaled": (2, 40, 1, 16, 10000.0, SHORT, "contig"),
    "qkv": (2, 5, 2, 8, 10000.0, None, "qkv"),
    "wide": (1, 3, 2, 600, 10000.0, None, "contig"),
    "transposed": (1, 4, 2, 6, 10000.0, None, "transposed"),
}


def params_of(theta, scaling, layout):
    return {"theta": theta, "scaling": scaling, "layout": layout}


def rope_case(name, dtype, cfg):
    B, T, H, D, theta, scaling, layout = cfg
    params = params_of(theta, scaling, layout)
    if layout == "qkv":
        return case(name, lambda qkv: apply_rope(bthd_of_qkv(qkv), theta, scaling),
                    {"qkv": randn(name, B, T, 3, H, D)}, dtype=dtype, params=params)
    x = randn(name, B, T, H, D)
    return case(name, lambda x: apply_rope(x, theta, scaling), {"x": transposed(x) if layout == "transposed" else x},
                dtype=dtype, params=params)


def table_case(name, dtype, T, D, theta, scaling):
    """rope_tables against HF's [T, D] tables' first halves, from the positions 0..T-1."""
    def fn(pos):
        cos, sin = hf_tables(pos, D, theta, scaling)
        return cos[:, : D // 2].to(cos.dtype if dtype == "f64" else torch.float32), \
            sin[:, : D // 2].to(sin.dtype if dtype == "f64" else torch.float32)

    return case(name, fn, {"pos": np.arange(T, dtype=np.int64)}, dtype=dtype, grad=False,
                params={"theta": theta, "scaling": scaling, "head_dim": D})


def cases():
    for dtype in ("f32", "f64", "bf16", "f16"):
        for cfg_name, cfg in CONFIGS.items():
            yield rope_case(f"rope_{cfg_name}_{dtype}", dtype, cfg)
    for dtype in ("f32", "f64"):
        yield table_case(f"rope_tables_plain_{dtype}", dtype, 50, 16, 10000.0, None)
        yield table_case(f"rope_tables_llama32_{dtype}", dtype, 300, 64, 500000.0, LLAMA32)
        yield table_case(f"rope_tables_short_scaled_{dtype}", dtype, 100, 32, 10000.0, SHORT)
