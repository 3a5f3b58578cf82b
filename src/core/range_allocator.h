// Placement of blocks inside one reserved address span [0, capacity), for the CUDA allocator's
// expandable segments (backend/cuda/expandable_segment.h). Pure bookkeeping, no device calls, so
// it is tested on any machine (tests/test_range_allocator.cpp).
//
// - Best fit: a block goes to the smallest free range that holds it, the lowest offset among equal
//   ones, so small blocks fill holes before the untouched tail of the span is used, and the span
//   grows only when nothing freed fits.
// - A freed block merges with free neighbours on both sides: memory freed in pieces comes back as
//   one range a larger block can use, which separate device allocations never allow (the
//   fragmentation expandable segments exist to avoid).
// - Physical memory is mapped per granule (the driver's mapping unit). free_granules() names the
//   granules no live block touches: the ones that may be unmapped.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "fasttrain/error.h"

namespace ft {

class RangeAllocator {
 public:
  RangeAllocator(uint64_t capacity, uint64_t granule) : capacity_(capacity), granule_(granule) {
    FT_CHECK(granule > 0 && capacity % granule == 0, "range allocator: capacity ", capacity,
             " is not a multiple of the granule ", granule);
    if (capacity > 0) insert_free(0, capacity);
  }

  // The offset of a new block of `size` bytes (> 0), or nothing when no free range holds it.
  std::optional<uint64_t> allocate(uint64_t size) {
    FT_CHECK(size > 0, "range allocator: a block of 0 bytes");
    auto it = by_size_.lower_bound({size, 0});
    if (it == by_size_.end()) return std::nullopt;
    const auto [free_size, offset] = *it;
    erase_free(offset, free_size);
    if (free_size > size) insert_free(offset + size, free_size - size);
    live_.emplace(offset, size);
    live_bytes_ += size;
    return offset;
  }

  // Frees the block at `offset`; returns its size.
  uint64_t free(uint64_t offset) {
    auto it = live_.find(offset);
    FT_CHECK(it != live_.end(), "range allocator: no block at offset ", offset);
    const uint64_t size = it->second;
    live_.erase(it);
    live_bytes_ -= size;
    uint64_t begin = offset, end = offset + size;
    if (auto next = by_offset_.find(end); next != by_offset_.end()) {
      end += next->second;
      erase_free(next->first, next->second);
    }
    if (auto prev = by_offset_.lower_bound(begin); prev != by_offset_.begin()) {
      --prev;
      if (prev->first + prev->second == begin) {
        begin = prev->first;
        erase_free(prev->first, prev->second);
      }
    }
    insert_free(begin, end - begin);
    return size;
  }

  // Calls f(first, last) for each run of granules [first, last) that no live block touches.
  template <class F>
  void free_granules(F f) const {
    for (const auto& [offset, size] : by_offset_) {
      const uint64_t first = (offset + granule_ - 1) / granule_, last = (offset + size) / granule_;
      if (first < last) f(first, last);
    }
  }

  // The granules [first, last) a block at `offset` of `size` bytes touches.
  std::pair<uint64_t, uint64_t> granules_of(uint64_t offset, uint64_t size) const {
    return {offset / granule_, (offset + size + granule_ - 1) / granule_};
  }

  bool empty() const { return live_.empty(); }
  uint64_t live_bytes() const { return live_bytes_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t granule() const { return granule_; }

 private:
  void insert_free(uint64_t offset, uint64_t size) {
    by_offset_.emplace(offset, size);
    by_size_.emplace(size, offset);
  }
  void erase_free(uint64_t offset, uint64_t size) {
    by_offset_.erase(offset);
    by_size_.erase({size, offset});
  }

  uint64_t capacity_, granule_;
  std::map<uint64_t, uint64_t> by_offset_;           // free ranges: offset -> size
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // the same ranges as (size, offset)
  std::unordered_map<uint64_t, uint64_t> live_;      // blocks: offset -> size
  uint64_t live_bytes_ = 0;
};

}  // namespace ft
