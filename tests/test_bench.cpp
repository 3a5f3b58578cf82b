// The training-step benchmark (src/train/bench.cpp): BENCH.md's workloads (shapes and parameter
// counts of the peer's models), the step (it trains, under fp32 and bf16 autocast), the JSON line
// (the peer's fields, order and rounding) and option validation.
#include <gtest/gtest.h>

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
                                            "ms_per_step", "samples_per_s", "loss", "params", "peak_mem_mb"}));
  EXPECT_EQ(j["impl"], "fasttrain");
  EXPECT_EQ(j["workload"], "mlp");
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["precision"], "fp32");
  EXPECT_EQ(j["batch"], 4);
  EXPECT_EQ(j["threads"], get_num_threads());
  EXPECT_NEAR(j["ms_per_step"].get<double>(), r.ms_per_step, 5e-4);
  EXPECT_NEAR(j["samples_per_s"].get<double>(), 4 / (r.ms_per_step / 1e3), 0.05 + 1e-3 * r.items_per_s);
  EXPECT_NEAR(j["loss"].get<double>(), r.loss, 5e-5);
  EXPECT_EQ(j["params"], r.params);
  // Python's json.dumps layout: ", " and ": " separators, floats with a decimal point.
  EXPECT_NE(line.find("\"device\": \"cpu\", "), std::string::npos) << line;
  EXPECT_NE(line.find("\"ms_per_step\": " + std::to_string(static_cast<int64_t>(r.ms_per_step))), std::string::npos)
      << line;

  r.ms_per_step = 612.0;
  r.items_per_s = 3345.04;
  r.loss = 5.14;
  line = bench::to_json_line(r);
  EXPECT_NE(line.find("\"ms_per_step\": 612.0,"), std::string::npos) << line;
  EXPECT_NE(line.find("\"samples_per_s\": 3345.0,"), std::string::npos) << line;
  EXPECT_NE(line.find("\"loss\": 5.14,"), std::string::npos) << line;
}

TEST(Bench, RejectsBadOptionsWithClearMessages) {
  Generator gen(0);
  expect_error([&] { bench::make_workload("resnet9", 0, gen); },
               "unknown workload 'resnet9' (expected one of: mlp, cnn-mini, gpt-mini)");
  expect_error([&] { train::precision_from_name("fp8"); },
               "precision: expected 32, tf32, bf16-mixed, fp16-mixed or bf16-true");
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
