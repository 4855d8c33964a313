// Seeded bijections of [0, n) for per-epoch shuffling.
//
// The order is uniform in the sense a shuffle needs: for n <= kTableMax it is
// an exact Fisher-Yates shuffle, computed once per (n, seed, epoch) object
// into a small inline table; above that, an alternating Feistel network of
// kRounds rounds over the smallest power of two >= n, with cycle walking
// (apply the network until the value falls inside [0, n)). The network is a
// bijection of its domain, so walking gives a bijection of [0, n); the domain
// is < 2n, so a walk takes fewer than 2 steps on average. No per-epoch arrays
// beyond the 256-byte table: any process computes any position, and the whole
// order is (n, seed, epoch).
//
// Why these choices (measured: docs/design.md, "Tickets, order and the
// cursor"; tests/engine/permutation_test.cc):
//  * A Feistel network over a domain of 2^k points only reaches even
//    permutations of that domain (each round is an even permutation for
//    k >= 2), and with few rounds over a few bits its round functions are
//    tiny tables: at n = 5 the old 4-round network made some orders 9x
//    likelier than others. No number of rounds makes small domains exact, so
//    small n get an exact shuffle instead.
//  * Four rounds are a pseudo-random permutation only for far fewer queries
//    than the domain holds (Luby-Rackoff: about 2^(k/4)); a shuffle reveals
//    every point, and the old network put index neighbours side by side
//    1.2-2x as often as a uniform permutation. Eight rounds of SplitMix64 are
//    within 1% of uniform on every neighbour statistic we measure from
//    n = 257 up; six were still 3% off.
//  * Alternating (unbalanced) halves let the domain be the next power of two
//    instead of the next even power (< 2n instead of < 4n), so the walk pays
//    for the doubled rounds.
//  * Every draw is our own integer arithmetic (SplitMix64, rejection for
//    bounded draws), never std::uniform_int_distribution, whose output
//    differs between standard libraries: same order on every build.
#ifndef TAILCUT_ENGINE_PERMUTATION_H_
#define TAILCUT_ENGINE_PERMUTATION_H_

#include <array>
#include <cstdint>

namespace tailcut::detail {

uint64_t SplitMix64(uint64_t x) noexcept;

// Which order Permutation computes for a given (n, seed, epoch). Queues and
// checkpoints carry it in their fingerprint (engine/config.cc), so a queue or
// a state made with another order is refused, never read in a different
// order. 1: 4-round balanced Feistel. 2: this file.
inline constexpr uint64_t kPermutationVersion = 2;

class Permutation {
 public:
  // The largest n shuffled exactly by a table.
  static constexpr uint64_t kTableMax = 256;

  // O(n) for n <= kTableMax (a Fisher-Yates shuffle), O(1) above.
  Permutation(uint64_t n, uint64_t seed, uint64_t epoch) noexcept;
  // The element at position pos < n. Thread-safe (const), no allocation.
  uint64_t operator()(uint64_t pos) const noexcept;
  // out[k] = (*this)(begin + k) for k < end - begin, REQUIRES begin <= end
  // <= n. The same values, about 4x faster: one position's rounds wait on
  // each other (a multiply chain), so positions are encrypted kLanes at a
  // time, round by round, and their rounds overlap in the CPU; a position
  // that cycle-walks stays in its lane for the next pass.
  void Fill(uint64_t begin, uint64_t end, uint64_t* out) const noexcept;

 private:
  static constexpr int kRounds = 8;
  static constexpr int kLanes = 8;  // positions in flight in Fill
  uint64_t Encrypt(uint64_t x) const noexcept;
  uint64_t n_;
  int high_bits_ = 0;  // the network's state is high_bits_ | low_bits_ wide
  int low_bits_ = 0;
  uint64_t keys_[kRounds] = {};
  std::array<uint8_t, kTableMax> table_{};  // n <= kTableMax: position -> element
};

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_PERMUTATION_H_
