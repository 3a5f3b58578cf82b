// Generation speed (generation.h: nn::generate), batch 1, greedy: a prompt of --prompt random tokens
// in one forward, then --new tokens one at a time from the key/value cache, on BENCH.md's gpt-mini
// or llama-mini (random weights; the work does not depend on them). bench/torch_generate.py is the
// PyTorch side: the same models and the same work in an HF-style loop with past_key_values.
// --uncached times the loop `fasttrain sample` ran before the cache (the whole sequence through the
// model for every token), to show what the cache saves.
// Prints one JSON line per run: the median of --rounds runs after --warmup ones.
// Usage: generate_tokens [--model gpt-mini|llama-mini] [--prompt N] [--new N] [--threads N]
//                        [--rounds N] [--warmup N] [--device cpu|cuda] [--uncached]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fasttrain/fasttrain.h"

using namespace ft;

namespace {

std::shared_ptr<nn::CausalDecoder> make_model(const std::string& name, Generator& gen) {
  if (name == "gpt-mini") return std::make_shared<nn::GPT>(nn::GPTConfig::preset("gpt-mini"), &gen);
  // BENCH.md's llama-mini (torch_bench.py's): vocabulary 1000, 256 positions, 8 heads sharing 2
  // key/value heads, untied head.
  if (name == "llama-mini") return std::make_shared<nn::Llama>(nn::LlamaConfig::preset("llama-mini"), &gen);
  std::fprintf(stderr, "generate_tokens: unknown model %s (gpt-mini or llama-mini)\n", name.c_str());
  std::exit(2);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The loop before the cache: every token runs the whole sequence so far (at most the context).
void uncached_greedy(nn::CausalDecoder& model, std::vector<int64_t> ids, int64_t tokens) {
  autograd::InferenceMode guard;
  for (int64_t i = 0; i < tokens; ++i) {
    const int64_t t = std::min<int64_t>(model.context_length(), static_cast<int64_t>(ids.size()));
    const std::vector<double> window(ids.end() - t, ids.end());
    const Tensor logits = model(from_vector(window, {1, t}, DType::I64)).select(0, 0).select(0, t - 1);
    const std::vector<double> row = logits.to_vector();
    ids.push_back(std::max_element(row.begin(), row.end()) - row.begin());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_name = "gpt-mini", device_name = "cpu";
  int64_t prompt_len = 32, new_tokens = 96;
  int threads = 2, rounds = 5, warmup = 1;
  bool uncached = false;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (!std::strcmp(a, "--uncached")) {
      uncached = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "generate_tokens: %s needs a value\n", a);
      return 2;
    }
    const char* v = argv[++i];
    if (!std::strcmp(a, "--model"))
      model_name = v;
    else if (!std::strcmp(a, "--prompt"))
      prompt_len = std::atoll(v);
    else if (!std::strcmp(a, "--new"))
      new_tokens = std::atoll(v);
    else if (!std::strcmp(a, "--threads"))
      threads = std::atoi(v);
    else if (!std::strcmp(a, "--rounds"))
      rounds = std::atoi(v);
    else if (!std::strcmp(a, "--warmup"))
      warmup = std::atoi(v);
    else if (!std::strcmp(a, "--device"))
      device_name = v;
    else {
      std::fprintf(stderr, "generate_tokens: unknown option %s\n", a);
      return 2;
    }
  }
  set_num_threads(threads);
  Generator gen(0);
  auto model = make_model(model_name, gen);
  const Device device = device_name == "cuda" ? Device::cuda(0) : Device::cpu();
  model->to(device);
  model->eval();
  std::vector<int64_t> prompt;
  for (double x : randint(0, model->vocab_size(), {prompt_len}, DType::I64, &gen).to_vector())
    prompt.push_back(static_cast<int64_t>(x));

  nn::GenerationOptions o;
  o.max_new_tokens = new_tokens;
  o.sampling.temperature = 0;  // greedy: the same work on both sides, no sampling to compare
  std::vector<double> total_ms, prefill_ms;
  for (int r = 0; r < warmup + rounds; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    if (uncached) {
      uncached_greedy(*model, prompt, new_tokens);
    } else {
      const int64_t n = static_cast<int64_t>(nn::generate(*model, prompt, o).tokens.size());
      if (n != new_tokens)
        std::fprintf(stderr, "generate_tokens: %lld tokens, not %lld\n", (long long)n, (long long)new_tokens);
    }
    const double total = ms_since(t0);
    // The prompt's forward alone, with a fresh cache (the first logits read back as generate does).
    nn::KvCache cache = model->make_cache(1, std::min<int64_t>(model->context_length(), prompt_len + new_tokens));
    t0 = std::chrono::steady_clock::now();
    const std::vector<double> tail(prompt.begin(), prompt.end());
    (void)model->forward_cached(from_vector(tail, {1, prompt_len}, DType::I64).to(device), cache)
        .select(0, 0)
        .select(0, prompt_len - 1)
        .to_vector();
    const double prefill = ms_since(t0);
    if (r >= warmup) total_ms.push_back(total), prefill_ms.push_back(prefill);
  }
  const double total = median(total_ms), prefill = median(prefill_ms);
  std::printf(
      "{\"impl\": \"fasttrain\", \"workload\": \"%s\", \"task\": \"generate\", \"cache\": %s, \"device\": \"%s\", "
      "\"precision\": \"fp32\", \"batch\": 1, \"threads\": %d, \"prompt_tokens\": %lld, \"new_tokens\": %lld, "
      "\"ms_total\": %.2f, \"prefill_ms\": %.2f, \"ms_per_new_token\": %.3f, \"tokens_per_s\": %.1f, "
      "\"params\": %lld, \"cpu_isa\": \"%s\"}\n",
      model_name.c_str(), uncached ? "false" : "true", device_name.c_str(), threads, (long long)prompt_len,
      (long long)new_tokens, total, prefill, (total - prefill) / std::max<int64_t>(new_tokens - 1, 1),
      new_tokens / (total / 1000.0), (long long)model->num_parameters(), cpu_info().isa_flags.c_str());
  return 0;
}
