// rotary_embedding and rope_tables: PyTorch parity with Hugging Face Llama's formulas (tables,
// Llama 3 scaling, rotate_half) over layouts and dtypes, f64 gradient checks, the fused kernel
// against its composition of slices, products and cat, decoding at an offset, and validation.
#include <gtest/gtest.h>

#include <cmath>

#include "fasttrain/fasttrain.h"
#include "support/expect_error.h"
#include "support/gradcheck.h"
#include "support/parity.h"

using namespace ft;
using test::ParityCase;

namespace {

RopeScaling scaling_of(const nlohmann::json& j) {
  RopeScaling s;
  if (j.is_null()) return s;
  s.type = RopeScaling::Type::Llama3;
  s.factor = j.at("factor");
  s.low_freq_factor = j.at("low_freq_factor");
  s.high_freq_factor = j.at("high_freq_factor");
  s.original_max_position_embeddings = j.at("original_max_position_embeddings");
  return s;
}

Tensor randn64(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return randn(s, DType::F64, &g);
}

// HF's q * cos + rotate_half(q) * sin from plain ops, the tables [T, D/2] broadcast over [B, T, H, D].
Tensor composed_rope(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const int64_t T = x.size(1), h = x.size(3) / 2;
  Tensor c = cos.reshape({1, T, 1, h}), s = sin.reshape({1, T, 1, h});
  Tensor x1 = x.narrow(-1, 0, h), x2 = x.narrow(-1, h, h);
  return cat({sub(mul(x1, c), mul(x2, s)), add(mul(x2, c), mul(x1, s))}, -1);
}

}  // namespace

TEST(RotaryParity, AllCases) {
  for (const char* dt : {"f32", "f64", "bf16", "f16"}) {
    for (const char* cfg : {"basic", "llama32", "short_scaled", "qkv", "wide", "transposed"}) {
      const std::string name = std::string("rope_") + cfg + "_" + dt;
      SCOPED_TRACE(name);
      FT_PARITY_CASE(c, name);
      const std::string layout = c.param<std::string>("layout");
      const bool qkv = layout == "qkv";
      Tensor leaf = c.input(qkv ? "qkv" : "x", true);
      Tensor x = qkv ? leaf.select(2, 0) : leaf;
      if (layout == "transposed") EXPECT_NE(x.stride(3), 1);
      const DType table_dtype = c.dtype() == DType::F64 ? DType::F64 : DType::F32;
      RopeTables tab =
          rope_tables(x.size(1), x.size(3), c.param<double>("theta"), scaling_of(c.params()["scaling"]), table_dtype);
      Tensor y = rotary_embedding(x, tab.cos, tab.sin);
      EXPECT_EQ(y.dtype(), c.dtype());
      EXPECT_TRUE(y.is_contiguous());
      c.expect_output(y);
      c.backward({y});
      c.expect_grad(qkv ? "qkv" : "x", leaf);
    }
  }
}

// The tables against HF's formulas computed in f64 (f32 tables: the same values rounded once).
TEST(RotaryParity, Tables) {
  for (const char* dt : {"f32", "f64"}) {
    for (const char* cfg : {"plain", "llama32", "short_scaled"}) {
      const std::string name = std::string("rope_tables_") + cfg + "_" + dt;
      SCOPED_TRACE(name);
      FT_PARITY_CASE(c, name);
      RopeTables tab = rope_tables(c.input("pos").size(0), c.param<int64_t>("head_dim"), c.param<double>("theta"),
                                   scaling_of(c.params()["scaling"]), c.dtype());
      c.expect_output(tab.cos, 0);
      c.expect_output(tab.sin, 1);
    }
  }
}

TEST(RotaryGrad, F64FiniteDifferences) {
  RopeScaling s;
  s.type = RopeScaling::Type::Llama3;
  s.original_max_position_embeddings = 16;
  RopeTables tab = rope_tables(5, 6, 100.0, s, DType::F64);
  // [B, H, T, D] storage seen as [B, T, H, D]: strides no single row stride describes
  Tensor xs = randn64({2, 3, 5, 6}, 1).requires_grad_();
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        return rotary_embedding(in[0].permute({0, 2, 1, 3}), tab.cos, tab.sin);
      },
      {xs});
}

