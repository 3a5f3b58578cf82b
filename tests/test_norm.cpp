#include <gtest/gtest.h>

#include "fasttrain/fasttrain.h"
#include "support/expect_error.h"
#include "support/gradcheck.h"
#include "support/parity.h"

using namespace ft;
using test::expect_error;
using test::ParityCase;

namespace {

const char* kDtypes[] = {"f32", "f64", "bf16", "f16"};

Shape shape_param(const ParityCase& c) { return Shape(c.param<std::vector<int64_t>>("shape")); }
double param_or(const ParityCase& c, const char* key, double dflt) {
  return c.params().contains(key) ? c.params()[key].get<double>() : dflt;
}
Tensor opt_input(const ParityCase& c, const std::string& name, bool requires_grad) {
  return c.has(name) ? c.input(name, requires_grad) : Tensor();
}

void check_layer_norm_case(const std::string& name) {
  SCOPED_TRACE(name);
  FT_PARITY_CASE(c, name);
  Tensor x = c.input("x", true), w = opt_input(c, "w", true), b = opt_input(c, "b", true);
  Tensor y = layer_norm(x, shape_param(c), w, b, param_or(c, "eps", 1e-5));
  EXPECT_EQ(y.dtype(), c.dtype());
  c.expect_output(y);
  c.backward({y});
  c.expect_grad("x", x);
  if (w.defined()) c.expect_grad("w", w);
  if (b.defined()) c.expect_grad("b", b);
}

void check_rms_norm_case(const std::string& name) {
  SCOPED_TRACE(name);
  FT_PARITY_CASE(c, name);
  Tensor x = c.input("x", true), w = opt_input(c, "w", true);
  Tensor y = rms_norm(x, shape_param(c), w, param_or(c, "eps", 1e-6));
  c.expect_output(y);
  c.backward({y});
  c.expect_grad("x", x);
  if (w.defined()) c.expect_grad("w", w);
}

// add_layer_norm / add_rms_norm: both outputs (the sum and its norm) and the gradients reaching
// x, the residual and the parameters from random upstream gradients of both.
void check_add_norm_case(const std::string& name, bool rms) {
  SCOPED_TRACE(name);
  FT_PARITY_CASE(c, name);
  Tensor x = c.input("x", true), r = c.input("r", true), w = opt_input(c, "w", true), b = opt_input(c, "b", true);
  const ResidualNorm out = rms ? add_rms_norm(x, r, shape_param(c), w, 1e-6)
                               : add_layer_norm(x, r, shape_param(c), w, b, param_or(c, "eps", 1e-5));
  EXPECT_EQ(out.sum.dtype(), c.dtype());
  EXPECT_EQ(out.normed.dtype(), c.dtype());
  c.expect_output(out.sum, 0);
  c.expect_output(out.normed, 1);
  c.backward({out.sum, out.normed});
  c.expect_grad("x", x);
  c.expect_grad("r", r);
  if (w.defined()) c.expect_grad("w", w);
  if (b.defined()) c.expect_grad("b", b);
}

void check_batch_norm_case(const std::string& name) {
  SCOPED_TRACE(name);
  FT_PARITY_CASE(c, name);
  Tensor x = c.input("x", true), w = opt_input(c, "w", true), b = opt_input(c, "b", true);
  Tensor rm = opt_input(c, "rm", false), rv = opt_input(c, "rv", false);
  const bool training = c.param<bool>("training");
  Tensor y = batch_norm(x, rm, rv, w, b, training, c.param<double>("momentum"), 1e-5);
  EXPECT_EQ(y.is_channels_last(), x.is_channels_last() && !x.is_contiguous());
  c.expect_output(y, 0);
  if (rm.defined()) {
    c.expect_output(rm, 1);  // updated in place in training, untouched in eval
    c.expect_output(rv, 2);
  }
  c.backward({y});
  c.expect_grad("x", x);
  if (w.defined()) c.expect_grad("w", w);
  if (b.defined()) c.expect_grad("b", b);
}

// relu(batch_norm(x) + r) against PyTorch's composition: output, running statistics, and the
// gradients of x, the residual, weight and bias.
void check_batch_norm_add_relu_case(const std::string& name) {
  SCOPED_TRACE(name);
  FT_PARITY_CASE(c, name);
  Tensor x = c.input("x", true), r = c.input("r", true), w = c.input("w", true), b = c.input("b", true);
  Tensor rm = c.input("rm", false), rv = c.input("rv", false);
  Tensor y = batch_norm_add_relu(x, r, rm, rv, w, b, c.param<bool>("training"), c.param<double>("momentum"), 1e-5);
  EXPECT_EQ(y.is_channels_last(), x.is_channels_last() && !x.is_contiguous());
  c.expect_output(y, 0);
  c.expect_output(rm, 1);
  c.expect_output(rv, 2);
  c.backward({y});
  for (const auto& [input, t] : {std::pair<const char*, Tensor>{"x", x}, {"r", r}, {"w", w}, {"b", b}})
    c.expect_grad(input, t);
}

}  // namespace

