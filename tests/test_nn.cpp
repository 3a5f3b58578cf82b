// Module mechanics (naming, tied parameters, modes, state dicts, moves), initialisers and layers'
// behaviour. The models' numbers against PyTorch are in test_models.cpp.
#include <cmath>

#include <gtest/gtest.h>

#include "fasttrain/fasttrain.h"
#include "fasttrain/nn.h"
#include "support/expect_error.h"

using namespace ft;
using test::expect_error;

namespace {

std::vector<std::string> keys(const std::vector<std::pair<std::string, Tensor>>& m) {
  std::vector<std::string> out;
  for (auto& [n, t] : m) out.push_back(n);
  return out;
}

// Two Linear layers sharing one weight, like a tied embedding and head.
struct Tied : nn::Module {
  std::shared_ptr<nn::Linear> a, b;
  Tied() {
    a = register_module("a", std::make_shared<nn::Linear>(3, 3));
    b = register_module("b", std::make_shared<nn::Linear>(a->weight));
  }
  std::string type_name() const override { return "Tied"; }
};

double max_abs_diff(const Tensor& a, const Tensor& b) { return max(abs(a - b)).item<double>(); }

}  // namespace

TEST(Module, NamesFollowPyTorch) {
  auto net = nn::cnn_mini();
  auto names = keys(net->state_dict());
  std::vector<std::string> first{"0.0.weight",       "0.1.weight",      "0.1.bias",
                                 "0.1.running_mean", "0.1.running_var", "0.1.num_batches_tracked",
                                 "1.0.weight"};
  ASSERT_GE(names.size(), first.size());
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + first.size()), first);
  EXPECT_EQ(names.back(), "8.bias");
  EXPECT_EQ(keys(net->named_parameters()).front(), "0.0.weight");
  EXPECT_EQ(keys(net->named_buffers()).front(), "0.1.running_mean");
  auto mods = net->named_modules();
  EXPECT_EQ(mods[0].first, "");
  EXPECT_EQ(mods[1].first, "0");
  EXPECT_EQ(mods[2].first, "0.0");
  EXPECT_EQ(mods[2].second->type_name(), "Conv2d");
  for (auto& [n, p] : net->named_parameters()) {
    EXPECT_TRUE(p.is_leaf()) << n;
    EXPECT_TRUE(p.requires_grad()) << n;
  }
  EXPECT_EQ(net->named_buffers()[2].second.dtype(), DType::I64);  // num_batches_tracked
}

TEST(Module, RegistrationErrors) {
  struct M : nn::Module {
    std::string type_name() const override { return "M"; }
    void add(const std::string& n) { register_parameter(n, zeros({2})); }
    void add_int(const std::string& n) { register_parameter(n, zeros({2}, DType::I64)); }
    void add_buffer(const std::string& n) { register_buffer(n, zeros({2})); }
    void add_module(const std::string& n) { register_module(n, nn::mlp({2, 2})); }
  } m;
  m.add("w");
  expect_error([&] { m.add("w"); }, "M: \"w\" is already registered");
  // Parameters, buffers and submodules share one namespace, whichever comes first.
  expect_error([&] { m.add_buffer("w"); }, "M: \"w\" is already registered (as a parameter)");
  m.add_module("sub");
  expect_error([&] { m.add("sub"); }, "M: \"sub\" is already registered (as a submodule)");
  m.add_buffer("b");
  expect_error([&] { m.add_module("b"); }, "M: \"b\" is already registered (as a buffer)");
  expect_error([&] { m.add("a.b"); }, "must not contain '.'");
  expect_error([&] { m.add_int("i"); }, "must be floating point; found i64");
}

TEST(Module, TiedParametersListedOnceSavedUnderEveryName) {
  Tied t;
  EXPECT_EQ(keys(t.named_parameters()), (std::vector<std::string>{"a.weight", "a.bias"}));
  EXPECT_EQ(t.num_parameters(), 12);
  EXPECT_EQ(keys(t.state_dict()), (std::vector<std::string>{"a.weight", "a.bias", "b.weight"}));
  EXPECT_TRUE(t.a->weight.same(t.b->weight));

  const uint32_t version = t.a->weight.version();
  t.to(Device::cpu());  // nothing to move: not a write
  EXPECT_EQ(t.a->weight.version(), version);
  t.to(DType::F64);
  EXPECT_TRUE(t.a->weight.same(t.b->weight));
  EXPECT_EQ(t.b->weight.dtype(), DType::F64);
  EXPECT_TRUE(t.a->weight.is_leaf() && t.a->weight.requires_grad());
  EXPECT_TRUE(t.parameters()[0].same(t.a->weight));  // registry and member are one tensor

  TensorMap state{{"a.weight", full({3, 3}, 2.0)}, {"a.bias", zeros({3})}, {"b.weight", full({3, 3}, 2.0)}};
  t.load_state_dict(state);
  EXPECT_TRUE(t.a->weight.same(t.b->weight));
  EXPECT_EQ(t.b->weight.dtype(), DType::F64);  // converted to the module's dtype
  EXPECT_EQ(t.b->weight.to_vector()[4], 2.0);
}

