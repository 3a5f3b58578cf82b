// Batches on the device the model runs on, with the copy of batch k+1 overlapping the step on
// batch k: PyTorch's pin_memory=True + .to(device, non_blocking=True) pattern, done for the user.
// Implemented in src/data/device_prefetcher.cpp.
#pragma once
#include <exception>
#include <memory>
#include <vector>

#include "fasttrain/device.h"
#include "fasttrain/loader.h"

namespace ft::data {

// Wraps a DataLoader. For a CUDA device each batch is copied into one of two device buffers on a
// copy stream of its own, and an event recorded after the copy is what the compute stream waits
// on, so the host never blocks on a copy it has just issued. next() hands out batch k and at once
// issues the copy of batch k+1, which the device runs while it computes on batch k. The copy into
// a buffer waits (on the device) for the compute stream to finish with the batch that buffer held
// two calls earlier. With `pin_memory` in the loader's options the host buffers are page-locked and
// the copies truly asynchronous; without it they are correct but staged by the driver.
//
// For the CPU device batches pass straight through: no copy, no lookahead, nothing allocated.
//
// Lookahead stops at the end of an epoch, and state() excludes a batch taken from the loader but
// not yet handed out, so a checkpoint resumes exactly as with the bare loader. An error loading
// the prefetched batch is thrown by the next() that asks for that batch, as the loader would.
class DevicePrefetcher {
 public:
  // `loader` must outlive the prefetcher. Throws ft::Error naming the device when it is not usable.
  DevicePrefetcher(DataLoader& loader, Device device);
  ~DevicePrefetcher();
  DevicePrefetcher(const DevicePrefetcher&) = delete;
  DevicePrefetcher& operator=(const DevicePrefetcher&) = delete;

  // The next batch, on device(), or nullptr once the epoch is exhausted (that call moves to the
  // next epoch, as DataLoader::next). Its tensors are valid until the next call to next() or
  // load_state(). Work that reads them must be issued on the stream that is current for device()
  // when next() returns (the compute stream): that is the stream made to wait for the copy.
  const Batch* next();

  Device device() const { return device_; }
  DataLoader& loader() { return loader_; }
  Stream copy_stream() const { return copy_stream_; }  // the null stream on the CPU

  // The position as the consumer sees it: a prefetched batch not yet handed out does not count.
  LoaderState state() const;
  // Drops the prefetched batch and continues from `state` (see DataLoader::load_state).
  void load_state(const LoaderState& state);

 private:
  struct Staged {
    std::vector<Tensor> full;         // [batch_size, ...] per field on the device, made at first use
    Batch batch;                      // views of `full` handed to the consumer
    std::unique_ptr<Event> copied;    // on the copy stream, after this batch's copies
    std::unique_ptr<Event> released;  // on the compute stream, once the consumer moved past it
  };
  void stage(int slot);    // takes the loader's next batch and issues its copy into staged_[slot]
  void release_current();  // the consumer is done issuing work on its batch

  DataLoader& loader_;
  Device device_;
  Stream copy_stream_;  // a side_stream()
  Staged staged_[2];
  int ahead_ = -1;                      // slot holding the prefetched batch, -1 when none
  bool ahead_is_end_ = false;           // the prefetch found the end of the epoch instead of a batch
  LoaderState before_ahead_;            // the loader's state before that prefetch
  int current_ = -1;                    // slot of the batch the consumer holds, -1 when none
  std::exception_ptr lookahead_error_;  // a failed prefetch, thrown when that batch is asked for
};

}  // namespace ft::data
