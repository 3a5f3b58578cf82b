// DataLoader over an IterableDataset: identical batches whatever the worker count, every sample
// once per epoch, the epoch ending when the stream runs dry (drop_last or not), exact mid-epoch
// resume (even with another worker count), errors naming the stream sample, and shutdown of
// workers over an endless stream.
#include <atomic>
#include <memory>
#include <set>

#include <gtest/gtest.h>

#include "fasttrain/loader.h"
#include "support/expect_error.h"

namespace ft::data {
namespace {

using ft::test::expect_error;

// Stream sample i of epoch e: value = {i, 1000 e + i}. `n` < 0 makes the stream endless. Sample
// `broken` throws while `fail` is set. Counts the streams opened.
class CountingDataset : public IterableDataset {
 public:
  explicit CountingDataset(int64_t n, int64_t broken = -1) : n_(n), broken_(broken) {}
  SampleSpec spec() const override { return {{"value", {2}, DType::I64}}; }
  std::unique_ptr<SampleStream> open(uint64_t epoch, int64_t start) const override {
    ++opened;
    return std::make_unique<Stream>(*this, epoch, start);
  }
  mutable std::atomic<bool> fail{true};
  mutable std::atomic<int> opened{0};

 private:
  class Stream : public SampleStream {
   public:
    Stream(const CountingDataset& d, uint64_t epoch, int64_t at) : d_(d), epoch_(epoch), at_(at) {}
    bool next(const std::vector<Tensor>& fields) override {
      if (d_.n_ >= 0 && at_ >= d_.n_) return false;
      FT_CHECK(!(at_ == d_.broken_ && d_.fail.load()), "counting: sample ", at_, " is unreadable");
      int64_t* v = fields[0].data<int64_t>();
      v[0] = at_;
      v[1] = 1000 * static_cast<int64_t>(epoch_) + at_;
      ++at_;
      return true;
    }
    int64_t skip(int64_t n) override {
      const int64_t passed = d_.n_ < 0 ? n : std::max<int64_t>(0, std::min(n, d_.n_ - at_));
      at_ += passed;
      return passed;
    }