TEST(Module, LoadStateDictValidatesBeforeChanging) {
  auto net = nn::mlp({4, 5, 2});
  TensorMap good = net->state_dict();
  std::vector<double> before = net->parameters()[0].to_vector();
  auto with = [&](auto edit) {
    TensorMap s;
    for (auto& [n, t] : good) s.emplace_back(n, full(t.shape(), 7.0));
    edit(s);
    return s;
  };
  auto check_unchanged = [&] { EXPECT_EQ(net->parameters()[0].to_vector(), before); };

  expect_error([&] { net->load_state_dict(with([](TensorMap& s) { s.erase(s.begin() + 1); })); },
               "missing key \"0.bias\" (expected shape [5])");
  check_unchanged();
  expect_error([&] { net->load_state_dict(with([](TensorMap& s) { s.emplace_back("3.weight", zeros({1})); })); },
               "unexpected key \"3.weight\"");
  check_unchanged();
  expect_error([&] { net->load_state_dict(with([](TensorMap& s) { s.back().second = zeros({3}); })); },
               "key \"2.bias\": expected shape [2], found [3]");
  check_unchanged();
  // Non-strict: missing and unexpected keys are allowed, shapes are still checked.
  net->load_state_dict(with([](TensorMap& s) {
                         s.erase(s.begin() + 1);
                         s.emplace_back("extra", zeros({1}));
                       }),
                       /*strict=*/false);
  EXPECT_EQ(net->parameters()[0].to_vector()[0], 7.0);
  EXPECT_NE(net->parameters()[1].to_vector()[0], 7.0);
}

TEST(Module, TrainEvalIsRecursive) {
  auto net = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{std::make_shared<nn::Dropout>(0.5)})});
  net->eval();
  for (auto& [n, m] : net->named_modules()) EXPECT_FALSE(m->is_training()) << n;
  Tensor x = ones({1000});
  EXPECT_TRUE((*net)(x).same(x));  // identity in eval
  net->train();
  for (auto& [n, m] : net->named_modules()) EXPECT_TRUE(m->is_training()) << n;
  std::vector<double> y = (*net)(x).to_vector();
  int zeros_n = 0;
  for (double v : y) {
    EXPECT_TRUE(v == 0.0 || v == 2.0);
    zeros_n += v == 0.0;
  }
  EXPECT_GT(zeros_n, 400);
  EXPECT_LT(zeros_n, 600);
}

TEST(Module, BatchNormModes) {
  nn::BatchNorm2d bn(3);
  Tensor x = randn({4, 3, 5, 5}) * 2.0 + 1.0;
  bn(x);
  bn(x);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 2);
  std::vector<double> rm = bn.running_mean.to_vector();
  EXPECT_NE(rm[0], 0.0);  // updated by the training forward
  bn.eval();
  Tensor y = bn(x);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 2);
  EXPECT_EQ(bn.running_mean.to_vector(), rm);  // untouched in eval
  Tensor expected = batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, false);
  EXPECT_EQ(max_abs_diff(y, expected), 0.0);
  expect_error([&] { bn(zeros({3, 5})); }, "BatchNorm2d: expected a 4-d input [N, C, H, W], found shape [3, 5]");
}

