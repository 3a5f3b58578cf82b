// CUDA kernels of 2-d pooling (kernel-table entries max_pool2d_*, avg_pool2d_*,
// adaptive_avg_pool2d_*). Semantics are the CPU backend's (backend/cpu/pool.cpp), in f32 (f64 for
// f64 tensors) whatever the input dtype.
//
// Layouts: dense NCHW (a plane per (n, c)) or dense NHWC (PoolParams.channels_last: a plane per n
// whose positions hold C contiguous channels). Element (plane b, position ih * W + iw, channel
// lane) lives at (b * H * W + ih * W + iw) * inner + lane, inner = C (NHWC) or 1 (NCHW); the same
// for outputs with OH x OW. NHWC threads own V adjacent channels (one 16-byte vector load where C
// and the pointers allow), so a warp reads contiguous memory at every tap.
//
// Math:
// - max forward: y = max over the window's taps (oh * s - p + k * d, clipped to the input) in
//   scan order (rows, then columns); a tap is taken when v > best or v is NaN, so NaN wins (the
//   last NaN) and the first maximum wins ties; a window of -inf keeps its first valid position.
//   indices = flat position ih * W + iw within the input plane (PyTorch's). Reads each window,
//   writes y and indices once.
// - max backward, as a gather: each input element visits the output windows that can contain it
//   and adds gy where the saved index is its own position, in increasing output order (the CPU's
//   scatter order, so the sums are the same bits). No atomics, so deterministic and safe in bf16;
//   reads gy and indices of a few windows per element, writes gx once.
// - avg forward: sum over the clipped window / divisor (the padded window's size with
//   count_include_pad, else the clipped one's). adaptive: window [floor(o * H / OH),
//   ceil((o + 1) * H / OH)) per axis, divided by its size. Sums in the CPU's order (rows, then
//   columns), so the results are the CPU's bits. Global pooling (1x1 output) in NCHW reduces a
//   plane with a warp instead (a fixed shuffle tree), for coalesced loads.
// - avg / adaptive backward, as a gather: gx = sum over the windows containing the element of
//   gy / divisor, in increasing output order (the CPU's). Reads gy, writes gx once.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/vectors.cuh"

namespace ft::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = int64_t(1) << 20;  // grid-stride loops take over beyond
// Blocks per SM the kernels are compiled for (85 registers): each thread has only a vector or two
// in flight, so the loads need many resident threads.
constexpr int kMinBlocks = 3;

unsigned flat_grid(int64_t n) { return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(n, kThreads), 1, kMaxGrid)); }

// The pooling geometry as the kernels see it: the parameters, the plane layout and dividers for
// decoding a flat (plane, row, column, channel vector) index of the outputs (OH, OW) or inputs
// (H, W).
struct Geom {
  PoolParams p;
  int64_t inner = 1;  // elements per position: C (NHWC) or 1 (NCHW)
  int64_t CV = 1;     // channel vectors per position: C / V (NHWC) or 1 (NCHW)
  FastDiv by_cv, by_ow, by_oh, by_w, by_h;
};

Geom make_geom(const PoolParams& p, int V) {
  Geom g;
  g.p = p;
  g.inner = p.channels_last ? p.C : 1;
  g.CV = p.channels_last ? p.C / V : 1;
  g.by_cv = FastDiv(g.CV);
  g.by_ow = FastDiv(p.OW);
  g.by_oh = FastDiv(p.OH);
  g.by_w = FastDiv(p.W);
  g.by_h = FastDiv(p.H);
  return g;
}

int64_t planes_of(const PoolParams& p) { return p.channels_last ? p.N : p.N * p.C; }

