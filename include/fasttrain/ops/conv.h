// Convolution and pooling over 4-d inputs in NCHW or channels-last (NHWC memory order, the same
// logical NCHW shape, as in PyTorch). Output memory format follows the input's.
// Implemented in src/ops/conv.cpp, src/ops/pool.cpp and src/backend/cpu/.
#pragma once
#include <array>

#include "fasttrain/tensor.h"

namespace ft {

using Pair = std::array<int64_t, 2>;

// x [N, C, H, W], weight [O, C/groups, kH, kW], bias [O] or undefined.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), Pair stride = {1, 1},
              Pair padding = {0, 0}, Pair dilation = {1, 1}, int64_t groups = 1);
Tensor max_pool2d(const Tensor& x, Pair kernel, Pair stride = {0, 0} /* 0: = kernel */, Pair padding = {0, 0},
                  Pair dilation = {1, 1});
Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0},
                  bool count_include_pad = true);
Tensor adaptive_avg_pool2d(const Tensor& x, Pair output_size);

}  // namespace ft
