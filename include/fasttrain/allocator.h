// Memory for tensors. Every device has one caching allocator: freed blocks go back to a pool
// keyed by rounded size and are handed out again without calling the system (malloc/cudaMalloc),
// which keeps steady-state training free of allocation cost. Statistics are what tests and
// benchmarks read to prove zero-copy paths and measure peak memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "fasttrain/device.h"

namespace ft {

struct AllocatorStats {
  int64_t allocated_bytes = 0;       // bytes in blocks handed out and not yet freed
  int64_t reserved_bytes = 0;        // allocated plus cached bytes obtained from the system
  int64_t peak_allocated_bytes = 0;  // high-water mark of allocated_bytes since reset_peak()
  int64_t num_allocs = 0;            // allocate() calls served (cache hits included)
  int64_t num_frees = 0;
  int64_t num_system_allocs = 0;  // malloc / cudaMalloc calls: cache misses
  int64_t num_system_frees = 0;
};

// Owning pointer to device memory; the deleter returns the block to its allocator.
using DataPtr = std::unique_ptr<void, std::function<void(void*)>>;

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns nbytes of memory usable by work on `stream`, aligned to at least 64 bytes.
  // Throws ft::OutOfMemoryError stating requested, allocated and reserved bytes.
  virtual DataPtr allocate(size_t nbytes, Stream stream) = 0;
  // Marks a block as used by another stream so it is not reused before that stream's work is
  // done (no-op on the CPU).
  virtual void record_stream(void* ptr, Stream stream) {}
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
  // Returns cached, unused blocks to the system.
  virtual void empty_cache() = 0;
  // Upper bound on allocated bytes (0 = none); allocations past it raise OutOfMemoryError.
  // On the CPU this is how a memory budget is imposed (batch-size finder).
  virtual void set_memory_limit(size_t bytes) = 0;
};

Allocator& allocator_for(Device device);
// Page-locked host memory from the first device backend that has it and a usable device (CUDA),
// or nullptr when there is none. Cached
// like device memory, because page-locking costs far more than a malloc. Copies from it to the
// device are asynchronous; from ordinary memory the driver stages them, synchronously. Blocks given
// to record_stream() are reused only after that stream's work issued before the free is done, so a
// buffer is never overwritten while an asynchronous copy still reads it.
Allocator* pinned_host_allocator();

}  // namespace ft
