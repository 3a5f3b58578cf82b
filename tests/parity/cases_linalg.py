"""Reference cases for matrix products (tests/test_linalg.cpp): every rank combination of
torch.matmul, broadcast batch dims, transposed and strided operands, bmm and linear."""
import torch
import torch.nn.functional as F

from parity_lib import case as plain_case
from parity_lib import randn, strided, transposed


def make_case(dtype):
    def case(name, fn, inputs, **kw):
        return plain_case(name, f32_reference(fn) if dtype == "bf16" else fn, inputs, **kw)
    return case


def mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)


def mlp_rounded(low):
    """The 16-bit MLP as kernels accumulating in f32 compute it (see f32_reference): each product
    and the GELU in f32, each of the three results rounded once to `low` (generate.py hands f16
    cases f32 tensors holding f16 values, so the rounding is written out here)."""
    def fn(x, w1, b1, w2, b2):
        f = lambda t: t.float()
        pre = F.linear(f(x), f(w1), f(b1)).to(low)
        h = F.gelu(f(pre), approximate="tanh").to(low)
        return F.linear(f(h), f(w2), f(b2)).to(low)
    return fn


# name -> (shape of a, shape of b): one rank case of torch.matmul each.
MATMUL = {
    "mm": ((5, 7), (7, 4)),
    "dot": ((7,), (7,)),
    "mv": ((5, 7), (7,)),
    "vm": ((7,), (7, 4)),
    "3d_2d": ((3, 5, 7), (7, 4)),       # batch folded into rows
    "2d_3d": ((5, 7), (3, 7, 4)),       # a broadcast over b's batch
    "3d_1d": ((3, 5, 7), (7,)),
    "1d_3d": ((7,), (3, 7, 4)),
    "bcast": ((2, 1, 5, 7), (3, 7, 4)),  # batch dims [2, 1] x [3] -> [2, 3]
    "bcast_both": ((2, 1, 5, 7), (1, 3, 7, 4)),
}


def f32_reference(fn):
    """PyTorch 1.13's CPU bf16 matmul accumulates some products in bf16 (matmul_bcast_bf16,
    element 80: exact -0.0826, PyTorch -0.0977; the gradient of a broadcast operand is off by
    more), so bf16 references are computed in f32 from the bf16 inputs and rounded once: what a
    kernel accumulating in f32 (oneDNN, cuBLAS, our fallback) produces. Gradients flow back
    through the casts, so they too are f32 products rounded once to bf16."""
    def run(**kw):
        return fn(**{k: v.float() for k, v in kw.items()}).bfloat16()
    return run


def cases():
    for dtype in ("f32", "f64", "bf16", "f16"):
        # every case of this dtype goes through `case` below, which applies f32_reference to bf16
        case = make_case(dtype)
        for name, (sa, sb) in MATMUL.items():
            n = f"matmul_{name}_{dtype}"
            yield case(n, lambda a, b: torch.matmul(a, b), {"a": randn(n, *sa), "b": randn(n + "b", *sb)}, dtype=dtype)
        # Transposed (column-major) operands go to BLAS as Trans flags; 3-d reversed permutations
        # and every-other-column views are not BLAS-expressible and take the copy path.
        n = f"matmul_mm_transposed_{dtype}"
        yield case(n, lambda a, b: torch.matmul(a, b), {"a": transposed(randn(n, 6, 5)), "b": transposed(randn(n + "b", 5, 3))},
                   dtype=dtype)
        n = f"matmul_bcast_transposed_{dtype}"
        yield case(n, lambda a, b: torch.matmul(a, b), {"a": transposed(randn(n, 3, 4, 5)), "b": randn(n + "b", 5, 2)}, dtype=dtype)
        n = f"matmul_batched_strided_{dtype}"
        yield case(n, lambda a, b: torch.matmul(a, b), {"a": randn(n, 2, 4, 6), "b": strided(randn(n + "b", 2, 6, 3))}, dtype=dtype)
        n = f"bmm_{dtype}"
        yield case(n, lambda a, b: torch.bmm(a, b), {"a": randn(n, 3, 4, 6), "b": randn(n + "b", 3, 6, 5)}, dtype=dtype)
        n = f"bmm_transposed_{dtype}"
        yield case(n, lambda a, b: torch.bmm(a, b.transpose(1, 2)),
                   {"a": randn(n, 3, 4, 6), "b": randn(n + "b", 3, 5, 6)}, dtype=dtype)
        n = f"linear_bias_{dtype}"
        yield case(n, F.linear, {"input": randn(n, 2, 3, 7), "weight": randn(n + "w", 4, 7),
                                 "bias": randn(n + "b", 4)}, dtype=dtype)
        n = f"linear_nobias_{dtype}"
        yield case(n, F.linear, {"input": randn(n, 2, 3, 7), "weight": randn(n + "w", 4, 7)}, dtype=dtype)
        n = f"linear_transposed_{dtype}"  # x not viewable as rows (copied), W column-major (NoTrans)
        yield case(n, F.linear, {"input": transposed(randn(n, 2, 3, 7)), "weight": transposed(randn(n + "w", 4, 7)),
                                 "bias": randn(n + "b", 4)}, dtype=dtype)
        n = f"linear_1d_{dtype}"
        yield case(n, F.linear, {"input": randn(n, 7), "weight": randn(n + "w", 4, 7),
                                 "bias": randn(n + "b", 4)}, dtype=dtype)
        # gelu_mlp: linear, tanh-GELU, linear as one op (GPT-2's MLP)
        n = f"gelu_mlp_{dtype}"
        low = {"bf16": torch.bfloat16, "f16": torch.float16}.get(dtype)
        yield plain_case(n, mlp_rounded(low) if low else mlp,
                         {"x": randn(n, 2, 5, 12), "w1": randn(n + "w1", 24, 12) * 0.5, "b1": randn(n + "b1", 24),
                          "w2": randn(n + "w2", 7, 24) * 0.5, "b2": randn(n + "b2", 7)}, dtype=dtype)
    n = "gelu_mlp_exact_nobias_f32"
    yield make_case("f32")(n, lambda x, w1, w2: F.linear(F.gelu(F.linear(x, w1)), w2),
                           {"x": randn(n, 9, 8), "w1": randn(n + "w1", 16, 8) * 0.5, "w2": randn(n + "w2", 5, 16) * 0.5},
                           dtype="f32")
    case = make_case("bf16")
    # Long inner dimension in bf16 (oneDNN's blocked AVX512-BF16 kernel). Against the f32-computed
    # reference the default bf16 tolerance holds (rtol 2e-2 is ~5 bf16 ulps; both sides round one
    # f32 sum once), so no widening is needed; against PyTorch 1.13's own bf16 matmul it would be.
    n = "matmul_longk_bf16"
    yield case(n, lambda a, b: torch.matmul(a, b), {"a": randn(n, 2, 8, 256), "b": randn(n + "b", 256, 16)},
               dtype="bf16")
    n = "linear_longk_bf16"
    yield case(n, F.linear, {"input": randn(n, 4, 8, 256), "weight": randn(n + "w", 16, 256),
                             "bias": randn(n + "b", 16)}, dtype="bf16")
    # Rows and columns past several register tiles of the packed GEMM and oneDNN's blocks, the
    # shape class of a GPT layer (CTest runs these on both bf16 GEMM paths, FT_BF16_GEMM).
    n = "linear_wide_bf16"
    yield case(n, F.linear, {"input": randn(n, 3, 37, 96), "weight": randn(n + "w", 200, 96),
                             "bias": randn(n + "b", 200)}, dtype="bf16")
