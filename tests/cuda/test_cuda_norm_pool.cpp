// CUDA batch-norm and pooling kernels (backend/cuda/batch_norm.cu, pool.cu) against the CPU
// backend, through the public ops and layers: batch_norm / batch_norm_relu / nn::BatchNorm2d in
// training and eval mode, max_pool2d, avg_pool2d and adaptive_avg_pool2d, forward and backward,
// on NCHW and channels-last inputs, f32 / bf16 / f16 (and f64 once each). Shapes are chosen to
// reach every kernel path: runs of 49 / 196 / 256 values (scalar, half-width and full-width
// vectors), channel counts that do and do not fill a vector, inputs large enough to split a
// channel's reduction over several blocks. Upstream gradients are random (support/cuda_compare.h),
// comparisons by norms with tol(dt). Also: the statistics of a channel whose mean dwarfs its
// spread, bitwise determinism, and inputs at an offset that defeats vector loads. Skipped with a
// visible message where there is no GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "fasttrain/fasttrain.h"
#include "support/cuda_compare.h"
#include "support/require_gpu.h"

using namespace ft;
using ft::testing::backward_random;
using ft::testing::gpu;
using ft::testing::Leaf;
using ft::testing::leaf;
using ft::testing::rnd;
using ft::testing::tol;

namespace {

const DType kDtypes[] = {DType::F32, DType::BF16, DType::F16};

bool nhwc(const Tensor& t) { return t.dim() == 4 && t.is_channels_last() && !t.is_contiguous(); }

// `v` in NCHW (cl false) or NHWC memory order on both devices, as leaves.
Leaf leaf_fmt(const Tensor& v, bool cl, bool requires_grad = true) {
  const Tensor c = v.detach().contiguous();
  Leaf l{(cl ? c.contiguous_channels_last() : c.clone()).detach(),
         (cl ? gpu(c).contiguous_channels_last() : gpu(c)).detach()};
  if (requires_grad) {
    l.cpu.requires_grad_();
    l.cuda.requires_grad_();
  }
  return l;
}

std::string fmt_name(const Shape& s, bool cl, DType dt) {
  return s.str() + (cl ? " nhwc " : " nchw ") + dtype_name(dt);
}

// Bitwise equality of two GPU results.
bool same_bits(const Tensor& a, const Tensor& b) {
  return a.to(Device::cpu()).contiguous().to_vector() == b.to(Device::cpu()).contiguous().to_vector();
}

// The values of `v` (any layout) in a fresh buffer at an offset of one element, in NCHW or NHWC
// order: the data pointer is not 16-byte aligned, so the kernels cannot use vector loads on it.
Tensor at_odd_offset(const Tensor& v, bool cl) {
  const Shape& s = v.shape();
  const Tensor dense = cl ? v.contiguous_channels_last() : v.contiguous();
  Tensor buf = empty({v.numel() + 1}, v.options());
  const Strides st = cl ? Strides{s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]} : contiguous_strides(s);
  Tensor out = buf.as_strided(s, st, 1);
  out.copy_(dense);
  return out;
}

// ---------------------------------------------------------------------------------------------
// batch_norm

struct BnShape {
  Shape shape;
  bool cl;
};

// NCS runs of 49 (scalar loads), 196 (8-byte vectors in 16-bit), 256 (16-byte vectors), 15; 2-d
// and 3-d inputs; a channel of 18432 values (two reduction blocks); channels-last with 8, 64, 12
// and 5 channels and one with several row splits.
const BnShape kBnShapes[] = {
    {{4, 8, 7, 7}, false}, {{2, 16, 14, 14}, false}, {{2, 6, 16, 16}, false}, {{3, 5, 3, 5}, false},
    {{64, 12}, false},     {{4, 6, 10}, false},      {{8, 4, 48, 48}, false}, {{4, 8, 7, 7}, true},
    {{2, 64, 6, 6}, true}, {{3, 12, 5, 5}, true},    {{2, 5, 4, 6}, true},    {{8, 32, 24, 24}, true},
};

struct BnRun {
  Tensor y, rm, rv;
};

