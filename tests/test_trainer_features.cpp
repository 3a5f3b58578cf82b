// Trainer features of the speed-and-safety issue: precision modes, gradient accumulation,
// clipping by value, schedules with cycled momentum, the batch-size finder, the LR finder,
// stopping on a signal, early stopping, checkpoint keeping, TensorBoard logging and checkpoint
// integrity on resume.
#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fasttrain/allocator.h"
#include "fasttrain/bench.h"
#include "fasttrain/fasttrain.h"
#include "fasttrain/tensorboard.h"
#include "fasttrain/train.h"
#include "fasttrain/train_step.h"
#include "support/expect_error.h"
#include "support/trainer_configs.h"

using namespace ft;
using namespace ft::train;
namespace fs = std::filesystem;

namespace {

std::string temp_dir(const std::string& name) { return test::scratch_dir("fasttrain_test_features", name); }

using test::tiny_char;

TrainerConfig tiny_images(const std::string& run_dir) {
  TrainerConfig i = TrainerConfig::defaults_for("images");
  i.run_dir = run_dir;
  i.progress = false;
  i.model.name = "cnn-tiny";
  i.data.image_size = 16;
  i.data.train_images = 64;
  i.data.val_images = 20;
  i.batch_size = 8;
  i.max_steps = 6;
  i.log_every_n_steps = 2;
  i.eval_every = 3;
  return i;
}

std::vector<std::vector<double>> weights_of(const nn::Module& m) {
  std::vector<std::vector<double>> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.to(DType::F64).to_vector());
  return out;
}

}  // namespace

// Accumulating 4 micro-batches of 8 is one step on the batch of 32: the same gradients within
// fp32 rounding (the loss is divided by 4 per micro-batch; the summation order differs), hence the
// same SGD trajectory. (Adam would amplify rounding noise in near-zero gradients: it normalises.)
TEST(TrainStep, AccumulatingFourTimesEightEqualsBatch32) {
  for (const char* workload : {"mlp", "gpt-mini"}) {
    SCOPED_TRACE(workload);
    const int64_t batch = workload == std::string("mlp") ? 32 : 4;
    Generator g1(7), g2(7);
    bench::Workload a = bench::make_workload(workload, batch, g1);
    bench::Workload b = bench::make_workload(workload, batch, g2);
    optim::GroupOptions o;
    o.lr = 0.05;
    o.momentum = 0.9;
    auto oa = optim::make_sgd({optim::ParamGroup{a.model->parameters(), o, "all"}});
    auto ob = optim::make_sgd({optim::ParamGroup{b.model->parameters(), o, "all"}});
    auto ra = bench::make_step_runner(a, *oa, Precision::FP32, 1);
    auto rb = bench::make_step_runner(b, *ob, Precision::FP32, 4);
    auto relative_difference = [](const std::vector<Tensor>& x, const std::vector<Tensor>& y, bool grads) {
      double diff = 0, norm = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const auto u = (grads ? x[i].grad() : x[i]).to(DType::F64).to_vector();
        const auto v = (grads ? y[i].grad() : y[i]).to(DType::F64).to_vector();
        for (size_t k = 0; k < u.size(); ++k) diff += (u[k] - v[k]) * (u[k] - v[k]), norm += u[k] * u[k];
      }
      return std::sqrt(diff / norm);
    };
    for (int s = 0; s < 3; ++s) {
      const double la = ra->step(a.inputs, a.targets).item<double>();
      const double lb = rb->step(b.inputs, b.targets).item<double>();
      EXPECT_NEAR(la, lb, 1e-6 * std::abs(la)) << "step " << s;
      EXPECT_LT(relative_difference(a.model->parameters(), b.model->parameters(), true), 1e-5)
          << "gradients, step " << s;
    }
    EXPECT_LT(relative_difference(a.model->parameters(), b.model->parameters(), false), 1e-6) << "weights";
    // Only the micro-batch count of a step is allowed.
    rb->forward_backward(b.inputs.narrow(0, 0, 1), b.targets.narrow(0, 0, 1));
    test::expect_error([&] { rb->optimizer_step(); }, "optimizer_step() after 1 micro-batches, expected 4");
  }
}

