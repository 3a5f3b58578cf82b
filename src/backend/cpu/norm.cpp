// Layer/RMS/batch-norm kernels; the layout and threading scheme is described in norm.h.
#include "backend/cpu/norm.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/half_tiles.h"
#include "backend/kernel_params.h"
#include "fasttrain/parallel.h"

namespace ft::cpu {

namespace {

// kAcc independent accumulators: the loop vectorises over them, and several vector registers of
// partial sums break the add latency chain (one chain of 8 would run at a quarter of the
// throughput).
constexpr int kAcc = 32;

template <class T, class C>
C dense_sum(const T* x, int64_t n) {
  C p[kAcc] = {};
  int64_t i = 0;
  for (; i + kAcc <= n; i += kAcc)
    for (int j = 0; j < kAcc; ++j) p[j] += static_cast<C>(x[i + j]);
  C s = 0;
  for (; i < n; ++i) s += static_cast<C>(x[i]);
  for (int j = 0; j < kAcc; ++j) s += p[j];
  return s;
}

// sum((x - mu)^2): the second pass of a two-pass variance (exact for any mean offset).
template <class T, class C>
C dense_sq_dev(const T* x, int64_t n, C mu) {
  C p[kAcc] = {};
  int64_t i = 0;
  for (; i + kAcc <= n; i += kAcc)
    for (int j = 0; j < kAcc; ++j) {
      C d = static_cast<C>(x[i + j]) - mu;
      p[j] += d * d;
    }
  C s = 0;
  for (; i < n; ++i) {
    C d = static_cast<C>(x[i]) - mu;
    s += d * d;
  }
  for (int j = 0; j < kAcc; ++j) s += p[j];
  return s;
}

// Number of row blocks with private partial column sums for a [rows, cols] reduction: one for
// small inputs (not worth waking threads), else 16 (or one per thread beyond 16 threads). It
// depends on the thread count only beyond 16 threads, so column sums (weight gradients,
// channels-last statistics) are bitwise the same on 1 and 2 threads.
int64_t row_blocks(int64_t rows, int64_t cols) {
  if (rows * cols < 32768) return 1;
  return std::max<int64_t>(1, std::min<int64_t>(rows, std::max(16, get_num_threads())));
}

// Runs f(block, row_begin, row_end) for each of nb row blocks, in parallel.
template <class F>
void for_row_blocks(int64_t rows, int64_t nb, F&& f) {
  parallel_for(0, nb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) f(b, rows * b / nb, rows * (b + 1) / nb);
  });
}

// out[c] = sum_b partial[b * n + c]: combines per-block partial sums.
template <class A, class Out>
void combine_partials(const std::vector<A>& partial, int64_t nb, int64_t n, Out* out) {
  parallel_for(0, n, 4096, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      A s = 0;
      for (int64_t b = 0; b < nb; ++b) s += partial[b * n + c];
      out[c] = static_cast<Out>(s);
    }
  });
}

// A per-feature vector in the compute dtype, or `fill` everywhere when the tensor is undefined.
template <class C>
std::vector<C> feature_vector(const Tensor& t, int64_t n, C fill) {
  if (!t.defined()) return std::vector<C>(n, fill);
  const C* p = t.data<C>();
  return std::vector<C>(p, p + n);
}

// ---------------------------------------------------------------------------------------------
// layer_norm / rms_norm

template <class T, class R>
void row_norm_forward_impl(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b, double eps,
                           bool rms, const Tensor& sum, const Tensor& y, const Tensor& mean_t, const Tensor& rstd_t) {
  using C = compute_t<T>;
  const int64_t N = x.size(-1), M = N ? x.numel() / N : 0;
  const T* xp = x.data<T>();
  const R* rp = residual.defined() ? residual.data<R>() : nullptr;
  T* sp = residual.defined() ? sum.data<T>() : nullptr;
  T* yp = y.data<T>();
  C* meanp = rms ? nullptr : mean_t.data<C>();
  C* rstdp = rstd_t.data<C>();
  const std::vector<C> wv = feature_vector<C>(w, N, C(1)), bv = feature_vector<C>(b, N, C(0));
  const C* wp = wv.data();
  const C* bp = bv.data();
  const C inv_n = C(1) / static_cast<C>(std::max<int64_t>(N, 1));
  const C ceps = static_cast<C>(eps);
  parallel_for(0, M, std::max<int64_t>(1, 16384 / std::max<int64_t>(N, 1)), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const T* xr = xp + m * N;
      T* yr = yp + m * N;
      if (rp) {  // the fused residual add: the row's sum, rounded as add() rounds it, is what is normalised
        const R* rr = rp + m * N;
        T* sr = sp + m * N;
        store_run(sr, N, [&](int64_t i) { return static_cast<C>(xr[i]) + static_cast<C>(rr[i]); });
        xr = sr;
      }
      const C mu = rms ? C(0) : dense_sum<T, C>(xr, N) * inv_n;
      const C var = dense_sq_dev<T, C>(xr, N, mu) * inv_n;
      const C rs = C(1) / std::sqrt(var + ceps);
      if (!rms) meanp[m] = mu;
      rstdp[m] = rs;
      store_run(yr, N, [&](int64_t i) { return (static_cast<C>(xr[i]) - mu) * rs * wp[i] + bp[i]; });
    }
  });
}

