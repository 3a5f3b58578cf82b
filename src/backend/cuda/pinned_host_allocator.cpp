// Page-locked host memory for batch buffers and staging (pinned_host_allocator() in allocator.h).
// cudaHostAlloc maps and locks pages and costs milliseconds, so blocks are cached by size class
// like the other allocators. A block freed while asynchronous copies from it may still be queued
// (record_stream) is parked with an event per stream and reused only once every event is reached,
// the rule PyTorch's CachingHostAllocator follows too.
#include <cuda_runtime.h>

#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/stream_events.h"
#include "core/allocator_bookkeeping.h"
#include "core/size_class.h"

namespace ft::cuda {
namespace {

class PinnedHostAllocator final : public AllocatorBookkeeping {
 public:
  PinnedHostAllocator() : AllocatorBookkeeping("pinned") {}
  DataPtr allocate(size_t nbytes, Stream) override {
    const size_t size = allocation_size_class(std::max<size_t>(nbytes, 1));
    std::lock_guard<std::mutex> lock(mu_);
    reclaim_finished_locked();
    if (over_limit_locked(size))
      throw OutOfMemoryError(detail::concat("pinned host memory: out of memory: requested ", nbytes, " bytes with ",
                                            stats_.allocated_bytes, " allocated and ", stats_.reserved_bytes,
                                            " reserved, over the limit of ", limit_));
    void* p = take_cached_locked(size);
    const bool from_system = p == nullptr;
    if (from_system) {
      // Portable: pinned for every device's context, so any GPU can copy from it asynchronously.
      cudaError_t err = cudaHostAlloc(&p, size, cudaHostAllocPortable);
      if (err != cudaSuccess) {
        cudaGetLastError();
        throw OutOfMemoryError(detail::concat("pinned host memory: out of memory: requested ", nbytes, " bytes with ",
                                              stats_.allocated_bytes, " allocated and ", stats_.reserved_bytes,
                                              " reserved (cudaHostAlloc: ", cudaGetErrorString(err), ")"));
      }
    }
    in_use_[p] = InUse{size, {}};
    count_allocation_locked(p, size, from_system);
    return DataPtr(p, [this](void* ptr) { release(ptr); });
  }

  // `ptr` may point anywhere inside a block (a view's data).
  void record_stream(void* ptr, Stream stream) override {
    if (!stream.device.is_cuda()) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = in_use_.upper_bound(ptr);
    FT_CHECK(it != in_use_.begin(), "pinned host memory: record_stream: ", ptr, " is not in a pinned block");
    --it;
    const auto* base = static_cast<const char*>(it->first);
    FT_CHECK(static_cast<const char*>(ptr) < base + it->second.size, "pinned host memory: record_stream: ", ptr,
             " is not in a pinned block");
    std::vector<Stream>& streams = it->second.streams;
    if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    reclaim_finished_locked();
    drop_cache_locked([](void* p) { cudaFreeHost(p); });
  }

 private:
  struct InUse {
    size_t size;
    std::vector<Stream> streams;  // streams that may still read or write the block
  };
  struct Parked {
    void* ptr;
    size_t size;
    std::vector<cudaEvent_t> events;  // one per recorded stream, recorded at free time
  };

  // Runs from a DataPtr deleter, so it must not throw.
  void release(void* ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = in_use_.find(ptr);
    if (it == in_use_.end()) return;
    const InUse block = std::move(it->second);
    in_use_.erase(it);
    count_free_locked(ptr, block.size, /*to_system=*/false);
    Parked parked{ptr, block.size, record_stream_events(block.streams)};
    if (parked.events.empty())
      cache_locked(ptr, parked.size);
    else
      parked_.push_back(std::move(parked));
  }

  // Moves parked blocks whose copies have all finished to the free lists.
  void reclaim_finished_locked() {
    for (auto it = parked_.begin(); it != parked_.end();) {
      if (!events_reached_then_destroy(it->events)) {
        ++it;
        continue;
      }
      cache_locked(it->ptr, it->size);
      it = parked_.erase(it);
    }
  }

  std::map<void*, InUse> in_use_;  // ordered: record_stream looks up interior pointers
  std::deque<Parked> parked_;
};

}  // namespace

Allocator& pinned_host_allocator_instance() {
  // Leaked on purpose: pinned tensors held by static objects may be freed after main() returns.
  static auto* allocator = new PinnedHostAllocator();
  return *allocator;
}

}  // namespace ft::cuda
