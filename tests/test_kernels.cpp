// The kernel table: the CPU's is complete for every instruction-set level this CPU runs, its
// variants agree, a device without a kernel raises the one error, and FASTTRAIN_CPU_ISA is
// read as documented.
#include <cmath>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "backend/cpu/kernels.h"
#include "backend/strided_loop.h"
#include "core/switches.h"
#include "fasttrain/fasttrain.h"
#include "ops/autocast_policy.h"
#include "support/expect_error.h"

namespace ft {
namespace {

using backend::Kernels;
using cpu::CpuIsa;

// ||a - b|| / ||b|| over all elements, in f64.
double relative_error(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num / den);
}

TEST(Kernels, CpuTableIsCompleteAtEveryLevel) {
  for (CpuIsa isa : cpu::kCpuIsaLevels) {
    if (isa > cpu::detected_cpu_isa()) break;
    int entries = 0;
    backend::cpu_kernels_for(isa).for_each([&](const auto& slot) {
      ++entries;
      EXPECT_TRUE(slot.has_value()) << "cpu (" << cpu::cpu_isa_name(isa) << ") has no kernel for " << slot.name();
    });
    EXPECT_GT(entries, 40);
    // The CPU also provides every optional fusion (the reference the other backends' fallbacks
    // are checked against).
    backend::cpu_kernels_for(isa).for_each_fused([&](const auto& slot) {
      EXPECT_TRUE(slot.has_value()) << "cpu (" << cpu::cpu_isa_name(isa) << ") has no fused kernel for " << slot.name();
    });
  }
}

TEST(Kernels, DeviceWithoutKernelNamesDeviceAndKernel) {
  // A table a backend filled nothing into: every slot is empty, and the call says which.
  const Kernels cuda(DeviceType::CUDA);
  Tensor x = ones({4}), out = empty({4});
  test::expect_error([&] { cuda.unary(math::UnaryOp::Exp, x, out); }, "no cuda kernel for unary");
  test::expect_error([&] { cuda.matmul(x, x, out, false, Tensor()); }, "no cuda kernel for matmul");
  // The check happens before the call: the output is untouched.
  EXPECT_EQ(out.numel(), 4);
}

TEST(Kernels, CudaBuildRegistersItsTable) {
  if (!cuda_compiled()) GTEST_SKIP() << "SKIP: this build has no CUDA backend";
  // Registered when the backend starts, GPU or not. It provides every entry of the lists (an empty
  // entry's message: DeviceWithoutKernelNamesDeviceAndKernel).
  const Kernels& cuda = backend::kernels(Device::cuda(0));
  EXPECT_EQ(cuda.device, DeviceType::CUDA);
  cuda.for_each([](const auto& slot) { EXPECT_TRUE(slot.has_value()) << "no cuda kernel for " << slot.name(); });
}

TEST(Kernels, CpuDispatchGoesThroughTheTable) {
  Tensor x = randn({3, 5}, TensorOptions(DType::F64));
  Tensor via_table = empty({3, 5}, TensorOptions(DType::F64));
  backend::kernels(x).unary(math::UnaryOp::Tanh, x, via_table);
  EXPECT_EQ(via_table.to_vector(), tanh(x).to_vector());
}

// bf16/f16 products take the packed AVX-512 GEMM or the portable path depending on the level;
// both accumulate in f32, so they agree within 16-bit rounding of the result.
TEST(Kernels, MatmulVariantsAgree) {
  if (cpu::detected_cpu_isa() < CpuIsa::Avx512) GTEST_SKIP() << "SKIP: this CPU has no AVX-512 variant to compare";
  const Kernels& fast = backend::cpu_kernels_for(CpuIsa::Avx512);
  const Kernels& portable = backend::cpu_kernels_for(CpuIsa::Generic);
  for (DType dt : {DType::BF16, DType::F16}) {
    Tensor a = randn({2, 37, 70}).to(dt), b = randn({2, 70, 45}).to(dt), bias = randn({45}).to(dt);
    Tensor c1 = empty({2, 37, 45}, TensorOptions(dt)), c2 = empty({2, 37, 45}, TensorOptions(dt));
    fast.matmul(a, b, c1, false, bias);
    portable.matmul(a, b, c2, false, bias);
    Tensor ref = add(matmul(a.to(DType::F64), b.to(DType::F64)), bias.to(DType::F64));
    EXPECT_LT(relative_error(c1, ref), 1e-2) << dtype_name(dt);
    EXPECT_LT(relative_error(c2, ref), 1e-2) << dtype_name(dt);
    EXPECT_GT(relative_error(c1, ref), 0) << "a bf16/f16 result equal to the f64 one means the test compares nothing";
  }
}

TEST(Kernels, IsaNamesRoundTrip) {
  for (CpuIsa isa : cpu::kCpuIsaLevels) EXPECT_EQ(cpu::parse_cpu_isa(cpu::cpu_isa_name(isa)), isa);
  EXPECT_FALSE(cpu::parse_cpu_isa("sse2").has_value());
}

// The switch lowers the level in-process (tests/test_switches.cpp checks its variable's names).
TEST(Kernels, TheSwitchLowersTheLevel) {
  {
    switches::Scoped isa(switches::cpu_isa, CpuIsa::Generic);
    EXPECT_EQ(cpu::selected_cpu_isa(), CpuIsa::Generic);
  }
  if (cpu::detected_cpu_isa() < CpuIsa::Amx) {
    switches::Scoped isa(switches::cpu_isa, CpuIsa::Amx);
    test::expect_error([] { cpu::selected_cpu_isa(); }, "above what this CPU runs");
  }
}

TEST(Kernels, AutocastPolicyTable) {
  using ops::AutocastOp;
  using ops::CastClass;
  EXPECT_EQ(ops::autocast_class(AutocastOp::linear), CastClass::LowPrecision);
  EXPECT_EQ(ops::autocast_class(AutocastOp::softmax), CastClass::Float32);
  EXPECT_EQ(ops::autocast_class(AutocastOp::cross_entropy), CastClass::Float32InKernel);
  Tensor w = randn({4, 3}), h = randn({2, 3}).to(DType::BF16);
  EXPECT_FALSE(ops::autocast_inputs(AutocastOp::linear, w, w).has_value());  // autocast off
  autocast::AutocastGuard guard(DType::BF16);
  auto lin = ops::autocast_inputs(AutocastOp::linear, h, w);
  ASSERT_TRUE(lin.has_value());
  EXPECT_EQ((*lin)[1].dtype(), DType::BF16);
  auto sm = ops::autocast_inputs(AutocastOp::softmax, h);
  ASSERT_TRUE(sm.has_value());
  EXPECT_EQ((*sm)[0].dtype(), DType::F32);
  // Read as they are, with an f32 result.
  EXPECT_FALSE(ops::autocast_inputs(AutocastOp::cross_entropy, h).has_value());
  EXPECT_EQ(ops::autocast_result_dtype(AutocastOp::cross_entropy, h), DType::F32);
  EXPECT_EQ(ops::autocast_result_dtype(AutocastOp::cross_entropy, w), DType::F32);
  EXPECT_EQ(ops::autocast_result_dtype(AutocastOp::softmax, h), DType::BF16);  // not that class
}

// The elementwise loop follows the output's memory order: channels-last operands become one
// dense run (they used to loop over W at a stride of C elements, which made add and relu on
// ResNet-50's NHWC activations 20x slower than on NCHW ones), a broadcast per-channel operand
// keeps C innermost, and a row-major output keeps the logical order.
TEST(Loops, FollowTheOutputsMemoryOrder) {
  const Tensor x = randn({2, 3, 4, 5}).contiguous_channels_last();
  const Tensor y = randn({2, 3, 4, 5}).contiguous_channels_last();
  const Tensor out = empty({2, 3, 4, 5}).contiguous_channels_last();
  backend::StridedLoop L = backend::make_loop(out, {&x, &y});
  ASSERT_EQ(L.ndim, 1);
  EXPECT_EQ(L.shape[0], 120);
  for (int a = 0; a < 3; ++a) EXPECT_EQ(L.strides[a][0], 4) << "operand " << a;

  const Tensor bias = randn({1, 3, 1, 1});
  L = backend::make_loop(out, {&x, &bias});
  ASSERT_EQ(L.ndim, 2);
  EXPECT_EQ(L.shape[1], 3);  // C innermost
  EXPECT_EQ(L.strides[2][1], 4);
  EXPECT_EQ(L.strides[2][0], 0);

  const Tensor row_major = empty({2, 3, 4, 5});
  L = backend::make_loop(row_major, {&x});
  ASSERT_EQ(L.ndim, 3);  // N, C, H*W: the output's order, the input read at its strides
  EXPECT_EQ(L.strides[0][2], 4);
  EXPECT_EQ(L.strides[1][2], 3 * 4);

  // Values do not depend on the order.
  const Tensor want = add(x.contiguous(), bias);
  const Tensor got = add(x, bias);
  EXPECT_TRUE(got.is_channels_last());
  EXPECT_EQ(got.contiguous().to_vector(), want.to_vector());
  EXPECT_EQ(relu(x).contiguous().to_vector(), relu(x.contiguous()).to_vector());
}

}  // namespace
}  // namespace ft
