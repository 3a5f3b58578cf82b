#include "backend/cpu/gemm_half.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/cpu/avx512_kernel.h"
#include "fasttrain/dtype.h"
#include "fasttrain/error.h"
#include "fasttrain/parallel.h"

namespace ft::cpu {

namespace {

// Register tile: kMR rows x kNR columns = 14 x 2 zmm accumulators (28 of 32 zmm; the rest hold
// the two B vectors and the A broadcast).
constexpr int kMR = 14;
constexpr int kNR = 32;
// Row strips of A packed together: 8 x 14 rows x K values stay in L2 while every column strip
// reuses them.
constexpr int64_t kStripsPerBlock = 8;
// K per block (a multiple of 2 for the Dot pairs): a 256 x 32 f32 B strip is 32 KB (L1).
constexpr int64_t kKC = 256;

float bf16_value(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The two inner products. Each packs B into kNR-column strips and A into kMR-row strips, both
// zero-padded, `kStep` consecutive k per depth unit:
// - Dot: bf16 pairs (k, k+1) interleaved, [K/2][kNR][2] and [K/2][kMR][2]; vdpbf16ps.
// - Fma: values widened to f32 while packing, [K][kNR] and [K][kMR]; vfmadd231ps.
struct Dot {
  using T = uint16_t;
  static constexpr int kStep = 2;
  static T value(uint16_t b) { return b; }
};
struct Fma {
  using T = float;
  static constexpr int kStep = 1;
  static T value(uint16_t b) { return bf16_value(b); }
};
// IEEE halves: the same packing layout and micro-kernel. The widening is integer arithmetic and
// a select, which the packing loops vectorise (GCC leaves _Float16 conversions scalar): the
// exponent and mantissa moved into f32 position and scaled by 2^112 rebias normals and turn
// subnormals into normals exactly; infinities and NaNs keep an all-ones exponent.
struct FmaF16 : Fma {
  static T value(uint16_t b) {
    const uint32_t magnitude = b & 0x7fffu;
    float scaled;
    const uint32_t shifted = magnitude << 13;
    std::memcpy(&scaled, &shifted, 4);
    scaled *= 0x1p112f;
    uint32_t bits;
    std::memcpy(&bits, &scaled, 4);
    bits = magnitude >= 0x7c00u ? (shifted | 0x7f800000u) : bits;
    bits |= uint32_t(b & 0x8000u) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
};

// B[k, n] for k in [0, K), n in [n0, n0 + kNR) as [depth][kNR][kStep]; zero beyond K or N.
template <class V>
void pack_b_strip(const GemmHalfArgs& g, int64_t n0, int64_t depth, typename V::T* dst) {
  constexpr int S = V::kStep;
  const int64_t nc = std::min<int64_t>(kNR, g.N - n0);
  const uint16_t* b = g.b + n0 * g.b_cs;
  if (S == 1 && g.b_rs == 1) {
    // Transposed B (W^T in linear's forward): read each column contiguously.
    for (int64_t n = 0; n < nc; ++n) {
      const uint16_t* col = b + n * g.b_cs;
      for (int64_t k = 0; k < g.K; ++k) dst[k * kNR + n] = V::value(col[k]);
    }
    for (int64_t n = nc; n < kNR; ++n)
      for (int64_t k = 0; k < g.K; ++k) dst[k * kNR + n] = 0;
    return;
  }
  for (int64_t p = 0; p < depth; ++p) {
    typename V::T* d = dst + p * S * kNR;
    for (int s = 0; s < S; ++s) {
      const int64_t k = p * S + s;
      if (k >= g.K) {
        for (int64_t n = 0; n < kNR; ++n) d[S * n + s] = 0;
        continue;
      }
      const uint16_t* row = b + k * g.b_rs;
      for (int64_t n = 0; n < nc; ++n) d[S * n + s] = V::value(row[n * g.b_cs]);
      for (int64_t n = nc; n < kNR; ++n) d[S * n + s] = 0;
    }
  }
}

// A[m, k] for m in [m0, m0 + rows) (rows <= kMR), depth units [d0, d0 + depth) as
// [depth][kMR][kStep]; zero beyond K or rows.
template <class V>
void pack_a_strip(const GemmHalfArgs& g, int64_t m0, int64_t rows, int64_t d0, int64_t depth, typename V::T* dst) {
  constexpr int S = V::kStep;
  const uint16_t* a = g.a + m0 * g.a_rs;
  if (S == 1 && g.a_cs == 1 && d0 + depth <= g.K) {
    // Row-major A: read each row contiguously (the loads and widening vectorise).
    for (int64_t r = 0; r < rows; ++r) {
      const uint16_t* row = a + r * g.a_rs + d0;
      for (int64_t p = 0; p < depth; ++p) dst[p * kMR + r] = V::value(row[p]);
    }
    for (int64_t r = rows; r < kMR; ++r)
      for (int64_t p = 0; p < depth; ++p) dst[p * kMR + r] = 0;
    return;
  }
  for (int64_t p = 0; p < depth; ++p) {
    typename V::T* d = dst + p * S * kMR;
    for (int s = 0; s < S; ++s) {
      const int64_t k = (d0 + p) * S + s;
      for (int64_t r = 0; r < rows; ++r) d[S * r + s] = k < g.K ? V::value(a[r * g.a_rs + k * g.a_cs]) : 0;
      for (int64_t r = rows; r < kMR; ++r) d[S * r + s] = 0;
    }
  }
}

FT_AVX512_KERNEL inline __m512 load_half_as_f32(const uint16_t* p, __mmask16 m, HalfFormat format) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  if (format == HalfFormat::F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Nearest-even rounding to bf16, quiet NaNs kept (bf16::from_float's rule, 16 lanes).
FT_AVX512_KERNEL inline __m256i round_to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

// Nearest-even rounding to the output format (vcvtps2ph rounds as f16::from_float does).
FT_AVX512_KERNEL inline __m256i round_to_half(__m512 v, HalfFormat format) {
  if (format == HalfFormat::F16) return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return round_to_bf16(v);
}

// Writes the finished tile: bias, accumulation into C and the output rounding happen here, so
// C is read and written once.
template <int R>
FT_AVX512_KERNEL inline void store_tile(const GemmHalfArgs& g, __m512 (&acc)[R][2], int64_t m0, int64_t n0,
                                        int64_t cols) {
  const __mmask16 m0k = cols >= 16 ? __mmask16(0xffff) : __mmask16((1u << cols) - 1);
  const __mmask16 m1k = cols >= 32 ? __mmask16(0xffff) : cols <= 16 ? __mmask16(0) : __mmask16((1u << (cols - 16)) - 1);
  const __mmask16 masks[2] = {m0k, m1k};
  __m512 bias[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  if (g.bias)
    for (int h = 0; h < 2; ++h) bias[h] = load_half_as_f32(g.bias + n0 + 16 * h, masks[h], g.format);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    for (int h = 0; h < 2; ++h) {
      if (!masks[h]) continue;
      const int64_t off = (m0 + r) * g.ldc + n0 + 16 * h;
      __m512 v = acc[r][h];
      if (g.bias) v = _mm512_add_ps(v, bias[h]);
      if (g.c_half) {
        uint16_t* c = static_cast<uint16_t*>(g.c) + off;
        if (g.accumulate) v = _mm512_add_ps(load_half_as_f32(c, masks[h], g.format), v);
        _mm256_mask_storeu_epi16(c, masks[h], round_to_half(v, g.format));
      } else {
        float* c = static_cast<float*>(g.c) + off;
        if (g.accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(masks[h], c), v);
        _mm512_mask_storeu_ps(c, masks[h], v);
      }
    }
  }
}

// Where a micro-kernel's tile goes. K is split into blocks of kKC so one packed B strip stays in
// L1 while a group of row strips uses it; partial sums of the blocks before the last live in a
// per-thread f32 staging area (`partial`, row stride partial_ld), so C is still written once.
struct Tile {
  int64_t m0, n0, cols;
  float* partial;
  int64_t partial_ld;
  bool first, last;
};

template <int R>
FT_AVX512_KERNEL inline void load_partial(__m512 (&acc)[R][2], const Tile& t) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h)
      acc[r][h] = t.first ? _mm512_setzero_ps() : _mm512_loadu_ps(t.partial + r * t.partial_ld + 16 * h);
}

template <int R>
FT_AVX512_KERNEL inline void finish_tile(const GemmHalfArgs& g, __m512 (&acc)[R][2], const Tile& t) {
  if (t.last) {
    store_tile<R>(g, acc, t.m0, t.n0, t.cols);
    return;
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) _mm512_storeu_ps(t.partial + r * t.partial_ld + 16 * h, acc[r][h]);
}

// C[m0 .. m0+R, n0 .. n0+cols) from packed A (R rows used) and one packed B strip, one K block.
template <int R>
FT_BF16_KERNEL void dot_kernel(const GemmHalfArgs& g, int64_t depth, const uint16_t* ap, const uint16_t* bp,
                               const Tile& t) {
  __m512 acc[R][2];
  load_partial<R>(acc, t);
  const int32_t* a32 = reinterpret_cast<const int32_t*>(ap);
  for (int64_t p = 0; p < depth; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + p * 2 * kNR);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + p * 2 * kNR + kNR);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(a32[p * kMR + r]);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
  }
  finish_tile<R>(g, acc, t);
}

template <int R>
FT_AVX512_KERNEL void fma_kernel(const GemmHalfArgs& g, int64_t depth, const float* ap, const float* bp,
                                 const Tile& t) {
  __m512 acc[R][2];
  load_partial<R>(acc, t);
  for (int64_t k = 0; k < depth; ++k) {
    const __m512 b0 = _mm512_loadu_ps(bp + k * kNR);
    const __m512 b1 = _mm512_loadu_ps(bp + k * kNR + 16);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(ap[k * kMR + r]);
      acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
    }
  }
  finish_tile<R>(g, acc, t);
}

template <class T>
using MicroKernel = void (*)(const GemmHalfArgs&, int64_t, const T*, const T*, const Tile&);

// table[r - 1] handles a tile of r rows.
template <int... R>
constexpr std::array<MicroKernel<uint16_t>, sizeof...(R)> dot_table(std::integer_sequence<int, R...>) {
  return {&dot_kernel<R + 1>...};
}
template <int... R>
constexpr std::array<MicroKernel<float>, sizeof...(R)> fma_table(std::integer_sequence<int, R...>) {
  return {&fma_kernel<R + 1>...};
}
MicroKernel<uint16_t> kernel_for(Dot, int64_t rows) {
  static constexpr auto table = dot_table(std::make_integer_sequence<int, kMR>{});
  return table[rows - 1];
}
MicroKernel<float> kernel_for(Fma, int64_t rows) {  // FmaF16 too
  static constexpr auto table = fma_table(std::make_integer_sequence<int, kMR>{});
  return table[rows - 1];
}

// Grows a per-thread buffer to n elements (64-byte aligned) and returns it; reused across calls,
// so a training step does not allocate.
template <class T>
T* scratch(std::vector<T>& buf, size_t n) {
  constexpr size_t pad = 64 / sizeof(T);
  if (buf.size() < n + pad) buf.resize(n + pad);
  auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64) / sizeof(T);
}

