// CUDA elementwise kernels (src/backend/cuda/elementwise.cu, copy.cu, random_fill.cu, dropout.cu)
// against the CPU backend: copy with dtype conversion, fill, every unary op of the list and its
// backward, binary ops with broadcasting and their gradients, where, clamp, in-place add, the
// random fills and dropout.
// Each test runs the public op on CPU inputs and on the same inputs moved to the GPU, over odd
// sizes, empty tensors and non-contiguous or misaligned views (which take the strided kernel).
// Conversions, fills, selections, integer math, random fills and dropout are compared bit for
// bit; floating math by norm (libm and the fast CPU exp differ from CUDA's in the last bits).
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "backend/elementwise_math.h"
#include "fasttrain/fasttrain.h"
#include "ops/unary.h"
#include "support/cuda_compare.h"
#include "support/require_gpu.h"

using namespace ft;
using ft::testing::gpu;

namespace {

const DType kFloats[] = {DType::F32, DType::BF16, DType::F16};

double tol(DType dt) {
  switch (dt) {
    case DType::F64: return 1e-12;
    case DType::F32: return 1e-5;
    default: return 1e-2;
  }
}

// Bit-equality with the CPU result (values compared as f64, which every dtype converts to exactly).
void expect_same(const Tensor& got, const Tensor& want) {
  ASSERT_TRUE(got.defined() && want.defined());
  ASSERT_TRUE(got.device().is_cuda()) << "result is on " << got.device().str();
  ASSERT_EQ(got.dtype(), want.dtype()) << dtype_name(got.dtype()) << " vs " << dtype_name(want.dtype());
  ASSERT_EQ(got.shape().str(), want.shape().str());
  EXPECT_EQ(got.to(Device::cpu()).to_vector(), want.to_vector());
}

// Floating results by norm, integer ones bit for bit.
void expect_match(const Tensor& got, const Tensor& want, DType dt) {
  if (is_integral(dt)) {
    expect_same(got, want);
  } else {
    EXPECT_CLOSE_TO_CPU(got, want, tol(dt));
  }
}

// One input layout: the same values as a CPU view and as the same view of a GPU copy.
struct Layout {
  std::string name;
  Tensor cpu, cuda;
};

// Odd sizes (one element, under a vector, a large odd count), empty tensors, a transpose, a
// stepped slice, a view one element into its storage (dense but not 16-byte aligned) and a
// permuted 4-d tensor. `make` draws a contiguous CPU tensor of the given shape.
template <class Make>
std::vector<Layout> layouts(Make make, bool large = true) {
  std::vector<Layout> out;
  std::vector<int64_t> sizes = {1, 7, 1000};
  if (large) sizes.push_back(1000003);
  for (int64_t n : sizes) {
    Tensor c = make(Shape{n});
    out.push_back({"n=" + std::to_string(n), c, gpu(c)});
  }
  for (Shape s : {Shape{0}, Shape{3, 0}}) {
    Tensor c = make(s);
    out.push_back({"empty " + s.str(), c, gpu(c)});
  }
  {
    Tensor c = make(Shape{37, 29});
    out.push_back({"transposed", c.t(), gpu(c).t()});
  }
  {
    Tensor c = make(Shape{1000});
    out.push_back({"step 3", c.slice(0, 1, 1000, 3), gpu(c).slice(0, 1, 1000, 3)});
  }
  {
    Tensor c = make(Shape{1001});
    out.push_back({"offset 1", c.narrow(0, 1, 1000), gpu(c).narrow(0, 1, 1000)});
  }
  {
    Tensor c = make(Shape{2, 3, 5, 7});
    out.push_back({"permuted", c.permute({0, 2, 3, 1}), gpu(c).permute({0, 2, 3, 1})});
  }
  return out;
}

// Every unary op of the list in backend/elementwise_math.h, by enumerator.
constexpr int kNumUnary = static_cast<int>(std::size(math::kUnaryInfo));

// The binary ops through their public functions (generated from the list, as test_elementwise does).
using BinaryFn = Tensor (*)(const Tensor&, const Tensor&);
struct BinaryEntry {
  const char* name;
  math::BinaryOp op;
  BinaryFn fn;
};
#define FT_TEST_BINARY(Op, name, ...) \
  BinaryEntry{#name, math::BinaryOp::Op, [](const Tensor& a, const Tensor& b) { return ft::name(a, b); }},
const BinaryEntry kBinaryOps[] = {FT_BINARY_OPS(FT_TEST_BINARY)};
#undef FT_TEST_BINARY

// Operands an op is defined on: pow's base positive, div's divisor away from zero; comparisons,
// maximum and minimum on small integers so that ties occur.
Tensor binary_operand(math::BinaryOp op, int which, const Shape& s, DType dt, Generator& g) {
  if (math::is_comparison(op) || op == math::BinaryOp::Max || op == math::BinaryOp::Min)
    return randint(-3, 4, s, DType::I64, &g).to(dt);
  Tensor t = randn(s, DType::F32, &g);
  if (op == math::BinaryOp::Pow && which == 0) t = add(abs(t), 0.5);
  if (op == math::BinaryOp::Pow && which == 1) t = mul(t, 0.5);
  if (op == math::BinaryOp::Div && which == 1) t = add(abs(t), 0.5);
  return t.to(dt);
}

}  // namespace

// --- copy ---

TEST(CudaElementwise, CopyConvertsEveryDtypePairLikeTheCpu) {
  REQUIRE_GPU();
  const DType all[] = {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8, DType::Bool};
  Generator g(1);
  // Non-negative (u8 holds them), half zeros (bool sees both values), fractional (truncation and
  // 16-bit rounding matter); below 256.
  Tensor values = mul(relu(randn({1003}, DType::F64, &g)), 50.0);
  for (DType from : all) {
    const Tensor src = values.to(from);
    for (DType to : all) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + dtype_name(to));
      expect_same(gpu(src).to(to), src.to(to));
    }
  }
}

