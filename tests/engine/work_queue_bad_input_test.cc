// Tests of tailcut/work_queue.h: bad input: names, missing, unreadable and
// replaced work files, a configuration that differs from a live queue's, and
// garbage, hostile, damaged or foreign segments, and a full /dev/shm. Every
// one is a clear error that names the thing, never a crash or a hang.
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <sys/mount.h>

#include <fstream>
#include <map>
#include <set>

#include "engine/segment_layout.h"
#include "tests/engine/queue_test_util.h"
#include "tests/engine/work_queue_fixture.h"

namespace tailcut::test {
namespace {

using std::chrono::milliseconds;

// ============================================================ bad input

TEST_F(WorkQueueTest, SegmentPathIsPerUserUnderDevShm) {
  EXPECT_EQ(SegmentPath("work_queue"),
            "/dev/shm/tailcut." + std::to_string(::getuid()) + ".work_queue");
  EXPECT_TRUE(FailsWith([] { SegmentPath(""); }, ErrorKind::kInvalidArgument));
  EXPECT_TRUE(FailsWith([] { SegmentPath("a/b"); }, ErrorKind::kInvalidArgument, {"a/b"}));
}

TEST_F(WorkQueueTest, BadNamesAreInvalidArguments) {
  const auto works = dir_.Files("f", 1, {100});
  auto o = BaseOptions("", works);
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kInvalidArgument, {"name"}));
  o.name = "has/slash";
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kInvalidArgument, {"has/slash"}));
  o.name = std::string(201, 'n');
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kInvalidArgument, {"name"}));
  o.name = std::string(300, 'n');
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kInvalidArgument, {"name"}));
  o.name = "..";
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kInvalidArgument));
  // A 100-character name is fine.
  o.name = NewName("long_ok") + std::string(60, 'x');
  guards_.push_back(std::make_unique<QueueGuard>(o.name));
  EXPECT_NO_THROW(WorkQueue::Open(o));
}

TEST_F(WorkQueueTest, MissingWorkFileIsNotFoundAndNamed) {
  const std::string missing = dir_.path() + "/no_such_file.rec";
  auto o = Options("missing", {dir_.File("ok", 100), missing});
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kNotFound, {missing}));
  EXPECT_FALSE(PathExists(SegmentPath(o.name))) << "a failed Open left a segment behind";
  // With a prefix, the message names the full path.
  auto p = Options("missing_prefix", {"nothere"});
  p.prefix = dir_.path() + "/";
  EXPECT_TRUE(
      FailsWith([&] { WorkQueue::Open(p); }, ErrorKind::kNotFound, {dir_.path() + "/nothere"}));
}

// Resume offsets are kept in 48 bits. A sparse file on tmpfs (no blocks
// used) stands for a file of that size.
TEST_F(WorkQueueTest, AFileOver256TiBIsRejectedAndNamed) {
  const std::string huge = "/dev/shm/tctest_huge_" + std::to_string(::getpid());
  const int fd = ::open(huge.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
  ASSERT_GE(fd, 0) << ErrnoText("open");
  if (::ftruncate(fd, off_t{1} << 48) != 0) {
    ::close(fd);
    ::unlink(huge.c_str());
    GTEST_SKIP() << "this file system does not take a 2^48-byte sparse file";
  }
  ::close(fd);
  auto o = Options("huge", {dir_.File("ok", 100), huge});
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kInvalidArgument,
                        {huge, "281474976710656 bytes", "256 TiB", "split it"}));
  ::unlink(huge.c_str());
}

TEST_F(WorkQueueTest, DirectoryAsWorkIsRejectedAndNamed) {
  const std::string sub = dir_.path() + "/subdir";
  ASSERT_EQ(::mkdir(sub.c_str(), 0755), 0);
  auto o = Options("dir_work", {sub});
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kInvalidArgument, {sub}));
}

TEST_F(WorkQueueTest, EmptyWorksAndZeroEpochsAreInvalidArguments) {
  auto o = Options("noworks", {});
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kInvalidArgument, {"works"}));
  auto e = Options("zeroepochs", {dir_.File("f", 10)});
  e.num_epochs = 0;
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(e); }, ErrorKind::kInvalidArgument, {"num_epochs"}));
}

