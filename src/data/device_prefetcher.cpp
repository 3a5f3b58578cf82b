// DevicePrefetcher: double-buffered device batches with copies on their own stream (see
// device_prefetcher.h for the ordering rules).
#include "fasttrain/device_prefetcher.h"

#include <exception>

#include "backend/device_backend.h"
#include "fasttrain/allocator.h"
#include "fasttrain/error.h"

namespace ft::data {
namespace {

Device checked_device(Device device) {
  if (device.is_cuda()) {
    const int n = cuda_device_count();
    FT_CHECK(device.index < n, "DevicePrefetcher: device ", device.str(), " is not available (", n,
             " CUDA devices found)");
  }
  return device;
}

}  // namespace

DevicePrefetcher::DevicePrefetcher(DataLoader& loader, Device device)
    : loader_(loader), device_(checked_device(device)), copy_stream_(side_stream(device_)) {
  if (device_.is_cpu()) return;
  for (Staged& s : staged_) {
    s.copied = std::make_unique<Event>(device_);
    s.released = std::make_unique<Event>(device_);
  }
}

DevicePrefetcher::~DevicePrefetcher() {
  // The device buffers go back to the allocator with the prefetcher: let queued copies into them
  // finish first. A failure here (a lost device) has nowhere to go from a destructor.
  if (device_.is_cpu()) return;
  try {
    synchronize(copy_stream_);
  } catch (const Error&) {
  }
}

void DevicePrefetcher::stage(int slot) {
  before_ahead_ = loader_.state();
  const Batch* host = loader_.next();
  if (host == nullptr) {
    ahead_is_end_ = true;
    return;
  }
  Staged& s = staged_[slot];
  const Stream copy = copy_stream_;
  const int64_t b = loader_.options().batch_size;
  if (s.full.empty()) {
    for (const FieldSpec& fs : loader_.spec()) {
      Shape shape = fs.shape;
      shape.insert(0, b);
      s.full.push_back(empty(shape, TensorOptions(fs.dtype, device_)));
    }
    s.batch.fields = s.full;
  }
  // This buffer last held the batch before the consumer's previous one; the compute stream may
  // still be reading it, so the copy waits for that on the device.
  s.released->block(copy);
  for (size_t f = 0; f < host->fields.size(); ++f) {
    const Tensor& src = host->fields[f];  // contiguous: whole rows of a contiguous buffer
    backend::find_backend(device_.type)
        ->memcpy(s.full[f].raw_data(), device_, src.raw_data(), Device::cpu(), src.nbytes(), copy,
                 /*non_blocking=*/true);
    if (src.is_pinned()) pinned_host_allocator()->record_stream(src.raw_data(), copy);
  }
  s.copied->record(copy);
  for (size_t f = 0; f < s.full.size(); ++f)
    s.batch.fields[f] = host->rows == b ? s.full[f] : s.full[f].narrow(0, 0, host->rows);
  s.batch.epoch = host->epoch;
  s.batch.index = host->index;
  s.batch.rows = host->rows;
  s.batch.spec = host->spec;
  ahead_ = slot;
}

void DevicePrefetcher::release_current() {
  if (current_ < 0) return;
  staged_[current_].released->record(current_stream(device_));
  current_ = -1;
}

const Batch* DevicePrefetcher::next() {
  if (device_.is_cpu()) return loader_.next();
  if (lookahead_error_) {  // the batch that failed to load is the one asked for now
    release_current();
    std::exception_ptr error = lookahead_error_;
    lookahead_error_ = nullptr;
    std::rethrow_exception(error);  // the loader stays at that batch: the next call retries it
  }
  if (ahead_ < 0 && !ahead_is_end_) stage(current_ == 0 ? 1 : 0);
  if (ahead_is_end_) {  // the loader has already moved to the next epoch
    ahead_is_end_ = false;
    release_current();
    return nullptr;
  }
  const int slot = ahead_;
  ahead_ = -1;
  Staged& s = staged_[slot];
  s.copied->block(current_stream(device_));  // the step on this batch starts after its copy
  release_current();
  current_ = slot;
  // The loader refills the host buffer once stage() asks it for the next batch, so the copy from
  // it must be complete. It was issued one call ago and has normally finished long since: ask
  // first, and wait (a host synchronisation, counted by --detect-sync) only when it has not.
  if (!s.copied->query()) s.copied->synchronize();
  try {
    stage(1 - slot);  // batch k+1's copy runs while the device computes on batch k
  } catch (...) {
    lookahead_error_ = std::current_exception();  // batch k is good: report k+1's error when asked for it
  }
  return &s.batch;
}

LoaderState DevicePrefetcher::state() const { return (ahead_ >= 0 || ahead_is_end_) ? before_ahead_ : loader_.state(); }

void DevicePrefetcher::load_state(const LoaderState& state) {
  if (!device_.is_cpu()) release_current();
  ahead_ = -1;
  ahead_is_end_ = false;
  lookahead_error_ = nullptr;
  loader_.load_state(state);
}

}  // namespace ft::data
