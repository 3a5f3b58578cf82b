// The models of shared/BENCH.md against PyTorch (tests/parity/cases_nn.py): state-dict names,
// shapes and parameter counts equal to the PyTorch definitions; loss, logits and every weight's
// gradient after one backward of cross-entropy, from PyTorch's own initial weights.
#include <gtest/gtest.h>

#include "fasttrain/autocast.h"
#include "fasttrain/fasttrain.h"
#include "fasttrain/nn.h"
#include "support/expect_error.h"
#include "support/parity.h"

using namespace ft;
using test::expect_error;
using test::ParityCase;

namespace {

void expect_structure(nn::Module& model, const std::string& case_name) {
  SCOPED_TRACE(case_name);
  FT_PARITY_CASE(c, case_name);
  auto names = c.param<std::vector<std::string>>("names");
  auto shapes = c.param<std::vector<std::vector<int64_t>>>("shapes");
  TensorMap sd = model.state_dict();
  ASSERT_EQ(sd.size(), names.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    EXPECT_EQ(sd[i].first, names[i]) << "entry " << i;
    EXPECT_EQ(sd[i].second.shape(), Shape(shapes[i])) << sd[i].first;
  }
  EXPECT_EQ(model.num_parameters(), c.param<int64_t>("params"));
}

// Loads PyTorch's weights by name, runs loss = cross_entropy(model(x), y) and compares the loss,
// the logits and the gradient of every parameter.
void expect_model_parity(nn::UnaryModule& model, const std::string& case_name, bool lm = false) {
  SCOPED_TRACE(case_name);
  FT_PARITY_CASE(c, case_name);
  TensorMap state;
  for (auto& [name, t] : model.state_dict()) {
    // Tied tensors are stored once, under their first name (the GPT head reuses wte).
    Tensor v = c.has(name) ? c.input(name) : c.input("transformer.wte.weight");
    // np.ascontiguousarray stores 0-d arrays (num_batches_tracked) as [1].
    state.emplace_back(name, t.dim() == 0 ? v.reshape({}) : v);
  }
  model.load_state_dict(state);
  model.train();
  Tensor x = c.input("x"), y = c.input("y");
  Tensor logits = model(x);
  Tensor flat = lm ? logits.reshape({-1, logits.size(-1)}) : logits;
  Tensor loss = cross_entropy(flat, lm ? y.reshape({-1}) : y);
  c.expect_output(loss, 0);
  c.expect_output(logits, 1);
  c.backward({loss});
  for (auto& [name, p] : model.named_parameters()) c.expect_grad(name, p);
}

// An unpadded PyTorch GPT (tests/parity/cases_nn.py: vocab 300, and GPT-2's 50257) against the
// C++ model with the same weights, whose embedding is padded to a multiple of 64: the same loss,
// logits [B, T, vocab] and gradients. The padding rows hold large values, so any probability a
// padded class received would move the loss far outside the tolerance; their gradient is zero.
void expect_padded_gpt_parity(int64_t vocab, int64_t context, int64_t layers, int64_t dim, int64_t heads) {
  const std::string name = "nn_gpt_vocab" + std::to_string(vocab);
  SCOPED_TRACE(name);
  FT_PARITY_CASE(c, name);
  nn::GPTConfig cfg;
  cfg.vocab_size = vocab, cfg.context = context, cfg.layers = layers, cfg.dim = dim, cfg.heads = heads;
  nn::GPT gpt(cfg);
  const int64_t pad = gpt.padded_vocab() - vocab;
  ASSERT_GT(pad, 0);
  Generator gen(5);
  Tensor wte = cat({c.input("transformer.wte.weight"), mul(randn({pad, dim}, DType::F32, &gen), 30.0)});
  TensorMap state;
  for (auto& [n, t] : gpt.state_dict())
    state.emplace_back(n, n == "transformer.wte.weight" || n == "lm_head.weight" ? wte : c.input(n));
  gpt.load_state_dict(state);
  gpt.train();
  Tensor x = c.input("x"), y = c.input("y");
  Tensor logits = gpt(x);
  EXPECT_EQ(logits.shape(), Shape({x.size(0), x.size(1), vocab}));
  Tensor loss = cross_entropy(logits.reshape({-1, vocab}), y.reshape({-1}));
  c.expect_output(loss, 0);
  c.expect_output(logits, 1);
  c.backward({loss});
  for (auto& [n, p] : gpt.named_parameters()) {
    if (n != "transformer.wte.weight") {
      c.expect_grad(n, p);
      continue;
    }
    ASSERT_TRUE(p.grad().defined());
    c.expect_close(p.grad().narrow(0, 0, vocab), "grad_" + n, "gradient of the embedding's vocabulary rows");
    EXPECT_EQ(max(abs(p.grad().narrow(0, vocab, pad))).item<double>(), 0.0) << "gradient of the padding rows";
  }
}

}  // namespace

