#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "backend/cpu/gemm_half.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/linalg.h"
#include "backend/cpu/peak_rate.h"
#include "core/switches.h"
#include "fasttrain/fasttrain.h"
#include "support/expect_error.h"
#include "support/gradcheck.h"
#include "support/parity.h"

using namespace ft;
using test::expect_error;
using test::ParityCase;

namespace {

const char* kDtypes[] = {"f32", "f64", "bf16", "f16"};

// Runs fn on the case's inputs a and b and compares the output and both gradients.
void check_pair_case(const std::string& name, Tensor (*fn)(const Tensor&, const Tensor&)) {
  SCOPED_TRACE(name);
  ParityCase c(name);
  if (!c.available()) GTEST_SKIP() << c.skip_reason();
  Tensor a = c.input("a", true), b = c.input("b", true);
  Tensor y = fn(a, b);
  EXPECT_EQ(y.dtype(), c.dtype());
  c.expect_output(y);
  c.backward({y});
  c.expect_grad("a", a);
  c.expect_grad("b", b);
}

Tensor call_matmul(const Tensor& a, const Tensor& b) { return matmul(a, b); }
Tensor call_bmm(const Tensor& a, const Tensor& b) { return bmm(a, b); }
Tensor call_bmm_t(const Tensor& a, const Tensor& b) { return bmm(a, b.transpose(1, 2)); }

void check_linear_case(const std::string& name) {
  SCOPED_TRACE(name);
  ParityCase c(name);
  if (!c.available()) GTEST_SKIP() << c.skip_reason();
  Tensor x = c.input("input", true), w = c.input("weight", true);
  Tensor b = c.has("bias") ? c.input("bias", true) : Tensor();
  Tensor y = linear(x, w, b);
  EXPECT_EQ(y.dtype(), c.dtype());
  c.expect_output(y);
  c.backward({y});
  c.expect_grad("input", x);
  c.expect_grad("weight", w);
  if (b.defined()) c.expect_grad("bias", b);
}

// gelu_mlp against PyTorch's linear, gelu, linear: output and every gradient.
void check_gelu_mlp_case(const std::string& name, GeluApprox approx) {
  SCOPED_TRACE(name);
  ParityCase c(name);
  if (!c.available()) GTEST_SKIP() << c.skip_reason();
  Tensor x = c.input("x", true), w1 = c.input("w1", true), w2 = c.input("w2", true);
  Tensor b1 = c.has("b1") ? c.input("b1", true) : Tensor(), b2 = c.has("b2") ? c.input("b2", true) : Tensor();
  Tensor y = gelu_mlp(x, w1, b1, w2, b2, approx);
  EXPECT_EQ(y.dtype(), c.dtype());
  c.expect_output(y);
  c.backward({y});
  for (const auto& [input, t] :
       {std::pair<const char*, Tensor>{"x", x}, {"w1", w1}, {"w2", w2}, {"b1", b1}, {"b2", b2}})
    if (t.defined()) c.expect_grad(input, t);
}

}  // namespace

TEST(LinalgParity, GeluMlp) {
  for (const char* dt : kDtypes) check_gelu_mlp_case(std::string("gelu_mlp_") + dt, GeluApprox::Tanh);
  check_gelu_mlp_case("gelu_mlp_exact_nobias_f32", GeluApprox::None);
}