template <class V>
void run_gemm(const GemmHalfArgs& g) {
  using T = typename V::T;
  constexpr int S = V::kStep;
  const int64_t depth = (g.K + S - 1) / S;
  const int64_t nstrips = (g.N + kNR - 1) / kNR;
  const int64_t bstrip = depth * S * kNR;  // elements per packed B strip
  thread_local std::vector<T> bbuf;
  T* bpack = scratch(bbuf, static_cast<size_t>(nstrips * bstrip));
  const int64_t pack_grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(bstrip, 1));
  parallel_for(0, nstrips, pack_grain, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) pack_b_strip<V>(g, s * kNR, depth, bpack + s * bstrip);
  });

  // Work items are (column block, group of up to kStripsPerBlock row strips). Threads take items
  // from a shared counter rather than fixed ranges, so on a busy machine a thread that is
  // descheduled does not hold the others up; which thread computes an item does not change its
  // values. Column blocks only when there are too few row groups to keep the threads busy
  // (each block repacks its A strips).
  const int64_t mstrips = (g.M + kMR - 1) / kMR;
  const int64_t groups = (mstrips + kStripsPerBlock - 1) / kStripsPerBlock;
  const int64_t threads = get_num_threads();
  const int64_t nblocks = std::min<int64_t>(nstrips, (4 * threads + groups - 1) / groups);
  const int64_t strips_per_block = (nstrips + nblocks - 1) / nblocks;
  const int64_t items = nblocks * groups;
  // About 2 MFLOP per thread at least, so small GEMMs do not pay for waking the pool.
  const int64_t flops = 2 * g.M * g.N * std::max<int64_t>(g.K, 1);
  const int64_t workers = std::clamp<int64_t>(flops >> 21, 1, std::min(threads, items));

  // Depth units per K block, and the staging area for partial sums when there are several.
  const int64_t kc = kKC / S, kblocks = std::max<int64_t>(1, (depth + kc - 1) / kc);  // K = 0: one empty block
  const int64_t block_cols = strips_per_block * kNR;
  std::atomic<int64_t> next{0};
  parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    thread_local std::vector<T> abuf;
    thread_local std::vector<float> pbuf;
    const int64_t astrip = std::min(kc, depth) * S * kMR;
    T* apack = scratch(abuf, static_cast<size_t>(kStripsPerBlock * astrip));
    float* partial = kblocks > 1 ? scratch(pbuf, static_cast<size_t>(kStripsPerBlock * kMR * block_cols)) : nullptr;
    for (int64_t item = next++; item < items; item = next++) {
      const int64_t nb = item / groups, first = (item % groups) * kStripsPerBlock;
      const int64_t count = std::min(kStripsPerBlock, mstrips - first);
      const int64_t s_begin = nb * strips_per_block, s_end = std::min(nstrips, s_begin + strips_per_block);
      for (int64_t kb = 0; kb < kblocks; ++kb) {
        const int64_t d0 = kb * kc, dn = std::min(kc, depth - d0);
        for (int64_t i = 0; i < count; ++i) {
          const int64_t m = (first + i) * kMR;
          pack_a_strip<V>(g, m, std::min<int64_t>(kMR, g.M - m), d0, dn, apack + i * astrip);
        }
        for (int64_t s = s_begin; s < s_end; ++s) {
          const int64_t n0 = s * kNR, cols = std::min<int64_t>(kNR, g.N - n0);
          for (int64_t i = 0; i < count; ++i) {
            const int64_t m = (first + i) * kMR, rows = std::min<int64_t>(kMR, g.M - m);
            const Tile tile{m,
                            n0,
                            cols,
                            partial ? partial + i * kMR * block_cols + (s - s_begin) * kNR : nullptr,
                            block_cols,
                            kb == 0,
                            kb == kblocks - 1};
            kernel_for(V{}, rows)(g, dn, apack + i * astrip, bpack + s * bstrip + d0 * S * kNR, tile);
          }
        }
      }
    }
  });
}

