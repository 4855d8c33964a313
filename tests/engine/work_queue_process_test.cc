// Many processes on one WorkQueue: exactly once per epoch, fast processes
// take more, racing creators share one queue, lease timeouts reassign the
// items of a hung process and refuse its late acks, items a holder gave back or
// left come back at once, client slots of dead processes are reused.
//
// Every child opens its own WorkQueue and reports through shared memory
// (queue_test_util.h); every wait has a deadline, and a child still running
// then is killed and reported as hung.
#include <map>
#include <set>

#include "tests/engine/queue_test_util.h"

namespace tailcut::test {
namespace {

using std::chrono::milliseconds;

constexpr uint64_t kMiB = 1 << 20;

class WorkQueueProcessTest : public QueueTest {};

TEST_F(WorkQueueProcessTest, SixteenProcessesTakeEachItemExactlyOncePerEpochAndFastOnesTakeMore) {
  constexpr int kProcs = 16;
  auto o = BaseOptions(NewName("sixteen"), dir_.Files("f", 6, {kMiB, 2 * kMiB, 3 * kMiB}));
  o.num_slices = 3000;
  o.num_epochs = 3;
  o.num_clients = kProcs;
  o.seed = 99;
  const uint64_t cap = 4 * 3200 * 3 + 64;
  Children kids(kProcs, cap);
  StartGate gate;
  for (int k = 0; k < kProcs; ++k) {
    kids.Spawn([&](ChildContext& c) {
      auto q = WorkQueue::Open(o);
      c.SetValue(0, 1);
      if (!gate.Wait(milliseconds(30000))) return c.Fail("start gate never opened");
      WorkerOptions w;
      // Odd children are 4x slower per item.
      w.sleep_us = c.index() % 2 == 1 ? 800 : 200;
      w.rng_seed = 5;
      const int rc = RunWorker(*q, c, w);
      q->Close();
      return rc;
    });
  }
  for (int k = 0; k < kProcs; ++k)
    ASSERT_EQ(kids.WaitValue(k, 0, milliseconds(30000)), 1u) << kids.Error(k);
  const auto t0 = Clock::now();
  gate.Open();
  const auto results = kids.WaitAll(milliseconds(90000));
  RecordProperty("elapsed_ms", std::to_string(MillisSince(t0)));
  const uint64_t n = kids.Value(0, kValueNumItems);
  ASSERT_GE(n, 2990u);
  std::vector<uint32_t> counts(n * 3);
  double fast = 0, slow = 0;
  for (int k = 0; k < kProcs; ++k) {
    EXPECT_TRUE(results[k].Ok()) << "child " << k << " " << results[k].Describe();
    EXPECT_EQ(kids.Value(k, kValueTakeEnd), 1u) << "child " << k << " never saw kEnd";
    EXPECT_FALSE(kids.Overflowed(k));
    CountAcks(kids, k, n, &counts);
    (k % 2 == 1 ? slow : fast) += static_cast<double>(CountKind(kids, k, Rec::kAcked));
  }
  EXPECT_EQ(ExactlyOnce(counts, n), "");
  fast /= kProcs / 2;
  slow /= kProcs / 2;
  RecordProperty("mean_items_fast", std::to_string(fast));
  RecordProperty("mean_items_slow", std::to_string(slow));
  // About 3x in practice; 1.5x leaves room for a loaded machine.
  EXPECT_GT(fast, 1.5 * slow) << "processes 4x faster per item should take clearly more items";
  EXPECT_FALSE(PathExists(SegmentPath(o.name)))
      << "the last process should remove the finished queue";
}

TEST_F(WorkQueueProcessTest, ProcessesHoldingSeveralItemsAndGivingSomeBackStillAckEachOnce) {
  constexpr int kProcs = 6;
  auto o = BaseOptions(NewName("batches"), dir_.Files("f", 4, {kMiB}));
  o.num_slices = 600;
  o.num_epochs = 2;
  o.num_clients = kProcs;
  o.leases_per_client = 4;
  Children kids(kProcs, 8 * 1200 + 64);
  for (int k = 0; k < kProcs; ++k) {
    kids.Spawn([&](ChildContext& c) {
      auto q = WorkQueue::Open(o);
      WorkerOptions w;
      w.batch = 1 + c.index() % 4;
      w.give_back = 0.1;
      w.progress = 0.3;
      w.spin_us = 30;
      w.rng_seed = 17;
      return RunWorker(*q, c, w);  // the destructor closes
    });
  }
  const auto results = kids.WaitAll(milliseconds(60000));
  const uint64_t n = kids.Value(0, kValueNumItems);
  ASSERT_GT(n, 0u);
  std::vector<uint32_t> counts(n * 2);
  uint64_t gave_back = 0;
  for (int k = 0; k < kProcs; ++k) {
    EXPECT_TRUE(results[k].Ok()) << "child " << k << " " << results[k].Describe();
    CountAcks(kids, k, n, &counts);
    gave_back += CountKind(kids, k, Rec::kGaveBack);
  }
  EXPECT_EQ(ExactlyOnce(counts, n), "");
  EXPECT_GT(gave_back, 0u);
  RecordProperty("given_back", std::to_string(gave_back));
  EXPECT_FALSE(PathExists(SegmentPath(o.name)));
}

// Items handed back (GiveBack, recovery) while other processes look for
// one must never become invisible: the end of the data is where this races.
TEST_F(WorkQueueProcessTest, ItemsGivenBackAtTheEndOfTheDataAreNeverLost) {
  constexpr int kRounds = 60;
  constexpr int kProcs = 6;
  const auto works = dir_.Files("f", 3, {kMiB});
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto o = BaseOptions(NewName("giveback_end"), works);
    o.num_slices = 30;
    o.num_clients = kProcs;
    Children kids(kProcs, 2000);
    StartGate gate;
    for (int k = 0; k < kProcs; ++k) {
      kids.Spawn([&](ChildContext& c) {
        auto q = WorkQueue::Open(o);
        if (!gate.Wait(milliseconds(20000))) return c.Fail("gate");
        WorkerOptions w;
        w.batch = 2;
        w.give_back = 0.5;
        w.take_timeout = milliseconds(5000);
        w.rng_seed = 1000 + round;
        return RunWorker(*q, c, w);
      });
    }
    gate.Open();
    const auto results = kids.WaitAll(milliseconds(30000));
    const uint64_t n = kids.Value(0, kValueNumItems);
    std::vector<uint32_t> counts(n);
    for (int k = 0; k < kProcs; ++k) {
      EXPECT_TRUE(results[k].Ok()) << "child " << k << " " << results[k].Describe();
      CountAcks(kids, k, n, &counts);
    }
    EXPECT_EQ(ExactlyOnce(counts, n), "");
    if (HasFailure()) break;
  }
}

// Processes that read like tailcut's Reader (Claim before each chunk): the
// fast ones run dry and split the tails of the slow one's items. Every byte
// of every item of every epoch is acked exactly once.
TEST_F(WorkQueueProcessTest, SplitTailsAreAckedExactlyOnceByteForByte) {
  constexpr int kProcs = 4;
  const auto works = dir_.Files("f", 6, {4 * kMiB, 3 * kMiB + 12345});
  auto o = BaseOptions(NewName("split_bytes"), works);
  o.num_epochs = 2;
  o.num_clients = kProcs;
  o.min_split_bytes = 128 << 10;
  Children kids(kProcs, 4096);
  StartGate slow_gate, fast_gate;
  for (int k = 0; k < kProcs; ++k) {
    kids.Spawn([&](ChildContext& c) {
      auto q = WorkQueue::Open(o);
      c.SetValue(3, 1);
      StartGate& mine = c.index() == 0 ? slow_gate : fast_gate;
      (c.index() == 0 ? fast_gate : slow_gate).CloseInChild();
      if (!mine.Wait(milliseconds(20000))) return c.Fail("gate");
      WorkerOptions w;
      w.claim_chunk = 32 << 10;
      // Process 0 is slow: ~100 ms per item, longer than idle processes
      // sleep between looks for a tail to split (they are not woken by Claim).
      w.chunk_spin_us = c.index() == 0 ? 800 : 2;
      w.rng_seed = 77;
      const int rc = RunWorker(*q, c, w);
      c.SetValue(2, 1 + q->Stats().splits);
      return rc;
    });
  }
  for (int k = 0; k < kProcs; ++k)
    ASSERT_EQ(kids.WaitValue(k, 3, milliseconds(20000)), 1u) << kids.Error(k);
  // The slow process takes its first item before the others start.
  slow_gate.Open();
  ::usleep(5000);
  fast_gate.Open();
  const auto results = kids.WaitAll(milliseconds(60000));
  Coverage cov(ItemTable(works, std::nullopt), 2);
  uint64_t pieces = 0;
  for (int k = 0; k < kProcs; ++k) {
    EXPECT_TRUE(results[k].Ok()) << "child " << k << " " << results[k].Describe();
    for (const Record& r : kids.Records(k)) {
      if (r.kind != Rec::kAcked) continue;
      EXPECT_TRUE(cov.Add(r.epoch, r.index, r.begin, r.end));
      pieces += r.flags;
    }
  }
  EXPECT_EQ(cov.Check(), "");
  RecordProperty("pieces", std::to_string(pieces));
  EXPECT_GT(pieces, 0u) << "fast readers should have split the slow reader's tails";
  EXPECT_FALSE(PathExists(SegmentPath(o.name)));
}

TEST_F(WorkQueueProcessTest, RacingCreatorsShareOneQueueAndOneSeed) {
  constexpr int kRounds = 8;
  constexpr int kProcs = 12;
  const auto works = dir_.Files("f", 3, {kMiB});
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto o = BaseOptions(NewName("race"), works);
    o.num_slices = 200;
    o.num_clients = kProcs;  // seed unset: the creator draws it
    Children kids(kProcs, 4 * 200 + 64);
    StartGate gate;
    for (int k = 0; k < kProcs; ++k) {
      kids.Spawn([&](ChildContext& c) {
        if (!gate.Wait(milliseconds(30000))) return c.Fail("start gate never opened");
        std::string notices;
        auto mine = o;
        mine.on_notice = [&](const std::string& s) { notices += s + "\n"; };
        auto q = WorkQueue::Open(mine);
        c.SetValue(1, q->seed() | 1ull << 63);  // never 0
        c.SetValue(2, q->Stats().seed | 1ull << 63);
        if (ContainsNoCase(notices, "replac") || ContainsNoCase(notices, "resum")) {
          return c.Fail("a racing creator saw a stale queue: " + notices);
        }
        WorkerOptions w;
        w.spin_us = 10;
        return RunWorker(*q, c, w);
      });
    }
    gate.Open();
    const auto results = kids.WaitAll(milliseconds(60000));
    const uint64_t n = kids.Value(0, kValueNumItems);
    std::vector<uint32_t> counts(n);
    std::set<uint64_t> seeds;
    for (int k = 0; k < kProcs; ++k) {
      EXPECT_TRUE(results[k].Ok()) << "child " << k << " " << results[k].Describe();
      seeds.insert(kids.Value(k, 1));
      seeds.insert(kids.Value(k, 2));
      CountAcks(kids, k, n, &counts);
    }
    EXPECT_EQ(seeds.size(), 1u) << "every process must use the seed the creator drew";
    EXPECT_EQ(ExactlyOnce(counts, n), "");
    EXPECT_FALSE(PathExists(SegmentPath(o.name)));
    if (HasFailure()) break;
  }
}

