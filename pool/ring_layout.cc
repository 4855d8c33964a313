#include "pool/ring_layout.h"

namespace tailcut::detail {

namespace {

size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

}  // namespace

uint32_t RingCellsFor(uint32_t num_slots) {
  uint32_t cells = 2;
  while (cells < 2 * num_slots) cells *= 2;
  return cells;
}

RingGeometry ComputeRingGeometry(uint64_t slot_bytes, uint32_t num_slots, uint32_t max_clients) {
  RingGeometry g;
  // Reject counts that could overflow the sums below before using them.
  if (slot_bytes == 0 || slot_bytes > (uint64_t{1} << 36) || num_slots == 0 ||
      num_slots > kMaxRingSlots || max_clients == 0 || max_clients > kMaxRingClients)
    return g;
  g.slot_bytes = slot_bytes;
  g.slot_stride = AlignUp(slot_bytes, kSlotAlign);
  g.num_slots = num_slots;
  g.max_clients = max_clients;
  g.ring_cells = RingCellsFor(num_slots);
  size_t off = AlignUp(sizeof(RingHeader), kRingCacheLine);
  g.counters = off;
  off = AlignUp(off + sizeof(RingCounters), kRingCacheLine);
  g.clients = off;
  off = AlignUp(off + sizeof(RingClient) * max_clients, kRingCacheLine);
  g.slots = off;
  off = AlignUp(off + sizeof(SlotHeader) * num_slots, kRingCacheLine);
  g.free_ring = off;
  off = AlignUp(off + sizeof(IdRing), kRingCacheLine);
  g.free_cells = off;
  off = AlignUp(off + sizeof(uint64_t) * g.ring_cells, kRingCacheLine);
  g.ready_ring = off;
  off = AlignUp(off + sizeof(IdRing), kRingCacheLine);
  g.ready_cells = off;
  off = AlignUp(off + sizeof(uint64_t) * g.ring_cells, kSlotAlign);
  g.arena = off;
  g.total = off + g.slot_stride * num_slots;
  return g;
}

}  // namespace tailcut::detail
