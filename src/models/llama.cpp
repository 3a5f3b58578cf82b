// The Llama family (models.h: Llama): RMSNorm pre-norm blocks, rotary position embeddings,
// grouped-query attention and the gated SiLU MLP, with Hugging Face's LlamaForCausalLM names, and
// its decoding with a key/value cache.
//   block(x) = h + mlp(rms_norm(h)),  h = x + o_proj(attention(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))),
//   n = rms_norm(x),  mlp(y) = down_proj(silu(gate_proj(y)) * up_proj(y))
#include <cmath>
#include <vector>

#include "fasttrain/kv_cache.h"
#include "fasttrain/models.h"
#include "fasttrain/nn.h"
#include "fasttrain/ops.h"

namespace ft::nn {
namespace {

// The rotary tables of a model, made once on the CPU and copied to each device and table dtype
// (f32, or f64 for an f64 model) the first time a forward needs them there.
class RopeCache {
 public:
  explicit RopeCache(const LlamaConfig& c) : cfg_(c) {}
  const RopeTables& for_input(const Tensor& x) {
    const DType dtype = x.dtype() == DType::F64 ? DType::F64 : DType::F32;
    for (const Entry& e : entries_)
      if (e.device == x.device() && e.dtype == dtype) return e.tables;
    RopeTables t =
        rope_tables(cfg_.context, cfg_.head_size(), cfg_.rope_theta, cfg_.rope_scaling, TensorOptions(dtype));
    if (!x.device().is_cpu()) t = {t.cos.to(x.device()), t.sin.to(x.device())};
    entries_.push_back({x.device(), dtype, std::move(t)});
    return entries_.back().tables;
  }

 private:
  struct Entry {
    Device device;
    DType dtype;
    RopeTables tables;
  };
  LlamaConfig cfg_;
  std::vector<Entry> entries_;
};

using dist::Communicator;

class LlamaAttention : public UnaryModule {
 public:
  LlamaAttention(const LlamaConfig& c, RopeCache* rope, Generator* gen, const std::shared_ptr<Communicator>& tp)
      : heads_(c.heads), kv_heads_(c.kv_heads), head_dim_(c.head_size()), rope_(rope), tp_(tp) {
    if (tp) {
      // This rank's query heads and the key/value heads they share (heads / t of each).
      heads_ /= tp->world_size(), kv_heads_ /= tp->world_size();
      auto column = [&](const char* name, int64_t out) {
        return register_module(name, std::make_shared<dist::ColumnParallelLinear>(c.dim, out, c.attention_bias, tp));
      };
      tp_q_ = column("q_proj", c.heads * head_dim_);
      tp_k_ = column("k_proj", c.kv_heads * head_dim_);
      tp_v_ = column("v_proj", c.kv_heads * head_dim_);
      tp_o_ =
          register_module("o_proj", std::make_shared<dist::RowParallelLinear>(c.heads * head_dim_, c.dim, false, tp));
      return;
    }
    q_proj = register_module("q_proj", std::make_shared<Linear>(c.dim, heads_ * head_dim_, c.attention_bias, gen));
    k_proj = register_module("k_proj", std::make_shared<Linear>(c.dim, kv_heads_ * head_dim_, c.attention_bias, gen));
    v_proj = register_module("v_proj", std::make_shared<Linear>(c.dim, kv_heads_ * head_dim_, c.attention_bias, gen));
    o_proj = register_module("o_proj", std::make_shared<Linear>(heads_ * head_dim_, c.dim, false, gen));
  }
  Tensor forward(const Tensor& x) override { return attend(x, Tensor(), nullptr, 0); }
  // Under DocumentMask{doc_ids} when doc_ids is defined; called as this module.
  Tensor forward(const Tensor& x, const Tensor& doc_ids) {
    return call_as_this([&] { return attend(x, doc_ids, nullptr, 0); });
  }
  // x at positions cache.length() .. with the cache's `layer` (kv_cache.h); single-process only.
  Tensor forward_cached(const Tensor& x, KvCache& cache, int64_t layer) {
    return call_as_this([&] { return attend(x, Tensor(), &cache, layer); });
  }
  std::string type_name() const override { return "LlamaAttention"; }
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;

