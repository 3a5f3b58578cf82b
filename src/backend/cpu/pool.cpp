#include "backend/cpu/pool.h"

#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/half_tiles.h"
#include "fasttrain/parallel.h"

namespace ft::cpu {

namespace {

// A pooling window clipped to the input, and what its sum is divided by.
struct Window {
  int64_t hs, he, ws, we;
  double div;
};

Window avg_window(const PoolParams& p, int64_t oh, int64_t ow) {
  int64_t hs = oh * p.sH - p.pH, ws = ow * p.sW - p.pW;
  int64_t he = std::min(hs + p.kH, p.H + p.pH), we = std::min(ws + p.kW, p.W + p.pW);
  const int64_t padded = (he - hs) * (we - ws);
  hs = std::max<int64_t>(hs, 0), ws = std::max<int64_t>(ws, 0);
  he = std::min(he, p.H), we = std::min(we, p.W);
  return {hs, he, ws, we, static_cast<double>(p.count_include_pad ? padded : (he - hs) * (we - ws))};
}

Window adaptive_window(const PoolParams& p, int64_t oh, int64_t ow) {
  const int64_t hs = oh * p.H / p.OH, he = ((oh + 1) * p.H + p.OH - 1) / p.OH;
  const int64_t ws = ow * p.W / p.OW, we = ((ow + 1) * p.W + p.OW - 1) / p.OW;
  return {hs, he, ws, we, static_cast<double>((he - hs) * (we - ws))};
}

template <class T, class WinFn>
void mean_forward(const PoolParams& p, const T* x, T* y, WinFn win) {
  using A = compute_t<T>;
  if (!p.channels_last) {
    parallel_for(0, p.N * p.C, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const T* xp = x + b * p.H * p.W;
        T* yp = y + b * p.OH * p.OW;
        for (int64_t oh = 0; oh < p.OH; ++oh)
          for (int64_t ow = 0; ow < p.OW; ++ow) {
            const Window w = win(p, oh, ow);
            A s = 0;
            for (int64_t ih = w.hs; ih < w.he; ++ih)
              for (int64_t iw = w.ws; iw < w.we; ++iw) s += static_cast<A>(xp[ih * p.W + iw]);
            yp[oh * p.OW + ow] = static_cast<T>(s / static_cast<A>(w.div));
          }
      }
    });
    return;
  }
  const int64_t C = p.C;
  parallel_for(0, p.N * p.OH, 1, [&](int64_t r0, int64_t r1) {
    std::vector<A> acc(C);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r / p.OH, oh = r % p.OH;
      for (int64_t ow = 0; ow < p.OW; ++ow) {
        const Window w = win(p, oh, ow);
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t ih = w.hs; ih < w.he; ++ih)
          for (int64_t iw = w.ws; iw < w.we; ++iw) {
            const T* xr = x + ((n * p.H + ih) * p.W + iw) * C;
            for (int64_t c = 0; c < C; ++c) acc[c] += static_cast<A>(xr[c]);
          }
        T* yr = y + ((n * p.OH + oh) * p.OW + ow) * C;
        const A div = static_cast<A>(w.div);
        store_run(yr, C, [&](int64_t c) { return acc[c] / div; });
      }
    }
  });
}

