#include <gtest/gtest.h>

#include <cmath>

#include "fasttrain/autocast.h"
#include "fasttrain/fasttrain.h"

using namespace ft;
using autocast::AutocastGuard;

TEST(Autocast, LowPrecisionOpsRunInBf16WithF32MasterGradients) {
  Generator g(1);
  Tensor x = randn({8, 16}, {}, &g);
  Tensor w = randn({4, 16}, {}, &g).requires_grad_();
  Tensor b = randn({4}, {}, &g).requires_grad_();
  Tensor y;
  {
    AutocastGuard ac(DType::BF16);
    y = linear(x, w, b);
  }
  EXPECT_EQ(y.dtype(), DType::BF16);
  Tensor ref = linear(x.to(DType::BF16), w.detach().to(DType::BF16), b.detach().to(DType::BF16));
  EXPECT_EQ(y.to_vector(), ref.to_vector());  // the same computation, bit for bit
  sum(y.to(DType::F32)).backward();
  EXPECT_EQ(w.grad().dtype(), DType::F32);
  EXPECT_EQ(b.grad().dtype(), DType::F32);
  // d sum(x W^T) / dW = column sums of x, rounded to bf16 on the way (x was cast)
  Tensor expected = sum(x.to(DType::BF16).to(DType::F32), {0}).unsqueeze(0).expand({4, 16});
  std::vector<double> got = w.grad().to_vector(), want = expected.contiguous().to_vector();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 0.05 + 0.01 * std::fabs(want[i]));
}

TEST(Autocast, F32ClassOpsWidenSixteenBitInputs) {
  Tensor x = randn({4, 10}).to(DType::BF16);
  Tensor t = randint(0, 10, {4});
  AutocastGuard ac(DType::BF16);
  EXPECT_EQ(softmax(x, 1).dtype(), DType::F32);
  EXPECT_EQ(log_softmax(x, 1).dtype(), DType::F32);
  EXPECT_EQ(cross_entropy(x, t).dtype(), DType::F32);
  // ops outside both classes keep their inputs' dtype
  EXPECT_EQ(relu(x).dtype(), DType::BF16);
  EXPECT_EQ(layer_norm(x, {10}).dtype(), DType::BF16);
}

TEST(Autocast, EachParameterIsCastOncePerRegion) {
  Tensor w = randn({8, 8}).requires_grad_();
  Tensor x = randn({2, 8});
  int64_t before = autocast::cache_hits();
  Tensor y;
  {
    AutocastGuard ac;
    Tensor h = linear(x, w);
    y = linear(h, w);  // second use: served from the cache
  }
  EXPECT_EQ(autocast::cache_hits(), before + 1);
  sum(y.to(DType::F32)).backward();
  EXPECT_TRUE(w.grad().defined());
  // Both uses contribute to the gradient through the one cached cast.
  Tensor w2 = w.detach().requires_grad_();
  {
    AutocastGuard ac;
    Tensor y2 = linear(linear(x, w2), w2);
    sum(y2.to(DType::F32)).backward();
  }
  EXPECT_EQ(w.grad().to_vector(), w2.grad().to_vector());
  {
    AutocastGuard ac;  // a new region starts with an empty cache
    int64_t hits = autocast::cache_hits();
    linear(x, w);
    EXPECT_EQ(autocast::cache_hits(), hits);
  }
}

TEST(Autocast, InPlaceUpdateInvalidatesTheCachedCast) {
  Tensor w = ones({2, 2}).requires_grad_();
  Tensor x = ones({1, 2});
  AutocastGuard ac;
  Tensor a = linear(x, w);
  {
    autograd::NoGradGuard ng;
    w.fill_(2);
  }
  Tensor b = linear(x, w);
  EXPECT_EQ(a.to_vector(), (std::vector<double>{2, 2}));
  EXPECT_EQ(b.to_vector(), (std::vector<double>{4, 4}));
}

TEST(Autocast, NestedDisabledRegionAndValidation) {
  Tensor x = randn({2, 3});
  Tensor w = randn({3, 3});
  AutocastGuard ac(DType::BF16);
  {
    AutocastGuard off(DType::BF16, false);
    EXPECT_EQ(matmul(x, w).dtype(), DType::F32);
  }
  EXPECT_EQ(matmul(x, w).dtype(), DType::BF16);
  EXPECT_THROW(AutocastGuard bad(DType::F64), Error);
}

TEST(Autocast, ConvAndAttentionFollowThePolicy) {
  Tensor x = randn({2, 3, 8, 8});
  Tensor w = mul(randn({4, 3, 3, 3}), 0.1).requires_grad_();
  Tensor q = randn({1, 2, 5, 8});
  AutocastGuard ac(DType::BF16);
  Tensor y = conv2d(x, w, Tensor(), {1, 1}, {1, 1});
  EXPECT_EQ(y.dtype(), DType::BF16);
  EXPECT_EQ(scaled_dot_product_attention(q, q, q, true).dtype(), DType::BF16);
  sum(y.to(DType::F32)).backward();
  EXPECT_EQ(w.grad().dtype(), DType::F32);
}
