// The torch.nn layers: parameters named and initialised as PyTorch does, forward through the ops.
#include <cmath>

#include "fasttrain/activation_checkpoint.h"
#include "fasttrain/autograd.h"
#include "fasttrain/nn.h"

namespace ft::nn {
namespace {

// nn.Linear / nn.Conv2d reset_parameters(): kaiming_uniform_(a=sqrt(5)), which bounds the weight
// by 1/sqrt(fan_in), and the bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
void default_affine_init(Tensor& weight, Tensor& bias, double fan_in, Generator* gen) {
  init::kaiming_uniform_(weight, std::sqrt(5.0), true, init::Nonlinearity::LeakyReLU, gen);
  if (bias.defined()) {
    double bound = fan_in > 0 ? 1.0 / std::sqrt(fan_in) : 0.0;
    init::uniform_(bias, -bound, bound, gen);
  }
}

void check_positive(int64_t v, const char* layer, const char* what) {
  FT_CHECK(v > 0, layer, ": ", what, " must be positive, found ", v);
}

}  // namespace

Linear::Linear(int64_t in, int64_t out, bool with_bias, Generator* gen) {
  check_positive(in, "Linear", "in_features");
  check_positive(out, "Linear", "out_features");
  weight = register_parameter("weight", empty({out, in}));
  if (with_bias) bias = register_parameter("bias", empty({out}));
  default_affine_init(weight, bias, static_cast<double>(in), gen);
}

Linear::Linear(Tensor w, Tensor b) {
  FT_CHECK(w.defined() && w.dim() == 2, "Linear: weight must be a 2-d [out, in] tensor");
  weight = register_parameter("weight", w);
  if (b.defined()) {
    FT_CHECK(b.dim() == 1 && b.size(0) == w.size(0), "Linear: bias must have shape [", w.size(0), "], found ",
             b.shape().str());
    bias = register_parameter("bias", b);
  }
}

Tensor Linear::forward(const Tensor& x) {
  const Fp8Recipe* recipe = fp8_autocast_recipe();
  if (recipe == nullptr || !runs_fp8()) return linear(x, weight, bias);
  if (!fp8_state) fp8_state = std::make_shared<Fp8LinearState>(*recipe, weight.device());
  return fp8_linear(x, weight, bias, *fp8_state);
}

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding, bool with_bias, int64_t groups,
               int64_t dilation, Generator* gen)
    : stride(stride), padding(padding), groups(groups), dilation(dilation) {
  check_positive(in, "Conv2d", "in_channels");
  check_positive(out, "Conv2d", "out_channels");
  check_positive(kernel, "Conv2d", "kernel_size");
  check_positive(stride, "Conv2d", "stride");
  check_positive(groups, "Conv2d", "groups");
  check_positive(dilation, "Conv2d", "dilation");
  FT_CHECK(padding >= 0, "Conv2d: padding must be >= 0, found ", padding);
  FT_CHECK(in % groups == 0 && out % groups == 0, "Conv2d: in_channels (", in, ") and out_channels (", out,
           ") must be divisible by groups (", groups, ")");
  weight = register_parameter("weight", empty({out, in / groups, kernel, kernel}));
  if (with_bias) bias = register_parameter("bias", empty({out}));
  default_affine_init(weight, bias, static_cast<double>(in / groups * kernel * kernel), gen);
}

Tensor Conv2d::forward(const Tensor& x) {
  return conv2d(x, weight, bias, {stride, stride}, {padding, padding}, {dilation, dilation}, groups);
}

BatchNorm2d::BatchNorm2d(int64_t channels, double eps, double momentum) : eps(eps), momentum(momentum) {
  check_positive(channels, "BatchNorm2d", "num_features");
  FT_CHECK(eps > 0, "BatchNorm2d: eps must be positive, found ", eps);
  FT_CHECK(momentum >= 0 && momentum <= 1, "BatchNorm2d: momentum must be in [0, 1], found ", momentum);
  weight = register_parameter("weight", ones({channels}));
  bias = register_parameter("bias", zeros({channels}));
  running_mean = register_buffer("running_mean", zeros({channels}));
  running_var = register_buffer("running_var", ones({channels}));
  num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, DType::I64));
}

