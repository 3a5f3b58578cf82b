// CPU kernels of softmax and log-softmax along one dimension of a contiguous tensor, viewed as
// [outer, R, inner] with R the softmax dimension.
//
// Forward, per row: m = max x; s = sum exp(x - m); softmax = exp(x - m) / s and
// log_softmax = x - m - log s. Subtracting the max keeps exp from overflowing. Statistics are in
// f32 (f64 for f64) whatever the storage type.
// Backward (y = the forward output, g = upstream gradient):
//   softmax:     gx = y * (g - sum(g * y))
//   log_softmax: gx = g - exp(y) * sum(g)
//
// Why it is fast: inner == 1 (the last dim: attention and classifier logits) works on dense rows,
// three vectorised passes over a row that stays in L1/L2, rows split across threads. inner > 1
// (softmax over dim 0 or a middle dim) keeps per-column statistics for a block of `inner`
// columns and sweeps the R rows of that block with dense, vectorised inner loops, so no
// transposing copy is needed. exp is the vectorisable fast_exp for f32/bf16/f16.
#pragma once
#include "backend/cpu/kernel_decls.h"
#include "fasttrain/tensor.h"

namespace ft::cpu {

// softmax_forward: out = softmax(x) (or log_softmax when `log`) along `dim`; x and out contiguous, one dtype.
// softmax_backward: gx from g and the forward output y; g, y, gx contiguous, one dtype and shape.

}  // namespace ft::cpu