TEST(Models, StructureMatchesPyTorch) {
  expect_structure(*nn::mlp({784, 1024, 1024, 10}), "nn_structure_mlp");
  expect_structure(*nn::cnn_mini(), "nn_structure_cnn_mini");
  nn::GPT gpt(nn::GPTConfig::preset("gpt-mini"));
  expect_structure(gpt, "nn_structure_gpt_mini");
  expect_structure(*nn::resnet("resnet50", 1000), "nn_structure_resnet50");
  expect_structure(*nn::resnet("resnet18", 1000), "nn_structure_resnet18");
  expect_structure(*nn::resnet("resnet20", 10), "nn_structure_resnet20");
  expect_structure(*nn::resnet("resnet56", 10), "nn_structure_resnet56");
}

TEST(Models, ForwardBackwardParity) {
  expect_model_parity(*nn::mlp({20, 32, 32, 10}), "nn_mlp");
  expect_model_parity(*nn::cnn_mini(), "nn_cnn_mini");
  expect_model_parity(*nn::resnet("resnet20", 10), "nn_resnet20");
  nn::GPTConfig cfg;
  cfg.vocab_size = 64, cfg.context = 16, cfg.layers = 2, cfg.dim = 32, cfg.heads = 4;
  nn::GPT gpt(cfg);
  expect_model_parity(gpt, "nn_gpt_tiny", /*lm=*/true);
}

TEST(Models, PaddedGptMatchesUnpaddedPyTorch) {
  expect_padded_gpt_parity(300, 16, 2, 32, 4);   // padded to 320
  expect_padded_gpt_parity(50257, 8, 1, 16, 2);  // GPT-2's vocabulary, padded to 50304
}