bool has_avx512() {
  static const bool ok =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return ok;
}

bool has_avx512_bf16() {
  static const bool ok = has_avx512() && __builtin_cpu_supports("avx512bf16");
  return ok;
}

}  // namespace

const char* gemm_half_kernel_name(GemmHalfKernel k) {
  switch (k) {
    case GemmHalfKernel::Auto: return "auto";
    case GemmHalfKernel::Dot: return "dot";
    case GemmHalfKernel::Fma: return "fma";
  }
  return "?";
}

bool gemm_half_available(GemmHalfKernel k) { return k == GemmHalfKernel::Dot ? has_avx512_bf16() : has_avx512(); }

void gemm_half(const GemmHalfArgs& g) {
  FT_CHECK(gemm_half_available(g.kernel), "gemm_half: the ", gemm_half_kernel_name(g.kernel),
           " kernel needs a CPU with AVX-512", g.kernel == GemmHalfKernel::Dot ? "-BF16" : "", ", found none");
  FT_CHECK(g.M >= 0 && g.N >= 0 && g.K >= 0, "gemm_half: expected non-negative sizes, found M=", g.M, " N=", g.N,
           " K=", g.K);
  FT_CHECK(g.c != nullptr || g.M * g.N == 0, "gemm_half: output pointer is null");
  FT_CHECK(g.M <= 1 || g.ldc >= g.N, "gemm_half: expected ldc >= N (", g.N, "), found ", g.ldc);
  FT_CHECK(!(g.accumulate && g.bias), "gemm_half: bias with accumulate is not supported");
  FT_CHECK(!(g.kernel == GemmHalfKernel::Dot && g.format == HalfFormat::F16),
           "gemm_half: the dot kernel takes bf16 operands, found f16 (use the fma kernel)");
  if (g.M == 0 || g.N == 0) return;
  FT_CHECK(g.K == 0 || (g.a != nullptr && g.b != nullptr), "gemm_half: operand pointer is null");
  if (g.kernel == GemmHalfKernel::Dot)
    run_gemm<Dot>(g);
  else if (g.format == HalfFormat::F16)
    run_gemm<FmaF16>(g);
  else
    run_gemm<Fma>(g);
}

}  // namespace ft::cpu
