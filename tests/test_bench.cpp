// The training-step benchmark (src/tools/bench.cpp): BENCH.md's workloads (shapes and parameter
// counts of the peer's models), the step (it trains, under fp32 and bf16 autocast), the JSON line
// (the peer's fields, order and rounding) and option validation.
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "fasttrain/bench.h"
#include "fasttrain/fasttrain.h"
#include "support/expect_error.h"

using namespace ft;
using ft::test::expect_error;

namespace {

int64_t linear_params(int64_t in, int64_t out, bool bias = true) { return in * out + (bias ? out : 0); }

}  // namespace

TEST(Bench, WorkloadsHaveBenchMdShapesAndParameterCounts) {
  Generator gen(0);
  bench::Workload mlp = bench::make_workload("mlp", 0, gen);
  EXPECT_EQ(mlp.batch, 256);
  EXPECT_EQ(mlp.inputs.shape(), Shape({256, 784}));
  EXPECT_EQ(mlp.targets.shape(), Shape({256}));
  EXPECT_EQ(mlp.item_unit, "samples");
  EXPECT_EQ(mlp.model->num_parameters(),
            linear_params(784, 1024) + linear_params(1024, 1024) + linear_params(1024, 10));

  bench::Workload cnn = bench::make_workload("cnn-mini", 0, gen);
  EXPECT_EQ(cnn.batch, 64);
  EXPECT_EQ(cnn.inputs.shape(), Shape({64, 3, 32, 32}));
  int64_t conv = 0, prev = 3;
  for (int64_t c : {32, 32, 64, 64, 128, 128}) {
    conv += prev * c * 9 + 2 * c;  // bias-free 3x3 conv, BatchNorm weight and bias
    prev = c;
  }
  EXPECT_EQ(cnn.model->num_parameters(), conv + linear_params(128, 10));

  bench::Workload gpt = bench::make_workload("gpt-mini", 0, gen);
  EXPECT_EQ(gpt.batch, 16);
  EXPECT_EQ(gpt.inputs.shape(), Shape({16, 128}));
  EXPECT_EQ(gpt.targets.shape(), Shape({16, 128}));
  EXPECT_EQ(gpt.items_per_sample, 128);
  EXPECT_EQ(gpt.item_unit, "tokens");
  const int64_t d = 256;
  const int64_t block =
      2 * 2 * d + linear_params(d, 3 * d) + linear_params(d, d) + linear_params(d, 4 * d) + linear_params(4 * d, d);
  EXPECT_EQ(gpt.model->num_parameters(), 512 * d + 128 * d + 4 * block + 2 * d);  // head tied to wte
}

TEST(Bench, BigWorkloadsAtTheirCpuSizes) {
  // BENCH.md's CPU rows: gpt2-124m at batch 1 (1024 tokens), resnet50 at batch 8, the peer's models.
  Generator gen(0);
  bench::Workload gpt = bench::make_workload("gpt2-124m", 1, gen);
  EXPECT_EQ(gpt.inputs.shape(), Shape({1, 1024}));
  EXPECT_EQ(gpt.item_unit, "tokens");
  const int64_t d = 768, V = 50304;
  const int64_t block =
      2 * 2 * d + linear_params(d, 3 * d) + linear_params(d, d) + linear_params(d, 4 * d) + linear_params(4 * d, d);
  EXPECT_EQ(gpt.model->num_parameters(), V * d + 1024 * d + 12 * block + 2 * d);  // 124,475,904, as the peer's
  // 6 N per token (N without the position embeddings) plus 12 L T d.
  const double n = static_cast<double>(gpt.model->num_parameters() - 1024 * d);
  EXPECT_DOUBLE_EQ(bench::model_flops_per_step(gpt), (6.0 * n + 12.0 * 12 * 1024 * d) * 1024);

  bench::Workload rn = bench::make_workload("resnet50", 8, gen);
  EXPECT_EQ(rn.inputs.shape(), Shape({8, 3, 224, 224}));
  EXPECT_EQ(rn.targets.shape(), Shape({8}));
  EXPECT_EQ(rn.model->num_parameters(), 25557032);  // torchvision's resnet50
  // ResNet-50's forward is 4.09 G multiply-adds per 224x224 image (convolutions and the classifier).
  const double macs = bench::model_flops_per_step(rn) / 3 / 2 / 8;
  EXPECT_GT(macs, 4.08e9);
  EXPECT_LT(macs, 4.12e9);
}

