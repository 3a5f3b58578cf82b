#include "backend/cpu/gemm_bf16.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>
#include <vector>

#include "fasttrain/error.h"
#include "fasttrain/parallel.h"

namespace ft::cpu {

namespace {

#define FT_BF16_KERNEL __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// Register tile: kMR rows x kNR columns = 14 x 2 zmm accumulators (28 of 32 zmm; the rest hold
// the two B vectors and the A broadcast).
constexpr int kMR = 14;
constexpr int kNR = 32;
// Rows of A per task block: kMC x K bf16 values stay in L2 while every column strip reuses them.
constexpr int64_t kMC = 8 * kMR;

// B[k, n] for k in [0, K), n in [n0, n0 + kNR) as [kp][kNR][2]; zero beyond K or N.
void pack_b_strip(const GemmBf16Args& g, int64_t n0, int64_t kp, uint16_t* dst) {
  const int64_t nc = std::min<int64_t>(kNR, g.N - n0);
  const uint16_t* b = g.b + n0 * g.b_cs;
  for (int64_t p = 0; p < kp; ++p) {
    uint16_t* d = dst + p * 2 * kNR;
    const int64_t k = 2 * p;
    const uint16_t* r0 = b + k * g.b_rs;
    const uint16_t* r1 = r0 + g.b_rs;
    const bool has1 = k + 1 < g.K;
    for (int64_t n = 0; n < nc; ++n) {
      d[2 * n] = r0[n * g.b_cs];
      d[2 * n + 1] = has1 ? r1[n * g.b_cs] : uint16_t(0);
    }
    for (int64_t n = nc; n < kNR; ++n) d[2 * n] = d[2 * n + 1] = 0;
  }
}

// A[m, k] for m in [m0, m0 + rows) (rows <= kMR) as [kp][kMR][2]; zero beyond K or rows.
void pack_a_strip(const GemmBf16Args& g, int64_t m0, int64_t rows, int64_t kp, uint16_t* dst) {
  const uint16_t* a = g.a + m0 * g.a_rs;
  if (g.a_cs == 1 && g.K % 2 == 0) {  // row-major A: each k pair is one 32-bit word
    for (int64_t p = 0; p < kp; ++p) {
      uint32_t* d = reinterpret_cast<uint32_t*>(dst + p * 2 * kMR);
      for (int64_t r = 0; r < rows; ++r) std::memcpy(d + r, a + r * g.a_rs + 2 * p, 4);
      for (int64_t r = rows; r < kMR; ++r) d[r] = 0;
    }
    return;
  }
  for (int64_t p = 0; p < kp; ++p) {
    uint16_t* d = dst + p * 2 * kMR;
    const int64_t k = 2 * p;
    const bool has1 = k + 1 < g.K;
    for (int64_t r = 0; r < rows; ++r) {
      const uint16_t* row = a + r * g.a_rs + k * g.a_cs;
      d[2 * r] = row[0];
      d[2 * r + 1] = has1 ? row[g.a_cs] : uint16_t(0);
    }
    for (int64_t r = rows; r < kMR; ++r) d[2 * r] = d[2 * r + 1] = 0;
  }
}

FT_BF16_KERNEL inline __m512 load_bf16_as_f32(const uint16_t* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// C[m0 .. m0+R, n0 .. n0+cols) from packed A (R rows used) and one packed B strip, all of K.
template <int R>
FT_BF16_KERNEL void micro_kernel(const GemmBf16Args& g, int64_t kp, const uint16_t* ap, const uint16_t* bp,
                                 int64_t m0, int64_t n0, int64_t cols) {
  __m512 acc[R][2];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const int32_t* a32 = reinterpret_cast<const int32_t*>(ap);
  for (int64_t p = 0; p < kp; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + p * 2 * kNR);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + p * 2 * kNR + kNR);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(a32[p * kMR + r]);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
  }
  const __mmask16 m0k = cols >= 16 ? __mmask16(0xffff) : __mmask16((1u << cols) - 1);
  const __mmask16 m1k = cols >= 32 ? __mmask16(0xffff) : cols <= 16 ? __mmask16(0) : __mmask16((1u << (cols - 16)) - 1);
  const __mmask16 masks[2] = {m0k, m1k};
  __m512 bias[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  if (g.bias)
    for (int h = 0; h < 2; ++h) bias[h] = load_bf16_as_f32(g.bias + n0 + 16 * h, masks[h]);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    for (int h = 0; h < 2; ++h) {
      if (!masks[h]) continue;
      const int64_t off = (m0 + r) * g.ldc + n0 + 16 * h;
      __m512 v = acc[r][h];
      if (g.bias) v = _mm512_add_ps(v, bias[h]);
      if (g.c_bf16) {
        uint16_t* c = static_cast<uint16_t*>(g.c) + off;
        if (g.accumulate) v = _mm512_add_ps(load_bf16_as_f32(c, masks[h]), v);
        _mm256_mask_storeu_epi16(c, masks[h], (__m256i)_mm512_cvtneps_pbh(v));
      } else {
        float* c = static_cast<float*>(g.c) + off;
        if (g.accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(masks[h], c), v);
        _mm512_mask_storeu_ps(c, masks[h], v);
      }
    }
  }
}

using MicroKernel = void (*)(const GemmBf16Args&, int64_t, const uint16_t*, const uint16_t*, int64_t, int64_t, int64_t);

template <int... R>
constexpr std::array<MicroKernel, sizeof...(R)> kernel_table(std::integer_sequence<int, R...>) {
  return {&micro_kernel<R + 1>...};
}
// kKernels[r - 1] handles a tile of r rows.
constexpr auto kKernels = kernel_table(std::make_integer_sequence<int, kMR>{});

// Grows a per-thread buffer to n elements (64-byte aligned) and returns it; reused across calls,
// so a training step does not allocate.
uint16_t* scratch(std::vector<uint16_t>& buf, size_t n) {
  if (buf.size() < n + 32) buf.resize(n + 32);
  auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64) / 2;
}

}  // namespace

