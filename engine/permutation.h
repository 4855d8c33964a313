// Seeded bijections of [0, n) for per-epoch shuffling.
//
// A balanced Feistel network over the smallest even power of two >= n, with
// cycle walking: apply the network until the value falls inside [0, n).
// Because the network is a bijection of its domain, walking gives a bijection
// of [0, n); the domain is < 4n, so a walk takes fewer than 4 steps on
// average. No per-epoch arrays: any process computes any position, and the
// whole order is (n, seed, epoch).
#ifndef TAILCUT_ENGINE_PERMUTATION_H_
#define TAILCUT_ENGINE_PERMUTATION_H_

#include <cstdint>

namespace tailcut::detail {

uint64_t SplitMix64(uint64_t x) noexcept;

class Permutation {
 public:
  Permutation(uint64_t n, uint64_t seed, uint64_t epoch) noexcept;
  // The element at position pos < n. Thread-safe (const).
  uint64_t operator()(uint64_t pos) const noexcept;

 private:
  static constexpr int kRounds = 4;
  uint64_t Encrypt(uint64_t x) const noexcept;
  uint64_t n_;
  int half_bits_;
  uint64_t half_mask_;
  uint64_t keys_[kRounds];
};

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_PERMUTATION_H_
