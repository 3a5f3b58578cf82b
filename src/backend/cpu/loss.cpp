#include "backend/cpu/loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/column_softmax_stats.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/fast_exp.h"
#include "backend/cpu/half_tiles.h"
#include "fasttrain/parallel.h"

namespace ft::cpu {

namespace {

// Positions per block in the S > 1 path (see loss.h).
constexpr int64_t kPosBlock = 64;

int64_t grain_for(int64_t work_per_item) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(work_per_item, 1)); }

template <class T>
void forward_rows(const T* x, const int64_t* target, int64_t N, int64_t C, int64_t ignore, double eps_d,
                  compute_t<T>* loss, compute_t<T>* lse) {
  using A = compute_t<T>;
  const A eps = static_cast<A>(eps_d);
  parallel_for(0, N, grain_for(C), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T* xr = x + n * C;
      const A m = max_value(xr, C);
      A s = 0, sx = 0;
#pragma omp simd reduction(+ : s, sx)
      for (int64_t c = 0; c < C; ++c) {
        const A v = load(xr[c]);
        s += fast_exp(v - m);
        sx += v;
      }
      const A l = m + std::log(s);
      lse[n] = l;
      const int64_t t = target[n];
      if (t == ignore) {
        loss[n] = 0;
        continue;
      }
      A li = (A(1) - eps) * (l - load(xr[t]));
      if (eps != A(0)) li += eps * (l - sx / static_cast<A>(C));
      loss[n] = li;
    }
  });
}

template <class T>
void forward_cols(const T* x, const int64_t* target, int64_t N, int64_t C, int64_t S, int64_t ignore, double eps_d,
                  compute_t<T>* loss, compute_t<T>* lse) {
  using A = compute_t<T>;
  const A eps = static_cast<A>(eps_d);
  const int64_t nblk = (S + kPosBlock - 1) / kPosBlock;
  parallel_for(0, N * nblk, grain_for(C * kPosBlock), [&](int64_t b0, int64_t b1) {
    A m[kPosBlock], s[kPosBlock], sx[kPosBlock];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n = b / nblk, p0 = (b % nblk) * kPosBlock, w = std::min(kPosBlock, S - p0);
      const T* xb = x + n * C * S + p0;
      column_softmax_stats<true>(xb, C, S, w, m, s, sx);
      for (int64_t j = 0; j < w; ++j) {
        const int64_t i = n * S + p0 + j;
        const A l = m[j] + std::log(s[j]);
        lse[i] = l;
        const int64_t t = target[i];
        if (t == ignore) {
          loss[i] = 0;
          continue;
        }
        A li = (A(1) - eps) * (l - load(xb[t * S + j]));
        if (eps != A(0)) li += eps * (l - sx[j] / static_cast<A>(C));
        loss[i] = li;
      }
    }
  });
}

template <class T>
void backward_rows(const T* x, const int64_t* target, const compute_t<T>* lse, int64_t N, int64_t C, int64_t ignore,
                   double eps_d, const compute_t<T>* grad, bool per_position, double scale, T* gx) {
  using A = compute_t<T>;
  const A eps = static_cast<A>(eps_d), smooth = static_cast<A>(eps_d / static_cast<double>(C));
  parallel_for(0, N, grain_for(C), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T* xr = x + n * C;
      T* out = gx + n * C;
      const int64_t t = target[n];
      if (t == ignore) {
        std::fill(out, out + C, T(0));
        continue;
      }
      const A sc = static_cast<A>((per_position ? grad[n] : grad[0]) * static_cast<A>(scale));
      const A l = lse[n];
      store_run(out, C, [&](int64_t c) { return sc * (fast_exp(load(xr[c]) - l) - smooth); });
      out[t] = store<T>(sc * (fast_exp(load(xr[t]) - l) - smooth - (A(1) - eps)));
    }
  });
}

template <class T>
void backward_cols(const T* x, const int64_t* target, const compute_t<T>* lse, int64_t N, int64_t C, int64_t S,
                   int64_t ignore, double eps_d, const compute_t<T>* grad, bool per_position, double scale, T* gx) {
  using A = compute_t<T>;
  const A eps = static_cast<A>(eps_d), smooth = static_cast<A>(eps_d / static_cast<double>(C));
  const int64_t nblk = (S + kPosBlock - 1) / kPosBlock;
  parallel_for(0, N * nblk, grain_for(C * kPosBlock), [&](int64_t b0, int64_t b1) {
    A sc[kPosBlock], l[kPosBlock];
    int64_t t[kPosBlock];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n = b / nblk, p0 = (b % nblk) * kPosBlock, w = std::min(kPosBlock, S - p0);
      const T* xb = x + n * C * S + p0;
      T* gb = gx + n * C * S + p0;
      for (int64_t j = 0; j < w; ++j) {
        const int64_t i = n * S + p0 + j;
        t[j] = target[i];
        const bool ignored = t[j] == ignore;
        sc[j] = ignored ? A(0) : static_cast<A>((per_position ? grad[i] : grad[0]) * static_cast<A>(scale));
        l[j] = ignored ? A(0) : lse[i];
        if (ignored) t[j] = -1;  // matches no class
      }
      for (int64_t c = 0; c < C; ++c) {
        const T* xr = xb + c * S;
        T* out = gb + c * S;
#pragma omp simd
        for (int64_t j = 0; j < w; ++j) {
          const A hit = t[j] == c ? A(1) - eps : A(0);
          // sc == 0 for ignored positions; the select keeps 0 * inf from making a NaN there.
          const A v = sc[j] * (fast_exp(load(xr[j]) - l[j]) - smooth - hit);
          out[j] = store<T>(sc[j] == A(0) ? A(0) : v);
        }
      }
    }
  });
}

}  // namespace

void cross_entropy_forward(const Tensor& logits, int64_t N, int64_t C, int64_t S, const Tensor& target,
                           int64_t ignore_index, double eps, const Tensor& loss, const Tensor& lse) {
  if (N * S == 0) return;
  FT_DISPATCH_FLOATING(logits.dtype(), "cross_entropy", [&] {
    using A = compute_t<scalar_t>;
    if (S == 1)
      forward_rows<scalar_t>(logits.data<scalar_t>(), target.data<int64_t>(), N, C, ignore_index, eps, loss.data<A>(),
                             lse.data<A>());
    else
      forward_cols<scalar_t>(logits.data<scalar_t>(), target.data<int64_t>(), N, C, S, ignore_index, eps,
                             loss.data<A>(), lse.data<A>());
  });
}

void cross_entropy_backward(const Tensor& logits, int64_t N, int64_t C, int64_t S, const Tensor& target,
                            const Tensor& lse, int64_t ignore_index, double eps, const Tensor& grad, double scale,
                            const Tensor& gx) {
  if (gx.numel() == 0) return;
  const bool per_position = grad.numel() == N * S && N * S != 1;
  FT_DISPATCH_FLOATING(logits.dtype(), "cross_entropy_backward", [&] {
    using A = compute_t<scalar_t>;
    if (S == 1)
      backward_rows<scalar_t>(logits.data<scalar_t>(), target.data<int64_t>(), lse.data<A>(), N, C, ignore_index, eps,
                              grad.data<A>(), per_position, scale, gx.data<scalar_t>());
    else
      backward_cols<scalar_t>(logits.data<scalar_t>(), target.data<int64_t>(), lse.data<A>(), N, C, S, ignore_index,
                              eps, grad.data<A>(), per_position, scale, gx.data<scalar_t>());
  });
}

}  // namespace ft::cpu