bool gemm_bf16_available() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  return ok;
}

void gemm_bf16(const GemmBf16Args& g) {
  FT_CHECK(gemm_bf16_available(), "gemm_bf16: expected a CPU with AVX512-BF16, found none");
  FT_CHECK(g.M >= 0 && g.N >= 0 && g.K >= 0, "gemm_bf16: expected non-negative sizes, found M=", g.M, " N=", g.N,
           " K=", g.K);
  FT_CHECK(g.c != nullptr || g.M * g.N == 0, "gemm_bf16: output pointer is null");
  FT_CHECK(g.M <= 1 || g.ldc >= g.N, "gemm_bf16: expected ldc >= N (", g.N, "), found ", g.ldc);
  FT_CHECK(!(g.accumulate && g.bias), "gemm_bf16: bias with accumulate is not supported");
  if (g.M == 0 || g.N == 0) return;
  FT_CHECK(g.K == 0 || (g.a != nullptr && g.b != nullptr), "gemm_bf16: operand pointer is null");

  const int64_t kp = (g.K + 1) / 2;
  const int64_t nstrips = (g.N + kNR - 1) / kNR;
  const int64_t bstrip = kp * 2 * kNR;  // elements per packed B strip
  thread_local std::vector<uint16_t> bbuf;
  uint16_t* bpack = scratch(bbuf, static_cast<size_t>(nstrips * bstrip));
  const int64_t pack_grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(bstrip, 1));
  parallel_for(0, nstrips, pack_grain, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) pack_b_strip(g, s * kNR, kp, bpack + s * bstrip);
  });

  // Tasks are (row block, column block) pairs. Column blocks only when there are too few row
  // blocks to keep every thread busy (each column block repacks its rows of A).
  const int64_t mblocks = (g.M + kMC - 1) / kMC;
  const int64_t threads = get_num_threads();
  int64_t nblocks = 1;
  if (mblocks < 4 * threads) nblocks = std::min<int64_t>(nstrips, (4 * threads + mblocks - 1) / mblocks);
  const int64_t strips_per_block = (nstrips + nblocks - 1) / nblocks;
  nblocks = (nstrips + strips_per_block - 1) / strips_per_block;
  const int64_t astrip = kp * 2 * kMR;
  // Enough multiply-adds per chunk that waking the pool pays off.
  const int64_t task_flops = std::min(kMC, g.M) * std::min(strips_per_block * kNR, g.N) * std::max<int64_t>(g.K, 1);
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 20) / task_flops);

  parallel_for(0, mblocks * nblocks, grain, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<uint16_t> abuf;
    uint16_t* apack = scratch(abuf, static_cast<size_t>((kMC / kMR) * astrip));
    int64_t packed_block = -1;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t mb = t / nblocks, nb = t % nblocks;
      const int64_t m_begin = mb * kMC, m_end = std::min(g.M, m_begin + kMC);
      if (packed_block != mb) {
        for (int64_t m = m_begin, i = 0; m < m_end; m += kMR, ++i)
          pack_a_strip(g, m, std::min<int64_t>(kMR, m_end - m), kp, apack + i * astrip);
        packed_block = mb;
      }
      const int64_t s_end = std::min(nstrips, (nb + 1) * strips_per_block);
      for (int64_t s = nb * strips_per_block; s < s_end; ++s) {
        const int64_t n0 = s * kNR, cols = std::min<int64_t>(kNR, g.N - n0);
        for (int64_t m = m_begin, i = 0; m < m_end; m += kMR, ++i) {
          const int64_t rows = std::min<int64_t>(kMR, m_end - m);
          kKernels[rows - 1](g, kp, apack + i * astrip, bpack + s * bstrip, m, n0, cols);
        }
      }
    }
  });
}

}  // namespace ft::cpu
