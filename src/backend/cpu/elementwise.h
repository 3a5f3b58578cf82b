// CPU kernels of the elementwise family (formulas in backend/elementwise_math.h).
#pragma once
#include <optional>

#include "backend/cpu/kernel_decls.h"
#include "backend/elementwise_math.h"
#include "fasttrain/tensor.h"

namespace ft::cpu {

// unary: out = op(x); x and out share a floating dtype (or an integral one for Neg/Abs/Square/Relu).
// unary_backward: out = grad * op'(x) (y = op(x) passed for ops whose derivative uses it).
// binary: out = op(a, b) with broadcasting; a and b share a dtype; out has it too, or bool for comparisons.
// where: out = cond ? a : b; cond bool, a/b/out one dtype.
// clamp: out = min(max(x, lo), hi), either bound optional.
// clamp_backward: out = grad where lo <= x <= hi, else 0.
// add_inplace: a += alpha * b in place (b broadcasts to a).
// silu_mul: out = silu(gate) * up over [R, F] rows; gate and up any row stride, last dim dense; out dense.
// silu_mul_backward: dgate = grad * up * silu'(gate), dup = grad * silu(gate); grad as gate, outputs dense.

}  // namespace ft::cpu