template <class T, class WinFn>
void mean_backward(const PoolParams& p, const T* gy, T* gx, WinFn win) {
  using A = compute_t<T>;
  if (!p.channels_last) {
    parallel_for(0, p.N * p.C, 1, [&](int64_t b0, int64_t b1) {
      std::vector<A> buf(p.H * p.W);
      for (int64_t b = b0; b < b1; ++b) {
        std::fill(buf.begin(), buf.end(), A(0));
        const T* gp = gy + b * p.OH * p.OW;
        for (int64_t oh = 0; oh < p.OH; ++oh)
          for (int64_t ow = 0; ow < p.OW; ++ow) {
            const Window w = win(p, oh, ow);
            const A g = static_cast<A>(gp[oh * p.OW + ow]) / static_cast<A>(w.div);
            for (int64_t ih = w.hs; ih < w.he; ++ih)
              for (int64_t iw = w.ws; iw < w.we; ++iw) buf[ih * p.W + iw] += g;
          }
        T* xp = gx + b * p.H * p.W;
        store_run(xp, p.H * p.W, [&](int64_t i) { return buf[i]; });
      }
    });
    return;
  }
  const int64_t C = p.C;
  parallel_for(0, p.N, 1, [&](int64_t n0, int64_t n1) {
    std::vector<A> buf(p.H * p.W * C), g(C);
    for (int64_t n = n0; n < n1; ++n) {
      std::fill(buf.begin(), buf.end(), A(0));
      for (int64_t oh = 0; oh < p.OH; ++oh)
        for (int64_t ow = 0; ow < p.OW; ++ow) {
          const Window w = win(p, oh, ow);
          const T* gr = gy + ((n * p.OH + oh) * p.OW + ow) * C;
          const A div = static_cast<A>(w.div);
          for (int64_t c = 0; c < C; ++c) g[c] = static_cast<A>(gr[c]) / div;
          for (int64_t ih = w.hs; ih < w.he; ++ih)
            for (int64_t iw = w.ws; iw < w.we; ++iw) {
              A* br = buf.data() + (ih * p.W + iw) * C;
              for (int64_t c = 0; c < C; ++c) br[c] += g[c];
            }
        }
      T* xp = gx + n * p.H * p.W * C;
      store_run(xp, p.H * p.W * C, [&](int64_t i) { return buf[i]; });
    }
  });
}

// First valid tap of a dilated window starting at `start` (may be negative) and its end.
inline void clip_taps(int64_t start, int64_t k, int64_t d, int64_t size, int64_t& lo, int64_t& hi) {
  hi = std::min(start + (k - 1) * d + 1, size);
  lo = start;
  while (lo < 0) lo += d;
}

// NCHW max pooling, one output row of one plane at a time, vectorised over the output columns.
// Each input row under the window is widened and split by phase into sW buffers, phase q holding
// the padded row's columns q, q + sW, q + 2 sW, ..., and padded with -inf to every column a window
// reaches. A tap (ih, kw) at offset t = kw * dW then reads phase t % sW from t / sW on: one
// unit-stride pass over all output columns, with no clipping (-inf padding is never taken) and
// no strided loads, which GCC turns into gathers or permutes. Taps go in the same order as a
// per-window loop (rows, then columns) with the same strict comparison, so ties and NaNs pick the
// same position; a window whose values are all -inf keeps its first valid position. Positions
// are i32 lanes beside the f32 values.
template <class T>
void max_forward_planes(const PoolParams& p, const T* x, T* y, int64_t* idx) {
  using A = compute_t<T>;
  const A neg_inf = -std::numeric_limits<A>::infinity();
  const int64_t W = p.W, OW = p.OW, sW = p.sW;
  // Whole vectors of columns, the lanes past OW computed and dropped, so no scalar epilogue runs
  // on rows as short as ResNet's 56.
  constexpr int64_t kLanes = 16;
  const int64_t OWv = (OW + kLanes - 1) / kLanes * kLanes;
  const int64_t phase_len = OWv + ((p.kW - 1) * p.dW) / sW + 1;
  std::vector<int32_t> first_col(OW), col_offset(OWv);  // first valid column of each window; ow * sW
  for (int64_t ow = 0; ow < OWv; ++ow) col_offset[ow] = static_cast<int32_t>(ow * sW);
  for (int64_t ow = 0; ow < OW; ++ow) {
    int64_t ws, we;
    clip_taps(ow * sW - p.pW, p.kW, p.dW, W, ws, we);
    first_col[ow] = static_cast<int32_t>(ws);
  }
  // Phase q's entries m in [valid_lo[q], valid_hi[q]) are input columns m * sW + q - pW of the row.
  std::vector<int64_t> valid_lo(sW), valid_hi(sW);
  for (int64_t q = 0; q < sW; ++q) {
    valid_lo[q] = std::min(phase_len, std::max<int64_t>(0, (p.pW - q + sW - 1) / sW));
    valid_hi[q] = std::max(valid_lo[q], std::min(phase_len, (W + p.pW - q + sW - 1) / sW));
  }
  parallel_for(0, p.N * p.C, 1, [&](int64_t b0, int64_t b1) {
    std::vector<A> best_buf(OWv), phase_buf(sW * phase_len, neg_inf);
    std::vector<int32_t> at_buf(OWv, 0);
    A* best = best_buf.data();
    int32_t* at = at_buf.data();
    for (int64_t b = b0; b < b1; ++b) {
      const T* xp = x + b * p.H * W;
      for (int64_t oh = 0; oh < p.OH; ++oh) {
        int64_t hs, he;
        clip_taps(oh * p.sH - p.pH, p.kH, p.dH, p.H, hs, he);
        std::fill(best, best + OWv, neg_inf);
        for (int64_t ow = 0; ow < OW; ++ow) at[ow] = static_cast<int32_t>(hs * W) + first_col[ow];
        for (int64_t ih = hs; ih < he; ih += p.dH) {
          const T* xr = xp + ih * W - p.pW;
          for (int64_t q = 0; q < sW; ++q) {
            A* ph = phase_buf.data() + q * phase_len;
            for (int64_t m = valid_lo[q]; m < valid_hi[q]; ++m) ph[m] = static_cast<A>(xr[m * sW + q]);
          }
          for (int64_t kw = 0; kw < p.kW; ++kw) {
            const int64_t t = kw * p.dW;
            const A* r = phase_buf.data() + (t % sW) * phase_len + t / sW;
            const int32_t base = static_cast<int32_t>(ih * W - p.pW + t);  // column ow: base + ow * sW
            const int32_t* offset = col_offset.data();
#pragma omp simd
            for (int64_t ow = 0; ow < OWv; ++ow) {
              const A v = r[ow];
              const bool take = (v > best[ow]) | (v != v);
              best[ow] = take ? v : best[ow];
              at[ow] = take ? base + offset[ow] : at[ow];
            }
          }
        }
        // The maximum is an input value, so narrowing it back to T is exact (a NaN stays a NaN).
        const int64_t o = (b * p.OH + oh) * OW;
        store_run(y + o, OW, [&](int64_t i) { return best[i]; });
        for (int64_t ow = 0; ow < OW; ++ow) idx[o + ow] = at[ow];
      }
    }
  });
}