// One of five processes opening a queue at once is SIGKILLed at a random
// moment of its Open (creating, or waiting for the queue's lock): the other
// four must still open the one queue, not time out behind a dead process.
TEST_F(WorkQueueProcessTest, ProcessKilledWhileOthersOpenTheQueueStrandsNobody) {
  constexpr int kRounds = 200;
  const auto works = dir_.Files("f", 1, {kMiB});
  const uint64_t seed = TestSeed();
  RecordProperty("seed", std::to_string(seed));
  std::mt19937_64 rng(seed);
  int killed = 0;
  for (int round = 0; round < kRounds; ++round) {
    auto o = BaseOptions(NewName("open_kill"), works);
    o.keep_unfinished = true;  // a survivor that closes first must not remove it under the others
    o.num_slices = 100;
    o.attach_timeout = milliseconds(2000);
    Children kids(5, 4);
    for (int k = 0; k < 5; ++k) {
      kids.Spawn([&](ChildContext& c) {
        auto q = WorkQueue::Open(o);
        c.SetValue(1, q->seed() | 1ull << 63);
        return 0;
      });
    }
    const auto start = Clock::now();
    const auto kill_at = start + std::chrono::microseconds(rng() % 3000);
    while (Clock::now() < kill_at && !kids.Poll(0)) ::usleep(20);
    kids.Kill(0, SIGKILL);
    killed += kids.Wait(0, milliseconds(10000)).Killed();
    std::set<uint64_t> seeds;
    for (int k = 1; k < 5; ++k) {
      const ChildResult r = kids.Wait(k, milliseconds(20000));
      EXPECT_TRUE(r.Ok()) << "round " << round << ", process " << k << ": " << r.Describe()
                          << " (TAILCUT_TEST_SEED=" << seed << ")";
      seeds.insert(kids.Value(k, 1));
    }
    EXPECT_EQ(seeds.size(), 1u) << "round " << round << ": the survivors opened different queues";
    if (HasFailure()) break;
  }
  RecordProperty("victims_killed", std::to_string(killed));
}

