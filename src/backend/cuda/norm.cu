// CUDA kernels of layer_norm and rms_norm (kernel-table entries row_norm_forward,
// row_norm_backward), optionally with the residual add fused in front (sum = x + residual, then
// the norm of sum). Semantics are the CPU backend's (backend/cpu/norm.cpp); statistics are in f32
// (f64 for f64 tensors). The row machinery (block shape, block sums) is rows.cuh's.
//
// Math and memory traffic per [M, N] row of n = N elements:
// - layer_norm forward: mu = mean(x); var = mean((x - mu)^2) (two passes, exact for any offset);
//   y = (x - mu) * rstd * w + b with rstd = 1 / sqrt(var + eps); rms_norm drops mu. Reads the row
//   three times (the later reads hit L1/L2), writes it once.
// - row norm backward: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w and
//   xhat = (x - mu) * rstd (RMS drops the mean(g) term); reads dy and x twice, writes dx once.
//   dw = sum_rows dy * xhat and db = sum_rows dy are column sums: per-block partial sums over a
//   fixed row range into a scratch buffer, then one thread per column adds the partials in block
//   order, so the result is the same bits on every run (no float atomics). Rows up to 1024 wide
//   take one fused pass instead (dx and the partial column sums from one read of dy and x).
//
// Rows up to 2048 wide run one warp per row (shuffles only, eight rows per block); wider rows one
// block per row.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/rows.cuh"
#include "backend/cuda/vectors.cuh"
#include "core/switches.h"

namespace ft::cuda {

namespace {

// Column sums of the norm backward: a block covers 32 columns (one per lane: coalesced) and
// kParamLanes row lanes; at most kMaxParamBlocks blocks of rows, so the partials stay small.
constexpr int kParamLanes = 8;
constexpr int64_t kMaxParamBlocks = 256;
constexpr int64_t kRowsPerParamBlock = 64;

// A pointer to an optional tensor's data: nullptr when undefined (weight/bias, dw/db, dx).
template <class T>
T* opt_ptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw_data()) : nullptr;
}

// Full-precision sqrt in the statistics type, as exp_of and log_of (rows.cuh).
__device__ __forceinline__ float sqrt_of(float v) { return sqrtf(v); }
__device__ __forceinline__ double sqrt_of(double v) { return sqrt(v); }

// A product rounded on its own, never fused into a following add: where a difference must come
// out exactly 0 (layer_norm over a width of 1: dy * w - mean(dy * w)), an FMA would keep the
// product's rounding error and turn it into noise.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

// Two sums at once (one pair of barriers for both). buf holds 2 * kMaxWarps values.
template <class A>
__device__ __forceinline__ void block_sum2(A& a, A& b, A* buf) {
  a = warp_sum(a);
  b = warp_sum(b);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) {
    buf[warp] = a;
    buf[kMaxWarps + warp] = b;
  }
  __syncthreads();
  a = buf[0];
  b = buf[kMaxWarps];
  for (int i = 1; i < nw; ++i) {
    a += buf[i];
    b += buf[kMaxWarps + i];
  }
}

// ---------------------------------------------------------------------------------------------
// layer_norm / rms_norm

