// Pinned host memory, streams, events and DevicePrefetcher on a real GPU. Skipped with a visible
// message where there is none. A "gate" — a host function enqueued on a stream that spins until the
// test opens it — holds a stream at a known point, which shows what queues behind what without
// relying on timing.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include <gtest/gtest.h>

#include "fasttrain/allocator.h"
#include "fasttrain/device_prefetcher.h"
#include "fasttrain/fasttrain.h"
#include "support/expect_error.h"
#include "support/require_gpu.h"
#include "support/synthetic_dataset.h"

namespace ft::data {
namespace {

using test_support::copy;
using test_support::drain;
using test_support::Seen;
using test_support::SyntheticDataset;

const Device kGpu = Device::cuda(0);

// Work on `stream` after close() waits until open(), or until 20 s have passed — then timed_out()
// is true. The timeout keeps a test that went wrong (or a driver call that waits for the whole
// device) from hanging; a check that matters asserts !timed_out(). The host function owns a share
// of the state, so the gate may die before its stream reaches it.
class StreamGate {
 public:
  void close(Stream stream) {
    auto* share = new std::shared_ptr<State>(state_);
    ASSERT_EQ(cudaLaunchHostFunc(static_cast<cudaStream_t>(stream.handle), &StreamGate::wait, share), cudaSuccess);
  }
  void open() { state_->open.store(true); }
  bool timed_out() const { return state_->timed_out.load(); }
  ~StreamGate() { open(); }

