// cuDNN convolutions (backend/cuda/conv.cpp) against the CPU backend through ft::conv2d: forward
// and the input, weight and bias gradients, on a ResNet-like set of shapes (7x7 stride-2 stem,
// 1x1, 3x3 at stride 1 and 2, grouped, depthwise, dilated, rectangular), NCHW and channels-last,
// f32 / bf16 / f16 / f64, with cuDNN's heuristics and with autotuning (cudnn_benchmark), and
// bitwise-repeatable under deterministic_algorithms(). f32 must agree to 1e-5 by norms: TF32 is
// off unless allowed. Skipped with a visible message where there is no GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "fasttrain/fasttrain.h"
#include "support/cuda_compare.h"
#include "support/require_gpu.h"

using namespace ft;
using ft::testing::backward_random;
using ft::testing::gpu;
using ft::testing::rnd;
using ft::testing::tol;

namespace {

struct Case {
  const char* name;
  int64_t N, C, H, W, O, kH, kW;
  Pair stride, padding, dilation;
  int64_t groups;
  bool bias;
};

const Case kCases[] = {
    {"stem 7x7 stride 2 pad 3", 2, 3, 20, 20, 16, 7, 7, {2, 2}, {3, 3}, {1, 1}, 1, false},
    {"1x1", 2, 16, 8, 8, 24, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, false},
    {"1x1 stride 2, bias", 2, 16, 8, 8, 32, 1, 1, {2, 2}, {0, 0}, {1, 1}, 1, true},
    {"3x3 pad 1, bias", 2, 16, 8, 8, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
    {"3x3 pad 1 stride 2", 2, 16, 9, 9, 32, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, false},
    {"grouped 3x3, 4 groups, bias", 2, 16, 8, 8, 32, 3, 3, {1, 1}, {1, 1}, {1, 1}, 4, true},
    {"depthwise 3x3", 2, 16, 8, 8, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 16, false},
    {"3x3 dilation 2, bias", 2, 8, 10, 10, 8, 3, 3, {1, 1}, {2, 2}, {2, 2}, 1, true},
    {"3x1 stride [2, 1], odd sizes, bias", 3, 5, 7, 6, 4, 3, 1, {2, 1}, {1, 0}, {1, 1}, 1, true},
};

// Forward output and the gradients of one conv2d call.
struct Result {
  Tensor y, gx, gw, gb;
};

// Leaves with the given values on `dev`, 4-d ones in NHWC memory order when channels_last.
Tensor leaf_on(const Tensor& v, Device dev, bool channels_last) {
  Tensor t = dev.is_cuda() ? gpu(v) : v;
  if (channels_last) t = t.contiguous_channels_last();
  return t.detach().requires_grad_();
}

// The case on the CPU and on the GPU from the same values, backward with the same random
// upstream gradient. x_cl / w_cl: activations / weight channels-last.
std::pair<Result, Result> run_both(const Case& k, DType dt, bool x_cl, bool w_cl, uint64_t seed) {
  const double w_scale = 1.0 / std::sqrt(static_cast<double>(k.C / k.groups * k.kH * k.kW));
  const Tensor xv = rnd({k.N, k.C, k.H, k.W}, dt, seed);
  const Tensor wv = rnd({k.O, k.C / k.groups, k.kH, k.kW}, dt, seed + 1, w_scale);
  const Tensor bv = rnd({k.O}, dt, seed + 2);
  Result r[2];
  Tensor x[2], w[2], b[2];
  const Device devs[2] = {Device::cpu(), Device::cuda(0)};
  for (int i = 0; i < 2; ++i) {
    x[i] = leaf_on(xv, devs[i], x_cl);
    w[i] = leaf_on(wv, devs[i], w_cl);
    if (k.bias) b[i] = leaf_on(bv, devs[i], false);
    r[i].y = conv2d(x[i], w[i], b[i], k.stride, k.padding, k.dilation, k.groups);
  }
  backward_random(r[0].y, r[1].y, seed + 3);
  for (int i = 0; i < 2; ++i) {
    r[i].gx = x[i].grad();
    r[i].gw = w[i].grad();
    if (k.bias) r[i].gb = b[i].grad();
  }
  return {r[0], r[1]};
}

void expect_matches_cpu(const Case& k, DType dt, bool x_cl, bool w_cl) {
  SCOPED_TRACE(std::string(k.name) + ", " + dtype_name(dt) + (x_cl ? ", NHWC" : ", NCHW") +
               (w_cl ? " activations, OHWI weight" : " activations, OIHW weight"));
  const auto [on_cpu, on_gpu] = run_both(k, dt, x_cl, w_cl, 10);
  EXPECT_CLOSE_TO_CPU(on_gpu.y, on_cpu.y, tol(dt));
  if (x_cl) {
    EXPECT_TRUE(on_gpu.y.is_channels_last()) << "a channels-last input must give a channels-last output";
  }
  EXPECT_CLOSE_TO_CPU(on_gpu.gx, on_cpu.gx, tol(dt));
  EXPECT_CLOSE_TO_CPU(on_gpu.gw, on_cpu.gw, tol(dt));
  if (k.bias) {
    EXPECT_CLOSE_TO_CPU(on_gpu.gb, on_cpu.gb, tol(dt));
  }
}

::testing::AssertionResult bitwise_equal(const Tensor& a, const Tensor& b) {
  const std::vector<double> va = a.to(Device::cpu()).to_vector(), vb = b.to(Device::cpu()).to_vector();
  if (va.size() != vb.size()) return ::testing::AssertionFailure() << va.size() << " vs " << vb.size() << " elements";
  for (size_t i = 0; i < va.size(); ++i)
    if (va[i] != vb[i]) return ::testing::AssertionFailure() << "element " << i << ": " << va[i] << " vs " << vb[i];
  return ::testing::AssertionSuccess();
}

}  // namespace

TEST(CudaConv, MatchesCpuAcrossShapesLayoutsAndDtypes) {
  REQUIRE_GPU();
  ASSERT_FALSE(cudnn_benchmark()) << "autotuning is off by default";
  ASSERT_FALSE(allow_tf32()) << "TF32 is off by default";
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64})
    for (bool cl : {false, true})
      for (const Case& k : kCases) expect_matches_cpu(k, dt, cl, cl);
}