template <class T>
void row_norm_backward_impl(const Tensor& dy, const Tensor& dsum, const Tensor& x, const Tensor& mean_t,
                            const Tensor& rstd_t, const Tensor& w, bool rms, const Tensor& dx, const Tensor& dw,
                            const Tensor& db) {
  using C = compute_t<T>;
  const int64_t N = x.size(-1), M = N ? x.numel() / N : 0;
  const T* xp = x.data<T>();
  const T* dyp = dy.data<T>();
  const T* dsp = dsum.defined() ? dsum.data<T>() : nullptr;
  T* dxp = dx.defined() ? dx.data<T>() : nullptr;
  const C* meanp = rms ? nullptr : mean_t.data<C>();
  const C* rstdp = rstd_t.data<C>();
  const std::vector<C> wv = feature_vector<C>(w, N, C(1));
  const C* wp = wv.data();
  const bool need_dw = dw.defined(), need_db = db.defined();
  const int64_t nb = row_blocks(M, N);
  std::vector<C> pw(need_dw ? nb * N : 0, C(0)), pb(need_db ? nb * N : 0, C(0));
  const C inv_n = C(1) / static_cast<C>(std::max<int64_t>(N, 1));
  for_row_blocks(M, nb, [&](int64_t blk, int64_t m0, int64_t m1) {
    C* pwr = need_dw ? pw.data() + blk * N : nullptr;
    C* pbr = need_db ? pb.data() + blk * N : nullptr;
    for (int64_t m = m0; m < m1; ++m) {
      const T* xr = xp + m * N;
      const T* dyr = dyp + m * N;
      const C mu = rms ? C(0) : meanp[m];
      const C rs = rstdp[m];
      if (pwr)
        for (int64_t i = 0; i < N; ++i) pwr[i] += static_cast<C>(dyr[i]) * ((static_cast<C>(xr[i]) - mu) * rs);
      if (pbr)
        for (int64_t i = 0; i < N; ++i) pbr[i] += static_cast<C>(dyr[i]);
      if (!dxp) continue;
      // s1 = sum(g), s2 = sum(g * xhat) with g = dy * w
      C s1[kAcc] = {}, s2[kAcc] = {};
      int64_t i = 0;
      for (; i + kAcc <= N; i += kAcc)
        for (int j = 0; j < kAcc; ++j) {
          C g = static_cast<C>(dyr[i + j]) * wp[i + j];
          s1[j] += g;
          s2[j] += g * ((static_cast<C>(xr[i + j]) - mu) * rs);
        }
      C a1 = 0, a2 = 0;
      for (; i < N; ++i) {
        C g = static_cast<C>(dyr[i]) * wp[i];
        a1 += g;
        a2 += g * ((static_cast<C>(xr[i]) - mu) * rs);
      }
      for (int j = 0; j < kAcc; ++j) {
        a1 += s1[j];
        a2 += s2[j];
      }
      const C mg = rms ? C(0) : a1 * inv_n, mgx = a2 * inv_n;
      T* dxr = dxp + m * N;
      auto dx_norm = [&](int64_t k) {
        const C xhat = (static_cast<C>(xr[k]) - mu) * rs;
        return rs * (static_cast<C>(dyr[k]) * wp[k] - mg - xhat * mgx);
      };
      if (dsp) {  // the fused residual add's gradient joins before the one rounding
        const T* dsr = dsp + m * N;
        store_run(dxr, N, [&](int64_t k) { return dx_norm(k) + static_cast<C>(dsr[k]); });
      } else {
        store_run(dxr, N, dx_norm);
      }
    }
  });
  if (need_dw) combine_partials(pw, nb, N, dw.data<C>());
  if (need_db) combine_partials(pb, nb, N, db.data<C>());
}

// ---------------------------------------------------------------------------------------------
// batch_norm

