// Matrix products on the GPU (cuBLASLt) against the CPU backend: plain, transposed views, batched
// with broadcast batch dims (whose gradients sum aliased batches), linear with its bias epilogue,
// f32 / bf16 / f16 / f64, and TF32 when allowed (within TF32's rounding, and off by default).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fasttrain/fasttrain.h"
#include "support/cuda_compare.h"
#include "support/require_gpu.h"

using namespace ft;
using ft::testing::gpu;

namespace {

double tol(DType dt) { return dt == DType::F32 || dt == DType::F64 ? 1e-5 : 1e-2; }

// Forward and both operand gradients of matmul(a, b) on each device, from the same values.
void expect_matmul_matches(const Tensor& a_cpu, const Tensor& b_cpu, DType dt) {
  Tensor a = a_cpu.to(dt).detach().requires_grad_(), b = b_cpu.to(dt).detach().requires_grad_();
  Tensor ga = gpu(a).detach().requires_grad_(), gb = gpu(b).detach().requires_grad_();
  Tensor y = matmul(a, b), gy = matmul(ga, gb);
  EXPECT_CLOSE_TO_CPU(gy, y, tol(dt));
  Tensor dy = randn(y.shape()).to(dt);
  y.backward(dy);
  gy.backward(gpu(dy));
  EXPECT_CLOSE_TO_CPU(ga.grad(), a.grad(), tol(dt));
  EXPECT_CLOSE_TO_CPU(gb.grad(), b.grad(), tol(dt));
}

}  // namespace

TEST(CudaMatmul, MatchesCpuAcrossLayoutsAndDtypes) {
  REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    SCOPED_TRACE(dtype_name(dt));
    expect_matmul_matches(randn({37, 70}), randn({70, 45}), dt);                         // odd sizes
    expect_matmul_matches(randn({70, 37}).t(), randn({45, 70}).t(), dt);                 // both transposed
    expect_matmul_matches(randn({5, 1, 33, 64}), randn({3, 64, 17}), dt);                // broadcast batches
    expect_matmul_matches(randn({4, 8, 16}).transpose(1, 2), randn({4, 8, 24}), dt);     // batched, transposed
    expect_matmul_matches(randn({1, 64}), randn({64, 1}), dt);                           // a dot product
    expect_matmul_matches(randn({6, 10, 12}).slice(2, 0, 12, 2), randn({6, 6, 9}), dt);  // strided columns
  }
}

TEST(CudaMatmul, LinearWithBiasMatchesCpu) {
  REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = randn({3, 50, 96}).to(dt).requires_grad_(), w = randn({130, 96}).to(dt).requires_grad_(),
           b = randn({130}).to(dt).requires_grad_();
    Tensor gx = gpu(x).detach().requires_grad_(), gw = gpu(w).detach().requires_grad_(),
           gb = gpu(b).detach().requires_grad_();
    Tensor y = linear(x, w, b), gy = linear(gx, gw, gb);
    EXPECT_CLOSE_TO_CPU(gy, y, tol(dt));
    Tensor dy = randn(y.shape()).to(dt);
    y.backward(dy);
    gy.backward(gpu(dy));
    EXPECT_CLOSE_TO_CPU(gx.grad(), x.grad(), tol(dt));
    EXPECT_CLOSE_TO_CPU(gw.grad(), w.grad(), tol(dt));
    EXPECT_CLOSE_TO_CPU(gb.grad(), b.grad(), tol(dt));
  }
}

// linear's parameter gradients come from one kernel (linear_weight_grad: the bias sums fused into
// the weight product where cuBLASLt can, FT_CUDA_BGRADB=off runs them apart): at a transformer's
// sizes, with rows that are no multiple of 8, and with only the weight or only the bias trained.
TEST(CudaMatmul, LinearParameterGradientsMatchCpu) {
  REQUIRE_GPU();
  struct Case {
    int64_t rows, in, out;
    bool weight, bias;
  };
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    for (const Case& c : {Case{1024, 768, 2304, true, true}, Case{333, 96, 40, true, true},
                          Case{200, 64, 48, false, true}, Case{200, 64, 48, true, false}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " rows " + std::to_string(c.rows) + " in " + std::to_string(c.in) +
                   " out " + std::to_string(c.out) + (c.weight ? " weight" : "") + (c.bias ? " bias" : ""));
      Tensor x = randn({c.rows, c.in}).to(dt), w = mul(randn({c.out, c.in}), 0.1).to(dt), b = randn({c.out}).to(dt);
      w.requires_grad_(c.weight);
      b.requires_grad_(c.bias);
      Tensor gw = gpu(w).detach().requires_grad_(c.weight), gb = gpu(b).detach().requires_grad_(c.bias);
      Tensor y = linear(x, w, b), gy = linear(gpu(x), gw, gb);
      Tensor dy = randn(y.shape()).to(dt);
      y.backward(dy);
      gy.backward(gpu(dy));
      if (c.weight) {
        EXPECT_CLOSE_TO_CPU(gw.grad(), w.grad(), tol(dt));
      }
      if (c.bias) {
        EXPECT_CLOSE_TO_CPU(gb.grad(), b.grad(), tol(dt));
      }
      EXPECT_EQ(gw.grad().defined(), c.weight);
      EXPECT_EQ(gb.grad().defined(), c.bias);
    }
  }
}

