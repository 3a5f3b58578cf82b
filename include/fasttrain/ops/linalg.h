// Matrix products through BLAS. Implemented in src/ops/linalg.cpp and src/backend/cpu/linalg.cpp.
#pragma once
#include "fasttrain/tensor.h"

namespace ft {

// torch.matmul semantics: 1-d/2-d/batched with broadcasting of batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);  // [B,M,K] x [B,K,N] -> [B,M,N]
// y = x W^T + b with W [out, in]; x [..., in]. bias may be undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace ft
