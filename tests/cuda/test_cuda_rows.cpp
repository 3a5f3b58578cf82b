// CUDA row kernels (backend/cuda/norm.cu, softmax.cu, loss.cu) against the CPU backend:
// layer_norm / rms_norm, softmax / log_softmax and cross_entropy, forward and backward through the
// public ops and layers. Every case runs the same inputs on the CPU and on the GPU and compares by
// norms (support/cuda_compare.h). Upstream gradients are random, not ones: with ones the norm and
// softmax input gradients are sums that cancel to ~0, and a comparison of rounding noise means
// nothing. Skipped with a visible message where there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
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

// Largest |got - want| over the elements (got from the GPU); infinite for a NaN or a size mismatch.
double max_abs_diff(const Tensor& got, const Tensor& want) {
  const std::vector<double> a = got.to(Device::cpu()).to_vector(), b = want.to_vector();
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(a[i] - b[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

std::string name_of(DType dt, int64_t width) { return std::string(dtype_name(dt)) + " width " + std::to_string(width); }

// Rows per width: several row blocks of the weight-gradient sums (64 rows each) where it is cheap.
int64_t rows_for(int64_t width) { return width <= 7 ? 1000 : (width <= 768 ? 200 : 70); }

// ---------------------------------------------------------------------------------------------
// layer_norm / rms_norm

void check_layer_norm(DType dt, int64_t width, bool affine, bool rms) {
  SCOPED_TRACE(std::string(rms ? "rms_norm " : "layer_norm ") + name_of(dt, width) + (affine ? " affine" : ""));
  const int64_t rows = rows_for(width);
  // An offset mean checks that the variance does not cancel (two-pass statistics).
  Leaf x = leaf(rnd({rows / 10, 10, width}, dt, 1, 2.0, 3.0));
  Leaf w, b;
  if (affine) {
    w = leaf(rnd({width}, dt, 2, 0.5, 1.0));
    if (!rms) b = leaf(rnd({width}, dt, 3, 0.5));
  }
  Tensor yc = rms ? rms_norm(x.cpu, {width}, w.cpu, 1e-6) : layer_norm(x.cpu, {width}, w.cpu, b.cpu, 1e-5);
  Tensor yg = rms ? rms_norm(x.cuda, {width}, w.cuda, 1e-6) : layer_norm(x.cuda, {width}, w.cuda, b.cuda, 1e-5);
  EXPECT_CLOSE_TO_CPU(yg, yc, tol(dt));
  backward_random(yc, yg, 4);
  if (width == 1) {
    // Over one element the input gradient is exactly 0 (layer_norm) or rounding noise around a
    // value ~1e-7 (rms_norm: 1 - x^2 / (x^2 + eps)); the CPU's FMA contraction leaves its own
    // noise there, so only an absolute bound means anything.
    EXPECT_LT(max_abs_diff(x.cuda.grad(), x.cpu.grad()), 1e-2);
  } else {
    EXPECT_CLOSE_TO_CPU(x.cuda.grad(), x.cpu.grad(), tol(dt));
  }
  if (w.cpu.defined()) {
    EXPECT_CLOSE_TO_CPU(w.cuda.grad(), w.cpu.grad(), tol(dt));
  }
  if (b.cpu.defined()) {
    EXPECT_CLOSE_TO_CPU(b.cuda.grad(), b.cpu.grad(), tol(dt));
  }
}

}  // namespace

TEST(CudaRows, LayerNorm) {
  REQUIRE_GPU();
  for (DType dt : kDtypes)
    for (int64_t width : {1, 7, 768, 4097})
      for (bool affine : {false, true}) check_layer_norm(dt, width, affine, false);
}

TEST(CudaRows, RmsNorm) {
  REQUIRE_GPU();
  for (DType dt : kDtypes)
    for (int64_t width : {1, 7, 768, 4097})
      for (bool affine : {false, true}) check_layer_norm(dt, width, affine, true);
}

TEST(CudaRows, LayerNormF64) {
  REQUIRE_GPU();
  check_layer_norm(DType::F64, 768, true, false);
  check_layer_norm(DType::F64, 33, true, true);
}

// add_layer_norm / add_rms_norm (the residual add fused into the norm), against the CPU: both
// outputs and the gradients of x, the residual and the parameters from random upstream
// gradients of both outputs. Widths reach every kernel: the warp forward and the fused backward
// (<= 1024), the warp dx kernel (<= 2048), the block kernels (4097). `rdt`: the residual's dtype
// (bf16 with an f32 x: autocast's residual stream plus a bf16 branch).
void check_add_norm(DType dt, DType rdt, int64_t width, bool rms) {
  SCOPED_TRACE(std::string(rms ? "add_rms_norm " : "add_layer_norm ") + name_of(dt, width) + " residual " +
               dtype_name(rdt));
  const int64_t rows = rows_for(width);
  Leaf x = leaf(rnd({rows, width}, dt, 31, 2.0, 3.0)), r = leaf(rnd({rows, width}, rdt, 32));
  Leaf w = leaf(rnd({width}, DType::F32, 33, 0.5, 1.0)), b = leaf(rnd({width}, DType::F32, 34, 0.5));
  auto run = [&](bool cuda) {
    auto pick = [&](const Leaf& t) { return cuda ? t.cuda : t.cpu; };
    return rms ? add_rms_norm(pick(x), pick(r), {width}, pick(w))
               : add_layer_norm(pick(x), pick(r), {width}, pick(w), pick(b));
  };
  const ResidualNorm oc = run(false), og = run(true);
  EXPECT_EQ(og.sum.dtype(), dt);
  EXPECT_CLOSE_TO_CPU(og.sum, oc.sum, tol(dt));
  EXPECT_CLOSE_TO_CPU(og.normed, oc.normed, tol(dt));
  const Tensor gs = rnd(oc.sum.shape(), dt, 35), gy = rnd(oc.normed.shape(), dt, 36);
  autograd::backward({oc.sum, oc.normed}, {gs, gy});
  autograd::backward({og.sum, og.normed}, {gpu(gs), gpu(gy)});
  EXPECT_EQ(r.cuda.grad().dtype(), rdt);
  EXPECT_CLOSE_TO_CPU(x.cuda.grad(), x.cpu.grad(), tol(dt));
  EXPECT_CLOSE_TO_CPU(r.cuda.grad(), r.cpu.grad(), tol(rdt));
  EXPECT_CLOSE_TO_CPU(w.cuda.grad(), w.cpu.grad(), tol(dt));
  if (!rms) {
    EXPECT_CLOSE_TO_CPU(b.cuda.grad(), b.cpu.grad(), tol(dt));
  }
}

TEST(CudaRows, AddLayerNormAndAddRmsNorm) {
  REQUIRE_GPU();
  for (DType dt : kDtypes)
    for (int64_t width : {7, 768, 1500, 4097})
      for (bool rms : {false, true}) check_add_norm(dt, dt, width, rms);
  for (DType rdt : {DType::BF16, DType::F16}) check_add_norm(DType::F32, rdt, 768, false);
  check_add_norm(DType::F32, DType::BF16, 4097, true);
}

// bf16 input with f32 parameters (mixed precision): the kernels read the parameters in f32 and
// the gradients come back in f32.
TEST(CudaRows, LayerNormMixedDtypeParams) {
  REQUIRE_GPU();
  Leaf x = leaf(rnd({50, 768}, DType::BF16, 5));
  Leaf w = leaf(rnd({768}, DType::F32, 6, 0.5, 1.0)), b = leaf(rnd({768}, DType::F32, 7));
  Tensor yc = layer_norm(x.cpu, {768}, w.cpu, b.cpu), yg = layer_norm(x.cuda, {768}, w.cuda, b.cuda);
  EXPECT_CLOSE_TO_CPU(yg, yc, 1e-2);
  backward_random(yc, yg, 8);
  EXPECT_CLOSE_TO_CPU(x.cuda.grad(), x.cpu.grad(), 1e-2);
  EXPECT_CLOSE_TO_CPU(w.cuda.grad(), w.cpu.grad(), 1e-5);  // f32 sums of the same bf16 values
  EXPECT_CLOSE_TO_CPU(b.cuda.grad(), b.cpu.grad(), 1e-5);
}

// Only the parameters want gradients: the kernel gets no dx (an undefined tensor) and must still
// produce dw and db.
TEST(CudaRows, LayerNormParamsOnlyGradients) {
  REQUIRE_GPU();
  Leaf x = leaf(rnd({300, 96}, DType::F32, 9), false);
  Leaf w = leaf(rnd({96}, DType::F32, 10, 0.5, 1.0)), b = leaf(rnd({96}, DType::F32, 11));
  Tensor yc = layer_norm(x.cpu, {96}, w.cpu, b.cpu), yg = layer_norm(x.cuda, {96}, w.cuda, b.cuda);
  backward_random(yc, yg, 12);
  EXPECT_CLOSE_TO_CPU(w.cuda.grad(), w.cpu.grad(), 1e-5);
  EXPECT_CLOSE_TO_CPU(b.cuda.grad(), b.cpu.grad(), 1e-5);
}

// No rows: the outputs are empty and the parameter gradients are zeros.
TEST(CudaRows, LayerNormEmptyInput) {
  REQUIRE_GPU();
  Leaf x = leaf(zeros({0, 16}));
  Leaf w = leaf(rnd({16}, DType::F32, 13)), b = leaf(rnd({16}, DType::F32, 14));
  Tensor yc = layer_norm(x.cpu, {16}, w.cpu, b.cpu), yg = layer_norm(x.cuda, {16}, w.cuda, b.cuda);
  EXPECT_EQ(yg.numel(), 0);
  backward_random(yc, yg, 15);
  EXPECT_CLOSE_TO_CPU(w.cuda.grad(), w.cpu.grad(), 1e-5);
  EXPECT_CLOSE_TO_CPU(b.cuda.grad(), b.cpu.grad(), 1e-5);
}

// The layers: nn::LayerNorm and nn::RMSNorm moved to the GPU, with random parameters.
TEST(CudaRows, NormLayers) {
  REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    nn::LayerNorm ln_c(768), ln_g(768);
    nn::RMSNorm rn_c(768), rn_g(768);
    Generator g(16);
    nn::init::normal_(ln_c.weight, 1.0, 0.2, &g);
    nn::init::normal_(ln_c.bias, 0.0, 0.2, &g);
    nn::init::normal_(rn_c.weight, 1.0, 0.2, &g);
    for (nn::Module* m : {static_cast<nn::Module*>(&ln_c), static_cast<nn::Module*>(&rn_c)}) m->to(dt);
    ln_g.to(dt);
    rn_g.to(dt);
    ln_g.load_state_dict(ln_c.state_dict());
    rn_g.load_state_dict(rn_c.state_dict());
    ln_g.to(Device::cuda(0));
    rn_g.to(Device::cuda(0));
    Leaf x = leaf(rnd({4, 33, 768}, dt, 17, 1.5, -0.5));
    Tensor yc = rn_c.forward(ln_c.forward(x.cpu)), yg = rn_g.forward(ln_g.forward(x.cuda));
    EXPECT_CLOSE_TO_CPU(yg, yc, tol(dt));
    backward_random(yc, yg, 18);
    EXPECT_CLOSE_TO_CPU(x.cuda.grad(), x.cpu.grad(), tol(dt));
    EXPECT_CLOSE_TO_CPU(ln_g.weight.grad(), ln_c.weight.grad(), tol(dt));
    EXPECT_CLOSE_TO_CPU(ln_g.bias.grad(), ln_c.bias.grad(), tol(dt));
    EXPECT_CLOSE_TO_CPU(rn_g.weight.grad(), rn_c.weight.grad(), tol(dt));
  }
}

// ---------------------------------------------------------------------------------------------
// softmax / log_softmax

namespace {

void check_softmax(DType dt, const Shape& shape, int64_t dim, bool log) {
  SCOPED_TRACE(std::string(log ? "log_softmax " : "softmax ") + dtype_name(dt) + " " + shape.str() + " dim " +
               std::to_string(dim));
  Leaf x = leaf(rnd(shape, dt, 20, 3.0));
  auto op = [&](const Tensor& t) { return log ? log_softmax(t, dim) : softmax(t, dim); };
  Tensor yc = op(x.cpu), yg = op(x.cuda);
  backward_random(yc, yg, 21);
  if (dt != DType::F32) {
    EXPECT_CLOSE_TO_CPU(yg, yc, tol(dt));
    EXPECT_CLOSE_TO_CPU(x.cuda.grad(), x.cpu.grad(), tol(dt));
    return;
  }
  // f32 against an f64 reference on the same values: over rows tens of thousands wide the CPU's
  // own f32 sums are off by more than 1e-5 (5e-5 seen at 50304), so the CPU is no f32 yardstick.
  Tensor x64 = x.cpu.detach().to(DType::F64).requires_grad_();
  Tensor y64 = op(x64);
  y64.backward(rnd(yc.shape(), dt, 21).to(DType::F64));
  EXPECT_CLOSE_TO_CPU(yg, y64.to(DType::F32), tol(dt));
  EXPECT_CLOSE_TO_CPU(x.cuda.grad(), x64.grad().to(DType::F32), tol(dt));
}

}  // namespace

TEST(CudaRows, SoftmaxLastDim) {
  REQUIRE_GPU();
  for (DType dt : kDtypes)
    for (bool log : {false, true}) {
      check_softmax(dt, {5, 7}, -1, log);
      check_softmax(dt, {3, 11, 64}, 2, log);
      check_softmax(dt, {6, 4097}, 1, log);
      check_softmax(dt, {2, 50304}, -1, log);
    }
  check_softmax(DType::F64, {9, 300}, -1, false);
  check_softmax(DType::F64, {9, 300}, -1, true);
}

TEST(CudaRows, SoftmaxOtherDims) {
  REQUIRE_GPU();
  for (DType dt : kDtypes)
    for (bool log : {false, true}) {
      check_softmax(dt, {4, 37, 5}, 1, log);     // middle dim, few columns
      check_softmax(dt, {3, 300, 129}, 1, log);  // middle dim, many columns and rows
      check_softmax(dt, {40, 7}, 0, log);        // first dim
      check_softmax(dt, {2, 3, 4, 5}, 2, log);
    }
  check_softmax(DType::F64, {4, 37, 5}, 1, true);
}

// -inf scores (attention masks) get probability 0 and log-probability -inf; a fully masked row
// is NaN everywhere, as on the CPU (and in PyTorch).
TEST(CudaRows, SoftmaxMaskedRows) {
  REQUIRE_GPU();
  const int64_t R = 700;
  std::vector<double> v(3 * R);
  std::mt19937 gen(22);
  std::normal_distribution<double> nd;
  for (int64_t i = 0; i < 3 * R; ++i) v[i] = nd(gen);
  for (int64_t i = 0; i < R; i += 3) v[i] = -INFINITY;       // row 0: partly masked, first element included
  for (int64_t i = R; i < R + R / 2; ++i) v[i] = -INFINITY;  // row 1: its first half masked
  for (int64_t i = 2 * R; i < 3 * R; ++i) v[i] = -INFINITY;  // row 2: fully masked
  for (DType dt : kDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = from_vector(v, {3, R}).to(dt);
    EXPECT_CLOSE_TO_CPU(softmax(gpu(x), -1), softmax(x, -1), tol(dt));
    EXPECT_CLOSE_TO_CPU(log_softmax(gpu(x), -1), log_softmax(x, -1), tol(dt));
    Tensor xt = x.t().contiguous();  // the same rows as columns: the strided kernel
    EXPECT_CLOSE_TO_CPU(softmax(gpu(xt), 0), softmax(xt, 0), tol(dt));
    EXPECT_CLOSE_TO_CPU(log_softmax(gpu(xt), 0), log_softmax(xt, 0), tol(dt));
  }
  // Gradients through the partly masked rows.
  Leaf x = leaf(from_vector(v, {3, R}).slice(0, 0, 2).contiguous());
  Tensor yc = log_softmax(x.cpu, -1), yg = log_softmax(x.cuda, -1);
  backward_random(yc, yg, 23);
  EXPECT_CLOSE_TO_CPU(x.cuda.grad(), x.cpu.grad(), 1e-5);
}

// ---------------------------------------------------------------------------------------------
// cross_entropy

namespace {

// Class indices in [0, C) for `shape`, every `ignore_every`-th one replaced by ignore_index
// (none when 0).
Tensor targets(const Shape& shape, int64_t C, int64_t ignore_every, int64_t ignore_index, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> cls(0, C - 1);
  std::vector<double> v(shape.numel());
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = ignore_every && i % ignore_every == 1 ? static_cast<double>(ignore_index) : static_cast<double>(cls(gen));
  return from_vector(v, shape, DType::I64);
}

const char* red_name(Reduction r) { return r == Reduction::Mean ? "mean" : (r == Reduction::Sum ? "sum" : "none"); }

void check_ce(DType dt, const Shape& shape, int64_t ignore_every, double eps, Reduction red,
              int64_t ignore_index = -100) {
  SCOPED_TRACE(std::string("cross_entropy ") + dtype_name(dt) + " " + shape.str() + " ignore_every " +
               std::to_string(ignore_every) + " eps " + std::to_string(eps) + " " + red_name(red));
  const int64_t C = shape[1];
  Shape tshape;
  for (int i = 0; i < shape.size(); ++i)
    if (i != 1) tshape.push_back(shape[i]);
  Tensor t = targets(tshape, C, ignore_every, ignore_index, 30);
  Leaf x = leaf(rnd(shape, dt, 31, 2.0));
  Tensor lc = cross_entropy(x.cpu, t, ignore_index, eps, red);
  Tensor lg = cross_entropy(x.cuda, gpu(t), ignore_index, eps, red);
  EXPECT_CLOSE_TO_CPU(lg, lc, tol(dt));
  if (red == Reduction::None) {
    backward_random(lc, lg, 32);
  } else {
    lc.backward();
    lg.backward();
  }
  EXPECT_CLOSE_TO_CPU(x.cuda.grad(), x.cpu.grad(), tol(dt));
}

}  // namespace

TEST(CudaRows, CrossEntropySmallVocab) {
  REQUIRE_GPU();
  for (DType dt : kDtypes)
    for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None})
      for (double eps : {0.0, 0.1}) {
        check_ce(dt, {64, 10}, 0, eps, red);
        check_ce(dt, {64, 10}, 5, eps, red);  // some targets ignored
      }
  check_ce(DType::F64, {64, 10}, 5, 0.1, Reduction::Mean);
}