TEST(LinalgGradcheck, GeluMlp) {
  Generator g(6);
  auto r = [&](Shape s) { return randn(s, DType::F64, &g).requires_grad_(); };
  for (GeluApprox approx : {GeluApprox::Tanh, GeluApprox::None}) {
    auto mlp = [approx](const std::vector<Tensor>& in) {
      return gelu_mlp(in[0], in[1], in.size() > 3 ? in[2] : Tensor(), in.size() > 3 ? in[3] : in[2],
                      in.size() > 4 ? in[4] : Tensor(), approx);
    };
    EXPECT_GRADCHECK(mlp, {r({2, 3, 4}), r({6, 4}), r({6}), r({5, 6}), r({5})});
    EXPECT_GRADCHECK(mlp, {r({3, 4}), r({6, 4}), r({5, 6})});  // no biases
  }
  // Only some parameters trained: the first layer frozen, then only the first layer's weight.
  const Tensor w1 = randn({6, 4}, DType::F64, &g), b1 = randn({6}, DType::F64, &g);
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) { return gelu_mlp(in[0], w1, b1, in[1], in[2], GeluApprox::Tanh); },
      {r({3, 4}), r({5, 6}), r({5})});
  const Tensor x = randn({3, 4}, DType::F64, &g), w2 = randn({5, 6}, DType::F64, &g);
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) { return gelu_mlp(x, in[0], b1, w2, Tensor(), GeluApprox::Tanh); },
      {r({6, 4})});
}

namespace {

// y and every gradient (x, w1, b1, w2, b2) of gelu_mlp (fused) or of linear, gelu, linear, after
// backward(gy).
std::vector<std::vector<double>> gelu_mlp_outputs(bool fused, const Tensor& x0, const std::vector<Tensor>& p0,
                                                  const Tensor& gy) {
  Tensor x = x0.detach().requires_grad_();
  std::vector<Tensor> p;
  for (const Tensor& t : p0) p.push_back(t.detach().requires_grad_());
  Tensor y = fused ? gelu_mlp(x, p[0], p[1], p[2], p[3], GeluApprox::Tanh)
                   : linear(gelu(linear(x, p[0], p[1]), GeluApprox::Tanh), p[2], p[3]);
  EXPECT_EQ(y.shape(), gy.shape());
  y.backward(gy);
  std::vector<std::vector<double>> out = {y.to_vector(), x.grad().to_vector()};
  for (const Tensor& t : p) out.push_back(t.grad().to_vector());
  return out;
}

}  // namespace

// On the CPU gelu_mlp runs the very kernels of linear, gelu, linear: the same bits, forward and
// backward (what the fused CUDA products are measured against in tests/cuda).
TEST(Linalg, GeluMlpIsLinearGeluLinearBitwise) {
  Generator g(7);
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x0 = randn({3, 11, 32}, DType::F32, &g).to(dt), gy = randn({3, 11, 16}, DType::F32, &g).to(dt);
    const std::vector<Tensor> p0 = {
        mul(randn({64, 32}, DType::F32, &g), 0.2).to(dt), randn({64}, DType::F32, &g).to(dt),
        mul(randn({16, 64}, DType::F32, &g), 0.2).to(dt), randn({16}, DType::F32, &g).to(dt)};
    EXPECT_EQ(gelu_mlp_outputs(true, x0, p0, gy), gelu_mlp_outputs(false, x0, p0, gy));
  }
}

// Empty shapes: no rows (the outputs and weight gradients are empty or zero) and no input
// features (the output is b2 + gelu(b1) W2^T per row), as linear, gelu, linear give them.
TEST(Linalg, GeluMlpEmptyShapesMatchTheThreeOps) {
  Generator g(8);
  for (const Shape& xs : {Shape{4, 0}, Shape{0, 8}, Shape{2, 0, 8}, Shape{3, 2, 0}}) {
    SCOPED_TRACE(xs.str());
    const int64_t in = xs.back();
    const Tensor x0 = randn(xs, DType::F32, &g);
    const std::vector<Tensor> p0 = {randn({6, in}, DType::F32, &g), randn({6}, DType::F32, &g),
                                    randn({5, 6}, DType::F32, &g), randn({5}, DType::F32, &g)};
    Shape ys = xs;
    ys[ys.size() - 1] = 5;
    const Tensor gy = randn(ys, DType::F32, &g);
    EXPECT_EQ(gelu_mlp_outputs(true, x0, p0, gy), gelu_mlp_outputs(false, x0, p0, gy));
  }
}

