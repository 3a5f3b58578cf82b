// CUDA kernels of the row operations: layer/RMS norm, softmax/log-softmax and fused cross-entropy
// (kernel-table entries row_norm_*, softmax_*, cross_entropy_*). Semantics are the CPU backend's
// (backend/cpu/norm.cpp, softmax.cpp, loss.cpp); statistics are in f32 (f64 for f64 tensors).
//
// Shapes: every input is contiguous (the ops make it so). A "row" is one reduction: a [M, N] row
// for the norms, a [R] slice of [outer, R, inner] for softmax, the C logits of one of the N*S
// positions of [N, C, S] for cross-entropy.
//
// Math and memory traffic per row of n elements:
// - layer_norm forward: mu = mean(x); var = mean((x - mu)^2) (two passes, exact for any offset);
//   y = (x - mu) * rstd * w + b. Reads the row three times (the later reads hit L1/L2), writes
//   it once.
// - row norm backward: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w (RMS
//   drops the mean(g) term); reads dy and x twice, writes dx once. dw = sum_rows dy * xhat and
//   db = sum_rows dy are column sums: per-block partial sums over a fixed row range into a
//   scratch buffer, then one thread per column adds the partials in block order, so the result is
//   the same bits on every run (no float atomics).
// - softmax forward: one pass keeps a running max m and a running sum s of exp(x - m) (rescaled
//   whenever m grows), merged across threads; a second pass writes exp(x - m) / s or
//   x - m - log(s). Reads the row twice, writes once.
// - softmax backward: gx = y * (g - sum(g * y)), or gx = g - exp(y) * sum(g) for log-softmax.
//   Reads g and y twice, writes gx once.
// - cross-entropy forward: the same one-pass running max/sum, plus sum(x) for label smoothing:
//   lse = m + log(s); loss = (1 - eps) * (lse - x_t) + eps * (lse - mean(x)), 0 where t is
//   ignore_index. Reads the logits once; writes two scalars per position.
// - cross-entropy backward: gx = scale_i * (exp(x - lse) - eps / C - (1 - eps) [c == t]) from
//   the logits and the saved lse: no probability matrix is ever stored. Reads logits once, writes
//   gx once.
//
// Layout of the work: a row that is contiguous (norms, softmax over the last dim, cross-entropy
// with S == 1) gets one block, threads striding over the row with coalesced accesses and
// warp-shuffle reductions; a row strided by `inner` (softmax over another dim, cross-entropy with
// S > 1) gets one thread, so that neighbouring threads read neighbouring columns and loads stay
// coalesced.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/vectors.cuh"
#include "core/switches.h"

namespace ft::cuda {

namespace {

// Threads of a one-block-per-row kernel, at most: the launch bounds let the compiler budget
// registers for this many (a 1024-thread launch of a kernel compiled for more registers fails).
constexpr int kRowThreads = 512;
// Warps of a block: a block reduction keeps one partial per warp.
constexpr int kMaxWarps = kRowThreads / 32;
// Row-blocks kernels loop over rows beyond this many blocks (gridDim.x is 2^31 - 1 at most).
constexpr int64_t kMaxRowGrid = int64_t(1) << 24;
// Column sums of the norm backward: a block covers 32 columns (one per lane: coalesced) and
// kParamLanes row lanes; at most kMaxParamBlocks blocks of rows, so the partials stay small.
constexpr int kParamLanes = 8;
constexpr int64_t kMaxParamBlocks = 256;
constexpr int64_t kRowsPerParamBlock = 64;

// Block size for rows of n elements: whole warps, no more threads than elements (up to the cap).
int row_threads(int64_t n) {
  return static_cast<int>(std::min<int64_t>(kRowThreads, std::max<int64_t>(32, (n + 31) / 32 * 32)));
}
unsigned row_grid(int64_t rows) { return static_cast<unsigned>(std::min(rows, kMaxRowGrid)); }

// A pointer to an optional tensor's data: nullptr when undefined (weight/bias, dw/db, dx).
template <class T>
T* opt_ptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw_data()) : nullptr;
}

// Full-precision exp/log/sqrt in the statistics type (f32 or f64).
__device__ __forceinline__ float exp_of(float v) { return expf(v); }
__device__ __forceinline__ double exp_of(double v) { return exp(v); }
__device__ __forceinline__ float log_of(float v) { return logf(v); }
__device__ __forceinline__ double log_of(double v) { return log(v); }
__device__ __forceinline__ float sqrt_of(float v) { return sqrtf(v); }
__device__ __forceinline__ double sqrt_of(double v) { return sqrt(v); }

