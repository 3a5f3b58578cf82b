// CPU kernel of the random fills (rand, randn, randint, uniform_, normal_, bernoulli_mask): the
// counter blocks are shared between threads whole, so each block's Philox call is made once, and
// every element is the function of its index that backend/random_math.h defines.
#include <type_traits>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/optim.h"
#include "fasttrain/parallel.h"

namespace ft::cpu {
namespace {

using random_math::RandomDistribution;
using random_math::RandomFill;

template <class T, RandomDistribution kDist>
void fill_blocks(T* p, int64_t n, const RandomFill& f) {
  parallel_for(0, (n + 3) / 4, 4096, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const random_math::PhiloxBlock w = random_math::philox4x32(f.key, f.base + b);
      for (int lane = 0; lane < 4 && b * 4 + lane < n; ++lane) {
        const double v = random_math::random_value<kDist>(f, lane, w);
        if constexpr (std::is_same_v<T, bool>)
          p[b * 4 + lane] = v != 0;
        else
          p[b * 4 + lane] = static_cast<T>(static_cast<compute_t<T>>(v));
      }
    }
  });
}

}  // namespace

void random_fill(const Tensor& out, const RandomFill& fill) {
  FT_CHECK(fill.device_base == nullptr, "random fill: the CPU kernel got counters relative to a device value");
  const int64_t n = out.numel();
  FT_DISPATCH_ALL(out.dtype(), "random", [&] {
    scalar_t* p = out.data<scalar_t>();
    switch (fill.distribution) {
      case RandomDistribution::Uniform01: return fill_blocks<scalar_t, RandomDistribution::Uniform01>(p, n, fill);
      case RandomDistribution::Uniform: return fill_blocks<scalar_t, RandomDistribution::Uniform>(p, n, fill);
      case RandomDistribution::StandardNormal:
        return fill_blocks<scalar_t, RandomDistribution::StandardNormal>(p, n, fill);
      case RandomDistribution::Normal: return fill_blocks<scalar_t, RandomDistribution::Normal>(p, n, fill);
      case RandomDistribution::RandInt: return fill_blocks<scalar_t, RandomDistribution::RandInt>(p, n, fill);
      case RandomDistribution::Bernoulli: return fill_blocks<scalar_t, RandomDistribution::Bernoulli>(p, n, fill);
    }
    FT_FAIL("random fill: invalid distribution ", static_cast<int>(fill.distribution));
  });
}

}  // namespace ft::cpu
