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

namespace ft::cpu {

inline float fast_exp(float x) {
  // x = n ln2 + r with |r| <= ln2/2; exp(r) by Cephes' degree-6 minimax polynomial; 2^n built
  // directly in the exponent bits.
  const float xc = x > 88.3f ? 88.3f : (x < -87.3f ? -87.3f : x);
  const float n = std::floor(xc * 1.44269504088896341f + 0.5f);
  const float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const float res = y * scale;
  // NaN fails both comparisons and keeps res (NaN, since r is NaN).
  return x < -87.3f ? 0.0f : (x > 88.72f ? INFINITY : res);
}

inline double fast_exp(double x) { return std::exp(x); }

}  // namespace ft::cpu
