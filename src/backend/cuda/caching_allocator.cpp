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
// - With FT_CUDA_EXPANDABLE_SEGMENTS=1, blocks are not separate cudaMallocs: each (device, stream,
//   pool) places its blocks in one expandable segment (expandable_segment.h), sized to 512 bytes
//   rather than a size class, freed neighbours merged, physical memory mapped per granule as the
//   segment grows and unmapped by empty_cache. Stream, event and pool rules are the same.
#include <cuda_runtime.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "backend/cuda/caching_allocator.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/expandable_segment.h"
#include "backend/cuda/stream_events.h"
#include "backend/device_backend.h"
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
    std::lock_guard<std::mutex> lock(mu_);
    const size_t size = block_size_locked(nbytes);
    reclaim_finished_locked();
    if (over_limit_locked(size))
      throw OutOfMemoryError(oom_message(stream.device, nbytes, "over the memory limit of " + std::to_string(limit_)));
    const Key key{stream.device.index, stream.handle, size, tls_capture_pool};
    void* p = nullptr;
    bool from_system = false;  // a cudaMalloc (an expandable segment counts its mappings itself)
    if (expandable_locked()) {
      p = segment_allocate_locked(key, nbytes);
    } else if (auto it = free_.find(key); it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
    } else {
      p = device_malloc_locked(stream.device, size, nbytes);
      from_system = true;
    }
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
    for (auto it = segments_.begin(); it != segments_.end();) {
      if (std::get<2>(it->first) == pool && it->second->empty()) {
        drop_segment_locked(*it->second);
        it = segments_.erase(it);
      } else {
        ++it;
      }
    }
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
  using SegmentKey = std::tuple<int, void*, uint64_t>;  // device, stream, pool

  // Decided at the first allocation, so a bad FT_CUDA_EXPANDABLE_SEGMENTS is an error there
  // rather than at start-up.
  bool expandable_locked() {
    if (!expandable_) expandable_ = expandable_segments_requested();
    return *expandable_;
  }
  size_t block_size_locked(size_t nbytes) {
    nbytes = std::max<size_t>(nbytes, 1);
    if (!expandable_locked()) return allocation_size_class(nbytes);
    constexpr size_t a = ExpandableSegment::kBlockAlignment;
    return (nbytes + a - 1) / a * a;
  }

  ExpandableSegment& segment_locked(const Key& key) {
    std::unique_ptr<ExpandableSegment>& seg = segments_[SegmentKey{key.device, key.stream, key.pool}];
    if (!seg) seg = std::make_unique<ExpandableSegment>(key.device);
    return *seg;
  }

  // A block of key.size bytes in the key's segment; retried once after empty_cache's unmapping.
  void* segment_allocate_locked(const Key& key, size_t nbytes) {
    check(cudaSetDevice(key.device), "cuda allocator: set device");
    ExpandableSegment::Placed placed = segment_locked(key).allocate(key.size);
    if (placed.ptr == nullptr) {
      release_cache_locked();
      placed = segment_locked(key).allocate(key.size);
    }
    stats_.reserved_bytes += placed.mapped_bytes;
    stats_.num_system_allocs += placed.granules_created;
    if (placed.ptr != nullptr) return placed.ptr;
    throw OutOfMemoryError(oom_message(
        Device::cuda(key.device), nbytes,
        detail::concat(placed.out_of_memory ? "no device memory to map " : "no room in the expandable segment for ",
                       key.size, " bytes, ", device_memory_state())));
  }

  // Unmaps what a segment maps and no block uses; the device must be done with its freed blocks.
  void unmap_segment_locked(ExpandableSegment& seg) noexcept {
    try {
      const int64_t unmapped = seg.unmap_free();
      stats_.reserved_bytes -= unmapped;
      stats_.num_system_frees += unmapped / seg.granule_bytes();
    } catch (...) {  // deleters' path: the granules stay mapped, which is safe
    }
  }
  // Counts a segment about to be destroyed (its destructor unmaps what it maps) as given back.
  void drop_segment_locked(const ExpandableSegment& seg) noexcept {
    stats_.reserved_bytes -= seg.mapped_bytes();
    stats_.num_system_frees += seg.mapped_bytes() / seg.granule_bytes();
  }

  // A freed block (its stream's later work may reuse it at once) back to its cache.
  void cache_block_locked(void* p, const Key& key) {
    if (expandable_locked())
      segment_locked(key).free(p);
    else
      free_[key].push_back(p);
  }

  // "the device has N MiB free of M MiB", for out-of-memory messages.
  static std::string device_memory_state() {
    size_t free_b = 0, total_b = 0;
    std::string state = "device memory unknown";
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
      state = detail::concat("the device has ", mib(static_cast<int64_t>(free_b)), " free of ",
                             mib(static_cast<int64_t>(total_b)));
    cudaGetLastError();
    return state;
  }

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
      throw OutOfMemoryError(oom_message(device, nbytes,
                                         detail::concat("cudaMalloc of ", size, " bytes failed (",
                                                        cudaGetErrorString(err), "), ", device_memory_state())));
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
      cache_block_locked(ptr, block.key);
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
        cache_block_locked(it->ptr, it->key);
      it = parked_.erase(it);
    }
  }

  bool released_locked(const Key& key) const { return key.pool != 0 && released_pools_.count(key.pool) != 0; }

  // A free block of a released graph pool back to the device. Runs from deleters: no throw.
  void free_to_device_locked(void* p, const Key& key) noexcept {
    cudaSetDevice(key.device);
    if (expandable_locked()) {
      auto it = segments_.find(SegmentKey{key.device, key.stream, key.pool});
      if (it == segments_.end()) return;
      try {
        it->second->free(p);
      } catch (...) {  // not a block of the segment: nothing to give back
      }
      if (it->second->empty()) {
        drop_segment_locked(*it->second);
        segments_.erase(it);
      }
      return;
    }
    cudaFree(p);
    cudaGetLastError();
    stats_.reserved_bytes -= static_cast<int64_t>(key.size);
    ++stats_.num_system_frees;
  }

  void release_cache_locked() {
    if (!segments_.empty()) {
      // Unmapping memory that queued kernels may still touch is not ordered with them, as
      // cudaFree is: wait for the device first.
      note_host_sync("cuda allocator: unmapping cached granules");
      int waited = -1;  // keys are ordered by device first: one wait per device
      for (auto& [key, seg] : segments_) {
        if (std::get<2>(key) != 0) continue;  // a live graph's: its replays write there
        if (std::get<0>(key) != waited) {
          waited = std::get<0>(key);
          check(cudaSetDevice(waited), "cuda allocator: set device");
          check(cudaDeviceSynchronize(), "cuda allocator: wait before unmapping");
        }
        unmap_segment_locked(*seg);
      }
    }
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
  std::optional<bool> expandable_;
  std::map<SegmentKey, std::unique_ptr<ExpandableSegment>> segments_;
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

uint64_t exchange_capture_pool(uint64_t pool) noexcept { return std::exchange(tls_capture_pool, pool); }

}  // namespace ft::cuda
