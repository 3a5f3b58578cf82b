// Normalisation layers' functional forms and dropout. Statistics in f32 (f64 for f64).
// Implemented in src/ops/norm.cpp and src/ops/dropout.cpp.
#pragma once
#include "fasttrain/random.h"
#include "fasttrain/tensor.h"

namespace ft {

// Normalises over the trailing dims given by normalized_shape. weight/bias may be undefined.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(), double eps = 1e-6);

// A pre-norm transformer's residual add and the norm after it, in one pass over the rows each
// way: sum = x + residual (the residual stream, carried on) and normed = layer_norm(sum) (or
// rms_norm). Both outputs take gradients; x and residual get the same one. Equal to add() then the
// norm; a residual of another shape (broadcast) or dtype goes through exactly those two ops.
struct ResidualNorm {
  Tensor sum;
  Tensor normed;
};
ResidualNorm add_layer_norm(const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                            const Tensor& weight = Tensor(), const Tensor& bias = Tensor(), double eps = 1e-5);
ResidualNorm add_rms_norm(const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                          const Tensor& weight = Tensor(), double eps = 1e-6);
// x [N, C, ...] (channels-last 4-d inputs stay channels-last). In training mode uses batch
// statistics and updates running_mean/var in place (unbiased variance, PyTorch's momentum rule);
// in eval mode uses the running statistics. running_* may be undefined in training mode.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5);
// relu(batch_norm(...)) in one pass over the activations each way, with no tensor between the
// two (nn::Sequential runs a BatchNorm2d followed by a ReLU this way).
Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5);
// relu(batch_norm(x, ...) + residual), the output of a ResNet block, in one pass over the
// activations (nn::Sequential::forward_add_relu). residual: x's shape; one of another dtype is
// added as add() would, through the unfused ops.
Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& weight, const Tensor& bias, bool training,
                           double momentum = 0.1, double eps = 1e-5);

// Zeroes each element with probability p and scales the rest by 1/(1-p) (identity when !training
// or p == 0). The mask comes from the counter-based generator.
Tensor dropout(const Tensor& x, double p, bool training = true, Generator* gen = nullptr);

}  // namespace ft
