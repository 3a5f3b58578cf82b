// Dropout kernels; see dropout.h for the counter layout that keeps masks thread-count independent.
#include "backend/cpu/dropout.h"

#include <cmath>

#include "backend/cpu/dispatch.h"
#include "fasttrain/parallel.h"
#include "fasttrain/random.h"

namespace ft::cpu {

namespace {

constexpr int kLanes = 8;  // counter blocks per vectorised Philox call

// Philox-4x32-10 on kLanes consecutive counters ctr0 .. ctr0 + kLanes - 1 (high counter word 0),
// bit-identical to philox4x32(); the lane loops compile to vector multiplies.
inline void philox_lanes(uint64_t key, uint64_t ctr0, uint32_t out[4][kLanes]) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  uint32_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
  for (int j = 0; j < kLanes; ++j) {
    const uint64_t c = ctr0 + static_cast<uint64_t>(j);
    c0[j] = static_cast<uint32_t>(c);
    c1[j] = static_cast<uint32_t>(c >> 32);
    c2[j] = 0;
    c3[j] = 0;
  }
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    for (int j = 0; j < kLanes; ++j) {
      const uint64_t p0 = static_cast<uint64_t>(M0) * c0[j];
      const uint64_t p1 = static_cast<uint64_t>(M1) * c2[j];
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[j] ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[j] ^ k1;
      c1[j] = static_cast<uint32_t>(p1);
      c3[j] = static_cast<uint32_t>(p0);
      c0[j] = n0;
      c2[j] = n2;
    }
    k0 += W0;
    k1 += W1;
  }
  for (int j = 0; j < kLanes; ++j) {
    out[0][j] = c0[j];
    out[1][j] = c1[j];
    out[2][j] = c2[j];
    out[3][j] = c3[j];
  }
}

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
  const int64_t groups = (n + 4 * kLanes - 1) / (4 * kLanes);  // 32 elements per group
  parallel_for(0, groups, 256, [&](int64_t g0, int64_t g1) {
    uint32_t words[4][kLanes];
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t first = g * 4 * kLanes;
      philox_lanes(key, base + static_cast<uint64_t>(g * kLanes), words);
      const int64_t count = std::min<int64_t>(4 * kLanes, n - first);
      uint8_t m[4 * kLanes];
      for (int64_t e = 0; e < 4 * kLanes; ++e) m[e] = (words[e % 4][e / 4] >> 8) < threshold;
      for (int64_t e = 0; e < count; ++e) {
        mp[first + e] = m[e];
        yp[first + e] = m[e] ? static_cast<T>(static_cast<C>(xp[first + e]) * s) : static_cast<T>(C(0));
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
    for (int64_t i = i0; i < i1; ++i) dp[i] = static_cast<T>(static_cast<C>(gp[i]) * (static_cast<C>(mp[i]) * s));
  });
}

}  // namespace

void dropout_forward(const Tensor& x, float keep, double scale, uint64_t key, uint64_t base, const Tensor& y,
                     const Tensor& mask) {
  FT_DISPATCH_FLOATING(x.dtype(), "dropout", [&] { dropout_forward_impl<scalar_t>(x, keep, scale, key, base, y, mask); });
}

void dropout_backward(const Tensor& dy, const Tensor& mask, double scale, const Tensor& dx) {
  FT_DISPATCH_FLOATING(dy.dtype(), "dropout", [&] { dropout_backward_impl<scalar_t>(dy, mask, scale, dx); });
}

}  // namespace ft::cpu
