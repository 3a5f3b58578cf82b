"""Reference cases for the elementwise family (tests/test_elementwise.cpp).

Unary and binary cases carry op=<name in the C++ op lists>; test_elementwise.cpp runs every
such case from the manifest and fails for a listed op without one. A new activation is one
line in UNARY (or POSITIVE for ops defined for x > 0).
"""
import numpy as np
import torch
import torch.nn.functional as F

from parity_lib import broadcast, case, randn, rng, strided, transposed

UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
    "square": torch.square, "softplus": F.softplus,
    # PyTorch 1.13 has no bf16 CPU mish: f32 on the rounded input, rounded, as the bf16 kernel here computes
    "mish": lambda x: F.mish(x.float()).to(x.dtype) if x.dtype == torch.bfloat16 else F.mish(x),
}
POSITIVE = {"log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt}
BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
          "maximum": torch.maximum, "minimum": torch.minimum}


def silu_mul_ref(gate, up):
    """F.silu(g) * u; 16-bit inputs in f32 on the rounded values, rounded once, as the fused kernel does."""
    if gate.dtype in (torch.bfloat16, torch.float16):
        return (F.silu(gate.float()) * up.float()).to(gate.dtype)
    return F.silu(gate) * up


def silu_mul_cases(dtype):
    """silu_mul: separate operands; gate and up as the two halves of one [B, T, 2F] projection (rows
    read in place, row stride 2F, F past one 256-element tile); transposed operands (copied first)."""
    n = f"silu_mul_{dtype}"
    yield case(n, silu_mul_ref, {"gate": 2 * randn(n, 6, 37), "up": randn(n + "u", 6, 37)}, dtype=dtype)
    n = f"silu_mul_{dtype}_halves"
    F2 = 300

    def halves(gu):
        return silu_mul_ref(gu[..., :F2], gu[..., F2:])

    yield case(n, halves, {"gu": 2 * randn(n, 2, 3, 2 * F2)}, dtype=dtype)
    n = f"silu_mul_{dtype}_transposed"
    yield case(n, silu_mul_ref, {"gate": transposed(2 * randn(n, 5, 9)), "up": transposed(randn(n + "u", 5, 9))},
               dtype=dtype)


def cases():
    for dtype in ("f32", "f64", "bf16", "f16"):
        yield from silu_mul_cases(dtype)
        for name, fn in UNARY.items():
            n = f"{name}_{dtype}"
            yield case(n, lambda x, fn=fn: fn(x), {"x": randn(n, 7, 33)}, dtype=dtype, op=name)
            n = f"{name}_{dtype}_transposed"
            yield case(n, lambda x, fn=fn: fn(x), {"x": transposed(randn(n, 5, 6))}, dtype=dtype, op=name)
        for name, fn in POSITIVE.items():
            n = f"{name}_{dtype}"
            yield case(n, lambda x, fn=fn: fn(x), {"x": np.abs(randn(n, 7, 33)) + 0.1}, dtype=dtype, op=name)
            n = f"{name}_{dtype}_strided"
            yield case(n, lambda x, fn=fn: fn(x), {"x": strided(np.abs(randn(n, 4, 9)) + 0.1)}, dtype=dtype, op=name)
        for name, fn in BINARY.items():
            n = f"{name}_{dtype}"
            b = randn(n + "b", 6, 10)
            if name == "div":
                b = np.sign(b) * (np.abs(b) + 0.5)
            yield case(n, lambda a, b, fn=fn: fn(a, b), {"a": randn(n, 6, 10), "b": b}, dtype=dtype, op=name)
            n = f"{name}_{dtype}_bcast"
            b = randn(n + "b", 1, 10)
            if name == "div":
                b = np.sign(b) * (np.abs(b) + 0.5)
            yield case(n, lambda a, b, fn=fn: fn(a, b), {"a": transposed(randn(n, 3, 4, 10)), "b": b}, dtype=dtype,
                       op=name)
            n = f"{name}_{dtype}_expand"
            yield case(n, lambda a, b, fn=fn: fn(a, b), {"a": randn(n, 5, 8), "b": broadcast(np.abs(randn(n + "b", 1, 8)) + 0.5, (5, 8))}, dtype=dtype,
                       op=name)
    # softplus returns x itself past its threshold, 20: inputs on both sides
    n = "softplus_f32_threshold"
    yield case(n, lambda x: F.softplus(x), {"x": 12 * randn(n, 4, 9)}, op="softplus")
    # pow with tensor exponent and scalar exponent
    n = "pow_f64"
    yield case(n, lambda a, b: torch.pow(a, b), {"a": np.abs(randn(n, 4, 5)) + 0.2, "b": randn(n + "b", 4, 5)}, dtype="f64",
               op="pow")
    n = "pow_scalar_f32"
    yield case(n, lambda a: torch.pow(a, 3.5), {"a": np.abs(randn(n, 4, 5)) + 0.2}, dtype="f32", params={"e": 3.5})
    # clamp with both bounds and one bound
    n = "clamp_f32"
    yield case(n, lambda x: torch.clamp(x, -0.5, 0.7), {"x": randn(n, 8, 9)}, params={"lo": -0.5, "hi": 0.7})
    n = "clamp_min_f64_transposed"
    yield case(n, lambda x: torch.clamp(x, min=-0.2), {"x": transposed(randn(n, 5, 7))}, dtype="f64", params={"lo": -0.2})
    # where / masked_fill with broadcast masks
    n = "where_f32"
    cond = rng(n).random((4, 1, 6)) > 0.5
    yield case(n, lambda c, a, b: torch.where(c, a, b), {"c": cond, "a": randn(n, 4, 5, 6), "b": randn(n + "b", 5, 6)})
    n = "masked_fill_f32"
    mask = rng(n).random((1, 7)) > 0.5
    yield case(n, lambda x, m: x.masked_fill(m, -3.0), {"x": randn(n, 3, 7), "m": mask}, params={"value": -3.0})
    n = "masked_fill_bf16_transposed"
    mask = rng(n).random((6, 5)) > 0.5
    yield case(n, lambda x, m: x.masked_fill(m, 2.0), {"x": transposed(randn(n, 6, 5)), "m": mask}, dtype="bf16", params={"value": 2.0})

    # comparisons give bool tensors; integer-valued inputs make ties common
    for dtype in ("f32", "bf16", "f64"):
        for name in ("eq", "ne", "lt", "le", "gt", "ge"):
            n = f"cmp_{name}_{dtype}"
            g = rng(n)
            a = g.integers(-3, 3, (5, 6)).astype(np.float64)
            b = g.integers(-3, 3, (1, 6)).astype(np.float64)
            yield case(n, lambda a, b, name=name: getattr(torch, name)(a, b), {"a": transposed(a), "b": b},
                       dtype=dtype, grad=False, op=name)
    n = "logical_not_bool"
    yield case(n, lambda x: torch.logical_not(x), {"x": rng(n).random((4, 5)) > 0.5}, grad=False)