// batch_norm(_relu) of leaf x with weight w / bias b (undefined: no affine) and running
// statistics (rm, rv) on x's device; momentum 1, so after training they are the batch statistics
// (the mean and the unbiased variance) and compare tightly.
BnRun run_bn(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& rm, const Tensor& rv, bool training,
             bool relu) {
  BnRun r{Tensor(), rm.clone(), rv.clone()};
  auto op = relu ? batch_norm_relu : batch_norm;
  r.y = op(x, r.rm, r.rv, w, b, training, 1.0, 1e-5);
  return r;
}

void check_bn(DType dt, const BnShape& bs, bool training, bool affine, bool relu, bool x_grad = true) {
  SCOPED_TRACE(fmt_name(bs.shape, bs.cl, dt) + (training ? " train" : " eval") + (affine ? " affine" : "") +
               (relu ? " relu" : "") + (x_grad ? "" : " params-only"));
  const int64_t C = bs.shape[1];
  Leaf x = leaf_fmt(rnd(bs.shape, dt, 1, 2.0, 0.5), bs.cl, x_grad);
  Leaf w, b;
  if (affine) {
    w = leaf(rnd({C}, DType::F32, 2, 0.5, 1.0));
    b = leaf(rnd({C}, DType::F32, 3, 0.5));
  }
  const Tensor rm = rnd({C}, DType::F32, 4, 0.5), rv = add(abs(rnd({C}, DType::F32, 5)), 0.5);
  const BnRun c = run_bn(x.cpu, w.cpu, b.cpu, rm, rv, training, relu);
  const BnRun g = run_bn(x.cuda, w.cuda, b.cuda, gpu(rm), gpu(rv), training, relu);
  EXPECT_CLOSE_TO_CPU(g.y, c.y, tol(dt));
  if (bs.cl) {
    EXPECT_TRUE(nhwc(g.y)) << "channels-last input, output not";
  }
  if (training) {
    // f32 statistics of the same values on both devices.
    EXPECT_CLOSE_TO_CPU(g.rm, c.rm, 1e-5);
    EXPECT_CLOSE_TO_CPU(g.rv, c.rv, 1e-5);
  }
  if (!x_grad && !affine) return;
  backward_random(c.y, g.y, 6);
  if (x_grad) {
    EXPECT_CLOSE_TO_CPU(x.cuda.grad(), x.cpu.grad(), tol(dt));
  }
  if (affine) {
    EXPECT_CLOSE_TO_CPU(w.cuda.grad(), w.cpu.grad(), tol(dt));
    EXPECT_CLOSE_TO_CPU(b.cuda.grad(), b.cpu.grad(), tol(dt));
  }
}

}  // namespace

TEST(CudaNormPool, BatchNormTraining) {
  REQUIRE_GPU();
  for (DType dt : kDtypes)
    for (const BnShape& bs : kBnShapes)
      for (bool affine : {false, true}) check_bn(dt, bs, true, affine, false);
  check_bn(DType::F64, kBnShapes[0], true, true, false);
  check_bn(DType::F64, kBnShapes[8], true, true, false);
}

TEST(CudaNormPool, BatchNormEval) {
  REQUIRE_GPU();
  for (DType dt : kDtypes)
    for (const BnShape& bs : kBnShapes)
      for (bool affine : {false, true}) check_bn(dt, bs, false, affine, false);
  check_bn(DType::F64, kBnShapes[1], false, true, false);
}

// batch_norm_relu: the fused ReLU in the forward and its mask, recomputed from x, in the backward.
TEST(CudaNormPool, BatchNormReluFused) {
  REQUIRE_GPU();
  for (DType dt : kDtypes)
    for (const BnShape& bs : kBnShapes)
      for (bool training : {true, false}) {
        check_bn(dt, bs, training, true, true);
        check_bn(dt, bs, training, false, true);
      }
  check_bn(DType::F64, kBnShapes[2], true, true, true);
}

