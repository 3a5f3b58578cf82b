// softmax, log_softmax and cross_entropy. Parity with PyTorch (tests/parity/cases_softmax.py),
// gradient checks in f64, errors and options.
#include <gtest/gtest.h>

#include <cmath>

#include "fasttrain/fasttrain.h"
#include "support/expect_error.h"
#include "support/gradcheck.h"
#include "support/parity.h"

using namespace ft;
using test::expect_error;
using test::ParityCase;

namespace {

const char* kDtypes[] = {"f32", "f64", "bf16", "f16"};
const char* kSoftmaxSets[] = {"last", "first", "mid", "mid_t", "last_t", "strided", "wide"};
const char* kCeSets[] = {"mean", "sum_ignore", "none_smooth", "mean_smooth_ignore_t",
                         "wide", "4d",         "4d_none_cl",  "3d_sum"};

Reduction reduction_of(const std::string& s) {
  if (s == "mean") return Reduction::Mean;
  if (s == "sum") return Reduction::Sum;
  if (s == "none") return Reduction::None;
  FT_FAIL("unknown reduction ", s);
}

Tensor ce_from_case(const ParityCase& c, const Tensor& x) {
  return cross_entropy(x, c.input("t"), c.param<int64_t>("ignore_index"), c.param<double>("label_smoothing"),
                       reduction_of(c.param<std::string>("reduction")));
}

Tensor rnd(Shape s, Generator& g) { return randn(s, DType::F64, &g).requires_grad_(); }

}  // namespace

TEST(SoftmaxParity, SoftmaxAndLogSoftmax) {
  for (const char* dt : kDtypes) {
    for (const char* tag : kSoftmaxSets) {
      for (bool log : {false, true}) {
        std::string name = std::string(log ? "log_softmax_" : "softmax_") + dt + "_" + tag;
        SCOPED_TRACE(name);
        FT_PARITY_CASE(c, name);
        Tensor x = c.input("x", true);
        int64_t dim = c.param<int64_t>("dim");
        Tensor y = log ? log_softmax(x, dim) : softmax(x, dim);
        EXPECT_EQ(y.dtype(), c.dtype());
        c.expect_output(y);
        c.backward({y});
        c.expect_grad("x", x);
      }
    }
  }
}

TEST(SoftmaxParity, CrossEntropy) {
  for (const char* dt : kDtypes) {
    for (const char* tag : kCeSets) {
      std::string name = std::string("ce_") + dt + "_" + tag;
      SCOPED_TRACE(name);
      FT_PARITY_CASE(c, name);
      Tensor x = c.input("x", true);
      Tensor y = ce_from_case(c, x);
      EXPECT_EQ(y.dtype(), c.dtype());
      c.expect_output(y);
      c.backward({y});
      c.expect_grad("x", x);
    }
  }
  FT_PARITY_CASE(c, "ce_f32_all_ignored");
  Tensor x = c.input("x", true);
  Tensor y = ce_from_case(c, x);
  EXPECT_TRUE(std::isnan(y.item<double>()));  // 0/0, like PyTorch
  c.expect_output(y);
  c.backward({y});
  c.expect_grad("x", x);
}

TEST(SoftmaxGradcheck, SoftmaxLogSoftmax) {
  Generator g(9);
  for (int64_t dim : {0, 1, 2, -1}) {
    SCOPED_TRACE(dim);
    EXPECT_GRADCHECK([dim](const std::vector<Tensor>& in) { return softmax(in[0], dim); }, {rnd({3, 4, 5}, g)});
    EXPECT_GRADCHECK([dim](const std::vector<Tensor>& in) { return log_softmax(in[0], dim); }, {rnd({3, 4, 5}, g)});
  }
  Tensor xt = rnd({6, 4}, g).t().detach().requires_grad_();
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return softmax(in[0], -1); }, {xt});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return log_softmax(in[0], 0); }, {xt});
}

