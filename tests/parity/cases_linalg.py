"""Reference cases for matrix products (tests/test_linalg.cpp): every rank combination of
torch.matmul, broadcast batch dims, transposed and strided operands, bmm and linear."""
import torch
import torch.nn.functional as F

from parity_lib import case, randn, strided, transposed

# name -> (fn of the two ready inputs, a, b); each shape pair covers one rank case of matmul.
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


def cases():
    for dtype in ("f32", "f64", "bf16", "f16"):
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
    # Long inner dimension in bf16: values grow to ~sqrt(K) = 16 where one bf16 ulp is 0.125, and
    # the summation order (oneDNN's blocked kernel vs PyTorch's) differs, so a product that lands
    # near a rounding boundary can round to the neighbouring bf16 value; allow about one ulp.
    n = "matmul_longk_bf16"
    yield case(n, lambda a, b: torch.matmul(a, b), {"a": randn(n, 2, 8, 256), "b": randn(n + "b", 256, 16)}, dtype="bf16",
               atol=0.15, rtol=1e-2)
    n = "linear_longk_bf16"
    yield case(n, F.linear, {"input": randn(n, 4, 8, 256), "weight": randn(n + "w", 16, 256),
                             "bias": randn(n + "b", 16)}, dtype="bf16", atol=0.15, rtol=1e-2)