// Batch-norm reductions. An element operation elem(c, x, dy, a1, a2) adds channel c's element into
// two accumulators of the compute type; values are accumulated in the compute type over a few
// thousand elements at most and combined in f64. Every walk depends on the shape only, so results
// do not depend on the thread count. Three walks:
//   long NCS runs (S > kSlotPerPosition): runs in memory order, split into blocks of runs with
//        per-block partials per channel, so x streams through memory like an elementwise pass
//        (walking one channel's runs at a stride of C * S was half as fast). A run is folded into
//        kAcc register accumulators, position i into slot i % kAcc.
//   short NCS runs: one channel at a time, chunks of about kChunkElems values (consecutive runs)
//        accumulated into a slot per position, so the loop vectorises whatever S is and nothing
//        is reduced per run (a 7x7 run would be mostly tail).
//   MC rows: row blocks with per-block partials, chunks of kRowsPerChunk rows accumulated into a
//        slot per channel.
constexpr int64_t kChunkElems = 8192;
constexpr int64_t kRowsPerChunk = 64;
constexpr int64_t kSlotPerPosition = 256;

bool long_runs(const BatchNormLayout& L) { return !L.rows && L.S > kSlotPerPosition; }
int64_t runs_per_chunk(const BatchNormLayout& L) {
  return std::max<int64_t>(1, kChunkElems / std::max<int64_t>(L.S, 1));
}

// Sums of elem's a1 and a2 over one run of channel c, folded into kAcc register accumulators.
template <class T, class Elem>
std::pair<double, double> fold_run(const T* xr, const T* dyr, int64_t S, int64_t c, Elem elem) {
  using Cp = compute_t<T>;
  Cp p1[kAcc] = {}, p2[kAcc] = {};
  int64_t i = 0;
  for (; i + kAcc <= S; i += kAcc)
    for (int j = 0; j < kAcc; ++j) elem(c, static_cast<Cp>(xr[i + j]), static_cast<Cp>(dyr[i + j]), p1[j], p2[j]);
  for (int j = 0; i + j < S; ++j) elem(c, static_cast<Cp>(xr[i + j]), static_cast<Cp>(dyr[i + j]), p1[j], p2[j]);
  return {dense_sum<Cp, double>(p1, kAcc), dense_sum<Cp, double>(p2, kAcc)};
}

// q[i] = sums over runs [n0, n1) of channel c of elem at position i (short NCS runs).
template <class T, class Cp, class Elem>
void accumulate_runs(const BatchNormLayout& L, const T* x, const T* dy, int64_t c, int64_t n0, int64_t n1, Cp* q1,
                     Cp* q2, Elem elem) {
  const int64_t S = L.S;
  std::fill(q1, q1 + S, Cp(0));
  std::fill(q2, q2 + S, Cp(0));
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t off = (n * L.C + c) * S;
    const T* xr = x + off;
    const T* dyr = dy ? dy + off : xr;  // elem ignores dy where there is none
#pragma omp simd
    for (int64_t i = 0; i < S; ++i) elem(c, static_cast<Cp>(xr[i]), static_cast<Cp>(dyr[i]), q1[i], q2[i]);
  }
}

// accumulate_rows for C a multiple of 16: one block of 16 channels at a time over all the rows,
// its sums in registers (summing whole rows instead loads and stores every channel's two sums
// once per row, which made channels-last statistics twice as slow as NCHW's for C = 32).
// kHasDy is a template argument, not a test of dy in the loop: with `dy ? dy : x` there, the
// bf16 backward sums ran 3-5 times slower (2026-11-27).
template <bool kHasDy, class T, class Cp, class Elem>
void accumulate_row_blocks(int64_t C, const T* x, const T* dy, int64_t m0, int64_t m1, Cp* q1, Cp* q2, Elem elem) {
  constexpr int kLanes = 16;
  for (int64_t c0 = 0; c0 < C; c0 += kLanes) {
    Cp s1[kLanes] = {}, s2[kLanes] = {};
    for (int64_t m = m0; m < m1; ++m) {
      const T* xr = x + m * C + c0;
      const T* dyr = kHasDy ? dy + m * C + c0 : xr;  // elem ignores dy where there is none
#pragma omp simd
      for (int j = 0; j < kLanes; ++j) elem(c0 + j, static_cast<Cp>(xr[j]), static_cast<Cp>(dyr[j]), s1[j], s2[j]);
    }
    std::copy(s1, s1 + kLanes, q1 + c0);
    std::copy(s2, s2 + kLanes, q2 + c0);
  }
}

// q[c] = sum over rows [m0, m1) of elem at channel c (MC), rows in order for every c.
template <class T, class Cp, class Elem>
void accumulate_rows(const BatchNormLayout& L, const T* x, const T* dy, int64_t m0, int64_t m1, Cp* q1, Cp* q2,
                     Elem elem) {
  const int64_t C = L.C;
  if (C % 16 == 0) {
    if (dy != nullptr) return accumulate_row_blocks<true>(C, x, dy, m0, m1, q1, q2, elem);
    return accumulate_row_blocks<false>(C, x, dy, m0, m1, q1, q2, elem);
  }
  std::fill(q1, q1 + C, Cp(0));
  std::fill(q2, q2 + C, Cp(0));
  for (int64_t m = m0; m < m1; ++m) {
    const T* xr = x + m * C;
    const T* dyr = dy ? dy + m * C : xr;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) elem(c, static_cast<Cp>(xr[c]), static_cast<Cp>(dyr[c]), q1[c], q2[c]);
  }
}

