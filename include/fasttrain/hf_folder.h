// Hugging Face model folders: config.json plus model.safetensors, or the shards listed by
// model.safetensors.index.json, as transformers' save_pretrained writes them and from_pretrained
// reads them, for the Llama family (LlamaForCausalLM, and Qwen2ForCausalLM without sliding
// windows) and GPT-2 (GPT2LMHeadModel). Implemented in src/models/hf_folder.cpp; JSON stays
// private to the library.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "fasttrain/dtype.h"
#include "fasttrain/models.h"
#include "fasttrain/safetensors.h"

namespace ft::nn {

enum class HfModelType { Llama, Gpt2 };

// What config.json describes: `llama` when type is Llama, `gpt` when it is Gpt2 (the other is left
// at its defaults).
struct HfModelConfig {
  HfModelType type = HfModelType::Llama;
  LlamaConfig llama;
  GPTConfig gpt;
};

// Reads DIR/config.json. model_type "llama" and "qwen2" map to LlamaConfig (num_key_value_heads
// absent: heads; head_dim absent: hidden / heads; rope_theta absent: 10000; tie_word_embeddings
// absent: false, transformers' default for both; rope_scaling null or of type "llama3"), "gpt2" to
// GPTConfig. Refused with an ft::Error naming the file, the field and its value: any other
// model_type (Mistral included), hidden_act other than "silu" (Llama) or activation_function
// other than "gelu_new" (GPT-2), another rope_scaling type, a sliding window in use, mlp_bias,
// and missing or mistyped shape fields.
HfModelConfig read_hf_config(const std::string& dir);

// The weights of DIR, as saved (Hugging Face's names and layouts, no conversion): model.safetensors
// (first, as from_pretrained looks), or every file named by model.safetensors.index.json's "weight_map" (name -> file).
// Refused naming the file: a malformed index, a listed shard that is missing, a tensor in two shards, a shard that
// lacks a tensor the index puts there.
TensorMap read_hf_weights(const std::string& dir);

// Loads the folder DIR into a model built for it (e.g. from read_hf_config): config.json must
// describe model.config() (every differing field named in one error), the weights must have
// exactly the model's names and shapes (a tied head's absent "lm_head.weight" is the embedding; a
// present one must equal it). GPT-2 goes through gpt2_from_hf_state (Conv1D transposes, the
// embedding padded). Checks everything before copying: a failed load changes nothing.
void load_hf_folder(Llama& model, const std::string& dir);
void load_hf_folder(GPT& model, const std::string& dir);
// One .safetensors file in Hugging Face's Llama names into `model` (no config.json: the model's
// own config is taken as the file's), the tied head completed as load_hf_folder does.
void load_llama_weights(Llama& model, const std::string& safetensors_path);

struct HfSaveOptions {
  // Past this many bytes of tensor data a new shard begins (transformers' max_shard_size; a
  // tensor larger than it gets a shard of its own). One shard: model.safetensors, no index.
  int64_t max_shard_bytes = 5'000'000'000;
  std::optional<int64_t> bos_token_id, eos_token_id;  // written to config.json when given
  DType dtype = DType::F32;  // F32, BF16 or F16: the weights are converted on write (torch_dtype)
};

// Writes DIR as save_pretrained does: config.json (architectures, model_type, every shape field,
// torch_dtype, the token ids given) and the weights in Hugging Face's layout (a tied head left
// out), as model.safetensors or model-0000N-of-0000M.safetensors with
// model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"}). The folder is written
// under a temporary name beside DIR and renamed over it, so DIR is either complete or untouched.
void save_hf_folder(const Llama& model, const std::string& dir, const HfSaveOptions& options = {});
void save_hf_folder(const GPT& model, const std::string& dir, const HfSaveOptions& options = {});

}  // namespace ft::nn
