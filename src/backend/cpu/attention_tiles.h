// f32 tile products of the attention kernels on AVX-512 (attention.cpp), for CPUs where
// selected_cpu_isa() >= Avx512; elsewhere the kernels keep dnnl_sgemm. And the same product on
// vdpbf16ps for two bf16 operands (product_bf16, CPUs with AVX512-BF16), whose right operand
// comes as pairs of rows side by side, because vdpbf16ps sums two products per lane.
//
// The tiles are small (64 x 64 x 64 to 64 x 128 x 64) and already in L1/L2, so a general GEMM's
// call overhead, argument checks and packing of both operands are a large part of each call.
// These products pack nothing per call: the right operand is read as dense rows of N floats (a
// key block of K^T, a tile of V, Q, dO or K; for product_bf16 a key block of K or V in row pairs,
// made once per (b, KV head) by attention.cpp), and the left one element (or bf16 pair) at a time
// as broadcasts, through two strides, so the f32 kernel reads A or A^T (P^T dO and dS^T Q need no
// transposed copy).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cpu/avx512_kernel.h"

namespace ft::cpu::attention_tiles {

namespace detail {

// p[0, 16) under mask m (+)= alpha * v.
FT_AVX512_KERNEL inline void put(float* p, __mmask16 m, __m512 v, __m512 alpha, bool accumulate) {
  const __m512 out = accumulate ? _mm512_fmadd_ps(v, alpha, _mm512_maskz_loadu_ps(m, p)) : _mm512_mul_ps(v, alpha);
  _mm512_mask_storeu_ps(p, m, out);
}

// One register block: MR rows of C by NV vectors of 16 columns (the last one masked by `tail`).
// The accumulators are named variables, not an array: GCC 12 kept an __m512 array of this size
// on the stack and stored all of it on every step of the depth loop, at half the FMA rate.
#define FT_ATTN_ACC_ROW(r) __m512 c##r##_0, c##r##_1, c##r##_2, c##r##_3;
#define FT_ATTN_FOR_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
// Per row r of a register block: its accumulators zeroed, and stored (times alpha) into C.
#define FT_ATTN_ZERO(r)                                              \
  if constexpr (MR > r) {                                            \
    c##r##_0 = c##r##_1 = c##r##_2 = c##r##_3 = _mm512_setzero_ps(); \
  }
#define FT_ATTN_STORE(r)                                              \
  if constexpr (MR > r) {                                             \
    float* cr = c + r * ldc;                                          \
    put(cr, m0, c##r##_0, al, accumulate);                            \
    if constexpr (NV > 1) put(cr + 16, m1, c##r##_1, al, accumulate); \
    if constexpr (NV > 2) put(cr + 32, m2, c##r##_2, al, accumulate); \
    if constexpr (NV > 3) put(cr + 48, m3, c##r##_3, al, accumulate); \
  }
// A block's accumulators zeroed and its column masks (m0..m3, the last vector's by `tail`); at
// the end, its rows stored into C times alpha.
#define FT_ATTN_BLOCK_BEGIN                                                                           \
  static_assert(MR >= 1 && MR <= 16 && NV >= 1 && NV <= 4);                                           \
  FT_ATTN_FOR_ROWS(FT_ATTN_ACC_ROW)                                                                   \
  FT_ATTN_FOR_ROWS(FT_ATTN_ZERO)                                                                      \
  const __mmask16 full = 0xFFFF;                                                                      \
  const __mmask16 m0 = NV == 1 ? tail : full, m1 = NV == 2 ? tail : full, m2 = NV == 3 ? tail : full, \
                  m3 = NV == 4 ? tail : full;
#define FT_ATTN_BLOCK_END                  \
  const __m512 al = _mm512_set1_ps(alpha); \
  FT_ATTN_FOR_ROWS(FT_ATTN_STORE)
// B's vectors of one depth step pinned in registers (an empty asm that "changes" them): see block().
#define FT_ATTN_HOLD_B                                                           \
  do {                                                                           \
    if constexpr (NV == 1) __asm__("" : "+v"(b0));                               \
    if constexpr (NV == 2) __asm__("" : "+v"(b0), "+v"(b1));                     \
    if constexpr (NV == 3) __asm__("" : "+v"(b0), "+v"(b1), "+v"(b2));           \
    if constexpr (NV == 4) __asm__("" : "+v"(b0), "+v"(b1), "+v"(b2), "+v"(b3)); \
  } while (0)
template <int MR, int NV>
FT_AVX512_KERNEL inline void block(int64_t K, float alpha, const float* a, int64_t sam, int64_t sak, const float* b,
                                   int64_t ldb, bool accumulate, float* c, int64_t ldc, __mmask16 tail) {
  FT_ATTN_BLOCK_BEGIN
  for (int64_t k = 0; k < K; ++k) {
    const float* bk = b + k * ldb;
    __m512 b0, b1, b2, b3;
    b0 = _mm512_maskz_loadu_ps(m0, bk);
    if constexpr (NV > 1) b1 = _mm512_maskz_loadu_ps(m1, bk + 16);
    if constexpr (NV > 2) b2 = _mm512_maskz_loadu_ps(m2, bk + 32);
    if constexpr (NV > 3) b3 = _mm512_maskz_loadu_ps(m3, bk + 48);
    // B in registers, loaded once per k: left to itself GCC folded these loads into every row's
    // FMA where it could (MR loads of each vector per k instead of one), and on Zen 5 block<4, 4>
    // then ran at 40% of block<5, 4>'s rate, which kept B in registers (docs/PERF.md).
    FT_ATTN_HOLD_B;
    const float* ak = a + k * sak;
#define FT_ATTN_FMA(r)                                                  \
  if constexpr (MR > r) {                                               \
    const __m512 av = _mm512_set1_ps(ak[r * sam]);                      \
    c##r##_0 = _mm512_fmadd_ps(av, b0, c##r##_0);                       \
    if constexpr (NV > 1) c##r##_1 = _mm512_fmadd_ps(av, b1, c##r##_1); \
    if constexpr (NV > 2) c##r##_2 = _mm512_fmadd_ps(av, b2, c##r##_2); \
    if constexpr (NV > 3) c##r##_3 = _mm512_fmadd_ps(av, b3, c##r##_3); \
  }
    FT_ATTN_FOR_ROWS(FT_ATTN_FMA)
#undef FT_ATTN_FMA
  }
  FT_ATTN_BLOCK_END
}

// Two consecutive bf16 values as one 32-bit word (the first in the low half).
inline uint32_t load_u32(const uint16_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The same register block on vdpbf16ps (AVX512-BF16), for product_bf16: A's rows are bf16 (bits),
// read two depth steps at a time as one 32-bit broadcast, and B holds pairs of depth rows, word
// n of pair row p being (B[2p][n], B[2p+1][n]) in its low and high halves. vdpbf16ps multiplies
// the two halves lane by lane and adds both products to the f32 sum: bf16 products are exact in
// f32, so this is the f32 kernel's sum on bf16 operands, with half the instructions.
template <int MR, int NV>
FT_BF16_KERNEL inline void block_bf16(int64_t K, float alpha, const uint16_t* a, int64_t lda, const uint32_t* b,
                                      int64_t ldb, bool accumulate, float* c, int64_t ldc, __mmask16 tail) {
  FT_ATTN_BLOCK_BEGIN
  // One depth pair: b0..b3 from pair row pk, each row's pair of A from PAIR(row pointer).
#define FT_ATTN_DOT(r)                                                                             \
  if constexpr (MR > r) {                                                                          \
    const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(FT_ATTN_PAIR(ak + r * lda))); \
    c##r##_0 = _mm512_dpbf16_ps(c##r##_0, av, (__m512bh)b0);                                       \
    if constexpr (NV > 1) c##r##_1 = _mm512_dpbf16_ps(c##r##_1, av, (__m512bh)b1);                 \
    if constexpr (NV > 2) c##r##_2 = _mm512_dpbf16_ps(c##r##_2, av, (__m512bh)b2);                 \
    if constexpr (NV > 3) c##r##_3 = _mm512_dpbf16_ps(c##r##_3, av, (__m512bh)b3);                 \
  }
#define FT_ATTN_PAIR_STEP(pk)                                                        \
  do {                                                                               \
    const uint32_t* bk = b + (pk)*ldb;                                               \
    __m512i b0, b1, b2, b3;                                                          \
    b0 = _mm512_maskz_loadu_epi32(m0, bk);                                           \
    if constexpr (NV > 1) b1 = _mm512_maskz_loadu_epi32(m1, bk + 16);                \
    if constexpr (NV > 2) b2 = _mm512_maskz_loadu_epi32(m2, bk + 32);                \
    if constexpr (NV > 3) b3 = _mm512_maskz_loadu_epi32(m3, bk + 48);                \
    FT_ATTN_HOLD_B; /* as in block(): one load per pair row, not one per row of C */ \
    const uint16_t* ak = a + 2 * (pk);                                               \
    FT_ATTN_FOR_ROWS(FT_ATTN_DOT)                                                    \
  } while (0)
  const int64_t pairs = K / 2;
#define FT_ATTN_PAIR(p) load_u32(p)
  for (int64_t pk = 0; pk < pairs; ++pk) FT_ATTN_PAIR_STEP(pk);
#undef FT_ATTN_PAIR
#define FT_ATTN_PAIR(p) static_cast<uint32_t>(*(p))
  // An odd depth's last step: A's row may end at its last value, whose partner is zero (as is
  // the high half of B's last pair row).
  if (K % 2 == 1) FT_ATTN_PAIR_STEP(pairs);
#undef FT_ATTN_PAIR
#undef FT_ATTN_PAIR_STEP
#undef FT_ATTN_DOT
  FT_ATTN_BLOCK_END
}
#undef FT_ATTN_BLOCK_BEGIN
#undef FT_ATTN_HOLD_B
#undef FT_ATTN_BLOCK_END
#undef FT_ATTN_ZERO
#undef FT_ATTN_STORE
#undef FT_ATTN_ACC_ROW
#undef FT_ATTN_FOR_ROWS

// The operands of block() and block_bf16() for one column panel; run<MR, NV>(m) multiplies the
// MR rows of C from row m.
struct F32Operands {
  int64_t K;
  float alpha;
  const float* a;
  int64_t sam, sak;
  const float* b;
  int64_t ldb;
  bool accumulate;
  float* c;
  int64_t ldc;
  __mmask16 tail;
  template <int MR, int NV>
  FT_AVX512_KERNEL void run(int64_t m) const {
    block<MR, NV>(K, alpha, a + m * sam, sam, sak, b, ldb, accumulate, c + m * ldc, ldc, tail);
  }
};
struct Bf16Operands {
  int64_t K;
  float alpha;
  const uint16_t* a;
  int64_t lda;
  const uint32_t* b;
  int64_t ldb;
  bool accumulate;
  float* c;
  int64_t ldc;
  __mmask16 tail;
  template <int MR, int NV>
  FT_BF16_KERNEL void run(int64_t m) const {
    block_bf16<MR, NV>(K, alpha, a + m * lda, lda, b, ldb, accumulate, c + m * ldc, ldc, tail);
  }
};

// Rows of C in blocks of MR (MR x NV accumulators: 24, or 16 for one vector), the last block smaller.
template <int NV, class Operands>
inline void rows(int64_t M, const Operands& ops) {
  constexpr int MR = NV == 4 ? 6 : NV == 3 ? 8 : NV == 2 ? 12 : 16;
  int64_t m = 0;
  for (; m + MR <= M; m += MR) ops.template run<MR, NV>(m);
  // The remainder, in one block of its own height (MR - 1 at most).
  switch (M - m) {
#define FT_ATTN_TAIL(R)                               \
  case R:                                             \
    if constexpr (R < MR) ops.template run<R, NV>(m); \
    break;
    FT_ATTN_TAIL(1)
    FT_ATTN_TAIL(2)
    FT_ATTN_TAIL(3)
    FT_ATTN_TAIL(4)
    FT_ATTN_TAIL(5)
    FT_ATTN_TAIL(6)
    FT_ATTN_TAIL(7)
    FT_ATTN_TAIL(8)
    FT_ATTN_TAIL(9)
    FT_ATTN_TAIL(10)
    FT_ATTN_TAIL(11)
    FT_ATTN_TAIL(12)
    FT_ATTN_TAIL(13)
    FT_ATTN_TAIL(14)
    FT_ATTN_TAIL(15)
#undef FT_ATTN_TAIL
    default: break;
  }
}

// Columns in panels of up to 64 (four vectors): C's rows of one panel stay in registers over the
// whole depth, and A is read once per panel. panel(n0, tail) gives the operands of the panel at
// column n0 (tail masks its last vector).
template <class Panel>
inline void column_panels(int64_t M, int64_t N, const Panel& panel) {
  if (M <= 0 || N <= 0) return;
  for (int64_t n0 = 0; n0 < N; n0 += 64) {
    const int64_t n = std::min<int64_t>(64, N - n0);
    const int nv = static_cast<int>((n + 15) / 16);
    const int rem = static_cast<int>(n - 16 * (nv - 1));
    const auto ops = panel(n0, static_cast<__mmask16>((1u << rem) - 1));
    switch (nv) {
      case 1: rows<1>(M, ops); break;
      case 2: rows<2>(M, ops); break;
      case 3: rows<3>(M, ops); break;
      default: rows<4>(M, ops); break;
    }
  }
}

}  // namespace detail

// C[M, N] (+)= alpha * A' B with A'(m, k) = a[m * sam + k * sak] (sam = lda, sak = 1 for A;
// sam = 1, sak = lda for A^T), B [K, N] dense rows with leading dimension ldb, C with ldc.
// Accumulates into C when `accumulate`, otherwise overwrites it. Any M, N, K >= 0.
FT_AVX512_KERNEL inline void product(int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t sam,
                                     int64_t sak, const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  detail::column_panels(M, N, [&](int64_t n0, __mmask16 tail) {
    return detail::F32Operands{K, alpha, a, sam, sak, b + n0, ldb, accumulate, c + n0, ldc, tail};
  });
}

// The same on vdpbf16ps (CPUs with AVX512-BF16) for bf16 operands, whose products are exact in
// f32: A [M, K] bf16 rows (their bits; leading dimension lda), B given as pair rows, word n of
// pair row p (leading dimension ldb, in words) holding (B[2p][n], B[2p + 1][n]) in its low and
// high halves for p < ceil(K / 2), the high halves of the last zero when K is odd.
FT_BF16_KERNEL inline void product_bf16(int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* a, int64_t lda,
                                        const uint32_t* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  detail::column_panels(M, N, [&](int64_t n0, __mmask16 tail) {
    return detail::Bf16Operands{K, alpha, a, lda, b + n0, ldb, accumulate, c + n0, ldc, tail};
  });
}

// The softmax passes over a score row, on 16 lanes (GCC vectorises the generic loops to 8 lanes
// under this build's tuning, and they took as long as the products).

// fast_exp (fast_exp.h) on 16 lanes: the same reduction and polynomial, with 2^n applied by
// vscalefps, which also gives inf past the top of the range (so only the top needs a clamp, for
// the rounding trick); below -87.3 the result is exactly 0, as in fast_exp (never a subnormal,
// which would slow the products that read it), and NaN propagates.
FT_AVX512_KERNEL inline __m512 exp16(__m512 x) {
  // min(c, x) returns x when x is NaN.
  const __m512 xc = _mm512_min_ps(_mm512_set1_ps(100.0f), x);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(12582912.0f)),
                                 _mm512_set1_ps(12582912.0f));
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  // Lanes with x < -87.3 (-inf included, whose n and r are infinite and NaN) are zeroed; NaN
  // compares unordered and is kept.
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_NLT_UQ);
  return _mm512_maskz_scalef_ps(keep, y, n);
}

inline __mmask16 first_lanes(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }

// Sum and maximum of the 16 lanes. The shuffles are the masked forms with every lane selected:
// the plain intrinsics (and _mm512_reduce_add_ps / _mm512_reduce_max_ps, built on them) start
// from an undefined register in GCC 12, which warns (-Wuninitialized) where the file is not built
// for AVX-512 as a whole.
FT_AVX512_KERNEL inline __m512 swap_halves(__m512 v) { return _mm512_mask_shuffle_f32x4(v, 0xFFFF, v, v, 0x4E); }
FT_AVX512_KERNEL inline __m512 swap_quarters(__m512 v) { return _mm512_mask_shuffle_f32x4(v, 0xFFFF, v, v, 0xB1); }
FT_AVX512_KERNEL inline __m512 swap_pairs(__m512 v) { return _mm512_mask_permute_ps(v, 0xFFFF, v, 0x4E); }
FT_AVX512_KERNEL inline __m512 swap_lanes(__m512 v) { return _mm512_mask_permute_ps(v, 0xFFFF, v, 0xB1); }
FT_AVX512_KERNEL inline float lanes_add(__m512 v) {
  v = _mm512_add_ps(v, swap_halves(v));
  v = _mm512_add_ps(v, swap_quarters(v));
  v = _mm512_add_ps(v, swap_pairs(v));
  v = _mm512_add_ps(v, swap_lanes(v));
  return _mm512_cvtss_f32(v);
}
FT_AVX512_KERNEL inline float lanes_max(__m512 v) {
  v = _mm512_max_ps(v, swap_halves(v));
  v = _mm512_max_ps(v, swap_quarters(v));
  v = _mm512_max_ps(v, swap_pairs(v));
  v = _mm512_max_ps(v, swap_lanes(v));
  return _mm512_cvtss_f32(v);
}

// max of x[0, n) (-inf when n == 0).
FT_AVX512_KERNEL inline float row_max(const float* x, int64_t n) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  __m512 m0 = ninf, m1 = ninf;
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + j));
    m1 = _mm512_max_ps(m1, _mm512_loadu_ps(x + j + 16));
  }
  for (; j < n; j += 16)
    m0 = _mm512_max_ps(m0, _mm512_mask_loadu_ps(ninf, first_lanes(std::min<int64_t>(16, n - j)), x + j));
  return lanes_max(_mm512_max_ps(m0, m1));
}

