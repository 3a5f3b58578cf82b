// Elementwise arithmetic and activations with NumPy broadcasting and PyTorch type promotion.
// Implemented in src/ops/elementwise.cpp (math, gradients) and src/backend/cpu/elementwise.cpp.
#pragma once
#include "fasttrain/tensor.h"

namespace ft {

Tensor add(const Tensor& a, const Tensor& b, Scalar alpha = 1);  // a + alpha * b
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha = 1);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, Scalar b);
Tensor sub(const Tensor& a, Scalar b);
Tensor mul(const Tensor& a, Scalar b);
Tensor div(const Tensor& a, Scalar b);
Tensor rsub(const Tensor& a, Scalar b);  // b - a
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, Scalar exponent);

// One-input ops in the input's dtype (16-bit floats computed in f32). neg, abs, square and relu
// take integer tensors too; the rest need a floating one. Each is one line of FT_UNARY_OPS
// (src/backend/elementwise_math.h), which generates its definition; that definition needs the
// declaration here.
Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor square(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
enum class GeluApprox { None, Tanh };  // None: exact x*Phi(x) with erf
Tensor gelu(const Tensor& x, GeluApprox approximate = GeluApprox::None);
Tensor silu(const Tensor& x);
// log(1 + e^x), and x itself past 20 (PyTorch's softplus with beta 1, threshold 20).
Tensor softplus(const Tensor& x);
// x * tanh(softplus(x)) (Misra 2019; PyTorch's mish).
Tensor mish(const Tensor& x);
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);

// silu(gate) * up in one pass (the gated MLP of Llama-family models: down(silu_mul(gate(x), up(x)))),
// and both gradients in one pass. gate and up: one shape and floating dtype; their last dim
// should be dense and their leading dims collapse to one row stride (so gate and up may be the
// two halves of one [.., 2F] projection, read in place), other layouts are copied first. The
// output is contiguous; bf16 and f16 compute in f32.
Tensor silu_mul(const Tensor& gate, const Tensor& up);

// Selection: cond is bool (or any dtype, nonzero = true); broadcasting over all three.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value);

// Comparisons give bool tensors (not differentiable).
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, Scalar b);
Tensor gt(const Tensor& a, Scalar b);
Tensor lt(const Tensor& a, Scalar b);
Tensor logical_not(const Tensor& x);

// In place, not recorded by autograd (optimizers, accumulation).
Tensor& add_(Tensor& a, const Tensor& b, Scalar alpha = 1);
Tensor& mul_(Tensor& a, Scalar b);

// Sums `grad` over broadcast dimensions so it has `shape` (the backward of broadcasting).
Tensor sum_to_shape(const Tensor& grad, const Shape& shape);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, Scalar b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, Scalar b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, Scalar b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, Scalar b) { return div(a, b); }
inline Tensor operator+(Scalar a, const Tensor& b) { return add(b, a); }
inline Tensor operator-(Scalar a, const Tensor& b) { return rsub(b, a); }
inline Tensor operator*(Scalar a, const Tensor& b) { return mul(b, a); }

}  // namespace ft
