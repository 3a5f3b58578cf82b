// Training equivalence with PyTorch: gpt-mini and cnn-mini (shared/BENCH.md) trained for 20 steps
// from identical initial weights give the same loss curve in fasttrain and in PyTorch 1.13 (fp32,
// within 1e-3 relative at every step). fasttrain draws the weights and a fixed batch and writes them
// as safetensors; tests/support/torch_equivalence.py loads them into the benchmark peer's models
// (bench/torch_bench.py, names mapped) and trains with the peer's step. Both sides run BENCH.md's
// step: zero grads to none, forward, f32 cross-entropy, backward, AdamW (lr 3e-4, wd 0.1 on every
// parameter). cnn-mini's BatchNorm runs in training mode (batch statistics) on both sides.
// Batches are smaller than the benchmark's to keep the test fast: gpt-mini 4 x 128 tokens,
// cnn-mini 16 images; one thread on both sides.
//
// The Llama family against tests/support/hf_llama.py (Hugging Face's modeling_llama written out
// in PyTorch): issue 42's shape (4 layers, width 256, 8 heads sharing 2 KV heads, SwiGLU 688,
// vocab 1000, untied head), with plain rotary frequencies and with Llama 3's scaling, starts from
// a folder torch wrote in Hugging Face's names, trains 20 steps with AdamW and clipping by the
// global norm on both sides, and exports a folder that torch loads and runs to our logits.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fasttrain/bench.h"
#include "fasttrain/fasttrain.h"
#include "fasttrain/safetensors.h"
#include "support/torch_scripts.h"
#include "support/trainer_configs.h"

using namespace ft;
namespace fs = std::filesystem;