TEST(NormParity, LayerNorm) {
  for (const char* dt : kDtypes)
    for (const char* v : {"last", "2d_transposed", "noaffine"})
      check_layer_norm_case(std::string("layer_norm_") + dt + "_" + v);
  for (const char* v : {"weight_only", "bias_only", "long"}) check_layer_norm_case(std::string("layer_norm_f32_") + v);
}

TEST(NormParity, RmsNorm) {
  for (const char* dt : kDtypes) {
    check_rms_norm_case(std::string("rms_norm_") + dt);
    check_rms_norm_case(std::string("rms_norm_") + dt + "_2d_transposed_noweight");
  }
}

TEST(NormParity, AddLayerNormAndAddRmsNorm) {
  for (const char* dt : kDtypes) {
    check_add_norm_case(std::string("add_layer_norm_") + dt, false);
    check_add_norm_case(std::string("add_rms_norm_") + dt, true);
  }
  check_add_norm_case("add_layer_norm_f32_broadcast_residual", false);
}

TEST(NormParity, BatchNorm) {
  for (const char* dt : kDtypes)
    for (const char* form : {"2d", "4d", "cl"})
      for (const char* mode : {"train", "eval"})
        check_batch_norm_case(std::string("batch_norm_") + dt + "_" + form + "_" + mode);
  check_batch_norm_case("batch_norm_f32_3d_transposed_train");
  check_batch_norm_case("batch_norm_f32_4d_train_noaffine_nostats");
  check_batch_norm_case("batch_norm_f64_cl_train_noaffine");
}

TEST(NormParity, BatchNormAddRelu) {
  for (const char* dt : kDtypes)
    for (const char* form : {"4d", "cl"})
      for (const char* mode : {"train", "eval"})
        check_batch_norm_add_relu_case(std::string("batch_norm_add_relu_") + dt + "_" + form + "_" + mode);
}

TEST(NormGradcheck, LayerNorm) {
  Generator g(3);
  auto r = [&](Shape s) { return randn(s, DType::F64, &g).requires_grad_(); };
  // x, weight and bias over one trailing dim
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return layer_norm(in[0], {5}, in[1], in[2]); },
                   {r({3, 4, 5}), r({5}), r({5})});
  // two trailing dims of a non-contiguous input, no affine parameters
  Tensor xt = randn({3, 5, 4}, DType::F64, &g).transpose(1, 2).detach().requires_grad_();
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return layer_norm(in[0], {4, 5}); }, {xt});
  // weight only
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return layer_norm(in[0], {6}, in[1], Tensor(), 1e-3); },
                   {r({2, 6}), r({6})});
  // parameters only: the input needs no gradient (a frozen embedding feeding a trained norm)
  const Tensor frozen = randn({3, 6}, DType::F64, &g);
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return layer_norm(frozen, {6}, in[0], in[1]); },
                   {r({6}), r({6})});
}

TEST(NormGradcheck, RmsNorm) {
  Generator g(4);
  auto r = [&](Shape s) { return randn(s, DType::F64, &g).requires_grad_(); };
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return rms_norm(in[0], {6}, in[1]); }, {r({4, 6}), r({6})});
  Tensor xt = randn({3, 2, 4}, DType::F64, &g).transpose(0, 2).detach().requires_grad_();
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return rms_norm(in[0], {2, 3}); }, {xt});
}

// batch_norm and batch_norm_relu (whose backward recomputes the ReLU's mask from x) against
// finite differences: training and eval; [N, C], NCHW, channels-last and a permuted layout.
TEST(NormGradcheck, BatchNorm) {
  using BatchNormOp =
      Tensor (*)(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, double, double);
  for (BatchNormOp op : {BatchNormOp(batch_norm), BatchNormOp(batch_norm_relu)}) {
    SCOPED_TRACE(op == BatchNormOp(batch_norm) ? "batch_norm" : "batch_norm_relu");
    Generator g(5);
    auto r = [&](Shape s) { return randn(s, DType::F64, &g).requires_grad_(); };
    auto fn = [op](bool training) {
      return [op, training](const std::vector<Tensor>& in) {
        const int64_t C = in[0].size(1);
        Tensor rm = full({C}, 0.1, DType::F64), rv = full({C}, 1.3, DType::F64);
        return op(in[0], rm, rv, in[1], in[2], training, 0.1, 1e-5);
      };
    };
    for (bool training : {true, false}) {
      SCOPED_TRACE(training ? "training" : "eval");
      EXPECT_GRADCHECK(fn(training), {r({5, 3}), r({3}), r({3})});
      EXPECT_GRADCHECK(fn(training), {r({2, 3, 2, 3}), r({3}), r({3})});
      Tensor cl = randn({2, 4, 3, 2}, DType::F64, &g).contiguous_channels_last().detach().requires_grad_();
      ASSERT_TRUE(cl.is_channels_last());
      EXPECT_GRADCHECK(fn(training), {cl, r({4}), r({4})});
      Tensor nc = randn({4, 3, 2}, DType::F64, &g).permute({2, 1, 0}).detach().requires_grad_();  // [2, 3, 4]
      EXPECT_GRADCHECK(fn(training), {nc, r({3}), r({3})});
    }
    // training without running statistics or affine parameters
    EXPECT_GRADCHECK(
        [op](const std::vector<Tensor>& in) {
          return op(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5);
        },
        {r({3, 2, 4})});
  }
}