TEST(LinalgParity, MatmulRankCases) {
  for (const char* dt : kDtypes)
    for (const char* name : {"mm", "dot", "mv", "vm", "3d_2d", "2d_3d", "3d_1d", "1d_3d", "bcast", "bcast_both",
                             "mm_transposed", "bcast_transposed", "batched_strided"})
      check_pair_case(std::string("matmul_") + name + "_" + dt, call_matmul);
  check_pair_case("matmul_longk_bf16", call_matmul);
}

TEST(LinalgParity, Bmm) {
  for (const char* dt : kDtypes) {
    check_pair_case(std::string("bmm_") + dt, call_bmm);
    check_pair_case(std::string("bmm_transposed_") + dt, call_bmm_t);
  }
}

TEST(LinalgParity, Linear) {
  for (const char* dt : kDtypes)
    for (const char* v : {"bias", "nobias", "transposed", "1d"})
      check_linear_case(std::string("linear_") + v + "_" + dt);
  check_linear_case("linear_longk_bf16");
  check_linear_case("linear_wide_bf16");
}

TEST(LinalgGradcheck, Matmul) {
  Generator g(3);
  auto r = [&](Shape s) { return randn(s, DType::F64, &g).requires_grad_(); };
  auto fn = [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); };
  const std::vector<std::pair<Shape, Shape>> shapes = {{{4, 3}, {3, 2}},
                                                       {{3}, {3}},
                                                       {{4, 3}, {3}},
                                                       {{3}, {3, 2}},
                                                       {{2, 4, 3}, {3, 2}},
                                                       {{4, 3}, {2, 3, 2}},
                                                       {{2, 1, 4, 3}, {3, 3, 2}},
                                                       {{3}, {2, 3, 2}},
                                                       {{2, 4, 3}, {3}}};
  for (const auto& [sa, sb] : shapes) {
    SCOPED_TRACE(sa.str() + " x " + sb.str());
    EXPECT_GRADCHECK(fn, {r(sa), r(sb)});
  }
  // Non-contiguous operands: a transposed (Trans flag), b with every other column (copied).
  Tensor at = r({3, 4}).t().detach().requires_grad_();
  Tensor bs = r({3, 4}).slice(1, 0, 4, 2).detach().requires_grad_();
  EXPECT_GRADCHECK(fn, {at, bs});
  // Only one operand requiring grad.
  EXPECT_GRADCHECK(fn, {r({2, 3, 4}), randn({4, 2}, DType::F64, &g)});
}

TEST(LinalgGradcheck, BmmAndLinear) {
  Generator g(5);
  auto r = [&](Shape s) { return randn(s, DType::F64, &g).requires_grad_(); };
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return bmm(in[0], in[1]); }, {r({2, 3, 4}), r({2, 4, 5})});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return bmm(in[0], in[1].transpose(1, 2)); },
                   {r({2, 3, 4}), r({2, 5, 4})});
  auto lin = [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in.size() > 2 ? in[2] : Tensor()); };
  EXPECT_GRADCHECK(lin, {r({2, 3, 5}), r({4, 5}), r({4})});
  EXPECT_GRADCHECK(lin, {r({2, 3, 5}), r({4, 5})});
  EXPECT_GRADCHECK(lin, {r({5}), r({4, 5}), r({4})});
  // Only the bias, or only the weight, trained (linear_weight_grad with gb undefined; the bias
  // sums alone).
  EXPECT_GRADCHECK(lin, {r({2, 3, 5}), randn({4, 5}, DType::F64, &g), r({4})});
  EXPECT_GRADCHECK(lin, {r({2, 3, 5}), r({4, 5}), randn({4}, DType::F64, &g)});
  EXPECT_GRADCHECK(lin, {randn({2, 3, 5}, DType::F64, &g), randn({4, 5}, DType::F64, &g), r({4})});
  // Non-contiguous input (leading dims not viewable as rows) and a transposed weight.
  Tensor xt = r({5, 3, 2}).permute({2, 1, 0}).detach().requires_grad_();
  Tensor wt = r({5, 4}).t().detach().requires_grad_();
  EXPECT_GRADCHECK(lin, {xt, wt, r({4})});
}

