#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/gemm_half.h"
#include "backend/cpu/linalg.h"
#include "fasttrain/fasttrain.h"
#include "support/expect_error.h"

using namespace ft;
using test::expect_error;

namespace {

#define SKIP_WITHOUT_AVX512() \
  if (!cpu::gemm_half_available()) GTEST_SKIP() << "CPU lacks AVX-512"

using cpu::HalfFormat;

double half_value(uint16_t bits, HalfFormat f) {
  return f == HalfFormat::F16 ? f16::to_float(bits) : bf16::to_float(bits);
}
uint16_t to_half(double v, HalfFormat f) {
  return f == HalfFormat::F16 ? f16::from_float(float(v)) : bf16::from_float(float(v));
}

// A bf16 or f16 matrix [rows, cols] stored transposed or not, with `gap` elements between
// neighbours along the contiguous dim (gap 2 reads every other element, a layout BLAS cannot
// express).
struct Mat {
  std::vector<uint16_t> data;
  int64_t rs = 0, cs = 0;
  int64_t rows = 0, cols = 0;
  HalfFormat format = HalfFormat::BF16;
  double at(int64_t r, int64_t c) const { return half_value(data[r * rs + c * cs], format); }
};

Mat random_mat(int64_t rows, int64_t cols, bool trans, int64_t gap, Generator& g, HalfFormat format) {
  Mat m;
  m.format = format;
  m.rows = rows;
  m.cols = cols;
  const int64_t inner = trans ? rows : cols, outer = trans ? cols : rows;
  m.data.assign(static_cast<size_t>(std::max<int64_t>(outer * inner * gap, 1)), 0);
  if (trans) {
    m.rs = gap;
    m.cs = inner * gap;
  } else {
    m.rs = inner * gap;
    m.cs = gap;
  }
  std::vector<double> v = randn({rows * cols}, DType::F32, &g).to_vector();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) m.data[r * m.rs + c * m.cs] = to_half(v[r * cols + c], format);
  return m;
}

struct Problem {
  int64_t M, N, K;
  bool ta = false, tb = false;
  int64_t gap = 1;
  bool c_half = false, accumulate = false, bias = false;
  cpu::GemmHalfKernel kernel = cpu::GemmHalfKernel::Auto;
  HalfFormat format = HalfFormat::BF16;
};

const cpu::GemmHalfKernel kKernels[] = {cpu::GemmHalfKernel::Fma, cpu::GemmHalfKernel::Dot};

// Runs gemm_half (skipped for a kernel this CPU cannot run) and compares every element with an
// f64 reference from the same 16-bit inputs. f32 accumulation of K products errs by at most about
// K ulps of sum |a b|; a 16-bit output adds half an ulp (2^-9 relative for bf16, 2^-11 for f16).
void check(const Problem& p, Generator& g) {
  SCOPED_TRACE(::testing::Message() << "M=" << p.M << " N=" << p.N << " K=" << p.K << " ta=" << p.ta << " tb=" << p.tb
                                    << " gap=" << p.gap << " bf16out=" << p.c_half << " acc=" << p.accumulate
                                    << " bias=" << p.bias << " kernel=" << cpu::gemm_half_kernel_name(p.kernel)
                                    << " f16=" << (p.format == HalfFormat::F16));
  if (!cpu::gemm_half_available(p.kernel)) return;
  Mat a = random_mat(p.M, p.K, p.ta, p.gap, g, p.format), b = random_mat(p.K, p.N, p.tb, p.gap, g, p.format);
  Mat bias = random_mat(1, p.N, false, 1, g, p.format);
  const int64_t ldc = p.N + 3;  // a padded output checks that ldc is honoured
  std::vector<double> init = randn({std::max<int64_t>(p.M * ldc, 1)}, DType::F32, &g).to_vector();
  std::vector<float> c32(init.size());
  std::vector<uint16_t> c16(init.size());
  for (size_t i = 0; i < init.size(); ++i) {
    c16[i] = to_half(init[i], p.format);
    c32[i] = p.c_half ? float(half_value(c16[i], p.format)) : float(init[i]);
  }
  cpu::GemmHalfArgs args;
  args.M = p.M;
  args.N = p.N;
  args.K = p.K;
  args.a = a.data.data();
  args.a_rs = a.rs;
  args.a_cs = a.cs;
  args.b = b.data.data();
  args.b_rs = b.rs;
  args.b_cs = b.cs;
  args.c = p.c_half ? static_cast<void*>(c16.data()) : static_cast<void*>(c32.data());
  args.ldc = ldc;
  args.c_half = p.c_half;
  args.accumulate = p.accumulate;
  args.bias = p.bias ? bias.data.data() : nullptr;
  args.kernel = p.kernel;
  args.format = p.format;
  cpu::gemm_half(args);
  for (int64_t m = 0; m < p.M; ++m) {
    for (int64_t n = 0; n < ldc; ++n) {
      const size_t i = static_cast<size_t>(m * ldc + n);
      const double got = p.c_half ? half_value(c16[i], p.format) : c32[i];
      const double old = p.c_half ? half_value(to_half(init[i], p.format), p.format) : float(init[i]);
      if (n >= p.N) {  // padding between rows is untouched
        ASSERT_EQ(got, old) << "padding at " << m << ", " << n;
        continue;
      }
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < p.K; ++k) {
        ref += a.at(m, k) * b.at(k, n);
        mag += std::abs(a.at(m, k) * b.at(k, n));
      }
      if (p.bias) ref += bias.at(0, n), mag += std::abs(bias.at(0, n));
      if (p.accumulate) ref += old, mag += std::abs(old);
      double tol = (p.K + 2) * std::ldexp(1.0, -24) * mag + 1e-30;
      if (p.c_half) tol += std::ldexp(1.0, p.format == HalfFormat::F16 ? -10 : -8) * std::abs(ref);
      ASSERT_NEAR(got, ref, tol) << "at " << m << ", " << n;
    }
  }
}

}  // namespace

