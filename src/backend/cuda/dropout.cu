// CUDA kernels of dropout (kernel-table entries dropout_forward, dropout_backward; the CPU's are
// backend/cpu/dropout.cpp).
//
// Forward: keep_i = uniform_i < keep, with uniform_i drawn as the random fills draw (word i % 4
// of Philox counter base + i / 4, random_math.h), tested in the CPU's integer form
// (w >> 8) < ceil(keep * 2^24); y = x * (keep_i * scale) and a one-byte mask keep_i, so the CPU
// and the GPU drop the same elements. Backward: dx = dy * (mask * scale). Memory-bound: the
// forward reads x and writes y and the mask, one thread per counter block of four elements; the
// backward is an elementwise loop (elementwise.cuh) over dy and the mask.
#include <cmath>
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/kernels.h"
#include "backend/random_math.h"

namespace ft::cuda {

namespace {

// dy * (mask * scale): a multiply by 0, not a select, so NaN/inf gradients behave as on the CPU.
template <class C>
struct DropoutBackwardFn {
  C scale;
  __device__ __forceinline__ C operator()(C g, uint8_t m) const { return g * (static_cast<C>(m) * scale); }
};

// Dropout forward over dense x, y and mask. The keep test is the CPU's integer form of
// uniform_from_word(w) < keep: (w >> 8) < threshold. `vec`: x, y and mask are aligned for one
// 4-element access per counter block.
template <class T>
__global__ void __launch_bounds__(kThreads)
    dropout_forward_kernel(const T* x, T* y, uint8_t* mask, int64_t n, uint32_t threshold, acc_t<T> scale, uint64_t key,
                           uint64_t base, const uint64_t* device_base, bool vec) {
  using C = acc_t<T>;
  if (device_base != nullptr) base += *device_base;  // a CUDA graph's replay: the counter it started at
  const int64_t blocks = (n + 3) / 4;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks; b += step) {
    const random_math::PhiloxBlock w = random_math::philox4x32(key, base + static_cast<uint64_t>(b));
    if (vec && 4 * b + 4 <= n) {
      const Pack<T, 4> xv = reinterpret_cast<const Pack<T, 4>*>(x)[b];
      Pack<T, 4> yv;
      Pack<uint8_t, 4> mv;
#pragma unroll
      for (int lane = 0; lane < 4; ++lane) {
        const uint32_t keep = (w.v[lane] >> 8) < threshold;
        mv.v[lane] = static_cast<uint8_t>(keep);
        // x * (keep * scale), in this order, as the CPU rounds it.
        yv.v[lane] = convert<T>(convert<C>(xv.v[lane]) * (static_cast<C>(keep) * scale));
      }
      reinterpret_cast<Pack<T, 4>*>(y)[b] = yv;
      reinterpret_cast<Pack<uint8_t, 4>*>(mask)[b] = mv;
    } else {
      for (int lane = 0; lane < 4; ++lane) {
        const int64_t e = 4 * b + lane;
        if (e >= n) break;
        const uint32_t keep = (w.v[lane] >> 8) < threshold;
        mask[e] = static_cast<uint8_t>(keep);
        y[e] = convert<T>(convert<C>(x[e]) * (static_cast<C>(keep) * scale));
      }
    }
  }
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

void dropout_forward(const Tensor& x, float keep, double scale, const PhiloxDraw& draw, const Tensor& y,
                     const Tensor& mask) {
  const int64_t n = x.numel();
  if (n == 0) return;
  // (w >> 8) < ceil(keep * 2^24) <=> uniform_from_word(w) < keep; computed as the CPU computes it.
  const uint32_t threshold = static_cast<uint32_t>(std::ceil(keep * 16777216.0f));
  cudaStream_t stream = stream_for(x);
  FT_CUDA_DISPATCH_FLOATING(x.dtype(), "dropout", [&] {
    using T = scalar_t;
    const T* xp = static_cast<const T*>(x.raw_data());
    T* yp = static_cast<T*>(y.raw_data());
    uint8_t* mp = static_cast<uint8_t*>(mask.raw_data());
    const bool vec = aligned(xp, sizeof(Pack<T, 4>)) && aligned(yp, sizeof(Pack<T, 4>)) && aligned(mp, 4);
    dropout_forward_kernel<T><<<grid_for((n + 3) / 4, kThreads), kThreads, 0, stream>>>(
        xp, yp, mp, n, threshold, static_cast<acc_t<T>>(scale), draw.key, draw.base, draw.device_base, vec);
    check_launch("dropout_forward");
  });
}

void dropout_backward(const Tensor& dy, const Tensor& mask, double scale, const Tensor& dx) {
  FT_CUDA_DISPATCH_FLOATING(dy.dtype(), "dropout", [&] {
    using C = acc_t<scalar_t>;
    launch_elementwise<scalar_t, scalar_t, uint8_t>("dropout_backward", dx, {&dy, &mask},
                                                    DropoutBackwardFn<C>{static_cast<C>(scale)});
  });
}

}  // namespace ft::cuda
