// Operands of vdpbf16ps, which sums products two at a time: helpers that put two rows of bf16
// values (two images, two Winograd tiles) side by side as pairs, and take 32 channels in either
// channel layout (conv_weight_grad.h's ChannelBlockedLayout). For the kernels of
// conv_weight_grad.cpp and conv_winograd.cpp; include after avx512_kernel.h.
#pragma once
#include <cstdint>

#include "backend/cpu/avx512_kernel.h"

namespace ft::cpu {

// vpermt2w indices taking word j of the first source to word 2j and word j of the second to
// word 2j + 1: sixteen (row a, row b) pairs.
alignas(64) inline constexpr uint16_t kPairIndex[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                        8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
FT_AVX512_KERNEL inline __m512i pair_indices() { return _mm512_load_si512(kPairIndex); }

// Sixteen values of a and of b as (a[j], b[j]) pairs.
FT_AVX512_KERNEL inline __m512i pair_up(const uint16_t* a, const uint16_t* b, __m512i idx) {
  const __m512i va = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
  const __m512i vb = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
  return _mm512_permutex2var_epi16(va, idx, vb);
}

// 32 channels of one position: one load where they are consecutive (NHWC), two 16-channel blocks
// otherwise (nChw16c).
FT_AVX512_KERNEL inline __m512i load_32_channels(const uint16_t* p, int64_t block_stride) {
  if (block_stride == 16) return _mm512_loadu_si512(p);
  const __m512i low = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_inserti64x4(low, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + block_stride)), 1);
}

// Sums of the in-lane pair order that vpunpcklwd / vpunpckhwd of two 32-channel vectors leave
// (vector 0: channels 0-3, 8-11, 16-19, 24-27 by 128-bit lane; vector 1: 4-7, 12-15, 20-23,
// 28-31) put back in channel order: lanes (v0 0, v1 0, v0 1, v1 1) hold channels 0-15, lanes
// (v0 2, v1 2, v0 3, v1 3) channels 16-31.
alignas(64) inline constexpr int32_t kRestoreLow[16] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23};
alignas(64) inline constexpr int32_t kRestoreHigh[16] = {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};
FT_AVX512_KERNEL inline void restore_channel_order(__m512& v0, __m512& v1) {
  const __m512 low = _mm512_permutex2var_ps(v0, _mm512_load_si512(kRestoreLow), v1);
  v1 = _mm512_permutex2var_ps(v0, _mm512_load_si512(kRestoreHigh), v1);
  v0 = low;
}

}  // namespace ft::cpu