TEST(Bench, LlamaWorkloadsAreBenchMdsShapes) {
  // llama-mini: vocab 1000, context 256, 4 layers, width 256, 8 heads, 2 KV heads (head 32), MLP
  // 688, untied head; smollm-135m at batch 1 x 1024 tokens with SmolLM-135M's published size.
  Generator gen(0);
  bench::Workload mini = bench::make_workload("llama-mini", 0, gen);
  EXPECT_EQ(mini.batch, 8);
  EXPECT_EQ(mini.inputs.shape(), Shape({8, 256}));
  EXPECT_EQ(mini.item_unit, "tokens");
  const int64_t d = 256, kv = 2 * 32, ffn = 688, V = 1000;
  const int64_t block = 2 * d + d * d + 2 * d * kv + d * d + 3 * d * ffn;
  EXPECT_EQ(mini.model->num_parameters(), 2 * V * d + 4 * block + d);
  const double n = static_cast<double>(mini.model->num_parameters() - V * d);  // the untied embedding is a lookup
  EXPECT_DOUBLE_EQ(bench::model_flops_per_step(mini), (6.0 * n + 12.0 * 4 * 256 * d) * 8 * 256);

  bench::Workload smol = bench::make_workload("smollm-135m", 1, gen);
  EXPECT_EQ(smol.inputs.shape(), Shape({1, 1024}));
  EXPECT_EQ(smol.model->num_parameters(), 134'515'008);  // tied: every parameter multiplies
  EXPECT_DOUBLE_EQ(bench::model_flops_per_step(smol), (6.0 * 134'515'008 + 12.0 * 30 * 1024 * 576) * 1024);
}

TEST(Bench, ModelFlopsCountConvolutionsAndLinearLayers) {
  Generator gen(0);
  bench::Workload mlp = bench::make_workload("mlp", 3, gen);
  EXPECT_DOUBLE_EQ(bench::model_flops_per_step(mlp), 3.0 * 2 * 3 * (784 * 1024 + 1024 * 1024 + 1024 * 10));
  bench::Workload cnn = bench::make_workload("cnn-mini", 2, gen);
  const double fwd =
      2.0 * 9 * (3 * 32 * 1024 + 32 * 32 * 1024 + 32 * 64 * 256 + 64 * 64 * 256 + 64 * 128 * 64 + 128 * 128 * 64) +
      2.0 * 128 * 10;
  EXPECT_DOUBLE_EQ(bench::model_flops_per_step(cnn), 3 * fwd * 2);
  EXPECT_TRUE(cnn.model->is_training());  // counted in eval mode, restored
  bench::Workload gpt = bench::make_workload("gpt-mini", 2, gen);
  const double n = static_cast<double>(gpt.model->num_parameters() - 128 * 256);
  EXPECT_DOUBLE_EQ(bench::model_flops_per_step(gpt), (6 * n + 12.0 * 4 * 128 * 256) * 2 * 128);
}

TEST(Bench, Bf16GptStepTracksFp32) {
  // A gpt-mini step under bf16 autocast on whichever bf16 GEMM this process uses (CTest runs
  // this suite with FT_BF16_GEMM=onednn and =packed): losses follow the f32 run's within bf16's
  // precision over a few steps.
  using train::Precision;
  std::vector<double> losses[2];
  for (int i = 0; i < 2; ++i) {
    Generator gen(3);
    bench::Workload w = bench::make_workload("gpt-mini", 2, gen);
    auto opt = bench::make_bench_optimizer(*w.model);
    auto runner = bench::make_step_runner(w, *opt, i == 0 ? Precision::FP32 : Precision::BF16Mixed);
    for (int s = 0; s < 3; ++s) losses[i].push_back(runner->step(w.inputs, w.targets).item<double>());
  }
  for (int s = 0; s < 3; ++s) EXPECT_NEAR(losses[1][s], losses[0][s], 2e-2) << "step " << s;
  EXPECT_LT(losses[1][2], losses[1][0]);
}