// (plane, row, column, channel vector) of flat index i over [planes, rows, cols, CV].
struct Pos {
  int64_t b, r, c, cv;
};
__device__ __forceinline__ Pos decode(int64_t i, int64_t CV, const FastDiv& by_cv, int64_t cols, const FastDiv& by_cols,
                                      int64_t rows, const FastDiv& by_rows) {
  Pos q;
  int64_t t = by_cv.div(i);
  q.cv = i - t * CV;
  const int64_t t2 = by_cols.div(t);
  q.c = t - t2 * cols;
  t = by_rows.div(t2);
  q.r = t2 - t * rows;
  q.b = t;
  return q;
}

// The valid taps lo, lo + d, ... < hi of a dilated window starting at `start` (may be negative).
__device__ __forceinline__ void clip_taps(int64_t start, int64_t k, int64_t d, int64_t size, int64_t& lo, int64_t& hi) {
  hi = min(start + (k - 1) * d + 1, size);
  lo = start < 0 ? start + (-start + d - 1) / d * d : start;
}

// A mean window clipped to the input, and its divisor (the CPU's avg_window / adaptive_window).
template <class A>
struct Window {
  int64_t hs, he, ws, we;
  A div;
};

template <class A>
__device__ __forceinline__ Window<A> avg_window(const PoolParams& p, int64_t oh, int64_t ow) {
  int64_t hs = oh * p.sH - p.pH, ws = ow * p.sW - p.pW;
  int64_t he = min(hs + p.kH, p.H + p.pH), we = min(ws + p.kW, p.W + p.pW);
  const int64_t padded = (he - hs) * (we - ws);
  hs = max(hs, int64_t(0));
  ws = max(ws, int64_t(0));
  he = min(he, p.H);
  we = min(we, p.W);
  return {hs, he, ws, we, static_cast<A>(p.count_include_pad ? padded : (he - hs) * (we - ws))};
}

template <class A>
__device__ __forceinline__ Window<A> adaptive_window(const PoolParams& p, int64_t oh, int64_t ow) {
  const int64_t hs = oh * p.H / p.OH, he = ((oh + 1) * p.H + p.OH - 1) / p.OH;
  const int64_t ws = ow * p.W / p.OW, we = ((ow + 1) * p.W + p.OW - 1) / p.OW;
  return {hs, he, ws, we, static_cast<A>((he - hs) * (we - ws))};
}

template <class A>
__device__ __forceinline__ A neg_inf() {
  return -static_cast<A>(INFINITY);
}

// ---------------------------------------------------------------------------------------------
// max

template <class T, int V>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    max_pool_forward_kernel(const Geom g, const T* __restrict__ x, T* __restrict__ y, int64_t* __restrict__ idx,
                            int64_t total) {
  using A = acc_t<T>;
  const PoolParams& p = g.p;
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < total;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Pos q = decode(o, g.CV, g.by_cv, p.OW, g.by_ow, p.OH, g.by_oh);
    int64_t hs, he, ws, we;
    clip_taps(q.r * p.sH - p.pH, p.kH, p.dH, p.H, hs, he);
    clip_taps(q.c * p.sW - p.pW, p.kW, p.dW, p.W, ws, we);
    A best[V];
    int64_t at[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      best[k] = neg_inf<A>();
      at[k] = hs * p.W + ws;  // kept by a window of -inf values
    }
    const T* xb = x + q.b * p.H * p.W * g.inner + q.cv * V;
    for (int64_t ih = hs; ih < he; ih += p.dH)
      for (int64_t iw = ws; iw < we; iw += p.dW) {
        const int64_t pos = ih * p.W + iw;
        const Pack<T, V> v = load_pack<T, V>(xb + pos * g.inner);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const A a = convert<A>(v.v[k]);
          if (a > best[k] || a != a) {
            best[k] = a;
            at[k] = pos;
          }
        }
      }
    const int64_t out = ((q.b * p.OH + q.r) * p.OW + q.c) * g.inner + q.cv * V;
    Pack<T, V> yv;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      yv.v[k] = convert<T>(best[k]);  // an input value (or -inf): exact in T
      idx[out + k] = at[k];
    }
    store_pack<T, V>(y + out, yv);
  }
}

