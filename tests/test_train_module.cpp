// A module and data of the user's own, trained through the public API only (fasttrain/*.h, no
// private header): a two-output model (logits and an auxiliary regression head) on generated
// blobs, with its own metrics and parameter groups, through Trainer::fit with accumulation,
// clipping, mixed precision, checkpoints and exact resume; an iterable training stream; and the
// errors a malformed module or data gives.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "fasttrain/fasttrain.h"
#include "fasttrain/train.h"
#include "fasttrain/train_module.h"
#include "support/expect_error.h"
#include "support/trainer_configs.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using train::DataModule;
using train::DatasetModule;
using train::StepOutput;
using train::TrainData;
using train::TrainerConfig;
using train::TrainModule;
using train::ValData;

constexpr int64_t kFeatures = 4, kClasses = 3;

// Sample i: a point of blob i % 3 (centre at 2.5 * e_c, unit noise from a hash of (seed, i)),
// its class, and a regression target (the sum of its features).
class Blobs : public data::Dataset {
 public:
  Blobs(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  int64_t size() const override { return n_; }
  data::SampleSpec spec() const override {
    return {{"x", Shape{kFeatures}, DType::F32}, {"label", Shape{}, DType::I64}, {"sum", Shape{}, DType::F32}};
  }
  void read(int64_t i, uint64_t, const std::vector<Tensor>& f) const override {
    const int64_t c = i % kClasses;
    float* x = f[0].data<float>();
    float total = 0;
    for (int64_t j = 0; j < kFeatures; ++j) {
      const auto r = philox4x32(seed_, static_cast<uint64_t>(i * kFeatures + j));
      const double u1 = uniform_from_word(r.v[0]) + 1e-12, u2 = uniform_from_word(r.v[1]);
      const double noise = std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
      x[j] = static_cast<float>((j == c ? 2.5 : 0.0) + noise);
      total += x[j];
    }
    *f[1].data<int64_t>() = c;
    *f[2].data<float>() = total;
  }

 private:
  int64_t n_;
  uint64_t seed_;
};

// The same samples as a stream (an IterableDataset), for the training data.
class BlobStream : public data::IterableDataset {
 public:
  explicit BlobStream(std::shared_ptr<const Blobs> blobs) : blobs_(std::move(blobs)) {}
  data::SampleSpec spec() const override { return blobs_->spec(); }
  std::unique_ptr<data::SampleStream> open(uint64_t epoch, int64_t start) const override {
    struct Stream : data::SampleStream {
      const Blobs& b;
      uint64_t epoch;
      int64_t at;
      Stream(const Blobs& blobs, uint64_t e, int64_t s) : b(blobs), epoch(e), at(s) {}
      bool next(const std::vector<Tensor>& f) override {
        if (at >= b.size()) return false;
        b.read(at++, epoch, f);
        return true;
      }
      int64_t skip(int64_t n) override {
        const int64_t k = std::min(n, b.size() - at);
        at += k;
        return k;
      }
    };
    return std::make_unique<Stream>(*blobs_, epoch, start);
  }

 private:
  std::shared_ptr<const Blobs> blobs_;
};

// A trunk with two heads: class logits and the regression of the features' sum.
class TwoHeads : public nn::Module {
 public:
  explicit TwoHeads(Generator* gen) {
    trunk = register_module("trunk", std::make_shared<nn::Linear>(kFeatures, 32, true, gen));
    classify = register_module("classify", std::make_shared<nn::Linear>(32, kClasses, true, gen));
    regress = register_module("regress", std::make_shared<nn::Linear>(32, 1, true, gen));
  }
  std::string type_name() const override { return "TwoHeads"; }
  std::shared_ptr<nn::Linear> trunk, classify, regress;
};

class TwoHeadModule : public TrainModule {
 public:
  explicit TwoHeadModule(uint64_t seed) : gen_(seed), model_(&gen_) {}
  nn::Module& model() override { return model_; }