TEST(TrainStep, ClipByValueBoundsEveryGradientElement) {
  Generator gen(3);
  bench::Workload w = bench::make_workload("mlp", 8, gen);
  auto opt = optim::make_sgd({optim::ParamGroup{w.model->parameters(), optim::GroupOptions{}, "all"}});
  StepOptions so;
  so.clip = 1e-4;
  so.clip_algorithm = ClipAlgorithm::Value;
  StepRunner runner(
      *w.model, *opt, [&](const Tensor& o, const Tensor& y) { return bench::workload_loss(w, o); }, so);
  runner.forward_backward(w.inputs, w.targets);
  runner.optimizer_step();
  double largest = 0;
  for (const Tensor& p : w.model->parameters())
    for (double g : p.grad().to(DType::F64).to_vector()) largest = std::max(largest, std::abs(g));
  EXPECT_LE(largest, 1e-4);
  EXPECT_GT(largest, 0.0);
  test::expect_error([&] { so.clip_algorithm = clip_algorithm_from_name("max"); },
                     "gradient_clip_algorithm: expected norm or value");
}

// step(batch tensors, loss) splits every tensor of the batch into the micro-batches and returns
// each micro-batch's outputs in order; it trains exactly as step(input, target). On the CPU
// cuda_graphs changes nothing.
TEST(TrainStep, BatchStepSplitsEveryTensorAndReturnsOutputs) {
  StepOptions so;
  so.accumulate = 2;
  Generator ga(9), gb(9);
  bench::Workload a = bench::make_workload("mlp", 8, ga), b = bench::make_workload("mlp", 8, gb);
  auto oa = bench::make_bench_optimizer(*a.model), ob = bench::make_bench_optimizer(*b.model);
  StepRunner ra(
      *a.model, *oa, [](const Tensor& o, const Tensor& y) { return cross_entropy(o, y); }, so);
  so.cuda_graphs = true;
  StepRunner rb(*b.model, *ob, so);
  for (int s = 0; s < 5; ++s) {
    const Tensor la = ra.step(a.inputs, a.targets);
    const StepResult r = rb.step({b.inputs, b.targets}, [&](const std::vector<Tensor>& t, std::vector<Tensor>& out) {
      EXPECT_EQ(t[0].size(0), 4);
      EXPECT_EQ(t[1].size(0), 4);
      Tensor logits = b.model->forward(t[0]);
      out.push_back(argmax(logits, 1));
      return cross_entropy(logits, t[1]);
    });
    EXPECT_EQ(la.item<double>(), r.loss.item<double>()) << "step " << s;
    ASSERT_EQ(r.outputs.size(), 2u);
    EXPECT_EQ(r.outputs[0].shape(), Shape({4}));
    EXPECT_FALSE(r.outputs[1].requires_grad());
  }
  EXPECT_FALSE(rb.graph_captured());
  EXPECT_EQ(rb.graph_refused(), "");
  const std::vector<Tensor> pa = a.model->parameters(), pb = b.model->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(pa[i].to_vector(), pb[i].to_vector()) << "parameter " << i;
  test::expect_error(
      [&] {
        rb.step({b.inputs, b.targets.narrow(0, 0, 6)}, nullptr);
      },
      "expected a batch whose tensors share a first dim");
}

// Every precision mode trains the char task; bf16-true keeps bf16 weights, fp16-mixed logs its
// loss scale, fp8-mixed runs its linear layers in FP8 (scales moved off 1, the head left out) and
// checkpoints their scales, and each resumes exactly.
TEST(Trainer, PrecisionModesTrainAndResumeExactly) {
  for (const char* precision : {"32", "tf32", "bf16-mixed", "fp16-mixed", "bf16-true", "fp8-mixed"}) {
    SCOPED_TRACE(precision);
    TrainerConfig c = tiny_char(temp_dir(std::string("precision_") + precision));
    set_field(c, "precision", precision);
    c.accumulate = 2;
    c.checkpoint.every = 4;
    c.max_steps = 8;
    test::BuiltinRun a(c);
    TrainResult r = a.fit();
    EXPECT_TRUE(std::isfinite(r.final_train_loss));
    EXPECT_LT(a.history().back().loss, std::log(128.0));  // below the uniform guess over 128 classes
    if (std::string(precision) == "bf16-true")
      for (const Tensor& p : a.model().parameters()) EXPECT_EQ(p.dtype(), DType::BF16);
    bool saw_scale = false;
    for (const MetricRow& m : a.history())
      if (m.split == "train") saw_scale |= m.loss_scale.value_or(0) > 0;
    EXPECT_EQ(saw_scale, std::string(precision) == "fp16-mixed");
    if (std::string(precision) == "fp8-mixed") {
      // c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj of the one block; not the head.
      const auto states = fp8_states(a.model());
      EXPECT_EQ(states.size(), 4u);
      for (const auto& [name, st] : states) {
        EXPECT_EQ(name.find("lm_head"), std::string::npos) << name;
        EXPECT_NE(st->scale.to_vector()[0], 1.0) << name << ": the input's scale followed its amax";
      }
      EXPECT_TRUE(fs::exists(c.run_dir + "/checkpoints/step-00000004/fp8_scales.safetensors"));
    }

    TrainerConfig cb = c;
    cb.run_dir = temp_dir(std::string("precision_b_") + precision);
    test::BuiltinRun b(cb);
    b.resume(c.run_dir + "/checkpoints/step-00000004");
    b.fit();
    std::vector<MetricRow> tail;
    for (const MetricRow& m : a.history())
      if (m.step > 4) tail.push_back(m);
    ASSERT_EQ(tail.size(), b.history().size());
    for (size_t k = 0; k < tail.size(); ++k) EXPECT_EQ(tail[k].loss, b.history()[k].loss) << "step " << tail[k].step;
    fs::remove_all(c.run_dir);
    fs::remove_all(cb.run_dir);
  }
}

