// Data-parallel training (src/dist, src/train/distributed.cpp): jobs of 2 and 3 ranks started
// with mpirun (--oversubscribe: the CI machine has 2 cores; --allow-run-as-root: it runs as root)
// against one process, through tests/dist/ddp_worker (a model and data of its own trained by
// Trainer::fit) and the fasttrain program; and DDP's bucketing in one process.
//
// (tests/support/mpi_job.h: the mpirun prefix, and ASan's leak check off in the ranks only.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/switches.h"
#include "dist/host_staging.h"
#include "fasttrain/ddp.h"
#include "fasttrain/fasttrain.h"
#include "support/expect_error.h"
#include "support/mpi_job.h"
#include "support/pretend_communicator.h"
#include "support/trainer_configs.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

using test::expect_weights_close;
using test::mpirun;
using test::run_command;
using test::slurp;
using test::train_losses;

// Trains with the worker: alone for ranks == 1, else under mpirun; returns the run folder.
std::string train(const std::string& root, const std::string& name, int ranks, const std::string& cap_mb,
                  bool seed_per_rank = true) {
  const std::string dir = root + "/" + name;
  const std::string args = std::string(FT_DDP_WORKER) + " train " + dir + " 12 " + cap_mb + (seed_per_rank ? " 1" : "");
  const test::CliRun r = run_command(ranks == 1 ? args : mpirun(ranks) + args);
  EXPECT_EQ(r.code, 0) << r.output;
  return dir;
}

void expect_losses_close(const std::vector<double>& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.size(), 20u);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], rel * std::abs(want[i])) << "step " << i + 1;
}

// Replicas compared before every micro-batch of 20 steps x 2 micro-batches: all equal.
void expect_replicas_identical(const std::string& dir) {
  EXPECT_EQ(slurp(dir + "/replicas.txt"), "checks 40 mismatches 0\n") << dir;
}

TEST(Ddp, TwoAndThreeRanksTrainLikeOneProcessWithTheGlobalBatch) {
  const std::string root = test::scratch_dir("ddp", "equivalence");
  // AdamW, weight decay, cosine with warmup, clipping at 0.5, 2 micro-batches per step (the
  // worker's config); global batch 12: 12 x 1, 6 x 2 and 4 x 3 ranks. The ranks start from
  // different seeds: DDP's broadcast must make them all rank 0's (= the single process's).
  const std::string one = train(root, "one", 1, "25", false);
  const std::vector<double> reference = train_losses(one);
  for (int ranks : {2, 3}) {
    const std::string dir = train(root, "ranks" + std::to_string(ranks), ranks, "25");
    expect_losses_close(train_losses(dir), reference, 1e-6);
    expect_weights_close(dir, one, 1e-6);
    expect_replicas_identical(dir);
  }
  // The parameter no forward uses got no gradient on any rank: AdamW's decay never touched it,
  // as in the single process (checked by the weights above); and it trained (loss fell).
  EXPECT_LT(reference.back(), reference.front());
  fs::remove_all(root);
}