  StepOutput training_step(const data::Batch& b) override { return step(b); }
  StepOutput validation_step(const data::Batch& b) override { return step(b); }

  // Only the classifier trunk and head decay; the regression head has no weight decay.
  std::vector<optim::ParamGroup> param_groups(const optim::GroupOptions& options) override {
    optim::ParamGroup decay{{}, options, "decay"}, no_decay{{}, options, "no_decay"};
    no_decay.options.weight_decay = 0;
    for (const auto& [name, p] : model_.named_parameters())
      (name.rfind("regress.", 0) == 0 || name.find("bias") != std::string::npos ? no_decay : decay).params.push_back(p);
    ++groups_asked;
    return {decay, no_decay};
  }

  std::optional<train::Goal> judge(const train::EvalResult& r) const override {
    const double acc = r.metric("accuracy").value_or(0);
    return train::Goal{"accuracy " + std::to_string(acc), acc >= 0.9};
  }
  std::string description_json() const override { return R"({"heads": ["classify", "regress"]})"; }

  int groups_asked = 0;

 private:
  StepOutput step(const data::Batch& b) {
    Tensor h = relu(model_.trunk->forward(b.field("x")));
    Tensor logits = model_.classify->forward(h);
    Tensor sum_pred = model_.regress->forward(h).reshape({-1});
    Tensor ce = cross_entropy(logits, b.field("label"));
    Tensor mse = mean(square(sub(sum_pred, b.field("sum").to(sum_pred.dtype()))));
    Tensor acc = mean(eq(argmax(logits, 1), b.field("label")).to(DType::F32));
    return {add(ce, mul(mse, 0.1)), {{"accuracy", acc}, {"mse", mse}}};
  }