// The weight in the other layout than the activations (a model half converted, or a grouped
// weight, which the op keeps OIHW): copied to cuDNN's layout, its gradient copied back.
TEST(CudaConv, MixedActivationAndWeightLayoutsMatchCpu) {
  REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& k : {kCases[0], kCases[3], kCases[5]}) {
      expect_matches_cpu(k, dt, true, false);
      expect_matches_cpu(k, dt, false, true);
    }
}

TEST(CudaConv, AutotunedMatchesCpu) {
  REQUIRE_GPU();
  const CudnnBenchmarkGuard benchmark(true);
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (bool cl : {false, true})
      for (const Case& k : kCases) expect_matches_cpu(k, dt, cl, cl);
  // A second pass takes the plans found by the first.
  for (const Case& k : kCases) expect_matches_cpu(k, DType::F32, true, true);
}

TEST(CudaConv, DeterministicAlgorithmsRepeatBitwise) {
  REQUIRE_GPU();
  const DeterministicAlgorithmsGuard deterministic(true);
  for (bool autotune : {false, true}) {
    const CudnnBenchmarkGuard benchmark(autotune);
    for (DType dt : {DType::F32, DType::BF16, DType::F16})
      for (bool cl : {false, true})
        for (const Case& k : kCases) {
          SCOPED_TRACE(std::string(k.name) + ", " + dtype_name(dt) + (cl ? ", NHWC" : ", NCHW") +
                       (autotune ? ", autotuned" : ", heuristics"));
          const auto [on_cpu, first] = run_both(k, dt, cl, cl, 20);
          const Result second = run_both(k, dt, cl, cl, 20).second;
          EXPECT_CLOSE_TO_CPU(first.y, on_cpu.y, tol(dt));
          EXPECT_CLOSE_TO_CPU(first.gw, on_cpu.gw, tol(dt));
          EXPECT_TRUE(bitwise_equal(first.y, second.y)) << "output";
          EXPECT_TRUE(bitwise_equal(first.gx, second.gx)) << "input gradient";
          EXPECT_TRUE(bitwise_equal(first.gw, second.gw)) << "weight gradient";
          if (k.bias) {
            EXPECT_TRUE(bitwise_equal(first.gb, second.gb)) << "bias gradient";
          }
        }
  }
}

TEST(CudaConv, Tf32OnlyWhenAllowed) {
  REQUIRE_GPU();
  const Tensor x = rnd({4, 64, 16, 16}, DType::F32, 1), w = rnd({64, 64, 3, 3}, DType::F32, 2, 1.0 / 24);
  const Tensor ref = conv2d(x.to(DType::F64), w.to(DType::F64), Tensor(), {1, 1}, {1, 1}).to(DType::F32);
  EXPECT_CLOSE_TO_CPU(conv2d(gpu(x), gpu(w), Tensor(), {1, 1}, {1, 1}), ref, 1e-5);  // exact f32 products
  // TF32 allowed: cuDNN may take tensor-core kernels, which round operands to 10 mantissa bits.
  const AllowTf32Guard tf32(true);
  EXPECT_CLOSE_TO_CPU(conv2d(gpu(x), gpu(w), Tensor(), {1, 1}, {1, 1}), ref, 3e-3);
}

// Image 1 of a [3, 3, 5, 5] batch starts 300 bytes (f32) or 150 bytes (bf16) in: a dense view
// that is not 16-byte aligned, which the backend copies before cuDNN sees it.
TEST(CudaConv, UnalignedBatchSliceMatchesCpu) {
  REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor batch = rnd({3, 3, 5, 5}, dt, 1), w = rnd({4, 3, 3, 3}, dt, 2, 0.2), b = rnd({4}, dt, 3);
    const Tensor want = conv2d(batch.slice(0, 1, 3), w, b, {1, 1}, {1, 1});
    const Tensor got = conv2d(gpu(batch).slice(0, 1, 3), gpu(w), gpu(b), {1, 1}, {1, 1});
    EXPECT_CLOSE_TO_CPU(got, want, tol(dt));
  }
}
