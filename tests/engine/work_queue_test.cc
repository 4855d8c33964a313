// Tests of tailcut/work_queue.h: take and ack in one process (sometimes with
// a child or two): acks of items not held, give-backs, the lease limit,
// stats, tail splitting, and the end of the data while another process holds
// an item.
//
// The other WorkQueueTest suites: item order and slicing in
// work_queue_order_test.cc, bad input and hostile segments in
// work_queue_bad_input_test.cc, checkpoints in work_queue_checkpoint_test.cc,
// the lifetime of the segment in work_queue_lifetime_test.cc. Many-process
// exactly-once, racing creators and lease timeouts are in
// work_queue_process_test.cc; kill -9 trials in work_queue_crash_test.cc;
// threads in work_queue_thread_test.cc.
#include "tests/engine/queue_test_util.h"
#include "tests/engine/work_queue_fixture.h"

namespace tailcut::test {
namespace {

using std::chrono::milliseconds;

// ============================================================ acks

TEST_F(WorkQueueTest, AckRefusesItemsItDoesNotHold) {
  auto o = Options("badack", dir_.Files("f", 4, {100}));
  auto q = WorkQueue::Open(o);
  WorkItem it;
  ASSERT_EQ(q->TryTake(&it), TakeStatus::kOk);
  EXPECT_EQ(q->Progress(it, it.begin), ItemStatus::kOk);
  EXPECT_EQ(q->Ack(it), ItemStatus::kOk);
  // No longer held: refused as what it is, and never counted twice.
  EXPECT_EQ(q->Ack(it), ItemStatus::kAlreadyDone) << "second ack of the same item";
  EXPECT_EQ(q->GiveBack(it), ItemStatus::kAlreadyDone) << "give back after ack";
  EXPECT_EQ(q->Progress(it, it.begin), ItemStatus::kAlreadyDone) << "progress after ack";
  EXPECT_EQ(q->Stats().stale_acks, 0u) << "a second ack is not a stale one";
  EXPECT_EQ(q->Stats().done, 1u);
  WorkItem forged = it;
  forged.lease = 1u << 30;
  EXPECT_EQ(q->Ack(forged), ItemStatus::kInvalid) << "lease slot out of range";
  EXPECT_EQ(q->Progress(forged, 0), ItemStatus::kInvalid);
  EXPECT_EQ(q->GiveBack(forged), ItemStatus::kInvalid);
  EXPECT_EQ(q->Ack(WorkItem{}), ItemStatus::kInvalid) << "default item";
  // Every item still comes out exactly once.
  EXPECT_EQ(Drain(*q).size(), 3u);
  EXPECT_EQ(q->Stats().done, 4u);
}

TEST_F(WorkQueueTest, GivenBackItemIsHandedOutAgain) {
  auto o = Options("giveback", dir_.Files("f", 5, {100}));
  o.num_epochs = 2;
  auto q = WorkQueue::Open(o);
  WorkItem it;
  ASSERT_EQ(q->TryTake(&it), TakeStatus::kOk);
  const auto key = std::make_pair(it.epoch, it.index);
  EXPECT_EQ(q->GiveBack(it), ItemStatus::kOk);
  EXPECT_NE(q->Ack(it), ItemStatus::kOk) << "an item given back is no longer held";
  std::vector<uint32_t> counts(10);
  int again = 0;
  for (const WorkItem& w : Drain(*q)) {
    counts[Key(5, w.epoch, w.index)]++;
    if (std::make_pair(w.epoch, w.index) == key) ++again;
  }
  EXPECT_EQ(again, 1);
  EXPECT_EQ(ExactlyOnce(counts, 5), "");
  const QueueStats s = q->Stats();
  ASSERT_EQ(s.clients.size(), 1u);
  EXPECT_EQ(s.clients[0].items_given_back, 1u);
  EXPECT_EQ(s.clients[0].items_taken, 11u);
  EXPECT_EQ(s.clients[0].items_acked, 10u);
}

TEST_F(WorkQueueTest, TakeWithEveryLeaseSlotHeldIsLimitNotEnd) {
  auto o = Options("fullleases", dir_.Files("f", 20, {100}));
  o.leases_per_client = 4;
  auto q = WorkQueue::Open(o);
  std::vector<WorkItem> held(4);
  for (auto& h : held) ASSERT_EQ(q->TryTake(&h), TakeStatus::kOk);
  WorkItem extra;
  EXPECT_EQ(q->TryTake(&extra), TakeStatus::kLimit);
  EXPECT_EQ(q->Take(&extra, Clock::now() + milliseconds(50)), TakeStatus::kLimit);
  EXPECT_EQ(q->Ack(held[2]), ItemStatus::kOk);
  EXPECT_EQ(q->TryTake(&extra), TakeStatus::kOk);
  for (int i : {0, 1, 3}) EXPECT_EQ(q->Ack(held[i]), ItemStatus::kOk);
  EXPECT_EQ(q->Ack(extra), ItemStatus::kOk);
  EXPECT_EQ(Drain(*q).size(), 15u);
}

TEST_F(WorkQueueTest, SettledTicketsStopAtTheFirstTicketNotDone) {
  auto o = Options("settled", dir_.Files("f", 4, {100}));
  o.num_epochs = 2;
  o.shuffle = false;
  auto q = WorkQueue::Open(o);
  EXPECT_EQ(q->SettledTickets(), 0u);
  WorkItem first, second;
  ASSERT_EQ(q->TryTake(&first), TakeStatus::kOk);
  ASSERT_EQ(q->TryTake(&second), TakeStatus::kOk);
  EXPECT_EQ(q->Ack(second), ItemStatus::kOk);
  EXPECT_EQ(q->SettledTickets(), 0u) << "ticket 0 is held, not done";
  EXPECT_EQ(q->SettledTickets(1), 2u) << "from 1 on: ticket 1 done, 2 never taken";
  EXPECT_EQ(q->Ack(first), ItemStatus::kOk);
  EXPECT_EQ(q->SettledTickets(), 2u);
  EXPECT_EQ(Drain(*q).size(), 6u);
  EXPECT_EQ(q->SettledTickets(), 8u) << "every ticket of both epochs";
  EXPECT_EQ(q->SettledTickets(5), 8u);
  EXPECT_EQ(q->SettledTickets(100), 100u) << "past the end: where it was asked to start";
  q->Close();
  EXPECT_EQ(q->SettledTickets(), 0u) << "closed";
}

TEST_F(WorkQueueTest, SettledTicketsWaitForThePiecesOfARestoredState) {
  // A restore sets the done bit of every item it resumes and hands the rest out as a piece:
  // the epoch is not over until the piece is acked (a pool ended it early, and the loader that
  // held the piece found its epoch gone).
  auto o = Options("settled_restored", dir_.Files("r", 2, {100}));
  o.shuffle = false;
  std::string state;
  {
    auto q = WorkQueue::Open(o);
    WorkItem item;
    ASSERT_EQ(q->TryTake(&item), TakeStatus::kOk);
    ASSERT_EQ(q->Progress(item, item.begin + 40), ItemStatus::kOk);
    state = q->SaveState();
  }
  o.name += "_restored";
  o.restore_state = state;
  auto q = WorkQueue::Open(o);
  EXPECT_EQ(q->SettledTickets(), 0u) << "ticket 0 resumes at 40: a piece, not done";
  WorkItem piece, second;
  ASSERT_EQ(q->TryTake(&piece), TakeStatus::kOk);
  ASSERT_EQ(piece.begin, 40u);
  ASSERT_EQ(q->TryTake(&second), TakeStatus::kOk);
  ASSERT_EQ(q->Ack(second), ItemStatus::kOk);
  EXPECT_EQ(q->SettledTickets(), 0u) << "the piece of ticket 0 is still out";
  EXPECT_EQ(q->SettledTickets(1), 2u);
  ASSERT_EQ(q->Ack(piece), ItemStatus::kOk);
  EXPECT_EQ(q->SettledTickets(), 2u);
}

TEST_F(WorkQueueTest, StatsCountWhatThisProcessDid) {
  const std::vector<uint64_t> sizes = {1000, 2000, 3000};
  std::vector<std::string> works;
  for (size_t i = 0; i < 3; ++i) works.push_back(dir_.File("s" + std::to_string(i), sizes[i]));
  auto o = Options("stats", works);
  o.num_epochs = 2;
  auto q = WorkQueue::Open(o);
  WorkItem a, b;
  ASSERT_EQ(q->TryTake(&a), TakeStatus::kOk);
  ASSERT_EQ(q->TryTake(&b), TakeStatus::kOk);
  EXPECT_EQ(q->Progress(a, a.begin + 1, 7), ItemStatus::kOk);
  EXPECT_EQ(q->Ack(a), ItemStatus::kOk);
  QueueStats s = q->Stats();
  EXPECT_EQ(s.name, o.name);
  EXPECT_EQ(s.segment_path, SegmentPath(o.name));
  EXPECT_EQ(s.num_items, 3u);
  EXPECT_EQ(s.num_epochs, 2u);
  EXPECT_EQ(s.total, 6u);
  EXPECT_EQ(s.done, 1u);
  EXPECT_EQ(s.in_flight, 1u);
  EXPECT_EQ(s.handed_out, 2u);
  EXPECT_EQ(s.epoch, 0u);
  EXPECT_EQ(s.clients_joined, 1u);
  ASSERT_EQ(s.clients.size(), 1u);
  const ClientStats& c = s.clients[0];
  EXPECT_EQ(c.pid, ::getpid());
  EXPECT_TRUE(c.alive);
  EXPECT_EQ(c.items_taken, 2u);
  EXPECT_EQ(c.items_acked, 1u);
  EXPECT_EQ(c.open_items, 1u);
  EXPECT_EQ(c.records, 7u);
  EXPECT_EQ(c.bytes_acked, a.end - a.begin);
  EXPECT_GT(c.last_progress_ns, 0u);
  EXPECT_LE(c.joined_ns, s.now_ns);
  EXPECT_EQ(q->Ack(b), ItemStatus::kOk);
  Drain(*q);
  s = q->Stats();
  EXPECT_EQ(s.done, 6u);
  EXPECT_EQ(s.epoch, 2u) << "epoch of the next ticket is num_epochs at the end";
  EXPECT_EQ(s.clients[0].bytes_acked, 2 * (1000 + 2000 + 3000u));
}

// ============================================================ tail splitting

TEST_F(WorkQueueTest, IdleClientSplitsTheUnclaimedTailOfAClaimedItem) {
  const uint64_t size = 16 * kMiB;
  auto o = Options("split", {dir_.File("big", size)});
  o.min_split_bytes = kMiB;
  o.num_clients = 3;
  auto a = WorkQueue::Open(o);
  auto b = WorkQueue::Open(o);
  auto c = WorkQueue::Open(o);
  WorkItem it, piece, other;
  ASSERT_EQ(a->TryTake(&it), TakeStatus::kOk);
  EXPECT_FALSE(it.piece);
  EXPECT_EQ(b->TryTake(&piece), TakeStatus::kTimeout) << "an item never claimed is never split";
  uint64_t end = 0;
  ASSERT_EQ(a->Claim(it, kMiB, &end), ItemStatus::kOk);
  EXPECT_EQ(end, size);
  ASSERT_EQ(b->TryTake(&piece), TakeStatus::kOk) << "b is idle and a's item has 15 MiB unclaimed";
  EXPECT_TRUE(piece.piece);
  EXPECT_EQ(piece.ticket, it.ticket);
  EXPECT_EQ(piece.epoch, it.epoch);
  EXPECT_EQ(piece.index, it.index);
  EXPECT_EQ(piece.path, it.path);
  EXPECT_EQ(piece.end, size);
  EXPECT_GE(piece.begin, kMiB + kMiB) << "the owner keeps at least min_split_bytes past its claim";
  EXPECT_GE(size - piece.begin, kMiB) << "the piece is at least min_split_bytes";
  EXPECT_EQ(CheckItem(*b, piece), "");
  // The owner sees the lowered end and cannot claim past it.
  ASSERT_EQ(a->Claim(it, size, &end), ItemStatus::kOk);
  EXPECT_EQ(end, piece.begin);
  // A piece is split again like any claimed item: c, idle, takes the
  // unclaimed tail of b's piece (a's part is claimed to its end).
  uint64_t piece_end = 0;
  ASSERT_EQ(b->Claim(piece, piece.begin + 4096, &piece_end), ItemStatus::kOk);
  EXPECT_EQ(piece_end, piece.end);
  WorkItem piece2;
  ASSERT_EQ(c->TryTake(&piece2), TakeStatus::kOk);
  EXPECT_TRUE(piece2.piece);
  EXPECT_EQ(piece2.ticket, it.ticket);
  EXPECT_EQ(piece2.end, piece.end);
  EXPECT_GT(piece2.begin, piece.begin + 4096);
  ASSERT_EQ(b->Claim(piece, piece.end, &piece_end), ItemStatus::kOk);
  EXPECT_EQ(piece_end, piece2.begin) << "b must stop where c starts";
  EXPECT_EQ(b->Ack(piece), ItemStatus::kOk);
  EXPECT_EQ(c->Ack(piece2), ItemStatus::kOk);
  EXPECT_EQ(c->TryTake(&other), TakeStatus::kTimeout) << "a still holds its part";
  EXPECT_EQ(a->Ack(it), ItemStatus::kOk);
  EXPECT_EQ(a->TryTake(&other), TakeStatus::kEnd);
  EXPECT_EQ(c->TryTake(&other), TakeStatus::kEnd);
  const QueueStats s = a->Stats();
  EXPECT_EQ(s.done, 1u);
  EXPECT_EQ(s.splits, 2u);
  uint64_t by_clients = 0;
  for (const ClientStats& cs : s.clients) by_clients += cs.splits;
  EXPECT_EQ(by_clients, 2u);
}

// At an epoch's end Take hands out the next epoch's items, so it never
// splits this epoch's last one; TakeSplit does, and only below the epoch
// asked for. Items under 1 MiB split at any byte (the split unit is 1).
TEST_F(WorkQueueTest, TakeSplitSplitsAnEarlierEpochsItemWhereTakeHandsOutTheNextEpoch) {
  auto o = Options("takesplit", dir_.Files("f", 2, {64 << 10}));
  o.num_epochs = 2;
  o.shuffle = false;
  o.min_split_bytes = 100;
  o.num_clients = 2;
  auto a = WorkQueue::Open(o);
  auto b = WorkQueue::Open(o);
  WorkItem slow, fast, next, piece;
  ASSERT_EQ(a->TryTake(&slow), TakeStatus::kOk);
  ASSERT_EQ(b->TryTake(&fast), TakeStatus::kOk);
  ASSERT_EQ(b->Ack(fast), ItemStatus::kOk);
  EXPECT_EQ(b->TakeSplit(&piece, 1), TakeStatus::kTimeout) << "never claimed, never split";
  uint64_t end = 0;
  ASSERT_EQ(a->Claim(slow, slow.begin + 1000, &end), ItemStatus::kOk);
  ASSERT_EQ(b->TryTake(&next), TakeStatus::kOk);
  EXPECT_EQ(next.epoch, 1u) << "Take hands out the next epoch rather than split";
  ASSERT_EQ(b->GiveBack(next), ItemStatus::kOk);
  EXPECT_EQ(b->TakeSplit(&piece, 0), TakeStatus::kTimeout) << "no open item below epoch 0";
  ASSERT_EQ(b->TakeSplit(&piece, 1), TakeStatus::kOk);
  EXPECT_TRUE(piece.piece);
  EXPECT_EQ(piece.epoch, 0u);
  EXPECT_EQ(piece.ticket, slow.ticket);
  EXPECT_EQ(piece.end, slow.end);
  EXPECT_GT(piece.begin, slow.begin + 1000);
  EXPECT_LT(piece.begin, slow.end);
  EXPECT_NE((piece.begin - slow.begin) % 4096, 0u) << "split in bytes, not 4 KiB units";
  ASSERT_EQ(a->Claim(slow, slow.end, &end), ItemStatus::kOk);
  EXPECT_EQ(end, piece.begin);
  EXPECT_EQ(a->Ack(slow), ItemStatus::kOk);
  EXPECT_EQ(b->Ack(piece), ItemStatus::kOk);
  EXPECT_EQ(a->Stats().done, 2u) << "epoch 0 done, its split item counted once";
  WorkItem null;
  EXPECT_EQ(b->TakeSplit(nullptr, 1), TakeStatus::kInvalidArgument);
  a->Close();
  EXPECT_EQ(a->TakeSplit(&null, 1), TakeStatus::kClosed);
}

// A thief with split_multiple (a pool loader's batch) splits at a multiple
// of it past the item's begin, rounding up, so pieces of an item of whole
// batches are whole batches; a piece splits on the same grid.
TEST_F(WorkQueueTest, SplitsFallOnTheThiefsSplitMultiple) {
  auto o = Options("multiple", dir_.Files("f", 1, {96 << 10}));
  o.min_split_bytes = 1000;
  o.num_clients = 3;
  auto owner = WorkQueue::Open(o);
  o.split_multiple = 1000;
  auto thief = WorkQueue::Open(o);
  auto second = WorkQueue::Open(o);
  WorkItem it, piece, piece2;
  ASSERT_EQ(owner->TryTake(&it), TakeStatus::kOk);
  uint64_t end = 0;
  ASSERT_EQ(owner->Claim(it, it.begin + 1500, &end), ItemStatus::kOk);
  ASSERT_EQ(thief->TryTake(&piece), TakeStatus::kOk);
  EXPECT_EQ((piece.begin - it.begin) % 1000, 0u) << piece.begin;
  EXPECT_GE(piece.begin, it.begin + 2000) << "rounded up past the owner's claim";
  ASSERT_EQ(owner->Claim(it, it.end, &end), ItemStatus::kOk);
  EXPECT_EQ(end, piece.begin);
  ASSERT_EQ(thief->Claim(piece, piece.begin + 1000, &end), ItemStatus::kOk);
  ASSERT_EQ(second->TryTake(&piece2), TakeStatus::kOk);
  EXPECT_EQ((piece2.begin - it.begin) % 1000, 0u) << piece2.begin;
  EXPECT_EQ(piece2.end, it.end);
  ASSERT_EQ(thief->Claim(piece, piece.end, &end), ItemStatus::kOk);
  EXPECT_EQ(end, piece2.begin);
  EXPECT_EQ(owner->Ack(it), ItemStatus::kOk);
  EXPECT_EQ(thief->Ack(piece), ItemStatus::kOk);
  EXPECT_EQ(second->Ack(piece2), ItemStatus::kOk);
  EXPECT_EQ(owner->Stats().done, 1u);
}

TEST_F(WorkQueueTest, NoSplitWhenDisabledOrTheTailIsSmall) {
  const uint64_t size = 16 * kMiB;
  const std::string big = dir_.File("big", size);
  for (int variant = 0; variant < 2; ++variant) {
    SCOPED_TRACE(variant == 0 ? "split_tail = false" : "tail under 2 x min_split_bytes");
    auto o = Options("nosplit", {big});
    if (variant == 0) {
      o.split_tail = false;
      o.min_split_bytes = kMiB;
    } else {
      o.min_split_bytes = 8 * kMiB;  // 15 MiB unclaimed < 2 x 8 MiB
    }
    auto a = WorkQueue::Open(o);
    auto b = WorkQueue::Open(o);
    WorkItem it, other;
    ASSERT_EQ(a->TryTake(&it), TakeStatus::kOk);
    uint64_t end = 0;
    ASSERT_EQ(a->Claim(it, kMiB, &end), ItemStatus::kOk);
    EXPECT_EQ(b->TryTake(&other), TakeStatus::kTimeout);
    ASSERT_EQ(a->Claim(it, size, &end), ItemStatus::kOk);
    EXPECT_EQ(end, size);
    EXPECT_EQ(a->Ack(it), ItemStatus::kOk);
    EXPECT_EQ(b->TryTake(&other), TakeStatus::kEnd);
    EXPECT_EQ(a->Stats().splits, 0u);
  }
}

// ============================================================ end of data

// A child takes one item, reports it, holds it until flag 0, then (after
// value 1 = the CLOCK_MONOTONIC ns just before its ack) acks it and closes.
size_t SpawnHolder(Children& kids, const WorkQueueOptions& o, int delay_ms_before_ack) {
  return kids.Spawn([o, delay_ms_before_ack](ChildContext& c) {
    auto q = WorkQueue::Open(o);
    WorkItem it;
    if (q->TryTake(&it) != TakeStatus::kOk) return c.Fail("take");
    c.Log(Rec::kTaken, it);
    c.SetValue(0, 1);
    if (!c.WaitFlag(0, milliseconds(30000))) return c.Fail("never told to ack");
    ::usleep(delay_ms_before_ack * 1000);
    c.SetValue(1, static_cast<uint64_t>(Clock::now().time_since_epoch().count()));
    if (q->Ack(it) != ItemStatus::kOk) return c.Fail("ack refused");
    q->Close();
    return 0;
  });
}

TEST_F(WorkQueueTest, TakeWaitsForAnotherProcessesLastItemThenEnds) {
  auto o = Options("end_ack", dir_.Files("f", 3, {100}));
  Children kids(1, 8);
  SpawnHolder(kids, o, 200);
  ASSERT_EQ(kids.WaitValue(0, 0, milliseconds(20000)), 1u) << kids.Error(0);
  auto q = WorkQueue::Open(o);
  WorkItem it;
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(q->TryTake(&it), TakeStatus::kOk);
    ASSERT_EQ(q->Ack(it), ItemStatus::kOk);
  }
  EXPECT_EQ(q->TryTake(&it), TakeStatus::kTimeout) << "another live process holds the last item";
  auto t0 = Clock::now();
  EXPECT_EQ(q->Take(&it, t0 + milliseconds(300)), TakeStatus::kTimeout);
  const double waited = MillisSince(t0);
  EXPECT_GE(waited, 250.0) << "Take returned before its deadline";
  EXPECT_LT(waited, 5000.0);
  RecordProperty("deadline_300ms_waited_ms", std::to_string(waited));