// The schedule drives lr and momentum every step (onecycle cycles Adam's beta1), LAMB and LARS
// train, and both land in metrics and TensorBoard.
TEST(Trainer, OneCycleMomentumAndNewOptimizersAreLogged) {
  for (const char* optimizer : {"adamw", "lamb", "lars"}) {
    SCOPED_TRACE(optimizer);
    TrainerConfig c = tiny_char(temp_dir(std::string("onecycle_") + optimizer));
    set_field(c, "optimizer", optimizer);
    c.schedule = ft::train::OneCycleSchedule{};
    c.optimizer.lr = optimizer == std::string("lars") ? 2.0 : 1e-2;
    c.log_every_n_steps = 1;
    test::BuiltinRun t(c);
    t.fit();
    auto schedule = make_schedule(c);
    for (const MetricRow& m : t.history()) {
      if (m.split != "train") continue;
      EXPECT_DOUBLE_EQ(m.lr, schedule->lr(m.step - 1)) << "step " << m.step;
      ASSERT_TRUE(m.momentum.has_value()) << "step " << m.step;
      EXPECT_DOUBLE_EQ(*m.momentum, *schedule->momentum(m.step - 1)) << "step " << m.step;
    }
    const auto events = read_tensorboard_scalars(fs::directory_iterator(c.run_dir + "/tensorboard")->path().string());
    int lr_events = 0;
    for (const ScalarEvent& e : events) lr_events += e.tag == "train/lr";
    EXPECT_EQ(lr_events, c.max_steps);  // one per step
    fs::remove_all(c.run_dir);
  }
}

// A SIGTERM during fit() saves a checkpoint after the current step and returns; the run resumes.
TEST(Trainer, SigtermSavesACheckpointAndStops) {
  TrainerConfig c = tiny_char(temp_dir("sigterm"));
  c.max_steps = 100000;
  c.eval_every = 0;
  test::BuiltinRun t(c);
  std::thread killer([&] {
    while (!fs::exists(c.run_dir + "/metrics.csv") || fs::file_size(c.run_dir + "/metrics.csv") < 200)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ::kill(::getpid(), SIGTERM);
  });
  TrainResult r = t.fit();
  killer.join();
  EXPECT_TRUE(r.interrupted);
  EXPECT_LT(r.steps, c.max_steps);
  ASSERT_FALSE(r.last_checkpoint.empty());
  EXPECT_TRUE(fs::exists(r.last_checkpoint + "/trainer_state.json"));
  TrainerConfig cb = c;
  cb.run_dir = temp_dir("sigterm_b");
  cb.max_steps = r.steps + 2;
  test::BuiltinRun b(cb);
  b.resume(r.last_checkpoint);
  EXPECT_EQ(b.fit().steps, r.steps + 2);
  EXPECT_GT(b.history().front().step, r.steps);  // it went on from the checkpoint
  fs::remove_all(c.run_dir);
  fs::remove_all(cb.run_dir);
}