TEST(Rotary, MatchesComposedSlicesMulCat) {
  RopeTables tab = rope_tables(7, 10, 10000.0, {}, DType::F64);
  Tensor x = randn64({2, 7, 3, 10}, 2).requires_grad_();
  EXPECT_MATCHES_REFERENCE([&](const std::vector<Tensor>& in) { return rotary_embedding(in[0], tab.cos, tab.sin); },
                           [&](const std::vector<Tensor>& in) { return composed_rope(in[0], tab.cos, tab.sin); }, {x});
}

// A decoding step at position p passes table rows [p, p + T): the result is the full sequence's
// rows. Rotations keep each pair's length.
TEST(Rotary, OffsetRowsAndNormPreserved) {
  RopeTables tab = rope_tables(12, 8, 10000.0);
  Generator g(3);
  Tensor x = randn({1, 12, 2, 8}, DType::F32, &g);
  Tensor full = rotary_embedding(x, tab.cos, tab.sin);
  Tensor step = rotary_embedding(x.narrow(1, 9, 2), tab.cos.narrow(0, 9, 2), tab.sin.narrow(0, 9, 2));
  EXPECT_EQ(step.to_vector(), full.narrow(1, 9, 2).contiguous().to_vector());
  Tensor n_in = sum(mul(x, x), {3}), n_out = sum(mul(full, full), {3});
  const std::vector<double> a = n_in.to_vector(), b = n_out.to_vector();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * a[i]);
}

TEST(Rotary, ValidatesArguments) {
  using test::error_of;
  RopeTables tab = rope_tables(4, 8);
  Tensor x = zeros({1, 4, 2, 8});
  EXPECT_EQ(error_of([&] {
              rotary_embedding(zeros({4, 2, 8}), tab.cos, tab.sin);
            }),
            "rotary_embedding: x must have 4 dimensions [B, T, H, D], found 3 (shape [4, 2, 8])");
  EXPECT_EQ(error_of([&] {
              rotary_embedding(zeros({1, 4, 2, 7}), tab.cos, tab.sin);
            }),
            "rotary_embedding: the head dim D of x [B, T, H, D] must be even (pairs i and i + D/2), found 7");
  EXPECT_EQ(error_of([&] {
              rotary_embedding(zeros({1, 5, 2, 8}), tab.cos, tab.sin);
            }),
            "rotary_embedding: cos must be [T, D/2] = [5, 4] for x [1, 5, 2, 8], found [4, 4]");
  EXPECT_EQ(error_of([&] { rotary_embedding(x, tab.cos.to(DType::BF16), tab.sin); }),
            "rotary_embedding: cos must be f32 (or f64 for f64 x), found bf16 for x f32");
  EXPECT_EQ(error_of([&] { rotary_embedding(x, tab.cos.to(DType::F64), tab.sin.to(DType::F64)); }),
            "rotary_embedding: cos must be f32 (or f64 for f64 x), found f64 for x f32");
  EXPECT_EQ(error_of([&] { rotary_embedding(x.to(DType::I64), tab.cos, tab.sin); }),
            "rotary_embedding: x must be a floating-point tensor, found i64");
  EXPECT_EQ(error_of([] { rope_tables(4, 7); }), "rope_tables: head_dim must be even and positive, found 7");
  RopeScaling bad;
  bad.type = RopeScaling::Type::Llama3;
  bad.high_freq_factor = 0.5;
  EXPECT_EQ(error_of([&] { rope_tables(4, 8, 10000.0, bad); }),
            "rope_tables: llama3 scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
            "original_max_position_embeddings > 0, found factor 8, low_freq_factor 1, high_freq_factor 0.5, "
            "original_max_position_embeddings 8192");
}