// The units the blocked walks split (long NCS runs or MC rows), and their number of blocks.
int64_t reduction_units(const BatchNormLayout& L) { return L.rows ? L.N * L.S : L.N * L.C; }
int64_t reduction_blocks(const BatchNormLayout& L) { return row_blocks(reduction_units(L), L.rows ? L.C : L.S); }

// Per-channel sums s1[c] = sum elem's a1, s2[c] = sum elem's a2 over the N*S elements, in f64.
template <class T, class Elem>
void channel_sums(const BatchNormLayout& L, const T* x, const T* dy, Elem elem, std::vector<double>& s1,
                  std::vector<double>& s2) {
  using Cp = compute_t<T>;
  const int64_t C = L.C, S = L.S;
  s1.assign(C, 0.0);
  s2.assign(C, 0.0);
  if (!L.rows && !long_runs(L)) {
    const int64_t per_chunk = runs_per_chunk(L);
    parallel_for(0, C, std::max<int64_t>(1, 32768 / std::max<int64_t>(L.N * S, 1)), [&](int64_t c0, int64_t c1) {
      std::vector<Cp> q1(S), q2(S);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t n0 = 0; n0 < L.N; n0 += per_chunk) {
          accumulate_runs(L, x, dy, c, n0, std::min(L.N, n0 + per_chunk), q1.data(), q2.data(), elem);
          s1[c] += dense_sum<Cp, double>(q1.data(), S);
          s2[c] += dense_sum<Cp, double>(q2.data(), S);
        }
    });
    return;
  }
  const int64_t nb = reduction_blocks(L);
  std::vector<double> p1(nb * C, 0.0), p2(nb * C, 0.0);
  for_row_blocks(reduction_units(L), nb, [&](int64_t blk, int64_t u0, int64_t u1) {
    double* a1 = p1.data() + blk * C;
    double* a2 = p2.data() + blk * C;
    if (!L.rows) {
      for (int64_t r = u0; r < u1; ++r) {
        const auto [r1, r2] = fold_run(x + r * S, (dy ? dy : x) + r * S, S, r % C, elem);
        a1[r % C] += r1;
        a2[r % C] += r2;
      }
      return;
    }
    std::vector<Cp> q1(C), q2(C);
    for (int64_t m0 = u0; m0 < u1; m0 += kRowsPerChunk) {
      accumulate_rows(L, x, dy, m0, std::min(u1, m0 + kRowsPerChunk), q1.data(), q2.data(), elem);
      for (int64_t c = 0; c < C; ++c) {
        a1[c] += static_cast<double>(q1[c]);
        a2[c] += static_cast<double>(q2[c]);
      }
    }
  });
  combine_partials(p1, nb, C, s1.data());
  combine_partials(p2, nb, C, s2.data());
}

// Count, mean and sum of squared deviations of a set of values, in f64; merge() adds another set
// (Chan, Golub and LeVeque's pairwise update), which combines the row blocks of a channel.
struct Moments {
  double n = 0, mean = 0, m2 = 0;
  void merge(const Moments& o) {
    if (o.n == 0) return;
    const double total = n + o.n, delta = o.mean - mean;
    mean += delta * (o.n / total);
    m2 += o.m2 + delta * delta * (n * o.n / total);
    n = total;
  }
};

// Moments from the sums of deviations d = x - shift: mean = shift + sum d / n and
// m2 = sum d^2 - (sum d)^2 / n (exact for any shift; the rounding error grows with
// (mean - shift)^2 / variance, so the shift is a mean of the first values seen).
inline Moments moments_about(double count, double shift, double sum_d, double sum_d2) {
  return {count, shift + sum_d / count, std::max(0.0, sum_d2 - sum_d * sum_d / count)};
}

// y = f(c, x, dy) elementwise with per-channel coefficients: run(c, xr, dyr, yr, n) handles a
// contiguous run of channel c (NCS), row(xr, dyr, yr) one [C] row (MC).
template <class T, class RunF, class RowF>
void channel_map(const BatchNormLayout& L, const T* x, const T* dy, T* y, RunF run, RowF row) {
  const int64_t C = L.C;
  if (!L.rows) {
    parallel_for(0, L.N * C, std::max<int64_t>(1, 32768 / std::max<int64_t>(L.S, 1)), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t off = r * L.S;
        run(r % C, x + off, dy ? dy + off : nullptr, y + off, L.S);
      }
    });
    return;
  }
  parallel_for(0, L.N * L.S, std::max<int64_t>(1, 32768 / std::max<int64_t>(C, 1)), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) row(x + m * C, dy ? dy + m * C : nullptr, y + m * C);
  });
}