TEST_F(WorkQueueProcessTest, HungProcessLosesItsItemAfterTheLeaseTimeoutAndItsAckIsStale) {
  auto o = BaseOptions(NewName("lease"), dir_.Files("f", 40, {1000}));
  o.lease_timeout = milliseconds(200);
  Children kids(2, 512);
  // A: takes one item, stops itself, and after SIGCONT tries to finish it.
  kids.Spawn([&](ChildContext& c) {
    auto q = WorkQueue::Open(o);
    WorkItem it;
    if (q->TryTake(&it) != TakeStatus::kOk) return c.Fail("take");
    c.Log(Rec::kTaken, it);
    c.SetValue(0, 1);
    ::raise(SIGSTOP);
    c.SetValue(1, 1 + static_cast<uint64_t>(q->Progress(it, it.begin + 1)));
    const ItemStatus a = q->Ack(it);
    c.SetValue(2, 1 + static_cast<uint64_t>(a));
    c.Log(a == ItemStatus::kOk ? Rec::kAcked : Rec::kStale, it);
    const QueueStats s = q->Stats();
    c.SetValue(3, 1 + s.stale_acks);
    for (const ClientStats& cs : s.clients) {
      if (cs.pid == ::getpid()) c.SetValue(4, 1 + cs.stale_acks);
    }
    c.SetValue(6, 1 + s.recovered_items);
    WorkItem next;
    c.SetValue(5, 1 + static_cast<uint64_t>(q->Take(&next, Clock::now() + milliseconds(10000))));
    q->Close();
    return 0;
  });
  ASSERT_EQ(kids.WaitValue(0, 0, milliseconds(20000)), 1u) << kids.Error(0);
  ASSERT_TRUE(kids.WaitStopped(0, milliseconds(20000)));
  const Record held = kids.Records(0).at(0);
  // B: runs the queue to its end, which needs A's item back.
  const auto t0 = Clock::now();
  kids.Spawn([&](ChildContext& c) {
    auto q = WorkQueue::Open(o);
    WorkerOptions w;
    w.take_timeout = milliseconds(15000);
    const int rc = RunWorker(*q, c, w);
    q->Close();
    return rc;
  });
  const ChildResult b = kids.Wait(1, milliseconds(30000));
  RecordProperty("b_ms", std::to_string(MillisSince(t0)));
  EXPECT_TRUE(b.Ok()) << "B " << b.Describe();
  bool b_got_it = false;
  for (const Record& r : kids.Records(1)) {
    if (r.kind == Rec::kAcked && r.epoch == held.epoch && r.index == held.index) b_got_it = true;
  }
  EXPECT_TRUE(b_got_it) << "the stopped process's item was not reassigned";

  ::kill(kids.pid(0), SIGCONT);
  const ChildResult a = kids.Wait(0, milliseconds(20000));
  EXPECT_TRUE(a.Ok()) << "A " << a.Describe();
  EXPECT_EQ(kids.Value(0, 1), 1 + static_cast<uint64_t>(ItemStatus::kStale))
      << "Progress after reassignment";
  EXPECT_EQ(kids.Value(0, 2), 1 + static_cast<uint64_t>(ItemStatus::kStale))
      << "Ack after reassignment";
  EXPECT_GE(kids.Value(0, 3), 2u) << "Stats().stale_acks should count the refused ack";
  EXPECT_EQ(kids.Value(0, 4), 2u) << "the client's own stale_acks should be 1";
  EXPECT_GE(kids.Value(0, 6), 2u) << "Stats().recovered_items should count the reassigned item";
  EXPECT_EQ(kids.Value(0, 5), 1 + static_cast<uint64_t>(TakeStatus::kEnd))
      << "A's Take after everything was done";

  std::vector<uint32_t> counts(40);
  CountAcks(kids, 0, 40, &counts);
  CountAcks(kids, 1, 40, &counts);
  EXPECT_EQ(ExactlyOnce(counts, 40), "");
  EXPECT_FALSE(PathExists(SegmentPath(o.name)));
}

