// CPU kernels of cross-entropy on class-index targets. Logits are contiguous and viewed as
// [N, C, S] (S = product of the dims after the class dim, 1 for [N, C]); targets are the N*S
// positions' class indices.
//
// Forward, per position i with target t (one pass over the row's C logits):
//   lse_i  = m + log sum_c exp(x_c - m)                      (m = max_c x_c, for stability)
//   loss_i = (1 - eps) * (lse_i - x_t) + eps * (lse_i - mean_c x_c)
// where the second term is the label-smoothing part: the mean over classes of -log p_c. Ignored
// positions (t == ignore_index) give 0. Statistics are in f32 (f64 for f64).
// Backward, fused (no softmax tensor is materialised):
//   d loss_i / d x_c = scale_i * (exp(x_c - lse_i) - (1 - eps) [c == t] - eps / C)
// with scale_i the upstream gradient of position i (already divided by the count for Mean),
// and 0 for ignored positions.
//
// Why it is fast: S == 1 (classifier and language-model logits) streams each dense row twice in
// the forward and once in the backward with vectorised loops (fast_exp); S > 1 ([N, C, H, W])
// keeps per-position statistics for a block of positions and sweeps the classes, so no
// transposing copy is needed.
#pragma once
#include "backend/cpu/kernel_decls.h"
#include "fasttrain/tensor.h"

namespace ft::cpu {

// cross_entropy_forward: loss and lse: contiguous, numel N*S, of the statistics dtype (f32; f64 for f64 logits).
// target: contiguous i64, numel N*S.
// cross_entropy_backward: gx: contiguous, logits' dtype and shape. grad: contiguous, statistics dtype; the upstream
// gradient of position i is grad[i] * scale when it has N*S elements, grad[0] * scale when one.

}  // namespace ft::cpu
