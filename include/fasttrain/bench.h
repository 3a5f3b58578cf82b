// The training-step benchmark of shared/BENCH.md: its CPU workloads built from the nn models,
// the step it times (zero grads to none, forward, f32 cross-entropy, backward, AdamW), and the
// JSON line it prints, field for field the same as the PyTorch peer (bench/torch_bench.py).
// Implemented in src/train/bench.cpp; `fasttrain bench` is the command-line front end.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fasttrain/nn.h"
#include "fasttrain/optim.h"
#include "fasttrain/random.h"
#include "fasttrain/tensor.h"

namespace ft::bench {

// One workload: the model and a fixed batch held in memory (data loading is measured elsewhere).
struct Workload {
  std::string name;
  std::shared_ptr<nn::UnaryModule> model;
  Tensor inputs;   // f32 vectors/images, or i64 token ids [B, T]
  Tensor targets;  // i64 class ids [B] or next-token ids [B, T]
  int64_t batch = 0;
  int64_t items_per_sample = 1;  // tokens per sequence for language models
  std::string item_unit;         // "tokens" or "samples" (the JSON field is "<unit>_per_s")
};

// The workload names `fasttrain bench` accepts, in BENCH.md's order: mlp, cnn-mini, gpt-mini.
const std::vector<std::string>& workload_names();
// Builds a workload with BENCH.md's model and default batch (batch 0) or the given one; the model's
// weights and the batch are drawn from `gen`.
Workload make_workload(const std::string& name, int64_t batch, Generator& gen);
// Cross-entropy of the model output against the targets, computed in f32 whatever the output's
// dtype (the peer's `logits.float()`); language-model logits are flattened to [B*T, vocab].
Tensor workload_loss(const Workload& w, const Tensor& output);
// BENCH.md's optimizer: AdamW, lr 3e-4, weight decay 0.1, betas 0.9/0.999, eps 1e-8, one group
// holding every parameter (as the peer's torch.optim.AdamW(model.parameters(), ...)).
std::unique_ptr<optim::Optimizer> make_bench_optimizer(const nn::Module& model);

enum class Precision { FP32, BF16 };
// "fp32" / "bf16"; anything else throws ft::Error naming the accepted values.
Precision precision_from_name(const std::string& name);
const char* precision_name(Precision p);

// One training step of BENCH.md: zero grads (set to none), forward (under bf16 autocast for
// BF16), f32 loss, backward, optimizer step. Returns the loss.
Tensor train_step(Workload& w, optim::Optimizer& opt, Precision precision);

struct BenchOptions {
  std::string workload = "gpt-mini";
  Precision precision = Precision::FP32;
  int threads = 0;  // 0: all cores
  int steps = 10;   // timed steps; the median is reported
  int warmup = 3;
  int64_t batch = 0;  // 0: the workload's default
  uint64_t seed = 0;
};

struct BenchResult {
  std::string workload;
  Precision precision = Precision::FP32;
  int64_t batch = 0;
  int threads = 0;
  double ms_per_step = 0;  // median of the timed steps
  double items_per_s = 0;
  std::string item_unit;
  double loss = 0;  // of the last timed step
  int64_t params = 0;
  std::vector<double> step_ms;  // every timed step, in order
};

// Validates the options (known workload, positive steps/threads/batch, warmup >= 0), builds the
// workload, warms up, times the steps.
BenchResult run_bench(const BenchOptions& options);
// The JSON line of BENCH.md, formatted as Python's json.dumps formats the peer's (same field order
// and rounding: ms 3 decimals, throughput 1, loss 4).
std::string to_json_line(const BenchResult& result);

}  // namespace ft::bench
