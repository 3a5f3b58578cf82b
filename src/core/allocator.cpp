// CPU caching allocator. Sizes are rounded up to a size class (core/size_class.h), and freed
// blocks are kept per class for reuse. Reuse matters on the CPU too: a fresh multi-megabyte malloc
// is served by mmap and page-faulted on first touch, which costs more than many small kernels.
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/device_backend.h"
#include "core/allocator_bookkeeping.h"
#include "core/host_allocator.h"
#include "core/size_class.h"
#include "fasttrain/allocator.h"
#include "fasttrain/error.h"

namespace ft {
namespace {

std::string mb(int64_t bytes) { return std::to_string(bytes / (1024 * 1024)) + " MiB"; }

class CpuCachingAllocator final : public AllocatorBookkeeping {
 public:
  DataPtr allocate(size_t nbytes, Stream) override {
    const size_t size = allocation_size_class(std::max<size_t>(nbytes, 1));
    std::lock_guard<std::mutex> lock(mu_);
    if (over_limit_locked(size))
      throw OutOfMemoryError(detail::concat(
          "cpu: out of memory: requested ", nbytes, " bytes with ", stats_.allocated_bytes, " bytes allocated and ",
          stats_.reserved_bytes, " reserved, over the memory limit of ", limit_, " bytes (", mb(limit_), ")"));
    void* p = take_cached_locked(size);
    const bool from_system = p == nullptr;
    if (from_system) {
      // aligned_alloc requires the size to be a multiple of the alignment (C11 7.22.3.1; otherwise
      // undefined, and ASan stops there), which the size classes below 512 bytes are not (80, 96,
      // 160, ...). The spare tail is never handed out: the block stays in its size class.
      p = std::aligned_alloc(64, (size + 63) / 64 * 64);
      if (!p)
        throw OutOfMemoryError(detail::concat("cpu: out of memory: requested ", nbytes, " bytes with ",
                                              stats_.allocated_bytes, " bytes allocated and ", stats_.reserved_bytes,
                                              " reserved"));
    }
    count_allocation_locked(p, size, from_system);
    return DataPtr(p, [this, size](void* ptr) { release(ptr, size); });
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    drop_cache_locked([](void* p) { std::free(p); });
  }

 private:
  void release(void* p, size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    count_free_locked(p, size, /*to_system=*/false);
    cache_locked(p, size);
  }
};

}  // namespace

Allocator& host_allocator() {
  // Intentionally leaked: tensors in static objects may be freed after main() returns.
  static CpuCachingAllocator* cpu = new CpuCachingAllocator();
  return *cpu;
}

Allocator& allocator_for(Device device) {
  const backend::DeviceBackend* b = backend::find_backend(device.type);
  FT_CHECK(b != nullptr, "device ", device.str(), " is not available: this build has no ",
           device_type_label(device.type), " support");
  return b->allocator();
}

Allocator* pinned_host_allocator() {
  for (int t = 0; t < kNumDeviceTypes; ++t) {
    const backend::DeviceBackend* b = backend::find_backend(static_cast<DeviceType>(t));
    if (b != nullptr && b->pinned_host_allocator != nullptr && b->device_count() > 0) return b->pinned_host_allocator();
  }
  return nullptr;
}

}  // namespace ft