// A process's own stop_timeout: stopped (SIGSTOP), it loses its item to the
// others without any lease timeout, and after SIGCONT its calls on it are
// stale; only slow (no queue call for several stop timeouts, but running),
// it keeps its item, since its holder thread beats.
TEST_F(WorkQueueProcessTest, AStoppedProcessLosesItsItemAfterItsStopTimeoutAndASlowOneKeepsIt) {
  auto o = BaseOptions(NewName("stop"), dir_.Files("f", 40, {1000}));
  o.num_clients = 3;
  WorkQueueOptions mine = o;
  mine.stop_timeout = milliseconds(300);
  Children kids(3, 512);
  // A: takes one item, stops itself, and after SIGCONT tries to finish it.
  kids.Spawn([&](ChildContext& c) {
    auto q = WorkQueue::Open(mine);
    WorkItem it;
    if (q->TryTake(&it) != TakeStatus::kOk) return c.Fail("take");
    c.Log(Rec::kTaken, it);
    c.SetValue(0, 1);
    ::raise(SIGSTOP);
    c.SetValue(1, 1 + static_cast<uint64_t>(q->Progress(it, it.begin + 1)));
    const ItemStatus a = q->Ack(it);
    c.SetValue(2, 1 + static_cast<uint64_t>(a));
    c.Log(a == ItemStatus::kOk ? Rec::kAcked : Rec::kStale, it);
    q->Close();
    return 0;
  });
  // S: takes one item and works on it for 2 s (ten stop timeouts) without a
  // queue call, then acks it.
  kids.Spawn([&](ChildContext& c) {
    auto q = WorkQueue::Open(mine);
    WorkItem it;
    if (q->TryTake(&it) != TakeStatus::kOk) return c.Fail("take");
    c.Log(Rec::kTaken, it);
    c.SetValue(0, 1);
    std::this_thread::sleep_for(milliseconds(2000));
    const ItemStatus a = q->Ack(it);
    c.SetValue(2, 1 + static_cast<uint64_t>(a));
    c.Log(a == ItemStatus::kOk ? Rec::kAcked : Rec::kStale, it);
    q->Close();
    return 0;
  });
  ASSERT_EQ(kids.WaitValue(0, 0, milliseconds(20000)), 1u) << kids.Error(0);
  ASSERT_EQ(kids.WaitValue(1, 0, milliseconds(20000)), 1u) << kids.Error(1);
  ASSERT_TRUE(kids.WaitStopped(0, milliseconds(20000)));
  const Record stopped = kids.Records(0).at(0), slow = kids.Records(1).at(0);
  // B: no timeout of its own; runs the queue to its end, which needs both.
  const auto t0 = Clock::now();
  kids.Spawn([&](ChildContext& c) {
    auto q = WorkQueue::Open(o);
    WorkerOptions w;
    w.take_timeout = milliseconds(15000);
    const int rc = RunWorker(*q, c, w);
    q->Close();
    return rc;
  });
  const ChildResult b = kids.Wait(2, milliseconds(30000));
  RecordProperty("b_ms", std::to_string(MillisSince(t0)));
  EXPECT_TRUE(b.Ok()) << "B " << b.Describe();
  bool b_got_stopped = false, b_got_slow = false;
  for (const Record& r : kids.Records(2)) {
    if (r.kind != Rec::kAcked) continue;
    b_got_stopped |= r.epoch == stopped.epoch && r.index == stopped.index;
    b_got_slow |= r.epoch == slow.epoch && r.index == slow.index;
  }
  EXPECT_TRUE(b_got_stopped) << "the stopped process's item was not reassigned";
  EXPECT_FALSE(b_got_slow) << "the slow (running) process lost its item";
  const ChildResult s = kids.Wait(1, milliseconds(20000));
  EXPECT_TRUE(s.Ok()) << "S " << s.Describe();
  EXPECT_EQ(kids.Value(1, 2), 1 + static_cast<uint64_t>(ItemStatus::kOk)) << "the slow one's ack";

  ::kill(kids.pid(0), SIGCONT);
  const ChildResult a = kids.Wait(0, milliseconds(20000));
  EXPECT_TRUE(a.Ok()) << "A " << a.Describe();
  EXPECT_EQ(kids.Value(0, 1), 1 + static_cast<uint64_t>(ItemStatus::kStale))
      << "Progress after reassignment";
  EXPECT_EQ(kids.Value(0, 2), 1 + static_cast<uint64_t>(ItemStatus::kStale))
      << "Ack after reassignment";
  std::vector<uint32_t> counts(40);
  for (int k = 0; k < 3; ++k) CountAcks(kids, k, 40, &counts);
  EXPECT_EQ(ExactlyOnce(counts, 40), "");
  EXPECT_FALSE(PathExists(SegmentPath(o.name)));
}

