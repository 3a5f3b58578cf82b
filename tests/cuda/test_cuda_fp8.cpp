// FP8 on CUDA (src/backend/cuda/fp8.cu, fp8_matmul.cpp: cuBLASLt) against the CPU backend's
// emulation (tests/test_fp8.cpp checks that one against PyTorch and f64): the quantize kernel's
// codes, transposed codes and amax bit for bit, the scales' update bit for bit, the FP8 GEMM
// against the CPU's product of the same codes and against a bf16 product of the unquantized
// operands within the quantization's error bound, and fp8_linear's output and gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "fasttrain/fasttrain.h"
#include "support/cuda_compare.h"
#include "support/require_gpu.h"

using namespace ft;
using ft::testing::gpu;

namespace {

Tensor scalar_on(float v, Device d) { return full({1}, v, TensorOptions(DType::F32, d)); }

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(Device::cpu()).contiguous(), hb = b.to(Device::cpu()).contiguous();
  return ha.numel() == hb.numel() && ha.dtype() == hb.dtype() &&
         std::memcmp(ha.raw_data(), hb.raw_data(), static_cast<size_t>(ha.numel()) * dtype_size(ha.dtype())) == 0;
}

}  // namespace

TEST(CudaFp8, QuantizeAndScaleUpdateEqualTheCpuBitForBit) {
  REQUIRE_GPU();
  Generator g(1);
  for (DType dt : {DType::F32, DType::BF16}) {
    for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + fp8_format_name(f));
      // 37 x 50: partial 32 x 32 tiles on both edges; a scale that saturates some values.
      const Tensor x = mul(randn({37, 50}, DType::F32, &g), 4.0).to(dt);
      const float s = f == Fp8Format::E4M3 ? 150.0f : 20000.0f;
      const Tensor amax_c = scalar_on(0.25f, Device::cpu()), amax_g = gpu(amax_c);
      const Fp8Codes c = fp8_quantize(x, f, scalar_on(s, Device::cpu()), amax_c, true);
      const Fp8Codes q = fp8_quantize(gpu(x), f, scalar_on(s, Device::cuda(0)), amax_g, true);
      EXPECT_TRUE(same_bytes(q.codes, c.codes));
      EXPECT_TRUE(same_bytes(q.transposed, c.transposed));
      EXPECT_TRUE(same_bytes(amax_g, amax_c));
      // Rows with a stride (one half of a wider tensor).
      const Tensor wide = randn({20, 96}, DType::F32, &g).to(dt);
      EXPECT_TRUE(same_bytes(
          fp8_quantize(gpu(wide).narrow(1, 32, 48), f, scalar_on(1, Device::cuda(0)), scalar_on(0, Device::cuda(0)))
              .codes,
          fp8_quantize(wide.narrow(1, 32, 48), f, scalar_on(1, Device::cpu()), scalar_on(0, Device::cpu())).codes));
    }
  }
  for (Fp8AmaxAlgo algo : {Fp8AmaxAlgo::Max, Fp8AmaxAlgo::MostRecent}) {
    Fp8Recipe r;
    r.amax_history_len = 300;  // more than one pass of the update kernel's 256 threads
    r.amax_algo = algo;
    r.margin = 2;
    Fp8LinearState cpu(r, Device::cpu()), dev(r, Device::cuda(0));
    for (int step = 0; step < 5; ++step) {
      const Tensor a = abs(randn({3}, DType::F32, &g));
      cpu.amax.copy_(a);
      dev.amax.copy_(gpu(a));
      cpu.update_scales(r);
      dev.update_scales(r);
    }
    const auto ct = cpu.tensors(), dt = dev.tensors();
    for (size_t i = 0; i < ct.size(); ++i) EXPECT_TRUE(same_bytes(dt[i].second, ct[i].second)) << ct[i].first;
  }
}

