// GPT-2 (pre-norm blocks, fused qkv, tanh-GELU MLP, tied head) with Hugging Face's module names,
// its decoding with a key/value cache, and the conversions to and from Hugging Face's GPT-2 weight
// files.
#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "fasttrain/autograd.h"
#include "fasttrain/kv_cache.h"
#include "fasttrain/models.h"
#include "fasttrain/nn.h"

namespace ft::nn {
namespace {

using dist::Communicator;

class GPT2MLP : public UnaryModule {
 public:
  // With a tensor group (of more than one rank): c_fc column-parallel, c_proj row-parallel.
  GPT2MLP(int64_t dim, double dropout, Generator* gen, const std::shared_ptr<Communicator>& tp) : dropout_(dropout) {
    if (tp) {
      tp_fc_ = register_module("c_fc", std::make_shared<dist::ColumnParallelLinear>(dim, 4 * dim, true, tp));
      tp_proj_ = register_module("c_proj", std::make_shared<dist::RowParallelLinear>(4 * dim, dim, true, tp));
      tp_ = tp;
      return;
    }
    c_fc = register_module("c_fc", std::make_shared<Linear>(dim, 4 * dim, true, gen));
    c_proj = register_module("c_proj", std::make_shared<Linear>(4 * dim, dim, true, gen));
  }
  // c_proj(gelu(c_fc(x))) as one op (gelu_mlp: the GELU rides in the products' epilogues on CUDA);
  // c_fc and c_proj keep their parameters and names, and the work shows under this module's span.
  // Split: this rank's 4C / t hidden features through the same op (f before it, no second bias),
  // then g sums the ranks' parts and the bias is added once.
  Tensor forward(const Tensor& x) override {
    if (tp_) {
      const Tensor part =
          gelu_mlp(tp_fc_->enter(x), tp_fc_->weight, tp_fc_->bias, tp_proj_->weight, Tensor(), GeluApprox::Tanh);
      return tp_proj_->dropout(add(tp_proj_->leave(part), tp_proj_->bias), dropout_, training_);
    }
    // fp8-mixed: two FP8 linear layers around the GELU (their products take 8-bit operands, which
    // gelu_mlp's fused epilogues do not).
    const bool fp8 = fp8_autocast_recipe() != nullptr && c_fc->runs_fp8() && c_proj->runs_fp8();
    const Tensor y = fp8 ? (*c_proj)(gelu((*c_fc)(x), GeluApprox::Tanh))
                         : gelu_mlp(x, c_fc->weight, c_fc->bias, c_proj->weight, c_proj->bias, GeluApprox::Tanh);
    return ft::dropout(y, dropout_, training_);
  }
  std::string type_name() const override { return "GPT2MLP"; }
  std::shared_ptr<Linear> c_fc, c_proj;

 private:
  double dropout_;
  std::shared_ptr<Communicator> tp_;
  std::shared_ptr<dist::ColumnParallelLinear> tp_fc_;
  std::shared_ptr<dist::RowParallelLinear> tp_proj_;
};

class GPT2Block : public CheckpointableBlock {
 public:
  GPT2Block(const GPTConfig& cfg, Generator* gen, const std::shared_ptr<Communicator>& tp) {
    ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(cfg.dim));
    if (tp) {
      parallel_attn_ = std::make_shared<dist::ParallelCausalSelfAttention>(cfg.dim, cfg.heads, cfg.dropout, tp);
      attn = register_module("attn", parallel_attn_);
    } else {
      plain_attn_ = std::make_shared<CausalSelfAttention>(cfg.dim, cfg.heads, cfg.dropout, gen);
      attn = register_module("attn", plain_attn_);
    }
    ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(cfg.dim));
    mlp = register_module("mlp", std::make_shared<GPT2MLP>(cfg.dim, cfg.dropout, gen, tp));
  }
  Tensor block_forward(const Tensor& x) override { return run(x, nullptr, 0); }
  // The block at positions cache.length() .. with the cache's `layer` (kv_cache.h); a
  // single-process model's (GPT::decode refuses a tensor group first).
  Tensor forward_cached(const Tensor& x, KvCache& cache, int64_t layer) {
    return forward_variant([&] { return run(x, &cache, layer); });
  }
  std::string type_name() const override { return "GPT2Block"; }
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<UnaryModule> attn;  // CausalSelfAttention, or its heads on this rank
  std::shared_ptr<GPT2MLP> mlp;