// A product rounded on its own, never fused into a following add: where a difference must come
// out exactly 0 (layer_norm over a width of 1: dy * w - mean(dy * w)), an FMA would keep the
// product's rounding error and turn it into noise.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

template <class A>
__device__ __forceinline__ A inf_of() {
  return static_cast<A>(INFINITY);
}

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum of v over the block (blockDim.x a multiple of 32, at most kRowThreads), returned to every
// thread. `buf` holds kMaxWarps values. Every thread adds the warp partials in warp order, so all
// get the same bits without a third barrier.
template <class A>
__device__ __forceinline__ A block_sum(A v, A* buf) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();  // threads still reading buf from the previous call are done
  if (lane == 0) buf[warp] = v;
  __syncthreads();
  A t = buf[0];
  for (int i = 1; i < nw; ++i) t += buf[i];
  return t;
}

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
// Running max and sum of exponentials: (m, s) stands for sum exp(x - m) over the values seen.
// m is never NaN (a NaN fails `x > m`); a NaN value makes s NaN, which every result inherits.

template <class A>
__device__ __forceinline__ void push(A& m, A& s, A x) {
  if (x > m) {
    // m = -inf at first: exp(-inf) = 0 drops the empty sum (a NaN s stays NaN).
    s = s * exp_of(m - x) + A(1);
    m = x;
  } else if (x != -inf_of<A>()) {
    // -inf adds exp(-inf) = 0; skipped because with m = -inf too, x - m would be NaN.
    s += exp_of(x - m);
  }
}

template <class A>
__device__ __forceinline__ void merge(A& m, A& s, A m2, A s2) {
  const A mm = m > m2 ? m : m2;
  // Equal maxima need no rescaling, and with both -inf (or both +inf) m - mm would be NaN.
  s = (m == mm ? s : s * exp_of(m - mm)) + (m2 == mm ? s2 : s2 * exp_of(m2 - mm));
  m = mm;
}

// An infinite max makes the row's statistics NaN, as on the CPU (where exp(x - m) is NaN for
// the x = m element): a fully masked (-inf) row or a +inf logit gives NaN outputs.
template <class A>
__device__ __forceinline__ void finish(A m, A& s) {
  if (m == inf_of<A>() || m == -inf_of<A>()) s = static_cast<A>(NAN);
}

template <class A>
__device__ __forceinline__ void warp_merge(A& m, A& s) {
  for (int o = 16; o > 0; o >>= 1) {
    const A m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const A s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge(m, s, m2, s2);
  }
}

// Merges every thread's (m, s) over the block and applies finish(); all threads get the result.
// bm and bs hold kMaxWarps values each.
template <class A>
__device__ __forceinline__ void block_merge(A& m, A& s, A* bm, A* bs) {
  warp_merge(m, s);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) {
    bm[warp] = m;
    bs[warp] = s;
  }
  __syncthreads();
  m = bm[0];
  s = bs[0];
  for (int i = 1; i < nw; ++i) merge(m, s, bm[i], bs[i]);
  finish(m, s);
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

// ---------------------------------------------------------------------------------------------
// softmax / log_softmax

// One block per contiguous row of R (softmax over the last dim).
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    softmax_rows_kernel(const T* __restrict__ x, int64_t rows, int64_t R, bool log_out, T* __restrict__ y) {
  using A = acc_t<T>;
  __shared__ A bm[kMaxWarps], bs[kMaxWarps];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * R;
    T* yr = y + row * R;
    A m = -inf_of<A>(), s = 0;
    for (int64_t i = threadIdx.x; i < R; i += blockDim.x) push(m, s, load(xr + i));
    block_merge(m, s, bm, bs);
    if (log_out) {
      const A logs = log_of(s);
      for (int64_t i = threadIdx.x; i < R; i += blockDim.x) yr[i] = convert<T>(load(xr + i) - m - logs);
    } else {
      const A inv = A(1) / s;
      for (int64_t i = threadIdx.x; i < R; i += blockDim.x) yr[i] = convert<T>(exp_of(load(xr + i) - m) * inv);
    }
  }
}

