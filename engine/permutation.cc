#include "engine/permutation.h"

namespace tailcut::detail {

uint64_t SplitMix64(uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

Permutation::Permutation(uint64_t n, uint64_t seed, uint64_t epoch) noexcept : n_(n) {
  int bits = 0;
  while (bits < 64 && (uint64_t{1} << bits) < n) ++bits;
  half_bits_ = (bits + 1) / 2;
  if (half_bits_ == 0) half_bits_ = 1;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  uint64_t epoch_key = SplitMix64(seed ^ SplitMix64(epoch));
  for (int r = 0; r < kRounds; ++r) keys_[r] = SplitMix64(epoch_key + static_cast<uint64_t>(r));
}

uint64_t Permutation::Encrypt(uint64_t x) const noexcept {
  uint64_t left = x >> half_bits_;
  uint64_t right = x & half_mask_;
  for (int r = 0; r < kRounds; ++r) {
    uint64_t next = left ^ (SplitMix64(right ^ keys_[r]) & half_mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t Permutation::operator()(uint64_t pos) const noexcept {
  if (n_ <= 1) return 0;
  uint64_t x = pos;
  do {
    x = Encrypt(x);
  } while (x >= n_);
  return x;
}

}  // namespace tailcut::detail
