#include "engine/permutation.h"

#include <utility>

namespace tailcut::detail {

uint64_t SplitMix64(uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

namespace {

// The SplitMix64 generator: a stream of 64-bit draws from one word of state.
class Draws {
 public:
  explicit Draws(uint64_t state) : state_(state) {}
  uint64_t Next() noexcept {
    uint64_t out = SplitMix64(state_);
    state_ += 0x9e3779b97f4a7c15ull;
    return out;
  }
  // Uniform in [0, bound), bound > 0: draws below 2^64 mod bound are rejected,
  // so every residue has the same number of draws behind it.
  uint64_t Below(uint64_t bound) noexcept {
    const uint64_t reject_below = (0 - bound) % bound;
    uint64_t r;
    do r = Next();
    while (r < reject_below);
    return r % bound;
  }

 private:
  uint64_t state_;
};

constexpr uint64_t Mask(int bits) { return bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1; }

// Keeps the table's draws apart from the round keys of the same epoch key.
constexpr uint64_t kTableSalt = 0x7ab1e5eed0f15e2dull;

}  // namespace

Permutation::Permutation(uint64_t n, uint64_t seed, uint64_t epoch) noexcept : n_(n) {
  const uint64_t epoch_key = SplitMix64(seed ^ SplitMix64(epoch));
  if (n <= kTableMax) {
    for (uint64_t i = 0; i < n; ++i) table_[i] = static_cast<uint8_t>(i);
    Draws draws(epoch_key ^ kTableSalt);
    for (uint64_t i = n; i > 1; --i) std::swap(table_[i - 1], table_[draws.Below(i)]);
    return;
  }
  int bits = 0;
  while (bits < 64 && (uint64_t{1} << bits) < n) ++bits;
  high_bits_ = bits / 2;
  low_bits_ = bits - high_bits_;
  for (int r = 0; r < kRounds; ++r) keys_[r] = SplitMix64(epoch_key + static_cast<uint64_t>(r));
}

// Round r maps (high, low) to (low, high ^ F_r(low)): the halves swap places
// and widths each round, so after an even number of rounds the widths are
// back where they started.
uint64_t Permutation::Encrypt(uint64_t x) const noexcept {
  int high_width = high_bits_, low_width = low_bits_;
  uint64_t high = x >> low_width;
  uint64_t low = x & Mask(low_width);
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t next_low = high ^ (SplitMix64(low ^ keys_[r]) & Mask(high_width));
    high = low;
    low = next_low;
    std::swap(high_width, low_width);
  }
  static_assert(kRounds % 2 == 0, "an odd round count leaves the halves swapped");
  return (high << low_width) | low;
}

void Permutation::Fill(uint64_t begin, uint64_t end, uint64_t* out) const noexcept {
  if (n_ <= kTableMax) {
    for (uint64_t p = begin; p < end; ++p) out[p - begin] = table_[p];
    return;
  }
  // lanes: the value each lane encrypts and the slot of out it is for. Each
  // pass encrypts every live lane once (Encrypt's rounds, interleaved); a
  // value still >= n walks on in its lane (kept, compacted), the others
  // leave and free their lanes for the next positions.
  uint64_t x[kLanes], slot[kLanes];
  int live = 0;
  uint64_t next = begin;
  const uint64_t low_mask = Mask(low_bits_), high_mask = Mask(high_bits_);
  while (true) {
    while (live < kLanes && next < end) {
      x[live] = next;
      slot[live] = next - begin;
      ++live;
      ++next;
    }
    if (live == 0) return;
    uint64_t high[kLanes], low[kLanes];
    for (int i = 0; i < live; ++i) {
      high[i] = x[i] >> low_bits_;
      low[i] = x[i] & low_mask;
    }
    // Encrypt(), lane by lane within each round. The widths alternate as
    // there: after round r the low half is high_bits_ wide for even r.
    for (int r = 0; r < kRounds; ++r) {
      const uint64_t mask = (r % 2 == 0) ? high_mask : low_mask;
      for (int i = 0; i < live; ++i) {
        const uint64_t next_low = high[i] ^ (SplitMix64(low[i] ^ keys_[r]) & mask);
        high[i] = low[i];
        low[i] = next_low;
      }
    }
    int kept = 0;
    for (int i = 0; i < live; ++i) {
      const uint64_t v = (high[i] << low_bits_) | low[i];
      if (v < n_) {
        out[slot[i]] = v;
      } else {
        x[kept] = v;
        slot[kept] = slot[i];
        ++kept;
      }
    }
    live = kept;
  }
}

uint64_t Permutation::operator()(uint64_t pos) const noexcept {
  if (n_ <= kTableMax) return pos < n_ ? table_[pos] : 0;
  uint64_t x = pos;
  do {
    x = Encrypt(x);
  } while (x >= n_);
  return x;
}

}  // namespace tailcut::detail