// ADD: the row normalised is sum = x + res, rounded to T and written to `sum` first; each thread
// then reads back only the elements it wrote, so no barrier is needed.
template <class T, class R, bool ADD>
__global__ void __launch_bounds__(kRowThreads)
    row_norm_forward_kernel(const T* __restrict__ x, const R* __restrict__ res, T* __restrict__ sum,
                            const acc_t<T>* __restrict__ w, const acc_t<T>* __restrict__ b, acc_t<T> eps, bool rms,
                            int64_t M, int64_t N, T* __restrict__ y, acc_t<T>* __restrict__ mean,
                            acc_t<T>* __restrict__ rstd) {
  using A = acc_t<T>;
  __shared__ A buf[kMaxWarps];
  const A inv_n = A(1) / static_cast<A>(N);
  for (int64_t row = blockIdx.x; row < M; row += gridDim.x) {
    const T* xr = x + row * N;
    T* yr = y + row * N;
    if constexpr (ADD) {
      T* sr = sum + row * N;
      for (int64_t i = threadIdx.x; i < N; i += blockDim.x)
        sr[i] = convert<T>(static_cast<A>(load(xr + i)) + static_cast<A>(load(res + row * N + i)));
      xr = sr;
    }
    A mu = 0;
    if (!rms) {
      A s = 0;
      for (int64_t i = threadIdx.x; i < N; i += blockDim.x) s += load(xr + i);
      mu = block_sum(s, buf) * inv_n;
    }
    // Second pass on the deviations: no cancellation, whatever the row's offset.
    A q = 0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
      const A d = load(xr + i) - mu;
      q += d * d;
    }
    const A var = block_sum(q, buf) * inv_n;
    const A rs = A(1) / sqrt_of(var + eps);
    if (threadIdx.x == 0) {
      if (!rms) mean[row] = mu;
      rstd[row] = rs;
    }
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
      const A wi = w ? w[i] : A(1), bi = b ? b[i] : A(0);
      yr[i] = convert<T>((load(xr + i) - mu) * rs * wi + bi);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    row_norm_backward_dx_kernel(const T* __restrict__ dy, const T* __restrict__ ds, const T* __restrict__ x,
                                const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ rstd,
                                const acc_t<T>* __restrict__ w, bool rms, int64_t M, int64_t N, T* __restrict__ dx) {
  using A = acc_t<T>;
  __shared__ A buf[2 * kMaxWarps];
  const A inv_n = A(1) / static_cast<A>(N);
  for (int64_t row = blockIdx.x; row < M; row += gridDim.x) {
    const T* xr = x + row * N;
    const T* dyr = dy + row * N;
    const A mu = rms ? A(0) : mean[row];
    const A rs = rstd[row];
    // a1 = sum(g), a2 = sum(g * xhat) with g = dy * w
    A a1 = 0, a2 = 0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
      const A g = mul_rn(load(dyr + i), w ? w[i] : A(1));
      a1 += g;
      a2 += g * ((load(xr + i) - mu) * rs);
    }
    block_sum2(a1, a2, buf);
    const A mg = rms ? A(0) : a1 * inv_n, mgx = a2 * inv_n;
    T* dxr = dx + row * N;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
      const A xhat = (load(xr + i) - mu) * rs;
      const A v = rs * (mul_rn(load(dyr + i), w ? w[i] : A(1)) - mg - mul_rn(xhat, mgx));
      dxr[i] = convert<T>(ds ? v + load(ds + row * N + i) : v);  // + the fused sum's own gradient
    }
  }
}

// The same two kernels with one warp per row, for rows up to kWarpRowMax wide (transformer
// widths): a block's reductions need barriers, a warp's only shuffles, and eight rows per block
// keep the loads of several rows in flight. Same formulas, same per-thread order of terms.
constexpr int64_t kWarpRowMax = 2048;
constexpr int kWarpRowsPerBlock = 8;