TEST(SoftmaxGradcheck, CrossEntropy) {
  Generator g(13);
  Tensor t = from_vector({2, -100, 0, 4, 1, 3}, {6}, DType::I64);
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    for (double eps : {0.0, 0.15}) {
      SCOPED_TRACE(eps);
      EXPECT_GRADCHECK([t, red, eps](const std::vector<Tensor>& in) { return cross_entropy(in[0], t, -100, eps, red); },
                       {rnd({6, 5}, g)});
    }
  }
  // non-contiguous logits, ignore_index naming a real class
  Tensor xt = rnd({5, 6}, g).t().detach().requires_grad_();
  Tensor t3 = from_vector({2, 3, 0, 4, 1, 3}, {6}, DType::I64);
  EXPECT_GRADCHECK([t3](const std::vector<Tensor>& in) { return cross_entropy(in[0], t3, 3, 0.1); }, {xt});
  // [N, C, H, W] with targets [N, H, W]
  Tensor t4 = from_vector({0, 2, 1, -100, 2, 2, 0, 1, 1, 0, -100, 2}, {2, 2, 3}, DType::I64);
  EXPECT_GRADCHECK([t4](const std::vector<Tensor>& in) { return cross_entropy(in[0], t4, -100, 0.2); },
                   {rnd({2, 3, 2, 3}, g)});
  EXPECT_GRADCHECK([t4](const std::vector<Tensor>& in) { return cross_entropy(in[0], t4, -100, 0.0, Reduction::None); },
                   {rnd({2, 3, 2, 3}, g)});
}

namespace {

// softmax, log_softmax and cross_entropy are fused kernels; their oracle is the textbook formula
// composed of elementwise ops, reductions and gather, whose gradients autograd derives. The row
// maximum is a constant shift (detached): it changes nothing but the range of exp.
Tensor composed_log_softmax(const Tensor& x, int64_t dim) {
  Tensor shifted = sub(x, max(x, dim, true).values.detach());
  return sub(shifted, log(sum(exp(shifted), {dim}, true)));
}

// PyTorch's cross_entropy over class dim 1: (1 - eps) * nll + eps * mean over classes of -log p,
// ignored positions excluded from the sum and from the mean's denominator.
Tensor composed_cross_entropy(const Tensor& x, const Tensor& t, int64_t ignore_index, double eps, Reduction red) {
  Tensor logp = composed_log_softmax(x, 1);
  Tensor valid = logical_not(eq(t, ignore_index));
  Tensor safe_t = where(valid, t, zeros_like(t));
  Tensor nll = neg(gather(logp, 1, safe_t.unsqueeze(1)).squeeze(1));
  Tensor smooth = neg(mean(logp, {1}));
  Tensor loss = mul(add(mul(nll, 1 - eps), mul(smooth, eps)), valid.to(x.dtype()));
  if (red == Reduction::None) return loss;
  if (red == Reduction::Sum) return sum(loss);
  return div(sum(loss), sum(valid.to(x.dtype())));
}

}  // namespace

TEST(Softmax, FusedKernelsMatchComposedOps) {
  Generator g(21);
  for (int64_t dim : {0, 1, -1}) {
    SCOPED_TRACE(dim);
    Tensor x = mul(randn({4, 6, 5}, DType::F64, &g), 3.0).detach().requires_grad_();
    EXPECT_MATCHES_REFERENCE([dim](const std::vector<Tensor>& in) { return log_softmax(in[0], dim); },
                             [dim](const std::vector<Tensor>& in) { return composed_log_softmax(in[0], dim); }, {x});
    EXPECT_MATCHES_REFERENCE([dim](const std::vector<Tensor>& in) { return softmax(in[0], dim); },
                             [dim](const std::vector<Tensor>& in) { return exp(composed_log_softmax(in[0], dim)); },
                             {x});
  }
  Tensor t = from_vector({2, -100, 0, 4, 1, 3, 4, -100}, {8}, DType::I64);
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    for (double eps : {0.0, 0.15}) {
      SCOPED_TRACE(eps);
      Tensor x = rnd({8, 5}, g);
      EXPECT_MATCHES_REFERENCE(
          [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], t, -100, eps, red); },
          [&](const std::vector<Tensor>& in) { return composed_cross_entropy(in[0], t, -100, eps, red); }, {x});
    }
  }
  // [N, C, H, W] logits, non-contiguous, with targets [N, H, W] and ignore_index naming a class
  Tensor t4 = from_vector({0, 2, 1, 2, 2, 2, 0, 1, 1, 0, 2, 2}, {2, 2, 3}, DType::I64);
  Tensor x4 = randn({2, 2, 3, 3}, DType::F64, &g).permute({0, 3, 1, 2}).detach().requires_grad_();
  EXPECT_MATCHES_REFERENCE(
      [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], t4, 1, 0.1); },
      [&](const std::vector<Tensor>& in) { return composed_cross_entropy(in[0], t4, 1, 0.1, Reduction::Mean); }, {x4});
}