// Sequential runs BatchNorm2d + ReLU as one fused op: the same values and gradients as calling the
// modules one by one, and no ReLU kernel runs (the profiler's kernel spans).
TEST(Module, SequentialFusesBatchNormAndRelu) {
  Generator g(17);
  auto conv = std::make_shared<nn::Conv2d>(3, 8, 3, 1, 1, false, 1, 1, &g);
  auto bn = std::make_shared<nn::BatchNorm2d>(8);
  auto act = std::make_shared<nn::ReLU>();
  nn::Sequential seq({conv, bn, act});
  Tensor x = randn({4, 3, 6, 6}, DType::F32, &g);
  std::vector<double> out[2], gw[2], gb[2];
  for (int fused = 0; fused < 2; ++fused) {
    seq.zero_grad();
    Tensor y;
    std::vector<profiler::Span> spans;
    {
      profiler::Session session;
      y = fused ? seq(x) : (*act)((*bn)((*conv)(x)));
      sum(mul(y, y)).backward();
      session.stop();
      spans = session.spans();
    }
    int relu_kernels = 0, bn_kernels = 0;
    for (const auto& s : spans) {
      if (s.category != "kernel") continue;
      relu_kernels += s.name == "relu" || s.name == "relu_backward";
      bn_kernels += s.name == "batch_norm_apply" || s.name == "batch_norm_backward";
    }
    EXPECT_EQ(relu_kernels, fused ? 0 : 2);
    EXPECT_EQ(bn_kernels, 2);
    out[fused] = y.to_vector();
    gw[fused] = conv->weight.grad().to_vector();
    gb[fused] = bn->bias.grad().to_vector();
  }
  EXPECT_EQ(out[1], out[0]);
  for (size_t i = 0; i < gw[0].size(); ++i) EXPECT_NEAR(gw[1][i], gw[0][i], 1e-5 * (1 + std::fabs(gw[0][i])));
  for (size_t i = 0; i < gb[0].size(); ++i) EXPECT_NEAR(gb[1][i], gb[0][i], 1e-5 * (1 + std::fabs(gb[0][i])));
}

TEST(Module, ToChannelsLastKeepsResults) {
  auto net = nn::cnn_mini();
  net->eval();
  Tensor x = randn({2, 3, 16, 16});
  Tensor before = (*net)(x);
  Tensor w = net->parameters()[0];  // "0.0.weight", a conv weight
  net->to_channels_last();
  EXPECT_TRUE(w.is_channels_last() && !w.is_contiguous());  // the same handle sees the new layout
  EXPECT_TRUE(w.is_leaf() && w.requires_grad());
  Tensor after = (*net)(x.contiguous_channels_last());
  EXPECT_LT(max_abs_diff(before, after), 1e-4);
}

TEST(Module, ZeroGrad) {
  auto net = nn::mlp({3, 2});
  sum((*net)(ones({4, 3}))).backward();
  EXPECT_TRUE(net->parameters()[0].grad().defined());
  net->zero_grad(false);
  EXPECT_EQ(net->parameters()[0].grad().to_vector(), std::vector<double>(6, 0.0));
  net->zero_grad();
  EXPECT_FALSE(net->parameters()[0].grad().defined());
}

TEST(Init, KaimingAndXavierStatistics) {
  Generator gen(1);
  // nn.Linear's default: kaiming_uniform_(a = sqrt(5)) = U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  nn::Linear lin(400, 300, true, &gen);
  const double bound = 1.0 / std::sqrt(400.0);
  EXPECT_LE(max(abs(lin.weight)).item<double>(), bound);
  EXPECT_GT(max(abs(lin.weight)).item<double>(), 0.99 * bound);
  EXPECT_NEAR(std::sqrt(var(lin.weight.flatten(), {0}).item<double>()), bound / std::sqrt(3.0), 0.01 * bound);
  EXPECT_LE(max(abs(lin.bias)).item<double>(), bound);
  // Conv2d: fan_in = in/groups * k * k.
  nn::Conv2d conv(16, 32, 3, 1, 1, true, 2, 1, &gen);
  EXPECT_LE(max(abs(conv.weight)).item<double>(), 1.0 / std::sqrt(8.0 * 9.0));
  EXPECT_GT(max(abs(conv.weight)).item<double>(), 0.98 / std::sqrt(8.0 * 9.0));

  Tensor w = empty({256, 128, 3, 3});
  nn::init::kaiming_normal_(w, 0.0, /*fan_in_mode=*/false, nn::init::Nonlinearity::ReLU, &gen);  // fan_out
  EXPECT_NEAR(std::sqrt(var(w.flatten(), {0}).item<double>()), std::sqrt(2.0 / (256 * 9)),
              0.01 * std::sqrt(2.0 / (256 * 9)));
  Tensor v = empty({300, 500});
  nn::init::xavier_normal_(v, 2.0, &gen);
  EXPECT_NEAR(std::sqrt(var(v.flatten(), {0}).item<double>()), 2.0 * std::sqrt(2.0 / 800),
              0.01 * 2.0 * std::sqrt(2.0 / 800));
  nn::init::xavier_uniform_(v, 1.0, &gen);
  EXPECT_LE(max(abs(v)).item<double>(), std::sqrt(6.0 / 800));
  nn::init::kaiming_uniform_(v, 0.0, true, nn::init::Nonlinearity::Tanh, &gen);
  EXPECT_LE(max(abs(v)).item<double>(), 5.0 / 3.0 * std::sqrt(3.0 / 500));

  nn::Embedding emb(1000, 64, &gen);
  EXPECT_NEAR(std::sqrt(var(emb.weight.flatten(), {0}).item<double>()), 1.0, 0.02);
  nn::LayerNorm ln(8);
  EXPECT_EQ(ln.weight.to_vector(), std::vector<double>(8, 1.0));
  EXPECT_EQ(ln.bias.to_vector(), std::vector<double>(8, 0.0));
  nn::BatchNorm2d bn(4);
  EXPECT_EQ(bn.running_var.to_vector(), std::vector<double>(4, 1.0));

  Tensor b = empty({5});
  expect_error([&] { nn::init::xavier_uniform_(b); }, "at least 2 dimensions, found shape [5]");
  Tensor i = empty({2, 2}, DType::I64);
  expect_error([&] { nn::init::normal_(i); }, "expected a floating tensor, found i64");
}

