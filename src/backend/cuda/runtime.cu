// CUDA runtime glue: device discovery, streams and events, host<->device copies, and the backend
// record (device_backend.h) that hands them to the core with the device allocator and the kernel
// table, made on first use. Every host wait here ends by raising
// a failed device-side index check, if one has finished (index_checks.h). Linked against the static CUDA
// runtime, which loads the driver only when first used, so a machine without a driver sees zero
// devices instead of failing to start.
#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include "backend/cuda/caching_allocator.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/graph.h"
#include "backend/cuda/index_checks.h"
#include "backend/cuda/kernels.h"
#include "backend/device_backend.h"

namespace ft::cuda {
namespace {

int device_count() {
  static int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "device properties");
  return prop.name;
}

void synchronize_internal(Stream s) {
  check(cudaSetDevice(s.device.index), "synchronize");
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(s.handle)), "synchronize");
}

void synchronize(Stream s) {
  synchronize_internal(s);
  raise_failed_index_checks();
}

void memcpy_any(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes, Stream stream,
                bool non_blocking) {
  cudaMemcpyKind kind = dst_dev.is_cuda() ? (src_dev.is_cuda() ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                          : cudaMemcpyDeviceToHost;
  check(cudaSetDevice(stream.device.index), "to()");
  auto s = static_cast<cudaStream_t>(stream.handle);
  check(cudaMemcpyAsync(dst, src, nbytes, kind, s), "to()");
  if (!non_blocking) {
    check(cudaStreamSynchronize(s), "to()");
    raise_failed_index_checks();
  }
}

void* stream_create(int device) {
  check(cudaSetDevice(device), "stream create");
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream create");
  return s;
}

void* event_create(int device) {
  check(cudaSetDevice(device), "event create");
  cudaEvent_t ev = nullptr;
  check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "event create");
  return ev;
}

void event_destroy(void* event) {
  cudaEventDestroy(static_cast<cudaEvent_t>(event));
  cudaGetLastError();
}

void event_record(void* event, Stream s) {
  check(cudaSetDevice(s.device.index), "event record");
  check(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(s.handle)), "event record");
}

void stream_wait_event(Stream s, void* event) {
  check(cudaSetDevice(s.device.index), "stream wait");
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(s.handle), static_cast<cudaEvent_t>(event), 0), "stream wait");
}

void event_synchronize(void* event) {
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "event wait");
  raise_failed_index_checks();
}

bool event_query(void* event) {
  cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  check(err, "event query");
  return true;
}

Allocator* pinned_allocator() { return &pinned_host_allocator_instance(); }

const backend::Kernels& kernels() { return cuda_kernels(); }

}  // namespace

const backend::DeviceBackend& make_backend() {
  static const backend::DeviceBackend record = [] {
    backend::DeviceBackend b;
    b.type = DeviceType::CUDA;
    b.kernels = kernels;
    b.allocator = device_allocator_instance;
    b.pinned_host_allocator = pinned_allocator;
    b.device_count = device_count;
    b.device_name = device_name;
    b.memcpy = memcpy_any;
    b.synchronize = synchronize;
    b.synchronize_internal = synchronize_internal;
    b.stream_create = stream_create;
    b.event_create = event_create;
    b.event_destroy = event_destroy;
    b.event_record = event_record;
    b.stream_wait_event = stream_wait_event;
    b.event_synchronize = event_synchronize;
    b.event_query = event_query;
    set_graph_entries(b);
    return b;
  }();
  return record;
}

}  // namespace ft::cuda
