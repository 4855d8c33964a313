#include "engine/state_scan.h"

#include <algorithm>
#include <vector>

#include "engine/resume_point.h"
#include "tailcut/error.h"

namespace tailcut::detail {

void ScanState(const LeaseTable& table, const std::string& name, SavedState* state) {
  SavedState& s = *state;
  Segment& seg = table.segment();
  uint64_t total = table.total();
  // acquire: pairs with the release half of TakeOnce's fetch_add and
  // ApplyRestore's store: the leases reserved below it are seen by the scan.
  s.cursor = std::min(seg.cursor().next_ticket.load(std::memory_order_acquire), total);
  // Leases first, then bits: an ack sets its bit before freeing its lease,
  // so nothing acked is missed, and an item acked meanwhile is merely
  // handed out again after a restore.
  //
  // A split moves a range from its anchor to the thief's lease at the CAS
  // on the anchor's extent; a thief bumps split_seq before and after that
  // CAS. A scan that sees split_seq unchanged can only have missed a split
  // whose thief sat between its two bumps for the whole scan: its lease was
  // TAKING throughout, with its fields already written. Whether its range
  // has moved is then told by the anchor's extent as this same scan read it
  // (pending names the thief from the CAS until the piece is OPEN), so the
  // anchor and the piece are judged at one moment: never both, never none.
  // A TAKING piece that moved on during the scan makes us scan again.
  struct Seen {
    uint64_t word = 0, ticket = kNoTicket, begin = 0, end = 0, progress = 0, floor = 0, extent = 0,
             anchor = 0;
    uint32_t flags = 0;
  };
  const uint64_t num_leases = table.num_leases();
  std::vector<Seen> seen(num_leases);
  std::vector<uint64_t> acking;
  for (int scan = 0;; ++scan) {
    // seq_cst: pairs with TrySplit's two seq_cst bumps (see above).
    uint64_t split_seq = seg.counters().split_seq.load(std::memory_order_seq_cst);
    for (uint64_t l = 0; l < num_leases; ++l) {
      LeaseEntry& ls = seg.lease(l);
      Seen& v = seen[l];
      for (;;) {
        // acquire: pairs with the owners' CASes on the word, made after the
        // fields read below; the second load checks the word did not move.
        v.word = ls.word.load(std::memory_order_acquire);
        if (!ReadTicketAndFlags(ls, &v.ticket, &v.flags)) continue;
        v.begin = ls.begin.load(std::memory_order_relaxed);
        v.end = ls.end.load(std::memory_order_relaxed);
        v.progress = ls.progress.load(std::memory_order_relaxed);
        v.floor = ls.floor.load(std::memory_order_relaxed);
        // acquire: pairs with the extent CASes of TrySplit, Claim,
        // ClaimOrphan and FinishAck's seal.
        v.extent = ls.extent.load(std::memory_order_acquire);
        v.anchor = ls.anchor.load(std::memory_order_relaxed);
        // acquire: as the first load of the word.
        if (ls.word.load(std::memory_order_acquire) == v.word) break;
      }
    }
    // seq_cst: as the load before the scan.
    bool still = seg.counters().split_seq.load(std::memory_order_seq_cst) == split_seq;
    // A thief's TAKING piece is judged below by its anchor as this scan
    // read it, which holds only if the piece stayed TAKING all through the
    // scan (it leaves the anchor's pending mark once OPEN). Read its fields
    // again meanwhile: if its split happened, they were complete before it.
    for (uint64_t l = 0; l < num_leases && still; ++l) {
      Seen& v = seen[l];
      if (LeaseStateOf(v.word) != kLeaseTaking || !(v.flags & kLeasePiece)) continue;
      LeaseEntry& ls = seg.lease(l);
      still = ReadTicketAndFlags(ls, &v.ticket, &v.flags);
      v.anchor = ls.anchor.load(std::memory_order_relaxed);
      v.begin = ls.begin.load(std::memory_order_relaxed);
      v.end = ls.end.load(std::memory_order_relaxed);
      // acquire: as in the scan above.
      still = still && ls.word.load(std::memory_order_acquire) == v.word;
    }
    if (still) break;
    if (scan == 100)
      throw Error(ErrorKind::kTimeout,
                  "queue '" + name +
                      "': tails kept being split while "
                      "saving the state; retry, or open the queues with split_tail=false");
  }
  for (uint64_t l = 0; l < num_leases; ++l) {
    const Seen& v = seen[l];
    uint64_t state = LeaseStateOf(v.word);
    if (v.ticket >= total || v.begin > v.end) continue;
    uint64_t end = v.end;
    if (!(v.flags & kLeasePreset))  // a split lowers an anchor's end
      end = std::min(end, v.begin + Extent::Of(v.extent).end * SplitUnit(v.end - v.begin));
    if (state == kLeaseAcking) {
      acking.push_back(v.ticket);
    } else if (state == kLeaseOpen || state == kLeaseOrphan) {
      const uint64_t resume = CheckpointResume(v.word, v.begin, v.floor, v.progress);
      s.pieces.push_back({v.ticket, std::clamp(resume, v.begin, end), end});
    } else if (state == kLeaseTaking && (v.flags & kLeasePiece)) {
      if (v.anchor < num_leases && Extent::Of(seen[v.anchor].extent).pending == l + 1)
        s.pieces.push_back({v.ticket, v.begin, v.end});
    } else if (state == kLeaseTaking && !(seg.IsDone(v.ticket) && !(v.flags & kLeasePreset))) {
      const WorkQueue::Item& item =
          table.items()[table.ItemAt(v.ticket / s.num_items, v.ticket % s.num_items)];
      s.pieces.push_back({v.ticket, item.begin, item.end});
    }
  }
  uint64_t words = (s.cursor + 63) / 64;
  std::vector<uint64_t> bits(words);
  // acquire: pairs with FinishAck's acq_rel fetch_or (lease.cc); read
  // after the leases (see above).
  for (uint64_t i = 0; i < words; ++i) bits[i] = seg.done_word(i).load(std::memory_order_acquire);
  // Only tickets below the cursor: one taken after we read it is handed
  // out again, whole, after a restore; a bit or a piece of it here would
  // make the restore skip some of it.
  if (s.cursor % 64 != 0) bits[words - 1] &= (uint64_t{1} << (s.cursor % 64)) - 1;
  std::erase_if(s.pieces, [&](const Piece& p) { return p.ticket >= s.cursor; });
  for (uint64_t t : acking)
    if (t < s.cursor) bits[t / 64] |= uint64_t{1} << (t % 64);
  for (const Piece& p : s.pieces) bits[p.ticket / 64] |= uint64_t{1} << (p.ticket % 64);
  s.low = 0;
  while (s.low < s.cursor && ((bits[s.low / 64] >> (s.low % 64)) & 1)) ++s.low;
  s.words.assign(bits.begin() + static_cast<long>(s.low / 64), bits.end());
}

}  // namespace tailcut::detail
