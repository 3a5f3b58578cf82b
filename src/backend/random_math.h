// Counter-based random numbers for every backend: Philox-4x32-10 (Salmon et al., "Parallel random
// numbers: as easy as 1, 2, 3", SC'11) and the distributions of the random fills. Element i of a
// fill made at counter `base` is drawn from word i%4 of counter block base + i/4 (Box-Muller uses
// the block's word pairs), so a fill depends only on the key, the base and i: the same stream on
// any thread count and on any device whose kernel calls these functions.
#pragma once
#include <cmath>
#include <cstdint>

#include "backend/host_device.h"

namespace ft::random_math {

struct PhiloxBlock {
  uint32_t v[4];
};

FT_HD PhiloxBlock philox4x32(uint64_t key, uint64_t ctr_lo, uint64_t ctr_hi = 0) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(ctr_lo), c1 = static_cast<uint32_t>(ctr_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(ctr_hi), c3 = static_cast<uint32_t>(ctr_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(M0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(M1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n1 = static_cast<uint32_t>(p1);
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    const uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += W0;
    k1 += W1;
  }
  return PhiloxBlock{{c0, c1, c2, c3}};
}

// The distributions of random_fill. Each is exactly the rule of one public function
// (src/core/random.cpp), which is why rand and uniform_, randn and normal_ are not merged: their
// roundings differ.
enum class RandomDistribution : uint8_t {
  Uniform01,       // rand: the word's top 24 bits as a float in [0, 1)
  Uniform,         // uniform_: low + (high - low) * word / 2^32, in f64
  StandardNormal,  // randn: Box-Muller
  Normal,          // normal_: mean + std * (Box-Muller)
  RandInt,         // randint: low + floor(word * range / 2^32)
  Bernoulli,       // bernoulli_mask: 1 where Uniform01 < p (as f32), else 0
};

// What a fill draws and where its counters start.
struct RandomFill {
  RandomDistribution distribution = RandomDistribution::Uniform01;
  double low = 0, high = 1;  // Uniform
  double mean = 0, std = 1;  // Normal
  int64_t int_low = 0;       // RandInt: [int_low, int_low + int_range), int_range <= 2^32
  uint64_t int_range = 1;
  double p = 0.5;                         // Bernoulli: probability of a 1
  uint64_t key = 0;                       // the generator's seed
  uint64_t base = 0;                      // first counter block reserved for this fill
  const uint64_t* device_base = nullptr;  // in a CUDA graph: a device value added to base (PhiloxDraw)
};

// [0, 1) with 24 random bits: every value is exact in f32 (ft::uniform_from_word, which dropout's
// masks use, is the same rule).
FT_HD float uniform01(uint32_t w) { return static_cast<float>(w >> 8) * (1.0f / 16777216.0f); }

// Box-Muller on word pairs (0,1) and (2,3): lanes 0/2 take the cosine, 1/3 the sine.
FT_HD double standard_normal(int lane, const PhiloxBlock& w) {
  using std::cos, std::log, std::sin, std::sqrt;
  const int pair = lane / 2;
  const double u1 = (static_cast<double>(w.v[2 * pair]) + 1.0) * (1.0 / 4294967296.0);  // (0,1]
  const double u2 = static_cast<double>(w.v[2 * pair + 1]) * (1.0 / 4294967296.0);
  const double r = sqrt(-2.0 * log(u1));
  const double theta = 2.0 * M_PI * u2;
  return (lane % 2 == 0) ? r * cos(theta) : r * sin(theta);
}

// Element `lane` (0..3) of a counter block, as f64 (the fill converts it to the tensor's dtype).
template <RandomDistribution kDist>
FT_HD double random_value(const RandomFill& f, int lane, const PhiloxBlock& w) {
  if constexpr (kDist == RandomDistribution::Uniform01) {
    return static_cast<double>(uniform01(w.v[lane]));
  } else if constexpr (kDist == RandomDistribution::Uniform) {
    return f.low + (f.high - f.low) * (static_cast<double>(w.v[lane]) * (1.0 / 4294967296.0));
  } else if constexpr (kDist == RandomDistribution::StandardNormal) {
    return standard_normal(lane, w);
  } else if constexpr (kDist == RandomDistribution::Normal) {
    return f.mean + f.std * standard_normal(lane, w);
  } else if constexpr (kDist == RandomDistribution::RandInt) {
    return static_cast<double>(f.int_low +
                               static_cast<int64_t>((static_cast<uint64_t>(w.v[lane]) * f.int_range) >> 32));
  } else {
    return uniform01(w.v[lane]) < static_cast<float>(f.p) ? 1.0 : 0.0;
  }
}

}  // namespace ft::random_math
