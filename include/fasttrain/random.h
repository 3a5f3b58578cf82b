// Seeded, counter-based random numbers (Philox-4x32-10). Element i of a draw depends only on the
// seed, the generator's offset at the time of the draw and i, so the same seed gives the same
// tensor on any number of threads and, with the same kernel, on the GPU.
#pragma once
#include <cstdint>
#include <mutex>

#include "fasttrain/tensor.h"

namespace ft {

struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;  // counter blocks consumed so far
};

// The counters of one draw: blocks base, base + 1, ... under `key`. Inside a CUDA graph capture
// `device_base` points at a device value that every replay sets, before it runs, to the
// generator's counter at that time, and the kernels add it to `base` (CudaGraph::random_counters).
struct PhiloxDraw {
  uint64_t key = 0;
  uint64_t base = 0;
  const uint64_t* device_base = nullptr;
};

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : state_{seed, 0} {}
  void manual_seed(uint64_t seed);
  GeneratorState state() const;
  void set_state(GeneratorState s);
  // Reserves `blocks` consecutive Philox counters and returns the first; thread-safe. Refused
  // while this thread captures a CUDA graph (a replay would repeat the counters).
  uint64_t reserve(uint64_t blocks);
  // The counters for a draw of `blocks` blocks on `device`: reserved now, or, for a CUDA device
  // while this thread captures a graph, relative to a value each replay sets (PhiloxDraw), so
  // every replay draws what the same eager step would.
  PhiloxDraw draw(uint64_t blocks, Device device);
  uint64_t seed() const;

 private:
  mutable std::mutex mu_;
  GeneratorState state_;
};

Generator& default_generator();
void manual_seed(uint64_t seed);

// Philox-4x32-10: four 32-bit random words for counter `ctr` (128-bit: lo, hi) under `key`.
struct Philox4 {
  uint32_t v[4];
};
Philox4 philox4x32(uint64_t key, uint64_t ctr_lo, uint64_t ctr_hi = 0);

// Element i of a draw made at generator offset `base` uses counter base + i/4, word i%4.
inline uint32_t philox_word(uint64_t key, uint64_t base, uint64_t i) { return philox4x32(key, base + i / 4).v[i % 4]; }
inline float uniform_from_word(uint32_t w) { return static_cast<float>(w >> 8) * (1.0f / 16777216.0f); }  // [0,1)

Tensor rand(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);   // U[0,1)
Tensor randn(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);  // N(0,1)
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts = DType::I64,
               Generator* gen = nullptr);  // uniform in [low, high)
Tensor rand_like(const Tensor& t, Generator* gen = nullptr);
Tensor randn_like(const Tensor& t, Generator* gen = nullptr);
// In-place fills (initialisers use these).
Tensor& uniform_(Tensor& t, double low, double high, Generator* gen = nullptr);
Tensor& normal_(Tensor& t, double mean, double std, Generator* gen = nullptr);
// A keep-mask with probability 1-p of ones, as the dtype of `like` (dropout).
Tensor bernoulli_mask(const Shape& shape, double keep_prob, TensorOptions opts, Generator* gen = nullptr);

}  // namespace ft
