// Sum over dimensions. Two shapes of loop cover every case without a transposing copy in the
// common ones: reducing trailing (dense) dims sums each row with vectorised partial sums;
// reducing leading dims (bias gradients: sum over the batch) adds whole dense rows into an
// accumulator row. Anything else is first permuted into a dense [K, R] copy.
#include "backend/cpu/reduce.h"

#include <algorithm>

#include "backend/cpu/copy.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/half_tiles.h"
#include "fasttrain/parallel.h"

namespace ft::cpu {

ReductionRows reduction_rows(const Tensor& x, const std::vector<bool>& mask) {
  Dims order;
  int64_t K = 1, R = 1;
  for (int i = 0; i < x.dim(); ++i)
    if (!mask[i]) {
      order.push_back(i);
      K *= x.size(i);
    }
  for (int i = 0; i < x.dim(); ++i)
    if (mask[i]) {
      order.push_back(i);
      R *= x.size(i);
    }
  Tensor p = x.dim() ? x.detach().permute(order) : x.detach();
  ReductionRows rows;
  rows.K = K;
  rows.R = R;
  if (!p.is_contiguous()) {
    Tensor c = empty(p.shape(), p.options());
    copy(c, p);
    p = c;
  }
  rows.values = p.reshape({K, R});
  return rows;
}

Rows3 rows3(const Shape& s, int dim) {
  Rows3 r;
  for (int i = 0; i < s.size(); ++i) {
    if (i < dim)
      r.outer *= s[i];
    else if (i == dim)
      r.R = s[i];
    else
      r.inner *= s[i];
  }
  return r;
}

namespace {

template <class T, class Acc>
void sum_rows(const T* x, int64_t K, int64_t R, double scale, Acc* out) {
  parallel_for(0, K, std::max<int64_t>(1, 32768 / std::max<int64_t>(R, 1)), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const T* row = x + k * R;
      double total = 0;
      // blocks of 256 summed in the compute type (vectorised), blocks combined in double
      for (int64_t r0 = 0; r0 < R; r0 += 256) {
        int64_t r1 = std::min(R, r0 + 256);
        compute_t<T> part[8] = {};
        int64_t r = r0;
        for (; r + 8 <= r1; r += 8)
          for (int j = 0; j < 8; ++j) part[j] += static_cast<compute_t<T>>(row[r + j]);
        compute_t<T> block = 0;
        for (int j = 0; j < 8; ++j) block += part[j];
        for (; r < r1; ++r) block += static_cast<compute_t<T>>(row[r]);
        total += static_cast<double>(block);
      }
      out[k] = static_cast<Acc>(total * scale);
    }
  });
}

// x viewed as [R, K] dense: out[k] = sum_r x[r, k]. As sum_rows: blocks of 256 rows summed in the
// compute type (one vectorised add per element into a row of partial sums that stays in L1), the
// blocks combined in double. Threads split the columns, so each column's order of addition is
// the same on any thread count.
template <class T, class Acc>
void sum_columns(const T* x, int64_t R, int64_t K, double scale, Acc* out) {
  using C = compute_t<T>;
  parallel_for(0, K, 256, [&](int64_t k0, int64_t k1) {
    const int64_t n = k1 - k0;
    std::vector<double> acc(n, 0.0);
    std::vector<C> part(n);
    for (int64_t r0 = 0; r0 < R; r0 += 256) {
      const int64_t r1 = std::min(R, r0 + 256);
      std::fill(part.begin(), part.end(), C(0));
      for (int64_t r = r0; r < r1; ++r) {
        const T* row = x + r * K + k0;
        if constexpr (std::is_same_v<T, f16>) {  // widened in tiles: a conversion per element stays scalar
          for_half_tiles(n, [&](int64_t i0, int64_t m) {
            float t[kHalfTile];
            widen_halves(row + i0, t, m);
            for (int64_t i = 0; i < m; ++i) part[i0 + i] += t[i];
          });
        } else {
          for (int64_t i = 0; i < n; ++i) part[i] += static_cast<C>(row[i]);
        }
      }
      for (int64_t i = 0; i < n; ++i) acc[i] += static_cast<double>(part[i]);
    }
    for (int64_t i = 0; i < n; ++i) out[k0 + i] = static_cast<Acc>(acc[i] * scale);
  });
}

}  // namespace

void sum(const Tensor& x, const std::vector<bool>& mask, double scale, const Tensor& out) {
  if (!is_floating(x.dtype()) && x.dtype() != DType::I64) {
    Tensor wide = empty(x.shape(), DType::I64);
    copy(wide, x);
    sum(wide, mask, scale, out);
    return;
  }
  // Leading-dims case: x dense and every reduced dim precedes every kept dim.
  int last_reduced = -1, first_kept = x.dim();
  for (int i = 0; i < x.dim(); ++i) {
    if (mask[i])
      last_reduced = i;
    else
      first_kept = std::min(first_kept, i);
  }
  const bool leading = x.is_contiguous() && last_reduced >= 0 && last_reduced < first_kept && first_kept < x.dim();
  const DType acc_dtype = is_floating(x.dtype()) ? DType::F64 : DType::I64;
  Tensor result = out.dtype() == acc_dtype && out.is_contiguous() ? out : empty(out.shape(), acc_dtype);
  FT_DISPATCH_ALL(x.dtype(), "sum", [&] {
    if constexpr (std::is_same_v<scalar_t, bool> || std::is_same_v<scalar_t, int32_t> ||
                  std::is_same_v<scalar_t, uint8_t>) {
      FT_FAIL("sum: unreachable dtype");
    } else {
      using Acc = std::conditional_t<std::is_integral_v<scalar_t>, int64_t, double>;
      const int64_t K = out.numel();
      if (leading) {
        sum_columns<scalar_t, Acc>(x.data<scalar_t>(), x.numel() / std::max<int64_t>(K, 1), K, scale,
                                   result.data<Acc>());
      } else {
        ReductionRows rows = reduction_rows(x, mask);
        sum_rows<scalar_t, Acc>(rows.values.data<scalar_t>(), rows.K, rows.R, scale, result.data<Acc>());
      }
    }
  });
  if (!result.same(out)) copy(out, result);
}

}  // namespace ft::cpu
