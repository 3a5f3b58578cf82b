// GPT fidelity with Hugging Face's GPT-2.
// - The vocabulary padding never takes part: whatever the padding rows of the tied embedding hold,
//   the loss (f32, bf16 and f16 autocast, label smoothing) and the real rows' gradients are the
//   same, the padding rows get no gradient, and sampling never returns a padded id. (Loss, logits
//   and gradients against an unpadded PyTorch model: test_models.cpp, PaddedGptMatchesUnpaddedPyTorch.)
// - Hugging Face GPT-2 files (Conv1D [in, out] weights, with and without the "transformer."
//   prefix and the mask buffers) load through load_gpt2_weights and give the logits of an HF-style
//   PyTorch model (tests/support/hf_gpt2.py, written with HF's exact names and layouts); files saved
//   in HF's layout load in that model; a plain load_state_dict of an HF file says what it is.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "fasttrain/autocast.h"
#include "fasttrain/data.h"
#include "fasttrain/fasttrain.h"
#include "fasttrain/nn.h"
#include "fasttrain/safetensors.h"
#include "fasttrain/tasks.h"
#include "fasttrain/train.h"
#include "support/expect_error.h"
#include "support/parity.h"
#include "support/torch_scripts.h"
#include "support/trainer_configs.h"

using namespace ft;
using test::expect_close;
using test::expect_error;
using test::named;
namespace fs = std::filesystem;

namespace {

nn::GPTConfig small_config(int64_t vocab) {
  nn::GPTConfig cfg;
  cfg.vocab_size = vocab, cfg.context = 16, cfg.layers = 2, cfg.dim = 32, cfg.heads = 4;
  return cfg;
}

// A handle to the embedding (by value: named_parameters() returns a temporary list).
Tensor embedding_of(nn::GPT& gpt) {
  for (const auto& [name, p] : gpt.named_parameters())
    if (name == "transformer.wte.weight") return p;
  ADD_FAILURE() << "no transformer.wte.weight";
  return Tensor();
}

// Writes `rows` into the embedding's padding rows (past the vocabulary).
void set_padding_rows(nn::GPT& gpt, const Tensor& rows) {
  autograd::NoGradGuard ng;
  const int64_t vocab = gpt.config().vocab_size;
  embedding_of(gpt).narrow(0, vocab, gpt.padded_vocab() - vocab).copy_(rows);
}

int run_python(const std::string& args) { return test::run_torch_script("hf_gpt2.py", args); }

// The HF-style GPT-2 computes in f32 as we do.
constexpr test::Tolerance kTorchTol{1e-5, 1e-4};

}  // namespace