// batch_norm_add_relu (a ResNet block's output, relu(bn(x) + residual)): the CUDA kernel adds the
// residual in the normalisation's pass. 4-d shapes in both layouts, both modes: output, running
// statistics and the gradients of x, the residual, weight and bias.
TEST(CudaNormPool, BatchNormAddReluFused) {
  REQUIRE_GPU();
  for (DType dt : kDtypes)
    for (const BnShape& bs : kBnShapes) {
      if (bs.shape.size() != 4) continue;
      for (bool training : {true, false}) {
        SCOPED_TRACE(fmt_name(bs.shape, bs.cl, dt) + (training ? " train" : " eval"));
        const int64_t C = bs.shape[1];
        Leaf x = leaf_fmt(rnd(bs.shape, dt, 1, 2.0, 0.5), bs.cl), r = leaf_fmt(rnd(bs.shape, dt, 7, 1.0), bs.cl);
        Leaf w = leaf(rnd({C}, DType::F32, 2, 0.5, 1.0)), b = leaf(rnd({C}, DType::F32, 3, 0.5));
        const Tensor rm = rnd({C}, DType::F32, 4, 0.5), rv = add(abs(rnd({C}, DType::F32, 5)), 0.5);
        Tensor rmc = rm.clone(), rvc = rv.clone(), rmg = gpu(rm), rvg = gpu(rv);
        Tensor yc = batch_norm_add_relu(x.cpu, r.cpu, rmc, rvc, w.cpu, b.cpu, training, 1.0, 1e-5);
        Tensor yg = batch_norm_add_relu(x.cuda, r.cuda, rmg, rvg, w.cuda, b.cuda, training, 1.0, 1e-5);
        EXPECT_CLOSE_TO_CPU(yg, yc, tol(dt));
        EXPECT_EQ(nhwc(yg), bs.cl);
        EXPECT_CLOSE_TO_CPU(rmg, rmc, 1e-5);
        EXPECT_CLOSE_TO_CPU(rvg, rvc, 1e-5);
        backward_random(yc, yg, 8);
        for (const Leaf* l : {&x, &r, &w, &b}) {
          EXPECT_CLOSE_TO_CPU(l->cuda.grad(), l->cpu.grad(), tol(dt));
        }
      }
    }
}

// Only the parameters want gradients (dx undefined), in both modes and layouts.
TEST(CudaNormPool, BatchNormParamsOnlyGradients) {
  REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16})
    for (const BnShape& bs : {kBnShapes[1], kBnShapes[6], kBnShapes[9], kBnShapes[11]})
      for (bool training : {true, false})
        for (bool relu : {false, true}) check_bn(dt, bs, training, true, relu, false);
}

// A channel whose mean dwarfs its spread (1000 + 0.01 z): the variance must come out as the
// spread's, not as the rounding noise of 1000^2 - 1000^2, in both layouts and with split
// reductions; y and the gradients then match the CPU's too.
TEST(CudaNormPool, BatchNormStatisticsLargeMean) {
  REQUIRE_GPU();
  for (const BnShape& bs : {BnShape{{4, 8, 16, 16}, false}, BnShape{{8, 4, 48, 48}, false},
                            BnShape{{4, 8, 16, 16}, true}, BnShape{{8, 32, 24, 24}, true}}) {
    SCOPED_TRACE(fmt_name(bs.shape, bs.cl, DType::F32));
    const int64_t C = bs.shape[1];
    Leaf x = leaf_fmt(rnd(bs.shape, DType::F32, 30, 0.01, 1000.0), bs.cl);
    const Tensor rm = zeros({C}), rv = ones({C});
    const BnRun c = run_bn(x.cpu, Tensor(), Tensor(), rm, rv, true, false);
    const BnRun g = run_bn(x.cuda, Tensor(), Tensor(), gpu(rm), gpu(rv), true, false);
    const std::vector<double> mg = g.rm.to(Device::cpu()).to_vector(), mc = c.rm.to_vector();
    const std::vector<double> vg = g.rv.to(Device::cpu()).to_vector();
    for (int64_t i = 0; i < C; ++i) {
      EXPECT_NEAR(mg[i], mc[i], 1.3e-4) << "channel " << i << " mean (2 f32 ulps at 1000)";
      EXPECT_NEAR(vg[i], 1e-4, 3e-5) << "channel " << i << " variance";
    }
    EXPECT_CLOSE_TO_CPU(g.rv, c.rv, 1e-5);
    // y = (x - mean) / std with std = 0.01: the f32 mean's last bit at 1000 (6.1e-5) is 0.6% of y,
    // so y and dx follow the two devices' means (checked above to 2 ulps) to about that much.
    EXPECT_CLOSE_TO_CPU(g.y, c.y, 1.5e-2);
    backward_random(c.y, g.y, 31);
    EXPECT_CLOSE_TO_CPU(x.cuda.grad(), x.cpu.grad(), 1.5e-2);
  }
}