// batch_norm_relu is relu(batch_norm(...)): values and gradients of x, weight and bias, in every
// floating dtype and both layouts, training and eval; the running statistics move the same way.
TEST(Norm, BatchNormReluMatchesReluOfBatchNorm) {
  for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
    for (bool cl : {false, true}) {
      for (bool training : {true, false}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + (cl ? " nhwc" : " nchw") + (training ? " train" : " eval"));
        Generator g(16);
        Tensor x0 = randn({3, 5, 4, 6}, DType::F32, &g).to(dt);
        if (cl) x0 = x0.contiguous_channels_last();
        const Tensor w0 = randn({5}, DType::F32, &g).to(dt), b0 = randn({5}, DType::F32, &g).to(dt);
        const Tensor dy = randn({3, 5, 4, 6}, DType::F32, &g).to(dt);
        std::vector<double> out[2], grads[2][3], running[2];
        for (int fused = 0; fused < 2; ++fused) {
          Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_(), b = b0.detach().requires_grad_();
          Tensor rm = full({5}, 0.2, dt), rv = full({5}, 1.5, dt);
          Tensor y = fused ? batch_norm_relu(x, rm, rv, w, b, training) : relu(batch_norm(x, rm, rv, w, b, training));
          if (cl) EXPECT_TRUE(y.is_channels_last() && !y.is_contiguous());
          autograd::backward({y}, {dy});
          out[fused] = y.to_vector();
          grads[fused][0] = x.grad().to_vector();
          grads[fused][1] = w.grad().to_vector();
          grads[fused][2] = b.grad().to_vector();
          running[fused] = cat({rm, rv}).to_vector();
        }
        EXPECT_EQ(out[1], out[0]);
        EXPECT_EQ(running[1], running[0]);
        const double tol = dt == DType::BF16 ? 2e-2 : dt == DType::F32 ? 1e-5 : 1e-12;
        for (int k = 0; k < 3; ++k)
          for (size_t i = 0; i < grads[0][k].size(); ++i)
            EXPECT_NEAR(grads[1][k][i], grads[0][k][i], tol * (1 + std::fabs(grads[0][k][i]))) << k << " " << i;
      }
    }
  }
}

// batch_norm_add_relu against finite differences, for x, the residual, weight and bias: training
// and eval, NCHW and channels-last (the residual in the other layout in one case).
TEST(NormGradcheck, BatchNormAddRelu) {
  Generator g(25);
  auto r = [&](Shape s) { return randn(s, DType::F64, &g).requires_grad_(); };
  auto cl = [&](Shape s) { return randn(s, DType::F64, &g).contiguous_channels_last().detach().requires_grad_(); };
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "eval");
    auto fn = [training](const std::vector<Tensor>& in) {
      const int64_t C = in[0].size(1);
      Tensor rm = full({C}, 0.1, DType::F64), rv = full({C}, 1.3, DType::F64);
      return batch_norm_add_relu(in[0], in[1], rm, rv, in[2], in[3], training, 0.1, 1e-5);
    };
    EXPECT_GRADCHECK(fn, {r({2, 3, 2, 3}), r({2, 3, 2, 3}), r({3}), r({3})});
    EXPECT_GRADCHECK(fn, {cl({2, 4, 3, 2}), cl({2, 4, 3, 2}), r({4}), r({4})});
    EXPECT_GRADCHECK(fn, {cl({2, 4, 3, 2}), r({2, 4, 3, 2}), r({4}), r({4})});
  }
}

