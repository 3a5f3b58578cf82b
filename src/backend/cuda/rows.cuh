// What the row kernels share (norm.cu, softmax.cu, loss.cu: kernel-table entries row_norm_*,
// softmax_*, cross_entropy_*): the block shape of a one-block-per-row kernel, warp and block sums,
// full-precision exp/log in the statistics type, and the running max and sum of exponentials that
// softmax and cross-entropy reduce a row to. Statistics are in f32 (f64 for f64 tensors).
//
// Shapes: every input is contiguous (the ops make it so). A "row" is one reduction: a [M, N] row
// for the norms, a [R] slice of [outer, R, inner] for softmax, the C logits of one of the N*S
// positions of [N, C, S] for cross-entropy.
//
// Running max and sum: (m, s) stands for sum_i exp(x_i - m) over the values seen so far. Pushing
// x > m rescales, s = s * exp(m - x) + 1, m = x; otherwise s += exp(x - m). Two partial states
// merge as s = s1 * exp(m1 - m) + s2 * exp(m2 - m) with m = max(m1, m2), so threads, warps and
// the block combine in any tree; log(sum exp x) = m + log(s).
//
// Layout of the work: a row that is contiguous (norms, softmax over the last dim, cross-entropy
// with S == 1) gets one block, threads striding over the row with coalesced accesses and
// warp-shuffle reductions; a row strided by `inner` (softmax over another dim, cross-entropy with
// S > 1) gets one thread, so that neighbouring threads read neighbouring columns and loads stay
// coalesced.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cuda/common.cuh"

namespace ft::cuda {

// Threads of a one-block-per-row kernel, at most: the launch bounds let the compiler budget
// registers for this many (a 1024-thread launch of a kernel compiled for more registers fails).
constexpr int kRowThreads = 512;
// Warps of a block: a block reduction keeps one partial per warp.
constexpr int kMaxWarps = kRowThreads / 32;
// Row-blocks kernels loop over rows beyond this many blocks (gridDim.x is 2^31 - 1 at most).
constexpr int64_t kMaxRowGrid = int64_t(1) << 24;

// Block size for rows of n elements: whole warps, no more threads than elements (up to the cap).
inline int row_threads(int64_t n) {
  return static_cast<int>(std::min<int64_t>(kRowThreads, std::max<int64_t>(32, (n + 31) / 32 * 32)));
}
inline unsigned row_grid(int64_t rows) { return static_cast<unsigned>(std::min(rows, kMaxRowGrid)); }

// Full-precision exp and log in the statistics type (f32 or f64).
__device__ __forceinline__ float exp_of(float v) { return expf(v); }
__device__ __forceinline__ double exp_of(double v) { return exp(v); }
__device__ __forceinline__ float log_of(float v) { return logf(v); }
__device__ __forceinline__ double log_of(double v) { return log(v); }

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

}  // namespace ft::cuda
