// Reductions on the GPU: sum / mean / var over any set of dims, max / argmax along one dim or over
// everything, and max's backward (the gradient routed to the selected element).
//
// One engine serves them all. A reduction is a K x R index space: k runs over the kept dims (the
// output, contiguous, in row-major order), r over the reduced dims (row-major), and element (k, r)
// lives at koff(k) + roff(r) in x (any strides; size-1 dims dropped and mergeable neighbours
// merged, so most layouts come down to one kept and one reduced dim). Each output reads its R
// inputs once and writes once: sum is one pass over x, var two (mean, then squared deviations),
// max one. Two kernel shapes keep the loads coalesced:
//   rows:    the reduced dims are innermost in memory: a warp (R < kBlockRowMin) or a block per
//            output strides along r and combines with warp shuffles;
//   columns: the kept dims are innermost (sum over the batch): 32 adjacent outputs per block on
//            the x axis, 8 lanes along r on the y axis, combined through shared memory.
// When there are too few outputs to fill the device, r is split into S chunks whose partial
// results go to a [K, S] scratch buffer, combined by a warp per output in a second kernel.
//
// Determinism: the split, the lanes each element goes to and the combining trees depend on the
// shape only (never on the device or on timing), and there are no atomics, so a sum is bitwise
// reproducible. Max breaks ties by a total order (NaN above everything, then value, then the lower
// index), which makes its combine order-free: the first NaN if any, else the first maximal index,
// as the CPU backend picks.
//
// Accumulation: f64 for f32/f64 inputs (the CPU combines its blocks in f64; the loads, not the
// adds, bound these kernels), f32 for bf16/f16, i64 for the integer dtypes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace ft::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kColX = 32;  // outputs per column block: one 32-element (>= 64-byte) segment per row
constexpr int kColY = 8;   // lanes along r per column block
// Rows of at least this many elements get a whole block; shorter ones a warp.
constexpr int64_t kBlockRowMin = 1024;
// The split aims at this many blocks. A constant, not the device's SM count: the split fixes the
// summation order, which must not change with the GPU.
constexpr int64_t kTargetBlocks = 1024;
constexpr int64_t kRowChunkMin = 8192;  // least elements a split row block reduces
constexpr int64_t kColChunkMin = 256;   // least rows a split column block reduces

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

// --- the index space -----------------------------------------------------------------------------

__device__ __forceinline__ int64_t unravel(int64_t i, int n, const int64_t* size, const int64_t* stride) {
  if (n == 1) return i * stride[0];  // the usual case after merging: no division
  int64_t off = 0;
  for (int d = n - 1; d >= 0; --d) {
    const int64_t q = i / size[d];
    off += (i - q * size[d]) * stride[d];
    i = q;
  }
  return off;
}

struct ReduceShape {
  int nk = 0, nr = 0;
  int64_t K = 1, R = 1;
  int64_t ksize[kMaxDims] = {}, kstride[kMaxDims] = {};  // strides in elements
  int64_t rsize[kMaxDims] = {}, rstride[kMaxDims] = {};
  __device__ __forceinline__ int64_t koff(int64_t k) const { return unravel(k, nk, ksize, kstride); }
  __device__ __forceinline__ int64_t roff(int64_t r) const { return unravel(r, nr, rsize, rstride); }
};

// Appends a dim (outer to inner). A size-1 dim changes no index; a dim whose outer neighbour
// steps exactly over it merges into it, which keeps the row-major linear index the same.
void append_dim(int& n, int64_t* size, int64_t* stride, int64_t sz, int64_t st) {
  if (sz == 1) return;
  if (n > 0 && stride[n - 1] == st * sz) {
    size[n - 1] *= sz;
    stride[n - 1] = st;
    return;
  }
  size[n] = sz;
  stride[n] = st;
  ++n;
}

