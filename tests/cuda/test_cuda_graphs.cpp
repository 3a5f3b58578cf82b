// CUDA graphs (fasttrain/cuda_graph.h, StepRunner's cuda_graphs): a replayed training step gives
// bitwise the losses and weights of the same steps run eagerly, with a learning rate that changes
// every step and a batch of another shape in between, with dropout too; what cannot be captured
// (a host read, a draw for the CPU) is refused by name and the steps run eagerly; memory a graph captured is never
// handed to anything else; an index check inside a replay still reports a bad id.
#include <gtest/gtest.h>

#include <cstring>

#include "fasttrain/bench.h"
#include "fasttrain/fasttrain.h"
#include "support/require_gpu.h"

using namespace ft;

namespace {

struct TrainedRun {
  std::vector<double> losses;
  TensorMap state;
  bool captured = false;
  std::string refused;
};

// Steps with a different batch each step (drawn on the CPU from the step number) and a
// learning rate that changes each step; step 5 takes half a batch (eager even with graphs).
TrainedRun train_steps(const std::string& workload, train::Precision precision, bool graphs, int steps,
                       double dropout = 0) {
  Generator gen(5);
  manual_seed(11);  // dropout draws from the default generator: the same masks in every run
  bench::Workload w = bench::make_workload(workload, 8, gen);
  if (dropout > 0) {
    nn::GPTConfig cfg = nn::GPTConfig::preset(workload);
    cfg.dropout = dropout;
    Generator g2(5);
    w.model = std::make_shared<nn::GPT>(cfg, &g2);
  }
  const Device cuda = Device::cuda(0);
  w.model->to(cuda);
  auto opt = bench::make_bench_optimizer(*w.model);
  auto runner = bench::make_step_runner(w, *opt, precision, 1, graphs);
  TrainedRun r;
  for (int s = 0; s < steps; ++s) {
    Generator batch_gen(100 + s);
    const int64_t rows = s == 5 ? w.batch / 2 : w.batch;
    Tensor x = w.inputs.dtype() == DType::I64 ? randint(0, 512, {rows, w.inputs.size(1)}, DType::I64, &batch_gen)
                                              : randn({rows, w.inputs.size(1)}, DType::F32, &batch_gen);
    Tensor y = randint(0, 10, {rows, w.targets.dim() == 2 ? w.targets.size(1) : 1}, DType::I64, &batch_gen);
    if (w.targets.dim() == 1) y = y.reshape({rows});
    opt->set_lr(1e-3 * (1.0 + 0.25 * s));
    r.losses.push_back(runner->step(x.to(cuda), y.to(cuda)).item<double>());
  }
  r.state = w.model->state_dict();
  r.captured = runner->graph_captured();
  r.refused = runner->graph_refused();
  return r;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const Tensor ca = a.to(Device::cpu()).contiguous(), cb = b.to(Device::cpu()).contiguous();
  return ca.shape() == cb.shape() && ca.dtype() == cb.dtype() &&
         std::memcmp(ca.raw_data(), cb.raw_data(), static_cast<size_t>(ca.nbytes())) == 0;
}

void expect_replay_equals_eager(const std::string& workload, train::Precision precision) {
  constexpr int kSteps = 9;
  const TrainedRun eager = train_steps(workload, precision, false, kSteps);
  const TrainedRun graphed = train_steps(workload, precision, true, kSteps);
  EXPECT_FALSE(eager.captured);
  EXPECT_TRUE(graphed.captured) << graphed.refused;
  for (int s = 0; s < kSteps; ++s) EXPECT_EQ(graphed.losses[s], eager.losses[s]) << workload << " step " << s;
  ASSERT_EQ(graphed.state.size(), eager.state.size());
  for (size_t i = 0; i < eager.state.size(); ++i)
    EXPECT_TRUE(bitwise_equal(graphed.state[i].second, eager.state[i].second))
        << workload << " " << eager.state[i].first;
  // The learning rate reached the replays: a run whose lr stayed at the captured value would
  // have different weights from step 5 on (checked by the comparison above).
  EXPECT_LT(eager.losses.back(), eager.losses.front() * 1.5);
}

}  // namespace

TEST(CudaGraphs, MlpReplayIsBitwiseEager) {
  REQUIRE_GPU();
  expect_replay_equals_eager("mlp", train::Precision::FP32);
}

TEST(CudaGraphs, GptMiniReplayIsBitwiseEager) {
  REQUIRE_GPU();
  expect_replay_equals_eager("gpt-mini", train::Precision::FP32);
}

TEST(CudaGraphs, GptMiniBf16MixedReplayIsBitwiseEager) {
  REQUIRE_GPU();
  expect_replay_equals_eager("gpt-mini", train::Precision::BF16Mixed);
}