TEST(Linalg, ValuesAgainstNaiveProduct) {
  // Broadcast batch dims with both operands partly broadcast, against a per-element sum.
  Generator g(9);
  Tensor a = randn({2, 1, 3, 4}, DType::F64, &g), b = randn({3, 4, 5}, DType::F64, &g);
  Tensor y = matmul(a, b);
  ASSERT_EQ(y.shape(), Shape({2, 3, 3, 5}));
  std::vector<double> av = a.to_vector(), bv = b.to_vector(), yv = y.to_vector();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int m = 0; m < 3; ++m)
        for (int n = 0; n < 5; ++n) {
          double s = 0;
          for (int k = 0; k < 4; ++k) s += av[(i * 3 + m) * 4 + k] * bv[(j * 4 + k) * 5 + n];
          EXPECT_NEAR(yv[((i * 3 + j) * 3 + m) * 5 + n], s, 1e-12);
        }
}

TEST(Linalg, ManySmallBatchesRunInParallelCorrectly) {
  Generator g(1);
  Tensor a = randn({64, 8, 6}, {}, &g), b = randn({64, 6, 7}, {}, &g);
  Tensor y = bmm(a, b);
  for (int i : {0, 17, 63}) {
    Tensor yi = matmul(a.select(0, i), b.select(0, i));
    std::vector<double> got = y.select(0, i).to_vector(), want = yi.to_vector();
    for (size_t k = 0; k < got.size(); ++k) EXPECT_NEAR(got[k], want[k], 1e-5);
  }
}

TEST(Linalg, EmptyInnerDimension) {
  Tensor y = matmul(zeros({3, 0}), zeros({0, 4}));
  EXPECT_EQ(y.shape(), Shape({3, 4}));
  for (double v : y.to_vector()) EXPECT_EQ(v, 0.0);
  Tensor z = linear(zeros({2, 0}), zeros({3, 0}), from_vector({1, 2, 3}, {3}));
  EXPECT_EQ(z.to_vector(), (std::vector<double>{1, 2, 3, 1, 2, 3}));
}

TEST(Linalg, Bf16OneDnnMatchesF32Fallback) {
  // The oneDNN path and the convert-to-f32 sgemm path accumulate in f32; the results may differ
  // by the final rounding only.
  Generator g(2);
  Tensor a = randn({3, 16, 64}, DType::BF16, &g), b = randn({64, 24}, DType::BF16, &g).t().contiguous().t();
  Tensor bias = randn({24}, DType::BF16, &g);
  Tensor be = b.expand({3, 64, 24});
  Tensor y1 = empty({3, 16, 24}, DType::BF16), y2 = empty({3, 16, 24}, DType::BF16);
  ASSERT_TRUE(cpu::matmul_onednn(a, be, y1, false, bias));
  cpu::matmul_via_f32(a, be, y2, false, bias);
  std::vector<double> v1 = y1.to_vector(), v2 = y2.to_vector();
  for (size_t i = 0; i < v1.size(); ++i) EXPECT_NEAR(v1[i], v2[i], 1e-2 * std::abs(v2[i]) + 1e-2);
}

