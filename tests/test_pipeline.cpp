// Pipeline parallelism (pipeline.h): the schedules and the stages' programs without MPI (every
// micro-batch forwarded before its backward on every stage, the activations in flight bounded,
// and the programs of all stages run against a simulated rendezvous: no deadlock, every message
// matched), the split of blocks into stages; then `fasttrain train --pp` under mpirun
// (--oversubscribe: the CI machine has 2 cores) against one process with the same global batch,
// composed with --tp and data parallelism, checkpoints resumed at other layouts, refusals and a
// failing rank.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fasttrain/fasttrain.h"
#include "fasttrain/pipeline.h"
#include "support/mpi_job.h"
#include "support/trainer_configs.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using dist::PipelineAction;
using dist::PipelineMessage;
using dist::PipelineOp;
using dist::PipelineSchedule;

std::string show(const std::vector<PipelineAction>& actions) {
  std::string s;
  for (const PipelineAction& a : actions)
    s += (s.empty() ? "" : " ") + std::string(a.kind == PipelineAction::Forward ? "F" : "B") + std::to_string(a.micro);
  return s;
}

// "" when `actions` is a valid step of m micro-batches: each forwarded once and backwarded once,
// after its forward; else what is wrong. *peak: the most micro-batches forwarded and not yet
// backwarded at any point (activations held).
std::string check_actions(const std::vector<PipelineAction>& actions, int64_t m, int64_t* peak) {
  std::vector<int> forwarded(m, 0), backwarded(m, 0);
  int64_t held = 0;
  *peak = 0;
  for (const PipelineAction& a : actions) {
    if (a.micro < 0 || a.micro >= m) return "micro-batch " + std::to_string(a.micro) + " out of range";
    if (a.kind == PipelineAction::Forward) {
      if (forwarded[a.micro]++) return "F" + std::to_string(a.micro) + " twice";
      *peak = std::max(*peak, ++held);
    } else {
      if (!forwarded[a.micro]) return "B" + std::to_string(a.micro) + " before its forward";
      if (backwarded[a.micro]++) return "B" + std::to_string(a.micro) + " twice";
      --held;
    }
  }
  for (int64_t j = 0; j < m; ++j)
    if (!forwarded[j] || !backwarded[j]) return "micro-batch " + std::to_string(j) + " not run";
  return "";
}

TEST(PipelineSchedule, GPipeRunsAllForwardsThenAllBackwards) {
  EXPECT_EQ(show(dist::pipeline_schedule(PipelineSchedule::GPipe, 0, 2, 4)), "F0 F1 F2 F3 B0 B1 B2 B3");
  EXPECT_EQ(show(dist::pipeline_schedule(PipelineSchedule::GPipe, 1, 2, 4)), "F0 F1 F2 F3 B0 B1 B2 B3");
}

