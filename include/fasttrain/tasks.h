// The built-in tasks of `fasttrain train --task`, as ordinary TrainModule / DataModule pairs
// (train_module.h) built from a TrainerConfig: nothing in the Trainer knows about them.
//  char    a small GPT learns next-character prediction on text drawn from the built-in trigram
//          Markov chain, whose entropy rate is the floor its validation loss is reported against
//  images  a small CNN classifies procedurally drawn shapes
//  lm      a GPT learns next-token prediction on llm.c token shards (`fasttrain data`)
//  classify  a classifier (mlp, cnn-mini, resnet18/20/50) on data of one's own: MNIST, CIFAR-10,
//          a folder of JPEG/PNG images per class, or .npy arrays (src/tasks/classify_data.h)
// Implemented in src/tasks/char_task.cpp, image_task.cpp, lm_task.cpp and classify_task.cpp.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "fasttrain/hf_folder.h"
#include "fasttrain/loader.h"
#include "fasttrain/models.h"
#include "fasttrain/nn.h"
#include "fasttrain/random.h"
#include "fasttrain/train.h"
#include "fasttrain/train_module.h"

namespace ft::train {

struct BuiltinTask {
  std::unique_ptr<TrainModule> module;
  std::unique_ptr<DataModule> data;
};
// The task config.task names, with its data drawn and its model initialised from config.seed;
// its options are checked first (validate_task_options).
BuiltinTask make_builtin_task(const TrainerConfig& config);
// Checks the [model] and [data] options the built-in task config.task reads; ft::Error naming
// the option, what was expected and what was found. Nothing for another task name.
void validate_task_options(const TrainerConfig& config);
// Whether `model` names a GPT preset of the lm task: gpt-mini, gpt2, gpt2-medium or gpt2-large.
bool is_gpt_preset(const std::string& model);
// Sets context, layers, dim and heads to those of the GPT preset m.name.
void set_gpt_preset(ModelOptions& m);
// Whether `model` names a Llama preset (LlamaConfig::preset) or a Llama of its own ("llama").
bool is_llama_preset(const std::string& model);
bool is_llama(const std::string& model);
// Sets layers, dim, heads, kv_heads, ffn_dim and rope_theta to those of the Llama preset m.name,
// and the context (the training window) to the preset's, at most 2048, unless keep_context.
void set_llama_preset(ModelOptions& m, bool keep_context = false);
// The LlamaConfig the options describe (a preset's, with its own rotary scaling and context of
// positions; or "llama"'s fields), for a vocabulary of vocab_size.
nn::LlamaConfig llama_config(const ModelOptions& m, int64_t vocab_size);

// The GPT of the char and lm tasks: context, layers, dim, heads and dropout from the config,
// GPT-2 initialisation (also used by `fasttrain sample` and `fasttrain eval`).
std::shared_ptr<nn::GPT> make_gpt_model(const TrainerConfig& c, int64_t vocab_size, Generator* gen);
// The decoder of the char and lm tasks, ids [B, T] -> logits: the architecture of the Hugging Face
// folder --init-from names (its config.json), else a Llama (is_llama(c.model.name)), else
// make_gpt_model's GPT.
std::shared_ptr<nn::CausalDecoder> make_decoder(const TrainerConfig& c, int64_t vocab_size, Generator* gen);
// Classification steps of the images and classify tasks, for any classifier of one's own too:
// field 0 the input, field 1 the integer labels. The training step's loss is the mean
// cross-entropy; the validation step adds the batch's "accuracy".
StepOutput classification_step(nn::UnaryModule& model, const data::Batch& batch);
StepOutput classification_eval_step(nn::UnaryModule& model, const data::Batch& batch);
// "val accuracy 97.10% on 1000 images of 6 classes (goal >= 95.0%: met)" and whether it was met.
// No goal (nullopt) when `goal` is 0: the user stated none.
std::optional<Goal> accuracy_goal(const EvalResult& result, double goal, int64_t samples, const char* what,
                                  int64_t classes);

// The mean next-token cross-entropy of a batch of "tokens" and "targets" [B, T] (char and lm).
Tensor next_token_loss(nn::UnaryModule& model, const data::Batch& batch);
// The mean cross-entropy of a decoder's logits [B, T, V] against targets [B, T]; for a
// tensor-parallel model (dist::VocabParallelOutput) formed across its tensor group from this
// rank's vocabulary columns, without gathering them.
Tensor next_token_cross_entropy(const nn::UnaryModule& model, const Tensor& logits, const Tensor& targets);
// Loads weights into a GPT from a .safetensors file (--init-from): fasttrain's layout or Hugging
// Face GPT-2's (Conv1D [in, out] weights, with or without the "transformer." prefix).
void load_gpt_weights(nn::GPT& model, const std::string& path);
// Whether --init-from names a Hugging Face model folder (a directory holding config.json).
bool is_hf_folder(const std::string& init_from);
// Loads --init-from into the decoder: a Hugging Face model folder (hf_folder.h: config.json and
// safetensors, sharded or not; make_decoder built the model from its config.json); a GPT from a
// .safetensors file as load_gpt_weights; a Llama from a .safetensors file with Hugging Face's
// names (a tied head's absent lm_head.weight is the embedding).
void load_decoder_weights(nn::UnaryModule& model, const std::string& path);

// Writes the decoder of a char or lm run or checkpoint folder as a Hugging Face model folder
// (hf_folder.h: config.json, safetensors sharded past options.max_shard_bytes, the index), plus the
// run's tokenizer.json when its shards were made with one: what transformers' from_pretrained and
// AutoTokenizer load. `fasttrain export --format hf`.
void export_hf_folder(const std::string& run_dir, const std::string& out_dir, const nn::HfSaveOptions& options = {});

struct SampleOptions {
  std::string prompt = "The ";
  int64_t tokens = 200;      // tokens (characters for a char vocabulary) to generate, at most
  double temperature = 0.8;  // 0: always the most likely token
  int64_t top_k = 0;         // sample among the k most likely tokens (0: all)
  double top_p = 1.0;        // then among the most likely tokens whose probabilities reach p (1: all)
  uint64_t seed = 0;
  // Stop at the tokenizer's end-of-text token, as Hugging Face's generate stops at eos_token_id
  // (it is not written out); a vocabulary without one never stops early.
  bool stop_at_eos = true;
};
// Loads the decoder of a char or lm run or checkpoint folder (config.toml, task.json with the
// vocabulary, model.safetensors) and returns `prompt` continued by up to `tokens` tokens, generated
// with a key/value cache (generation.h: nn::generate) in the run's context window.
std::string sample_text(const std::string& dir, const SampleOptions& options);

}  // namespace ft::train
