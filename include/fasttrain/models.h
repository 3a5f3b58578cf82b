// The model zoo, built from nn.h's modules: BENCH.md's mlp, cnn-mini and ResNets, and GPT with its
// weight files in fasttrain's layout and Hugging Face's. Implemented in src/models/. Kept apart
// from nn.h, which has modules and layers only: a program with a model of its own includes nn.h.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fasttrain/kv_cache.h"
#include "fasttrain/nn.h"
#include "fasttrain/ops/rotary.h"
#include "fasttrain/pipeline.h"
#include "fasttrain/safetensors.h"
#include "fasttrain/tensor_parallel.h"

namespace ft::nn {

// MLP: Linear/ReLU stack; sizes {784, 1024, 1024, 10} is BENCH.md's `mlp`.
std::shared_ptr<Sequential> mlp(const std::vector<int64_t>& sizes, Generator* gen = nullptr);
// BENCH.md's `cnn-mini`: 6 x (conv3x3 no bias, BatchNorm, ReLU) with channels 32,32,64(s2),64,
// 128(s2),128; global average pool; Linear(128, classes). Layout and names as torch.nn.Sequential.
std::shared_ptr<Sequential> cnn_mini(int64_t in_channels = 3, int64_t classes = 10, Generator* gen = nullptr);
// Their residual blocks are CheckpointableBlocks: nn::set_activation_checkpointing(*net, true).
// ResNets: "resnet20", "resnet56" (CIFAR, 3x32x32, basic blocks 16/32/64) and "resnet18",
// "resnet50" (ImageNet stem, basic / bottleneck blocks; resnet50 = BENCH.md's, bias-free convs).
std::shared_ptr<UnaryModule> resnet(const std::string& name, int64_t classes, Generator* gen = nullptr);

struct GPTConfig {
  int64_t vocab_size = 512;  // the tokens; the embedding is padded to a multiple of 64 (see GPT)
  int64_t context = 128;
  int64_t layers = 4;
  int64_t dim = 256;
  int64_t heads = 4;
  double dropout = 0.0;
  // "gpt-mini" (BENCH.md: vocab 512, ctx 128, 4 layers, width 256, 4 heads), "gpt2" (124M),
  // "gpt2-medium" (350M), "gpt2-large" (774M); GPT-2 sizes use vocab 50257 -> padded 50304.
  static GPTConfig preset(const std::string& name);
};
// GPT-2: token + position embeddings, pre-norm blocks (ln_1, attn, ln_2, mlp with tanh-GELU),
// final LayerNorm, head tied to the token embedding. Names follow Hugging Face's GPT-2
// ("transformer.wte.weight", "transformer.h.0.attn.c_attn.weight", "lm_head.weight", ...).
// GPT-2 initialisation: Linear/Embedding ~ N(0, 0.02), zero biases (BENCH.md); c_proj weights
// additionally scaled by 1/sqrt(2 * layers) when gpt2_residual_scaling is set.
//
// Vocabulary padding: the tied embedding has padded_vocab() >= vocab_size rows (a multiple of 64,
// as llm.c does: 50257 -> 50304), but the padding rows are storage only. Ids must be below
// vocab_size, and the head multiplies by the first vocab_size rows, so the logits are
// [B, T, vocab_size]: no padded class ever gets probability (loss, evaluation, sampling all see
// the real vocabulary only), the loss equals that of an unpadded model with the same weights, and
// the padding rows' gradient is exactly zero.
//
// Tensor parallelism (tensor_parallel.h): built with a tensor group of t > 1 ranks, each rank holds
// its part of the model under the same names: c_attn column-parallel by heads (q, k and v each),
// c_fc column-parallel, both c_proj row-parallel, the (padded) embedding and tied head split by
// vocabulary rows; layer norms, wpe and the row-parallel biases replicated. The parts are cut from
// the single-process model initialised with the same generator, so the t ranks together hold
// exactly its weights (gather_tensor_parallel_state returns them). forward then returns this
// rank's columns of the logits (VocabParallelOutput): [B, T, its real vocabulary rows]. Refused
// unless heads and the padded vocabulary divide by t and every rank holds a real vocabulary row.
//
// Decoding with a KvCache (kv_cache.h: forward_cached): position p adds row p of the position
// embedding, as in forward. Single-process models only (refused with a tensor group).
//
// Pipeline parallelism (pipeline.h): built with a PipelinePart of p > 1 stages, the model holds
// its stage's blocks (split by stage_layers: balanced by parameters or --pp-layers) under their
// single-process names ("transformer.h.5..."), the embeddings on the first stage, ln_f and the
// head on the last, which holds its own copy of the tied embedding ("lm_head.weight"). All cut
// from the single-process model built with the same generator. It runs through stage_forward;
// forward(ids) is refused.
class GPT : public CausalDecoder, public dist::VocabParallelOutput, public dist::PipelineStageModel {
 public:
  explicit GPT(const GPTConfig& cfg, Generator* gen = nullptr, bool gpt2_residual_scaling = false,
               std::shared_ptr<dist::Communicator> tensor_group = nullptr, const dist::PipelinePart& pipeline = {});
  const dist::PipelineStage& pipeline_stage() const override { return stage_; }
  Tensor stage_forward(const Tensor& input, const Tensor& doc_ids) override;
  int64_t hidden_size() const override { return cfg_.dim; }
  Tensor tied_weight() const override;
  int64_t dropout_blocks(int64_t batch, int64_t length) const override;
  // ids [B, T] integer in [0, vocab_size) -> logits [B, T, vocab_size] (with a tensor group:
  // this rank's columns of them)
  Tensor forward(const Tensor& ids) override;
  std::shared_ptr<dist::Communicator> vocab_group() const override { return tp_; }
  int64_t vocab_start() const override;
  // The same with every attention layer under DocumentMask{doc_ids} (doc_ids [B, T], i32 or i64,
  // on ids' device; undefined: plain causal): a token attends only to earlier tokens of its own
  // packed document. Positions are not reset per document: token t keeps position t of the
  // window, as Llama 3's pretraining keeps them.
  Tensor forward(const Tensor& ids, const Tensor& doc_ids);
  std::string type_name() const override { return "GPT"; }
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t context_length() const override { return cfg_.context; }
  const GPTConfig& config() const { return cfg_; }
  int64_t padded_vocab() const { return padded_vocab_; }  // rows of the embedding
  // Checkpoints every transformer block (see CheckpointableBlock).
  void set_activation_checkpointing(bool on);