// batch_norm_add_relu is relu(batch_norm(...) + r): values, gradients of x, r, weight and bias,
// and the running statistics, in each floating dtype and both layouts, training and eval. Bitwise
// in f64 and f32, where the unfused ops round nothing the fused kernel does not; in bf16 the
// fused kernel rounds once where the unfused ops round after the norm and after the add.
TEST(Norm, BatchNormAddReluMatchesTheUnfusedOps) {
  for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
    for (bool cl : {false, true}) {
      for (bool training : {true, false}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + (cl ? " nhwc" : " nchw") + (training ? " train" : " eval"));
        Generator g(17);
        auto act = [&](double scale) {
          Tensor t = mul(randn({3, 5, 4, 6}, DType::F32, &g), scale).to(dt);
          return cl ? t.contiguous_channels_last() : t;
        };
        const Tensor x0 = act(1.0), r0 = act(0.8), dy = act(1.0);
        const Tensor w0 = randn({5}, DType::F32, &g).to(dt), b0 = randn({5}, DType::F32, &g).to(dt);
        std::vector<double> out[2], grads[2][4], running[2];
        for (int fused = 0; fused < 2; ++fused) {
          Tensor x = x0.detach().requires_grad_(), res = r0.detach().requires_grad_();
          Tensor w = w0.detach().requires_grad_(), b = b0.detach().requires_grad_();
          Tensor rm = full({5}, 0.2, dt), rv = full({5}, 1.5, dt);
          Tensor y = fused ? batch_norm_add_relu(x, res, rm, rv, w, b, training)
                           : relu(add(batch_norm(x, rm, rv, w, b, training), res));
          if (cl) EXPECT_TRUE(y.is_channels_last() && !y.is_contiguous());
          EXPECT_EQ(y.dtype(), dt);
          autograd::backward({y}, {dy});
          out[fused] = y.to_vector();
          const Tensor* leaves[] = {&x, &res, &w, &b};
          for (int k = 0; k < 4; ++k) grads[fused][k] = leaves[k]->grad().to_vector();
          running[fused] = cat({rm, rv}).to_vector();
        }
        EXPECT_EQ(running[1], running[0]);
        const double tol = dt == DType::BF16 ? 2e-2 : 0;
        for (size_t i = 0; i < out[0].size(); ++i)
          ASSERT_NEAR(out[1][i], out[0][i], tol * (1 + std::fabs(out[0][i]))) << i;
        for (int k = 0; k < 4; ++k)
          for (size_t i = 0; i < grads[0][k].size(); ++i)
            ASSERT_NEAR(grads[1][k][i], grads[0][k][i], tol * (1 + std::fabs(grads[0][k][i]))) << k << " " << i;
      }
    }
  }
}

// Without weight, bias or running statistics (training), the fused op still equals the unfused
// ops, and its gradients of x and the residual too.
TEST(Norm, BatchNormAddReluWithoutAffineOrRunningStatistics) {
  Generator g(19);
  const Tensor x0 = randn({4, 16, 3, 5}, DType::F32, &g).contiguous_channels_last();
  const Tensor r0 = randn({4, 16, 3, 5}, DType::F32, &g).contiguous_channels_last();
  const Tensor dy = randn({4, 16, 3, 5}, DType::F32, &g);
  std::vector<double> out[2], gx[2], gr[2];
  for (int fused = 0; fused < 2; ++fused) {
    Tensor x = x0.detach().requires_grad_(), r = r0.detach().requires_grad_();
    Tensor y = fused ? batch_norm_add_relu(x, r, Tensor(), Tensor(), Tensor(), Tensor(), true)
                     : relu(add(batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true), r));
    autograd::backward({y}, {dy});
    out[fused] = y.to_vector();
    gx[fused] = x.grad().to_vector();
    gr[fused] = r.grad().to_vector();
  }
  EXPECT_EQ(out[1], out[0]);
  EXPECT_EQ(gx[1], gx[0]);
  EXPECT_EQ(gr[1], gr[0]);
}

// A residual the add would promote (f32 onto a bf16 norm) goes through the unfused ops: the
// result is add()'s f32. A residual of another shape is refused by name.
TEST(Norm, BatchNormAddReluPromotesAndChecksTheResidual) {
  Generator g(18);
  const Tensor x = randn({2, 3, 4, 4}, DType::F32, &g).to(DType::BF16), r = randn({2, 3, 4, 4}, DType::F32, &g);
  Tensor y = batch_norm_add_relu(x, r, Tensor(), Tensor(), Tensor(), Tensor(), true);
  EXPECT_EQ(y.dtype(), DType::F32);
  EXPECT_EQ(y.to_vector(), relu(add(batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true), r)).to_vector());
  expect_error(
      [&] {
        batch_norm_add_relu(x, r.view({2, 3, 16}), Tensor(), Tensor(), Tensor(), Tensor(), true);
      },
      "batch_norm_add_relu: residual has shape [2, 3, 16], expected the input's shape [2, 3, 4, 4]");
  expect_error([&] { batch_norm_add_relu(x, Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), true); },
               "batch_norm_add_relu: expected a residual tensor, found an undefined one");
}

