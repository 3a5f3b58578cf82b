"""Reference cases for view ops and dtype conversions (tests/test_views.cpp)."""
import numpy as np
import torch

from parity_lib import case, randn, rng, strided, transposed

VIEWS = {
    "reshape": lambda x: x.reshape(6, -1),
    "transpose": lambda x: x.transpose(0, 2),
    "permute": lambda x: x.permute(2, 0, 1),
    "slice_step": lambda x: x[:, 1:, ::2],
    "narrow": lambda x: x.narrow(2, 1, 3),
    "select": lambda x: x.select(1, -1),
    "expand": lambda x: x[:, :1].expand(5, 2, 3, 4),
    "unsqueeze_squeeze": lambda x: x.unsqueeze(1).squeeze(1).unsqueeze(-1),
    "flatten": lambda x: x.flatten(1),
    "contiguous": lambda x: x.contiguous(),
}


def cases():
    for dtype in ("f32", "f64", "bf16"):
        for name, fn in VIEWS.items():
            n = f"view_{name}_{dtype}"
            yield case(n, lambda x, fn=fn: fn(x), {"x": randn(n, 2, 3, 4)}, dtype=dtype)
            n = f"view_{name}_{dtype}_transposed"
            yield case(n, lambda x, fn=fn: fn(x), {"x": transposed(randn(n, 2, 3, 4))}, dtype=dtype)
    # conversions must round exactly like PyTorch: no tolerance
    g = rng("casts")
    vals = np.concatenate([g.standard_normal(500) * 10.0 ** g.integers(-8, 8, 500),
                           [0.0, -0.0, 1.0, 65504.0, 65520.0, 1e-8, 3.0e38, 1.00390625, 1.01171875]])
    for target, tdt in (("bf16", torch.bfloat16), ("f16", torch.float16)):
        n = f"cast_f32_to_{target}"
        yield case(n, lambda x, tdt=tdt: x.to(tdt).to(torch.float32), {"x": vals.astype(np.float64)}, dtype="f32",
                   params={"to": target}, grad=False, atol=0.0, rtol=0.0)
    n = "cast_f32_to_i32"
    yield case(n, lambda x: x.to(torch.int32), {"x": g.standard_normal(50) * 100}, dtype="f32", grad=False)
