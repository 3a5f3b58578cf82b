// Every kernel an op may ask a device for, one line each: X(name, signature). The list makes
// the fields of backend::Kernels (kernels.h) and the CPU registration (cpu/kernels.cpp assigns
// each entry its cpu:: function of the same name, so a CPU kernel that is missing or has another
// signature fails to compile there). A backend without an entry leaves it empty and the op raises
// "no <device> kernel for <name>" when called.
//
// Conventions: outputs come last and are allocated by the op (shape and dtype already decided);
// kernels validate nothing the op has checked.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "backend/elementwise_math.h"
#include "backend/kernel_params.h"
#include "fasttrain/tensor.h"

#define FT_KERNELS(X)                                                                                                  \
  /* core: tensor copies and fills */                                                                                  \
  X(copy, void(const Tensor& dst, const Tensor& src))                                                                  \
  X(fill, void(const Tensor& dst, Scalar value))                                                                       \
  /* elementwise */                                                                                                    \
  X(unary, void(math::UnaryOp op, const Tensor& x, const Tensor& out))                                                 \
  X(unary_backward, void(math::UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y, const Tensor& out))   \
  X(binary, void(math::BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out))                              \
  X(where, void(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out))                              \
  X(clamp, void(const Tensor& x, std::optional<double> lo, std::optional<double> hi, const Tensor& out))               \
  X(clamp_backward,                                                                                                    \
    void(const Tensor& grad, const Tensor& x, std::optional<double> lo, std::optional<double> hi, const Tensor& out))  \
  X(add_inplace, void(const Tensor& a, const Tensor& b, double alpha))                                                 \
  /* reductions */                                                                                                     \
  X(sum, void(const Tensor& x, const std::vector<bool>& mask, double scale, const Tensor& out))                        \
  X(var, void(const Tensor& x, const std::vector<bool>& mask, double divisor, const Tensor& out))                      \
  X(max_dim, void(const Tensor& x, int dim, const Tensor& values, const Tensor& indices))                              \
  X(max_all, void(const Tensor& x, const Tensor& value, const Tensor& index))                                          \
  X(max_dim_backward, void(const Tensor& g, const Tensor& indices, int dim, const Tensor& gx))                         \
  /* indexing */                                                                                                       \
  X(cat, void(const std::vector<Tensor>& inputs, int dim, const Tensor& out))                                          \
  X(check_index_range,                                                                                                 \
    void(const Tensor& index, int64_t size, std::optional<int64_t> ignore, const IndexErrorText& error))               \
  X(index_select, void(const Tensor& x, int dim, const Tensor& index, const Tensor& out))                              \
  X(index_add, void(const Tensor& acc, int dim, const Tensor& index, const Tensor& src, std::optional<int64_t> skip))  \
  X(gather, void(const Tensor& x, int dim, const Tensor& index, const Tensor& out))                                    \
  X(scatter_add, void(const Tensor& acc, int dim, const Tensor& index, const Tensor& src))                             \
  /* linear algebra: out (+)= a @ b (+ bias), batched over leading dims */                                             \
  X(matmul, void(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate, const Tensor& bias))            \
  /* linear's parameter gradients from gy [R, out] and x [R, in]: gw = gy^T x, gb (if defined) = column sums of gy */  \
  X(linear_weight_grad, void(const Tensor& gy, const Tensor& x, const Tensor& gw, const Tensor& gb))                   \
  /* convolution and pooling */                                                                                        \
  X(conv2d_forward, void(const ConvParams& p, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y))     \
  X(conv2d_backward_data, void(const ConvParams& p, const Tensor& gy, const Tensor& w, const Tensor& gx))              \
  X(conv2d_backward_weight,                                                                                            \
    void(const ConvParams& p, const Tensor& gy, const Tensor& x, const Tensor& gw, const Tensor& gb))                  \
  X(max_pool2d_forward, void(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& indices))            \
  X(max_pool2d_backward, void(const PoolParams& p, const Tensor& gy, const Tensor& indices, const Tensor& gx))         \
  X(avg_pool2d_forward, void(const PoolParams& p, const Tensor& x, const Tensor& y))                                   \
  X(avg_pool2d_backward, void(const PoolParams& p, const Tensor& gy, const Tensor& gx))                                \
  X(adaptive_avg_pool2d_forward, void(const PoolParams& p, const Tensor& x, const Tensor& y))                          \
  X(adaptive_avg_pool2d_backward, void(const PoolParams& p, const Tensor& gy, const Tensor& gx))                       \
  /* normalisation, softmax, losses */                                                                                 \
  /* layer/RMS norm of x, or with `residual` defined of sum = x + residual (rounded to x's dtype, then */              \
  /* normalised; sum written); backward: dx (+)= dsum when defined, for the fused residual add */                      \
  X(row_norm_forward, void(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b, double eps,      \
                           bool rms, const Tensor& sum, const Tensor& y, const Tensor& mean, const Tensor& rstd))      \
  X(row_norm_backward,                                                                                                 \
    void(const Tensor& dy, const Tensor& dsum, const Tensor& x, const Tensor& mean, const Tensor& rstd,                \
         const Tensor& w, bool rms, const Tensor& dx, const Tensor& dw, const Tensor& db))                             \
  X(batch_norm_stats, void(const Tensor& x, const BatchNormLayout& L, const Tensor& mean, const Tensor& var))          \
  /* invstd = 1/sqrt(var + eps); running stats (if defined) blended with the batch's (var made unbiased) */            \
  X(batch_norm_update, void(const Tensor& mean, const Tensor& var, double count, double momentum, double eps,          \
                            const Tensor& invstd, const Tensor& running_mean, const Tensor& running_var))              \
  X(batch_norm_apply, void(const Tensor& x, const BatchNormLayout& L, const Tensor& mean, const Tensor& invstd,        \
                           const Tensor& w, const Tensor& b, const Tensor& y))                                         \
  X(batch_norm_backward,                                                                                               \
    void(const Tensor& dy, const Tensor& x, const BatchNormLayout& L, const Tensor& mean, const Tensor& invstd,        \
         const Tensor& w, const Tensor& b, bool training, const Tensor& dx, const Tensor& dw, const Tensor& db))       \
  X(softmax_forward, void(const Tensor& x, int dim, bool log, const Tensor& out))                                      \
  X(softmax_backward, void(const Tensor& g, const Tensor& y, int dim, bool log, const Tensor& gx))                     \
  X(cross_entropy_forward, void(const Tensor& logits, int64_t N, int64_t C, int64_t S, const Tensor& target,           \
                                int64_t ignore_index, double eps, const Tensor& loss, const Tensor& lse))              \
  X(cross_entropy_backward,                                                                                            \
    void(const Tensor& logits, int64_t N, int64_t C, int64_t S, const Tensor& target, const Tensor& lse,               \
         int64_t ignore_index, double eps, const Tensor& grad, double scale, const Tensor& gx))                        \
  /* dropout and attention */                                                                                          \
  X(dropout_forward,                                                                                                   \
    void(const Tensor& x, float keep, double scale, const PhiloxDraw& mask_draw, const Tensor& y, const Tensor& mask)) \
  X(dropout_backward, void(const Tensor& dy, const Tensor& mask, double scale, const Tensor& dx))                      \
  /* document mask bounds: doc_ids dense i32 [B, T] -> starts, ends dense i32 [B, T] (AttentionParams); an id */       \
  /* below its predecessor raises decreasing(id - previous, flat position) (on a GPU at the next synchronisation) */   \
  X(attention_document_bounds,                                                                                         \
    void(const Tensor& doc_ids, const Tensor& starts, const Tensor& ends, const IndexErrorText& decreasing))           \
  X(attention_forward, void(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,               \
                            const Tensor& out, const Tensor& lse, const Tensor& out_f32))                              \
  X(attention_backward,                                                                                                \
    void(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& dout,  \
         const AttentionParams& p, const Tensor& dq, const Tensor& dk, const Tensor& dv))                              \
  /* rotary position embedding, Hugging Face's rotate_half pairing (i with i + D/2): x [B, T, H, D] with any */        \
  /* strides and a dense last dim, cos and sin dense [T, D/2] (f32, or f64 for f64 x), out dense [B, T, H, D]: */      \
  /* out[i] = x[i] c - x[i + D/2] s, out[i + D/2] = x[i + D/2] c + x[i] s; `inverse` turns by minus the angle */       \
  /* (the backward, on the gradient) */                                                                                \
  X(rotary_embedding, void(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse, const Tensor& out))    \
  /* FP8 (fasttrain/fp8.h, backend/fp8_math.h): x [R, C] (any float dtype, dense last dim) -> codes U8 [R, C] */       \
  /* = saturate(x * scale) in `format`, and the same codes transposed into codes_t U8 [C, R] when defined; */          \
  /* amax f32 [1] becomes max(amax, max |x|) (NaN wins); scale f32 [1] */                                              \
  X(fp8_quantize, void(const Tensor& x, Fp8Format format, const Tensor& scale, const Tensor& amax,                     \
                       const Tensor& codes, const Tensor& codes_t))                                                    \
  /* end of a step, per row r of amax [R]: history [R, L] shifts by one (newest first) taking amax[r], amax[r] */      \
  /* becomes 0, scale[r] = fp8_next_scale(max of the row or its newest entry, scale[r]), scale_inv = 1 / scale */      \
  X(fp8_update_scales, void(const Tensor& amax, const Tensor& history, const Tensor& scale, const Tensor& scale_inv,   \
                            const Fp8ScaleParams& p))                                                                  \
  /* out [M, N] = (a [M, K] b [N, K]^T) * a_scale_inv * b_scale_inv (+ bias [N], out's dtype), a and b dense U8 */     \
  /* codes of fa and fb, f32 accumulation; out f32 or bf16 */                                                          \
  X(fp8_matmul, void(const Tensor& a, Fp8Format fa, const Tensor& a_scale_inv, const Tensor& b, Fp8Format fb,          \
                     const Tensor& b_scale_inv, const Tensor& bias, bool fast_accumulate, const Tensor& out))