template <class T, class R, bool ADD>
__global__ void __launch_bounds__(32 * kWarpRowsPerBlock)
    row_norm_forward_warp_kernel(const T* __restrict__ x, const R* __restrict__ res, T* __restrict__ sum,
                                 const acc_t<T>* __restrict__ w, const acc_t<T>* __restrict__ b, acc_t<T> eps, bool rms,
                                 int64_t M, int64_t N, T* __restrict__ y, acc_t<T>* __restrict__ mean,
                                 acc_t<T>* __restrict__ rstd) {
  using A = acc_t<T>;
  const int lane = threadIdx.x & 31;
  const A inv_n = A(1) / static_cast<A>(N);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpRowsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpRowsPerBlock + (threadIdx.x >> 5); row < M; row += warps) {
    const T* xr = x + row * N;
    T* yr = y + row * N;
    if constexpr (ADD) {  // as in row_norm_forward_kernel
      T* sr = sum + row * N;
      for (int64_t i = lane; i < N; i += 32)
        sr[i] = convert<T>(static_cast<A>(load(xr + i)) + static_cast<A>(load(res + row * N + i)));
      xr = sr;
    }
    A mu = 0;
    if (!rms) {
      A s = 0;
      for (int64_t i = lane; i < N; i += 32) s += load(xr + i);
      mu = warp_sum(s) * inv_n;
    }
    A q = 0;
    for (int64_t i = lane; i < N; i += 32) {
      const A d = load(xr + i) - mu;
      q += d * d;
    }
    const A rs = A(1) / sqrt_of(warp_sum(q) * inv_n + eps);
    if (lane == 0) {
      if (!rms) mean[row] = mu;
      rstd[row] = rs;
    }
    for (int64_t i = lane; i < N; i += 32) {
      const A wi = w ? w[i] : A(1), bi = b ? b[i] : A(0);
      yr[i] = convert<T>((load(xr + i) - mu) * rs * wi + bi);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(32 * kWarpRowsPerBlock)
    row_norm_backward_dx_warp_kernel(const T* __restrict__ dy, const T* __restrict__ ds, const T* __restrict__ x,
                                     const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ rstd,
                                     const acc_t<T>* __restrict__ w, bool rms, int64_t M, int64_t N,
                                     T* __restrict__ dx) {
  using A = acc_t<T>;
  const int lane = threadIdx.x & 31;
  const A inv_n = A(1) / static_cast<A>(N);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpRowsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpRowsPerBlock + (threadIdx.x >> 5); row < M; row += warps) {
    const T* xr = x + row * N;
    const T* dyr = dy + row * N;
    const A mu = rms ? A(0) : mean[row];
    const A rs = rstd[row];
    A a1 = 0, a2 = 0;
    for (int64_t i = lane; i < N; i += 32) {
      const A g = mul_rn(load(dyr + i), w ? w[i] : A(1));
      a1 += g;
      a2 += g * ((load(xr + i) - mu) * rs);
    }
    a1 = warp_sum(a1);
    a2 = warp_sum(a2);
    const A mg = rms ? A(0) : a1 * inv_n, mgx = a2 * inv_n;
    T* dxr = dx + row * N;
    for (int64_t i = lane; i < N; i += 32) {
      const A xhat = (load(xr + i) - mu) * rs;
      const A v = rs * (mul_rn(load(dyr + i), w ? w[i] : A(1)) - mg - mul_rn(xhat, mgx));
      dxr[i] = convert<T>(ds ? v + load(ds + row * N + i) : v);
    }
  }
}

// The whole backward of rows up to kFusedRowMax wide in one pass over dy and x: a warp takes a
// fixed range of rows, keeps its lane's columns (c = lane + 32 j) of dy and x in registers for
// the row's dx, and adds them into its own column sums of dw (dy * xhat) and db (dy), which it
// writes once at the end as one partial row per warp. Reading dy and x once instead of twice
// (dx, then the parameter sums) halves the traffic of the transformer's norms; the ranges depend
// on M only, so the sums are reproducible. The dx terms are those of the warp kernel above, in
// the same per-lane order.
constexpr int64_t kFusedRowMax = 1024;
constexpr int kFusedWarpsPerBlock = 4;
constexpr int64_t kFusedMaxGroups = 1024;  // partial rows: enough warps in flight to fill HBM
constexpr int64_t kFusedMinRowsPerGroup = 4;

template <class T, int CPL>  // CPL: columns per lane, N <= 32 * CPL
__global__ void __launch_bounds__(32 * kFusedWarpsPerBlock)
    row_norm_backward_fused_kernel(const T* __restrict__ dy, const T* __restrict__ ds, const T* __restrict__ x,
                                   const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ rstd,
                                   const acc_t<T>* __restrict__ w, bool rms, int64_t M, int64_t N, int64_t groups,
                                   T* __restrict__ dx, acc_t<T>* __restrict__ pw, acc_t<T>* __restrict__ pb) {
  using A = acc_t<T>;
  const int lane = threadIdx.x & 31;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kFusedWarpsPerBlock + (threadIdx.x >> 5);
  if (g >= groups) return;
  const A inv_n = A(1) / static_cast<A>(N);
  A wv[CPL], sw[CPL], sb[CPL];
#pragma unroll
  for (int j = 0; j < CPL; ++j) {
    const int64_t c = lane + 32 * j;
    wv[j] = (c < N && w) ? w[c] : A(1);
    sw[j] = sb[j] = A(0);
  }
  for (int64_t row = M * g / groups, end = M * (g + 1) / groups; row < end; ++row) {
    const T* xr = x + row * N;
    const T* dyr = dy + row * N;
    const A mu = rms ? A(0) : mean[row];
    const A rs = rstd[row];
    A d[CPL], xh[CPL];
    A a1 = 0, a2 = 0;
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
      const int64_t c = lane + 32 * j;
      d[j] = c < N ? load(dyr + c) : A(0);
      xh[j] = c < N ? (load(xr + c) - mu) * rs : A(0);
    }
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
      const A gj = mul_rn(d[j], wv[j]);
      a1 += gj;
      a2 += gj * xh[j];
      sw[j] += d[j] * xh[j];
      sb[j] += d[j];
    }
    a1 = warp_sum(a1);
    a2 = warp_sum(a2);
    const A mg = rms ? A(0) : a1 * inv_n, mgx = a2 * inv_n;
    if (dx) {
      T* dxr = dx + row * N;
#pragma unroll
      for (int j = 0; j < CPL; ++j) {
        const int64_t c = lane + 32 * j;
        if (c >= N) continue;
        const A v = rs * (mul_rn(d[j], wv[j]) - mg - mul_rn(xh[j], mgx));
        dxr[c] = convert<T>(ds ? v + load(ds + row * N + c) : v);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < CPL; ++j) {
    const int64_t c = lane + 32 * j;
    if (c >= N) continue;
    if (pw) pw[g * N + c] = sw[j];
    if (pb) pb[g * N + c] = sb[j];
  }
}

// out[s * N + c] = sum of partial[b * N + c] over b in slice s of `slices` equal ranges of [0, nb),
// in order. Two launches (nb -> slices -> 1) spread a long column sum over many threads.
template <class A>
__global__ void combine_partial_slices_kernel(const A* __restrict__ partial, int64_t nb, int64_t N, int64_t slices,
                                              A* __restrict__ out) {
  const int64_t s = blockIdx.y;
  const int64_t b0 = nb * s / slices, b1 = nb * (s + 1) / slices;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < N;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    A t = 0;
    for (int64_t b = b0; b < b1; ++b) t += partial[b * N + c];
    out[s * N + c] = t;
  }
}