 private:
  Tensor attend(const Tensor& x, const Tensor& doc_ids, KvCache* cache, int64_t layer) {
    // Split: one f for the three projections (the input's gradient all-reduced once, not
    // thrice); under sequence parallelism it gathers the positions of every rank.
    const Tensor in = tp_ ? tp_q_->enter(x) : x;
    const int64_t B = in.size(0), T = in.size(1), position = cache ? cache->length() : 0;
    // Positions p..p+T-1 (p = 0 without a cache) rotate by rows p..p+T-1 of the tables.
    const RopeTables& rope = rope_->for_input(x);
    const Tensor cos = rope.cos.narrow(0, position, T), sin = rope.sin.narrow(0, position, T);
    // rotary_embedding works on [B, T, H, D], the projections' own layout; attention reads the
    // [B, H, T, D] transposed views without a copy. K and V keep their kv_heads heads: attention
    // shares each among its group of query heads, and a cache stores only those.
    Tensor q, k, v;
    if (tp_) {
      auto heads_of = [&](const dist::ColumnParallelLinear& proj, int64_t h) {
        return linear(in, proj.weight, proj.bias).view({B, T, h, head_dim_});
      };
      q = rotary_embedding(heads_of(*tp_q_, heads_), cos, sin).transpose(1, 2);
      k = rotary_embedding(heads_of(*tp_k_, kv_heads_), cos, sin).transpose(1, 2);
      v = heads_of(*tp_v_, kv_heads_).transpose(1, 2);
    } else {
      auto heads_of = [&](Linear& proj, int64_t h) { return proj(x).view({B, T, h, head_dim_}); };
      q = rotary_embedding(heads_of(*q_proj, heads_), cos, sin).transpose(1, 2);
      k = rotary_embedding(heads_of(*k_proj, kv_heads_), cos, sin).transpose(1, 2);
      v = heads_of(*v_proj, kv_heads_).transpose(1, 2);
    }
    // The rotary angles are the window's positions even under a document mask: a document
    // packed at offset t starts at angle t, not 0, as in Llama 3's pretraining.
    const Tensor attended = cache               ? cached_attention(q, k, v, *cache, layer)
                            : doc_ids.defined() ? scaled_dot_product_attention(q, k, v, DocumentMask{doc_ids})
                                                : scaled_dot_product_attention(q, k, v, /*causal=*/true);
    const Tensor y = attended.transpose(1, 2).reshape({B, T, heads_ * head_dim_});
    return tp_ ? (*tp_o_)(y) : (*o_proj)(y);
  }

  int64_t heads_, kv_heads_, head_dim_;  // with a tensor group: this rank's heads
  RopeCache* rope_;
  std::shared_ptr<Communicator> tp_;
  std::shared_ptr<dist::ColumnParallelLinear> tp_q_, tp_k_, tp_v_;
  std::shared_ptr<dist::RowParallelLinear> tp_o_;
};

class LlamaMLP : public UnaryModule {
 public:
  LlamaMLP(const LlamaConfig& c, Generator* gen, const std::shared_ptr<Communicator>& tp) : tp_(tp) {
    if (tp) {
      tp_gate_ =
          register_module("gate_proj", std::make_shared<dist::ColumnParallelLinear>(c.dim, c.ffn_dim, false, tp));
      tp_up_ = register_module("up_proj", std::make_shared<dist::ColumnParallelLinear>(c.dim, c.ffn_dim, false, tp));
      tp_down_ = register_module("down_proj", std::make_shared<dist::RowParallelLinear>(c.ffn_dim, c.dim, false, tp));
      return;
    }
    gate_proj = register_module("gate_proj", std::make_shared<Linear>(c.dim, c.ffn_dim, false, gen));
    up_proj = register_module("up_proj", std::make_shared<Linear>(c.dim, c.ffn_dim, false, gen));
    down_proj = register_module("down_proj", std::make_shared<Linear>(c.ffn_dim, c.dim, false, gen));
  }
  Tensor forward(const Tensor& x) override {
    if (tp_) {  // this rank's ffn_dim / t features (one f for gate and up), summed by down's g
      const Tensor in = tp_gate_->enter(x);
      return (*tp_down_)(silu_mul(linear(in, tp_gate_->weight), linear(in, tp_up_->weight)));
    }
    return (*down_proj)(silu_mul((*gate_proj)(x), (*up_proj)(x)));
  }
  std::string type_name() const override { return "LlamaMLP"; }
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;