// The same inputs give the same bits: twice in a row, and from a copy at an odd offset (no vector
// loads there; the reductions copy such an input so that their summation order stays the same).
TEST(CudaNormPool, BatchNormDeterministicAndOffsetIndependent) {
  REQUIRE_GPU();
  for (const BnShape& bs : {BnShape{{4, 16, 16, 16}, false}, BnShape{{4, 16, 8, 8}, true}})
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(fmt_name(bs.shape, bs.cl, dt));
      const int64_t C = bs.shape[1];
      const Tensor xv = gpu(rnd(bs.shape, dt, 40, 1.5, 0.3));
      const Tensor w = gpu(rnd({C}, DType::F32, 41, 0.5, 1.0)), b = gpu(rnd({C}, DType::F32, 42));
      const Tensor gy = gpu(rnd(bs.shape, dt, 43));
      std::vector<std::vector<Tensor>> results;
      for (const Tensor& src : {bs.cl ? xv.contiguous_channels_last() : xv, bs.cl ? xv.contiguous_channels_last() : xv,
                                at_odd_offset(xv, bs.cl)}) {
        Tensor x = src.detach().requires_grad_();
        Tensor wl = w.detach().clone().requires_grad_(), bl = b.detach().clone().requires_grad_();
        Tensor y = batch_norm_relu(x, Tensor(), Tensor(), wl, bl, true);
        y.backward(gy);
        results.push_back({y, x.grad(), wl.grad(), bl.grad()});
      }
      for (size_t r = 1; r < results.size(); ++r)
        for (size_t i = 0; i < results[0].size(); ++i)
          EXPECT_TRUE(same_bits(results[r][i], results[0][i])) << "run " << r << " result " << i;
    }
}

// nn::BatchNorm2d on the GPU: two training steps (running statistics and the batch counter), the
// fused call_with_relu, then eval mode; bf16 activations with the layer's f32 parameters.
TEST(CudaNormPool, BatchNorm2dLayer) {
  REQUIRE_GPU();
  for (bool cl : {false, true})
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(cl ? "nhwc " : "nchw ") + dtype_name(dt));
      nn::BatchNorm2d mc(24), mg(24);
      Generator gen(50);
      nn::init::normal_(mc.weight, 1.0, 0.3, &gen);
      nn::init::normal_(mc.bias, 0.0, 0.3, &gen);
      mg.load_state_dict(mc.state_dict());
      mg.to(Device::cuda(0));
      for (int step = 0; step < 2; ++step) {
        Leaf x = leaf_fmt(rnd({6, 24, 10, 9}, dt, 51 + step, 2.0, 1.0), cl);
        Tensor yc = step == 0 ? mc.forward(x.cpu) : mc.call_with_relu(x.cpu);
        Tensor yg = step == 0 ? mg.forward(x.cuda) : mg.call_with_relu(x.cuda);
        EXPECT_CLOSE_TO_CPU(yg, yc, tol(dt));
        backward_random(yc, yg, 60 + step);
        EXPECT_CLOSE_TO_CPU(x.cuda.grad(), x.cpu.grad(), tol(dt));
      }
      EXPECT_CLOSE_TO_CPU(mg.weight.grad(), mc.weight.grad(), tol(dt));
      EXPECT_CLOSE_TO_CPU(mg.bias.grad(), mc.bias.grad(), tol(dt));
      EXPECT_CLOSE_TO_CPU(mg.running_mean, mc.running_mean, 1e-5);
      EXPECT_CLOSE_TO_CPU(mg.running_var, mc.running_var, 1e-5);
      EXPECT_EQ(mg.num_batches_tracked.to(Device::cpu()).item<int64_t>(), 2);
      mc.eval();
      mg.eval();
      Leaf x = leaf_fmt(rnd({3, 24, 7, 7}, dt, 70, 2.0, 1.0), cl);
      Tensor yc = mc.call_with_relu(x.cpu), yg = mg.call_with_relu(x.cuda);
      EXPECT_CLOSE_TO_CPU(yg, yc, tol(dt));
      backward_random(yc, yg, 71);
      EXPECT_CLOSE_TO_CPU(x.cuda.grad(), x.cpu.grad(), tol(dt));
    }
}

