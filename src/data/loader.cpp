// DataLoader: a fixed pool of batch buffers, worker threads filling whole batches into them, and a
// consumer that takes them strictly in order. See loader.h for the scheduling rule.
#include "fasttrain/loader.h"

#include <algorithm>
#include <exception>
#include <limits>

#include "fasttrain/error.h"
#include "fasttrain/profiler.h"

namespace ft::data {

const Tensor& Batch::field(std::string_view name) const {
  FT_CHECK(spec != nullptr, "Batch::field: the batch has no spec");
  for (size_t f = 0; f < spec->size(); ++f)
    if ((*spec)[f].name == name) return fields[f];
  std::string names;
  for (const auto& fs : *spec) names += (names.empty() ? "" : ", ") + fs.name;
  FT_FAIL("Batch::field: no field named '", name, "'; the batch has: ", names);
}

DataLoader::DataLoader(DatasetPtr dataset, LoaderOptions options, SamplerPtr sampler)
    : dataset_(std::move(dataset)), options_(options), sampler_(std::move(sampler)) {
  FT_CHECK(dataset_ != nullptr, "DataLoader: expected a dataset, found none");
  FT_CHECK(options_.batch_size >= 1, "DataLoader: expected batch_size >= 1, found ", options_.batch_size);
  FT_CHECK(options_.num_workers >= 0, "DataLoader: expected num_workers >= 0, found ", options_.num_workers);
  FT_CHECK(options_.prefetch_factor >= 1, "DataLoader: expected prefetch_factor >= 1, found ",
           options_.prefetch_factor);
  FT_CHECK(!(sampler_ && options_.shuffle),
           "DataLoader: shuffle must be false when a sampler is given (the sampler decides the order)");
  const int64_t n = dataset_->size();
  if (!sampler_) {
    sampler_ = options_.shuffle ? SamplerPtr(std::make_shared<RandomSampler>(n, options_.seed))
                                : SamplerPtr(std::make_shared<SequentialSampler>(n));
  }
  spec_ = dataset_->spec();
  FT_CHECK(!spec_.empty(), "DataLoader: expected the dataset's spec() to list at least one field, found none");

  const int64_t samples = sampler_->size();
  const int64_t b = options_.batch_size;
  batches_per_epoch_ = options_.drop_last ? samples / b : (samples + b - 1) / b;
  make_pool();
  order_.reserve(static_cast<size_t>(std::max<int64_t>(samples, 0)));
  start_workers();
}

DataLoader::DataLoader(IterableDatasetPtr dataset, LoaderOptions options)
    : iterable_(std::move(dataset)), options_(options) {
  FT_CHECK(iterable_ != nullptr, "DataLoader: expected an iterable dataset, found none");
  FT_CHECK(options_.batch_size >= 1, "DataLoader: expected batch_size >= 1, found ", options_.batch_size);
  FT_CHECK(options_.num_workers >= 0, "DataLoader: expected num_workers >= 0, found ", options_.num_workers);
  FT_CHECK(options_.prefetch_factor >= 1, "DataLoader: expected prefetch_factor >= 1, found ",
           options_.prefetch_factor);
  FT_CHECK(!options_.shuffle,
           "DataLoader: shuffle must be false for an iterable dataset (a stream decides its own order)");
  spec_ = iterable_->spec();
  FT_CHECK(!spec_.empty(), "DataLoader: expected the dataset's spec() to list at least one field, found none");
  batches_per_epoch_ = -1;
  cursors_.resize(static_cast<size_t>(std::max(1, options_.num_workers)));
  own_claim_.resize(cursors_.size());
  make_pool();
  start_workers();
}

void DataLoader::start_workers() {
  for (int w = 0; w < options_.num_workers; ++w) workers_.emplace_back([this, w] { worker_loop(w); });
}

void DataLoader::make_pool() {
  // Every buffer and every row view is made here, once, so steady state allocates nothing. With
  // pin_memory and a CUDA device the buffers are page-locked, so DevicePrefetcher's copies of them
  // are asynchronous; otherwise they are 64-byte-aligned host memory. The pool is at least the
  // worker count, so every worker can hold a batch (iterable datasets give each worker its own).
  const int64_t b = options_.batch_size;
  const int pool = std::max(2, options_.num_workers * options_.prefetch_factor);
  slots_.resize(static_cast<size_t>(pool));
  for (Slot& slot : slots_) {
    for (const FieldSpec& fs : spec_) {
      Shape shape = fs.shape;
      shape.insert(0, b);
      slot.full.push_back(options_.pin_memory ? empty_pinned(shape, fs.dtype) : empty(shape, fs.dtype));
    }
    slot.rows.resize(static_cast<size_t>(b));
    for (int64_t r = 0; r < b; ++r)
      for (const Tensor& t : slot.full) slot.rows[r].push_back(t.select(0, r));
    slot.batch.spec = &spec_;
    slot.batch.fields = slot.full;
  }
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();  // each finishes at most the batch in hand
}

void DataLoader::fill(Slot& slot, int64_t k, uint64_t epoch, int worker) {
  slot.error.clear();
  if (iterable_)
    fill_streamed(slot, k, epoch, worker);
  else
    fill_indexed(slot, k, epoch);
}

void DataLoader::fill_indexed(Slot& slot, int64_t k, uint64_t epoch) const {
  const int64_t b = options_.batch_size;
  const int64_t rows = std::min(b, static_cast<int64_t>(order_.size()) - k * b);
  slot.filled = rows;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t index = order_[static_cast<size_t>(k * b + r)];
    try {
      dataset_->read(index, epoch, slot.rows[r]);
    } catch (const std::exception& e) {
      slot.error = detail::concat("DataLoader: reading sample ", index, " (batch ", k, " of epoch ", epoch,
                                  ") failed: ", e.what());
      return;
    } catch (...) {
      slot.error = detail::concat("DataLoader: reading sample ", index, " (batch ", k, " of epoch ", epoch,
                                  ") failed with a non-standard exception");
      return;
    }
  }
}

