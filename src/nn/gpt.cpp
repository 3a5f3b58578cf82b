// GPT-2 (pre-norm blocks, fused qkv, tanh-GELU MLP, tied head) with Hugging Face's module names,
// and the conversions to and from Hugging Face's GPT-2 weight files.
#include <cmath>
#include <unordered_map>

#include "fasttrain/autograd.h"
#include "fasttrain/nn.h"

namespace ft::nn {
namespace {

class GPT2MLP : public UnaryModule {
 public:
  GPT2MLP(int64_t dim, double dropout, Generator* gen) : dropout_(dropout) {
    c_fc = register_module("c_fc", std::make_shared<Linear>(dim, 4 * dim, true, gen));
    c_proj = register_module("c_proj", std::make_shared<Linear>(4 * dim, dim, true, gen));
  }
  Tensor forward(const Tensor& x) override {
    return ft::dropout(c_proj->forward(gelu(c_fc->forward(x), GeluApprox::Tanh)), dropout_, training_);
  }
  std::string type_name() const override { return "GPT2MLP"; }
  std::shared_ptr<Linear> c_fc, c_proj;

 private:
  double dropout_;
};

class GPT2Block : public CheckpointableBlock {
 public:
  GPT2Block(const GPTConfig& cfg, Generator* gen) {
    ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(cfg.dim));
    attn = register_module("attn", std::make_shared<CausalSelfAttention>(cfg.dim, cfg.heads, cfg.dropout, gen));
    ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(cfg.dim));
    mlp = register_module("mlp", std::make_shared<GPT2MLP>(cfg.dim, cfg.dropout, gen));
  }
  Tensor block_forward(const Tensor& x) override {
    Tensor h = add(x, attn->forward(ln_1->forward(x)));
    return add(h, mlp->forward(ln_2->forward(h)));
  }
  std::string type_name() const override { return "GPT2Block"; }
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<GPT2MLP> mlp;
};

// The "transformer" submodule of Hugging Face's GPT2LMHeadModel.
class GPT2Model : public Module {
 public:
  GPT2Model(const GPTConfig& cfg, int64_t padded_vocab, Generator* gen) {
    wte = register_module("wte", std::make_shared<Embedding>(padded_vocab, cfg.dim, gen));
    wpe = register_module("wpe", std::make_shared<Embedding>(cfg.context, cfg.dim, gen));
    h = register_module("h", std::make_shared<ModuleList>());
    for (int64_t i = 0; i < cfg.layers; ++i) {
      blocks.push_back(std::make_shared<GPT2Block>(cfg, gen));
      h->push_back(blocks.back());
    }
    ln_f = register_module("ln_f", std::make_shared<LayerNorm>(cfg.dim));
  }
  std::string type_name() const override { return "GPT2Model"; }
  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<ModuleList> h;
  std::vector<std::shared_ptr<GPT2Block>> blocks;  // h's entries, typed, for the forward loop
  std::shared_ptr<LayerNorm> ln_f;
};

GPT2Model& body(const std::shared_ptr<Module>& m) { return static_cast<GPT2Model&>(*m); }

}  // namespace

GPTConfig GPTConfig::preset(const std::string& name) {
  auto make = [](int64_t vocab, int64_t ctx, int64_t layers, int64_t dim, int64_t heads) {
    GPTConfig c;
    c.vocab_size = vocab;
    c.context = ctx;
    c.layers = layers;
    c.dim = dim;
    c.heads = heads;
    return c;
  };
  if (name == "gpt-mini") return make(512, 128, 4, 256, 4);
  if (name == "gpt2" || name == "gpt2-124m") return make(50257, 1024, 12, 768, 12);
  if (name == "gpt2-medium") return make(50257, 1024, 24, 1024, 16);
  if (name == "gpt2-large") return make(50257, 1024, 36, 1280, 20);
  FT_FAIL("GPTConfig::preset: unknown preset \"", name,
          "\"; known: gpt-mini, gpt2 (gpt2-124m), gpt2-medium, gpt2-large");
}

