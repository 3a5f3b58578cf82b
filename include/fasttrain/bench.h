// The training-step benchmark of shared/BENCH.md: its CPU workloads built from the nn models,
// the step it times (zero grads to none, forward, f32 cross-entropy, backward, AdamW), and the
// JSON line it prints, field for field the same as the PyTorch peer (bench/torch_bench.py).
// Implemented in src/tools/bench.cpp; `fasttrain bench` is the command-line front end.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fasttrain/dist.h"
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

// The workload names `fasttrain bench` accepts, in BENCH.md's order: mlp, cnn-mini, gpt-mini,
// gpt2-124m, resnet50, llama-mini, smollm-135m. The default batches are the peer's (BENCH.md's
// table: 256, 64, 16, 16, 128, 8, 16); BENCH.md's CPU rows run gpt2-124m and smollm-135m at
// --batch 1 (1024 tokens) and resnet50 at --batch 8.
const std::vector<std::string>& workload_names();
// Builds a workload with BENCH.md's model and default batch (batch 0) or the given one; the model's
// weights and the batch are drawn from `gen`.
Workload make_workload(const std::string& name, int64_t batch, Generator& gen);
// Model FLOPs of one training step (forward + backward), the count BENCH.md's "model_flops" means:
// - GPTs: per token 6 N + 12 L T d (Kaplan et al. 2020; PaLM's MFU appendix), times B T tokens.
//   N is every parameter except the position embeddings: the token embedding counts because the
//   head multiplies by it (2 V d per token forward). 6 = 2 (multiply-add) x 3 (forward, input
//   gradient, weight gradient). 12 L T d is attention's two T x T x d products per layer (QK^T,
//   PV), forward and backward, counted over the full T x T square as the convention does.
// - Llama-family models: the same, with N every parameter but an untied token embedding (a
//   lookup; a tied one is the head's product), and the attention term 12 L T (heads x head size).
// - Other models: the multiply-adds of every convolution and linear layer, 2 x output elements x
//   (input channels / groups x kernel area, or in_features), times 3 for the backward's two
//   products. Counted on the autograd graph of a one-sample forward (eval mode, so BatchNorm's
//   running statistics are untouched), times the batch.
// Norms, activations, softmax and the optimizer are not counted (conventional; they are memory-bound).
double model_flops_per_step(const Workload& w);
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
                                                    int64_t accumulate = 1, bool cuda_graphs = false);
// BENCH.md's name of a precision in the JSON line: fp32, bf16, fp16 (mixed modes), else
// Lightning's name (tf32, bf16-true).
const char* bench_precision_name(train::Precision p);

struct BenchOptions {
  std::string workload = "gpt-mini";
  train::Precision precision = train::Precision::FP32;
  int64_t accumulate = 1;                         // micro-batches per step (the batch is split evenly)
  bool checkpoint_blocks = false;                 // activation checkpointing of every transformer block (gpt-mini)
  bool channels_last = false;                     // NHWC images and 4-d weights (the peer's --channels-last)
  dist::Strategy strategy = dist::Strategy::Ddp;  // under mpirun (TrainerConfig::strategy)
  Device device = Device::cpu();                  // cuda: model and batch on the GPU, each step timed to its end
  int profile_steps = 0;                          // > 0: after the timed steps, that many profiled ones (profile_table)
  int profile_shapes = 25;                        // rows of the profile's kernel calls by operand shape, largest first
  bool detect_sync = false;                       // one untimed step under a SyncTracker (host_syncs)
  bool cuda_graphs = false;  // CUDA: the step captured after the warm-up and replayed (StepOptions)
  int threads = 0;           // 0: all cores
  int steps = 10;            // timed steps; the median is reported
  int warmup = 3;
  int64_t batch = 0;  // 0: the workload's default
  uint64_t seed = 0;
};

struct BenchResult {
  std::string workload;
  Device device = Device::cpu();
  std::string gpu;  // the GPU's name on CUDA (figures from other GPUs do not compare)
  train::Precision precision = train::Precision::FP32;
  int64_t accumulate = 1;
  bool checkpoint_blocks = false;
  bool channels_last = false;
  bool cuda_graphs = false;          // the timed steps were graph replays
  std::string graph_refused;         // why not, when graphs were asked for and the capture was refused
  int64_t peak_allocated_bytes = 0;  // allocator high-water mark over the timed steps
  int64_t reserved_bytes = 0;        // what the allocator holds from the device after them (GPU lines only)
  int64_t batch = 0;
  int threads = 0;
  double ms_per_step = 0;            // median of the timed steps
  int64_t host_syncs_per_step = -1;  // with detect_sync: waits on the device in one step (-1: not counted)
  std::string host_syncs;            // with detect_sync: SyncTracker::summary() of that step
  double items_per_s = 0;
  std::string item_unit;
  double loss = 0;  // of the last timed step (under mpirun: the mean over the ranks, one process's loss)
  int64_t params = 0;
  double model_flops = 0;       // per step of the whole job (every rank), model_flops_per_step
  double peak_gflops = 0;       // the measured peak for this precision on `threads` threads, times the ranks
  double peak_fraction = 0;     // model FLOP/s over that peak
  std::string cpu_isa;          // "avx2+avx512f+avx512_bf16[+amx]": figures from other ISAs do not compare
  std::string cpu;              // "AuthenticAMD family 25 model 17": CPUs with one ISA still differ
  std::string half_gemm;        // the bf16/f16 GEMM path (onednn or packed) for the 16-bit precisions, else ""
  std::vector<double> step_ms;  // every timed step, in order
  std::string profile_table;    // BenchOptions::profile_steps: time per phase and op (device time on a GPU)
  // Under mpirun: the ranks of a DDP or ZeRO run, which split `batch` (the global batch) evenly;
  // each step's time is the slowest rank's (as the PyTorch DDP peer reports).
  int world_size = 1;
  dist::Strategy strategy = dist::Strategy::Ddp;
};

// Validates the options (known workload, positive steps/threads/batch, warmup >= 0, a batch that
// divides into `accumulate`), builds the workload, warms up, times the steps. Launched by mpirun
// with several ranks, the step is DDP's over dist::world(), the global batch split evenly.
BenchResult run_bench(const BenchOptions& options);
// The JSON line of BENCH.md, formatted as Python's json.dumps formats the peer's (same field order
// and rounding: ms 3 decimals, throughput 1, loss 4), then the engine's own fields: "cpu_isa" (as
// the peer writes it), "cpu" (vendor, family and model from CPUID), "model_flops", "peak_gflops" (1 decimal),
// "peak_fraction" (4 decimals), "half_gemm" for the 16-bit precisions; runs with accumulate > 1, checkpointed blocks,
// channels-last or CUDA graphs add "accumulate" / "checkpoint_blocks" / "channels_last" / "cuda_graphs" and every line
// ends with "peak_mem_mb".
std::string to_json_line(const BenchResult& result);

}  // namespace ft::bench
