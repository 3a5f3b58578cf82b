// Activation checkpointing (autograd::checkpoint, nn::CheckpointableBlock): gradients through a
// checkpointed function are f64-gradchecked and equal bit for bit to those without checkpointing
// (same ops, same order, same dropout masks), BatchNorm's running statistics are updated once,
// and a checkpointed GPT's forward+backward peaks at less allocator memory.
#include <gtest/gtest.h>

#include <cstdio>

#include "fasttrain/activation_checkpoint.h"
#include "fasttrain/allocator.h"
#include "fasttrain/autocast.h"
#include "fasttrain/fasttrain.h"
#include "fasttrain/nn.h"
#include "support/expect_error.h"
#include "support/gradcheck.h"

using namespace ft;
using autograd::backward;
using autograd::checkpoint;
using test::expect_error;

namespace {

Tensor leaf(const Shape& shape, uint64_t seed, DType dt = DType::F32) {
  Generator g(seed);
  return randn(shape, TensorOptions(dt), &g).requires_grad_(true);
}

// A two-layer function with a captured parameter `w2` (not among the checkpoint's inputs).
std::vector<Tensor> two_layers(const std::vector<Tensor>& in, const Tensor& w2) {
  Tensor h = tanh(matmul(in[0], in[1]));
  return {matmul(h, w2), sum(mul(h, h))};
}

std::vector<double> grad_of(const Tensor& t) { return t.grad().to_vector(); }

}  // namespace

TEST(ActivationCheckpoint, GradcheckThroughInputsAndCapturedParameters) {
  Tensor x = leaf({3, 4}, 1, DType::F64), w1 = leaf({4, 5}, 2, DType::F64), w2 = leaf({5, 2}, 3, DType::F64);
  // w2 is only captured: its gradient reaches grad()'s results through the nested pass.
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        Tensor w2 = in[2];
        auto outs = checkpoint([w2](const std::vector<Tensor>& a) { return two_layers(a, w2); }, {in[0], in[1]});
        return add(outs[0], outs[1]);
      },
      {x, w1, w2});
}

TEST(ActivationCheckpoint, GradientsEqualWithoutCheckpointing) {
  Tensor x = leaf({6, 8}, 1), w1 = leaf({8, 16}, 2), w2 = leaf({16, 3}, 3);
  auto loss_of = [&](const std::vector<Tensor>& outs) { return add(sum(mul(outs[0], outs[0])), outs[1]); };
  backward({loss_of(two_layers({x, w1}, w2))});
  std::vector<double> gx = grad_of(x), gw1 = grad_of(w1), gw2 = grad_of(w2);
  zero_grad({x, w1, w2});
  auto outs = checkpoint([&](const std::vector<Tensor>& a) { return two_layers(a, w2); }, {x, w1});
  EXPECT_EQ(outs[0].grad_fn()->name(), "CheckpointBackward");
  backward({loss_of(outs)});
  EXPECT_EQ(grad_of(x), gx);
  EXPECT_EQ(grad_of(w1), gw1);
  EXPECT_EQ(grad_of(w2), gw2);
}

TEST(ActivationCheckpoint, GradOfACheckpointLeavesEveryGradAlone) {
  Tensor x = leaf({6, 8}, 1), w1 = leaf({8, 16}, 2), w2 = leaf({16, 3}, 3);
  auto fn = [&](const std::vector<Tensor>& a) { return two_layers(a, w2); };
  std::vector<Tensor> plain = autograd::grad({sum(fn({x, w1})[0])}, {x, w2});
  std::vector<Tensor> ck = autograd::grad({sum(checkpoint(fn, {x, w1})[0])}, {x, w2});
  EXPECT_EQ(ck[0].to_vector(), plain[0].to_vector());
  EXPECT_EQ(ck[1].to_vector(), plain[1].to_vector());
  for (const Tensor& t : {x, w1, w2}) EXPECT_FALSE(t.grad().defined());
}

