// CUDA kernels of the fused cross-entropy (log-softmax + negative log-likelihood, with label
// smoothing and ignore_index; kernel-table entries cross_entropy_forward, cross_entropy_backward).
// Semantics are the CPU backend's (backend/cpu/loss.cpp); statistics are in f32 (f64 for f64
// tensors). The running max/sum and block reductions are rows.cuh's.
//
// Logits are [N, C, S]: the C logits of one of the N*S positions are one row. Math and memory
// traffic per row:
// - forward: the running max/sum of softmax, plus sum(x) for label smoothing:
//   lse = m + log(s); loss = (1 - eps) * (lse - x_t) + eps * (lse - mean(x)), 0 where t is
//   ignore_index. Reads the logits once; writes two scalars per position (loss and lse).
// - backward: gx = scale_i * (exp(x - lse) - eps / C - (1 - eps) [c == t]) from the logits and
//   the saved lse: no probability matrix is ever stored. Reads logits once, writes gx once.
// With S == 1 a position's logits are contiguous and get one block; with S > 1 one thread per
// position, so that neighbouring threads read neighbouring addresses.
#include <cmath>
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/rows.cuh"
#include "backend/cuda/vectors.cuh"

namespace ft::cuda {

namespace {

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
