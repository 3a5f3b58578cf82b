// The program the DDP tests (tests/test_ddp.cpp) start, alone or under mpirun: a small model of
// the test's own (a trunk, two heads, a parameter no forward uses, a buffer) trained on generated
// blobs through Trainer::fit with AdamW, weight decay, a cosine schedule with warmup, norm
// clipping and accumulation. Only the public API (fasttrain/*.h).
//
//   ddp_worker train <run_dir> <global_batch> <bucket_cap_mb> [seed_per_rank [strategy
//                    [checkpoint_every [resume_from|- [precision [dropout [checkpoint_blocks]]]]]]]
//     trains 20 steps with batch global_batch / ranks per rank and the strategy (default ddp;
//     zero1, zero2, zero3: tests/test_zero.cpp), keeping a checkpoint every checkpoint_every steps
//     (all of them; 0: none) and resuming from the checkpoint folder resume_from when given;
//     each rank initialises its model from seed
//     7 + 1000 x rank when seed_per_rank is 1 (DDP must make them rank 0's). Before
//     every micro-batch the ranks compare a checksum of their weights' bits; rank 0 writes
//     <run_dir>/replicas.txt ("checks C mismatches M") besides the run folder's files. With
//     dropout > 0 the hidden layer is dropped out in training steps, and the ranks also compare
//     their masks: replicas.txt then ends with " same_masks S", the micro-batches in which two
//     ranks dropped the same units.
//   ddp_worker fail <run_dir> <rank> <step>   rank <rank> throws in training step <step>
//   ddp_worker hang <run_dir> <rank> <step>   rank <rank> stops communicating at step <step>
//     (the others' collectives must time out: dist_timeout is 3 s here)
//   ddp_worker size|skip <run_dir> <rank> <step>   with dist_debug on, rank <rank> all-gathers a
//     2-element checksum in step <step> (size) or skips that all-gather (skip): the debug mode
//     must name the differing collectives on every rank
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "fasttrain/fasttrain.h"
#include "support/linear_block.h"

namespace {

using namespace ft;

constexpr int64_t kFeatures = 4, kClasses = 3, kSamples = 480;

// Sample i: a point of blob i % 3 with unit noise from a hash of i; its class and feature sum.
class Blobs : public data::Dataset {
 public:
  int64_t size() const override { return kSamples; }
  data::SampleSpec spec() const override {
    return {{"x", Shape{kFeatures}, DType::F32}, {"label", Shape{}, DType::I64}, {"sum", Shape{}, DType::F32}};
  }
  void read(int64_t i, uint64_t, const std::vector<Tensor>& f) const override {
    const int64_t c = i % kClasses;
    float* x = f[0].data<float>();
    float total = 0;
    for (int64_t j = 0; j < kFeatures; ++j) {
      const auto r = philox4x32(99, static_cast<uint64_t>(i * kFeatures + j));
      const double u1 = uniform_from_word(r.v[0]) + 1e-12, u2 = uniform_from_word(r.v[1]);
      x[j] = static_cast<float>((j == c ? 2.5 : 0.0) + std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307 * u2));
      total += x[j];
    }
    *f[1].data<int64_t>() = c;
    *f[2].data<float>() = total;
  }
};

// trunk -> wide (a 64 x 32 weight: 8 KiB, larger than the tests' smallest bucket caps) -> two
// heads; `unused` is never in the forward pass; `shift` is a buffer added to the input. trunk and
// wide are blocks (ZeRO stage 3's units; recomputed in backward with checkpoint_blocks), the rest
// is the root.
class Net : public nn::Module {
 public:
  explicit Net(Generator* gen) {
    trunk = register_module("trunk", std::make_shared<test::LinearBlock>(kFeatures, 32, gen));
    wide = register_module("wide", std::make_shared<test::LinearBlock>(32, 64, gen));
    unused = register_module("unused", std::make_shared<nn::Linear>(64, 2, true, gen));
    classify = register_module("classify", std::make_shared<nn::Linear>(64, kClasses, true, gen));
    regress = register_module("regress", std::make_shared<nn::Linear>(64, 1, true, gen));
    register_buffer("shift", mul(randn({kFeatures}, {}, gen), 0.1));
  }
  std::string type_name() const override { return "DdpTestNet"; }
  std::shared_ptr<test::LinearBlock> trunk, wide;
  std::shared_ptr<nn::Linear> unused, classify, regress;
};

