// ZeRO stages 1, 2 and 3 (fasttrain/zero.h): jobs of 2 and 3 ranks started with mpirun (as in
// test_ddp.cpp) against one process and against DDP, through tests/dist/ddp_worker; the shards'
// bytes and the bytes communicated per step through tests/dist/zero_worker; and the strategies
// and optimizers ZeRO refuses, in one process.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "fasttrain/fasttrain.h"
#include "fasttrain/zero.h"
#include "support/expect_error.h"
#include "support/linear_block.h"
#include "support/mpi_job.h"
#include "support/run_cli.h"
#include "support/trainer_configs.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

using test::expect_weights_close;
using test::mpirun;
using test::slurp;
using test::train_losses;
// ddp_worker's 20 steps (AdamW, weight decay, cosine with warmup, clipping at 0.5, 2
// micro-batches, an unused parameter) with global batch 12, alone or under mpirun.
std::string train(const std::string& root, const std::string& name, int ranks, const std::string& strategy,
                  const std::string& extra = "", const std::string& cap_mb = "25") {
  const std::string dir = root + "/" + name;
  const std::string args = std::string(FT_DDP_WORKER) + " train " + dir + " 12 " + cap_mb + " 1 " + strategy + extra;
  const test::CliRun r = test::run_command(ranks == 1 ? args : mpirun(ranks) + args);
  EXPECT_EQ(r.code, 0) << r.output;
  return dir;
}

void expect_losses_close_n(const std::vector<double>& got, const std::vector<double>& want, double rel,
                           const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], rel * std::abs(want[i])) << what << ", step " << i + 1;
}

// ddp_worker's runs: 20 steps.
void expect_losses_close(const std::vector<double>& got, const std::vector<double>& want, double rel,
                         const std::string& what) {
  ASSERT_EQ(want.size(), 20u);
  expect_losses_close_n(got, want, rel, what);
}

TEST(Zero, EveryStageTrainsLikeOneProcessAndLikeDdp) {
  const std::string root = test::scratch_dir("zero", "equivalence");
  // Global batch 12: 12 x 1, 6 x 2 and 4 x 3 ranks; ranks start from different seeds (rank 0's
  // weights are broadcast). The unused parameter must keep no gradient under sharding either, or
  // AdamW's decay would move it and the weights would differ from the single process's.
  const std::string one = train(root, "one", 1, "ddp");
  const std::vector<double> reference = train_losses(one);
  for (int ranks : {2, 3}) {
    const std::string n = std::to_string(ranks);
    const std::string ddp = train(root, "ddp" + n, ranks, "ddp");
    for (const char* strategy : {"zero1", "zero2", "zero3"}) {
      const std::string dir = train(root, strategy + n, ranks, strategy);
      const std::string what = std::string(strategy) + " at " + n + " ranks";
      expect_losses_close(train_losses(dir), reference, 1e-6, what + " vs one process");
      expect_losses_close(train_losses(dir), train_losses(ddp), 1e-6, what + " vs ddp");
      expect_weights_close(dir, one, 1e-6);
      expect_weights_close(dir, ddp, 1e-6);
      // With 2 ranks every mean is (a + b) / 2 whatever MPI's algorithm, and clipping uses
      // DDP's f32 norm and factor: the same bits as DDP.
      if (ranks == 2) {
        EXPECT_EQ(train_losses(dir), train_losses(ddp)) << what;
        EXPECT_TRUE(slurp(dir + "/model.safetensors") == slurp(ddp + "/model.safetensors")) << what;
      }
      // The all-gathered parameters are the same bits on every rank before every micro-batch
      // (stage 3: the root's, gathered before the forward; the blocks' are gathered inside it).
      EXPECT_EQ(slurp(dir + "/replicas.txt"), "checks 40 mismatches 0\n") << what;
    }
  }
  fs::remove_all(root);
}

