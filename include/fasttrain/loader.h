// Samplers and the DataLoader: which samples make up batch k of an epoch, and worker threads that
// write those samples straight into reused, 64-byte-aligned batch buffers, handed out in order.
// Implemented in src/data/sampler.cpp and src/data/loader.cpp.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "fasttrain/dataset.h"

namespace ft::data {

// --- samplers ---------------------------------------------------------------------------------
// The order in which an epoch visits a dataset. indices() is a pure function of the sampler's
// configuration and the epoch, so any epoch can be regenerated on resume without replaying earlier
// ones.
class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual int64_t size() const = 0;  // indices per epoch
  // Fills `out` with the epoch's indices (resized to size(); reuses its capacity).
  virtual void indices(uint64_t epoch, std::vector<int64_t>& out) const = 0;
};
using SamplerPtr = std::shared_ptr<const Sampler>;

// A uniformly random permutation of 0..n-1 that depends only on (seed, epoch): Fisher-Yates whose
// step i draws from Philox counter (i, epoch) under key `seed`, so no generator state is carried
// between epochs.
void random_permutation(int64_t n, uint64_t seed, uint64_t epoch, std::vector<int64_t>& out);

// 0, 1, ..., n-1 every epoch.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  int64_t size() const override { return n_; }
  void indices(uint64_t epoch, std::vector<int64_t>& out) const override;

 private:
  int64_t n_;
};

// A different, reproducible permutation each epoch (random_permutation(n, seed, epoch)).
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed);
  int64_t size() const override { return n_; }
  void indices(uint64_t epoch, std::vector<int64_t>& out) const override;

 private:
  int64_t n_;
  uint64_t seed_;
};

// Rank `rank` of `world_size`'s shard, as torch.utils.data.DistributedSampler: the (optionally
// shuffled, same seed on every rank) order is cut to a multiple of world_size — padded by wrapping
// around to its start (drop_last = false) or truncated (drop_last = true) — and rank r takes
// positions r, r + world_size, ... Shards are disjoint (up to the wrapped padding) and equal in
// size, so every rank runs the same number of steps.
class DistributedSampler : public Sampler {
 public:
  DistributedSampler(int64_t n, int64_t rank, int64_t world_size, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);
  int64_t size() const override { return per_rank_; }
  void indices(uint64_t epoch, std::vector<int64_t>& out) const override;

 private:
  int64_t n_, rank_, world_size_, per_rank_;
  bool shuffle_;
  uint64_t seed_;
};

// --- loader -----------------------------------------------------------------------------------
struct LoaderOptions {
  int64_t batch_size = 1;
  int num_workers = 0;  // 0: samples are read in the thread that calls next()
  // Page-locked batch buffers (empty_pinned) when a CUDA device is present, so DevicePrefetcher's
  // host-to-device copies are asynchronous. Without one they are 64-byte-aligned host memory.
  bool pin_memory = false;
  int prefetch_factor = 2;  // batches in flight per worker; the pool holds max(2, workers * this)
  bool drop_last = false;   // drop the epoch's last, partial batch
  bool shuffle = false;     // RandomSampler(seed) instead of SequentialSampler
  uint64_t seed = 0;
};

// Where the loader is in its stream of batches: enough to continue a stopped run with exactly the
// batches it would have seen. Saved in checkpoints.
struct LoaderState {
  uint64_t epoch = 0;
  int64_t position = 0;  // batches of `epoch` already handed out
  uint64_t seed = 0;
};

// One batch: a tensor per SampleSpec field, shaped [rows, ...field shape]. Its tensors view a
// pooled buffer that is reused: they are valid until the next call to next() / load_state() or the
// loader's destruction. Call .clone() on a field to keep it longer.
struct Batch {
  std::vector<Tensor> fields;  // in spec() order
  uint64_t epoch = 0;
  int64_t index = 0;  // batch number within the epoch
  int64_t rows = 0;   // batch_size, or fewer for the last batch when drop_last is false
  const SampleSpec* spec = nullptr;
  const Tensor& field(std::string_view name) const;
};