// A hash of every parameter's and buffer's bits, in registration order (under ZeRO stage 3, of
// those gathered before the forward: the root's; the blocks' are gathered inside it).
int64_t weights_hash(const nn::Module& m) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const Tensor& t) {
    if (!t.storage()->data) return;
    const Tensor c = t.detach().contiguous();
    const auto* p = static_cast<const unsigned char*>(c.raw_data());
    for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  for (const auto& [name, p] : m.named_parameters()) mix(p);
  for (const auto& [name, b] : m.named_buffers()) mix(b);
  return static_cast<int64_t>(h >> 1);
}

class NetModule : public train::TrainModule {
 public:
  NetModule(uint64_t seed, std::string mode, int fail_rank, int64_t fail_step, int64_t accumulate, double dropout)
      : dropout_(dropout),
        gen_(seed),
        net_(&gen_),
        mode_(std::move(mode)),
        fail_rank_(fail_rank),
        fail_step_(fail_step),
        accumulate_(accumulate) {}
  nn::Module& model() override { return net_; }

  train::StepOutput training_step(const data::Batch& b) override {
    const int64_t step = calls_++ / accumulate_ + 1;
    const std::shared_ptr<dist::Communicator> w = dist::world();
    if (step == fail_step_ && w->rank() == fail_rank_) {
      if (mode_ == "fail") FT_FAIL("injected failure in training step ", step);
      if (mode_ == "hang")
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    const bool diverge = step == fail_step_ && w->rank() == fail_rank_;
    if (diverge && mode_ == "skip") return step_of(b, true);
    // Every replica must hold the same bits before every micro-batch.
    const int64_t n = diverge && mode_ == "size" ? 2 : 1;
    Tensor mine = empty({n}, DType::I64);
    std::fill_n(mine.data<int64_t>(), n, weights_hash(net_));
    Tensor all = empty({w->world_size() * n}, DType::I64);
    w->all_gather(mine, all);
    for (int64_t r = 1; r < w->world_size(); ++r) mismatches += all.data<int64_t>()[r] != all.data<int64_t>()[0];
    ++checks;
    return step_of(b, true);
  }
  train::StepOutput validation_step(const data::Batch& b) override { return step_of(b, false); }

  int64_t checks = 0, mismatches = 0, same_masks = 0;

 private:
  train::StepOutput step_of(const data::Batch& b, bool training) {
    const Tensor x = add(b.field("x"), net_.named_buffers().front().second);
    Tensor h = tanh(net_.wide->forward(relu(net_.trunk->forward(x))));
    if (training && dropout_ > 0) {
      h = dropout(h, dropout_, true);
      compare_masks(h);
    }
    const Tensor ce = cross_entropy(net_.classify->forward(h), b.field("label"));
    const Tensor mse = mean(square(sub(net_.regress->forward(h).reshape({-1}), b.field("sum"))));
    return {add(ce, mul(mse, 0.05)), {{"mse", mse}}};
  }

  // Counts the micro-batches where another rank's dropout mask (the zeros of `h`) equals this one's.
  void compare_masks(const Tensor& h) {
    const std::shared_ptr<dist::Communicator> w = dist::world();
    const std::vector<double> v = h.to_vector();
    uint64_t hash = 1469598103934665603ull;
    for (double x : v) hash = (hash ^ (x == 0.0 ? 1u : 2u)) * 1099511628211ull;
    Tensor mine = scalar_tensor(static_cast<int64_t>(hash >> 1), DType::I64).reshape({1});
    Tensor all = empty({w->world_size()}, DType::I64);
    w->all_gather(mine, all);
    const int64_t* a = all.data<int64_t>();
    for (int64_t r = 0; r < w->world_size(); ++r)
      if (r != w->rank() && a[r] == a[w->rank()]) {
        ++same_masks;
        break;
      }
  }

  double dropout_;
  Generator gen_;
  Net net_;
  std::string mode_;
  int fail_rank_;
  int64_t fail_step_, accumulate_, calls_ = 0;
};

int usage() {
  std::fprintf(stderr,
               "usage: ddp_worker train RUN_DIR GLOBAL_BATCH BUCKET_CAP_MB [SEED_PER_RANK [STRATEGY [CKPT_EVERY "
               "[RESUME|- [PRECISION [DROPOUT [CHECKPOINT_BLOCKS]]]]]]]\n"
               "       ddp_worker fail|hang|size|skip RUN_DIR RANK STEP\n");
  return 64;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) return usage();
  const std::string mode = argv[1], run_dir = argv[2];
  const std::shared_ptr<dist::Communicator> w = dist::world();
  train::TrainerConfig c;
  c.task = "ddp-test";
  c.run_dir = run_dir;
  c.progress = false;
  c.tensorboard = false;
  c.max_steps = 20;
  c.accumulate = 2;
  c.optimizer.kind = optim::OptimizerKind::AdamW;
  c.optimizer.lr = 1e-2;
  c.schedule = ft::train::CosineSchedule{.min_lr = 1e-3, .warmup_steps = 5};
  c.optimizer.weight_decay = 0.1;
  c.optimizer.grad_clip = 0.5;
  c.log_every_n_steps = 1;
  c.eval_every = 0;
  c.eval_batches = 0;
  c.threads = 1;
  uint64_t init_seed = 7;
  double dropout_p = 0;
  int fail_rank = -1;
  int64_t fail_step = -1;
  if (mode == "train") {
    const int64_t global_batch = std::atoll(argv[3]);
    if (global_batch % w->world_size() != 0) {
      std::fprintf(stderr, "ddp_worker: global batch %lld does not divide by %d ranks\n",
                   static_cast<long long>(global_batch), w->world_size());
      return 64;
    }
    c.batch_size = global_batch / w->world_size();
    c.dist.bucket_cap_mb = std::atof(argv[4]);
    if (argc > 5 && std::strcmp(argv[5], "1") == 0) init_seed += 1000 * static_cast<uint64_t>(w->rank());
    if (argc > 6) train::set_field(c, "strategy", argv[6]);
    if (argc > 7) c.checkpoint.every = std::atoll(argv[7]);
    c.checkpoint.keep_last = 0;
    if (argc > 9) train::set_field(c, "precision", argv[9]);
    if (argc > 10) dropout_p = std::atof(argv[10]);
    if (argc > 11) c.precision.checkpoint_blocks = std::strcmp(argv[11], "1") == 0;
  } else if (mode == "fail" || mode == "hang" || mode == "size" || mode == "skip") {
    c.batch_size = 6;
    fail_rank = std::atoi(argv[3]);
    fail_step = std::atoll(argv[4]);
    c.dist.timeout = 3;
    // The debug mode, not the timeout, must end a diverging job: the timeout is out of reach.
    c.dist.debug = mode == "size" || mode == "skip";
    if (c.dist.debug) c.dist.timeout = 120;
  } else {
    return usage();
  }
  NetModule module(init_seed, mode, fail_rank, fail_step, c.accumulate, dropout_p);
  auto blobs = std::make_shared<Blobs>();
  train::DatasetModule data({blobs, nullptr, nullptr}, {blobs, nullptr});
  train::Trainer trainer(c);
  if (mode == "train" && argc > 8 && std::strcmp(argv[8], "-") != 0) trainer.resume(argv[8]);
  trainer.fit(module, data);
  if (w->rank() == 0) {
    std::ofstream out(run_dir + "/replicas.txt");
    out << "checks " << module.checks << " mismatches " << module.mismatches;
    if (dropout_p > 0) out << " same_masks " << module.same_masks;
    out << "\n";
  }
  return 0;
}