TEST(Trainer, EarlyStoppingAndCheckpointKeeping) {
  TrainerConfig c = tiny_char(temp_dir("early"));
  c.max_steps = 40;
  c.eval_every = 2;
  c.checkpoint.every = 2;
  c.checkpoint.keep_last = 2;
  c.checkpoint.keep_best = 1;
  c.checkpoint.early_stopping_patience = 3;
  c.checkpoint.early_stopping_min_delta = 1e9;  // nothing after the first evaluation counts as an improvement
  test::BuiltinRun t(c);
  TrainResult r = t.fit();
  EXPECT_TRUE(r.stopped_early);
  EXPECT_EQ(r.steps, 8);  // evaluations at 2 (best), 4, 6, 8: three without improvement
  std::set<std::string> kept;
  for (const auto& e : fs::directory_iterator(c.run_dir + "/checkpoints")) kept.insert(e.path().filename());
  // The newest two and the best by validation loss (every checkpoint step was evaluated).
  int64_t best_step = -1;
  double best = INFINITY;
  for (const MetricRow& m : t.history())
    if (m.split == "val" && m.loss < best) best = m.loss, best_step = m.step;
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(best_step));
  EXPECT_EQ(kept, (std::set<std::string>{"step-00000006", "step-00000008", name}));
  fs::remove_all(c.run_dir);
}

// A checkpoint with one flipped byte is rejected (CRC) and the model stays as it was.
TEST(Trainer, AlteredCheckpointIsRejectedAndChangesNothing) {
  TrainerConfig c = tiny_char(temp_dir("altered"));
  c.max_steps = 2;
  c.checkpoint.every = 2;
  test::BuiltinRun(c).fit();
  const std::string ckpt = c.run_dir + "/checkpoints/step-00000002";
  {
    std::fstream f(ckpt + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-5, std::ios::end);
    char byte = 0;
    f.read(&byte, 1);
    byte ^= 0x10;
    f.seekp(-5, std::ios::end);
    f.write(&byte, 1);
  }
  test::BuiltinRun t(c);
  const auto before = weights_of(t.model());
  t.resume(ckpt);  // checks the folder and its config; the tensors are read as fit() starts
  test::expect_error([&] { t.fit(); }, "checksum mismatch: file altered or corrupt");
  EXPECT_EQ(weights_of(t.model()), before);
  EXPECT_EQ(t.step(), 0);
  fs::remove_all(c.run_dir);
}

// --batch-size auto under a memory budget: doubling until a trial fails for lack of memory, the
// engine usable afterwards, the lr scaled with the batch.
TEST(Trainer, BatchSizeFinderStopsAtTheMemoryBudget) {
  for (const char* search : {"power", "binsearch"}) {
    SCOPED_TRACE(search);
    TrainerConfig c = tiny_images(temp_dir(std::string("autobatch_") + search));
    c.data.train_images = 2048;
    c.batch_size = 0;
    ft::train::set_field(c, "memory_limit", "24M");
    set_field(c, "batch_size_search", search);
    // The trials run with the module and its data in memory, as the run's own finder does.
    BatchSizeSearch found;
    {
      BuiltinTask probe = make_builtin_task(c);
      const auto weights = weights_of(probe.module->model());
      found = find_batch_size(c, *probe.module, *probe.data);
      EXPECT_EQ(weights_of(probe.module->model()), weights) << "the trials' updates were not undone";
    }
    ASSERT_GE(found.trials.size(), 2u);
    bool failed = false;
    for (const auto& [b, ok] : found.trials) {
      if (!ok) failed = true;
      if (ok) EXPECT_LE(b, found.batch_size);
    }
    EXPECT_TRUE(failed) << found.report;
    EXPECT_GE(found.batch_size, 2);
    if (std::string(search) == "binsearch") {
      // Bisection ends next to the first failure.
      int64_t smallest_failure = INT64_MAX;
      for (const auto& [b, ok] : found.trials)
        if (!ok) smallest_failure = std::min(smallest_failure, b);
      EXPECT_EQ(smallest_failure, found.batch_size + 1) << found.report;
    }
    test::BuiltinRun t(c);
    t.fit();  // the finder runs again as fit() starts; the engine is usable after the failed trials
    EXPECT_EQ(t.config().batch_size, found.batch_size);
    EXPECT_NEAR(t.config().optimizer.lr, TrainerConfig::defaults_for("images").optimizer.lr * found.batch_size / 32.0,
                1e-12);
    allocator_for(Device::cpu()).set_memory_limit(0);
    fs::remove_all(c.run_dir);
  }
}

