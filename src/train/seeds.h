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

// The stream of rank `rank` of a data-parallel job for a key every rank derived alike: rank 0
// keeps the key (one process and rank 0 draw the same numbers), every other rank a distinct key.
// Dropout uses it: with one stream for all, every rank would drop the same units of its own
// samples, which is not what one process over the global batch does (its masks over the batch
// are independent). Exact per-sample equality with one process is not promised; independence is.
inline uint64_t rank_stream(uint64_t key, int rank) {
  if (rank == 0) return key;
  uint64_t z = key ^ (0xD1B54A32D192ED03ull * static_cast<uint64_t>(rank));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace ft::train