// Pool loaders gate epochs: a loader that takes an item of epoch e + 1 while
// epoch e has items out hands it back and looks again every few ms. The
// items of epoch e that a loader gave back, or left when it closed, exited
// without closing or died, must come back to such takers at once -- not after
// the queue's stop_timeout (10 s for pool loaders), which is for a holder
// that does not run -- from their last commit, and once.
TEST_F(WorkQueueProcessTest, ItemsLeftByTheirHolderComeBackAtOnceFromTheirCommitToGatedTakers) {
  enum class Leave { kGiveBack, kClose, kExit, kKill };
  constexpr int kTakers = 2;
  constexpr uint64_t kCommit[2] = {56, 40};  // positions into each held item
  auto now_ns = [] {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
            .count());
  };
  for (Leave how : {Leave::kGiveBack, Leave::kClose, Leave::kExit, Leave::kKill}) {
    const char* how_name[] = {"gives back", "closes", "exits without closing", "is killed"};
    SCOPED_TRACE(std::string("the holder ") + how_name[static_cast<int>(how)]);
    auto o = BaseOptions(NewName("left_items"), {});
    o.num_samples = 800;  // 4 items of 200 positions, as an index work of a pool
    o.num_slices = 4;
    o.num_epochs = 2;
    o.stop_timeout = milliseconds(10000);  // a pool loader's
    Children kids(1 + kTakers, 4096);
    // The holder: takes two items of epoch 0, commits part of each, and
    // leaves when told to, stamping the time just before.
    kids.Spawn([&](ChildContext& c) {
      auto q = WorkQueue::Open(o);
      WorkItem held[2];
      for (int i = 0; i < 2; ++i) {
        if (q->TryTake(&held[i]) != TakeStatus::kOk || held[i].epoch != 0)
          return c.Fail("take of epoch 0");
        if (q->Commit(held[i], held[i].begin + kCommit[i]) != ItemStatus::kOk)
          return c.Fail("commit");
        c.Log(Rec::kTaken, held[i]);
      }
      c.SetValue(0, 1);
      if (!c.WaitFlag(0, milliseconds(20000))) return c.Fail("never told to leave");
      c.SetValue(1, now_ns());
      switch (how) {
        case Leave::kGiveBack:
          for (const WorkItem& it : held)
            if (q->GiveBack(it) != ItemStatus::kOk) return c.Fail("give back");
          if (!c.WaitFlag(1, milliseconds(20000))) return c.Fail("never told to close");
          q->Close();
          return 0;
        case Leave::kClose:
          q->Close();
          return 0;
        case Leave::kExit:
          ::_exit(0);  // no Close: the life mutex dies with the process
        case Leave::kKill:
          ::raise(SIGKILL);
      }
      return c.Fail("unreachable");
    });
    ASSERT_EQ(kids.WaitValue(0, 0, milliseconds(20000)), 1u) << kids.Error(0);
    const std::vector<Record> held = kids.Records(0);
    ASSERT_EQ(held.size(), 2u);
    // Takers gated at epoch 0: they ack what they get of epoch 0 (the
    // holder's items once they come back), and hand items of epoch 1 back
    // at once, 5 ms apart, until epoch 0 is settled. Value t + 1 of a taker:
    // when it took epoch 0's ticket t.
    for (int k = 0; k < kTakers; ++k) {
      kids.Spawn([&](ChildContext& c) {
        auto q = WorkQueue::Open(o);
        const auto deadline = Clock::now() + milliseconds(15000);
        while (q->SettledTickets(0) < 4) {
          if (Clock::now() >= deadline) return c.Fail("epoch 0 never settled");
          WorkItem it;
          const TakeStatus s = q->Take(&it, Clock::now() + milliseconds(100));
          if (s == TakeStatus::kTimeout) continue;
          if (s != TakeStatus::kOk) return c.Fail("take");
          if (it.epoch == 0) {
            c.SetValue(static_cast<int>(it.ticket) + 1, now_ns());
            c.Log(Rec::kTaken, it);
            if (q->Ack(it) != ItemStatus::kOk) return c.Fail("ack");
          } else {
            if (q->GiveBack(it) != ItemStatus::kOk) return c.Fail("give back");
            std::this_thread::sleep_for(milliseconds(5));
          }
        }
        q->Close();
        return 0;
      });
    }
    // Let the takers run dry of epoch 0 and churn epoch 1, then the holder leaves.
    std::this_thread::sleep_for(milliseconds(300));
    kids.SetFlag(0, 0);
    const uint64_t left_ns = kids.WaitValue(0, 1, milliseconds(20000));
    ASSERT_NE(left_ns, 0u) << kids.Error(0);
    for (int k = 1; k <= kTakers; ++k) {
      const ChildResult r = kids.Wait(k, milliseconds(30000));
      EXPECT_TRUE(r.Ok()) << "taker " << k << " " << r.Describe() << " " << kids.Error(k);
    }
    kids.SetFlag(0, 1);
    const ChildResult h = kids.Wait(0, milliseconds(20000));
    if (how == Leave::kKill)
      EXPECT_TRUE(h.Killed()) << h.Describe();
    else
      EXPECT_TRUE(h.Ok()) << h.Describe() << " " << kids.Error(0);
    for (int i = 0; i < 2; ++i) {
      const Record& mine = held[i];
      std::vector<Record> again;
      uint64_t taken_ns = 0;
      for (int k = 1; k <= kTakers; ++k) {
        for (const Record& r : kids.Records(k)) {
          if (r.ticket != mine.ticket) continue;
          again.push_back(r);
          taken_ns = kids.Value(k, static_cast<int>(r.ticket) + 1);
        }
      }
      ASSERT_EQ(again.size(), 1u) << "ticket " << mine.ticket << " taken again " << again.size()
                                  << " times";
      EXPECT_EQ(again[0].begin, mine.begin + kCommit[i]) << "not from its last commit";
      EXPECT_EQ(again[0].end, mine.end);
      ASSERT_GE(taken_ns, left_ns) << "taken while its holder still held it";
      const double ms = static_cast<double>(taken_ns - left_ns) / 1e6;
      const char* how_tag[] = {"give_back", "close", "exit", "kill"};
      RecordProperty(std::string("back_ms_") + how_tag[static_cast<int>(how)] + "_ticket_" +
                         std::to_string(mine.ticket),
                     std::to_string(ms));
      // A death is found by the takers' next check of the others (100 ms
      // apart); anything near the 10 s stop_timeout is the stall.
      EXPECT_LT(ms, 2000.0) << "ticket " << mine.ticket << " came back after " << ms << " ms";
    }
  }
}