// ---------------------------------------------------------------------------------------------
// pooling

namespace {

using PoolOp = std::function<Tensor(const Tensor&)>;

// op on the same values (`v`, rounded to dt) on both devices in the given layout: output and
// input gradient against the CPU's.
void check_pool(const char* what, const Tensor& v, DType dt, bool cl, const PoolOp& op, uint64_t seed = 80) {
  SCOPED_TRACE(std::string(what) + " " + fmt_name(v.shape(), cl, dt));
  Leaf x = leaf_fmt(v.to(dt), cl);
  Tensor yc = op(x.cpu), yg = op(x.cuda);
  EXPECT_CLOSE_TO_CPU(yg, yc, tol(dt));
  if (nhwc(x.cuda) && yg.size(1) > 1 && yg.size(2) * yg.size(3) > 1) {
    EXPECT_TRUE(nhwc(yg)) << "layout not kept";
  }
  backward_random(yc, yg, seed);
  EXPECT_CLOSE_TO_CPU(x.cuda.grad(), x.cpu.grad(), tol(dt));
}

// Values drawn from {-2, -1, 0, 1, 2, -inf, NaN} (many ties, -inf windows, NaNs), and the first
// plane all -inf: every window there keeps its first valid position.
Tensor tie_values(const Shape& s, uint64_t seed) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> v(s.numel());
  uint64_t r = seed;
  for (double& e : v) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    const int k = static_cast<int>((r >> 33) % 20);
    e = k == 0 ? nan : (k == 1 ? -inf : static_cast<double>(k % 5) - 2.0);
  }
  for (int64_t i = 0; i < s[2] * s[3]; ++i) v[i] = -inf;
  return from_vector(v, s);
}

struct MaxCfg {
  const char* name;
  Shape shape;
  Pair k, s, p, d;
};

// ResNet's stem window, overlapping stride-1 windows, plain 2x2, dilated rectangles; channel
// counts 16 (vector loads in NHWC), 3 and 5 (scalar), 4.
const MaxCfg kMaxCfgs[] = {
    {"k3s2p1", {2, 16, 17, 16}, {3, 3}, {2, 2}, {1, 1}, {1, 1}},
    {"k3s1p1", {2, 3, 9, 11}, {3, 3}, {1, 1}, {1, 1}, {1, 1}},
    {"k2", {2, 5, 8, 8}, {2, 2}, {0, 0}, {0, 0}, {1, 1}},
    {"k2x3s1x2p1d2x1", {2, 4, 9, 10}, {2, 3}, {1, 2}, {1, 1}, {2, 1}},
    {"k3x2s2x1p0x1d1x3", {2, 16, 8, 21}, {3, 2}, {2, 1}, {0, 1}, {1, 3}},
};

PoolOp max_op(const MaxCfg& c) {
  return [c](const Tensor& t) { return max_pool2d(t, c.k, c.s, c.p, c.d); };
}

}  // namespace

TEST(CudaNormPool, MaxPoolTiesInfinitiesNans) {
  REQUIRE_GPU();
  for (const MaxCfg& c : kMaxCfgs)
    for (DType dt : kDtypes)
      for (bool cl : {false, true}) check_pool(c.name, tie_values(c.shape, 81), dt, cl, max_op(c));
  check_pool("k3s2p1", tie_values(kMaxCfgs[0].shape, 82), DType::F64, true, max_op(kMaxCfgs[0]));
}

// Random values at ResNet's stem: 64 channels, k3 s2 p1, 32x32 -> 16x16.
TEST(CudaNormPool, MaxPoolResNetStem) {
  REQUIRE_GPU();
  const MaxCfg stem{"stem", {4, 64, 32, 32}, {3, 3}, {2, 2}, {1, 1}, {1, 1}};
  for (DType dt : kDtypes)
    for (bool cl : {false, true}) check_pool("stem", rnd(stem.shape, DType::F32, 83), dt, cl, max_op(stem));
  for (const MaxCfg& c : kMaxCfgs)
    for (bool cl : {false, true}) check_pool(c.name, rnd(c.shape, DType::F32, 84), DType::F32, cl, max_op(c));
}

