// Rotary position embedding on the CPU (kernel-table entry rotary_embedding; the math is in
// src/ops/rotary.cpp): each row x[b, t, h, :] of D elements is turned pair by pair,
//   out[i] = x[i] c_i - x[i + D/2] s_i,  out[i + D/2] = x[i + D/2] c_i + x[i] s_i,
// with c, s row t of the tables (s negated for the inverse, the backward). The two halves of a
// row and the table row are dense runs, so the loop over i is a plain vectorisable loop; 16-bit
// halves are widened to f32 a tile at a time and rounded once on store. One pass: x read once,
// out written once, the tables ([T, D/2], small) stay in cache across the heads of a position.
#include <algorithm>

#include "backend/cpu/copy.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/half_tiles.h"
#include "backend/cpu/kernel_decls.h"
#include "fasttrain/parallel.h"

namespace ft::cpu {

namespace {

// Elements per parallel chunk: below this a block of rows is not worth another thread.
constexpr int64_t kGrainElements = 1 << 15;

// T the element type of x and out, A the tables' (f32, or f64 for f64 x).
template <class T, class A>
void rotary_typed(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse, const Tensor& out) {
  using C = compute_t<T>;
  const int64_t Tn = x.size(1), H = x.size(2), D = x.size(3), half = D / 2, rows = x.size(0) * Tn * H;
  const int64_t sb = x.stride(0), st = x.stride(1), sh = x.stride(2);
  const T* X = static_cast<const T*>(x.raw_data());
  T* O = static_cast<T*>(out.raw_data());
  const A* Cs = static_cast<const A*>(cos.raw_data());
  const A* Sn = static_cast<const A*>(sin.raw_data());
  const C sign = inverse ? C(-1) : C(1);
  parallel_for(0, rows, std::max<int64_t>(1, kGrainElements / std::max<int64_t>(D, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t h = r % H, t = (r / H) % Tn, b = r / (H * Tn);
      const T* xr = X + b * sb + t * st + h * sh;
      T* o = O + r * D;
      const A* c = Cs + t * half;
      const A* s = Sn + t * half;
      for_half_tiles(half, [&](int64_t i0, int64_t m) {
        C lo_buf[kHalfTile], hi_buf[kHalfTile];
        const C* lo = widened_run(xr + i0, m, lo_buf);
        const C* hi = widened_run(xr + half + i0, m, hi_buf);
        store_run(o + i0, m, [&](int64_t i) { return lo[i] * C(c[i0 + i]) - hi[i] * (sign * C(s[i0 + i])); });
        store_run(o + half + i0, m, [&](int64_t i) { return hi[i] * C(c[i0 + i]) + lo[i] * (sign * C(s[i0 + i])); });
      });
    }
  });
}

}  // namespace

void rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse, const Tensor& out) {
  // f64 tables come with f64 x only (the op checked).
  FT_DISPATCH_FLOATING(x.dtype(), "rotary_embedding", [&] {
    if constexpr (std::is_same_v<scalar_t, double>)
      if (cos.dtype() == DType::F64) return rotary_typed<double, double>(x, cos, sin, inverse, out);
    rotary_typed<scalar_t, float>(x, cos, sin, inverse, out);
  });
}

}  // namespace ft::cpu