namespace {

constexpr int kSteps = 20;
constexpr int kNoTorch = 77;  // the script's exit status when torch is not installed
constexpr double kRelTol = 1e-3;

fs::path script() { return fs::path(__FILE__).parent_path() / "support" / "torch_equivalence.py"; }

// Runs the PyTorch side on the weights and batch in `dir`; returns its exit status.
int run_torch(const std::string& workload, const fs::path& dir) {
  std::string cmd = "/usr/bin/python3 " + script().string() + " " + workload + " " +
                    (dir / "state.safetensors").string() + " " + (dir / "batch.safetensors").string() + " " +
                    std::to_string(kSteps) + " " + (dir / "losses.json").string();
  int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void expect_same_curve(const std::string& workload, int64_t batch) {
  // One thread on both sides: the test stays fast when other jobs share the cores (two spinning
  // OpenMP threads on one free core can take many times longer; docs/PERF.md) and agreement does
  // not rest on a split.
  set_num_threads(1);
  fs::path dir = fs::temp_directory_path() / ("ft_equivalence_" + std::to_string(::getpid()) + "_" + workload);
  fs::remove_all(dir);
  fs::create_directories(dir);

  Generator gen(7);
  bench::Workload w = bench::make_workload(workload, batch, gen);
  w.model->save((dir / "state.safetensors").string());
  save_safetensors((dir / "batch.safetensors").string(), {{"inputs", w.inputs}, {"targets", w.targets}});

  int rc = run_torch(workload, dir);
  if (rc == kNoTorch) {
    fs::remove_all(dir);
    GTEST_SKIP() << "python3-torch not installed: training equivalence not tested";
  }
  ASSERT_EQ(rc, 0) << "tests/support/torch_equivalence.py failed for " << workload;
  std::ifstream f(dir / "losses.json");
  std::vector<double> expected = nlohmann::json::parse(f).at("losses").get<std::vector<double>>();
  fs::remove_all(dir);
  ASSERT_EQ(expected.size(), static_cast<size_t>(kSteps));

  auto opt = bench::make_bench_optimizer(*w.model);
  auto runner = bench::make_step_runner(w, *opt, train::Precision::FP32);
  for (int step = 0; step < kSteps; ++step) {
    double loss = runner->step(w.inputs, w.targets).item<double>();
    EXPECT_NEAR(loss, expected[step], kRelTol * std::abs(expected[step]))
        << workload << " step " << step << ": fasttrain " << loss << ", PyTorch " << expected[step];
  }
  // The curve must actually fall (the models fit the fixed batch), or agreement would say little
  // about the updates.
  EXPECT_LT(expected.back(), 0.95 * expected.front()) << workload;
}

}  // namespace

TEST(TrainingEquivalence, GptMiniMatchesPyTorchFor20Steps) { expect_same_curve("gpt-mini", 4); }

TEST(TrainingEquivalence, CnnMiniMatchesPyTorchFor20Steps) { expect_same_curve("cnn-mini", 16); }

namespace {

struct LlamaRun {
  const char* name;
  double llama3_factor;  // 0: plain rotary frequencies (hf_llama.py's rope_scaling otherwise)
  train::Precision precision;
  double loss_tolerance;  // relative, per step
};

constexpr int64_t kLlamaContext = 64, kLlamaBatch = 4;
constexpr double kLlamaLr = 3e-4, kLlamaClip = 1.0;

// The largest and the root-mean-square difference between two tensors' elements.
struct LogitDrift {
  double max = 0, rms = 0;
};
LogitDrift drift(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  EXPECT_EQ(x.size(), y.size());
  LogitDrift d;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    const double e = std::abs(x[i] - y[i]);
    d.max = std::max(d.max, e);
    d.rms += e * e;
  }
  d.rms = std::sqrt(d.rms / static_cast<double>(std::max<size_t>(x.size(), 1)));
  return d;
}

void expect_llama_trains_as_hugging_face(const LlamaRun& run) {
  set_num_threads(1);
  const fs::path dir = test::scratch_dir("ft_llama_training", run.name);
  fs::create_directories(dir);
  // vocab context layers dim heads kv_heads ffn theta tied bias llama3_factor max_shard_bytes
  const std::string shape = detail::concat("1000 ", kLlamaContext, " 4 256 8 2 688 10000 0 0 ", run.llama3_factor);
  int rc = test::run_torch_script("hf_llama.py", "folder " + dir.string() + " " + shape + " 4000000");
  if (rc == test::kNoTorch) GTEST_SKIP() << "python3-torch not installed: Llama training not compared with PyTorch";
  ASSERT_EQ(rc, 0) << "tests/support/hf_llama.py folder failed";

  // Our side starts from torch's folder (sharded: 4 MB shards), as --init-from does.
  const nn::HfModelConfig config = nn::read_hf_config((dir / "hf").string());
  ASSERT_EQ(config.llama.kv_heads, 2);
  ASSERT_EQ(config.llama.rope_scaling.type,
            run.llama3_factor > 0 ? RopeScaling::Type::Llama3 : RopeScaling::Type::None);
  nn::Llama model(config.llama);
  nn::load_hf_folder(model, (dir / "hf").string());
  Generator gen(11);
  const Tensor ids = randint(0, 1000, {kLlamaBatch, kLlamaContext}, DType::I64, &gen);
  const Tensor targets = randint(0, 1000, {kLlamaBatch, kLlamaContext}, DType::I64, &gen);
  save_safetensors((dir / "batch.safetensors").string(), {{"ids", ids}, {"targets", targets}});
  rc = test::run_torch_script(
      "hf_llama.py", detail::concat("train ", (dir / "hf").string(), " ", (dir / "batch.safetensors").string(), " ",
                                    kSteps, " ", kLlamaLr, " ", kLlamaClip, " ", train::precision_name(run.precision),
                                    " ", (dir / "torch.safetensors").string()));
  ASSERT_EQ(rc, 0) << "tests/support/hf_llama.py train failed";
  const TensorMap torch = load_safetensors((dir / "torch.safetensors").string()).tensors;
  const std::vector<double> losses = test::named(torch, "losses").to_vector();
  const std::vector<double> norms = test::named(torch, "grad_norms").to_vector();

  // The Trainer's optimizer: AdamW with decay on the matrices, none on the norms' weights.
  optim::GroupOptions o;
  o.lr = kLlamaLr, o.weight_decay = 0.1, o.beta2 = 0.95;
  auto opt = optim::make_adamw(optim::decay_groups(model.named_parameters(), o));
  train::StepOptions so;
  so.precision = run.precision, so.clip = kLlamaClip;
  train::StepRunner runner(
      model, *opt,
      [](const Tensor& logits, const Tensor& y) {
        const Tensor l = logits.dtype() == DType::F32 ? logits : logits.to(DType::F32);
        return cross_entropy(l.reshape({-1, l.size(-1)}), y.reshape({-1}));
      },
      so);
  int clipped = 0;
  double worst = 0;  // printed: the figure the closing notes quote
  for (int step = 0; step < kSteps; ++step) {
    const double loss = runner.step(ids, targets).item<double>();
    const double norm = runner.last_grad_norm().item<double>();
    EXPECT_NEAR(loss, losses[step], run.loss_tolerance * std::abs(losses[step]))
        << run.name << " step " << step << ": fasttrain " << loss << ", PyTorch " << losses[step];
    EXPECT_NEAR(norm, norms[step], 20 * run.loss_tolerance * norms[step]) << run.name << " step " << step;
    clipped += norms[step] > kLlamaClip;
    worst = std::max(worst, std::abs(loss - losses[step]) / std::abs(losses[step]));
  }
  std::printf("%s: largest relative loss difference over %d steps %.2e (losses %.4f -> %.4f)\n", run.name, kSteps,
              worst, losses.front(), losses.back());
  // The comparison covers clipping and learning: some steps were clipped, the loss fell.
  EXPECT_GT(clipped, 0) << run.name << ": no step's gradient norm exceeded " << kLlamaClip;
  EXPECT_LT(losses.back(), 0.8 * losses.front()) << run.name;

  // Export -> torch loads our folder (as from_pretrained) and gives our logits; both sides'
  // trained models agree too.
  model.eval();
  const Tensor ours = [&] {
    autograd::InferenceMode guard;
    return model(ids);
  }();
  nn::save_hf_folder(model, (dir / "export").string());
  rc = test::run_torch_script(
      "hf_llama.py", detail::concat("run ", (dir / "export").string(), " ", (dir / "batch.safetensors").string(), " ",
                                    (dir / "exported_logits.safetensors").string()));
  ASSERT_EQ(rc, 0) << "tests/support/hf_llama.py run failed on our export";
  const Tensor exported =
      test::named(load_safetensors((dir / "exported_logits.safetensors").string()).tensors, "logits");
  test::expect_close(ours, exported, "torch's logits of our exported folder");
  const Tensor theirs = test::named(torch, "logits");
  if (run.precision == train::Precision::FP32) {
    test::expect_close(ours, theirs, "the trained models' logits", {1e-3, 1e-3});
  } else {
    // After 20 steps in bf16 each run's roundings have compounded (2^-8 relative per operation
    // through 4 layers and 20 updates), by an amount that depends on the kernels' summation
    // orders, which differ between CPUs (a fixed 0.15 held on one machine and missed by 0.005 at
    // one logit of 256,000 on another). The scale is PyTorch's own: its bf16 run against its f32
    // run from the same start. fasttrain's bf16 run must stay within twice that of PyTorch's (two
    // runs that each drift that far from f32 may differ by up to twice it), in the largest and in
    // the root-mean-square difference; a wrong gradient or rounding moves the logits much further.
    const LogitDrift ours_drift = drift(ours, theirs), bf16_drift = drift(theirs, test::named(torch, "logits_f32"));
    std::printf(
        "%s: trained logits against PyTorch's bf16 run: largest %.4f, rms %.5f; PyTorch bf16 against f32: "
        "largest %.4f, rms %.5f\n",
        run.name, ours_drift.max, ours_drift.rms, bf16_drift.max, bf16_drift.rms);
    EXPECT_LE(ours_drift.max, 2 * bf16_drift.max) << run.name << ": the trained models' largest logit difference";
    EXPECT_LE(ours_drift.rms, 2 * bf16_drift.rms) << run.name << ": the trained models' rms logit difference";
  }
  fs::remove_all(dir);
}

}  // namespace

TEST(TrainingEquivalence, LlamaGqaFromAHuggingFaceFolderTrainsAsPyTorchFor20Steps) {
  expect_llama_trains_as_hugging_face({"rope", 0, train::Precision::FP32, 1e-5});
}

TEST(TrainingEquivalence, LlamaWithLlama3RopeScalingTrainsAsPyTorchFor20Steps) {
  expect_llama_trains_as_hugging_face({"llama3", 8, train::Precision::FP32, 1e-5});
}

TEST(TrainingEquivalence, LlamaBf16MixedTrainsAsPyTorchAutocastFor20Steps) {
  expect_llama_trains_as_hugging_face({"bf16", 0, train::Precision::BF16Mixed, 1e-2});
}
