// CPU caching allocator. Sizes are rounded up to a size class (core/size_class.h), and freed
// blocks are kept per class for reuse. Reuse matters on the CPU too: a fresh multi-megabyte malloc
// is served by mmap and page-faulted on first touch, which costs more than many small kernels.
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/cuda_hooks.h"
#include "core/size_class.h"
#include "fasttrain/allocator.h"
#include "fasttrain/error.h"

namespace ft {
namespace {

std::string mb(int64_t bytes) { return std::to_string(bytes / (1024 * 1024)) + " MiB"; }

class CpuCachingAllocator final : public Allocator {
 public:
  DataPtr allocate(size_t nbytes, Stream) override {
    size_t size = allocation_size_class(std::max<size_t>(nbytes, 1));
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (limit_ && stats_.allocated_bytes + static_cast<int64_t>(size) > static_cast<int64_t>(limit_))
        throw OutOfMemoryError(detail::concat("cpu: out of memory: requested ", nbytes, " bytes with ",
                                              stats_.allocated_bytes, " bytes allocated and ", stats_.reserved_bytes,
                                              " reserved, over the memory limit of ", limit_, " bytes (", mb(limit_),
                                              ")"));
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
      }
      ++stats_.num_allocs;
      stats_.allocated_bytes += size;
      stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
      if (!p) {
        p = std::aligned_alloc(64, size);
        if (!p) {
          stats_.allocated_bytes -= size;
          --stats_.num_allocs;
          throw OutOfMemoryError(detail::concat("cpu: out of memory: requested ", nbytes, " bytes with ",
                                                stats_.allocated_bytes, " bytes allocated and ",
                                                stats_.reserved_bytes, " reserved"));
        }
        ++stats_.num_system_allocs;
        stats_.reserved_bytes += size;
      }
    }
    return DataPtr(p, [this, size](void* ptr) { release(ptr, size); });
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) {
        std::free(p);
        stats_.reserved_bytes -= size;
        ++stats_.num_system_frees;
      }
      blocks.clear();
    }
  }
  void set_memory_limit(size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    limit_ = bytes;
  }

 private:
  void release(void* p, size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.allocated_bytes -= size;
    ++stats_.num_frees;
    free_[size].push_back(p);
  }

  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  AllocatorStats stats_;
  size_t limit_ = 0;
};

Allocator* g_allocators[kNumDeviceTypes] = {};

}  // namespace

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) {
    // Intentionally leaked: tensors in static objects may be freed after main() returns.
    static CpuCachingAllocator* cpu = new CpuCachingAllocator();
    return *cpu;
  }
  Allocator* a = g_allocators[static_cast<int>(device.type)];
  FT_CHECK(a != nullptr, "device ", device.str(), " is not available: this build has no CUDA support");
  return *a;
}

void register_allocator(DeviceType type, Allocator* allocator) { g_allocators[static_cast<int>(type)] = allocator; }

Allocator* pinned_host_allocator() { return cuda_available() ? cuda_hooks().pinned_allocator : nullptr; }

}  // namespace ft