TEST(GemmHalf, EdgeSizesAllTransposes) {
  SKIP_WITHOUT_AVX512();
  Generator g(1);
  const int64_t sizes[] = {1, 15, 16, 17, 31, 33};
  for (int64_t M : sizes)
    for (int64_t N : sizes)
      for (int64_t K : {int64_t(1), int64_t(2), int64_t(17), int64_t(32)})
        for (int t = 0; t < 4; ++t)
          for (auto kern : kKernels) check({M, N, K, bool(t & 1), bool(t & 2), 1, false, false, false, kern}, g);
}

TEST(GemmHalf, LargerShapesOutputsAndEpilogues) {
  SKIP_WITHOUT_AVX512();
  Generator g(2);
  for (auto kern : kKernels) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      check({257, 255, 33, ta, tb, 1, false, false, false, kern}, g);
      check({29, 40, 600, ta, tb, 1, true, false, false, kern}, g);   // several K blocks
      check({113, 97, 257, ta, tb, 2, false, true, false, kern}, g);  // every other element, accumulate
      check({130, 65, 64, ta, tb, 1, true, true, false, kern}, g);    // bf16 accumulate
      check({15, 33, 31, ta, tb, 2, true, false, true, kern}, g);     // bias
      check({127, 129, 515, ta, tb, 1, false, false, true, kern}, g);
    }
    check({7, 9, 0, false, false, 1, false, false, true, kern}, g);  // empty sum: bias only
    check({7, 9, 0, false, false, 1, true, true, false, kern}, g);   // empty sum: unchanged
  }
}

// f16 operands take the f32-FMA kernel with F16C widening and vcvtps2ph rounding.
TEST(GemmHalf, F16OperandsEdgeSizesOutputsAndEpilogues) {
  SKIP_WITHOUT_AVX512();
  Generator g(5);
  const auto fma = cpu::GemmHalfKernel::Fma;
  const auto f16 = HalfFormat::F16;
  for (int64_t M : {1, 15, 17, 33})
    for (int64_t N : {1, 16, 31, 33})
      for (int64_t K : {1, 2, 17})
        for (int t = 0; t < 4; ++t) check({M, N, K, bool(t & 1), bool(t & 2), 1, false, false, false, fma, f16}, g);
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    check({257, 255, 33, ta, tb, 1, false, false, false, fma, f16}, g);
    check({29, 40, 600, ta, tb, 1, true, false, false, fma, f16}, g);   // several K blocks, f16 out
    check({113, 97, 257, ta, tb, 2, false, true, false, fma, f16}, g);  // every other element, accumulate
    check({130, 65, 64, ta, tb, 1, true, true, false, fma, f16}, g);    // f16 accumulate
    check({15, 33, 31, ta, tb, 2, true, false, true, fma, f16}, g);     // bias
  }
  check({7, 9, 0, false, false, 1, false, false, true, fma, f16}, g);  // empty sum: bias only
}

// The packing widens f16 with integer arithmetic of its own; 1 x B must give back every half
// exactly: zeros, subnormals, normals, infinities (NaNs stay NaN).
TEST(GemmHalf, F16WideningIsExactForEveryHalf) {
  SKIP_WITHOUT_AVX512();
  std::vector<uint16_t> one{f16::from_float(1.0f)}, halves(65536);
  for (uint32_t h = 0; h < 65536; ++h) halves[h] = static_cast<uint16_t>(h);
  std::vector<float> c(65536);
  for (bool transposed : {false, true}) {
    cpu::GemmHalfArgs g;
    g.M = 1, g.N = 65536, g.K = 1;
    g.a = one.data(), g.a_rs = 1, g.a_cs = 1;
    g.b = halves.data(), g.b_rs = transposed ? 1 : 65536, g.b_cs = 1;
    g.c = c.data(), g.ldc = 65536;
    g.format = HalfFormat::F16;
    cpu::gemm_half(g);
    for (uint32_t h = 0; h < 65536; ++h) {
      const float want = f16::to_float_software(static_cast<uint16_t>(h));
      if (std::isnan(want))
        ASSERT_TRUE(std::isnan(c[h])) << std::hex << h;
      else
        ASSERT_EQ(c[h], want) << std::hex << h << (transposed ? " transposed" : "");
    }
  }
}

