// CUDA kernels of batch normalisation (kernel-table entries batch_norm_stats, batch_norm_apply,
// batch_norm_backward). Semantics are the CPU backend's (backend/cpu/norm.cpp); statistics and
// per-channel coefficients are in f32 (f64 for f64 tensors), whatever the input dtype.
//
// Layouts (BatchNormLayout): NCS, dense [N, C, S] (NCHW: a channel is N runs of S contiguous
// values), or rows, dense [N*S, C] (channels-last, and every input with S == 1).
//
// Math, per channel c over its n = N*S values:
// - stats: mean and biased variance. With shift k (the mean of the channel's first
//   kShiftSamples values in memory order), sums of deviations d = x - k give
//   mean = k + sum(d) / n and var = (sum(d^2) - sum(d)^2 / n) / n. Exact when the mean dwarfs the
//   spread: k lies within the spread of the mean, so d is of the size of the spread and the
//   squares do not cancel. One read of x.
// - apply: y = x * scale + shift with scale = w * invstd, shift = b - mean * scale; with the fused
//   ReLU, y = max(0, that) (a NaN gives 0, as on the CPU). One read, one write.
// - backward: g = dy, or dy * [bn(x) > 0] with the fused ReLU (bn recomputed from x, so y is never
//   read). sdy = sum(g), sdyx = sum(g * (x - mean)); dw = sdyx * invstd, db = sdy;
//   dx = g * k1 + (x - mean) * k2 + k3 with k1 = w * invstd and, in training,
//   k2 = -k1 * invstd^2 * sdyx / n, k3 = -k1 * sdy / n (0 in eval, where dx = g * k1 and x is
//   read only for the ReLU mask). Reads x and dy twice (sums, then dx), writes dx once.
//
// Reductions are two-level and deterministic: blocks write per-block partial sums (f32 running
// sums over at most kMaxElemsPerBlock values per block) to a workspace from the caching allocator,
// and a small kernel adds each channel's partials in f64 in a fixed order (combine_partials). How
// values are split among blocks, threads and vector lanes depends on the shape only (never on the
// device, the alignment of the pointers or timing), and there are no atomics, so results are
// bitwise reproducible.
// - NCS: a block per (channel, split of the channel's N*S values); threads stride over the values
//   with vector loads (16 bytes where S allows), so a warp reads contiguous memory within a run,
//   and a 7x7 run is not mostly idle lanes.
// - rows: a block is cx x ry threads; each thread owns V adjacent channels (one vector load per
//   row) and walks rows ry apart, so a warp reads whole contiguous rows; the ry partials of a
//   channel are added in a fixed tree through shared memory.
// Elementwise passes (apply, dx) on NCS read per-channel coefficients from a small table, one
// thread per vector of a flattened index (channel from two multiply-shift divisions); on rows
// each thread holds its channels' coefficients in registers and walks rows.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/vectors.cuh"

namespace ft::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Reductions aim at this many blocks in all. A constant, not the SM count: the split fixes the
// summation order, which must not change with the GPU.
constexpr int64_t kTargetBlocks = 2048;
// Least values a block of a split reduction handles (fewer make the partials the cost), and most
// (bounds the length of each thread's f32 running sums).
constexpr int64_t kMinElemsPerBlock = 8192;
constexpr int64_t kMaxElemsPerBlock = 65536;
constexpr int64_t kMaxSplits = 65535;  // gridDim.y
// Values averaged into the shift of the variance sums: a mean of several values sits closer to
// the channel's mean than one value, which keeps the rounding error of sum(d^2) - sum(d)^2 / n
// small even when the first value is an outlier.
constexpr int64_t kShiftSamples = 32;
// Blocks per SM the elementwise kernels are compiled for (a register budget of 85): enough
// resident threads to keep the loads of memory-bound passes in flight.
constexpr int kElementwiseBlocks = 3;
// Grid-stride loops take over beyond this many blocks.
constexpr int64_t kMaxGrid = int64_t(1) << 20;

template <class T>
const T* opt_ptr(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.raw_data()) : nullptr;
}

bool aligned_to(const Tensor& t, size_t bytes) {
  return !t.defined() || reinterpret_cast<uintptr_t>(t.raw_data()) % bytes == 0;
}

// ---------------------------------------------------------------------------------------------
// Vectors of V elements (vectors.cuh), loaded and stored as one 16-, 8- or 4-byte access.

// Elements per vector for a layout whose runs (NCS) or rows (channels-last) are `len` elements:
// 16 bytes where len allows, else 8 bytes for 16-bit types (ResNet's 14x14 = 196), else 1.
template <class T>
int vec_width(int64_t len) {
  constexpr int full = 16 / static_cast<int>(sizeof(T));
  if (len % full == 0) return full;
  if (full >= 8 && len % (full / 2) == 0) return full / 2;
  return 1;
}

// Vectors a thread loads before using any, so that about 32 bytes per thread are in flight.
template <class T, int V>
constexpr int unroll_for() {
  constexpr int bytes = V * static_cast<int>(sizeof(T));
  return bytes >= 16 ? 2 : (bytes >= 8 ? 4 : 8);
}

// A product rounded on its own (no FMA contraction), as the CPU's coefficient arithmetic.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