// The padding rows hold zeros in one model and large values in the other: everything the real
// vocabulary sees is bitwise the same, in every precision the trainer offers and with label
// smoothing (whose mean over classes would include padded classes if they were present).
TEST(GptPadding, PaddingRowsNeverChangeTheLossOrGetGradient) {
  const nn::GPTConfig cfg = small_config(300);
  Generator gen(11);
  nn::GPT a(cfg, &gen), b(cfg, &gen);
  b.load_state_dict(a.state_dict());
  const int64_t pad = a.padded_vocab() - cfg.vocab_size;
  ASSERT_EQ(pad, 20);
  set_padding_rows(a, zeros({pad, cfg.dim}));
  set_padding_rows(b, mul(randn({pad, cfg.dim}, DType::F32, &gen), 30.0));
  Tensor ids = randint(0, cfg.vocab_size, {2, 16}, DType::I64, &gen);
  Tensor targets = randint(0, cfg.vocab_size, {2, 16}, DType::I64, &gen);

  for (DType precision : {DType::F32, DType::BF16, DType::F16})
    for (double smoothing : {0.0, 0.1}) {
      SCOPED_TRACE(std::string(dtype_name(precision)) + " label smoothing " + std::to_string(smoothing));
      auto loss_of = [&](nn::GPT& m) {
        m.zero_grad();
        std::optional<autocast::AutocastGuard> guard;
        if (precision != DType::F32) guard.emplace(precision);
        Tensor logits = m(ids);
        EXPECT_EQ(logits.size(-1), cfg.vocab_size);
        return cross_entropy(logits.reshape({-1, cfg.vocab_size}).to(DType::F32), targets.reshape({-1}), -100,
                             smoothing);
      };
      Tensor la = loss_of(a), lb = loss_of(b);
      ASSERT_TRUE(std::isfinite(la.item<double>()));
      EXPECT_EQ(la.item<double>(), lb.item<double>());
      la.backward();
      lb.backward();
      Tensor ga = embedding_of(a).grad(), gb = embedding_of(b).grad();
      EXPECT_EQ(max(abs(gb.narrow(0, cfg.vocab_size, pad))).item<double>(), 0.0);
      EXPECT_EQ(max(abs(ga.narrow(0, 0, cfg.vocab_size) - gb.narrow(0, 0, cfg.vocab_size))).item<double>(), 0.0);
    }

  // The same weights in a model whose vocabulary includes the padding rows: there they dominate,
  // so the invariance above is not an accident of small padding values.
  nn::GPTConfig wide = cfg;
  wide.vocab_size = b.padded_vocab();
  nn::GPT c(wide);
  c.load_state_dict(b.state_dict());
  Tensor lb = cross_entropy(b(ids).reshape({-1, cfg.vocab_size}), targets.reshape({-1}));
  Tensor lc = cross_entropy(c(ids).reshape({-1, wide.vocab_size}), targets.reshape({-1}));
  EXPECT_GT(lc.item<double>() - lb.item<double>(), 1.0);
}

// A char run whose padding rows would win every draw if they were candidates: ln_f maps every
// position to the same vector h, and the padding rows are 50 h, so a padded logit is 50 |h|^2.
TEST(GptPadding, SamplingNeverPicksAPaddedId) {
  train::TrainerConfig c = test::tiny_char(test::scratch_dir("ft_gpt_fidelity", "sample"));
  test::BuiltinRun(c).fit();
  const std::string vocab = data::MarkovText::builtin().alphabet();
  auto model = train::make_gpt_model(c, static_cast<int64_t>(vocab.size()), nullptr);  // as sample_text builds it
  nn::GPT& gpt = *model;
  const nn::GPTConfig cfg = gpt.config();
  const std::string weights = c.run_dir + "/model.safetensors";
  gpt.load(weights);
  const int64_t pad = gpt.padded_vocab() - cfg.vocab_size;
  ASSERT_GT(pad, 0) << "the char vocabulary must not be a multiple of 64 for this test";
  Generator gen(3);
  Tensor h = randn({cfg.dim}, DType::F32, &gen);
  {
    autograd::NoGradGuard ng;
    for (auto& [name, p] : gpt.named_parameters()) {
      if (name == "transformer.ln_f.weight") p.fill_(0.0);
      if (name == "transformer.ln_f.bias") p.copy_(h);
    }
  }
  set_padding_rows(gpt, mul(h, 50.0).reshape({1, cfg.dim}).expand({pad, cfg.dim}));
  gpt.save(weights);

  // Were the padding classes candidates, the greedy choice would be one of them.
  nn::GPTConfig wide = cfg;
  wide.vocab_size = gpt.padded_vocab();
  nn::GPT with_padding(wide);
  with_padding.load(weights);
  Tensor ids = zeros({1, 4}, DType::I64);
  EXPECT_GE(argmax(with_padding(ids).select(1, 3).flatten()).item<int64_t>(), cfg.vocab_size);
  EXPECT_EQ(gpt(ids).size(-1), cfg.vocab_size);

  for (double temperature : {0.0, 1.0, 5.0}) {
    train::SampleOptions o;
    o.prompt = vocab.substr(0, 1);
    o.tokens = 200;
    o.temperature = temperature;
    o.seed = 9;
    const std::string text = train::sample_text(c.run_dir, o);
    ASSERT_EQ(text.size(), 201u);
    for (char ch : text) EXPECT_NE(vocab.find(ch), std::string::npos) << "temperature " << temperature;
  }
  fs::remove_all(c.run_dir);
}

