// CPU matrix products. One entry point covers mm, bmm, broadcast matmul and linear (with and
// without bias) forward and backward:
//
//   out[i] (+)= a[i] @ b[i] (+ bias)   for every index i of the leading (batch) dims
//
// Why it is fast:
// - f32/f64 go to OpenBLAS sgemm/dgemm. A matrix operand that is a transposed dense matrix
//   (stride 1 along rows) is handed over with the Trans flag and its leading dimension, so
//   transposed views (W^T in linear, B^T and A^T in the backward) are never copied. Only a
//   matrix whose strides BLAS cannot express (e.g. every other column) is copied first.
// - Batch dims may have zero strides (broadcast operands, not materialised). Small GEMMs are
//   spread across batches on the thread pool; large ones run one after another because OpenBLAS
//   already threads each of them (running both would oversubscribe the cores).
// - An output whose batch dims have zero strides (the gradient of a broadcast operand, an
//   expanded view of a zeroed buffer) is accumulated batch by batch with beta = 1: the reduction
//   over broadcast dims happens inside the GEMMs, without a materialised per-batch gradient.
// - bf16 and f16 run gemm_half (backend/cpu/gemm_half.h: a packed GEMM that widens 16-bit
//   operands to f32 while packing, reads transposed views through its packing and fuses bias,
//   accumulation and the 16-bit rounding into its store) wherever the CPU has AVX-512, except for
//   aliased (broadcast-gradient) outputs. Otherwise bf16 takes oneDNN's matmul primitive (bf16
//   inputs, f32 accumulation, bias fused, primitives cached by shape and strides) or, when
//   OpenBLAS runs its AVX-512 kernels, conversion to f32 and sgemm; f16 converts to f32 and uses
//   sgemm.
#pragma once
#include "fasttrain/tensor.h"

namespace ft::cpu {

// a [..., M, K], b [..., K, N], out [..., M, N] with identical batch dims (already broadcast,
// zero strides allowed) and one floating dtype. out's matrices must be row-major (unit column
// stride); its batch dims may alias (zero strides) only when `accumulate`. With `accumulate`
// the products are added to out; otherwise out is overwritten. bias [N] (optional, same dtype,
// not with accumulate) is added to every row.
void matmul(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate = false,
            const Tensor& bias = Tensor());
// The same for CPUs below AVX-512 (the kernel table's choice, isa.h): bf16/f16 never take the
// packed GEMM.
void matmul_portable(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate = false,
                     const Tensor& bias = Tensor());

// The 16-bit paths, same contract as matmul, exposed so tests and benchmarks can compare
// them. matmul_onednn (bf16 only, not accumulate) returns false when oneDNN declines the
// problem; matmul_via_f32 converts to f32, calls sgemm and rounds once (bf16 and f16).
bool matmul_onednn(const Tensor& a, const Tensor& b, const Tensor& out, const Tensor& bias = Tensor());
// matmul_gemm_half (bf16 or f16, all three tensors alike) runs gemm_half.h's GEMM; it returns
// false for other dtypes, when the CPU lacks AVX-512, or when out's batches alias (broadcast-operand gradients, summed
// in f32 instead).
bool matmul_gemm_half(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate = false,
                      const Tensor& bias = Tensor());
void matmul_via_f32(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate = false,
                    const Tensor& bias = Tensor());

}  // namespace ft::cpu
