// Expandable segments for the device allocator (caching_allocator.cpp, FT_CUDA_EXPANDABLE_SEGMENTS):
// one reserved span of device addresses per (device, stream, graph pool), as large as the
// device's memory, with physical memory mapped into it one granule (2 MiB on current GPUs) at a
// time, where blocks are placed (core/range_allocator.h).
//
// Why: with one cudaMalloc per block, memory freed as many small blocks cannot serve one large
// request, and reserved memory grows past what the model needs when block sizes vary (a batch of
// another length, a bucketed sequence). Here freed neighbours merge, a large block maps only the
// granules it lacks at the end of the span, and empty_cache unmaps whole free granules anywhere.
//
// Uses the driver's virtual memory calls (cuMemAddressReserve, cuMemCreate, cuMemMap,
// cuMemSetAccess), found through the runtime (cudaGetDriverEntryPointByVersion), so the binary
// still links no libcuda and starts without a driver.
#pragma once
#include <cstdint>
#include <map>

#include "core/range_allocator.h"

namespace ft::cuda {

class ExpandableSegment {
 public:
  // Reserves addresses for the device's whole memory; maps nothing yet.
  explicit ExpandableSegment(int device);
  ~ExpandableSegment();  // unmaps and releases everything: the caller knows the device is done with it
  ExpandableSegment(const ExpandableSegment&) = delete;
  ExpandableSegment& operator=(const ExpandableSegment&) = delete;

  struct Placed {
    void* ptr = nullptr;       // null: no room (addresses, or device memory when out_of_memory)
    int64_t mapped_bytes = 0;  // physical memory mapped for this block
    int64_t granules_created = 0;
    bool out_of_memory = false;  // the device had no memory for a granule the block needs
  };
  // A block of `size` bytes (a multiple of kBlockAlignment).
  Placed allocate(uint64_t size);
  // Frees the block at `ptr` (its memory stays mapped); returns its size.
  uint64_t free(void* ptr);
  // Unmaps every granule no block touches; returns the bytes unmapped. The device must be idle
  // for this segment (freed blocks' kernels done).
  int64_t unmap_free();

  bool empty() const { return ranges_.empty(); }
  int64_t mapped_bytes() const { return static_cast<int64_t>(mapped_.size() * ranges_.granule()); }
  int64_t granule_bytes() const { return static_cast<int64_t>(ranges_.granule()); }

  static constexpr uint64_t kBlockAlignment = 512;

 private:
  // Maps granules [first, last) that are not yet mapped; false when the device is out of memory
  // (what this call mapped stays mapped, counted in mapped_).
  bool map(uint64_t first, uint64_t last, int64_t& mapped_bytes, int64_t& created);

  int device_;
  uint64_t base_ = 0;                    // CUdeviceptr of the reserved span
  RangeAllocator ranges_;                // offsets from base_
  std::map<uint64_t, uint64_t> mapped_;  // granule -> its physical allocation (CUmemGenericAllocationHandle)
};

// True when the switch FT_CUDA_EXPANDABLE_SEGMENTS (core/switches.h; default off) asks for them.
// Read when a device's allocator is made: an override after that changes nothing for it.
bool expandable_segments_requested();

}  // namespace ft::cuda
