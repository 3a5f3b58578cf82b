// Samplers: the order of an epoch as a pure function of (configuration, epoch).
#include <algorithm>
#include <numeric>

#include "fasttrain/error.h"
#include "fasttrain/loader.h"
#include "fasttrain/random.h"

namespace ft::data {

void random_permutation(int64_t n, uint64_t seed, uint64_t epoch, std::vector<int64_t>& out) {
  FT_CHECK(n >= 0, "random_permutation: expected n >= 0, found ", n);
  out.resize(static_cast<size_t>(n));
  std::iota(out.begin(), out.end(), int64_t{0});
  for (int64_t i = n - 1; i > 0; --i) {
    // 64 random bits scaled to [0, i] by a multiply-high: no modulo, bias below 2^-32 for any n.
    const Philox4 r = philox4x32(seed, static_cast<uint64_t>(i), epoch);
    const uint64_t bits = static_cast<uint64_t>(r.v[0]) | (static_cast<uint64_t>(r.v[1]) << 32);
    const auto j = static_cast<int64_t>((static_cast<unsigned __int128>(bits) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(out[i], out[j]);
  }
}

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  FT_CHECK(n >= 0, "SequentialSampler: expected a dataset size >= 0, found ", n);
}

void SequentialSampler::indices(uint64_t, std::vector<int64_t>& out) const {
  out.resize(static_cast<size_t>(n_));
  std::iota(out.begin(), out.end(), int64_t{0});
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  FT_CHECK(n >= 0, "RandomSampler: expected a dataset size >= 0, found ", n);
}

void RandomSampler::indices(uint64_t epoch, std::vector<int64_t>& out) const {
  random_permutation(n_, seed_, epoch, out);
}

DistributedSampler::DistributedSampler(int64_t n, int64_t rank, int64_t world_size, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : n_(n), rank_(rank), world_size_(world_size), shuffle_(shuffle), seed_(seed) {
  FT_CHECK(n >= 0, "DistributedSampler: expected a dataset size >= 0, found ", n);
  FT_CHECK(world_size >= 1, "DistributedSampler: expected world_size >= 1, found ", world_size);
  FT_CHECK(rank >= 0 && rank < world_size, "DistributedSampler: expected rank in [0, ", world_size, "), found ", rank);
  // drop_last: the largest multiple of world_size not above n; otherwise the smallest at or above.
  per_rank_ = drop_last ? n / world_size : (n + world_size - 1) / world_size;
}

void DistributedSampler::indices(uint64_t epoch, std::vector<int64_t>& out) const {
  const int64_t total = per_rank_ * world_size_;
  if (shuffle_) {
    random_permutation(n_, seed_, epoch, out);
  } else {
    out.resize(static_cast<size_t>(n_));
    std::iota(out.begin(), out.end(), int64_t{0});
  }
  // Pad by wrapping around (possibly more than once when world_size > n), or truncate.
  const int64_t n = n_;
  out.resize(static_cast<size_t>(std::max(total, n)));
  for (int64_t i = n; i < total; ++i) out[i] = out[i - n];
  // Rank r keeps positions r, r + W, ...; compacting in place is safe since r + j*W >= j.
  for (int64_t j = 0; j < per_rank_; ++j) out[j] = out[rank_ + j * world_size_];
  out.resize(static_cast<size_t>(per_rank_));
}

}  // namespace ft::data