// Runs fn as uid/gid 65534 in a child when we are root (root reads anything),
// as ourselves otherwise. fn returns "" on success or what went wrong.
void RunUnprivileged(const std::function<std::string()>& fn) {
  Children kids(1, 1);
  kids.Spawn([&](ChildContext& c) {
    if (::geteuid() == 0) {
      if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) {
        return c.Fail(ErrnoText("dropping privileges"));
      }
    }
    const std::string bad = fn();
    return bad.empty() ? 0 : c.Fail(bad);
  });
  const ChildResult r = kids.Wait(0, milliseconds(30000));
  EXPECT_TRUE(r.Ok()) << r.Describe();
}

TEST_F(WorkQueueTest, UnreadableWorkFileIsAPermissionErrorAndNamed) {
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
  const std::string locked = dir_.File("locked.rec", 100);
  ASSERT_EQ(::chmod(locked.c_str(), 0), 0);
  const std::string closed_dir = dir_.path() + "/closed";
  ASSERT_EQ(::mkdir(closed_dir.c_str(), 0700), 0);
  const std::string hidden = dir_.File("closed/hidden.rec", 100);
  const std::string ok = dir_.File("ok.rec", 100);
  ASSERT_EQ(::chmod(ok.c_str(), 0644), 0);
  const std::string name1 = NewName("unreadable_file");
  const std::string name2 = NewName("unreadable_dir");
  RunUnprivileged([&]() -> std::string {
    std::string out;
    auto r1 = FailsWith(
        [&] {
          WorkQueue::Open(BaseOptions(name1, {ok, locked}));
        },
        ErrorKind::kPermission, {locked});
    if (!r1) out += std::string("file mode 000: ") + r1.message() + "\n";
    auto r2 = FailsWith([&] { WorkQueue::Open(BaseOptions(name2, {hidden})); },
                        ErrorKind::kPermission, {hidden});
    if (!r2) out += std::string("file in a mode 0700 directory: ") + r2.message() + "\n";
    return out;
  });
}

TEST_F(WorkQueueTest, MismatchedConfigurationAgainstALiveQueueNamesTheField) {
  const auto works = dir_.Files("f", 3, {kMiB});
  auto base = Options("mismatch", works);
  base.num_slices = 30;
  base.seed = 5;
  auto live = WorkQueue::Open(base);
  WorkItem held;
  ASSERT_EQ(live->TryTake(&held), TakeStatus::kOk);

  auto o = base;
  o.num_epochs = 2;
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kConfigMismatch, {"num_epochs"}));
  o = base;
  o.works.pop_back();
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kConfigMismatch, {"works"}));
  o = base;
  o.seed = 6;
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kConfigMismatch, {"seed"}));
  o = base;
  o.shuffle = false;
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kConfigMismatch, {"shuffle"}));
  o = base;
  o.num_slices = 31;
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kConfigMismatch, {"slices"}));
  o = base;
  o.format = "tfrecord";
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kConfigMismatch, {"format"}));
  o = base;
  std::swap(o.works[0], o.works[1]);
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kConfigMismatch, {"works"}));
  // A work file that changed size since the queue was made.
  dir_.File("f1", 2 * kMiB);
  try {
    WorkQueue::Open(base);
    ADD_FAILURE() << "a work file that changed size was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfigMismatch) << e.what();
    EXPECT_TRUE(Contains(e.what(), works[1]) || ContainsNoCase(e.what(), "size"))
        << "the message should name the file or its size: " << e.what();
  }
  dir_.File("f1", kMiB);

  // Nothing the live queue did is lost.
  EXPECT_EQ(live->Ack(held), ItemStatus::kOk);
  EXPECT_EQ(Drain(*live).size() + 1, live->num_items());
}