// The optimizer's options are written before each replay, outside the graph. Their device array
// must not be memory a captured temporary had: here the loss makes and frees small tensors of every
// size from 4 to 256 bytes (filled by kernels inside the graph) before the optimizer runs, so a
// block of the graph's pool for the options would be one of them, overwritten in every replay
// after the host wrote it (the first replay's update was then wrong).
TEST(CudaGraphs, MemoryWrittenBeforeAReplayIsNoCapturedTemporary) {
  REQUIRE_GPU();
  const Device cuda = Device::cuda(0);
  std::vector<double> losses[2];
  TensorMap states[2];
  for (int graphs = 0; graphs < 2; ++graphs) {
    Generator gen(3);
    bench::Workload w = bench::make_workload("mlp", 16, gen);
    w.model->to(cuda);
    auto opt = bench::make_bench_optimizer(*w.model);
    auto loss_with_temporaries = [cuda](const Tensor& out, const Tensor& target) {
      Tensor extra = zeros({}, TensorOptions(DType::F32, cuda));
      for (int64_t n = 1; n <= 64; ++n) extra = add(extra, sum(full({n}, 0.25, TensorOptions(DType::F32, cuda))));
      return add(cross_entropy(out, target), mul(extra, 1e-3));
    };
    train::StepOptions so;
    so.cuda_graphs = graphs == 1;
    train::StepRunner runner(*w.model, *opt, loss_with_temporaries, so);
    for (int s = 0; s < 7; ++s) {
      Generator batch_gen(100 + s);
      const Tensor x = randn({16, w.inputs.size(1)}, DType::F32, &batch_gen).to(cuda);
      const Tensor y = randint(0, 10, {16}, DType::I64, &batch_gen).to(cuda);
      opt->set_lr(1e-3 * (1.0 + 0.25 * s));
      losses[graphs].push_back(runner.step(x, y).item<double>());
    }
    EXPECT_EQ(runner.graph_captured(), graphs == 1) << runner.graph_refused();
    states[graphs] = w.model->state_dict();
  }
  EXPECT_EQ(losses[1], losses[0]);
  for (size_t i = 0; i < states[0].size(); ++i)
    EXPECT_TRUE(bitwise_equal(states[1][i].second, states[0][i].second)) << states[0][i].first;
}

// Dropout (in the residual stream and in attention) inside the captured step: each replay draws the
// counters the same eager step would, so masks, losses and weights are bitwise those of eager steps.
TEST(CudaGraphs, DropoutReplayIsBitwiseEager) {
  REQUIRE_GPU();
  constexpr int kSteps = 8;
  const TrainedRun eager = train_steps("gpt-mini", train::Precision::FP32, false, kSteps, /*dropout=*/0.1);
  const TrainedRun graphed = train_steps("gpt-mini", train::Precision::FP32, true, kSteps, /*dropout=*/0.1);
  EXPECT_TRUE(graphed.captured) << graphed.refused;
  for (int s = 0; s < kSteps; ++s) EXPECT_EQ(graphed.losses[s], eager.losses[s]) << "step " << s;
  for (size_t i = 0; i < eager.state.size(); ++i)
    EXPECT_TRUE(bitwise_equal(graphed.state[i].second, eager.state[i].second)) << eager.state[i].first;
  // Dropout was on: the same steps without it give other losses.
  const TrainedRun plain = train_steps("gpt-mini", train::Precision::FP32, false, kSteps);
  EXPECT_NE(plain.losses[1], eager.losses[1]);
}

// A random fill in a graph: every replay draws the next counters of the generator, as the same
// calls run eagerly one after the other would, and the generator's counter moves on the host.
TEST(CudaGraphs, RandomFillsInAReplayDrawNewNumbers) {
  REQUIRE_GPU();
  const Device cuda = Device::cuda(0);
  const Tensor x = empty({1000}, TensorOptions(DType::F32, cuda));
  Generator eager_gen(7), graph_gen(7);
  const Tensor first = rand_like(x, &eager_gen), second = rand_like(x, &eager_gen);
  Tensor y;
  CudaGraph graph(cuda);
  graph.capture([&] { y = rand_like(x, &graph_gen); });
  EXPECT_EQ(graph_gen.state().offset, 0u);  // nothing drawn while capturing
  graph.replay();
  EXPECT_TRUE(bitwise_equal(y, first));
  graph.replay();
  EXPECT_TRUE(bitwise_equal(y, second));
  EXPECT_EQ(graph_gen.state().offset, eager_gen.state().offset);
  // Drawing for the CPU inside a capture is refused by name: a replay would not run it.
  CudaGraph cpu_draw(cuda);
  try {
    cpu_draw.capture([&] { (void)rand({4}); });
    FAIL() << "a CPU draw was captured";
  } catch (const GraphCaptureError& e) {
    EXPECT_NE(std::string(e.what()).find("random numbers drawn for the CPU"), std::string::npos) << e.what();
  }
}