// One thread per column of [outer, R, inner] (inner > 1): threads next to each other in j read
// neighbouring addresses at every step r.
template <class T>
__global__ void softmax_cols_kernel(const T* __restrict__ x, int64_t outer, int64_t R, int64_t inner, bool log_out,
                                    T* __restrict__ y) {
  using A = acc_t<T>;
  const int64_t cols = outer * inner;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < cols;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = (k / inner) * R * inner + k % inner;
    A m = -inf_of<A>(), s = 0;
    for (int64_t r = 0; r < R; ++r) push(m, s, load(x + base + r * inner));
    finish(m, s);
    if (log_out) {
      const A logs = log_of(s);
      for (int64_t r = 0; r < R; ++r) y[base + r * inner] = convert<T>(load(x + base + r * inner) - m - logs);
    } else {
      const A inv = A(1) / s;
      for (int64_t r = 0; r < R; ++r) y[base + r * inner] = convert<T>(exp_of(load(x + base + r * inner) - m) * inv);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    softmax_backward_rows_kernel(const T* __restrict__ g, const T* __restrict__ y, int64_t rows, int64_t R,
                                 bool log_out, T* __restrict__ gx) {
  using A = acc_t<T>;
  __shared__ A buf[kMaxWarps];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* gr = g + row * R;
    const T* yr = y + row * R;
    T* out = gx + row * R;
    A s = 0;
    if (log_out) {
      for (int64_t i = threadIdx.x; i < R; i += blockDim.x) s += load(gr + i);
      s = block_sum(s, buf);
      // y = log p, so p = exp(y)
      for (int64_t i = threadIdx.x; i < R; i += blockDim.x)
        out[i] = convert<T>(load(gr + i) - exp_of(load(yr + i)) * s);
    } else {
      for (int64_t i = threadIdx.x; i < R; i += blockDim.x) s += load(gr + i) * load(yr + i);
      s = block_sum(s, buf);
      for (int64_t i = threadIdx.x; i < R; i += blockDim.x) out[i] = convert<T>(load(yr + i) * (load(gr + i) - s));
    }
  }
}

template <class T>
__global__ void softmax_backward_cols_kernel(const T* __restrict__ g, const T* __restrict__ y, int64_t outer, int64_t R,
                                             int64_t inner, bool log_out, T* __restrict__ gx) {
  using A = acc_t<T>;
  const int64_t cols = outer * inner;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < cols;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = (k / inner) * R * inner + k % inner;
    A s = 0;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t o = base + r * inner;
      s += log_out ? load(g + o) : load(g + o) * load(y + o);
    }
    for (int64_t r = 0; r < R; ++r) {
      const int64_t o = base + r * inner;
      gx[o] = log_out ? convert<T>(load(g + o) - exp_of(load(y + o)) * s) : convert<T>(load(y + o) * (load(g + o) - s));
    }
  }
}

// [outer, R, inner] around dim of a contiguous shape.
struct Rows3 {
  int64_t outer = 1, R = 1, inner = 1;
};
Rows3 rows3(const Tensor& t, int dim) {
  Rows3 L;
  for (int i = 0; i < t.dim(); ++i) {
    if (i < dim) L.outer *= t.size(i);
    if (i == dim) L.R = t.size(i);
    if (i > dim) L.inner *= t.size(i);
  }
  return L;
}

// ---------------------------------------------------------------------------------------------
// cross-entropy

// loss and lse of one position from its merged statistics; xr[c * stride] is logit c. The
// target's logit is read only when the target is not ignored (an ignored one may be out of range).
template <class T, class A = acc_t<T>>
__device__ __forceinline__ void ce_position(A m, A s, A sx, const T* xr, int64_t stride, int64_t t, int64_t C,
                                            int64_t ignore, A eps, A inv_c, A* loss, A* lse) {
  const A l = m + log_of(s);
  *lse = l;
  if (t == ignore) {
    *loss = A(0);
    return;
  }
  if (t < 0 || t >= C) {  // its check reports it later (nothing waited for it): read nothing
    *loss = static_cast<A>(NAN);
    return;
  }
  A li = (A(1) - eps) * (l - load(xr + t * stride));
  if (eps != A(0)) li += eps * (l - sx * inv_c);
  *loss = li;
}