TEST(Zero, StageThreeUnderActivationCheckpointingAndAsFsdp) {
  const std::string root = test::scratch_dir("zero", "stage3");
  // Activation checkpointing recomputes each block inside its backward, after stage 3 gathered
  // the block's parameters again: the same results as one process without it. "fsdp" is stage 3.
  const std::string one = train(root, "one", 1, "ddp");
  const std::string ckpt = train(root, "zero3ckpt", 3, "zero3", " 0 - 32 0 1");
  expect_losses_close(train_losses(ckpt), train_losses(one), 1e-6, "zero3 with checkpointed blocks at 3 ranks");
  expect_weights_close(ckpt, one, 1e-6);
  const std::string fsdp = train(root, "fsdp", 2, "fsdp");
  const std::string zero3 = train(root, "zero3", 2, "zero3");
  EXPECT_EQ(train_losses(fsdp), train_losses(zero3));
  EXPECT_TRUE(slurp(fsdp + "/model.safetensors") == slurp(zero3 + "/model.safetensors"));
  fs::remove_all(root);
}

TEST(Zero, ACheckpointOfThreeRanksResumesAtTwoAndAtOneAndOneOfOneAtThree) {
  const std::string root = test::scratch_dir("zero", "reshard");
  // Stage 2 at 3 ranks with a checkpoint every 10 steps; resumed from step 10 at 2 ranks (stage
  // 1) and at 1 rank (no sharding): the state is consolidated from the 3 shards and cut anew.
  const std::string full = train(root, "full", 3, "zero2", " 10");
  const std::string ckpt = full + "/checkpoints/step-00000010";
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(fs::exists(ckpt + "/optimizer-rank-" + std::to_string(r) + "-of-3.safetensors")) << r;
  EXPECT_FALSE(fs::exists(ckpt + "/optimizer.safetensors"));
  EXPECT_FALSE(fs::exists(ckpt + ".tmp"));  // committed: the temporary folder renamed
  // The consolidated model: one file with every parameter whole.
  const SafetensorsFile model = load_safetensors(ckpt + "/model.safetensors");
  const SafetensorsFile final_model = load_safetensors(full + "/model.safetensors");
  ASSERT_EQ(model.tensors.size(), final_model.tensors.size());
  for (size_t i = 0; i < model.tensors.size(); ++i)
    EXPECT_EQ(model.tensors[i].second.shape(), final_model.tensors[i].second.shape()) << model.tensors[i].first;
  const std::vector<double> all = train_losses(full);
  ASSERT_EQ(all.size(), 20u);
  const std::vector<double> tail(all.begin() + 10, all.end());
  for (const auto& [ranks, strategy] :
       std::vector<std::pair<int, std::string>>{{2, "zero1"}, {1, "ddp"}, {2, "zero2"}, {2, "zero3"}}) {
    const std::string dir = train(root, "resumed" + std::to_string(ranks) + strategy, ranks, strategy, " 0 " + ckpt);
    const std::vector<double> got = train_losses(dir);
    ASSERT_EQ(got.size(), tail.size()) << dir;
    for (size_t i = 0; i < tail.size(); ++i)
      EXPECT_NEAR(got[i], tail[i], 1e-6 * std::abs(tail[i])) << dir << ", step " << i + 11;
    expect_weights_close(dir, full, 1e-6);
  }
  // And the other way: one process's checkpoint (optimizer.safetensors, unsharded) resumed by
  // 3 ranks under stage 2.
  const std::string one = train(root, "one", 1, "ddp", " 10");
  const std::string sharded = train(root, "one-resumed3", 3, "zero2", " 0 " + one + "/checkpoints/step-00000010");
  const std::vector<double> one_all = train_losses(one), got = train_losses(sharded);
  ASSERT_EQ(one_all.size(), 20u);
  ASSERT_EQ(got.size(), 10u);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], one_all[i + 10], 1e-6 * std::abs(one_all[i + 10])) << "step " << i + 11;
  expect_weights_close(sharded, one, 1e-6);
  // Stage 3 at 3 ranks (its groups are cut per block): its checkpoint resumes at 2 under stage 3
  // and in one process, with the losses of the uninterrupted run.
  const std::string full3 = train(root, "full3", 3, "zero3", " 10");
  const std::string ckpt3 = full3 + "/checkpoints/step-00000010";
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(fs::exists(ckpt3 + "/optimizer-rank-" + std::to_string(r) + "-of-3.safetensors")) << r;
  const std::vector<double> all3 = train_losses(full3);
  ASSERT_EQ(all3.size(), 20u);
  for (const auto& [ranks, strategy] : std::vector<std::pair<int, std::string>>{{2, "zero3"}, {1, "ddp"}}) {
    const std::string dir = train(root, "resumed3-" + std::to_string(ranks) + strategy, ranks, strategy, " 0 " + ckpt3);
    const std::vector<double> got3 = train_losses(dir);
    ASSERT_EQ(got3.size(), 10u) << dir;
    for (size_t i = 0; i < got3.size(); ++i)
      EXPECT_NEAR(got3[i], all3[i + 10], 1e-6 * std::abs(all3[i + 10])) << dir << ", step " << i + 11;
    expect_weights_close(dir, full3, 1e-6);
  }
  fs::remove_all(root);
}

