// What every CUDA kernel file shares: the stream a tensor's kernels go to, launch checking that
// names the kernel, dtype dispatch onto device types, 16-bit float conversions that round as the
// CPU backend does (nearest, ties to even), and the strided elementwise loop of
// backend/strided_loop.h as a kernel parameter.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/strided_loop.h"
#include "fasttrain/tensor.h"

namespace ft::cuda {

// The stream the calling thread issues work for `t`'s device to (current_stream; null = the
// device's default stream), with that device made current.
inline cudaStream_t stream_for(const Tensor& t) {
  const Stream s = current_stream(t.device());
  check(cudaSetDevice(s.device.index), "set device");
  return static_cast<cudaStream_t>(s.handle);
}

// Raises the launch error of the kernel just issued, naming it (the op's kernel slot name).
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

// Grid for a grid-stride loop over n elements: enough blocks to fill the device several times
// over, never more than n needs.
inline unsigned grid_for(int64_t n, int threads = 256) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, 132 * 32)));
}

// Device-side element types: the 16-bit floats are CUDA's, whose layout equals ft::bf16/ft::f16.
using bf16_t = __nv_bfloat16;
using f16_t = __half;

template <class T>
struct Acc {
  using type = T;
};
template <>
struct Acc<bf16_t> {
  using type = float;
};
template <>
struct Acc<f16_t> {
  using type = float;
};
template <class T>
using acc_t = typename Acc<T>::type;

// Value conversions on the device, through the compute type; round to nearest even.
template <class To, class From>
__device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, bf16_t>) {
    return convert<To>(__bfloat162float(v));
  } else if constexpr (std::is_same_v<From, f16_t>) {
    return convert<To>(__half2float(v));
  } else if constexpr (std::is_same_v<To, bf16_t>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, f16_t>) {
    return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else {
    return static_cast<To>(v);
  }
}
template <class T>
__device__ __forceinline__ acc_t<T> load(const T* p) {
  return convert<acc_t<T>>(*p);
}

// A StridedLoop passed to a kernel by value (a few hundred bytes of parameters); elementwise.cuh
// unravels each thread's linear index into the operands' byte offsets.
struct DeviceLoop {
  backend::StridedLoop L;
};

}  // namespace ft::cuda

#define FT_CUDA_CASE(DT, TYPE, ...) \
  case ::ft::DType::DT: {           \
    using scalar_t = TYPE;          \
    return __VA_ARGS__();           \
  }

// Runs the lambda with scalar_t bound to the device type of a floating dtype.
#define FT_CUDA_DISPATCH_FLOATING(DTYPE, NAME, ...)                                                        \
  [&] {                                                                                                    \
    switch (DTYPE) {                                                                                       \
      FT_CUDA_CASE(F32, float, __VA_ARGS__)                                                                \
      FT_CUDA_CASE(F64, double, __VA_ARGS__)                                                               \
      FT_CUDA_CASE(BF16, ::ft::cuda::bf16_t, __VA_ARGS__)                                                  \
      FT_CUDA_CASE(F16, ::ft::cuda::f16_t, __VA_ARGS__)                                                    \
      default: FT_FAIL(NAME, ": expected a floating-point tensor, found dtype ", ::ft::dtype_name(DTYPE)); \
    }                                                                                                      \
  }()

// Every dtype.
#define FT_CUDA_DISPATCH_ALL(DTYPE, NAME, ...)                       \
  [&] {                                                              \
    switch (DTYPE) {                                                 \
      FT_CUDA_CASE(F32, float, __VA_ARGS__)                          \
      FT_CUDA_CASE(F64, double, __VA_ARGS__)                         \
      FT_CUDA_CASE(BF16, ::ft::cuda::bf16_t, __VA_ARGS__)            \
      FT_CUDA_CASE(F16, ::ft::cuda::f16_t, __VA_ARGS__)              \
      FT_CUDA_CASE(I32, int32_t, __VA_ARGS__)                        \
      FT_CUDA_CASE(I64, int64_t, __VA_ARGS__)                        \
      FT_CUDA_CASE(U8, uint8_t, __VA_ARGS__)                         \
      FT_CUDA_CASE(Bool, bool, __VA_ARGS__)                          \
    }                                                                \
    FT_FAIL(NAME, ": invalid dtype code ", static_cast<int>(DTYPE)); \
  }()

#define FT_CUDA_DISPATCH_INDEX(DTYPE, NAME, ...)                                                                 \
  [&] {                                                                                                          \
    switch (DTYPE) {                                                                                             \
      FT_CUDA_CASE(I32, int32_t, __VA_ARGS__)                                                                    \
      FT_CUDA_CASE(I64, int64_t, __VA_ARGS__)                                                                    \
      default: FT_FAIL(NAME, ": expected an index tensor of dtype i64 or i32, found ", ::ft::dtype_name(DTYPE)); \
    }                                                                                                            \
  }()