TEST(GemmHalf, IndependentOfThreadCount) {
  SKIP_WITHOUT_AVX512();
  Generator g(3);
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = randn({300, 257}, dt, &g), b = randn({257, 200}, dt, &g);
    Tensor bias = randn({200}, dt, &g);
    const int saved = get_num_threads();
    std::vector<std::vector<double>> results;
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      Tensor y = empty({300, 200}, dt), z = zeros({200, 257}, dt);
      ASSERT_TRUE(cpu::matmul_gemm_half(a, b, y, false, bias));
      ASSERT_TRUE(cpu::matmul_gemm_half(b.t(), a, z, true));  // a transposed operand, accumulating
      std::vector<double> v = y.to_vector(), w = z.to_vector();
      v.insert(v.end(), w.begin(), w.end());
      results.push_back(v);
    }
    set_num_threads(saved);
    ASSERT_EQ(results[0].size(), results[1].size());
    for (size_t i = 0; i < results[0].size(); ++i) ASSERT_EQ(results[0][i], results[1][i]) << "element " << i;
  }
}

TEST(GemmHalf, MatmulPathMatchesF32PathOnBatches) {
  // Both accumulate in f32 and round once: they differ by at most about one 16-bit rounding.
  SKIP_WITHOUT_AVX512();
  Generator g(4);
  for (DType dt : {DType::BF16, DType::F16}) {
    for (int mode = 0; mode < 3; ++mode) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " mode " << mode);
      Tensor a = randn({2, 3, 40, 70}, dt, &g).transpose(2, 3);      // [2, 3, 70, 40] transposed
      Tensor b = randn({3, 40, 50}, dt, &g).expand({2, 3, 40, 50});  // broadcast batch
      Tensor bias = randn({50}, dt, &g);
      Tensor init = randn({2, 3, 70, 50}, dt, &g);
      Tensor y1 = init.clone(), y2 = init.clone();
      const bool acc = mode == 1;
      const Tensor bs = mode == 2 ? bias : Tensor();
      ASSERT_TRUE(cpu::matmul_gemm_half(a, b, y1, acc, bs));
      cpu::matmul_via_f32(a, b, y2, acc, bs);
      std::vector<double> v1 = y1.to_vector(), v2 = y2.to_vector();
      for (size_t i = 0; i < v1.size(); ++i) ASSERT_NEAR(v1[i], v2[i], 1e-2 * std::abs(v2[i]) + 1e-3) << i;
    }
  }
}

TEST(GemmHalf, DeclinesAliasedOutputs) {
  SKIP_WITHOUT_AVX512();
  Tensor a = ones({2, 4, 3}, DType::BF16), b = ones({2, 3, 5}, DType::BF16);
  Tensor out = zeros({1, 4, 5}, DType::BF16).expand({2, 4, 5});
  EXPECT_FALSE(cpu::matmul_gemm_half(a, b, out, true));
  EXPECT_FALSE(cpu::matmul_gemm_half(a.to(DType::F32), b.to(DType::F32), out.to(DType::F32)));
}

TEST(GemmHalf, Errors) {
  SKIP_WITHOUT_AVX512();
  std::vector<uint16_t> a(16), b(16);
  std::vector<float> c(16);
  cpu::GemmHalfArgs g;
  g.M = 4;
  g.N = 4;
  g.K = 4;
  g.a = a.data();
  g.a_rs = 4;
  g.a_cs = 1;
  g.b = b.data();
  g.b_rs = 4;
  g.b_cs = 1;
  g.c = c.data();
  g.ldc = 3;
  expect_error([&] { cpu::gemm_half(g); }, "gemm_half: expected ldc >= N (4), found 3");
  g.ldc = 4;
  g.M = -1;
  expect_error([&] { cpu::gemm_half(g); }, "gemm_half: expected non-negative sizes, found M=-1 N=4 K=4");
  g.M = 4;
  g.accumulate = true;
  g.bias = a.data();
  expect_error([&] { cpu::gemm_half(g); }, "gemm_half: bias with accumulate is not supported");
  g.accumulate = false;
  g.bias = nullptr;
  g.format = HalfFormat::F16;
  g.kernel = cpu::GemmHalfKernel::Dot;
  if (cpu::gemm_half_available(g.kernel))
    expect_error([&] { cpu::gemm_half(g); }, "gemm_half: the dot kernel takes bf16 operands, found f16");
}
