// Small helpers shared by op implementations.
#pragma once
#include <vector>

#include "fasttrain/autograd.h"
#include "fasttrain/tensor.h"

namespace ft::ops {

// Throws unless every defined tensor lives on the same device; returns that device.
Device common_device(std::initializer_list<const Tensor*> ts, const char* op);
// Throws "<op>: <what> must be a floating-point tensor, found i64".
void check_floating(const Tensor& t, const char* op, const char* what);
// reduced_dims_mask: mask[d] is true for each dim in `dims` (wrapped; an empty list is no dim;
// a repeated dim is an error naming `op`). reduced_shape: `shape` without the masked dims, or
// with 1 in their place when keepdim.
std::vector<bool> reduced_dims_mask(const Dims& dims, int ndim, const char* op);
Shape reduced_shape(const Shape& shape, const std::vector<bool>& mask, bool keepdim);
// A 0-d tensor holding `s`, of the dtype an op with tensor `like` computes in.
Tensor scalar_like(Scalar s, const Tensor& like);
// t (detached) as [R, F] rows, F its last size and R the product of the others, with a dense
// last dim and one row stride: a view when the leading dims collapse to one stride (a [B, T, F]
// half of a [B, T, 2F] projection does), a contiguous copy otherwise. For row kernels, which then
// take any row stride rather than asking every operand to be contiguous.
Tensor as_rows(const Tensor& t);

}  // namespace ft::ops