TEST(CudaElementwise, CopyFloatRoundTripsOddSizesAndViews) {
  REQUIRE_GPU();
  Generator g(2);
  for (DType from : {DType::F32, DType::BF16, DType::F16, DType::F64, DType::I64}) {
    auto make = [&](const Shape& s) { return mul(randn(s, DType::F32, &g), 100.0).to(from); };
    for (const Layout& l : layouts(make)) {
      for (DType to : {DType::F32, DType::BF16, DType::F16}) {
        SCOPED_TRACE(l.name + " " + dtype_name(from) + " -> " + dtype_name(to));
        expect_same(l.cuda.to(to), l.cpu.to(to));
        // same-dtype copies: strided views through the kernel, dense ones as one
        // device-to-device copy (clone)
        expect_same(l.cuda.contiguous(), l.cpu.contiguous());
        expect_same(l.cuda.clone(), l.cpu.clone());
      }
    }
  }
}

TEST(CudaElementwise, PermutedCopiesWithDenseRowsMatchTheCpu) {
  REQUIRE_GPU();
  // The attention heads' layouts: [B, T, H, D] <-> [B, H, T, D], whose rows of D are dense in both
  // (the vector path), next to row lengths that do not fill a 16-byte vector (the element path),
  // a row starting off a vector boundary, and a dtype change on the way.
  Generator g(31);
  for (int64_t D : {64, 12, 8, 3}) {
    for (DType dt : {DType::F32, DType::BF16}) {
      Tensor x = randn({2, 33, 4, D}, DType::F32, &g).to(dt);
      EXPECT_CLOSE_TO_CPU(gpu(x).transpose(1, 2).contiguous(), x.transpose(1, 2).contiguous(), 1e-12);
      Tensor y = randn({2, 4, 33, D}, DType::F32, &g).to(dt);
      Tensor back = empty({2, 33, 4, D}, TensorOptions(dt, Device::cuda(0)));
      back.transpose(1, 2).copy_(gpu(y));
      EXPECT_CLOSE_TO_CPU(back, y.transpose(1, 2).contiguous(), 1e-12);
      Tensor offset = randn({5, 2 * D + 1}, DType::F32, &g).to(dt).narrow(1, 1, 2 * D);
      EXPECT_CLOSE_TO_CPU(gpu(offset.contiguous()), offset.contiguous(), 1e-12);
      EXPECT_CLOSE_TO_CPU(gpu(x).transpose(1, 2).to(DType::F32).contiguous(), x.transpose(1, 2).to(DType::F32), 1e-12);
      // A bias broadcast over rows: outer stride 0, dense rows.
      Tensor bias = randn({D}, DType::F32, &g).to(dt), rows = randn({7, 3, D}, DType::F32, &g).to(dt);
      EXPECT_CLOSE_TO_CPU(add(gpu(rows), gpu(bias)), add(rows, bias), dt == DType::F32 ? 1e-7 : 1e-2);
    }
  }
}