   private:
    const CountingDataset& d_;
    uint64_t epoch_;
    int64_t at_;
  };
  int64_t n_, broken_;
};

// A batch's values, copied out, with where it came from.
struct Seen {
  std::vector<int64_t> values;
  uint64_t epoch;
  int64_t index;
  bool operator==(const Seen&) const = default;
};

Seen copy(const Batch& b) {
  const int64_t* v = b.field("value").data<int64_t>();
  return {std::vector<int64_t>(v, v + 2 * b.rows), b.epoch, b.index};
}

std::vector<Seen> drain(DataLoader& loader, int epochs) {
  std::vector<Seen> out;
  for (int e = 0; e < epochs; ++e)
    while (const Batch* b = loader.next()) out.push_back(copy(*b));
  return out;
}

LoaderOptions opts(int workers, int64_t batch = 4, bool drop_last = false) {
  LoaderOptions o;
  o.batch_size = batch;
  o.num_workers = workers;
  o.drop_last = drop_last;
  return o;
}

// Batch k of epoch e holds stream samples [4k, 4k + 4) of that epoch, for every worker count.
TEST(IterableLoader, BatchesAreTheSameWhateverTheWorkerCount) {
  for (bool drop_last : {false, true}) {
    auto data = std::make_shared<CountingDataset>(23);
    DataLoader reference(data, opts(0, 4, drop_last));
    const std::vector<Seen> expected = drain(reference, 2);
    ASSERT_EQ(expected.size(), drop_last ? 10u : 12u);  // 5 full batches (+ 3 rows) per epoch
    for (const Seen& s : expected) {
      const bool last = !drop_last && s.index == 5;
      ASSERT_EQ(s.values.size(), last ? 6u : 8u);
      for (size_t r = 0; r < s.values.size() / 2; ++r) {
        EXPECT_EQ(s.values[2 * r], 4 * s.index + static_cast<int64_t>(r));
        EXPECT_EQ(s.values[2 * r + 1], 1000 * static_cast<int64_t>(s.epoch) + s.values[2 * r]);
      }
    }
    for (int workers : {1, 2, 3, 5}) {
      DataLoader loader(data, opts(workers, 4, drop_last));
      EXPECT_EQ(drain(loader, 2), expected) << workers << " workers, drop_last " << drop_last;
      EXPECT_EQ(loader.batches_per_epoch(), -1);
    }
  }
}

// Every sample exactly once per epoch, including streams that end on a batch boundary or are empty.
TEST(IterableLoader, EverySampleOncePerEpochAcrossWorkers) {
  for (int64_t n : {0, 1, 12, 13}) {
    for (int workers : {0, 3}) {
      auto data = std::make_shared<CountingDataset>(n);
      DataLoader loader(data, opts(workers));
      for (uint64_t epoch = 0; epoch < 2; ++epoch) {
        std::multiset<int64_t> seen;
        int64_t batches = 0;
        while (const Batch* b = loader.next()) {
          EXPECT_EQ(b->index, batches++);
          EXPECT_EQ(b->epoch, epoch);
          EXPECT_GT(b->rows, 0);
          for (int64_t r = 0; r < b->rows; ++r) seen.insert(b->field("value").data<int64_t>()[2 * r]);
        }
        EXPECT_EQ(batches, (n + 3) / 4) << n << " samples, " << workers << " workers";
        ASSERT_EQ(static_cast<int64_t>(seen.size()), n);
        int64_t expect = 0;
        for (int64_t v : seen) EXPECT_EQ(v, expect++);
      }
    }
  }
}

// Workers keep their streams open between their batches (skipping the others'), so a worker opens
// one stream per epoch rather than one per batch.
TEST(IterableLoader, WorkersSkipRatherThanReopen) {
  auto data = std::make_shared<CountingDataset>(400);
  DataLoader loader(data, opts(2));
  drain(loader, 1);
  EXPECT_EQ(data->opened.load(), 2);
}

// A state saved mid-epoch continues with exactly the batches the run would have seen, also under
// another worker count, and also from the end of an epoch.
TEST(IterableLoader, MidEpochResumeIsExact) {
  auto data = std::make_shared<CountingDataset>(30);
  DataLoader full(data, opts(2, 4));
  const std::vector<Seen> all = drain(full, 2);  // 8 batches per epoch
  for (int64_t stop : {3, 8, 11}) {
    DataLoader first(data, opts(2, 4));
    std::vector<Seen> seen;
    for (int64_t i = 0; i < stop; ++i) {
      const Batch* b = first.next();
      if (b == nullptr) b = first.next();  // the epoch boundary
      seen.push_back(copy(*b));
    }
    const LoaderState state = first.state();
    for (int workers : {0, 3}) {
      DataLoader resumed(data, opts(workers, 4));
      resumed.load_state(state);
      std::vector<Seen> rest = seen;
      while (rest.size() < all.size()) {
        const Batch* b = resumed.next();
        if (b != nullptr) rest.push_back(copy(*b));
      }
      EXPECT_EQ(rest, all) << "stopped after " << stop << " batches, resumed with " << workers << " workers";
    }
  }
  DataLoader loader(data, opts(1));
  expect_error([&] { loader.load_state({0, -1, 0}); }, "expected a position >= 0, found -1");
}

// A failing read reaches next() naming the stream sample, batch, epoch and worker; the loader stays
// at that batch, and once the sample reads again the epoch continues unchanged.
TEST(IterableLoader, ErrorsNameTheSampleAndRetry) {
  for (int workers : {0, 2}) {
    auto data = std::make_shared<CountingDataset>(20, 9);
    DataLoader loader(data, opts(workers));
    ASSERT_NE(loader.next(), nullptr);
    ASSERT_NE(loader.next(), nullptr);
    expect_error([&] { loader.next(); },
                 "reading stream sample 9 (batch 2 of epoch 0, worker 0) failed: counting: "
                 "sample 9 is unreadable");
    expect_error([&] { loader.next(); }, "stream sample 9");  // still at batch 2
    data->fail = false;
    const Batch* b = loader.next();
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->index, 2);
    EXPECT_EQ(b->field("value").data<int64_t>()[0], 8);
    EXPECT_EQ(drain(loader, 1).size(), 2u);
  }
}

// Destroying the loader joins its workers at any point, even over a stream that never ends.
TEST(IterableLoader, ShutdownOverAnEndlessStream) {
  for (int workers : {1, 4}) {
    auto data = std::make_shared<CountingDataset>(-1);
    auto loader = std::make_unique<DataLoader>(data, opts(workers, 8));
    for (int64_t k = 0; k < 50; ++k) {
      const Batch* b = loader->next();
      ASSERT_NE(b, nullptr);
      ASSERT_EQ(b->field("value").data<int64_t>()[0], 8 * k);
    }
    loader.reset();  // must return, with the workers joined
  }
}

TEST(IterableLoader, RejectsBadOptions) {
  expect_error([] { DataLoader(IterableDatasetPtr(), opts(0)); }, "expected an iterable dataset, found none");
  auto data = std::make_shared<CountingDataset>(4);
  LoaderOptions o = opts(0);
  o.shuffle = true;
  expect_error([&] { DataLoader(data, o); }, "shuffle must be false for an iterable dataset");
  expect_error([&] { DataLoader(data, opts(0, 0)); }, "expected batch_size >= 1, found 0");
  expect_error([&] { DataLoader(data, opts(-1)); }, "expected num_workers >= 0, found -1");
}

}  // namespace
}  // namespace ft::data
