// DataLoader: in-order batches whatever the worker count, per-epoch reshuffling, exact mid-epoch
// resume, error propagation with clean shutdown, and no allocation in steady state.
#include <atomic>
#include <memory>

#include <gtest/gtest.h>

#include "fasttrain/allocator.h"
#include "fasttrain/loader.h"
#include "support/expect_error.h"
#include "support/synthetic_dataset.h"

namespace ft::data {
namespace {

using test_support::copy;
using test_support::drain;
using test_support::Seen;
using test_support::SyntheticDataset;

LoaderOptions opts(int workers, bool shuffle = true) {
  LoaderOptions o;
  o.batch_size = 7;
  o.num_workers = workers;
  o.shuffle = shuffle;
  o.seed = 5;
  return o;
}

TEST(DataLoader, SequentialBatchesHoldTheSamplesInOrder) {
  DataLoader loader(std::make_shared<SyntheticDataset>(10), opts(2, false));
  EXPECT_EQ(loader.batches_per_epoch(), 2);
  const auto seen = drain(loader, 1);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].labels, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(seen[1].labels, (std::vector<int64_t>{7, 8, 9}));  // partial last batch
  EXPECT_FLOAT_EQ(seen[1].images[6 * 2 + 4], 904.0f);          // sample 9, element 4, epoch 0
}

TEST(DataLoader, SameBatchesForAnyWorkerCount) {
  auto ds = std::make_shared<SyntheticDataset>(50);
  DataLoader reference(ds, opts(0));
  const auto want = drain(reference, 2);
  ASSERT_EQ(want.size(), 16u);  // 8 batches (the last of 1 sample) x 2 epochs
  for (int workers : {1, 4}) {
    for (int prefetch : {1, 2}) {
      LoaderOptions o = opts(workers);
      o.prefetch_factor = prefetch;
      DataLoader loader(ds, o);
      EXPECT_EQ(drain(loader, 2), want) << workers << " workers, prefetch " << prefetch;
    }
  }
}

TEST(DataLoader, ReshufflesEachEpochAndCoversTheDataset) {
  DataLoader loader(std::make_shared<SyntheticDataset>(50), opts(3));
  std::vector<std::vector<int64_t>> epochs(2);
  for (auto& labels : epochs) {
    while (const Batch* b = loader.next()) {
      const auto s = copy(*b);
      labels.insert(labels.end(), s.labels.begin(), s.labels.end());
    }
    auto sorted = labels;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(sorted[i], i);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_EQ(loader.state().epoch, 2u);
}

TEST(DataLoader, DropLastDropsThePartialBatch) {
  LoaderOptions o = opts(2);
  o.drop_last = true;
  DataLoader loader(std::make_shared<SyntheticDataset>(50), o);
  EXPECT_EQ(loader.batches_per_epoch(), 7);
  const auto seen = drain(loader, 1);
  ASSERT_EQ(seen.size(), 7u);
  for (const auto& s : seen) EXPECT_EQ(s.labels.size(), 7u);
}

TEST(DataLoader, ResumesMidEpochWithExactlyTheSameBatches) {
  auto ds = std::make_shared<SyntheticDataset>(50);
  for (int workers : {0, 4}) {
    DataLoader uninterrupted(ds, opts(workers));
    const auto want = drain(uninterrupted, 3);

    // Stop after epoch 0 and three batches of epoch 1 (the pipeline has prefetched past them).
    LoaderState saved;
    std::vector<Seen> got;
    {
      DataLoader first(ds, opts(workers));
      got = drain(first, 1);
      for (int i = 0; i < 3; ++i) got.push_back(copy(*first.next()));
      saved = first.state();
    }
    EXPECT_EQ(saved.epoch, 1u);
    EXPECT_EQ(saved.position, 3);
    DataLoader resumed(ds, opts(workers));
    resumed.load_state(saved);
    const auto rest = drain(resumed, 2);
    got.insert(got.end(), rest.begin(), rest.end());
    EXPECT_EQ(got, want) << workers << " workers";
  }
}

TEST(DataLoader, WorkerErrorsNameTheSampleAndTheLoaderCanRetry) {
  for (int workers : {0, 4}) {
    auto ds = std::make_shared<SyntheticDataset>(50, 23);
    DataLoader loader(ds, opts(workers, false));
    for (int i = 0; i < 3; ++i) ASSERT_NE(loader.next(), nullptr);  // samples 0..20
    test::expect_error([&] { loader.next(); },
                       "reading sample 23 (batch 3 of epoch 0) failed: synthetic: sample file vanished");
    test::expect_error([&] { loader.next(); }, "reading sample 23");  // stays at the failed batch
    EXPECT_EQ(loader.state().position, 3);
    ds->fail = false;  // the file is back
    const Batch* b = loader.next();
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->index, 3);
    EXPECT_EQ(copy(*b).labels[2], 23);
  }
}

TEST(DataLoader, DestroysCleanlyMidEpochAndAfterAnError) {
  auto ds = std::make_shared<SyntheticDataset>(500, 30);
  { DataLoader never_used(ds, opts(4)); }
  {
    DataLoader one_batch(ds, opts(4, false));  // workers block on a full pool when destroyed
    ASSERT_NE(one_batch.next(), nullptr);
  }
  {
    DataLoader failed(ds, opts(4, false));
    EXPECT_THROW(drain(failed, 1), Error);
  }
}

TEST(DataLoader, AllocatesNothingPerBatchInSteadyState) {
  auto ds = std::make_shared<SyntheticDataset>(64);
  for (int workers : {0, 2}) {
    DataLoader loader(ds, opts(workers));
    ASSERT_NE(loader.next(), nullptr);  // warm-up: the epoch's order is generated
    const int64_t before = allocator_for(Device::cpu()).stats().num_allocs;
    int64_t batches = 0;
    for (int e = 0; e < 3; ++e)
      while (loader.next()) ++batches;
    EXPECT_GT(batches, 20);
    EXPECT_EQ(allocator_for(Device::cpu()).stats().num_allocs, before) << workers << " workers";
  }
}

TEST(DataLoader, BuffersAreAlignedForDeviceCopies) {
  LoaderOptions o = opts(2);
  o.pin_memory = true;
  DataLoader loader(std::make_shared<SyntheticDataset>(20), o);
  const Batch* b = loader.next();
  for (const Tensor& t : b->fields) EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u);
}