TEST(ActivationCheckpoint, NonGradIntegerAndUnusedInputsAndOutputs) {
  Tensor table = leaf({10, 4}, 1), w = leaf({4, 4}, 2);
  Tensor scale = full({4}, 0.5);  // does not require grad
  Tensor ids = from_vector({3, 1, 3, 7}, {2, 2}, DType::I64);
  auto fn = [&](const std::vector<Tensor>& in) {
    Tensor e = embedding(in[2], in[0]);
    Tensor used = mul(matmul(e, w), in[1]);
    return std::vector<Tensor>{used, relu(e), in[2].clone()};  // relu(e) unused, the ids integer
  };
  backward({sum(fn({table, scale, ids})[0])});
  std::vector<double> gt = grad_of(table), gw = grad_of(w);
  zero_grad({table, w});
  auto outs = checkpoint(fn, {table, scale, ids});
  EXPECT_FALSE(outs[2].requires_grad());
  backward({sum(outs[0])});
  EXPECT_EQ(grad_of(table), gt);
  EXPECT_EQ(grad_of(w), gw);
  EXPECT_FALSE(scale.grad().defined());
}

TEST(ActivationCheckpoint, OutputsThatAreAnInputOrAParameterKeepTheirOwnHistory) {
  Tensor x = leaf({3}, 1), w = leaf({3}, 2);
  auto outs = checkpoint([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0], w}; }, {x});
  EXPECT_TRUE(x.is_leaf());  // the node got aliases, not x itself
  EXPECT_TRUE(w.is_leaf());
  backward({add(sum(mul(outs[0], 2.0)), sum(mul(outs[1], 3.0)))});
  EXPECT_EQ(grad_of(x), std::vector<double>(3, 2.0));
  EXPECT_EQ(grad_of(w), std::vector<double>(3, 3.0));
}

TEST(ActivationCheckpoint, WithoutGradModeOrGradInputsItIsThePlainFunction) {
  Tensor x = leaf({2, 3}, 1), w = leaf({3, 3}, 2);
  auto fn = [&](const Tensor& a) { return matmul(a, w); };
  {
    autograd::NoGradGuard ng;
    EXPECT_FALSE(checkpoint(fn, x).requires_grad());
  }
  // No input requires grad: fn records its own graph, so w still gets its gradient.
  Tensor y = checkpoint(fn, x.detach());
  EXPECT_NE(y.grad_fn()->name(), "CheckpointBackward");
  backward({sum(y)});
  EXPECT_TRUE(w.grad().defined());
}

TEST(ActivationCheckpoint, RetainGraphRecomputesAgainAndOtherwiseRefusesASecondBackward) {
  Tensor x = leaf({4, 4}, 1), w = leaf({4, 4}, 2);
  auto fn = [&](const Tensor& a) { return tanh(matmul(a, w)); };
  Tensor loss = sum(checkpoint(fn, x));
  backward({loss}, {}, /*retain_graph=*/true);
  std::vector<double> once = grad_of(w);
  backward({loss});
  std::vector<double> twice = grad_of(w);
  for (size_t i = 0; i < once.size(); ++i) EXPECT_EQ(twice[i], once[i] + once[i]);
  expect_error([&] { backward({loss}); }, "retain_graph");
}

TEST(ActivationCheckpoint, DropoutMasksMatchAndTheRandomStreamIsUndisturbed) {
  Tensor x = leaf({64, 32}, 1), w = leaf({32, 32}, 2);
  auto fn = [&](const Tensor& a) { return dropout(matmul(a, w), 0.5); };
  manual_seed(7);
  backward({sum(mul(fn(x), fn(x)))});
  std::vector<double> gx = grad_of(x), gw = grad_of(w);
  GeneratorState after_plain = default_generator().state();
  zero_grad({x, w});
  manual_seed(7);
  Tensor a = checkpoint(fn, x), b = checkpoint(fn, x);  // two different masks
  GeneratorState after_forward = default_generator().state();
  backward({sum(mul(a, b))});
  EXPECT_EQ(grad_of(x), gx);
  EXPECT_EQ(grad_of(w), gw);
  EXPECT_EQ(default_generator().state().offset, after_forward.offset);
  EXPECT_EQ(after_forward.offset, after_plain.offset);
}

