"""Reference cases for joining, splitting and gathering (tests/test_indexing.cpp)."""
import numpy as np
import torch
import torch.nn.functional as F

from parity_lib import case, randn, rng, strided, transposed


def cases():
    for dtype in ("f32", "f64", "bf16", "f16"):
        n = f"cat_dim1_{dtype}"
        yield case(n, lambda a, b, c: torch.cat([a, b, c], dim=-1),
                   {"a": randn(n, 2, 3), "b": transposed(randn(n + "b", 2, 4)), "c": randn(n + "c", 2, 1)},
                   dtype=dtype, params={"dim": -1})
        n = f"cat_dim0_{dtype}"
        yield case(n, lambda a, b: torch.cat([a, b], dim=0),
                   {"a": randn(n, 3, 4, 5), "b": strided(randn(n + "b", 2, 4, 5))}, dtype=dtype, params={"dim": 0})
        n = f"cat_rows_{dtype}"  # many outer rows: the dense memcpy path
        yield case(n, lambda a, b: torch.cat([a, b], dim=1),
                   {"a": randn(n, 40, 3), "b": randn(n + "b", 40, 5)}, dtype=dtype, params={"dim": 1})
        n = f"stack_{dtype}"
        yield case(n, lambda a, b, c: torch.stack([a, b, c], dim=-1),
                   {"a": randn(n, 3, 4), "b": transposed(randn(n + "b", 3, 4)), "c": randn(n + "c", 3, 4)},
                   dtype=dtype, params={"dim": -1})
        n = f"split_size_{dtype}"
        yield case(n, lambda x: torch.split(x, 3, dim=0), {"x": randn(n, 7, 5)}, dtype=dtype,
                   params={"size": 3, "dim": 0})
        n = f"split_sizes_{dtype}"
        yield case(n, lambda x: torch.split(x, [1, 3, 2], dim=-1), {"x": transposed(randn(n, 4, 6))}, dtype=dtype,
                   params={"sizes": [1, 3, 2], "dim": -1})
        n = f"chunk_{dtype}"
        yield case(n, lambda x: torch.chunk(x, 3, dim=1), {"x": randn(n, 4, 8)}, dtype=dtype,
                   params={"chunks": 3, "dim": 1})
        n = f"index_select_{dtype}"
        idx = np.array([4, 0, 2, 2, 4, 1], dtype=np.int64)
        yield case(n, lambda x, index: torch.index_select(x, -1, index),
                   {"x": transposed(randn(n, 3, 5)), "index": idx}, dtype=dtype, params={"dim": -1})
        n = f"index_select_dim0_{dtype}"
        idx = np.array([1, 1, 0, 3], dtype=np.int32)
        yield case(n, lambda x, index: torch.index_select(x, 0, index.long()),
                   {"x": randn(n, 4, 3, 2), "index": idx}, dtype=dtype, params={"dim": 0})
        n = f"gather_{dtype}"
        idx = rng(n).integers(0, 6, size=(3, 4)).astype(np.int64)
        yield case(n, lambda x, index: torch.gather(x, -1, index),
                   {"x": strided(randn(n, 4, 6)), "index": idx}, dtype=dtype, params={"dim": -1})
        n = f"gather_dim0_{dtype}"
        idx = rng(n).integers(0, 5, size=(7, 3)).astype(np.int64)
        yield case(n, lambda x, index: torch.gather(x, 0, index),
                   {"x": transposed(randn(n, 5, 3)), "index": idx}, dtype=dtype, params={"dim": 0})
        n = f"embedding_{dtype}"
        ids = np.array([[1, 3, 3, 0], [9, 3, 1, 1]], dtype=np.int64)
        yield case(n, lambda ids, weight: F.embedding(ids, weight),
                   {"ids": ids, "weight": randn(n, 10, 6)}, dtype=dtype)
        n = f"embedding_pad_{dtype}"
        ids = np.array([[2, 0, 5], [0, 2, 2]], dtype=np.int32)
        yield case(n, lambda ids, weight: F.embedding(ids.long(), weight, padding_idx=2),
                   {"ids": ids, "weight": randn(n, 6, 4)}, dtype=dtype, params={"padding_idx": 2})
