#include <gtest/gtest.h>

#include <cmath>

#include "fasttrain/fasttrain.h"
#include "ops/mask_parts.h"
#include "support/gradcheck.h"

using namespace ft;

namespace {

// The value a kept element must have: x times 1/(1-p), rounded as the dtype's kernel does
// (multiply in the compute type, one rounding to the storage type).
double expected_kept(double x, double p, DType dt) {
  if (dt == DType::F64) return x * (1.0 / (1.0 - p));
  float v = static_cast<float>(x) * static_cast<float>(1.0 / (1.0 - p));
  return full({}, static_cast<double>(v), DType::F32).to(dt).item<double>();
}

}  // namespace

TEST(Dropout, KeepFractionAndExactScaling) {
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    for (double p : {0.1, 0.5, 0.8}) {
      Generator g(42), gx(1);
      const int64_t n = 40000;
      Tensor x = add(abs(randn({n}, {}, &gx)), 0.25).to(dt);  // no zeros, so y == 0 means dropped
      Tensor y = dropout(x, p, true, &g);
      EXPECT_EQ(y.dtype(), dt);
      std::vector<double> xv = x.to_vector(), yv = y.to_vector();
      int64_t kept = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (yv[i] == 0) continue;
        ++kept;
        ASSERT_EQ(yv[i], expected_kept(xv[i], p, dt)) << "element " << i;
      }
      // binomial std is sqrt(p(1-p)/n) <= 0.0025; allow 6 sigma
      EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 0.015) << "p " << p;
    }
  }
}

TEST(Dropout, MaskIsTheCounterBasedBernoulliMask) {
  // Element i uses counter base + i/4, word i%4, exactly like bernoulli_mask, so the two agree
  // for the same generator state, and the generator advances by the same amount.
  Generator g1(77), g2(77);
  Tensor x = ones({3, 37});
  Tensor y = dropout(x, 0.3, true, &g1);
  Tensor m = bernoulli_mask({3, 37}, 0.7, {}, &g2);
  EXPECT_EQ(ne(y, zeros_like(y)).to(DType::F32).to_vector(), m.to_vector());
  EXPECT_EQ(g1.state().offset, g2.state().offset);
  // the next draw continues from the advanced counter: a different mask
  Tensor y2 = dropout(x, 0.3, true, &g1);
  EXPECT_NE(y.to_vector(), y2.to_vector());
}

TEST(Dropout, DeterministicAcrossThreadCounts) {
  const int prev = get_num_threads();
  Generator gx(3);
  Tensor x = randn({257, 1031}, {}, &gx);  // large enough to be split across threads
  set_num_threads(1);
  Generator g1(123);
  std::vector<double> a = dropout(x, 0.4, true, &g1).to_vector();
  set_num_threads(2);
  Generator g2(123);
  std::vector<double> b = dropout(x, 0.4, true, &g2).to_vector();
  set_num_threads(prev);
  EXPECT_EQ(a, b);
}

TEST(Dropout, BackwardUsesTheForwardMask) {
  Generator g(5), gx(6);
  Tensor x = add(abs(randn({50, 40}, {}, &gx)), 0.5).detach().requires_grad_();
  Tensor y = dropout(x, 0.35, true, &g);
  Tensor gy = randn({50, 40}, {}, &gx);
  y.backward(gy);
  std::vector<double> yv = y.to_vector(), gyv = gy.to_vector(), gxv = x.grad().to_vector();
  const float scale = static_cast<float>(1.0 / 0.65);
  for (size_t i = 0; i < yv.size(); ++i) {
    double expect = yv[i] != 0 ? static_cast<double>(static_cast<float>(gyv[i]) * scale) : 0.0;
    ASSERT_EQ(gxv[i], expect) << "element " << i;
  }
}

TEST(Dropout, NonContiguousInputUsesLogicalOrder) {
  Generator gx(8);
  Tensor base = randn({30, 20}, {}, &gx);
  Tensor xt = base.t();  // [20, 30], non-contiguous
  Generator g1(9), g2(9);
  Tensor a = dropout(xt, 0.5, true, &g1);
  Tensor b = dropout(xt.contiguous(), 0.5, true, &g2);
  EXPECT_EQ(a.shape(), xt.shape());
  EXPECT_EQ(a.to_vector(), b.to_vector());
}

TEST(Dropout, APartOfTheSequenceDrawsItsPartOfTheWholeMask) {
  // Sequence parallelism: positions [4, 8) of 12 (each of 6 values) drop what dropout of the
  // whole [2, 12, 6] tensor drops there, gradients included, and the generator advances alike.
  const Tensor x = randn({2, 12, 6}, {}, nullptr);
  Generator whole_gen(5), part_gen(5);
  Tensor xw = x.clone().requires_grad_();
  const Tensor y = dropout(xw, 0.3, true, &whole_gen);
  Tensor xp = x.narrow(1, 4, 4).contiguous().requires_grad_();
  const Tensor yp = ops::dropout_of_part(xp, 0.3, true, 4, 12, &part_gen);
  EXPECT_EQ(yp.to_vector(), y.narrow(1, 4, 4).contiguous().to_vector());
  EXPECT_EQ(part_gen.state().offset, whole_gen.state().offset);
  sum(y).backward();
  sum(yp).backward();
  EXPECT_EQ(xp.grad().to_vector(), xw.grad().narrow(1, 4, 4).contiguous().to_vector());
  // Plain dropout of the part draws a mask of its own; a part not starting on a counter block
  // (position 1 of 3 values: element 3) is refused.
  Generator plain_gen(5);
  EXPECT_NE(dropout(x.narrow(1, 4, 4).contiguous(), 0.3, true, &plain_gen).to_vector(), yp.to_vector());
  EXPECT_THROW(ops::dropout_of_part(randn({2, 2, 3}, {}, nullptr), 0.3, true, 1, 4), Error);
}

TEST(Dropout, IdentityZerosAndErrors) {
  Tensor x = randn({4, 5}).requires_grad_();
  EXPECT_TRUE(dropout(x, 0.5, false).same(x));  // eval
  EXPECT_TRUE(dropout(x, 0.0, true).same(x));   // p == 0
  Tensor z = dropout(x, 1.0, true);
  EXPECT_EQ(z.to_vector(), std::vector<double>(20, 0.0));
  sum(z).backward();
  EXPECT_EQ(x.grad().to_vector(), std::vector<double>(20, 0.0));
  for (double p : {1.5, -0.1}) {
    try {
      dropout(x, p);
      ADD_FAILURE() << "no error for p " << p;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("dropout: probability p must be in [0, 1], found"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(dropout(zeros({3}, DType::I64), 0.5), Error);
  // the default generator is used when none is given, and reseeding reproduces the mask
  manual_seed(11);
  std::vector<double> a = dropout(ones({64}), 0.5).to_vector();
  manual_seed(11);
  EXPECT_EQ(dropout(ones({64}), 0.5).to_vector(), a);
}

TEST(DropoutGradcheck, FixedMask) {
  Generator gx(12);
  Tensor x = randn({6, 7}, DType::F64, &gx).requires_grad_();
  Tensor xt = randn({7, 6}, DType::F64, &gx).t().detach().requires_grad_();
  auto fn = [](const std::vector<Tensor>& in) {
    Generator g(99);  // reseeded on every call so each evaluation draws the same mask
    return dropout(in[0], 0.4, true, &g);
  };
  EXPECT_GRADCHECK(fn, {x});
  EXPECT_GRADCHECK(fn, {xt});
}