// scale = w * invstd, shift = b - mean * scale (w = 1, b = 0 when undefined): the CPU's Affine.
template <class A>
__device__ __forceinline__ void affine_of(const A* mean, const A* invstd, const A* w, const A* b, int64_t c, A& scale,
                                          A& shift) {
  scale = mul_rn(w ? w[c] : A(1), invstd[c]);
  shift = (b ? b[c] : A(0)) - mul_rn(mean[c], scale);
}

// bn(x), written once so that the forward's ReLU and the backward's mask make the same decision.
template <class A>
__device__ __forceinline__ A bn_value(A x, A scale, A shift) {
  return x * scale + shift;
}

template <bool Relu, class A>
__device__ __forceinline__ A activate(A v) {
  if constexpr (Relu) return v > A(0) ? v : A(0);
  return v;
}

// dy where the fused ReLU passed bn(x), else 0: a product, not a select, as on the CPU (a NaN or
// infinite dy stays NaN where masked).
template <bool Relu, class A>
__device__ __forceinline__ A through_relu(A g, A x, A scale, A shift) {
  if constexpr (Relu) return g * static_cast<A>(bn_value(x, scale, shift) > A(0));
  return g;
}

// Per-channel coefficients of the elementwise passes (apply: scale, shift; dx: all).
template <class A>
struct Coef {
  A k1, k2, k3, mean, scale, shift;
};
constexpr int64_t kCoefWords = 6;  // A values per Coef

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sums a and b over a block of kThreads threads; thread 0 gets the result (warps in order).
template <class A>
__device__ __forceinline__ void block_sum2(A& a, A& b) {
  __shared__ A sa[kWarps], sb[kWarps];
  a = warp_sum(a);
  b = warp_sum(b);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sa[warp] = a;
    sb[warp] = b;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < kWarps; ++i) {
      sa[0] += sa[i];
      sb[0] += sb[i];
    }
    a = sa[0];
    b = sb[0];
  }
}

// ---------------------------------------------------------------------------------------------
// Per-element operations of the reductions. A Maker builds channel c's operation; the operation
// adds one value (x, and dy where kDy) into two accumulators.

template <class A>
struct StatsElem {
  A shift;
  __device__ __forceinline__ void operator()(A x, A, A& a1, A& a2) const {
    const A d = x - shift;
    a1 += d;
    a2 += d * d;
  }
};

template <class A>
struct StatsMaker {
  static constexpr bool kDy = false;
  const A* shift;
  __device__ __forceinline__ StatsElem<A> operator()(int64_t c) const { return {shift[c]}; }
};

template <class A, bool Relu>
struct GradElem {
  A mean, scale, shift;
  __device__ __forceinline__ void operator()(A x, A dy, A& a1, A& a2) const {
    const A g = through_relu<Relu>(dy, x, scale, shift);
    a1 += g;
    a2 += g * (x - mean);
  }
};

template <class A, bool Relu>
struct GradMaker {
  static constexpr bool kDy = true;
  const A *mean, *invstd, *w, *b;
  __device__ __forceinline__ GradElem<A, Relu> operator()(int64_t c) const {
    GradElem<A, Relu> e;
    e.mean = mean[c];
    affine_of(mean, invstd, w, b, c, e.scale, e.shift);
    return e;
  }
};

// ---------------------------------------------------------------------------------------------
// Reductions

// shift[c] = mean of channel c's first kShiftSamples values in memory order (0 when it has none).
template <class T>
__global__ void bn_shift_kernel(const T* __restrict__ x, int64_t N, int64_t C, int64_t S, bool rows,
                                acc_t<T>* __restrict__ shift) {
  using A = acc_t<T>;
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const int64_t k = N * S < kShiftSamples ? N * S : kShiftSamples;
  A s = 0;
  for (int64_t j = 0; j < k; ++j) s += load(x + (rows ? j * C + c : ((j / S) * C + c) * S + j % S));
  shift[c] = k > 0 ? s / static_cast<A>(k) : A(0);
}

// NCS: block (c, split) reduces vectors [j0, j1) of channel c's sequence of N * SV vectors (vector
// j is number j % SV of sample n = j / SV's run, at vector (n * C + c) * SV + j % SV). Lane k of
// the vectors has its own accumulators, added in lane order at the end. Partials go to
// p1/p2[split * C + c].
template <class T, int V, class Maker>
__global__ void __launch_bounds__(kThreads)
    bn_reduce_planes_kernel(const T* __restrict__ x, const T* __restrict__ dy, int64_t N, int64_t C, int64_t SV,
                            Maker mk, acc_t<T>* __restrict__ p1, acc_t<T>* __restrict__ p2) {
  using A = acc_t<T>;
  constexpr int U = unroll_for<T, V>();
  const int64_t c = blockIdx.x, split = blockIdx.y, ns = gridDim.y;
  const int64_t total = N * SV;
  const int64_t j1 = total * (split + 1) / ns;
  const auto el = mk(c);
  A q1[V], q2[V];
#pragma unroll
  for (int k = 0; k < V; ++k) q1[k] = q2[k] = A(0);
  // (n, s) of vector j, stepped by blockDim without a division per vector.
  const int64_t step_n = kThreads / SV, step_s = kThreads % SV;
  int64_t j = total * split / ns + threadIdx.x;
  int64_t n = j / SV, s = j - n * SV;
  while (j < j1) {
    Pack<T, V> xv[U], gv[U];
    bool ok[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      ok[u] = j < j1;
      if (ok[u]) {
        const int64_t off = ((n * C + c) * SV + s) * V;
        xv[u] = load_pack<T, V>(x + off);
        if constexpr (Maker::kDy) gv[u] = load_pack<T, V>(dy + off);
      }
      j += kThreads;
      n += step_n;
      s += step_s;
      if (s >= SV) {
        s -= SV;
        ++n;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (!ok[u]) continue;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if constexpr (Maker::kDy)
          el(convert<A>(xv[u].v[k]), convert<A>(gv[u].v[k]), q1[k], q2[k]);
        else
          el(convert<A>(xv[u].v[k]), A(0), q1[k], q2[k]);
      }
    }
  }
  A a1 = q1[0], a2 = q2[0];
#pragma unroll
  for (int k = 1; k < V; ++k) {
    a1 += q1[k];
    a2 += q2[k];
  }
  block_sum2(a1, a2);
  if (threadIdx.x == 0) {
    p1[split * C + c] = a1;
    p2[split * C + c] = a2;
  }
}