TEST(CudaElementwise, CopyIntoStridedBroadcastDestination) {
  REQUIRE_GPU();
  Generator g(3);
  Tensor src_row = randn({1, 29}, DType::F32, &g);  // broadcasts over the 37 rows
  Tensor src_t = randn({29, 37}, DType::F32, &g).t();
  for (DType dst_dt : {DType::F32, DType::BF16, DType::F16, DType::I32}) {
    SCOPED_TRACE(dtype_name(dst_dt));
    Tensor base_c = zeros({29, 37}, dst_dt), base_g = gpu(base_c);
    Tensor dst_c = base_c.t(), dst_g = base_g.t();  // {37, 29}, column-major
    dst_c.copy_(src_row);
    dst_g.copy_(gpu(src_row));
    expect_same(base_g, base_c);
    dst_c.copy_(src_t);
    dst_g.copy_(gpu(src_t));
    expect_same(base_g, base_c);
    // stepped slice of the destination, 16-bit source
    Tensor s16 = randn({37, 10}, DType::F32, &g).to(DType::BF16);
    dst_c.slice(1, 0, 29, 3).copy_(s16);
    dst_g.slice(1, 0, 29, 3).copy_(gpu(s16));
    expect_same(base_g, base_c);
  }
}

// --- fill ---

TEST(CudaElementwise, FillWritesTheCpuBitPatternIntoEveryLayout) {
  REQUIRE_GPU();
  const DType all[] = {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8, DType::Bool};
  const Scalar values[] = {Scalar(0), Scalar(-1), Scalar(1.3), Scalar(true), Scalar(int64_t(300))};
  for (DType dt : all) {
    for (const Scalar& v : values) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " value " + std::to_string(v.to_double()));
      for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(1000003)}) {
        Tensor c = full({n}, v, TensorOptions(dt));
        Tensor d = full({n}, v, TensorOptions(dt, Device::cuda(0)));
        expect_same(d, c);
      }
      // views: only the viewed elements change
      Tensor base_c = full({37, 29}, 5, TensorOptions(dt)), base_g = gpu(base_c);
      base_c.t().fill_(v);
      base_g.t().fill_(v);
      expect_same(base_g, base_c);
      base_c = full({1001}, 5, TensorOptions(dt));
      base_g = gpu(base_c);
      base_c.slice(0, 1, 1001, 3).fill_(v);
      base_g.slice(0, 1, 1001, 3).fill_(v);
      expect_same(base_g, base_c);
      base_c = full({1001}, 5, TensorOptions(dt));
      base_g = gpu(base_c);
      base_c.narrow(0, 1, 1000).fill_(v);
      base_g.narrow(0, 1, 1000).fill_(v);
      expect_same(base_g, base_c);
    }
  }
}

// --- unary ---

TEST(CudaElementwise, EveryUnaryOpMatchesTheCpu) {
  REQUIRE_GPU();
  Generator g(4);
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    for (int k = 0; k < kNumUnary; ++k) {
      const auto op = static_cast<math::UnaryOp>(k);
      const math::UnaryInfo& info = math::kUnaryInfo[k];
      const bool positive = info.domain == math::UnaryDomain::Positive;
      auto make = [&](const Shape& s) {
        Tensor t = mul(randn(s, DType::F32, &g), 2.0);
        return (positive ? add(abs(t), 0.1) : t).to(dt);
      };
      for (const Layout& l : layouts(make, dt == DType::F32 || dt == DType::BF16)) {
        SCOPED_TRACE(std::string(info.name) + " " + dtype_name(dt) + " " + l.name);
        EXPECT_CLOSE_TO_CPU(ops::unary(op, l.cuda), ops::unary(op, l.cpu), tol(dt));
      }
    }
  }
}

