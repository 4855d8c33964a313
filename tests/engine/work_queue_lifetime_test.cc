// Tests of tailcut/work_queue.h: the lifetime of the segment: who removes it
// and when, a queue that outlives Close and its killed processes, a stale
// queue replaced, RemoveQueue, ListQueues and InspectQueue.
#include <fcntl.h>
#include <sys/mman.h>

#include <set>

#include "engine/segment_layout.h"
#include "tests/engine/queue_test_util.h"
#include "tests/engine/work_queue_fixture.h"

namespace tailcut::test {
namespace {

using std::chrono::milliseconds;

// ============================================================ lifetime

TEST_F(WorkQueueTest, LastCloseRemovesTheSegmentOfAFinishedQueue) {
  auto o = Options("lastclose", dir_.Files("f", 3, {100}));
  auto a = WorkQueue::Open(o);
  auto b = WorkQueue::Open(o);
  Drain(*a);
  a->Close();
  a->Close();  // idempotent
  EXPECT_TRUE(PathExists(SegmentPath(o.name))) << "b is still open";
  WorkItem it;
  EXPECT_EQ(b->TryTake(&it), TakeStatus::kEnd);
  b.reset();  // the destructor closes
  EXPECT_FALSE(PathExists(SegmentPath(o.name)));
}

// Whether a Close is the last, and so removes the segment, is decided under
// the admin lock only. A Close that cannot take it in time (another process
// holds it) leaves the segment, says so, and still leaves the queue.
TEST_F(WorkQueueTest, CloseWithoutTheAdminLockLeavesTheSegmentInPlace) {
  auto o = Options("close_admin", dir_.Files("f", 3, {100}));
  o.attach_timeout = milliseconds(200);
  std::string notices;
  o.on_notice = [&](const std::string& line) { notices += line + "\n"; };
  auto q = WorkQueue::Open(o);
  Drain(*q);  // finished: a Close with the lock would remove it
  const std::string path = SegmentPath(o.name);
  int locked[2], release[2];
  ASSERT_EQ(pipe(locked), 0);
  ASSERT_EQ(pipe(release), 0);
  const pid_t child = fork();
  if (child == 0) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) _exit(2);
    void* at =
        ::mmap(nullptr, sizeof(tailcut::detail::Header), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (at == MAP_FAILED) _exit(3);
    if (pthread_mutex_lock(&static_cast<tailcut::detail::Header*>(at)->admin_mutex) != 0) _exit(4);
    char c = 1;
    if (write(locked[1], &c, 1) != 1) _exit(5);
    if (read(release[0], &c, 1) != 1) _exit(6);
    _exit(0);  // dies holding it: the next locker gets EOWNERDEAD
  }
  char c = 0;
  ASSERT_EQ(read(locked[0], &c, 1), 1);
  q->Close();
  EXPECT_TRUE(PathExists(path)) << "removed without the admin lock";
  EXPECT_TRUE(Contains(notices, "closed without the segment's admin lock")) << notices;
  EXPECT_TRUE(Contains(notices, path)) << notices;
  ASSERT_EQ(write(release[1], &c, 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int fd : {locked[0], locked[1], release[0], release[1]}) close(fd);
  WorkItem it;
  EXPECT_EQ(q->TryTake(&it), TakeStatus::kClosed) << "closed all the same";
  const QueueStats st = InspectQueue(o.name);
  ASSERT_EQ(st.clients.size(), 1u);
  EXPECT_FALSE(st.clients[0].alive) << "its client slot is free";
}

TEST_F(WorkQueueTest, SegmentStaysUntilNumClientsHaveJoined) {
  auto o = Options("numclients", dir_.Files("f", 3, {100}));
  o.num_clients = 2;
  {
    auto a = WorkQueue::Open(o);
    Drain(*a);
  }
  ASSERT_TRUE(PathExists(SegmentPath(o.name))) << "only 1 of 2 expected clients has joined";
  {
    auto b = WorkQueue::Open(o);
    WorkItem it;
    EXPECT_EQ(b->TryTake(&it), TakeStatus::kEnd) << "the late client finds the queue finished";
    EXPECT_EQ(b->Stats().clients_joined, 2u);
  }
  EXPECT_FALSE(PathExists(SegmentPath(o.name)));
}

TEST_F(WorkQueueTest, UnfinishedQueueSurvivesCloseAndContinues) {
  auto o = Options("continue", dir_.Files("f", 20, {100}));
  o.num_epochs = 2;
  o.keep_unfinished = true;  // else the last clean Close removes it
  std::vector<uint32_t> counts(40);
  std::set<std::pair<uint64_t, uint64_t>> given_back;
  {
    auto a = WorkQueue::Open(o);
    std::vector<WorkItem> held(6);
    for (auto& h : held) ASSERT_EQ(a->TryTake(&h), TakeStatus::kOk);
    for (size_t i = 0; i < held.size(); ++i) {
      if (i % 2 == 0) {
        ASSERT_EQ(a->Ack(held[i]), ItemStatus::kOk);
        counts[Key(20, held[i].epoch, held[i].index)]++;
      } else {
        given_back.insert({held[i].epoch, held[i].index});
      }
    }
    a->Close();  // gives back the three still held
  }
  ASSERT_TRUE(PathExists(SegmentPath(o.name)));
  auto b = WorkQueue::Open(o);
  std::set<std::pair<uint64_t, uint64_t>> seen;
  for (const WorkItem& it : Drain(*b)) {
    counts[Key(20, it.epoch, it.index)]++;
    seen.insert({it.epoch, it.index});
  }
  for (const auto& k : given_back)
    EXPECT_TRUE(seen.count(k)) << "item given back at Close never came back";
  EXPECT_EQ(ExactlyOnce(counts, 20), "");
}

// A child opens `o`, takes `take` items, acks `ack` of them, and is SIGKILLed
// holding the rest. Returns what it acked.
std::set<std::pair<uint64_t, uint64_t>> RunAndKill(const WorkQueueOptions& o, int take, int ack) {
  Children kids(1, 1024);
  kids.Spawn([&](ChildContext& c) {
    auto q = WorkQueue::Open(o);
    std::vector<WorkItem> held(take);
    for (auto& h : held) {
      if (q->TryTake(&h) != TakeStatus::kOk) return c.Fail("take");
    }
    for (int i = 0; i < ack; ++i) {
      if (q->Ack(held[i]) != ItemStatus::kOk) return c.Fail("ack");
      c.Log(Rec::kAcked, held[i]);
    }
    ::raise(SIGKILL);
    return 0;
  });
  const ChildResult r = kids.Wait(0, milliseconds(20000));
  EXPECT_TRUE(r.Killed()) << r.Describe();
  std::set<std::pair<uint64_t, uint64_t>> acked;
  for (const Record& rec : kids.Records(0)) acked.insert({rec.epoch, rec.index});
  return acked;
}

TEST_F(WorkQueueTest, QueueOfKilledProcessesIsResumed) {
  auto o = Options("resume", dir_.Files("f", 30, {100}));
  o.num_epochs = 2;
  o.leases_per_client = 8;
  auto acked = RunAndKill(o, 8, 5);
  for (const auto& k : RunAndKill(o, 4, 2)) acked.insert(k);
  ASSERT_EQ(acked.size(), 7u);
  ASSERT_TRUE(PathExists(SegmentPath(o.name)));
  std::vector<std::string> notices;
  auto r = o;
  r.on_notice = [&](const std::string& s) { notices.push_back(s); };
  auto q = WorkQueue::Open(r);
  std::string all;
  for (const auto& s : notices) all += s + "\n";
  EXPECT_TRUE(ContainsNoCase(all, "resum")) << "notices: " << all;
  EXPECT_TRUE(Contains(all, o.name)) << "the notice should name the queue: " << all;
  std::vector<uint32_t> counts(60);
  for (const auto& [e, i] : acked) counts[Key(30, e, i)]++;
  for (const WorkItem& it : Drain(*q)) counts[Key(30, it.epoch, it.index)]++;
  EXPECT_EQ(ExactlyOnce(counts, 30), "");
}

TEST_F(WorkQueueTest, StaleQueueWithAnotherConfigurationIsReplaced) {
  auto o = Options("replace", dir_.Files("f", 10, {100}));
  RunAndKill(o, 3, 2);
  ASSERT_TRUE(PathExists(SegmentPath(o.name)));
  std::vector<std::string> notices;
  auto r = o;
  r.num_epochs = 2;
  r.on_notice = [&](const std::string& s) { notices.push_back(s); };
  auto q = WorkQueue::Open(r);
  std::string all;
  for (const auto& s : notices) all += s + "\n";
  EXPECT_TRUE(ContainsNoCase(all, "replac")) << "notices: " << all;
  EXPECT_EQ(q->num_epochs(), 2u);
  EXPECT_EQ(q->Stats().done, 0u);
  EXPECT_EQ(q->Stats().clients_joined, 1u);
  EXPECT_EQ(Drain(*q).size(), 20u);
}

TEST_F(WorkQueueTest, RemoveQueueRefusesWhileALiveClientExists) {
  auto o = Options("remove", dir_.Files("f", 3, {100}));
  EXPECT_TRUE(FailsWith([&] { RemoveQueue(o.name, false); }, ErrorKind::kNotFound, {o.name}));
  Children kids(1, 1);
  kids.Spawn([&](ChildContext& c) {
    auto q = WorkQueue::Open(o);
    c.SetValue(0, 1);
    if (!c.WaitFlag(0, milliseconds(20000))) return c.Fail("never told to go");
    q->Close();  // the segment was removed under it: must not crash
    return 0;
  });
  ASSERT_EQ(kids.WaitValue(0, 0, milliseconds(20000)), 1u) << kids.Error(0);
  EXPECT_TRUE(FailsWith([&] { RemoveQueue(o.name, false); }, ErrorKind::kInvalidArgument,
                        {std::to_string(kids.pid(0))}));
  EXPECT_TRUE(PathExists(SegmentPath(o.name)));
  EXPECT_NO_THROW(RemoveQueue(o.name, true));
  EXPECT_FALSE(PathExists(SegmentPath(o.name)));
  kids.SetFlag(0, 0);
  const ChildResult r = kids.Wait(0, milliseconds(20000));
  EXPECT_TRUE(r.Ok()) << r.Describe();

  // A queue whose clients are all dead is removed without force.
  RunAndKill(o, 1, 0);
  ASSERT_TRUE(PathExists(SegmentPath(o.name)));
  EXPECT_NO_THROW(RemoveQueue(o.name, false));
  EXPECT_FALSE(PathExists(SegmentPath(o.name)));
}

TEST_F(WorkQueueTest, ListAndInspectSeeALiveQueue) {
  auto o = Options("inspect", dir_.Files("f", 10, {100}));
  o.num_epochs = 2;
  EXPECT_TRUE(FailsWith([&] { InspectQueue(o.name); }, ErrorKind::kNotFound, {o.name}));
  Children kids(1, 1);
  kids.Spawn([&](ChildContext& c) {
    auto q = WorkQueue::Open(o);
    std::vector<WorkItem> held(5);
    for (auto& h : held) {
      if (q->TryTake(&h) != TakeStatus::kOk) return c.Fail("take");
    }
    for (int i = 0; i < 3; ++i) q->Ack(held[i]);
    c.SetValue(0, 1);
    if (!c.WaitFlag(0, milliseconds(20000))) return c.Fail("never told to go");
    q->Ack(held[3]);
    q->Ack(held[4]);
    Drain(*q);
    return 0;
  });
  ASSERT_EQ(kids.WaitValue(0, 0, milliseconds(20000)), 1u) << kids.Error(0);

  bool listed = false;
  for (const QueueListing& l : ListQueues()) {
    if (l.name != o.name) continue;
    listed = true;
    EXPECT_TRUE(l.valid) << l.problem;
    EXPECT_EQ(l.segment_path, SegmentPath(o.name));
  }
  EXPECT_TRUE(listed) << "ListQueues does not list " << o.name;

  const QueueStats s = InspectQueue(o.name);
  EXPECT_EQ(s.name, o.name);
  EXPECT_EQ(s.num_items, 10u);
  EXPECT_EQ(s.num_epochs, 2u);
  EXPECT_EQ(s.total, 20u);
  EXPECT_EQ(s.done, 3u);
  EXPECT_EQ(s.in_flight, 2u);
  EXPECT_EQ(s.handed_out, 5u);
  EXPECT_EQ(s.clients_joined, 1u);
  ASSERT_EQ(s.clients.size(), 1u);
  EXPECT_EQ(s.clients[0].pid, kids.pid(0));
  EXPECT_TRUE(s.clients[0].alive);
  EXPECT_EQ(s.clients[0].items_taken, 5u);
  EXPECT_EQ(s.clients[0].items_acked, 3u);
  EXPECT_EQ(s.clients[0].open_items, 2u);
  kids.SetFlag(0, 0);
  const ChildResult r = kids.Wait(0, milliseconds(20000));
  EXPECT_TRUE(r.Ok()) << r.Describe();
  EXPECT_FALSE(PathExists(SegmentPath(o.name)));
}

TEST_F(WorkQueueTest, ListQueuesReportsAnUnreadableSegmentAsInvalid) {
  const std::string name = NewName("list_garbage");
  WriteSegment(SegmentPath(name), std::string(4096, 'z'));
  bool listed = false;
  for (const QueueListing& l : ListQueues()) {
    if (l.name != name) continue;
    listed = true;
    EXPECT_FALSE(l.valid);
    EXPECT_FALSE(l.problem.empty());
  }
  EXPECT_TRUE(listed);
  EXPECT_TRUE(FailsWith([&] { InspectQueue(name); }, ErrorKind::kCorrupt, {SegmentPath(name)}));
}

}  // namespace
}  // namespace tailcut::test