 protected:
  // Recognises Hugging Face's GPT-2 layout and points to load_gpt2_weights / gpt2_from_hf_state.
  std::string explain_foreign_state(const TensorMap& state) const override;
  CacheShape cache_shape() const override { return {cfg_.layers, cfg_.heads, cfg_.dim / cfg_.heads}; }
  Tensor decode(const Tensor& ids, KvCache& cache) override;

 private:
  // forward and decode: the ids at positions cache->length() .. (0 without a cache).
  Tensor run(const Tensor& ids, const Tensor& doc_ids, KvCache* cache);
  Tensor embed(const Tensor& ids, const Tensor& doc_ids, KvCache* cache);  // token + position embeddings
  Tensor head(const Tensor& hidden);                                       // ln_f, then the logits
  void make_stage(Generator* gen, bool gpt2_residual_scaling, std::shared_ptr<dist::Communicator> tensor_group,
                  const dist::PipelinePart& part);
  GPTConfig cfg_;
  int64_t padded_vocab_;
  dist::PipelineStage stage_;               // the whole model unless built for a pipeline stage
  std::shared_ptr<Module> transformer_;     // holds wte, wpe, h (ModuleList of blocks), ln_f
  std::shared_ptr<UnaryModule> lm_head_;    // Linear, or ColumnParallelLinear with a tensor group
  Tensor head_weight_;                      // lm_head's weight: the (local) embedding
  std::shared_ptr<dist::Communicator> tp_;  // null: one process holds the whole model
};

// --- the Llama family: Llama 2/3, SmolLM, TinyLlama, Qwen2-style decoders ---
// The fields of Hugging Face's LlamaConfig (config.json) that shape the model.
struct LlamaConfig {
  int64_t vocab_size = 512;
  int64_t context = 128;        // max_position_embeddings: the rotary tables' rows
  int64_t layers = 4;           // num_hidden_layers
  int64_t dim = 256;            // hidden_size
  int64_t heads = 4;            // num_attention_heads
  int64_t kv_heads = 2;         // num_key_value_heads: < heads is grouped-query attention, 1 multi-query
  int64_t head_dim = 0;         // 0: dim / heads
  int64_t ffn_dim = 688;        // intermediate_size of the gated MLP
  double rope_theta = 10000;    // rope_theta
  RopeScaling rope_scaling;     // rope_scaling (Llama 3.1/3.2: type llama3)
  double rms_eps = 1e-5;        // rms_norm_eps
  bool tie_embeddings = true;   // tie_word_embeddings: the head is the embedding
  bool attention_bias = false;  // q, k and v projections with biases (Qwen2)
  double init_std = 0.02;       // initializer_range: every Linear and Embedding weight ~ N(0, init_std)
  int64_t head_size() const { return head_dim > 0 ? head_dim : dim / heads; }
  // "llama-mini" (gpt-mini's size, 2 KV heads: BENCH.md), and the published shapes
  // "smollm-135m", "smollm-360m", "tinyllama-1.1b", "llama-3.2-1b".
  static LlamaConfig preset(const std::string& name);
  // ft::Error naming the field, what was expected and what was found.
  void validate() const;
  // The model's parameters (a tied head counted once), without building it.
  int64_t num_parameters() const;
};
// A Llama-family decoder with Hugging Face's LlamaForCausalLM names ("model.embed_tokens.weight",
// "model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.gate_proj.weight",
// "model.norm.weight", "lm_head.weight"), so its state_dict is a Hugging Face checkpoint's:
// token embedding; pre-norm blocks x + attn(rms_norm(x)), then + mlp(rms_norm(.)); attention with
// rotary embeddings on q and k (HF's rotate_half layout) and kv_heads K/V heads shared by groups
// of query heads; the gated MLP down(silu(gate(x)) * up(x)); final RMSNorm; the head, tied to the
// embedding or its own. The blocks are CheckpointableBlocks.
//
// Tensor parallelism (tensor_parallel.h), as GPT's: with a tensor group of t > 1 ranks q_proj,
// k_proj and v_proj are column-parallel by heads (rank r: query heads [r H/t, (r+1) H/t) and the
// key/value heads their groups share, [r KV/t, (r+1) KV/t)), gate_proj and up_proj column-parallel,
// o_proj and down_proj row-parallel, the embedding and the head (tied or not) split by vocabulary
// rows; the norms replicated. The parts are cut from the single-process model built with the same
// generator; forward returns this rank's vocabulary columns of the logits. Refused unless heads,
// kv_heads, ffn_dim and vocab_size divide by t.
//
// Decoding with a KvCache (kv_cache.h: forward_cached): the cache holds kv_heads heads per layer,
// and position p's q and k rotate by row p of the rotary tables, as in forward. Single-process
// models only (refused with a tensor group).
//
// Pipeline parallelism, as GPT's: "model.layers.5..." on its stage, embed_tokens on the first,
// norm and lm_head on the last (a tied head there holds its own copy of the embedding).
class Llama : public CausalDecoder, public dist::VocabParallelOutput, public dist::PipelineStageModel {
 public:
  explicit Llama(const LlamaConfig& cfg, Generator* gen = nullptr,
                 std::shared_ptr<dist::Communicator> tensor_group = nullptr, const dist::PipelinePart& pipeline = {});
  const dist::PipelineStage& pipeline_stage() const override { return stage_; }
  Tensor stage_forward(const Tensor& input, const Tensor& doc_ids) override;
  int64_t hidden_size() const override { return cfg_.dim; }
  Tensor tied_weight() const override;
  // ids [B, T] integer in [0, vocab_size), T <= context -> logits [B, T, vocab_size] (with a
  // tensor group: this rank's columns of them)
  Tensor forward(const Tensor& ids) override;
  std::shared_ptr<dist::Communicator> vocab_group() const override { return tp_; }
  int64_t vocab_start() const override;
  // With document-masked attention in every layer, as GPT::forward(ids, doc_ids); rotary
  // positions are the window's, not restarted per document (Llama 3's pretraining).
  Tensor forward(const Tensor& ids, const Tensor& doc_ids);
  std::string type_name() const override { return "Llama"; }
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t context_length() const override { return cfg_.context; }
  const LlamaConfig& config() const { return cfg_; }
  void set_activation_checkpointing(bool on);