 private:
  std::shared_ptr<Communicator> tp_;
  std::shared_ptr<dist::ColumnParallelLinear> tp_gate_, tp_up_;
  std::shared_ptr<dist::RowParallelLinear> tp_down_;
};

class LlamaDecoderLayer : public CheckpointableBlock {
 public:
  LlamaDecoderLayer(const LlamaConfig& c, RopeCache* rope, Generator* gen, const std::shared_ptr<Communicator>& tp) {
    input_layernorm = register_module("input_layernorm", std::make_shared<RMSNorm>(c.dim, c.rms_eps));
    self_attn = register_module("self_attn", std::make_shared<LlamaAttention>(c, rope, gen, tp));
    post_attention_layernorm = register_module("post_attention_layernorm", std::make_shared<RMSNorm>(c.dim, c.rms_eps));
    mlp = register_module("mlp", std::make_shared<LlamaMLP>(c, gen, tp));
  }
  Tensor block_forward(const Tensor& x) override { return run(x, nullptr, 0); }
  Tensor forward_cached(const Tensor& x, KvCache& cache, int64_t layer) {
    return forward_variant([&] { return run(x, &cache, layer); });
  }
  std::string type_name() const override { return "LlamaDecoderLayer"; }
  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<LlamaAttention> self_attn;
  std::shared_ptr<LlamaMLP> mlp;

