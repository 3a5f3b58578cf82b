// CPU 2-d convolution kernels: forward, gradient of the input (backward-data) and gradient of the
// weight and bias (backward-filter).
//
//   y[n, o, i, j] = b[o] + sum_{c in group(o), p, q} w[o, c, p, q] * x[n, c, i*sh - ph + p*dh, j*sw - pw + q*dw]
//
// f32 and bf16 run on oneDNN's convolution primitives (brgemm/JIT kernels for AVX-512 and
// AVX-512-BF16), which on the cnn-mini shapes are several times faster than im2col + OpenBLAS
// sgemm (see conv_onednn.cpp; figures in docs/PERF.md), except where the engine's own kernels
// are faster: bf16 3x3 stride-1 layers by Winograd (conv_winograd.h) and other bf16 weight
// gradients on the paired kernel (conv_weight_grad.h) or, for small channels-last 1x1 layers, as
// one matrix product, as the rules below say. f16 computes in f32 on converted copies
// (oneDNN 2.6 has no fast f16 CPU convolution) and rounds the results. f64, and any configuration
// oneDNN rejects or would only run with its slow reference implementation, use the im2col + GEMM
// reference path below.
#pragma once
#include <string>

#include "backend/cpu/kernel_decls.h"
#include "backend/kernel_params.h"
#include "core/switches.h"
#include "fasttrain/ops/conv.h"
#include "fasttrain/tensor.h"

