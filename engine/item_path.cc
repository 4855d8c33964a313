// The table behind ItemPath's debug check (tailcut/item_path.h) and the
// WorkQueue slots in it (engine/item_path_token.h).
#include "tailcut/item_path.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "engine/item_path_token.h"

namespace tailcut::detail {
namespace {

constexpr uint32_t kGenerationBits = 20;
constexpr uint32_t kGenerationMask = (1u << kGenerationBits) - 1;
constexpr uint32_t kSlots = 1u << (32 - kGenerationBits);  // slot 0 unused: token 0

// relaxed throughout: a slot's value is read only by a thread that the
// queue's construction (or destruction) happens-before, or that races with
// it and breaks the contract; no other data is published through it.
std::atomic<uint32_t> g_slots[kSlots];
std::atomic<uint32_t> g_generation{0};

}  // namespace

ItemPathToken::ItemPathToken() noexcept : token_(0) {
  uint32_t generation = 0;
  while (generation == 0)
    generation = g_generation.fetch_add(1, std::memory_order_relaxed) & kGenerationMask;
  for (uint32_t slot = 1; slot < kSlots; ++slot) {
    uint32_t free = 0;
    if (g_slots[slot].compare_exchange_strong(free, generation, std::memory_order_relaxed)) {
      token_ = slot << kGenerationBits | generation;
      return;
    }
  }
}

ItemPathToken::~ItemPathToken() {
  if (token_ != 0) g_slots[token_ >> kGenerationBits].store(0, std::memory_order_relaxed);
}

void CheckItemPath(uint32_t queue_token) noexcept {
  if (g_slots[queue_token >> kGenerationBits].load(std::memory_order_relaxed) ==
      (queue_token & kGenerationMask))
    return;
  std::fprintf(stderr,
               "tailcut: WorkItem::path read after its WorkQueue was destroyed: the path "
               "points into the queue's own table; copy it (std::string(item.path)) to keep it "
               "past the queue\n");
  std::abort();
}

}  // namespace tailcut::detail
