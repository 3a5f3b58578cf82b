"""Reference cases for the reduction family (tests/test_reduce.cpp): sum, mean, var, max, argmax."""
import numpy as np
import torch

from parity_lib import broadcast, case, randn, rng, strided, transposed

DTYPES = ("f32", "f64", "bf16", "f16")

# tag -> (input builder(name), dims, keepdim). The C++ test walks the same tags.
DIM_SETS = {
    "lead": (lambda n: randn(n, 4, 5, 6), [0], False),
    "lead2": (lambda n: randn(n, 3, 4, 5), [0, 1], False),
    "trail": (lambda n: randn(n, 4, 5, 6), [-1], False),
    "mid": (lambda n: transposed(randn(n, 4, 5, 6)), [1], True),
    "all": (lambda n: strided(randn(n, 3, 4, 5)), [0, 1, 2], False),
    "mixed": (lambda n: randn(n, 4, 5, 6), [0, 2], True),
    "neg": (lambda n: transposed(randn(n, 6, 7)), [-2], False),
    "bcast": (lambda n: broadcast(randn(n, 1, 5, 6), (4, 5, 6)), [1], False),
    "long": (lambda n: randn(n, 3, 1000) + 2.0, [1], False),
}

MAX_DIM_SETS = {
    "last": (lambda n: randn(n, 5, 7), -1, False),
    "first": (lambda n: transposed(randn(n, 6, 5)), 0, True),
    "mid": (lambda n: randn(n, 3, 4, 5), 1, False),
    "strided": (lambda n: strided(randn(n, 4, 6)), 1, True),
    # integer values: many ties; the first maximal index must win
    "ties": (lambda n: np.round(randn(n, 4, 6)), 1, False),
    "ties0": (lambda n: np.round(randn(n, 6, 4)), 0, False),
}


def tol(dtype, tag):
    # bf16/f16 sums over 1000 elements: PyTorch accumulates differently; the result is rounded
    # once, so one ulp of the result is the expected difference.
    if tag == "long" and dtype in ("bf16", "f16"):
        return {"atol": 0.1, "rtol": 2e-2}
    return {}


def cases():
    for dtype in DTYPES:
        for tag, (make, dims, keepdim) in DIM_SETS.items():
            for op in ("sum", "mean", "var"):
                n = f"{op}_{dtype}_{tag}"
                params = {"dims": dims, "keepdim": keepdim}
                if op == "var":
                    corr = 0 if tag in ("all", "mixed") else 1
                    params["correction"] = corr
                    fn = lambda x, dims=dims, keepdim=keepdim, corr=corr: torch.var(x, dim=dims, unbiased=bool(corr), keepdim=keepdim)
                elif op == "sum":
                    fn = lambda x, dims=dims, keepdim=keepdim: torch.sum(x, dim=dims, keepdim=keepdim)
                else:
                    fn = lambda x, dims=dims, keepdim=keepdim: torch.mean(x, dim=dims, keepdim=keepdim)
                yield case(n, fn, {"x": make(n)}, dtype=dtype, params=params, **tol(dtype, tag))
        # max over everything: random values, and integer values with ties (gradient split evenly)
        n = f"max_all_{dtype}"
        yield case(n, lambda x: torch.max(x), {"x": transposed(randn(n, 5, 6))}, dtype=dtype)
        n = f"max_all_ties_{dtype}"
        x = np.round(randn(n, 4, 5))
        x[1, 2] = x[3, 4] = x[0, 0] = x.max() + 1  # three-way tie for the max
        yield case(n, lambda x: torch.amax(x, dim=(0, 1)), {"x": x}, dtype=dtype)
        for tag, (make, dim, keepdim) in MAX_DIM_SETS.items():
            n = f"max_dim_{dtype}_{tag}"
            yield case(n, lambda x, dim=dim, keepdim=keepdim: tuple(torch.max(x, dim=dim, keepdim=keepdim)),
                       {"x": make(n)}, dtype=dtype, params={"dim": dim, "keepdim": keepdim})
            n = f"argmax_{dtype}_{tag}"
            yield case(n, lambda x, dim=dim, keepdim=keepdim: torch.argmax(x, dim=dim, keepdim=keepdim),
                       {"x": make(n)}, dtype=dtype, params={"dim": dim, "keepdim": keepdim}, grad=False)
        n = f"argmax_flat_{dtype}"
        yield case(n, lambda x: torch.argmax(x), {"x": transposed(randn(n, 7, 9))}, dtype=dtype, grad=False)
