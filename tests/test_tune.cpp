// fasttrain tune (fasttrain/tune.h): a run with a deliberately bad setting — no loader workers
// while every sample takes milliseconds to "decode" — is tuned to one with workers, measured; a
// setting that changes what the model computes is refused by the loss check; the outputs are the
// configuration of a trial that ran, and every trial is in tune.csv.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "fasttrain/autocast.h"
#include "fasttrain/fasttrain.h"
#include "fasttrain/tune.h"
#include "support/expect_error.h"
#include "support/trainer_configs.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using train::TrainerConfig;

constexpr int64_t kFeatures = 8, kClasses = 4;

// Sample i: features from a hash of i, the class from their sign pattern; reading one sleeps
// `delay`, standing in for image decoding.
class SlowSamples : public data::Dataset {
 public:
  SlowSamples(int64_t n, std::chrono::microseconds delay) : n_(n), delay_(delay) {}
  int64_t size() const override { return n_; }
  data::SampleSpec spec() const override {
    return {{"x", Shape{kFeatures}, DType::F32}, {"label", Shape{}, DType::I64}};
  }
  void read(int64_t i, uint64_t, const std::vector<Tensor>& f) const override {
    std::this_thread::sleep_for(delay_);
    float* x = f[0].data<float>();
    for (int64_t j = 0; j < kFeatures; ++j) {
      const auto r = philox4x32(7, static_cast<uint64_t>(i * kFeatures + j));
      x[j] = static_cast<float>(uniform_from_word(r.v[0]) * 2 - 1);
    }
    *f[1].data<int64_t>() = (x[0] > 0) + 2 * (x[1] > 0);
  }

 private:
  int64_t n_;
  std::chrono::microseconds delay_;
};

class Mlp : public nn::Module {
 public:
  explicit Mlp(Generator* gen) {
    hidden = register_module("hidden", std::make_shared<nn::Linear>(kFeatures, 64, true, gen));
    out = register_module("out", std::make_shared<nn::Linear>(64, kClasses, true, gen));
  }
  std::string type_name() const override { return "Mlp"; }
  std::shared_ptr<nn::Linear> hidden, out;
};

// `bf16_bias`: a loss that changes under mixed precision, as a setting that alters what is
// learned would; the tuner must refuse it.
class MlpModule : public train::TrainModule {
 public:
  MlpModule(uint64_t seed, bool bf16_bias) : gen_(seed), model_(&gen_), bf16_bias_(bf16_bias) {}
  nn::Module& model() override { return model_; }
  train::StepOutput training_step(const data::Batch& b) override { return step(b); }
  train::StepOutput validation_step(const data::Batch& b) override { return step(b); }

 private:
  train::StepOutput step(const data::Batch& b) {
    Tensor logits = model_.out->forward(relu(model_.hidden->forward(b.field("x"))));
    Tensor loss = cross_entropy(logits, b.field("label"));
    if (bf16_bias_ && autocast::enabled()) loss = add(loss, 0.5);
    return {loss, {}};
  }
  Generator gen_;
  Mlp model_;
  bool bf16_bias_;
};

train::TaskFactory slow_task(std::chrono::microseconds delay, bool bf16_bias = false) {
  return [=](const TrainerConfig& c) {
    auto train_set = std::make_shared<SlowSamples>(4096, delay), val_set = std::make_shared<SlowSamples>(64, delay);
    train::BuiltinTask t;
    t.module = std::make_unique<MlpModule>(c.seed, bf16_bias);
    t.data = std::make_unique<train::DatasetModule>(
        train::TrainData{train_set, std::make_shared<data::RandomSampler>(train_set->size(), c.seed), nullptr},
        train::ValData{val_set, nullptr});
    return t;
  };
}