TEST(Init, SameSeedSameWeights) {
  Generator g1(42), g2(42);
  auto a = nn::mlp({8, 16, 4}, &g1);
  auto b = nn::mlp({8, 16, 4}, &g2);
  for (size_t i = 0; i < a->parameters().size(); ++i)
    EXPECT_EQ(a->parameters()[i].to_vector(), b->parameters()[i].to_vector());
}

TEST(Layers, ValidateArguments) {
  expect_error([] { nn::Conv2d(3, 4, 3, 1, 0, true, 2); }, "must be divisible by groups (2)");
  expect_error([] { nn::Linear(0, 4); }, "Linear: in_features must be positive, found 0");
  expect_error([] { nn::CausalSelfAttention(10, 3); }, "width 10 must be a positive multiple of the number of heads 3");
  nn::CausalSelfAttention attn(16, 4);
  expect_error([&] { attn(zeros({2, 3, 8})); }, "expected input [B, T, 16], found shape [2, 3, 8]");
}

TEST(Layers, CausalSelfAttentionMatchesComposition) {
  // The strided head views and the fused kernel equal the obvious composition with copies.
  Generator gen(5);
  nn::CausalSelfAttention attn(32, 4, 0.0, &gen);
  Tensor x = randn({2, 7, 32});
  Tensor y = attn(x);
  Tensor qkv = linear(x, attn.c_attn->weight, attn.c_attn->bias);
  auto heads = [&](int i) {
    return qkv.narrow(2, i * 32, 32).contiguous().reshape({2, 7, 4, 8}).permute({0, 2, 1, 3}).contiguous();
  };
  Tensor scores = matmul(heads(0), heads(1).transpose(2, 3)) / std::sqrt(8.0);
  std::vector<double> m(49);
  for (int i = 0; i < 7; ++i)
    for (int j = 0; j < 7; ++j) m[i * 7 + j] = j > i ? -1e30 : 0.0;
  Tensor o = matmul(softmax(scores + from_vector(m, {7, 7}), -1), heads(2));
  Tensor ref = linear(o.permute({0, 2, 1, 3}).contiguous().reshape({2, 7, 32}), attn.c_proj->weight, attn.c_proj->bias);
  EXPECT_LT(max_abs_diff(y, ref), 1e-5);
}

TEST(Module, SaveLoadRoundTrip) {
  const std::string path = ::testing::TempDir() + "/ft_test_nn_module.safetensors";
  nn::GPTConfig cfg;
  cfg.vocab_size = 64, cfg.context = 8, cfg.layers = 1, cfg.dim = 16, cfg.heads = 2;
  Generator g1(1), g2(2);
  nn::GPT a(cfg, &g1), b(cfg, &g2);
  a.save(path);
  b.load(path);
  TensorMap sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) EXPECT_EQ(sa[i].second.to_vector(), sb[i].second.to_vector()) << sa[i].first;
  EXPECT_TRUE(b.state_dict().back().second.storage() == b.named_parameters().front().second.storage());  // still tied

  // A model of another shape: rejected with the file and key named, nothing changed.
  nn::GPTConfig wide = cfg;
  wide.dim = 32;
  nn::GPT c(wide);
  std::vector<double> before = c.parameters()[0].to_vector();
  expect_error([&] { c.load(path); }, "key \"transformer.wte.weight\": expected shape [64, 32], found [64, 16]");
  expect_error([&] { c.load(path); }, path);
  EXPECT_EQ(c.parameters()[0].to_vector(), before);
  std::remove(path.c_str());
}