TEST(Zero, MixedPrecisionAndLossScalingGiveDdpsResults) {
  const std::string root = test::scratch_dir("zero", "precision");
  // fp16-mixed runs GradScaler (its unscale_ sees only the shard; the skip decision is agreed
  // over the ranks), bf16-mixed autocast, bf16-true bf16 weights whose pieces get the
  // optimizer's f32 master as in DDP; 3 ranks, padded shards.
  for (const char* precision : {"fp16-mixed", "bf16-mixed", "bf16-true"}) {
    const std::string tail = std::string(" 0 - ") + precision;
    const std::string ddp = train(root, std::string("ddp") + precision, 3, "ddp", tail);
    for (const char* strategy : {"zero1", "zero2", "zero3"}) {
      const std::string dir = train(root, std::string(strategy) + precision, 3, strategy, tail);
      expect_losses_close(train_losses(dir), train_losses(ddp), 1e-6,
                          std::string(strategy) + " " + precision + " vs ddp");
      expect_weights_close(dir, ddp, 1e-6);
    }
  }
  fs::remove_all(root);
}

TEST(Zero, TinyBucketsAndAllGatherChunksGiveTheSameBits) {
  const std::string root = test::scratch_dir("zero", "chunks");
  // A cap of 0.0001 MiB (~100 bytes): stage 1 averages in a bucket per parameter, and both
  // stages all-gather in chunks of 13 values per rank, so parameters straddle chunks and chunks
  // straddle parameters. Every value is still the same sum and the same copy: the same bits.
  // Stage 1 at 2 ranks, where each mean is (a + b) / 2 whatever algorithm MPI picks for a bucket's
  // size; stage 2 (whose reduce-scatter does not depend on the cap) at 3, with padding.
  for (const auto& [strategy, ranks] : std::vector<std::pair<std::string, int>>{{"zero1", 2}, {"zero2", 3}}) {
    const std::string base = train(root, strategy + "cap25", ranks, strategy);
    const std::string tiny = train(root, strategy + "tiny", ranks, strategy, "", "0.0001");
    EXPECT_EQ(train_losses(tiny), train_losses(base)) << strategy;
    EXPECT_TRUE(slurp(tiny + "/model.safetensors") == slurp(base + "/model.safetensors")) << strategy;
    EXPECT_EQ(slurp(tiny + "/replicas.txt"), "checks 40 mismatches 0\n") << strategy;
  }
  fs::remove_all(root);
}

// zero_worker's rank<R>.txt as key -> value.
std::map<std::string, int64_t> accounting(const std::string& dir, int rank) {
  std::ifstream f(dir + "/rank" + std::to_string(rank) + ".txt");
  std::map<std::string, int64_t> m;
  std::string key;
  int64_t value = 0;
  while (f >> key >> value) m[key] = value;
  return m;
}