// Batches of `dataset` in sampler order. Workers (std::thread) each fill a whole batch: batch k
// goes into pool slot k % pool_size, and a worker may start batch k only after the consumer has
// released batch k - pool_size, so the pool bounds both memory and the reorder window while
// next() hands batches out strictly in order whatever the worker count. Nothing is allocated per
// sample or per batch in steady state: buffers and their row views are made once.
//
// Errors thrown by Dataset::read reach next() as ft::Error naming the sample index; the loader
// stops its workers and stays at that batch (calling next() again retries it). The destructor
// joins the workers after they finish the batch in hand, at any point in an epoch.
//
// Iterable datasets: the epoch's stream is cut into batches of batch_size consecutive samples, and
// batch k is filled by worker k % N (N = max(1, num_workers)) from that worker's own stream, which
// skips the N - 1 batches the other workers take in between. Workers thus write disjoint parts of
// the stream, and batch k always holds stream samples [k * batch_size, (k + 1) * batch_size):
// the batches are IDENTICAL whatever the worker count (0 included), so a run may even resume with
// a different one. The epoch ends at the first batch that comes up short (the stream ran dry):
// it is handed out if it has rows and drop_last is false, and the next call returns nullptr.
// batches_per_epoch() is -1 (unknown until the stream runs dry); shuffle and samplers do not apply
// (a stream shuffles itself, per epoch, if it wants to). LoaderState is exact here too: the
// samples each worker has consumed follow from (epoch, position) — worker w has filled the batches
// k < position with k % N == w — so load_state() reopens the streams at position * batch_size.
// Errors name the stream sample, batch, epoch and worker.
class DataLoader {
 public:
  // `sampler` replaces the default one (then `shuffle` must be false, as in PyTorch).
  DataLoader(DatasetPtr dataset, LoaderOptions options, SamplerPtr sampler = nullptr);
  // Batches of a stream (see above); `options.shuffle` must be false.
  DataLoader(IterableDatasetPtr dataset, LoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next batch of the current epoch, or nullptr once the epoch is exhausted — that call also
  // moves the loader to the start of the next epoch. Not thread-safe: one consumer.
  const Batch* next();

  // -1 for an iterable dataset (the epoch ends when its stream runs dry).
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  const LoaderOptions& options() const { return options_; }
  const SampleSpec& spec() const { return spec_; }

  LoaderState state() const;
  // Continues from `state` (its seed must equal the loader's). Invalidates the current batch.
  void load_state(const LoaderState& state);

 private:
  struct Slot {
    std::vector<Tensor> full;               // [batch_size, ...] per field, allocated once
    std::vector<std::vector<Tensor>> rows;  // rows[r][f] = full[f].select(0, r), made once
    Batch batch;
    int64_t ready = -1;  // the batch number the slot holds, -1 = none
    int64_t filled = 0;  // rows written (fewer at the end of the epoch)
    std::string error;   // set instead of data when a read failed
  };
  // One worker's stream over an iterable dataset, positioned before stream sample `at` of `epoch`.
  // Touched only by its worker (or by the consumer when there are no workers).
  struct Cursor {
    std::unique_ptr<SampleStream> stream;
    uint64_t epoch = 0;
    int64_t at = 0;
  };

  void make_pool();
  void start_workers();
  void worker_loop(int worker);
  bool claimable_locked(int worker) const;
  int64_t claim_locked(int worker);
  // Fill batch k into `slot` (sets slot.filled, or slot.error on failure).
  void fill(Slot& slot, int64_t k, uint64_t epoch, int worker);
  void fill_indexed(Slot& slot, int64_t k, uint64_t epoch) const;
  void fill_streamed(Slot& slot, int64_t k, uint64_t epoch, int worker);
  void note_end_locked(const Slot& slot, int64_t k);  // a short stream batch ends the epoch
  void start_epoch_locked();
  void stop_workers_locked(std::unique_lock<std::mutex>& lock);
  const Batch& publish(Slot& slot, int64_t k);

  DatasetPtr dataset_;
  IterableDatasetPtr iterable_;
  std::vector<Cursor> cursors_;  // per worker (one when there are no workers)
  LoaderOptions options_;
  SamplerPtr sampler_;
  SampleSpec spec_;
  int64_t batches_per_epoch_ = 0;
  std::vector<Slot> slots_;
  std::vector<int64_t> order_;  // this epoch's sample indices

  // Shared with workers, guarded by mu_.
  mutable std::mutex mu_;
  std::condition_variable work_cv_;   // workers wait for claimable batches
  std::condition_variable ready_cv_;  // consumer waits for its batch; stop waits for in_flight_
  uint64_t epoch_ = 0;
  int64_t position_ = 0;            // next batch to hand out
  int64_t released_ = 0;            // batches the consumer has given back
  int64_t next_claim_ = 0;          // next batch a worker may take
  std::vector<int64_t> own_claim_;  // iterable: worker w's next batch (≡ w mod workers)
  int64_t end_ = 0;                 // batches in this epoch: known up front, or once a stream runs dry
  int in_flight_ = 0;
  bool running_ = false;    // workers may claim batches of this epoch
  bool need_start_ = true;  // order_ must be (re)generated / the pipeline restarted
  bool holding_ = false;    // the consumer holds batch position_ - 1
  bool shutdown_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace ft::data