  Generator gen_;
  TwoHeads model_;
};

std::shared_ptr<const Blobs> blobs(int64_t n, uint64_t seed) { return std::make_shared<Blobs>(n, seed); }

TrainerConfig config(const std::string& dir) {
  TrainerConfig c;
  c.task = "two-heads";
  c.run_dir = dir;
  c.progress = false;
  c.tensorboard = true;
  c.max_steps = 60;
  c.batch_size = 16;
  c.accumulate = 2;
  c.optimizer.lr = 1e-2;
  c.schedule = ft::train::CosineSchedule{.min_lr = 1e-3, .warmup_steps = 5};
  c.eval_every = 20;
  c.eval_batches = 0;
  c.log_every_n_steps = 10;
  c.checkpoint.every = 20;
  c.optimizer.grad_clip = 1.0;
  c.checkpoint.monitor = ft::train::Monitor::ValAccuracy;
  c.threads = 1;
  return c;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(TrainModule, UserModuleTrainsLogsMetricsAndResumesExactly) {
  const std::string dir = test::scratch_dir("ft_module", "two_heads");
  DatasetModule data({blobs(960, 1), nullptr, nullptr}, {blobs(300, 2), nullptr});
  TwoHeadModule module(7);
  TrainerConfig c = config(dir);
  c.checkpoint.keep_last = 0;  // every checkpoint stays: the test resumes from the first
  train::Trainer trainer(c);
  const train::TrainResult r = trainer.fit(module, data);
  EXPECT_EQ(module.groups_asked, 1);
  EXPECT_EQ(r.steps, 60);
  EXPECT_EQ(r.unit, "samples");
  EXPECT_EQ(r.model, "TwoHeads");
  ASSERT_TRUE(r.final_val_accuracy.has_value());
  EXPECT_GE(*r.final_val_accuracy, 0.9) << r.goal;
  EXPECT_TRUE(r.goal_met);
  EXPECT_FALSE(r.floor.has_value());
  // Metrics: every train row has the interval's mean accuracy and mse; val rows the split's.
  int val_rows = 0;
  for (const train::MetricRow& m : trainer.history()) {
    ASSERT_EQ(m.metrics.size(), 2u) << m.split << " " << m.step;
    EXPECT_EQ(m.metrics[0].first, "accuracy");
    EXPECT_EQ(m.metrics[1].first, "mse");
    ASSERT_TRUE(m.accuracy.has_value());
    EXPECT_EQ(*m.accuracy, m.metrics[0].second);
    EXPECT_GE(*m.accuracy, 0.0);
    EXPECT_LE(*m.accuracy, 1.0);
    if (m.split == "val") ++val_rows;
    if (m.split == "train") EXPECT_TRUE(m.grad_norm.has_value());
    EXPECT_FALSE(m.loss_scale.has_value());
  }
  EXPECT_EQ(val_rows, 3);
  EXPECT_NE(slurp(dir + "/task.json").find("\"regress\""), std::string::npos);
  EXPECT_NE(slurp(dir + "/summary.json").find("final_val_mse"), std::string::npos);
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors"));

  // Resumed from step 20 by a new Trainer with a new module: the same rows after step 20.
  const std::string dir_b = test::scratch_dir("ft_module", "two_heads_b");
  TrainerConfig cb = config(dir_b);
  TwoHeadModule other(99);  // different initial weights: the checkpoint replaces them
  train::Trainer resumed(cb);
  resumed.resume(dir + "/checkpoints/step-00000020");
  resumed.fit(other, data);
  std::vector<train::MetricRow> want;
  for (const train::MetricRow& m : trainer.history())
    if (m.step > 20) want.push_back(m);
  ASSERT_EQ(resumed.history().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(resumed.history()[i].step, want[i].step);
    EXPECT_EQ(resumed.history()[i].loss, want[i].loss) << "step " << want[i].step << " " << want[i].split;
    EXPECT_EQ(resumed.history()[i].metrics, want[i].metrics) << "step " << want[i].step;
  }
  fs::remove_all(dir);
  fs::remove_all(dir_b);
}

// Mixed precision applies to a user module as to the built-in ones; bf16-true hands it bf16 inputs.
TEST(TrainModule, PrecisionModesApplyToAUserModule) {
  for (const char* precision : {"bf16-mixed", "bf16-true", "fp16-mixed"}) {
    SCOPED_TRACE(precision);
    const std::string dir = test::scratch_dir("ft_module", std::string("precision_") + precision);
    TrainerConfig c = config(dir);
    set_field(c, "precision", precision);
    c.max_steps = 40;
    c.checkpoint.every = 0;
    DatasetModule data({blobs(960, 1), nullptr, nullptr}, {blobs(300, 2), nullptr});
    TwoHeadModule module(7);
    train::Trainer trainer(c);
    const train::TrainResult r = trainer.fit(module, data);
    EXPECT_GE(r.final_val_accuracy.value_or(0), 0.85) << r.goal;
    if (std::string(precision) == "bf16-true")
      for (const Tensor& p : module.model().parameters()) EXPECT_EQ(p.dtype(), DType::BF16);
    bool scaled = false;
    for (const train::MetricRow& m : trainer.history()) scaled |= m.loss_scale.has_value();
    EXPECT_EQ(scaled, std::string(precision) == "fp16-mixed");
    fs::remove_all(dir);
  }
}

// Two epochs of 960 samples in batches of 16 x 2 (30 steps each), no checkpoints or evaluations
// before the end, max_steps as given.
TrainerConfig two_epochs_config(const std::string& dir, int64_t max_steps) {
  TrainerConfig c = config(dir);
  c.max_steps = max_steps;
  c.max_epochs = 2;
  c.checkpoint.every = 0;
  c.eval_every = 0;
  return c;
}

// The 960 training samples as an iterable stream (no length, so no epoch count in advance).
TrainData blob_stream_data() { return {nullptr, nullptr, std::make_shared<BlobStream>(blobs(960, 1))}; }

// An iterable stream as training data: epochs are counted as the stream runs dry, and max_epochs
// ends the run.
TEST(TrainModule, IterableTrainingStreamAndMaxEpochs) {
  const std::string dir = test::scratch_dir("ft_module", "stream");
  TrainerConfig c = two_epochs_config(dir, 1000);
  DatasetModule data(blob_stream_data(), {blobs(300, 2), nullptr});
  TwoHeadModule module(7);
  train::Trainer trainer(c);
  const train::TrainResult r = trainer.fit(module, data);
  EXPECT_GE(r.steps, 60);
  EXPECT_LE(r.steps, 61);  // the step that finds the third epoch begun ends the run
  EXPECT_GE(r.final_val_accuracy.value_or(0), 0.9) << r.goal;
  fs::remove_all(dir);
}

// max_steps 0 with max_epochs (Lightning's max_steps=-1): the run takes as many steps as the epochs
// hold and the schedule spans exactly those; training data with no length (a stream) is refused.
TEST(TrainModule, MaxEpochsAloneSizesTheRunAndItsSchedule) {
  const std::string dir = test::scratch_dir("ft_module", "epochs");
  TrainerConfig c = two_epochs_config(dir, 0);
  c.log_every_n_steps = 1;
  DatasetModule data({blobs(960, 1), nullptr, nullptr}, {blobs(300, 2), nullptr});
  TwoHeadModule module(7);
  train::Trainer trainer(c);
  const train::TrainResult r = trainer.fit(module, data);
  EXPECT_EQ(r.steps, 60);
  EXPECT_EQ(train::load_run_config(dir).max_steps, 60);  // recorded resolved: a resume keeps it
  // Each step's learning rate is the cosine schedule over 60 steps (warmup 5), ending at min_lr.
  c.max_steps = 60;
  const std::unique_ptr<optim::Schedule> schedule = train::make_schedule(c);
  int64_t rows = 0;
  for (const train::MetricRow& row : trainer.history()) {
    if (row.split != "train") continue;
    ++rows;
    EXPECT_DOUBLE_EQ(row.lr, schedule->lr(row.step - 1)) << "step " << row.step;
  }
  EXPECT_EQ(rows, 60);

  c.max_steps = 0;
  DatasetModule stream(blob_stream_data(), {blobs(300, 2), nullptr});
  TwoHeadModule other(7);
  train::Trainer streamed(c);
  test::expect_error([&] { streamed.fit(other, stream); },
                     "option max_epochs: sizing the run by epochs alone needs training data of known length");
  fs::remove_all(dir);
}

class BadLoss : public TwoHeadModule {
 public:
  BadLoss() : TwoHeadModule(1) {}
  StepOutput training_step(const data::Batch&) override {
    return {model().parameters().front(), {}};  // a [32, 4] weight, not a scalar
  }
};

// A loss that turns infinite at one step (its gradients NaN): the run stops at that step's
// check, naming it and the first parameter hit; the last good checkpoint stays; no model and no
// later checkpoint is written.
class BlowsUp : public TwoHeadModule {
 public:
  explicit BlowsUp(int64_t at) : TwoHeadModule(1), at_(at) {}
  StepOutput training_step(const data::Batch& b) override {
    StepOutput out = TwoHeadModule::training_step(b);
    if (++calls_ == at_) out.loss = mul(out.loss, std::numeric_limits<double>::infinity());
    return out;
  }

 private:
  int64_t at_, calls_ = 0;
};

TEST(TrainModule, NonFiniteLossStopsTheRunAndKeepsTheLastGoodCheckpoint) {
  const std::string dir = test::scratch_dir("ft_module", "nan");
  TrainerConfig c = config(dir);
  c.accumulate = 1;
  c.checkpoint.every = 10;
  c.log_every_n_steps = 10;
  c.eval_every = 0;
  DatasetModule data({blobs(960, 1), nullptr, nullptr}, {blobs(300, 2), nullptr});
  BlowsUp module(15);
  train::Trainer trainer(c);
  test::expect_error([&] { trainer.fit(module, data); },
                     "training step 15: the loss is not finite (NaN summed since step 10); the first parameter with a "
                     "non-finite gradient: trunk.weight; stopped without writing a checkpoint or the model; the last "
                     "good checkpoint " +
                         dir + "/checkpoints/step-00000010 is intact");
  EXPECT_TRUE(fs::exists(dir + "/checkpoints/step-00000010/trainer_state.json"));
  EXPECT_FALSE(fs::exists(dir + "/checkpoints/step-00000020"));
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/summary.json"));
  fs::remove_all(dir);
}

TEST(TrainModule, MalformedModuleOrDataIsAClearError) {
  const std::string dir = test::scratch_dir("ft_module", "bad");
  TrainerConfig c = config(dir);
  {
    DatasetModule data({blobs(960, 1), nullptr, nullptr}, {blobs(300, 2), nullptr});
    BadLoss module;
    train::Trainer trainer(c);
    test::expect_error([&] { trainer.fit(module, data); },
                       "training_step: expected a loss with one element, found [32, 4]");
  }
  {
    DatasetModule data({nullptr, nullptr, nullptr}, {blobs(300, 2), nullptr});
    TwoHeadModule module(1);
    train::Trainer trainer(c);
    test::expect_error([&] { trainer.fit(module, data); },
                       "expected the training data as a dataset or a stream (exactly one), found neither");
  }
  {
    DatasetModule data({blobs(20, 1), nullptr, nullptr}, {blobs(300, 2), nullptr});
    TwoHeadModule module(1);
    train::Trainer trainer(c);
    test::expect_error([&] { trainer.fit(module, data); },
                       "the training data holds 20 samples per epoch, fewer than batch_size x accumulate = 32");
  }
  {
    DatasetModule data({blobs(960, 1), nullptr, nullptr}, {blobs(0, 2), nullptr});
    TwoHeadModule module(1);
    train::Trainer trainer(c);
    test::expect_error([&] { trainer.fit(module, data); }, "the validation dataset is empty");
  }
  fs::remove_all(dir);
}

// TensorDataset: rows of tensors (e.g. two .npy files) as samples, with clear errors.
TEST(TrainModule, TensorDatasetServesRowsOfNpyFiles) {
  const std::string dir = test::scratch_dir("ft_module", "npy");
  fs::create_directories(dir);
  save_npy(dir + "/x.npy", from_vector({1, 2, 3, 4, 5, 6}, {3, 2}, DType::F32));
  save_npy(dir + "/y.npy", from_vector({7, 8, 9}, {3}, DType::I64));
  data::TensorDataset ds({{"x", map_npy(dir + "/x.npy")}, {"y", load_npy(dir + "/y.npy")}});
  ASSERT_EQ(ds.size(), 3);
  ASSERT_EQ(ds.spec().size(), 2u);
  EXPECT_EQ(ds.spec()[0].shape, Shape({2}));
  EXPECT_EQ(ds.spec()[1].dtype, DType::I64);
  std::vector<Tensor> row = {empty({2}), empty({}, DType::I64)};
  ds.read(1, 0, row);
  EXPECT_EQ(row[0].to_vector(), (std::vector<double>{3, 4}));
  EXPECT_EQ(row[1].item<int64_t>(), 8);
  test::expect_error([&] { ds.read(3, 0, row); }, "TensorDataset: expected a sample index in [0, 3), found 3");
  test::expect_error(
      [&] {
        data::TensorDataset({{"x", zeros({3, 2})}, {"y", zeros({4})}});
      },
      "TensorDataset: field 'y' has 4 rows, expected 3 like 'x'");
  test::expect_error(
      [&] {
        data::TensorDataset({{"x", scalar_tensor(1.0, DType::F32)}});
      },
      "field 'x': expected a tensor with a first (sample) dimension, found a 0-d tensor");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ft