TEST(Zero, ShardBytesAndBytesPerStepFollowTheZeroFormulas) {
  const std::string root = test::scratch_dir("zero", "bytes");
  // zero_worker's model: Ψ = 66 parameters in 4 tensors, groups of 56 (weights) and 10 (biases);
  // under stage 3 cut per unit: the root (b: 21 weights, 3 biases) and the block (a: 35, 7).
  const int64_t psi = 66, tensors = 4, f32 = 4, adam_k = 2 * f32;  // K = 8 bytes per element (exp_avg, exp_avg_sq)
  for (int ranks : {2, 3}) {
    for (int stage : {1, 2, 3}) {
      // Each group padded to a multiple of N: stages 1 and 2, N = 2: 56 + 10; N = 3: 57 + 12.
      // Stage 3, N = 2: 22 + 4 (root) + 36 + 8 (block); N = 3: 21 + 3 + 36 + 9.
      const int64_t block_shard = stage == 3 ? (ranks == 2 ? 18 + 4 : 12 + 3) : 0;
      const int64_t shard = stage == 3 ? (ranks == 2 ? 11 + 2 : 7 + 1) + block_shard : (ranks == 2 ? 28 + 5 : 19 + 4);
      const std::string dir = root + "/s" + std::to_string(stage) + "n" + std::to_string(ranks);
      fs::create_directories(dir);
      const test::CliRun r =
          test::run_command(mpirun(ranks) + FT_ZERO_WORKER + " " + dir + " " + std::to_string(stage));
      ASSERT_EQ(r.code, 0) << r.output;
      int64_t state_sum = 0;
      for (int rank = 0; rank < ranks; ++rank) {
        auto m = accounting(dir, rank);
        const std::string what =
            "stage " + std::to_string(stage) + ", rank " + std::to_string(rank) + " of " + std::to_string(ranks);
        EXPECT_EQ(m["psi"], psi) << what;
        EXPECT_EQ(m["shard"], shard) << what;
        EXPECT_EQ(m["padded"], shard * ranks) << what;
        // Optimizer state: K Ψ / N per rank (padding holds none: the ranks' sum is exactly K Ψ).
        EXPECT_LE(m["state"], adam_k * shard) << what;
        if (stage < 3) EXPECT_GE(m["state"], adam_k * (shard - ranks)) << what;
        state_sum += m["state"];
        if (stage >= 2) {
          // Only the shard's gradient is kept after the step: 4 Ψ / N bytes.
          EXPECT_EQ(m["grad"], f32 * shard) << what;
        } else {
          // Stage 1 keeps DDP's full gradient buckets (Ψ values plus a used flag per tensor) besides
          // the shard's copy.
          EXPECT_EQ(m["grad"], f32 * (psi + tensors) + f32 * shard) << what;
        }
        // Parameters between steps: the whole model (stages 1, 2), the shard alone (stage 3).
        EXPECT_EQ(m["param"], stage == 3 ? f32 * shard : f32 * psi) << what;
        // Bytes issued in one step (each collective counts its input once; the norm is one f64):
        //   stage 1: all-reduce Ψ (+ flags), all-gather of the shard Ψ/N;
        //   stage 2: reduce-scatter of the padded Ψ, the flags, all-gather Ψ/N;
        //   stage 3: all-gather Ψ/N before forward (every unit), again Ψ_block/N before the
        //            block's backward, reduce-scatter of the padded Ψ, the flags.
        // In a ring, reduce-scatter of Ψ and all-gather into Ψ each move Ψ (N-1)/N per rank:
        // stage 2's 2Ψ; stage 1's all-reduce is itself 2Ψ, plus the all-gather's Ψ; stage 3's
        // 2Ψ + Ψ_block (3Ψ when every parameter is in a block).
        const int64_t expected = stage == 1 ? f32 * (psi + tensors) + 8 + f32 * shard
                                 : stage == 2
                                     ? f32 * shard * ranks + f32 * tensors + 8 + f32 * shard
                                     : f32 * shard + f32 * block_shard + f32 * shard * ranks + f32 * tensors + 8;
        EXPECT_EQ(m["issued"], expected) << what;
      }
      EXPECT_EQ(state_sum, adam_k * psi) << "stage " << stage << " at " << ranks << " ranks";
    }
  }
  fs::remove_all(root);
}

