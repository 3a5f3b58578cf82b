// Dropout kernels; see dropout.h for the counter layout that keeps masks thread-count independent.
#include "backend/cpu/dropout.h"

#include <cmath>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "backend/cpu/dispatch.h"
#include "backend/cpu/half_tiles.h"
#include "fasttrain/parallel.h"
#include "fasttrain/random.h"

namespace ft::cpu {

namespace {

constexpr int kLanes = 8;  // counter blocks per Philox call: one AVX2 register of 32-bit words

// Philox-4x32-10 on kGroups * kLanes consecutive counters from ctr0 (high counter word 0),
// bit-identical to philox4x32(), written in element order: out[4 * j + w] is word w of counter
// ctr0 + j, i.e. the word of element 4 * (ctr0 - base) + 4 * j + w.
#if defined(__AVX2__)
// The 32x32->64-bit products use vpmuludq, which multiplies the even lanes; the odd lanes go
// through a second multiply after a 32-bit shift, and blends reassemble the high/low halves.
inline void mul_hilo(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
  const __m256i pe = _mm256_mul_epu32(a, m);                         // lanes 0,2,4,6 as u64
  const __m256i po = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);  // lanes 1,3,5,7 as u64
  hi = _mm256_blend_epi32(_mm256_srli_epi64(pe, 32), po, 0xAA);
  lo = _mm256_blend_epi32(pe, _mm256_slli_epi64(po, 32), 0xAA);
}

// kGroups independent groups of 8 counters are interleaved: one round's multiply -> blend ->
// xor chain is latency-bound, and four chains keep the vector units busy.
constexpr int kGroups = 4;

inline void philox_lanes(uint64_t key, uint64_t ctr0, uint32_t* out) {
  alignas(32) uint32_t lo[kGroups * kLanes], hi[kGroups * kLanes];
  for (int j = 0; j < kGroups * kLanes; ++j) {
    const uint64_t c = ctr0 + static_cast<uint64_t>(j);
    lo[j] = static_cast<uint32_t>(c);
    hi[j] = static_cast<uint32_t>(c >> 32);
  }
  __m256i c0[kGroups], c1[kGroups], c2[kGroups], c3[kGroups];
  for (int g = 0; g < kGroups; ++g) {
    c0[g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo + g * kLanes));
    c1[g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi + g * kLanes));
    c2[g] = _mm256_setzero_si256();
    c3[g] = _mm256_setzero_si256();
  }
  const __m256i M0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m256i M1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const __m256i K0 = _mm256_set1_epi32(static_cast<int>(k0)), K1 = _mm256_set1_epi32(static_cast<int>(k1));
    for (int g = 0; g < kGroups; ++g) {
      __m256i h0, l0, h1, l1;
      mul_hilo(c0[g], M0, h0, l0);
      mul_hilo(c2[g], M1, h1, l1);
      c0[g] = _mm256_xor_si256(_mm256_xor_si256(h1, c1[g]), K0);
      c2[g] = _mm256_xor_si256(_mm256_xor_si256(h0, c3[g]), K1);
      c1[g] = l1;
      c3[g] = l0;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int g = 0; g < kGroups; ++g) {
    // 4x8 -> 8x4 transpose: registers of one word for 8 counters become 4 words per counter
    const __m256i t0 = _mm256_unpacklo_epi32(c0[g], c1[g]), t1 = _mm256_unpacklo_epi32(c2[g], c3[g]);
    const __m256i t2 = _mm256_unpackhi_epi32(c0[g], c1[g]), t3 = _mm256_unpackhi_epi32(c2[g], c3[g]);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t1), u1 = _mm256_unpackhi_epi64(t0, t1);  // counters 0,4 / 1,5
    const __m256i u2 = _mm256_unpacklo_epi64(t2, t3), u3 = _mm256_unpackhi_epi64(t2, t3);  // counters 2,6 / 3,7
    __m256i* o = reinterpret_cast<__m256i*>(out + g * 4 * kLanes);
    _mm256_storeu_si256(o + 0, _mm256_permute2x128_si256(u0, u1, 0x20));
    _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(u2, u3, 0x20));
    _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(u0, u1, 0x31));
    _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(u2, u3, 0x31));
  }
}
#else
constexpr int kGroups = 4;