TEST(CudaElementwise, IntegerUnaryOpsAreExact) {
  REQUIRE_GPU();
  Generator g(5);
  for (DType dt : {DType::I32, DType::I64}) {
    for (int k = 0; k < kNumUnary; ++k) {
      const auto op = static_cast<math::UnaryOp>(k);
      if (!math::accepts_integers(op)) continue;
      auto make = [&](const Shape& s) { return randint(-1000, 1000, s, dt, &g); };
      for (const Layout& l : layouts(make, false)) {
        SCOPED_TRACE(std::string(math::kUnaryInfo[k].name) + " " + dtype_name(dt) + " " + l.name);
        expect_same(ops::unary(op, l.cuda), ops::unary(op, l.cpu));
      }
    }
  }
}

TEST(CudaElementwise, EveryUnaryOpBackwardMatchesTheCpu) {
  REQUIRE_GPU();
  Generator g(6);
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    for (int k = 0; k < kNumUnary; ++k) {
      const auto op = static_cast<math::UnaryOp>(k);
      const math::UnaryInfo& info = math::kUnaryInfo[k];
      SCOPED_TRACE(std::string(info.name) + " " + dtype_name(dt));
      Tensor x0 = mul(randn({37, 29}, DType::F32, &g), 2.0);
      if (info.domain == math::UnaryDomain::Positive) x0 = add(abs(x0), 0.1);
      Tensor xc = x0.to(dt), xg = gpu(xc);
      xc.requires_grad_();
      xg.requires_grad_();
      Tensor gy = randn({29, 37}, DType::F32, &g).to(dt);
      // through a transpose: the forward reads a strided input
      ops::unary(op, xc.t()).backward(gy);
      ops::unary(op, xg.t()).backward(gpu(gy));
      EXPECT_CLOSE_TO_CPU(xg.grad(), xc.grad(), tol(dt));
      // dense, odd size
      Tensor yc = randn({1003}, DType::F32, &g);
      if (info.domain == math::UnaryDomain::Positive) yc = add(abs(yc), 0.1);
      Tensor vc = yc.to(dt), vg = gpu(vc);
      vc.requires_grad_();
      vg.requires_grad_();
      Tensor gv = randn({1003}, DType::F32, &g).to(dt);
      ops::unary(op, vc).backward(gv);
      ops::unary(op, vg).backward(gpu(gv));
      EXPECT_CLOSE_TO_CPU(vg.grad(), vc.grad(), tol(dt));
    }
  }
}

// --- binary ---

TEST(CudaElementwise, EveryBinaryOpMatchesTheCpuWithBroadcasting) {
  REQUIRE_GPU();
  Generator g(7);
  struct Shapes {
    const char* name;
    Shape a, b;
  };
  const Shapes shapes[] = {{"same", {1000003}, {1000003}},
                           {"odd", {7}, {7}},
                           {"one", {1}, {1}},
                           {"broadcast both", {6, 1, 5}, {4, 1}},
                           {"scalar rhs", {1003}, {}},
                           {"scalar lhs", {}, {13, 7}},
                           {"row", {37, 29}, {29}},
                           {"empty", {0, 5}, {5}}};
  for (DType dt : kFloats) {
    for (const BinaryEntry& e : kBinaryOps) {
      for (const Shapes& s : shapes) {
        SCOPED_TRACE(std::string(e.name) + " " + dtype_name(dt) + " " + s.name);
        Tensor a = binary_operand(e.op, 0, s.a, dt, g), b = binary_operand(e.op, 1, s.b, dt, g);
        Tensor want = e.fn(a, b), got = e.fn(gpu(a), gpu(b));
        if (math::is_comparison(e.op)) {
          expect_same(got, want);
        } else {
          EXPECT_CLOSE_TO_CPU(got, want, tol(dt));
        }
      }
      // non-contiguous operands: a transposed, b a stepped slice
      SCOPED_TRACE(std::string(e.name) + " " + dtype_name(dt) + " strided");
      Tensor a = binary_operand(e.op, 0, {29, 37}, dt, g), b = binary_operand(e.op, 1, {37, 88}, dt, g);
      Tensor want = e.fn(a.t(), b.slice(1, 1, 88, 3)), got = e.fn(gpu(a).t(), gpu(b).slice(1, 1, 88, 3));
      if (math::is_comparison(e.op)) {
        expect_same(got, want);
      } else {
        EXPECT_CLOSE_TO_CPU(got, want, tol(dt));
      }
    }
  }
}