// One block per position when S == 1: the C logits of a row are contiguous.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    ce_forward_rows_kernel(const T* __restrict__ x, const int64_t* __restrict__ target, int64_t N, int64_t C,
                           int64_t ignore, acc_t<T> eps, acc_t<T>* __restrict__ loss, acc_t<T>* __restrict__ lse) {
  using A = acc_t<T>;
  __shared__ A bm[kMaxWarps], bs[kMaxWarps], bx[kMaxWarps];
  const A inv_c = A(1) / static_cast<A>(C);
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* xr = x + n * C;
    A m = -inf_of<A>(), s = 0, sx = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const A v = load(xr + c);
      push(m, s, v);
      sx += v;
    }
    block_merge(m, s, bm, bs);
    sx = block_sum(sx, bx);
    if (threadIdx.x == 0) ce_position(m, s, sx, xr, 1, target[n], C, ignore, eps, inv_c, loss + n, lse + n);
  }
}

// One thread per position when S > 1: logit c of position (n, j) is at (n * C + c) * S + j, so
// neighbouring threads (j) read neighbouring addresses.
template <class T>
__global__ void ce_forward_cols_kernel(const T* __restrict__ x, const int64_t* __restrict__ target, int64_t N,
                                       int64_t C, int64_t S, int64_t ignore, acc_t<T> eps, acc_t<T>* __restrict__ loss,
                                       acc_t<T>* __restrict__ lse) {
  using A = acc_t<T>;
  const A inv_c = A(1) / static_cast<A>(C);
  const int64_t P = N * S;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < P;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T* xb = x + (i / S) * C * S + i % S;
    A m = -inf_of<A>(), s = 0, sx = 0;
    for (int64_t c = 0; c < C; ++c) {
      const A v = load(xb + c * S);
      push(m, s, v);
      sx += v;
    }
    finish(m, s);
    ce_position(m, s, sx, xb, S, target[i], C, ignore, eps, inv_c, loss + i, lse + i);
  }
}

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    ce_backward_rows_kernel(const T* __restrict__ x, const int64_t* __restrict__ target,
                            const acc_t<T>* __restrict__ lse, int64_t N, int64_t C, int64_t ignore,
                            acc_t<T> one_minus_eps, acc_t<T> smooth, const acc_t<T>* __restrict__ grad,
                            bool per_position, acc_t<T> scale, T* __restrict__ gx) {
  using A = acc_t<T>;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* xr = x + n * C;
    T* out = gx + n * C;
    const int64_t t = target[n];
    if (t == ignore) {
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[c] = convert<T>(A(0));
      continue;
    }
    const A sc = (per_position ? grad[n] : grad[0]) * scale;
    const A l = lse[n];
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      out[c] = convert<T>(sc * (exp_of(load(xr + c) - l) - smooth - (c == t ? one_minus_eps : A(0))));
  }
}