 private:
  std::shared_ptr<CausalSelfAttention> plain_attn_;                   // attn without a tensor group
  std::shared_ptr<dist::ParallelCausalSelfAttention> parallel_attn_;  // attn with one

  Tensor run(const Tensor& x, KvCache* cache, int64_t layer) {
    // h = x + attn(ln_1(x)) and ln_2(h) in one pass (add_layer_norm). The side input is the
    // window's document ids under a document mask (GPT::forward(ids, doc_ids)).
    const Tensor a = (*ln_1)(x);
    const Tensor attended = cache         ? plain_attn_->forward_cached(a, *cache, layer)
                            : plain_attn_ ? plain_attn_->forward(a, side_input())
                                          : parallel_attn_->forward(a, side_input());
    const ResidualNorm h = ln_2->call_with_add(x, attended);
    return add(h.sum, (*mlp)(h.normed));
  }
};

// The "transformer" submodule of Hugging Face's GPT2LMHeadModel.
class GPT2Model : public Module {
 public:
  // With a pipeline stage: the embeddings on the first stage only, the stage's blocks under their
  // global indices ("h.5"), the final norm on the last stage only.
  GPT2Model(const GPTConfig& cfg, int64_t padded_vocab, Generator* gen, const std::shared_ptr<Communicator>& tp,
            const dist::PipelineStage* stage = nullptr) {
    const bool first = stage == nullptr || stage->first(), last = stage == nullptr || stage->last();
    if (first && tp) {
      auto split = register_module("wte", std::make_shared<dist::VocabParallelEmbedding>(padded_vocab, cfg.dim, tp));
      wte = split, wte_weight = split->weight;
    } else if (first) {
      auto whole = register_module("wte", std::make_shared<Embedding>(padded_vocab, cfg.dim, gen));
      wte = whole, wte_weight = whole->weight;
    }
    if (first) wpe = register_module("wpe", std::make_shared<Embedding>(cfg.context, cfg.dim, gen));
    h = register_module("h", std::make_shared<ModuleList>());
    const int64_t begin = stage ? stage->first_block : 0, end = stage ? stage->end_block : cfg.layers;
    for (int64_t i = begin; i < end; ++i) {
      blocks.push_back(std::make_shared<GPT2Block>(cfg, gen, tp));
      if (stage)
        h->register_module(std::to_string(i), blocks.back());
      else
        h->push_back(blocks.back());
    }
    if (last) ln_f = register_module("ln_f", std::make_shared<LayerNorm>(cfg.dim));
  }
  std::string type_name() const override { return "GPT2Model"; }
  std::shared_ptr<UnaryModule> wte;  // Embedding, or VocabParallelEmbedding (this rank's rows)
  Tensor wte_weight;
  std::shared_ptr<Embedding> wpe;
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

GPT::GPT(const GPTConfig& cfg, Generator* gen, bool gpt2_residual_scaling, std::shared_ptr<Communicator> tensor_group,
         const dist::PipelinePart& pipeline)
    : cfg_(cfg) {
  FT_CHECK(cfg.vocab_size > 0 && cfg.context > 0 && cfg.layers > 0 && cfg.dim > 0 && cfg.heads > 0,
           "GPT: vocab_size, context, layers, dim and heads must be positive, found ", cfg.vocab_size, ", ",
           cfg.context, ", ", cfg.layers, ", ", cfg.dim, ", ", cfg.heads);
  FT_CHECK(cfg.dim % cfg.heads == 0, "GPT: width ", cfg.dim, " is not a multiple of the number of heads ", cfg.heads);
  FT_CHECK(cfg.dropout >= 0 && cfg.dropout < 1, "GPT: dropout must be in [0, 1), found ", cfg.dropout);
  padded_vocab_ = (cfg.vocab_size + 63) / 64 * 64;  // GEMM-friendly head width (50257 -> 50304)
  if (tensor_group && tensor_group->world_size() > 1) {
    // Checked before anything communicates, from numbers every rank has: all refuse alike.
    const int t = tensor_group->world_size();
    FT_CHECK(cfg.heads % t == 0, "tensor parallelism: GPT's ", cfg.heads,
             " attention heads are not divisible by tp = ", t);
    FT_CHECK(padded_vocab_ % t == 0, "tensor parallelism: GPT's vocabulary of ", cfg.vocab_size,
             " tokens (embedding padded to ", padded_vocab_, " rows) is not divisible by tp = ", t);
    FT_CHECK(cfg.vocab_size > (t - 1) * (padded_vocab_ / t), "tensor parallelism: GPT's vocabulary of ", cfg.vocab_size,
             " tokens leaves the last of tp = ", t, " ranks (embedding rows ", (t - 1) * (padded_vocab_ / t), " to ",
             padded_vocab_ - 1, ") only padding rows; use fewer tp ranks");
    if (pipeline.count > 1) {
      make_stage(gen, gpt2_residual_scaling, std::move(tensor_group), pipeline);
      return;
    }
    tp_ = std::move(tensor_group);
    // The single-process model, initialised exactly as one process would (same generator, same
    // order of draws); this rank keeps its parts. Costs the whole model's memory once, at start.
    const GPT whole(cfg, gen, gpt2_residual_scaling);
    // Its layers' own initialisation draws from a scratch generator (overwritten below), so the
    // default generator (dropout's) is left as one process leaves it.
    Generator scratch(0);
    transformer_ = register_module("transformer", std::make_shared<GPT2Model>(cfg, padded_vocab_, &scratch, tp_));
    head_weight_ = body(transformer_).wte_weight;
    lm_head_ = register_module("lm_head", std::make_shared<dist::ColumnParallelLinear>(head_weight_, tp_));
    load_state_dict(dist::shard_tensor_parallel_state(whole.state_dict(), *this));
    return;
  }
  if (pipeline.count > 1) {
    make_stage(gen, gpt2_residual_scaling, nullptr, pipeline);
    return;
  }
  transformer_ = register_module("transformer", std::make_shared<GPT2Model>(cfg, padded_vocab_, gen, nullptr));
  head_weight_ = body(transformer_).wte_weight;
  auto head = std::make_shared<Linear>(head_weight_);
  head->fp8 = false;  // fp8-mixed keeps the logits' product in bf16 (fp8.h)
  lm_head_ = register_module("lm_head", head);

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

void GPT::make_stage(Generator* gen, bool gpt2_residual_scaling, std::shared_ptr<Communicator> tensor_group,
                     const dist::PipelinePart& part) {
  // The single-process model, initialised exactly as one process would (the same draws from
  // `gen`); this stage keeps its blocks (and, with a tensor group, its parts of them).
  const GPT whole(cfg_, gen, gpt2_residual_scaling);
  const GPT2Model& w = body(whole.transformer_);
  std::vector<int64_t> block_params;
  for (const auto& b : w.blocks) block_params.push_back(b->num_parameters());
  // Stage 0 holds the embeddings, the last stage the final norm and a head of the embedding's size.
  const int64_t embeddings = w.wte_weight.numel() + w.wpe->weight.numel();
  const int64_t head = w.ln_f->num_parameters() + w.wte_weight.numel();
  const std::vector<int64_t> layers =
      dist::stage_layers(block_params, embeddings, head, part.count, part.layers, "GPT");
  stage_.index = part.index, stage_.count = part.count, stage_.group = part.group;
  for (int k = 0; k < part.index; ++k) stage_.first_block += layers[k];
  stage_.end_block = stage_.first_block + layers[part.index];
  if (tensor_group && tensor_group->world_size() > 1) tp_ = std::move(tensor_group);
  Generator scratch(0);  // overwritten below: the default generator stays as one process leaves it
  transformer_ =
      register_module("transformer", std::make_shared<GPT2Model>(cfg_, padded_vocab_, &scratch, tp_, &stage_));
  if (stage_.last()) {
    // The tied head's own copy of the embedding (Megatron-LM's): equal at the start, kept equal
    // by PipelineSync adding the two gradients.
    const int64_t rows = tp_ ? padded_vocab_ / tp_->world_size() : padded_vocab_;
    head_weight_ = zeros({rows, cfg_.dim});
    if (tp_)
      lm_head_ = register_module("lm_head", std::make_shared<dist::ColumnParallelLinear>(head_weight_, tp_));
    else
      lm_head_ = register_module("lm_head", std::make_shared<Linear>(head_weight_));
    head_weight_ = lm_head_->named_parameters().front().second;
  }
  load_state_dict(dist::shard_tensor_parallel_state(dist::stage_part_of_state(whole.state_dict(), *this), *this));
}

int64_t GPT::dropout_blocks(int64_t batch, int64_t length) const {
  if (cfg_.dropout == 0) return 0;
  // One block per 4 elements of each mask (the dropout and attention kernels' rule): the
  // embedding's [B, T, C] on the first stage; per block the attention probabilities'
  // [B, H, T, T] (all heads: a tensor rank draws its heads' part of the whole mask and advances
  // by all of it), the attention output's and the MLP output's [B, T, C].
  const auto blocks = [](int64_t n) { return (n + 3) / 4; };
  const int64_t BTC = batch * length * cfg_.dim, scores = batch * cfg_.heads * length * length;
  const int64_t n = stage_.split() ? stage_.end_block - stage_.first_block : cfg_.layers;
  return (stage_.first() ? blocks(BTC) : 0) + n * (blocks(scores) + 2 * blocks(BTC));
}

Tensor GPT::tied_weight() const {
  if (!stage_.split()) return Tensor();
  return stage_.first() ? body(transformer_).wte_weight : stage_.last() ? head_weight_ : Tensor();
}

Tensor GPT::stage_forward(const Tensor& input, const Tensor& doc_ids) {
  return call_as_this([&] {
    GPT2Model& tr = body(transformer_);
    Tensor x = stage_.first() ? embed(input, doc_ids, nullptr) : input;
    for (auto& block : tr.blocks) x = block->forward(x, doc_ids);
    return stage_.last() ? head(x) : x;
  });
}

int64_t GPT::vocab_start() const { return tp_ ? tp_->rank() * (padded_vocab_ / tp_->world_size()) : 0; }

Tensor GPT::forward(const Tensor& ids) { return run(ids, Tensor(), nullptr); }

// Called as this module here (operator() does that for forward(ids)).
Tensor GPT::forward(const Tensor& ids, const Tensor& doc_ids) {
  return call_as_this([&] { return run(ids, doc_ids, nullptr); });
}

Tensor GPT::decode(const Tensor& ids, KvCache& cache) {
  FT_CHECK(!tp_,
           "GPT::forward_cached: decoding with a key/value cache runs on a single-process model, not on one "
           "split over a tensor group of ",
           tp_ ? tp_->world_size() : 1, " ranks (gather_tensor_parallel_state gives the whole model's weights)");
  return run(ids, Tensor(), &cache);
}

Tensor GPT::run(const Tensor& ids, const Tensor& doc_ids, KvCache* cache) {
  FT_CHECK(!stage_.split(), "GPT: this model is pipeline ", stage_.describe(),
           " and runs through the pipeline executor (stage_forward), not forward(ids)");
  Tensor x = embed(ids, doc_ids, cache);
  GPT2Model& tr = body(transformer_);
  for (size_t i = 0; i < tr.blocks.size(); ++i)
    x = cache ? tr.blocks[i]->forward_cached(x, *cache, static_cast<int64_t>(i)) : tr.blocks[i]->forward(x, doc_ids);
  return head(x);
}

Tensor GPT::embed(const Tensor& ids, const Tensor& doc_ids, KvCache* cache) {
  FT_CHECK(ids.defined() && is_integral(ids.dtype()) && ids.dtype() != DType::Bool,
           "GPT: token ids must be an integer tensor, found ", ids.defined() ? dtype_name(ids.dtype()) : "undefined");
  FT_CHECK(ids.dim() == 2, "GPT: token ids must be [B, T], found shape ", ids.shape().str());
  const int64_t T = ids.size(1), position = cache ? cache->length() : 0;
  FT_CHECK(T >= 1 && position + T <= cfg_.context, "GPT: sequence length ", position + T,
           " must be in [1, context = ", cfg_.context, "]");
  const bool padded = padded_vocab_ != cfg_.vocab_size;
  if (padded || tp_) {
    // The embedding's own check stops at its padded size; an id in the padding is no token. On a
    // GPU the check runs there: nothing waits for it (the error comes at the next synchronisation).
    // (A vocabulary-parallel embedding gives zeros for an id no rank holds: checked here too.)
    check_index_range(ids, cfg_.vocab_size, [v = cfg_.vocab_size](int64_t id, int64_t) {
      return detail::concat("GPT: token id ", id, " is out of range for a vocabulary of ", v,
                            " (the embedding's rows past it are padding)");
    });
  }
  FT_CHECK(!doc_ids.defined() || doc_ids.shape() == ids.shape(), "GPT: doc_ids must be shaped as the token ids ",
           ids.shape().str(), ", found ", doc_ids.shape().str());
  GPT2Model& tr = body(transformer_);
  // Positions p..p+T-1 (p = 0 without a cache) are rows of wpe: a view broadcast over the batch,
  // no gather. Under a document mask too: positions run on across the window's documents rather
  // than restarting at each (Llama 3's pretraining does the same; only attention is confined).
  // Sequence parallelism: the embedding gives this rank's positions only (sequence_start).
  const Tensor tokens = (*tr.wte)(ids);
  const auto* split = dynamic_cast<const dist::VocabParallelEmbedding*>(tr.wte.get());
  const int64_t first = split ? split->sequence_start(T) : 0;
  Tensor x = add(tokens, tr.wpe->weight.narrow(0, position + first, tokens.size(1)));
  // Decoding with a cache is inference. Split: this rank's positions' part of one process's mask.
  if (!cache) x = split ? split->dropout(x, cfg_.dropout, training_) : dropout(x, cfg_.dropout, training_);
  return x;
}

Tensor GPT::head(const Tensor& hidden) {
  const Tensor x = (*body(transformer_).ln_f)(hidden);
  const bool padded = padded_vocab_ != cfg_.vocab_size;
  if (tp_) {
    // This rank's real vocabulary rows [vocab_start, vocab_start + n) of its part of the head
    // (the rest is padding): its columns of the logits. f: the gradient of x is the sum of every
    // rank's columns' contributions.
    const int64_t rows = padded_vocab_ / tp_->world_size();
    const int64_t real = std::min(rows, cfg_.vocab_size - vocab_start());
    return linear(static_cast<const dist::ColumnParallelLinear&>(*lm_head_).enter(x), head_weight_.narrow(0, 0, real));
  }
  if (!padded) return (*lm_head_)(x);
  // Only the real vocabulary's rows make logits: the padding classes are absent rather than
  // masked, so no consumer (cross-entropy, label smoothing, evaluation, sampling) can give them
  // probability, and the head's GEMM skips them. The rows are a contiguous view of the embedding;
  // its backward leaves the padding rows' gradient zero.
  return linear(x, head_weight_.narrow(0, 0, cfg_.vocab_size));
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

bool is_mask_buffer(const std::string& name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
}

// A 2-d [a, b] tensor with b == k * a: a Conv1D [in, out] weight of a layer widening k times.
bool widens(const Tensor& t, int64_t k) { return t.defined() && t.dim() == 2 && t.size(1) == k * t.size(0); }

}  // namespace

GptWeightLayout detect_gpt2_layout(const TensorMap& state) {
  for (auto& [key, t] : state) {
    // HF's GPT2Model files (no "transformer." prefix) and HF's mask buffers: never in ours.
    if (is_mask_buffer(key) || key == "wte.weight" || key == "wpe.weight" || key.starts_with("h.") ||
        key.starts_with("ln_f."))
      return GptWeightLayout::HuggingFace;
    // With the prefix the names equal ours; the non-square Conv1D weights tell [in, out] apart.
    if ((key.ends_with(".attn.c_attn.weight") && widens(t, 3)) || (key.ends_with(".mlp.c_fc.weight") && widens(t, 4)))
      return GptWeightLayout::HuggingFace;
  }
  return GptWeightLayout::Fasttrain;
}

TensorMap gpt2_from_hf_state(const TensorMap& hf, const GPT& model) {
  autograd::NoGradGuard ng;
  const int64_t vocab = model.config().vocab_size, padded = model.padded_vocab();
  TensorMap out;
  Tensor wte, head;
  std::string head_key;
  for (auto& [key, t] : hf) {
    FT_CHECK(t.defined(), "gpt2_from_hf_state: \"", key, "\" holds an undefined tensor");
    if (is_mask_buffer(key)) continue;  // HF's causal-mask buffers are not weights
    std::string name = key;
    if (name != "lm_head.weight" && !name.starts_with("transformer.")) name = "transformer." + name;
    Tensor v = t;
    if (is_conv1d_weight(name)) {
      FT_CHECK(t.dim() == 2, "gpt2_from_hf_state: \"", key, "\" must be 2-d, found shape ", t.shape().str());
      v = t.t().contiguous();
    }
    if (name == "transformer.wte.weight" || name == "lm_head.weight") {
      // Padded files (llm.c's, nanoGPT's 50304) are accepted as well as HF's exact vocabulary.
      FT_CHECK(t.dim() == 2 && (t.size(0) == vocab || t.size(0) == padded), "gpt2_from_hf_state: \"", key,
               "\" must be [", vocab, " (the model's vocabulary) or ", padded, " (padded), dim], found shape ",
               t.shape().str());
      if (t.size(0) < padded) {  // padding rows: zero
        Tensor p = zeros({padded, t.size(1)}, t.options());
        p.narrow(0, 0, t.size(0)).copy_(t);
        v = p;
      }
      if (name == "lm_head.weight") {
        head = v, head_key = key;
        continue;  // emitted once, after the loop: it must be the embedding
      }
      wte = v;
    }
    out.emplace_back(name, v);
  }
  if (head.defined() && wte.defined()) {
    // The model ties its head to the embedding; an untied file's head cannot be represented.
    auto rows = [&](const Tensor& t) { return t.narrow(0, 0, vocab).to(DType::F32); };
    const bool same = head.shape() == wte.shape() && max(abs(rows(head) - rows(wte))).item<double>() == 0.0;
    FT_CHECK(same, "gpt2_from_hf_state: \"", head_key,
             "\" differs from the token embedding, but this GPT ties its head to the embedding");
  }
  if (wte.defined() || head.defined()) out.emplace_back("lm_head.weight", wte.defined() ? wte : head);
  if (!wte.defined() && head.defined()) out.emplace_back("transformer.wte.weight", head);
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

GptWeightLayout load_gpt2_weights(GPT& model, const std::string& safetensors_path) {
  SafetensorsFile f = load_safetensors(safetensors_path);
  const GptWeightLayout layout = detect_gpt2_layout(f.tensors);
  try {
    // A tensor-parallel model takes its parts of the whole file.
    model.load_state_dict(dist::shard_tensor_parallel_state(
        layout == GptWeightLayout::HuggingFace ? gpt2_from_hf_state(f.tensors, model) : f.tensors, model));
  } catch (const Error& e) {
    FT_FAIL(safetensors_path, " (", layout == GptWeightLayout::HuggingFace ? "Hugging Face" : "fasttrain",
            " GPT-2 layout): ", e.what());
  }
  return layout;
}

void save_gpt2_weights(const GPT& model, const std::string& safetensors_path, GptWeightLayout layout) {
  if (layout == GptWeightLayout::Fasttrain) return model.save(safetensors_path);
  // transformers refuses safetensors files whose metadata lacks format "pt".
  save_safetensors(safetensors_path, gpt2_to_hf_state(model), {{"format", "pt"}});
}

std::string GPT::explain_foreign_state(const TensorMap& state) const {
  if (detect_gpt2_layout(state) != GptWeightLayout::HuggingFace) return {};
  std::string example;
  for (auto& [key, t] : state)
    if (key.ends_with(".attn.c_attn.weight") && t.defined()) {
      example = " (\"" + key + "\" is " + t.shape().str() + ")";
      break;
    }
  return "the state is in Hugging Face's GPT-2 layout (Conv1D weights stored [in, out]" + example +
         "): load the file with nn::load_gpt2_weights(model, path), or convert the map with "
         "nn::gpt2_from_hf_state(state, model) first";
}

}  // namespace ft::nn
