// Profiler overhead: the same training step (a small GPT: vocab 512, context 64, 2 layers, width
// 128, 4 heads, batch 8; forward, cross-entropy, backward, AdamW) timed with the profiler off,
// tracing, recording the memory history, and both; and one tiny kernel (add of 16 floats) per
// call, where the per-call cost of a span shows most. Modes run in alternating rounds so a busy
// machine's drift falls on all of them alike; each line reports the median of its rounds.
// "Off" is the shipping state: one relaxed atomic load per kernel call, module call, autograd node
// and phase (profiler.h). One JSON line per (workload, mode).
// Usage: profiler_overhead [--threads N] [--rounds N] [--steps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fasttrain/fasttrain.h"

using namespace ft;

namespace {

enum class Mode { Off, Trace, Memory, Both };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::Off: return "off";
    case Mode::Trace: return "trace";
    case Mode::Memory: return "memory_history";
    default: return "trace+memory_history";
  }
}

// Runs f under `mode` and returns its seconds.
template <class F>
double timed(Mode mode, F&& f) {
  std::unique_ptr<profiler::Session> session;
  if (mode == Mode::Trace || mode == Mode::Both) session = std::make_unique<profiler::Session>();
  if (mode == Mode::Memory || mode == Mode::Both) memory::start_history();
  const auto t0 = std::chrono::steady_clock::now();
  f();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (mode == Mode::Memory || mode == Mode::Both) memory::stop_history();
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0, rounds = 7, steps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
  }
  if (threads > 0) set_num_threads(threads);
  const Mode modes[] = {Mode::Off, Mode::Trace, Mode::Memory, Mode::Both};

  nn::GPTConfig cfg;
  cfg.vocab_size = 512;
  cfg.context = 64;
  cfg.layers = 2;
  cfg.dim = 128;
  cfg.heads = 4;
  Generator gen(0);
  auto model = std::make_shared<nn::GPT>(cfg, &gen);
  profiler::name_modules(*model);
  auto opt = optim::make_adamw({optim::ParamGroup{model->parameters(), {}, "all"}});
  const int64_t B = 8, T = cfg.context;
  Tensor ids = randint(0, cfg.vocab_size, {B, T}, DType::I64, &gen);
  Tensor targets = randint(0, cfg.vocab_size, {B, T}, DType::I64, &gen);
  auto step = [&] {
    Tensor logits = (*model)(ids);
    Tensor loss = cross_entropy(logits.view({B * T, cfg.vocab_size}), targets.view({B * T}));
    loss.backward();
    opt->step();
    opt->zero_grad();
  };
  step();  // warm-up: optimizer state, allocator cache
  Tensor a = ones({16}), b = ones({16});
  const int calls = 20000;
  auto tiny = [&] {
    for (int i = 0; i < calls; ++i) (void)add(a, b);
  };
  tiny();

  std::vector<double> step_s[4], tiny_s[4];
  for (int r = 0; r < rounds; ++r)
    for (int m = 0; m < 4; ++m) {
      step_s[m].push_back(timed(modes[m],
                                [&] {
                                  for (int s = 0; s < steps; ++s) step();
                                }) /
                          steps);
      tiny_s[m].push_back(timed(modes[m], tiny) / calls);
    }
  const double step_off = median(step_s[0]), tiny_off = median(tiny_s[0]);
  for (int m = 0; m < 4; ++m) {
    const double st = median(step_s[m]), ti = median(tiny_s[m]);
    std::printf(
        "{\"bench\": \"profiler_overhead\", \"workload\": \"gpt_step\", \"mode\": \"%s\", \"threads\": %d, "
        "\"rounds\": %d, \"steps_per_round\": %d, \"ms_per_step\": %.3f, \"overhead_vs_off\": %.4f}\n",
        mode_name(modes[m]), get_num_threads(), rounds, steps, 1e3 * st, st / step_off - 1);
    std::printf(
        "{\"bench\": \"profiler_overhead\", \"workload\": \"add_16_floats\", \"mode\": \"%s\", \"threads\": %d, "
        "\"rounds\": %d, \"calls_per_round\": %d, \"ns_per_call\": %.1f, \"overhead_ns_vs_off\": %.1f}\n",
        mode_name(modes[m]), get_num_threads(), rounds, calls, 1e9 * ti, 1e9 * (ti - tiny_off));
  }
  profiler::forget_module_names();
  return 0;
}
