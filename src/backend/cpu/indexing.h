// CPU kernels for joining and gathering. They move bytes, so they are written around memcpy of
// the longest contiguous runs the layouts allow, split across threads; the scatter-adds of the
// backward passes partition the destination so that threads never write the same element
// (no atomics, and the summation order is fixed, so results are deterministic).
#pragma once
#include <optional>
#include <vector>

#include "backend/cpu/kernel_decls.h"
#include "backend/kernel_params.h"
#include "fasttrain/tensor.h"

namespace ft::cpu {

// cat: out (contiguous) = the inputs (same dtype as out, any strides) joined along `dim`. When every
// input is dense each output row of the [outer, size(dim) * inner] view is a few memcpys.

// check_index_range: Throws error(value, position) for the first entry of `index` (integer, any shape/strides)
// outside [0, size), entries equal to `ignore` skipped.

// index_select: out [outer, n, inner] = x [outer, V, inner][:, index, :] with x viewed around `dim`; out is
// contiguous with x's shape except size(dim) = n = index.numel(). Indices must be in range.
// Each selected row of `inner` elements is one memcpy.

// index_add: acc [outer, V, inner] (contiguous, f32 or f64, pre-zeroed) += src [outer, n, inner] scattered
// to rows index[j] along `dim`; entries equal to `skip` are ignored (embedding padding). Threads
// own disjoint ranges of destination rows and each scans the whole index, so repeated indices
// never race and every row sums its sources in index order.

// gather: out = torch.gather(x, dim, index): out has index's shape. Indices must be in range.

// scatter_add: acc (x's shape, contiguous, f32 or f64, pre-zeroed) += src scattered along `dim` by index (the
// backward of gather). Runs on one thread: elements differing only along `dim` may collide.

}  // namespace ft::cpu
