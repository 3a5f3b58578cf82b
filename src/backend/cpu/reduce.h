// CPU reductions over a set of dimensions.
#pragma once
#include "backend/cpu/kernel_decls.h"
#include "fasttrain/tensor.h"

namespace ft::cpu {

// The input viewed as rows: out element k reduces the R values x[k, 0..R) (kept dims first,
// reduced dims last, as a permuted view). When `inner_contiguous`, the R values of a row are
// dense (stride 1) and row k starts at row_offset(k); otherwise `values` is a dense [K, R] copy.
struct ReductionRows {
  Tensor values;  // [K, R] contiguous view or copy
  int64_t K = 0, R = 0;
};
ReductionRows reduction_rows(const Tensor& x, const std::vector<bool>& mask);

// A tensor viewed as [outer, R, inner] around dimension `dim` (R is that dimension's size): the
// layout softmax and single-dim reductions iterate over.
struct Rows3 {
  int64_t outer = 1, R = 1, inner = 1;
};
Rows3 rows3(const Shape& shape, int dim);

// sum: out (any floating/integral dtype, numel K) = sum over reduced dims of x, times `scale`.
// Floating sums accumulate in f64 per row block for accuracy; ints sum in i64.

}  // namespace ft::cpu