TEST(Zero, AnOverflowInOneRanksShardSkipsTheStepOnEveryRank) {
  const std::string root = test::scratch_dir("zero", "overflow");
  // fp16-mixed, 3 ranks: in step 2 one gradient element is inf on rank 0, and after the
  // reduce-scatter only its owner (rank 2) sees it. Every rank must skip that step, as DDP's
  // ranks (which all see it) do: the same weights and loss scale after 4 steps.
  std::vector<std::string> weights;
  for (int stage : {0, 1, 2, 3}) {
    const std::string dir = root + "/s" + std::to_string(stage);
    fs::create_directories(dir);
    const test::CliRun r =
        test::run_command(mpirun(3) + FT_ZERO_WORKER + " " + dir + " " + std::to_string(stage) + " inf");
    ASSERT_EQ(r.code, 0) << r.output;
    weights.push_back(slurp(dir + "/weights.txt"));
  }
  ASSERT_FALSE(weights[0].empty());
  // The scale went down from its initial 2^16: the overflow was seen (and the step skipped).
  EXPECT_EQ(weights[0].find("scale 65536\n"), std::string::npos) << weights[0];
  EXPECT_NE(weights[0].find("scale "), std::string::npos) << weights[0];
  EXPECT_EQ(weights[1], weights[0]) << "stage 1";
  EXPECT_EQ(weights[2], weights[0]) << "stage 2";
  EXPECT_EQ(weights[3], weights[0]) << "stage 3";
  fs::remove_all(root);
}

TEST(Zero, TrustRatioOptimizersAndUnknownStagesAreClearErrors) {
  for (const char* s : {"zero1", "zero2", "zero3", "fsdp"}) {
    train::TrainerConfig c;
    train::set_field(c, "strategy", s);
    EXPECT_NO_THROW(c.validate()) << s;
    EXPECT_EQ(name_of(c.dist.strategy), std::string(s));
  }
  train::TrainerConfig bad;
  expect_error([&] { train::set_field(bad, "strategy", "zero4"); },
               "expected ddp, zero1, zero2, zero3 or fsdp, found 'zero4'");
  Generator gen(1);
  nn::Linear layer(3, 2, true, &gen);
  optim::GroupOptions o;
  auto lamb = optim::make_lamb(optim::decay_groups(layer.named_parameters(), o));
  expect_error([&] { dist::ZeroSharding zero(layer, *lamb, dist::single_process(), 1); },
               "expected an element-wise optimizer (adamw, adam or sgd), found lamb");
  auto adamw = optim::make_adamw(optim::decay_groups(layer.named_parameters(), o));
  expect_error([&] { dist::ZeroSharding zero(layer, *adamw, dist::single_process(), 4); },
               "ZeRO: expected stage 1, 2 or 3, found 4");

  // The shards are views of the parameters: converting the model afterwards is caught at the
  // next step instead of training memory nobody reads.
  dist::ZeroSharding zero(layer, *adamw, dist::single_process(), 2);
  layer.to(DType::BF16);
  zero.before_backward(true);
  zero.after_backward(true);
  expect_error([&] { zero.finish(); }, "was given new memory (bf16) after sharding (f32 view)");
}

// Two blocks and a root layer, for stage 3 in one process.
class Stage3Net : public nn::Module {
 public:
  explicit Stage3Net(Generator* gen) {
    first = register_module("first", std::make_shared<test::LinearBlock>(4, 6, gen));
    second = register_module("second", std::make_shared<test::LinearBlock>(6, 5, gen));
    head = register_module("head", std::make_shared<nn::Linear>(5, 2, true, gen));
  }
  std::string type_name() const override { return "Stage3Net"; }
  Tensor forward(const Tensor& x) { return head->forward(tanh((*second)(tanh((*first)(x))))); }
  std::shared_ptr<test::LinearBlock> first, second;
  std::shared_ptr<nn::Linear> head;
};