// Mean and biased variance per channel, reading x from memory once. Each channel (or each row
// block's part of it) takes its shift from the mean of its first chunk (a long run, a chunk of
// short runs or of rows), summed while the chunk is in cache; then the deviations from the shift
// are summed over all its values, and row blocks are merged in f64. The shift is within the
// channel's spread of its mean, so the sums of squares do not cancel.
template <class T>
void batch_norm_stats_impl(const Tensor& x, const BatchNormLayout& L, const Tensor& mean_t, const Tensor& var_t) {
  using Cp = compute_t<T>;
  const int64_t C = L.C, S = L.S;
  const T* xp = x.data<T>();
  const T* no_dy = nullptr;
  auto add_x = [](int64_t, Cp v, Cp, Cp& a1, Cp&) { a1 += v; };
  // d = x - shift_of(c) summed into a1, d^2 into a2.
  auto deviations_from = [](auto shift_of) {
    return [shift_of](int64_t c, Cp v, Cp, Cp& a1, Cp& a2) {
      const Cp d = v - shift_of(c);
      a1 += d;
      a2 += d * d;
    };
  };
  auto constant = [](Cp k) { return [k](int64_t) { return k; }; };
  std::vector<Moments> m(C);
  if (!L.rows && !long_runs(L)) {
    const int64_t per_chunk = runs_per_chunk(L);
    parallel_for(0, C, std::max<int64_t>(1, 32768 / std::max<int64_t>(L.N * S, 1)), [&](int64_t c0, int64_t c1) {
      std::vector<Cp> q1(S), q2(S);
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t first = std::min(L.N, per_chunk);
        accumulate_runs(L, xp, no_dy, c, 0, first, q1.data(), q2.data(), add_x);
        const Cp shift = static_cast<Cp>(dense_sum<Cp, double>(q1.data(), S) / static_cast<double>(first * S));
        double d1 = 0, d2 = 0;
        for (int64_t n0 = 0; n0 < L.N; n0 += per_chunk) {
          accumulate_runs(L, xp, no_dy, c, n0, std::min(L.N, n0 + per_chunk), q1.data(), q2.data(),
                          deviations_from(constant(shift)));
          d1 += dense_sum<Cp, double>(q1.data(), S);
          d2 += dense_sum<Cp, double>(q2.data(), S);
        }
        m[c] = moments_about(static_cast<double>(L.N * S), shift, d1, d2);
      }
    });
  } else {
    const int64_t nb = reduction_blocks(L);
    std::vector<Moments> partial(nb * C);
    for_row_blocks(reduction_units(L), nb, [&](int64_t blk, int64_t u0, int64_t u1) {
      std::vector<Cp> shift(C);
      std::vector<double> d1(C, 0.0), d2(C, 0.0), count(C, 0.0);
      if (!L.rows) {
        for (int64_t r = u0; r < u1; ++r) {
          const int64_t c = r % C;
          const T* xr = xp + r * S;
          if (count[c] == 0) shift[c] = static_cast<Cp>(fold_run(xr, xr, S, c, add_x).first / static_cast<double>(S));
          const auto [s1, s2] = fold_run(xr, xr, S, c, deviations_from(constant(shift[c])));
          d1[c] += s1;
          d2[c] += s2;
          count[c] += static_cast<double>(S);
        }
      } else {
        std::vector<Cp> q1(C), q2(C);
        const int64_t first = std::min(u1, u0 + kRowsPerChunk);
        accumulate_rows(L, xp, no_dy, u0, first, q1.data(), q2.data(), add_x);
        for (int64_t c = 0; c < C; ++c) shift[c] = static_cast<Cp>(static_cast<double>(q1[c]) / (first - u0));
        for (int64_t m0 = u0; m0 < u1; m0 += kRowsPerChunk) {
          accumulate_rows(L, xp, no_dy, m0, std::min(u1, m0 + kRowsPerChunk), q1.data(), q2.data(),
                          deviations_from([k = shift.data()](int64_t c) { return k[c]; }));
          for (int64_t c = 0; c < C; ++c) {
            d1[c] += static_cast<double>(q1[c]);
            d2[c] += static_cast<double>(q2[c]);
          }
        }
        std::fill(count.begin(), count.end(), static_cast<double>(u1 - u0));
      }
      for (int64_t c = 0; c < C; ++c)
        if (count[c] > 0) partial[blk * C + c] = moments_about(count[c], shift[c], d1[c], d2[c]);
    });
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t c = 0; c < C; ++c) m[c].merge(partial[b * C + c]);
  }
  Cp* meanp = mean_t.data<Cp>();
  Cp* varp = var_t.data<Cp>();
  for (int64_t c = 0; c < C; ++c) {
    meanp[c] = static_cast<Cp>(m[c].mean);
    varp[c] = static_cast<Cp>(m[c].m2 / m[c].n);
  }
}

