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

namespace ft {

class AllocatorBookkeeping : public Allocator {
 public:
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
  // A block of `size` bytes handed out; from_system when it was just obtained from the system.
  void count_allocation_locked(size_t size, bool from_system) {
    ++stats_.num_allocs;
    stats_.allocated_bytes += static_cast<int64_t>(size);
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    if (from_system) {
      ++stats_.num_system_allocs;
      stats_.reserved_bytes += static_cast<int64_t>(size);
    }
  }
  // A block of `size` bytes given back; to_system when it went straight back to the system.
  void count_free_locked(size_t size, bool to_system) {
    stats_.allocated_bytes -= static_cast<int64_t>(size);
    ++stats_.num_frees;
    if (to_system) {
      stats_.reserved_bytes -= static_cast<int64_t>(size);
      ++stats_.num_system_frees;
    }
  }

  mutable std::mutex mu_;
  AllocatorStats stats_;
  size_t limit_ = 0;  // 0: none

 private:
  std::unordered_map<size_t, std::vector<void*>> free_;
};

}  // namespace ft
