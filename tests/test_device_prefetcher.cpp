// The parts of pinned memory, streams, events and DevicePrefetcher that hold on every machine:
// on the CPU the prefetcher hands out the loader's own batches (no copy, no lookahead), pinned
// buffers fall back to aligned host memory when no GPU is present, and CUDA objects asked for
// without a GPU fail with an error naming the device. The CUDA behaviour itself is tested in
// tests/cuda/test_cuda_prefetch.cpp.
#include <cstdint>
#include <memory>

#include <gtest/gtest.h>

#include "fasttrain/allocator.h"
#include "fasttrain/device_prefetcher.h"
#include "support/expect_error.h"
#include "support/synthetic_dataset.h"

namespace ft::data {
namespace {

using test_support::copy;
using test_support::drain;
using test_support::Seen;
using test_support::SyntheticDataset;

LoaderOptions opts(int workers, bool pin_memory) {
  LoaderOptions o;
  o.batch_size = 7;
  o.num_workers = workers;
  o.shuffle = true;
  o.pin_memory = pin_memory;
  o.seed = 11;
  return o;
}

TEST(DevicePrefetcher, OnTheCpuHandsOutTheLoadersOwnBatches) {
  auto ds = std::make_shared<SyntheticDataset>(30);
  DataLoader reference(ds, opts(2, false));
  const std::vector<Seen> expected = drain(reference, 2);
  ASSERT_EQ(expected.size(), 10u);  // 5 batches per epoch, the last one partial

  DataLoader loader(ds, opts(2, false));
  DevicePrefetcher batches(loader, Device::cpu());
  EXPECT_EQ(batches.copy_stream().handle, nullptr);
  std::vector<Seen> got;
  for (int e = 0; e < 2; ++e) {
    while (const Batch* b = batches.next()) {
      // The very tensors of the loader's pool: no copy was made, and nothing is read ahead.
      EXPECT_EQ(b->fields[0].device(), Device::cpu());
      EXPECT_EQ(batches.state().position, loader.state().position);
      got.push_back(copy(*b));
    }
  }
  EXPECT_EQ(got, expected);
}

TEST(DevicePrefetcher, CpuSteadyStateAllocatesNothing) {
  DataLoader loader(std::make_shared<SyntheticDataset>(70), opts(2, true));
  DevicePrefetcher batches(loader, Device::cpu());
  ASSERT_NE(batches.next(), nullptr);
  const AllocatorStats before = allocator_for(Device::cpu()).stats();
  int n = 0;
  while (batches.next() != nullptr) ++n;
  EXPECT_EQ(n, 9);
  EXPECT_EQ(allocator_for(Device::cpu()).stats().num_allocs, before.num_allocs);
}

TEST(DevicePrefetcher, CpuResumeMidEpochIsExact) {
  auto ds = std::make_shared<SyntheticDataset>(30);
  DataLoader reference(ds, opts(1, false));
  const std::vector<Seen> expected = drain(reference, 2);

  LoaderState saved;
  std::vector<Seen> got;
  {
    DataLoader loader(ds, opts(1, false));
    DevicePrefetcher batches(loader, Device::cpu());
    for (int i = 0; i < 3; ++i) got.push_back(copy(*batches.next()));
    saved = batches.state();
  }
  DataLoader loader(ds, opts(3, false));
  DevicePrefetcher batches(loader, Device::cpu());
  batches.load_state(saved);
  while (const Batch* b = batches.next()) got.push_back(copy(*b));
  for (const Seen& s : drain(batches, 1)) got.push_back(s);
  EXPECT_EQ(got, expected);
}

TEST(PinnedMemory, WithoutAGpuPinnedBuffersAreAlignedHostMemory) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present: tests/cuda/test_cuda_prefetch.cpp covers pinning";
  EXPECT_EQ(pinned_host_allocator(), nullptr);
  Tensor t = empty_pinned({3, 5}, DType::U8);
  EXPECT_FALSE(t.is_pinned());
  EXPECT_EQ(t.device(), Device::cpu());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u);

  DataLoader loader(std::make_shared<SyntheticDataset>(20), opts(2, /*pin_memory=*/true));
  const Batch* b = loader.next();
  ASSERT_NE(b, nullptr);
  for (const Tensor& f : b->fields) {
    EXPECT_FALSE(f.is_pinned());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(f.raw_data()) % 64, 0u);
  }
}

TEST(StreamsAndEvents, OnTheCpuEverythingIsAlreadyDone) {
  const Stream stream = side_stream(Device::cpu());
  EXPECT_EQ(stream.handle, nullptr);
  Event ev(Device::cpu());
  EXPECT_TRUE(ev.query());  // never recorded
  ev.record(stream);
  ev.block(current_stream(Device::cpu()));
  ev.synchronize();
  EXPECT_TRUE(ev.query());
  test::expect_error(
      [&] {
        ev.record(Stream{Device::cuda(0), nullptr});
      },
      "Event::record: the event belongs to cpu, the stream to cuda:0");
}

TEST(StreamsAndEvents, CudaObjectsWithoutAGpuNameTheDevice) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  test::expect_error([] { side_stream(Device::cuda(0)); }, "side_stream(cuda:0)");
  test::expect_error([] { Event e(Device::cuda(0)); }, "Event(cuda:0)");
  DataLoader loader(std::make_shared<SyntheticDataset>(20), opts(0, true));
  test::expect_error([&] { DevicePrefetcher p(loader, Device::cuda(0)); },
                     "DevicePrefetcher: device cuda:0 is not available (0 CUDA devices found)");
}

}  // namespace
}  // namespace ft::data