// Opens `o` in a child (so a crash or hang is seen, not suffered). The child
// reports value 0 = 1 + ErrorKind on a tailcut::Error (message in Error()),
// 100 if Open succeeded (then it drains what it can, bounded), and the
// notices it got.
struct OpenOutcome {
  ChildResult result;
  std::optional<ErrorKind> kind;
  std::string message;
  bool opened = false;
  std::string notices;
};
OpenOutcome OpenInChild(const WorkQueueOptions& o, milliseconds timeout = milliseconds(20000),
                        milliseconds take_deadline = milliseconds(2000)) {
  Children kids(1, 1);
  SharedBlob notices(1 << 16);
  kids.Spawn([&](ChildContext& c) {
    std::string said;
    auto mine = o;
    mine.on_notice = [&](const std::string& s) {
      said += s + "\n";
      notices.Put(said);
    };
    std::unique_ptr<WorkQueue> q;
    try {
      q = WorkQueue::Open(mine);
    } catch (const tailcut::Error& e) {
      c.SetValue(0, 1 + static_cast<uint64_t>(e.kind()));
      c.Fail(e.what());
      return 0;
    }
    c.SetValue(0, 100);
    // Whatever Open accepted must behave: bounded takes, no crash.
    WorkItem it;
    for (uint64_t i = 0; i < q->num_items() * q->num_epochs() + 8; ++i) {
      const TakeStatus st = q->Take(&it, Clock::now() + take_deadline);
      if (st != TakeStatus::kOk) break;
      q->Ack(it);
    }
    q->Stats();
    q->Close();
    return 0;
  });
  OpenOutcome out;
  out.result = kids.Wait(0, timeout);
  const uint64_t v = kids.Value(0, 0);
  if (v >= 1 && v < 100) {
    out.kind = static_cast<ErrorKind>(v - 1);
    out.message = kids.Error(0);
  }
  out.opened = v == 100;
  out.notices = notices.Get().value_or("");
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Only sizes were compared: a file replaced by another of the same size was
// accepted silently by every process that attached.
TEST_F(WorkQueueTest, FilesAreIdentifiedByMoreThanTheirSize) {
  const auto works = dir_.Files("f", 2, {100});
  auto o = Options("identity", works);
  auto q = WorkQueue::Open(o);
  ASSERT_EQ(q->files().size(), 2u);
  for (size_t i = 0; i < works.size(); ++i) {
    struct stat st;
    ASSERT_EQ(::stat(works[i].c_str(), &st), 0);
    EXPECT_EQ(q->files()[i], IdentityOf(st)) << works[i];
    EXPECT_EQ(q->files()[i].size, 100u);
    EXPECT_NE(q->files()[i].inode, 0u);
  }
  EXPECT_EQ(DescribeFileChange(q->files()[0], q->files()[0]), "");
  // Replaced (renamed over) by a file of the same size.
  const std::string other = dir_.File("other", 100);
  struct stat ost;
  ASSERT_EQ(::stat(other.c_str(), &ost), 0);
  ASSERT_EQ(::rename(other.c_str(), works[0].c_str()), 0);
  const std::string change =
      "inode " + std::to_string(q->files()[0].inode) + " -> " + std::to_string(ost.st_ino);
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kConfigMismatch,
                        {"file '" + works[0] + "' changed since the queue was created: " + change,
                         "(recreate the queue, or restore the file)"}));
  // A stale queue (its process was killed) over a changed file is replaced,
  // with a notice.
  const std::string stale = NewName("identity-stale");
  {
    Children kids(1, 1);
    kids.Spawn([&](ChildContext&) {
      auto k = WorkQueue::Open(BaseOptions(stale, works));
      ::raise(SIGKILL);
      return 0;
    });
    ASSERT_TRUE(kids.Wait(0, milliseconds(20000)).Killed());
  }
  ASSERT_TRUE(PathExists(SegmentPath(stale)));
  std::vector<std::string> notices;
  ASSERT_EQ(::utimensat(AT_FDCWD, works[1].c_str(), nullptr, 0), 0);  // touched: a new mtime
  auto again = BaseOptions(stale, works);
  again.on_notice = [&](const std::string& n) { notices.push_back(n); };
  auto q2 = WorkQueue::Open(again);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_TRUE(Contains(notices[0], "replacing a stale queue")) << notices[0];
  EXPECT_TRUE(
      Contains(notices[0], "file '" + works[1] + "' changed since the queue was created: mtime "))
      << notices[0];
}