TEST(CudaFp8, ProductMatchesTheCpuAndTheBf16ProductWithinTheQuantizationBound) {
  REQUIRE_GPU();
  Generator g(2);
  const int64_t M = 64, N = 96, K = 128;
  const Tensor x = randn({M, K}, DType::F32, &g), w = mul(randn({N, K}, DType::F32, &g), 0.05);
  for (Fp8Format fa : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    for (DType out : {DType::F32, DType::BF16}) {
      for (bool fast : {false, true}) {
        SCOPED_TRACE(std::string(fp8_format_name(fa)) + " -> " + dtype_name(out) + (fast ? " fast" : ""));
        const float sa = fa == Fp8Format::E4M3 ? 64.0f : 4096.0f, sb = 2048.0f;
        const Fp8Codes a = fp8_quantize(x, fa, scalar_on(sa, Device::cpu()), scalar_on(0, Device::cpu()));
        const Fp8Codes b = fp8_quantize(w, Fp8Format::E4M3, scalar_on(sb, Device::cpu()), scalar_on(0, Device::cpu()));
        const Tensor bias = randn({N}, DType::F32, &g).to(out);
        const Tensor want = fp8_matmul(a.codes, fa, scalar_on(1 / sa, Device::cpu()), b.codes, Fp8Format::E4M3,
                                       scalar_on(1 / sb, Device::cpu()), bias, out);
        const Tensor got = fp8_matmul(gpu(a.codes), fa, scalar_on(1 / sa, Device::cuda(0)), gpu(b.codes),
                                      Fp8Format::E4M3, scalar_on(1 / sb, Device::cuda(0)), gpu(bias), out, fast);
        EXPECT_CLOSE_TO_CPU(got, want, out == DType::F32 ? (fast ? 1e-4 : 1e-5) : 1e-2);
        // Against the product of the unquantized operands: each FP8 value is within half a unit in
        // the last place of its input (2^-4 relative for E4M3, 2^-3 for E5M2, in range), so each
        // output is within (ea + eb + ea eb) * sum_k |x||w| of it, plus the output's rounding.
        const double ea = fa == Fp8Format::E4M3 ? 0.0625 : 0.125, eb = 0.0625;
        const Tensor exact = add(matmul(x.to(DType::F64), w.to(DType::F64).t()), bias.to(DType::F64));
        const Tensor bound = add(mul(matmul(abs(x).to(DType::F64), abs(w).to(DType::F64).t()), ea + eb + ea * eb),
                                 mul(abs(exact), out == DType::BF16 ? 0.004 : 1e-6));
        const Tensor excess = sub(abs(sub(got.to(Device::cpu()).to(DType::F64), exact)), bound);
        EXPECT_LE(max(excess).item<double>(), 1e-6);
      }
    }
  }
}

TEST(CudaFp8, LinearAndItsGradientsMatchTheCpu) {
  REQUIRE_GPU();
  Generator g(3);
  Fp8Recipe r;
  Fp8LinearState cpu(r, Device::cpu()), dev(r, Device::cuda(0));
  const Tensor scales = from_vector({8.0, 128.0, 8192.0}, {3}, DType::F32);
  const Tensor inverses = from_vector({1 / 8.0, 1 / 128.0, 1 / 8192.0}, {3}, DType::F32);
  for (Fp8LinearState* st : {&cpu, &dev}) {
    st->scale.copy_(scales.to(st->scale.device()));
    st->scale_inv.copy_(inverses.to(st->scale.device()));
  }
  const Tensor x = randn({4, 25, 64}, DType::F32, &g),
               w = mul(randn({80, 64}, DType::F32, &g), 0.1);  // 100 rows: padded to 112 in dW
  const Tensor b = randn({80}, DType::F32, &g), r_ = mul(randn({4, 25, 80}, DType::F32, &g), 1e-3);
  for (bool autocast : {false, true}) {
    SCOPED_TRACE(autocast ? "under autocast (bf16 output)" : "f32");
    Tensor xc = x.clone().requires_grad_(), wc = w.clone().requires_grad_(), bc = b.clone().requires_grad_();
    Tensor xg = gpu(x).requires_grad_(), wg = gpu(w).requires_grad_(), bg = gpu(b).requires_grad_();
    Tensor yc, yg;
    {
      autocast::AutocastGuard amp(DType::BF16, autocast);
      yc = fp8_linear(xc, wc, bc, cpu);
      yg = fp8_linear(xg, wg, bg, dev);
    }
    EXPECT_CLOSE_TO_CPU(yg, yc, autocast ? 1e-2 : 1e-4);
    sum(mul(yc, r_.to(yc.dtype()))).backward();
    sum(mul(yg, gpu(r_).to(yg.dtype()))).backward();
    EXPECT_CLOSE_TO_CPU(xg.grad(), xc.grad(), 1e-5);
    EXPECT_CLOSE_TO_CPU(wg.grad(), wc.grad(), 1e-5);
    EXPECT_CLOSE_TO_CPU(bg.grad(), bc.grad(), autocast ? 1e-2 : 1e-6);
    EXPECT_TRUE(same_bytes(dev.amax, cpu.amax));
  }
}
