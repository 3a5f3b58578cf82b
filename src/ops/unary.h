// Runs a unary op by its enumerator (FT_UNARY_OPS in backend/elementwise_math.h): the generated
// public functions, hand-written ones with options (gelu) and tests that walk the list call it.
#pragma once
#include "backend/elementwise_math.h"
#include "fasttrain/tensor.h"

namespace ft::ops {

Tensor unary(math::UnaryOp op, const Tensor& x);

}  // namespace ft::ops