// Rows: block (cx, ry) threads; thread (tx, ty) of block (bx, split) owns channels
// [(bx * cx + tx) * V, + V) and walks rows r0 + ty, r0 + ty + ry, ... of the split's rows
// [r0, r1). The ry partials of a channel are added in a fixed tree. cx and ry are powers of two.
template <class T, int V, class Maker>
__global__ void __launch_bounds__(kThreads)
    bn_reduce_rows_kernel(const T* __restrict__ x, const T* __restrict__ dy, int64_t M, int64_t C, Maker mk,
                          acc_t<T>* __restrict__ p1, acc_t<T>* __restrict__ p2) {
  using A = acc_t<T>;
  constexpr int U = unroll_for<T, V>();
  __shared__ A s1[kThreads * V], s2[kThreads * V];
  const int cx = blockDim.x, ry = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int64_t CV = C / V;
  const int64_t cv = static_cast<int64_t>(blockIdx.x) * cx + tx;
  const int64_t split = blockIdx.y, ns = gridDim.y;
  const int64_t r0 = M * split / ns, r1 = M * (split + 1) / ns;
  A q1[V], q2[V];
#pragma unroll
  for (int k = 0; k < V; ++k) q1[k] = q2[k] = A(0);
  if (cv < CV) {
    decltype(mk(0)) el[V];
#pragma unroll
    for (int k = 0; k < V; ++k) el[k] = mk(cv * V + k);
    for (int64_t r = r0 + ty; r < r1; r += static_cast<int64_t>(ry) * U) {
      Pack<T, V> xv[U], gv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t rr = r + static_cast<int64_t>(u) * ry;
        if (rr < r1) {
          const int64_t off = rr * C + cv * V;
          xv[u] = load_pack<T, V>(x + off);
          if constexpr (Maker::kDy) gv[u] = load_pack<T, V>(dy + off);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (r + static_cast<int64_t>(u) * ry >= r1) continue;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          if constexpr (Maker::kDy)
            el[k](convert<A>(xv[u].v[k]), convert<A>(gv[u].v[k]), q1[k], q2[k]);
          else
            el[k](convert<A>(xv[u].v[k]), A(0), q1[k], q2[k]);
        }
      }
    }
  }
  const int slot = (ty * cx + tx) * V;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    s1[slot + k] = q1[k];
    s2[slot + k] = q2[k];
  }
  __syncthreads();
  for (int h = ry / 2; h > 0; h >>= 1) {
    if (ty < h) {
      const int other = slot + h * cx * V;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        s1[slot + k] += s1[other + k];
        s2[slot + k] += s2[other + k];
      }
    }
    __syncthreads();
  }
  if (ty == 0 && cv < CV) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      p1[split * C + cv * V + k] = s1[tx * V + k];
      p2[split * C + cv * V + k] = s2[tx * V + k];
    }
  }
}

// The second level of the reductions: channel c's ns partials (p[s * C + c]) added in f64 by a
// block of 32 channels (tx: coalesced along C) x kCombineLanes lanes (ty), lane ty taking
// partials ty, ty + kCombineLanes, ... in order, the lanes then added in a fixed tree. Up to
// thousands of partials per channel (channels-last with few channels), so one thread per channel
// would wait on a long chain of loads. No partials (p1 null): sums of 0. Returns true on the
// thread (ty == 0) that holds channel c's sums.
constexpr int kCombineLanes = 16;

template <class A>
__device__ __forceinline__ bool combine_partials(const A* __restrict__ p1, const A* __restrict__ p2, int64_t ns,
                                                 int64_t C, int64_t c, double& d1, double& d2) {
  __shared__ double s1[kCombineLanes][32], s2[kCombineLanes][32];
  const int tx = threadIdx.x, ty = threadIdx.y;
  double a1 = 0, a2 = 0;
  if (p1 && c < C) {
    for (int64_t s = ty; s < ns; s += kCombineLanes) {
      a1 += static_cast<double>(p1[s * C + c]);
      a2 += static_cast<double>(p2[s * C + c]);
    }
  }
  s1[ty][tx] = a1;
  s2[ty][tx] = a2;
  __syncthreads();
  for (int h = kCombineLanes / 2; h > 0; h >>= 1) {
    if (ty < h) {
      s1[ty][tx] += s1[ty + h][tx];
      s2[ty][tx] += s2[ty + h][tx];
    }
    __syncthreads();
  }
  d1 = s1[0][tx];
  d2 = s2[0][tx];
  return ty == 0 && c < C;
}

