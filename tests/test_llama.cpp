// The Llama family (models.h: Llama) against a Hugging Face-style LlamaForCausalLM written in
// PyTorch (tests/support/hf_llama.py, HF's names and math): a file of its weights loads by name
// into nn::Llama and gives its logits, loss and every parameter's gradient, for grouped-query,
// multi-query and full multi-head attention, tied and untied heads, q/k/v biases (Qwen2) and
// Llama 3's rotary frequency scaling. Plus the config's checks and activation checkpointing.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "fasttrain/fasttrain.h"
#include "support/expect_error.h"
#include "support/torch_scripts.h"
#include "support/trainer_configs.h"

using namespace ft;
namespace fs = std::filesystem;
using test::expect_close;
using test::named;

namespace {

struct Case {
  const char* name;
  nn::LlamaConfig cfg;
  double llama3_factor = 0;  // hf_llama.py: original context = 4 context, low 1, high 4
};

nn::LlamaConfig small(int64_t heads, int64_t kv_heads, bool tied, bool bias) {
  nn::LlamaConfig c;
  c.vocab_size = 300, c.context = 16, c.layers = 2, c.dim = 32, c.heads = heads, c.kv_heads = kv_heads;
  c.ffn_dim = 48, c.rope_theta = 10000, c.tie_embeddings = tied, c.attention_bias = bias;
  return c;
}

int write_reference(const fs::path& dir, const Case& k) {
  const nn::LlamaConfig& c = k.cfg;
  const std::string args =
      detail::concat("write ", dir.string(), " ", c.vocab_size, " ", c.context, " ", c.layers, " ", c.dim, " ", c.heads,
                     " ", c.kv_heads, " ", c.ffn_dim, " ", c.rope_theta, " ", c.tie_embeddings ? 1 : 0, " ",
                     c.attention_bias ? 1 : 0, " ", k.llama3_factor);
  return test::run_torch_script("hf_llama.py", args);
}

}  // namespace

class LlamaMatchesHfStyleModel : public ::testing::TestWithParam<Case> {};

TEST_P(LlamaMatchesHfStyleModel, LogitsLossAndGradients) {
  const Case& k = GetParam();
  const fs::path dir = test::scratch_dir("ft_llama", k.name);
  fs::create_directories(dir);
  const int rc = write_reference(dir, k);
  if (rc == test::kNoTorch) GTEST_SKIP() << "python3-torch not installed: the Llama is not compared with PyTorch";
  ASSERT_EQ(rc, 0) << "tests/support/hf_llama.py write failed";
  const TensorMap ref = load_safetensors((dir / "reference.safetensors").string()).tensors;
  TensorMap weights = load_safetensors((dir / "hf_model.safetensors").string()).tensors;

  nn::LlamaConfig cfg = k.cfg;
  if (k.llama3_factor > 0) cfg.rope_scaling = {RopeScaling::Type::Llama3, k.llama3_factor, 1.0, 4.0, cfg.context * 4};
  nn::Llama model(cfg);
  // save_pretrained leaves a tied head out; the module lists it under both names, as torch does.
  if (cfg.tie_embeddings) weights.emplace_back("lm_head.weight", named(weights, "model.embed_tokens.weight"));
  model.load_state_dict(weights);

  const Tensor ids = named(ref, "ids"), targets = named(ref, "targets");
  const Tensor logits = model(ids);
  expect_close(logits, named(ref, "logits"), "logits");
  Tensor loss = cross_entropy(logits.reshape({-1, cfg.vocab_size}), targets.reshape({-1}));
  expect_close(loss, named(ref, "loss"), "loss");
  loss.backward();
  int64_t checked = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    expect_close(p.grad(), named(ref, "grad." + name), "grad of " + name);
    ++checked;
  }
  const int64_t per_layer = 4 + 3 + 2 + (cfg.attention_bias ? 3 : 0);
  EXPECT_EQ(checked, 1 + cfg.layers * per_layer + 1 + (cfg.tie_embeddings ? 0 : 1));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LlamaMatchesHfStyleModel,
                         ::testing::Values(Case{"gqa_tied", small(4, 2, true, false)},
                                           Case{"mqa_untied_bias", small(4, 1, false, true)},
                                           Case{"mha_llama3_scaling", small(4, 4, true, false), 8.0}),
                         [](const auto& info) { return std::string(info.param.name); });

// Recomputing each block in backward gives the gradients of keeping its activations, bit for bit.
TEST(Llama, ActivationCheckpointingGivesTheSameGradients) {
  const nn::LlamaConfig cfg = small(4, 2, true, false);
  Generator gen(7);
  const Tensor ids = randint(0, cfg.vocab_size, {2, 12}, DType::I64, &gen);
  std::vector<std::vector<Tensor>> grads;
  for (bool checkpointing : {false, true}) {
    Generator init(3);
    nn::Llama model(cfg, &init);
    EXPECT_EQ(nn::set_activation_checkpointing(model, checkpointing), cfg.layers);
    sum(model(ids)).backward();
    grads.emplace_back();
    for (const Tensor& p : model.parameters()) grads.back().push_back(p.grad());
  }
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_EQ(max(abs(grads[0][i] - grads[1][i])).item<double>(), 0.0) << i;
}

// A config that cannot be built is refused naming the field, expected and found.
TEST(Llama, ConfigErrorsNameTheField) {
  auto refused = [](auto change, const std::string& fragment) {
    nn::LlamaConfig c = small(4, 2, true, false);
    change(c);
    test::expect_error([&] { nn::Llama m(c); }, fragment);
  };
  refused([](nn::LlamaConfig& c) { c.kv_heads = 3; }, "Llama: heads (4) must be a multiple of kv_heads, found 3");
  refused([](nn::LlamaConfig& c) { c.dim = 30; }, "Llama: width 30 is not a multiple of the number of heads 4");
  refused([](nn::LlamaConfig& c) { c.ffn_dim = 0; }, "Llama: ffn_dim must be positive, found 0");
  nn::Llama m(small(4, 2, true, false));
  test::expect_error([&] { m(zeros({1, 17}, DType::I64)); }, "Llama: sequence length 17 must be in [1, context = 16]");
  test::expect_error([] { nn::LlamaConfig::preset("llama-9"); }, "unknown preset \"llama-9\"");
}

// The presets are the published shapes: their parameter counts are the published ones.
TEST(Llama, PresetsHaveThePublishedParameterCounts) {
  EXPECT_EQ(nn::LlamaConfig::preset("smollm-135m").num_parameters(), 134'515'008);
  EXPECT_EQ(nn::LlamaConfig::preset("smollm-360m").num_parameters(), 361'821'120);
  EXPECT_EQ(nn::LlamaConfig::preset("tinyllama-1.1b").num_parameters(), 1'100'048'384);
  EXPECT_EQ(nn::LlamaConfig::preset("llama-3.2-1b").num_parameters(), 1'235'814'400);
  const nn::LlamaConfig mini = nn::LlamaConfig::preset("llama-mini");
  EXPECT_EQ(nn::Llama(mini).num_parameters(), mini.num_parameters());
  nn::LlamaConfig untied = small(4, 1, false, true);
  EXPECT_EQ(nn::Llama(untied).num_parameters(), untied.num_parameters());
}
