#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "fasttrain/fasttrain.h"
#include "support/gradcheck.h"

using namespace ft;

TEST(Autograd, ChainRuleThroughSharedInputs) {
  Tensor x = from_vector({1, 2, 3}, {3}, DType::F64).requires_grad_();
  Tensor y = mul(x, x);            // x^2
  Tensor z = add(y, mul(x, 3.0));  // x^2 + 3x
  sum(z).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{5, 7, 9}));
}

TEST(Autograd, GradientsAccumulateAcrossBackwardCalls) {
  Tensor x = from_vector({1, 2}, {2}).requires_grad_();
  sum(mul(x, 2.0)).backward();
  sum(mul(x, 2.0)).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{4, 4}));
  zero_grad({x});
  EXPECT_FALSE(x.grad().defined());  // set to none by default
  sum(mul(x, 2.0)).backward();
  zero_grad({x}, /*set_to_none=*/false);
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 0}));
}

TEST(Autograd, SecondBackwardNeedsRetainGraph) {
  Tensor x = from_vector({1, 2}, {2}).requires_grad_();
  Tensor y = sum(exp(x));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  EXPECT_NEAR(x.grad().to_vector()[0], 2 * std::exp(1.0), 1e-5);
  Tensor y2 = sum(exp(x));
  y2.backward();
  try {
    y2.backward();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("second time"), std::string::npos) << e.what();
  }
}

TEST(Autograd, DetachAndNoGrad) {
  Tensor x = ones({2}).requires_grad_();
  Tensor d = x.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.storage().get(), x.storage().get());
  {
    autograd::NoGradGuard ng;
    Tensor y = mul(x, 2.0);
    EXPECT_FALSE(y.requires_grad());
  }
  {
    autograd::InferenceMode im;
    Tensor y = mul(x, 2.0);
    EXPECT_FALSE(y.requires_grad());
    uint32_t v = y.version();
    y.fill_(1);
    EXPECT_EQ(y.version(), v);  // inference mode skips version tracking
  }
  Tensor y = mul(x, 2.0);
  EXPECT_TRUE(y.requires_grad());
  EXPECT_FALSE(y.is_leaf());
}

TEST(Autograd, InPlaceModificationOfSavedTensorIsDetected) {
  Tensor x = from_vector({1, 2}, {2}).requires_grad_();
  Tensor e = exp(x);  // saves its output
  Tensor y = sum(e);
  {
    autograd::NoGradGuard ng;
    e.fill_(0);
  }
  try {
    y.backward();
    FAIL();
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("modified in place"), std::string::npos) << err.what();
  }
}

TEST(Autograd, InPlaceOnTensorRequiringGradIsRefused) {
  Tensor x = ones({2}).requires_grad_();
  EXPECT_THROW(x.fill_(0), Error);
  autograd::NoGradGuard ng;
  x.fill_(0);  // allowed without grad mode (optimizer updates)
  EXPECT_EQ(x.to_vector(), (std::vector<double>{0, 0}));
}

TEST(Autograd, HooksSeeAndReplaceGradients) {
  Tensor x = from_vector({1, 2}, {2}).requires_grad_();
  std::vector<double> seen;
  x.register_hook([&](const Tensor& g) {
    seen = g.to_vector();
    return mul(g, 10.0);
  });
  int ready = 0;
  x.register_post_accumulate_grad_hook([&](Tensor& p) {
    ++ready;
    EXPECT_TRUE(p.grad().defined());
  });
  Tensor h = mul(x, 3.0);
  std::vector<double> seen_h;
  h.register_hook([&](const Tensor& g) {
    seen_h = g.to_vector();
    return Tensor();
  });
  sum(h).backward();
  EXPECT_EQ(seen_h, (std::vector<double>{1, 1}));
  EXPECT_EQ(seen, (std::vector<double>{3, 3}));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{30, 30}));
  EXPECT_EQ(ready, 1);
}

TEST(Autograd, RetainGradOnIntermediate) {
  Tensor x = from_vector({1, 2}, {2}).requires_grad_();
  Tensor h = mul(x, x);
  h.retain_grad();
  sum(mul(h, 2.0)).backward();
  EXPECT_EQ(h.grad().to_vector(), (std::vector<double>{2, 2}));
}