// GPT-2's padded vocabulary: one block per row over 50304 logits.
TEST(CudaRows, CrossEntropyLargeVocab) {
  REQUIRE_GPU();
  for (DType dt : kDtypes)
    for (double eps : {0.0, 0.1}) {
      check_ce(dt, {24, 50304}, 4, eps, Reduction::Mean);
      check_ce(dt, {5, 50304}, 0, eps, Reduction::None);
    }
}

// Class dim in the middle: [N, C, S] and [N, C, H, W], targets [N, S] / [N, H, W].
TEST(CudaRows, CrossEntropyClassDimInMiddle) {
  REQUIRE_GPU();
  for (DType dt : kDtypes)
    for (Reduction red : {Reduction::Mean, Reduction::None})
      for (double eps : {0.0, 0.2}) {
        check_ce(dt, {4, 10, 6}, 3, eps, red);
        check_ce(dt, {2, 5, 3, 40}, 7, eps, red);
        check_ce(dt, {3, 1000, 33}, 4, eps, red);
      }
}

// ignore_index naming a real class, label smoothing 1, and a batch whose targets are all ignored
// (the Mean is 0/0 = NaN and the gradient 0, as on the CPU).
TEST(CudaRows, CrossEntropyEdgeCases) {
  REQUIRE_GPU();
  check_ce(DType::F32, {64, 10}, 0, 0.0, Reduction::Mean, 3);
  check_ce(DType::F32, {4, 10, 6}, 0, 0.0, Reduction::Sum, 3);
  check_ce(DType::F32, {64, 10}, 4, 1.0, Reduction::Mean);
  Tensor t = full({8}, -100, DType::I64);
  Leaf x = leaf(rnd({8, 10}, DType::F32, 33));
  Tensor lc = cross_entropy(x.cpu, t), lg = cross_entropy(x.cuda, gpu(t));
  EXPECT_TRUE(std::isnan(lg.to(Device::cpu()).item<double>()));
  lc.backward();
  lg.backward();
  EXPECT_CLOSE_TO_CPU(x.cuda.grad(), x.cpu.grad(), 1e-5);
}