TEST(Norm, BatchNormRunningStatsUpdate) {
  Generator g(6);
  Tensor x = randn({6, 3, 2, 2}, {}, &g);
  Tensor rm = full({3}, 0.5), rv = full({3}, 2.0);
  const uint32_t vm = rm.version(), vv = rv.version();
  Tensor y = batch_norm(x, rm, rv, Tensor(), Tensor(), true, 0.2);
  EXPECT_GT(rm.version(), vm);
  EXPECT_GT(rv.version(), vv);
  EXPECT_FALSE(rm.requires_grad());
  // the rule, computed here from the batch with plain reductions
  Tensor mean_c = mean(x, {0, 2, 3});
  Tensor var_unbiased = div(sum(square(sub(x, mean_c.view({1, 3, 1, 1}))), {0, 2, 3}), 23.0);
  std::vector<double> m = mean_c.to_vector(), v = var_unbiased.to_vector(), rmv = rm.to_vector(), rvv = rv.to_vector();
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(rmv[c], 0.8 * 0.5 + 0.2 * m[c], 1e-6);
    EXPECT_NEAR(rvv[c], 0.8 * 2.0 + 0.2 * v[c], 1e-5);
  }
  // eval leaves them alone and uses them: y = (x - rm) / sqrt(rv + eps)
  const uint32_t vm2 = rm.version();
  Tensor ye = batch_norm(x, rm, rv, Tensor(), Tensor(), false);
  EXPECT_EQ(rm.version(), vm2);
  Tensor expect = div(sub(x, rm.view({1, 3, 1, 1})), sqrt(add(rv.view({1, 3, 1, 1}), 1e-5)));
  EXPECT_TRUE(test::compare(ye, expect, {1e-5, 1e-5}).empty());
  // running stats of another dtype than the input (bf16 input, f32 statistics)
  Tensor rm32 = zeros({3}), rv32 = ones({3});
  Tensor yb = batch_norm(x.to(DType::BF16), rm32, rv32, ones({3}), zeros({3}), true);
  EXPECT_EQ(yb.dtype(), DType::BF16);
  EXPECT_NEAR(rm32.to_vector()[1], 0.1 * mean_c.to_vector()[1], 1e-2);
}

// Batch statistics of f32 activations whose mean is large beside their spread (1000 + 0.01 c z):
// a variance from sums of squares cancels to noise here. The kernel reads each chunk of a channel
// twice while it is in cache and merges the chunks' moments, in each of its forms: short NCHW runs
// (a slot per position), long ones (folded into registers), [N, C] rows and channels-last rows
// (row blocks). Reference: f64 over the same f32 values.
TEST(Norm, BatchNormStatisticsStayExactWhenTheMeanDwarfsTheSpread) {
  struct Layout {
    Shape shape;
    bool channels_last;
  };
  const Layout layouts[] = {{{400, 2, 7, 7}, false},
                            {{64, 3, 10, 30}, false},
                            {{5000, 4}, false},
                            {{64, 8, 10, 10}, true},
                            // rows of 16 to 64 channels: 16 at a time (accumulate_row_blocks)
                            {{3000, 32}, false},
                            {{16, 16, 9, 9}, true},
                            {{16, 32, 12, 12}, true},
                            {{16, 48, 6, 6}, true},
                            {{16, 64, 5, 5}, true}};
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.shape.str() + (l.channels_last ? " channels-last" : ""));
    const int64_t C = l.shape[1];
    Generator g(11);
    std::vector<int64_t> per_channel(l.shape.size(), 1);
    per_channel[1] = C;
    Tensor spread = mul(arange(1, C + 1).view(Shape(per_channel)), 0.01);
    Tensor x = add(mul(randn(l.shape, {}, &g), spread), 1000.0);
    if (l.channels_last) x = x.contiguous_channels_last();
    Tensor rm = zeros({C}), rv = zeros({C});
    batch_norm(x, rm, rv, Tensor(), Tensor(), true, /*momentum=*/1.0);  // running stats = batch stats
    // f64 reference, channel by channel, from the same f32 values
    Tensor xd = x.to(DType::F64).contiguous();
    const std::vector<double> v = xd.to_vector();
    const int64_t S = x.numel() / (l.shape[0] * C);
    const std::vector<double> got_mean = rm.to_vector(), got_var = rv.to_vector();
    for (int64_t c = 0; c < C; ++c) {
      double s = 0, s2 = 0;
      const int64_t count = l.shape[0] * S;
      for (int64_t n = 0; n < l.shape[0]; ++n)
        for (int64_t i = 0; i < S; ++i) s += v[(n * C + c) * S + i];
      const double mean = s / count;
      for (int64_t n = 0; n < l.shape[0]; ++n)
        for (int64_t i = 0; i < S; ++i) s2 += (v[(n * C + c) * S + i] - mean) * (v[(n * C + c) * S + i] - mean);
      const double var = s2 / (count - 1);
      EXPECT_NEAR(got_mean[c], mean, 2 * 6.2e-5) << "channel " << c;  // two f32 ulps at 1000
      EXPECT_NEAR(got_var[c], var, 1e-4 * var) << "channel " << c;
    }
  }
}

