// The optimizers, clipping, the loss scaler and random fills behind the kernel table
// (src/backend/kernel_list_optim.h): the CPU table has every entry at every instruction-set level,
// a device without them names the missing kernel, device checks replaced the CPU-only ones, and
// the step kernels advance the step counts themselves.
#include <gtest/gtest.h>

#include <vector>

#include "backend/cpu/kernels.h"
#include "fasttrain/amp.h"
#include "fasttrain/fasttrain.h"
#include "fasttrain/optim.h"
#include "support/expect_error.h"

namespace ft {
namespace {

using test::expect_error;

// A tensor that claims to live on cuda:0 without any device memory (from_blob over a host
// buffer): enough to test device checks on machines without a GPU.
struct FakeCuda {
  std::vector<float> buf = std::vector<float>(4096, 0.0f);
  Tensor make(const Shape& s) { return from_blob(buf.data(), s, TensorOptions(DType::F32, Device::cuda(0))); }
};

TEST(OptimKernels, CpuTableHasEveryEntryAtEveryLevel) {
  for (cpu::CpuIsa isa : cpu::kCpuIsaLevels) {
    if (isa > cpu::detected_cpu_isa()) break;
    const backend::Kernels& k = backend::cpu_kernels_for(isa);
    int entries = 0;
#define FT_CHECK_FILLED(name, sig) \
  ++entries;                       \
  EXPECT_TRUE(k.name.has_value()) << "cpu (" << cpu::cpu_isa_name(isa) << ") has no " #name;
    FT_KERNELS_OPTIM(FT_CHECK_FILLED)
#undef FT_CHECK_FILLED
    EXPECT_EQ(entries, 9);
  }
}

TEST(OptimKernels, DeviceWithoutThemNamesTheKernel) {
  // A table a backend filled nothing into: every optim entry is empty and says which it is.
  const backend::Kernels cuda(DeviceType::CUDA);
#define FT_CHECK_EMPTY(name, sig) EXPECT_FALSE(cuda.name.has_value()) << #name;
  FT_KERNELS_OPTIM(FT_CHECK_EMPTY)
#undef FT_CHECK_EMPTY
  const backend::MultiTensorStep step;
  expect_error([&] { cuda.adam_step(step, true); }, "no cuda kernel for adam_step");
  expect_error([&] { cuda.sgd_step(step); }, "no cuda kernel for sgd_step");
  expect_error([&] { cuda.lamb_step(step); }, "no cuda kernel for lamb_step");
  expect_error([&] { cuda.lars_step(step); }, "no cuda kernel for lars_step");
  Tensor x = zeros({});
  expect_error([&] { cuda.clip_grad_norm({}, 1.0, x); }, "no cuda kernel for clip_grad_norm");
  expect_error([&] { cuda.clip_grad_value({}, 1.0); }, "no cuda kernel for clip_grad_value");
  expect_error([&] { cuda.unscale_grads({}, x, x); }, "no cuda kernel for unscale_grads");
  expect_error([&] { cuda.update_loss_scale(x, x, x, 2.0, 0.5, 2000); }, "no cuda kernel for update_loss_scale");
  expect_error([&] { cuda.random_fill(x, {}); }, "no cuda kernel for random_fill");
}

TEST(OptimKernels, ParametersAndGradientsMustShareADevice) {
  FakeCuda fake;
  Tensor cpu_param = zeros({4}).requires_grad_();
  Tensor cuda_param = fake.make({4}).requires_grad_();
  // Parameters on another device are accepted (that device's table runs the step); mixing is not.
  EXPECT_NO_THROW(optim::make_adamw({{{cuda_param}, optim::GroupOptions{}, ""}}));
  expect_error(
      [&] {
        optim::make_adamw({{{cpu_param, cuda_param}, optim::GroupOptions{}, ""}});
      },
      "optimizer: parameter 1 of group 0 is on cuda:0, the first parameter on cpu");

  auto opt = optim::make_adam({{{cpu_param}, optim::GroupOptions{}, ""}});
  cpu_param.set_grad(zeros({4}));
  expect_error([&] { opt->step(from_blob(fake.buf.data(), {}, TensorOptions(DType::F32, Device::cuda(0)))); },
               "adam: found_inf is on cuda:0, the parameters on cpu");

  cuda_param.set_grad(fake.make({4}));
  expect_error(
      [&] {
        optim::clip_grad_norm_({cpu_param, cuda_param}, 1.0);
      },
      "clip_grad_norm_: the gradient of parameter 1 is on cuda:0, that of parameter 0 on cpu");
  auto cuda_opt = optim::make_sgd({{{cuda_param}, optim::GroupOptions{}, ""}});
  amp::GradScaler scaler;
  expect_error([&] { scaler.unscale_(*cuda_opt); },
               "GradScaler.unscale_: the gradients are on cuda:0, the scale on cpu");
}

// The step kernels advance every step count, those of empty parameters included, and a skipped
// step advances none.
TEST(OptimKernels, StepKernelsAdvanceTheStepCounts) {
  for (auto make : {optim::make_sgd, optim::make_adam, optim::make_lamb, optim::make_lars}) {
    Tensor a = ones({3}).requires_grad_(), empty_param = zeros({0}).requires_grad_();
    auto opt = make({{{a, empty_param}, optim::GroupOptions{}, ""}});
    a.set_grad(ones({3}));
    empty_param.set_grad(zeros({0}));
    opt->step();
    opt->step(scalar_tensor(1.0f));
    opt->step(scalar_tensor(0.0f));
    for (const auto& [key, t] : opt->state_tensors())
      if (key.ends_with(".step")) EXPECT_EQ(t.item<int64_t>(), 2) << opt->name() << " " << key;
    EXPECT_EQ(opt->step_count(), 3);
  }
}

// Dropout's masks and bernoulli_mask must keep agreeing: both use this rule.
TEST(OptimKernels, UniformRuleIsTheOneDropoutUses) {
  for (uint32_t w : {0u, 1u, 255u, 256u, 0x80000000u, 0xFFFFFF00u, 0xFFFFFFFFu})
    EXPECT_EQ(random_math::uniform01(w), uniform_from_word(w)) << w;
  const Philox4 a = philox4x32(42, 7, 1);
  const random_math::PhiloxBlock b = random_math::philox4x32(42, 7, 1);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(a.v[k], b.v[k]);
}

}  // namespace
}  // namespace ft