// gelu_mlp (linear, GELU, linear as one op): cuBLASLt's GELU_AUX_BIAS epilogue in the forward
// (and DGELU_BGRAD in the backward with FT_CUDA_GELU_EPILOGUE=on) for bf16/f16 with the tanh GELU;
// the composed kernels for f32, the exact GELU, a hidden width cuBLASLt's aux matrix cannot take
// (not a multiple of 8), and with FT_CUDA_GELU_EPILOGUE=off (gpu-check runs this file in all three
// modes). Output and every gradient against the CPU, with and without biases.
TEST(CudaMatmul, GeluMlpMatchesCpu) {
  REQUIRE_GPU();
  struct Case {
    int64_t rows, in, hid, out;
    bool bias1, bias2;
    GeluApprox approx;
  };
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    for (const Case& c :
         {Case{512, 256, 1024, 256, true, true, GeluApprox::Tanh}, Case{333, 96, 100, 40, true, true, GeluApprox::Tanh},
          Case{256, 64, 128, 64, false, false, GeluApprox::Tanh}, Case{256, 64, 128, 64, true, false, GeluApprox::Tanh},
          Case{200, 64, 128, 48, true, true, GeluApprox::None}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " rows " + std::to_string(c.rows) + " hid " + std::to_string(c.hid) +
                   (c.bias1 ? " b1" : "") + (c.bias2 ? " b2" : "") +
                   (c.approx == GeluApprox::Tanh ? " tanh" : " exact"));
      std::vector<Tensor> cpu = {randn({c.rows, c.in}).to(dt), mul(randn({c.hid, c.in}), 0.1).to(dt),
                                 c.bias1 ? randn({c.hid}).to(dt) : Tensor(), mul(randn({c.out, c.hid}), 0.1).to(dt),
                                 c.bias2 ? randn({c.out}).to(dt) : Tensor()};
      std::vector<Tensor> dev;
      for (Tensor& t : cpu) {
        if (!t.defined()) {
          dev.emplace_back();
          continue;
        }
        t.requires_grad_();
        dev.push_back(gpu(t).detach().requires_grad_());
      }
      Tensor y = gelu_mlp(cpu[0], cpu[1], cpu[2], cpu[3], cpu[4], c.approx);
      Tensor gy = gelu_mlp(dev[0], dev[1], dev[2], dev[3], dev[4], c.approx);
      EXPECT_CLOSE_TO_CPU(gy, y, tol(dt));
      Tensor dy = randn(y.shape()).to(dt);
      y.backward(dy);
      gy.backward(gpu(dy));
      for (size_t i = 0; i < cpu.size(); ++i) {
        if (!cpu[i].defined()) continue;
        SCOPED_TRACE("gradient of input " + std::to_string(i));
        EXPECT_CLOSE_TO_CPU(dev[i].grad(), cpu[i].grad(), tol(dt));
      }
    }
  }
}

TEST(CudaMatmul, Tf32OnlyWhenAllowed) {
  REQUIRE_GPU();
  Tensor a = randn({512, 512}), b = randn({512, 512});
  Tensor ref = matmul(a.to(DType::F64), b.to(DType::F64)).to(DType::F32);
  Tensor exact = matmul(gpu(a), gpu(b));
  EXPECT_CLOSE_TO_CPU(exact, ref, 1e-5);  // off by default: full f32 products
  AllowTf32Guard tf32(true);
  Tensor fast = matmul(gpu(a), gpu(b));
  EXPECT_CLOSE_TO_CPU(fast, ref, 2e-3);  // TF32 rounds operands to 10 mantissa bits
  EXPECT_FALSE(ft::testing::close_to_cpu(fast, ref, 1e-5)) << "TF32 was asked for but the products are exact";
}

TEST(CudaMatmul, EmptyInnerDimensionGivesBiasOrZeros) {
  REQUIRE_GPU();
  Tensor a = randn({4, 0}), b = randn({0, 5});
  EXPECT_CLOSE_TO_CPU(matmul(gpu(a), gpu(b)), matmul(a, b), 1e-7);
  Tensor w = randn({5, 0}), bias = randn({5});
  EXPECT_CLOSE_TO_CPU(linear(gpu(a), gpu(w), gpu(bias)), linear(a, w, bias), 1e-7);
}