TEST(DataLoader, RejectsBadOptionsAndStates) {
  auto ds = std::make_shared<SyntheticDataset>(10);
  LoaderOptions o = opts(0);
  o.batch_size = 0;
  test::expect_error([&] { DataLoader loader(ds, o); }, "expected batch_size >= 1, found 0");
  test::expect_error([&] { DataLoader(DatasetPtr(), opts(0)); }, "expected a dataset, found none");
  test::expect_error([&] { DataLoader(ds, opts(0, true), std::make_shared<SequentialSampler>(10)); },
                     "shuffle must be false when a sampler is given");
  DataLoader loader(ds, opts(0));
  test::expect_error([&] { loader.load_state({0, 0, 6}); }, "saved with seed 6, this loader uses seed 5");
  test::expect_error([&] { loader.load_state({0, 3, 5}); }, "expected a position in [0, 2], found 3");
  test::expect_error([&] { loader.next()->field("pixels"); }, "no field named 'pixels'; the batch has: image, label");
}

TEST(DataLoader, DistributedSamplerFeedsOneRanksShard) {
  auto ds = std::make_shared<SyntheticDataset>(10);
  LoaderOptions o = opts(2, false);
  o.batch_size = 2;
  DataLoader loader(ds, o, std::make_shared<DistributedSampler>(10, 1, 4, false));
  const auto seen = drain(loader, 1);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].labels, (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(seen[1].labels, (std::vector<int64_t>{9}));
}

}  // namespace
}  // namespace ft::data
