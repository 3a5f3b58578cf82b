// CPU 2-d pooling kernels (max, average, adaptive average), forward and fused backward, for dense
// NCHW or NHWC (channels-last) tensors.
//
// NCHW runs one (n, c) plane per task: windows read short dense runs of a row. NHWC runs one
// output row (n, oh) per task with the channel loop innermost, so every window position is a
// dense, vectorisable run of C values. Backward kernels accumulate into a compute-type (f32 for
// bf16/f16) buffer per plane (NCHW) or per image (NHWC), which no other task touches, so
// overlapping windows need no atomics and 16-bit gradients are rounded once.
#pragma once
#include "backend/cpu/kernel_decls.h"
#include "backend/kernel_params.h"
#include "fasttrain/tensor.h"

namespace ft::cpu {

using backend::PoolParams;

// max_pool2d_forward: y[n, c, i, j] = max over the (dilated, padded) window of x; indices (i64,
// y's layout) hold the flat position h * W + w of the maximum (the first on ties; a NaN wins, as in
// PyTorch).
// max_pool2d_backward: gx = 0, then gx[n, c, indices] += gy.

// avg_pool2d_forward and _backward: PyTorch's avg_pool2d (no ceil mode): the window is clipped to
// the padded input, and the divisor counts padding when count_include_pad, else only the elements
// inside the input.

// adaptive_avg_pool2d_forward and _backward: bins [floor(i * H / OH), ceil((i + 1) * H / OH)) per
// output row (likewise for columns).

}  // namespace ft::cpu