TEST(GptHuggingFace, LayoutDetectionAndErrors) {
  const nn::GPTConfig cfg = small_config(300);
  nn::GPT gpt(cfg), other(cfg);
  const TensorMap ours = gpt.state_dict(), hf = nn::gpt2_to_hf_state(gpt);
  EXPECT_EQ(nn::detect_gpt2_layout(ours), nn::GptWeightLayout::Fasttrain);
  EXPECT_EQ(nn::detect_gpt2_layout(hf), nn::GptWeightLayout::HuggingFace);              // prefixed: told by the shapes
  EXPECT_EQ(named(hf, "transformer.wte.weight").shape(), Shape({300, 32}));             // unpadded
  EXPECT_EQ(named(hf, "transformer.h.0.attn.c_attn.weight").shape(), Shape({32, 96}));  // Conv1D [in, out]
  TensorMap unprefixed;
  for (auto& [n, t] : hf) unprefixed.emplace_back(n.substr(std::string("transformer.").size()), t);
  EXPECT_EQ(nn::detect_gpt2_layout(unprefixed), nn::GptWeightLayout::HuggingFace);

  // A plain load of HF weights: one sentence naming the layout and the loader, not a list of
  // shape mismatches; the model is unchanged.
  for (const TensorMap* m : std::vector<const TensorMap*>{&hf, &unprefixed}) {
    try {
      other.load_state_dict(*m);
      ADD_FAILURE() << "an HF state loaded as ours";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("Hugging Face's GPT-2 layout"), std::string::npos) << msg;
      EXPECT_NE(msg.find("nn::load_gpt2_weights"), std::string::npos) << msg;
      EXPECT_EQ(msg.find("problem(s)"), std::string::npos) << msg;
    }
  }
  // A state of our own layout that does not fit still lists its mismatches.
  nn::GPT bigger(small_config(400));
  expect_error([&] { other.load_state_dict(bigger.state_dict()); }, "2 problem(s): key \"transformer.wte.weight\"");

  // The vocabulary must be the model's, exact or padded.
  TensorMap short_vocab = hf;
  for (auto& [n, t] : short_vocab)
    if (n == "transformer.wte.weight") t = t.narrow(0, 0, 299);
  expect_error([&] { nn::gpt2_from_hf_state(short_vocab, other); },
               "must be [300 (the model's vocabulary) or 320 (padded), dim], found shape [299, 32]");
  TensorMap padded_vocab = hf;
  for (auto& [n, t] : padded_vocab)
    if (n == "transformer.wte.weight") t = cat({t, zeros({20, 32})});
  other.load_state_dict(nn::gpt2_from_hf_state(padded_vocab, other));
  Tensor ids = randint(0, 300, {2, 8});
  EXPECT_EQ(max(abs(other(ids) - gpt(ids))).item<double>(), 0.0);

  // A head that is the embedding is accepted; an untied one cannot be represented.
  TensorMap with_head = hf;
  with_head.emplace_back("lm_head.weight", named(hf, "transformer.wte.weight"));
  other.load_state_dict(nn::gpt2_from_hf_state(with_head, other));
  with_head.back().second = add(with_head.back().second, 1.0);
  expect_error([&] { nn::gpt2_from_hf_state(with_head, other); },
               "\"lm_head.weight\" differs from the token embedding, but this GPT ties its head");
}

