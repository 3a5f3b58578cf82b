// Error handling shared by the CUDA backend's files.
#pragma once
#include <cuda_runtime.h>

#include "fasttrain/allocator.h"
#include "fasttrain/error.h"

namespace ft::cuda {

// Throws ft::Error naming the operation and the CUDA error. Clears the runtime's last-error state
// first so a recoverable failure (an allocation) does not resurface in the next unrelated call.
inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();
    FT_FAIL(what, ": CUDA error ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  }
}

// The process's page-locked host allocator (src/backend/cuda/pinned_host_allocator.cpp).
Allocator& pinned_host_allocator_instance();

}  // namespace ft::cuda
