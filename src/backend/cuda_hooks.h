// The few entry points the core needs from the CUDA backend. The CUDA backend fills them in at
// start-up when it is compiled in; without it they stay empty and the core reports "no CUDA
// support" instead of failing to link or to start. This keeps the core free of CUDA headers and
// lets the same binary run on machines without a driver.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "fasttrain/device.h"

namespace ft {

class Allocator;

struct CudaHooks {
  int (*device_count)() = nullptr;  // 0 when no driver or no GPU
  std::string (*device_name)(int device) = nullptr;
  void (*synchronize)(Stream) = nullptr;
  // As synchronize, but a failed device-side index check found there stays pending until the next
  // synchronize: for the engine's own waits (a scalar constant's first write), which are not where
  // the user's code asked to see results.
  void (*synchronize_internal)(Stream) = nullptr;
  // Copies nbytes between host and device memory (either side may be the device) on `stream`.
  void (*memcpy)(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes, Stream stream,
                 bool non_blocking) = nullptr;

  // Streams and events (handles are cudaStream_t / cudaEvent_t).
  void* (*stream_create)(int device) = nullptr;  // non-blocking with respect to the legacy stream
  void* (*event_create)(int device) = nullptr;   // timing disabled: cheapest to record and wait on
  void (*event_destroy)(void* event) = nullptr;
  void (*event_record)(void* event, Stream) = nullptr;
  void (*stream_wait_event)(Stream, void* event) = nullptr;  // device-side wait: the host goes on
  void (*event_synchronize)(void* event) = nullptr;          // host waits
  bool (*event_query)(void* event) = nullptr;                // true once the recorded work is done

  // CUDA graphs (fasttrain/cuda_graph.h). begin: stream capture on `stream` (relaxed mode), this
  // thread's allocations from the allocator's `pool`; end: the instantiated cudaGraphExec_t
  // (throws GraphCaptureError); abort: ends a failed capture, true when the runtime had
  // invalidated it; destroy: the executable graph, then its pool.
  void (*graph_begin)(Stream stream, uint64_t pool) = nullptr;
  void* (*graph_end)(Stream stream) = nullptr;
  bool (*graph_abort)(Stream stream) noexcept = nullptr;
  void (*graph_launch)(void* exec, Stream stream) = nullptr;
  void (*graph_destroy)(void* exec, uint64_t pool) noexcept = nullptr;
  // Sets the pool this thread allocates from (0: the shared cache) and returns the previous one
  // (OutsideGraphPool below).
  uint64_t (*exchange_capture_pool)(uint64_t pool) noexcept = nullptr;

  // Page-locked host memory (cudaHostAlloc), cached; see pinned_host_allocator().
  Allocator* pinned_allocator = nullptr;
};

CudaHooks& cuda_hooks();

// While alive, this thread's allocations come from the shared cache even during a capture. For
// memory the host writes before every replay with work outside the graph (CudaGraph::before_replay):
// a block of the graph's pool may be one a captured temporary used earlier in the step, whose
// writes in the replay would land on what the host wrote. The caller keeps the block alive as
// long as the graph (CudaGraph::keep_alive), so nothing else gets it either.
class OutsideGraphPool {
 public:
  OutsideGraphPool() : saved_(cuda_hooks().exchange_capture_pool(0)) {}
  ~OutsideGraphPool() { cuda_hooks().exchange_capture_pool(saved_); }
  OutsideGraphPool(const OutsideGraphPool&) = delete;
  OutsideGraphPool& operator=(const OutsideGraphPool&) = delete;

 private:
  uint64_t saved_;
};

// Every host wait on a CUDA device calls this with what waited (SyncTracker, device.h): the
// backend's blocking copies, stream and event waits, flag read-backs and cudaFree. One relaxed
// load when no tracker is alive.
void note_host_sync(const std::string& what);
bool host_sync_tracking();  // a tracker is alive or a graph captures: callers that build a name check first

}  // namespace ft