unsigned warp_row_grid(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>((rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock, 132 * 16));
}

// Partial column sums of dw (dy * xhat) and db (dy) over rows [M * blk / nb, M * (blk + 1) / nb):
// block (32, kParamLanes), blockIdx.x picks 32 columns, blockIdx.y the row block. Each lane adds
// its rows in order, then lane row 0 adds the kParamLanes lanes in order: a fixed summation order.
template <class T>
__global__ void row_norm_param_partials_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                               const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ rstd,
                                               bool rms, int64_t M, int64_t N, int64_t nb, acc_t<T>* __restrict__ pw,
                                               acc_t<T>* __restrict__ pb) {
  using A = acc_t<T>;
  __shared__ A sw[kParamLanes][32], sb[kParamLanes][32];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t blk = blockIdx.y;
  const int64_t r0 = M * blk / nb, r1 = M * (blk + 1) / nb;
  A aw = 0, ab = 0;
  if (col < N) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kParamLanes) {
      const A g = load(dy + r * N + col);
      if (pw) aw += g * ((load(x + r * N + col) - (rms ? A(0) : mean[r])) * rstd[r]);
      ab += g;
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && col < N) {
    A tw = 0, tb = 0;
    for (int k = 0; k < kParamLanes; ++k) {
      tw += sw[k][threadIdx.x];
      tb += sb[k][threadIdx.x];
    }
    if (pw) pw[blk * N + col] = tw;
    if (pb) pb[blk * N + col] = tb;
  }
}

// out[c] = sum_b partial[b * N + c], b in order.
template <class A>
__global__ void combine_partials_kernel(const A* __restrict__ partial, int64_t nb, int64_t N, A* __restrict__ out) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < N;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    A s = 0;
    for (int64_t b = 0; b < nb; ++b) s += partial[b * N + c];
    out[c] = s;
  }
}

}  // namespace

namespace {

template <class T, class R, bool ADD>
void launch_row_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b, double eps,
                             bool rms, const Tensor& sum, const Tensor& y, const Tensor& mean, const Tensor& rstd,
                             int64_t M, int64_t N, cudaStream_t stream) {
  using A = acc_t<T>;
  const R* res = ADD ? cptr<R>(residual) : nullptr;
  T* sump = ADD ? mptr<T>(sum) : nullptr;
  if (N <= kWarpRowMax)
    row_norm_forward_warp_kernel<T, R, ADD><<<warp_row_grid(M), 32 * kWarpRowsPerBlock, 0, stream>>>(
        cptr<T>(x), res, sump, opt_ptr<const A>(w), opt_ptr<const A>(b), static_cast<A>(eps), rms, M, N, mptr<T>(y),
        rms ? nullptr : mptr<A>(mean), mptr<A>(rstd));
  else
    row_norm_forward_kernel<T, R, ADD><<<row_grid(M), row_threads(N), 0, stream>>>(
        cptr<T>(x), res, sump, opt_ptr<const A>(w), opt_ptr<const A>(b), static_cast<A>(eps), rms, M, N, mptr<T>(y),
        rms ? nullptr : mptr<A>(mean), mptr<A>(rstd));
  check_launch("row_norm_forward");
}

}  // namespace

