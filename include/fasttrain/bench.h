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
#include "fasttrain/train_step.h"

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

// The step runner of a workload: BENCH.md's step (zero grads to none, forward and the f32 loss
// under autocast in the mixed modes, backward, optimizer step), with gradient accumulation over
// `accumulate` equal micro-batches of the fixed batch when asked (fasttrain's own rows; the peer
// has none).
std::unique_ptr<train::StepRunner> make_step_runner(Workload& w, optim::Optimizer& opt, train::Precision precision,
                                                    int64_t accumulate = 1);
// BENCH.md's name of a precision in the JSON line: fp32, bf16, fp16 (mixed modes), else
// Lightning's name (tf32, bf16-true).
const char* bench_precision_name(train::Precision p);

struct BenchOptions {
  std::string workload = "gpt-mini";
  train::Precision precision = train::Precision::FP32;
  int64_t accumulate = 1;          // micro-batches per step (the batch is split evenly)
  bool checkpoint_blocks = false;  // activation checkpointing of every transformer block (gpt-mini)
  std::string strategy = "ddp";    // under mpirun: ddp, zero1 or zero2 (TrainerConfig::strategy)
  int threads = 0;                 // 0: all cores
  int steps = 10;                  // timed steps; the median is reported
  int warmup = 3;
  int64_t batch = 0;  // 0: the workload's default
  uint64_t seed = 0;
};

struct BenchResult {
  std::string workload;
  train::Precision precision = train::Precision::FP32;
  int64_t accumulate = 1;
  bool checkpoint_blocks = false;
  int64_t peak_allocated_bytes = 0;  // allocator high-water mark over the timed steps
  int64_t batch = 0;
  int threads = 0;
  double ms_per_step = 0;  // median of the timed steps
  double items_per_s = 0;
  std::string item_unit;
  double loss = 0;  // of the last timed step
  int64_t params = 0;
  std::vector<double> step_ms;  // every timed step, in order
  // Under mpirun: the ranks of a DDP or ZeRO run, which split `batch` (the global batch) evenly;
  // each step's time is the slowest rank's (as the PyTorch DDP peer reports).
  int world_size = 1;
  std::string strategy = "ddp";
};

// Validates the options (known workload, positive steps/threads/batch, warmup >= 0, a batch that
// divides into `accumulate`), builds the workload, warms up, times the steps. Launched by mpirun
// with several ranks, the step is DDP's over dist::world(), the global batch split evenly.
BenchResult run_bench(const BenchOptions& options);
// The JSON line of BENCH.md, formatted as Python's json.dumps formats the peer's (same field order
// and rounding: ms 3 decimals, throughput 1, loss 4); runs with accumulate > 1 or checkpointed
// blocks add "accumulate" / "checkpoint_blocks" and every line ends with "peak_mem_mb".
std::string to_json_line(const BenchResult& result);

}  // namespace ft::bench
