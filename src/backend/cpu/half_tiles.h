// Dense runs of 16-bit floats widened to f32 and narrowed back in tiles, with the CPU's
// conversion instructions where it has them.
// - f16: the CPU has no f16 arithmetic the kernels use, and a loop converting one element per call
//   (even one instruction each) does not vectorise: GCC 12 leaves _Float16 conversions scalar. So
//   elementwise loops over f16 work in tiles — widen eight at a time with F16C, run the op on f32
//   (which vectorises), narrow eight at a time.
// - bf16: widening is a shift, which vectorises inline. Narrowing in plain C++ (bf16::from_float:
//   round to nearest even, NaN kept quiet) vectorises too, but takes about ten instructions per
//   vector and bound bf16 elementwise loops; AVX512-BF16's vcvtneps2bf16 does it in one. So with
//   AVX512-BF16, loops writing bf16 store through f32 tiles as well (docs/PERF.md).
// Rounding is the same nearest-even as f16::from_float and bf16::from_float on every value, so
// results do not depend on the path.
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>

#if defined(__F16C__) || defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include "fasttrain/dtype.h"

namespace ft::cpu {

// Elements per tile: three f32 tiles stay in L1 next to the operands.
inline constexpr int64_t kHalfTile = 256;

inline void widen_halves(const f16* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

inline void narrow_to_halves(const float* src, f16* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; i < n; ++i) dst[i] = f16(src[i]);
}

inline void narrow_to_halves(const float* src, bf16* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512BF16__)
  const __m512i exponent = _mm512_set1_epi32(0x7f800000), mantissa = _mm512_set1_epi32(0x007fffff);
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(src + i);
    // vcvtneps2bf16 flushes subnormal inputs to zero, where bf16 keeps them (it has f32's
    // exponent range); a vector holding one is narrowed by the exact loop below instead.
    if (_mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(u, exponent), u, mantissa)) {
      for (int64_t k = i; k < i + 16; ++k) dst[k] = bf16(src[k]);
      continue;
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), (__m256i)_mm512_cvtneps_pbh(_mm512_castsi512_ps(u)));
  }
#endif
  for (; i < n; ++i) dst[i] = bf16(src[i]);
}

// Whether loops writing T go through f32 tiles: where the CPU narrows to T in one instruction.
template <class T>
inline constexpr bool narrows_in_tiles_v =
#if defined(__F16C__)
    std::is_same_v<T, f16> ||
#endif
#if defined(__AVX512BF16__)
    std::is_same_v<T, bf16> ||
#endif
    false;

// Calls body(offset, count) over [0, n) in tiles of at most kHalfTile.
template <class Body>
inline void for_half_tiles(int64_t n, Body&& body) {
  for (int64_t i0 = 0; i0 < n; i0 += kHalfTile) body(i0, std::min(kHalfTile, n - i0));
}

// Runs shorter than this are stored directly: a tile per 32-channel BatchNorm row doubled its
// backward, while 128-wide softmax rows gained (docs/PERF.md).
inline constexpr int64_t kMinTiledRun = 128;

// dst[i] = T(value(i)) for i in [0, n), value giving f32 (or the compute type): through an f32
// tile and the narrowing above where narrows_in_tiles_v<T> and the run is long enough, directly
// otherwise. The elements are independent (value(i) reads, never writes), so the loops are marked
// for vectorising.
template <class T, class Value>
inline void store_run(T* dst, int64_t n, Value&& value) {
  if constexpr (narrows_in_tiles_v<T>) {
    if (n >= kMinTiledRun) {
      for_half_tiles(n, [&](int64_t i0, int64_t m) {
        float t[kHalfTile];
#pragma omp simd
        for (int64_t i = 0; i < m; ++i) t[i] = static_cast<float>(value(i0 + i));
        narrow_to_halves(t, dst + i0, m);
      });
      return;
    }
  }
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    // A 16-bit float is stored as its bits: under `omp simd` a bf16 temporary becomes a per-lane
    // array whose struct copy stops the loop vectorising (scalar BatchNorm on 7x7 and 8x8 maps).
    if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
      dst[i].bits = T::from_float(static_cast<float>(value(i)));
    else
      dst[i] = static_cast<T>(value(i));
  }
}

}  // namespace ft::cpu