TEST(ActivationCheckpoint, RecomputesUnderTheForwardsAutocastState) {
  Tensor x = leaf({8, 16}, 1), w = leaf({16, 16}, 2);
  auto fn = [&](const Tensor& a) { return gelu(matmul(a, w)); };
  Tensor plain;
  {
    autocast::AutocastGuard ac(DType::BF16);
    plain = fn(x);
  }
  backward({sum(plain.to(DType::F32))});
  std::vector<double> gx = grad_of(x), gw = grad_of(w);
  zero_grad({x, w});
  Tensor ck;
  {
    autocast::AutocastGuard ac(DType::BF16);
    ck = checkpoint(fn, x);
  }
  EXPECT_EQ(ck.dtype(), DType::BF16);
  backward({sum(ck.to(DType::F32))});  // outside autocast: the recompute must still run in bf16
  EXPECT_EQ(grad_of(x), gx);
  EXPECT_EQ(grad_of(w), gw);
}

TEST(ActivationCheckpoint, NestedCheckpointsReenterTheEngine) {
  Tensor x = leaf({5, 6}, 1), w = leaf({6, 6}, 2);
  auto inner = [&](const Tensor& a) { return tanh(matmul(a, w)); };
  auto outer = [&](const Tensor& a) { return mul(checkpoint(inner, a), a); };
  backward({sum(mul(inner(x), x))});
  std::vector<double> gx = grad_of(x), gw = grad_of(w);
  zero_grad({x, w});
  backward({sum(checkpoint(outer, x))});
  EXPECT_EQ(grad_of(x), gx);
  EXPECT_EQ(grad_of(w), gw);
  EXPECT_FALSE(autograd::recomputing());
}

TEST(ActivationCheckpoint, Errors) {
  Tensor x = leaf({2, 2}, 1);
  expect_error([&] { checkpoint(autograd::CheckpointFn(), {x}); }, "expected a function, found an empty one");
  expect_error(
      [&] {
        checkpoint([](const std::vector<Tensor>& in) { return in; }, {x, Tensor()});
      },
      "input 1 is undefined");
  // A function that does something else when re-run.
  int calls = 0;
  auto flaky = [&](const std::vector<Tensor>& in) {
    ++calls;
    return calls == 1 ? std::vector<Tensor>{mul(in[0], 2.0)} : std::vector<Tensor>{sum(in[0])};
  };
  Tensor y = checkpoint(flaky, {x})[0];
  expect_error([&] { backward({sum(y)}); }, "must do the same thing when run again");
  // An input changed in place between forward and backward.
  Tensor z = leaf({3}, 2).detach().requires_grad_(true);
  Tensor base = mul(z, 1.0);
  Tensor out = checkpoint([](const Tensor& a) { return mul(a, a); }, base);
  {
    autograd::NoGradGuard ng;
    add_(base, ones({3}));
  }
  expect_error([&] { backward({sum(out)}); }, "modified in place");
  expect_error(
      [] {
        nn::Linear lin(2, 2);
        nn::set_activation_checkpointing(lin, true);
      },
      "expected a model with checkpointable blocks (GPT, a ResNet), found none in a Linear");
}

namespace {

// Loss and every parameter's gradient of one training step.
struct Step {
  double loss;
  std::vector<std::vector<double>> grads;
};

Step gpt_step(nn::GPT& model, const Tensor& ids, const Tensor& targets, uint64_t seed) {
  model.zero_grad();
  manual_seed(seed);
  Tensor logits = model.forward(ids);
  Tensor loss = cross_entropy(logits.flatten(0, 1), targets.flatten());
  backward({loss});
  Step s{loss.item<double>(), {}};
  for (auto& p : model.parameters()) s.grads.push_back(grad_of(p));
  return s;
}

}  // namespace