GPT::GPT(const GPTConfig& cfg, Generator* gen, bool gpt2_residual_scaling) : cfg_(cfg) {
  FT_CHECK(cfg.vocab_size > 0 && cfg.context > 0 && cfg.layers > 0 && cfg.dim > 0 && cfg.heads > 0,
           "GPT: vocab_size, context, layers, dim and heads must be positive, found ", cfg.vocab_size, ", ",
           cfg.context, ", ", cfg.layers, ", ", cfg.dim, ", ", cfg.heads);
  FT_CHECK(cfg.dim % cfg.heads == 0, "GPT: width ", cfg.dim, " is not a multiple of the number of heads ", cfg.heads);
  FT_CHECK(cfg.dropout >= 0 && cfg.dropout < 1, "GPT: dropout must be in [0, 1), found ", cfg.dropout);
  padded_vocab_ = (cfg.vocab_size + 63) / 64 * 64;  // GEMM-friendly head width (50257 -> 50304)
  transformer_ = register_module("transformer", std::make_shared<GPT2Model>(cfg, padded_vocab_, gen));
  lm_head_ = register_module("lm_head", std::make_shared<Linear>(body(transformer_).wte->weight));

  // GPT-2 initialisation (BENCH.md): every Linear and Embedding weight ~ N(0, 0.02), zero biases.
  const double res_std = gpt2_residual_scaling ? 0.02 / std::sqrt(2.0 * cfg.layers) : 0.02;
  for (auto& [name, m] : named_modules()) {
    if (m.get() == lm_head_.get()) continue;  // tied to wte, initialised there
    if (auto* lin = dynamic_cast<Linear*>(m.get())) {
      const bool residual = name.ends_with(".c_proj");
      init::normal_(lin->weight, 0.0, residual ? res_std : 0.02, gen);
      if (lin->bias.defined()) init::zeros_(lin->bias);
    } else if (auto* emb = dynamic_cast<Embedding*>(m.get())) {
      init::normal_(emb->weight, 0.0, 0.02, gen);
    }
  }
}

Tensor GPT::forward(const Tensor& ids) {
  FT_CHECK(ids.defined() && is_integral(ids.dtype()) && ids.dtype() != DType::Bool,
           "GPT: token ids must be an integer tensor, found ", ids.defined() ? dtype_name(ids.dtype()) : "undefined");
  FT_CHECK(ids.dim() == 2, "GPT: token ids must be [B, T], found shape ", ids.shape().str());
  const int64_t T = ids.size(1);
  FT_CHECK(T >= 1 && T <= cfg_.context, "GPT: sequence length ", T, " must be in [1, context = ", cfg_.context, "]");
  GPT2Model& tr = body(transformer_);
  // Positions 0..T-1 are the first T rows of wpe: a view broadcast over the batch, no gather.
  Tensor x = add(tr.wte->forward(ids), tr.wpe->weight.narrow(0, 0, T));
  x = dropout(x, cfg_.dropout, training_);
  for (auto& block : tr.blocks) x = block->forward(x);
  return lm_head_->forward(tr.ln_f->forward(x));
}

void GPT::set_activation_checkpointing(bool on) {
  for (auto& block : body(transformer_).blocks) block->set_activation_checkpointing(on);
}

// ---------------------------------------------------------------- Hugging Face exchange

namespace {

// HF's Conv1D layers: their weights are [in, out] in HF files.
bool is_conv1d_weight(const std::string& name) {
  for (const char* suffix : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
    if (name.ends_with(suffix)) return true;
  return false;
}

}  // namespace

TensorMap gpt2_from_hf_state(const TensorMap& hf, const GPT& model) {
  autograd::NoGradGuard ng;
  TensorMap out;
  bool has_head = false;
  Tensor wte;
  for (auto& [key, t] : hf) {
    FT_CHECK(t.defined(), "gpt2_from_hf_state: \"", key, "\" holds an undefined tensor");
    // HF's causal-mask buffers are not weights.
    if (key.ends_with(".attn.bias") || key.ends_with(".attn.masked_bias")) continue;
    std::string name = key;
    if (name != "lm_head.weight" && !name.starts_with("transformer.")) name = "transformer." + name;
    Tensor v = t;
    if (is_conv1d_weight(name)) {
      FT_CHECK(t.dim() == 2, "gpt2_from_hf_state: \"", key, "\" must be 2-d, found shape ", t.shape().str());
      v = t.t().contiguous();
    }
    if (name == "transformer.wte.weight" || name == "lm_head.weight") {
      FT_CHECK(t.dim() == 2 && t.size(0) <= model.padded_vocab(), "gpt2_from_hf_state: \"", key,
               "\" must be [vocab <= ", model.padded_vocab(), ", dim], found shape ", t.shape().str());
      if (t.size(0) < model.padded_vocab()) {  // padding rows: zero
        Tensor padded = zeros({model.padded_vocab(), t.size(1)}, t.options());
        padded.narrow(0, 0, t.size(0)).copy_(t);
        v = padded;
      }
      if (name == "lm_head.weight")
        has_head = true;
      else
        wte = v;
    }
    out.emplace_back(name, v);
  }
  if (!has_head && wte.defined()) out.emplace_back("lm_head.weight", wte);
  return out;
}

TensorMap gpt2_to_hf_state(const GPT& model) {
  autograd::NoGradGuard ng;
  TensorMap out;
  for (auto& [name, t] : model.state_dict()) {
    if (name == "lm_head.weight") continue;  // tied: HF files hold the embedding only
    Tensor v = t;
    if (name == "transformer.wte.weight") v = t.narrow(0, 0, model.config().vocab_size);
    if (is_conv1d_weight(name)) v = t.t();
    out.emplace_back(name, v.contiguous());
  }
  return out;
}

}  // namespace ft::nn
