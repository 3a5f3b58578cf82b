// `fasttrain bench`: times BENCH.md's training step on one CPU workload and prints its JSON line
// (the same fields as bench/torch_bench.py; bench/compare_cpu.sh runs both and prints ratios).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cli_parse.h"
#include "commands.h"
#include "fasttrain/bench.h"
#include "fasttrain/dist.h"
#include "fasttrain/error.h"

namespace {

int run_bench_command(const std::vector<std::string>& args) {
  ft::bench::BenchOptions o;
  std::string precision = "fp32";
  CLI::App app{
      "Times one training step of a shared/BENCH.md workload (warm-up, then the median of the timed "
      "steps) and prints one JSON line: impl, workload, device, precision, batch, threads, ms_per_step, "
      "tokens_per_s or samples_per_s, loss, params, then cpu_isa, model_flops (per step), peak_gflops (the "
      "machine's peak for the precision, measured at start-up), peak_fraction and, for 16-bit precisions, "
      "half_gemm (the bf16 GEMM path: onednn or packed; FT_BF16_GEMM=onednn|packed|auto chooses).",
      "fasttrain bench"};
  app.add_option("--workload", o.workload, "mlp, cnn-mini, gpt-mini, gpt2-124m or resnet50")
      ->check(CLI::IsMember(ft::bench::workload_names()))
      ->capture_default_str();
  app.add_option("--precision", precision,
                 "fp32 (or 32), bf16 (or bf16-mixed: autocast, fp32 master weights), fp16 (or fp16-mixed: autocast "
                 "and loss scaling), bf16-true, tf32")
      ->capture_default_str();
  app.add_option("--accumulate", o.accumulate,
                 "micro-batches per step: the batch is split evenly (gradient accumulation)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_flag("--checkpoint-blocks", o.checkpoint_blocks,
               "activation checkpointing: every transformer block is recomputed in backward (gpt-mini)");
  app.add_flag("--channels-last", o.channels_last,
               "NHWC images and convolution weights (the peer's --channels-last; cnn-mini, resnet50)");
  std::string strategy = "ddp";
  app.add_option("--strategy", strategy,
                 "under mpirun: ddp, zero1 (optimizer state sharded), zero2 (gradients too) or zero3 / fsdp "
                 "(parameters too)")
      ->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (default: all cores)")->check(CLI::Range(1, 1024));
  app.add_option("--steps", o.steps, "timed steps; the median is reported")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::Range(0, 1000000))->capture_default_str();
  app.add_option("--batch", o.batch,
                 "batch size (default: the workload's, 256 / 64 / 16 / 16 / 128; BENCH.md's CPU rows run gpt2-124m "
                 "at 1 and resnet50 at 8)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--seed", o.seed, "seed of the weights and the fixed batch")->capture_default_str();
  app.add_option("--profile", o.profile_steps,
                 "after the timed steps, profile this many more and print time per phase and per op to stderr "
                 "(on a GPU each kernel is waited for, so its time is device time)")
      ->check(CLI::Range(0, 1000));
  app.add_option("--profile-shapes", o.profile_shapes,
                 "with --profile: how many rows of the kernel calls by operand shape to print, largest first")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app.add_flag("--detect-sync", o.detect_sync,
               "count and name the host-device synchronisations of one untimed step (after the warm-up) and "
               "print them to stderr");
  app.add_flag("--cuda-graphs", o.cuda_graphs,
               "CUDA: capture the whole step as a CUDA graph after the warm-up and replay it (what cannot be "
               "captured is reported on stderr and the step runs eagerly)");
  std::string device = "cpu";
  app.add_option("--device", device, "cpu, cuda or cuda:N (model and batch on that device)")->capture_default_str();

  if (!ft::cli::parse_command_line(app, args, "bench")) return 0;
  o.precision = ft::train::precision_from_name(precision);
  o.strategy = ft::parse_name<ft::dist::Strategy>("bench: --strategy", strategy);
  o.device = ft::Device::parse(device);
  const ft::bench::BenchResult r = ft::bench::run_bench(o);
  if (!r.profile_table.empty() && ft::dist::world()->rank() == 0) std::fputs(r.profile_table.c_str(), stderr);
  if (o.detect_sync && ft::dist::world()->rank() == 0)
    std::fprintf(stderr, "host-device synchronisations in one step: %s\n", r.host_syncs.c_str());
  if (ft::dist::world()->rank() == 0) std::puts(ft::bench::to_json_line(r).c_str());  // one line per job
  std::fflush(stdout);
  return 0;
}

}  // namespace

FT_REGISTER_COMMAND(bench,
                    "time a BENCH.md training step (mlp, cnn-mini, gpt-mini, gpt2-124m, resnet50) and print its JSON "
                    "line",
                    run_bench_command);
