// Rotary position embedding on CUDA (kernel-table entry rotary_embedding); semantics are the CPU
// backend's (backend/cpu/rotary.cpp, math in src/ops/rotary.cpp). One thread per pair (i, i + D/2)
// of a row x[b, t, h, :]:
//   out[i] = x[i] c - x[i + D/2] s,  out[i + D/2] = x[i + D/2] c + x[i] s
// with c, s the tables at [t, i] (s negated for the inverse, the backward). Consecutive threads
// take consecutive i, so each half-row's loads and stores coalesce; the tables ([T, D/2]) are read
// once per head and stay in L2. One pass: x read once, out written once.
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace ft::cuda {

namespace {

// x's element strides (the last dim is dense) and sizes.
struct RopeShape {
  int64_t T, H, half, sb, st, sh;
};

template <class T, class A>
__global__ void rotary_kernel(const T* x, const A* cos, const A* sin, T* out, RopeShape s, acc_t<T> sign, int64_t n) {
  using C = acc_t<T>;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < n;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = p / s.half, i = p - row * s.half;
    const int64_t h = row % s.H, t = (row / s.H) % s.T, b = row / (s.H * s.T);
    const T* xr = x + b * s.sb + t * s.st + h * s.sh;
    const C lo = load(xr + i), hi = load(xr + s.half + i);
    const C c = static_cast<C>(cos[t * s.half + i]), sn = sign * static_cast<C>(sin[t * s.half + i]);
    T* o = out + row * 2 * s.half;
    o[i] = convert<T>(lo * c - hi * sn);
    o[s.half + i] = convert<T>(hi * c + lo * sn);
  }
}

template <class T, class A>
void rotary_typed(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse, const Tensor& out) {
  const RopeShape s{x.size(1), x.size(2), x.size(3) / 2, x.stride(0), x.stride(1), x.stride(2)};
  const int64_t n = x.size(0) * s.T * s.H * s.half;
  if (n == 0) return;
  rotary_kernel<T, A><<<grid_for(n), 256, 0, stream_for(x)>>>(
      reinterpret_cast<const T*>(x.raw_data()), reinterpret_cast<const A*>(cos.raw_data()),
      reinterpret_cast<const A*>(sin.raw_data()), reinterpret_cast<T*>(out.raw_data()), s,
      inverse ? acc_t<T>(-1) : acc_t<T>(1), n);
  check_launch("rotary_embedding");
}

}  // namespace

void rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse, const Tensor& out) {
  // f64 tables come with f64 x only (the op checked).
  FT_CUDA_DISPATCH_FLOATING(x.dtype(), "rotary_embedding", [&] {
    if constexpr (std::is_same_v<scalar_t, double>)
      if (cos.dtype() == DType::F64) return rotary_typed<double, double>(x, cos, sin, inverse, out);
    rotary_typed<scalar_t, float>(x, cos, sin, inverse, out);
  });
}

}  // namespace ft::cuda
