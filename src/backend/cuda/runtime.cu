// CUDA runtime glue: device discovery, stream sync, host<->device copies and the device
// allocator. Linked against the static CUDA runtime, which loads the driver only when first
// used, so a machine without a driver sees zero devices instead of failing to start.
#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include "backend/cuda_hooks.h"
#include "fasttrain/allocator.h"
#include "fasttrain/error.h"

namespace ft::cuda {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error state for recoverable errors
    FT_FAIL(what, ": CUDA error ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  }
}

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

void synchronize(Stream s) {
  check(cudaSetDevice(s.device.index), "synchronize");
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(s.handle)), "synchronize");
}

void memcpy_any(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes, Stream stream,
                bool non_blocking) {
  cudaMemcpyKind kind = dst_dev.is_cuda() ? (src_dev.is_cuda() ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                          : cudaMemcpyDeviceToHost;
  check(cudaSetDevice(stream.device.index), "to()");
  auto s = static_cast<cudaStream_t>(stream.handle);
  check(cudaMemcpyAsync(dst, src, nbytes, kind, s), "to()");
  if (!non_blocking) check(cudaStreamSynchronize(s), "to()");
}

// Device memory with statistics. The size-class caching and expandable segments of the full
// caching allocator come with the CUDA backend issue; the interface is already the final one.
class CudaAllocator final : public Allocator {
 public:
  DataPtr allocate(size_t nbytes, Stream stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    size_t size = (std::max<size_t>(nbytes, 1) + 511) / 512 * 512;
    if (limit_ && stats_.allocated_bytes + static_cast<int64_t>(size) > static_cast<int64_t>(limit_))
      throw OutOfMemoryError(detail::concat(stream.device.str(), ": out of memory: requested ", nbytes, " bytes with ",
                                            stats_.allocated_bytes, " allocated and ", stats_.reserved_bytes,
                                            " reserved, over the limit of ", limit_));
    check(cudaSetDevice(stream.device.index), "allocate");
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw OutOfMemoryError(detail::concat(stream.device.str(), ": out of memory: requested ", nbytes,
                                            " bytes with ", stats_.allocated_bytes, " allocated and ",
                                            stats_.reserved_bytes, " reserved (", cudaGetErrorString(err), ")"));
    }
    ++stats_.num_allocs;
    ++stats_.num_system_allocs;
    stats_.allocated_bytes += size;
    stats_.reserved_bytes += size;
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    return DataPtr(p, [this, size](void* ptr) {
      std::lock_guard<std::mutex> lock(mu_);
      cudaFree(ptr);
      stats_.allocated_bytes -= size;
      stats_.reserved_bytes -= size;
      ++stats_.num_frees;
      ++stats_.num_system_frees;
    });
  }
  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
  }
  void empty_cache() override {}
  void set_memory_limit(size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    limit_ = bytes;
  }

 private:
  mutable std::mutex mu_;
  AllocatorStats stats_;
  size_t limit_ = 0;
};

}  // namespace

void register_backend(CudaHooks& hooks) {
  hooks.device_count = device_count;
  hooks.synchronize = synchronize;
  hooks.memcpy = memcpy_any;
  static CudaAllocator allocator;
  register_allocator(DeviceType::CUDA, &allocator);
}

}  // namespace ft::cuda