template <class T>
__global__ void ce_backward_cols_kernel(const T* __restrict__ x, const int64_t* __restrict__ target,
                                        const acc_t<T>* __restrict__ lse, int64_t N, int64_t C, int64_t S,
                                        int64_t ignore, acc_t<T> one_minus_eps, acc_t<T> smooth,
                                        const acc_t<T>* __restrict__ grad, bool per_position, acc_t<T> scale,
                                        T* __restrict__ gx) {
  using A = acc_t<T>;
  const int64_t P = N * S;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < P;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t off = (i / S) * C * S + i % S;
    int64_t t = target[i];
    const bool ignored = t == ignore;
    const A sc = ignored ? A(0) : (per_position ? grad[i] : grad[0]) * scale;
    const A l = ignored ? A(0) : lse[i];
    if (ignored) t = -1;  // matches no class
    for (int64_t c = 0; c < C; ++c) {
      const int64_t o = off + c * S;
      const A v = sc * (exp_of(load(x + o) - l) - smooth - (c == t ? one_minus_eps : A(0)));
      // sc == 0 for ignored positions; the select keeps 0 * inf from making a NaN there (as the
      // CPU's S > 1 path does).
      gx[o] = convert<T>(sc == A(0) ? A(0) : v);
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// entries

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

void softmax_forward(const Tensor& x, int dim, bool log, const Tensor& out) {
  if (x.numel() == 0) return;
  const Rows3 L = rows3(x, dim);
  cudaStream_t stream = stream_for(x);
  FT_CUDA_DISPATCH_FLOATING(x.dtype(), log ? "log_softmax" : "softmax", [&] {
    if (L.inner == 1) {
      softmax_rows_kernel<scalar_t><<<row_grid(L.outer), row_threads(L.R), 0, stream>>>(cptr<scalar_t>(x), L.outer, L.R,
                                                                                        log, mptr<scalar_t>(out));
    } else {
      softmax_cols_kernel<scalar_t><<<grid_for(L.outer * L.inner), 256, 0, stream>>>(cptr<scalar_t>(x), L.outer, L.R,
                                                                                     L.inner, log, mptr<scalar_t>(out));
    }
    check_launch("softmax_forward");
  });
}

void softmax_backward(const Tensor& g, const Tensor& y, int dim, bool log, const Tensor& gx) {
  if (y.numel() == 0) return;
  const Rows3 L = rows3(y, dim);
  cudaStream_t stream = stream_for(y);
  FT_CUDA_DISPATCH_FLOATING(y.dtype(), log ? "log_softmax_backward" : "softmax_backward", [&] {
    if (L.inner == 1) {
      softmax_backward_rows_kernel<scalar_t><<<row_grid(L.outer), row_threads(L.R), 0, stream>>>(
          cptr<scalar_t>(g), cptr<scalar_t>(y), L.outer, L.R, log, mptr<scalar_t>(gx));
    } else {
      softmax_backward_cols_kernel<scalar_t><<<grid_for(L.outer * L.inner), 256, 0, stream>>>(
          cptr<scalar_t>(g), cptr<scalar_t>(y), L.outer, L.R, L.inner, log, mptr<scalar_t>(gx));
    }
    check_launch("softmax_backward");
  });
}

void cross_entropy_forward(const Tensor& logits, int64_t N, int64_t C, int64_t S, const Tensor& target,
                           int64_t ignore_index, double eps, const Tensor& loss, const Tensor& lse) {
  if (N * S == 0) return;
  cudaStream_t stream = stream_for(logits);
  FT_CUDA_DISPATCH_FLOATING(logits.dtype(), "cross_entropy", [&] {
    using A = acc_t<scalar_t>;
    if (S == 1) {
      ce_forward_rows_kernel<scalar_t>
          <<<row_grid(N), row_threads(C), 0, stream>>>(cptr<scalar_t>(logits), cptr<int64_t>(target), N, C,
                                                       ignore_index, static_cast<A>(eps), mptr<A>(loss), mptr<A>(lse));
    } else {
      ce_forward_cols_kernel<scalar_t>
          <<<grid_for(N * S), 256, 0, stream>>>(cptr<scalar_t>(logits), cptr<int64_t>(target), N, C, S, ignore_index,
                                                static_cast<A>(eps), mptr<A>(loss), mptr<A>(lse));
    }
    check_launch("cross_entropy_forward");
  });
}

void cross_entropy_backward(const Tensor& logits, int64_t N, int64_t C, int64_t S, const Tensor& target,
                            const Tensor& lse, int64_t ignore_index, double eps, const Tensor& grad, double scale,
                            const Tensor& gx) {
  if (gx.numel() == 0) return;
  // The upstream gradient is per position (reduction None) or one value (Sum/Mean).
  const bool per_position = grad.numel() == N * S && N * S != 1;
  cudaStream_t stream = stream_for(logits);
  FT_CUDA_DISPATCH_FLOATING(logits.dtype(), "cross_entropy_backward", [&] {
    using A = acc_t<scalar_t>;
    const A eps_a = static_cast<A>(eps), one_minus_eps = A(1) - eps_a;
    // eps / C divided in double, then rounded: the CPU's order.
    const A smooth = static_cast<A>(eps / static_cast<double>(C));
    if (S == 1) {
      ce_backward_rows_kernel<scalar_t><<<row_grid(N), row_threads(C), 0, stream>>>(
          cptr<scalar_t>(logits), cptr<int64_t>(target), cptr<A>(lse), N, C, ignore_index, one_minus_eps, smooth,
          cptr<A>(grad), per_position, static_cast<A>(scale), mptr<scalar_t>(gx));
    } else {
      ce_backward_cols_kernel<scalar_t><<<grid_for(N * S), 256, 0, stream>>>(
          cptr<scalar_t>(logits), cptr<int64_t>(target), cptr<A>(lse), N, C, S, ignore_index, one_minus_eps, smooth,
          cptr<A>(grad), per_position, static_cast<A>(scale), mptr<scalar_t>(gx));
    }
    check_launch("cross_entropy_backward");
  });
}

}  // namespace ft::cuda