ReduceShape make_shape(const Tensor& x, const std::vector<bool>& mask) {
  ReduceShape s;
  for (int i = 0; i < x.dim(); ++i) {
    const int64_t sz = x.size(i), st = x.stride(i);
    if (mask[i]) {
      s.R *= sz;
      append_dim(s.nr, s.rsize, s.rstride, sz, st);
    } else {
      s.K *= sz;
      append_dim(s.nk, s.ksize, s.kstride, sz, st);
    }
  }
  return s;
}

// --- reduction policies --------------------------------------------------------------------------
// An Op gives: state (the partial result type), identity(), element(offset, r, k) for the input
// at that offset, combine(a, b), and write(k, state) storing output k.

// Sums (and, with kCentred, sums of squared deviations from mean[k]) of x, stored as
// total * scale / divisor.
template <class T, class A, class Out, bool kCentred>
struct SumOp {
  using state = A;
  const T* x;
  Out* out;
  const A* mean;  // kCentred only
  double scale, divisor;
  __device__ __forceinline__ A identity() const { return A(0); }
  __device__ __forceinline__ A element(int64_t off, int64_t, int64_t k) const {
    const A v = convert<A>(x[off]);
    if constexpr (kCentred) {
      const A d = v - mean[k];
      return d * d;
    } else {
      return v;
    }
  }
  __device__ __forceinline__ A combine(A a, A b) const { return a + b; }
  __device__ __forceinline__ void write(int64_t k, A v) const {
    if constexpr (std::is_integral_v<A>) {
      // Integer sums stay exact unless a scale was asked for (mean is refused for integers).
      out[k] = scale == 1.0 && divisor == 1.0 ? v : static_cast<A>(static_cast<double>(v) * scale / divisor);
    } else {
      out[k] = convert<Out>(static_cast<double>(v) * scale / divisor);
    }
  }
};

template <class T>
struct SumAcc {
  using type = std::conditional_t<std::is_integral_v<T>, int64_t, std::conditional_t<sizeof(T) == 2, float, double>>;
};

// Max: value in a type every dtype converts to exactly and shuffles (bool and u8 widen to int);
// i < 0 marks an empty state.
template <class T>
using max_c = std::conditional_t<sizeof(T) == 2, float, std::conditional_t<(sizeof(T) == 1), int, T>>;

template <class C>
struct MaxState {
  C v;
  int64_t i;
};

template <class C>
__device__ __forceinline__ bool is_nan(C v) {
  if constexpr (std::is_floating_point_v<C>)
    return v != v;
  else
    return false;
}

template <class T>
struct MaxOp {
  using C = max_c<T>;
  using state = MaxState<C>;
  const T* x;
  T* values;         // null for argmax
  int64_t* indices;  // null for max(x) without an index
  __device__ __forceinline__ state identity() const { return {C(0), -1}; }
  __device__ __forceinline__ state element(int64_t off, int64_t r, int64_t) const { return {convert<C>(x[off]), r}; }
  // A total order (NaN first, then larger value, then lower index): the result is the same
  // whatever order the states are combined in.
  __device__ __forceinline__ state combine(state a, state b) const {
    if (b.i < 0) return a;
    if (a.i < 0) return b;
    const bool an = is_nan(a.v), bn = is_nan(b.v);
    if (an != bn) return an ? a : b;
    if (!an && a.v != b.v) return a.v > b.v ? a : b;
    return a.i <= b.i ? a : b;
  }
  __device__ __forceinline__ void write(int64_t k, state s) const {
    if (values) values[k] = convert<T>(s.v);
    if (indices) indices[k] = s.i;
  }
};

// --- warp combining --------------------------------------------------------------------------------

template <class V>
__device__ __forceinline__ V shfl_down(V v, int delta) {
  return __shfl_down_sync(0xffffffffu, v, delta);
}
template <class C>
__device__ __forceinline__ MaxState<C> shfl_down(MaxState<C> s, int delta) {
  return {shfl_down(s.v, delta), shfl_down(s.i, delta)};
}

