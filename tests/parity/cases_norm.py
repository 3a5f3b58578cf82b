"""Reference cases for the normalisation family (tests/test_norm.cpp).

batch_norm cases return the updated running_mean/running_var as extra outputs (out1, out2), so
the C++ side can compare PyTorch's in-place update. rms_norm is not in PyTorch 1.13: its
reference is written with torch ops (in f32 for low-precision inputs, like the kernel), so
autograd supplies the gradients.

bf16 references are PyTorch computing in f32 on the bf16-rounded inputs, rounded to bf16 (as
generate.py does for f16): PyTorch 1.13's bf16 CPU kernels accumulate the weight/bias gradient
column sums in bf16 and are off by several bf16 ulps (e.g. grad of bias -0.281 where the exact
sum is -0.2588), while these kernels accumulate in f32 as the project's rules require.
"""
import numpy as np
import torch
import torch.nn.functional as F

from parity_lib import case, channels_last, randn, rng, transposed

DTYPES = ("f32", "f64", "bf16", "f16")


def rms_ref(x, w, dims, eps):
    xf = x if x.dtype == torch.float64 else x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=dims, keepdim=True) + eps)
    if w is not None:
        y = y * (w if x.dtype == torch.float64 else w.float())
    return y.to(x.dtype)


def f32_compute(fn, dt):
    """For bf16: run fn in f32 on the (already bf16-rounded) inputs and round the outputs."""
    if dt != "bf16":
        return fn

    def wrapped(**kw):
        out = fn(**{k: v.float() if v is not None and v.is_floating_point() else v for k, v in kw.items()})
        if isinstance(out, tuple):
            return tuple(o.to(torch.bfloat16) if o is not None else None for o in out)
        return out.to(torch.bfloat16)
    return wrapped


def bn_fn(training, momentum, eps=1e-5, affine=True, stats=True):
    def fn(x, rm=None, rv=None, w=None, b=None):
        rm = rm.clone() if rm is not None else None
        rv = rv.clone() if rv is not None else None
        y = F.batch_norm(x, rm, rv, w, b, training, momentum, eps)
        return (y, rm, rv) if stats else y
    return fn


def bn_add_relu_fn(training, momentum, eps=1e-5):
    def fn(x, r, rm, rv, w, b):
        rm, rv = rm.clone(), rv.clone()
        return F.relu(F.batch_norm(x, rm, rv, w, b, training, momentum, eps) + r), rm, rv
    return fn


def bn_inputs(n, shape, layout, affine=True, stats=True):
    c = shape[1]
    x = randn(n, *shape) * 1.5 + 0.7
    if layout == "channels_last":
        x = channels_last(x)
    elif layout == "transposed":
        x = transposed(x)
    inputs = {"x": x}
    if stats:
        inputs["rm"] = randn(n + "rm", c) * 0.2
        inputs["rv"] = np.abs(randn(n + "rv", c)) + 0.5
    if affine:
        inputs["w"] = randn(n + "w", c)
        inputs["b"] = randn(n + "b", c)
    return inputs


def add_norm_fn(dt, shape, eps, rms=False):
    """add_layer_norm / add_rms_norm: (x + r, rounded to the case's dtype as add() rounds it, and
    its norm computed in f32 (f64 for f64) on that rounded sum)."""
    low = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16}[dt]
    ct = torch.float64 if dt == "f64" else torch.float32

    def fn(x, r, w=None, b=None):
        s = (x + r).to(low)
        if rms:
            y = rms_ref(s, w, tuple(range(-len(shape), 0)), eps)
        else:
            y = F.layer_norm(s.to(ct), shape, w.to(ct) if w is not None else None,
                             b.to(ct) if b is not None else None, eps)
        return s, y.to(low)
    return fn


