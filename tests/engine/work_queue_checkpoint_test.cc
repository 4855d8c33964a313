// Tests of tailcut/work_queue.h: checkpoints: a state saved partway restores
// where it stopped, after every process was killed too, from any process of
// the job, at the start and at the end; garbage states and other
// configurations are refused.
#include <set>

#include "tests/engine/queue_test_util.h"
#include "tests/engine/work_queue_fixture.h"

namespace tailcut::test {
namespace {

using std::chrono::milliseconds;

// ============================================================ checkpoint

// A queue run partway: what was acked, and what was open with which offset.
struct Partial {
  std::string state;
  std::set<std::pair<uint64_t, uint64_t>> acked;
  std::map<std::pair<uint64_t, uint64_t>, uint64_t> open_from;  // (epoch, index) -> resume offset
  std::map<std::pair<uint64_t, uint64_t>, uint64_t> open_end;
};

// Takes `taken` items one by one and acks all but every 5th; of those held,
// every other one reports progress (two steps; the last one counts). Then
// SaveState. Needs leases_per_client >= taken / 5.
Partial RunPartway(WorkQueue& q, int taken) {
  Partial p;
  for (int i = 0; i < taken; ++i) {
    WorkItem it;
    EXPECT_EQ(q.TryTake(&it), TakeStatus::kOk) << "take " << i;
    const auto key = std::make_pair(it.epoch, it.index);
    if (i % 5 != 2) {
      EXPECT_EQ(q.Ack(it), ItemStatus::kOk);
      p.acked.insert(key);
      continue;
    }
    uint64_t offset = it.begin;
    if ((i / 5) % 2 == 0 && it.end - it.begin >= 4) {
      EXPECT_EQ(q.Progress(it, it.begin + (it.end - it.begin) / 4, 3), ItemStatus::kOk);
      offset = it.begin + (it.end - it.begin) / 2;
      EXPECT_EQ(q.Progress(it, offset, 5), ItemStatus::kOk);
    }
    p.open_from[key] = offset;
    p.open_end[key] = it.end;
  }
  p.state = q.SaveState();
  return p;
}

// After a restore: acks of both runs make exactly one pass per epoch, and
// items open at the checkpoint resume from their last progress offset.
void CheckRestoredRun(const Partial& p, const std::vector<WorkItem>& second, uint64_t n,
                      uint64_t epochs) {
  std::vector<uint32_t> counts(n * epochs);
  for (const auto& [e, i] : p.acked) counts[Key(n, e, i)]++;
  for (const WorkItem& it : second) {
    ASSERT_LT(it.epoch, epochs);
    ASSERT_LT(it.index, n);
    counts[Key(n, it.epoch, it.index)]++;
    const auto key = std::make_pair(it.epoch, it.index);
    if (auto f = p.open_from.find(key); f != p.open_from.end()) {
      EXPECT_EQ(it.begin, f->second)
          << "item (" << it.epoch << "," << it.index
          << ") open at the checkpoint should resume at its last progress offset";
      EXPECT_EQ(it.end, p.open_end.at(key));
    }
  }
  EXPECT_EQ(ExactlyOnce(counts, n), "");
}

TEST_F(WorkQueueTest, RestoredQueueContinuesWhereTheCheckpointStopped) {
  const auto works = dir_.Files("f", 3, {kMiB, 2 * kMiB});
  auto o = Options("ckpt", works);
  o.keep_unfinished = true;  // closed unfinished, then removed by hand: kept until then
  o.leases_per_client = 16;
  o.num_slices = 40;
  o.num_epochs = 2;
  o.seed = 11;
  Partial p;
  uint64_t n = 0;
  {
    auto q = WorkQueue::Open(o);
    n = q->num_items();
    p = RunPartway(*q, 50);  // crosses into epoch 1
    ASSERT_FALSE(p.state.empty());
    q->Close();
  }
  ASSERT_TRUE(PathExists(SegmentPath(o.name))) << "an unfinished queue must survive Close";
  RemoveQueue(o.name, /*force=*/false);
  EXPECT_FALSE(PathExists(SegmentPath(o.name)));

  auto r = o;
  r.restore_state = p.state;
  auto q = WorkQueue::Open(r);
  EXPECT_EQ(q->num_items(), n);
  EXPECT_EQ(q->Stats().done, p.acked.size());
  CheckRestoredRun(p, Drain(*q), n, 2);
}

TEST_F(WorkQueueTest, RestoreAfterEveryProcessWasKilled) {
  const auto works = dir_.Files("f", 4, {kMiB});
  auto o = Options("ckpt_kill", works);
  o.leases_per_client = 16;
  o.num_slices = 60;
  o.num_epochs = 3;
  o.seed = 12;
  SharedBlob state(16 << 20);
  Children kids(1, 256);
  kids.Spawn([&](ChildContext& c) {
    auto q = WorkQueue::Open(o);
    Partial p = RunPartway(*q, 70);
    for (const auto& [e, i] : p.acked) c.Log(Record{Rec::kAcked, 0, e, i, 0, 0, 0});
    for (const auto& [key, off] : p.open_from)
      c.Log(Record{Rec::kProgress, 0, key.first, key.second, 0, 0, off});
    if (!state.Put(p.state)) return c.Fail("state too large for the test buffer");
    ::raise(SIGKILL);
    return 0;
  });
  const ChildResult r = kids.Wait(0, milliseconds(20000));
  ASSERT_TRUE(r.Killed()) << r.Describe();
  ASSERT_TRUE(state.Get().has_value());
  Partial p;
  p.state = *state.Get();
  for (const Record& rec : kids.Records(0)) {
    if (rec.kind == Rec::kAcked) p.acked.insert({rec.epoch, rec.index});
    if (rec.kind == Rec::kProgress) p.open_from[{rec.epoch, rec.index}] = rec.end;
  }
  RemoveQueue(o.name, /*force=*/false);  // every client is dead: no force needed

  auto rq = o;
  rq.restore_state = p.state;
  auto q = WorkQueue::Open(rq);
  const uint64_t n = q->num_items();
  for (const auto& [key, off] : p.open_from) p.open_end[key] = q->items()[key.second].end;
  CheckRestoredRun(p, Drain(*q), n, 3);
}

TEST_F(WorkQueueTest, EveryProcessOfTheJobMayPassTheSameState) {
  const auto works = dir_.Files("f", 4, {kMiB});
  auto o = Options("ckpt_multi", works);
  o.leases_per_client = 16;
  o.num_slices = 80;
  o.num_epochs = 2;
  o.seed = 13;
  o.num_clients = 4;
  Partial p;
  uint64_t n;
  {
    auto q = WorkQueue::Open(o);
    n = q->num_items();
    p = RunPartway(*q, 60);
  }
  RemoveQueue(o.name, /*force=*/true);
  auto r = o;
  r.restore_state = p.state;
  Children kids(4, 4 * n * 2);
  StartGate gate;
  for (int k = 0; k < 4; ++k) {
    kids.Spawn([&](ChildContext& c) {
      if (!gate.Wait(milliseconds(20000))) return c.Fail("gate");
      std::string notices;
      auto mine = r;
      mine.on_notice = [&](const std::string& s) { notices += s + "; "; };
      auto q = WorkQueue::Open(mine);
      int rc = 0;
      if (ContainsNoCase(notices, "replac")) {
        rc = c.Fail("a process of the restored job replaced the queue the others run: " + notices);
      }
      for (;;) {
        WorkItem it;
        const TakeStatus st = q->Take(&it, Clock::now() + milliseconds(20000));
        if (st == TakeStatus::kEnd) return rc;
        if (st != TakeStatus::kOk) return c.Fail(std::string("Take returned ") + StatusName(st));
        if (std::string bad = CheckItem(*q, it); !bad.empty()) return c.Fail(bad);
        c.Log(Rec::kTaken, it);
        if (q->Ack(it) != ItemStatus::kOk) return c.Fail("ack refused");
        c.Log(Rec::kAcked, it);
        Spin(20);
      }
    });
  }
  gate.Open();
  std::vector<WorkItem> second;
  for (size_t k = 0; k < 4; ++k) {
    const ChildResult res = kids.Wait(k, milliseconds(60000));
    EXPECT_TRUE(res.Ok()) << res.Describe();
    for (const Record& rec : kids.Records(k)) {
      if (rec.kind != Rec::kAcked) continue;
      WorkItem it;
      it.epoch = rec.epoch;
      it.index = rec.index;
      it.begin = rec.begin;
      it.end = rec.end;
      second.push_back(it);
    }
  }
  CheckRestoredRun(p, second, n, 2);
  EXPECT_FALSE(PathExists(SegmentPath(o.name)))
      << "the last of num_clients processes removes a finished queue";
}

TEST_F(WorkQueueTest, StateAtTheStartAndAtTheEndRestore) {
  const auto works = dir_.Files("f", 2, {kMiB});
  auto o = Options("ckpt_edges", works);
  o.num_slices = 10;
  o.num_epochs = 2;
  std::string at_start, at_end;
  uint64_t seed;
  {
    auto q = WorkQueue::Open(o);
    seed = q->seed();
    at_start = q->SaveState();
    Drain(*q);
    at_end = q->SaveState();
    q->Close();
  }
  // The seed drawn by the first run travels with the state.
  auto a = o;
  a.name = NewName("ckpt_start");
  a.restore_state = at_start;
  {
    auto q = WorkQueue::Open(a);
    EXPECT_EQ(q->seed(), seed) << "a restored queue must use the checkpoint's seed";
    EXPECT_EQ(Drain(*q).size(), 2 * q->num_items());
  }
  auto b = o;
  b.name = NewName("ckpt_end");
  b.restore_state = at_end;
  auto q = WorkQueue::Open(b);
  WorkItem it;
  EXPECT_EQ(q->TryTake(&it), TakeStatus::kEnd);
}

TEST_F(WorkQueueTest, GarbageStateIsCorrupt) {
  const auto works = dir_.Files("f", 2, {kMiB});
  auto o = Options("ckpt_garbage", works);
  o.keep_unfinished = true;  // closed unfinished, then removed by hand: kept until then
  o.num_slices = 10;
  std::string good;
  {
    auto q = WorkQueue::Open(o);
    WorkItem it;
    ASSERT_EQ(q->TryTake(&it), TakeStatus::kOk);
    ASSERT_EQ(q->Ack(it), ItemStatus::kOk);
    good = q->SaveState();
  }
  RemoveQueue(o.name, true);
  std::mt19937_64 rng(TestSeed());
  std::string random(200, '\0');
  for (char& c : random) c = static_cast<char>(rng());
  for (const std::string& bad : {random, std::string("x"), good.substr(0, good.size() / 2),
                                 good.substr(0, good.size() - 1)}) {
    SCOPED_TRACE("state of " + std::to_string(bad.size()) + " bytes");
    auto r = o;
    r.restore_state = bad;
    EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(r); }, ErrorKind::kCorrupt));
    // A failed restore leaves nothing that blocks the name.
    EXPECT_FALSE(PathExists(SegmentPath(o.name))) << "a failed restore left a segment";
  }
  auto plain = WorkQueue::Open(o);
  EXPECT_EQ(plain->Stats().done, 0u);
}

TEST_F(WorkQueueTest, RestoreIntoAnotherConfigurationIsAMismatch) {
  const auto works = dir_.Files("f", 3, {kMiB});
  auto o = Options("ckpt_mismatch", works);
  o.keep_unfinished = true;  // closed unfinished, then removed by hand: kept until then
  o.num_slices = 12;
  o.seed = 9;
  std::string state;
  {
    auto q = WorkQueue::Open(o);
    WorkItem it;
    ASSERT_EQ(q->TryTake(&it), TakeStatus::kOk);
    state = q->SaveState();
  }
  RemoveQueue(o.name, true);
  auto r = o;
  r.restore_state = state;
  r.num_epochs = 2;
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(r); }, ErrorKind::kConfigMismatch, {"num_epochs"}));
  r = o;
  r.restore_state = state;
  r.works.pop_back();
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(r); }, ErrorKind::kConfigMismatch, {"works"}));
  r = o;
  r.restore_state = state;
  r.num_slices = 13;
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(r); }, ErrorKind::kConfigMismatch));
  r = o;
  r.restore_state = state;
  r.seed = 10;
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(r); }, ErrorKind::kConfigMismatch, {"seed"}));
}

}  // namespace
}  // namespace tailcut::test
