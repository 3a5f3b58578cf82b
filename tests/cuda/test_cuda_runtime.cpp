// CUDA runtime tests: run on a machine with an NVIDIA GPU, skip with a visible message elsewhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "fasttrain/bench.h"
#include "fasttrain/fasttrain.h"
#include "support/require_gpu.h"

using namespace ft;

TEST(CudaRuntime, BinaryStartsWithoutDriverAndReportsDevices) {
  // Must not throw or abort whether or not a driver is present.
  int n = cuda_device_count();
  EXPECT_GE(n, 0);
  if (n == 0) {
    EXPECT_THROW(zeros({2}).to(Device::cuda(0)), Error);
  }
}

TEST(CudaRuntime, RoundTripThroughDeviceMemory) {
  REQUIRE_GPU();
  Tensor x = randn({37, 41});
  Allocator& a = allocator_for(Device::cuda(0));
  int64_t before = a.stats().num_allocs;
  Tensor d = x.to(Device::cuda(0));
  EXPECT_EQ(d.device(), Device::cuda(0));
  EXPECT_GT(a.stats().num_allocs, before);
  Tensor back = d.to(Device::cpu());
  EXPECT_EQ(back.to_vector(), x.to_vector());
  // dtype and device change in one to()
  Tensor h = x.to(Device::cuda(0), DType::BF16).to(Device::cpu(), DType::F32);
  EXPECT_EQ(h.to_vector(), x.to(DType::BF16).to(DType::F32).to_vector());
}

TEST(CudaRuntime, OutOfMemoryMessageStatesSizes) {
  REQUIRE_GPU();
  try {
    Tensor huge = empty({int64_t(1) << 50}, TensorOptions(DType::U8, Device::cuda(0)));
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("requested 1125899906842624 bytes"), std::string::npos) << e.what();
  }
}

// --detect-sync's counter: a planted item() on a device tensor is one named wait; device work that
// stays on the device is none; a blocking copy names its shape.
TEST(CudaSyncTracker, CountsAPlantedItemAndNothingElse) {
  REQUIRE_GPU();
  Tensor x = randn({256, 256}).to(Device::cuda(0));
  synchronize(current_stream(Device::cuda(0)));
  {
    const SyncTracker syncs;
    Tensor y = relu(matmul(x, x));  // queued, never waited for
    Tensor s = sum(y);
    EXPECT_EQ(syncs.total(), 0) << syncs.summary();
    (void)s.item<double>();
    ASSERT_EQ(syncs.total(), 1) << syncs.summary();
    EXPECT_EQ(syncs.counts()[0].what, "to(cpu): f32 []");
    (void)y.to(Device::cpu());
    synchronize(current_stream(Device::cuda(0)));
    EXPECT_EQ(syncs.summary(), "3: to(cpu): f32 [] x1, to(cpu): f32 [256, 256] x1, synchronize x1");
  }
  const SyncTracker later;  // a tracker sees only what happens while it is alive
  EXPECT_EQ(later.total(), 0);
  EXPECT_EQ(later.summary(), "none");
}

// A GPT training step on the GPU, as bench --detect-sync runs it: a planted item() inside the
// step shows up as one more wait than the step has without it, under its own name.
TEST(CudaSyncTracker, FindsAnItemPlantedInATrainingStep) {
  REQUIRE_GPU();
  Generator gen(3);
  bench::Workload w = bench::make_workload("gpt-mini", 2, gen);
  const Device dev = Device::cuda(0);
  w.model->to(dev);
  w.inputs = w.inputs.to(dev);
  w.targets = w.targets.to(dev);
  auto opt = bench::make_bench_optimizer(*w.model);
  auto runner = bench::make_step_runner(w, *opt, train::Precision::FP32);
  runner->step(w.inputs, w.targets);  // warm-up: the allocator's first requests
  int64_t clean = 0;
  {
    const SyncTracker syncs;
    runner->step(w.inputs, w.targets);
    clean = syncs.total();
    std::printf("host-device synchronisations of a gpt-mini fp32 step: %s\n", syncs.summary().c_str());
  }
  {
    const SyncTracker syncs;
    Tensor loss = runner->step(w.inputs, w.targets);
    (void)loss.item<double>();  // the planted one
    EXPECT_EQ(syncs.total(), clean + 1) << syncs.summary();
    const auto counts = syncs.counts();
    EXPECT_TRUE(std::any_of(counts.begin(), counts.end(), [](const SyncCount& c) {
      return c.what == "to(cpu): f32 []";
    })) << syncs.summary();
  }
}
