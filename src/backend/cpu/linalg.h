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
// - bf16 and f16 take one of two GEMMs, chosen in one place (half_gemm_path below):
//   * oneDNN's matmul primitive (16-bit inputs, f32 accumulation, bias and accumulation fused as
//     a post-op, primitives cached by shape and strides). With AMX, oneDNN runs tile multiplies
//     (tdpbf16ps), several times the f32 FMA rate; that is the reason for this path.
//   * gemm_half (backend/cpu/gemm_half.h: a packed GEMM that widens 16-bit operands to f32 while
//     packing, reads transposed views through its packing and fuses bias, accumulation and the
//     16-bit rounding into its store) wherever the CPU has AVX-512. Without AMX nothing retires
//     bf16 products faster than f32 FMA, so widening costs no arithmetic rate.
//   Aliased (broadcast-gradient) outputs are summed in f32 on either path (conversion + sgemm):
//   rounding after every batch would lose accuracy. Below AVX-512, bf16 takes oneDNN unless
//   OpenBLAS runs its AVX-512 kernels, and f16 converts to f32 and uses sgemm.
#pragma once
#include "backend/cpu/kernel_decls.h"
#include "backend/elementwise_math.h"
#include "core/switches.h"
#include "fasttrain/tensor.h"

namespace ft::cpu {

// The GEMM behind bf16/f16 matrix products (matmul, bmm, linear and their backward).
enum class HalfGemmPath { Onednn, Packed };
const char* half_gemm_path_name(HalfGemmPath p);  // "onednn", "packed"
// The choice for a setting of the switch FT_BF16_GEMM (core/switches.h): onednn and packed force a
// path; auto takes oneDNN where it multiplies bf16 faster than f32 FMA can: with AMX (oneDNN's
// effective ISA includes it and the kernel table's level, FASTTRAIN_CPU_ISA, is amx), or where
// AVX512-BF16's vdpbf16ps retires more FLOP/s than vfmadd231ps (measured, peak_rate.h: about
// 1.9x on the AMD EPYC development VM, 0.5x on the Sapphire-Rapids-class VM without AMX); packed
// otherwise.
HalfGemmPath choose_half_gemm_path(switches::HalfGemm setting, bool amx, bool bf16_dot_outruns_fma);
// The path in effect: the switch's, its automatic choice made once per kernel-table level
// (ONEDNN_MAX_CPU_ISA lowers oneDNN's ISA, so auto can be steered from the environment too).
HalfGemmPath half_gemm_path();
// True when oneDNN's effective ISA (after ONEDNN_MAX_CPU_ISA) includes AMX / AVX512-BF16.
bool onednn_isa_has_amx();
bool onednn_isa_has_avx512_bf16();

// The GEMM behind f32 matrix products: OpenBLAS's sgemm, or oneDNN's f32 matmul primitive
// (brgemm kernels; bias and accumulation fused as above). The switch FT_F32_GEMM = blas | onednn
// forces a path; auto decides per product shape, from the shape alone (so a run and its resume
// take the same path and the same bits):
//   - oneDNN when OpenBLAS runs kernels below AVX-512 on a CPU where oneDNN has AVX-512 (an
//     OPENBLAS_CORETYPE that chose AVX2 kernels, say);
//   - where both run AVX-512, on an AMD CPU: oneDNN for every single product (no batch).
//     bench/gemm_paths --f32 on a Zen 4 (OpenBLAS on its Cooperlake kernels) measured oneDNN
//     0.99-1.13x OpenBLAS at every product of smollm-135m and gpt2-124m, wide ones included;
//   - where both run AVX-512, otherwise (Intel): oneDNN for a single product with N <= 1024,
//     K <= 2048 and M <= 2048, OpenBLAS otherwise. bench/gemm_paths --f32 measured oneDNN
//     1.05-1.8x faster at every such linear-layer product of gpt-mini, llama-mini, smollm-135m
//     and gpt2-124m (one at 0.99), and OpenBLAS up to 2x faster outside it (N = 3072, K >= 2304),
//     on the Xeon with AMX at 2 threads (docs/PERF.md).
//   Batched products were not measured and stay with OpenBLAS.
enum class F32GemmPath { Blas, Onednn };
const char* f32_gemm_path_name(F32GemmPath p);  // "blas", "onednn"
// One product's shape as the GEMM sees it: out [batches x M x N] from a [M x K] and b [K x N].
struct GemmShape {
  int64_t batches = 1, M = 0, N = 0, K = 0;
};
// What the automatic choice depends on besides the shape: which GEMM kernels each library runs
// here, and the CPU's vendor (the boundary above was measured on Intel).
struct F32GemmMachine {
  bool blas_avx512 = false, onednn_avx512 = false, amd = false;
};
F32GemmPath choose_f32_gemm_path(switches::F32Gemm setting, const F32GemmMachine& machine, const GemmShape& shape);
F32GemmPath f32_gemm_path(const GemmShape& shape);
// Whether OpenBLAS runs its AVX-512 kernels (blas_setup.h: why it might not), and whether
// oneDNN's effective ISA (after ONEDNN_MAX_CPU_ISA) includes AVX-512.
bool blas_has_avx512_kernels();
bool onednn_isa_has_avx512();

// matmul: a [..., M, K], b [..., K, N], out [..., M, N] with identical batch dims (already broadcast,
// zero strides allowed) and one floating dtype. out's matrices must be row-major (unit column
// stride); its batch dims may alias (zero strides) only when `accumulate`. With `accumulate`
// the products are added to out; otherwise out is overwritten. bias [N] (optional, same dtype,
// not with accumulate) is added to every row.
// The same for CPUs below AVX-512 (the kernel table's choice, isa.h): bf16/f16 never take the
// packed GEMM.
void matmul_portable(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate = false,
                     const Tensor& bias = Tensor());
// linear_weight_grad: linear's weight and bias gradients: the table's matmul (the variant chosen
// for this CPU) for gw = gy^T x, then the column sums of gy for gb (if defined).
// linear_gelu, matmul_gelu_backward: the MLP fusions (kernel_list.h), composed from the table's
// matmul, unary and sum: the CPU has no faster form (the GELU's pass is a small part of a CPU step).

// The paths, same contract as matmul, exposed so tests and benchmarks can compare them.
// matmul_onednn (bf16, f16 or f32, all three tensors alike) returns false when oneDNN declines
// the problem (f16 without AVX512-FP16, say) or out's batches alias; with `accumulate` the sum
// is a post-op rounded once. matmul_via_f32 converts to f32, calls sgemm and rounds once.
bool matmul_onednn(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate = false,
                   const Tensor& bias = Tensor());
// matmul_gemm_half (bf16 or f16, all three tensors alike) runs gemm_half.h's GEMM; it returns
// false for other dtypes, when the CPU lacks AVX-512, or when out's batches alias (broadcast-operand gradients, summed
// in f32 instead).
bool matmul_gemm_half(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate = false,
                      const Tensor& bias = Tensor());
void matmul_via_f32(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate = false,
                    const Tensor& bias = Tensor());

}  // namespace ft::cpu