void DataLoader::fill_streamed(Slot& slot, int64_t k, uint64_t epoch, int worker) {
  const int64_t b = options_.batch_size;
  const int64_t start = k * b;
  Cursor& c = cursors_[static_cast<size_t>(worker)];
  slot.filled = 0;
  int64_t sample = start;  // the stream sample being read, for error messages
  try {
    // Reopen only when the cursor cannot move forward to `start` (new epoch, resume, after an
    // error); otherwise skip the batches the other workers took.
    if (!c.stream || c.epoch != epoch || c.at > start) {
      c.stream.reset();
      c.stream = iterable_->open(epoch, start);
      FT_CHECK(c.stream != nullptr, "the dataset's open() returned no stream");
      c.epoch = epoch;
      c.at = start;
    }
    if (c.at < start) {
      const int64_t passed = c.stream->skip(start - c.at);
      c.at += passed;
      if (c.at < start) return;  // dry before this batch: it is empty
    }
    for (int64_t r = 0; r < b; ++r, ++sample) {
      if (!c.stream->next(slot.rows[r])) return;
      ++c.at;
      ++slot.filled;
    }
  } catch (const std::exception& e) {
    c.stream.reset();  // its position is unknown after a failure
    slot.error = detail::concat("DataLoader: reading stream sample ", sample, " (batch ", k, " of epoch ", epoch,
                                ", worker ", worker, ") failed: ", e.what());
  } catch (...) {
    c.stream.reset();
    slot.error = detail::concat("DataLoader: reading stream sample ", sample, " (batch ", k, " of epoch ", epoch,
                                ", worker ", worker, ") failed with a non-standard exception");
  }
}

void DataLoader::note_end_locked(const Slot& slot, int64_t k) {
  if (!iterable_ || !slot.error.empty() || slot.filled == options_.batch_size) return;
  // A short batch: the stream ran dry inside it. A partial one is still handed out unless drop_last.
  const int64_t end = slot.filled > 0 && !options_.drop_last ? k + 1 : k;
  end_ = std::min(end_, end);
}

bool DataLoader::claimable_locked(int worker) const {
  // Batch k may be filled once the consumer has released batch k - pool (its slot's last user).
  const int64_t k = iterable_ ? own_claim_[static_cast<size_t>(worker)] : next_claim_;
  return k < end_ && k < released_ + static_cast<int64_t>(slots_.size());
}

int64_t DataLoader::claim_locked(int worker) {
  if (!iterable_) return next_claim_++;
  const int64_t k = own_claim_[static_cast<size_t>(worker)];
  own_claim_[static_cast<size_t>(worker)] += static_cast<int64_t>(own_claim_.size());
  return k;
}