void row_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b, double eps, bool rms,
                      const Tensor& sum, const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const int64_t N = x.size(-1), M = N ? x.numel() / N : 0;
  if (M == 0) return;
  cudaStream_t stream = stream_for(x);
  const char* op = rms ? "rms_norm" : "layer_norm";
  FT_CUDA_DISPATCH_FLOATING(x.dtype(), op, [&] {
    using T = scalar_t;
    if (!residual.defined()) {
      launch_row_norm_forward<T, T, false>(x, residual, w, b, eps, rms, sum, y, mean, rstd, M, N, stream);
    } else if (residual.dtype() == x.dtype()) {
      launch_row_norm_forward<T, T, true>(x, residual, w, b, eps, rms, sum, y, mean, rstd, M, N, stream);
    } else if constexpr (std::is_same_v<T, float>) {  // f32 plus a bf16/f16 branch (autocast)
      FT_CHECK(backend::row_norm_residual_ok(x.dtype(), residual.dtype()), op, ": a residual of dtype ",
               dtype_name(residual.dtype()), " for an f32 input (expected f32, bf16 or f16)");
      if (residual.dtype() == DType::BF16)
        launch_row_norm_forward<T, bf16_t, true>(x, residual, w, b, eps, rms, sum, y, mean, rstd, M, N, stream);
      else
        launch_row_norm_forward<T, f16_t, true>(x, residual, w, b, eps, rms, sum, y, mean, rstd, M, N, stream);
    } else {
      FT_FAIL(op, ": a residual of dtype ", dtype_name(residual.dtype()), " for an input of dtype ",
              dtype_name(x.dtype()), " (expected the input's dtype, or bf16/f16 for an f32 input)");
    }
  });
}

// FT_CUDA_NORM_BACKWARD=split (core/switches.h) keeps the two-pass backward (dx, then the
// parameter sums): the A/B switch of the benchmark and a second path for the tests.
bool fused_norm_backward_off() { return switches::cuda_norm_backward.get() == switches::CudaNormBackward::Split; }

template <class T>
void row_norm_backward_fused(const Tensor& dy, const Tensor& dsum, const Tensor& x, const acc_t<T>* meanp,
                             const Tensor& rstd, const Tensor& w, bool rms, int64_t M, int64_t N, const Tensor& dx,
                             const Tensor& dw, const Tensor& db, cudaStream_t stream) {
  using A = acc_t<T>;
  const int64_t groups = std::clamp<int64_t>(M / kFusedMinRowsPerGroup, 1, kFusedMaxGroups);
  const int64_t nparts = (dw.defined() ? 1 : 0) + (db.defined() ? 1 : 0);
  Tensor partial;
  if (nparts > 0) partial = empty({nparts, groups, N}, TensorOptions(rstd.dtype(), x.device()));
  A* pw = dw.defined() ? mptr<A>(partial) : nullptr;
  A* pb = db.defined() ? mptr<A>(partial) + (dw.defined() ? groups * N : 0) : nullptr;
  const unsigned blocks = static_cast<unsigned>((groups + kFusedWarpsPerBlock - 1) / kFusedWarpsPerBlock);
  auto launch = [&](auto cpl) {
    row_norm_backward_fused_kernel<T, decltype(cpl)::value><<<blocks, 32 * kFusedWarpsPerBlock, 0, stream>>>(
        cptr<T>(dy), opt_ptr<const T>(dsum), cptr<T>(x), meanp, cptr<A>(rstd), opt_ptr<const A>(w), rms, M, N, groups,
        opt_ptr<T>(dx), pw, pb);
  };
  const int64_t cpl = (N + 31) / 32;
  if (cpl <= 4)
    launch(std::integral_constant<int, 4>());
  else if (cpl <= 8)
    launch(std::integral_constant<int, 8>());
  else if (cpl <= 16)
    launch(std::integral_constant<int, 16>());
  else if (cpl <= 24)
    launch(std::integral_constant<int, 24>());
  else
    launch(std::integral_constant<int, 32>());
  check_launch("row_norm_backward");
  if (nparts == 0) return;
  // groups partial rows -> `slices` rows -> the result, each in order.
  const int64_t slices = std::min<int64_t>(groups, 32);
  Tensor mid = empty({slices, N}, TensorOptions(rstd.dtype(), x.device()));
  const unsigned col_blocks = static_cast<unsigned>((N + 255) / 256);
  for (const auto& [p, out] : {std::pair{pw, dw}, std::pair{pb, db}}) {
    if (p == nullptr) continue;
    combine_partial_slices_kernel<A>
        <<<dim3(col_blocks, static_cast<unsigned>(slices)), 256, 0, stream>>>(p, groups, N, slices, mptr<A>(mid));
    check_launch("row_norm_backward");
    combine_partial_slices_kernel<A><<<dim3(col_blocks, 1), 256, 0, stream>>>(mptr<A>(mid), slices, N, 1, mptr<A>(out));
    check_launch("row_norm_backward");
  }
}

