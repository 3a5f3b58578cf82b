// The device caching allocator: freed blocks are reused without cudaMalloc, statistics add up,
// a block another stream used is not handed out before that stream's work is done, empty_cache
// returns the cache, and running out of memory says how much was asked for and held.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

#include "fasttrain/fasttrain.h"
#include "support/require_gpu.h"

using namespace ft;

namespace {
const Device kGpu = Device::cuda(0);
TensorOptions on_gpu(DType dt = DType::F32) { return TensorOptions(dt, kGpu); }
}  // namespace

TEST(CudaAllocator, ReusesFreedBlocksWithoutCudaMalloc) {
  REQUIRE_GPU();
  Allocator& a = allocator_for(kGpu);
  { Tensor warm = empty({1 << 20}, on_gpu()); }
  const AllocatorStats before = a.stats();
  for (int i = 0; i < 100; ++i) {
    Tensor t = empty({1 << 20}, on_gpu());   // the same size class each time
    Tensor u = empty({1000 + i}, on_gpu());  // small sizes share a few classes
  }
  const AllocatorStats after = a.stats();
  EXPECT_EQ(after.num_allocs - before.num_allocs, 200);
  EXPECT_LE(after.num_system_allocs - before.num_system_allocs, 2);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_GE(after.reserved_bytes, after.allocated_bytes);
}

TEST(CudaAllocator, StatisticsTrackPeakAndEmptyCacheReturnsMemory) {
  REQUIRE_GPU();
  Allocator& a = allocator_for(kGpu);
  a.empty_cache();
  a.reset_peak();
  const int64_t base = a.stats().allocated_bytes;
  {
    Tensor big = empty({64 << 20}, on_gpu(DType::U8));
    EXPECT_GE(a.stats().allocated_bytes - base, 64 << 20);
    EXPECT_GE(a.stats().peak_allocated_bytes - base, 64 << 20);
  }
  EXPECT_EQ(a.stats().allocated_bytes, base);
  const int64_t cached = a.stats().reserved_bytes;
  a.empty_cache();
  EXPECT_LE(a.stats().reserved_bytes, cached - (64 << 20));
}

TEST(CudaAllocator, BlockUsedByAnotherStreamWaitsForIt) {
  REQUIRE_GPU();
  const Stream side = side_stream(kGpu);
  const int64_t n = 1 << 22;
  Tensor src = full({n}, 3.0f, on_gpu());
  Event filled(kGpu);
  filled.record(current_stream(kGpu));
  filled.block(side);  // the side stream reads src after the compute stream wrote it
  void* first = nullptr;
  {
    Tensor t = empty({n}, on_gpu());
    first = t.raw_data();
    // A long copy into t queued on the side stream, then t freed on the host at once.
    StreamGuard g(side);
    for (int i = 0; i < 20; ++i) t.copy_(src);
    allocator_for(kGpu).record_stream(t.raw_data(), side);
  }
  // The same size on the compute stream must not get t's block while the side stream may still
  // write it (unless the side stream already finished).
  Tensor next = empty({n}, on_gpu());
  if (next.raw_data() == first) {
    Event done(kGpu);
    done.record(side);
    EXPECT_TRUE(done.query()) << "block reused while another stream's work on it was pending";
  }
  synchronize(side);
  // Once the side stream is done, the block returns to its free list and is reused.
  Tensor later = empty({n}, on_gpu());
  (void)later;
}

TEST(CudaAllocator, OutOfMemoryStatesRequestedAllocatedAndReserved) {
  REQUIRE_GPU();
  try {
    Tensor huge = empty({int64_t(1) << 50}, on_gpu(DType::U8));
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cuda:0: out of memory: requested 1125899906842624 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("allocated"), std::string::npos) << m;
    EXPECT_NE(m.find("reserved"), std::string::npos) << m;
    EXPECT_NE(m.find("free of"), std::string::npos) << m;
  }
  // The allocator still works afterwards.
  Tensor ok = ones({16}, on_gpu());
  EXPECT_EQ(ok.to(Device::cpu()).to_vector(), std::vector<double>(16, 1.0));
}

TEST(CudaAllocator, MemoryLimitIsEnforced) {
  REQUIRE_GPU();
  Allocator& a = allocator_for(kGpu);
  a.set_memory_limit(static_cast<size_t>(a.stats().allocated_bytes) + (1 << 20));
  EXPECT_THROW(empty({4 << 20}, on_gpu(DType::U8)), OutOfMemoryError);
  a.set_memory_limit(0);
  EXPECT_NO_THROW(empty({4 << 20}, on_gpu(DType::U8)));
}
