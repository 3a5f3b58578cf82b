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
// Sets this thread's pool (0: the shared cache) and returns the previous one (the backend
// record's exchange_capture_pool).
uint64_t exchange_capture_pool(uint64_t pool) noexcept;
}  // namespace ft::cuda
