#include "backend/cpu/softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/column_softmax_stats.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/fast_exp.h"
#include "backend/cpu/half_tiles.h"
#include "backend/cpu/reduce.h"
#include "fasttrain/parallel.h"

namespace ft::cpu {

namespace {

// Columns per block in the inner > 1 path: the block's statistics stay in registers/L1 while
// the R rows of the block stream through.
constexpr int64_t kColBlock = 64;

int64_t row_grain(int64_t work_per_item) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(work_per_item, 1)); }

template <class T>
void forward_row(const T* xr, T* yr, int64_t R, bool log, compute_t<T>* buf) {
  using C = compute_t<T>;
  const C m = max_value(xr, R);
  C s = 0;
  if (log) {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < R; ++i) s += fast_exp(load(xr[i]) - m);
    const C logs = std::log(s);
    store_run(yr, R, [&](int64_t i) { return load(xr[i]) - m - logs; });
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < R; ++i) {
      const C v = fast_exp(load(xr[i]) - m);
      buf[i] = v;
      s += v;
    }
    const C inv = C(1) / s;
    store_run(yr, R, [&](int64_t i) { return buf[i] * inv; });
  }
}

template <class T>
void forward_rows(const T* x, T* y, int64_t rows, int64_t R, bool log) {
  using C = compute_t<T>;
  constexpr bool kWide = std::is_same_v<T, C>;
  parallel_for(0, rows, row_grain(R), [&](int64_t r0, int64_t r1) {
    std::vector<C> tmp(kWide ? 0 : R);  // 16-bit types: exps kept in f32 until normalised
    for (int64_t row = r0; row < r1; ++row) {
      C* buf;
      if constexpr (kWide)
        buf = y + row * R;  // f32/f64 normalise in place
      else
        buf = tmp.data();
      forward_row<T>(x + row * R, y + row * R, R, log, buf);
    }
  });
}

template <class T>
void forward_cols(const T* x, T* y, int64_t outer, int64_t R, int64_t inner, bool log) {
  using C = compute_t<T>;
  const int64_t nblk = (inner + kColBlock - 1) / kColBlock;
  parallel_for(0, outer * nblk, row_grain(R * kColBlock), [&](int64_t b0, int64_t b1) {
    C m[kColBlock], s[kColBlock];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t o = b / nblk, c0 = (b % nblk) * kColBlock, w = std::min(kColBlock, inner - c0);
      const T* xb = x + o * R * inner + c0;
      T* yb = y + o * R * inner + c0;
      column_softmax_stats<false>(xb, R, inner, w, m, s, static_cast<C*>(nullptr));
      if (log) {
        for (int64_t j = 0; j < w; ++j) s[j] = m[j] + std::log(s[j]);
        for (int64_t r = 0; r < R; ++r) {
          const T* xr = xb + r * inner;
          T* yr = yb + r * inner;
          store_run(yr, w, [&](int64_t j) { return load(xr[j]) - s[j]; });
        }
      } else {
        for (int64_t j = 0; j < w; ++j) s[j] = C(1) / s[j];
        for (int64_t r = 0; r < R; ++r) {
          const T* xr = xb + r * inner;
          T* yr = yb + r * inner;
          store_run(yr, w, [&](int64_t j) { return fast_exp(load(xr[j]) - m[j]) * s[j]; });
        }
      }
    }
  });
}

template <class T>
void backward_rows(const T* g, const T* y, T* gx, int64_t rows, int64_t R, bool log) {
  using C = compute_t<T>;
  parallel_for(0, rows, row_grain(R), [&](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      const T* gr = g + row * R;
      const T* yr = y + row * R;
      T* out = gx + row * R;
      C s = 0;
      if (log) {
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < R; ++i) s += load(gr[i]);
        store_run(out, R, [&](int64_t i) { return load(gr[i]) - fast_exp(load(yr[i])) * s; });
      } else {
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < R; ++i) s += load(gr[i]) * load(yr[i]);
        store_run(out, R, [&](int64_t i) { return load(yr[i]) * (load(gr[i]) - s); });
      }
    }
  });
}

template <class T>
void backward_cols(const T* g, const T* y, T* gx, int64_t outer, int64_t R, int64_t inner, bool log) {
  using C = compute_t<T>;
  const int64_t nblk = (inner + kColBlock - 1) / kColBlock;
  parallel_for(0, outer * nblk, row_grain(R * kColBlock), [&](int64_t b0, int64_t b1) {
    C s[kColBlock];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t o = b / nblk, c0 = (b % nblk) * kColBlock, w = std::min(kColBlock, inner - c0);
      const int64_t base = o * R * inner + c0;
      for (int64_t j = 0; j < w; ++j) s[j] = 0;
      for (int64_t r = 0; r < R; ++r) {
        const T* gr = g + base + r * inner;
        const T* yr = y + base + r * inner;
        if (log) {
#pragma omp simd
          for (int64_t j = 0; j < w; ++j) s[j] += load(gr[j]);
        } else {
#pragma omp simd
          for (int64_t j = 0; j < w; ++j) s[j] += load(gr[j]) * load(yr[j]);
        }
      }
      for (int64_t r = 0; r < R; ++r) {
        const T* gr = g + base + r * inner;
        const T* yr = y + base + r * inner;
        T* out = gx + base + r * inner;
        if (log) {
          store_run(out, w, [&](int64_t j) { return load(gr[j]) - fast_exp(load(yr[j])) * s[j]; });
        } else {
          store_run(out, w, [&](int64_t j) { return load(yr[j]) * (load(gr[j]) - s[j]); });
        }
      }
    }
  });
}

}  // namespace

void softmax_forward(const Tensor& x, int dim, bool log, const Tensor& out) {
  if (x.numel() == 0) return;
  const Rows3 L = rows3(x.shape(), dim);
  FT_DISPATCH_FLOATING(x.dtype(), log ? "log_softmax" : "softmax", [&] {
    if (L.inner == 1)
      forward_rows<scalar_t>(x.data<scalar_t>(), out.data<scalar_t>(), L.outer, L.R, log);
    else
      forward_cols<scalar_t>(x.data<scalar_t>(), out.data<scalar_t>(), L.outer, L.R, L.inner, log);
  });
}

void softmax_backward(const Tensor& g, const Tensor& y, int dim, bool log, const Tensor& gx) {
  if (y.numel() == 0) return;
  const Rows3 L = rows3(y.shape(), dim);
  FT_DISPATCH_FLOATING(y.dtype(), log ? "log_softmax_backward" : "softmax_backward", [&] {
    if (L.inner == 1)
      backward_rows<scalar_t>(g.data<scalar_t>(), y.data<scalar_t>(), gx.data<scalar_t>(), L.outer, L.R, log);
    else
      backward_cols<scalar_t>(g.data<scalar_t>(), y.data<scalar_t>(), gx.data<scalar_t>(), L.outer, L.R, L.inner, log);
  });
}

}  // namespace ft::cpu
