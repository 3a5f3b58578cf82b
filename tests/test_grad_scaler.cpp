// amp::GradScaler (src/optim/grad_scaler.cpp): the scaled loss and its gradients, the fused
// unscale with inf/NaN detection for f32/bf16/f16 gradients, the skipped step on overflow, the
// scale's backoff and growth (torch.cuda.amp.GradScaler's rules), state round trips and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "fasttrain/amp.h"
#include "fasttrain/fasttrain.h"
#include "support/expect_error.h"

using namespace ft;
using ft::test::expect_error;

namespace {

std::vector<Tensor> make_params(int count, uint64_t seed = 1) {
  Generator gen(seed);
  std::vector<Tensor> ps;
  for (int i = 0; i < count; ++i) ps.push_back(randn({6 + i, 3}, DType::F32, &gen).requires_grad_());
  return ps;
}

// The gradients of step `step`, times `factor` (a power of two: exact).
void set_grads(const std::vector<Tensor>& ps, int step, double factor = 1.0, DType dtype = DType::F32) {
  Generator gen(100 + step);
  for (const auto& p : ps) p.set_grad(mul(randn(p.shape(), DType::F32, &gen), factor).to(dtype));
}

std::vector<Tensor> clones(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (const auto& p : ps) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

std::vector<std::vector<double>> values(const std::vector<Tensor>& ts) {
  std::vector<std::vector<double>> out;
  for (const auto& t : ts) out.push_back(t.to_vector());
  return out;
}

std::vector<std::vector<double>> state_values(const optim::Optimizer& opt) {
  std::vector<std::vector<double>> out;
  for (const auto& [name, t] : opt.state_tensors()) out.push_back(t.to_vector());
  return out;
}

int64_t tracker(const amp::GradScaler& s) { return s.state_tensors()[1].second.item<int64_t>(); }

amp::GradScalerOptions small_interval(int64_t interval) {
  amp::GradScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = interval;
  return o;
}

}  // namespace

TEST(GradScaler, ScaledLossGivesScaledGradients) {
  amp::GradScaler scaler(small_interval(10));
  Tensor w = full({3}, 0.5).requires_grad_();
  Tensor loss = sum(square(w));
  Tensor scaled = scaler.scale(loss);
  EXPECT_EQ(scaled.dtype(), DType::F32);
  EXPECT_EQ(scaled.item<double>(), loss.item<double>() * 1024);
  scaled.backward();
  EXPECT_EQ(w.grad().to_vector(), std::vector<double>(3, 1024.0));  // d/dw sum(w^2) = 2w = 1, scaled
  EXPECT_EQ(scaler.scale(loss.to(DType::BF16)).dtype(), DType::BF16);
}

// No overflow and a power-of-two scale: scaling and unscaling are exact, so the trajectory is
// bitwise the one without a scaler.
TEST(GradScaler, TrajectoryEqualsUnscaledRun) {
  for (DType grad_dtype : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(grad_dtype));
    std::vector<Tensor> a = make_params(3), b = clones(a);
    optim::GroupOptions o;
    o.lr = 0.01;
    o.weight_decay = 0.1;
    auto opt_a = optim::make_adamw({{a, o, ""}}), opt_b = optim::make_adamw({{b, o, ""}});
    amp::GradScaler scaler(small_interval(2));
    for (int s = 0; s < 5; ++s) {
      set_grads(a, s, scaler.get_scale(), grad_dtype);
      set_grads(b, s, 1.0, grad_dtype);
      scaler.step(*opt_a);
      scaler.update();
      opt_b->step();
      EXPECT_EQ(scaler.found_inf().item<float>(), 0.0f);
    }
    EXPECT_EQ(values(a), values(b));
    EXPECT_EQ(scaler.get_scale(), 1024.0 * 4);  // grew after steps 2 and 4
  }
}