// The lease timeout decides what processes do to each other's items: a
// process that opened with 0 ("never") once had its item reassigned by a
// peer that set 200 ms. It is the queue's now: the creator's, stored in the
// segment; another non-zero value is refused, 0 adopts the queue's.
TEST_F(WorkQueueProcessTest, TheLeaseTimeoutIsTheQueuesAndAPeerCannotImposeAnother) {
  auto o = BaseOptions(NewName("lease_shared"), dir_.Files("f", 4, {1000}));
  Children kids(3, 64);
  // A creates with 0 (never), takes an item and then makes no progress.
  kids.Spawn([&](ChildContext& c) {
    auto q = WorkQueue::Open(o);
    WorkItem it;
    if (q->TryTake(&it) != TakeStatus::kOk) return c.Fail("take");
    c.SetValue(0, 1);
    if (!c.WaitFlag(0, milliseconds(20000))) return c.Fail("no go from the parent");
    c.SetValue(2, 1 + static_cast<uint64_t>(q->Ack(it)));
    return 0;
  });
  ASSERT_EQ(kids.WaitValue(0, 0, milliseconds(20000)), 1u) << kids.Error(0);
  // B asks for 200 ms: refused, naming both values.
  kids.Spawn([&](ChildContext& c) {
    auto mine = o;
    mine.lease_timeout = milliseconds(200);
    auto r = FailsWith([&] { WorkQueue::Open(mine); }, ErrorKind::kConfigMismatch,
                       {"lease_timeout differs: 200 ms here, 0 (never) in segment"});
    return r ? 0 : c.Fail(r.message());
  });
  EXPECT_TRUE(kids.Wait(1, milliseconds(20000)).Ok()) << kids.Error(1);
  // C leaves it at 0: joins, uses the queue's (never), and A's item stays A's
  // however long C waits at the end.
  kids.Spawn([&](ChildContext& c) {
    auto q = WorkQueue::Open(o);
    if (q->lease_timeout() != milliseconds(0))
      return c.Fail("lease_timeout_ms is not the queue's 0");
    WorkItem it;
    while (q->TryTake(&it) == TakeStatus::kOk) q->Ack(it);
    if (q->Take(&it, Clock::now() + milliseconds(600)) != TakeStatus::kTimeout)
      return c.Fail("A's item was handed out though the queue never reassigns");
    return 0;
  });
  EXPECT_TRUE(kids.Wait(2, milliseconds(20000)).Ok()) << kids.Error(2);
  kids.SetFlag(0, 0);
  ASSERT_TRUE(kids.Wait(0, milliseconds(20000)).Ok()) << kids.Error(0);
  EXPECT_EQ(kids.Value(0, 2), 1 + static_cast<uint64_t>(ItemStatus::kOk)) << "A's own ack";
}

// An attacher that leaves lease_timeout at 0 adopts the creator's value, and
// with it the creator can reassign the attacher's item.
TEST_F(WorkQueueProcessTest, AnAttacherWithoutALeaseTimeoutAdoptsTheCreatorsValue) {
  auto o = BaseOptions(NewName("lease_adopt"), dir_.Files("f", 4, {1000}));
  auto creator = o;
  creator.lease_timeout = milliseconds(200);
  auto q = WorkQueue::Open(creator);
  EXPECT_EQ(q->lease_timeout(), milliseconds(200));
  Children kids(1, 64);
  kids.Spawn([&](ChildContext& c) {
    auto mine = WorkQueue::Open(o);  // lease_timeout 0: the queue's
    if (mine->lease_timeout() != milliseconds(200)) return c.Fail("did not adopt 200 ms");
    WorkItem it;
    if (mine->TryTake(&it) != TakeStatus::kOk) return c.Fail("take");
    c.SetValue(0, 1);
    std::this_thread::sleep_for(milliseconds(1500));  // no progress
    c.SetValue(1, 1 + static_cast<uint64_t>(mine->Ack(it)));
    return 0;
  });
  ASSERT_EQ(kids.WaitValue(0, 0, milliseconds(20000)), 1u) << kids.Error(0);
  WorkItem it;
  int taken = 0;
  while (q->Take(&it, Clock::now() + milliseconds(5000)) == TakeStatus::kOk) {
    ++taken;
    q->Ack(it);
  }
  EXPECT_EQ(taken, 4) << "the child's item was reassigned to the creator";
  EXPECT_TRUE(kids.Wait(0, milliseconds(20000)).Ok()) << kids.Error(0);
  EXPECT_EQ(kids.Value(0, 1), 1 + static_cast<uint64_t>(ItemStatus::kStale));
}

