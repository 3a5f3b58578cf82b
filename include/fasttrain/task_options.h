// The options of the built-in tasks (tasks.h): the model they build and the data they read or
// generate, the [model] and [data] tables of a run file. TrainerConfig (train.h) carries them so
// that one file and one set of flags describe a run; the Trainer itself never reads them.
#pragma once
#include <cstdint>
#include <string>

namespace ft::train {

// The model a built-in task builds (tasks.h): `[model]` in TOML, flat flags on the command line
// (--model, --context, ...). A module of one's own has its own options and ignores these.
struct ModelOptions {
  // images: "cnn-mini" (BENCH.md) or "cnn-tiny" (faster); lm: the GPT presets "gpt-mini", "gpt2",
  // "gpt2-medium", "gpt2-large", or "custom" (a GPT of layers, dim, heads, context); the Llama
  // presets "llama-mini", "smollm-135m", "smollm-360m", "tinyllama-1.1b", "llama-3.2-1b", or
  // "llama" (a Llama of layers, dim, heads, kv_heads, ffn_dim, rope_theta, context); classify:
  // "mlp", "cnn-mini", "resnet18", "resnet20" or "resnet50"; char: a custom GPT.
  std::string name = "cnn-mini";
  int64_t context = 64;  // GPTs and Llamas: tokens of context (a Llama preset's: the training window)
  int64_t layers = 2;
  int64_t dim = 128;
  int64_t heads = 4;
  int64_t kv_heads = 0;       // Llama: key/value heads (0: heads; fewer: grouped-query attention)
  int64_t ffn_dim = 0;        // Llama: gated MLP width (0: 8/3 dim rounded up to a multiple of 64)
  double rope_theta = 10000;  // Llama: rotary embedding base
  double dropout = 0.0;       // GPT
  std::string init_from;      // lm: initial weights (.safetensors; Hugging Face GPT-2 and Llama names too)
};

// The data a built-in task reads or generates, and the goal it states: `[data]` in TOML.
struct DataOptions {
  std::string train;          // lm: a glob of llm.c token shards; classify: mnist:DIR, cifar10:DIR, folder:DIR, npy:X,y
  std::string val;            // the validation data, in the same forms ("": classify holds out val_fraction)
  double val_fraction = 0.1;  // classify: the share of the training data held out when val is empty
  int64_t vocab_size = 0;     // lm: 0 reads it from the tokenizer/vocab file beside the shards
  bool augment = true;        // classify: random crop (4-pixel padding) and horizontal flip of training images
  int64_t train_chars = 2'000'000;  // char: the generated Markov text
  int64_t val_chars = 200'000;
  int64_t image_size = 32;  // images: generated side; classify: images are resized to it
  int64_t classes = 6;      // images: shape classes
  int64_t train_images = 10000;
  int64_t val_images = 1000;
  double goal_gap = 0.05;    // char: final val loss within this many nats of the entropy floor
  double goal_accuracy = 0;  // images, classify: final validation accuracy to reach (0: no goal)
  // lm: attention stays inside each document of a packed window (DocumentMask; documents found by
  // data::document_ids from the start token vocab.json names). Positions are not reset.
  bool doc_mask = false;
};

}  // namespace ft::train
