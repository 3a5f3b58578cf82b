// The device caching allocator (PyTorch's CUDACachingAllocator idea, own code). cudaMalloc and
// cudaFree synchronise the device and cost far more than a kernel, so freed blocks are kept and
// handed out again:
//
// - Sizes are rounded to a size class (core/size_class.h: four classes per power of two, at most
//   25% waste), and free blocks are kept per (stream, size class).
// - A block belongs to the stream it was allocated on. Work on one stream runs in issue order, so
//   a block freed on the host while kernels that use it are still queued can be handed to the next
//   allocation on the same stream at once: whatever that allocation's kernels do, they run after.
// - A block another stream used too (record_stream) is parked at free time with an event per such
//   stream and returns to its free list once every event is reached, so it is never reused while
//   another stream may still read or write it.
// - While a thread captures a CUDA graph (cuda_graph.h), its allocations come from the graph's own
//   pool: a block of a pool is handed out again only inside that pool, so a replay's writes to
//   the addresses it captured never land in memory given to anything else. When the graph goes
//   (after its stream is idle), its pool's blocks go back to the device: at once when free, when
//   freed otherwise. (Its blocks belong to the graph's stream, which nothing else allocates on.)
// - When cudaMalloc fails, the cache is returned to the device and the allocation retried once;
//   a second failure raises OutOfMemoryError stating the requested, allocated and reserved bytes
//   and the device's free and total memory.
#include <cuda_runtime.h>

#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backend/cuda/caching_allocator.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/stream_events.h"
#include "backend/cuda_hooks.h"
#include "core/allocator_bookkeeping.h"
#include "core/size_class.h"

namespace ft::cuda {
namespace {

std::string mib(int64_t bytes) { return std::to_string(bytes / (1024 * 1024)) + " MiB"; }

thread_local uint64_t tls_capture_pool = 0;  // the pool this thread allocates from (0: the shared cache)

class DeviceCachingAllocator final : public AllocatorBookkeeping {
 public:
  DeviceCachingAllocator() : AllocatorBookkeeping("cuda") {}

  DataPtr allocate(size_t nbytes, Stream stream) override {
    const int devices = cuda_device_count();
    FT_CHECK(stream.device.index >= 0 && stream.device.index < devices, stream.device.str(),
             ": device is not available (", devices, " CUDA devices found)");
    const size_t size = allocation_size_class(std::max<size_t>(nbytes, 1));
    std::lock_guard<std::mutex> lock(mu_);
    reclaim_finished_locked();
    if (over_limit_locked(size))
      throw OutOfMemoryError(oom_message(stream.device, nbytes, "over the memory limit of " + std::to_string(limit_)));
    const Key key{stream.device.index, stream.handle, size, tls_capture_pool};
    void* p = nullptr;
    auto it = free_.find(key);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
    }
    const bool from_system = p == nullptr;
    if (from_system) p = device_malloc_locked(stream.device, size, nbytes);
    in_use_[p] = Block{key, {}};
    count_allocation_locked(p, size, from_system);
    return DataPtr(p, [this](void* ptr) { release(ptr); });
  }

  // `ptr` may point anywhere inside a block (a view's data).
  void record_stream(void* ptr, Stream stream) override {
    if (!stream.device.is_cuda()) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = in_use_.upper_bound(ptr);
    FT_CHECK(it != in_use_.begin(), "cuda allocator: record_stream: ", ptr, " is not in a device block");
    --it;
    FT_CHECK(static_cast<const char*>(ptr) < static_cast<const char*>(it->first) + it->second.key.size,
             "cuda allocator: record_stream: ", ptr, " is not in a device block");
    if (stream.handle == it->second.key.stream) return;  // its own stream orders its uses already
    std::vector<Stream>& streams = it->second.other_streams;
    if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    reclaim_finished_locked();
    release_cache_locked();
  }

  // A graph's pool is done with (nothing queued uses it): its free blocks go back to the
  // device now, its blocks in use when they are freed.
  void release_pool(uint64_t pool) {
    std::lock_guard<std::mutex> lock(mu_);
    released_pools_.insert(pool);
    for (auto it = free_.begin(); it != free_.end();) {
      if (it->first.pool != pool) {
        ++it;
        continue;
      }
      for (void* p : it->second) free_to_device_locked(p, it->first);
      it = free_.erase(it);
    }
  }