TEST(Bench, StepTrainsInEveryPrecision) {
  using train::Precision;
  for (auto precision : {Precision::FP32, Precision::BF16Mixed, Precision::FP16Mixed, Precision::BF16True}) {
    Generator gen(1);
    bench::Workload w = bench::make_workload("mlp", 8, gen);
    auto opt = bench::make_bench_optimizer(*w.model);
    auto runner = bench::make_step_runner(w, *opt, precision);
    double first = runner->step(w.inputs, w.targets).item<double>();
    double last = first;
    for (int i = 0; i < 5; ++i) last = runner->step(w.inputs, w.targets).item<double>();
    EXPECT_LT(last, first) << train::precision_name(precision);
    // Master weights stay f32 under autocast; bf16-true trains bf16 weights.
    const DType expected = precision == Precision::BF16True ? DType::BF16 : DType::F32;
    for (const Tensor& p : w.model->parameters()) EXPECT_EQ(p.dtype(), expected) << train::precision_name(precision);
  }
}

TEST(Bench, OptimizerIsBenchMdAdamWOnEveryParameter) {
  Generator gen(0);
  bench::Workload w = bench::make_workload("cnn-mini", 2, gen);
  auto opt = bench::make_bench_optimizer(*w.model);
  EXPECT_EQ(opt->name(), "adamw");
  ASSERT_EQ(opt->param_groups().size(), 1u);
  const optim::GroupOptions& o = opt->param_groups()[0].options;
  EXPECT_EQ(o.lr, 3e-4);
  EXPECT_EQ(o.weight_decay, 0.1);
  EXPECT_EQ(o.beta1, 0.9);
  EXPECT_EQ(o.beta2, 0.999);
  EXPECT_EQ(o.eps, 1e-8);
  EXPECT_EQ(opt->param_groups()[0].params.size(), w.model->parameters().size());
}