void row_norm_backward(const Tensor& dy, const Tensor& dsum, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                       const Tensor& w, bool rms, const Tensor& dx, const Tensor& dw, const Tensor& db) {
  const int64_t N = x.size(-1), M = N ? x.numel() / N : 0;
  if (N == 0) return;
  cudaStream_t stream = stream_for(x);
  FT_CUDA_DISPATCH_FLOATING(x.dtype(), rms ? "rms_norm" : "layer_norm", [&] {
    using A = acc_t<scalar_t>;
    const A* meanp = rms ? nullptr : cptr<A>(mean);
    if (M > 0 && N <= kFusedRowMax && !fused_norm_backward_off()) {
      row_norm_backward_fused<scalar_t>(dy, dsum, x, meanp, rstd, w, rms, M, N, dx, dw, db, stream);
      return;
    }
    if (dx.defined() && M > 0 && N <= kWarpRowMax) {
      row_norm_backward_dx_warp_kernel<scalar_t><<<warp_row_grid(M), 32 * kWarpRowsPerBlock, 0, stream>>>(
          cptr<scalar_t>(dy), opt_ptr<const scalar_t>(dsum), cptr<scalar_t>(x), meanp, cptr<A>(rstd),
          opt_ptr<const A>(w), rms, M, N, mptr<scalar_t>(dx));
      check_launch("row_norm_backward");
    } else if (dx.defined() && M > 0) {
      row_norm_backward_dx_kernel<scalar_t><<<row_grid(M), row_threads(N), 0, stream>>>(
          cptr<scalar_t>(dy), opt_ptr<const scalar_t>(dsum), cptr<scalar_t>(x), meanp, cptr<A>(rstd),
          opt_ptr<const A>(w), rms, M, N, mptr<scalar_t>(dx));
      check_launch("row_norm_backward");
    }
    if (!dw.defined() && !db.defined()) return;
    // Row blocks depend on M only (not on the device), so the sums are reproducible anywhere. With
    // M == 0 one block of no rows writes zero partials, and dw/db come out 0 as on the CPU.
    const int64_t nb = std::clamp<int64_t>((M + kRowsPerParamBlock - 1) / kRowsPerParamBlock, 1, kMaxParamBlocks);
    const int64_t nparts = (dw.defined() ? 1 : 0) + (db.defined() ? 1 : 0);
    Tensor partial = empty({nparts, nb, N}, TensorOptions(rstd.dtype(), x.device()));
    A* pw = dw.defined() ? mptr<A>(partial) : nullptr;
    A* pb = db.defined() ? mptr<A>(partial) + (dw.defined() ? nb * N : 0) : nullptr;
    const dim3 grid(static_cast<unsigned>((N + 31) / 32), static_cast<unsigned>(nb));
    row_norm_param_partials_kernel<scalar_t><<<grid, dim3(32, kParamLanes), 0, stream>>>(
        cptr<scalar_t>(dy), cptr<scalar_t>(x), meanp, cptr<A>(rstd), rms, M, N, nb, pw, pb);
    check_launch("row_norm_backward");
    if (pw) {
      combine_partials_kernel<A><<<grid_for(N), 256, 0, stream>>>(pw, nb, N, mptr<A>(dw));
      check_launch("row_norm_backward");
    }
    if (pb) {
      combine_partials_kernel<A><<<grid_for(N), 256, 0, stream>>>(pb, nb, N, mptr<A>(db));
      check_launch("row_norm_backward");
    }
  });
}

}  // namespace ft::cuda