// Lane 0 ends with the combination of the warp's 32 states (a fixed tree). Every lane must call.
template <class Op>
__device__ __forceinline__ typename Op::state warp_combine(const Op& op, typename Op::state s) {
  for (int delta = 16; delta > 0; delta >>= 1) s = op.combine(s, shfl_down(s, delta));
  return s;
}

// Folds x[k, r] for r = r0 + lane, r0 + lane + step, ... < r1 into s, four loads in flight.
template <class Op>
__device__ __forceinline__ typename Op::state fold(const Op& op, const ReduceShape& sh, typename Op::state s, int64_t k,
                                                   int64_t base, int64_t r, int64_t r1, int64_t step) {
  for (; r + 3 * step < r1; r += 4 * step) {
    const auto a = op.element(base + sh.roff(r), r, k);
    const auto b = op.element(base + sh.roff(r + step), r + step, k);
    const auto c = op.element(base + sh.roff(r + 2 * step), r + 2 * step, k);
    const auto d = op.element(base + sh.roff(r + 3 * step), r + 3 * step, k);
    s = op.combine(op.combine(op.combine(op.combine(s, a), b), c), d);
  }
  for (; r < r1; r += step) s = op.combine(s, op.element(base + sh.roff(r), r, k));
  return s;
}

// --- kernels -------------------------------------------------------------------------------------