// x[j] = exp(x[j] * mul + add) for j in [0, n); returns the sum of the results.
FT_AVX512_KERNEL inline float exp_affine_sum(float* x, int64_t n, float mul, float add) {
  const __m512 vm = _mm512_set1_ps(mul), va = _mm512_set1_ps(add);
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    const __m512 e0 = exp16(_mm512_fmadd_ps(_mm512_loadu_ps(x + j), vm, va));
    const __m512 e1 = exp16(_mm512_fmadd_ps(_mm512_loadu_ps(x + j + 16), vm, va));
    _mm512_storeu_ps(x + j, e0);
    _mm512_storeu_ps(x + j + 16, e1);
    s0 = _mm512_add_ps(s0, e0);
    s1 = _mm512_add_ps(s1, e1);
  }
  for (; j < n; j += 16) {
    const __mmask16 m = first_lanes(std::min<int64_t>(16, n - j));
    const __m512 e = exp16(_mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + j), vm, va));
    _mm512_mask_storeu_ps(x + j, m, e);
    s0 = _mm512_add_ps(s0, _mm512_maskz_mov_ps(m, e));
  }
  return lanes_add(_mm512_add_ps(s0, s1));
}

// The forward's online-softmax step for one score tile, rows [0, nq) of s (leading dimension
// lds) over keys [0, nk), masked entries already -inf: with m[r] the row's running maximum and
// lanes[16 r, 16 r + 16) its running sum of exponentials kept as 16 partial sums (added up once,
// at the end, by lanes_sum), each row becomes exp(s - m') with m' = max(m, rowmax s), its
// partial sums lanes * exp(m - m') + that row's, and row r of acc (leading dimension D)
// is scaled by exp(m - m'). A row whose maximum is still -inf (nothing visible yet) is zeroed and
// left otherwise alone. The per-row rescale factors are computed 16 rows at a time and applied
// without a branch: per-row scalar exponentials and mispredicted "did the maximum move" tests
// cost as much as the exponentials of the tile.
FT_AVX512_KERNEL inline void online_softmax_tile(float* s, int64_t lds, int64_t nq, int64_t nk, float* m, float* lanes,
                                                 float* acc, int64_t D) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  for (int64_t r0 = 0; r0 < nq; r0 += 16) {
    const int64_t rows = std::min<int64_t>(16, nq - r0);
    const __mmask16 rm = first_lanes(rows);
    alignas(64) float mnew[16], alpha[16];
    std::fill(mnew + rows, mnew + 16, -INFINITY);  // lanes past the last row: defined, unused
    for (int64_t i = 0; i < rows; ++i) mnew[i] = std::max(m[r0 + i], row_max(s + (r0 + i) * lds, nk));
    const __m512 vold = _mm512_mask_loadu_ps(ninf, rm, m + r0), vnew = _mm512_load_ps(mnew);
    const __mmask16 none = _mm512_cmp_ps_mask(vnew, ninf, _CMP_EQ_OQ);
    _mm512_store_ps(alpha, _mm512_mask_blend_ps(none, exp16(_mm512_sub_ps(vold, vnew)), _mm512_set1_ps(1.0f)));
    _mm512_mask_storeu_ps(m + r0, rm, vnew);
    for (int64_t i = 0; i < rows; ++i) {
      float* row = s + (r0 + i) * lds;
      if (mnew[i] == -INFINITY) {
        for (int64_t j = 0; j < nk; j += 16)
          _mm512_mask_storeu_ps(row + j, first_lanes(std::min<int64_t>(16, nk - j)), _mm512_setzero_ps());
        continue;
      }
      const __m512 shift = _mm512_set1_ps(-mnew[i]), a = _mm512_set1_ps(alpha[i]);
      __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
      int64_t j = 0;
      for (; j + 32 <= nk; j += 32) {
        const __m512 e0 = exp16(_mm512_add_ps(_mm512_loadu_ps(row + j), shift));
        const __m512 e1 = exp16(_mm512_add_ps(_mm512_loadu_ps(row + j + 16), shift));
        _mm512_storeu_ps(row + j, e0);
        _mm512_storeu_ps(row + j + 16, e1);
        s0 = _mm512_add_ps(s0, e0);
        s1 = _mm512_add_ps(s1, e1);
      }
      for (; j < nk; j += 16) {
        const __mmask16 mk = first_lanes(std::min<int64_t>(16, nk - j));
        const __m512 e = exp16(_mm512_add_ps(_mm512_maskz_loadu_ps(mk, row + j), shift));
        _mm512_mask_storeu_ps(row + j, mk, e);
        s0 = _mm512_add_ps(s0, _mm512_maskz_mov_ps(mk, e));
      }
      float* lr = lanes + (r0 + i) * 16;
      _mm512_storeu_ps(lr, _mm512_fmadd_ps(_mm512_loadu_ps(lr), a, _mm512_add_ps(s0, s1)));
      float* ar = acc + (r0 + i) * D;
      for (int64_t d = 0; d < D; d += 16) {
        const __mmask16 mk = first_lanes(std::min<int64_t>(16, D - d));
        _mm512_mask_storeu_ps(ar + d, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, ar + d), a));
      }
    }
  }
}

// The sum of 16 partial sums (online_softmax_tile's lanes of one row).
FT_AVX512_KERNEL inline float lanes_sum(const float* lanes) { return lanes_add(_mm512_loadu_ps(lanes)); }

// ds[j] = p[j] * (ds[j] - di) for j in [0, n): the softmax backward without dropout.
FT_AVX512_KERNEL inline void softmax_grad_row(float* ds, const float* p, int64_t n, float di) {
  const __m512 vd = _mm512_set1_ps(di);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = first_lanes(std::min<int64_t>(16, n - j));
    const __m512 g = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, ds + j), vd);
    _mm512_mask_storeu_ps(ds + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p + j), g));
  }
}

}  // namespace ft::cpu::attention_tiles