TEST_F(WorkQueueTest, GarbageSegmentIsCorruptAndNamedNeverACrash) {
  const auto works = dir_.Files("f", 2, {kMiB});
  std::mt19937_64 rng(TestSeed());
  struct Case {
    const char* what;
    std::string bytes;
  };
  std::string random4k(4096, '\0'), random64(64, '\0');
  for (char& c : random4k) c = static_cast<char>(rng());
  for (char& c : random64) c = static_cast<char>(rng());
  const std::vector<Case> cases = {
      {"random 4 KiB", random4k}, {"random 64 bytes", random64}, {"one byte", "x"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto o = Options("garbage", works);
    o.attach_timeout = milliseconds(500);
    const std::string seg = SegmentPath(o.name);
    WriteSegment(seg, c.bytes);
    const OpenOutcome out = OpenInChild(o);
    EXPECT_TRUE(out.result.Ok()) << out.result.Describe();
    if (!out.kind.has_value()) {
      ADD_FAILURE() << "Open accepted (replaced) a garbage segment; notices: " << out.notices;
      continue;
    }
    EXPECT_EQ(*out.kind, ErrorKind::kCorrupt) << out.message;
    EXPECT_TRUE(Contains(out.message, seg)) << out.message;
    EXPECT_TRUE(PathExists(seg)) << "a segment we cannot read must be left for a person to look at";
  }
  // An empty or all-zero object is what a creator that died before writing
  // the header leaves: after attach_timeout, failing with a clear error or
  // replacing it with a notice are both fine; crashing or hanging is not.
  for (const Case& c :
       std::vector<Case>{{"empty", ""}, {"64 KiB of zeros", std::string(1 << 16, '\0')}}) {
    SCOPED_TRACE(c.what);
    auto o = Options("garbage_empty", works);
    o.attach_timeout = milliseconds(500);
    WriteSegment(SegmentPath(o.name), c.bytes);
    const auto t0 = Clock::now();
    const OpenOutcome out = OpenInChild(o);
    EXPECT_TRUE(out.result.Ok()) << out.result.Describe();
    if (out.kind.has_value()) {
      EXPECT_TRUE(*out.kind == ErrorKind::kCorrupt || *out.kind == ErrorKind::kTimeout)
          << out.message;
      EXPECT_TRUE(Contains(out.message, SegmentPath(o.name))) << out.message;
    } else {
      EXPECT_TRUE(out.opened);
      EXPECT_TRUE(Contains(out.notices, o.name))
          << "replaced without a notice naming the queue: " << out.notices;
    }
    RecordProperty(std::string(c.what[0] == 'e' ? "empty" : "zeros") + "_segment_open_ms",
                   std::to_string(MillisSince(t0)));
  }
}

TEST_F(WorkQueueTest, HostileHeaderFieldsNeverCrashOrHang) {
  const auto works = dir_.Files("f", 2, {kMiB});
  auto o = Options("hostile", works);
  o.num_slices = 40;
  o.seed = 3;
  o.attach_timeout = milliseconds(1000);
  const std::string seg = SegmentPath(o.name);
  {  // A real stale segment: a client took and acked some, then died.
    Children kids(1, 1);
    kids.Spawn([&](ChildContext& c) {
      auto q = WorkQueue::Open(o);
      WorkItem it;
      for (int i = 0; i < 5; ++i) {
        if (q->TryTake(&it) != TakeStatus::kOk) return c.Fail("take");
        if (i % 2 == 0) q->Ack(it);
      }
      ::raise(SIGKILL);
      return 0;
    });
    ASSERT_TRUE(kids.Wait(0, milliseconds(20000)).Killed());
  }
  const std::string original = ReadFile(seg);
  ASSERT_GE(original.size(), 512u);
  const uint64_t seed = TestSeed();
  RecordProperty("seed", std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::map<std::string, int> outcomes;
  int runs = 0;
  const auto t0 = Clock::now();
  auto mutate_and_open = [&](size_t off, uint64_t v) {
    std::string bytes = original;
    std::memcpy(bytes.data() + off, &v, sizeof v);
    WriteSegment(seg, bytes);
    const OpenOutcome out = OpenInChild(o, milliseconds(15000), milliseconds(200));
    ++runs;
    EXPECT_TRUE(out.result.Ok()) << "offset " << off << " value 0x" << std::hex << v << std::dec
                                 << ": " << out.result.Describe() << " (TAILCUT_TEST_SEED=" << seed
                                 << ")";
    outcomes[out.opened ? "opened" : out.kind ? ErrorKindName(*out.kind) : "no report"]++;
  };
  // Every header word with absurd values...
  for (size_t off = 0; off < 256; off += 8) {
    for (const uint64_t v : std::initializer_list<uint64_t>{~0ull, 1ull << 63, rng()})
      mutate_and_open(off, v);
  }
  // ... and random words anywhere: counters, client and lease slots, tables.
  for (int i = 0; i < 64; ++i) {
    const size_t off = (rng() % (original.size() / 8)) * 8;
    mutate_and_open(off,
                    i % 2 == 0 ? static_cast<uint64_t>(rng()) : static_cast<uint64_t>(rng() % 8));
  }
  std::ostringstream summary;
  for (const auto& [k, n] : outcomes) summary << k << "=" << n << " ";
  RecordProperty("outcomes", summary.str());
  RecordProperty("runs", runs);
  RecordProperty("elapsed_ms", std::to_string(MillisSince(t0)));

  // A truncated segment is corrupt, named.
  WriteSegment(seg, original.substr(0, original.size() / 2));
  const OpenOutcome cut = OpenInChild(o);
  ASSERT_TRUE(cut.result.Ok()) << cut.result.Describe();
  ASSERT_TRUE(cut.kind.has_value()) << "Open accepted a truncated segment";
  EXPECT_EQ(*cut.kind, ErrorKind::kCorrupt) << cut.message;
  EXPECT_TRUE(Contains(cut.message, seg)) << cut.message;
}

// A FREE lease word rewritten as ACKING, owned by a client slot never used,
// passed attach; the resumed queue had every item done and "1 in flight",
// and Take waited for ever. So too a lease in no valid state, or owned by a
// slot past max_clients: each is repaired at attach (its item handed out
// again if it had one) with a notice naming it, never a hang.
TEST_F(WorkQueueTest, ADamagedLeaseOfAStaleSegmentIsRepairedNotWaitedFor) {
  const auto works = dir_.Files("f", 3, {1000});
  struct Damage {
    const char* what;
    uint64_t word;
    const char* needle;
  };
  const uint32_t kMaxClients = 4, kLeases = 2;
  const uint64_t never_used = 3;  // client slot 3: the one child uses slot 0
  const std::vector<Damage> damages = {
      {"ACKING, owner never registered",
       tailcut::detail::LeaseWord(tailcut::detail::kLeaseAcking, never_used, 7),
       "(ACKING, owner slot 3, ticket none): its owner, client slot 3, is not registered"},
      {"OPEN, owner past max_clients",
       tailcut::detail::LeaseWord(tailcut::detail::kLeaseOpen, 4000, 7),
       "(OPEN, owner slot 4000, ticket none): its owner field names client slot 4000, past the 4 "
       "slots"},
      {"state 7", tailcut::detail::LeaseWord(7, 0, 7),
       "(state 7, owner slot 0, ticket none): its state field"},
      {"TAKING, owner never registered",
       tailcut::detail::LeaseWord(tailcut::detail::kLeaseTaking, never_used, 7),
       "(TAKING, owner slot 3, ticket none)"},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.what);
    auto o = Options("damaged", works);
    o.max_clients = kMaxClients;
    o.leases_per_client = kLeases;
    o.num_epochs = 2;
    {  // Every item done, then killed: a stale, finished segment.
      Children kids(1, 1);
      kids.Spawn([&](ChildContext& c) {
        auto q = WorkQueue::Open(o);
        WorkItem it;
        while (q->TryTake(&it) == TakeStatus::kOk) q->Ack(it);
        if (q->Stats().done != 6) return c.Fail("not all done");
        ::raise(SIGKILL);
        return 0;
      });
      ASSERT_TRUE(kids.Wait(0, milliseconds(20000)).Killed());
    }
    const std::string seg = SegmentPath(o.name);
    std::string bytes = ReadFile(seg);
    uint64_t path_bytes = 0;
    for (const auto& w : works) path_bytes += w.size();
    const tailcut::detail::Geometry g =
        tailcut::detail::ComputeGeometry(works.size(), 3, 6, path_bytes, kMaxClients, kLeases);
    ASSERT_EQ(g.total, bytes.size());
    const size_t lease = never_used * kLeases;  // a FREE lease of the unused slot
    const size_t off = g.leases + lease * sizeof(tailcut::detail::LeaseEntry) +
                       offsetof(tailcut::detail::LeaseEntry, word);
    std::memcpy(bytes.data() + off, &d.word, sizeof d.word);
    WriteSegment(seg, bytes);

    std::vector<std::string> notices;
    auto attach = o;
    attach.on_notice = [&](const std::string& n) { notices.push_back(n); };
    auto q = WorkQueue::Open(attach);
    WorkItem it;
    const auto t0 = Clock::now();
    EXPECT_EQ(q->Take(&it, std::chrono::steady_clock::now() + milliseconds(5000)), TakeStatus::kEnd)
        << "Take must end, not wait for a lease nobody holds";
    EXPECT_LT(MillisSince(t0), 1000.0);
    EXPECT_EQ(q->Stats().in_flight, 0u);
    std::string all;
    for (const auto& n : notices) all += n + "\n";
    EXPECT_TRUE(Contains(all, "segment " + seg +
                                  " was damaged; handed out again the items of 1 "
                                  "lease(s) no process could finish: lease " +
                                  std::to_string(lease) + " " + d.needle))
        << all;
  }
}

// The same damage in a live queue: found by the next housekeeping.
TEST_F(WorkQueueTest, ADamagedLeaseOfALiveQueueIsRepairedByHousekeeping) {
  const auto works = dir_.Files("f", 2, {1000});
  auto o = Options("damaged-live", works);
  o.max_clients = 4;
  o.leases_per_client = 2;
  auto q = WorkQueue::Open(o);
  uint64_t path_bytes = 0;
  for (const auto& w : works) path_bytes += w.size();
  const tailcut::detail::Geometry g = tailcut::detail::ComputeGeometry(2, 2, 2, path_bytes, 4, 2);
  const int fd = ::open(SegmentPath(o.name).c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const uint64_t word = tailcut::detail::LeaseWord(tailcut::detail::kLeaseAcking, 3, 9);
  ASSERT_EQ(::pwrite(fd, &word, sizeof word,
                     static_cast<off_t>(g.leases + 6 * sizeof(tailcut::detail::LeaseEntry))),
            static_cast<ssize_t>(sizeof word));
  ::close(fd);
  WorkItem it;
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(q->TryTake(&it), TakeStatus::kOk);
    ASSERT_EQ(q->Ack(it), ItemStatus::kOk);
  }
  EXPECT_EQ(q->Take(&it, std::chrono::steady_clock::now() + milliseconds(5000)), TakeStatus::kEnd);
}

TEST_F(WorkQueueTest, SegmentOwnedByAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make a segment owned by another user";
  auto o = Options("foreign", dir_.Files("f", 1, {100}));
  const std::string seg = SegmentPath(o.name);
  const int fd = ::open(seg.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0) << ErrnoText("open");
  ASSERT_EQ(::ftruncate(fd, 1 << 20), 0);
  ASSERT_EQ(::fchown(fd, 65534, 65534), 0) << ErrnoText("fchown");
  ::close(fd);
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kPermission, {seg}));
  EXPECT_TRUE(PathExists(seg)) << "someone else's object must not be removed or replaced";
}