// Fusions of the entries above that a backend may leave out: where its slot is empty, the op
// computes the same result from the entries above (ops ask the slot's has_value()), so a backend
// gains the fusion by adding the kernel and nothing else changes. Completeness checks of a
// backend's table cover FT_KERNELS and FT_KERNELS_OPTIM only.
#define FT_KERNELS_FUSED(X)                                                                                          \
  /* y = max(0, bn(x) + r), r dense in y's layout and dtype (ResNet's block output: the residual add and ReLU in */  \
  /* the normalisation's one pass) */                                                                                \
  X(batch_norm_add_relu, void(const Tensor& x, const BatchNormLayout& L, const Tensor& mean, const Tensor& invstd,   \
                              const Tensor& w, const Tensor& b, const Tensor& residual, const Tensor& y))            \
  /* pre = x @ w^T + b (b may be undefined) and y = gelu(pre), x [R, in], w [hid, in]: an MLP's first linear */      \
  /* and its GELU in one product (cuBLASLt's GELU_AUX_BIAS epilogue); gelu: UnaryOp::Gelu or GeluTanh */             \
  X(linear_gelu,                                                                                                     \
    void(const Tensor& x, const Tensor& w, const Tensor& b, math::UnaryOp gelu, const Tensor& pre, const Tensor& y)) \
  /* dpre = (gy @ w) * gelu'(pre) and db (if defined) = dpre's column sums, gy [R, out], w [out, hid]: the MLP's */  \
  /* second linear's input gradient, the GELU's backward and the first linear's bias gradient in one product */      \
  X(matmul_gelu_backward, void(const Tensor& gy, const Tensor& w, const Tensor& pre, math::UnaryOp gelu,             \
                               const Tensor& dpre, const Tensor& db))                                                \
  /* out = silu(gate) * up (SwiGLU's gate: the unary silu and the binary mul in one pass), gate and up [R, F] */     \
  /* with any row strides and a dense last dim (two halves of one [R, 2F] projection), out dense [R, F]; the */      \
  /* backward writes dgate = grad * up * silu'(gate) and dup = grad * silu(gate) in one pass (grad as gate's */      \
  /* layout rules, dgate and dup dense). A backend provides both or neither. */                                      \
  X(silu_mul, void(const Tensor& gate, const Tensor& up, const Tensor& out))                                         \
  X(silu_mul_backward,                                                                                               \
    void(const Tensor& grad, const Tensor& gate, const Tensor& up, const Tensor& dgate, const Tensor& dup))