 private:
  Tensor run(const Tensor& x, KvCache* cache, int64_t layer) {
    // h = x + attn(input_layernorm(x)) and its norm in one pass (add_rms_norm).
    // The side input: the window's document ids under a document mask (Llama::forward(ids, doc_ids)).
    const Tensor n = (*input_layernorm)(x);
    const Tensor attended = cache ? self_attn->forward_cached(n, *cache, layer) : self_attn->forward(n, side_input());
    const ResidualNorm h = post_attention_layernorm->call_with_add(x, attended);
    return add(h.sum, (*mlp)(h.normed));
  }
};

// The "model" submodule of Hugging Face's LlamaForCausalLM; it owns the rotary tables.
class LlamaModel : public Module {
 public:
  // With a pipeline stage: embed_tokens on the first stage only, the stage's layers under their
  // global indices ("layers.5"), the final norm on the last stage only.
  LlamaModel(const LlamaConfig& c, Generator* gen, const std::shared_ptr<Communicator>& tp,
             const dist::PipelineStage* stage = nullptr)
      : rope(c) {
    const bool first = stage == nullptr || stage->first(), last = stage == nullptr || stage->last();
    if (first && tp) {
      auto split =
          register_module("embed_tokens", std::make_shared<dist::VocabParallelEmbedding>(c.vocab_size, c.dim, tp));
      embed_tokens = split, embed_weight = split->weight;
    } else if (first) {
      auto whole = register_module("embed_tokens", std::make_shared<Embedding>(c.vocab_size, c.dim, gen));
      embed_tokens = whole, embed_weight = whole->weight;
    }
    layers = register_module("layers", std::make_shared<ModuleList>());
    const int64_t begin = stage ? stage->first_block : 0, end = stage ? stage->end_block : c.layers;
    for (int64_t i = begin; i < end; ++i) {
      blocks.push_back(std::make_shared<LlamaDecoderLayer>(c, &rope, gen, tp));
      if (stage)
        layers->register_module(std::to_string(i), blocks.back());
      else
        layers->push_back(blocks.back());
    }
    if (last) norm = register_module("norm", std::make_shared<RMSNorm>(c.dim, c.rms_eps));
  }
  std::string type_name() const override { return "LlamaModel"; }
  RopeCache rope;
  std::shared_ptr<UnaryModule> embed_tokens;  // Embedding, or VocabParallelEmbedding (this rank's rows)
  Tensor embed_weight;
  std::shared_ptr<ModuleList> layers;
  std::vector<std::shared_ptr<LlamaDecoderLayer>> blocks;  // layers' entries, typed
  std::shared_ptr<RMSNorm> norm;
};

LlamaModel& body(const std::shared_ptr<Module>& m) { return static_cast<LlamaModel&>(*m); }

}  // namespace

LlamaConfig LlamaConfig::preset(const std::string& name) {
  // vocab, context, layers, dim, heads, kv_heads, ffn_dim, rope_theta, tied: the published
  // config.json of each model (HuggingFaceTB/SmolLM-135M, -360M, TinyLlama/TinyLlama-1.1B,
  // meta-llama/Llama-3.2-1B).
  auto make = [](int64_t vocab, int64_t ctx, int64_t layers, int64_t dim, int64_t heads, int64_t kv, int64_t ffn,
                 double theta, bool tied) {
    LlamaConfig c;
    c.vocab_size = vocab, c.context = ctx, c.layers = layers, c.dim = dim, c.heads = heads, c.kv_heads = kv;
    c.ffn_dim = ffn, c.rope_theta = theta, c.tie_embeddings = tied;
    return c;
  };
  // llama-mini is BENCH.md's workload (and issue 42's test shape): gpt-mini's width with 8 heads
  // sharing 2 key/value heads and an untied head.
  if (name == "llama-mini") return make(1000, 256, 4, 256, 8, 2, 688, 10000, false);
  if (name == "smollm-135m") return make(49152, 2048, 30, 576, 9, 3, 1536, 10000, true);
  if (name == "smollm-360m") return make(49152, 2048, 32, 960, 15, 5, 2560, 10000, true);
  if (name == "tinyllama-1.1b") return make(32000, 2048, 22, 2048, 32, 4, 5632, 10000, false);
  if (name == "llama-3.2-1b") {
    LlamaConfig c = make(128256, 131072, 16, 2048, 32, 8, 8192, 500000, true);
    c.rope_scaling = {RopeScaling::Type::Llama3, 32.0, 1.0, 4.0, 8192};
    return c;
  }
  FT_FAIL("LlamaConfig::preset: unknown preset \"", name,
          "\"; known: llama-mini, smollm-135m, smollm-360m, tinyllama-1.1b, llama-3.2-1b");
}

void LlamaConfig::validate() const {
  auto positive = [](int64_t v, const char* field) {
    FT_CHECK(v > 0, "Llama: ", field, " must be positive, found ", v);
  };
  positive(vocab_size, "vocab_size"), positive(context, "context"), positive(layers, "layers");
  positive(dim, "dim"), positive(heads, "heads"), positive(kv_heads, "kv_heads"), positive(ffn_dim, "ffn_dim");
  FT_CHECK(heads % kv_heads == 0, "Llama: heads (", heads, ") must be a multiple of kv_heads, found ", kv_heads);
  FT_CHECK(head_dim > 0 || dim % heads == 0, "Llama: width ", dim, " is not a multiple of the number of heads ", heads,
           " (or give head_dim)");
  FT_CHECK(head_size() % 2 == 0, "Llama: the head size must be even for rotary embeddings, found ", head_size());
  FT_CHECK(std::isfinite(rope_theta) && rope_theta > 0, "Llama: rope_theta must be positive, found ", rope_theta);
  FT_CHECK(std::isfinite(rms_eps) && rms_eps > 0, "Llama: rms_norm_eps must be positive, found ", rms_eps);
}

int64_t LlamaConfig::num_parameters() const {
  const int64_t q = heads * head_size(), kv = kv_heads * head_size();
  const int64_t attention = dim * q + 2 * dim * kv + q * dim + (attention_bias ? q + 2 * kv : 0);
  const int64_t per_layer = attention + 3 * dim * ffn_dim + 2 * dim;
  return vocab_size * dim * (tie_embeddings ? 1 : 2) + layers * per_layer + dim;
}

Llama::Llama(const LlamaConfig& cfg, Generator* gen, std::shared_ptr<Communicator> tensor_group,
             const dist::PipelinePart& pipeline)
    : cfg_(cfg) {
  cfg.validate();
  if (tensor_group && tensor_group->world_size() > 1) {
    // Checked before anything communicates, from numbers every rank has: all refuse alike.
    const int t = tensor_group->world_size();
    FT_CHECK(cfg.heads % t == 0, "tensor parallelism: Llama's ", cfg.heads,
             " attention heads are not divisible by tp = ", t);
    FT_CHECK(cfg.kv_heads % t == 0, "tensor parallelism: Llama's ", cfg.kv_heads,
             " key/value heads are not divisible by tp = ", t);
    FT_CHECK(cfg.ffn_dim % t == 0, "tensor parallelism: Llama's MLP width (ffn_dim) ", cfg.ffn_dim,
             " is not divisible by tp = ", t);
    FT_CHECK(cfg.vocab_size % t == 0, "tensor parallelism: Llama's vocabulary of ", cfg.vocab_size,
             " tokens is not divisible by tp = ", t);
    if (pipeline.count > 1) {
      make_stage(gen, std::move(tensor_group), pipeline);
      return;
    }
    tp_ = std::move(tensor_group);
    // The single-process model, initialised exactly as one process would; this rank keeps its
    // parts (GPT's scheme). The split layers' own initialisation draws from a scratch generator.
    const Llama whole(cfg, gen);
    Generator scratch(0);
    model_ = register_module("model", std::make_shared<LlamaModel>(cfg, &scratch, tp_));
    lm_head_ = register_module("lm_head",
                               cfg.tie_embeddings
                                   ? std::make_shared<dist::ColumnParallelLinear>(body(model_).embed_weight, tp_)
                                   : std::make_shared<dist::ColumnParallelLinear>(cfg.dim, cfg.vocab_size, false, tp_));
    load_state_dict(dist::shard_tensor_parallel_state(whole.state_dict(), *this));
    return;
  }
  if (pipeline.count > 1) {
    make_stage(gen, nullptr, pipeline);
    return;
  }
  model_ = register_module("model", std::make_shared<LlamaModel>(cfg, gen, nullptr));
  LlamaModel& m = body(model_);
  auto head = cfg.tie_embeddings ? std::make_shared<Linear>(m.embed_weight)
                                 : std::make_shared<Linear>(cfg.dim, cfg.vocab_size, false, gen);
  head->fp8 = false;  // fp8-mixed keeps the logits' product in bf16 (fp8.h)
  lm_head_ = register_module("lm_head", head);
  // Hugging Face's LlamaPreTrainedModel._init_weights: Linear and Embedding weights ~ N(0,
  // initializer_range), zero biases; the norms' weights stay ones.
  for (auto& [name, module] : named_modules()) {
    if (cfg.tie_embeddings && module.get() == lm_head_.get()) continue;  // the embedding, initialised there
    if (auto* lin = dynamic_cast<Linear*>(module.get())) {
      init::normal_(lin->weight, 0.0, cfg.init_std, gen);
      if (lin->bias.defined()) init::zeros_(lin->bias);
    } else if (auto* emb = dynamic_cast<Embedding*>(module.get())) {
      init::normal_(emb->weight, 0.0, cfg.init_std, gen);
    }
  }
}

void Llama::make_stage(Generator* gen, std::shared_ptr<Communicator> tensor_group, const dist::PipelinePart& part) {
  // The single-process model built with the same generator; this stage keeps its part (GPT's scheme).
  const Llama whole(cfg_, gen);
  const LlamaModel& w = body(whole.model_);
  std::vector<int64_t> block_params;
  for (const auto& b : w.blocks) block_params.push_back(b->num_parameters());
  const int64_t head = w.norm->num_parameters() + cfg_.vocab_size * cfg_.dim;  // a tied head's copy too
  const std::vector<int64_t> layers =
      dist::stage_layers(block_params, w.embed_weight.numel(), head, part.count, part.layers, "Llama");
  stage_.index = part.index, stage_.count = part.count, stage_.group = part.group;
  for (int k = 0; k < part.index; ++k) stage_.first_block += layers[k];
  stage_.end_block = stage_.first_block + layers[part.index];
  if (tensor_group && tensor_group->world_size() > 1) tp_ = std::move(tensor_group);
  Generator scratch(0);  // overwritten below
  model_ = register_module("model", std::make_shared<LlamaModel>(cfg_, &scratch, tp_, &stage_));
  if (stage_.last()) {
    // A tied head holds its own copy of the embedding here (kept equal by PipelineSync).
    const int64_t rows = tp_ ? cfg_.vocab_size / tp_->world_size() : cfg_.vocab_size;
    if (tp_)
      lm_head_ = register_module("lm_head", std::make_shared<dist::ColumnParallelLinear>(zeros({rows, cfg_.dim}), tp_));
    else
      lm_head_ = register_module("lm_head", std::make_shared<Linear>(zeros({rows, cfg_.dim})));
  }
  load_state_dict(dist::shard_tensor_parallel_state(dist::stage_part_of_state(whole.state_dict(), *this), *this));
}

Tensor Llama::tied_weight() const {
  if (!stage_.split() || !cfg_.tie_embeddings) return Tensor();
  if (stage_.first()) return body(model_).embed_weight;
  return stage_.last() ? lm_head_->named_parameters().front().second : Tensor();
}

Tensor Llama::stage_forward(const Tensor& input, const Tensor& doc_ids) {
  return call_as_this([&] {
    LlamaModel& m = body(model_);
    Tensor x = input;
    if (stage_.first()) {
      FT_CHECK(input.defined() && input.dim() == 2 && is_integral(input.dtype()),
               "Llama: the first pipeline stage takes token ids [B, T], found ",
               input.defined() ? input.shape().str() : std::string("none"));
      if (tp_)
        check_index_range(input, cfg_.vocab_size, [v = cfg_.vocab_size](int64_t id, int64_t) {
          return detail::concat("Llama: token id ", id, " is out of range for a vocabulary of ", v);
        });
      x = (*m.embed_tokens)(input);
    }
    for (auto& block : m.blocks) x = block->forward(x, doc_ids);
    return stage_.last() ? (*lm_head_)((*m.norm)(x)) : x;
  });
}

int64_t Llama::vocab_start() const { return tp_ ? tp_->rank() * (cfg_.vocab_size / tp_->world_size()) : 0; }

Tensor Llama::forward(const Tensor& ids) { return run(ids, Tensor(), nullptr); }

// Called as this module here (operator() does that for forward(ids)).
Tensor Llama::forward(const Tensor& ids, const Tensor& doc_ids) {
  return call_as_this([&] { return run(ids, doc_ids, nullptr); });
}

Tensor Llama::decode(const Tensor& ids, KvCache& cache) {
  FT_CHECK(!tp_,
           "Llama::forward_cached: decoding with a key/value cache runs on a single-process model, not on "
           "one split over a tensor group of ",
           tp_ ? tp_->world_size() : 1, " ranks (gather_tensor_parallel_state gives the whole model's weights)");
  return run(ids, Tensor(), &cache);
}

Tensor Llama::run(const Tensor& ids, const Tensor& doc_ids, KvCache* cache) {
  FT_CHECK(!stage_.split(), "Llama: this model is pipeline ", stage_.describe(),
           " and runs through the pipeline executor (stage_forward), not forward(ids)");
  FT_CHECK(ids.defined() && is_integral(ids.dtype()) && ids.dtype() != DType::Bool,
           "Llama: token ids must be an integer tensor, found ", ids.defined() ? dtype_name(ids.dtype()) : "undefined");
  FT_CHECK(ids.dim() == 2, "Llama: token ids must be [B, T], found shape ", ids.shape().str());
  const int64_t T = ids.size(1), position = cache ? cache->length() : 0;
  FT_CHECK(T >= 1 && position + T <= cfg_.context, "Llama: sequence length ", position + T,
           " must be in [1, context = ", cfg_.context, "]");
  FT_CHECK(!doc_ids.defined() || doc_ids.shape() == ids.shape(), "Llama: doc_ids must be shaped as the token ids ",
           ids.shape().str(), ", found ", doc_ids.shape().str());
  LlamaModel& m = body(model_);
  // A vocabulary-parallel embedding gives zeros for an id no rank holds: refused here instead.
  if (tp_)
    check_index_range(ids, cfg_.vocab_size, [v = cfg_.vocab_size](int64_t id, int64_t) {
      return detail::concat("Llama: token id ", id, " is out of range for a vocabulary of ", v);
    });
  Tensor x = (*m.embed_tokens)(ids);
  for (size_t i = 0; i < m.blocks.size(); ++i)
    x = cache ? m.blocks[i]->forward_cached(x, *cache, static_cast<int64_t>(i)) : m.blocks[i]->forward(x, doc_ids);
  return (*lm_head_)((*m.norm)(x));
}

void Llama::set_activation_checkpointing(bool on) {
  for (auto& block : body(model_).blocks) block->set_activation_checkpointing(on);
}

}  // namespace ft::nn
