// CPU kernels of the elementwise family (formulas in backend/elementwise_math.h).
#pragma once
#include <optional>

#include "backend/elementwise_math.h"
#include "fasttrain/tensor.h"

namespace ft::cpu {

// out = op(x); x and out share a floating dtype (or an integral one for Neg/Abs/Square/Relu).
void unary(math::UnaryOp op, const Tensor& x, const Tensor& out);
// out = grad * op'(x) (y = op(x) passed for ops whose derivative uses it).
void unary_backward(math::UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y, const Tensor& out);
// out = op(a, b) with broadcasting; a and b share a dtype; out has it too, or bool for comparisons.
void binary(math::BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);
// out = cond ? a : b; cond bool, a/b/out one dtype.
void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out);
void clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi, const Tensor& out);
// out = grad where lo <= x <= hi, else 0.
void clamp_backward(const Tensor& grad, const Tensor& x, std::optional<double> lo, std::optional<double> hi,
                    const Tensor& out);
// a += alpha * b in place (b broadcasts to a).
void add_inplace(const Tensor& a, const Tensor& b, double alpha);

}  // namespace ft::cpu
