// BENCH.md's gpt-mini training step (fasttrain/bench.h: AdamW, f32 loss, autocast in the mixed
// modes) with the vocabulary as a parameter, to time what the vocabulary's padding costs: gpt-mini's
// own 512 is a multiple of 64 (no padding rows), 500 pads to 512 and 50257 (GPT-2's) to 50304.
// Prints one JSON line per run with the median step of each round and their minimum.
// Usage: gpt_vocab_step [--vocab N] [--precision fp32|bf16] [--threads N] [--steps N] [--warmup N]
//                       [--batch N] [--rounds N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fasttrain/bench.h"
#include "fasttrain/fasttrain.h"
#include "fasttrain/parallel.h"

using namespace ft;

int main(int argc, char** argv) {
  int64_t vocab = 512, batch = 16;
  int threads = 2, steps = 10, warmup = 3, rounds = 3;
  std::string precision = "fp32";
  for (int i = 1; i + 1 < argc; i += 2) {
    const char* a = argv[i];
    const char* v = argv[i + 1];
    if (!std::strcmp(a, "--vocab"))
      vocab = std::atoll(v);
    else if (!std::strcmp(a, "--precision"))
      precision = v;
    else if (!std::strcmp(a, "--threads"))
      threads = std::atoi(v);
    else if (!std::strcmp(a, "--steps"))
      steps = std::atoi(v);
    else if (!std::strcmp(a, "--warmup"))
      warmup = std::atoi(v);
    else if (!std::strcmp(a, "--batch"))
      batch = std::atoll(v);
    else if (!std::strcmp(a, "--rounds"))
      rounds = std::atoi(v);
    else {
      std::fprintf(stderr, "gpt_vocab_step: unknown option %s\n", a);
      return 2;
    }
  }
  set_num_threads(threads);
  Generator gen(0);
  nn::GPTConfig cfg = nn::GPTConfig::preset("gpt-mini");
  cfg.vocab_size = vocab;
  bench::Workload w;
  w.name = "gpt-mini";
  w.batch = batch;
  auto model = std::make_shared<nn::GPT>(cfg, &gen);
  w.model = model;
  w.inputs = randint(0, vocab, {batch, cfg.context}, DType::I64, &gen);
  w.targets = randint(0, vocab, {batch, cfg.context}, DType::I64, &gen);
  auto opt = bench::make_bench_optimizer(*w.model);
  const auto p = precision == "bf16" ? train::Precision::BF16Mixed : train::Precision::FP32;
  auto runner = bench::make_step_runner(w, *opt, p);

  for (int i = 0; i < warmup; ++i) runner->step(w.inputs, w.targets);
  std::vector<double> medians;
  double loss = 0;
  for (int r = 0; r < rounds; ++r) {
    std::vector<double> ms;
    for (int i = 0; i < steps; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      loss = runner->step(w.inputs, w.targets).item<double>();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    medians.push_back(ms[ms.size() / 2]);
  }
  std::string list;
  for (double m : medians) list += (list.empty() ? "" : ", ") + std::to_string(m);
  std::printf(
      "{\"workload\": \"gpt-mini\", \"vocab\": %lld, \"padded_vocab\": %lld, \"precision\": \"%s\", \"batch\": %lld, "
      "\"threads\": %d, \"round_medians_ms\": [%s], \"min_ms\": %.2f, \"loss\": %.4f}\n",
      static_cast<long long>(vocab), static_cast<long long>(model->padded_vocab()), precision.c_str(),
      static_cast<long long>(batch), threads, list.c_str(), *std::min_element(medians.begin(), medians.end()), loss);
  return 0;
}
