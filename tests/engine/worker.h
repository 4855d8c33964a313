// tests/engine/worker.h: the body of a worker child (RunWorker: take,
// optionally Claim chunks like tailcut's Reader, ack / give back / commit),
// logging "about to ack" before each Ack and "acked" after it, and what the
// parent reads from those logs (CountAcks, CountKind, AddAckedBeforeSave).
#ifndef TAILCUT_TESTS_ENGINE_WORKER_H_
#define TAILCUT_TESTS_ENGINE_WORKER_H_

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tailcut/work_queue.h"
#include "tests/engine/children.h"
#include "tests/engine/coverage.h"
#include "tests/engine/queue_fixture.h"
#include "tests/engine/test_basics.h"

namespace tailcut::test {

// What a queue restored from a state saved during [save_begin, save_end)
// (record seqs) may take as done, from one process's log of the run the
// state was saved from: its acks that finished before the save began surely,
// and its acks and Progress calls that began before the save ended maybe (a
// Progress offset is where a restored item may resume). An ack a killed process may
// or may not have finished counts as overlapping.
inline void AddAckedBeforeSave(Coverage* cov, const std::vector<Record>& log, bool killed,
                               uint64_t save_begin, uint64_t save_end) {
  std::optional<Record> pending;
  for (const Record& r : log) {
    if (r.kind == Rec::kIntent) pending = r;
    if (r.kind == Rec::kStale) pending.reset();
    if (r.kind == Rec::kProgress && r.seq < save_end)
      cov->AddUncertain(r.epoch, r.index, r.begin, r.end);
    if (r.kind == Rec::kAcked) {
      if (r.seq < save_begin) {
        cov->Add(r.epoch, r.index, r.begin, r.end);
      } else if (pending && pending->seq < save_end) {
        cov->AddUncertain(r.epoch, r.index, r.begin, r.end);
      }
      pending.reset();
    }
  }
  if (pending && pending->seq < save_end && killed) {
    cov->AddUncertain(pending->epoch, pending->index, pending->begin, pending->end);
  }
}

// What a worker child does with each item (see RunWorker).
struct WorkerOptions {
  uint32_t batch = 1;    // items held at once (taken, then acked in random order)
  double give_back = 0;  // chance to GiveBack an item instead of acking it
  double progress = 0;   // chance to report Progress before the ack
  // Chance to Commit half of what it consumed before the ack (or give-back),
  // logged as an ack of that half (kIntent, kAcked): the rest comes back
  // from there, to whoever takes the item next.
  double commit = 0;
  uint64_t spin_us = 0;           // busy work per item
  uint64_t sleep_us = 0;          // sleep per item
  uint64_t stop_after = ~0ull;    // return after this many acks, without reaching the end
  bool allow_stale = false;       // kStale acks are logged, not failures
  uint64_t die_after_takes = 0;   // SIGKILL itself right after this many takes (0: never)
  uint64_t stop_after_takes = 0;  // SIGSTOP itself right after this many takes (0: never)
  // Read like tailcut's Reader: Claim each chunk of this many bytes before
  // "reading" it (spinning chunk_spin_us), stop at the end Claim reports (a
  // tail split off by another process). 0: no Claim, the item is never split.
  uint64_t claim_chunk = 0;
  uint64_t chunk_spin_us = 0;
  milliseconds take_timeout{20000};  // a Take that waits this long is a hang
  uint64_t rng_seed = 1;
};

// Child values RunWorker sets.
enum WorkerValue : int { kValueNumItems = 15, kValueTakeEnd = 14 };

// The body of a worker child: takes until kEnd (or stop_after acks), logging
// kTaken, kIntent (before Ack), kAcked / kStale (after) and kGaveBack. Returns
// the exit code for the child.
inline int RunWorker(WorkQueue& q, ChildContext& c, const WorkerOptions& w) {
  std::mt19937_64 rng(w.rng_seed * 0x9E3779B97F4A7C15ull + c.index());
  std::uniform_real_distribution<double> coin(0, 1);
  c.SetValue(kValueNumItems, q.num_items());
  std::vector<WorkItem> batch;
  batch.reserve(w.batch);
  uint64_t acked = 0, taken = 0;
  for (;;) {
    batch.clear();
    TakeStatus last = TakeStatus::kOk;
    while (batch.size() < w.batch) {
      WorkItem it;
      last = batch.empty() ? q.Take(&it, Clock::now() + w.take_timeout) : q.TryTake(&it);
      if (last != TakeStatus::kOk) break;
      if (std::string bad = CheckItem(q, it); !bad.empty()) return c.Fail("bad item: " + bad);
      c.Log(Rec::kTaken, it);
      batch.push_back(it);
      ++taken;
      if (taken == w.die_after_takes) ::raise(SIGKILL);
      if (taken == w.stop_after_takes) ::raise(SIGSTOP);
    }
    if (batch.empty()) {
      if (last == TakeStatus::kEnd) {
        c.SetValue(kValueTakeEnd, 1);
        return 0;
      }
      return c.Fail(std::string("Take returned ") + StatusName(last) + " (deadline " +
                    std::to_string(w.take_timeout.count()) +
                    " ms): the queue neither handed out an item nor ended");
    }
    std::shuffle(batch.begin(), batch.end(), rng);
    for (const WorkItem& it : batch) {
      if (w.sleep_us > 0) ::usleep(static_cast<useconds_t>(w.sleep_us));
      if (w.spin_us > 0) Spin(w.spin_us);
      // The bytes this process consumed: all of the item, or with Claim up
      // to where another process split the tail off.
      uint64_t covered_end = it.end;
      if (w.claim_chunk > 0) {
        uint64_t pos = it.begin, end = it.end;
        while (pos < end) {
          const uint64_t up_to = std::min(pos + w.claim_chunk, it.end);
          const ItemStatus cs = q.Claim(it, up_to, &end);
          if (cs == ItemStatus::kStale && w.allow_stale) break;
          if (cs != ItemStatus::kOk) return c.Fail(std::string("Claim returned ") + StatusName(cs));
          if (end > it.end || end < pos) {
            return c.Fail("Claim moved the end of ticket " + std::to_string(it.ticket) + " to " +
                          std::to_string(end) + ", outside [" + std::to_string(pos) + ", " +
                          std::to_string(it.end) + "]");
          }
          if (pos >= end) break;
          pos = std::min(up_to, end);
          if (w.chunk_spin_us > 0) Spin(w.chunk_spin_us);
        }
        covered_end = pos;
      }
      uint64_t from = it.begin;
      if (w.commit > 0 && coin(rng) < w.commit && covered_end > it.begin) {
        Record handed{Rec::kIntent,
                      it.piece ? 1u : 0u,
                      it.epoch,
                      it.index,
                      it.ticket,
                      it.begin,
                      it.begin + (covered_end - it.begin) / 2};
        c.Log(handed);
        const ItemStatus cs = q.Commit(it, handed.end);
        if (cs == ItemStatus::kStale && w.allow_stale) {
          c.Log(Rec::kStale, it);
          continue;
        }
        if (cs != ItemStatus::kOk) return c.Fail(std::string("Commit returned ") + StatusName(cs));
        handed.kind = Rec::kAcked;
        c.Log(handed);
        from = handed.end;
      }
      const Record consumed{Rec::kIntent, it.piece ? 1u : 0u, it.epoch, it.index, it.ticket,
                            from,         covered_end};
      if (w.progress > 0 && coin(rng) < w.progress) {
        // Half of what this process consumed, as a reader reports it.
        const uint64_t offset = it.begin + (covered_end - it.begin) / 2;
        c.Log(Record{Rec::kProgress, 0, it.epoch, it.index, it.ticket, it.begin, offset});
        const ItemStatus p = q.Progress(it, offset, 1);
        if (p != ItemStatus::kOk && !(p == ItemStatus::kStale && w.allow_stale)) {
          return c.Fail(std::string("Progress returned ") + StatusName(p));
        }
      }
      if (w.give_back > 0 && coin(rng) < w.give_back) {
        const ItemStatus g = q.GiveBack(it);
        if (g == ItemStatus::kOk) {
          c.Log(Rec::kGaveBack, it);
          continue;
        }
        if (!(g == ItemStatus::kStale && w.allow_stale)) {
          return c.Fail(std::string("GiveBack returned ") + StatusName(g));
        }
        c.Log(Rec::kStale, it);
        continue;
      }
      c.Log(consumed);
      const ItemStatus a = q.Ack(it);
      if (a == ItemStatus::kOk) {
        Record done = consumed;
        done.kind = Rec::kAcked;
        c.Log(done);
        ++acked;
      } else if (a == ItemStatus::kStale && w.allow_stale) {
        c.Log(Rec::kStale, it);
      } else {
        return c.Fail("Ack of ticket " + std::to_string(it.ticket) + " returned " + StatusName(a));
      }
    }
    if (acked >= w.stop_after) return 0;
  }
}

// Adds child i's kAcked records to counts (indexed by Key()).
inline void CountAcks(const Children& kids, size_t i, uint64_t num_items,
                      std::vector<uint32_t>* counts) {
  for (const Record& r : kids.Records(i)) {
    if (r.kind != Rec::kAcked) continue;
    const uint64_t k = Key(num_items, r.epoch, r.index);
    if (k < counts->size()) (*counts)[k]++;
  }
}

inline uint64_t CountKind(const Children& kids, size_t i, Rec kind) {
  uint64_t n = 0;
  for (const Record& r : kids.Records(i)) n += r.kind == kind;
  return n;
}

}  // namespace tailcut::test

#endif  // TAILCUT_TESTS_ENGINE_WORKER_H_