TEST(CudaNormPool, AvgPool) {
  REQUIRE_GPU();
  struct Cfg {
    const char* name;
    Shape shape;
    Pair k, s, p;
    bool include_pad;
  };
  const Cfg cfgs[] = {
      {"k3s2p1", {2, 8, 15, 16}, {3, 3}, {2, 2}, {1, 1}, true},
      {"k3s2p1_excl", {2, 8, 15, 16}, {3, 3}, {2, 2}, {1, 1}, false},
      {"k2", {2, 16, 8, 8}, {2, 2}, {0, 0}, {0, 0}, true},
      {"k3x2s2x1p1_excl", {2, 5, 9, 7}, {3, 2}, {2, 1}, {1, 1}, false},
      {"k5s3p2", {2, 12, 11, 13}, {5, 5}, {3, 3}, {2, 2}, true},
      {"k5s3p2_excl", {2, 12, 11, 13}, {5, 5}, {3, 3}, {2, 2}, false},
  };
  for (const Cfg& c : cfgs) {
    const PoolOp op = [c](const Tensor& t) { return avg_pool2d(t, c.k, c.s, c.p, c.include_pad); };
    for (DType dt : kDtypes)
      for (bool cl : {false, true}) check_pool(c.name, rnd(c.shape, DType::F32, 90), dt, cl, op);
  }
  const PoolOp op = [](const Tensor& t) { return avg_pool2d(t, {3, 3}, {2, 2}, {1, 1}, false); };
  check_pool("k3s2p1_excl", rnd({2, 8, 15, 16}, DType::F32, 91), DType::F64, false, op);
}

TEST(CudaNormPool, AdaptiveAvgPool) {
  REQUIRE_GPU();
  struct Cfg {
    const char* name;
    Shape shape;
    Pair out;
  };
  const Cfg cfgs[] = {
      {"global", {4, 32, 7, 7}, {1, 1}},  // ResNet's head (the NCHW warp-per-plane path)
      {"global_wide", {2, 6, 40, 37}, {1, 1}},  {"4x4_of_7x6", {2, 8, 7, 6}, {4, 4}},  // windows overlap
      {"3x5_of_10x11", {2, 8, 10, 11}, {3, 5}}, {"9x8_of_7x6", {2, 5, 7, 6}, {9, 8}},  // more outputs than inputs
  };
  for (const Cfg& c : cfgs) {
    const PoolOp op = [c](const Tensor& t) { return adaptive_avg_pool2d(t, c.out); };
    for (DType dt : kDtypes)
      for (bool cl : {false, true}) check_pool(c.name, rnd(c.shape, DType::F32, 100), dt, cl, op);
    check_pool(c.name, rnd(c.shape, DType::F32, 101), DType::F64, true, op);
  }
}

// Pooling from inputs at an odd offset (no vector loads) gives the bits of the aligned inputs.
TEST(CudaNormPool, PoolOffsetIndependent) {
  REQUIRE_GPU();
  const PoolOp ops[] = {
      [](const Tensor& t) {
        return max_pool2d(t, {3, 3}, {2, 2}, {1, 1});
      },
      [](const Tensor& t) {
        return avg_pool2d(t, {3, 3}, {2, 2}, {1, 1}, false);
      },
      [](const Tensor& t) {
        return adaptive_avg_pool2d(t, {3, 2});
      },
  };
  for (DType dt : {DType::F32, DType::BF16})
    for (const PoolOp& op : ops) {
      SCOPED_TRACE(dtype_name(dt));
      const Tensor xv = gpu(rnd({2, 16, 9, 8}, dt, 110));
      const Tensor gy = gpu(rnd(op(xv).shape(), dt, 111));
      std::vector<Tensor> ys, gs;
      for (const Tensor& src : {xv.contiguous_channels_last(), at_odd_offset(xv, true)}) {
        Tensor x = src.detach().requires_grad_();
        Tensor y = op(x);
        y.backward(gy);
        ys.push_back(y);
        gs.push_back(x.grad());
      }
      EXPECT_TRUE(same_bits(ys[1], ys[0]));
      EXPECT_TRUE(same_bits(gs[1], gs[0]));
    }
}