TEST(CudaElementwise, IntegerAndBoolBinaryOpsAreExact) {
  REQUIRE_GPU();
  Generator g(8);
  for (DType dt : {DType::I32, DType::I64, DType::U8, DType::Bool}) {
    for (const BinaryEntry& e : kBinaryOps) {
      if (dt == DType::Bool && !math::is_comparison(e.op)) continue;  // refused for bool
      SCOPED_TRACE(std::string(e.name) + " " + dtype_name(dt));
      // small values (pow stays in range); right operands nonzero (div promotes to f32, and 0/0
      // would be NaN, which never compares equal)
      const bool is_bool = dt == DType::Bool;
      const DType draw = is_bool ? DType::I64 : dt;
      Tensor a = randint(0, 4, {6, 1, 5}, draw, &g).to(dt);
      Tensor b = randint(is_bool ? 0 : 1, 4, {4, 1}, draw, &g).to(dt);
      Tensor c = randint(is_bool ? 0 : 1, 4, {5, 1, 6}, draw, &g).to(dt);
      expect_same(e.fn(gpu(a), gpu(b)), e.fn(a, b));
      expect_same(e.fn(gpu(a).transpose(0, 2), gpu(c)), e.fn(a.transpose(0, 2), c));
    }
  }
}

TEST(CudaElementwise, ArithmeticWithScalarsAndMixedDtypes) {
  REQUIRE_GPU();
  Generator g(9);
  Tensor x = randn({1001}, DType::F32, &g);
  Tensor h = randn({1001}, DType::F32, &g).to(DType::BF16);
  Tensor i = randint(-50, 50, {1001}, DType::I64, &g);
  EXPECT_CLOSE_TO_CPU(mul(gpu(x), 2.5), mul(x, 2.5), 1e-6);
  EXPECT_CLOSE_TO_CPU(rsub(gpu(x), 1.0), rsub(x, 1.0), 1e-6);
  // bf16 promoted to f32; integer division is true division in f32
  EXPECT_CLOSE_TO_CPU(add(gpu(x), gpu(h)), add(x, h), 1e-6);
  EXPECT_CLOSE_TO_CPU(div(gpu(i), gpu(add(abs(i), 1))), div(i, add(abs(i), 1)), 1e-6);
  expect_same(add(gpu(i), gpu(i), 3), add(i, i, 3));
  EXPECT_CLOSE_TO_CPU(pow(gpu(abs(x)), 2.5), pow(abs(x), 2.5), 1e-5);
  expect_same(logical_not(gpu(x)), logical_not(x));
}

TEST(CudaElementwise, BinaryBackwardMatchesTheCpu) {
  REQUIRE_GPU();
  Generator g(10);
  for (DType dt : kFloats) {
    for (const BinaryEntry& e : kBinaryOps) {
      if (math::is_comparison(e.op)) continue;
      SCOPED_TRACE(std::string(e.name) + " " + dtype_name(dt));
      Tensor ac = binary_operand(e.op, 0, {37, 29}, dt, g), bc = binary_operand(e.op, 1, {29, 37}, dt, g);
      Tensor ag = gpu(ac), bg = gpu(bc);
      for (Tensor* t : {&ac, &bc, &ag, &bg}) t->requires_grad_();
      Tensor gy = randn({37, 29}, DType::F32, &g).to(dt);
      e.fn(ac, bc.t()).backward(gy);
      e.fn(ag, bg.t()).backward(gpu(gy));
      EXPECT_CLOSE_TO_CPU(ag.grad(), ac.grad(), tol(dt));
      EXPECT_CLOSE_TO_CPU(bg.grad(), bc.grad(), tol(dt));
    }
  }
}

