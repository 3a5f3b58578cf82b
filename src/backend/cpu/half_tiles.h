// Dense runs of IEEE halves (f16) widened to f32 and narrowed back eight at a time with F16C.
// The CPU has no f16 arithmetic the kernels use, and a loop converting one element per call
// (even one instruction each) does not vectorise: GCC 12 leaves _Float16 conversions scalar. So
// elementwise loops over f16 work in tiles — widen, run the op on f32 (which vectorises), narrow.
// Rounding is the same nearest-even as f16::from_float, so results do not depend on the path.
#pragma once
#include <algorithm>
#include <cstdint>

#if defined(__F16C__)
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

// Calls body(offset, count) over [0, n) in tiles of at most kHalfTile.
template <class Body>
inline void for_half_tiles(int64_t n, Body&& body) {
  for (int64_t i0 = 0; i0 < n; i0 += kHalfTile) body(i0, std::min(kHalfTile, n - i0));
}

}  // namespace ft::cpu
