// Elementwise ops: PyTorch parity for every case tests/parity/cases_elementwise.py lists (walked
// from the generator's manifest), gradient checks for every op of the lists in
// backend/elementwise_math.h, type promotion and errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <optional>
#include <set>

#include "backend/elementwise_math.h"
#include "fasttrain/fasttrain.h"
#include "ops/unary.h"
#include "support/expect_error.h"
#include "support/gradcheck.h"
#include "support/parity.h"

using namespace ft;
using test::ParityCase;

namespace {

// Every op of the lists in backend/elementwise_math.h by name: unary ops through the function
// users call (ops::unary for those reached through another function's option, like gelu's),
// binary ops through `name(a, b)`. Parity cases name their op (tests/parity/cases_elementwise.py),
// so a new op needs no edit in this file.
using UnaryFn = Tensor (*)(const Tensor&);
using BinaryFn = Tensor (*)(const Tensor&, const Tensor&);

struct UnaryEntry {
  const char* name;
  math::UnaryOp op;
  math::UnaryDomain domain;
  UnaryFn fn;
};
#define FT_TEST_CALL_Public(Op, name) [](const Tensor& x) { return ft::name(x); }
#define FT_TEST_CALL_Internal(Op, name) [](const Tensor& x) { return ops::unary(math::UnaryOp::Op, x); }
#define FT_TEST_UNARY(Op, name, domain, saves, api, ...) \
  UnaryEntry{#name, math::UnaryOp::Op, math::UnaryDomain::domain, FT_TEST_CALL_##api(Op, name)},
const UnaryEntry kUnaryOps[] = {FT_UNARY_OPS(FT_TEST_UNARY)};
#undef FT_TEST_UNARY
#undef FT_TEST_CALL_Internal
#undef FT_TEST_CALL_Public

struct BinaryEntry {
  const char* name;
  math::BinaryOp op;
  BinaryFn fn;
};
#define FT_TEST_BINARY(Op, name, ...) \
  BinaryEntry{#name, math::BinaryOp::Op, [](const Tensor& a, const Tensor& b) { return ft::name(a, b); }},
const BinaryEntry kBinaryOps[] = {FT_BINARY_OPS(FT_TEST_BINARY)};
#undef FT_TEST_BINARY

const UnaryEntry* find_unary(const std::string& name) {
  for (const auto& e : kUnaryOps)
    if (name == e.name) return &e;
  return nullptr;
}
const BinaryEntry* find_binary(const std::string& name) {
  for (const auto& e : kBinaryOps)
    if (name == e.name) return &e;
  return nullptr;
}

// Runs one manifest case: inputs in call order (those with reference gradients require grad),
// the output against PyTorch's, then the gradients.
void check_case(const nlohmann::json& entry, std::optional<DType> expected_dtype,
                const std::function<Tensor(const std::vector<Tensor>&)>& call) {
  const std::string name = entry.at("name");
  SCOPED_TRACE(name);
  FT_PARITY_CASE(c, name);
  const auto grads = entry.at("grads").get<std::vector<std::string>>();
  std::vector<Tensor> inputs;
  const auto input_names = entry.at("inputs").get<std::vector<std::string>>();
  for (const auto& in : input_names)
    inputs.push_back(c.input(in, std::find(grads.begin(), grads.end(), in) != grads.end()));
  Tensor y = call(inputs);
  EXPECT_EQ(y.dtype(), expected_dtype.value_or(c.dtype()));
  c.expect_output(y);
  if (grads.empty()) return;
  c.backward({y});
  for (size_t i = 0; i < input_names.size(); ++i)
    if (std::find(grads.begin(), grads.end(), input_names[i]) != grads.end()) c.expect_grad(input_names[i], inputs[i]);
}

}  // namespace

TEST(ElementwiseParity, Unary) {
  FT_PARITY_MANIFEST(m);
  for (const auto& entry : m.op_cases("elementwise")) {
    const UnaryEntry* u = find_unary(entry.at("op"));
    if (u == nullptr) continue;
    check_case(entry, std::nullopt, [u](const std::vector<Tensor>& in) { return u->fn(in.at(0)); });
  }
}

TEST(ElementwiseParity, Binary) {
  FT_PARITY_MANIFEST(m);
  for (const auto& entry : m.op_cases("elementwise")) {
    const BinaryEntry* b = find_binary(entry.at("op"));
    if (b == nullptr || math::is_comparison(b->op)) continue;
    check_case(entry, std::nullopt, [b](const std::vector<Tensor>& in) { return b->fn(in.at(0), in.at(1)); });
  }
}

// A listed op without a parity case fails here, so the recipe cannot skip that step.
TEST(ElementwiseParity, EveryListedOpHasCases) {
  FT_PARITY_MANIFEST(m);
  std::set<std::string> covered;
  for (const auto& entry : m.op_cases("elementwise")) {
    const std::string op = entry.at("op");
    EXPECT_TRUE(find_unary(op) || find_binary(op))
        << entry.at("name") << " names op '" << op << "', which is in neither list of backend/elementwise_math.h";
    covered.insert(op);
  }
  for (const auto& e : kUnaryOps)
    EXPECT_TRUE(covered.count(e.name)) << "unary op " << e.name
                                       << " has no parity case: add it to UNARY in tests/parity/cases_elementwise.py";
  for (const auto& e : kBinaryOps)
    EXPECT_TRUE(covered.count(e.name)) << "binary op " << e.name << " has no parity case";
}

// gelu's `approximate` option picks between two listed ops.
TEST(Elementwise, GeluApproximationsAreTheListedOps) {
  Tensor x = randn({4, 9});
  EXPECT_EQ(gelu(x).to_vector(), ops::unary(math::UnaryOp::Gelu, x).to_vector());
  EXPECT_EQ(gelu(x, GeluApprox::Tanh).to_vector(), ops::unary(math::UnaryOp::GeluTanh, x).to_vector());
}

// How far an f32 result is from the exact value `want`, in units of f32's last place at want.
static double ulps_off(float got, double want) {
  const float w = static_cast<float>(want);
  const double ulp = std::nextafter(std::fabs(w), INFINITY) - std::fabs(w);
  return std::fabs(static_cast<double>(got) - want) / ulp;
}

// The f32 normal CDF behind exact GELU (math::normal_cdf_, polynomial fits) against the library
// erfc in double: every 257th float of [0, 5.5] and their negatives, the fits' seams, the tails
// past them, and the special values. Phi(x) = 0.5 erfc(-x/sqrt2) changes by x^2 of its own
// relative size per relative change of x (d log Phi / d log x = x phi(x) / Phi(x), about x^2 in the
// negative tail), so rounding x^2 in f32 alone moves the result by up to x^2/2 ulps there: the
// bound is 4 ulps times max(1, x^2/2) (the worst is 3.2). Computed as 0.5 (1 + erf(x/sqrt2)), as
// before, Phi lost all relative accuracy in the negative tail (1e-2 at x = -4.5).
TEST(ElementwiseMath, F32NormalCdfIsWithinFourUlpsOfTheLibraryErfc) {
  double worst = 0;
  float at = 0;
  auto check = [&](float x) {
    const double xd = x, want = 0.5 * std::erfc(-xd / std::sqrt(2.0));
    // The central piece, 0.5 + 0.5 z P(z^2), cancels for x < 0 down to Phi(-1.27) = 0.1: there the
    // error is counted in ulps of 0.5.
    const double at_least = std::fabs(xd) <= 1.273 ? 0.5 : 0.0;  // 0.9 sqrt2 = 1.2728, with f32 rounding of z
    const float ref = static_cast<float>(std::max(want, at_least));
    const double ulp = std::nextafter(ref, INFINITY) - ref;
    const double e = std::fabs(math::normal_cdf_(x) - want) / ulp / std::max(1.0, xd * xd / 2);
    if (!(e <= worst)) worst = e, at = x;
  };
  const uint32_t end = std::bit_cast<uint32_t>(5.5f);
  for (uint32_t bits = 0; bits <= end; bits += 257) {
    check(std::bit_cast<float>(bits));
    check(-std::bit_cast<float>(bits));
  }
  // Past -3.92 sqrt2 = -5.54 Phi is 0 (checked below), not within ulps.
  for (float seam : {0.9f * 1.41421356f, 3.92f * 1.41421356f})
    for (float x = std::nextafter(seam, 0.0f), k = 0; k < 3; ++k, x = std::nextafter(x, INFINITY)) {
      check(x);
      if (x <= 5.5f) check(-x);
    }
  EXPECT_LE(worst, 4.0) << "at x = " << at;
  for (float x : {5.6f, 8.0f, 1e30f}) {
    EXPECT_EQ(math::normal_cdf_(x), 1.0f) << x;
    EXPECT_LE(math::normal_cdf_(-x), 1.1e-8f) << -x;  // Phi(-5.6) = 1.07e-8
  }
  EXPECT_EQ(math::normal_cdf_(0.0f), 0.5f);
  EXPECT_EQ(math::normal_cdf_(INFINITY), 1.0f);
  EXPECT_EQ(math::normal_cdf_(-INFINITY), 0.0f);
  EXPECT_TRUE(std::isnan(math::normal_cdf_(NAN)));
}

// The f32 log behind the log op (math::log_, an atanh series after splitting off the exponent)
// against the library log in double: every 257th positive float, subnormals included, and the
// special values.
TEST(ElementwiseMath, F32LogIsWithinThreeUlpsOfTheLibraryLog) {
  double worst = 0;
  float at = 0;
  for (uint32_t bits = 1; bits < 0x7f800000u; bits += 257) {
    const float x = std::bit_cast<float>(bits);
    const double e = ulps_off(math::log_(x), std::log(static_cast<double>(x)));
    if (!(e <= worst)) worst = e, at = x;
  }
  EXPECT_LE(worst, 3.0) << "at x = " << at;
  EXPECT_EQ(math::log_(1.0f), 0.0f);
  EXPECT_EQ(math::log_(0.0f), -INFINITY);
  EXPECT_EQ(math::log_(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(math::log_(-1.0f)));
  EXPECT_TRUE(std::isnan(math::log_(-INFINITY)));
  EXPECT_TRUE(std::isnan(math::log_(NAN)));
}

// pow with a tensor exponent runs in Binary; these take parameters.
TEST(ElementwiseParity, PowClampWhereMaskedFill) {
  {
    FT_PARITY_CASE(c, "pow_scalar_f32");
    Tensor a = c.input("a", true);
    Tensor y = pow(a, c.param<double>("e"));
    c.expect_output(y);
    c.backward({y});
    c.expect_grad("a", a);
  }
  {
    FT_PARITY_CASE(c, "clamp_f32");
    Tensor x = c.input("x", true);
    Tensor y = clamp(x, c.param<double>("lo"), c.param<double>("hi"));
    c.expect_output(y);
    c.backward({y});
    c.expect_grad("x", x);
  }
  {
    FT_PARITY_CASE(c, "clamp_min_f64_transposed");
    Tensor x = c.input("x", true);
    Tensor y = clamp(x, c.param<double>("lo"), std::nullopt);
    c.expect_output(y);
    c.backward({y});
    c.expect_grad("x", x);
  }
  {
    FT_PARITY_CASE(c, "where_f32");
    Tensor cond = c.input("c"), a = c.input("a", true), b = c.input("b", true);
    Tensor y = where(cond, a, b);
    c.expect_output(y);
    c.backward({y});
    c.expect_grad("a", a);
    c.expect_grad("b", b);
  }
  for (const char* name : {"masked_fill_f32", "masked_fill_bf16_transposed"}) {
    FT_PARITY_CASE(c, name);
    Tensor x = c.input("x", true), m = c.input("m");
    Tensor y = masked_fill(x, m, c.param<double>("value"));
    c.expect_output(y);
    c.backward({y});
    c.expect_grad("x", x);
  }
}

TEST(ElementwiseGradcheck, AllDifferentiableOps) {
  Generator g(11);
  auto r = [&](Shape s) { return randn(s, DType::F64, &g).requires_grad_(); };
  auto pos = [&](Shape s) { return add(abs(randn(s, DType::F64, &g)), 0.3).detach().requires_grad_(); };
  for (const auto& e : kUnaryOps) {
    SCOPED_TRACE(e.name);
    UnaryFn fn = e.fn;
    // log, sqrt and rsqrt are defined for x > 0
    Tensor x = e.domain == math::UnaryDomain::Positive ? pos({3, 4}) : r({3, 4});
    EXPECT_GRADCHECK([fn](const std::vector<Tensor>& in) { return fn(in[0]); }, {x});
  }
  for (const auto& e : kBinaryOps) {
    // comparisons have no gradient; pow's base must be positive (checked below)
    if (math::is_comparison(e.op) || e.op == math::BinaryOp::Pow) continue;
    SCOPED_TRACE(e.name);
    BinaryFn fn = e.fn;
    // broadcasting in both directions, non-contiguous first operand
    Tensor a = r({4, 3}).t().detach().requires_grad_();
    Tensor b = pos({1, 4});
    EXPECT_GRADCHECK([fn](const std::vector<Tensor>& in) { return fn(in[0], in[1]); }, {a, b});
  }
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return pow(in[0], in[1]); }, {pos({3, 2}), r({2})});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return pow(in[0], 2.5); }, {pos({5})});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return clamp(in[0], -0.5, 0.5); }, {r({10})});
  Tensor cond = gt(randn({3, 4}, {}, &g), 0.0);
  EXPECT_GRADCHECK([cond](const std::vector<Tensor>& in) { return where(cond, in[0], in[1]); }, {r({3, 4}), r({4})});
  Tensor mask = gt(randn({1, 4}, {}, &g), 0.0);
  EXPECT_GRADCHECK([mask](const std::vector<Tensor>& in) { return masked_fill(in[0], mask, 2.0); }, {r({3, 4})});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return sum(in[0], {0, 2}, true); }, {r({2, 3, 4})});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return mean(in[0].t(), {1}); }, {r({3, 5})});
}

