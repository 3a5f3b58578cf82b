// The process's device memory allocator (caching_allocator.cpp), registered for DeviceType::CUDA.
#pragma once
#include <cstdint>

#include "fasttrain/allocator.h"

namespace ft::cuda {

Allocator& device_allocator_instance();

// CUDA graph pools (cuda_graph.h): between begin and end, this thread's allocations come from
// `pool` (a number above 0 no other graph uses); release hands the pool back once its graph is
// destroyed.
void begin_graph_pool(uint64_t pool);
void end_graph_pool();
void release_graph_pool(uint64_t pool);
// Sets this thread's pool (0: the shared cache) and returns the previous one.
uint64_t exchange_capture_pool(uint64_t pool) noexcept;

// While alive, this thread's allocations come from the shared cache even during a capture. For
// memory the host writes before every replay with work outside the graph (CudaGraph::before_replay):
// a block of the graph's pool may be one a captured temporary used earlier in the step, whose
// writes in the replay would land on what the host wrote. The caller keeps the block alive as
// long as the graph (CudaGraph::keep_alive), so nothing else gets it either.
class OutsideGraphPool {
 public:
  OutsideGraphPool();
  ~OutsideGraphPool();
  OutsideGraphPool(const OutsideGraphPool&) = delete;
  OutsideGraphPool& operator=(const OutsideGraphPool&) = delete;

 private:
  uint64_t saved_;
};

}  // namespace ft::cuda