TEST(Models, GptNamesFollowHuggingFace) {
  nn::GPTConfig cfg;
  cfg.layers = 2;
  nn::GPT gpt(cfg);
  std::vector<std::string> expected{"transformer.wte.weight", "transformer.wpe.weight"};
  for (int i = 0; i < 2; ++i)
    for (const char* s : {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                          "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                          "mlp.c_proj.weight", "mlp.c_proj.bias"})
      expected.push_back("transformer.h." + std::to_string(i) + "." + s);
  expected.insert(expected.end(), {"transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight"});
  std::vector<std::string> names;
  for (auto& [n, t] : gpt.state_dict()) names.push_back(n);
  EXPECT_EQ(names, expected);
  // The head is the embedding: listed once among the parameters, under the first name.
  auto params = gpt.named_parameters();
  EXPECT_EQ(params.size(), expected.size() - 1);
  EXPECT_EQ(params.front().first, "transformer.wte.weight");
  EXPECT_TRUE(gpt.state_dict().back().second.storage() == params.front().second.storage());
}

TEST(Models, GptPresetsAndPadding) {
  auto g2 = nn::GPTConfig::preset("gpt2");
  EXPECT_EQ(g2.layers, 12);
  EXPECT_EQ(g2.dim, 768);
  EXPECT_EQ(g2.heads, 12);
  EXPECT_EQ(g2.vocab_size, 50257);
  EXPECT_EQ(g2.context, 1024);
  auto m = nn::GPTConfig::preset("gpt2-medium");
  EXPECT_EQ(m.layers * 10000 + m.dim * 10 + m.heads, 24 * 10000 + 1024 * 10 + 16);
  auto l = nn::GPTConfig::preset("gpt2-large");
  EXPECT_EQ(l.layers * 10000 + l.dim * 10 + l.heads, 36 * 10000 + 1280 * 10 + 20);
  expect_error([] { nn::GPTConfig::preset("gpt5"); }, "unknown preset \"gpt5\"");

  nn::GPTConfig cfg;
  cfg.vocab_size = 100, cfg.context = 8, cfg.layers = 1, cfg.dim = 16, cfg.heads = 2;
  nn::GPT gpt(cfg);
  EXPECT_EQ(gpt.padded_vocab(), 128);
  EXPECT_EQ(gpt.state_dict().front().second.shape(), Shape({128, 16}));  // the embedding holds the padding
  Tensor logits = gpt(randint(0, 100, {2, 5}));
  EXPECT_EQ(logits.shape(), Shape({2, 5, 100}));  // the logits do not: padded classes are absent
}

TEST(Models, GptInitialisation) {
  nn::GPTConfig cfg;
  cfg.vocab_size = 512, cfg.layers = 2, cfg.dim = 128, cfg.heads = 4;
  Generator gen(3);
  nn::GPT gpt(cfg, &gen, /*gpt2_residual_scaling=*/true);
  auto std_of = [](const Tensor& t) { return std::sqrt(var(t.flatten(), {0}).item<double>()); };
  for (auto& [name, t] : gpt.named_parameters()) {
    SCOPED_TRACE(name);
    if (name.find("ln_") != std::string::npos) continue;  // LayerNorms: ones and zeros
    const bool residual = name.find("c_proj.weight") != std::string::npos;
    if (name.find(".bias") != std::string::npos) {
      EXPECT_EQ(sum(abs(t)).item<double>(), 0.0);  // Linear biases are zero
    } else {
      const double expected = residual ? 0.02 / std::sqrt(4.0) : 0.02;  // wte and wpe too
      EXPECT_NEAR(std_of(t), expected, 0.06 * expected);
    }
  }
}

TEST(Models, GptValidatesIds) {
  nn::GPTConfig cfg;
  cfg.vocab_size = 64, cfg.context = 8, cfg.layers = 1, cfg.dim = 16, cfg.heads = 2;
  nn::GPT gpt(cfg);
  expect_error([&] { gpt(zeros({2, 4})); }, "token ids must be an integer tensor, found f32");
  expect_error([&] { gpt(zeros({8}, DType::I64)); }, "token ids must be [B, T], found shape [8]");
  expect_error([&] { gpt(zeros({1, 9}, DType::I64)); }, "sequence length 9 must be in [1, context = 8]");
  // An id in the embedding's padding rows is no token.
  cfg.vocab_size = 60;
  nn::GPT padded(cfg);
  expect_error([&] { padded(full({1, 4}, 60, DType::I64)); }, "token id 60 is out of range for a vocabulary of 60");
}

TEST(Models, GptHuggingFaceExchange) {
  nn::GPTConfig cfg;
  cfg.vocab_size = 100, cfg.context = 8, cfg.layers = 1, cfg.dim = 16, cfg.heads = 2;
  nn::GPT a(cfg), b(cfg);
  TensorMap hf = nn::gpt2_to_hf_state(a);
  for (auto& [n, t] : hf) {
    EXPECT_NE(n, "lm_head.weight");
    if (n == "transformer.h.0.attn.c_attn.weight") EXPECT_EQ(t.shape(), Shape({16, 48}));  // Conv1D [in, out]
    if (n == "transformer.wte.weight") EXPECT_EQ(t.shape(), Shape({100, 16}));             // unpadded
  }
  // Round trip, with the original checkpoint's unprefixed names and mask buffers.
  TensorMap unprefixed;
  for (auto& [n, t] : hf) unprefixed.emplace_back(n.substr(std::string("transformer.").size()), t);
  unprefixed.emplace_back("h.0.attn.bias", ones({1, 1, 8, 8}));
  b.load_state_dict(nn::gpt2_from_hf_state(unprefixed, b));
  Tensor ids = randint(0, 100, {2, 6});
  Tensor la = a(ids), lb = b(ids);
  EXPECT_EQ(max(abs(la.narrow(2, 0, 100) - lb.narrow(2, 0, 100))).item<double>(), 0.0);
  EXPECT_EQ(sum(abs(b.state_dict().front().second.narrow(0, 100, 28))).item<double>(), 0.0);  // padding rows
}

TEST(Models, ResnetNamesAndErrors) {
  expect_error([] { nn::resnet("resnet7", 10); }, "unknown model \"resnet7\"");
  auto r = nn::resnet("resnet20", 10);
  Tensor y = (*r)(randn({2, 3, 32, 32}));
  EXPECT_EQ(y.shape(), Shape({2, 10}));
  r->eval();
  r->to_channels_last();
  Tensor z = (*r)(randn({2, 3, 32, 32}).contiguous_channels_last());
  EXPECT_EQ(z.shape(), Shape({2, 10}));
}

TEST(Models, GptUnderBf16Autocast) {
  // BENCH.md's bf16 workloads: f32 master weights, bf16 matmuls, f32 loss and gradients.
  nn::GPTConfig cfg;
  cfg.vocab_size = 64, cfg.context = 16, cfg.layers = 2, cfg.dim = 32, cfg.heads = 4;
  nn::GPT gpt(cfg);
  Tensor ids = randint(0, 64, {2, 16});
  Tensor ref = cross_entropy(gpt(ids).reshape({-1, 64}), ids.reshape({-1}));
  Tensor loss;
  {
    autocast::AutocastGuard guard(DType::BF16);
    loss = cross_entropy(gpt(ids).reshape({-1, 64}), ids.reshape({-1}));
  }
  EXPECT_EQ(loss.dtype(), DType::F32);
  EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 0.02 * ref.item<double>());
  loss.backward();
  for (auto& [name, p] : gpt.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().dtype(), DType::F32) << name;
  }
}
