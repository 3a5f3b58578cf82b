// Error handling shared by the CUDA backend's files.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "fasttrain/allocator.h"
#include "fasttrain/cuda_graph.h"
#include "fasttrain/error.h"

namespace ft::cuda {

// Errors a call makes only while a stream is being captured into a CUDA graph.
inline bool is_capture_error(cudaError_t err) {
  switch (err) {
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureMerge:
    case cudaErrorStreamCaptureUnmatched:
    case cudaErrorStreamCaptureUnjoined:
    case cudaErrorStreamCaptureIsolation:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorCapturedEvent:
    case cudaErrorStreamCaptureWrongThread: return true;
    default: return false;
  }
}

// Throws ft::Error naming the operation and the CUDA error (GraphCaptureError for what a graph
// capture refused). Clears the runtime's last-error state first so a recoverable failure (an
// allocation) does not resurface in the next unrelated call.
inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();
    std::string message = detail::concat(what, ": CUDA error ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
    if (is_capture_error(err)) throw GraphCaptureError(message);
    throw Error(message);
  }
}

// The process's page-locked host allocator (src/backend/cuda/pinned_host_allocator.cpp).
Allocator& pinned_host_allocator_instance();

}  // namespace ft::cuda
