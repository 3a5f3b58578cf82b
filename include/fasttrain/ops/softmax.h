// Softmax family and losses. Statistics are computed in f32 (f64 for f64).
// Implemented in src/ops/softmax.cpp and src/ops/loss.cpp.
#pragma once
#include "fasttrain/tensor.h"

namespace ft {

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

enum class Reduction { Mean, Sum, None };
// logits [N, C] (or [N, C, d...]), target i64 [N] (or [N, d...]) class indices.
// Mean divides by the number of targets that are not ignore_index (PyTorch semantics).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                     double label_smoothing = 0.0, Reduction reduction = Reduction::Mean);

}  // namespace ft