  kids.SetFlag(0, 0);  // the child acks 200 ms from now, while we sleep in Take
  EXPECT_EQ(q->Take(&it, Clock::now() + milliseconds(20000)), TakeStatus::kEnd);
  const auto woke = Clock::now();
  const ChildResult r = kids.Wait(0, milliseconds(20000));
  ASSERT_TRUE(r.Ok()) << r.Describe();
  const Clock::time_point acked{Clock::duration(kids.Value(0, 1))};
  const double latency = std::chrono::duration<double, std::milli>(woke - acked).count();
  EXPECT_LT(latency, 5000.0) << "Take woke long after the last ack";
  RecordProperty("wake_after_ack_ms", std::to_string(latency));
  EXPECT_EQ(q->TryTake(&it), TakeStatus::kEnd);
}

TEST_F(WorkQueueTest, TakeGetsTheItemOfAHolderThatDies) {
  auto o = Options("end_death", dir_.Files("f", 3, {100}));
  Children kids(1, 8);
  SpawnHolder(kids, o, 0);
  ASSERT_EQ(kids.WaitValue(0, 0, milliseconds(20000)), 1u) << kids.Error(0);
  const Record held = kids.Records(0).at(0);
  auto q = WorkQueue::Open(o);
  WorkItem it;
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(q->TryTake(&it), TakeStatus::kOk);
    ASSERT_EQ(q->Ack(it), ItemStatus::kOk);
  }
  EXPECT_EQ(q->TryTake(&it), TakeStatus::kTimeout);
  // Kill the holder while we sleep in Take.
  std::atomic<int64_t> killed_at{0};
  std::thread killer([&] {
    std::this_thread::sleep_for(milliseconds(200));
    killed_at = Clock::now().time_since_epoch().count();
    kids.Kill(0, SIGKILL);
  });
  const TakeStatus st = q->Take(&it, Clock::now() + milliseconds(20000));
  const auto woke = Clock::now();
  killer.join();
  ASSERT_EQ(st, TakeStatus::kOk) << "the dead holder's item must come back";
  EXPECT_EQ(it.epoch, held.epoch);
  EXPECT_EQ(it.index, held.index);
  EXPECT_EQ(it.ticket, held.ticket);
  const double latency = std::chrono::duration<double, std::milli>(
                             woke - Clock::time_point{Clock::duration(killed_at.load())})
                             .count();
  EXPECT_LT(latency, 5000.0);
  RecordProperty("wake_after_death_ms", std::to_string(latency));
  EXPECT_TRUE(kids.Wait(0, milliseconds(5000)).Killed());
  EXPECT_EQ(q->Ack(it), ItemStatus::kOk);
  EXPECT_EQ(q->TryTake(&it), TakeStatus::kEnd);
  const QueueStats s = q->Stats();
  EXPECT_EQ(s.recovered_items, 1u);
  EXPECT_EQ(s.done, 3u);
  bool dead_seen = false;
  uint64_t recovered_by_us = 0;
  for (const ClientStats& c : s.clients) {
    if (c.pid == kids.pid(0)) dead_seen = !c.alive;
    if (c.pid == ::getpid()) recovered_by_us = c.items_recovered;
  }
  EXPECT_TRUE(dead_seen) << "Stats should list the dead client as not alive";
  EXPECT_EQ(recovered_by_us, 1u);
}

TEST_F(WorkQueueTest, TryTakeIsEndOnAFinishedQueueAndOkOtherwise) {
  auto o = Options("trytake", dir_.Files("f", 2, {100}));
  auto q = WorkQueue::Open(o);
  WorkItem a, b, c;
  EXPECT_EQ(q->TryTake(&a), TakeStatus::kOk);
  EXPECT_EQ(q->TryTake(&b), TakeStatus::kOk);
  // Only this process holds the rest: there is nothing to hand out now.
  EXPECT_EQ(q->TryTake(&c), TakeStatus::kTimeout);
  EXPECT_EQ(q->Ack(a), ItemStatus::kOk);
  EXPECT_EQ(q->Ack(b), ItemStatus::kOk);
  EXPECT_EQ(q->TryTake(&c), TakeStatus::kEnd);
  EXPECT_EQ(q->Take(&c), TakeStatus::kEnd);
}

}  // namespace
}  // namespace tailcut::test
