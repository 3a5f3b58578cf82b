// CUDA optimizer steps, gradient clipping and loss scaling (src/backend/cuda/optim.cu) against the
// CPU backend: the same parameters and gradients on both devices, several steps through the public
// optimizer API, then parameters and every state tensor compared (f32 1e-5, bf16/f16 1e-2 relative
// by norms; step counts exactly). Shapes include tensors larger than one kernel chunk, so per-tensor
// norms (LAMB, LARS) combine several blocks, and an empty parameter whose step count still advances.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fasttrain/amp.h"
#include "fasttrain/fasttrain.h"
#include "fasttrain/optim.h"
#include "support/cuda_compare.h"
#include "support/require_gpu.h"

namespace ft {
namespace {

using optim::GroupOptions;
using optim::Optimizer;
using optim::ParamGroup;
using testing::gpu;

std::unique_ptr<Optimizer> make(const std::string& kind, std::vector<ParamGroup> groups) {
  if (kind == "sgd") return optim::make_sgd(std::move(groups));
  if (kind == "adam") return optim::make_adam(std::move(groups));
  if (kind == "lamb") return optim::make_lamb(std::move(groups));
  if (kind == "lars") return optim::make_lars(std::move(groups));
  return optim::make_adamw(std::move(groups));
}

double tolerance(DType dtype) { return dtype == DType::BF16 || dtype == DType::F16 ? 1e-2 : 1e-5; }

// Matrices and vectors, two of them spanning several 16384-element chunks, and an empty one.
std::vector<Tensor> make_params(DType dtype, uint64_t seed = 1) {
  Generator gen(seed);
  const std::vector<Shape> shapes{{8, 5}, {17}, {300, 301}, {50000}, {9, 6}, {0}, {33}};
  std::vector<Tensor> ps;
  for (const Shape& s : shapes) ps.push_back(randn(s, DType::F32, &gen).to(dtype).requires_grad_());
  return ps;
}

std::vector<Tensor> to_gpu(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (const Tensor& p : ps) out.push_back(gpu(p.detach()).requires_grad_());
  return out;
}

// The gradients of step `step` (times `factor`), made on the CPU and copied to the GPU.
void set_grads(const std::vector<Tensor>& cpu_ps, const std::vector<Tensor>& gpu_ps, int step, DType dtype,
               double factor = 1.0) {
  Generator gen(1000 + step);
  for (size_t i = 0; i < cpu_ps.size(); ++i) {
    Tensor g = mul(randn(cpu_ps[i].shape(), DType::F32, &gen), factor).to(dtype);
    cpu_ps[i].set_grad(g);
    gpu_ps[i].set_grad(gpu(g));
  }
}

// Matrices in a "decay" group, vectors in a "no_decay" group with a third of the learning rate,
// no weight decay and (for LARS) no trust-ratio adaptation.
std::vector<ParamGroup> two_groups(const std::vector<Tensor>& ps, const GroupOptions& o) {
  ParamGroup a{{}, o, "decay"}, b{{}, o, "no_decay"};
  b.options.lr = o.lr / 3;
  b.options.weight_decay = 0;
  b.options.exclude_from_adaptation = true;
  for (const auto& p : ps) (p.dim() >= 2 ? a : b).params.push_back(p);
  return {a, b};
}

void expect_params_close(const std::vector<Tensor>& gpu_ps, const std::vector<Tensor>& cpu_ps, double tol) {
  ASSERT_EQ(gpu_ps.size(), cpu_ps.size());
  for (size_t i = 0; i < cpu_ps.size(); ++i)
    EXPECT_CLOSE_TO_CPU(gpu_ps[i].detach(), cpu_ps[i].detach(), tol) << "parameter " << i;
}

// Same entries in the same order; step counts equal, buffers and master weights (f32, or f64 for
// f64 parameters) close.
void expect_state_close(const Optimizer& gpu_opt, const Optimizer& cpu_opt) {
  const TensorMap got = gpu_opt.state_tensors(), want = cpu_opt.state_tensors();
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    ASSERT_EQ(got[k].first, want[k].first);
    if (want[k].first.ends_with(".step"))
      EXPECT_EQ(got[k].second.item<int64_t>(), want[k].second.item<int64_t>()) << want[k].first;
    else
      EXPECT_CLOSE_TO_CPU(got[k].second, want[k].second, 1e-5) << want[k].first;
  }
}

struct Run {
  std::string kind;
  GroupOptions options;
  DType param = DType::F32;
  DType grad = DType::F32;
};

// Five steps of the same optimizer on the CPU and on the GPU, then everything compared.
void expect_same_trajectory(const Run& r, int steps = 5) {
  SCOPED_TRACE(r.kind + " " + dtype_name(r.param) + " parameters, " + dtype_name(r.grad) + " gradients");
  std::vector<Tensor> cpu_ps = make_params(r.param), gpu_ps = to_gpu(cpu_ps);
  auto cpu_opt = make(r.kind, two_groups(cpu_ps, r.options)), gpu_opt = make(r.kind, two_groups(gpu_ps, r.options));
  for (int s = 0; s < steps; ++s) {
    set_grads(cpu_ps, gpu_ps, s, r.grad);
    cpu_opt->step();
    gpu_opt->step();
  }
  expect_params_close(gpu_ps, cpu_ps, tolerance(r.param));
  expect_state_close(*gpu_opt, *cpu_opt);
  EXPECT_EQ(gpu_opt->step_count(), steps);
}

GroupOptions options(double lr, double weight_decay, double momentum = 0) {
  GroupOptions o;
  o.lr = lr;
  o.weight_decay = weight_decay;
  o.momentum = momentum;
  return o;
}

TEST(CudaOptim, SgdMatchesCpu) {
  REQUIRE_GPU();
  expect_same_trajectory({"sgd", options(0.05, 0)});         // plain
  expect_same_trajectory({"sgd", options(0.05, 0.1, 0.9)});  // momentum, weight decay
  GroupOptions damp = options(0.05, 0.01, 0.8);
  damp.dampening = 0.3;
  expect_same_trajectory({"sgd", damp});
  GroupOptions nesterov = options(0.05, 0.1, 0.9);
  nesterov.nesterov = true;
  expect_same_trajectory({"sgd", nesterov});
  expect_same_trajectory({"sgd", options(0.05, 0.1, 0.9), DType::F64, DType::F64});
}

TEST(CudaOptim, AdamAndAdamWMatchCpu) {
  REQUIRE_GPU();
  expect_same_trajectory({"adam", options(0.01, 0)});
  expect_same_trajectory({"adam", options(0.01, 0.1)});  // L2: added to the gradient
  expect_same_trajectory({"adamw", options(0.01, 0.1)});
  GroupOptions betas = options(0.02, 0.05);
  betas.beta1 = 0.8;
  betas.beta2 = 0.95;
  betas.eps = 1e-6;
  expect_same_trajectory({"adamw", betas});
  expect_same_trajectory({"adamw", options(0.01, 0.1), DType::F32, DType::BF16});  // bf16 gradients
  expect_same_trajectory({"adam", options(0.01, 0.1), DType::F64, DType::F64});
}

TEST(CudaOptim, LambMatchesCpu) {
  REQUIRE_GPU();
  expect_same_trajectory({"lamb", options(0.01, 0)});
  expect_same_trajectory({"lamb", options(0.01, 0.1)});
  expect_same_trajectory({"lamb", options(0.01, 0.1), DType::F64, DType::F64});
}

TEST(CudaOptim, LarsMatchesCpu) {
  REQUIRE_GPU();
  expect_same_trajectory({"lars", options(0.1, 0.01, 0.9)});
  GroupOptions nesterov = options(0.1, 0.01, 0.9);
  nesterov.nesterov = true;
  nesterov.trust_coefficient = 0.02;
  expect_same_trajectory({"lars", nesterov});
  expect_same_trajectory({"lars", options(0.1, 0.0, 0.0)});  // no momentum buffer
  expect_same_trajectory({"lars", options(0.1, 0.01, 0.9), DType::F64, DType::F64});
}

// bf16/f16 parameters are updated through f32 master weights ("master" in the state, compared at
// f32 tolerance); the low-precision parameters are their rounding.
TEST(CudaOptim, LowPrecisionParametersUseMasterWeights) {
  REQUIRE_GPU();
  for (const char* kind : {"sgd", "adamw", "lamb", "lars"}) {
    expect_same_trajectory({kind, options(1e-3, 0.1, 0.9), DType::BF16, DType::BF16});
    expect_same_trajectory({kind, options(1e-3, 0.1, 0.9), DType::BF16, DType::F32});
  }
  expect_same_trajectory({"adamw", options(1e-3, 0.1), DType::F16, DType::F16});
}

// The per-tensor norms are reduced in a fixed order: two runs agree bit for bit.
TEST(CudaOptim, NormsAreDeterministic) {
  REQUIRE_GPU();
  for (const char* kind : {"lamb", "lars"}) {
    SCOPED_TRACE(kind);
    std::vector<std::vector<double>> results;
    for (int run = 0; run < 2; ++run) {
      std::vector<Tensor> cpu_ps = make_params(DType::F32), gpu_ps = to_gpu(cpu_ps);
      auto opt = make(kind, two_groups(gpu_ps, options(0.01, 0.1, 0.9)));
      for (int s = 0; s < 3; ++s) {
        set_grads(cpu_ps, gpu_ps, s, DType::F32);
        opt->step();
      }
      std::vector<double> all;
      for (const Tensor& p : gpu_ps) {
        const std::vector<double> v = p.detach().to(Device::cpu()).to_vector();
        all.insert(all.end(), v.begin(), v.end());
      }
      results.push_back(all);
    }
    EXPECT_EQ(results[0], results[1]);
  }
}

// The kernels advance every step count, the empty parameter's included, and a skipped step none.
TEST(CudaOptim, StepKernelsAdvanceTheStepCounts) {
  REQUIRE_GPU();
  for (const char* kind : {"sgd", "adam", "adamw", "lamb", "lars"}) {
    SCOPED_TRACE(kind);
    Tensor a = gpu(ones({3})).requires_grad_(), empty_param = gpu(zeros({0})).requires_grad_();
    auto opt = make(kind, {{{a, empty_param}, options(0.1, 0.0, 0.9), ""}});
    a.set_grad(gpu(ones({3})));
    empty_param.set_grad(gpu(zeros({0})));
    opt->step();
    opt->step(gpu(scalar_tensor(1.0f)));
    opt->step(gpu(scalar_tensor(0.0f)));
    int counts = 0;
    for (const auto& [key, t] : opt->state_tensors())
      if (key.ends_with(".step")) {
        EXPECT_EQ(t.item<int64_t>(), 2) << key;
        ++counts;
      }
    EXPECT_EQ(counts, 2);
    EXPECT_EQ(opt->step_count(), 3);
  }
}

// step(found_inf) with the flag set leaves parameters, moments and step counts bitwise unchanged,
// and the run then continues like the CPU's, which saw the same skipped step.
TEST(CudaOptim, SkippedStepChangesNothing) {
  REQUIRE_GPU();
  for (const char* kind : {"sgd", "adam", "adamw", "lamb", "lars"}) {
    SCOPED_TRACE(kind);
    std::vector<Tensor> cpu_ps = make_params(DType::F32), gpu_ps = to_gpu(cpu_ps);
    const GroupOptions o = options(0.01, 0.1, 0.9);
    auto cpu_opt = make(kind, two_groups(cpu_ps, o)), gpu_opt = make(kind, two_groups(gpu_ps, o));
    const Tensor overflow = scalar_tensor(1.0f), clean = scalar_tensor(0.0f);
    const Tensor gpu_overflow = gpu(overflow), gpu_clean = gpu(clean);
    for (int s = 0; s < 4; ++s) {
      set_grads(cpu_ps, gpu_ps, s, DType::F32);
      if (s == 2) {
        std::vector<std::vector<double>> params_before;
        for (const Tensor& p : gpu_ps) params_before.push_back(p.detach().to(Device::cpu()).to_vector());
        std::vector<std::vector<double>> state_before;
        for (const auto& [name, t] : gpu_opt->state_tensors()) state_before.push_back(t.to(Device::cpu()).to_vector());
        gpu_opt->step(gpu_overflow);
        cpu_opt->step(overflow);
        for (size_t i = 0; i < gpu_ps.size(); ++i)
          EXPECT_EQ(gpu_ps[i].detach().to(Device::cpu()).to_vector(), params_before[i]) << "parameter " << i;
        const TensorMap after = gpu_opt->state_tensors();
        ASSERT_EQ(after.size(), state_before.size());
        for (size_t k = 0; k < after.size(); ++k)
          EXPECT_EQ(after[k].second.to(Device::cpu()).to_vector(), state_before[k]) << after[k].first;
      }
      gpu_opt->step(gpu_clean);
      cpu_opt->step(clean);
    }
    expect_params_close(gpu_ps, cpu_ps, 1e-5);
    expect_state_close(*gpu_opt, *cpu_opt);
  }
}

// --- clipping ---------------------------------------------------------------------------------------

// Parameters with gradients of the given dtypes (cycled), on the CPU and copies on the GPU.
struct GradPair {
  std::vector<Tensor> cpu, gpu;
};
GradPair grads_pair(const std::vector<DType>& dtypes, double scale = 1.0) {
  GradPair out;
  std::vector<Tensor> ps = make_params(DType::F32, 7);
  Generator gen(77);
  for (size_t i = 0; i < ps.size(); ++i) {
    const DType dt = dtypes[i % dtypes.size()];
    Tensor g = mul(randn(ps[i].shape(), DType::F32, &gen), scale).to(dt);
    Tensor cp = zeros(ps[i].shape(), dt).requires_grad_();
    Tensor gp = gpu(zeros(ps[i].shape(), dt)).requires_grad_();
    cp.set_grad(g);
    gp.set_grad(gpu(g));
    out.cpu.push_back(cp);
    out.gpu.push_back(gp);
  }
  return out;
}

void expect_grads_close(const GradPair& p) {
  for (size_t i = 0; i < p.cpu.size(); ++i)
    EXPECT_CLOSE_TO_CPU(p.gpu[i].grad(), p.cpu[i].grad(), tolerance(p.cpu[i].grad().dtype())) << "gradient " << i;
}

TEST(CudaClip, GradNormMatchesCpu) {
  REQUIRE_GPU();
  for (const std::vector<DType>& dts :
       {std::vector<DType>{DType::F32}, std::vector<DType>{DType::F32, DType::BF16, DType::F16}}) {
    GradPair p = grads_pair(dts);
    const Tensor want = optim::clip_grad_norm_(p.cpu, 2.0);
    const Tensor got = optim::clip_grad_norm_(p.gpu, 2.0);
    EXPECT_EQ(got.dtype(), DType::F32);
    EXPECT_EQ(got.dim(), 0);
    EXPECT_CLOSE_TO_CPU(got, want, 1e-6);
    expect_grads_close(p);
  }
  // f64 gradients: an f64 norm.
  GradPair p = grads_pair({DType::F64});
  const Tensor want = optim::clip_grad_norm_(p.cpu, 2.0);
  const Tensor got = optim::clip_grad_norm_(p.gpu, 2.0);
  EXPECT_EQ(got.dtype(), DType::F64);
  EXPECT_CLOSE_TO_CPU(got, want, 1e-12);
  expect_grads_close(p);
}

// A norm under max_norm leaves the gradients bitwise alone.
TEST(CudaClip, GradNormBelowTheLimitChangesNothing) {
  REQUIRE_GPU();
  GradPair p = grads_pair({DType::F32, DType::BF16});
  std::vector<std::vector<double>> before;
  for (const Tensor& t : p.cpu) before.push_back(t.grad().to_vector());
  const Tensor norm = optim::clip_grad_norm_(p.gpu, 1e6);
  EXPECT_CLOSE_TO_CPU(norm, optim::clip_grad_norm_(p.cpu, 1e6), 1e-6);
  for (size_t i = 0; i < p.gpu.size(); ++i)
    EXPECT_EQ(p.gpu[i].grad().to(Device::cpu()).to_vector(), before[i]) << "gradient " << i;
}

TEST(CudaClip, GradNormWithoutGradientsAndWithNaN) {
  REQUIRE_GPU();
  std::vector<Tensor> ps{gpu(zeros({4})).requires_grad_(), gpu(zeros({3})).requires_grad_()};
  EXPECT_EQ(optim::clip_grad_norm_(ps, 1.0).item<float>(), 0.0f);  // nothing to clip: norm 0
  ps[0].set_grad(gpu(full({4}, 3.0)));
  ps[1].set_grad(gpu(from_vector({1.0, std::nan(""), 2.0}, {3})));
  EXPECT_TRUE(std::isnan(optim::clip_grad_norm_(ps, 1.0).item<float>()));
  EXPECT_TRUE(std::isnan(ps[0].grad().to(Device::cpu()).to_vector()[0]));  // a NaN factor, as in PyTorch
}

TEST(CudaClip, GradValueMatchesCpu) {
  REQUIRE_GPU();
  GradPair p = grads_pair({DType::F32, DType::BF16, DType::F16, DType::F64});
  optim::clip_grad_value_(p.cpu, 0.7);
  optim::clip_grad_value_(p.gpu, 0.7);
  for (size_t i = 0; i < p.cpu.size(); ++i)
    EXPECT_EQ(p.gpu[i].grad().to(Device::cpu()).to_vector(), p.cpu[i].grad().to_vector()) << "gradient " << i;
}

// --- loss scaling -----------------------------------------------------------------------------------

amp::GradScalerOptions small_interval(int64_t interval) {
  amp::GradScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = interval;
  return o;
}

int64_t tracker(const amp::GradScaler& s) { return s.state_tensors()[1].second.item<int64_t>(); }

TEST(CudaGradScaler, UnscaleMatchesCpu) {
  REQUIRE_GPU();
  for (double init : {1024.0, 3.0}) {  // a power of two (exact) and not
    GradPair p = grads_pair({DType::F32, DType::BF16, DType::F16}, init);
    amp::GradScalerOptions o = small_interval(10);
    o.init_scale = init;
    amp::GradScaler cpu_scaler(o), gpu_scaler(o, Device::cuda(0));
    auto cpu_opt = optim::make_sgd({{p.cpu, GroupOptions{}, ""}});
    auto gpu_opt = optim::make_sgd({{p.gpu, GroupOptions{}, ""}});
    cpu_scaler.unscale_(*cpu_opt);
    gpu_scaler.unscale_(*gpu_opt);
    EXPECT_EQ(gpu_scaler.found_inf().item<float>(), 0.0f);
    // One multiplication by the same f32 inverse per element: the same bits.
    for (size_t i = 0; i < p.cpu.size(); ++i)
      EXPECT_EQ(p.gpu[i].grad().to(Device::cpu()).to_vector(), p.cpu[i].grad().to_vector()) << "gradient " << i;
  }
}

// An inf or NaN in one gradient sets found_inf, skips the step (parameters and step counts
// unchanged) and backs the scale off; clean steps then grow it after growth_interval of them.
TEST(CudaGradScaler, OverflowSkipsTheStepAndBacksOff) {
  REQUIRE_GPU();
  for (DType grad_dtype : {DType::F32, DType::F16}) {
    for (double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
      SCOPED_TRACE(std::string(dtype_name(grad_dtype)) + (std::isnan(bad) ? " nan" : " inf"));
      std::vector<Tensor> cpu_ps = make_params(DType::F32), gpu_ps = to_gpu(cpu_ps);
      const GroupOptions o = options(0.01, 0.1);
      auto cpu_opt = optim::make_adamw({{cpu_ps, o, ""}}), gpu_opt = optim::make_adamw({{gpu_ps, o, ""}});
      amp::GradScaler cpu_scaler(small_interval(2)), gpu_scaler(small_interval(2), Device::cuda(0));
      auto one_step = [&](int s, bool overflow) {
        set_grads(cpu_ps, gpu_ps, s, grad_dtype, gpu_scaler.get_scale());
        if (overflow) {
          Tensor g = cpu_ps[2].grad().to(DType::F32);  // the large matrix: one element of a later chunk
          g.data<float>()[20000] = static_cast<float>(bad);
          g = g.to(grad_dtype);
          cpu_ps[2].set_grad(g);
          gpu_ps[2].set_grad(gpu(g));
        }
        cpu_scaler.step(*cpu_opt);
        gpu_scaler.step(*gpu_opt);
      };
      one_step(0, false);
      EXPECT_EQ(gpu_scaler.found_inf().item<float>(), 0.0f);
      cpu_scaler.update();
      gpu_scaler.update();
      EXPECT_EQ(tracker(gpu_scaler), 1);

      std::vector<std::vector<double>> params_before, state_before;
      for (const Tensor& p : gpu_ps) params_before.push_back(p.detach().to(Device::cpu()).to_vector());
      for (const auto& [name, t] : gpu_opt->state_tensors()) state_before.push_back(t.to(Device::cpu()).to_vector());
      one_step(1, true);
      EXPECT_EQ(gpu_scaler.found_inf().item<float>(), 1.0f);
      for (size_t i = 0; i < gpu_ps.size(); ++i)
        EXPECT_EQ(gpu_ps[i].detach().to(Device::cpu()).to_vector(), params_before[i]) << "parameter " << i;
      const TensorMap state = gpu_opt->state_tensors();
      ASSERT_EQ(state.size(), state_before.size());
      for (size_t k = 0; k < state.size(); ++k)
        EXPECT_EQ(state[k].second.to(Device::cpu()).to_vector(), state_before[k]) << state[k].first;
      EXPECT_EQ(state[0].second.item<int64_t>(), 1);  // "0.0.step"
      cpu_scaler.update();
      gpu_scaler.update();
      EXPECT_EQ(gpu_scaler.get_scale(), 512.0);
      EXPECT_EQ(tracker(gpu_scaler), 0);

      for (int s = 2; s < 4; ++s) {  // two clean steps: the scale grows back (interval 2)
        one_step(s, false);
        EXPECT_EQ(gpu_scaler.found_inf().item<float>(), 0.0f);
        cpu_scaler.update();
        gpu_scaler.update();
      }
      EXPECT_EQ(gpu_scaler.get_scale(), 1024.0);
      EXPECT_EQ(gpu_scaler.get_scale(), cpu_scaler.get_scale());
      EXPECT_EQ(gpu_opt->state_tensors()[0].second.item<int64_t>(), 3);
      expect_params_close(gpu_ps, cpu_ps, 1e-5);
      expect_state_close(*gpu_opt, *cpu_opt);
    }
  }
}

// torch's _amp_update_scale_ on the device: growth after growth_interval clean steps, backoff and
// a reset on overflow, no growth to an infinite scale.
TEST(CudaGradScaler, ScaleSequenceFollowsTorchRules) {
  REQUIRE_GPU();
  Tensor p = gpu(randn({5, 3})).requires_grad_();
  auto opt = optim::make_sgd({{{p}, GroupOptions{}, ""}});
  amp::GradScalerOptions o = small_interval(3);
  o.growth_factor = 4;
  o.backoff_factor = 0.25;
  amp::GradScaler scaler(o, Device::cuda(0));
  const std::vector<bool> overflow{false, false, false, false, true, false, false, false};
  std::vector<double> scales;
  std::vector<int64_t> trackers;
  for (bool inf : overflow) {
    p.set_grad(gpu(inf ? full({5, 3}, std::numeric_limits<double>::infinity()) : ones({5, 3})));
    scaler.step(*opt);
    scaler.update();
    scales.push_back(scaler.get_scale());
    trackers.push_back(tracker(scaler));
  }
  EXPECT_EQ(scales, (std::vector<double>{1024, 1024, 4096, 4096, 1024, 1024, 1024, 4096}));
  EXPECT_EQ(trackers, (std::vector<int64_t>{1, 2, 0, 1, 0, 1, 2, 0}));

  amp::GradScalerOptions huge = small_interval(1);
  huge.init_scale = 3e38;  // x2 would overflow f32: the scale stays
  amp::GradScaler top(huge, Device::cuda(0));
  p.set_grad(gpu(ones({5, 3})));
  top.step(*opt);
  top.update();
  EXPECT_EQ(top.get_scale(), static_cast<double>(3e38f));
  EXPECT_EQ(tracker(top), 0);
}

}  // namespace
}  // namespace ft