// Lifetime of an unfinished queue (work_queue.h): removed when every process
// closed it cleanly, kept when one of them died (a rerun resumes it) or when
// one asked with keep_unfinished. Clean closes once left per-run queues in
// /dev/shm for good.
class LifetimeTest : public QueueTest {
 protected:
  // Two processes share the queue and take an item each; then `first`
  // happens to process 0 (closes, or is killed), and process 1 closes.
  // Returns the notices process 1 wrote.
  std::string RunTwo(const WorkQueueOptions& o, bool kill_first, bool first_keeps) {
    Children kids(2, 64);
    SharedBlob notices(1 << 14);
    for (int n = 0; n < 2; ++n) {
      kids.Spawn([&, n](ChildContext& c) {
        auto mine = o;
        mine.keep_unfinished = n == 0 && first_keeps;
        std::string said;
        mine.on_notice = [&](const std::string& s) {
          said += s + "\n";
          if (n == 1) notices.Put(said);
        };
        auto q = WorkQueue::Open(mine);
        WorkItem it;
        if (q->TryTake(&it) != TakeStatus::kOk) return c.Fail("take");
        c.SetValue(0, 1);
        if (!c.WaitFlag(0, milliseconds(20000))) return c.Fail("no go");
        if (n == 0 && kill_first) ::raise(SIGKILL);
        q->Close();
        return 0;
      });
      EXPECT_EQ(kids.WaitValue(n, 0, milliseconds(20000)), 1u) << kids.Error(n);
    }
    kids.SetFlag(0, 0);
    const ChildResult first = kids.Wait(0, milliseconds(20000));
    EXPECT_TRUE(kill_first ? first.Killed() : first.Ok()) << first.Describe();
    kids.SetFlag(1, 0);
    EXPECT_TRUE(kids.Wait(1, milliseconds(20000)).Ok()) << kids.Error(1);
    return notices.Get().value_or("");
  }
  std::optional<QueueListing> Listed(const std::string& name) {
    for (QueueListing& l : ListQueues())
      if (l.name == name) return l;
    return std::nullopt;
  }
};

TEST_F(LifetimeTest, AnUnfinishedQueueEveryProcessClosedCleanlyIsRemoved) {
  auto o = BaseOptions(NewName("life_clean"), dir_.Files("f", 6, {100}));
  const std::string said = RunTwo(o, /*kill_first=*/false, /*first_keeps=*/false);
  EXPECT_FALSE(PathExists(SegmentPath(o.name)));
  EXPECT_TRUE(
      Contains(said, "queue '" + o.name +
                         "' removed unfinished (0 of 6 items done): every "
                         "process closed it; open it with keep_unfinished to resume it later"))
      << said;
}

TEST_F(LifetimeTest, AnUnfinishedQueueOneOfWhoseProcessesDiedIsKeptAndResumed) {
  auto o = BaseOptions(NewName("life_crash"), dir_.Files("f", 6, {100}));
  const auto before = std::chrono::system_clock::now();
  const std::string said = RunTwo(o, /*kill_first=*/true, /*first_keeps=*/false);
  ASSERT_TRUE(PathExists(SegmentPath(o.name)));
  EXPECT_TRUE(Contains(said,
                       "left unfinished (0 of 6 items done) because a process of it died, "
                       "so a rerun resumes it"))
      << said;
  const auto listed = Listed(o.name);
  ASSERT_TRUE(listed.has_value());
  EXPECT_TRUE(listed->valid) << listed->problem;
  EXPECT_EQ(listed->kept_reason, "a process of it died, so a rerun resumes it");
  EXPECT_FALSE(listed->finished);
  EXPECT_EQ(listed->live_clients, 0);
  const auto created = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::nanoseconds(listed->created_unix_ns)));
  EXPECT_GE(created, before - std::chrono::seconds(1));
  EXPECT_LE(created, std::chrono::system_clock::now());
  // A rerun resumes it and, finishing, removes it.
  auto q = WorkQueue::Open(o);
  EXPECT_EQ(Drain(*q).size(), 6u);
  q->Close();
  EXPECT_FALSE(PathExists(SegmentPath(o.name)));
}

TEST_F(LifetimeTest, KeepUnfinishedKeepsAQueueClosedCleanly) {
  auto o = BaseOptions(NewName("life_keep"), dir_.Files("f", 6, {100}));
  const std::string said = RunTwo(o, /*kill_first=*/false, /*first_keeps=*/true);
  ASSERT_TRUE(PathExists(SegmentPath(o.name)));
  EXPECT_TRUE(Contains(said, "left unfinished (0 of 6 items done) because keep_unfinished was set"))
      << said;
  const auto listed = Listed(o.name);
  ASSERT_TRUE(listed.has_value());
  EXPECT_EQ(listed->kept_reason, "keep_unfinished was set");
  // The next job resumes it; if it too closes unfinished without the
  // option, the queue goes (the old job's reasons are spent).
  {
    auto q = WorkQueue::Open(o);
    WorkItem it;
    ASSERT_EQ(q->TryTake(&it), TakeStatus::kOk);
    ASSERT_EQ(q->Ack(it), ItemStatus::kOk);
  }
  EXPECT_FALSE(PathExists(SegmentPath(o.name)));
}

TEST_F(LifetimeTest, AQueueWaitingForNumClientsIsKept) {
  auto o = BaseOptions(NewName("life_wait"), dir_.Files("f", 6, {100}));
  o.num_clients = 3;
  RunTwo(o, /*kill_first=*/false, /*first_keeps=*/false);
  ASSERT_TRUE(PathExists(SegmentPath(o.name)));
  const auto listed = Listed(o.name);
  ASSERT_TRUE(listed.has_value());
  EXPECT_EQ(listed->kept_reason, "2 of num_clients=3 processes have joined");
}

