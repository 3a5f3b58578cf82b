#include <gtest/gtest.h>

#include "fasttrain/fasttrain.h"
#include "support/expect_error.h"
#include "support/gradcheck.h"
#include "support/parity.h"

using namespace ft;
using test::expect_error;
using test::ParityCase;

namespace {

Pair pair_param(const ParityCase& c, const char* key) {
  auto v = c.param<std::vector<int64_t>>(key);
  return {v.at(0), v.at(1)};
}

Tensor rand_f64(const Shape& s, uint64_t seed) {
  manual_seed(seed);
  return randn(s, TensorOptions(DType::F64));
}

// Runs one parity case: the op, output layout, output and input gradient.
template <class F>
void check_case(const std::string& name, F op) {
  SCOPED_TRACE(name);
  ParityCase c(name);
  if (!c.available()) GTEST_SKIP() << c.skip_reason();
  Tensor x = c.input("x", true);
  Tensor y = op(c, x);
  EXPECT_EQ(y.dtype(), c.dtype());
  if (c.param<bool>("channels_last")) EXPECT_TRUE(y.is_channels_last()) << "channels-last input, output not";
  c.expect_output(y);
  c.backward({y});
  c.expect_grad("x", x);
  if (c.param<bool>("channels_last")) {
    // The input gradient the op produces is channels-last too. (Checked through autograd::grad:
    // the engine's AccumulateGrad currently copies a non-contiguous gradient into NCHW for .grad.)
    Tensor y2 = op(c, x);
    Tensor gx = autograd::grad({y2}, {x}, {full_like(y2, 1.0)})[0];
    EXPECT_TRUE(gx.is_channels_last() && !gx.is_contiguous());
  }
}

}  // namespace

TEST(PoolParity, MaxPool) {
  for (const char* dt : {"f32", "f64", "bf16"})
    for (const char* cfg : {"k2", "k3s2p1", "k3s2p1_cl", "rect_dil", "rect_dil_cl", "ceilless"})
      check_case(std::string("maxpool_") + cfg + "_" + dt, [](const ParityCase& c, const Tensor& x) {
        return max_pool2d(x, pair_param(c, "kernel"), pair_param(c, "stride"), pair_param(c, "padding"),
                          pair_param(c, "dilation"));
      });
}

TEST(PoolParity, AvgPool) {
  for (const char* dt : {"f32", "f64", "bf16"})
    for (const char* cfg : {"k2", "k3s2p1", "k3s2p1_excl", "k3s2p1_excl_cl", "rect_cl", "ceilless"})
      check_case(std::string("avgpool_") + cfg + "_" + dt, [](const ParityCase& c, const Tensor& x) {
        return avg_pool2d(x, pair_param(c, "kernel"), pair_param(c, "stride"), pair_param(c, "padding"),
                          c.param<bool>("count_include_pad"));
      });
}

TEST(PoolParity, AdaptiveAvgPool) {
  for (const char* dt : {"f32", "f64", "bf16"})
    for (const char* cfg : {"global", "global_cl", "uneven", "uneven_cl", "upsample"})
      check_case(std::string("adaptive_") + cfg + "_" + dt, [](const ParityCase& c, const Tensor& x) {
        return adaptive_avg_pool2d(x, pair_param(c, "output_size"));
      });
}

// Every pool in f64, on NCHW, channels-last and non-contiguous (permuted) inputs.
TEST(PoolGradcheck, AllPools) {
  Tensor base = rand_f64({2, 3, 7, 6}, 1);
  Tensor inputs[] = {base, base.contiguous_channels_last(), rand_f64({6, 7, 3, 2}, 2).permute({3, 2, 1, 0})};
  for (Tensor x : inputs) {
    x = x.detach().requires_grad_();
    SCOPED_TRACE(x.is_contiguous() ? "nchw" : x.is_channels_last() ? "nhwc" : "permuted");
    EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return max_pool2d(in[0], {3, 3}, {2, 2}, {1, 1}); }, {x});
    EXPECT_GRADCHECK(
        [](const std::vector<Tensor>& in) {
          return max_pool2d(in[0], {2, 3}, {1, 2}, {1, 1}, {2, 1});
        },
        {x});
    EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return avg_pool2d(in[0], {3, 3}, {2, 2}, {1, 1}); }, {x});
    EXPECT_GRADCHECK(
        [](const std::vector<Tensor>& in) {
          return avg_pool2d(in[0], {3, 2}, {2, 1}, {1, 1}, false);
        },
        {x});
    EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], {4, 4}); }, {x});
    EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], {1, 1}); }, {x});
  }
}