TEST(Autograd, GradFunctionDoesNotTouchDotGrad) {
  Tensor x = from_vector({1, 2}, {2}, DType::F64).requires_grad_();
  Tensor y = sum(mul(x, x));
  std::vector<Tensor> g = autograd::grad({y}, {x});
  EXPECT_EQ(g[0].to_vector(), (std::vector<double>{2, 4}));
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, BackwardThroughViews) {
  Tensor x = arange(0, 12, 1, DType::F64).reshape({3, 4}).detach().requires_grad_();
  Tensor y = x.t().slice(0, 1, 3).reshape({2, 3}).unsqueeze(0).expand({2, 2, 3});
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 2, 2, 0, 0, 2, 2, 0, 0, 2, 2, 0}));
}

TEST(Autograd, ViewOpsGradcheck) {
  Tensor x = randn({3, 4, 5}, DType::F64).requires_grad_();
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return in[0].transpose(0, 2).reshape({20, 3}); }, {x});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return in[0].permute({1, 2, 0}).slice(0, 1, 4, 2); }, {x});
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        return in[0].select(1, 2).unsqueeze(1).expand({3, 6, 5});
      },
      {x});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return in[0].narrow(2, 1, 3).contiguous().view({-1}); }, {x});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return in[0].to(DType::F32).to(DType::F64); }, {x},
                   test::GradcheckOptions{1e-3, 1e-4, 1e-3});
}

TEST(Autograd, ErrorsAreClear) {
  Tensor x = ones({2, 2}).requires_grad_();
  Tensor y = mul(x, 2.0);
  try {
    y.backward();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("implicit ones only for one-element outputs"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ones({2}).backward(), Error);   // does not require grad
  EXPECT_THROW(y.backward(ones({3})), Error);  // wrong gradient shape
}

// Gradients meeting at one input are summed in place when the engine alone holds the first:
// test ops whose backward returns a gradient made by `backward` from the incoming one.
namespace {
Tensor through(const Tensor& x, std::function<Tensor(const Tensor&)> backward) {
  Tensor y = x.detach().clone();
  autograd::record_function("Through", {&x}, {&y},
                            [backward](std::vector<Tensor>& g) { return std::vector<Tensor>{backward(g[0])}; });
  return y;
}
}  // namespace

TEST(Autograd, GradientsMeetingAtAnInputAreSummedInTheFirstBuffer) {
  Tensor x = from_vector({1, 2, 3}, {3}, DType::F64).requires_grad_();
  const void* first = nullptr;
  Tensor a = mul(x, 2.0);
  // Created last, so it runs first: its fresh gradient is the buffer the other one is added to.
  Tensor b = through(x, [&](const Tensor& g) {
    Tensor fresh = mul(g, 5.0);
    first = fresh.raw_data();
    return fresh;
  });
  sum(add(a, b)).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{7, 7, 7}));
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(x.grad().raw_data(), first);  // summed in place, then taken by .grad as it is
}

TEST(Autograd, GradientsSeenElsewhereAreNotOverwrittenBySums) {
  // A gradient the op keeps a reference to.
  Tensor x = from_vector({1, 2}, {2}, DType::F64).requires_grad_();
  Tensor kept;
  Tensor a = mul(x, 2.0);
  Tensor b = through(x, [&](const Tensor& g) {
    kept = mul(g, 5.0);
    return kept;
  });
  sum(add(a, b)).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{7, 7}));
  EXPECT_EQ(kept.to_vector(), (std::vector<double>{5, 5}));

  // An expanded gradient, where every element is the same memory.
  Tensor z = from_vector({1, 2, 3}, {3}, DType::F64).requires_grad_();
  Tensor c = mul(z, 2.0);
  Tensor d = through(z, [](const Tensor& g) { return from_vector({4}, {1}, DType::F64).expand({3}); });
  sum(add(c, d)).backward();
  EXPECT_EQ(z.grad().to_vector(), (std::vector<double>{6, 6, 6}));

  // Gradients given by the caller for outputs that meet at one node.
  Tensor w = from_vector({1, 2}, {2}, DType::F64).requires_grad_();
  Tensor y = mul(w, 3.0);
  Tensor g1 = from_vector({1, 1}, {2}, DType::F64), g2 = from_vector({2, 2}, {2}, DType::F64);
  autograd::backward({y, y}, {g1, g2});
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{9, 9}));
  EXPECT_EQ(g1.to_vector(), (std::vector<double>{1, 1}));
  EXPECT_EQ(g2.to_vector(), (std::vector<double>{2, 2}));
}
