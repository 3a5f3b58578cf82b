#include <gtest/gtest.h>

#include <cmath>
#include <limits>

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

// Max pooling against a per-window scan written here (rows, then columns; a value is taken when
// it is greater than the best so far or NaN, PyTorch's rule) on values with many ties, -inf
// windows and NaNs, in both layouts and at widths that are not a multiple of the kernels' vector
// width. The indices are checked through the backward: each output's gradient lands on the
// position its window picked.
TEST(PoolMax, MatchesAPerWindowScanWithTiesInfinitiesAndNans) {
  struct Config {
    Pair kernel, stride, padding, dilation;
    int64_t H, W;
  };
  const Config configs[] = {{{3, 3}, {2, 2}, {1, 1}, {1, 1}, 13, 37},
                            {{2, 3}, {1, 3}, {1, 1}, {2, 2}, 9, 40},
                            {{3, 2}, {2, 1}, {0, 1}, {1, 3}, 8, 21},
                            {{1, 1}, {1, 1}, {0, 0}, {1, 1}, 3, 17}};
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (const Config& cfg : configs)
    for (DType dt : {DType::F32, DType::BF16})
      for (bool cl : {false, true}) {
        SCOPED_TRACE(std::to_string(cfg.H) + "x" + std::to_string(cfg.W) + " " + dtype_name(dt) + (cl ? " nhwc" : ""));
        const int64_t N = 2, C = 3, H = cfg.H, W = cfg.W;
        std::vector<double> xv(N * C * H * W);
        uint64_t r = 12345;
        for (double& v : xv) {
          r = r * 6364136223846793005ull + 1442695040888963407ull;
          const int k = static_cast<int>((r >> 33) % 20);
          v = k == 0 ? nan : k == 1 ? -inf : static_cast<double>(k % 5) - 2.0;  // ties among five values
        }
        for (int64_t i = 0; i < H * W; ++i) xv[i] = -inf;  // one plane of -inf windows only
        Tensor x = from_vector(xv, {N, C, H, W}).to(dt);
        if (cl) x = x.contiguous_channels_last();
        x.requires_grad_();
        Tensor y = max_pool2d(x, cfg.kernel, cfg.stride, cfg.padding, cfg.dilation);
        const int64_t OH = y.shape()[2], OW = y.shape()[3];
        std::vector<double> gv(N * C * OH * OW);
        for (size_t i = 0; i < gv.size(); ++i) gv[i] = static_cast<double>(i % 7 + 1);
        sum(mul(y, from_vector(gv, {N, C, OH, OW}).to(dt))).backward();
        const std::vector<double> got = y.contiguous().to_vector(), got_grad = x.grad().contiguous().to_vector();
        std::vector<double> want_grad(xv.size(), 0.0);
        for (int64_t b = 0; b < N * C; ++b)
          for (int64_t oh = 0; oh < OH; ++oh)
            for (int64_t ow = 0; ow < OW; ++ow) {
              double best = -inf;
              int64_t at = -1;
              for (int64_t kh = 0; kh < cfg.kernel[0]; ++kh)
                for (int64_t kw = 0; kw < cfg.kernel[1]; ++kw) {
                  const int64_t ih = oh * cfg.stride[0] - cfg.padding[0] + kh * cfg.dilation[0];
                  const int64_t iw = ow * cfg.stride[1] - cfg.padding[1] + kw * cfg.dilation[1];
                  if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                  const double v = xv[(b * H + ih) * W + iw];
                  if (at < 0 || v > best || std::isnan(v)) {
                    best = v;
                    at = ih * W + iw;
                  }
                }
              const int64_t o = (b * OH + oh) * OW + ow;
              if (std::isnan(best))
                EXPECT_TRUE(std::isnan(got[o])) << "output " << o;
              else
                EXPECT_EQ(got[o], best) << "output " << o;
              want_grad[b * H * W + at] += gv[o];
            }
        EXPECT_EQ(got_grad, want_grad);
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
