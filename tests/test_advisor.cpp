// The advisor (fasttrain/advisor.h): each rule fires on measurements made to need it, names the
// flag, and stays silent just past its threshold; the rules that look at the model fire on the
// layers that need them and not on models built right. Runs through the profiler are in
// test_profile_advice.cpp.
#include <gtest/gtest.h>

#include "fasttrain/advisor.h"
#include "fasttrain/models.h"
#include "fasttrain/nn.h"
#include "support/expect_error.h"

namespace ft {
namespace {

using train::Finding;
using train::RunMeasurements;
using train::TrainerConfig;

// A step that crosses no threshold: 100 ms, most of it forward and backward, small memory share.
RunMeasurements quiet() {
  RunMeasurements m;
  m.step_ms = 100;
  m.phase_ms = {{"data", 2}, {"forward", 40}, {"backward", 50}, {"optimizer", 8}};
  m.op_self_ms = {{"matmul", 60}, {"conv2d_forward", 10}};
  m.peak_bytes = 40 << 20;
  m.peak_by_category = {{"activations", 10 << 20}, {"parameters", 30 << 20}};
  m.cores = 4;
  m.local_ranks = 1;
  m.bf16_hardware = false;
  m.cpu_isa = "avx512";
  m.memory_budget_bytes = 100 << 20;
  return m;
}

TrainerConfig config() {
  TrainerConfig c;
  c.threads = 4;
  c.batch_size = 32;
  return c;
}

std::vector<std::string> rules(const std::vector<Finding>& f) {
  std::vector<std::string> r;
  for (const Finding& x : f) r.push_back(x.rule);
  return r;
}

Finding only(const std::vector<Finding>& f, const std::string& rule) {
  EXPECT_EQ(rules(f), std::vector<std::string>{rule});
  return f.empty() ? Finding{} : f[0];
}

TEST(Advisor, QuietRunHasNoFindings) { EXPECT_TRUE(train::advise(config(), quiet()).empty()); }

TEST(Advisor, DataWaitAskForWorkers) {
  RunMeasurements m = quiet();
  m.phase_ms["data"] = 5;  // exactly 5%: not above the threshold
  EXPECT_TRUE(train::advise(config(), m).empty());
  m.phase_ms["data"] = 23;
  TrainerConfig c = config();
  c.workers = 2;
  const Finding f = only(train::advise(c, m), "data-wait");
  EXPECT_EQ(f.change, "--workers 4");
  EXPECT_NE(f.evidence.find("23% of the step"), std::string::npos) << f.evidence;
}

TEST(Advisor, SmallMemoryShareAsksForTheBatchSizeFinder) {
  RunMeasurements m = quiet();
  m.peak_bytes = 20 << 20;  // 20% of the budget
  const Finding f = only(train::advise(config(), m), "batch-size");
  EXPECT_EQ(f.change.rfind("--batch-size auto", 0), 0u);
  TrainerConfig finder = config();
  finder.batch_size = 0;  // already chosen by the finder
  EXPECT_TRUE(train::advise(finder, m).empty());
  m.peak_bytes.reset();  // no memory history: not measured, not reported
  EXPECT_TRUE(train::advise(config(), m).empty());
}

TEST(Advisor, Fp32OnBf16HardwareAsksForBf16Mixed) {
  RunMeasurements m = quiet();
  m.bf16_hardware = true;
  m.cpu_isa = "avx512_bf16";
  const Finding f = only(train::advise(config(), m), "precision");
  EXPECT_EQ(f.change, "--precision bf16-mixed");
  EXPECT_NE(f.evidence.find("avx512_bf16"), std::string::npos);
  TrainerConfig mixed = config();
  mixed.precision.mode = ft::train::Precision::BF16Mixed;
  EXPECT_TRUE(train::advise(mixed, m).empty());
}

TEST(Advisor, NearTheMemoryLimitAsksForCheckpointingOrAccumulation) {
  RunMeasurements m = quiet();
  m.peak_bytes = 90 << 20;
  m.peak_by_category = {{"activations", 60 << 20}, {"parameters", 30 << 20}};
  EXPECT_EQ(only(train::advise(config(), m), "memory").change.rfind("--checkpoint-blocks true", 0), 0u);
  TrainerConfig checkpointed = config();
  checkpointed.precision.checkpoint_blocks = true;
  EXPECT_EQ(only(train::advise(checkpointed, m), "memory").change.rfind("--batch-size 16 --accumulate 2", 0), 0u);
  m.peak_bytes = 85 << 20;  // at the threshold
  m.peak_by_category["activations"] = 55 << 20;
  EXPECT_TRUE(train::advise(config(), m).empty());
}

TEST(Advisor, ConvolutionTimeAsksForChannelsLast) {
  RunMeasurements m = quiet();
  m.op_self_ms = {{"conv2d_forward", 15}, {"conv2d_backward_input", 10}, {"matmul", 5}};
  const Finding f = only(train::advise(config(), m), "channels-last");
  EXPECT_EQ(f.change, "--channels-last true");
  EXPECT_NE(f.evidence.find("25% of the step"), std::string::npos) << f.evidence;
  TrainerConfig nhwc = config();
  nhwc.precision.channels_last = true;
  EXPECT_TRUE(train::advise(nhwc, m).empty());
}

TEST(Advisor, OversubscribedThreadsAndSlowOptimizerAndHiddenCommunication) {
  RunMeasurements m = quiet();
  m.local_ranks = 2;  // 2 ranks x 4 threads on 4 CPUs
  EXPECT_EQ(only(train::advise(config(), m), "threads").change, "--threads 2");
  TrainerConfig automatic = config();
  automatic.threads = 0;  // divides the cores among the local ranks
  EXPECT_TRUE(train::advise(automatic, m).empty());

  m = quiet();
  m.phase_ms["optimizer"] = 20;
  EXPECT_EQ(only(train::advise(config(), m), "optimizer").change.rfind("--accumulate 2", 0), 0u);

  m = quiet();
  m.communication_wait_ms = 10;  // at the threshold
  EXPECT_TRUE(train::advise(config(), m).empty());
  m.communication_wait_ms = 30;
  EXPECT_EQ(only(train::advise(config(), m), "communication").change.rfind("--bucket-cap-mb", 0), 0u);
}

// A convolution with a bias straight into a BatchNorm wastes the bias; one without, or one not
// followed by a BatchNorm, does not.
class ConvBn : public nn::Module {
 public:
  ConvBn(bool bias, Generator* g) {
    conv = register_module("conv", std::make_shared<nn::Conv2d>(3, 8, 3, 1, 1, bias, 1, 1, g));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(8));
    head = register_module("head", std::make_shared<nn::Conv2d>(8, 4, 1, 1, 0, true, 1, 1, g));
  }
  std::string type_name() const override { return "ConvBn"; }
  std::shared_ptr<nn::Conv2d> conv, head;
  std::shared_ptr<nn::BatchNorm2d> bn;
};

TEST(Advisor, BiasBeforeBatchNormIsFoundInTheModel) {
  Generator g(1);
  ConvBn wasteful(true, &g), right(false, &g);
  const Finding f = only(train::advise(config(), quiet(), &wasteful), "bias-before-batchnorm");
  EXPECT_NE(f.evidence.find("conv -> bn"), std::string::npos) << f.evidence;
  EXPECT_TRUE(train::advise(config(), quiet(), &right).empty());
  // The built-in convolution models are built without those biases.
  EXPECT_TRUE(train::advise(config(), quiet(), nn::resnet("resnet20", 10, &g).get()).empty());
  EXPECT_TRUE(train::advise(config(), quiet(), nn::cnn_mini(3, 10, &g).get()).empty());
}

TEST(Advisor, FindingsRoundTripAndBadInput) {
  const std::vector<Finding> f = {{"data-wait", "waiting \"23%\"", "--workers 4"}, {"precision", "fp32", "--x"}};
  const std::vector<Finding> back = train::findings_from_json(train::findings_json(f), "advice.json");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].evidence, f[0].evidence);
  EXPECT_EQ(back[1].change, f[1].change);
  EXPECT_NE(train::findings_text(f).find("[data-wait] waiting \"23%\""), std::string::npos);
  test::expect_error([] { train::findings_from_json("{\"format\": \"other\"}", "a.json"); },
                     "a.json: expected format fasttrain.advice.v1");
  test::expect_error([] { train::measurements_from_profile("/nonexistent/summary.json", TrainerConfig{}); },
                     "/nonexistent/summary.json: cannot read the profile summary");
}

}  // namespace
}  // namespace ft
