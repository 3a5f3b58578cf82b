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

// Cross-entropy reads 16-bit logits in its kernels instead of widening them: the loss and the
// logits' gradient are those of the widened computation up to the order of the f32 sums, without
// the f32 copy of the logits (for a language model's vocabulary, the largest tensor of the step).
TEST(Autocast, CrossEntropyReadsSixteenBitLogitsAsWideningWould) {
  const int64_t N = 64, C = 4096;
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    Generator g(7);
    Tensor base = mul(randn({N, C}, {}, &g), 3.0).to(dt);
    Tensor t = randint(0, C, {N}, DType::I64, &g);
    t.data<int64_t>()[5] = -100;  // an ignored position
    Tensor widened = base.detach().requires_grad_();
    Tensor want = cross_entropy(widened.to(DType::F32), t, -100, 0.1);
    want.backward();

    Tensor read = base.detach().requires_grad_();
    Allocator& alloc = allocator_for(Device::cpu());
    const int64_t before = alloc.stats().allocated_bytes;
    alloc.reset_peak();
    Tensor got;
    {
      AutocastGuard ac(dt);
      got = cross_entropy(read, t, -100, 0.1);
    }
    // The forward keeps per-row statistics only: far below an f32 copy of the logits.
    EXPECT_LT(alloc.stats().peak_allocated_bytes - before, N * C * 4 / 4);
    EXPECT_EQ(got.dtype(), DType::F32);
    EXPECT_NEAR(got.item<float>(), want.item<float>(), 1e-6 * std::fabs(want.item<float>()));
    got.backward();
    EXPECT_EQ(read.grad().dtype(), dt);
    // Each element rounds the same f32 value give or take a few f32 ulps of the row's terms (the
    // smoothing term cancels exp(x - lse) in the smallest ones): mostly the same 16-bit value.
    const std::vector<double> gr = read.grad().to_vector(), gw = widened.grad().to_vector();
    double largest = 0;
    for (double v : gw) largest = std::max(largest, std::fabs(v));
    const int mantissa = dt == DType::BF16 ? 7 : 10;
    const double subnormal_step = dt == DType::BF16 ? 0.0 : std::ldexp(1.0, -24);  // f16's, below 2^-14
    int64_t differ = 0;
    for (size_t i = 0; i < gr.size(); ++i) {
      EXPECT_NEAR(gr[i], gw[i], std::ldexp(std::fabs(gw[i]), -mantissa) + subnormal_step + 1e-6 * largest) << i;
      differ += gr[i] != gw[i];
    }
    EXPECT_LT(differ, N * C / 100);

    AutocastGuard ac(dt);  // per-position losses too
    Tensor none = cross_entropy(base, t, -100, 0.0, Reduction::None);
    EXPECT_EQ(none.dtype(), DType::F32);
    const std::vector<double> lr = none.to_vector(),
                              lw = cross_entropy(base.to(DType::F32), t, -100, 0.0, Reduction::None).to_vector();
    for (size_t i = 0; i < lr.size(); ++i) EXPECT_NEAR(lr[i], lw[i], 1e-6 * std::fabs(lw[i])) << i;
  }
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
