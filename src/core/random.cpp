// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
#include "fasttrain/random.h"

#include <cmath>

#include "backend/cpu/dispatch.h"
#include "fasttrain/autograd.h"
#include "fasttrain/parallel.h"

namespace ft {

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mu_);
  state_ = {seed, 0};
}
GeneratorState Generator::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}
void Generator::set_state(GeneratorState s) {
  std::lock_guard<std::mutex> lock(mu_);
  state_ = s;
}
uint64_t Generator::seed() const { return state().seed; }
uint64_t Generator::reserve(uint64_t blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t base = state_.offset;
  state_.offset += blocks;
  return base;
}

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}
void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

Philox4 philox4x32(uint64_t key, uint64_t ctr_lo, uint64_t ctr_hi) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(ctr_lo), c1 = static_cast<uint32_t>(ctr_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(ctr_hi), c3 = static_cast<uint32_t>(ctr_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(M0) * c0;
    uint64_t p1 = static_cast<uint64_t>(M1) * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = static_cast<uint32_t>(p1);
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += W0;
    k1 += W1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

namespace {

// Fills a contiguous CPU tensor: value(i, words) gives element i from its counter block.
template <class F>
void fill_counter_based(Tensor& t, Generator* gen, F value) {
  FT_CHECK(t.device().is_cpu(), "random fill on ", t.device().str(), " needs the CUDA backend");
  FT_CHECK(t.is_contiguous(), "random fill: expected a contiguous tensor");
  Generator& g = gen ? *gen : default_generator();
  const int64_t n = t.numel();
  const uint64_t key = g.seed();
  const uint64_t base = g.reserve((n + 3) / 4);
  FT_DISPATCH_ALL(t.dtype(), "random", [&] {
    scalar_t* p = t.data<scalar_t>();
    // Work in whole counter blocks so each block's Philox call is made once.
    parallel_for(0, (n + 3) / 4, 4096, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        Philox4 w = philox4x32(key, base + b);
        for (int64_t lane = 0; lane < 4 && b * 4 + lane < n; ++lane) {
          double v = value(lane, w);
          if constexpr (std::is_same_v<scalar_t, bool>) {
            p[b * 4 + lane] = v != 0;
          } else {
            p[b * 4 + lane] = static_cast<scalar_t>(static_cast<compute_t<scalar_t>>(v));
          }
        }
      }
    });
  });
}

// Box-Muller on word pairs (0,1) and (2,3): lanes 0/2 take the cosine, 1/3 the sine.
double normal_from_block(int64_t lane, const Philox4& w) {
  int64_t pair = lane / 2;
  double u1 = (static_cast<double>(w.v[2 * pair]) + 1.0) * (1.0 / 4294967296.0);  // (0,1]
  double u2 = static_cast<double>(w.v[2 * pair + 1]) * (1.0 / 4294967296.0);
  double r = std::sqrt(-2.0 * std::log(u1));
  double theta = 2.0 * M_PI * u2;
  return (lane % 2 == 0) ? r * std::cos(theta) : r * std::sin(theta);
}

Tensor finish(Tensor t, const TensorOptions& opts) {
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}

}  // namespace

Tensor rand(const Shape& shape, TensorOptions opts, Generator* gen) {
  Tensor t = empty(shape, opts.with_requires_grad(false));
  fill_counter_based(t, gen, [](int64_t lane, const Philox4& w) { return static_cast<double>(uniform_from_word(w.v[lane])); });
  return finish(t, opts);
}

Tensor randn(const Shape& shape, TensorOptions opts, Generator* gen) {
  Tensor t = empty(shape, opts.with_requires_grad(false));
  fill_counter_based(t, gen, normal_from_block);
  return finish(t, opts);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts, Generator* gen) {
  FT_CHECK(high > low, "randint: expected low < high, found low ", low, ", high ", high);
  uint64_t range = static_cast<uint64_t>(high - low);
  FT_CHECK(range <= (1ull << 32), "randint: range ", range, " exceeds 2^32");
  Tensor t = empty(shape, opts.with_requires_grad(false));
  fill_counter_based(t, gen, [low, range](int64_t lane, const Philox4& w) {
    return static_cast<double>(low + static_cast<int64_t>((static_cast<uint64_t>(w.v[lane]) * range) >> 32));
  });
  return t;
}

Tensor rand_like(const Tensor& t, Generator* gen) { return rand(t.shape(), t.options(), gen); }
Tensor randn_like(const Tensor& t, Generator* gen) { return randn(t.shape(), t.options(), gen); }

static void fill_into(Tensor& t, const Tensor& values) {
  autograd::NoGradGuard ng;
  t.copy_(values);
}

Tensor& uniform_(Tensor& t, double low, double high, Generator* gen) {
  Tensor v = empty(t.shape(), TensorOptions(DType::F64));
  fill_counter_based(v, gen, [low, high](int64_t lane, const Philox4& w) {
    return low + (high - low) * (static_cast<double>(w.v[lane]) * (1.0 / 4294967296.0));
  });
  fill_into(t, v);
  return t;
}

Tensor& normal_(Tensor& t, double mean, double std, Generator* gen) {
  Tensor v = empty(t.shape(), TensorOptions(DType::F64));
  fill_counter_based(v, gen, [mean, std](int64_t lane, const Philox4& w) { return mean + std * normal_from_block(lane, w); });
  fill_into(t, v);
  return t;
}

Tensor bernoulli_mask(const Shape& shape, double keep_prob, TensorOptions opts, Generator* gen) {
  Tensor t = empty(shape, opts.with_requires_grad(false));
  float kp = static_cast<float>(keep_prob);
  fill_counter_based(t, gen, [kp](int64_t lane, const Philox4& w) { return uniform_from_word(w.v[lane]) < kp ? 1.0 : 0.0; });
  return t;
}

}  // namespace ft
