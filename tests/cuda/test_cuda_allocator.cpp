// The device caching allocator: freed blocks are reused without cudaMalloc, statistics add up,
// a block another stream used is not handed out before that stream's work is done, empty_cache
// returns the cache, and running out of memory says how much was asked for and held. Under
// FT_CUDA_EXPANDABLE_SEGMENTS=1 (scripts/gpu-check.sh runs this file, the graph and the training
// tests so again) the same holds, and freed small blocks serve one large block without new memory.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "fasttrain/fasttrain.h"
#include "support/require_gpu.h"

using namespace ft;

namespace {
const Device kGpu = Device::cuda(0);
TensorOptions on_gpu(DType dt = DType::F32) { return TensorOptions(dt, kGpu); }
bool expandable_segments() {
  const char* v = std::getenv("FT_CUDA_EXPANDABLE_SEGMENTS");
  return v != nullptr && (std::string(v) == "1" || std::string(v) == "true");
}
#define REQUIRE_EXPANDABLE_SEGMENTS() \
  if (!expandable_segments())         \
  GTEST_SKIP() << "runs with FT_CUDA_EXPANDABLE_SEGMENTS=1 (scripts/gpu-check.sh does): skipped"
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

TEST(CudaAllocator, ExpandableSegmentsServeALargeBlockFromFreedSmallOnes) {
  REQUIRE_GPU();
  REQUIRE_EXPANDABLE_SEGMENTS();
  Allocator& a = allocator_for(kGpu);
  a.empty_cache();
  constexpr int64_t kMiB = 1 << 20;
  {
    std::vector<Tensor> small;
    for (int i = 0; i < 64; ++i) small.push_back(full({kMiB / 4}, static_cast<double>(i), on_gpu()));
    for (int i = 0; i < 64; i += 9) EXPECT_EQ(small[i].to(Device::cpu()).data<float>()[1000], static_cast<float>(i));
  }
  const AllocatorStats after_small = a.stats();
  EXPECT_GE(after_small.reserved_bytes, 64 * kMiB);
  // The 64 freed 1 MiB blocks merged: 64 MiB fit without mapping anything new. Separate
  // allocations (no expandable segments) would need 64 MiB more here.
  Tensor big = arange(0, 16 * kMiB, 1, on_gpu());
  const AllocatorStats after_big = a.stats();
  EXPECT_LE(after_big.reserved_bytes - after_small.reserved_bytes, 2 * kMiB);
  EXPECT_EQ(after_big.num_system_allocs, after_small.num_system_allocs);
  const Tensor host = big.to(Device::cpu());
  for (int64_t i : {int64_t{0}, int64_t{12345}, 16 * kMiB - 1}) EXPECT_EQ(host.data<float>()[i], static_cast<float>(i));
  // Blocks are 512-byte multiples, not size classes: 1000 floats take 4096 bytes, not a class.
  const int64_t before = a.stats().allocated_bytes;
  Tensor odd = empty({1000}, on_gpu());
  EXPECT_EQ(a.stats().allocated_bytes - before, 4096);
}

TEST(CudaAllocator, ExpandableSegmentsEmptyCacheUnmapsFreeGranules) {
  REQUIRE_GPU();
  REQUIRE_EXPANDABLE_SEGMENTS();
  Allocator& a = allocator_for(kGpu);
  a.empty_cache();
  const int64_t base = a.stats().reserved_bytes;
  Tensor keep = ones({1 << 10}, on_gpu());
  { Tensor big = ones({100 << 20}, on_gpu(DType::U8)); }
  EXPECT_GE(a.stats().reserved_bytes - base, 100 << 20);
  a.empty_cache();
  // All but the granule that `keep` lies in is unmapped.
  EXPECT_LE(a.stats().reserved_bytes - base, 2 << 20);
  EXPECT_EQ(keep.to(Device::cpu()).to_vector(), std::vector<double>(1 << 10, 1.0));
  // Memory mapped again after unmapping holds what is written there.
  Tensor again = full({50 << 20}, 2.0, on_gpu(DType::U8));
  const Tensor host = again.to(Device::cpu());
  for (int64_t i : {int64_t{0}, int64_t{777777}, int64_t{50 << 20} - 1}) EXPECT_EQ(host.data<uint8_t>()[i], 2);
}
