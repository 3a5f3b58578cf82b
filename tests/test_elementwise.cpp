#include <gtest/gtest.h>

#include "fasttrain/fasttrain.h"
#include "support/gradcheck.h"
#include "support/parity.h"

using namespace ft;
using test::ParityCase;

namespace {

Tensor call_unary(const std::string& name, const Tensor& x) {
  if (name == "neg") return neg(x);
  if (name == "abs") return abs(x);
  if (name == "exp") return exp(x);
  if (name == "log") return log(x);
  if (name == "sqrt") return sqrt(x);
  if (name == "rsqrt") return rsqrt(x);
  if (name == "square") return square(x);
  if (name == "tanh") return tanh(x);
  if (name == "sigmoid") return sigmoid(x);
  if (name == "relu") return relu(x);
  if (name == "gelu") return gelu(x);
  if (name == "gelu_tanh") return gelu(x, GeluApprox::Tanh);
  if (name == "silu") return silu(x);
  FT_FAIL("unknown unary ", name);
}

Tensor call_binary(const std::string& name, const Tensor& a, const Tensor& b) {
  if (name == "add") return add(a, b);
  if (name == "sub") return sub(a, b);
  if (name == "mul") return mul(a, b);
  if (name == "div") return div(a, b);
  if (name == "maximum") return maximum(a, b);
  if (name == "minimum") return minimum(a, b);
  FT_FAIL("unknown binary ", name);
}

const char* kDtypes[] = {"f32", "f64", "bf16", "f16"};
const char* kUnary[] = {"neg", "abs", "exp", "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "silu", "square"};
const char* kPositive[] = {"log", "sqrt", "rsqrt"};
const char* kBinary[] = {"add", "sub", "mul", "div", "maximum", "minimum"};

void check_unary_case(const std::string& op, const std::string& case_name) {
  ParityCase c(case_name);
  if (!c.available()) GTEST_SKIP() << c.skip_reason();
  Tensor x = c.input("x", true);
  Tensor y = call_unary(op, x);
  EXPECT_EQ(y.dtype(), c.dtype());
  c.expect_output(y);
  c.backward({y});
  c.expect_grad("x", x);
}

}  // namespace

TEST(ElementwiseParity, Unary) {
  for (const char* dt : kDtypes) {
    for (const char* op : kUnary) {
      SCOPED_TRACE(std::string(op) + " " + dt);
      check_unary_case(op, std::string(op) + "_" + dt);
      check_unary_case(op, std::string(op) + "_" + dt + "_transposed");
    }
    for (const char* op : kPositive) {
      SCOPED_TRACE(std::string(op) + " " + dt);
      check_unary_case(op, std::string(op) + "_" + dt);
      check_unary_case(op, std::string(op) + "_" + dt + "_strided");
    }
  }
}

TEST(ElementwiseParity, Binary) {
  for (const char* dt : kDtypes) {
    for (const char* op : kBinary) {
      for (const char* suffix : {"", "_bcast", "_expand"}) {
        std::string name = std::string(op) + "_" + dt + suffix;
        SCOPED_TRACE(name);
        FT_PARITY_CASE(c, name);
        Tensor a = c.input("a", true), b = c.input("b", true);
        Tensor y = call_binary(op, a, b);
        c.expect_output(y);
        c.backward({y});
        c.expect_grad("a", a);
        c.expect_grad("b", b);
      }
    }
  }
}

TEST(ElementwiseParity, PowClampWhereMaskedFill) {
  {
    FT_PARITY_CASE(c, "pow_f64");
    Tensor a = c.input("a", true), b = c.input("b", true);
    Tensor y = pow(a, b);
    c.expect_output(y);
    c.backward({y});
    c.expect_grad("a", a);
    c.expect_grad("b", b);
  }
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
  for (const char* op : kUnary) {
    SCOPED_TRACE(op);
    std::string name = op;
    EXPECT_GRADCHECK([name](const std::vector<Tensor>& in) { return call_unary(name, in[0]); }, {r({3, 4})});
  }
  for (const char* op : kPositive) {
    SCOPED_TRACE(op);
    std::string name = op;
    EXPECT_GRADCHECK([name](const std::vector<Tensor>& in) { return call_unary(name, in[0]); }, {pos({3, 4})});
  }
  for (const char* op : kBinary) {
    SCOPED_TRACE(op);
    std::string name = op;
    // broadcasting in both directions, non-contiguous first operand
    Tensor a = r({4, 3}).t().detach().requires_grad_();
    Tensor b = pos({1, 4});
    EXPECT_GRADCHECK([name](const std::vector<Tensor>& in) { return call_binary(name, in[0], in[1]); }, {a, b});
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
    EXPECT_NE(std::string(e.what()).find("add: shapes [2, 3] and [4] cannot be broadcast"), std::string::npos) << e.what();
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
  const std::pair<const char*, Tensor (*)(const Tensor&, const Tensor&)> ops[] = {
      {"eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); }},
      {"ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); }},
      {"lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); }},
      {"le", [](const Tensor& a, const Tensor& b) { return le(a, b); }},
      {"gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); }},
      {"ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); }}};
  for (const char* dt : {"f32", "bf16", "f64"}) {
    for (const auto& [name, fn] : ops) {
      std::string case_name = std::string("cmp_") + name + "_" + dt;
      SCOPED_TRACE(case_name);
      FT_PARITY_CASE(c, case_name);
      Tensor y = fn(c.input("a"), c.input("b"));
      EXPECT_EQ(y.dtype(), DType::Bool);
      c.expect_output(y);
    }
  }
  FT_PARITY_CASE(c, "logical_not_bool");
  c.expect_output(logical_not(c.input("x")));
}
