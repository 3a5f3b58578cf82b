// FP8 quantizing and the delayed scales' update on CUDA (kernel-table entries fp8_quantize and
// fp8_update_scales; the products are fp8_matmul.cpp's). Semantics are the CPU backend's
// (backend/cpu/fp8.cpp), the per-value conversion backend/fp8_math.h's, shared by both.
//
// fp8_quantize: one block per 32 x 32 tile of x. Each thread converts elements of the tile (loads
// and the row-major codes coalesce along C), the tile's codes pass through shared memory so the
// transposed codes [C, R] are written along R, coalesced too (Transformer Engine's cast-transpose:
// cuBLASLt's FP8 GEMMs take both operands with the summed dimension dense, so the backward needs
// each operand in both layouts). The block's largest magnitude goes to amax with one atomicMax on
// its bits: for non-negative floats the bit patterns order as the values, and a NaN's (above
// infinity's) wins, as on the CPU.
//
// fp8_update_scales: one block per state row; the history shifts through shared memory.
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/fp8_math.h"

namespace ft::cuda {

namespace {

constexpr int kTile = 32, kRowsPerPass = 8;  // a 32 x 8 block walks the tile's 32 rows in 4 passes

template <class T>
__global__ void quantize_kernel(const T* x, int64_t R, int64_t C, int64_t ld, Fp8Format format, const float* scale,
                                float* amax, uint8_t* codes, uint8_t* codes_t) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  __shared__ uint32_t block_max;
  if (threadIdx.x == 0 && threadIdx.y == 0) block_max = 0;
  __syncthreads();
  const float s = *scale;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile, r0 = static_cast<int64_t>(blockIdx.y) * kTile;
  uint32_t m = 0;  // bits of the thread's largest |x|
  for (int i = threadIdx.y; i < kTile; i += kRowsPerPass) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < R && c < C) {
      const float v = static_cast<float>(load(x + r * ld + c));
      m = max(m, __float_as_uint(fabsf(v)));
      const uint8_t code = math::fp8_encode(v * s, format);
      codes[r * C + c] = code;
      tile[i][threadIdx.x] = code;
    }
  }
  atomicMax(&block_max, m);
  __syncthreads();
  if (codes_t != nullptr) {
    for (int j = threadIdx.y; j < kTile; j += kRowsPerPass) {
      const int64_t c = c0 + j, r = r0 + threadIdx.x;
      if (r < R && c < C) codes_t[c * R + r] = tile[threadIdx.x][j];
    }
  }
  if (threadIdx.x == 0 && threadIdx.y == 0) atomicMax(reinterpret_cast<unsigned int*>(amax), block_max);
}

__global__ void update_scales_kernel(float* amax, float* history, float* scale, float* scale_inv, int64_t L,
                                     backend::Fp8ScaleParams p) {
  extern __shared__ float row[];
  __shared__ float block_max;
  const int r = blockIdx.x;
  float* h = history + r * L;
  for (int64_t i = threadIdx.x; i < L; i += blockDim.x) row[i] = h[i];
  if (threadIdx.x == 0) block_max = 0;
  __syncthreads();
  const float newest = amax[r];
  uint32_t m = 0;
  for (int64_t i = threadIdx.x; i < L; i += blockDim.x) {
    const float v = i == 0 ? newest : row[i - 1];
    h[i] = v;
    m = max(m, __float_as_uint(v));  // amaxes are >= 0 (or NaN): bits order as values
  }
  atomicMax(reinterpret_cast<unsigned int*>(&block_max), m);
  __syncthreads();
  if (threadIdx.x == 0) {
    const float ref = p.algo == Fp8AmaxAlgo::Max ? block_max : newest;
    scale[r] = math::fp8_next_scale(ref, scale[r], p.formats[r], p.margin);
    scale_inv[r] = 1.0f / scale[r];
    amax[r] = 0.0f;
  }
}

}  // namespace

void fp8_quantize(const Tensor& x, Fp8Format format, const Tensor& scale, const Tensor& amax, const Tensor& codes,
                  const Tensor& codes_t) {
  const int64_t R = x.size(0), C = x.size(1);
  if (R == 0 || C == 0) return;
  const dim3 grid(static_cast<unsigned>((C + kTile - 1) / kTile), static_cast<unsigned>((R + kTile - 1) / kTile));
  const dim3 block(kTile, kRowsPerPass);
  FT_CUDA_DISPATCH_FLOATING(x.dtype(), "fp8_quantize", [&] {
    quantize_kernel<scalar_t><<<grid, block, 0, stream_for(x)>>>(
        reinterpret_cast<const scalar_t*>(x.raw_data()), R, C, x.stride(0), format, scale.data<float>(),
        amax.data<float>(), static_cast<uint8_t*>(codes.raw_data()),
        codes_t.defined() ? static_cast<uint8_t*>(codes_t.raw_data()) : nullptr);
  });
  check_launch("fp8_quantize");
}

void fp8_update_scales(const Tensor& amax, const Tensor& history, const Tensor& scale, const Tensor& scale_inv,
                       const backend::Fp8ScaleParams& p) {
  const int64_t R = history.size(0), L = history.size(1);
  update_scales_kernel<<<static_cast<unsigned>(R), 256, static_cast<size_t>(L) * sizeof(float), stream_for(history)>>>(
      amax.data<float>(), history.data<float>(), scale.data<float>(), scale_inv.data<float>(), L, p);
  check_launch("fp8_update_scales");
}

}  // namespace ft::cuda
