// CPU kernels for joining and gathering. They move bytes, so they are written around memcpy of
// the longest contiguous runs the layouts allow, split across threads; the scatter-adds of the
// backward passes partition the destination so that threads never write the same element
// (no atomics, and the summation order is fixed, so results are deterministic).
#pragma once
#include <optional>
#include <vector>

#include "backend/kernel_params.h"
#include "fasttrain/tensor.h"

namespace ft::cpu {

// out (contiguous) = the inputs (same dtype as out, any strides) joined along `dim`. When every
// input is dense each output row of the [outer, size(dim) * inner] view is a few memcpys.
void cat(const std::vector<Tensor>& inputs, int dim, const Tensor& out);

// Throws error(value, position) for the first entry of `index` (integer, any shape/strides)
// outside [0, size), entries equal to `ignore` skipped.
void check_index_range(const Tensor& index, int64_t size, std::optional<int64_t> ignore,
                       const backend::IndexErrorText& error);

// out [outer, n, inner] = x [outer, V, inner][:, index, :] with x viewed around `dim`; out is
// contiguous with x's shape except size(dim) = n = index.numel(). Indices must be in range.
// Each selected row of `inner` elements is one memcpy.
void index_select(const Tensor& x, int dim, const Tensor& index, const Tensor& out);

// acc [outer, V, inner] (contiguous, f32 or f64, pre-zeroed) += src [outer, n, inner] scattered
// to rows index[j] along `dim`; entries equal to `skip` are ignored (embedding padding). Threads
// own disjoint ranges of destination rows and each scans the whole index, so repeated indices
// never race and every row sums its sources in index order.
void index_add(const Tensor& acc, int dim, const Tensor& index, const Tensor& src, std::optional<int64_t> skip);

// out = torch.gather(x, dim, index): out has index's shape. Indices must be in range.
void gather(const Tensor& x, int dim, const Tensor& index, const Tensor& out);

// acc (x's shape, contiguous, f32 or f64, pre-zeroed) += src scattered along `dim` by index (the
// backward of gather). Runs on one thread: elements differing only along `dim` may collide.
void scatter_add(const Tensor& acc, int dim, const Tensor& index, const Tensor& src);

}  // namespace ft::cpu