dim3 combine_grid(int64_t C) { return dim3(static_cast<unsigned>((C + 31) / 32)); }
const dim3 kCombineBlock(32, kCombineLanes);

// mean = shift + sum(d) / n, var = (sum(d^2) - sum(d)^2 / n) / n (no partials: no values, and
// NaN statistics as on the CPU).
template <class A>
__global__ void __launch_bounds__(32 * kCombineLanes)
    bn_stats_finish_kernel(const A* __restrict__ p1, const A* __restrict__ p2, int64_t ns, int64_t C,
                           const A* __restrict__ shift, double count, A* __restrict__ mean, A* __restrict__ var) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  double d1, d2;
  if (!combine_partials(p1, p2, ns, C, c, d1, d2)) return;
  mean[c] = static_cast<A>(static_cast<double>(shift[c]) + d1 / count);
  var[c] = static_cast<A>(fmax(0.0, d2 - d1 * d1 / count) / count);
}

// dw, db and the dx coefficients from the partial sums (none: sums of 0, the eval-mode dx without
// dw/db). The coefficient arithmetic is the CPU's, in f64 in the same order.
template <class A>
__global__ void __launch_bounds__(32 * kCombineLanes)
    bn_backward_finish_kernel(const A* __restrict__ p1, const A* __restrict__ p2, int64_t ns, int64_t C,
                              const A* __restrict__ mean, const A* __restrict__ invstd, const A* __restrict__ w,
                              const A* __restrict__ b, double count, bool training, A* __restrict__ dw,
                              A* __restrict__ db, Coef<A>* __restrict__ coef) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  double sdy, sdyx;
  if (!combine_partials(p1, p2, ns, C, c, sdy, sdyx)) return;
  const double is = static_cast<double>(invstd[c]);
  if (dw) dw[c] = static_cast<A>(sdyx * is);
  if (db) db[c] = static_cast<A>(sdy);
  if (!coef) return;
  const double wi = static_cast<double>(w ? w[c] : A(1)) * is;
  Coef<A> k;
  k.k1 = static_cast<A>(wi);
  k.k2 = training ? static_cast<A>(-wi * is * is * sdyx / count) : A(0);
  k.k3 = training ? static_cast<A>(-wi * sdy / count) : A(0);
  k.mean = mean[c];
  affine_of(mean, invstd, w, b, c, k.scale, k.shift);
  coef[c] = k;
}

// scale and shift of every channel, for the NCS apply.
template <class A>
__global__ void bn_affine_kernel(const A* __restrict__ mean, const A* __restrict__ invstd, const A* __restrict__ w,
                                 const A* __restrict__ b, int64_t C, Coef<A>* __restrict__ coef) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < C;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Coef<A> k{};
    affine_of(mean, invstd, w, b, c, k.scale, k.shift);
    coef[c] = k;
  }
}

// ---------------------------------------------------------------------------------------------
// Elementwise passes

// NCS apply: thread per vector of the flattened [N, C, SV] index; channel = (j / SV) % C.
template <class T, int V, bool Relu>
__global__ void __launch_bounds__(kThreads, kElementwiseBlocks)
    bn_apply_planes_kernel(const T* __restrict__ x, int64_t units, int64_t C, FastDiv per_run, FastDiv per_c,
                           const Coef<acc_t<T>>* __restrict__ coef, const T* __restrict__ res, T* __restrict__ y) {
  using A = acc_t<T>;
  constexpr int U = unroll_for<T, V>();
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * U + threadIdx.x; base < units;
       base += static_cast<int64_t>(gridDim.x) * kThreads * U) {
    Pack<T, V> xv[U];
    int ch[U];  // channel: C < 2^31 (it is a grid dimension of the reductions)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t j = base + static_cast<int64_t>(u) * kThreads;
      if (j < units) {
        xv[u] = load_pack<T, V>(x + j * V);
        const int64_t run = per_run.div(j);
        ch[u] = static_cast<int>(run - per_c.div(run) * C);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t j = base + static_cast<int64_t>(u) * kThreads;
      if (j >= units) continue;
      const A sc = coef[ch[u]].scale, sh = coef[ch[u]].shift;
      Pack<T, V> out;
      if (res) {  // batch_norm_add_relu: the block's residual joins before the ReLU, one rounding
        const Pack<T, V> rv = load_pack<T, V>(res + j * V);
#pragma unroll
        for (int k = 0; k < V; ++k)
          out.v[k] = convert<T>(activate<Relu>(bn_value(convert<A>(xv[u].v[k]), sc, sh) + convert<A>(rv.v[k])));
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) out.v[k] = convert<T>(activate<Relu>(bn_value(convert<A>(xv[u].v[k]), sc, sh)));
      }
      store_pack<T, V>(y + j * V, out);
    }
  }
}

