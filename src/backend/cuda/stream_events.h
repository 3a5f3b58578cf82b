// What the caching allocators (device and pinned host memory) do with a block other streams used:
// at free time an event marks the work each such stream has queued, and the block is reused only
// once every event is reached.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "backend/device_backend.h"
#include "fasttrain/device.h"

namespace ft::cuda {

// One event per stream, recorded now. Called from deleters, so it does not throw: a stream whose
// event cannot be recorded is waited for instead, which is slow but keeps the block safe.
inline std::vector<cudaEvent_t> record_stream_events(const std::vector<Stream>& streams) noexcept {
  std::vector<cudaEvent_t> events;
  for (const Stream& s : streams) {
    cudaEvent_t ev = nullptr;
    auto stream = static_cast<cudaStream_t>(s.handle);
    if (cudaSetDevice(s.device.index) == cudaSuccess &&
        cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess &&
        cudaEventRecord(ev, stream) == cudaSuccess) {
      events.push_back(ev);
    } else {
      if (ev != nullptr) cudaEventDestroy(ev);
      cudaGetLastError();
      try {
        note_host_sync("stream wait (a freed block's event could not be recorded)");
      } catch (...) {  // a deleter must not throw; the count is lost, the wait is not
      }
      cudaStreamSynchronize(stream);
      cudaGetLastError();
    }
  }
  return events;
}

// True once every event is reached; then destroys them. A failed query (a dead context) counts as
// reached and is cleared, so it does not resurface in an unrelated call.
inline bool events_reached_then_destroy(const std::vector<cudaEvent_t>& events) noexcept {
  const bool done =
      std::all_of(events.begin(), events.end(), [](cudaEvent_t ev) { return cudaEventQuery(ev) != cudaErrorNotReady; });
  if (!done) return false;
  cudaGetLastError();
  for (cudaEvent_t ev : events) cudaEventDestroy(ev);
  return true;
}

}  // namespace ft::cuda
