// Softmax statistics down columns: for `w` adjacent columns of a block of `rows` rows (row
// stride `stride`), m[j] = max over rows, s[j] = sum over rows of exp(x - m[j]), and, when
// kWithSum, sx[j] = sum over rows of x. Used when the softmax dimension is not the last one
// (softmax over dim 1 of [N, C, H, W], cross-entropy on [N, C, d...]): the w columns' statistics
// stay in registers/L1 while the rows stream through once per pass, with no transposing copy.
#pragma once
#include <cstdint>
#include <limits>

#include "backend/cpu/fast_exp.h"

namespace ft::cpu {

template <bool kWithSum, class T, class A>
inline void column_softmax_stats(const T* xb, int64_t rows, int64_t stride, int64_t w, A* m, A* s, A* sx) {
  for (int64_t j = 0; j < w; ++j) {
    m[j] = -std::numeric_limits<A>::infinity();
    s[j] = 0;
    if constexpr (kWithSum) sx[j] = 0;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = xb + r * stride;
#pragma omp simd
    for (int64_t j = 0; j < w; ++j) {
      const A v = load(xr[j]);
      m[j] = v > m[j] ? v : m[j];
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = xb + r * stride;
#pragma omp simd
    for (int64_t j = 0; j < w; ++j) {
      const A v = load(xr[j]);
      s[j] += fast_exp(v - m[j]);
      if constexpr (kWithSum) sx[j] += v;
    }
  }
}

}  // namespace ft::cpu
