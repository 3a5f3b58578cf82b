// The placement bookkeeping of the CUDA allocator's expandable segments (core/range_allocator.h),
// against a map of the span after every call of a random sequence (one entry per 256 bytes: every
// size is a multiple of 256, so every offset is too, and the map is exact; a byte map made the
// test take minutes under AddressSanitizer): blocks never overlap,
// each goes to the smallest free run that holds it (lowest offset among equals), a request fails
// only when no free run is long enough (freed neighbours merged), and the granules reported free
// are exactly those no live block touches.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

#include "core/range_allocator.h"

using ft::RangeAllocator;

namespace {

constexpr uint64_t kGranule = 4096, kCapacity = 64 * kGranule;
constexpr uint64_t kUnit = 256;  // the map's resolution: sizes are multiples of it

struct Units {  // [first, last) of the map for a byte range at a multiple of kUnit
  uint64_t first, last;
};
Units units_of(uint64_t offset, uint64_t size) { return {offset / kUnit, (offset + size) / kUnit}; }

struct FreeRun {
  uint64_t offset, size;
};

// The free runs of the map, in bytes.
std::vector<FreeRun> free_runs(const std::vector<bool>& used) {
  std::vector<FreeRun> runs;
  for (uint64_t i = 0; i < used.size();) {
    if (used[i]) {
      ++i;
      continue;
    }
    uint64_t j = i;
    while (j < used.size() && !used[j]) ++j;
    runs.push_back({i * kUnit, (j - i) * kUnit});
    i = j;
  }
  return runs;
}

}  // namespace

TEST(RangeAllocator, MatchesAMapOfTheSpanOverRandomCalls) {
  std::mt19937_64 rng(7);
  RangeAllocator ranges(kCapacity, kGranule);
  std::vector<bool> used(kCapacity / kUnit, false);
  std::vector<std::pair<uint64_t, uint64_t>> live;  // offset, size
  int failures = 0, merges_needed = 0;
  for (int call = 0; call < 4000; ++call) {
    const bool do_free = !live.empty() && (rng() % 100 < 45 || live.size() > 40);
    if (do_free) {
      const size_t k = rng() % live.size();
      const auto [offset, size] = live[k];
      EXPECT_EQ(ranges.free(offset), size);
      for (uint64_t u = units_of(offset, size).first; u < units_of(offset, size).last; ++u) used[u] = false;
      live.erase(live.begin() + static_cast<long>(k));
    } else {
      // Sizes from 256 bytes to 24 granules, many not multiples of the granule.
      const uint64_t size = kUnit * (1 + rng() % (rng() % 4 == 0 ? 384 : 24));
      const std::vector<FreeRun> runs = free_runs(used);
      const FreeRun* best = nullptr;
      int fitting_pieces = 0;
      for (const FreeRun& r : runs) {
        if (r.size >= size && (best == nullptr || r.size < best->size)) best = &r;
        fitting_pieces += r.size >= kUnit;
      }
      const std::optional<uint64_t> got = ranges.allocate(size);
      if (best == nullptr) {
        EXPECT_FALSE(got.has_value()) << "call " << call << ": " << size << " bytes placed with no free run for them";
        ++failures;
        continue;
      }
      ASSERT_TRUE(got.has_value()) << "call " << call << ": no place for " << size << " bytes though the free run at "
                                   << best->offset << " holds " << best->size;
      EXPECT_EQ(*got, best->offset) << "call " << call << ": not the smallest free run";
      ASSERT_EQ(*got % kUnit, 0u) << "call " << call << ": offset " << *got;
      for (uint64_t u = units_of(*got, size).first; u < units_of(*got, size).last; ++u) {
        ASSERT_FALSE(used[u]) << "call " << call << ": overlaps a live block at byte " << u * kUnit;
        used[u] = true;
      }
      live.emplace_back(*got, size);
      merges_needed += fitting_pieces > 1;
    }
    uint64_t live_bytes = 0;
    for (const auto& l : live) live_bytes += l.second;
    ASSERT_EQ(ranges.live_bytes(), live_bytes);
    std::set<uint64_t> reported;
    ranges.free_granules([&](uint64_t first, uint64_t last) {
      for (uint64_t g = first; g < last; ++g) EXPECT_TRUE(reported.insert(g).second) << "granule " << g << " twice";
    });
    for (uint64_t g = 0; g < kCapacity / kGranule; ++g) {
      bool touched = false;
      for (uint64_t u = g * kGranule / kUnit; u < (g + 1) * kGranule / kUnit && !touched; ++u) touched = used[u];
      ASSERT_EQ(reported.count(g) == 1, !touched) << "call " << call << ": granule " << g;
    }
  }
  EXPECT_GT(failures, 10);  // the sequence did fill the span
  EXPECT_GT(merges_needed, 100);
}

TEST(RangeAllocator, FreedNeighboursMergeIntoOneRange) {
  RangeAllocator ranges(8 * kGranule, kGranule);
  std::vector<uint64_t> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(*ranges.allocate(kGranule));
  EXPECT_FALSE(ranges.allocate(256).has_value());
  // Free in an order that leaves holes before they join: 1, 3, 2 (joins 1-3), 5, 4 (joins 1-5).
  for (int i : {1, 3, 2, 5, 4}) ranges.free(blocks[static_cast<size_t>(i)]);
  const std::optional<uint64_t> big = ranges.allocate(5 * kGranule);
  ASSERT_TRUE(big.has_value());
  EXPECT_EQ(*big, blocks[1]);
  EXPECT_EQ(ranges.granules_of(*big, 5 * kGranule), std::make_pair(uint64_t{1}, uint64_t{6}));
  EXPECT_EQ(ranges.granules_of(100, 5000), std::make_pair(uint64_t{0}, uint64_t{2}));
}

TEST(RangeAllocator, BadCallsAreClearErrors) {
  EXPECT_THROW(RangeAllocator(1000, kGranule), ft::Error);
  RangeAllocator ranges(kGranule, kGranule);
  EXPECT_THROW(ranges.allocate(0), ft::Error);
  EXPECT_THROW(ranges.free(64), ft::Error);
}
