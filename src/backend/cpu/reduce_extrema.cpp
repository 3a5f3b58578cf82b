#include "backend/cpu/reduce_extrema.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/reduce.h"
#include "fasttrain/parallel.h"

namespace ft::cpu {

namespace {

constexpr int64_t kColBlock = 64;

template <class C>
constexpr C lowest() {
  if constexpr (std::is_floating_point_v<C>)
    return -std::numeric_limits<C>::infinity();
  else
    return std::numeric_limits<C>::lowest();
}

template <class C>
bool is_nan(C v) {
  if constexpr (std::is_floating_point_v<C>)
    return v != v;
  else
    return false;
}

// (max, first index of it) of p[0..n), n > 0.
template <class T>
std::pair<compute_t<T>, int64_t> row_max(const T* p, int64_t n) {
  using C = compute_t<T>;
  C m = lowest<C>();
  int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
  for (int64_t i = 0; i < n; ++i) {
    const C v = static_cast<C>(p[i]);
    m = v > m ? v : m;
    nan |= is_nan(v) ? 1 : 0;
  }
  if (nan) {
    for (int64_t i = 0; i < n; ++i)
      if (is_nan(static_cast<C>(p[i]))) return {static_cast<C>(p[i]), i};
  }
  for (int64_t i = 0; i < n; ++i)
    if (static_cast<C>(p[i]) == m) return {m, i};
  return {m, 0};
}

template <class T>
void max_rows(const T* x, int64_t K, int64_t R, T* values, int64_t* indices) {
  parallel_for(0, K, std::max<int64_t>(1, 32768 / std::max<int64_t>(R, 1)), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      auto [m, i] = row_max(x + k * R, R);
      if (values) values[k] = static_cast<T>(m);
      indices[k] = i;
    }
  });
}

// x viewed [outer, R, inner], inner > 1: a running (value, index) per column of a block.
template <class T>
void max_cols(const T* x, int64_t outer, int64_t R, int64_t inner, T* values, int64_t* indices) {
  using C = compute_t<T>;
  const int64_t nblk = (inner + kColBlock - 1) / kColBlock;
  parallel_for(0, outer * nblk, std::max<int64_t>(1, 32768 / std::max<int64_t>(R * kColBlock, 1)),
               [&](int64_t b0, int64_t b1) {
                 C best[kColBlock];
                 int64_t idx[kColBlock];
                 for (int64_t b = b0; b < b1; ++b) {
                   const int64_t o = b / nblk, c0 = (b % nblk) * kColBlock, w = std::min(kColBlock, inner - c0);
                   const T* xb = x + o * R * inner + c0;
                   for (int64_t j = 0; j < w; ++j) {
                     best[j] = static_cast<C>(xb[j]);
                     idx[j] = 0;
                   }
                   for (int64_t r = 1; r < R; ++r) {
                     const T* xr = xb + r * inner;
                     for (int64_t j = 0; j < w; ++j) {
                       const C v = static_cast<C>(xr[j]);
                       const bool take = v > best[j] || (is_nan(v) && !is_nan(best[j]));
                       best[j] = take ? v : best[j];
                       idx[j] = take ? r : idx[j];
                     }
                   }
                   const int64_t out0 = o * inner + c0;
                   for (int64_t j = 0; j < w; ++j) {
                     if (values) values[out0 + j] = static_cast<T>(best[j]);
                     indices[out0 + j] = idx[j];
                   }
                 }
               });
}

// Sum of f(i) for i in [0, n): blocks of 256 in the compute type (vectorised), combined in f64.
template <class C, class F>
double blocked_sum(int64_t n, F&& f) {
  double total = 0;
  for (int64_t r0 = 0; r0 < n; r0 += 256) {
    const int64_t r1 = std::min(n, r0 + 256);
    C part = 0;
#pragma omp simd reduction(+ : part)
    for (int64_t r = r0; r < r1; ++r) part += f(r);
    total += static_cast<double>(part);
  }
  return total;
}

template <class T>
void var_rows(const T* x, int64_t K, int64_t R, double divisor, T* out) {
  using C = compute_t<T>;
  parallel_for(0, K, std::max<int64_t>(1, 16384 / std::max<int64_t>(R, 1)), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const T* row = x + k * R;
      const C mu = static_cast<C>(blocked_sum<C>(R, [&](int64_t i) { return static_cast<C>(row[i]); }) / R);
      const double ss = blocked_sum<C>(R, [&](int64_t i) {
        const C d = static_cast<C>(row[i]) - mu;
        return d * d;
      });
      out[k] = static_cast<T>(ss / divisor);
    }
  });
}

