// What the allocators share (CPU cache, CUDA device memory, page-locked host memory): statistics,
// the memory limit and a cache of freed blocks by size class, under one mutex. Subclasses make
// the system calls and word their out-of-memory errors; the *_locked helpers expect mu_ held.
#pragma once
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "fasttrain/allocator.h"
#include "fasttrain/profiler.h"

namespace ft::memory::detail {
inline bool history_on() {
  return (profiler::detail::g_flags.load(std::memory_order_relaxed) & profiler::detail::kMemoryHistory) != 0;
}
// Called with the allocator's lock held (memory_history.cpp).
void record_allocation(const char* device, void* p, int64_t bytes, int64_t allocated_after);
void record_free(const char* device, void* p, int64_t bytes, int64_t allocated_after);
}  // namespace ft::memory::detail

namespace ft {

class AllocatorBookkeeping : public Allocator {
 public:
  // history_device: the allocator's name in the memory history ("cpu", "cuda", "pinned").
  explicit AllocatorBookkeeping(const char* history_device = "cpu") : history_device_(history_device) {}
  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
  }
  void set_memory_limit(size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    limit_ = bytes;
  }

 protected:
  // True when handing out `size` more bytes would pass the limit set by set_memory_limit.
  bool over_limit_locked(size_t size) const {
    return limit_ != 0 && stats_.allocated_bytes + static_cast<int64_t>(size) > static_cast<int64_t>(limit_);
  }
  // A cached block of exactly `size` bytes (a size class), or nullptr.
  void* take_cached_locked(size_t size) {
    auto it = free_.find(size);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    return p;
  }
  void cache_locked(void* p, size_t size) { free_[size].push_back(p); }
  // Gives every cached block back to the system with system_free(p).
  template <class SystemFree>
  void drop_cache_locked(SystemFree system_free) {
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) {
        system_free(p);
        stats_.reserved_bytes -= static_cast<int64_t>(size);
        ++stats_.num_system_frees;
      }
      blocks.clear();
    }
  }
  // Block p of `size` bytes handed out; from_system when it was just obtained from the system.
  // Recorded in the memory history under the same lock, so the history's order is the order the
  // statistics saw (its replay reaches the same peak).
  void count_allocation_locked(void* p, size_t size, bool from_system) {
    ++stats_.num_allocs;
    stats_.allocated_bytes += static_cast<int64_t>(size);
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    if (from_system) {
      ++stats_.num_system_allocs;
      stats_.reserved_bytes += static_cast<int64_t>(size);
    }
    if (memory::detail::history_on()) [[unlikely]]
      memory::detail::record_allocation(history_device_, p, static_cast<int64_t>(size), stats_.allocated_bytes);
  }
  // Block p of `size` bytes given back; to_system when it went straight back to the system.
  void count_free_locked(void* p, size_t size, bool to_system) {
    stats_.allocated_bytes -= static_cast<int64_t>(size);
    ++stats_.num_frees;
    if (to_system) {
      stats_.reserved_bytes -= static_cast<int64_t>(size);
      ++stats_.num_system_frees;
    }
    if (memory::detail::history_on()) [[unlikely]]
      memory::detail::record_free(history_device_, p, static_cast<int64_t>(size), stats_.allocated_bytes);
  }

  mutable std::mutex mu_;
  AllocatorStats stats_;
  size_t limit_ = 0;  // 0: none
  const char* history_device_;

 private:
  std::unordered_map<size_t, std::vector<void*>> free_;
};

}  // namespace ft