// Output rows (or columns) whose windows can hold input row i: oh * s - p + k * d = i for some
// tap k in [0, ksize), i.e. oh in [ceil((i + p - (ksize - 1) * d) / s), floor((i + p) / s)],
// clipped to [0, out).
__device__ __forceinline__ void windows_over(int64_t i, int64_t p, int64_t ksize, int64_t d, int64_t s, int64_t out,
                                             int64_t& lo, int64_t& hi) {
  const int64_t first = i + p - (ksize - 1) * d;
  lo = first <= 0 ? 0 : (first + s - 1) / s;
  hi = min((i + p) / s, out - 1);
}

template <class T, int V>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    max_pool_backward_kernel(const Geom g, const T* __restrict__ gy, const int64_t* __restrict__ idx,
                             T* __restrict__ gx, int64_t total) {
  using A = acc_t<T>;
  const PoolParams& p = g.p;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Pos q = decode(i, g.CV, g.by_cv, p.W, g.by_w, p.H, g.by_h);
    int64_t oh0, oh1, ow0, ow1;
    windows_over(q.r, p.pH, p.kH, p.dH, p.sH, p.OH, oh0, oh1);
    windows_over(q.c, p.pW, p.kW, p.dW, p.sW, p.OW, ow0, ow1);
    const int64_t pos = q.r * p.W + q.c;
    const int64_t ob = q.b * p.OH * p.OW * g.inner + q.cv * V;
    A acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = A(0);
    // A window's index is one of its taps, so among these windows only the ones that picked this
    // element match; no dilation test is needed.
    for (int64_t oh = oh0; oh <= oh1; ++oh)
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        const int64_t o = ob + (oh * p.OW + ow) * g.inner;
#pragma unroll
        for (int k = 0; k < V; ++k)
          if (idx[o + k] == pos) acc[k] += load(gy + o + k);
      }
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = convert<T>(acc[k]);
    store_pack<T, V>(gx + (q.b * p.H * p.W + pos) * g.inner + q.cv * V, out);
  }
}

// ---------------------------------------------------------------------------------------------
// avg / adaptive avg

template <bool Adaptive, class A>
__device__ __forceinline__ Window<A> mean_window(const PoolParams& p, int64_t oh, int64_t ow) {
  if constexpr (Adaptive) return adaptive_window<A>(p, oh, ow);
  return avg_window<A>(p, oh, ow);
}

template <class T, int V, bool Adaptive>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    mean_pool_forward_kernel(const Geom g, const T* __restrict__ x, T* __restrict__ y, int64_t total) {
  using A = acc_t<T>;
  const PoolParams& p = g.p;
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < total;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Pos q = decode(o, g.CV, g.by_cv, p.OW, g.by_ow, p.OH, g.by_oh);
    const Window<A> w = mean_window<Adaptive, A>(p, q.r, q.c);
    const T* xb = x + q.b * p.H * p.W * g.inner + q.cv * V;
    A s[V];
#pragma unroll
    for (int k = 0; k < V; ++k) s[k] = A(0);
    for (int64_t ih = w.hs; ih < w.he; ++ih)
      for (int64_t iw = w.ws; iw < w.we; ++iw) {
        const Pack<T, V> v = load_pack<T, V>(xb + (ih * p.W + iw) * g.inner);
#pragma unroll
        for (int k = 0; k < V; ++k) s[k] += convert<A>(v.v[k]);
      }
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = convert<T>(s[k] / w.div);
    store_pack<T, V>(y + ((q.b * p.OH + q.r) * p.OW + q.c) * g.inner + q.cv * V, out);
  }
}

// Global average pooling of NCHW planes: a warp per plane, lanes striding along it (coalesced),
// partial sums combined by a fixed shuffle tree.
template <class T>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    global_avg_planes_kernel(const T* __restrict__ x, int64_t planes, int64_t HW, T* __restrict__ y) {
  using A = acc_t<T>;
  constexpr int kWarpsPerBlock = kThreads / 32;
  const int lane = threadIdx.x & 31;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); b < planes;
       b += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const T* xb = x + b * HW;
    A s = 0;
    for (int64_t i = lane; i < HW; i += 32) s += load(xb + i);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) y[b] = convert<T>(s / static_cast<A>(HW));
  }
}