// Item = (k, part): output k, r in [part * chunk, (part + 1) * chunk). A block per item
// (per_block) or a warp per item; the result goes to out (S == 1) or partial[item].
template <class Op>
__global__ void __launch_bounds__(kThreads)
    reduce_rows_kernel(Op op, ReduceShape sh, int64_t S, int64_t chunk, bool per_block, typename Op::state* partial) {
  using St = typename Op::state;
  __shared__ St warp_part[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t items = sh.K * S;
  const int64_t first = per_block ? blockIdx.x : static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const int64_t step = per_block ? gridDim.x : static_cast<int64_t>(gridDim.x) * kWarps;
  const int lanes = per_block ? kThreads : 32;
  const int me = per_block ? threadIdx.x : lane;
  // The loop bounds are the same for the whole block (per_block) or the whole warp.
  for (int64_t item = first; item < items; item += step) {
    const int64_t k = item / S, part = item - k * S;
    const int64_t r0 = part * chunk, r1 = min(sh.R, r0 + chunk);
    St s = fold(op, sh, op.identity(), k, sh.koff(k), r0 + me, r1, lanes);
    s = warp_combine(op, s);
    if (per_block) {
      if (lane == 0) warp_part[warp] = s;
      __syncthreads();
      if (warp == 0) s = warp_combine(op, lane < kWarps ? warp_part[lane] : op.identity());
      __syncthreads();  // warp_part is rewritten by the next item
    }
    if (me == 0) {
      if (S == 1)
        op.write(k, s);
      else
        partial[item] = s;
    }
  }
}

// Item = (tile, part): outputs tile * 32 + threadIdx.x, r in the part's chunk, split over
// threadIdx.y; the 8 partial states are combined in y order.
template <class Op>
__global__ void __launch_bounds__(kColX* kColY)
    reduce_cols_kernel(Op op, ReduceShape sh, int64_t S, int64_t chunk, typename Op::state* partial) {
  using St = typename Op::state;
  __shared__ St part_state[kColY][kColX];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t tiles = (sh.K + kColX - 1) / kColX;
  for (int64_t item = blockIdx.x; item < tiles * S; item += gridDim.x) {  // uniform across the block
    const int64_t tile = item / S, part = item - tile * S;
    const int64_t k = tile * kColX + tx;
    const int64_t r0 = part * chunk, r1 = min(sh.R, r0 + chunk);
    St s = op.identity();
    if (k < sh.K) s = fold(op, sh, s, k, sh.koff(k), r0 + ty, r1, kColY);
    part_state[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && k < sh.K) {
      for (int y = 1; y < kColY; ++y) s = op.combine(s, part_state[y][tx]);
      if (S == 1)
        op.write(k, s);
      else
        partial[k * S + part] = s;
    }
    __syncthreads();  // part_state is rewritten by the next item
  }
}

// partial is [K, S]: a warp per output combines its S states.
template <class Op>
__global__ void __launch_bounds__(kThreads)
    reduce_finish_kernel(Op op, int64_t K, int64_t S, const typename Op::state* partial) {
  const int lane = threadIdx.x & 31;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); k < K;
       k += static_cast<int64_t>(gridDim.x) * kWarps) {
    auto s = op.identity();
    for (int64_t p = lane; p < S; p += 32) s = op.combine(s, partial[k * S + p]);
    s = warp_combine(op, s);
    if (lane == 0) op.write(k, s);
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Picks the kernel shape and the split from the shape alone, then runs the reduction on `stream`.
template <class Op>
void run_reduce(const Op& op, const ReduceShape& sh, const Tensor& like, cudaStream_t stream, const char* name) {
  using St = typename Op::state;
  if (sh.K == 0) return;
  // Columns only when that makes the loads coalesced: kept dims innermost, reduced ones not.
  const bool kept_inner = sh.nk > 0 && sh.kstride[sh.nk - 1] == 1;
  const bool reduced_inner = sh.nr > 0 && sh.rstride[sh.nr - 1] == 1;
  const bool columns = kept_inner && !reduced_inner;
  const bool per_block = !columns && sh.R >= kBlockRowMin;
  int64_t S = 1;
  if (columns) {
    const int64_t tiles = ceil_div(sh.K, kColX);
    if (tiles < kTargetBlocks) S = std::max<int64_t>(1, std::min(sh.R / kColChunkMin, kTargetBlocks / tiles));
  } else if (per_block && sh.K < kTargetBlocks) {
    S = std::max<int64_t>(1, std::min(sh.R / kRowChunkMin, kTargetBlocks / sh.K));
  }
  const int64_t chunk = std::max<int64_t>(1, ceil_div(sh.R, S));
  S = std::max<int64_t>(1, ceil_div(sh.R, chunk));  // no empty trailing chunk
  Tensor scratch;
  St* partial = nullptr;
  if (S > 1) {
    scratch = empty({static_cast<int64_t>(sh.K * S * sizeof(St))}, TensorOptions(DType::U8, like.device()));
    partial = ptr<St>(scratch);
  }
  if (columns) {
    const int64_t items = ceil_div(sh.K, kColX) * S;
    reduce_cols_kernel<Op><<<grid_for(items, 1), dim3(kColX, kColY), 0, stream>>>(op, sh, S, chunk, partial);
  } else {
    const int64_t items = sh.K * S;
    const unsigned grid = per_block ? grid_for(items, 1) : grid_for(items, kWarps);
    reduce_rows_kernel<Op><<<grid, kThreads, 0, stream>>>(op, sh, S, chunk, per_block, partial);
  }
  check_launch(name);
  if (S > 1) {
    reduce_finish_kernel<Op><<<grid_for(sh.K, kWarps), kThreads, 0, stream>>>(op, sh.K, S, partial);
    check_launch(name);
  }
}

// gx [outer, R, inner] (contiguous) gets g[o, i] at r = indices[o, i] and zeros elsewhere: one
// write per element, so no separate zero fill.
template <class T>
__global__ void max_backward_kernel(const T* g, const int64_t* idx, int64_t R, int64_t inner, int64_t n, T* gx) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e % inner, orow = e / inner;
    const int64_t r = orow % R, o = orow / R;
    const int64_t j = o * inner + i;
    gx[e] = idx[j] == r ? g[j] : convert<T>(0.0f);
  }
}

}  // namespace

