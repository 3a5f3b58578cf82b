#!/usr/bin/env python3
"""Writes PyTorch reference values for the parity tests.

Usage: generate.py OUTDIR. Imports every cases_*.py beside this file; each defines cases(),
yielding parity_lib.Case objects. Writes OUTDIR/manifest.json (every case: family, op, dtype,
input names in call order, number of outputs, inputs with reference gradients) and then
OUTDIR/COMPLETE, which the C++ tests check.
"""
import glob
import importlib.util
import json
import os
import shutil
import sys

import numpy as np
import torch

from parity_lib import DTYPES, Layout

torch.set_num_threads(1)


def save(path, t):
    t = t.detach()
    if t.dtype == torch.bfloat16:  # NumPy has no bf16: stored as the exact f32 values
        t = t.to(torch.float32)
    np.save(path, t.contiguous().numpy())


def build_input(spec, dtype):
    """Returns (torch tensor as PyTorch sees it, array to store, meta)."""
    layout = spec if isinstance(spec, Layout) else Layout(spec, "contiguous")
    a = layout.array
    floating = np.issubdtype(a.dtype, np.floating)
    tdtype = DTYPES[dtype] if floating else None
    t = torch.from_numpy(np.ascontiguousarray(a))
    if floating:
        t = t.to(tdtype)
    meta = {"dtype": dtype if floating else {np.dtype("int64"): "i64", np.dtype("int32"): "i32",
                                              np.dtype("bool"): "bool", np.dtype("uint8"): "u8"}[a.dtype],
            "layout": layout.layout}
    if layout.layout == "contiguous":
        stored = t
    elif layout.layout == "transposed":
        stored = t.permute(*reversed(range(t.dim()))).contiguous()
        t = stored.permute(*reversed(range(t.dim())))
    elif layout.layout == "strided":
        stored = torch.stack([t, torch.zeros_like(t)], dim=-1).reshape(*t.shape[:-1], 2 * t.shape[-1])
        t = stored[..., ::2]
    elif layout.layout == "broadcast":
        stored = t
        t = t.expand(*layout.extra["shape"])
        meta["shape"] = layout.extra["shape"]
    elif layout.layout == "channels_last":
        stored = t.permute(0, 2, 3, 1).contiguous()
        t = stored.permute(0, 3, 1, 2)
    else:
        raise ValueError(layout.layout)
    return t, stored, meta, floating


def run_case(c, outdir):
    """Writes the case's files and returns its manifest entry."""
    d = os.path.join(outdir, c.name)
    os.makedirs(d, exist_ok=True)
    tensors, metas, leaves = {}, {}, {}
    for name, spec in c.inputs.items():
        t, stored, meta, floating = build_input(spec, c.dtype)
        save(os.path.join(d, f"in_{name}.npy"), stored)
        metas[name] = meta
        if floating and c.grad is not False and name not in c.nograd:
            leaf = t.detach().requires_grad_(True)  # same (possibly strided) view as C++ builds
            leaves[name] = leaf
            tensors[name] = leaf
        else:
            tensors[name] = t
    if c.dtype == "f16":
        # Debian's PyTorch 1.13 has few f16 CPU kernels: compute in f32 on the f16-rounded inputs
        # and round the results to f16, which is what an f16 kernel computing in f32 produces.
        out = c.fn(**{k: (v.float() if v.is_floating_point() else v) for k, v in tensors.items()})
        out = tuple(o.half() for o in out) if isinstance(out, (tuple, list)) else out.half()
    else:
        out = c.fn(**tensors)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    grads_out = []
    g = torch.Generator().manual_seed(7)
    for i, o in enumerate(outs):
        save(os.path.join(d, f"out{i}.npy"), o)
        if leaves and o.requires_grad and o.is_floating_point():
            go = torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype)
            save(os.path.join(d, f"gout{i}.npy"), go)
            grads_out.append((o, go))
    grad_names = []
    if leaves and grads_out:
        names = list(leaves)
        grad_names = names
        gs = torch.autograd.grad([o for o, _ in grads_out], [leaves[n] for n in names],
                                 [go for _, go in grads_out], allow_unused=True)
        for n, gr in zip(names, gs):
            if gr is None:
                gr = torch.zeros_like(leaves[n])
            save(os.path.join(d, f"grad_{n}.npy"), gr)
    meta = {"dtype": c.dtype, "params": c.params, "inputs": metas}
    if c.atol is not None:
        meta["atol"] = c.atol
    if c.rtol is not None:
        meta["rtol"] = c.rtol
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)
    return {"name": c.name, "op": c.op, "dtype": c.dtype, "inputs": list(c.inputs), "outputs": len(outs),
            "grads": grad_names}


def main():
    outdir = sys.argv[1]
    if os.path.exists(outdir):
        shutil.rmtree(outdir)
    os.makedirs(outdir)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    names = set()
    manifest = []
    for path in sorted(glob.glob(os.path.join(here, "cases_*.py"))):
        family = os.path.basename(path)[len("cases_"):-len(".py")]
        spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        for c in mod.cases():
            if c.name in names:
                raise SystemExit(f"duplicate parity case name {c.name} in {path}")
            names.add(c.name)
            manifest.append({"family": family, **run_case(c, outdir)})
    count = len(manifest)
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump({"torch": torch.__version__, "cases": manifest}, f, indent=0)
    open(os.path.join(outdir, "COMPLETE"), "w").write(f"{count}\n")
    print(f"parity: wrote {count} PyTorch {torch.__version__} reference cases to {outdir}")


if __name__ == "__main__":
    main()