// Rows apply: thread (tx, ty) owns V channels (coefficients in registers) and walks rows.
template <class T, int V, bool Relu>
__global__ void __launch_bounds__(kThreads, kElementwiseBlocks)
    bn_apply_rows_kernel(const T* __restrict__ x, int64_t M, int64_t C, const acc_t<T>* __restrict__ mean,
                         const acc_t<T>* __restrict__ invstd, const acc_t<T>* __restrict__ w,
                         const acc_t<T>* __restrict__ b, const T* __restrict__ res, T* __restrict__ y) {
  using A = acc_t<T>;
  constexpr int U = unroll_for<T, V>();
  const int64_t cv = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (cv >= C / V) return;
  A sc[V], sh[V];
#pragma unroll
  for (int k = 0; k < V; ++k) affine_of(mean, invstd, w, b, cv * V + k, sc[k], sh[k]);
  const int64_t ry = blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * ry * U + threadIdx.y; r < M;
       r += static_cast<int64_t>(gridDim.y) * ry * U) {
    Pack<T, V> xv[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (r + u * ry < M) xv[u] = load_pack<T, V>(x + (r + u * ry) * C + cv * V);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (r + u * ry >= M) continue;
      Pack<T, V> out;
      if (res) {  // as in bn_apply_planes_kernel
        const Pack<T, V> rv = load_pack<T, V>(res + (r + u * ry) * C + cv * V);
#pragma unroll
        for (int k = 0; k < V; ++k)
          out.v[k] = convert<T>(activate<Relu>(bn_value(convert<A>(xv[u].v[k]), sc[k], sh[k]) + convert<A>(rv.v[k])));
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k)
          out.v[k] = convert<T>(activate<Relu>(bn_value(convert<A>(xv[u].v[k]), sc[k], sh[k])));
      }
      store_pack<T, V>(y + (r + u * ry) * C + cv * V, out);
    }
  }
}

// dx of one element from channel coefficients: training uses all of them; eval is dy * k1 through
// the ReLU mask (x read only for the mask).
template <bool Training, bool Relu, class A>
__device__ __forceinline__ A dx_of(A dy, A x, const Coef<A>& k) {
  const A g = through_relu<Relu>(dy, x, k.scale, k.shift);
  if constexpr (Training) return g * k.k1 + (x - k.mean) * k.k2 + k.k3;
  return g * k.k1;
}

// NCS dx: as the NCS apply. x is not read in eval mode without ReLU (dx = dy * k1 whatever x is).
template <class T, int V, bool Training, bool Relu>
__global__ void __launch_bounds__(kThreads, kElementwiseBlocks)
    bn_dx_planes_kernel(const T* __restrict__ dy, const T* __restrict__ x, int64_t units, int64_t C, FastDiv per_run,
                        FastDiv per_c, const Coef<acc_t<T>>* __restrict__ coef, T* __restrict__ dx) {
  using A = acc_t<T>;
  constexpr bool kReadX = Training || Relu;
  constexpr int U = unroll_for<T, V>();
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * U + threadIdx.x; base < units;
       base += static_cast<int64_t>(gridDim.x) * kThreads * U) {
    Pack<T, V> gv[U], xv[U];
    int ch[U];  // channel: C < 2^31 (it is a grid dimension of the reductions)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t j = base + static_cast<int64_t>(u) * kThreads;
      if (j < units) {
        gv[u] = load_pack<T, V>(dy + j * V);
        if constexpr (kReadX) xv[u] = load_pack<T, V>(x + j * V);
        const int64_t run = per_run.div(j);
        ch[u] = static_cast<int>(run - per_c.div(run) * C);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t j = base + static_cast<int64_t>(u) * kThreads;
      if (j >= units) continue;
      const Coef<A> k = coef[ch[u]];
      Pack<T, V> out;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const A xe = kReadX ? convert<A>(xv[u].v[e]) : A(0);
        out.v[e] = convert<T>(dx_of<Training, Relu>(convert<A>(gv[u].v[e]), xe, k));
      }
      store_pack<T, V>(dx + j * V, out);
    }
  }
}

