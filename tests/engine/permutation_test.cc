// Tests of engine/permutation.h: the seeded bijection of [0, n) behind the
// per-epoch shuffle. Every process computes positions on its own, so the
// order must be a bijection for every n, a pure function of (n, seed, epoch),
// and different enough across seeds and epochs to be a shuffle.
#include "engine/permutation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <unordered_set>
#include <vector>

namespace tailcut::detail {
namespace {

// The whole order of a small permutation.
std::vector<uint64_t> Order(uint64_t n, uint64_t seed, uint64_t epoch) {
  Permutation p(n, seed, epoch);
  std::vector<uint64_t> out(n);
  for (uint64_t pos = 0; pos < n; ++pos) out[pos] = p(pos);
  return out;
}

// Empty string when `order` is a bijection of [0, n), else what is wrong.
std::string BijectionProblem(const std::vector<uint64_t>& order) {
  const uint64_t n = order.size();
  std::vector<bool> seen(n, false);
  for (uint64_t pos = 0; pos < n; ++pos) {
    const uint64_t v = order[pos];
    if (v >= n)
      return "position " + std::to_string(pos) + " maps to " + std::to_string(v) + " >= n";
    if (seen[v]) return "value " + std::to_string(v) + " appears twice";
    seen[v] = true;
  }
  return "";
}

uint64_t FixedPoints(const std::vector<uint64_t>& order) {
  uint64_t count = 0;
  for (uint64_t pos = 0; pos < order.size(); ++pos) count += order[pos] == pos;
  return count;
}

TEST(PermutationTest, IsABijectionForEverySmallN) {
  for (uint64_t n = 1; n <= 300; ++n) {
    for (uint64_t seed : {0ull, 1ull, 0xdeadbeefull}) {
      EXPECT_EQ(BijectionProblem(Order(n, seed, n % 7)), "") << "n=" << n << " seed=" << seed;
    }
  }
}

TEST(PermutationTest, IsABijectionForPrimesPowersOfTwoAndTheirNeighbours) {
  std::vector<uint64_t> sizes = {2, 3, 5, 7, 13, 251, 257, 1021, 4093, 65521, 65537, 262139};
  for (int k = 1; k <= 18; ++k) {
    const uint64_t p = uint64_t{1} << k;
    sizes.insert(sizes.end(), {p - 1, p, p + 1});
  }
  for (uint64_t n : sizes) {
    EXPECT_EQ(BijectionProblem(Order(n, 42, 3)), "") << "n=" << n;
  }
}

TEST(PermutationTest, LargeNMapsSampledPositionsToDistinctValuesInRange) {
  // Too large to enumerate: a sample must stay in range and never collide.
  for (uint64_t n : {(uint64_t{1} << 40) + 7, (uint64_t{1} << 63) + 1, UINT64_MAX}) {
    Permutation p(n, 7, 1);
    std::unordered_set<uint64_t> values;
    for (uint64_t i = 0; i < 20000; ++i) {
      const uint64_t pos = i * (n / 20000) + (i % 3);  // spread over [0, n), some neighbours
      const uint64_t v = p(pos);
      ASSERT_LT(v, n) << "n=" << n << " pos=" << pos;
      ASSERT_TRUE(values.insert(v).second) << "n=" << n << " collision at pos=" << pos;
    }
  }
}

TEST(PermutationTest, NOfZeroAndOneMapToZero) {
  // n = 1 has one order; n = 0 has no positions, and a call still answers 0
  // rather than walking forever.
  EXPECT_EQ(Permutation(1, 123, 4)(0), 0u);
  EXPECT_EQ(Permutation(0, 123, 4)(0), 0u);
}

TEST(PermutationTest, IsAPureFunctionOfSizeSeedAndEpoch) {
  for (uint64_t n : {10ull, 1000ull, 4097ull}) {
    EXPECT_EQ(Order(n, 99, 5), Order(n, 99, 5)) << "n=" << n;
    // Copies and separate objects agree too: any process computes any position.
    Permutation a(n, 99, 5);
    Permutation b = a;
    for (uint64_t pos = 0; pos < n; pos += 7) EXPECT_EQ(a(pos), b(pos));
  }
}

TEST(PermutationTest, DifferentSeedsGiveDifferentOrders) {
  const uint64_t n = 1000;
  std::vector<std::vector<uint64_t>> orders;
  for (uint64_t seed = 0; seed < 20; ++seed) orders.push_back(Order(n, seed, 0));
  for (size_t i = 0; i < orders.size(); ++i)
    for (size_t j = i + 1; j < orders.size(); ++j)
      EXPECT_NE(orders[i], orders[j]) << "seeds " << i << " and " << j;
}

TEST(PermutationTest, DifferentEpochsGiveDifferentOrders) {
  const uint64_t n = 1000;
  std::vector<std::vector<uint64_t>> orders;
  for (uint64_t epoch = 0; epoch < 20; ++epoch) orders.push_back(Order(n, 17, epoch));
  for (size_t i = 0; i < orders.size(); ++i)
    for (size_t j = i + 1; j < orders.size(); ++j)
      EXPECT_NE(orders[i], orders[j]) << "epochs " << i << " and " << j;
}

TEST(PermutationTest, SeedAndEpochDoNotCancel) {
  // (seed s, epoch e) and (seed e, epoch s) are different jobs.
  EXPECT_NE(Order(500, 3, 8), Order(500, 8, 3));
  EXPECT_NE(Order(500, 0, 1), Order(500, 1, 0));
}

TEST(PermutationTest, IsNotTheIdentity) {
  for (uint64_t n : {2ull, 3ull, 16ull, 100ull, 1000ull}) {
    // A two-element order is the identity half the time; over many seeds it
    // must not always be.
    uint64_t identities = 0;
    for (uint64_t seed = 0; seed < 64; ++seed) {
      std::vector<uint64_t> order = Order(n, seed, 0);
      std::vector<uint64_t> identity(n);
      std::iota(identity.begin(), identity.end(), 0);
      identities += order == identity;
    }
    EXPECT_LT(identities, 48u) << "n=" << n;
    if (n >= 16) EXPECT_EQ(identities, 0u) << "n=" << n;
  }
}

TEST(PermutationTest, FixedPointsAverageAboutOne) {
  // A uniform permutation has one fixed point on average, whatever n is.
  for (uint64_t n : {64ull, 1000ull, 4096ull}) {
    uint64_t total = 0;
    const uint64_t trials = 200;
    for (uint64_t seed = 0; seed < trials; ++seed) total += FixedPoints(Order(n, seed, 1));
    const double mean = static_cast<double>(total) / trials;
    EXPECT_GT(mean, 0.5) << "n=" << n;
    EXPECT_LT(mean, 1.6) << "n=" << n;
  }
}

TEST(PermutationTest, SpreadsPositionsEvenlyOverValues) {
  // Positions in bucket i land in every value bucket about equally often over
  // many seeds: no region of the data stays near where it started.
  const uint64_t n = 1000, buckets = 10, trials = 300;
  std::vector<uint64_t> count(buckets * buckets, 0);
  for (uint64_t seed = 0; seed < trials; ++seed) {
    std::vector<uint64_t> order = Order(n, seed, 2);
    for (uint64_t pos = 0; pos < n; ++pos)
      ++count[(pos * buckets / n) * buckets + order[pos] * buckets / n];
  }
  const double expected = static_cast<double>(n) * trials / (buckets * buckets);
  for (uint64_t i = 0; i < buckets; ++i)
    for (uint64_t j = 0; j < buckets; ++j)
      EXPECT_NEAR(count[i * buckets + j], expected, expected * 0.1)
          << "positions bucket " << i << " -> values bucket " << j;
}

TEST(PermutationTest, NeighbouringPositionsAreNotNeighbouringValues) {
  // A shuffle that kept runs would read files in the same order every epoch.
  const uint64_t n = 100000;
  std::vector<uint64_t> order = Order(n, 5, 0);
  uint64_t adjacent = 0;
  for (uint64_t pos = 0; pos + 1 < n; ++pos)
    adjacent += order[pos + 1] == order[pos] + 1 || order[pos] == order[pos + 1] + 1;
  // A uniform permutation has about 2 such pairs on average.
  EXPECT_LT(adjacent, 20u);
}

TEST(PermutationTest, SplitMix64MatchesTheReferenceSequence) {
  // The order is part of a checkpoint's meaning: SplitMix64 must stay the
  // published function (first outputs of the generator seeded with 0).
  EXPECT_EQ(SplitMix64(0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(SplitMix64(0x9e3779b97f4a7c15ull), 0x6e789e6aa1b965f4ull);
}

}  // namespace
}  // namespace tailcut::detail
