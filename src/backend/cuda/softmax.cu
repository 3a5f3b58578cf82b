// CUDA kernels of softmax and log_softmax over any dim (kernel-table entries softmax_forward,
// softmax_backward). Semantics are the CPU backend's (backend/cpu/softmax.cpp); statistics are in
// f32 (f64 for f64 tensors). The running max/sum and block reductions are rows.cuh's.
//
// The input is viewed as [outer, R, inner] around dim; each of the outer * inner rows of R is one
// softmax. Math and memory traffic per row:
// - forward: one pass keeps a running max m and a running sum s of exp(x - m) (rescaled
//   whenever m grows), merged across threads; a second pass writes exp(x - m) / s or
//   x - m - log(s). Reads the row twice, writes once.
// - backward: gx = y * (g - sum(g * y)), or gx = g - exp(y) * sum(g) for log-softmax.
//   Reads g and y twice, writes gx once.
// A row over the last dim (inner == 1) is contiguous and gets one block; otherwise one thread per
// row, so that neighbouring threads read neighbouring columns.
#include <cmath>
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/rows.cuh"
#include "backend/cuda/vectors.cuh"

namespace ft::cuda {

namespace {

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

}  // namespace

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

}  // namespace ft::cuda