 private:
  struct Key {
    int device;
    void* stream;
    size_t size;
    uint64_t pool;  // 0: the shared cache; else a CUDA graph's
    bool operator==(const Key& o) const {
      return device == o.device && stream == o.stream && size == o.size && pool == o.pool;
    }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<void*>()(k.stream) ^ (k.size * 0x9E3779B97F4A7C15ull) ^ static_cast<size_t>(k.device) ^
             (k.pool << 40);
    }
  };
  struct Block {
    Key key;
    std::vector<Stream> other_streams;  // streams besides its own that may still use it
  };
  struct Parked {
    void* ptr;
    Key key;
    std::vector<cudaEvent_t> events;  // one per other stream, recorded at free time
  };

  std::string oom_message(Device device, size_t nbytes, const std::string& why) const {
    return detail::concat(device.str(), ": out of memory: requested ", nbytes, " bytes (", mib(nbytes), ") with ",
                          stats_.allocated_bytes, " bytes allocated and ", stats_.reserved_bytes, " reserved (",
                          mib(stats_.reserved_bytes), "); ", why);
  }

  void* device_malloc_locked(Device device, size_t size, size_t nbytes) {
    check(cudaSetDevice(device.index), "cuda allocator: set device");
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      // The cache may hold the memory: give it back (cudaFree waits for the device) and retry.
      cudaGetLastError();
      release_cache_locked();
      err = cudaMalloc(&p, size);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      std::string device_state = "device memory unknown";
      if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
        device_state = detail::concat("the device has ", mib(static_cast<int64_t>(free_b)), " free of ",
                                      mib(static_cast<int64_t>(total_b)));
      cudaGetLastError();
      throw OutOfMemoryError(oom_message(
          device, nbytes,
          detail::concat("cudaMalloc of ", size, " bytes failed (", cudaGetErrorString(err), "), ", device_state)));
    }
    return p;
  }

  // Runs from a DataPtr deleter, so it must not throw.
  void release(void* ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = in_use_.find(ptr);
    if (it == in_use_.end()) return;
    Block block = std::move(it->second);
    in_use_.erase(it);
    count_free_locked(ptr, block.key.size, /*to_system=*/false);
    if (released_locked(block.key) && block.other_streams.empty()) {
      free_to_device_locked(ptr, block.key);
      return;
    }
    Parked parked{ptr, block.key, record_stream_events(block.other_streams)};
    if (parked.events.empty())
      free_[block.key].push_back(ptr);
    else
      parked_.push_back(std::move(parked));
  }

  void reclaim_finished_locked() {
    for (auto it = parked_.begin(); it != parked_.end();) {
      if (!events_reached_then_destroy(it->events)) {
        ++it;
        continue;
      }
      if (released_locked(it->key))
        free_to_device_locked(it->ptr, it->key);
      else
        free_[it->key].push_back(it->ptr);
      it = parked_.erase(it);
    }
  }

  bool released_locked(const Key& key) const { return key.pool != 0 && released_pools_.count(key.pool) != 0; }

  // A free block of a released graph pool back to the device. Runs from deleters: no throw.
  void free_to_device_locked(void* p, const Key& key) noexcept {
    cudaSetDevice(key.device);
    cudaFree(p);
    cudaGetLastError();
    stats_.reserved_bytes -= static_cast<int64_t>(key.size);
    ++stats_.num_system_frees;
  }

  void release_cache_locked() {
    if (!free_.empty()) note_host_sync("cuda allocator: cudaFree of cached blocks");
    for (auto& [key, blocks] : free_) {
      if (key.pool != 0) continue;  // a live graph's: its replays write there
      for (void* p : blocks) free_to_device_locked(p, key);
      blocks.clear();
    }
    cudaGetLastError();
  }

  std::map<void*, Block> in_use_;  // ordered: record_stream looks up interior pointers
  std::unordered_map<Key, std::vector<void*>, KeyHash> free_;
  std::deque<Parked> parked_;
  std::unordered_set<uint64_t> released_pools_;
};

DeviceCachingAllocator& instance() {
  // Leaked on purpose: device tensors held by static objects may be freed after main() returns,
  // when a destroyed allocator could not take them back.
  static auto* allocator = new DeviceCachingAllocator();
  return *allocator;
}

}  // namespace

Allocator& device_allocator_instance() { return instance(); }

void begin_graph_pool(uint64_t pool) { tls_capture_pool = pool; }
void end_graph_pool() { tls_capture_pool = 0; }
void release_graph_pool(uint64_t pool) { instance().release_pool(pool); }

}  // namespace ft::cuda