void expect_values_close(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6 * std::abs(want[i]) + 1e-9) << what;
}

TEST(Zero, StageThreeReleasesParametersBetweenUsesAndStepsLikeTheUnshardedOptimizer) {
  // A world of one: every gather returns the rank's own shard, so the arithmetic is the unsharded
  // optimizer's (the clipping norm summed in f64, to rounding), while the parameters' memory is
  // released between uses.
  Generator g1(3), g2(3);
  Stage3Net sharded_net(&g1), plain_net(&g2);
  optim::GroupOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  auto full = optim::make_adamw(optim::decay_groups(sharded_net.named_parameters(), o));
  auto plain = optim::make_adamw(optim::decay_groups(plain_net.named_parameters(), o));
  auto zero = std::make_unique<dist::ZeroSharding>(sharded_net, *full, dist::single_process(), 3);
  auto shard_opt = zero->make_shard_optimizer();
  train::StepOptions so;
  so.clip = 0.5;
  so.accumulate = 2;
  train::StepRunner runner(sharded_net, *shard_opt, so), reference(plain_net, *plain, so);
  runner.set_grad_sync(zero.get());
  // Between steps only the shard holds parameter values: reading one is a clear error.
  for (const Tensor& p : sharded_net.parameters()) EXPECT_EQ(p.storage()->ptr(), nullptr);
  expect_error([&] { (void)sharded_net.first->weight.to_vector(); }, "its memory is released");
  EXPECT_EQ(zero->parameter_bytes(sharded_net), 4 * sharded_net.num_parameters());  // the shard (N = 1)
  Generator data(9);
  for (int step = 0; step < 3; ++step) {
    std::vector<Tensor> xs = {randn({3, 4}, {}, &data), randn({3, 4}, {}, &data)};
    for (const Tensor& x : xs) {
      auto loss_of = [&](Stage3Net& net) { return [&net, &x] { return mean(square(net.forward(x))); }; };
      const Tensor a = runner.forward_backward(loss_of(sharded_net));
      const Tensor b = reference.forward_backward(loss_of(plain_net));
      EXPECT_NEAR(a.item<double>(), b.item<double>(), 1e-6 * std::abs(b.item<double>())) << "step " << step;
      // After a backward every block is released again.
      EXPECT_EQ(sharded_net.second->weight.storage()->ptr(), nullptr);
    }
    runner.optimizer_step();
    reference.optimizer_step();
  }
  {
    const dist::GatheredParameters whole(zero.get());
    const TensorMap got = sharded_net.state_dict(), want = plain_net.state_dict();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      expect_values_close(got[i].second.to_vector(), want[i].second.to_vector(), got[i].first);
  }
  EXPECT_EQ(sharded_net.head->weight.storage()->ptr(), nullptr);  // released at the scope's end
  // Evaluation without autograd: each block gathered for its forward only.
  zero->before_forward();
  {
    autograd::NoGradGuard no_grad;
    const Tensor x = randn({2, 4}, {}, &data);
    expect_values_close(sharded_net.forward(x).to_vector(), plain_net.forward(x).to_vector(), "evaluation");
  }
  zero->release_all();
  // A step taken while the whole model is held (as after fit()) refreshes it: the held parameters
  // are the updated ones, not those from before the step.
  {
    const dist::GatheredParameters whole(zero.get());
    const Tensor x = randn({3, 4}, {}, &data);
    for (int micro = 0; micro < 2; ++micro) {
      runner.forward_backward([&] { return mean(square(sharded_net.forward(x))); });
      reference.forward_backward([&] { return mean(square(plain_net.forward(x))); });
    }
    runner.optimizer_step();
    reference.optimizer_step();
    const TensorMap got = sharded_net.state_dict(), want = plain_net.state_dict();
    for (size_t i = 0; i < got.size(); ++i)
      expect_values_close(got[i].second.to_vector(), want[i].second.to_vector(), "held: " + got[i].first);
  }
  // Destroyed, the sharding leaves no hooks behind on the blocks.
  zero.reset();
  EXPECT_EQ(sharded_net.first->hooks(), nullptr);
}

