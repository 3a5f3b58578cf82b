// The CUDA side of CudaGraph (fasttrain/cuda_graph.h): stream capture in relaxed mode, with this
// thread's allocations routed to the graph's pool, instantiation, launch and destruction.
//
// Relaxed mode: the runtime does not refuse calls such as cudaMalloc (the allocator's new blocks)
// on this or other threads while a capture is open; what would break a replay is refused by the
// engine itself (note_host_sync, refuse_in_graph_capture), or by the runtime on the captured stream.
#include <cuda_runtime.h>

#include "backend/cuda/caching_allocator.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/graph.h"
#include "backend/device_backend.h"

namespace ft::cuda {
namespace {

void graph_begin(Stream s, uint64_t pool) {
  check(cudaSetDevice(s.device.index), "cuda graph capture");
  begin_graph_pool(pool);
  const cudaError_t err = cudaStreamBeginCapture(static_cast<cudaStream_t>(s.handle), cudaStreamCaptureModeRelaxed);
  if (err != cudaSuccess) end_graph_pool();
  check(err, "cuda graph capture: begin");
}

void* graph_end(Stream s) {
  end_graph_pool();
  cudaGraph_t graph = nullptr;
  check(cudaStreamEndCapture(static_cast<cudaStream_t>(s.handle), &graph), "cuda graph capture: end");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiateWithFlags(&exec, graph, 0);
  cudaGraphDestroy(graph);  // the executable graph is a copy
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw GraphCaptureError(detail::concat("cuda graph: instantiation failed: ", cudaGetErrorString(err)));
  }
  return exec;
}

bool graph_abort(Stream s) noexcept {
  end_graph_pool();
  auto stream = static_cast<cudaStream_t>(s.handle);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream, &status);
  const bool invalidated = status == cudaStreamCaptureStatusInvalidated;
  if (status != cudaStreamCaptureStatusNone) {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
  cudaGetLastError();
  return invalidated;
}

void graph_launch(void* exec, Stream s) {
  check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), static_cast<cudaStream_t>(s.handle)), "cuda graph: replay");
}

void graph_destroy(void* exec, uint64_t pool) noexcept {
  if (exec != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec));
  cudaGetLastError();
  try {
    release_graph_pool(pool);
  } catch (...) {  // a destructor's path: the pool's blocks stay cached, which is safe
  }
}

}  // namespace

void set_graph_entries(backend::DeviceBackend& b) {
  b.graph_begin = graph_begin;
  b.graph_end = graph_end;
  b.graph_abort = graph_abort;
  b.graph_launch = graph_launch;
  b.graph_destroy = graph_destroy;
  b.exchange_capture_pool = exchange_capture_pool;
}

}  // namespace ft::cuda
