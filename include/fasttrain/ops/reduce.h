// Reductions over dimensions. Floating inputs accumulate in f32 (f64 for f64) whatever their
// storage type; sums of integers give i64 as in PyTorch. Implemented in src/ops/reduce.cpp.
#pragma once
#include "fasttrain/tensor.h"

namespace ft {

Tensor sum(const Tensor& x);  // all elements -> 0-d
Tensor sum(const Tensor& x, const Dims& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const Dims& dims, bool keepdim = false);
// Variance with Bessel's `correction` (1 = unbiased, torch default; 0 = population).
Tensor var(const Tensor& x, const Dims& dims, int64_t correction = 1, bool keepdim = false);
Tensor max(const Tensor& x);  // all elements -> 0-d; gradient split evenly among ties
struct ValuesIndices {
  Tensor values;
  Tensor indices;  // i64
};
ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim = false);  // first index among ties
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x);  // index into the flattened tensor

}  // namespace ft
