// One run seed, several independent random streams: each use gets its own Philox key, so
// changing how many numbers one stream draws never shifts another (and resume stays exact).
#pragma once
#include <cstdint>

namespace ft::train {

enum class SeedUse : uint64_t { Data = 1, Init = 2, TrainBatches = 3, ValBatches = 4, ValData = 5, Dropout = 6 };

// splitmix64 of (seed, use): well-mixed, distinct keys for distinct uses.
inline uint64_t derive_seed(uint64_t seed, SeedUse use) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(use) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace ft::train