TEST_F(WorkQueueTest, FullDevShmIsNoSpaceAndLeavesNothing) {
  const std::string big = dir_.File("big", 1ull << 32);  // sparse
  const std::string small = dir_.File("small", 100);
  const std::string name = NewName("nospace");
  Children kids(1, 1);
  kids.Spawn([&](ChildContext& c) {
    if (::unshare(CLONE_NEWNS) != 0) {
      c.Fail(ErrnoText("unshare(CLONE_NEWNS)"));
      return 77;
    }
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=256k") != 0) {
      c.Fail(ErrnoText("mount"));
      return 77;
    }
    auto o = BaseOptions(name, {big});
    o.num_slices = 200000;
    // The exact free space, not rounded up to "1 MiB".
    auto r = FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kNoSpace,
                       {"/dev/shm", "(/dev/shm has 256 KiB free)"});
    if (!r) return c.Fail(std::string("a queue larger than /dev/shm: ") + r.message());
    if (PathExists(SegmentPath(name)))
      return c.Fail("the failed Open left its partial segment in /dev/shm");
    // The name is usable again for a queue that fits.
    try {
      auto q = WorkQueue::Open(BaseOptions(name, {small}));
      if (q->num_items() != 1) return c.Fail("small queue after kNoSpace has wrong items");
    } catch (const Error& e) {
      return c.Fail("a small queue after kNoSpace failed: " + ErrorText(e));
    }
    return 0;
  });
  const ChildResult r = kids.Wait(0, milliseconds(30000));
  if (r.exited && r.exit_code == 77)
    GTEST_SKIP() << "cannot mount a small /dev/shm here: " << r.error;
  EXPECT_TRUE(r.Ok()) << r.Describe();
}

}  // namespace
}  // namespace tailcut::test