template <class T>
void max_forward(const PoolParams& p, const T* x, T* y, int64_t* idx) {
  using A = compute_t<T>;
  const A neg_inf = -std::numeric_limits<A>::infinity();
  if (!p.channels_last) return max_forward_planes(p, x, y, idx);
  // Channel loops select with masks (SIMD over C); positions are tracked in i32 lanes, the width
  // of the f32 values they ride along with, and widened to i64 once per output.
  const int64_t C = p.C, H = p.H, W = p.W;
  parallel_for(0, p.N * p.OH, 1, [&](int64_t r0, int64_t r1) {
    std::vector<A> best_buf(C);
    std::vector<int32_t> at_buf(C);
    A* best = best_buf.data();
    int32_t* at = at_buf.data();
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r / p.OH, oh = r % p.OH;
      int64_t hs, he;
      clip_taps(oh * p.sH - p.pH, p.kH, p.dH, H, hs, he);
      for (int64_t ow = 0; ow < p.OW; ++ow) {
        int64_t ws, we;
        clip_taps(ow * p.sW - p.pW, p.kW, p.dW, W, ws, we);
        const int32_t first = static_cast<int32_t>(hs * W + ws);
        for (int64_t c = 0; c < C; ++c) {
          best[c] = neg_inf;
          at[c] = first;
        }
        for (int64_t ih = hs; ih < he; ih += p.dH)
          for (int64_t iw = ws; iw < we; iw += p.dW) {
            const T* xr = x + ((n * H + ih) * W + iw) * C;
            const int32_t pos = static_cast<int32_t>(ih * W + iw);
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) {
              const A v = static_cast<A>(xr[c]);
              const bool take = v > best[c] || v != v;
              best[c] = take ? v : best[c];
              at[c] = take ? pos : at[c];
            }
          }
        const int64_t o = ((n * p.OH + oh) * p.OW + ow) * C;
        T* yr = y + o;
        int64_t* ir = idx + o;
        const T* xn = x + n * H * W * C;
        for (int64_t c = 0; c < C; ++c) {
          ir[c] = at[c];
          yr[c] = xn[static_cast<int64_t>(at[c]) * C + c];
        }
      }
    }
  });
}