TEST(Elementwise, TypePromotionAndScalars) {
  Tensor i = arange(0, 4, 1, DType::I64);
  Tensor f = ones({4}, DType::BF16);
  EXPECT_EQ(add(i, f).dtype(), DType::BF16);
  EXPECT_EQ(mul(f, 0.5).dtype(), DType::BF16);  // python scalars don't promote
  EXPECT_EQ(mul(i, 2).dtype(), DType::I64);
  EXPECT_EQ(mul(i, 2.5).dtype(), DType::F32);
  EXPECT_EQ(div(i, i).dtype(), DType::F32);  // true division
  EXPECT_EQ(gt(i, 1).dtype(), DType::Bool);
  EXPECT_EQ(gt(i, 1).to_vector(), (std::vector<double>{0, 0, 1, 1}));
  EXPECT_EQ((2.0 - i).to_vector(), (std::vector<double>{2, 1, 0, -1}));
  EXPECT_EQ(logical_not(gt(i, 1)).to_vector(), (std::vector<double>{1, 1, 0, 0}));
}

TEST(Elementwise, ShapeAndDeviceErrors) {
  try {
    add(zeros({2, 3}), zeros({4}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("add: shapes [2, 3] and [4] cannot be broadcast"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(exp(zeros({2}, DType::I64)), Error);
  EXPECT_THROW(masked_fill(zeros({2}), zeros({2}), 1.0), Error);  // mask must be bool
  EXPECT_THROW(clamp(zeros({2}), 1.0, 0.0), Error);
}

TEST(Elementwise, LargeNonContiguousMatchesContiguous) {
  // exercises the parallel strided loop across chunk boundaries
  Tensor x = randn({300, 700});
  Tensor xt = x.t();
  std::vector<double> a = exp(xt).to_vector();
  std::vector<double> b = exp(xt.contiguous()).to_vector();
  EXPECT_EQ(a, b);
  Tensor s = add(x, x.slice(1, 0, 1));  // broadcast a column
  EXPECT_EQ(s.select(1, 5).to_vector(), add(x.select(1, 5), x.select(1, 0)).to_vector());
}

TEST(ElementwiseParity, ComparisonsAndLogicalNot) {
  FT_PARITY_MANIFEST(m);
  for (const auto& entry : m.op_cases("elementwise")) {
    const BinaryEntry* b = find_binary(entry.at("op"));
    if (b == nullptr || !math::is_comparison(b->op)) continue;
    check_case(entry, DType::Bool, [b](const std::vector<Tensor>& in) { return b->fn(in.at(0), in.at(1)); });
  }
  FT_PARITY_CASE(c, "logical_not_bool");
  c.expect_output(logical_not(c.input("x")));
}

// --- silu_mul (SwiGLU's gate, one pass each way) ---

// Against F.silu(g) * u: separate operands, the two halves of one [B, T, 2F] tensor (read in
// place with row stride 2F) and transposed operands (copied to rows first).
TEST(ElementwiseParity, SiluMul) {
  for (const char* dt : {"f32", "f64", "bf16", "f16"}) {
    for (const char* form : {"", "_halves", "_transposed"}) {
      const std::string name = std::string("silu_mul_") + dt + form;
      SCOPED_TRACE(name);
      FT_PARITY_CASE(c, name);
      std::vector<std::pair<std::string, Tensor>> leaves;
      Tensor y;
      if (c.has("gu")) {
        Tensor gu = c.input("gu", true);
        const int64_t F = gu.size(-1) / 2;
        y = silu_mul(gu.narrow(-1, 0, F), gu.narrow(-1, F, F));
        leaves = {{"gu", gu}};
      } else {
        Tensor gate = c.input("gate", true), up = c.input("up", true);
        y = silu_mul(gate, up);
        leaves = {{"gate", gate}, {"up", up}};
      }
      EXPECT_EQ(y.dtype(), c.dtype());
      EXPECT_TRUE(y.is_contiguous());
      c.expect_output(y);
      c.backward({y});
      for (const auto& [input, leaf] : leaves) c.expect_grad(input, leaf);
    }
  }
}

TEST(ElementwiseGradcheck, SiluMul) {
  Generator g(12);
  auto r = [&](Shape s) { return mul(randn(s, DType::F64, &g), 2.0).detach().requires_grad_(); };
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return silu_mul(in[0], in[1]); }, {r({3, 5}), r({3, 5})});
  // gate and up as halves of one [2, 3, 2F] tensor: row strides twice the width
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) { return silu_mul(in[0].narrow(-1, 0, 4), in[0].narrow(-1, 4, 4)); },
      {r({2, 3, 8})});
}