 private:
  struct State {
    std::atomic<bool> open{false}, timed_out{false};
  };
  static void wait(void* share) {
    std::unique_ptr<std::shared_ptr<State>> state(static_cast<std::shared_ptr<State>*>(share));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!(*state)->open.load()) {
      if (std::chrono::steady_clock::now() > deadline) {
        (*state)->timed_out.store(true);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

LoaderOptions opts(int workers, bool shuffle = true) {
  LoaderOptions o;
  o.batch_size = 7;
  o.num_workers = workers;
  o.shuffle = shuffle;
  o.pin_memory = true;
  o.seed = 11;
  return o;
}

TEST(CudaPinnedMemory, BlocksArePageLockedAndCached) {
  REQUIRE_GPU();
  Allocator* pinned = pinned_host_allocator();
  ASSERT_NE(pinned, nullptr);
  void* first = nullptr;
  {
    Tensor t = empty_pinned({1000, 1000}, DType::U8);
    EXPECT_TRUE(t.is_pinned());
    first = t.raw_data();
    cudaPointerAttributes attr{};
    ASSERT_EQ(cudaPointerGetAttributes(&attr, first), cudaSuccess);
    EXPECT_EQ(attr.type, cudaMemoryTypeHost);  // registered with the driver, not pageable
  }
  const int64_t system_allocs = pinned->stats().num_system_allocs;
  Tensor again = empty_pinned({1000, 1000}, DType::U8);
  EXPECT_EQ(again.raw_data(), first);  // served from the cache
  EXPECT_EQ(pinned->stats().num_system_allocs, system_allocs);

  DataLoader loader(std::make_shared<SyntheticDataset>(20), opts(2));
  const Batch* b = loader.next();
  ASSERT_NE(b, nullptr);
  for (const Tensor& f : b->fields) EXPECT_TRUE(f.is_pinned());
}

TEST(CudaPinnedMemory, ABlockStillReadByAQueuedCopyIsNotReused) {
  REQUIRE_GPU();
  const Stream side = side_stream(kGpu);
  StreamGate gate;
  gate.close(side);
  Tensor host = empty_pinned({1 << 20}, DType::U8);
  std::memset(host.raw_data(), 7, host.nbytes());
  void* block = host.raw_data();
  Tensor device;
  {
    StreamGuard guard(side);
    device = host.to(kGpu, DType::U8, /*non_blocking=*/true);  // queued behind the gate
  }
  host = Tensor();  // freed while the copy still has to read it
  Tensor other = empty_pinned({1 << 20}, DType::U8);
  EXPECT_NE(other.raw_data(), block) << "a block was handed out while a copy from it was queued";
  gate.open();
  synchronize(side);
  Tensor back = device.to(Device::cpu());
  EXPECT_EQ(back.data<uint8_t>()[12345], 7);
  Tensor reused = empty_pinned({1 << 20}, DType::U8);
  EXPECT_EQ(reused.raw_data(), block) << "the block should return to the cache once its copy is done";
}

TEST(CudaStreams, EventsOrderWorkAcrossStreams) {
  REQUIRE_GPU();
  const Stream a = side_stream(kGpu), b = side_stream(kGpu);
  EXPECT_NE(a.handle, nullptr);
  EXPECT_NE(a.handle, b.handle);  // consecutive side streams differ
  StreamGate gate;
  gate.close(a);
  Event on_a(kGpu), on_b(kGpu);
  EXPECT_TRUE(on_a.query());  // never recorded
  on_a.record(a);
  on_a.block(b);  // b waits for a on the device; the host goes on
  on_b.record(b);
  EXPECT_FALSE(on_a.query());
  EXPECT_FALSE(on_b.query());
  gate.open();
  on_b.synchronize();
  EXPECT_TRUE(on_a.query());
  EXPECT_TRUE(on_b.query());
}

TEST(CudaDevicePrefetcher, DeviceBatchesEqualTheLoadersBatches) {
  REQUIRE_GPU();
  auto ds = std::make_shared<SyntheticDataset>(30);
  DataLoader reference(ds, opts(2));
  const std::vector<Seen> expected = drain(reference, 3);
  ASSERT_EQ(expected.size(), 15u);

  DataLoader loader(ds, opts(2));
  DevicePrefetcher batches(loader, kGpu);
  EXPECT_NE(batches.copy_stream().handle, nullptr);
  EXPECT_NE(batches.copy_stream().handle, current_stream(kGpu).handle);
  std::vector<Seen> got;
  for (int e = 0; e < 3; ++e) {
    while (const Batch* b = batches.next()) {
      for (const Tensor& f : b->fields) EXPECT_EQ(f.device(), kGpu);
      got.push_back(copy(*b));
    }
  }
  EXPECT_EQ(got, expected);
}

TEST(CudaDevicePrefetcher, StateExcludesThePrefetchedBatchAndResumesExactly) {
  REQUIRE_GPU();
  auto ds = std::make_shared<SyntheticDataset>(30);
  DataLoader reference(ds, opts(1));
  const std::vector<Seen> expected = drain(reference, 2);

  LoaderState saved;
  std::vector<Seen> got;
  {
    DataLoader loader(ds, opts(1));
    DevicePrefetcher batches(loader, kGpu);
    for (int i = 0; i < 3; ++i) got.push_back(copy(*batches.next()));
    EXPECT_EQ(loader.state().position, 4);  // batch 3 is already on its way to the device
    saved = batches.state();
    EXPECT_EQ(saved.position, 3);  // but the consumer has seen three
  }
  DataLoader loader(ds, opts(4));
  DevicePrefetcher batches(loader, kGpu);
  batches.load_state(saved);
  while (const Batch* b = batches.next()) got.push_back(copy(*b));
  for (const Seen& s : drain(batches, 1)) got.push_back(s);
  EXPECT_EQ(got, expected);
}

TEST(CudaDevicePrefetcher, CopiesRunOnTheirOwnStreamNotBehindCompute) {
  REQUIRE_GPU();
  auto ds = std::make_shared<SyntheticDataset>(30);
  DataLoader reference(ds, opts(2));
  const std::vector<Seen> expected = drain(reference, 1);

  DataLoader loader(ds, opts(2));
  DevicePrefetcher batches(loader, kGpu);
  StreamGate compute_gate;
  compute_gate.close(current_stream(kGpu));  // the compute stream is busy with a long "step"
  // Were the copies queued on the compute stream, next() would wait for the gate (until it times
  // out). The second next() hands out batch 1, whose copy was issued by the first.
  const Batch* first = batches.next();
  const Batch* second = batches.next();
  const bool returned_while_busy = !compute_gate.timed_out();
  compute_gate.open();
  EXPECT_TRUE(returned_while_busy) << "next() waited for the compute stream";
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(copy(*second), expected[1]);
  std::vector<Seen> rest;
  while (const Batch* b = batches.next()) rest.push_back(copy(*b));
  EXPECT_EQ(rest, std::vector<Seen>(expected.begin() + 2, expected.end()));
}

TEST(CudaDevicePrefetcher, ALoadErrorSurfacesWithTheBatchThatFailedAndRetries) {
  REQUIRE_GPU();
  auto ds = std::make_shared<SyntheticDataset>(21, /*broken=*/9);  // sample 9 is in batch 1
  DataLoader loader(ds, opts(0, /*shuffle=*/false));
  DevicePrefetcher batches(loader, kGpu);
  const Batch* b0 = batches.next();  // batch 1's prefetch fails here, but batch 0 is good
  ASSERT_NE(b0, nullptr);
  EXPECT_EQ(copy(*b0).labels, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(batches.state().position, 1);
  test::expect_error([&] { batches.next(); }, "synthetic: sample file vanished");
  ds->fail = false;
  const Batch* b1 = batches.next();
  ASSERT_NE(b1, nullptr);
  EXPECT_EQ(copy(*b1).labels, (std::vector<int64_t>{7, 8, 9, 10, 11, 12, 13}));
}

}  // namespace
}  // namespace ft::data
