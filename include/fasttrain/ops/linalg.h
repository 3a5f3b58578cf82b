// Matrix products through BLAS. Implemented in src/ops/linalg.cpp and src/backend/cpu/linalg.cpp.
#pragma once
#include "fasttrain/ops/elementwise.h"  // GeluApprox
#include "fasttrain/tensor.h"

namespace ft {

// torch.matmul semantics: 1-d/2-d/batched with broadcasting of batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);  // [B,M,K] x [B,K,N] -> [B,M,N]
// y = x W^T + b with W [out, in]; x [..., in]. bias may be undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// linear(gelu(linear(x, w1, b1), approximate), w2, b2): a transformer's MLP as one op, so the
// first product's store applies the GELU and keeps its input, and the second product's input
// gradient applies the GELU's derivative and sums the first bias's gradient (cuBLASLt's GELU
// epilogues on CUDA). Same values and gradients as the three ops; b1, b2 may be undefined.
Tensor gelu_mlp(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2,
                GeluApprox approximate = GeluApprox::None);

}  // namespace ft