// Output rows whose adaptive windows hold input row i: [floor(i * out / in), ceil((i + 1) * out
// / in)), clipped to [0, out). The kernel still tests each window (a superset is harmless).
__device__ __forceinline__ void adaptive_windows_over(int64_t i, int64_t in, int64_t out, int64_t& lo, int64_t& hi) {
  lo = i * out / in;
  hi = min(((i + 1) * out + in - 1) / in - 1, out - 1);
}

template <class T, int V, bool Adaptive>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    mean_pool_backward_kernel(const Geom g, const T* __restrict__ gy, T* __restrict__ gx, int64_t total) {
  using A = acc_t<T>;
  const PoolParams& p = g.p;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Pos q = decode(i, g.CV, g.by_cv, p.W, g.by_w, p.H, g.by_h);
    int64_t oh0, oh1, ow0, ow1;
    if constexpr (Adaptive) {
      adaptive_windows_over(q.r, p.H, p.OH, oh0, oh1);
      adaptive_windows_over(q.c, p.W, p.OW, ow0, ow1);
    } else {
      windows_over(q.r, p.pH, p.kH, 1, p.sH, p.OH, oh0, oh1);
      windows_over(q.c, p.pW, p.kW, 1, p.sW, p.OW, ow0, ow1);
    }
    const int64_t ob = q.b * p.OH * p.OW * g.inner + q.cv * V;
    A acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = A(0);
    for (int64_t oh = oh0; oh <= oh1; ++oh)
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        const Window<A> w = mean_window<Adaptive, A>(p, oh, ow);
        if (q.r < w.hs || q.r >= w.he || q.c < w.ws || q.c >= w.we) continue;
        const Pack<T, V> gv = load_pack<T, V>(gy + ob + (oh * p.OW + ow) * g.inner);
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += convert<A>(gv.v[k]) / w.div;
      }
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = convert<T>(acc[k]);
    store_pack<T, V>(gx + (q.b * p.H * p.W + q.r * p.W + q.c) * g.inner + q.cv * V, out);
  }
}

// ---------------------------------------------------------------------------------------------
// Launch helpers

// Channels per NHWC thread: a 16-byte vector where C and every pointer allow it, else 8 bytes
// (16-bit types), else 1. NCHW threads take one element.
template <class T>
int pool_width(const PoolParams& p, std::initializer_list<const Tensor*> ts) {
  if (!p.channels_last) return 1;
  constexpr int full = 16 / static_cast<int>(sizeof(T));
  auto fits = [&](int v) {
    if (p.C % v != 0) return false;
    for (const Tensor* t : ts)
      if (reinterpret_cast<uintptr_t>(t->raw_data()) % (v * sizeof(T)) != 0) return false;
    return true;
  };
  if (fits(full)) return full;
  if (full >= 8 && fits(full / 2)) return full / 2;
  return 1;
}

template <bool Adaptive>
void mean_forward(const char* name, const PoolParams& p, const Tensor& x, const Tensor& y) {
  const int64_t planes = planes_of(p);
  if (planes == 0 || p.C == 0 || p.OH * p.OW == 0) return;
  cudaStream_t stream = stream_for(x);
  FT_CUDA_DISPATCH_FLOATING(x.dtype(), name, [&] {
    using T = scalar_t;
    if (Adaptive && !p.channels_last && p.OH == 1 && p.OW == 1) {
      global_avg_planes_kernel<T>
          <<<flat_grid(planes * 32), kThreads, 0, stream>>>(cptr<T>(x), planes, p.H * p.W, mptr<T>(y));
      check_launch(name);
      return;
    }
    with_width<T>(pool_width<T>(p, {&x, &y}), [&](auto vc) {
      constexpr int V = decltype(vc)::value;
      const Geom g = make_geom(p, V);
      const int64_t total = planes * p.OH * p.OW * g.CV;
      mean_pool_forward_kernel<T, V, Adaptive>
          <<<flat_grid(total), kThreads, 0, stream>>>(g, cptr<T>(x), mptr<T>(y), total);
      check_launch(name);
    });
  });
}

