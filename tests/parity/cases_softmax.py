"""Reference cases for softmax, log_softmax and cross_entropy (tests/test_softmax.cpp)."""
import numpy as np
import torch
import torch.nn.functional as F

from parity_lib import case, channels_last, randn, rng, strided, transposed

DTYPES = ("f32", "f64", "bf16", "f16")

# tag -> (input builder(name), dim). The C++ test walks the same tags.
SOFTMAX_SETS = {
    "last": (lambda n: randn(n, 6, 33), -1),
    "first": (lambda n: randn(n, 7, 5), 0),
    "mid": (lambda n: randn(n, 3, 9, 10), 1),
    "mid_t": (lambda n: transposed(randn(n, 4, 5, 70)), 1),
    "last_t": (lambda n: transposed(randn(n, 8, 6)), -1),
    "strided": (lambda n: strided(randn(n, 5, 12)), 1),
    "wide": (lambda n: 8.0 * randn(n, 4, 1000) + 50.0, -1),  # large values: needs the max shift
}

# tag -> (shape, layout, ignore_index, label_smoothing, reduction, fraction of targets ignored)
CE_SETS = {
    "mean": ((16, 10), None, -100, 0.0, "mean", 0.0),
    "sum_ignore": ((16, 10), None, -100, 0.0, "sum", 0.25),
    "none_smooth": ((12, 7), None, 3, 0.1, "none", 0.0),  # ignore_index is a real class here
    "mean_smooth_ignore_t": ((9, 11), "transposed", -1, 0.2, "mean", 0.3),
    "wide": ((4, 3000), None, -100, 0.05, "mean", 0.0),
    "4d": ((2, 5, 3, 4), None, -100, 0.1, "mean", 0.2),
    "4d_none_cl": ((2, 5, 3, 4), "channels_last", 1, 0.0, "none", 0.0),
    "3d_sum": ((3, 6, 70), None, -100, 0.3, "sum", 0.1),
}


def ce_inputs(n, shape, layout, ignore_index, frac):
    x = 2.0 * randn(n, *shape)
    C = shape[1]
    tshape = (shape[0],) + tuple(shape[2:])
    r = rng(n + "t")
    t = r.integers(0, C, size=tshape).astype(np.int64)
    if frac > 0:
        t[r.random(tshape) < frac] = ignore_index
    if layout == "transposed":
        x = transposed(x)
    elif layout == "channels_last":
        x = channels_last(x)
    return {"x": x, "t": t}


def cases():
    for dtype in DTYPES:
        for tag, (make, dim) in SOFTMAX_SETS.items():
            for op, fn in (("softmax", torch.softmax), ("log_softmax", torch.log_softmax)):
                n = f"{op}_{dtype}_{tag}"
                yield case(n, lambda x, fn=fn, dim=dim: fn(x, dim), {"x": make(n)}, dtype=dtype, params={"dim": dim})
        for tag, (shape, layout, ig, eps, red, frac) in CE_SETS.items():
            n = f"ce_{dtype}_{tag}"
            kw = {}
            if dtype in ("bf16", "f16") and red == "sum":
                kw = {"atol": 0.25, "rtol": 2e-2}  # sums of many rounded terms
            yield case(n, lambda x, t, ig=ig, eps=eps, red=red: F.cross_entropy(x, t, ignore_index=ig, label_smoothing=eps,
                                                                             reduction=red),
                       ce_inputs(n, shape, layout, ig, frac), dtype=dtype,
                       params={"ignore_index": ig, "label_smoothing": eps, "reduction": red}, **kw)
    # every target ignored: Mean is 0/0 = NaN and the gradient is zero
    n = "ce_f32_all_ignored"
    yield case(n, lambda x, t: F.cross_entropy(x, t), {"x": randn(n, 3, 4), "t": np.full(3, -100, dtype=np.int64)},
               params={"ignore_index": -100, "label_smoothing": 0.0, "reduction": "mean"})