TEST(Linalg, HalfGemmPathChoice) {
  using cpu::HalfGemmPath;
  // FT_BF16_GEMM forces either path on any machine; auto takes oneDNN where bf16 products run
  // faster than f32 FMA: AMX, or a vdpbf16ps that outruns vfmadd231ps.
  using S = switches::HalfGemm;
  EXPECT_EQ(cpu::choose_half_gemm_path(S::Onednn, false, false), HalfGemmPath::Onednn);
  EXPECT_EQ(cpu::choose_half_gemm_path(S::Packed, true, true), HalfGemmPath::Packed);
  EXPECT_EQ(cpu::choose_half_gemm_path(S::Auto, true, false), HalfGemmPath::Onednn);
  EXPECT_EQ(cpu::choose_half_gemm_path(S::Auto, false, true), HalfGemmPath::Onednn);
  EXPECT_EQ(cpu::choose_half_gemm_path(S::Auto, false, false), HalfGemmPath::Packed);
  // (The variable's names and refusal: tests/test_switches.cpp.) A forced path is the process's
  // path, set by the variable (CTest runs this suite with each one) or in-process.
  const S setting = switches::half_gemm.get();
  if (setting != S::Auto)
    EXPECT_EQ(cpu::half_gemm_path(), setting == S::Onednn ? HalfGemmPath::Onednn : HalfGemmPath::Packed);
  for (const S forced : {S::Onednn, S::Packed}) {
    switches::Scoped guard(switches::half_gemm, forced);
    EXPECT_EQ(cpu::half_gemm_path(), forced == S::Onednn ? HalfGemmPath::Onednn : HalfGemmPath::Packed);
  }
  // auto never takes oneDNN where its ISA (ONEDNN_MAX_CPU_ISA lowers it) has no bf16 products.
  switches::Scoped automatic(switches::half_gemm, S::Auto);
  if (!cpu::onednn_isa_has_avx512_bf16() && !cpu::onednn_isa_has_amx())
    EXPECT_EQ(cpu::half_gemm_path(), HalfGemmPath::Packed);
}

TEST(Linalg, PeakRatesAreMeasuredAndCached) {
  const cpu::PeakRates& r = cpu::measured_peak_rates(1);
  EXPECT_EQ(&r, &cpu::measured_peak_rates(1));
  EXPECT_EQ(r.threads, 1);
  if (cpu::detected_cpu_isa() >= cpu::CpuIsa::Avx512) EXPECT_GT(r.fp32_gflops, 1.0);
  if (cpu::detected_cpu_isa() >= cpu::CpuIsa::Avx512Bf16) EXPECT_GT(r.bf16_dot_gflops, 1.0);
  if (cpu::detected_cpu_isa() >= cpu::CpuIsa::Amx) EXPECT_GT(r.amx_bf16_gflops, 1.0);
  EXPECT_GE(r.bf16_gflops(), r.fp32_gflops);
  const std::string isa = cpu::cpu_isa_flags();
  EXPECT_FALSE(isa.empty());
  if (cpu::detected_cpu_isa() >= cpu::CpuIsa::Avx512Bf16) EXPECT_NE(isa.find("avx512_bf16"), std::string::npos) << isa;

  // A second measurement keeps the larger of each rate, in the same cached record.
  const cpu::PeakRates first = r;
  const cpu::PeakRates& again = cpu::remeasure_peak_rates(1);
  EXPECT_EQ(&again, &r);
  EXPECT_GE(again.fp32_gflops, first.fp32_gflops);
  EXPECT_GE(again.bf16_dot_gflops, first.bf16_dot_gflops);
  EXPECT_GE(again.amx_bf16_gflops, first.amx_bf16_gflops);
  if (cpu::detected_cpu_isa() >= cpu::CpuIsa::Avx512)
    EXPECT_EQ(profiler::measured_peak_flops(1, profiler::PeakOperands::F32).gflops, again.fp32_gflops);
}