inline void philox_lanes(uint64_t key, uint64_t ctr0, uint32_t* out) {
  for (int j = 0; j < kGroups * kLanes; ++j) {
    const Philox4 w = philox4x32(key, ctr0 + static_cast<uint64_t>(j));
    for (int k = 0; k < 4; ++k) out[4 * j + k] = w.v[k];
  }
}
#endif

template <class T>
void dropout_forward_impl(const Tensor& x, float keep, double scale, uint64_t key, uint64_t base, const Tensor& y,
                          const Tensor& mask) {
  using C = compute_t<T>;
  const int64_t n = x.numel();
  const T* xp = x.data<T>();
  T* yp = y.data<T>();
  uint8_t* mp = mask.data<uint8_t>();
  const C s = static_cast<C>(scale);
  // uniform_from_word(w) < keep  <=>  (w >> 8) < keep * 2^24 (exact in float)  <=>  (w >> 8) < ceil(keep * 2^24)
  const uint32_t threshold = static_cast<uint32_t>(std::ceil(keep * 16777216.0f));
  // Chunks of 256 elements: the Philox words for a chunk land in a small buffer in element order,
  // then one dense (vectorised) loop applies them.
  constexpr int64_t kChunk = 256;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  parallel_for(0, chunks, 32, [&](int64_t q0, int64_t q1) {
    alignas(32) uint32_t words[kChunk];
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t first = q * kChunk;
      constexpr int64_t per_call = 4 * kGroups * kLanes;  // elements per philox_lanes call
      for (int64_t g = 0; g < kChunk / per_call; ++g)
        philox_lanes(key, base + static_cast<uint64_t>((first + g * per_call) / 4), words + g * per_call);
      const int64_t count = std::min<int64_t>(kChunk, n - first);
      const T* xr = xp + first;
      T* yr = yp + first;
      uint8_t* mr = mp + first;
      // multiply by 0 or 1/(1-p) rather than select: branch-free, and NaN/inf inputs propagate
      // as in PyTorch's x * mask * scale
      for (int64_t e = 0; e < count; ++e) {
        const uint32_t keep = (words[e] >> 8) < threshold;
        mr[e] = static_cast<uint8_t>(keep);
        yr[e] = static_cast<T>(static_cast<C>(xr[e]) * (static_cast<C>(keep) * s));
      }
    }
  });
}

template <class T>
void dropout_backward_impl(const Tensor& dy, const Tensor& mask, double scale, const Tensor& dx) {
  using C = compute_t<T>;
  const int64_t n = dy.numel();
  const T* gp = dy.data<T>();
  const uint8_t* mp = mask.data<uint8_t>();
  T* dp = dx.data<T>();
  const C s = static_cast<C>(scale);
  parallel_for(0, n, 32768, [&](int64_t i0, int64_t i1) {
    store_run(dp + i0, i1 - i0,
              [&](int64_t i) { return static_cast<C>(gp[i0 + i]) * (static_cast<C>(mp[i0 + i]) * s); });
  });
}

}  // namespace

void dropout_forward(const Tensor& x, float keep, double scale, const PhiloxDraw& draw, const Tensor& y,
                     const Tensor& mask) {
  FT_CHECK(draw.device_base == nullptr, "dropout: the CPU kernel got counters relative to a device value");
  FT_DISPATCH_FLOATING(x.dtype(), "dropout",
                       [&] { dropout_forward_impl<scalar_t>(x, keep, scale, draw.key, draw.base, y, mask); });
}

void dropout_backward(const Tensor& dy, const Tensor& mask, double scale, const Tensor& dx) {
  FT_DISPATCH_FLOATING(dy.dtype(), "dropout", [&] { dropout_backward_impl<scalar_t>(dy, mask, scale, dx); });
}

}  // namespace ft::cpu