// lr_find sweeps, suggests a rate, and leaves weights, optimizer and data position untouched.
TEST(Trainer, LrFindRestoresTheRun) {
  TrainerConfig c = tiny_char(temp_dir("lrfind"));
  c.max_steps = 4;
  c.model.dropout = 0.1;  // the sweep's dropout draws must not leak into the run
  TrainerConfig c2 = c;
  c2.run_dir = temp_dir("lrfind_ref");
  test::BuiltinRun t(c);
  const auto before = weights_of(t.model());
  LrFindOptions o;
  o.steps = 30;
  o.min_lr = 1e-5;
  o.max_lr = 10;
  LrFindResult r = t.lr_find(o);
  EXPECT_GE(r.lrs.size(), 5u);
  EXPECT_GT(r.suggestion, 1e-5);
  EXPECT_LT(r.suggestion, 10.0);
  EXPECT_EQ(weights_of(t.model()), before);
  // Training after the sweep is the same as without it.
  t.fit();
  test::BuiltinRun ref(c2);  // built after t's run: a Trainer seeds the process-wide dropout stream
  ref.fit();
  ASSERT_EQ(t.history().size(), ref.history().size());
  for (size_t k = 0; k < t.history().size(); ++k) EXPECT_EQ(t.history()[k].loss, ref.history()[k].loss);
  fs::remove_all(c.run_dir);
  fs::remove_all(c2.run_dir);
}

// With activation checkpointing the char task trains to the same losses.
// channels_last trains the same CNN in NHWC memory: the weights and the image batches take that
// layout, the losses match the NCHW run to rounding (convolutions sum in another order), the
// saved weights are the same tensors, and a channels-last checkpoint resumes exactly.
TEST(Trainer, ChannelsLastTrainsTheSameModelAndResumes) {
  TrainerConfig c = tiny_images(temp_dir("nhwc_a"));
  c.checkpoint.every = 3;
  TrainerConfig cl = c;
  cl.run_dir = temp_dir("nhwc_b");
  cl.precision.channels_last = true;
  test::BuiltinRun a(c);
  a.fit();
  test::BuiltinRun b(cl);
  b.fit();
  size_t four_d = 0;
  for (const Tensor& p : b.model().parameters())
    if (p.dim() == 4) {
      EXPECT_TRUE(p.is_channels_last());
      ++four_d;
    }
  EXPECT_GT(four_d, 0u);
  ASSERT_EQ(a.history().size(), b.history().size());
  for (size_t k = 0; k < a.history().size(); ++k)
    EXPECT_NEAR(a.history()[k].loss, b.history()[k].loss, 1e-4 * std::abs(a.history()[k].loss));

  TrainerConfig resumed = cl;
  resumed.run_dir = temp_dir("nhwc_c");
  test::BuiltinRun r(resumed);
  r.resume(cl.run_dir + "/checkpoints/step-00000003");
  r.fit();
  std::vector<MetricRow> tail;
  for (const MetricRow& m : b.history())
    if (m.step > 3) tail.push_back(m);
  ASSERT_EQ(tail.size(), r.history().size());
  for (size_t k = 0; k < tail.size(); ++k) EXPECT_EQ(tail[k].loss, r.history()[k].loss) << "step " << tail[k].step;
  for (const auto& d : {c.run_dir, cl.run_dir, resumed.run_dir}) fs::remove_all(d);
}

// Also under fp8-mixed: the recomputation runs in the forward's FP8 region with the same scales.
TEST(Trainer, CheckpointBlocksGivesTheSameLosses) {
  for (Precision p : {Precision::FP32, Precision::FP8Mixed}) {
    SCOPED_TRACE(precision_name(p));
    TrainerConfig c = tiny_char(temp_dir("ckblocks_a"));
    c.model.layers = 2;
    c.model.dropout = 0.1;
    c.precision.mode = p;
    TrainerConfig cb = c;
    cb.run_dir = temp_dir("ckblocks_b");
    cb.precision.checkpoint_blocks = true;
    // One after the other: a Trainer seeds the process-wide dropout stream when it is built.
    test::BuiltinRun a(c);
    a.fit();
    test::BuiltinRun b(cb);
    b.fit();
    ASSERT_EQ(a.history().size(), b.history().size());
    for (size_t k = 0; k < a.history().size(); ++k)
      EXPECT_EQ(a.history()[k].loss, b.history()[k].loss);  // the recompute replays the same dropout masks
    fs::remove_all(c.run_dir);
    fs::remove_all(cb.run_dir);
  }
  TrainerConfig c = tiny_char(temp_dir("ckblocks_a"));
  TrainerConfig cb = c;
  cb.run_dir = temp_dir("ckblocks_b");
  TrainerConfig bad = tiny_images(temp_dir("ckblocks_images"));
  bad.precision.checkpoint_blocks = true;
  test::expect_error([&] { test::BuiltinRun(bad).fit(); }, "expected a model with checkpointable blocks");
  fs::remove_all(c.run_dir);
  fs::remove_all(cb.run_dir);
}
