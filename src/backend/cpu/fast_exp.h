// A branch-free exp for f32 that the compiler vectorises (glibc's expf is a scalar call, and
// libmvec is only used under -ffast-math). Softmax, log-softmax and cross-entropy spend most of
// their time in exp, so this decides their speed. Accuracy: within 2 ulp of expf on
// [-87.3, 88.3] (where 2^n stays a normal float); below -87.3 the result is exactly 0 (so
// exp(-inf) = 0, as masked attention scores need), above 88.72 it is inf, in between it
// saturates at exp(88.3); NaN propagates. f64 keeps std::exp (full precision is its point).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "fasttrain/dtype.h"

namespace ft::cpu {

// Always inlined: an out-of-line call inside a loop stops that loop from vectorising, and GCC
// stops inlining plain `inline` functions in large kernel files (it did in tanh-GELU's backward).
__attribute__((always_inline)) inline float fast_exp(float x) {
  // x = n ln2 + r with |r| <= ln2/2; exp(r) by Cephes' degree-6 minimax polynomial; 2^n built
  // directly in the exponent bits.
  const float xc = x > 88.3f ? 88.3f : (x < -87.3f ? -87.3f : x);
  // Round to nearest by the 1.5 * 2^23 trick: std::floor/nearbyint block GCC's vectoriser
  // without -fno-trapping-math.
  const float t = xc * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  const float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  // n as an integer is already in t's low mantissa bits: t's bits minus those of 1.5 * 2^23. Not
  // static_cast<int32_t>(n): for a NaN x (a fully masked softmax row) that conversion is
  // undefined, and UBSan stops there. The bit difference is defined for every x, and a NaN x still
  // gives NaN, since y is NaN.
  uint32_t tbits;
  std::memcpy(&tbits, &t, sizeof(tbits));
  const uint32_t bits = (tbits - 0x4B400000u + 127u) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const float res = y * scale;
  // NaN fails both comparisons and keeps res (NaN, since r is NaN).
  return x < -87.3f ? 0.0f : (x > 88.72f ? INFINITY : res);
}

inline double fast_exp(double x) { return std::exp(x); }

// Loads and stores between a storage type and its compute type. bf16's conversions (dtype.h) are
// branch-free, so loops through these vectorise; dense bf16 runs are better stored through
// store_run (half_tiles.h), which narrows with the CPU's instruction where it has one.
template <class T>
inline compute_t<T> load(T v) {
  return static_cast<compute_t<T>>(v);
}
template <class T>
inline T store(compute_t<T> v) {
  return static_cast<T>(v);
}

// max of p[0..n) in the compute type (-inf when empty; NaNs are skipped, callers' later sums
// propagate them).
template <class T>
compute_t<T> max_value(const T* p, int64_t n) {
  using C = compute_t<T>;
  C m = -std::numeric_limits<C>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) {
    const C v = load(p[i]);
    m = v > m ? v : m;
  }
  return m;
}

}  // namespace ft::cpu