template <class T>
void max_backward(const PoolParams& p, const T* gy, const int64_t* idx, T* gx) {
  using A = compute_t<T>;
  if (!p.channels_last) {
    parallel_for(0, p.N * p.C, 1, [&](int64_t b0, int64_t b1) {
      std::vector<A> buf(p.H * p.W);
      for (int64_t b = b0; b < b1; ++b) {
        std::fill(buf.begin(), buf.end(), A(0));
        const T* gp = gy + b * p.OH * p.OW;
        const int64_t* ip = idx + b * p.OH * p.OW;
        for (int64_t o = 0; o < p.OH * p.OW; ++o) buf[ip[o]] += static_cast<A>(gp[o]);
        T* xp = gx + b * p.H * p.W;
        store_run(xp, p.H * p.W, [&](int64_t i) { return buf[i]; });
      }
    });
    return;
  }
  const int64_t C = p.C;
  parallel_for(0, p.N, 1, [&](int64_t n0, int64_t n1) {
    std::vector<A> buf(p.H * p.W * C);
    for (int64_t n = n0; n < n1; ++n) {
      std::fill(buf.begin(), buf.end(), A(0));
      const T* gp = gy + n * p.OH * p.OW * C;
      const int64_t* ip = idx + n * p.OH * p.OW * C;
      for (int64_t o = 0; o < p.OH * p.OW; ++o)
        for (int64_t c = 0; c < C; ++c) buf[ip[o * C + c] * C + c] += static_cast<A>(gp[o * C + c]);
      T* xp = gx + n * p.H * p.W * C;
      store_run(xp, p.H * p.W * C, [&](int64_t i) { return buf[i]; });
    }
  });
}

}  // namespace

void max_pool2d_forward(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& indices) {
  // Both layouts track a window's position within its plane in i32 lanes.
  FT_CHECK(p.H * p.W <= std::numeric_limits<int32_t>::max(), "max_pool2d: planes of at most 2^31 - 1 elements on the ",
           "CPU, found ", p.H, "x", p.W);
  FT_DISPATCH_FLOATING(x.dtype(), "max_pool2d", [&] {
    max_forward<scalar_t>(p, x.data<scalar_t>(), y.data<scalar_t>(), indices.data<int64_t>());
  });
}

void max_pool2d_backward(const PoolParams& p, const Tensor& gy, const Tensor& indices, const Tensor& gx) {
  FT_DISPATCH_FLOATING(gy.dtype(), "max_pool2d_backward", [&] {
    max_backward<scalar_t>(p, gy.data<scalar_t>(), indices.data<int64_t>(), gx.data<scalar_t>());
  });
}

void avg_pool2d_forward(const PoolParams& p, const Tensor& x, const Tensor& y) {
  FT_DISPATCH_FLOATING(x.dtype(), "avg_pool2d",
                       [&] { mean_forward<scalar_t>(p, x.data<scalar_t>(), y.data<scalar_t>(), avg_window); });
}

void avg_pool2d_backward(const PoolParams& p, const Tensor& gy, const Tensor& gx) {
  FT_DISPATCH_FLOATING(gy.dtype(), "avg_pool2d_backward",
                       [&] { mean_backward<scalar_t>(p, gy.data<scalar_t>(), gx.data<scalar_t>(), avg_window); });
}

void adaptive_avg_pool2d_forward(const PoolParams& p, const Tensor& x, const Tensor& y) {
  FT_DISPATCH_FLOATING(x.dtype(), "adaptive_avg_pool2d",
                       [&] { mean_forward<scalar_t>(p, x.data<scalar_t>(), y.data<scalar_t>(), adaptive_window); });
}

void adaptive_avg_pool2d_backward(const PoolParams& p, const Tensor& gy, const Tensor& gx) {
  FT_DISPATCH_FLOATING(gy.dtype(), "adaptive_avg_pool2d_backward",
                       [&] { mean_backward<scalar_t>(p, gy.data<scalar_t>(), gx.data<scalar_t>(), adaptive_window); });
}

}  // namespace ft::cpu
