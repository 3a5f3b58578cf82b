// One record per device type: everything the core asks of a device (its kernel table, its
// allocators, and its runtime: device discovery, copies, host waits, streams, events, graphs)
// behind one struct of plain function pointers, as ggml's ggml_backend_i and PyTorch's
// DeviceGuardImplInterface do. The core includes no header of a backend's own and names no
// backend's functions: it asks find_backend(type) (or require_backend(device, what)) and calls the
// record.
//
// A backend fills what its device has and leaves the rest empty. The CPU has no streams, events
// or graphs (its work is done when a kernel returns), so those entries stay null there and the
// core treats a null stream or event handle as work already done. A device type this build has
// no backend for (CUDA in a CPU-only build) has no record: require_backend then says "this build
// has no CUDA support".
//
// Records are made on first use, not at start-up (backend/registry.cpp holds the one list of
// backends). The CUDA record loads the driver on its first device query, and cuBLASLt and cuDNN
// load on the first kernel that needs them (backend/shared_library.h), so a program that never
// touches a GPU maps none of them. Adding a device: docs/ARCHITECTURE.md, "How to add a device".
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "fasttrain/device.h"

namespace ft {
class Allocator;
}

namespace ft::backend {

struct Kernels;

struct DeviceBackend {
  DeviceType type = DeviceType::CPU;

  // --- what runs on it and where its memory comes from
  // The kernel table in effect: asked per call, because the CPU's follows the instruction-set
  // switch, which tests change in-process (core/switches.h).
  const Kernels& (*kernels)() = nullptr;
  Allocator& (*allocator)() = nullptr;
  // Page-locked host memory that this device copies from asynchronously, cached (allocator.h's
  // pinned_host_allocator()); null when the device has none.
  Allocator* (*pinned_host_allocator)() = nullptr;

  // --- devices
  int (*device_count)() = nullptr;  // 0 when the driver or every device is missing
  std::string (*device_name)(int index) = nullptr;

  // --- copies and host waits
  // Copies nbytes between host memory and this device's memory (either side may be the device, or
  // both) on `stream`; a blocking copy returns once the bytes landed.
  void (*memcpy)(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes, Stream stream,
                 bool non_blocking) = nullptr;
  void (*synchronize)(Stream) = nullptr;
  // As synchronize, but a failed device-side index check found there stays pending until the next
  // synchronize: for the engine's own waits (a scalar constant's first write), which are not where
  // the user's code asked to see results.
  void (*synchronize_internal)(Stream) = nullptr;

  // --- streams and events (opaque handles: cudaStream_t / cudaEvent_t on CUDA). Null on a device
  // whose work is done when a kernel returns.
  void* (*stream_create)(int index) = nullptr;  // non-blocking with respect to the legacy stream
  void* (*event_create)(int index) = nullptr;   // timing disabled: cheapest to record and wait on
  void (*event_destroy)(void* event) = nullptr;
  void (*event_record)(void* event, Stream) = nullptr;
  void (*stream_wait_event)(Stream, void* event) = nullptr;  // device-side wait: the host goes on
  void (*event_synchronize)(void* event) = nullptr;          // host waits
  bool (*event_query)(void* event) = nullptr;                // true once the recorded work is done

  // --- graphs (fasttrain/cuda_graph.h). begin: stream capture on `stream` (relaxed mode), this
  // thread's allocations from the allocator's `pool`; end: the instantiated executable graph
  // (throws GraphCaptureError); abort: ends a failed capture, true when the runtime had
  // invalidated it; destroy: the executable graph, then its pool. exchange_capture_pool sets the
  // pool this thread allocates from (0: the shared cache) and returns the previous one.
  void (*graph_begin)(Stream stream, uint64_t pool) = nullptr;
  void* (*graph_end)(Stream stream) = nullptr;
  bool (*graph_abort)(Stream stream) noexcept = nullptr;
  void (*graph_launch)(void* exec, Stream stream) = nullptr;
  void (*graph_destroy)(void* exec, uint64_t pool) noexcept = nullptr;
  uint64_t (*exchange_capture_pool)(uint64_t pool) noexcept = nullptr;
};

// The record for a device type, made on the first call; null when this build has no backend for
// it. Thread-safe.
const DeviceBackend* find_backend(DeviceType type);
// The record for `device`'s type, with `device` checked to exist: otherwise an error that starts
// with `what` and the device and says which is missing ("this build has no CUDA support", "device
// is not available (1 CUDA devices found)").
const DeviceBackend& require_backend(Device device, const char* what);

}  // namespace ft::backend

namespace ft {

// While alive, this thread's allocations on `device` come from the shared cache even during a
// graph capture (nothing changes on a device without graphs). For memory the host writes before
// every replay with work outside the graph (CudaGraph::before_replay): a block of the graph's pool
// may be one a captured temporary used earlier in the step, whose writes in the replay would land
// on what the host wrote. The caller keeps the block alive as long as the graph
// (CudaGraph::keep_alive), so nothing else gets it either.
class OutsideGraphPool {
 public:
  explicit OutsideGraphPool(Device device)
      : exchange_(backend::require_backend(device, "OutsideGraphPool").exchange_capture_pool),
        saved_(exchange_ != nullptr ? exchange_(0) : 0) {}
  ~OutsideGraphPool() {
    if (exchange_ != nullptr) exchange_(saved_);
  }
  OutsideGraphPool(const OutsideGraphPool&) = delete;
  OutsideGraphPool& operator=(const OutsideGraphPool&) = delete;

 private:
  uint64_t (*exchange_)(uint64_t) noexcept;
  uint64_t saved_;
};

// Every host wait on a device calls this with what waited (SyncTracker, device.h): the backend's
// blocking copies, stream and event waits, flag read-backs and frees that wait. One relaxed load
// when no tracker is alive.
void note_host_sync(const std::string& what);
bool host_sync_tracking();  // a tracker is alive or a graph captures: callers that build a name check first

}  // namespace ft
