// CPU kernels for layer_norm, rms_norm and batch_norm (dropout's are in dropout.h).
//
// Row norms (layer/rms) see x as dense [M, N] rows (N = numel of normalized_shape). One thread
// owns a block of rows; each row is read from cache a few times (statistics, then the normalised
// write), so the kernel streams x and y through memory once. Statistics are two-pass in the
// compute type (f32 for f32/bf16/f16, f64 for f64) with 32 independent partial sums, so the inner
// loops vectorise and are not bound by the latency of one chain of vector adds (with 8 they were
// slower than PyTorch; docs/PERF.md). Backward fuses dx (per-row) with the dweight/dbias column sums: every
// row block accumulates into its own partial buffer, and the partial buffers are added
// afterwards, so no two threads write the same memory and the result does not depend on
// scheduling (the block count is fixed up to 16 threads, so 1 and 2 threads agree bitwise).
//
// Batch norm sees x in one of two dense forms:
//   NCS: [N, C, S] (NCHW, S = H*W > 1): channel c is N runs of S contiguous values; threads split
//        the channels and each run is a vectorised contiguous loop.
//   MC:  [M, C] rows (channels-last NHWC, 2-d [N, C], or S == 1): a channel is a column; threads
//        split the rows into blocks with per-block partial sums (as for the layer-norm weight
//        gradient), and the apply pass is a dense row loop y[m, :] = x[m, :] * scale + shift.
// Per-channel vectors (mean, invstd, weight, bias) are dense tensors of the compute dtype.
// Reductions walk each channel in chunks of a few thousand values, accumulating in the compute
// type and combining chunks in f64. Statistics read x from memory once: the sums of deviations
// from a shift (the mean of the channel's first chunk, read twice while in cache), with row
// blocks' moments merged pairwise. Long NCHW runs are reduced in memory order.
// Backward is one reduction pass (sum dy, sum dy*(x-mean)) and one map pass
// dx = dy*k1 + (x-mean)*k2 + k3 with per-channel k's (k2 = k3 = 0 in eval mode).
//
// Timings against PyTorch are in docs/PERF.md (they depend on the machine, so they are kept with
// its description rather than here).
#pragma once
#include "backend/cpu/kernel_decls.h"
#include "backend/kernel_params.h"
#include "fasttrain/tensor.h"

namespace ft::cpu {

// --- layer_norm / rms_norm ---
// row_norm_forward: x: dense [M, N] of any floating dtype. w, b: undefined or dense [N] of the compute dtype.
// Writes y (dense, x's dtype), and mean/rstd (dense [M], compute dtype; mean is untouched for
// rms). rms: y = x * rstd * w with rstd = 1/sqrt(mean(x^2) + eps). With `residual` defined (dense,
// x's shape and dtype) the row normalised is sum = x + residual, rounded to x's dtype and written
// to `sum` (a transformer's residual add fused into the norm that follows it).
// row_norm_backward: dy, x: dense [M, N] (x: what was normalised, the sum when fused). Any of dx/dw/db may be
// undefined (not needed). dw, db: dense [N], compute dtype. dx: dense, x's dtype; dsum, when
// defined (the gradient reaching the fused sum directly), is added to it before it is rounded.

using backend::BatchNormLayout;
// batch_norm_stats: Per-channel batch mean and biased variance (compute dtype [C]).
// batch_norm_update: Per channel, in f64, each result rounded once: invstd = 1 / sqrt(var + eps); with running stats
// (both defined or both not), running = (1 - momentum) * running + momentum * statistic, the
// variance made unbiased (var * count / (count - 1)): PyTorch's rule. One pass over C values
// instead of a dozen elementwise ops (each a kernel launch on a GPU).
// batch_norm_apply: y = (x - mean) * invstd * w + b, in x's layout (then max(0, y) with L.relu).
// batch_norm_add_relu: y = max(0, (x - mean) * invstd * w + b + residual), residual dense in y's layout (L.relu
// unused). batch_norm_backward: Training: dx = w*invstd*(dy - mean(dy) - xhat*mean(dy*xhat)) (means over N*S); eval: dx
// = dy*w*invstd. dw = sum(dy*xhat), db = sum(dy). dy and dx in x's layout; any of dx/dw/db may be undefined. With
// L.relu, dy is first zeroed where the forward's x*w*invstd + (b - mean*w*invstd) was <= 0 (b is read for that mask
// only).

}  // namespace ft::cpu
