"""Helpers for writing PyTorch reference cases (see generate.py).

A case names an op call on concrete inputs. generate.py runs it in PyTorch and writes, under
OUTDIR/<name>/: in_<input>.npy, out<i>.npy, gout<i>.npy (random upstream gradients) and
grad_<input>.npy, plus meta.json (dtype, params, input layouts, optional tolerances). A case
that names the op it runs (`op`, the name in the C++ op lists) is also listed with it in
OUTDIR/manifest.json, which C++ tests walk instead of repeating case names.
"""
import zlib

import numpy as np
import torch

DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16}


class Layout:
    """An input array plus how the C++ side must rebuild it as a view."""

    def __init__(self, array, layout, **extra):
        self.array = np.asarray(array)
        self.layout = layout
        self.extra = extra


def transposed(a):
    """Non-contiguous: C++ loads the array with reversed dims and permutes it back."""
    return Layout(a, "transposed")


def strided(a):
    """Non-contiguous: every other element of a last dimension twice as long."""
    return Layout(a, "strided")


def broadcast(row, shape):
    """Zero-stride: `row` (shape[1:] with a leading 1) expanded to `shape`."""
    return Layout(row, "broadcast", shape=list(shape))


def channels_last(a):
    """NCHW logical array held in NHWC memory order."""
    return Layout(a, "channels_last")


class Case:
    def __init__(self, name, fn, inputs, dtype="f32", params=None, grad=None, atol=None, rtol=None, nograd=(),
                 op=None):
        self.name = name
        self.op = op  # the op the case runs, for tests that walk the manifest (None: not listed)
        self.fn = fn
        self.inputs = inputs
        self.dtype = dtype
        self.params = params or {}
        self.atol = atol
        self.rtol = rtol
        self.nograd = set(nograd)  # floating inputs that should not get gradients
        self.grad = grad  # None: backward for every floating input; False: no backward


def rng(name):
    return np.random.default_rng(zlib.crc32(name.encode()))


def randn(name, *shape):
    return rng(name).standard_normal(shape)


def case(name, fn, inputs, **kw):
    return Case(name, fn, inputs, **kw)