TEST(PipelineSchedule, OneFOneBWarmsUpThenAlternatesThenDrains) {
  // p = 4, m = 6: stage s runs p - s - 1 warm-up forwards.
  EXPECT_EQ(show(dist::pipeline_schedule(PipelineSchedule::OneFOneB, 0, 4, 6)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(show(dist::pipeline_schedule(PipelineSchedule::OneFOneB, 2, 4, 6)), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  EXPECT_EQ(show(dist::pipeline_schedule(PipelineSchedule::OneFOneB, 3, 4, 6)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
}

TEST(PipelineSchedule, EveryMicroBatchIsForwardedBeforeItsBackwardAndActivationsAreBounded) {
  for (int p = 1; p <= 5; ++p)
    for (int64_t m = 1; m <= 9; ++m)
      for (int s = 0; s < p; ++s) {
        SCOPED_TRACE("p " + std::to_string(p) + " m " + std::to_string(m) + " stage " + std::to_string(s));
        int64_t peak = 0;
        EXPECT_EQ(check_actions(dist::pipeline_schedule(PipelineSchedule::GPipe, s, p, m), m, &peak), "");
        EXPECT_EQ(peak, m);  // GPipe holds every micro-batch's activations
        if (m < p) continue;
        EXPECT_EQ(check_actions(dist::pipeline_schedule(PipelineSchedule::OneFOneB, s, p, m), m, &peak), "");
        EXPECT_LE(peak, p - s);  // 1F1B's bound
      }
  // The check can fail: a backward before its forward, a micro-batch left out.
  int64_t peak = 0;
  EXPECT_NE(check_actions({{PipelineAction::Backward, 0}, {PipelineAction::Forward, 0}}, 1, &peak), "");
  EXPECT_NE(check_actions({{PipelineAction::Forward, 0}, {PipelineAction::Backward, 0}}, 2, &peak), "");
}

TEST(PipelineSchedule, OneFOneBWithFewerMicroBatchesThanStagesIsRefusedWithTheNumbers) {
  try {
    dist::pipeline_schedule(PipelineSchedule::OneFOneB, 0, 4, 3);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 micro-batches (accumulate) are fewer than the 4 pipeline stages (pp)"),
              std::string::npos)
        << e.what();
  }
}

// Runs every stage's program against the others with rendezvous semantics (a send completes only
// when the peer's matching receive is posted, and the two halves of a send_recv progress on their
// own, as MPI_Sendrecv's): "" when all programs complete with every message received as sent,
// else the first mismatch or "deadlock ..." with each stage's position.
std::string simulate(const std::vector<std::vector<PipelineOp>>& programs) {
  const auto p = static_cast<int>(programs.size());
  std::vector<size_t> pc(p, 0);
  std::vector<bool> sent(p, false), received(p, false);  // halves of the current op done
  auto current = [&](int s) -> const PipelineOp* { return pc[s] < programs[s].size() ? &programs[s][pc[s]] : nullptr; };
  for (;;) {
    bool progress = false, done = true;
    for (int s = 0; s < p; ++s) {
      const PipelineOp* op = current(s);
      if (op == nullptr) continue;
      done = false;
      if (op->compute) {
        ++pc[s], progress = true;
        continue;
      }
      if (op->send.peer >= 0 && !sent[s]) {
        const int q = op->send.peer;
        const PipelineOp* other = current(q);
        if (other != nullptr && !other->compute && other->recv.peer == s && !received[q]) {
          if (other->recv.kind != op->send.kind || other->recv.micro != op->send.micro)
            return "stage " + std::to_string(q) + " received another message than stage " + std::to_string(s) + " sent";
          sent[s] = received[q] = true, progress = true;
        }
      }
    }
    for (int s = 0; s < p; ++s) {
      const PipelineOp* op = current(s);
      if (op == nullptr || op->compute) continue;
      if ((op->send.peer < 0 || sent[s]) && (op->recv.peer < 0 || received[s])) {
        ++pc[s], sent[s] = received[s] = false, progress = true;
      }
    }
    if (done) return "";
    if (!progress) {
      std::string where = "deadlock at ops";
      for (int s = 0; s < p; ++s) where += " " + std::to_string(pc[s]) + "/" + std::to_string(programs[s].size());
      return where;
    }
  }
}

std::vector<std::vector<PipelineOp>> programs(PipelineSchedule schedule, int p, int64_t m) {
  std::vector<std::vector<PipelineOp>> out;
  for (int s = 0; s < p; ++s) out.push_back(dist::pipeline_program(dist::pipeline_schedule(schedule, s, p, m), s, p));
  return out;
}

TEST(PipelineSchedule, TheStagesProgramsRunToTheEndWithEveryMessageMatched) {
  for (int p = 1; p <= 5; ++p)
    for (int64_t m = 1; m <= 8; ++m) {
      SCOPED_TRACE("p " + std::to_string(p) + " m " + std::to_string(m));
      EXPECT_EQ(simulate(programs(PipelineSchedule::GPipe, p, m)), "");
      if (m >= p) EXPECT_EQ(simulate(programs(PipelineSchedule::OneFOneB, p, m)), "");
    }
  // 1F1B's steady state on 2 stages: the neighbours exchange in one send_recv each.
  const auto two = programs(PipelineSchedule::OneFOneB, 2, 4);
  int fused = 0;
  for (const PipelineOp& op : two[0]) fused += !op.compute && op.send.peer >= 0 && op.recv.peer >= 0;
  EXPECT_EQ(fused, 3);
}

TEST(PipelineSchedule, TheSimulationCatchesADeadlockAndAMismatchedMessage) {
  // The same programs with every send_recv split into a send then a receive: both neighbours
  // send first and wait forever.
  auto split = programs(PipelineSchedule::OneFOneB, 2, 4);
  for (auto& program : split) {
    std::vector<PipelineOp> out;
    for (const PipelineOp& op : program) {
      if (!op.compute && op.send.peer >= 0 && op.recv.peer >= 0) {
        out.push_back({false, {}, op.send, {}});
        out.push_back({false, {}, {}, op.recv});
      } else {
        out.push_back(op);
      }
    }
    program = out;
  }
  EXPECT_NE(simulate(split).find("deadlock"), std::string::npos);
  // Stage 1 running another schedule than stage 0's: the messages no longer match.
  auto mixed = programs(PipelineSchedule::GPipe, 2, 4);
  mixed[1] = dist::pipeline_program(dist::pipeline_schedule(PipelineSchedule::OneFOneB, 1, 2, 4), 1, 2);
  EXPECT_NE(simulate(mixed), "");
}

TEST(PipelineStages, BlocksAreSplitToBalanceParametersOrAsGiven) {
  // Four blocks of 10; stage 0 also holds 15 (embeddings): {1, 3} (largest stage 30, not 35).
  EXPECT_EQ(dist::stage_layers({10, 10, 10, 10}, 15, 0, 2, {}, "GPT"), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(dist::stage_layers({10, 10, 10, 10}, 0, 0, 2, {}, "GPT"), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(dist::stage_layers({10, 10, 10, 10, 10, 10, 10, 10}, 1, 25, 3, {}, "GPT"),
            (std::vector<int64_t>{3, 4, 1}));  // largest 40 (a 3, 3, 2 split: 45)
  EXPECT_EQ(dist::stage_layers({10, 10, 10, 10}, 15, 0, 2, {3, 1}, "GPT"), (std::vector<int64_t>{3, 1}));
  auto refused = [](const std::vector<int64_t>& given, int stages) {
    try {
      dist::stage_layers({10, 10, 10, 10}, 0, 0, stages, given, "GPT");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refused({}, 5).find("pp = 5 stages for GPT's 4 blocks"), std::string::npos) << refused({}, 5);
  EXPECT_NE(refused({2, 1}, 2).find("summing to GPT's 4 blocks, found 2 counts summing to 3"), std::string::npos)
      << refused({2, 1}, 2);
  EXPECT_EQ(train::StageLayers::parse("pp_layers", "3,3,2").layers, (std::vector<int64_t>{3, 3, 2}));
  EXPECT_THROW(train::StageLayers::parse("pp_layers", "3,,2"), Error);
  EXPECT_THROW(train::StageLayers::parse("pp_layers", "3,0"), Error);
}

// --- the program ---

using test::expect_losses_close;
using test::expect_model_close;
using test::mpirun;
using test::run_command;
using test::train_losses;

class PipelineCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::scratch_dir("pp", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    test::write_noisy_cycle_shards(dir_);  // 96 tokens, padded to 128 rows
  }
  void TearDown() override { fs::remove_all(dir_); }

  // 4 blocks of width 32; 4 micro-batches; AdamW with decay, cosine schedule with warmup,
  // clipping at 0.5 (the early steps' norms are above it). `extra` starting with " --model "
  // replaces the custom GPT.
  std::string flags(int64_t batch, const std::string& run, const std::string& extra, int layers = 4,
                    int accumulate = 4) const {
    const bool model = extra.rfind(" --model ", 0) == 0, preset = extra.rfind(" --model llama-mini", 0) == 0;
    return " train --task lm --data " + dir_ + "/train.bin --val-data " + dir_ + "/val.bin --vocab-size 96" +
           (model ? "" : " --model custom") +
           (preset ? "" : " --layers " + std::to_string(layers) + " --dim 32 --heads 4") +
           " --context 16 --batch-size " + std::to_string(batch) + " --accumulate " + std::to_string(accumulate) +
           " --max-steps 20 --warmup-steps 5 --lr 0.01 --weight-decay 0.1 --grad-clip 0.5 "
           "--eval-every 10 --eval-batches 2 --log-every-n-steps 1 --threads 1 --tensorboard false --run-dir " +
           dir_ + "/" + run + extra;
  }
  std::string train(int ranks, int64_t batch, const std::string& run, const std::string& extra = "") const {
    const std::string command = (ranks == 1 ? std::string() : mpirun(ranks)) + FT_CLI_PATH + flags(batch, run, extra);
    const test::CliRun r = run_command(command);
    EXPECT_EQ(r.code, 0) << command << "\n" << r.output;
    return r.output;
  }
  // Column `col` of the rows of `split` (train, val) in a run's metrics.csv.
  std::vector<double> column(const std::string& run, const std::string& split, size_t col) const {
    std::ifstream f(dir_ + "/" + run + "/metrics.csv");
    std::vector<double> out;
    std::string line;
    while (std::getline(f, line)) {
      std::vector<std::string> cols;
      std::stringstream ss(line);
      for (std::string c; std::getline(ss, c, ',');) cols.push_back(c);
      if (cols.size() > col && cols[2] == split) out.push_back(std::stod(cols[col]));
    }
    return out;
  }
  // The gradient norm before clipping, per step.
  std::vector<double> grad_norms(const std::string& run) const { return column(run, "train", 7); }
  // The validation losses (steps 10 and 20), evaluated forward through the stages under --pp.
  std::vector<double> val_losses(const std::string& run) const { return column(run, "val", 3); }

  std::string dir_;
};

// The tied head's copy on the last stage and the embedding of the first: equal in every bit.
void expect_tied_copies_equal(const std::string& dir, const std::string& embedding) {
  const SafetensorsFile f = load_safetensors(dir + "/model.safetensors");
  Tensor e, h;
  for (const auto& [name, t] : f.tensors) {
    if (name == embedding) e = t;
    if (name == "lm_head.weight") h = t;
  }
  ASSERT_TRUE(e.defined() && h.defined()) << dir;
  EXPECT_EQ(e.to_vector(), h.to_vector()) << dir << ": the head's copy of the embedding drifted";
}

TEST_F(PipelineCli, TwentyGptStepsWithPp2Tp2xPp2AndDp2xPp2EqualOneProcessAndResumeAtOtherLayouts) {
  train(1, 8, "one");
  const std::vector<double> reference = train_losses(dir_ + "/one");
  ASSERT_EQ(reference.size(), 20u);
  EXPECT_LT(reference.back(), reference.front());  // it learns
  const std::vector<double> norms = grad_norms("one");
  EXPECT_GT(*std::max_element(norms.begin(), norms.end()), 0.5);  // clipping acted

  const std::string gpipe = train(2, 8, "gpipe", " --pp 2 --pp-schedule gpipe");
  EXPECT_NE(gpipe.find("pipeline parallel: tp 1 x dp 1 x pp 2 (world 2), schedule gpipe over 4 micro-batches"),
            std::string::npos)
      << gpipe;
  EXPECT_NE(gpipe.find("pipeline bubble (gpipe, p = 2, m = 4): formula (p-1)/(m+p-1) = 0.200"), std::string::npos)
      << gpipe;
  // Each step 4 activations of 8 x 16 x 32 f32 one way and their gradients back: 2 m B T C 4 bytes.
  EXPECT_NE(gpipe.find("bytes per step per stage boundary 131072 (formula 2 m B T C bytes = 131072)"),
            std::string::npos)
      << gpipe;
  expect_losses_close(train_losses(dir_ + "/gpipe"), reference, 1e-6);
  expect_model_close(dir_ + "/gpipe", dir_ + "/one", 5e-6, 32);
  expect_tied_copies_equal(dir_ + "/gpipe", "transformer.wte.weight");
  expect_losses_close(val_losses("gpipe"), val_losses("one"), 1e-6);
  const std::vector<double> pp_norms = grad_norms("gpipe");  // the global norm over the stages
  for (size_t i = 0; i < norms.size() && i < pp_norms.size(); ++i)
    EXPECT_NEAR(pp_norms[i], norms[i], 1e-5 * norms[i]) << "step " << i + 1;

  train(2, 8, "1f1b", " --pp 2 --pp-schedule 1f1b --checkpoint-blocks true");  // blocks recomputed in backward
  expect_losses_close(train_losses(dir_ + "/1f1b"), reference, 1e-6);
  expect_model_close(dir_ + "/1f1b", dir_ + "/one", 5e-6, 32);

  // tp 2 x pp 2 on 4 ranks, saving at step 10: the whole model and optimizer state. Its weights
  // are compared with tp 2's, whose split products round differently from one process (a few
  // 1e-6 of some small tensors after 20 Adam steps, see test_tensor_parallel): the stages add
  // nothing to that.
  train(4, 8, "tp2pp2", " --tp 2 --pp 2 --checkpoint-every 10");
  expect_losses_close(train_losses(dir_ + "/tp2pp2"), reference, 1e-6);
  train(2, 8, "tp2", " --tp 2");
  expect_model_close(dir_ + "/tp2pp2", dir_ + "/tp2", 5e-6, 32);
  expect_tied_copies_equal(dir_ + "/tp2pp2", "transformer.wte.weight");

  train(4, 8, "pp4", " --pp 4");  // a block per stage: the middle stages receive and send both ways
  expect_losses_close(train_losses(dir_ + "/pp4"), reference, 1e-6);
  expect_model_close(dir_ + "/pp4", dir_ + "/one", 5e-6, 32);

  train(4, 4, "dp2pp2", " --pp 2");  // global batch 4 x 2 replicas
  expect_losses_close(train_losses(dir_ + "/dp2pp2"), reference, 1e-6);

  // Saved at (dp 1, tp 2, pp 2); resumed at (dp 2, tp 1, pp 2) and by one process.
  const std::string checkpoint = dir_ + "/tp2pp2/checkpoints/step-00000010";
  ASSERT_TRUE(fs::exists(checkpoint + "/optimizer.safetensors"));
  // (A resumed run takes the checkpoint's options unless given: --tp and --pp are.)
  train(4, 4, "resumed_dp2pp2", " --tp 1 --pp 2 --resume " + checkpoint);
  expect_losses_close(train_losses(dir_ + "/resumed_dp2pp2"), reference, 1e-6, 10);
  train(1, 8, "resumed_one", " --tp 1 --pp 1 --resume " + checkpoint);
  expect_losses_close(train_losses(dir_ + "/resumed_one"), reference, 1e-6, 10);
}

TEST_F(PipelineCli, TwentyLlamaStepsWithPipelineStagesEqualOneProcess) {
  // Grouped-query attention (4 heads, 2 key/value heads) with a tied head...
  const std::string tied = " --model llama --kv-heads 2 --ffn-dim 64 --rope-theta 10000";
  train(1, 8, "one", tied);
  const std::vector<double> reference = train_losses(dir_ + "/one");
  ASSERT_EQ(reference.size(), 20u);
  train(2, 8, "pp2", tied + " --pp 2 --pp-schedule gpipe");
  expect_losses_close(train_losses(dir_ + "/pp2"), reference, 1e-6);
  expect_model_close(dir_ + "/pp2", dir_ + "/one", 5e-6, 0);
  expect_tied_copies_equal(dir_ + "/pp2", "model.embed_tokens.weight");
  train(4, 8, "tp2pp2", tied + " --tp 2 --pp 2 --pp-layers 1,3");
  expect_losses_close(train_losses(dir_ + "/tp2pp2"), reference, 1e-6);
  train(2, 8, "tp2", tied + " --tp 2");  // the split products' rounding (see the GPT case)
  expect_model_close(dir_ + "/tp2pp2", dir_ + "/tp2", 5e-6, 0);
  // ... and llama-mini's untied head (8 heads sharing 2 key/value heads, width 256).
  const std::string untied = " --model llama-mini";
  train(1, 8, "one_untied", untied);
  const std::vector<double> untied_reference = train_losses(dir_ + "/one_untied");
  ASSERT_EQ(untied_reference.size(), 20u);
  train(2, 8, "pp2_untied", untied + " --pp 2");
  expect_losses_close(train_losses(dir_ + "/pp2_untied"), untied_reference, 1e-6);
  expect_model_close(dir_ + "/pp2_untied", dir_ + "/one_untied", 5e-6, 0);
}

TEST_F(PipelineCli, ZeroWithinTheDataGroupsOfPipelineStagesEqualsOneProcess) {
  // dp 2 x pp 2: each stage's parameters sharded over its data group of 2; the tied embedding's
  // two copies (first and last stage) have shards of their own, added over the pair.
  train(1, 8, "one");
  const std::vector<double> reference = train_losses(dir_ + "/one");
  ASSERT_EQ(reference.size(), 20u);
  const std::vector<double> norms = grad_norms("one");
  // DDP at the same layout: its per-rank validation batches (4 rows, not one process's 8) and
  // its weights, whose sums over the data group round unlike one process's, are what ZeRO's follow.
  train(4, 4, "dp2pp2_ddp", " --pp 2");
  expect_losses_close(train_losses(dir_ + "/dp2pp2_ddp"), reference, 1e-6);
  for (const char* strategy : {"zero1", "zero2", "zero3"}) {
    SCOPED_TRACE(strategy);
    const std::string run = std::string("dp2pp2_") + strategy;
    // zero2 also saves at step 10 (the whole model and the consolidated optimizer state).
    // zero3 recomputes its blocks in backward (after its block's parameters are gathered again).
    const std::string extra = std::string(strategy) == "zero2"   ? " --checkpoint-every 10"
                              : std::string(strategy) == "zero3" ? " --checkpoint-blocks true"
                                                                 : "";
    const std::string out = train(4, 4, run, " --pp 2 --strategy " + std::string(strategy) + extra);
    EXPECT_NE(out.find("micro-batches (" + std::string(strategy) + " over the data groups)"), std::string::npos) << out;
    expect_losses_close(train_losses(dir_ + "/" + run), reference, 1e-6);
    expect_model_close(dir_ + "/" + run, dir_ + "/dp2pp2_ddp", 5e-6, 32);
    expect_tied_copies_equal(dir_ + "/" + run, "transformer.wte.weight");
    expect_losses_close(val_losses(run), val_losses("dp2pp2_ddp"), 1e-6);
    const std::vector<double> got = grad_norms(run);  // the global norm over stages and shards
    ASSERT_EQ(got.size(), norms.size());
    for (size_t i = 0; i < norms.size(); ++i) EXPECT_NEAR(got[i], norms[i], 1e-5 * norms[i]) << "step " << i + 1;
  }
  // The zero2 checkpoint is one file per kind whatever the layout: one process resumes it, and so
  // does zero3 at dp 2 x pp 2 with the 1f1b schedule.
  const std::string checkpoint = dir_ + "/dp2pp2_zero2/checkpoints/step-00000010";
  ASSERT_TRUE(fs::exists(checkpoint + "/optimizer.safetensors"));
  train(1, 8, "resumed_one", " --pp 1 --strategy ddp --resume " + checkpoint);
  expect_losses_close(train_losses(dir_ + "/resumed_one"), reference, 1e-6, 10);
  train(4, 4, "resumed_zero3", " --pp 2 --pp-schedule 1f1b --strategy zero3 --resume " + checkpoint);
  expect_losses_close(train_losses(dir_ + "/resumed_zero3"), reference, 1e-6, 10);
}

TEST_F(PipelineCli, ZeroUnderPipelineStagesEqualsOneProcessForLlama) {
  const std::string tied = " --model llama --kv-heads 2 --ffn-dim 64 --rope-theta 10000";
  train(1, 8, "one", tied);
  const std::vector<double> reference = train_losses(dir_ + "/one");
  ASSERT_EQ(reference.size(), 20u);
  train(4, 4, "dp2pp2", tied + " --pp 2 --strategy zero3 --pp-layers 1,3");
  expect_losses_close(train_losses(dir_ + "/dp2pp2"), reference, 1e-6);
  expect_tied_copies_equal(dir_ + "/dp2pp2", "model.embed_tokens.weight");
  // The weights against DDP's at the layout (its data-group sums round as ZeRO's do).
  train(4, 4, "dp2pp2_ddp", tied + " --pp 2 --pp-layers 1,3");
  expect_model_close(dir_ + "/dp2pp2", dir_ + "/dp2pp2_ddp", 5e-6, 0);
}

TEST_F(PipelineCli, DropoutUnderPipelineStagesDrawsOneProcesssMasks) {
  // Each stage draws its blocks' masks at the counters one process's forward of that micro-batch
  // would use (the stages before it skipped), in GPipe's order and in 1F1B's interleaving, and
  // with blocks recomputed in backward.
  train(1, 8, "one", " --dropout 0.1");
  train(1, 8, "plain", "");
  const std::vector<double> reference = train_losses(dir_ + "/one"), plain = train_losses(dir_ + "/plain");
  ASSERT_EQ(reference.size(), 20u);
  ASSERT_EQ(plain.size(), 20u);
  EXPECT_GT(std::abs(reference.front() - plain.front()), 1e-3);  // dropout changes the run: the check says something
  train(2, 8, "gpipe", " --dropout 0.1 --pp 2 --pp-schedule gpipe");
  expect_losses_close(train_losses(dir_ + "/gpipe"), reference, 1e-6);
  expect_losses_close(val_losses("gpipe"), val_losses("one"), 1e-6);  // evaluation draws nothing
  train(2, 8, "1f1b", " --dropout 0.1 --pp 2 --pp-schedule 1f1b --checkpoint-blocks true --pp-layers 1,3");
  expect_losses_close(train_losses(dir_ + "/1f1b"), reference, 1e-6);
  train(4, 8, "pp4", " --dropout 0.1 --pp 4 --pp-schedule 1f1b");
  expect_losses_close(train_losses(dir_ + "/pp4"), reference, 1e-6);
  // Under tensor parallelism each rank draws its heads' part of the whole attention mask and
  // advances by all of it: the stages' counts are one process's. Compared with tp 2's run, whose
  // split products round unlike one process's (by a few 1e-6 after some steps with dropout).
  train(2, 8, "tp2", " --dropout 0.1 --tp 2");
  train(4, 8, "tp2pp2", " --dropout 0.1 --tp 2 --pp 2");
  expect_losses_close(train_losses(dir_ + "/tp2pp2"), train_losses(dir_ + "/tp2"), 1e-6);
}

TEST_F(PipelineCli, InitialWeightsLoadIntoEveryStage) {
  // A fasttrain weight file (a finished run's model) and a Hugging Face folder (a Llama with a
  // tied head, whose file holds the embedding only): every stage reads the whole and keeps its
  // blocks, the last stage its copy of the embedding; the stages train as one process does.
  train(1, 8, "base");
  const std::string file = " --init-from " + dir_ + "/base/model.safetensors";
  train(1, 8, "one", file);
  const std::vector<double> reference = train_losses(dir_ + "/one");
  ASSERT_EQ(reference.size(), 20u);
  EXPECT_LT(reference.front(), train_losses(dir_ + "/base").front());  // it starts from the trained weights
  train(2, 8, "pp2", file + " --pp 2");
  expect_losses_close(train_losses(dir_ + "/pp2"), reference, 1e-6);
  expect_tied_copies_equal(dir_ + "/pp2", "transformer.wte.weight");

  nn::LlamaConfig cfg;
  cfg.vocab_size = 96, cfg.context = 16, cfg.layers = 4, cfg.dim = 32, cfg.heads = 4, cfg.kv_heads = 2;
  cfg.ffn_dim = 64, cfg.tie_embeddings = true;
  Generator gen(11);
  nn::Llama model(cfg, &gen);
  nn::save_hf_folder(model, dir_ + "/hf", {.max_shard_bytes = 20'000});
  auto run = [&](int ranks, const std::string& name, const std::string& extra) {
    std::string command = (ranks == 1 ? std::string() : mpirun(ranks)) + FT_CLI_PATH +
                          flags(8, name, " --model llama --init-from " + dir_ + "/hf" + extra);
    command.erase(command.find(" --layers 4 --dim 32 --heads 4"), 30);  // the folder is the architecture
    const test::CliRun r = run_command(command);
    EXPECT_EQ(r.code, 0) << command << "\n" << r.output;
  };
  run(1, "hf_one", "");
  const std::vector<double> hf_reference = train_losses(dir_ + "/hf_one");
  ASSERT_EQ(hf_reference.size(), 20u);
  run(4, "hf_tp2pp2", " --tp 2 --pp 2");
  expect_losses_close(train_losses(dir_ + "/hf_tp2pp2"), hf_reference, 1e-6);
  expect_tied_copies_equal(dir_ + "/hf_tp2pp2", "model.embed_tokens.weight");
}

TEST_F(PipelineCli, TheBatchSizeFinderRunsThePipelineOnEveryStage) {
  // Each stage tries a whole step of its part (4 micro-batches held by GPipe) under one agreed
  // budget, the outcome agreed over the job. 256 MiB holds batches up to the cap of 16.
  std::string command =
      mpirun(2) + FT_CLI_PATH + flags(0, "auto", " --pp 2 --pp-schedule gpipe --memory-limit 256M --max-batch-size 16");
  command.replace(command.find("--batch-size 0"), 14, "--batch-size auto");
  command.replace(command.find("--max-steps 20"), 14, "--max-steps 3");
  const test::CliRun r = run_command(command);
  ASSERT_EQ(r.code, 0) << command << "\n" << r.output;
  EXPECT_NE(r.output.find("-> batch size 16 per rank"), std::string::npos) << r.output;
  EXPECT_EQ(train_losses(dir_ + "/auto").size(), 3u);
  // A budget too small for batches of 16 on some stage: every rank leaves the failed trial and
  // the job agrees on a smaller batch rather than waiting in a receive.
  std::string small = command;
  small.replace(small.find("--memory-limit 256M"), 19, "--memory-limit 3M  ");
  small.replace(small.find(dir_ + "/auto"), dir_.size() + 5, dir_ + "/smal");
  const test::CliRun s = run_command(small);
  ASSERT_EQ(s.code, 0) << small << "\n" << s.output;
  EXPECT_NE(s.output.find("out of memory"), std::string::npos) << s.output;
  EXPECT_EQ(s.output.find("-> batch size 16 per rank"), std::string::npos) << s.output;
  EXPECT_EQ(train_losses(dir_ + "/smal").size(), 3u);
}

TEST_F(PipelineCli, SequenceParallelStagesExchangeTheirPartOfTheSequence) {
  // tp 2 x pp 2 with sequence parallelism: each tensor rank's stages send its 8 of the 16
  // positions; with dropout (its parts of one process's masks, placed per stage), and without it
  // under ZeRO stage 2 over the data groups of dp 2 x tp 2 x pp 2 (8 ranks).
  train(1, 8, "one", " --dropout 0.1");
  const std::vector<double> reference = train_losses(dir_ + "/one");
  ASSERT_EQ(reference.size(), 20u);
  train(2, 8, "tp2", " --dropout 0.1 --tp 2 --sequence-parallel true");  // the split products' rounding
  const std::string out = train(4, 8, "sp", " --dropout 0.1 --tp 2 --pp 2 --sequence-parallel true");
  // Each step 4 activations of 8 x 8 x 32 f32 one way and their gradients back.
  EXPECT_NE(out.find("bytes per step per stage boundary 65536 (formula 2 m B T C bytes = 65536)"), std::string::npos)
      << out;
  expect_losses_close(train_losses(dir_ + "/sp"), train_losses(dir_ + "/tp2"), 1e-6);
  expect_losses_close(train_losses(dir_ + "/sp"), reference, 2e-5);
  expect_tied_copies_equal(dir_ + "/sp", "transformer.wte.weight");
  train(1, 8, "plain");
  train(8, 4, "sp_zero2", " --tp 2 --pp 2 --sequence-parallel true --strategy zero2");
  expect_losses_close(train_losses(dir_ + "/sp_zero2"), train_losses(dir_ + "/plain"), 1e-6);
  expect_tied_copies_equal(dir_ + "/sp_zero2", "transformer.wte.weight");
}

TEST_F(PipelineCli, TheDocumentMaskReachesEveryStage) {
  // Token 5 starts a document (vocab.json as `fasttrain data` writes it for GPT-2's tokenizer):
  // the windows carry document ids, which every stage's attention must see.
  {
    std::ofstream v(dir_ + "/vocab.json");
    v << R"({"vocab_size": 96, "mode": "gpt2", "eot_token": 5})";
  }
  train(1, 8, "one", " --doc-mask true");
  train(1, 8, "unmasked", " --doc-mask false");
  const std::vector<double> reference = train_losses(dir_ + "/one"), unmasked = train_losses(dir_ + "/unmasked");
  ASSERT_EQ(reference.size(), 20u);
  ASSERT_EQ(unmasked.size(), 20u);
  EXPECT_GT(std::abs(reference.back() - unmasked.back()), 1e-3);  // the mask changes the run: the check says something
  train(2, 8, "pp2", " --doc-mask true --pp 2");
  expect_losses_close(train_losses(dir_ + "/pp2"), reference, 1e-6);
}

TEST_F(PipelineCli, MixedPrecisionUnderPipelineMatchesOneProcess) {
  train(1, 8, "one", " --precision bf16-mixed");
  const std::vector<double> reference = train_losses(dir_ + "/one");
  ASSERT_EQ(reference.size(), 20u);
  train(2, 8, "pp2", " --precision bf16-mixed --pp 2 --checkpoint-blocks true");
  // bf16 products round to 8 bits of mantissa; the stages add the same products in the same
  // order, so the differences stay far below bf16's 2^-8 step.
  expect_losses_close(train_losses(dir_ + "/pp2"), reference, 4e-3);
  // fp16 with dynamic loss scaling: the scale (updated from the found-inf flag every stage
  // agrees on) follows one process's.
  train(1, 8, "one_fp16", " --precision fp16-mixed");
  train(2, 8, "pp2_fp16", " --precision fp16-mixed --pp 2");
  expect_losses_close(train_losses(dir_ + "/pp2_fp16"), train_losses(dir_ + "/one_fp16"), 4e-3);
  EXPECT_EQ(column("pp2_fp16", "train", 8), column("one_fp16", "train", 8));
  EXPECT_EQ(column("pp2_fp16", "train", 8).size(), 20u);
  // bf16-true: bf16 weights, so the activations and their gradients travel in bf16.
  train(1, 8, "one_bf16_true", " --precision bf16-true");
  train(2, 8, "pp2_bf16_true", " --precision bf16-true --pp 2");
  expect_losses_close(train_losses(dir_ + "/pp2_bf16_true"), train_losses(dir_ + "/one_bf16_true"), 4e-3);
}

TEST_F(PipelineCli, AProfiledPipelineShowsEachStagesWaitsAndTransfers) {
  // --profile under pp 2: rank 0's trace.json holds both stages, each with its training lane's
  // "pipeline wait" spans (the bubble: blocked on a neighbour) and its communication lane's
  // transfers in the pipeline group; the last stage waits for stage 0 to fill the pipeline.
  train(2, 8, "profiled", " --pp 2 --pp-schedule gpipe --profile 2:3");
  const nlohmann::json trace = nlohmann::json::parse(test::slurp(dir_ + "/profiled/profile/trace.json"));
  std::map<int, std::map<int, std::string>> lane_names;  // pid -> tid -> name
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "thread_name")
      lane_names[e.at("pid").get<int>()][e.at("tid").get<int>()] = e.at("args").at("name");
  std::map<int, int> waits, transfers;
  std::map<int, double> wait_us;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    const int pid = e.at("pid").get<int>();
    const std::string name = e.at("name"), lane = lane_names[pid][e.at("tid").get<int>()];
    if (name == "pipeline wait" && lane == "train") ++waits[pid], wait_us[pid] += e.at("dur").get<double>();
    if (e.at("cat") == "communication" && name.find("in the pipeline group") != std::string::npos &&
        (name.rfind("send", 0) == 0 || name.rfind("recv", 0) == 0))
      ++transfers[pid];
  }
  ASSERT_EQ(lane_names.size(), 2u) << "one process per stage";
  for (int rank : {0, 1}) {
    SCOPED_TRACE(rank);
    // 2 steps x 4 micro-batches, each an activation one way and a gradient back.
    EXPECT_GE(waits[rank], 2 * 4);
    EXPECT_GE(transfers[rank], 2 * 4);
    EXPECT_GT(wait_us[rank], 0.0);
  }
}

TEST_F(PipelineCli, LayoutsThatCannotWorkAreRefusedBeforeTheFirstStep) {
  struct Case {
    int ranks;
    std::string extra, message;
    int layers = 4, accumulate = 4;
  };
  for (const Case& c :
       {Case{4, " --pp 4", "pipeline parallelism: pp = 4 stages for GPT's 2 blocks", 2},
        Case{2, " --pp 2",
             "option pp_schedule: 1f1b with 1 micro-batches (accumulate) is fewer than the 2 pipeline stages (pp)", 4,
             1},
        Case{3, " --pp 2", "the world size 3 is not divisible by tp x pp = 1 x 2 = 2"},
        Case{2, " --pp 2 --pp-layers 3,3", "option pp_layers: expected 2 positive block counts"}}) {
    SCOPED_TRACE(c.extra);
    const std::string command =
        mpirun(c.ranks) + FT_CLI_PATH + flags(8, "refused", c.extra + " --dist-timeout 60", c.layers, c.accumulate);
    const test::CliRun r = run_command(command);
    EXPECT_NE(r.code, 0) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.message << "\n" << r.output;
    EXPECT_EQ(r.output.find("did not complete within"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir_ + "/refused/metrics.csv"));
  }
}

TEST_F(PipelineCli, ARankThatFailsOrHangsEndsTheJob) {
  // The last stage runs out of memory in its third backward (an ft::Error thrown there): the
  // job ends at once with its message, the first stage waiting in a receive or not.
  const std::string one = FT_CLI_PATH + flags(8, "failed", " --pp 2 --dist-timeout 60");
  // Two programs (mpirun's MPMD form): rank 1 alone gets the fault.
  const std::string launch = mpirun(1);
  const test::CliRun f = run_command(launch + one + " : -np 1 env FASTTRAIN_FAULT=oom@backward:3 " + one);
  EXPECT_NE(f.code, 0) << f.output;
  EXPECT_NE(f.output.find("fasttrain: rank 1 of 2: error: "), std::string::npos) << f.output;
  // The last stage stops (SIGSTOP) in its third backward: the first stage's receive outlives the
  // 3 s dist_timeout, and its watchdog ends the job naming the pipeline group.
  const std::string hang = FT_CLI_PATH + flags(8, "hung", " --pp 2 --dist-timeout 3");
  const test::CliRun h = run_command(launch + hang + " : -np 1 env FASTTRAIN_FAULT=stop@backward:3 " + hang);
  EXPECT_NE(h.code, 0) << h.output;
  EXPECT_NE(h.output.find("in the pipeline group"), std::string::npos) << h.output;
  EXPECT_NE(h.output.find("did not complete within 3 s (dist_timeout)"), std::string::npos) << h.output;
}

}  // namespace
}  // namespace ft