TEST(Linalg, Bf16PathsAgreeOnLinearLayouts) {
  // The products of a linear layer's step at a gpt-mini-like shape (rows x in -> out), in the
  // layouts linear uses: forward x W^T + bias, input gradient dY W, weight gradient dY^T X (A
  // transposed) and an accumulating product. oneDNN and the packed GEMM both sum in f32 and round
  // once, so they differ by at most one bf16 rounding step; the f32 product of the same bf16
  // inputs is the reference for both.
  if (!cpu::gemm_half_available()) GTEST_SKIP() << "the packed GEMM needs AVX-512";
  Generator g(11);
  const int64_t R = 96, in = 80, out = 144;
  Tensor x = randn({R, in}, DType::BF16, &g), w = randn({out, in}, DType::BF16, &g);
  Tensor dy = randn({R, out}, DType::BF16, &g), bias = randn({out}, DType::BF16, &g);
  Tensor c0 = randn({R, out}, DType::BF16, &g);
  struct Case {
    const char* name;
    Tensor a, b, bias;
    bool accumulate;
  };
  const Case cases[] = {{"forward", x, w.t(), bias, false},
                        {"input grad", dy, w, Tensor(), false},
                        {"weight grad", dy.t(), x, Tensor(), false},
                        {"accumulate", x, w.t(), Tensor(), true},
                        {"batched", x.reshape({2, R / 2, in}), w.t().expand({2, in, out}), bias, false}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int nd = c.a.dim();
    Shape s = c.a.shape();
    s[nd - 1] = c.b.size(nd - 1);
    Tensor y1 = empty(s, DType::BF16), y2 = empty(s, DType::BF16), ref32 = empty(s, DType::F32);
    if (c.accumulate) {
      y1.copy_(c0);
      y2.copy_(c0);
    }
    ASSERT_TRUE(cpu::matmul_onednn(c.a, c.b, y1, c.accumulate, c.bias));
    ASSERT_TRUE(cpu::matmul_gemm_half(c.a, c.b, y2, c.accumulate, c.bias));
    cpu::matmul(c.a.to(DType::F32), c.b.to(DType::F32), ref32, false,
                c.bias.defined() ? c.bias.to(DType::F32) : Tensor());
    if (c.accumulate) ref32 = ref32 + c0.to(DType::F32);
    std::vector<double> v1 = y1.to_vector(), v2 = y2.to_vector(), r = ref32.to_vector();
    for (size_t i = 0; i < r.size(); ++i) {
      const double tol = 8e-3 * std::abs(r[i]) + 1e-3;  // one bf16 rounding is 2^-8 relative
      ASSERT_NEAR(v1[i], r[i], tol) << "oneDNN, element " << i;
      ASSERT_NEAR(v2[i], r[i], tol) << "packed, element " << i;
    }
  }
}

TEST(Linalg, F32PathsAgreeAndDoNotDependOnTheThreadCount) {
  // oneDNN's f32 matmul against OpenBLAS's sgemm in the layouts linear and attention use, with a
  // long inner dimension (the shape where a library might split K across threads and change the
  // order of the sum), an accumulating product and a broadcast operand. Both sum in f32 in their
  // own order: close, not equal. oneDNN gives the same bits on 1 and 2 threads (so does sgemm on
  // its AVX-512 kernels).
  Generator g(5);
  const int64_t R = 96, in = 80, out = 144;
  Tensor x = randn({R, in}, DType::F32, &g), w = randn({out, in}, DType::F32, &g);
  Tensor dy = randn({R, out}, DType::F32, &g), bias = randn({out}, DType::F32, &g);
  Tensor c0 = randn({R, out}, DType::F32, &g);
  Tensor lk_a = randn({16, 8192}, DType::F32, &g), lk_b = randn({8192, 24}, DType::F32, &g);
  struct Case {
    const char* name;
    Tensor a, b, bias;
    bool accumulate;
  };
  const Case cases[] = {
      {"forward", x, w.t(), bias, false},
      {"input grad", dy, w, Tensor(), false},
      {"weight grad", dy.t(), x, Tensor(), false},
      {"accumulate", x, w.t(), Tensor(), true},
      {"batched, broadcast weight", x.reshape({2, R / 2, in}), w.t().expand({2, in, out}), bias, false},
      {"long inner dimension", lk_a, lk_b, Tensor(), false}};
  const int threads = get_num_threads();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int nd = c.a.dim();
    Shape s = c.a.shape();
    s[nd - 1] = c.b.size(nd - 1);
    auto product = [&](bool onednn, int n) {
      set_num_threads(n);
      Tensor y = c.accumulate ? c0.clone() : empty(s, DType::F32);
      if (onednn)
        EXPECT_TRUE(cpu::matmul_onednn(c.a, c.b, y, c.accumulate, c.bias));
      else
        cpu::matmul_via_f32(c.a, c.b, y, c.accumulate, c.bias);  // f32 in, f32 out: sgemm itself
      return y.to_vector();
    };
    const std::vector<double> d1 = product(true, 1), d2 = product(true, 2), b1 = product(false, 1),
                              b2 = product(false, 2);
    EXPECT_EQ(d1, d2) << "oneDNN's f32 product depends on the thread count";
    // OpenBLAS's AVX-512 kernels split the output only; its AVX2 ("Haswell") kernels give other
    // bits on 2 threads than on 1 (seen with OPENBLAS_CORETYPE=Haswell on an AVX-512 CPU).
    if (cpu::blas_has_avx512_kernels()) EXPECT_EQ(b1, b2) << "sgemm depends on the thread count";
    double scale = 0;
    for (double v : b1) scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < b1.size(); ++i) ASSERT_NEAR(d1[i], b1[i], 1e-5 * scale) << "element " << i;
  }
  set_num_threads(threads);
}

