// Fused kernels (kernel_list.h's FT_KERNELS_FUSED) composed from the table's unfused entries on
// the tensor's own device: what an op runs where a backend leaves a fusion's slot empty, what a
// backend runs where its fused path does not apply (a shape or dtype its library cannot fuse), and
// the CPU's entry where it has no faster form. One composition, so every path computes the same.
#pragma once
#include "backend/elementwise_math.h"
#include "fasttrain/tensor.h"

namespace ft::backend::composed {

// pre = x @ w^T + b, y = gelu(pre).
void linear_gelu(const Tensor& x, const Tensor& w, const Tensor& b, math::UnaryOp gelu, const Tensor& pre,
                 const Tensor& y);
// dpre = (gy @ w) * gelu'(pre), db (if defined) = the column sums of dpre.
void matmul_gelu_backward(const Tensor& gy, const Tensor& w, const Tensor& pre, math::UnaryOp gelu, const Tensor& dpre,
                          const Tensor& db);

}  // namespace ft::backend::composed