// The fused kernel against its composition of the listed ops, outputs and both gradients, with
// rows longer than one 256-element tile and strided halves.
TEST(Elementwise, SiluMulMatchesSiluThenMul) {
  Generator g(13);
  Tensor gu = mul(randn({3, 2, 2 * 300}, DType::F64, &g), 3.0).detach().requires_grad_();
  auto halves = [](const Tensor& x) { return std::pair{x.narrow(-1, 0, 300), x.narrow(-1, 300, 300)}; };
  EXPECT_MATCHES_REFERENCE(
      [&](const std::vector<Tensor>& in) {
        auto [a, b] = halves(in[0]);
        return silu_mul(a, b);
      },
      [&](const std::vector<Tensor>& in) {
        auto [a, b] = halves(in[0]);
        return mul(silu(a), b);
      },
      {gu});
}

TEST(Elementwise, SiluMulErrors) {
  using test::error_of;
  EXPECT_EQ(error_of([] {
              silu_mul(zeros({2, 3}), zeros({3, 2}));
            }),
            "silu_mul: gate and up must have one shape, found gate [2, 3], up [3, 2]");
  EXPECT_EQ(error_of([] {
              silu_mul(zeros({2, 3}), zeros({2, 3}, DType::BF16));
            }),
            "silu_mul: gate and up must have one dtype, found gate f32, up bf16");
  EXPECT_EQ(error_of([] { silu_mul(zeros({2}, DType::I64), zeros({2}, DType::I64)); }),
            "silu_mul: gate must be a floating-point tensor, found i64");
  EXPECT_EQ(silu_mul(zeros({0, 3}), zeros({0, 3})).shape(), Shape({0, 3}));
}