// Rows dx: as the rows apply, coefficients from the table into registers once per thread. The
// V channels' six coefficients take 48 registers at V = 8, so this one gets a larger budget (two
// blocks per SM, each thread with two rows of dy and x in flight) rather than spilling.
template <class T, int V, bool Training, bool Relu>
__global__ void __launch_bounds__(kThreads, kElementwiseBlocks - 1)
    bn_dx_rows_kernel(const T* __restrict__ dy, const T* __restrict__ x, int64_t M, int64_t C,
                      const Coef<acc_t<T>>* __restrict__ coef, T* __restrict__ dx) {
  using A = acc_t<T>;
  constexpr bool kReadX = Training || Relu;
  constexpr int U = unroll_for<T, V>();
  const int64_t cv = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (cv >= C / V) return;
  Coef<A> k[V];
#pragma unroll
  for (int e = 0; e < V; ++e) k[e] = coef[cv * V + e];
  const int64_t ry = blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * ry * U + threadIdx.y; r < M;
       r += static_cast<int64_t>(gridDim.y) * ry * U) {
    Pack<T, V> gv[U], xv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t rr = r + u * ry;
      if (rr < M) {
        gv[u] = load_pack<T, V>(dy + rr * C + cv * V);
        if constexpr (kReadX) xv[u] = load_pack<T, V>(x + rr * C + cv * V);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t rr = r + u * ry;
      if (rr >= M) continue;
      Pack<T, V> out;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const A xe = kReadX ? convert<A>(xv[u].v[e]) : A(0);
        out.v[e] = convert<T>(dx_of<Training, Relu>(convert<A>(gv[u].v[e]), xe, k[e]));
      }
      store_pack<T, V>(dx + rr * C + cv * V, out);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Launch geometry (all from the shape only)

// Blocks per channel of the NCS reduction over `count` values: together about kTargetBlocks,
// each at least kMinElemsPerBlock values (unless the channel has fewer) and at most
// kMaxElemsPerBlock.
int64_t plane_splits(int64_t C, int64_t count) {
  const int64_t fill = ceil_div(kTargetBlocks, C);
  const int64_t at_most = std::max<int64_t>(1, count / kMinElemsPerBlock);
  const int64_t at_least = ceil_div(count, kMaxElemsPerBlock);
  return std::clamp<int64_t>(std::max(at_least, std::min(fill, at_most)), 1, kMaxSplits);
}

// Rows layout blocks: cx threads across the C / V channel vectors (a power of two up to a warp),
// ry = kThreads / cx rows at a time; gx blocks cover the channels.
struct RowGeom {
  int cx = 1, ry = kThreads;
  int64_t gx = 1;
};
RowGeom row_geom(int64_t CV) {
  RowGeom g;
  while (g.cx < 32 && g.cx < CV) g.cx <<= 1;
  g.ry = kThreads / g.cx;
  g.gx = ceil_div(CV, g.cx);
  return g;
}

// Row splits of the rows reduction: about kTargetBlocks blocks in all, each thread walking
// between 8 and 256 rows where M allows.
int64_t row_splits(const RowGeom& g, int64_t M) {
  const int64_t fill = ceil_div(kTargetBlocks, g.gx);
  const int64_t at_most = std::max<int64_t>(1, M / (g.ry * int64_t(8)));
  const int64_t at_least = ceil_div(M, g.ry * int64_t(256));
  return std::clamp<int64_t>(std::max(at_least, std::min(fill, at_most)), 1, kMaxSplits);
}

unsigned flat_grid(int64_t units, int per_block) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(units, per_block), 1, kMaxGrid));
}

// Row-walk grid of the elementwise rows kernels: each thread a few rows.
dim3 row_grid(const RowGeom& g, int64_t M, int U) {
  return dim3(static_cast<unsigned>(g.gx),
              static_cast<unsigned>(std::clamp<int64_t>(ceil_div(M, int64_t(g.ry) * U * 4), 1, kMaxSplits)));
}

// `t` itself when its data is aligned to `bytes`, else an aligned copy in the same memory order
// (a view at an odd offset): the reductions then load whole vectors and keep one summation order
// whatever the offset.
Tensor aligned_copy(const Tensor& t, size_t bytes) {
  if (aligned_to(t, bytes)) return t;
  Tensor c = empty_strided(t.shape(), t.strides(), t.options());
  c.copy_(t);
  return c;
}

// The sums of a reduction: launches the NCS or rows kernel for `mk` into partials p1/p2
// ([ns, C] each), with vectors of V elements.
template <class T, int V, class Maker>
void launch_reduce(const Tensor& x, const Tensor& dy, const BatchNormLayout& L, int64_t ns, Maker mk, acc_t<T>* p1,
                   acc_t<T>* p2, cudaStream_t stream) {
  const T* xp = cptr<T>(x);
  const T* dyp = dy.defined() ? cptr<T>(dy) : nullptr;
  if (!L.rows) {
    bn_reduce_planes_kernel<T, V, Maker>
        <<<dim3(static_cast<unsigned>(L.C), static_cast<unsigned>(ns)), kThreads, 0, stream>>>(xp, dyp, L.N, L.C,
                                                                                               L.S / V, mk, p1, p2);
  } else {
    const RowGeom g = row_geom(L.C / V);
    bn_reduce_rows_kernel<T, V, Maker>
        <<<dim3(static_cast<unsigned>(g.gx), static_cast<unsigned>(ns)), dim3(g.cx, g.ry), 0, stream>>>(
            xp, dyp, L.N * L.S, L.C, mk, p1, p2);
  }
  check_launch("batch_norm");
}

// Splits of the reduction over L (the rows kernel's geometry uses the shape's vector width).
template <class T>
int64_t reduce_splits(const BatchNormLayout& L) {
  if (!L.rows) return plane_splits(L.C, L.N * L.S);
  return row_splits(row_geom(L.C / vec_width<T>(L.C)), L.N * L.S);
}

// Vector width for an elementwise pass: the shape's, or 1 where a pointer is not aligned to it
// (any width gives the same values there).
template <class T>
int elementwise_width(const BatchNormLayout& L, std::initializer_list<const Tensor*> ts) {
  const int v = vec_width<T>(L.rows ? L.C : L.S);
  for (const Tensor* t : ts)
    if (!aligned_to(*t, v * sizeof(T))) return 1;
  return v;
}

// invstd and the running statistics, one thread per channel, in f64 as on the CPU (each result
// rounded once), R the running statistics' dtype.
template <class A, class R>
__global__ void bn_update_kernel(const A* __restrict__ mean, const A* __restrict__ var, int64_t C, double momentum,
                                 double eps, double unbias, A* __restrict__ invstd, R* __restrict__ rm,
                                 R* __restrict__ rv) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const double v = static_cast<double>(var[c]);
  invstd[c] = static_cast<A>(1.0 / sqrt(v + eps));
  if (rm == nullptr) return;
  const double om = 1.0 - momentum;
  using RC = acc_t<R>;
  rm[c] = convert<R>(static_cast<RC>(om * static_cast<double>(load(rm + c)) + momentum * static_cast<double>(mean[c])));
  rv[c] = convert<R>(static_cast<RC>(om * static_cast<double>(load(rv + c)) + momentum * v * unbias));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// entries