void sum(const Tensor& x, const std::vector<bool>& mask, double scale, const Tensor& out) {
  const ReduceShape sh = make_shape(x, mask);
  cudaStream_t stream = stream_for(out);
  FT_CUDA_DISPATCH_ALL(x.dtype(), "sum", [&] {
    using A = typename SumAcc<scalar_t>::type;
    // The op allocates out as x's dtype for floating x, i64 otherwise.
    using Out = std::conditional_t<std::is_integral_v<scalar_t>, int64_t, scalar_t>;
    SumOp<scalar_t, A, Out, false> op{ptr<const scalar_t>(x), ptr<Out>(out), nullptr, scale, 1.0};
    run_reduce(op, sh, out, stream, "sum");
  });
}

void var(const Tensor& x, const std::vector<bool>& mask, double divisor, const Tensor& out) {
  const ReduceShape sh = make_shape(x, mask);
  if (sh.K == 0) return;
  cudaStream_t stream = stream_for(out);
  FT_CUDA_DISPATCH_FLOATING(x.dtype(), "var", [&] {
    using A = typename SumAcc<scalar_t>::type;
    // Two passes: the means (kept in the accumulation type), then the squared deviations.
    Tensor mean = empty({sh.K}, TensorOptions(sizeof(A) == 8 ? DType::F64 : DType::F32, out.device()));
    SumOp<scalar_t, A, A, false> mean_op{ptr<const scalar_t>(x), ptr<A>(mean), nullptr, 1.0, static_cast<double>(sh.R)};
    run_reduce(mean_op, sh, out, stream, "var");
    SumOp<scalar_t, A, scalar_t, true> ss_op{ptr<const scalar_t>(x), ptr<scalar_t>(out), ptr<const A>(mean), 1.0,
                                             divisor};
    run_reduce(ss_op, sh, out, stream, "var");
  });
}

void max_dim(const Tensor& x, int dim, const Tensor& values, const Tensor& indices) {
  if (indices.numel() == 0) return;
  std::vector<bool> mask(x.dim(), false);
  mask[dim] = true;
  const ReduceShape sh = make_shape(x, mask);
  cudaStream_t stream = stream_for(indices);
  FT_CUDA_DISPATCH_ALL(x.dtype(), "max", [&] {
    MaxOp<scalar_t> op{ptr<const scalar_t>(x), values.defined() ? ptr<scalar_t>(values) : nullptr,
                       ptr<int64_t>(indices)};
    run_reduce(op, sh, indices, stream, "max_dim");
  });
}

void max_all(const Tensor& x, const Tensor& value, const Tensor& index) {
  if (x.numel() == 0) return;
  const ReduceShape sh = make_shape(x, std::vector<bool>(x.dim(), true));
  cudaStream_t stream = stream_for(x);
  FT_CUDA_DISPATCH_ALL(x.dtype(), "max", [&] {
    MaxOp<scalar_t> op{ptr<const scalar_t>(x), value.defined() ? ptr<scalar_t>(value) : nullptr,
                       index.defined() ? ptr<int64_t>(index) : nullptr};
    run_reduce(op, sh, x, stream, "max_all");
  });
}

void max_dim_backward(const Tensor& g, const Tensor& indices, int dim, const Tensor& gx) {
  const int64_t n = gx.numel();
  if (n == 0) return;
  int64_t inner = 1;
  for (int i = dim + 1; i < gx.dim(); ++i) inner *= gx.size(i);
  const int64_t R = gx.size(dim);
  cudaStream_t stream = stream_for(gx);
  FT_CUDA_DISPATCH_FLOATING(gx.dtype(), "max_backward", [&] {
    max_backward_kernel<scalar_t><<<grid_for(n), 256, 0, stream>>>(ptr<const scalar_t>(g), ptr<const int64_t>(indices),
                                                                   R, inner, n, ptr<scalar_t>(gx));
    check_launch("max_dim_backward");
  });
}

}  // namespace ft::cuda