TEST(Norm, BatchNormChannelsLastKeepsFormat) {
  Generator g(7);
  Tensor x = randn({2, 5, 3, 3}, {}, &g).contiguous_channels_last().detach().requires_grad_();
  Tensor w = randn({5}, {}, &g).requires_grad_();
  Tensor y = batch_norm(x, Tensor(), Tensor(), w, Tensor(), true);
  EXPECT_TRUE(y.is_channels_last());
  EXPECT_FALSE(y.is_contiguous());
  // same numbers as the NCHW path
  Tensor y2 = batch_norm(x.detach().contiguous(), Tensor(), Tensor(), w.detach(), Tensor(), true);
  EXPECT_TRUE(test::compare(y, y2, {1e-6, 1e-6}).empty());
  sum(mul(y, y)).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().shape(), x.shape());
}

TEST(Norm, Errors) {
  Tensor x = zeros({2, 3, 4});
  expect_error([&] { layer_norm(x, {3}); },
               "layer_norm: input of shape [2, 3, 4] does not end with normalized_shape [3]");
  expect_error([&] { layer_norm(x, {4}, zeros({5})); },
               "layer_norm: weight has shape [5], expected normalized_shape [4]");
  expect_error([&] { layer_norm(x, {4}, Tensor(), zeros({3, 4})); }, "layer_norm: bias has shape [3, 4]");
  expect_error([&] { layer_norm(x, Shape{}); }, "layer_norm: normalized_shape must have at least one dimension");
  expect_error(
      [&] {
        layer_norm(zeros({2, 4}, DType::I64), {4});
      },
      "layer_norm: input must be a floating-point tensor, found i64");
  expect_error(
      [&] {
        rms_norm(x, {3, 4, 4});
      },
      "rms_norm: input of shape [2, 3, 4] does not end with normalized_shape [3, 4, 4]");
  expect_error([&] { rms_norm(x, {4}, zeros({4}, DType::I32)); }, "rms_norm: weight must be a floating-point tensor");

  expect_error(
      [&] {
        batch_norm(zeros({1, 8}), Tensor(), Tensor(), Tensor(), Tensor(), true);
      },
      "batch_norm: expected more than 1 value per channel when training, found input of shape [1, 8]");
  expect_error([&] { batch_norm(zeros({4}), Tensor(), Tensor(), Tensor(), Tensor(), true); },
               "batch_norm: expected an input of shape [N, C, ...] with at least 2 dimensions, found shape [4]");
  expect_error([&] { batch_norm(x, Tensor(), Tensor(), zeros({4}), Tensor(), true); },
               "batch_norm: weight has shape [4], expected [3] for an input with 3 channels");
  expect_error([&] { batch_norm(x, Tensor(), Tensor(), Tensor(), zeros({2}), true); },
               "batch_norm: bias has shape [2]");
  expect_error([&] { batch_norm(x, zeros({2}), ones({2}), Tensor(), Tensor(), true); },
               "batch_norm: running_mean has shape [2]");
  expect_error([&] { batch_norm(x, zeros({3}), ones({4}), Tensor(), Tensor(), false); },
               "batch_norm: running_var has shape [4]");
  expect_error([&] { batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), false); },
               "batch_norm: eval mode (training=false) needs running_mean and running_var");
  expect_error([&] { batch_norm(x, zeros({3}), Tensor(), Tensor(), Tensor(), true); },
               "batch_norm: running_mean and running_var must both be given");
  // a single value per channel is fine in eval mode
  EXPECT_NO_THROW(batch_norm(zeros({1, 8}), zeros({8}), ones({8}), Tensor(), Tensor(), false));
}

TEST(Norm, LayerNormMatchesComposedOpsInAllDtypes) {
  Generator g(8);
  Tensor x = randn({5, 64}, {}, &g);
  Tensor w = randn({64}, {}, &g), b = randn({64}, {}, &g);
  Tensor ref = layer_norm(x.to(DType::F64), {64}, w.to(DType::F64), b.to(DType::F64));
  // the same thing from elementwise ops and reductions
  Tensor mu = mean(x.to(DType::F64), {1}, true);
  Tensor xm = sub(x.to(DType::F64), mu);
  Tensor composed = add(mul(div(xm, sqrt(add(mean(square(xm), {1}, true), 1e-5))), w.to(DType::F64)), b.to(DType::F64));
  EXPECT_TRUE(test::compare(ref, composed, {1e-12, 1e-10}).empty());
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    Tensor y = layer_norm(x.to(dt), {64}, w.to(dt), b.to(dt));
    EXPECT_EQ(y.dtype(), dt);
    test::Tolerance tol = test::default_tolerance(dt);
    tol.atol *= 4;  // inputs rounded to dt too
    tol.rtol *= 4;
    EXPECT_TRUE(test::compare(
                    y, layer_norm(x.to(dt).to(DType::F64), {64}, w.to(dt).to(DType::F64), b.to(dt).to(DType::F64)), tol)
                    .empty())
        << dtype_name(dt);
  }
}