// HF's own files (as tests/support/hf_gpt2.py writes them) load and give HF's logits and loss;
// our HF-layout files load in the HF model and give ours; both layouts round-trip.
TEST(GptHuggingFace, FilesInteroperateWithAnHfStyleModel) {
  const fs::path dir = test::scratch_dir("ft_gpt_fidelity", "hf");
  fs::create_directories(dir);
  const nn::GPTConfig cfg = small_config(300);
  const int rc = run_python("write " + dir.string() + " 300 16 2 32 4");
  if (rc == test::kNoTorch) {
    fs::remove_all(dir);
    GTEST_SKIP() << "python3-torch not installed: Hugging Face interop not tested";
  }
  ASSERT_EQ(rc, 0) << "tests/support/hf_gpt2.py write failed";
  const TensorMap ref = load_safetensors((dir / "reference.safetensors").string()).tensors;
  const Tensor ids = named(ref, "ids"), targets = named(ref, "targets");

  nn::GPT gpt(cfg);
  gpt.eval();
  for (const char* file : {"hf_model.safetensors", "hf_lmhead.safetensors"}) {
    SCOPED_TRACE(file);
    const std::string path = (dir / file).string();
    nn::GPT fresh(cfg);
    expect_error([&] { fresh.load(path); }, path + ": GPT.load_state_dict: the state is in Hugging Face's GPT-2");
    EXPECT_EQ(nn::load_gpt2_weights(gpt, path), nn::GptWeightLayout::HuggingFace);
    Tensor logits = gpt(ids);
    expect_close(logits, named(ref, "logits"), "logits", kTorchTol);
    expect_close(cross_entropy(logits.reshape({-1, 300}), targets.reshape({-1})), named(ref, "loss"), "loss",
                 kTorchTol);
    // Padding rows come in as zeros.
    EXPECT_EQ(max(abs(embedding_of(gpt).narrow(0, 300, 20))).item<double>(), 0.0);
  }
  const Tensor logits = gpt(ids);

  // Saved in HF's layout: HF's names and shapes, loadable by the HF-style model, same logits.
  const std::string hf_path = (dir / "ours_hf.safetensors").string();
  nn::save_gpt2_weights(gpt, hf_path, nn::GptWeightLayout::HuggingFace);
  SafetensorsFile saved = load_safetensors(hf_path);
  EXPECT_EQ(saved.metadata.at("format"), "pt");
  EXPECT_EQ(named(saved.tensors, "transformer.wte.weight").shape(), Shape({300, 32}));
  EXPECT_EQ(named(saved.tensors, "transformer.h.1.mlp.c_fc.weight").shape(), Shape({32, 128}));
  for (auto& [n, t] : saved.tensors) EXPECT_NE(n, "lm_head.weight");
  const std::string torch_out = (dir / "torch_logits.safetensors").string();
  ASSERT_EQ(run_python("check " + hf_path + " " + (dir / "reference.safetensors").string() + " " + torch_out + " 4"), 0)
      << "the HF-style model did not load our HF-layout file";
  expect_close(named(load_safetensors(torch_out).tensors, "logits"), logits, "HF-style model on our HF file",
               kTorchTol);

  // Round trips through both layouts: same weights, bit for bit.
  const std::string ours_path = (dir / "ours.safetensors").string();
  nn::save_gpt2_weights(gpt, ours_path, nn::GptWeightLayout::Fasttrain);
  EXPECT_EQ(named(load_safetensors(ours_path).tensors, "transformer.wte.weight").shape(), Shape({320, 32}));
  for (const std::string& path : {hf_path, ours_path}) {
    nn::GPT back(cfg);
    back.eval();
    const auto layout = nn::load_gpt2_weights(back, path);
    EXPECT_EQ(layout, path == hf_path ? nn::GptWeightLayout::HuggingFace : nn::GptWeightLayout::Fasttrain);
    EXPECT_EQ(max(abs(back(ids) - logits)).item<double>(), 0.0) << path;
  }

  // A model whose shape differs from the file's: the file, the layout and every mismatch named.
  nn::GPTConfig deeper = cfg;
  deeper.layers = 3;
  nn::GPT wrong(deeper);
  expect_error([&] { nn::load_gpt2_weights(wrong, hf_path); },
               hf_path +
                   " (Hugging Face GPT-2 layout): GPT.load_state_dict: 12 problem(s): missing key "
                   "\"transformer.h.2.ln_1.weight\"");
  fs::remove_all(dir);
}