TEST(ActivationCheckpoint, GPTWithDropoutGetsIdenticalGradients) {
  nn::GPTConfig cfg = nn::GPTConfig::preset("gpt-mini");
  cfg.layers = 2;
  cfg.dropout = 0.2;
  Generator g(3);
  nn::GPT model(cfg, &g);
  Tensor ids = randint(0, cfg.vocab_size, {2, 32}, DType::I64, &g);
  Tensor targets = randint(0, cfg.vocab_size, {2, 32}, DType::I64, &g);
  auto keys = [&] {
    std::vector<std::string> k;
    for (auto& [name, _] : model.state_dict()) k.push_back(name);
    return k;
  };
  std::vector<std::string> names = keys();
  Step plain = gpt_step(model, ids, targets, 11);
  model.set_activation_checkpointing(true);
  EXPECT_EQ(keys(), names);
  Step ck = gpt_step(model, ids, targets, 11);
  EXPECT_EQ(ck.loss, plain.loss);
  ASSERT_EQ(ck.grads.size(), plain.grads.size());
  for (size_t i = 0; i < ck.grads.size(); ++i) EXPECT_EQ(ck.grads[i], plain.grads[i]) << "parameter " << i;
  Step other_seed = gpt_step(model, ids, targets, 12);  // dropout is really on
  EXPECT_NE(other_seed.loss, plain.loss);
}

TEST(ActivationCheckpoint, ResNetWithBatchNormUpdatesRunningStatisticsOnce) {
  auto run = [](bool checkpointing) {
    Generator g(5);
    auto net = nn::resnet("resnet20", 10, &g);
    if (checkpointing) EXPECT_EQ(nn::set_activation_checkpointing(*net, true), 9);
    Tensor x = randn({4, 3, 16, 16}, {}, &g);
    Tensor y = randint(0, 10, {4}, DType::I64, &g);
    backward({cross_entropy(net->forward(x), y)});
    std::vector<std::vector<double>> out;
    for (auto& p : net->parameters()) out.push_back(grad_of(p));
    for (auto& [name, b] : net->named_buffers()) out.push_back(b.to_vector());  // running stats, counts
    return out;
  };
  std::vector<std::vector<double>> plain = run(false), ck = run(true);
  ASSERT_EQ(ck.size(), plain.size());
  for (size_t i = 0; i < ck.size(); ++i) EXPECT_EQ(ck[i], plain[i]) << "parameter or buffer " << i;
}

TEST(ActivationCheckpoint, GPTPeakMemoryFalls) {
  nn::GPTConfig cfg = nn::GPTConfig::preset("gpt-mini");  // 4 layers, width 256, context 128
  Generator g(9);
  nn::GPT model(cfg, &g);
  Tensor ids = randint(0, cfg.vocab_size, {8, cfg.context}, DType::I64, &g);
  Tensor targets = randint(0, cfg.vocab_size, {8, cfg.context}, DType::I64, &g);
  Allocator& alloc = allocator_for(Device::cpu());
  auto peak = [&](bool checkpointing) {
    model.set_activation_checkpointing(checkpointing);
    model.zero_grad();
    alloc.reset_peak();
    int64_t before = alloc.stats().allocated_bytes;
    backward({cross_entropy(model.forward(ids).flatten(0, 1), targets.flatten())});
    return alloc.stats().peak_allocated_bytes - before;
  };
  int64_t plain = peak(false), ck = peak(true);
  std::printf(
      "gpt-mini B=8 T=%lld forward+backward peak allocator memory: %.1f MiB without, %.1f MiB with "
      "activation checkpointing\n",
      static_cast<long long>(cfg.context), plain / 1048576.0, ck / 1048576.0);
  EXPECT_LT(ck, plain);
}