// layer_norm and rms_norm are fused kernels (statistics, normalisation and affine in one pass
// forward, one pass backward); their oracle is the same formula composed of reductions and
// elementwise ops, whose gradients autograd derives. Forward and backward, f64.
TEST(Norm, FusedNormsMatchComposedOps) {
  Generator g(12);
  auto r = [&](Shape s) { return randn(s, DType::F64, &g).requires_grad_(); };
  auto composed_layer_norm = [](const Tensor& x, const Dims& dims, const Tensor& w, const Tensor& b, double eps) {
    Tensor xm = sub(x, mean(x, dims, true));
    Tensor y = mul(xm, rsqrt(add(mean(square(xm), dims, true), eps)));
    if (w.defined()) y = mul(y, w);
    return b.defined() ? add(y, b) : y;
  };
  EXPECT_MATCHES_REFERENCE(
      [](const std::vector<Tensor>& in) { return layer_norm(in[0], {64}, in[1], in[2]); },
      [&](const std::vector<Tensor>& in) { return composed_layer_norm(in[0], {-1}, in[1], in[2], 1e-5); },
      {r({5, 64}), r({64}), r({64})});
  // two trailing dims of a non-contiguous input, no affine parameters, another eps
  Tensor xt = randn({3, 5, 4}, DType::F64, &g).transpose(1, 2).detach().requires_grad_();
  EXPECT_MATCHES_REFERENCE(
      [](const std::vector<Tensor>& in) {
        return layer_norm(in[0], {4, 5}, Tensor(), Tensor(), 1e-3);
      },
      [&](const std::vector<Tensor>& in) {
        return composed_layer_norm(in[0], {1, 2}, Tensor(), Tensor(), 1e-3);
      },
      {xt});
  auto composed_rms_norm = [](const Tensor& x, const Dims& dims, const Tensor& w, double eps) {
    Tensor y = mul(x, rsqrt(add(mean(square(x), dims, true), eps)));
    return w.defined() ? mul(y, w) : y;
  };
  EXPECT_MATCHES_REFERENCE([](const std::vector<Tensor>& in) { return rms_norm(in[0], {48}, in[1]); },
                           [&](const std::vector<Tensor>& in) { return composed_rms_norm(in[0], {-1}, in[1], 1e-6); },
                           {r({7, 48}), r({48})});
  EXPECT_MATCHES_REFERENCE(
      [](const std::vector<Tensor>& in) {
        return rms_norm(in[0], {4, 5});
      },
      [&](const std::vector<Tensor>& in) {
        return composed_rms_norm(in[0], {1, 2}, Tensor(), 1e-6);
      },
      {xt});
}

// The fused residual add's gradients in f64 against finite differences: x, the residual and the
// parameters, through both outputs (the sum carries on in the residual stream).
TEST(NormGradcheck, AddLayerNormAndAddRmsNorm) {
  Generator g(21);
  auto r = [&](Shape s) { return randn(s, DType::F64, &g).requires_grad_(); };
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        const ResidualNorm o = add_layer_norm(in[0], in[1], {6}, in[2], in[3]);
        return add(mul(o.sum, 0.7), o.normed);
      },
      {r({3, 4, 6}), r({3, 4, 6}), r({6}), r({6})});
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        const ResidualNorm o = add_rms_norm(in[0], in[1], {2, 5}, in[2]);
        return add(mul(o.sum, -1.3), o.normed);
      },
      {r({3, 2, 5}), r({3, 2, 5}), r({2, 5})});
  // only the residual wants a gradient
  const Tensor frozen = randn({4, 6}, DType::F64, &g);
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        const ResidualNorm o = add_layer_norm(frozen, in[0], {6});
        return add(o.sum, o.normed);
      },
      {r({4, 6})});
}