TEST(Softmax, Properties) {
  Generator g(1);
  Tensor x = randn({5, 7}, DType::F32, &g);
  for (int64_t dim : {0, 1}) {
    std::vector<double> s = sum(softmax(x, dim), {dim}).to_vector();
    for (double v : s) EXPECT_NEAR(v, 1.0, 1e-6);
  }
  // masked scores (-inf) get exactly 0 probability; a fully masked row is NaN, as in PyTorch
  Tensor m = from_vector({0, -INFINITY, 1, -INFINITY}, {1, 4});
  std::vector<double> p = softmax(m, 1).to_vector();
  EXPECT_EQ(p[1], 0.0);
  EXPECT_EQ(p[3], 0.0);
  EXPECT_NEAR(p[0] + p[2], 1.0, 1e-6);
  EXPECT_TRUE(std::isinf(log_softmax(m, 1).to_vector()[1]));
  EXPECT_TRUE(std::isnan(softmax(full({1, 3}, -INFINITY), 1).to_vector()[0]));
  // huge logits do not overflow
  Tensor big = from_vector({1000, 1001, 999}, {3});
  std::vector<double> pb = softmax(big, 0).to_vector();
  EXPECT_NEAR(pb[1], 1.0 / (1.0 + std::exp(-1.0) + std::exp(-2.0)), 1e-6);
  // 0-d and zero-size inputs
  EXPECT_EQ(softmax(scalar_tensor(3.0), 0).item<double>(), 1.0);
  EXPECT_EQ(softmax(zeros({0, 4}), 1).numel(), 0);
}

TEST(CrossEntropy, OptionsAndUnbatched) {
  Tensor x = from_vector({1, 2, 3, 0, 0, 0}, {2, 3});
  Tensor t = from_vector({2, 1}, {2}, DType::I64);
  const double l0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0, l1 = std::log(3.0);
  EXPECT_NEAR(cross_entropy(x, t).item<double>(), (l0 + l1) / 2, 1e-6);
  EXPECT_NEAR(cross_entropy(x, t, -100, 0.0, Reduction::Sum).item<double>(), l0 + l1, 1e-6);
  EXPECT_NEAR(cross_entropy(x, t, 1).item<double>(), l0, 1e-6);  // position 1 ignored: mean over 1
  // i32 targets work like i64
  EXPECT_NEAR(cross_entropy(x, t.to(DType::I32)).item<double>(), (l0 + l1) / 2, 1e-6);
  // unbatched [C] logits with a 0-d target
  Tensor u = cross_entropy(x.select(0, 0), scalar_tensor(int64_t{2}, DType::I64), -100, 0.0, Reduction::None);
  EXPECT_EQ(u.dim(), 0);
  EXPECT_NEAR(u.item<double>(), l0, 1e-6);
  // label smoothing 1: the loss is the mean over classes of -log p
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_NEAR(cross_entropy(x.select(0, 0).unsqueeze(0), t.slice(0, 0, 1), -100, 1.0).item<double>(), lse - 2.0, 1e-6);
}

TEST(CrossEntropy, Errors) {
  Tensor x = zeros({16, 10});
  expect_error([&] { cross_entropy(x, zeros({8}, DType::I64)); },
               "cross_entropy: target has shape [8], expected [16] to match logits [16, 10]");
  expect_error([&] { cross_entropy(x, zeros({16})); },
               "cross_entropy: target must be an integer tensor of class indices (i64 or i32), found f32");
  expect_error(
      [&] {
        cross_entropy(zeros({16, 10}, DType::I64), zeros({16}, DType::I64));
      },
      "cross_entropy: logits must be a floating-point tensor, found i64");
  Tensor t = zeros({16}, DType::I64);
  t.select(0, 5).fill_(10);
  expect_error([&] { cross_entropy(x, t); }, "cross_entropy: target 10 at position 5 is out of range for 10 classes");
  t.select(0, 5).fill_(-3);
  expect_error([&] { cross_entropy(x, t); }, "cross_entropy: target -3 at position 5 is out of range");
  expect_error([&] { cross_entropy(x, zeros({16}, DType::I64), -100, 1.5); },
               "cross_entropy: label_smoothing must be in [0, 1], found 1.5");
  expect_error(
      [&] {
        cross_entropy(zeros({2, 3, 4}), zeros({2, 3}, DType::I64));
      },
      "target has shape [2, 3], expected [2, 4]");
  expect_error([] { softmax(zeros({2}, DType::I32), 0); }, "softmax: input must be a floating-point tensor, found i32");
  expect_error([] { log_softmax(zeros({2, 3}), 2); }, "log_softmax: dimension 2 is out of range");
}