TEST(Bench, JsonLineHasThePeersFieldsInOrder) {
  bench::BenchOptions o;
  o.workload = "mlp";
  o.batch = 4;
  o.steps = 3;
  o.warmup = 1;
  bench::BenchResult r = bench::run_bench(o);
  ASSERT_EQ(r.step_ms.size(), 3u);
  std::string line = bench::to_json_line(r);
  auto j = nlohmann::ordered_json::parse(line);
  std::vector<std::string> keys;
  for (auto& [k, v] : j.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"impl", "workload", "device", "precision", "batch", "threads",
                                            "ms_per_step", "samples_per_s", "loss", "params", "cpu_isa", "cpu",
                                            "model_flops", "peak_gflops", "peak_fraction", "peak_mem_mb"}));
  EXPECT_EQ(j["impl"], "fasttrain");
  EXPECT_EQ(j["workload"], "mlp");
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["precision"], "fp32");
  EXPECT_EQ(j["batch"], 4);
  EXPECT_EQ(j["threads"], get_num_threads());
  EXPECT_NEAR(j["ms_per_step"].get<double>(), r.ms_per_step, 6e-4);
  EXPECT_NEAR(j["samples_per_s"].get<double>(), 4 / (r.ms_per_step / 1e3), 0.05 + 1e-3 * r.items_per_s);
  EXPECT_NEAR(j["loss"].get<double>(), r.loss, 6e-5);  // 4 decimals: half a unit, plus f64 error
  EXPECT_EQ(j["params"], r.params);
  Generator g0(0);
  EXPECT_EQ(j["model_flops"].get<double>(), bench::model_flops_per_step(bench::make_workload("mlp", 4, g0)));
  EXPECT_GT(j["peak_gflops"].get<double>(), 0.0);
  EXPECT_NEAR(j["peak_fraction"].get<double>(), r.model_flops / (r.ms_per_step / 1e3) / (r.peak_gflops * 1e9), 6e-5);
  EXPECT_FALSE(j["cpu_isa"].get<std::string>().empty());
  EXPECT_NE(j["cpu"].get<std::string>().find(" family "), std::string::npos) << j["cpu"];
  // Python's json.dumps layout: ", " and ": " separators, floats with a decimal point.
  EXPECT_NE(line.find("\"device\": \"cpu\", "), std::string::npos) << line;
  // Fixed notation for the step time (a value like 0.9997 prints as 1.0, so compare the number, not its digits).
  const size_t ms_at = line.find("\"ms_per_step\": ");
  ASSERT_NE(ms_at, std::string::npos) << line;
  const std::string ms_text = line.substr(ms_at + 15, line.find(',', ms_at) - ms_at - 15);
  EXPECT_EQ(ms_text.find_first_not_of("0123456789."), std::string::npos) << ms_text;
  EXPECT_NE(ms_text.find('.'), std::string::npos) << ms_text;

  r.ms_per_step = 612.0;
  r.items_per_s = 3345.04;
  r.loss = 5.14;
  line = bench::to_json_line(r);
  EXPECT_NE(line.find("\"ms_per_step\": 612.0,"), std::string::npos) << line;
  EXPECT_NE(line.find("\"samples_per_s\": 3345.0,"), std::string::npos) << line;
  EXPECT_NE(line.find("\"loss\": 5.14,"), std::string::npos) << line;
  // repr()'s notation: fixed from 1e-4 up, exponent below.
  r.peak_fraction = 0.0009;
  EXPECT_NE(bench::to_json_line(r).find("\"peak_fraction\": 0.0009,"), std::string::npos) << bench::to_json_line(r);

  // The 16-bit precisions name the GEMM path their products took.
  o.precision = train::Precision::BF16Mixed;
  o.steps = 1;
  auto j16 = nlohmann::ordered_json::parse(bench::to_json_line(bench::run_bench(o)));
  EXPECT_EQ(j16["precision"], "bf16");
  const std::string path = j16["half_gemm"].get<std::string>();
  EXPECT_TRUE(path == "onednn" || path == "packed") << path;
}

TEST(Bench, ProfileTableListsTheAskedNumberOfKernelShapes) {
  bench::BenchOptions o;
  o.workload = "mlp";
  o.batch = 4;
  o.steps = 1;
  o.warmup = 1;
  o.profile_steps = 1;
  o.profile_shapes = 2;
  const std::string table = bench::run_bench(o).profile_table;
  const size_t header = table.find("  kernel calls by shape (largest 2 of ");
  ASSERT_NE(header, std::string::npos) << table;
  // The mlp step runs more than two distinct kernel calls (linear layers forward and backward,
  // the loss, the optimizer): exactly two rows follow the header.
  const std::string rows = table.substr(table.find('\n', header) + 1);
  EXPECT_EQ(std::count(rows.begin(), rows.end(), '\n'), 2) << table;
  EXPECT_GT(std::stoi(table.substr(header + 38)), 2) << table;  // the total count of shapes
}

TEST(Bench, RejectsBadOptionsWithClearMessages) {
  Generator gen(0);
  expect_error([&] { bench::make_workload("resnet9", 0, gen); },
               "unknown workload 'resnet9' (expected one of: mlp, cnn-mini, gpt-mini, gpt2-124m, resnet50, llama-mini, "
               "smollm-135m)");
  expect_error([&] { train::precision_from_name("fp4"); },
               "precision: expected 32, tf32, bf16-mixed, fp16-mixed, bf16-true or fp8-mixed");
  bench::BenchOptions o;
  o.workload = "mlp";
  o.steps = 0;
  expect_error([&] { bench::run_bench(o); }, "expected --steps > 0, found 0");
  o.steps = 1;
  o.warmup = -1;
  expect_error([&] { bench::run_bench(o); }, "expected --warmup >= 0, found -1");
  o.warmup = 0;
  o.batch = -2;
  expect_error([&] { bench::run_bench(o); }, "expected --batch > 0, found -2");
}