// add_layer_norm is add() then layer_norm() in one kernel: equal to the two ops, forward bitwise
// (the sum is rounded once, as add() rounds it), backward to rounding (the two gradients reaching
// the sum are added before their one rounding, not after dx's). Also for autocast's mix: an f32
// residual stream plus a bf16 branch, whose sum is f32 and whose gradient comes back in bf16.
TEST(Norm, AddLayerNormEqualsAddThenLayerNorm) {
  Generator g(22);
  for (const auto& [xdt, rdt] : {std::pair{DType::F32, DType::F32}, std::pair{DType::BF16, DType::BF16},
                                 std::pair{DType::F32, DType::BF16}, std::pair{DType::F32, DType::F16}}) {
    SCOPED_TRACE(std::string(dtype_name(xdt)) + " + " + dtype_name(rdt));
    const Tensor x0 = randn({37, 96}, DType::F32, &g).to(xdt), r0 = randn({37, 96}, DType::F32, &g).to(rdt);
    const Tensor w0 = randn({96}, DType::F32, &g), b0 = randn({96}, DType::F32, &g);
    const Tensor gs = randn({37, 96}, DType::F32, &g).to(xdt), gy = randn({37, 96}, DType::F32, &g).to(xdt);
    auto run = [&](bool fused) {
      Tensor x = x0.detach().requires_grad_(), r = r0.detach().requires_grad_();
      Tensor w = w0.detach().requires_grad_(), b = b0.detach().requires_grad_();
      ResidualNorm o;
      if (fused) {
        o = add_layer_norm(x, r, {96}, w, b);
      } else {
        o.sum = add(x, r);
        o.normed = layer_norm(o.sum, {96}, w, b);
      }
      autograd::backward({o.sum, o.normed}, {gs, gy});
      return std::vector<Tensor>{o.sum, o.normed, x.grad(), r.grad(), w.grad(), b.grad()};
    };
    const std::vector<Tensor> fused = run(true), ref = run(false);
    EXPECT_EQ(fused[0].dtype(), xdt);
    EXPECT_EQ(fused[3].dtype(), rdt);
    EXPECT_EQ(fused[0].to_vector(), ref[0].to_vector());
    EXPECT_EQ(fused[1].to_vector(), ref[1].to_vector());
    for (size_t i = 2; i < fused.size(); ++i) {
      EXPECT_EQ(fused[i].dtype(), ref[i].dtype()) << i;
      EXPECT_TRUE(test::compare(fused[i], ref[i], test::default_tolerance(fused[i].dtype())).empty()) << i;
    }
  }
}

TEST(Norm, AddLayerNormErrors) {
  const Tensor x = zeros({2, 4});
  expect_error([&] { add_layer_norm(x, Tensor(), {4}); }, "add_layer_norm: expected a residual tensor");
  expect_error(
      [&] {
        add_layer_norm(x, zeros({2, 4}, DType::I64), {4});
      },
      "add_layer_norm: residual must be a floating-point tensor, found i64");
  expect_error([&] { add_rms_norm(x, x, {3}); },
               "add_rms_norm: input of shape [2, 4] does not end with normalized_shape [3]");
}

TEST(Norm, ColumnSumsIndependentOfThreadCount) {
  // big enough for several row blocks with partial sums (layer-norm weight gradient,
  // channels-last batch-norm statistics and gradients, and NCHW batch norm with runs long enough
  // to be reduced in memory order by blocks of runs)
  Generator g(9);
  Tensor x = randn({800, 48}, {}, &g), gy = randn({800, 48}, {}, &g);
  Tensor xb = randn({16, 24, 12, 12}, {}, &g).contiguous_channels_last(), gb = randn({16, 24, 12, 12}, {}, &g);
  Tensor xn = randn({16, 6, 20, 20}, {}, &g), gn = randn({16, 6, 20, 20}, {}, &g);
  auto run = [&](int threads) {
    set_num_threads(threads);
    Tensor w = ones({48}).requires_grad_(), xx = x.detach().requires_grad_();
    autograd::backward({layer_norm(xx, {48}, w, Tensor())}, {gy});
    Tensor wb = ones({24}).requires_grad_(), xbb = xb.detach().requires_grad_();
    Tensor yb = batch_norm(xbb, Tensor(), Tensor(), wb, Tensor(), true);
    autograd::backward({yb}, {gb});
    Tensor wn = ones({6}).requires_grad_(), xnn = xn.detach().requires_grad_();
    Tensor yn = batch_norm(xnn, Tensor(), Tensor(), wn, Tensor(), true);
    autograd::backward({yn}, {gn});
    return std::vector<std::vector<double>>{w.grad().to_vector(),  xx.grad().to_vector(),  yb.to_vector(),
                                            wb.grad().to_vector(), xbb.grad().to_vector(), yn.to_vector(),
                                            wn.grad().to_vector(), xnn.grad().to_vector()};
  };
  const int prev = get_num_threads();
  auto a = run(1), b = run(2);
  set_num_threads(prev);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "result " << i;
  // The channels-last sums (f32 partials over runs of rows, carried in double) against the same
  // batch norm in f64 on NCHW, whose per-channel loops are the other form: within f32 rounding.
  Tensor wb = ones({24}, DType::F64).requires_grad_(), x64 = xb.to(DType::F64).contiguous().requires_grad_();
  Tensor y64 = batch_norm(x64, Tensor(), Tensor(), wb, Tensor(), true);
  autograd::backward({y64}, {gb.to(DType::F64)});
  const std::vector<std::vector<double>> want = {y64.to_vector(), wb.grad().to_vector(), x64.grad().to_vector()};
  for (size_t i = 0; i < want.size(); ++i)
    for (size_t j = 0; j < want[i].size(); ++j)
      ASSERT_NEAR(a[2 + i][j], want[i][j], 2e-5 * (1 + std::abs(want[i][j])))
          << "result " << 2 + i << ", element " << j;
}