TrainerConfig slow_config() {
  TrainerConfig c;
  c.task = "slow-mlp";
  c.batch_size = 16;
  c.workers = 0;  // the bad setting
  c.optimizer.lr = 1e-3;
  c.schedule = ft::train::CosineSchedule{.min_lr = 1e-4, .warmup_steps = 0};
  return c;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

TEST(Tune, FindsLoaderWorkersForSlowDecoding) {
  const std::string dir = test::scratch_dir("ft_tune", "workers");
  train::TuneOptions o;
  o.out_dir = dir;
  o.trial_steps = 8;
  o.warmup_steps = 2;
  o.budget_s = 120;
  const TrainerConfig start = slow_config();
  // 16 samples x 1.5 ms: about 24 ms of waiting per step against well under a millisecond of compute.
  const train::TuneResult r = train::tune(start, slow_task(std::chrono::microseconds(1500)), o);
  const train::TuneTrial& best = r.trials.at(r.best);
  ASSERT_GT(r.trials.size(), 2u);
  EXPECT_GT(r.trials[0].data_wait_ms, 16 * 1.5 * 0.9) << train::tune_table(r);  // the start waits for its data
  EXPECT_GE(best.config.workers, 2) << train::tune_table(r);
  EXPECT_GT(r.speedup, 1.5) << train::tune_table(r);
  EXPECT_NEAR(r.speedup, best.items_per_s / r.trials[0].items_per_s, 1e-12);
  // Threads and workers do not change the batches or the arithmetic: every trial that changed only
  // those follows the start's loss trajectory exactly. (The best may also carry bf16-mixed when
  // load on the machine made that trial look faster; its loss then differs by rounding only.)
  int64_t workers_trials = 0;
  for (const train::TuneTrial& t : r.trials) {
    const bool only_parallelism = std::all_of(t.changes.begin(), t.changes.end(), [](const train::TuneChange& c) {
      return c.option == "threads" || c.option == "workers";
    });
    if (!t.ran || t.changes.empty() || !only_parallelism) continue;
    workers_trials += std::any_of(t.changes.begin(), t.changes.end(),
                                  [](const train::TuneChange& c) { return c.option == "workers"; });
    ASSERT_TRUE(t.loss_difference.has_value()) << train::tune_table(r);
    EXPECT_LT(*t.loss_difference, 1e-6) << "trial " << t.index << "\n" << train::tune_table(r);
  }
  EXPECT_GE(workers_trials, 1) << train::tune_table(r);
  ASSERT_TRUE(best.loss_difference.has_value());
  EXPECT_LT(*best.loss_difference, start.precision.mode == best.config.precision.mode ? 1e-6 : 1e-2)
      << train::tune_table(r);

  train::write_tune_outputs(start, r, dir);
  TrainerConfig written;
  train::apply_toml(written, slurp(dir + "/run.toml"), "run.toml");
  EXPECT_EQ(written.workers, best.config.workers);
  EXPECT_EQ(written.precision.mode, best.config.precision.mode);
  EXPECT_EQ(written.batch_size, best.config.batch_size);
  EXPECT_EQ(written.threads, best.config.threads);
  EXPECT_EQ(written.max_steps, start.max_steps);  // only the tuned settings change
  std::istringstream csv(slurp(dir + "/tune.csv"));
  std::string line;
  size_t rows = 0;
  while (std::getline(csv, line)) ++rows;
  EXPECT_EQ(rows, r.trials.size() + 1);  // the header
  fs::remove_all(dir);
}

TEST(Tune, RefusesASettingThatChangesTheLoss) {
  const std::string dir = test::scratch_dir("ft_tune", "loss");
  train::TuneOptions o;
  o.out_dir = dir;
  o.trial_steps = 6;
  o.warmup_steps = 2;
  const train::TuneResult r = train::tune(slow_config(), slow_task(std::chrono::microseconds(0), true), o);
  bool refused = false;
  for (const train::TuneTrial& t : r.trials) {
    if (t.config.precision.mode != ft::train::Precision::BF16Mixed) continue;
    refused = true;
    EXPECT_FALSE(t.kept);
    EXPECT_NE(t.verdict.find("loss differs by"), std::string::npos) << t.verdict;
  }
  // Only CPUs with bf16 hardware propose bf16-mixed.
  if (!refused) GTEST_SKIP() << "SKIP: this CPU has no bf16 hardware, so bf16-mixed is not a candidate";
  EXPECT_NE(r.trials.at(r.best).config.precision.mode, ft::train::Precision::BF16Mixed);
  fs::remove_all(dir);
}

TEST(Tune, TrajectoryDifferenceAndBadOptions) {
  EXPECT_DOUBLE_EQ(train::loss_trajectory_difference({1, 2, 4}, {1, 2, 4}), 0);
  EXPECT_DOUBLE_EQ(train::loss_trajectory_difference({1.1, 2, 3}, {1, 2, 4}), (0.1 + 0 + 0.25) / 3);
  test::expect_error([] { train::loss_trajectory_difference({1}, {1, 2}); }, "found 1 and 2 steps");
  train::TuneOptions o;
  o.out_dir = test::scratch_dir("ft_tune", "bad");
  o.trial_steps = 1;
  test::expect_error([&] { train::tune(slow_config(), slow_task(std::chrono::microseconds(0)), o); },
                     "expected trial_steps >= 2 and warmup_steps >= 0, found 1 and 3");
  o.trial_steps = 8;
  o.budget_s = 0;
  test::expect_error([&] { train::tune(slow_config(), slow_task(std::chrono::microseconds(0)), o); },
                     "expected a positive budget");
}

}  // namespace
}  // namespace ft
