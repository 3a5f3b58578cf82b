// NCHW <-> nChw16c transposes (block_transpose.h), one 16 x 16 (channel, position) tile at a time
// in AVX-512 registers.
//
// In both layouts the 16 channels of one block of one image occupy the same 16 * S elements (a
// "panel"): NCHW holds them channel by channel, nChw16c position by position. A panel is walked in
// tiles of 16 positions; positions past the last multiple of 16 (7x7 and 14x14 maps have them)
// are copied one element at a time.
//
// The register transpose: a tile of 16-bit elements fills 8 registers of 32 lanes, element
// e = 16 r + c (row r, column c) at register e / 32, lane e % 32. Read as bits, the address (5 lane
// bits low, 3 register bits high) starts equal to e = (r3 r2 r1 r0 c3 c2 c1 c0) and must end as
// 16 c + r = (c3 c2 c1 c0 r3 r2 r1 r0). Stage k pairs the registers whose indices differ in bit k
// and, with one two-source permute (vpermt2w) per output register, swaps that register bit with
// the lane bit that holds the column bit it must end up holding. After 3 stages the registers hold
// whole columns; the last stage also puts the lanes in their final order. The permute indices are
// derived once from these bit maps.
#include "backend/cpu/block_transpose.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "backend/cpu/avx512_kernel.h"
#include "backend/cpu/isa.h"
#include "fasttrain/error.h"
#include "fasttrain/parallel.h"

namespace ft::cpu {

namespace {

// Which element bit each address bit carries: element bits 0-3 are the column's, 4-7 the row's.
using BitMap = std::array<int, 8>;

int element_at(const BitMap& m, int address) {
  int e = 0;
  for (int a = 0; a < 8; ++a) e |= ((address >> a) & 1) << m[a];
  return e;
}
int address_of(const BitMap& m, int element) {
  int address = 0;
  for (int a = 0; a < 8; ++a) address |= ((element >> m[a]) & 1) << a;
  return address;
}

struct TilePlan {
  static constexpr int L = 32;  // lanes per register
  static constexpr int R = 8;   // registers per tile
  static constexpr int kLaneBits = 5;
  static constexpr int kStages = 3;
  static_assert(L == 1 << kLaneBits && R == 1 << kStages && L * R == 256, "a tile is 256 elements");
  // Per stage, the indices of the two outputs of a register pair: the one whose index has the
  // stage's bit clear, and the one with it set. Every pair of a stage uses the same two.
  alignas(64) uint16_t idx[kStages][2][L];

  TilePlan() {
    BitMap from{}, target{};
    for (int a = 0; a < 8; ++a) from[a] = a, target[a] = (a + 4) % 8;  // 16 r + c -> 16 c + r
    for (int k = 0; k < kStages; ++k) {
      const int reg_bit = kLaneBits + k;
      BitMap to = from;
      if (k + 1 == kStages) {
        to = target;
      } else {
        const int holder = int(std::find(from.begin(), from.end(), target[reg_bit]) - from.begin());
        std::swap(to[reg_bit], to[holder]);
      }
      for (int half = 0; half < 2; ++half) {
        const int out_reg = half << k;
        for (int lane = 0; lane < L; ++lane) {
          const int in = address_of(from, element_at(to, out_reg << kLaneBits | lane));
          const int in_reg = in >> kLaneBits;
          FT_CHECK(in_reg == 0 || in_reg == 1 << k, "block transpose: stage ", k, " reads outside its pair");
          idx[k][half][lane] = uint16_t((in & (L - 1)) + (in_reg ? L : 0));
        }
      }
      from = to;
    }
  }
};

FT_AVX512_KERNEL inline void transpose_tile(__m512i* v, const TilePlan& p) {
  constexpr int R = TilePlan::R;
#pragma GCC unroll 4
  for (int k = 0; k < TilePlan::kStages; ++k) {
    const __m512i i0 = _mm512_load_si512(p.idx[k][0]), i1 = _mm512_load_si512(p.idx[k][1]);
#pragma GCC unroll 16
    for (int a = 0; a < R; ++a) {
      if ((a >> k) & 1) continue;
      const int b = a | 1 << k;
      const __m512i low = _mm512_permutex2var_epi16(v[a], i0, v[b]);
      v[b] = _mm512_permutex2var_epi16(v[a], i1, v[b]);
      v[a] = low;
    }
  }
}

// Register j of a tile holds its rows 2j and 2j + 1 (32 bytes each).
FT_AVX512_KERNEL inline __m512i load_rows(const char* base, int j, int64_t row_bytes) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + 2 * j * row_bytes));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + (2 * j + 1) * row_bytes));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
FT_AVX512_KERNEL inline void store_rows(char* base, int j, int64_t row_bytes, __m512i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(base + 2 * j * row_bytes), _mm512_castsi512_si256(v));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(base + (2 * j + 1) * row_bytes), _mm512_extracti64x4_epi64(v, 1));
}

// One panel of 16 channels: the planar side is [16][S] (NCHW), the blocked side [S][16].
template <bool kToBlocked>
FT_AVX512_KERNEL void transpose_panel(const char* in, char* out, int64_t S, const TilePlan& p) {
  constexpr int R = TilePlan::R, EB = 2;
  const int64_t row_bytes = S * EB;  // between channels on the planar side
  int64_t s = 0;
  for (; s + 16 <= S; s += 16) {
    __m512i v[R];
    if constexpr (kToBlocked) {
      for (int j = 0; j < R; ++j) v[j] = load_rows(in + s * EB, j, row_bytes);
      transpose_tile(v, p);
      for (int j = 0; j < R; ++j) _mm512_storeu_si512(out + s * 16 * EB + 64 * j, v[j]);
    } else {
      for (int j = 0; j < R; ++j) v[j] = _mm512_loadu_si512(in + s * 16 * EB + 64 * j);
      transpose_tile(v, p);
      for (int j = 0; j < R; ++j) store_rows(out + s * EB, j, row_bytes, v[j]);
    }
  }
  for (; s < S; ++s)
    for (int c = 0; c < 16; ++c) {
      const int64_t planar = c * row_bytes + s * EB, blocked = (s * 16 + c) * EB;
      std::memcpy(out + (kToBlocked ? blocked : planar), in + (kToBlocked ? planar : blocked), EB);
    }
}

template <bool kToBlocked>
void transpose(const void* in, void* out, int64_t N, int64_t C, int64_t S) {
  FT_CHECK(C % 16 == 0, "block transpose: expected a multiple of 16 channels, found ", C);
  FT_CHECK(block_transpose_available(), "block transpose: this CPU lacks AVX-512");
  static const TilePlan plan;
  const int64_t panel_bytes = 16 * S * 2;  // the same range of bytes in both layouts
  const auto* src = static_cast<const char*>(in);
  auto* dst = static_cast<char*>(out);
  // Chunks of at least 64 KiB: below that, waking a second thread costs more than it saves.
  const int64_t grain = std::max<int64_t>(1, (int64_t(64) << 10) / panel_bytes);
  parallel_for(0, N * (C / 16), grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      transpose_panel<kToBlocked>(src + i * panel_bytes, dst + i * panel_bytes, S, plan);
  });
}

}  // namespace

bool block_transpose_available() { return selected_cpu_isa() >= CpuIsa::Avx512; }

void nchw_to_blocked16(const void* x, void* y, int64_t N, int64_t C, int64_t S) { transpose<true>(x, y, N, C, S); }

void blocked16_to_nchw(const void* y, void* x, int64_t N, int64_t C, int64_t S) { transpose<false>(y, x, N, C, S); }

}  // namespace ft::cpu