void batch_norm_update(const Tensor& mean, const Tensor& var, double count, double momentum, double eps,
                       const Tensor& invstd, const Tensor& running_mean, const Tensor& running_var) {
  const int64_t C = mean.numel();
  if (C == 0) return;
  cudaStream_t stream = stream_for(mean);
  const unsigned blocks = static_cast<unsigned>(ceil_div(C, kThreads));
  const double unbias = count / (count - 1);
  FT_CUDA_DISPATCH_FLOATING(mean.dtype(), "batch_norm", [&] {
    using A = scalar_t;
    if (!running_mean.defined()) {
      bn_update_kernel<A, A><<<blocks, kThreads, 0, stream>>>(cptr<A>(mean), cptr<A>(var), C, momentum, eps, unbias,
                                                              mptr<A>(invstd), nullptr, nullptr);
      check_launch("batch_norm_update");
      return;
    }
    FT_CUDA_DISPATCH_FLOATING(running_mean.dtype(), "batch_norm", [&] {
      using R = scalar_t;
      bn_update_kernel<A, R><<<blocks, kThreads, 0, stream>>>(cptr<A>(mean), cptr<A>(var), C, momentum, eps, unbias,
                                                              mptr<A>(invstd), mptr<R>(running_mean),
                                                              mptr<R>(running_var));
      check_launch("batch_norm_update");
    });
  });
}

void batch_norm_stats(const Tensor& x, const BatchNormLayout& L, const Tensor& mean, const Tensor& var) {
  const int64_t C = L.C, M = L.N * L.S;
  if (C == 0) return;
  cudaStream_t stream = stream_for(x);
  FT_CUDA_DISPATCH_FLOATING(x.dtype(), "batch_norm", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    const int V = vec_width<T>(L.rows ? L.C : L.S);
    const Tensor xa = aligned_copy(x, V * sizeof(T));
    const int64_t ns = M > 0 ? reduce_splits<T>(L) : 0;
    Tensor ws = empty({C * (1 + 2 * ns)}, TensorOptions(mean.dtype(), x.device()));
    A* shift = mptr<A>(ws);
    A* p1 = ns > 0 ? shift + C : nullptr;
    A* p2 = ns > 0 ? p1 + ns * C : nullptr;
    bn_shift_kernel<T><<<static_cast<unsigned>(ceil_div(C, kThreads)), kThreads, 0, stream>>>(cptr<T>(xa), L.N, C, L.S,
                                                                                              L.rows, shift);
    check_launch("batch_norm_stats");
    if (ns > 0) {
      with_width<T>(V, [&](auto vc) {
        launch_reduce<T, decltype(vc)::value>(xa, Tensor(), L, ns, StatsMaker<A>{shift}, p1, p2, stream);
      });
    }
    bn_stats_finish_kernel<A><<<combine_grid(C), kCombineBlock, 0, stream>>>(
        p1, p2, ns, C, shift, static_cast<double>(M), mptr<A>(mean), mptr<A>(var));
    check_launch("batch_norm_stats");
  });
}

namespace {

// batch_norm_apply, and with `residual` defined batch_norm_add_relu (the ReLU then always on).
void apply_batch_norm(const Tensor& x, const BatchNormLayout& L, const Tensor& mean, const Tensor& invstd,
                      const Tensor& w, const Tensor& b, const Tensor& residual, const Tensor& y) {
  const int64_t C = L.C, M = L.N * L.S;
  if (C == 0 || M == 0) return;
  cudaStream_t stream = stream_for(x);
  const bool relu = L.relu || residual.defined();
  FT_CUDA_DISPATCH_FLOATING(x.dtype(), "batch_norm", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    const A* meanp = cptr<A>(mean);
    const A* isp = cptr<A>(invstd);
    const A* wp = opt_ptr<A>(w);
    const A* bp = opt_ptr<A>(b);
    const T* rp = residual.defined() ? cptr<T>(residual) : nullptr;
    const int width =
        residual.defined() ? elementwise_width<T>(L, {&x, &y, &residual}) : elementwise_width<T>(L, {&x, &y});
    with_width<T>(width, [&](auto vc) {
      constexpr int V = decltype(vc)::value;
      constexpr int U = unroll_for<T, V>();
      if (!L.rows) {
        Tensor ws = empty({C * kCoefWords}, TensorOptions(mean.dtype(), x.device()));
        auto* coef = reinterpret_cast<Coef<A>*>(mptr<A>(ws));
        bn_affine_kernel<A><<<flat_grid(C, kThreads), kThreads, 0, stream>>>(meanp, isp, wp, bp, C, coef);
        check_launch("batch_norm_apply");
        const int64_t units = M * C / V;
        auto kernel = relu ? bn_apply_planes_kernel<T, V, true> : bn_apply_planes_kernel<T, V, false>;
        kernel<<<flat_grid(units, kThreads * U), kThreads, 0, stream>>>(cptr<T>(x), units, C, FastDiv(L.S / V),
                                                                        FastDiv(C), coef, rp, mptr<T>(y));
      } else {
        const RowGeom g = row_geom(C / V);
        auto kernel = relu ? bn_apply_rows_kernel<T, V, true> : bn_apply_rows_kernel<T, V, false>;
        kernel<<<row_grid(g, M, U), dim3(g.cx, g.ry), 0, stream>>>(cptr<T>(x), M, C, meanp, isp, wp, bp, rp,
                                                                   mptr<T>(y));
      }
      check_launch("batch_norm_apply");
    });
  });
}

}  // namespace

