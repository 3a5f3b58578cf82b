// CUDA runtime tests: run on a machine with an NVIDIA GPU, skip with a visible message elsewhere.
#include <gtest/gtest.h>

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
