// CUDA kernel of the random fills (rand, randn, randint, uniform_, normal_, bernoulli_mask;
// kernel-table entry random_fill; the CPU's is backend/cpu/random_fill.cpp).
//
// Counter-based: element i is a function of its index alone, word i % 4 of the Philox-4x32
// block for counter base + i / 4 under the fill's key, turned into the distribution's value by
// backend/random_math.h (the FT_HD functions the CPU calls), so both devices draw the same
// values. One thread per counter block (four elements); the Philox rounds (ten 32x32->64-bit
// multiply rounds per block) are the heaviest arithmetic, the rest is one store per element.
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/kernels.h"
#include "backend/random_math.h"

namespace ft::cuda {

using random_math::RandomDistribution;
using random_math::RandomFill;

namespace {

template <class T, RandomDistribution kDist>
__global__ void __launch_bounds__(kThreads) random_fill_kernel(T* out, int64_t n, RandomFill fill) {
  if (fill.device_base != nullptr) fill.base += *fill.device_base;  // a CUDA graph's replay
  const int64_t blocks = (n + 3) / 4;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks; b += step) {
    // Element 4b + lane is word `lane` of counter base + b (random_math.h), as on the CPU.
    const random_math::PhiloxBlock w = random_math::philox4x32(fill.key, fill.base + static_cast<uint64_t>(b));
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      const int64_t e = 4 * b + lane;
      // f64 -> T through the compute type, as the CPU's static_cast<T>(static_cast<compute_t<T>>(v)).
      if (e < n) out[e] = convert<T>(random_math::random_value<kDist>(fill, lane, w));
    }
  }
}

template <class T, RandomDistribution kDist>
void launch_random_fill(T* p, int64_t n, const RandomFill& fill, cudaStream_t stream) {
  random_fill_kernel<T, kDist><<<grid_for((n + 3) / 4, kThreads), kThreads, 0, stream>>>(p, n, fill);
  check_launch("random_fill");
}

}  // namespace

void random_fill(const Tensor& out, const RandomFill& fill) {
  const int64_t n = out.numel();
  if (n == 0) return;
  cudaStream_t stream = stream_for(out);
  FT_CUDA_DISPATCH_ALL(out.dtype(), "random", [&] {
    // Contiguous (the caller checked): element i is at p[i].
    scalar_t* p = static_cast<scalar_t*>(out.raw_data());
    switch (fill.distribution) {
      case RandomDistribution::Uniform01:
        return launch_random_fill<scalar_t, RandomDistribution::Uniform01>(p, n, fill, stream);
      case RandomDistribution::Uniform:
        return launch_random_fill<scalar_t, RandomDistribution::Uniform>(p, n, fill, stream);
      case RandomDistribution::StandardNormal:
        return launch_random_fill<scalar_t, RandomDistribution::StandardNormal>(p, n, fill, stream);
      case RandomDistribution::Normal:
        return launch_random_fill<scalar_t, RandomDistribution::Normal>(p, n, fill, stream);
      case RandomDistribution::RandInt:
        return launch_random_fill<scalar_t, RandomDistribution::RandInt>(p, n, fill, stream);
      case RandomDistribution::Bernoulli:
        return launch_random_fill<scalar_t, RandomDistribution::Bernoulli>(p, n, fill, stream);
    }
    FT_FAIL("random fill: invalid distribution ", static_cast<int>(fill.distribution));
  });
}
}  // namespace ft::cuda