// bn(x) = x * scale + shift per channel, with scale = w * invstd and shift = b - mean * scale.
template <class Cp>
struct Affine {
  std::vector<Cp> scale, shift;
  Affine(const Tensor& mean_t, const Tensor& invstd_t, const Tensor& w, const Tensor& b, int64_t C)
      : scale(C), shift(C) {
    const Cp* meanp = mean_t.data<Cp>();
    const Cp* isp = invstd_t.data<Cp>();
    const std::vector<Cp> wv = feature_vector<Cp>(w, C, Cp(1)), bv = feature_vector<Cp>(b, C, Cp(0));
    for (int64_t c = 0; c < C; ++c) {
      scale[c] = wv[c] * isp[c];
      shift[c] = bv[c] - meanp[c] * scale[c];
    }
  }
};

// max(0, v) with ReLU fused, v otherwise.
template <bool Relu, class Cp>
inline Cp activate(Cp v) {
  if constexpr (Relu) return v > Cp(0) ? v : Cp(0);
  return v;
}

// dy where the fused ReLU passed bn(x) (bn(x) > 0), else 0 (times 0, as relu's own backward
// does); dy itself without ReLU. A product, not a select: GCC turned the select into a branch in
// the channels-last loops, mispredicted on half the elements (a 12x slower backward).
template <bool Relu, class Cp>
inline Cp through_relu(Cp g, Cp x, Cp scale, Cp shift) {
  if constexpr (Relu) return g * static_cast<Cp>(x * scale + shift > Cp(0));
  return g;
}

// y = bn(x), then + residual where Residual, then max(0, .) where Relu.
template <class T, bool Relu, bool Residual>
void batch_norm_apply_impl(const Tensor& x, const BatchNormLayout& L, const Tensor& mean_t, const Tensor& invstd_t,
                           const Tensor& w, const Tensor& b, const Tensor& residual, const Tensor& y) {
  using Cp = compute_t<T>;
  const int64_t C = L.C;
  const Affine<Cp> af(mean_t, invstd_t, w, b, C);
  const Cp* sc = af.scale.data();
  const Cp* sh = af.shift.data();
  // r[i] is read only with a residual (r is null otherwise: no address is formed from it).
  // Forced inline: an out-of-line call per element would keep the loops below scalar.
  auto out = [](Cp xv, Cp scale, Cp shift, const T* r, int64_t i) __attribute__((always_inline)) {
    Cp v = xv * scale + shift;
    if constexpr (Residual) v += static_cast<Cp>(r[i]);
    return activate<Relu>(v);
  };
  // channel_map's second operand (dy in the backward) carries the residual here.
  channel_map<T>(
      L, x.data<T>(), Residual ? residual.data<T>() : nullptr, y.data<T>(),
      [sc, sh, out](int64_t c, const T* xr, const T* rr, T* yr, int64_t n) {
        const Cp a = sc[c], bb = sh[c];
        store_run(yr, n, [&](int64_t i) { return out(static_cast<Cp>(xr[i]), a, bb, rr, i); });
      },
      [C, sc, sh, out](const T* xr, const T* rr, T* yr) {
        for (int64_t c = 0; c < C; ++c) yr[c] = static_cast<T>(out(static_cast<Cp>(xr[c]), sc[c], sh[c], rr, c));
      });
}