TEST(CudaGraphs, HostReadIsRefusedByNameAndResultsStayEager) {
  REQUIRE_GPU();
  const Device cuda = Device::cuda(0);
  std::vector<double> losses[2];
  std::string refused;
  for (int graphs = 0; graphs < 2; ++graphs) {
    Generator gen(3);
    bench::Workload w = bench::make_workload("mlp", 16, gen);
    w.model->to(cuda);
    auto opt = bench::make_bench_optimizer(*w.model);
    // A loss that reads a value back to the host mid-step (a planted .item()).
    auto peeking_loss = [](const Tensor& out, const Tensor& target) {
      Tensor l = cross_entropy(out, target);
      if (l.item<double>() < 0) FT_FAIL("negative loss");
      return l;
    };
    train::StepOptions so;
    so.cuda_graphs = graphs == 1;
    train::StepRunner runner(*w.model, *opt, peeking_loss, so);
    const Tensor x = w.inputs.to(cuda), y = w.targets.to(cuda);
    for (int s = 0; s < 6; ++s) losses[graphs].push_back(runner.step(x, y).item<double>());
    EXPECT_FALSE(runner.graph_captured());
    if (graphs == 1) refused = runner.graph_refused();
    EXPECT_EQ(opt->step_count(), 6);
  }
  EXPECT_NE(refused.find("to(cpu)"), std::string::npos) << refused;
  EXPECT_NE(refused.find("waits for the device"), std::string::npos) << refused;
  EXPECT_EQ(losses[1], losses[0]);
}

TEST(CudaGraphs, CapturedMemoryIsTheGraphs) {
  REQUIRE_GPU();
  const Device cuda = Device::cuda(0);
  Tensor x = arange(0, 4096, 1, TensorOptions(DType::F32, cuda));
  // Once eagerly, as a training step's warm-up does: the scalar constants 1 and 2 are made on the
  // device then (making one waits for the device, which a capture refuses).
  Tensor y = mul(add(x, 1.0), 2.0);
  auto graph = std::make_unique<CudaGraph>(cuda);
  graph->capture([&] { y = mul(add(x, 1.0), 2.0); });  // the add's result is freed inside the capture
  ASSERT_TRUE(graph->captured());
  // Eager allocations of the same sizes after the capture must not get the graph's blocks.
  std::vector<Tensor> others;
  for (int i = 0; i < 8; ++i) others.push_back(full({4096}, -7.0, TensorOptions(DType::F32, cuda)));
  graph->replay();
  synchronize(current_stream(cuda));
  const Tensor want = mul(add(x, 1.0), 2.0).to(Device::cpu());
  EXPECT_TRUE(bitwise_equal(y, want));
  for (const Tensor& o : others) EXPECT_EQ(o.to(Device::cpu()).data<float>()[17], -7.0f);
  const auto* yp = static_cast<const char*>(y.raw_data());
  for (const Tensor& o : others) {
    const auto* op = static_cast<const char*>(o.raw_data());
    EXPECT_TRUE(op + o.nbytes() <= yp || yp + y.nbytes() <= op) << "an eager tensor overlaps the graph's output";
  }
  // A new batch of the input's values reaches the replay.
  x.copy_(full({4096}, 3.0, TensorOptions(DType::F32, cuda)));
  graph->replay();
  EXPECT_EQ(y.to(Device::cpu()).data<float>()[100], 8.0f);
  // Once the graph is gone its pool's memory goes back to the device: the add's result and y.
  y = Tensor();
  const int64_t reserved = allocator_for(cuda).stats().reserved_bytes;
  graph.reset();
  EXPECT_GE(reserved - allocator_for(cuda).stats().reserved_bytes, 2 * 4096 * 4);
}

TEST(CudaGraphs, IndexCheckInAReplayReportsABadId) {
  REQUIRE_GPU();
  const Device cuda = Device::cuda(0);
  const Tensor weight = randn({10, 4}, TensorOptions(DType::F32, cuda));
  Tensor ids = full({6}, int64_t{2}, TensorOptions(DType::I64, cuda));
  Tensor rows;
  CudaGraph graph(cuda);
  graph.capture([&] { rows = embedding(ids, weight); });
  graph.replay();
  synchronize(current_stream(cuda));  // a valid batch: nothing to report
  ids.copy_(full({6}, int64_t{12}, TensorOptions(DType::I64, cuda)));
  graph.replay();
  try {
    synchronize(current_stream(cuda));
    graph.replay();  // the report may come at the next look instead
    synchronize(current_stream(cuda));
    FAIL() << "the out-of-range id 12 went unreported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("12"), std::string::npos) << e.what();
  }
}

TEST(CudaGraphs, SyncInsideACaptureIsRefusedByName) {
  REQUIRE_GPU();
  const Device cuda = Device::cuda(0);
  const Tensor x = full({4}, 1.0, TensorOptions(DType::F32, cuda));
  CudaGraph graph(cuda);
  try {
    graph.capture([&] { (void)sum(x).item<double>(); });
    FAIL() << "a host read was captured";
  } catch (const GraphCaptureError& e) {
    EXPECT_NE(std::string(e.what()).find("to(cpu)"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(graph.captured());
  EXPECT_EQ(sum(x).item<double>(), 4.0);  // the stream works after the failed capture
}