// The gradient of a broadcast operand is summed (the CUDA sum kernel, reduce.cu).
TEST(CudaElementwise, BinaryBackwardWithBroadcastingMatchesTheCpu) {
  REQUIRE_GPU();
  Generator g(11);
  for (const BinaryEntry& e : kBinaryOps) {
    if (math::is_comparison(e.op)) continue;
    SCOPED_TRACE(e.name);
    Tensor ac = binary_operand(e.op, 0, {6, 1, 5}, DType::F32, g), bc = binary_operand(e.op, 1, {4, 1}, DType::F32, g);
    Tensor ag = gpu(ac), bg = gpu(bc);
    for (Tensor* t : {&ac, &bc, &ag, &bg}) t->requires_grad_();
    Tensor gy = randn({6, 4, 5}, DType::F32, &g);
    e.fn(ac, bc).backward(gy);
    e.fn(ag, bg).backward(gpu(gy));
    EXPECT_CLOSE_TO_CPU(ag.grad(), ac.grad(), 1e-5);
    EXPECT_CLOSE_TO_CPU(bg.grad(), bc.grad(), 1e-5);
  }
}

// --- where, clamp, in-place ---

TEST(CudaElementwise, WhereSelectsLikeTheCpu) {
  REQUIRE_GPU();
  Generator g(12);
  Tensor cond = gt(randn({4, 1, 6}, DType::F32, &g), 0.0);
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I64, DType::Bool}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = mul(randn({1, 5, 6}, DType::F32, &g), 3.0).to(dt), b = mul(randn({4, 5, 1}, DType::F32, &g), 3.0).to(dt);
    expect_same(where(gpu(cond), gpu(a), gpu(b)), where(cond, a, b));
    // dense operands of one shape, and a transposed condition
    Tensor c2 = gt(randn({1003}, DType::F32, &g), 0.0);
    Tensor a2 = randn({1003}, DType::F32, &g).to(dt), b2 = randn({1003}, DType::F32, &g).to(dt);
    expect_same(where(gpu(c2), gpu(a2), gpu(b2)), where(c2, a2, b2));
    Tensor c3 = gt(randn({29, 37}, DType::F32, &g), 0.0);
    Tensor a3 = randn({37, 29}, DType::F32, &g).to(dt);
    expect_same(where(gpu(c3).t(), gpu(a3), gpu(b2).narrow(0, 3, 1)), where(c3.t(), a3, b2.narrow(0, 3, 1)));
  }
  // non-bool condition (nonzero = true), and the gradient
  Tensor cf = randint(0, 2, {37, 29}, DType::F32, &g);
  Tensor ac = randn({37, 29}, DType::F32, &g), bc = randn({37, 29}, DType::F32, &g);
  Tensor ag = gpu(ac), bg = gpu(bc);
  for (Tensor* t : {&ac, &bc, &ag, &bg}) t->requires_grad_();
  Tensor yc = where(cf, ac, bc), yg = where(gpu(cf), ag, bg);
  expect_same(yg, yc);
  Tensor gy = randn({37, 29}, DType::F32, &g);
  yc.backward(gy);
  yg.backward(gpu(gy));
  expect_same(ag.grad(), ac.grad());
  expect_same(bg.grad(), bc.grad());
}