template <class T, bool Relu>
void batch_norm_backward_impl(const Tensor& dy, const Tensor& x, const BatchNormLayout& L, const Tensor& mean_t,
                              const Tensor& invstd_t, const Tensor& w, const Tensor& b, bool training, const Tensor& dx,
                              const Tensor& dw, const Tensor& db) {
  using Cp = compute_t<T>;
  const int64_t C = L.C;
  const T* xp = x.data<T>();
  const T* dyp = dy.data<T>();
  const Cp* meanp = mean_t.data<Cp>();
  const Cp* isp = invstd_t.data<Cp>();
  const std::vector<Cp> wv = feature_vector<Cp>(w, C, Cp(1));
  const Affine<Cp> af(mean_t, invstd_t, w, b, C);  // the fused ReLU's mask: bn(x) > 0
  const Cp* sc = af.scale.data();
  const Cp* sh = af.shift.data();
  const double count = static_cast<double>(L.N * L.S);
  const bool need_sums = training || dw.defined() || db.defined();
  std::vector<double> sdy(C, 0.0), sdyx(C, 0.0);
  if (need_sums) {
    // sdy = sum(dy), sdyx = sum(dy * (x - mean))
    channel_sums<T>(
        L, xp, dyp,
        [meanp, sc, sh](int64_t c, Cp xv, Cp dyv, Cp& a1, Cp& a2) {
          const Cp g = through_relu<Relu>(dyv, xv, sc[c], sh[c]);
          a1 += g;
          a2 += g * (xv - meanp[c]);
        },
        sdy, sdyx);
  }
  if (dw.defined()) {
    Cp* p = dw.data<Cp>();
    for (int64_t c = 0; c < C; ++c) p[c] = static_cast<Cp>(sdyx[c] * isp[c]);
  }
  if (db.defined()) {
    Cp* p = db.data<Cp>();
    for (int64_t c = 0; c < C; ++c) p[c] = static_cast<Cp>(sdy[c]);
  }
  if (!dx.defined()) return;
  // dx = dy * k1 + (x - mean) * k2 + k3
  std::vector<Cp> k1(C), k2(C, Cp(0)), k3(C, Cp(0)), mu(meanp, meanp + C);
  for (int64_t c = 0; c < C; ++c) {
    const double is = isp[c], wi = wv[c] * is;
    k1[c] = static_cast<Cp>(wi);
    if (training) {
      k2[c] = static_cast<Cp>(-wi * is * is * sdyx[c] / count);
      k3[c] = static_cast<Cp>(-wi * sdy[c] / count);
    }
  }
  const Cp *k1p = k1.data(), *k2p = k2.data(), *k3p = k3.data(), *mup = mu.data();
  if (training) {
    channel_map<T>(
        L, xp, dyp, dx.data<T>(),
        [=](int64_t c, const T* xr, const T* dyr, T* dxr, int64_t n) {
          const Cp a = k1p[c], bb = k2p[c], cc = k3p[c], m = mup[c], s = sc[c], h = sh[c];
          store_run(dxr, n, [&](int64_t i) {
            const Cp xv = static_cast<Cp>(xr[i]);
            return through_relu<Relu>(static_cast<Cp>(dyr[i]), xv, s, h) * a + (xv - m) * bb + cc;
          });
        },
        [=](const T* xr, const T* dyr, T* dxr) {
          for (int64_t c = 0; c < C; ++c) {
            const Cp xv = static_cast<Cp>(xr[c]);
            dxr[c] = static_cast<T>(through_relu<Relu>(static_cast<Cp>(dyr[c]), xv, sc[c], sh[c]) * k1p[c] +
                                    (xv - mup[c]) * k2p[c] + k3p[c]);
          }
        });
  } else if constexpr (Relu) {
    // eval mode is an affine map of x: dx = dy * w * invstd where bn(x) > 0
    channel_map<T>(
        L, xp, dyp, dx.data<T>(),
        [=](int64_t c, const T* xr, const T* dyr, T* dxr, int64_t n) {
          const Cp a = k1p[c], s = sc[c], h = sh[c];
          for (int64_t i = 0; i < n; ++i)
            dxr[i] = static_cast<T>(through_relu<Relu>(static_cast<Cp>(dyr[i]), static_cast<Cp>(xr[i]), s, h) * a);
        },
        [=](const T* xr, const T* dyr, T* dxr) {
          for (int64_t c = 0; c < C; ++c)
            dxr[c] = static_cast<T>(through_relu<Relu>(static_cast<Cp>(dyr[c]), static_cast<Cp>(xr[c]), sc[c], sh[c]) *
                                    k1p[c]);
        });
  } else {
    // eval mode is an affine map of x: dx = dy * w * invstd
    channel_map<T>(
        L, dyp, nullptr, dx.data<T>(),
        [=](int64_t c, const T* dyr, const T*, T* dxr, int64_t n) {
          const Cp a = k1p[c];
          for (int64_t i = 0; i < n; ++i) dxr[i] = static_cast<T>(static_cast<Cp>(dyr[i]) * a);
        },
        [=](const T* dyr, const T*, T* dxr) {
          for (int64_t c = 0; c < C; ++c) dxr[c] = static_cast<T>(static_cast<Cp>(dyr[c]) * k1p[c]);
        });
  }
}

}  // namespace