void batch_norm_apply(const Tensor& x, const BatchNormLayout& L, const Tensor& mean, const Tensor& invstd,
                      const Tensor& w, const Tensor& b, const Tensor& y) {
  apply_batch_norm(x, L, mean, invstd, w, b, Tensor(), y);
}

void batch_norm_add_relu(const Tensor& x, const BatchNormLayout& L, const Tensor& mean, const Tensor& invstd,
                         const Tensor& w, const Tensor& b, const Tensor& residual, const Tensor& y) {
  apply_batch_norm(x, L, mean, invstd, w, b, residual, y);
}

void batch_norm_backward(const Tensor& dy, const Tensor& x, const BatchNormLayout& L, const Tensor& mean,
                         const Tensor& invstd, const Tensor& w, const Tensor& b, bool training, const Tensor& dx,
                         const Tensor& dw, const Tensor& db) {
  const int64_t C = L.C, M = L.N * L.S;
  if (C == 0 || (!dx.defined() && !dw.defined() && !db.defined())) return;
  // The sums feed dw, db and the training-mode dx; eval-mode dx alone needs none, and over no
  // values they are 0 without a pass.
  const bool need_sums = (dw.defined() || db.defined() || (training && dx.defined())) && M > 0;
  cudaStream_t stream = stream_for(x);
  FT_CUDA_DISPATCH_FLOATING(x.dtype(), "batch_norm_backward", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    const A* meanp = cptr<A>(mean);
    const A* isp = cptr<A>(invstd);
    const A* wp = opt_ptr<A>(w);
    const A* bp = opt_ptr<A>(b);
    const int64_t ns = need_sums ? reduce_splits<T>(L) : 0;
    const int64_t coef_words = dx.defined() ? C * kCoefWords : 0;
    Tensor ws = empty({coef_words + 2 * ns * C}, TensorOptions(mean.dtype(), x.device()));
    A* base = mptr<A>(ws);
    Coef<A>* coef = dx.defined() ? reinterpret_cast<Coef<A>*>(base) : nullptr;
    A* p1 = need_sums ? base + coef_words : nullptr;
    A* p2 = need_sums ? p1 + ns * C : nullptr;
    if (need_sums) {
      const int V = vec_width<T>(L.rows ? L.C : L.S);
      const Tensor xa = aligned_copy(x, V * sizeof(T)), dya = aligned_copy(dy, V * sizeof(T));
      with_width<T>(V, [&](auto vc) {
        constexpr int VV = decltype(vc)::value;
        if (L.relu)
          launch_reduce<T, VV>(xa, dya, L, ns, GradMaker<A, true>{meanp, isp, wp, bp}, p1, p2, stream);
        else
          launch_reduce<T, VV>(xa, dya, L, ns, GradMaker<A, false>{meanp, isp, wp, bp}, p1, p2, stream);
      });
    }
    bn_backward_finish_kernel<A><<<combine_grid(C), kCombineBlock, 0, stream>>>(
        p1, p2, ns, C, meanp, isp, wp, bp, static_cast<double>(M), training, dw.defined() ? mptr<A>(dw) : nullptr,
        db.defined() ? mptr<A>(db) : nullptr, coef);
    check_launch("batch_norm_backward");
    if (!dx.defined() || M == 0) return;
    const bool read_x = training || L.relu;
    const int v = read_x ? elementwise_width<T>(L, {&dy, &x, &dx}) : elementwise_width<T>(L, {&dy, &dx});
    with_width<T>(v, [&](auto vc) {
      constexpr int V = decltype(vc)::value;
      constexpr int U = unroll_for<T, V>();
      if (!L.rows) {
        const int64_t units = M * C / V;
        auto kernel = training
                          ? (L.relu ? bn_dx_planes_kernel<T, V, true, true> : bn_dx_planes_kernel<T, V, true, false>)
                          : (L.relu ? bn_dx_planes_kernel<T, V, false, true> : bn_dx_planes_kernel<T, V, false, false>);
        kernel<<<flat_grid(units, kThreads * U), kThreads, 0, stream>>>(
            cptr<T>(dy), cptr<T>(x), units, C, FastDiv(L.S / V), FastDiv(C), coef, mptr<T>(dx));
      } else {
        const RowGeom g = row_geom(C / V);
        auto kernel = training
                          ? (L.relu ? bn_dx_rows_kernel<T, V, true, true> : bn_dx_rows_kernel<T, V, true, false>)
                          : (L.relu ? bn_dx_rows_kernel<T, V, false, true> : bn_dx_rows_kernel<T, V, false, false>);
        kernel<<<row_grid(g, M, U), dim3(g.cx, g.ry), 0, stream>>>(cptr<T>(dy), cptr<T>(x), M, C, coef, mptr<T>(dx));
      }
      check_launch("batch_norm_backward");
    });
  });
}

}  // namespace ft::cuda