// x dense [R, K] reducing the leading R (statistics over the batch): column accumulators, so
// every pass reads whole dense rows.
template <class T>
void var_cols(const T* x, int64_t R, int64_t K, double divisor, T* out) {
  using C = compute_t<T>;
  parallel_for(0, K, 256, [&](int64_t k0, int64_t k1) {
    const int64_t w = k1 - k0;
    std::vector<double> acc(w, 0.0);
    std::vector<C> mu(w);
    for (int64_t r = 0; r < R; ++r) {
      const T* row = x + r * K + k0;
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) acc[j] += static_cast<double>(static_cast<C>(row[j]));
    }
    for (int64_t j = 0; j < w; ++j) {
      mu[j] = static_cast<C>(acc[j] / R);
      acc[j] = 0;
    }
    for (int64_t r = 0; r < R; ++r) {
      const T* row = x + r * K + k0;
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) {
        const C d = static_cast<C>(row[j]) - mu[j];
        acc[j] += static_cast<double>(d * d);
      }
    }
    for (int64_t j = 0; j < w; ++j) out[k0 + j] = static_cast<T>(acc[j] / divisor);
  });
}

}  // namespace

void max_dim(const Tensor& x, int dim, const Tensor& values, const Tensor& indices) {
  if (indices.numel() == 0) return;
  const Rows3 L = rows3(x.shape(), dim);
  FT_DISPATCH_ALL(x.dtype(), "max", [&] {
    scalar_t* v = values.defined() ? values.data<scalar_t>() : nullptr;
    if (L.inner == 1)
      max_rows<scalar_t>(x.data<scalar_t>(), L.outer, L.R, v, indices.data<int64_t>());
    else
      max_cols<scalar_t>(x.data<scalar_t>(), L.outer, L.R, L.inner, v, indices.data<int64_t>());
  });
}

void max_all(const Tensor& x, const Tensor& value, const Tensor& index) {
  FT_DISPATCH_ALL(x.dtype(), "max", [&] {
    using C = compute_t<scalar_t>;
    const scalar_t* p = x.data<scalar_t>();
    const int64_t n = x.numel();
    // Chunks reduce in parallel; combining in chunk order keeps the first index among ties.
    const int64_t chunk = std::max<int64_t>(65536, (n + 63) / 64);
    const int64_t nchunks = (n + chunk - 1) / chunk;
    std::vector<std::pair<C, int64_t>> part(nchunks);
    parallel_for(0, nchunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t b = c * chunk, e = std::min(n, b + chunk);
        auto r = row_max(p + b, e - b);
        part[c] = {r.first, r.second + b};
      }
    });
    auto best = part[0];
    for (int64_t c = 1; c < nchunks; ++c) {
      const C v = part[c].first;
      if (is_nan(best.first)) break;
      if (v > best.first || is_nan(v)) best = part[c];
    }
    if (value.defined()) *value.data<scalar_t>() = static_cast<scalar_t>(best.first);
    if (index.defined()) *index.data<int64_t>() = best.second;
  });
}

void max_dim_backward(const Tensor& g, const Tensor& indices, int dim, const Tensor& gx) {
  const Rows3 L = rows3(gx.shape(), dim);
  FT_DISPATCH_FLOATING(gx.dtype(), "max_backward", [&] {
    const scalar_t* gp = g.data<scalar_t>();
    const int64_t* ip = indices.data<int64_t>();
    scalar_t* out = gx.data<scalar_t>();
    std::fill(out, out + gx.numel(), scalar_t(0));
    parallel_for(0, L.outer, std::max<int64_t>(1, 32768 / std::max<int64_t>(L.R * L.inner, 1)),
                 [&](int64_t o0, int64_t o1) {
                   for (int64_t o = o0; o < o1; ++o)
                     for (int64_t i = 0; i < L.inner; ++i)
                       out[(o * L.R + ip[o * L.inner + i]) * L.inner + i] = gp[o * L.inner + i];
                 });
  });
}

void var(const Tensor& x, const std::vector<bool>& mask, double divisor, const Tensor& out) {
  if (out.numel() == 0) return;
  int last_reduced = -1, first_kept = x.dim();
  for (int i = 0; i < x.dim(); ++i) {
    if (mask[i])
      last_reduced = i;
    else
      first_kept = std::min(first_kept, i);
  }
  const bool leading = x.is_contiguous() && last_reduced >= 0 && last_reduced < first_kept && first_kept < x.dim();
  FT_DISPATCH_FLOATING(x.dtype(), "var", [&] {
    const int64_t K = out.numel();
    if (leading) {
      var_cols<scalar_t>(x.data<scalar_t>(), x.numel() / K, K, divisor, out.data<scalar_t>());
    } else {
      ReductionRows rows = reduction_rows(x, mask);
      var_rows<scalar_t>(rows.values.data<scalar_t>(), rows.K, rows.R, divisor, out.data<scalar_t>());
    }
  });
}

}  // namespace ft::cpu