void row_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b, double eps, bool rms,
                      const Tensor& sum, const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const char* op = rms ? "rms_norm" : "layer_norm";
  FT_DISPATCH_FLOATING(x.dtype(), op, [&] {
    using T = scalar_t;
    if (!residual.defined() || residual.dtype() == x.dtype()) {
      row_norm_forward_impl<T, T>(x, residual, w, b, eps, rms, sum, y, mean, rstd);
    } else if constexpr (std::is_same_v<T, float>) {  // f32 plus a bf16/f16 branch (autocast)
      FT_CHECK(backend::row_norm_residual_ok(x.dtype(), residual.dtype()), op, ": a residual of dtype ",
               dtype_name(residual.dtype()), " for an f32 input (expected f32, bf16 or f16)");
      if (residual.dtype() == DType::BF16)
        row_norm_forward_impl<T, ::ft::bf16>(x, residual, w, b, eps, rms, sum, y, mean, rstd);
      else
        row_norm_forward_impl<T, ::ft::f16>(x, residual, w, b, eps, rms, sum, y, mean, rstd);
    } else {
      FT_FAIL(op, ": a residual of dtype ", dtype_name(residual.dtype()), " for an input of dtype ",
              dtype_name(x.dtype()), " (expected the input's dtype, or bf16/f16 for an f32 input)");
    }
  });
}

void row_norm_backward(const Tensor& dy, const Tensor& dsum, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                       const Tensor& w, bool rms, const Tensor& dx, const Tensor& dw, const Tensor& db) {
  FT_DISPATCH_FLOATING(x.dtype(), rms ? "rms_norm" : "layer_norm",
                       [&] { row_norm_backward_impl<scalar_t>(dy, dsum, x, mean, rstd, w, rms, dx, dw, db); });
}

void batch_norm_update(const Tensor& mean, const Tensor& var, double count, double momentum, double eps,
                       const Tensor& invstd, const Tensor& running_mean, const Tensor& running_var) {
  const int64_t C = mean.numel();
  const double unbias = count / (count - 1);
  FT_DISPATCH_FLOATING(mean.dtype(), "batch_norm", [&] {
    using A = scalar_t;  // the statistics' dtype: f32 or f64
    const A* m = mean.data<A>();
    const A* v = var.data<A>();
    A* is = invstd.data<A>();
    for (int64_t c = 0; c < C; ++c) is[c] = static_cast<A>(1.0 / std::sqrt(static_cast<double>(v[c]) + eps));
    if (!running_mean.defined()) return;
    FT_DISPATCH_FLOATING(running_mean.dtype(), "batch_norm", [&] {
      using R = scalar_t;
      R* rm = running_mean.data<R>();
      R* rv = running_var.data<R>();
      for (int64_t c = 0; c < C; ++c) {
        const double om = 1.0 - momentum;
        rm[c] = R(static_cast<compute_t<R>>(om * static_cast<double>(static_cast<compute_t<R>>(rm[c])) +
                                            momentum * static_cast<double>(m[c])));
        rv[c] = R(static_cast<compute_t<R>>(om * static_cast<double>(static_cast<compute_t<R>>(rv[c])) +
                                            momentum * static_cast<double>(v[c]) * unbias));
      }
    });
  });
}

void batch_norm_stats(const Tensor& x, const BatchNormLayout& L, const Tensor& mean, const Tensor& var) {
  FT_DISPATCH_FLOATING(x.dtype(), "batch_norm", [&] { batch_norm_stats_impl<scalar_t>(x, L, mean, var); });
}

void batch_norm_apply(const Tensor& x, const BatchNormLayout& L, const Tensor& mean, const Tensor& invstd,
                      const Tensor& w, const Tensor& b, const Tensor& y) {
  FT_DISPATCH_FLOATING(x.dtype(), "batch_norm", [&] {
    if (L.relu)
      batch_norm_apply_impl<scalar_t, true, false>(x, L, mean, invstd, w, b, Tensor(), y);
    else
      batch_norm_apply_impl<scalar_t, false, false>(x, L, mean, invstd, w, b, Tensor(), y);
  });
}

void batch_norm_add_relu(const Tensor& x, const BatchNormLayout& L, const Tensor& mean, const Tensor& invstd,
                         const Tensor& w, const Tensor& b, const Tensor& residual, const Tensor& y) {
  FT_DISPATCH_FLOATING(x.dtype(), "batch_norm_add_relu",
                       [&] { batch_norm_apply_impl<scalar_t, true, true>(x, L, mean, invstd, w, b, residual, y); });
}

void batch_norm_backward(const Tensor& dy, const Tensor& x, const BatchNormLayout& L, const Tensor& mean,
                         const Tensor& invstd, const Tensor& w, const Tensor& b, bool training, const Tensor& dx,
                         const Tensor& dw, const Tensor& db) {
  FT_DISPATCH_FLOATING(x.dtype(), "batch_norm", [&] {
    if (L.relu)
      batch_norm_backward_impl<scalar_t, true>(dy, x, L, mean, invstd, w, b, training, dx, dw, db);
    else
      batch_norm_backward_impl<scalar_t, false>(dy, x, L, mean, invstd, w, b, training, dx, dw, db);
  });
}

}  // namespace ft::cpu