 protected:
  CacheShape cache_shape() const override { return {cfg_.layers, cfg_.kv_heads, cfg_.head_size()}; }
  Tensor decode(const Tensor& ids, KvCache& cache) override;

 private:
  Tensor run(const Tensor& ids, const Tensor& doc_ids, KvCache* cache);  // as GPT's
  void make_stage(Generator* gen, std::shared_ptr<dist::Communicator> tensor_group, const dist::PipelinePart& part);
  LlamaConfig cfg_;
  dist::PipelineStage stage_;
  std::shared_ptr<Module> model_;           // embed_tokens, layers, norm
  std::shared_ptr<UnaryModule> lm_head_;    // Linear, or ColumnParallelLinear with a tensor group
  std::shared_ptr<dist::Communicator> tp_;  // null: one process holds the whole model
};

// --- GPT-2 weight files: ours and Hugging Face's ---
// The two layouts a GPT-2 weight file comes in.
enum class GptWeightLayout {
  // GPT::state_dict(), what Module::save writes: "transformer."-prefixed names, nn.Linear weights
  // [out, in], the embedding padded to padded_vocab() rows, "lm_head.weight" listed (tied).
  Fasttrain,
  // Hugging Face's GPT2LMHeadModel: Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc,
  // mlp.c_proj) stored [in, out], the embedding unpadded [vocab_size, dim], no "lm_head.weight"
  // (tied). Read with or without the "transformer." prefix (GPT2Model files such as the Hub's
  // gpt2/model.safetensors have none), with or without the ".attn.bias"/".attn.masked_bias" mask
  // buffers of older files (ignored); written with the prefix and without buffers.
  HuggingFace,
};

// Which layout a GPT-2 weight map is in, by its names (unprefixed "wte.weight", "h.0....", mask
// buffers) and shapes (a Conv1D c_attn weight is [dim, 3 dim], ours [3 dim, dim]).
GptWeightLayout detect_gpt2_layout(const TensorMap& state);

// Loads a GPT-2 .safetensors file in either layout (detected) into `model` and returns the
// layout found. This is the function for initialising from a Hugging Face GPT-2 checkpoint
// (`--init-from`): Conv1D weights are transposed, the embedding padded (padding rows zero), the
// mask buffers dropped. The model's config must match the file (vocab_size, context, layers,
// dim); a mismatch names the file and every tensor that differs, and leaves the model unchanged.
GptWeightLayout load_gpt2_weights(GPT& model, const std::string& safetensors_path);

// Writes `model`'s weights as a .safetensors file in the given layout (HuggingFace: loadable by
// transformers' GPT2LMHeadModel.from_pretrained next to a config.json; the embedding is cut to
// vocab_size rows). Fasttrain is the same file as model.save(path).
void save_gpt2_weights(const GPT& model, const std::string& safetensors_path, GptWeightLayout layout);

// The conversions behind the two functions above, on in-memory maps. gpt2_from_hf_state accepts
// what load_gpt2_weights does (an embedding of vocab_size or padded_vocab() rows; a
// "lm_head.weight" must equal the embedding, since the model ties them) and returns a map for
// model.load_state_dict; gpt2_to_hf_state returns the HuggingFace layout with the prefix.
TensorMap gpt2_from_hf_state(const TensorMap& hf, const GPT& model);
TensorMap gpt2_to_hf_state(const GPT& model);

}  // namespace ft::nn
