// Memory-format helpers shared by conv2d and the pooling ops (defined in conv.cpp).
#pragma once
#include "fasttrain/tensor.h"

namespace ft::ops {

// True when a 4-d tensor is NHWC-dense and not also NCHW-dense (with C == 1 or H == W == 1 it is
// both; PyTorch then keeps the contiguous format). Outputs follow this choice.
bool prefers_channels_last(const Tensor& x);
// `x` detached and dense in NHWC (channels_last) or NCHW order: itself when it already is.
Tensor dense_in_format(const Tensor& x, bool channels_last);
// An uninitialised 4-d tensor dense in NHWC (channels_last) or NCHW order.
Tensor empty_in_format(const Shape& shape, TensorOptions opts, bool channels_last);

}  // namespace ft::ops