def cases():
    for dt in DTYPES:
        # x + r and its layer_norm / rms_norm (add_layer_norm, add_rms_norm): both outputs get gradients
        n = f"add_layer_norm_{dt}"
        yield case(n, add_norm_fn(dt, (40,), 1e-5),
                   {"x": randn(n, 2, 3, 40) * 2 + 1, "r": randn(n + "r", 2, 3, 40), "w": randn(n + "w", 40),
                    "b": randn(n + "b", 40)}, dtype=dt, params={"shape": [40]})
        n = f"add_rms_norm_{dt}"
        yield case(n, add_norm_fn(dt, (3, 7), 1e-6, rms=True),
                   {"x": transposed(randn(n, 4, 3, 7)), "r": randn(n + "r", 4, 3, 7), "w": randn(n + "w", 3, 7)},
                   dtype=dt, params={"shape": [3, 7]})
        # layer_norm over the last dim, with weight and bias
        n = f"layer_norm_{dt}_last"
        yield case(n, f32_compute(lambda x, w, b: F.layer_norm(x, (33,), w, b, 1e-5), dt),
                   {"x": randn(n, 6, 33), "w": randn(n + "w", 33), "b": randn(n + "b", 33)}, dtype=dt,
                   params={"shape": [33]})
        # over two trailing dims of a non-contiguous input
        n = f"layer_norm_{dt}_2d_transposed"
        yield case(n, f32_compute(lambda x, w, b: F.layer_norm(x, (5, 6), w, b, 1e-5), dt),
                   {"x": transposed(randn(n, 3, 4, 5, 6) + 2.0), "w": randn(n + "w", 5, 6), "b": randn(n + "b", 5, 6)},
                   dtype=dt, params={"shape": [5, 6]})
        # no affine parameters
        n = f"layer_norm_{dt}_noaffine"
        yield case(n, f32_compute(lambda x: F.layer_norm(x, (40,), None, None, 1e-3), dt),
                   {"x": randn(n, 7, 40)}, dtype=dt, params={"shape": [40], "eps": 1e-3})
        # rms_norm
        n = f"rms_norm_{dt}"
        yield case(n, lambda x, w: rms_ref(x, w, (-1,), 1e-6),
                   {"x": randn(n, 5, 40), "w": randn(n + "w", 40)}, dtype=dt, params={"shape": [40]})
        n = f"rms_norm_{dt}_2d_transposed_noweight"
        yield case(n, lambda x: rms_ref(x, None, (-2, -1), 1e-5),
                   {"x": transposed(randn(n, 4, 3, 7))}, dtype=dt, params={"shape": [3, 7], "eps": 1e-5})
        # batch_norm: train and eval for 2-d, 4-d NCHW and 4-d channels-last
        for training in (True, False):
            mode = "train" if training else "eval"
            momentum = 0.25 if training else 0.1
            for form, shape, layout in (("2d", (8, 5), "contiguous"), ("4d", (4, 3, 5, 6), "contiguous"),
                                        ("cl", (4, 3, 5, 6), "channels_last")):
                n = f"batch_norm_{dt}_{form}_{mode}"
                yield case(n, f32_compute(bn_fn(training, momentum), dt), bn_inputs(n, shape, layout), dtype=dt,
                           params={"training": training, "momentum": momentum}, nograd=("rm", "rv"))
            # relu(batch_norm(x) + r): a ResNet block's output (batch_norm_add_relu)
            for form, layout in (("4d", "contiguous"), ("cl", "channels_last")):
                n = f"batch_norm_add_relu_{dt}_{form}_{mode}"
                inputs = bn_inputs(n, (4, 3, 5, 6), layout)
                r = randn(n + "r", 4, 3, 5, 6)
                inputs["r"] = channels_last(r) if layout == "channels_last" else r
                yield case(n, f32_compute(bn_add_relu_fn(training, momentum), dt), inputs, dtype=dt,
                           params={"training": training, "momentum": momentum}, nograd=("rm", "rv"))
    # option variants (f32): weight only, bias only for layer_norm
    n = "layer_norm_f32_weight_only"
    yield case(n, lambda x, w: F.layer_norm(x, (12,), w, None, 1e-5),
               {"x": randn(n, 9, 12), "w": randn(n + "w", 12)}, params={"shape": [12]})
    n = "layer_norm_f32_bias_only"
    yield case(n, lambda x, b: F.layer_norm(x, (12,), None, b, 1e-5),
               {"x": randn(n, 9, 12), "b": randn(n + "b", 12)}, params={"shape": [12]})
    # a long row (vector main loop plus tail) and many rows (several row blocks for dweight)
    n = "layer_norm_f32_long"
    yield case(n, lambda x, w, b: F.layer_norm(x, (515,), w, b, 1e-5),
               {"x": randn(n, 70, 515) * 3 + 1, "w": randn(n + "w", 515), "b": randn(n + "b", 515)},
               params={"shape": [515]})
    # a residual that broadcasts (add() then layer_norm, not the fused kernel), no affine parameters
    n = "add_layer_norm_f32_broadcast_residual"
    yield case(n, add_norm_fn("f32", (12,), 1e-5), {"x": randn(n, 5, 12), "r": randn(n + "r", 12)},
               params={"shape": [12]})
    # batch_norm: 3-d non-contiguous input, no affine, no running stats in training
    n = "batch_norm_f32_3d_transposed_train"
    yield case(n, bn_fn(True, 0.1), bn_inputs(n, (6, 4, 9), "transposed"), params={"training": True, "momentum": 0.1},
               nograd=("rm", "rv"))
    n = "batch_norm_f32_4d_train_noaffine_nostats"
    yield case(n, bn_fn(True, 0.1, affine=False, stats=False), bn_inputs(n, (5, 3, 4, 4), "contiguous", False, False),
               params={"training": True, "momentum": 0.1})
    n = "batch_norm_f64_cl_train_noaffine"
    yield case(n, bn_fn(True, 0.1, affine=False), bn_inputs(n, (3, 16, 4, 5), "channels_last", affine=False),
               dtype="f64", params={"training": True, "momentum": 0.1}, nograd=("rm", "rv"))