namespace ft::cpu {

using backend::ConvParams;

// conv2d_forward, conv2d_backward_data, conv2d_backward_weight: x, y (and gx, gy) dense in the
// params' memory format; w and gw contiguous [O, C/g, kH, kW]; b and gb contiguous [O] or
// undefined. All share x's dtype. Outputs are overwritten.

// The same three passes on the reference path only (f32/f64, or bf16/f16 converted to f32): used
// as the fallback and by tests that cross-check the oneDNN path.
void conv2d_forward_reference(const ConvParams& p, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y);
void conv2d_backward_data_reference(const ConvParams& p, const Tensor& gy, const Tensor& w, const Tensor& gx);
void conv2d_backward_weight_reference(const ConvParams& p, const Tensor& gy, const Tensor& x, const Tensor& gw,
                                      const Tensor& gb);

// oneDNN path (conv_onednn.cpp). Each returns false, having written nothing, when oneDNN has no
// fast implementation for the configuration; the caller then falls back to the reference path.
bool onednn_conv2d_forward(const ConvParams& p, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y);
bool onednn_conv2d_backward_data(const ConvParams& p, const Tensor& gy, const Tensor& w, const Tensor& gx);
bool onednn_conv2d_backward_weight(const ConvParams& p, const Tensor& gy, const Tensor& x, const Tensor& gw,
                                   const Tensor& gb);

// bf16 weight gradients on conv_weight_grad.h's kernel (images paired for vdpbf16ps), reading
// NHWC activations in place and NCHW ones as nChw16c copies. Returns false, having written nothing,
// where the kernel does not run (not bf16, grouped, dilated, channels not multiples of 16, or a
// CPU without AVX512-BF16).
bool paired_conv2d_backward_weight(const ConvParams& p, const Tensor& gy, const Tensor& x, const Tensor& gw,
                                   const Tensor& gb);
// bf16 weight gradients of weight_grad_is_one_product() layers as gw[O, C] = gy[M, O]^T x[M, C]
// over the M = N H W positions, and gb as gy's column sums: linear layers' weight gradient
// (linalg.h). Returns false, having written nothing, for other layers or dtypes.
bool matmul_conv2d_backward_weight(const ConvParams& p, const Tensor& gy, const Tensor& x, const Tensor& gw,
                                   const Tensor& gb);
// bf16 forward, backward-data and weight-gradient passes on conv_winograd.h's kernels, reading
// NHWC activations in place and NCHW ones as nChw16c copies. Return false, having written nothing,
// where the kernel does not run (not bf16, not 3x3 stride 1 padding 1, grouped, dilated, channels
// not multiples of 16, or a CPU without AVX512-BF16).
bool winograd_conv2d_forward(const ConvParams& p, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y);
bool winograd_conv2d_backward_data(const ConvParams& p, const Tensor& gy, const Tensor& w, const Tensor& gx);
bool winograd_conv2d_backward_weight(const ConvParams& p, const Tensor& gy, const Tensor& x, const Tensor& gw,
                                     const Tensor& gb);
// Which oneDNN algorithm a convolution asks for. Winograd F(4x4, 3x3) multiplies 2.25-4x less
// than the direct convolution; for f32 3x3 stride-1 layers with at least 16 channels each side
// and 8x8 outputs, oneDNN's AVX-512 kernels for it run every pass up to twice as fast
// (docs/PERF.md), at the cost of scratch memory (taken from the caching allocator). Its transforms
// round differently: against an f64 reference, errors by norms of about 1e-6 where direct sums
// make 2e-7 (tests/test_conv.cpp), far inside f32 training's needs. FT_CONV_ALGO=direct forces the
// direct kernels that PyTorch's CPU convolutions use; FT_CONV_ALGO=winograd asks for Winograd
// wherever oneDNN has it. Winograd that oneDNN declines falls back to direct.
//
// bf16 has no Winograd in oneDNN; its 3x3 stride-1 padding-1 layers with channels in multiples of
// 16 take conv_winograd.h's kernels (F(2x2, 3x3) for forward and backward-data, F(3x3, 2x2) for
// the weight gradient), where C * O <= kWinogradBf16MaxFilterPairs and oneDNN has no AMX. Their
// bf16 rounding of the transformed tiles makes errors of about 2-3x the direct sum's
// (tests/test_conv.cpp).
enum class ConvAlgorithm { Direct, Winograd };
inline constexpr int64_t kWinogradBf16MaxFilterPairs = 256 * 256;
// setting: the switch FT_CONV_ALGO (core/switches.h); auto is the rule above.
ConvAlgorithm choose_conv_algorithm(const ConvParams& p, DType dt, switches::ConvAlgo setting,
                                    bool onednn_has_amx = false);
ConvAlgorithm conv_algorithm(const ConvParams& p, DType dt);  // with the switch in effect
// Which kernel a bf16 weight gradient takes. The rule (the switch FT_CONV_WEIGHT_GRAD on auto): the
// Winograd kernel (conv_winograd.h) where the convolution's algorithm is Winograd; else oneDNN's
// where its ISA includes AMX, whose tile multiplies outrun vdpbf16ps; else, for a channels-last
// 1x1 stride-1 layer over at most kMatmulWeightGradMaxPositions positions (ResNet's 14x14 and
// 7x7 stages at batch 8), one matrix product gw = gy^T x on linalg.h's matmul, which runs such
// short sums 4-13% faster than oneDNN's convolution kernels and the paired kernel (docs/PERF.md;
// over 56x56 positions it is slower, over 28x28 even); else oneDNN's where each element of gy
// feeds 256 products or fewer (kH * kW * C: ResNet's 1x1 layers on up to 256 channels), as
// repacking gy then costs more than the paired kernel saves; the paired kernel otherwise.
// FT_CONV_WEIGHT_GRAD=paired, onednn or matmul forces one (A/B runs; tests of each on any
// machine); where the forced kernel does not take the layer, oneDNN's runs.
enum class WeightGradPath { Paired, OneDnn, Winograd, Matmul };
inline constexpr int64_t kMatmulWeightGradMaxPositions = 4096;
// Whether a layer's weight gradient is one matrix product over its positions: 1x1, stride 1, no
// padding, dilation or groups, channels-last activations (rows of channels per position).
bool weight_grad_is_one_product(const ConvParams& p);
WeightGradPath choose_weight_grad_path(const ConvParams& p, switches::ConvWeightGrad setting, bool onednn_has_amx,
                                       ConvAlgorithm algorithm = ConvAlgorithm::Direct);
WeightGradPath weight_grad_path(const ConvParams& p);  // with the switches in effect and oneDNN's ISA
// The implementation oneDNN runs for the forward pass (its impl_info_str, e.g. "jit_wino_4x3:avx512_core"),
// or "" when the configuration takes the reference path.
std::string onednn_conv2d_forward_implementation(const ConvParams& p, DType dt, bool bias);
// The scratch memory its forward primitive asks for (taken from the caching allocator per call).
int64_t onednn_conv2d_forward_scratch_bytes(const ConvParams& p, DType dt, bool bias);

}  // namespace ft::cpu