TEST(Linalg, CpuVendorIsTheModelNamesVendor) {
  // The f32 GEMM rule reads the vendor as a type; the figures carry it in cpu_model_name().
  const std::string name = cpu::cpu_model_name();
  const cpu::CpuVendor v = cpu::cpu_vendor();
  EXPECT_EQ(v == cpu::CpuVendor::Amd, name.starts_with("AuthenticAMD ")) << name;
  EXPECT_EQ(v == cpu::CpuVendor::Intel, name.starts_with("GenuineIntel ")) << name;
}

TEST(Linalg, F32GemmPathChoice) {
  using cpu::F32GemmPath;
  using S = switches::F32Gemm;
  const cpu::GemmShape narrow{1, 2048, 256, 1024}, wide{1, 1024, 3072, 768}, long_sum{1, 1024, 768, 3072},
      tall{1, 4096, 768, 1024}, batched{8, 256, 256, 64};
  using M = cpu::F32GemmMachine;
  // Forced paths, whatever the shape.
  EXPECT_EQ(cpu::choose_f32_gemm_path(S::Onednn, M{true, false, false}, wide), F32GemmPath::Onednn);
  EXPECT_EQ(cpu::choose_f32_gemm_path(S::Blas, M{false, true, true}, narrow), F32GemmPath::Blas);
  // OpenBLAS below AVX-512 and oneDNN on it: oneDNN for every shape; oneDNN without AVX-512: BLAS.
  for (const bool amd : {false, true})
    for (const cpu::GemmShape& s : {narrow, wide, long_sum, tall, batched}) {
      EXPECT_EQ(cpu::choose_f32_gemm_path(S::Auto, M{false, true, amd}, s), F32GemmPath::Onednn);
      EXPECT_EQ(cpu::choose_f32_gemm_path(S::Auto, M{false, false, amd}, s), F32GemmPath::Blas);
      EXPECT_EQ(cpu::choose_f32_gemm_path(S::Auto, M{true, false, amd}, s), F32GemmPath::Blas);
    }
  // Both on AVX-512, Intel: oneDNN inside the measured boundary (N <= 1024, K <= 2048, M <= 2048,
  // one product), BLAS outside it on each side.
  EXPECT_EQ(cpu::choose_f32_gemm_path(S::Auto, M{true, true, false}, narrow), F32GemmPath::Onednn);
  EXPECT_EQ(cpu::choose_f32_gemm_path(S::Auto, M{true, true, false}, {1, 2048, 1024, 2048}), F32GemmPath::Onednn);
  for (const cpu::GemmShape& s : {wide, long_sum, tall, batched})
    EXPECT_EQ(cpu::choose_f32_gemm_path(S::Auto, M{true, true, false}, s), F32GemmPath::Blas);
  // AMD: oneDNN for every single product, BLAS for batched ones.
  for (const cpu::GemmShape& s : {narrow, wide, long_sum, tall})
    EXPECT_EQ(cpu::choose_f32_gemm_path(S::Auto, M{true, true, true}, s), F32GemmPath::Onednn);
  EXPECT_EQ(cpu::choose_f32_gemm_path(S::Auto, M{true, true, true}, batched), F32GemmPath::Blas);
  // A forced path is the process's path (the variable's names: tests/test_switches.cpp).
  for (const S forced : {S::Onednn, S::Blas}) {
    switches::Scoped guard(switches::f32_gemm, forced);
    for (const cpu::GemmShape& s : {narrow, wide})
      EXPECT_EQ(cpu::f32_gemm_path(s), forced == S::Onednn ? F32GemmPath::Onednn : F32GemmPath::Blas);
  }
}