template <bool Adaptive>
void mean_backward(const char* name, const PoolParams& p, const Tensor& gy, const Tensor& gx) {
  const int64_t planes = planes_of(p);
  if (planes == 0 || p.C == 0 || p.H * p.W == 0) return;
  cudaStream_t stream = stream_for(gx);
  FT_CUDA_DISPATCH_FLOATING(gy.dtype(), name, [&] {
    using T = scalar_t;
    with_width<T>(pool_width<T>(p, {&gy, &gx}), [&](auto vc) {
      constexpr int V = decltype(vc)::value;
      const Geom g = make_geom(p, V);
      const int64_t total = planes * p.H * p.W * g.CV;
      mean_pool_backward_kernel<T, V, Adaptive>
          <<<flat_grid(total), kThreads, 0, stream>>>(g, cptr<T>(gy), mptr<T>(gx), total);
      check_launch(name);
    });
  });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// entries

void max_pool2d_forward(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& indices) {
  const int64_t planes = planes_of(p);
  if (planes == 0 || p.C == 0 || p.OH * p.OW == 0) return;
  cudaStream_t stream = stream_for(x);
  FT_CUDA_DISPATCH_FLOATING(x.dtype(), "max_pool2d", [&] {
    using T = scalar_t;
    with_width<T>(pool_width<T>(p, {&x, &y}), [&](auto vc) {
      constexpr int V = decltype(vc)::value;
      const Geom g = make_geom(p, V);
      const int64_t total = planes * p.OH * p.OW * g.CV;
      max_pool_forward_kernel<T, V>
          <<<flat_grid(total), kThreads, 0, stream>>>(g, cptr<T>(x), mptr<T>(y), mptr<int64_t>(indices), total);
      check_launch("max_pool2d_forward");
    });
  });
}

void max_pool2d_backward(const PoolParams& p, const Tensor& gy, const Tensor& indices, const Tensor& gx) {
  const int64_t planes = planes_of(p);
  if (planes == 0 || p.C == 0 || p.H * p.W == 0) return;
  cudaStream_t stream = stream_for(gx);
  FT_CUDA_DISPATCH_FLOATING(gy.dtype(), "max_pool2d_backward", [&] {
    using T = scalar_t;
    with_width<T>(pool_width<T>(p, {&gy, &gx}), [&](auto vc) {
      constexpr int V = decltype(vc)::value;
      const Geom g = make_geom(p, V);
      const int64_t total = planes * p.H * p.W * g.CV;
      max_pool_backward_kernel<T, V>
          <<<flat_grid(total), kThreads, 0, stream>>>(g, cptr<T>(gy), cptr<int64_t>(indices), mptr<T>(gx), total);
      check_launch("max_pool2d_backward");
    });
  });
}

void avg_pool2d_forward(const PoolParams& p, const Tensor& x, const Tensor& y) {
  mean_forward<false>("avg_pool2d", p, x, y);
}

void avg_pool2d_backward(const PoolParams& p, const Tensor& gy, const Tensor& gx) {
  mean_backward<false>("avg_pool2d_backward", p, gy, gx);
}

void adaptive_avg_pool2d_forward(const PoolParams& p, const Tensor& x, const Tensor& y) {
  mean_forward<true>("adaptive_avg_pool2d", p, x, y);
}

void adaptive_avg_pool2d_backward(const PoolParams& p, const Tensor& gy, const Tensor& gx) {
  mean_backward<true>("adaptive_avg_pool2d_backward", p, gy, gx);
}

}  // namespace ft::cuda
