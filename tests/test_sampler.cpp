// Samplers: deterministic orders, per-epoch reshuffling, distributed shards as torch's
// DistributedSampler (disjoint, equal-sized, covering; tail padded by wrapping or dropped).
#include <algorithm>
#include <numeric>
#include <set>

#include <gtest/gtest.h>

#include "fasttrain/loader.h"
#include "support/expect_error.h"

namespace ft::data {
namespace {

std::vector<int64_t> order(const Sampler& s, uint64_t epoch) {
  std::vector<int64_t> out;
  s.indices(epoch, out);
  return out;
}

bool is_permutation_of_range(std::vector<int64_t> v, int64_t n) {
  std::sort(v.begin(), v.end());
  std::vector<int64_t> want(static_cast<size_t>(n));
  std::iota(want.begin(), want.end(), int64_t{0});
  return v == want;
}

TEST(Sampler, SequentialIsTheIdentityEveryEpoch) {
  SequentialSampler s(5);
  EXPECT_EQ(s.size(), 5);
  EXPECT_EQ(order(s, 0), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(order(s, 7), order(s, 0));
}

TEST(Sampler, RandomIsAReproduciblePermutationThatChangesPerEpoch) {
  const int64_t n = 1000;
  RandomSampler a(n, 42), b(n, 42), other_seed(n, 43);
  const auto e0 = order(a, 0), e1 = order(a, 1);
  EXPECT_TRUE(is_permutation_of_range(e0, n));
  EXPECT_TRUE(is_permutation_of_range(e1, n));
  EXPECT_EQ(e0, order(b, 0));  // same (seed, epoch): same order, from a fresh sampler
  EXPECT_EQ(e1, order(a, 1));  // and again from the same one: no hidden state
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, order(other_seed, 0));
  std::vector<int64_t> identity(static_cast<size_t>(n));
  std::iota(identity.begin(), identity.end(), int64_t{0});
  EXPECT_NE(e0, identity);
}

TEST(Sampler, RandomPermutationIsRoughlyUniform) {
  // Position of element 0 over many epochs of a 4-element permutation: each of 4 places ~1/4.
  std::vector<int> where(4, 0);
  std::vector<int64_t> p;
  const int trials = 4000;
  for (int e = 0; e < trials; ++e) {
    random_permutation(4, 7, static_cast<uint64_t>(e), p);
    where[std::find(p.begin(), p.end(), 0) - p.begin()]++;
  }
  for (int c : where) EXPECT_NEAR(c, trials / 4, 150);  // ~5 standard deviations
}

// All ranks' shards for one epoch.
std::vector<std::vector<int64_t>> shards(int64_t n, int64_t world, bool shuffle, bool drop_last, uint64_t epoch) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < world; ++r)
    out.push_back(order(DistributedSampler(n, r, world, shuffle, 9, drop_last), epoch));
  return out;
}

TEST(Sampler, DistributedShardsAreDisjointEqualAndCovering) {
  for (bool shuffle : {false, true}) {
    const auto s = shards(12, 4, shuffle, false, 3);
    std::vector<int64_t> all;
    for (const auto& shard : s) {
      EXPECT_EQ(shard.size(), 3u);
      all.insert(all.end(), shard.begin(), shard.end());
    }
    EXPECT_TRUE(is_permutation_of_range(all, 12)) << "shuffle=" << shuffle;
  }
  EXPECT_NE(shards(12, 4, true, false, 0), shards(12, 4, true, false, 1));  // reshuffled per epoch
}

TEST(Sampler, DistributedPadsTheTailByWrapping) {
  // torch: order 0..9 padded to 12 with 0, 1; rank r takes r, r+4, r+8.
  const auto s = shards(10, 4, false, false, 0);
  EXPECT_EQ(s[0], (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(s[1], (std::vector<int64_t>{1, 5, 9}));
  EXPECT_EQ(s[2], (std::vector<int64_t>{2, 6, 0}));
  EXPECT_EQ(s[3], (std::vector<int64_t>{3, 7, 1}));
  // More ranks than samples: the padding wraps more than once and every rank still gets one.
  const auto tiny = shards(2, 5, false, false, 0);
  for (int64_t r = 0; r < 5; ++r) EXPECT_EQ(tiny[r], (std::vector<int64_t>{r % 2}));
}

TEST(Sampler, DistributedDropLastDropsTheTail) {
  for (bool shuffle : {false, true}) {
    const auto s = shards(10, 4, shuffle, true, 1);
    std::set<int64_t> seen;
    for (const auto& shard : s) {
      EXPECT_EQ(shard.size(), 2u);
      seen.insert(shard.begin(), shard.end());
    }
    EXPECT_EQ(seen.size(), 8u) << "disjoint";
  }
}

TEST(Sampler, RejectsBadConfiguration) {
  test::expect_error([] { DistributedSampler(10, 4, 4); }, "expected rank in [0, 4), found 4");
  test::expect_error([] { DistributedSampler(10, 0, 0); }, "expected world_size >= 1, found 0");
  test::expect_error([] { RandomSampler(-1, 0); }, "found -1");
}

}  // namespace
}  // namespace ft::data