TEST(Linalg, Errors) {
  expect_error([] { matmul(zeros({4, 3}), zeros({5, 2})); }, "matmul: inner dimensions differ: [4, 3] x [5, 2]");
  expect_error([] { matmul(zeros({3}), zeros({4})); }, "matmul: inner dimensions differ: [3] x [4]");
  expect_error([] { matmul(zeros({}), zeros({4})); }, "matmul: both operands need at least 1 dimension");
  expect_error([] { matmul(zeros({2, 3, 4}), zeros({3, 4, 5})); }, "matmul");
  expect_error(
      [] {
        matmul(zeros({2, 3}), zeros({3, 2}, DType::F64));
      },
      "matmul: dtype mismatch, first operand is f32 but second operand is f64");
  expect_error(
      [] {
        matmul(zeros({2, 3}, DType::I64), zeros({3, 2}, DType::I64));
      },
      "matmul: first operand must be a floating-point tensor, found i64");
  expect_error([] { bmm(zeros({3, 4}), zeros({4, 5})); }, "bmm: expected two 3-d tensors");
  expect_error([] { bmm(zeros({2, 3, 4}), zeros({3, 4, 5})); }, "bmm: batch sizes differ: [2, 3, 4] x [3, 4, 5]");
  expect_error([] { bmm(zeros({2, 3, 4}), zeros({2, 5, 5})); }, "bmm: inner dimensions differ");
  expect_error([] { linear(zeros({2, 3}), zeros({4, 3}, DType::BF16)); }, "linear: weight is bf16 but input is f32");
  expect_error(
      [] {
        linear(zeros({2, 3}), zeros({4, 5}));
      },
      "linear: input has 3 features (last dim of [2, 3]), weight [4, 5] expects 5");
  expect_error([] { linear(zeros({2, 3}), zeros({3})); }, "linear: weight must be 2-d [out, in], found shape [3]");
  expect_error(
      [] {
        gelu_mlp(zeros({2, 3}), zeros({4, 3}), Tensor(), zeros({5, 6}), Tensor());
      },
      "gelu_mlp: the hidden activations have 4 features (the first weight's rows), second weight [5, 6] expects 6");
  expect_error(
      [] {
        gelu_mlp(zeros({2, 3}), zeros({4, 2}), Tensor(), zeros({5, 4}), Tensor());
      },
      "gelu_mlp: first input has 3 features");
  expect_error(
      [] {
        gelu_mlp(zeros({2, 3}), zeros({4, 3}), Tensor(), zeros({5, 4}), zeros({4}));
      },
      "gelu_mlp: second bias has shape [4], expected [5]");
  expect_error([] { linear(zeros({2, 3}), zeros({4, 3}), zeros({5})); }, "linear: bias has shape [5], expected [4]");
  expect_error(
      [] {
        linear(zeros({2, 3}), zeros({4, 3}), zeros({4}, DType::F64));
      },
      "linear: bias is f64 but input is f32");
}