TEST(CudaElementwise, ClampAndItsBackwardMatchTheCpu) {
  REQUIRE_GPU();
  Generator g(13);
  const std::optional<double> none;
  const std::pair<std::optional<double>, std::optional<double>> bounds[] = {{-0.5, 0.7}, {-0.5, none}, {none, 0.7}};
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    auto make = [&](const Shape& s) { return randn(s, DType::F32, &g).to(dt); };
    for (const Layout& l : layouts(make, false)) {
      for (const auto& [lo, hi] : bounds) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + l.name);
        expect_same(clamp(l.cuda, lo, hi), clamp(l.cpu, lo, hi));
      }
    }
    // NaN passes through
    Tensor n = from_vector({NAN, -2, 0.25, 3}, {4}, dt);
    Tensor got = clamp(gpu(n), -1.0, 1.0).to(Device::cpu());
    EXPECT_TRUE(std::isnan(got.to_vector()[0]));
    EXPECT_CLOSE_TO_CPU(clamp(gpu(n), -1.0, 1.0), clamp(n, -1.0, 1.0), 1e-12);
    // backward: the gradient passes inside [lo, hi]
    for (const auto& [lo, hi] : bounds) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " backward");
      Tensor xc = randn({37, 29}, DType::F32, &g).to(dt), xg = gpu(xc);
      xc.requires_grad_();
      xg.requires_grad_();
      Tensor gy = randn({29, 37}, DType::F32, &g).to(dt);
      clamp(xc.t(), lo, hi).backward(gy);
      clamp(xg.t(), lo, hi).backward(gpu(gy));
      expect_same(xg.grad(), xc.grad());
    }
  }
  for (DType dt : {DType::I32, DType::I64, DType::U8}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = randint(0, 200, {1003}, dt, &g);
    expect_same(clamp(gpu(x), 20.0, 150.0), clamp(x, 20.0, 150.0));
    expect_same(clamp(gpu(x), std::nullopt, 99.0), clamp(x, std::nullopt, 99.0));
  }
}

TEST(CudaElementwise, InPlaceAddAndMulMatchTheCpu) {
  REQUIRE_GPU();
  Generator g(14);
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I64, DType::I32}) {
    SCOPED_TRACE(dtype_name(dt));
    const bool integral = is_integral(dt);
    auto draw = [&](const Shape& s) {
      return integral ? randint(-100, 100, s, dt, &g) : randn(s, DType::F32, &g).to(dt);
    };
    const Scalar alpha = integral ? Scalar(3) : Scalar(-0.75);
    // dense, odd size
    Tensor ac = draw({1000003}), ag = gpu(ac), b = draw({1000003});
    add_(ac, b, alpha);
    add_(ag, gpu(b), alpha);
    expect_match(ag, ac, dt);
    // a transposed destination, a broadcast row
    Tensor base_c = draw({29, 37}), base_g = gpu(base_c), row = draw({29});
    Tensor vc = base_c.t(), vg = base_g.t();
    add_(vc, row, alpha);
    add_(vg, gpu(row), alpha);
    expect_match(base_g, base_c, dt);
    // mul_ by a scalar (the kernel writes its own input), on a stepped slice
    Tensor sc = base_c.slice(1, 1, 37, 2), sg = base_g.slice(1, 1, 37, 2);
    mul_(sc, integral ? Scalar(2) : Scalar(1.5));
    mul_(sg, integral ? Scalar(2) : Scalar(1.5));
    expect_match(base_g, base_c, dt);
    // empty
    Tensor ec = draw({0}), eg = gpu(ec);
    add_(eg, gpu(ec), alpha);
    expect_same(eg, ec);
  }
}

// --- random fills and dropout: the same counter-based stream on both devices ---

