// Generating tokens with a decoder (kv_cache.h: CausalDecoder): the prompt in one forward, then one
// token per step from the key/value cache, each chosen from its logits greedily or by sampling with
// temperature, top-k and top-p as Hugging Face's generate does, until a number of tokens or the
// end-of-text token. `fasttrain sample` (tasks.h: sample_text) is this loop with a run's
// tokenizer around it. Implemented in src/nn/generation.cpp.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "fasttrain/kv_cache.h"

namespace ft::nn {

// How a token is chosen from a row of logits. The filters apply in Hugging Face's order
// (temperature, then top-k, then top-p: generate's TemperatureLogitsWarper, TopKLogitsWarper,
// TopPLogitsWarper), and the token is drawn from the softmax of what is left.
struct SamplingOptions {
  double temperature = 1.0;  // > 0 divides the logits; 0 is greedy: the most likely token, no draw
  int64_t top_k = 0;         // keep the k most likely tokens (and any tied with the k-th); 0: all
  double top_p = 1.0;        // in (0, 1]: keep the most likely tokens whose probabilities reach p
  // ft::Error naming the field, what was expected and what was found.
  void validate(int64_t vocab_size) const;
};

// The logits divided by `temperature` (> 0), with the tokens that top_k and then top_p remove set
// to -inf: Hugging Face's warpers. top_k keeps the scores at or above the k-th largest (0 or the
// vocabulary size: all). top_p keeps the smallest set of most likely tokens whose probabilities,
// after temperature and top-k, sum to at least p (nucleus sampling), plus any token tied with its
// least likely one, so the result never depends on the order of the vocabulary (p = 1: all). The
// most likely token always stays. ft::Error for arguments outside those ranges.
std::vector<double> filter_logits(std::span<const double> logits, double temperature, int64_t top_k, double top_p);

// The token chosen from a row of logits: with temperature 0 the most likely (the lowest id among
// equals, as argmax); otherwise the token where the cumulative distribution of softmax(
// filter_logits(...)), taken in id order, first passes u in [0, 1).
int64_t choose_token(std::span<const double> logits, const SamplingOptions& options, double u);

struct GenerationOptions {
  int64_t max_new_tokens = 200;
  SamplingOptions sampling;
  uint64_t seed = 0;       // the draw for new token i is uniform_from_word(philox4x32(seed, i).v[0])
  int64_t eos_token = -1;  // stop once this token is generated (it is returned); -1: never stop early
  // The most tokens the model sees at once (0: its context_length()); a longer sequence slides.
  int64_t window = 0;
  // When a token would pass the window: how many of the last tokens, the new one included, the
  // window restarts with, run again in one forward (0: the whole window; see generate()).
  int64_t slide_keep = 0;
  // Also return the logits each new token was chosen from (Hugging Face's output_logits).
  bool output_logits = false;
};

struct GenerationOutput {
  std::vector<int64_t> tokens;              // the new tokens
  std::vector<std::vector<double>> logits;  // with output_logits: the row of each, before filtering
};

// Continues `prompt` (at least one id) with up to max_new_tokens new ids, batch 1, and returns the
// new ids (ending with eos_token when generation stopped there, as Hugging Face's generate). The
// last `window` ids of the prompt run in one forward (the prefill), then each new id alone,
// attending over the cache. A sequence longer than the window slides (explained where it
// happens). Runs under InferenceMode, without dropout.
GenerationOutput generate(CausalDecoder& model, const std::vector<int64_t>& prompt, const GenerationOptions& options);

}  // namespace ft::nn