TEST(GradScaler, OverflowSkipsTheStepAndBacksOff) {
  for (DType grad_dtype : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(grad_dtype));
    for (double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
      std::vector<Tensor> ps = make_params(3);
      auto opt = optim::make_adamw({{ps, optim::GroupOptions{}, ""}});
      amp::GradScaler scaler(small_interval(10));
      set_grads(ps, 0, scaler.get_scale(), grad_dtype);
      scaler.step(*opt);
      scaler.update();
      EXPECT_EQ(tracker(scaler), 1);
      const auto params_before = values(ps), state_before = state_values(*opt);

      set_grads(ps, 1, scaler.get_scale(), grad_dtype);
      Tensor g = ps[1].grad();
      g.copy_(where(gt(arange(0, g.numel()).reshape(g.shape()), 4.5), full_like(g, bad), g));
      scaler.step(*opt);
      EXPECT_EQ(scaler.found_inf().item<float>(), 1.0f);
      EXPECT_EQ(values(ps), params_before);         // parameters bitwise unchanged
      EXPECT_EQ(state_values(*opt), state_before);  // moments and step counts too
      EXPECT_EQ(opt->state_tensors()[0].second.item<int64_t>(), 1);
      scaler.update();
      EXPECT_EQ(scaler.get_scale(), 512.0);
      EXPECT_EQ(tracker(scaler), 0);

      set_grads(ps, 2, scaler.get_scale(), grad_dtype);  // clean again: the step happens
      scaler.step(*opt);
      scaler.update();
      EXPECT_NE(values(ps), params_before);
      EXPECT_EQ(opt->state_tensors()[0].second.item<int64_t>(), 2);
      EXPECT_EQ(scaler.get_scale(), 512.0);
    }
  }
}

// torch's _amp_update_scale_: x growth_factor after growth_interval consecutive clean steps (the
// tracker counts them and restarts), x backoff_factor and a reset on overflow, and no growth to
// an infinite scale.
TEST(GradScaler, ScaleSequenceFollowsTorchRules) {
  std::vector<Tensor> ps = make_params(1);
  auto opt = optim::make_sgd({{ps, optim::GroupOptions{}, ""}});
  amp::GradScalerOptions o = small_interval(3);
  o.growth_factor = 4;
  o.backoff_factor = 0.25;
  amp::GradScaler scaler(o);
  const std::vector<bool> overflow{false, false, false, false, true, false, false, false};
  std::vector<double> scales;
  std::vector<int64_t> trackers;
  for (bool inf : overflow) {
    set_grads(ps, 0);
    if (inf) ps[0].grad().fill_(std::numeric_limits<double>::infinity());
    scaler.step(*opt);
    scaler.update();
    scales.push_back(scaler.get_scale());
    trackers.push_back(tracker(scaler));
  }
  EXPECT_EQ(scales, (std::vector<double>{1024, 1024, 4096, 4096, 1024, 1024, 1024, 4096}));
  EXPECT_EQ(trackers, (std::vector<int64_t>{1, 2, 0, 1, 0, 1, 2, 0}));

  amp::GradScalerOptions huge = small_interval(1);
  huge.init_scale = 3e38;  // x2 would overflow f32: the scale stays
  amp::GradScaler top(huge);
  set_grads(ps, 0);
  top.step(*opt);
  top.update();
  EXPECT_EQ(top.get_scale(), static_cast<double>(3e38f));
  EXPECT_EQ(tracker(top), 0);
}

TEST(GradScaler, UnscaleBeforeClippingAndOnlyOnce) {
  std::vector<Tensor> ps = make_params(2);
  auto opt = optim::make_sgd({{ps, optim::GroupOptions{}, ""}});
  amp::GradScaler scaler(small_interval(10));
  set_grads(ps, 0, 1024);
  scaler.unscale_(*opt);
  std::vector<Tensor> expected = clones(ps);
  set_grads(expected, 0);
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(ps[i].grad().to_vector(), expected[i].grad().to_vector());
  expect_error([&] { scaler.unscale_(*opt); },
               "GradScaler.unscale_: unscale_() has already been called on this optimizer since the last update()");
  scaler.step(*opt);  // does not unscale again
  scaler.update();
  scaler.unscale_(*opt);  // a new step
  amp::GradScaler fresh;
  expect_error([&] { fresh.update(); }, "GradScaler.update: No inf checks were recorded prior to update");
}

// The intended order with clipping: unscale_, clip the true gradients, then step (which does not
// unscale again).
TEST(GradScaler, ClippingSeesUnscaledGradients) {
  std::vector<Tensor> a = make_params(2), b = clones(a);
  optim::GroupOptions o;
  o.lr = 0.1;
  auto opt_a = optim::make_sgd({{a, o, ""}}), opt_b = optim::make_sgd({{b, o, ""}});
  amp::GradScaler scaler(small_interval(10));
  set_grads(a, 0, scaler.get_scale());
  set_grads(b, 0);
  scaler.unscale_(*opt_a);
  const Tensor norm_a = optim::clip_grad_norm_(a, 0.5), norm_b = optim::clip_grad_norm_(b, 0.5);
  EXPECT_EQ(norm_a.item<float>(), norm_b.item<float>());
  scaler.step(*opt_a);
  scaler.update();
  opt_b->step();
  EXPECT_EQ(values(a), values(b));
}