// The Llama family through the program (issue 42): the lm task's Llama (grouped-query attention,
// rotary embeddings, the gated MLP, RMSNorm; its blocks are CheckpointableBlocks) trains under
// DDP and every ZeRO stage, 2 ranks of batch 4, as one process of batch 8; stage 3 with its blocks
// checkpointed too; and bf16-mixed under stage 3 as under DDP.
TEST(Zero, ALlamaTrainsUnderEveryStageAsOneProcess) {
  const std::string root = test::scratch_dir("zero", "llama");
  fs::create_directories(root);
  {
    std::ofstream corpus(root + "/corpus.txt");
    const char* sentences[] = {"the cat sat on the mat. ", "a dog ran in the park. ", "we like green tea. "};
    for (int i = 0; i < 2000; ++i) corpus << sentences[(i * 7 + i / 3) % 3];
  }
  const test::CliRun data =
      test::run_command(std::string(FT_CLI_PATH) + " data --input " + root + "/corpus.txt --output " + root +
                        "/shards --vocab char --shard-tokens 30000");
  ASSERT_EQ(data.code, 0) << data.output;
  const std::string flags = std::string(FT_CLI_PATH) + " train --task lm --data " + root +
                            "/shards/tokens_000000.bin --val-data " + root +
                            "/shards/tokens_000001.bin --model llama --layers 2 --dim 32 --heads 2 --kv-heads 1 "
                            "--context 16 --max-steps 6 --lr 0.01 --warmup-steps 2 --grad-clip 0.5 "
                            "--log-every-n-steps 1 --eval-every 0 --eval-batches 0 --threads 1 --progress false";
  auto run = [&](const std::string& name, int ranks, const std::string& extra) {
    const std::string dir = root + "/" + name;
    const std::string batch = ranks == 1 ? " --batch-size 8" : " --batch-size 4";
    const test::CliRun r =
        test::run_command((ranks == 1 ? "" : mpirun(ranks)) + flags + batch + extra + " --run-dir " + dir);
    EXPECT_EQ(r.code, 0) << name << ": " << r.output;
    return dir;
  };
  const std::string one = run("one", 1, "");
  ASSERT_EQ(train_losses(one).size(), 6u);
  // Two ranks average two means of 4 where one process takes the mean of 8: gradients differ by
  // roundings, which AdamW's normalised first steps carry into weights whose gradients are near
  // zero (up to 2e-5 of the largest weight here). The losses agree to 1e-6; the stages agree
  // with DDP to 1e-6 in the weights too, since they reduce alike.
  const std::string ddp = run("ddp", 2, " --strategy ddp");
  expect_losses_close_n(train_losses(ddp), train_losses(one), 1e-6, "ddp vs one process");
  expect_weights_close(ddp, one, 1e-4);
  for (const char* strategy : {"zero1", "zero2", "zero3"}) {
    const std::string dir = run(strategy, 2, std::string(" --strategy ") + strategy);
    expect_losses_close_n(train_losses(dir), train_losses(one), 1e-6, std::string(strategy) + " vs one process");
    expect_weights_close(dir, ddp, 1e-6);
  }
  const std::string ckpt = run("zero3-checkpointed", 2, " --strategy zero3 --checkpoint-blocks");
  expect_losses_close_n(train_losses(ckpt), train_losses(one), 1e-6, "zero3 with checkpointed blocks");
  expect_weights_close(ckpt, ddp, 1e-6);
  const std::string bf16_ddp = run("bf16-ddp", 2, " --strategy ddp --precision bf16-mixed");
  const std::string bf16_zero3 = run("bf16-zero3", 2, " --strategy zero3 --precision bf16-mixed");
  expect_losses_close_n(train_losses(bf16_zero3), train_losses(bf16_ddp), 1e-6, "bf16-mixed zero3 vs ddp");
  expect_weights_close(bf16_zero3, bf16_ddp, 1e-6);
  fs::remove_all(root);
}

}  // namespace
}  // namespace ft