TEST(CudaElementwise, RandomFillsDrawTheCpuValues) {
  REQUIRE_GPU();
  const Device cuda = Device::cuda(0);
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(1000003)}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
      SCOPED_TRACE(dtype_name(dt));
      Generator gc(42), gg(42);
      gc.reserve(3);  // a base that is not a multiple of anything
      gg.reserve(3);
      expect_same(rand({n}, TensorOptions(dt, cuda), &gg), rand({n}, TensorOptions(dt), &gc));
      // Box-Muller uses f64 log/sin/cos, whose last bits differ between libm and CUDA
      EXPECT_CLOSE_TO_CPU(randn({n}, TensorOptions(dt, cuda), &gg), randn({n}, TensorOptions(dt), &gc),
                          dt == DType::F64 ? 1e-14 : 1e-6);
      expect_same(bernoulli_mask({n}, 0.3, TensorOptions(dt, cuda), &gg), bernoulli_mask({n}, 0.3, dt, &gc));
      Tensor uc = empty({n}, dt), ug = empty({n}, TensorOptions(dt, cuda));
      uniform_(uc, -2.0, 3.0, &gc);
      uniform_(ug, -2.0, 3.0, &gg);
      EXPECT_CLOSE_TO_CPU(ug, uc, dt == DType::F64 ? 1e-14 : 1e-6);
      Tensor nc = empty({n}, dt), ng = empty({n}, TensorOptions(dt, cuda));
      normal_(nc, 1.0, 0.5, &gc);
      normal_(ng, 1.0, 0.5, &gg);
      EXPECT_CLOSE_TO_CPU(ng, nc, dt == DType::F64 ? 1e-14 : 1e-6);
      EXPECT_EQ(gg.state().offset, gc.state().offset);
    }
    for (DType dt : {DType::I64, DType::I32, DType::U8, DType::Bool}) {
      SCOPED_TRACE(dtype_name(dt));
      Generator gc(7), gg(7);
      expect_same(randint(0, dt == DType::Bool ? 2 : 200, {n}, TensorOptions(dt, cuda), &gg),
                  randint(0, dt == DType::Bool ? 2 : 200, {n}, dt, &gc));
      expect_same(bernoulli_mask({n}, 0.6, TensorOptions(dt, cuda), &gg), bernoulli_mask({n}, 0.6, dt, &gc));
    }
    // the full 2^32 range and a negative low
    Generator gc(9), gg(9);
    expect_same(randint(-(int64_t(1) << 31), int64_t(1) << 31, {n}, TensorOptions(DType::I64, cuda), &gg),
                randint(-(int64_t(1) << 31), int64_t(1) << 31, {n}, DType::I64, &gc));
  }
}

TEST(CudaElementwise, DropoutMasksAndGradientsAreTheCpus) {
  REQUIRE_GPU();
  Generator gx(15);
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    auto make = [&](const Shape& s) { return randn(s, DType::F32, &gx).to(dt); };
    for (const Layout& l : layouts(make)) {
      for (double p : {0.1, 0.5}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + l.name + " p=" + std::to_string(p));
        Generator gc(123), gg(123);
        gc.reserve(5);
        gg.reserve(5);
        // leaves that require grad; the layout's view is what dropout sees
        Tensor xc = l.cpu.detach().requires_grad_(), xg = l.cuda.detach().requires_grad_();
        Tensor yc = dropout(xc, p, true, &gc), yg = dropout(xg, p, true, &gg);
        expect_same(yg, yc);
        EXPECT_EQ(gg.state().offset, gc.state().offset);
        Tensor gy = randn(yc.shape(), DType::F32, &gx).to(dt);
        yc.backward(gy);
        yg.backward(gpu(gy));
        expect_same(xg.grad(), xc.grad());
      }
    }
  }
}

// --- silu_mul ---

// gate and up as the two halves of one [B, T, 2F] projection (row stride 2F, F odd and past one
// CPU tile), forward and both gradients, and separate transposed operands (copied to rows).
TEST(CudaElementwise, SiluMulAndItsBackwardMatchTheCpu) {
  REQUIRE_GPU();
  Generator g(9);
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor guc = mul(randn({2, 5, 2 * 301}, DType::F32, &g), 2.0).to(dt), gug = gpu(guc);
    guc.requires_grad_();
    gug.requires_grad_();
    auto halves = [](const Tensor& gu) {
      const int64_t F = gu.size(-1) / 2;
      return silu_mul(gu.narrow(-1, 0, F), gu.narrow(-1, F, F));
    };
    Tensor yc = halves(guc), yg = halves(gug);
    EXPECT_CLOSE_TO_CPU(yg, yc, tol(dt));
    Tensor gy = randn(yc.shape(), DType::F32, &g).to(dt);
    yc.backward(gy);
    yg.backward(gpu(gy));
    EXPECT_CLOSE_TO_CPU(gug.grad(), guc.grad(), tol(dt));

    Tensor a = randn({7, 33}, DType::F32, &g).to(dt), b = randn({7, 33}, DType::F32, &g).to(dt);
    EXPECT_CLOSE_TO_CPU(silu_mul(gpu(a).t(), gpu(b).t()), silu_mul(a.t(), b.t()), tol(dt));
  }
  EXPECT_EQ(silu_mul(gpu(zeros({0, 3})), gpu(zeros({0, 3}))).shape(), Shape({0, 3}));
}