TEST_F(WorkQueueProcessTest, ProgressKeepsALeaseAlive) {
  auto o = BaseOptions(NewName("lease_alive"), dir_.Files("f", 20, {1000}));
  o.lease_timeout = milliseconds(500);  // 10x the progress interval: safe on a loaded machine
  o.num_clients = 2;
  Children kids(2, 256);
  // A: holds one item for 1.2 s (over twice the lease timeout), reporting
  // progress every 50 ms, then acks.
  kids.Spawn([&](ChildContext& c) {
    auto q = WorkQueue::Open(o);
    WorkItem it;
    if (q->TryTake(&it) != TakeStatus::kOk) return c.Fail("take");
    c.Log(Rec::kTaken, it);
    c.SetValue(0, 1);
    for (int i = 0; i < 24; ++i) {
      ::usleep(50000);
      if (q->Progress(it, it.begin + i) != ItemStatus::kOk)
        return c.Fail("Progress refused at step " + std::to_string(i));
    }
    c.Log(Rec::kIntent, it);
    const ItemStatus a = q->Ack(it);
    if (a != ItemStatus::kOk) return c.Fail("ack of a lease kept alive by Progress was refused");
    c.Log(Rec::kAcked, it);
    WorkItem next;
    if (q->Take(&next, Clock::now() + milliseconds(10000)) != TakeStatus::kEnd)
      return c.Fail("no kEnd");
    return 0;
  });
  ASSERT_EQ(kids.WaitValue(0, 0, milliseconds(20000)), 1u) << kids.Error(0);
  kids.Spawn([&](ChildContext& c) {
    auto q = WorkQueue::Open(o);
    return RunWorker(*q, c, WorkerOptions{});
  });
  const auto results = kids.WaitAll(milliseconds(30000));
  for (int k = 0; k < 2; ++k)
    EXPECT_TRUE(results[k].Ok()) << "child " << k << " " << results[k].Describe();
  std::vector<uint32_t> counts(20);
  CountAcks(kids, 0, 20, &counts);
  CountAcks(kids, 1, 20, &counts);
  EXPECT_EQ(ExactlyOnce(counts, 20), "");
}

TEST_F(WorkQueueProcessTest, SlotsOfDeadClientsAreReused) {
  auto o = BaseOptions(NewName("slots"), dir_.Files("f", 30, {100}));
  o.max_clients = 2;
  o.num_clients = 1;
  // Ten clients in a row die holding an item each: their slots must come back.
  std::vector<uint32_t> counts(30);
  for (int round = 0; round < 10; ++round) {
    Children kids(1, 64);
    kids.Spawn([&](ChildContext& c) {
      auto q = WorkQueue::Open(o);
      WorkItem it;
      for (int i = 0; i < 2; ++i) {
        if (q->TryTake(&it) != TakeStatus::kOk) return c.Fail("take");
        c.Log(Rec::kIntent, it);
        if (q->Ack(it) != ItemStatus::kOk) return c.Fail("ack");
        c.Log(Rec::kAcked, it);
      }
      if (q->TryTake(&it) != TakeStatus::kOk) return c.Fail("take");
      ::raise(SIGKILL);
      return 0;
    });
    const ChildResult r = kids.Wait(0, milliseconds(20000));
    ASSERT_TRUE(r.Killed()) << "round " << round << ": " << r.Describe();
    CountAcks(kids, 0, 30, &counts);
  }
  // Two live clients fill both slots; a third is refused with a clear error.
  Children kids(3, 256);
  StartGate gate;
  for (int k = 0; k < 2; ++k) {
    kids.Spawn([&](ChildContext& c) {
      auto q = WorkQueue::Open(o);
      c.SetValue(0, 1);
      if (!gate.Wait(milliseconds(30000))) return c.Fail("gate");
      return RunWorker(*q, c, WorkerOptions{});
    });
  }
  for (int k = 0; k < 2; ++k)
    ASSERT_EQ(kids.WaitValue(k, 0, milliseconds(20000)), 1u) << kids.Error(k);
  kids.Spawn([&](ChildContext& c) {
    gate.CloseInChild();
    try {
      auto q = WorkQueue::Open(o);
      return c.Fail("a third client was admitted to a queue with max_clients = 2");
    } catch (const tailcut::Error& e) {
      if (!Contains(e.what(), "max_clients"))
        return c.Fail(std::string("message does not name max_clients: ") + e.what());
    }
    return 0;
  });
  EXPECT_TRUE(kids.Wait(2, milliseconds(30000)).Ok()) << kids.Error(2);
  gate.Open();
  for (int k = 0; k < 2; ++k) {
    const ChildResult r = kids.Wait(k, milliseconds(30000));
    EXPECT_TRUE(r.Ok()) << "child " << k << " " << r.Describe();
    CountAcks(kids, k, 30, &counts);
  }
  EXPECT_EQ(ExactlyOnce(counts, 30), "");
}

TEST_F(WorkQueueProcessTest, InspectFromOutsideRecoversADeadClient) {
  auto o = BaseOptions(NewName("inspect_dead"), dir_.Files("f", 10, {100}));
  Children kids(2, 64);
  kids.Spawn([&](ChildContext& c) {
    auto q = WorkQueue::Open(o);
    WorkItem it;
    for (int i = 0; i < 3; ++i) {
      if (q->TryTake(&it) != TakeStatus::kOk) return c.Fail("take");
    }
    ::raise(SIGKILL);
    return 0;
  });
  ASSERT_TRUE(kids.Wait(0, milliseconds(20000)).Killed());
  const QueueStats s = InspectQueue(o.name);
  EXPECT_EQ(s.recovered_items, 3u) << "InspectQueue should hand the dead client's items back";
  ASSERT_EQ(s.clients.size(), 1u);
  EXPECT_FALSE(s.clients[0].alive);
  EXPECT_EQ(s.clients[0].open_items, 0u);
  kids.Spawn([&](ChildContext& c) {
    auto q = WorkQueue::Open(o);
    return RunWorker(*q, c, WorkerOptions{});
  });
  EXPECT_TRUE(kids.Wait(1, milliseconds(20000)).Ok()) << kids.Error(1);
  std::vector<uint32_t> counts(10);
  CountAcks(kids, 1, 10, &counts);
  EXPECT_EQ(ExactlyOnce(counts, 10), "");
}

}  // namespace
}  // namespace tailcut::test
