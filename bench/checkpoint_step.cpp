// Activation checkpointing's trade: forward+backward time and peak allocator memory of a model
// with and without checkpointing its blocks. Prints one JSON line per (model, mode).
// Usage: checkpoint_step [--threads N] [--iters N] [--batch N]
// Models: gpt-mini (shared/BENCH.md; batch x context 128 tokens, cross-entropy) and resnet20
// (batch x 3x32x32, cross-entropy), both in training mode.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "fasttrain/allocator.h"
#include "fasttrain/fasttrain.h"
#include "fasttrain/nn.h"

using namespace ft;

namespace {

void measure(const char* workload, nn::UnaryModule& model, const Tensor& x, const Tensor& y, int threads, int iters) {
  Allocator& alloc = allocator_for(Device::cpu());
  auto step = [&] {
    model.zero_grad();
    Tensor out = model.forward(x);
    autograd::backward({cross_entropy(out.dim() == 3 ? out.flatten(0, 1) : out, y.flatten())});
  };
  for (bool on : {false, true}) {
    nn::set_activation_checkpointing(model, on);
    step();  // warm the allocator's cache
    model.zero_grad();
    alloc.reset_peak();
    const int64_t base = alloc.stats().allocated_bytes;
    std::vector<double> ms;
    for (int i = 0; i < iters; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      step();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    std::printf(
        "{\"impl\": \"fasttrain\", \"workload\": \"%s\", \"checkpointing\": %s, \"threads\": %d, "
        "\"ms_per_step\": %.2f, \"peak_mib\": %.1f}\n",
        workload, on ? "true" : "false", threads, ms[ms.size() / 2],
        (alloc.stats().peak_allocated_bytes - base) / 1048576.0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, iters = 5, batch = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads"))
      threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--iters"))
      iters = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batch"))
      batch = std::atoi(argv[i + 1]);
  }
  set_num_threads(threads);
  Generator gen(0);
  {
    nn::GPTConfig cfg = nn::GPTConfig::preset("gpt-mini");
    nn::GPT gpt(cfg, &gen);
    Tensor ids = randint(0, cfg.vocab_size, {batch, cfg.context}, DType::I64, &gen);
    Tensor targets = randint(0, cfg.vocab_size, {batch, cfg.context}, DType::I64, &gen);
    measure("gpt-mini", gpt, ids, targets, threads, iters);
  }
  {
    auto net = nn::resnet("resnet20", 10, &gen);
    Tensor images = randn({batch, 3, 32, 32}, DType::F32, &gen);
    Tensor labels = randint(0, 10, {batch}, DType::I64, &gen);
    measure("resnet20", *net, images, labels, threads, iters);
  }
}
