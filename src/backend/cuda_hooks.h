// The few entry points the core needs from the CUDA backend. The CUDA backend fills them in at
// start-up when it is compiled in; without it they stay empty and the core reports "no CUDA
// support" instead of failing to link or to start. This keeps the core free of CUDA headers and
// lets the same binary run on machines without a driver.
#pragma once
#include <cstddef>

#include "fasttrain/device.h"

namespace ft {

struct CudaHooks {
  int (*device_count)() = nullptr;  // 0 when no driver or no GPU
  void (*synchronize)(Stream) = nullptr;
  // Copies nbytes between host and device memory (either side may be the device) on `stream`.
  void (*memcpy)(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes, Stream stream,
                 bool non_blocking) = nullptr;
};

CudaHooks& cuda_hooks();

}  // namespace ft