// Ties go to the first element of the window in scan order (PyTorch's rule), in both layouts, and
// overlapping windows accumulate into the shared element.
TEST(PoolMax, TiesRouteToFirstIndex) {
  for (bool cl : {false, true}) {
    Tensor x = ones({1, 2, 4, 4});
    if (cl) x = x.contiguous_channels_last();
    x.requires_grad_();
    Tensor y = max_pool2d(x, {2, 2});
    sum(y).backward();
    std::vector<double> g = x.grad().to_vector();
    for (int c = 0; c < 2; ++c)
      for (int h = 0; h < 4; ++h)
        for (int w = 0; w < 4; ++w) EXPECT_EQ(g[(c * 4 + h) * 4 + w], (h % 2 == 0 && w % 2 == 0) ? 1.0 : 0.0);
    Tensor x2 = (cl ? ones({1, 1, 3, 3}).contiguous_channels_last() : ones({1, 1, 3, 3})).requires_grad_();
    sum(max_pool2d(x2, {2, 2}, {1, 1})).backward();  // every window's first element: (0,0),(0,1),(1,0),(1,1)
    EXPECT_EQ(x2.grad().to_vector(), (std::vector<double>{1, 1, 0, 1, 1, 0, 0, 0, 0}));
  }
}

TEST(PoolAvg, CountIncludePad) {
  Tensor x = ones({1, 1, 2, 2});
  // 3x3 windows, padding 1: the corner output covers 4 input elements of 9 window positions
  for (double v : avg_pool2d(x, {3, 3}, {1, 1}, {1, 1}, true).to_vector()) EXPECT_NEAR(v, 4.0 / 9.0, 1e-7);
  for (double v : avg_pool2d(x, {3, 3}, {1, 1}, {1, 1}, false).to_vector()) EXPECT_DOUBLE_EQ(v, 1.0);
}

TEST(PoolErrors, Messages) {
  Tensor x = zeros({2, 3, 8, 8});
  expect_error(
      [&] {
        max_pool2d(zeros({3, 8, 8}), {2, 2});
      },
      "max_pool2d: expected a 4-d input [N, C, H, W], found shape [3, 8, 8]");
  expect_error(
      [&] {
        max_pool2d(x, {3, 3}, {1, 1}, {2, 2});
      },
      "max_pool2d: padding [2, 2] must be at most half the kernel size [3, 3]");
  expect_error([&] { max_pool2d(x, {0, 2}); }, "max_pool2d: kernel size must be positive, found [0, 2]");
  expect_error([&] { max_pool2d(x, {2, 2}, {-1, 1}); }, "max_pool2d: stride must be positive");
  expect_error([&] { max_pool2d(x, {2, 2}, {1, 1}, {0, 0}, {0, 1}); }, "max_pool2d: dilation must be positive");
  expect_error([&] { max_pool2d(x, {9, 2}); }, "max_pool2d: kernel 9x2 (dilated) is larger than the padded input 8x8");
  expect_error([&] { avg_pool2d(x, {3, 3}, {1, 1}, {2, 0}); }, "avg_pool2d: padding [2, 0] must be at most half");
  expect_error(
      [&] {
        avg_pool2d(zeros({2, 3, 8, 8}, DType::I64), {2, 2});
      },
      "avg_pool2d: input must be a floating-point tensor, found i64");
  expect_error(
      [&] {
        adaptive_avg_pool2d(x, {0, 3});
      },
      "adaptive_avg_pool2d: output size must be positive, found [0, 3]");
  expect_error(
      [&] {
        adaptive_avg_pool2d(zeros({2, 3, 0, 4}), {1, 1});
      },
      "adaptive_avg_pool2d: input has an empty spatial size");
}