// The staged path of GPU jobs (host_staging.h: device -> host -> MPI -> device), run on the CPU:
// FT_DIST_STAGING=always sends every collective of DDP (the broadcast of rank 0's weights, the
// buckets, the logged loss) through host copies. Copies change no bit: the run must equal the
// unstaged one exactly.
TEST(Ddp, CollectivesThroughHostCopiesChangeNoBit) {
  const std::string root = test::scratch_dir("ddp", "staged");
  const std::string plain = train(root, "plain", 2, "0.004");
  const std::string dir = root + "/staged";
  const test::CliRun r =
      run_command(mpirun(2) + "-x FT_DIST_STAGING=always " + FT_DDP_WORKER + " train " + dir + " 12 0.004 1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(train_losses(dir), train_losses(plain));
  EXPECT_TRUE(slurp(dir + "/model.safetensors") == slurp(plain + "/model.safetensors")) << "weights differ";
  expect_replicas_identical(dir);
  fs::remove_all(root);
}

TEST(Ddp, BucketCapsTinyDefaultAndUnboundedGiveIdenticalResults) {
  const std::string root = test::scratch_dir("ddp", "buckets");
  // 0.0001 MiB (~100 bytes): a bucket per parameter, and the 8 KiB weight larger than the cap;
  // 0.004 MiB: that weight alone, smaller ones grouped; 25: the default; 0: one bucket. With 2
  // ranks each element's mean is (a + b) / 2 whatever the buckets, so the bits must match.
  const std::string base = train(root, "cap25", 2, "25");
  const std::string model = slurp(base + "/model.safetensors");
  ASSERT_FALSE(model.empty());
  for (const char* cap : {"0.0001", "0.004", "0"}) {
    const std::string dir = train(root, std::string("cap") + cap, 2, cap);
    EXPECT_EQ(train_losses(dir), train_losses(base)) << "bucket_cap_mb " << cap;
    EXPECT_TRUE(slurp(dir + "/model.safetensors") == model) << "bucket_cap_mb " << cap << ": weights differ";
    expect_replicas_identical(dir);
  }
  fs::remove_all(root);
}

TEST(Ddp, ARankThatThrowsEndsEveryRankWithItsMessage) {
  const std::string root = test::scratch_dir("ddp", "fail");
  for (int ranks : {2, 3}) {
    const int failing = ranks - 1;
    const test::CliRun r = run_command(mpirun(ranks) + FT_DDP_WORKER + " fail " + root + "/r" + std::to_string(ranks) +
                                       " " + std::to_string(failing) + " 3");
    EXPECT_NE(r.code, 0) << r.output;
    const std::string expected = "fasttrain: rank " + std::to_string(failing) + " of " + std::to_string(ranks) +
                                 ": error: injected failure in training step 3";
    EXPECT_NE(r.output.find(expected), std::string::npos) << r.output;
  }
  fs::remove_all(root);
}

TEST(Ddp, ARankThatStopsCommunicatingTimesTheJobOut) {
  const std::string root = test::scratch_dir("ddp", "hang");
  // Rank 1 sleeps in step 3; rank 0's next collective outlives dist_timeout (3 s) and its
  // watchdog aborts the job, naming itself and the collective.
  const test::CliRun r = run_command(mpirun(2) + FT_DDP_WORKER + " hang " + root + " 1 3");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("fasttrain: rank 0 of 2: error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("did not complete within 3 s (dist_timeout)"), std::string::npos) << r.output;
  fs::remove_all(root);
}

TEST(Ddp, DropoutDrawsItsOwnMasksOnEveryRankAndResumesExactly) {
  const std::string root = test::scratch_dir("ddp", "dropout");
  // One process drops units of its global batch independently; ranks sharing one stream would
  // drop the same units of their own samples in every micro-batch. Each rank draws its own.
  auto job = [&](const std::string& name, const std::string& resume) {
    const std::string dir = root + "/" + name;
    const test::CliRun r =
        run_command(mpirun(2) + FT_DDP_WORKER + " train " + dir + " 12 25 1 ddp 10 " + resume + " 32 0.3");
    EXPECT_EQ(r.code, 0) << r.output;
    return dir;
  };
  const std::string full = job("full", "-");
  EXPECT_EQ(slurp(full + "/replicas.txt"), "checks 40 mismatches 0 same_masks 0\n");
  // Resumed at step 10, every rank continues its own stream: the losses of the uninterrupted run.
  const std::string resumed = job("resumed", full + "/checkpoints/step-00000010");
  const std::vector<double> all = train_losses(full), tail = train_losses(resumed);
  ASSERT_EQ(all.size(), 20u);
  ASSERT_EQ(tail.size(), 10u);
  for (size_t i = 0; i < tail.size(); ++i) EXPECT_EQ(tail[i], all[i + 10]) << "step " << i + 11;
  expect_weights_close(resumed, full, 0);
  fs::remove_all(root);
}

TEST(Ddp, TheBatchSizeFinderRunsOnEveryRankAndTheRanksAgreeOnTheSmallest) {
  const std::string root = test::scratch_dir("ddp", "batch-finder");
  const std::string flags =
      " train --batch-size auto --max-batch-size 512 --max-steps 2 --context 32 --layers 1 --dim 64 --heads 2 "
      "--train-chars 40000 --val-chars 4000 --eval-every 0 --threads 1 --tensorboard false --run-dir " +
      root;
  // The batch one process finds under 24 MiB, then the same budget on both ranks: the same batch
  // per rank, twice the global batch.
  const test::CliRun one = run_command(std::string(FT_CLI_PATH) + flags + "/one --memory-limit 24MiB");
  ASSERT_EQ(one.code, 0) << one.output;
  const size_t at = one.output.find("-> batch size ");
  ASSERT_NE(at, std::string::npos) << one.output;
  const int64_t b = std::stoll(one.output.substr(at + 14));
  ASSERT_GE(b, 8) << one.output;  // room to find a smaller one below
  const test::CliRun two = run_command(mpirun(2) + FT_CLI_PATH + flags + "/two --memory-limit 24MiB");
  ASSERT_EQ(two.code, 0) << two.output;
  EXPECT_NE(two.output.find("-> batch size " + std::to_string(b) + " per rank"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("global batch " + std::to_string(2 * b) + " x 1"), std::string::npos) << two.output;
  // Rank 1 with a quarter of the budget (mpirun's MPMD form): rank 0 searches past rank 1's
  // batch, and both take rank 1's, the smallest; rank 0 reports both.
  const test::CliRun mixed = run_command(mpirun(1) + FT_CLI_PATH + flags + "/mixed --memory-limit 24MiB : -np 1 " +
                                         FT_CLI_PATH + flags + "/mixed --memory-limit 6MiB");
  ASSERT_EQ(mixed.code, 0) << mixed.output;
  const size_t m = mixed.output.find("(the smallest any rank found; this rank's: " + std::to_string(b) + ")");
  ASSERT_NE(m, std::string::npos) << mixed.output;
  const size_t agreed_at = mixed.output.rfind("-> batch size ", m);
  ASSERT_NE(agreed_at, std::string::npos) << mixed.output;
  const int64_t agreed = std::stoll(mixed.output.substr(agreed_at + 14));
  EXPECT_GE(agreed, 1);
  EXPECT_LT(agreed, b);
  EXPECT_NE(mixed.output.find("global batch " + std::to_string(2 * agreed) + " x 1"), std::string::npos)
      << mixed.output;
  fs::remove_all(root);
}

TEST(Ddp, BenchUnderMpirunSplitsOneProcesssBatchAndReportsItsLoss) {
  // Each rank takes its rows of the batch one process would use; the mean of the ranks' losses is
  // that process's loss, step after step (the same weights, the same global gradient).
  auto field = [](const std::string& out, const std::string& key) {
    const size_t at = out.find("\"" + key + "\": ");
    EXPECT_NE(at, std::string::npos) << key << " in " << out;
    return at == std::string::npos ? 0.0 : std::stod(out.substr(at + key.size() + 4));
  };
  const std::string args =
      std::string(FT_CLI_PATH) + " bench --workload mlp --batch 8 --steps 3 --warmup 1 --threads 1";
  const test::CliRun one = run_command(args), two = run_command(mpirun(2) + args);
  ASSERT_EQ(one.code, 0) << one.output;
  ASSERT_EQ(two.code, 0) << two.output;
  EXPECT_NEAR(field(two.output, "loss"), field(one.output, "loss"), 1e-4 * std::abs(field(one.output, "loss")))
      << one.output << two.output;
  EXPECT_EQ(field(two.output, "model_flops"), field(one.output, "model_flops"));  // the job's step
  EXPECT_EQ(field(two.output, "world_size"), 2);
}

TEST(Ddp, TheDebugModeNamesACollectiveThatDiffersAcrossRanks) {
  const std::string root = test::scratch_dir("ddp", "debug");
  // In step 3 rank 1 all-gathers a checksum of 2 elements where the others gather 1 (size), or
  // skips that all-gather, so that its next collective is backward's first gradient bucket
  // (skip). With dist_debug every earlier collective agreed (the job reached step 3), and this
  // one fails on every rank, naming each rank's version, long before dist_timeout (120 s).
  struct Case {
    const char* mode;
    int ranks;
    std::vector<std::string> named;
  };
  for (const Case& c :
       {Case{"size",
             2,
             {"rank 0: collective #", ": all_gather of 1 i64 elements", "rank 1: collective #",
              ": all_gather of 2 i64 elements"}},
        Case{"size", 3, {"rank 2: collective #", ": all_gather of 1 i64 elements", ": all_gather of 2 i64 elements"}},
        Case{"skip", 2, {": all_gather of 1 i64 elements", ": all_reduce of ", " f32 elements (avg)"}}}) {
    SCOPED_TRACE(std::string(c.mode) + " at " + std::to_string(c.ranks) + " ranks");
    const test::CliRun r =
        run_command(mpirun(c.ranks) + FT_DDP_WORKER + " " + c.mode + " " + root + "/" + c.mode + " 1 3");
    EXPECT_NE(r.code, 0) << r.output;
    EXPECT_NE(r.output.find(": error: collectives differ across ranks (dist_debug)"), std::string::npos) << r.output;
    for (const std::string& what : c.named) EXPECT_NE(r.output.find(what), std::string::npos) << what << r.output;
    EXPECT_EQ(r.output.find("did not complete within"), std::string::npos) << r.output;
  }
  fs::remove_all(root);
}

TEST(Ddp, TheProgramTrainsAndResumesUnderMpirunAndOnlyRankZeroReports) {
  const std::string dir = test::scratch_dir("ddp", "cli");
  const std::string flags =
      " train --max-steps 6 --batch-size 4 --context 16 --layers 1 --dim 32 --heads 2 --train-chars 20000 "
      "--val-chars 4000 --eval-every 3 --eval-batches 2 --log-every-n-steps 3 --checkpoint-every 3 --threads 1 "
      "--run-dir " +
      dir;
  const test::CliRun r = run_command(mpirun(2) + FT_CLI_PATH + flags);
  ASSERT_EQ(r.code, 0) << r.output;
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = r.output.find(what); at != std::string::npos; at = r.output.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("done: 6 steps"), 1u) << r.output;
  EXPECT_EQ(count("data parallel: 2 ranks (ddp), global batch 8 x 1"), 1u) << r.output;
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors"));
  EXPECT_TRUE(fs::exists(dir + "/checkpoints/step-00000006/trainer_state.json"));
  EXPECT_EQ(train_losses(dir).size(), 2u);  // steps 3 and 6, once each: one writer

  // Resumed from rank 0's checkpoint at step 3, both ranks continue exactly: step 6 logs the
  // loss of the uninterrupted run, bit for bit.
  const std::string resumed = dir + "_resumed";
  const test::CliRun again = run_command(mpirun(2) + FT_CLI_PATH + flags.substr(0, flags.find(" --run-dir")) +
                                         " --run-dir " + resumed + " --resume " + dir + "/checkpoints/step-00000003");
  ASSERT_EQ(again.code, 0) << again.output;
  const std::vector<double> resumed_losses = train_losses(resumed);
  ASSERT_EQ(resumed_losses.size(), 1u);
  EXPECT_EQ(resumed_losses[0], train_losses(dir)[1]);
  const std::vector<double> ddp_losses = train_losses(dir);
  fs::remove_all(resumed);
  fs::remove_all(dir);

  // The same run under ZeRO stage 3 (the GPT's transformer block gathered around its forward and
  // backward, the embeddings as the root): the losses of DDP, one report.
  const test::CliRun zero = run_command(mpirun(2) + FT_CLI_PATH + flags + " --strategy zero3");
  ASSERT_EQ(zero.code, 0) << zero.output;
  EXPECT_NE(zero.output.find("data parallel: 2 ranks (zero3), global batch 8 x 1"), std::string::npos) << zero.output;
  const std::vector<double> zero_losses = train_losses(dir);
  ASSERT_EQ(zero_losses.size(), ddp_losses.size());
  for (size_t i = 0; i < zero_losses.size(); ++i)
    EXPECT_NEAR(zero_losses[i], ddp_losses[i], 1e-6 * std::abs(ddp_losses[i])) << "log " << i;
  EXPECT_TRUE(fs::exists(dir + "/checkpoints/step-00000006/optimizer-rank-1-of-2.safetensors"));
  fs::remove_all(dir);
}

// fp8-mixed under DDP: the ranks quantize different micro-batches, so their amaxes differ; they
// agree on the maximum before every scale update (GradSync::agree_fp8_amax), which is what lets
// both ranks resume from rank 0's checkpointed scales and continue exactly.
// The same under ZeRO stage 3 (its own GradSync).
TEST(Ddp, Fp8ReplicasAgreeOnTheirScalesAndResumeExactly) {
  for (const char* strategy : {"ddp", "zero3"}) {
    SCOPED_TRACE(strategy);
    const std::string dir = test::scratch_dir("ddp", std::string("fp8_") + strategy);
    const std::string flags =
        std::string(" train --strategy ") + strategy +
        " --precision fp8-mixed --fp8-amax-history 4 --max-steps 6 --batch-size 4 --context 16 --layers 1 "
        "--dim 32 --heads 2 --train-chars 20000 --val-chars 4000 --eval-every 6 --eval-batches 2 "
        "--log-every-n-steps 1 --checkpoint-every 3 --threads 1 --run-dir ";
    const test::CliRun r = run_command(mpirun(2) + FT_CLI_PATH + flags + dir);
    ASSERT_EQ(r.code, 0) << r.output;
    const std::string resumed = dir + "_resumed";
    const test::CliRun again =
        run_command(mpirun(2) + FT_CLI_PATH + flags + resumed + " --resume " + dir + "/checkpoints/step-00000003");
    ASSERT_EQ(again.code, 0) << again.output;
    const std::vector<double> all = train_losses(dir), tail = train_losses(resumed);
    ASSERT_EQ(all.size(), 6u);
    ASSERT_EQ(tail.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(tail[i], all[i + 3]) << "step " << i + 4;
    fs::remove_all(resumed);
    fs::remove_all(dir);
  }
}

// One process: DDP over a world of one changes nothing, and its buckets follow the caps.
class Mlp : public nn::Module {
 public:
  explicit Mlp(Generator* gen) {
    a = register_module("a", std::make_shared<nn::Linear>(8, 16, true, gen));   // 128 + 16
    b = register_module("b", std::make_shared<nn::Linear>(16, 64, true, gen));  // 1024 + 64
    c = register_module("c", std::make_shared<nn::Linear>(64, 2, true, gen));   // 128 + 2 (unused)
  }
  std::string type_name() const override { return "Mlp"; }
  std::shared_ptr<nn::Linear> a, b, c;
};

TEST(Ddp, BucketsHoldParametersInReverseOrderUnderTheCaps) {
  Generator gen(3);
  Mlp m(&gen);
  const auto single = dist::single_process();
  // Reverse registration order: c.bias, c.weight, b.bias, b.weight, a.bias, a.weight.
  EXPECT_EQ(dist::DataParallel(m, single, {0, 1 << 20}).bucket_sizes(), (std::vector<int64_t>{1362}));
  // The first bucket capped at 600 bytes (150 floats): c.bias + c.weight; then a 4 KiB cap:
  // b.bias + b.weight (1088 floats > 1024: the weight alone would pass the cap, so b.bias closes
  // its bucket and b.weight has one of its own), then a.*.
  EXPECT_EQ(dist::DataParallel(m, single, {4096, 600}).bucket_sizes(), (std::vector<int64_t>{130, 64, 1024, 144}));
  // A cap below every parameter: one bucket each.
  EXPECT_EQ(dist::DataParallel(m, single, {4, 4}).bucket_sizes(), (std::vector<int64_t>{2, 128, 64, 1024, 16, 128}));
  // Per step: every gradient as f32 plus one used flag per parameter.
  EXPECT_EQ(dist::DataParallel(m, single, {}).bytes_per_step(), (1362 + 6) * 4);
}

TEST(Ddp, AWorldOfOneLeavesGradientsAsBackwardMadeThem) {
  Generator gen(5);
  Mlp m(&gen);
  Tensor x = randn({4, 8}, {}, &gen);
  auto loss = [&] { return sum(square(m.b->forward(m.a->forward(x)))); };
  loss().backward();
  std::vector<std::vector<double>> expected;
  for (const Tensor& p : m.parameters())
    expected.push_back(p.grad().defined() ? p.grad().to_vector() : std::vector<double>{});
  m.zero_grad();
  dist::DataParallel ddp(m, dist::single_process(), {8, 8});
  ddp.before_backward(true);
  loss().backward();
  ddp.after_backward(true);
  ddp.finish();
  const std::vector<Tensor> params = m.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    if (expected[i].empty()) {
      EXPECT_FALSE(params[i].grad().defined()) << "parameter " << i << " was not used: no gradient";
    } else {
      EXPECT_EQ(params[i].grad().to_vector(), expected[i]) << "parameter " << i;
    }
  }
}

// A communicator of two pretend ranks that records the tensors it is handed. Its collectives
// complete only at wait(), as an MPI collective on the communication thread may: an all-reduce
// doubles (the other rank holds the same values), a broadcast from rank 1 writes 7s, a gather or
// a receive writes 1, 2, 3, ...; `fail` makes wait() throw.
class RecordingCommunicator : public test::PretendTwoRanks {
 public:
  std::vector<const void*> seen;  // data pointers, in issue order
  bool fail = false;

  std::string backend() const override { return "recording"; }
  dist::WorkPtr broadcast_async(const Tensor& t, int root) override {
    return later(t, [t, root] {
      if (root != 0) t.detach().fill_(7);
    });
  }
  dist::WorkPtr all_reduce_async(const Tensor& t, dist::ReduceOp) override {
    return later(t, [t] { t.detach().copy_(mul(t, 2.0)); });
  }
  dist::WorkPtr reduce_scatter_async(const Tensor& input, const Tensor& output, dist::ReduceOp) override {
    seen.push_back(input.raw_data());
    return later(output, [input, output] { output.detach().copy_(mul(input.narrow(0, 0, output.numel()), 2.0)); });
  }
  dist::WorkPtr all_gather_async(const Tensor& input, const Tensor& output) override {
    seen.push_back(input.raw_data());
    return later(output, [output] { output.detach().copy_(count_up(output)); });
  }
  dist::WorkPtr barrier_async() override {
    return later(Tensor(), [] {});
  }
  dist::WorkPtr send_async(const Tensor& t, int) override {
    return later(t, [] {});
  }
  dist::WorkPtr recv_async(const Tensor& t, int) override {
    return later(t, [t] { t.detach().copy_(count_up(t)); });
  }

 private:
  struct Later : dist::Work {
    std::function<void()> run;
    bool fail = false, finished = false;
    void wait() override {
      if (fail) FT_FAIL("the collective failed");
      if (!finished) run();
      finished = true;
    }
    bool done() const override { return finished; }
  };
  static Tensor count_up(const Tensor& t) { return arange(1, static_cast<double>(t.numel()) + 1, 1, t.dtype()); }
  dist::WorkPtr later(const Tensor& t, std::function<void()> run) {
    if (t.defined()) seen.push_back(t.raw_data());
    auto w = std::make_shared<Later>();
    w->run = std::move(run);
    w->fail = fail;
    return w;
  }
};

// The staging wrapper: with FT_DIST_STAGING=always a CPU tensor is handed to the inner
// communicator as a host copy, is left alone until wait(), and gets the result then, once;
// without it, CPU tensors go straight through.
TEST(HostStaging, CollectivesRunOnHostCopiesAndResultsArriveAtWait) {
  auto inner = std::make_shared<RecordingCommunicator>();
  const auto staged = dist::with_host_staging(inner);
  {
    Tensor t = from_vector({1.0, 2.0, 3.0}, {3}, DType::F32);
    const dist::WorkPtr direct = staged->all_reduce_async(t, dist::ReduceOp::Sum);  // the default: not staged
    EXPECT_EQ(inner->seen.back(), t.raw_data());
    direct->wait();
    EXPECT_EQ(t.to_vector(), (std::vector<double>{2, 4, 6}));
  }
  switches::Scoped always(switches::dist_staging, switches::DistStaging::Always);
  Tensor t = from_vector({1.0, 2.0, 3.0}, {3}, DType::F32);
  dist::WorkPtr w = staged->all_reduce_async(t, dist::ReduceOp::Sum);
  EXPECT_NE(inner->seen.back(), t.raw_data());
  t.fill_(5);  // the staged copy was taken at issue: later writes do not travel
  w->wait();
  EXPECT_EQ(t.to_vector(), (std::vector<double>{2, 4, 6}));
  t.fill_(9);
  w->wait();  // a second wait copies nothing over
  EXPECT_EQ(t.to_vector(), (std::vector<double>{9, 9, 9}));

  Tensor whole = from_vector({1.0, 2.0, 3.0, 4.0}, {4}, DType::F32), part = zeros({2});
  staged->reduce_scatter_async(whole, part, dist::ReduceOp::Sum)->wait();
  EXPECT_EQ(part.to_vector(), (std::vector<double>{2, 4}));
  EXPECT_EQ(whole.to_vector(), (std::vector<double>{1, 2, 3, 4}));  // inputs are never written back
  Tensor gathered = zeros({4}, DType::I64);
  staged->all_gather_async(from_vector({0.0, 0.0}, {2}, DType::I64), gathered)->wait();
  EXPECT_EQ(gathered.to_vector(), (std::vector<double>{1, 2, 3, 4}));
  Tensor b = zeros({2});
  staged->broadcast_async(b, 1)->wait();
  EXPECT_EQ(b.to_vector(), (std::vector<double>{7, 7}));
  Tensor received = zeros({3});
  staged->recv_async(received, 1)->wait();
  EXPECT_EQ(received.to_vector(), (std::vector<double>{1, 2, 3}));
  const Tensor sent = from_vector({4.0, 5.0}, {2}, DType::F32);
  staged->send_async(sent, 1)->wait();
  EXPECT_NE(inner->seen.back(), sent.raw_data());
  EXPECT_EQ(sent.to_vector(), (std::vector<double>{4, 5}));

  // A collective that fails rethrows at wait() and leaves the tensor as it was.
  inner->fail = true;
  Tensor kept = from_vector({1.0}, {1}, DType::F32);
  w = staged->all_reduce_async(kept, dist::ReduceOp::Sum);
  test::expect_error([&] { w->wait(); }, "the collective failed");
  EXPECT_EQ(kept.to_vector(), (std::vector<double>{1}));
  // The wrapper answers for the inner communicator; buffers of a host communicator stay in host
  // memory whatever device the tensors live on.
  EXPECT_EQ(staged->backend(), "recording");
  EXPECT_EQ(staged->world_size(), 2);
  EXPECT_EQ(staged->buffer_device(Device::cuda(1)), Device::cpu());
}

// "cuda" under a launcher: each local rank its own GPU, round robin when there are more ranks
// than GPUs (two ranks sharing one GPU: the staged path's check on a one-GPU machine).
TEST(Ddp, EachLocalRankTakesItsOwnGpu) {
  EXPECT_EQ(dist::local_device("cuda", 0, 8), Device::cuda(0));
  EXPECT_EQ(dist::local_device("cuda", 5, 8), Device::cuda(5));
  EXPECT_EQ(dist::local_device("cuda", 1, 1), Device::cuda(0));
  EXPECT_EQ(dist::local_device("cuda", 3, 2), Device::cuda(1));
  EXPECT_EQ(dist::local_device("cuda:1", 0, 2), Device::cuda(1));  // an index given is kept
  EXPECT_EQ(dist::local_device("cpu", 3, 0), Device::cpu());
  test::expect_error([] { dist::local_device("cuda", 0, 0); }, "expected a CUDA device on this machine, found none");
}

// mpi unless nccl is asked for (auto picks nccl only once it is verified on a GPU, and then only
// for a CUDA job of several ranks without model parallelism); nccl asked for where it cannot
// run is refused with the reason.
TEST(Ddp, TheBackendIsMpiUnlessNcclIsAskedForAndCanRun) {
  using dist::Backend;
  EXPECT_EQ(dist::choose_backend(Backend::Auto, true, 8, 1, 1, true, false), Backend::Mpi);
  EXPECT_EQ(dist::choose_backend(Backend::Auto, true, 8, 1, 1, true, true), Backend::Nccl);
  EXPECT_EQ(dist::choose_backend(Backend::Auto, true, 1, 1, 1, true, true), Backend::Mpi);
  EXPECT_EQ(dist::choose_backend(Backend::Auto, false, 8, 1, 1, true, true), Backend::Mpi);
  EXPECT_EQ(dist::choose_backend(Backend::Auto, true, 8, 2, 1, true, true), Backend::Mpi);
  EXPECT_EQ(dist::choose_backend(Backend::Auto, true, 8, 1, 1, false, true), Backend::Mpi);
  EXPECT_EQ(dist::choose_backend(Backend::Mpi, true, 8, 1, 1, true, true), Backend::Mpi);
  EXPECT_EQ(dist::choose_backend(Backend::Nccl, true, 1, 1, 1, true, false), Backend::Nccl);  // world of one too
  test::expect_error([] { dist::choose_backend(Backend::Nccl, false, 2, 1, 1, true, false); },
                     "nccl moves GPU memory; expected --device cuda, found a CPU run");
  test::expect_error([] { dist::choose_backend(Backend::Nccl, true, 4, 2, 1, true, false); },
                     "nccl with tensor or pipeline parallelism (tp 2, pp 1) is not built yet; use mpi");
  test::expect_error([] { dist::choose_backend(Backend::Nccl, true, 2, 1, 1, false, false); },
                     "this build has no NCCL communicator; use mpi");
  // The program: refused before anything is written, with the option named.
  const std::string dir = test::scratch_dir("ddp", "nccl_cpu");
  const test::CliRun r = test::run_cli("train --max-steps 2 --dist-backend nccl --run-dir " + dir + "/run");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("option dist_backend: nccl moves GPU memory"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/run/metrics.jsonl"));
  test::CliRun bad = test::run_cli("train --max-steps 2 --dist-backend gloo --run-dir " + dir + "/bad");
  EXPECT_NE(bad.output.find("expected auto, mpi or nccl, found 'gloo'"), std::string::npos) << bad.output;
  fs::remove_all(dir);
}

TEST(Ddp, UnknownStrategiesAreClearErrors) {
  train::TrainerConfig c;  // the ZeRO stages: test_zero.cpp
  try {
    train::set_field(c, "strategy", "horovod");
    ADD_FAILURE() << "horovod accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected ddp, zero1, zero2, zero3 or fsdp, found 'horovod'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(dist::launched());  // ctest does not start the suites with a launcher
  EXPECT_EQ(dist::world()->world_size(), 1);
  EXPECT_EQ(dist::world()->backend(), "single");
}

}  // namespace
}  // namespace ft
