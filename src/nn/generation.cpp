// Token generation with a key/value cache (generation.h): the logits filters of Hugging Face's
// generate (temperature, top-k, top-p), the choice of a token from them, and the decoding loop with
// its sliding window.
#include "fasttrain/generation.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "fasttrain/autograd.h"
#include "fasttrain/random.h"

namespace ft::nn {

namespace {

void check_filters(int64_t vocab, double temperature, int64_t top_k, double top_p, const char* where) {
  FT_CHECK(vocab > 0, where, ": expected logits for at least one token, found none");
  FT_CHECK(std::isfinite(temperature) && temperature >= 0, where, ": expected a finite temperature >= 0, found ",
           temperature);
  FT_CHECK(top_k >= 0 && top_k <= vocab, where, ": expected top_k in [0, ", vocab, "] (the vocabulary size), found ",
           top_k);
  // NaN fails both comparisons.
  FT_CHECK(top_p > 0 && top_p <= 1, where, ": expected top_p in (0, 1], found ", top_p);
}

}  // namespace

void SamplingOptions::validate(int64_t vocab_size) const {
  check_filters(vocab_size, temperature, top_k, top_p, "sampling");
}

std::vector<double> filter_logits(std::span<const double> logits, double temperature, int64_t top_k, double top_p) {
  const auto V = static_cast<int64_t>(logits.size());
  check_filters(V, temperature, top_k, top_p, "filter_logits");
  FT_CHECK(temperature > 0, "filter_logits: expected a temperature > 0 (0 is greedy: no filtering), found ",
           temperature);
  std::vector<double> s(logits.begin(), logits.end());
  for (double& x : s) x /= temperature;
  if (top_k > 0 && top_k < V) {
    // TopKLogitsWarper removes the scores below the k-th largest, so ties with it stay.
    std::vector<double> sorted = s;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<>());
    const double kth = sorted[top_k - 1];
    for (double& x : s)
      if (x < kth) x = -INFINITY;
  }
  if (top_p < 1) {
    // TopPLogitsWarper sorts ascending and removes the tokens whose cumulative probability is at
    // most 1 - p. Taken from the top instead: a token stays while the probability of the tokens
    // before it is below p. Only the tokens top-k left are sorted.
    std::vector<int64_t> order;
    for (int64_t i = 0; i < V; ++i)
      if (s[i] > -INFINITY) order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[a] > s[b]; });
    const double top = s[order[0]];
    double z = 0;
    for (int64_t i : order) z += std::exp(s[i] - top);
    double before = 0, cutoff = top;
    for (int64_t i : order) {
      if (before >= top_p) break;
      cutoff = s[i];
      before += std::exp(s[i] - top) / z;
    }
    // The last token kept sets the cutoff, so the tokens tied with it stay too.
    for (double& x : s)
      if (x < cutoff) x = -INFINITY;
  }
  return s;
}

int64_t choose_token(std::span<const double> logits, const SamplingOptions& o, double u) {
  o.validate(static_cast<int64_t>(logits.size()));
  if (o.temperature == 0) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  FT_CHECK(u >= 0 && u < 1, "choose_token: expected a uniform draw in [0, 1), found ", u);
  const std::vector<double> s = filter_logits(logits, o.temperature, o.top_k, o.top_p);
  const double top = *std::max_element(s.begin(), s.end());
  std::vector<double> p(s.size());
  double total = 0;
  for (size_t k = 0; k < s.size(); ++k) total += p[k] = std::exp(s[k] - top);  // exp(-inf) = 0: removed
  double left = u * total;
  int64_t chosen = 0;
  // The last candidate catches what rounding leaves of u.
  for (size_t k = 0; k < p.size(); ++k)
    if (p[k] > 0) {
      chosen = static_cast<int64_t>(k);
      if ((left -= p[k]) < 0) break;
    }
  return chosen;
}

GenerationOutput generate(CausalDecoder& model, const std::vector<int64_t>& prompt, const GenerationOptions& o) {
  const int64_t V = model.vocab_size();
  FT_CHECK(o.max_new_tokens >= 0, "generate: expected max_new_tokens >= 0, found ", o.max_new_tokens);
  o.sampling.validate(V);
  FT_CHECK(o.eos_token >= -1 && o.eos_token < V, "generate: expected eos_token in [-1, ", V, "), found ", o.eos_token);
  FT_CHECK(o.window >= 0 && o.window <= model.context_length(), "generate: expected a window in [0, ",
           model.context_length(), "] (0: the model's context), found ", o.window);
  const int64_t window = o.window > 0 ? o.window : model.context_length();
  FT_CHECK(o.slide_keep >= 0 && o.slide_keep <= window, "generate: expected slide_keep in [0, ", window,
           "] (the window; 0: all of it), found ", o.slide_keep);
  const int64_t keep = o.slide_keep > 0 ? o.slide_keep : window;
  FT_CHECK(!prompt.empty(), "generate: the prompt must hold at least one token");
  for (int64_t id : prompt) FT_CHECK(id >= 0 && id < V, "generate: expected prompt ids in [0, ", V, "), found ", id);
  GenerationOutput out;
  if (o.max_new_tokens == 0) return out;

  autograd::InferenceMode guard;
  std::vector<int64_t> ids = prompt;
  KvCache cache = model.make_cache(1, window);
  const Device device = cache.options().device;  // the model's
  auto on_device = [&](const std::vector<double>& v) {
    return from_vector(v, {1, static_cast<int64_t>(v.size())}, DType::I64).to(device);
  };
  // The logits of the next token after the last n ids, run from an empty cache in one forward.
  auto prefill = [&](int64_t n) {
    cache.clear();
    return model.forward_cached(on_device(std::vector<double>(ids.end() - n, ids.end())), cache)
        .select(0, 0)
        .select(0, n - 1);
  };
  Tensor logits = prefill(std::min<int64_t>(window, static_cast<int64_t>(ids.size())));
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    std::vector<double> row = logits.to_vector();
    const double u =
        o.sampling.temperature > 0 ? uniform_from_word(philox4x32(o.seed, static_cast<uint64_t>(i)).v[0]) : 0.0;
    const int64_t next = choose_token(row, o.sampling, u);
    out.tokens.push_back(next);
    if (o.output_logits) out.logits.push_back(std::move(row));
    ids.push_back(next);
    if (next == o.eos_token || i + 1 == o.max_new_tokens) break;
    if (cache.length() < window) {
      logits = model.forward_cached(on_device({static_cast<double>(next)}), cache).select(0, 0).select(0, 0);
    } else {
      // The window is full: slide it. A position's keys and values depend on everything before
      // it in the window (every layer mixes the earlier positions in, and GPT's learned positions
      // are added at the bottom), so the cache cannot drop its oldest position and keep the rest:
      // llama.cpp's context shift does that by re-rotating the cached keys, which only
      // approximates what the model computes for the shorter window, and Hugging Face's
      // generate stops at the model's positions instead. Here the window restarts with its last
      // `keep` tokens (the new one included), run again in one forward: exact, it gives what the
      // model gives for that window without a cache. With keep = window (the default) every token
      // is predicted from a full window, as the uncached loop did (a prefill per token past the
      // window: no faster than it there, and no different); a smaller keep prefills once every
      // window - keep + 1 tokens, at the price of a shorter history right after each slide.
      logits = prefill(keep);
    }
  }
  return out;
}

}  // namespace ft::nn