void DataLoader::worker_loop(int worker) {
  // A lane of its own in profiles; its allocations are data batches in the memory history.
  profiler::set_thread_name("loader worker " + std::to_string(worker));
  profiler::set_thread_phase(profiler::Phase::Data);
  const auto pool = static_cast<int64_t>(slots_.size());
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return shutdown_ || (running_ && claimable_locked(worker)); });
    if (shutdown_) return;
    const int64_t k = claim_locked(worker);
    const uint64_t epoch = epoch_;
    Slot& slot = slots_[static_cast<size_t>(k % pool)];
    ++in_flight_;
    lock.unlock();
    {
      profiler::Range span("load batch");
      fill(slot, k, epoch, worker);
    }
    lock.lock();
    slot.ready = k;
    note_end_locked(slot, k);
    --in_flight_;
    ready_cv_.notify_all();
    if (iterable_) work_cv_.notify_all();  // a new end_ stops the other workers' claims
  }
}

void DataLoader::stop_workers_locked(std::unique_lock<std::mutex>& lock) {
  running_ = false;
  ready_cv_.wait(lock, [&] { return in_flight_ == 0; });
  for (Slot& slot : slots_) slot.ready = -1;
  holding_ = false;
  need_start_ = true;
}

void DataLoader::start_epoch_locked() {
  if (iterable_) {
    end_ = std::numeric_limits<int64_t>::max();
    const auto n = static_cast<int64_t>(own_claim_.size());
    for (int64_t w = 0; w < n; ++w) own_claim_[static_cast<size_t>(w)] = position_ + ((w - position_ % n) + n) % n;
  } else {
    sampler_->indices(epoch_, order_);  // reuses order_'s capacity
    end_ = batches_per_epoch_;
  }
  released_ = next_claim_ = position_;
  running_ = true;
  need_start_ = false;
}

const Batch& DataLoader::publish(Slot& slot, int64_t k) {
  Batch& batch = slot.batch;
  const int64_t b = options_.batch_size;
  batch.rows = slot.filled;
  for (size_t f = 0; f < slot.full.size(); ++f)
    batch.fields[f] = batch.rows == b ? slot.full[f] : slot.full[f].narrow(0, 0, batch.rows);
  batch.epoch = epoch_;
  batch.index = k;
  holding_ = true;
  ++position_;
  return batch;
}

const Batch* DataLoader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  if (holding_) {  // the consumer is done with the previous batch: its slot may be refilled
    holding_ = false;
    released_ = position_;
    work_cv_.notify_all();
  }
  if (need_start_) {
    stop_workers_locked(lock);
    start_epoch_locked();
    work_cv_.notify_all();
  }
  auto end_epoch = [&] {
    stop_workers_locked(lock);
    ++epoch_;
    position_ = 0;
    return nullptr;
  };
  if (position_ >= end_) return end_epoch();
  const int64_t k = position_;
  Slot& slot = slots_[static_cast<size_t>(k % static_cast<int64_t>(slots_.size()))];
  if (workers_.empty()) {
    lock.unlock();  // nothing else touches the slot; keep the lock free for state() readers
    fill(slot, k, epoch_, 0);
    lock.lock();
    note_end_locked(slot, k);
  } else {
    // A worker never claims a batch past a known end, so wake for that too.
    ready_cv_.wait(lock, [&] { return slot.ready == k || position_ >= end_; });
    if (slot.ready != k) return end_epoch();
  }
  if (!slot.error.empty()) {
    // Stay at this batch: stop the workers so nothing runs past the failure; next() retries it.
    const std::string message = slot.error;
    slot.error.clear();
    stop_workers_locked(lock);
    throw Error(message);
  }
  if (position_ >= end_) return end_epoch();  // a stream ran dry before this batch, or drop_last
  return &publish(slot, k);
}

LoaderState DataLoader::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {epoch_, position_, options_.seed};
}

void DataLoader::load_state(const LoaderState& state) {
  FT_CHECK(state.seed == options_.seed, "DataLoader::load_state: the state was saved with seed ", state.seed,
           ", this loader uses seed ", options_.seed, " (the resumed run must use the same seed)");
  if (iterable_)
    FT_CHECK(state.position >= 0, "DataLoader::load_state: expected a position >= 0, found ", state.position);
  else
    FT_CHECK(state.position >= 0 && state.position <= batches_per_epoch_,
             "DataLoader::load_state: expected a position in [0, ", batches_per_epoch_, "], found ", state.position);
  std::unique_lock<std::mutex> lock(mu_);
  stop_workers_locked(lock);
  epoch_ = state.epoch;
  position_ = state.position;
}

}  // namespace ft::data
