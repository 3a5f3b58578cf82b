// CPU kernels of var, max and argmax (sum and mean are in reduce.h).
//
// max/argmax follow PyTorch: the first index among ties, and NaN beats every number (the first
// NaN is the result). Rows along the last dim take two vectorised passes (max value, then the
// first position holding it) instead of one scalar compare-and-branch pass; max over a leading or
// middle dim sweeps the R rows with a running (value, index) per column, so reads stay dense.
// var is two-pass (mean, then the sum of squared deviations) in blocks summed in f32 (f64 for
// f64) and combined in f64, which avoids the cancellation of the one-pass E[x^2] - E[x]^2.
#pragma once
#include <vector>

#include "backend/cpu/kernel_decls.h"
#include "fasttrain/tensor.h"

namespace ft::cpu {

// max_dim: Max along `dim` of contiguous x: `values` (x's dtype; may be undefined when only indices are
// wanted) and i64 `indices`, both contiguous with numel = x.numel() / x.size(dim).
// max_all: Max of all elements of contiguous x (non-empty) into the 0-d `value` (may be undefined) and the
// flat index of it into the 0-d i64 `index` (may be undefined).
// max_dim_backward: The backward of max_dim: gx (contiguous, x's shape, one dtype with g) = 0 except
// gx[o, indices[o, i], i] = g[o, i], for x viewed as [outer, R, inner] around `dim`.
// var: out (numel K, x's dtype) = variance over the `mask` dims of x, sum of squared deviations
// divided by `divisor` (R - correction, clamped at 0 by the caller).

}  // namespace ft::cpu