TEST(GradScaler, StateRoundTrip) {
  std::vector<Tensor> ps = make_params(1);
  auto opt = optim::make_sgd({{ps, optim::GroupOptions{}, ""}});
  amp::GradScaler a(small_interval(3));
  for (int s = 0; s < 2; ++s) {
    set_grads(ps, s);
    a.step(*opt);
    a.update();
  }
  TensorMap state = a.state_tensors();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "scale");
  EXPECT_EQ(state[1].first, "growth_tracker");
  EXPECT_EQ(state[1].second.dtype(), DType::I64);
  amp::GradScaler b(small_interval(3));
  b.load_state_tensors({{"scale", scalar_tensor(256.0f)}, {"growth_tracker", scalar_tensor(int64_t{2}, DType::I64)}});
  EXPECT_EQ(b.get_scale(), 256.0);
  b.load_state_tensors(state);
  EXPECT_EQ(b.get_scale(), a.get_scale());
  EXPECT_EQ(tracker(b), 2);
  set_grads(ps, 3);
  b.step(*opt);
  b.update();  // the third clean step: growth
  EXPECT_EQ(b.get_scale(), 2048.0);

  amp::GradScaler c;
  expect_error(
      [&] {
        c.load_state_tensors({{"scale", scalar_tensor(1.0f)}});
      },
      "GradScaler state: entry 'growth_tracker' is missing");
  expect_error(
      [&] {
        c.load_state_tensors({{"scale", scalar_tensor(1.0, DType::F64)}, state[1]});
      },
      "GradScaler state: entry 'scale' must be a 0-d f32 tensor, found f64 []");
  expect_error(
      [&] {
        c.load_state_tensors({state[0], state[1], {"extra", scalar_tensor(1.0f)}});
      },
      "GradScaler state: unexpected entry 'extra'");
  expect_error(
      [&] {
        c.load_state_tensors({{"scale", scalar_tensor(-1.0f)}, state[1]});
      },
      "'scale' must be positive and finite, found -1");
  EXPECT_EQ(c.get_scale(), 65536.0);  // unchanged by the failed loads
}

TEST(GradScaler, DisabledIsAPlainStep) {
  amp::GradScalerOptions o;
  o.enabled = false;
  amp::GradScaler scaler(o);
  std::vector<Tensor> a = make_params(2), b = clones(a);
  auto opt_a = optim::make_adam({{a, optim::GroupOptions{}, ""}}),
       opt_b = optim::make_adam({{b, optim::GroupOptions{}, ""}});
  Tensor loss = scalar_tensor(2.5f);
  EXPECT_TRUE(scaler.scale(loss).same(loss));
  set_grads(a, 0);
  set_grads(b, 0);
  scaler.unscale_(*opt_a);
  scaler.step(*opt_a);
  scaler.update();
  opt_b->step();
  EXPECT_EQ(values(a), values(b));
  EXPECT_EQ(scaler.get_scale(), 1.0);
}

TEST(GradScaler, ValidatesOptions) {
  auto with = [](auto edit) {
    amp::GradScalerOptions o;
    edit(o);
    return o;
  };
  expect_error([&] { amp::GradScaler(with([](auto& o) { o.growth_factor = 1; })); },
               "GradScaler: The growth factor must be > 1.0 (found 1)");
  expect_error([&] { amp::GradScaler(with([](auto& o) { o.backoff_factor = 1.5; })); },
               "GradScaler: The backoff factor must be < 1.0 and > 0 (found 1.5)");
  expect_error([&] { amp::GradScaler(with([](auto& o) { o.init_scale = 0; })); },
               "GradScaler: init_scale must be a positive finite number, found 0");
  expect_error([&] { amp::GradScaler(with([](auto& o) { o.growth_interval = 0; })); },
               "GradScaler: growth_interval must be a positive integer, found 0");
  amp::GradScaler scaler;
  expect_error([&] { scaler.scale(scalar_tensor(int64_t{3}, DType::I64)); },
               "GradScaler.scale: expected a floating-point loss, found dtype i64");
}
