// Copies with dtype conversion between arbitrarily strided CPU tensors, and fills.
#pragma once
#include "fasttrain/tensor.h"

namespace ft::cpu {

// dst = src converted to dst's dtype; src broadcasts to dst's shape.
void copy(const Tensor& dst, const Tensor& src);
void fill(const Tensor& dst, Scalar value);

}  // namespace ft::cpu