namespace {

// The module's batch norm; with the ReLU fused (relu), and with a residual added before it
// (residual defined).
Tensor batch_norm_module(BatchNorm2d& m, bool training, const Tensor& x, bool relu, const Tensor& residual = Tensor()) {
  FT_CHECK(x.dim() == 4, "BatchNorm2d: expected a 4-d input [N, C, H, W], found shape ", x.shape().str());
  auto op = [&](const Tensor& rm, const Tensor& rv) {
    if (residual.defined())
      return batch_norm_add_relu(x, residual, rm, rv, m.weight, m.bias, training, m.momentum, m.eps);
    return (relu ? batch_norm_relu : batch_norm)(x, rm, rv, m.weight, m.bias, training, m.momentum, m.eps);
  };
  // Re-run by activation checkpointing's backward: the forward already updated the statistics.
  if (training && autograd::recomputing()) return op(Tensor(), Tensor());
  Tensor y = op(m.running_mean, m.running_var);
  if (training) {
    autograd::NoGradGuard ng;
    add_(m.num_batches_tracked, ones({}, m.num_batches_tracked.options()));  // as torch: counted, not used
  }
  return y;
}

}  // namespace

Tensor BatchNorm2d::forward(const Tensor& x) { return batch_norm_module(*this, training_, x, false); }

Tensor BatchNorm2d::call_with_relu(const Tensor& x) {
  return call_as_this([&] { return batch_norm_module(*this, training_, x, true); });
}

Tensor BatchNorm2d::call_with_add_relu(const Tensor& x, const Tensor& residual) {
  return call_as_this([&] { return batch_norm_module(*this, training_, x, true, residual); });
}

LayerNorm::LayerNorm(int64_t dim, double eps, bool affine) : dim(dim), eps(eps) {
  check_positive(dim, "LayerNorm", "normalized_shape");
  FT_CHECK(eps > 0, "LayerNorm: eps must be positive, found ", eps);
  if (affine) {
    weight = register_parameter("weight", ones({dim}));
    bias = register_parameter("bias", zeros({dim}));
  }
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, {dim}, weight, bias, eps); }

ResidualNorm LayerNorm::call_with_add(const Tensor& x, const Tensor& residual) {
  ResidualNorm out;
  call_as_this([&] {
    out = add_layer_norm(x, residual, {dim}, weight, bias, eps);
    return out.normed;
  });
  return out;
}

RMSNorm::RMSNorm(int64_t dim, double eps) : dim(dim), eps(eps) {
  check_positive(dim, "RMSNorm", "normalized_shape");
  FT_CHECK(eps > 0, "RMSNorm: eps must be positive, found ", eps);
  weight = register_parameter("weight", ones({dim}));
}

Tensor RMSNorm::forward(const Tensor& x) { return rms_norm(x, {dim}, weight, eps); }

ResidualNorm RMSNorm::call_with_add(const Tensor& x, const Tensor& residual) {
  ResidualNorm out;
  call_as_this([&] {
    out = add_rms_norm(x, residual, {dim}, weight, eps);
    return out.normed;
  });
  return out;
}

Embedding::Embedding(int64_t num, int64_t dim, Generator* gen) {
  check_positive(num, "Embedding", "num_embeddings");
  check_positive(dim, "Embedding", "embedding_dim");
  weight = register_parameter("weight", empty({num, dim}));
  init::normal_(weight, 0.0, 1.0, gen);
}

Tensor Embedding::forward(const Tensor& ids) { return embedding(ids, weight); }

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p, training_); }

Tensor MaxPool2d::forward(const Tensor& x) {
  return max_pool2d(x, {kernel, kernel}, {stride, stride}, {padding, padding});
}

Tensor AvgPool2d::forward(const Tensor& x) {
  return avg_pool2d(x, {kernel, kernel}, {stride, stride}, {padding, padding});
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) { return adaptive_avg_pool2d(x, {out, out}); }

}  // namespace ft::nn
