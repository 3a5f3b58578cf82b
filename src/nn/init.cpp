// Initialisers with PyTorch's rules (torch.nn.init): fans from the weight's shape, gains per
// nonlinearity, bounds sqrt(3) * std for the uniform variants. All fill in place without
// recording autograd history.
#include <cmath>

#include "fasttrain/autograd.h"
#include "fasttrain/nn.h"

namespace ft::nn::init {
namespace {

void check_floating_tensor(const Tensor& t, const char* fn) {
  FT_CHECK(t.defined(), "init::", fn, ": tensor is undefined");
  FT_CHECK(is_floating(t.dtype()), "init::", fn, ": expected a floating tensor, found ", dtype_name(t.dtype()));
}

struct Fans {
  double in, out;
};

// fan_in = size(1) * receptive field, fan_out = size(0) * receptive field (torch's
// _calculate_fan_in_and_fan_out): for a conv weight [O, I, kH, kW] the receptive field is kH*kW.
Fans fans(const Tensor& t, const char* fn) {
  FT_CHECK(t.dim() >= 2, "init::", fn, ": fan in and fan out need a tensor of at least 2 dimensions, found shape ",
           t.shape().str());
  double receptive = 1;
  for (int d = 2; d < t.dim(); ++d) receptive *= static_cast<double>(t.size(d));
  return {static_cast<double>(t.size(1)) * receptive, static_cast<double>(t.size(0)) * receptive};
}

double gain(Nonlinearity nl, double a) {
  switch (nl) {
    case Nonlinearity::Linear: return 1.0;
    case Nonlinearity::ReLU: return std::sqrt(2.0);
    case Nonlinearity::LeakyReLU: return std::sqrt(2.0 / (1.0 + a * a));
    case Nonlinearity::Tanh: return 5.0 / 3.0;
  }
  return 1.0;
}

double kaiming_std(const Tensor& t, double a, bool fan_in_mode, Nonlinearity nl, const char* fn) {
  Fans f = fans(t, fn);
  double fan = fan_in_mode ? f.in : f.out;
  FT_CHECK(fan > 0, "init::", fn, ": fan is zero for a tensor of shape ", t.shape().str());
  return gain(nl, a) / std::sqrt(fan);
}

double xavier_std(const Tensor& t, double g, const char* fn) {
  Fans f = fans(t, fn);
  FT_CHECK(f.in + f.out > 0, "init::", fn, ": fan in + fan out is zero for a tensor of shape ", t.shape().str());
  return g * std::sqrt(2.0 / (f.in + f.out));
}

}  // namespace

void normal_(Tensor& t, double mean, double std, Generator* gen) {
  check_floating_tensor(t, "normal_");
  FT_CHECK(std >= 0, "init::normal_: std must be >= 0, found ", std);
  ::ft::normal_(t, mean, std, gen);
}

void uniform_(Tensor& t, double low, double high, Generator* gen) {
  check_floating_tensor(t, "uniform_");
  FT_CHECK(low <= high, "init::uniform_: low must be <= high, found [", low, ", ", high, ")");
  ::ft::uniform_(t, low, high, gen);
}

void zeros_(Tensor& t) {
  FT_CHECK(t.defined(), "init::zeros_: tensor is undefined");
  autograd::NoGradGuard ng;
  t.zero_();
}

void ones_(Tensor& t) {
  FT_CHECK(t.defined(), "init::ones_: tensor is undefined");
  autograd::NoGradGuard ng;
  t.fill_(1);
}

void kaiming_uniform_(Tensor& t, double a, bool fan_in_mode, Nonlinearity nl, Generator* gen) {
  check_floating_tensor(t, "kaiming_uniform_");
  double bound = std::sqrt(3.0) * kaiming_std(t, a, fan_in_mode, nl, "kaiming_uniform_");
  ::ft::uniform_(t, -bound, bound, gen);
}

void kaiming_normal_(Tensor& t, double a, bool fan_in_mode, Nonlinearity nl, Generator* gen) {
  check_floating_tensor(t, "kaiming_normal_");
  ::ft::normal_(t, 0.0, kaiming_std(t, a, fan_in_mode, nl, "kaiming_normal_"), gen);
}

void xavier_uniform_(Tensor& t, double g, Generator* gen) {
  check_floating_tensor(t, "xavier_uniform_");
  double bound = std::sqrt(3.0) * xavier_std(t, g, "xavier_uniform_");
  ::ft::uniform_(t, -bound, bound, gen);
}

void xavier_normal_(Tensor& t, double g, Generator* gen) {
  check_floating_tensor(t, "xavier_normal_");
  ::ft::normal_(t, 0.0, xavier_std(t, g, "xavier_normal_"), gen);
}

}  // namespace ft::nn::init
