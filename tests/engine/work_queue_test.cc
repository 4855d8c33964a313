// Tests of tailcut/work_queue.h that one process (sometimes with a child or
// two) can run: item order and the shuffle bijection, slicing, bad input,
// checkpoints, lifetime of the segment, and the end of the data.
//
// Many-process exactly-once, racing creators and lease timeouts are in
// work_queue_process_test.cc; kill -9 trials in work_queue_crash_test.cc;
// threads in work_queue_thread_test.cc.
#include <grp.h>
#include <sched.h>
#include <sys/mount.h>

#include <fstream>
#include <map>
#include <set>

#include "engine/segment_layout.h"
#include "tests/engine/queue_test_util.h"

namespace tailcut::test {
namespace {

using std::chrono::milliseconds;
using Order = std::vector<std::pair<uint64_t, uint64_t>>;  // (epoch, index) in take order

constexpr uint64_t kMiB = 1 << 20;

class WorkQueueTest : public QueueTest {
 protected:
  WorkQueueOptions Options(std::string_view tag, std::vector<std::string> works) {
    return BaseOptions(NewName(tag), std::move(works));
  }

  // Runs a queue start to end in this process; the (epoch, index) sequence.
  Order RunOrder(const WorkQueueOptions& o) {
    auto q = WorkQueue::Open(o);
    Order out;
    for (const WorkItem& it : Drain(*q)) out.emplace_back(it.epoch, it.index);
    return out;
  }
};

// ============================================================ order

TEST_F(WorkQueueTest, SameSeedGivesTheSameOrder) {
  const auto works = dir_.Files("f", 5, {kMiB, 3 * kMiB});
  auto a = Options("same_seed_a", works);
  a.num_slices = 200;
  a.num_epochs = 3;
  a.seed = 42;
  auto b = a;
  b.name = NewName("same_seed_b");
  const Order first = RunOrder(a);
  const Order second = RunOrder(b);
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(first, second);
}

TEST_F(WorkQueueTest, DifferentSeedsGiveDifferentOrders) {
  const auto works = dir_.Files("f", 5, {kMiB});
  auto a = Options("seed1", works);
  a.num_slices = 200;
  a.seed = 1;
  auto b = a;
  b.name = NewName("seed2");
  b.seed = 2;
  EXPECT_NE(RunOrder(a), RunOrder(b));
}

TEST_F(WorkQueueTest, EachEpochIsAPermutationInTicketOrder) {
  const auto works = dir_.Files("f", 4, {kMiB, 2 * kMiB});
  auto o = Options("perm", works);
  o.num_slices = 300;
  o.num_epochs = 4;
  o.seed = 7;
  auto q = WorkQueue::Open(o);
  const uint64_t n = q->num_items();
  ASSERT_GT(n, 100u);
  EXPECT_EQ(q->seed(), 7u);
  EXPECT_EQ(q->Stats().seed, 7u);
  EXPECT_TRUE(q->Stats().shuffle);
  const std::vector<WorkItem> got = Drain(*q);
  ASSERT_EQ(got.size(), n * 4);
  std::vector<std::vector<uint64_t>> epochs(4);
  for (uint64_t t = 0; t < got.size(); ++t) {
    // One process, one thread, nothing recovered: tickets come in order.
    ASSERT_EQ(got[t].ticket, t);
    ASSERT_EQ(got[t].epoch, t / n);
    ASSERT_EQ(got[t].index, q->ItemAt(t / n, t % n));
    epochs[t / n].push_back(got[t].index);
  }
  for (uint64_t e = 0; e < 4; ++e) {
    std::vector<uint64_t> sorted = epochs[e];
    std::sort(sorted.begin(), sorted.end());
    for (uint64_t i = 0; i < n; ++i)
      ASSERT_EQ(sorted[i], i) << "epoch " << e << " is not a permutation";
    std::vector<uint64_t> identity(n);
    std::iota(identity.begin(), identity.end(), 0);
    EXPECT_NE(epochs[e], identity) << "epoch " << e << " was not shuffled";
    for (uint64_t f = 0; f < e; ++f)
      EXPECT_NE(epochs[e], epochs[f]) << "epochs " << f << " and " << e << " agree";
  }
}

TEST_F(WorkQueueTest, WithoutShuffleItemsComeInFileAndByteOrder) {
  const std::vector<std::string> works = {dir_.File("c", 3 * kMiB), dir_.File("a", kMiB),
                                          dir_.File("b", 2 * kMiB)};
  auto o = Options("noshuffle", works);
  o.shuffle = false;
  o.num_slices = 12;
  o.num_epochs = 2;
  auto q = WorkQueue::Open(o);
  EXPECT_FALSE(q->Stats().shuffle);
  const uint64_t n = q->num_items();
  const auto& items = q->items();
  ASSERT_EQ(items.size(), n);
  for (uint64_t i = 1; i < n; ++i) {
    const bool ordered = items[i - 1].file < items[i].file ||
                         (items[i - 1].file == items[i].file && items[i - 1].end == items[i].begin);
    EXPECT_TRUE(ordered) << "item " << i << " (file " << items[i].file << " @" << items[i].begin
                         << ") does not follow item " << i - 1;
  }
  const std::vector<WorkItem> got = Drain(*q);
  ASSERT_EQ(got.size(), 2 * n);
  for (uint64_t t = 0; t < got.size(); ++t) {
    EXPECT_EQ(got[t].index, t % n) << "ticket " << t;
    EXPECT_EQ(q->ItemAt(t / n, t % n), t % n);
  }
  // Works order is kept: the first item belongs to "c", the first works entry.
  EXPECT_EQ(q->paths()[items[0].file], works[0]);
}

TEST_F(WorkQueueTest, UnsetSeedIsDrawnOnceAndSharedByAttachers) {
  const auto works = dir_.Files("f", 3, {kMiB});
  auto o = Options("noseed", works);
  o.num_slices = 30;
  auto creator = WorkQueue::Open(o);
  auto attacher = WorkQueue::Open(o);
  EXPECT_EQ(creator->seed(), attacher->seed());
  EXPECT_EQ(creator->Stats().seed, creator->seed());
  EXPECT_EQ(attacher->Stats().seed, creator->seed());
  for (uint64_t p = 0; p < creator->num_items(); ++p) {
    ASSERT_EQ(creator->ItemAt(0, p), attacher->ItemAt(0, p));
  }
  // Another queue draws its own seed (equal with probability 2^-64).
  auto other = o;
  other.name = NewName("noseed_other");
  auto q2 = WorkQueue::Open(other);
  EXPECT_NE(q2->seed(), creator->seed()) << "an unset seed should be drawn at random";
}

TEST_F(WorkQueueTest, ItemAtIsABijectionForManySizes) {
  for (const uint64_t n : {1, 2, 3, 7, 64, 1000, 4097}) {
    SCOPED_TRACE("num_slices " + std::to_string(n));
    auto o = Options("bij", {dir_.File("b" + std::to_string(n), n * 4096)});
    if (n > 1) o.num_slices = n;
    o.num_epochs = 3;
    o.seed = 1234 + n;
    auto q = WorkQueue::Open(o);
    const uint64_t m = q->num_items();
    EXPECT_LE(m > n ? m - n : n - m, 1u)
        << "one file with num_slices " << n << " gave " << m << " items";
    std::vector<std::vector<uint64_t>> perms(3);
    for (uint64_t e = 0; e < 3; ++e) {
      std::vector<bool> seen(m);
      for (uint64_t p = 0; p < m; ++p) {
        const uint64_t i = q->ItemAt(e, p);
        ASSERT_LT(i, m) << "epoch " << e << " position " << p;
        ASSERT_FALSE(seen[i]) << "item " << i << " appears twice in epoch " << e;
        seen[i] = true;
        perms[e].push_back(i);
      }
    }
    if (m >= 64) {
      EXPECT_NE(perms[0], perms[1]);
      EXPECT_NE(perms[1], perms[2]);
    }
    // Deterministic: the same object answers the same again.
    for (uint64_t p = 0; p < m; p += 1 + m / 50) EXPECT_EQ(q->ItemAt(1, p), perms[1][p]);
  }
}

// ============================================================ slicing

TEST_F(WorkQueueTest, WithoutNumSlicesEachFileIsOneItem) {
  const std::vector<uint64_t> sizes = {10, 4096, kMiB + 3};
  std::vector<std::string> works;
  for (size_t i = 0; i < sizes.size(); ++i)
    works.push_back(dir_.File("w" + std::to_string(i), sizes[i]));
  auto q = WorkQueue::Open(Options("one_per_file", works));
  ASSERT_EQ(q->num_items(), 3u);
  EXPECT_EQ(q->paths(), works);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(q->items()[i].file, i);
    EXPECT_EQ(q->items()[i].begin, 0u);
    EXPECT_EQ(q->items()[i].end, sizes[i]);
  }
}

TEST_F(WorkQueueTest, PrefixIsPrependedToEveryWork) {
  dir_.File("x.rec", 100);
  dir_.File("y.rec", 200);
  auto o = Options("prefix", {"x.rec", "y.rec"});
  o.prefix = dir_.path() + "/";
  auto q = WorkQueue::Open(o);
  ASSERT_EQ(q->paths().size(), 2u);
  EXPECT_EQ(q->paths()[0], dir_.path() + "/x.rec");
  EXPECT_EQ(q->paths()[1], dir_.path() + "/y.rec");
  for (const WorkItem& it : Drain(*q)) EXPECT_EQ(it.path, q->paths()[it.file]);
}

// Items of every file tile [0, size) in byte order, none empty unless the
// file is; returns the item count per file.
std::vector<uint64_t> CheckTiling(const WorkQueue& q, const std::vector<uint64_t>& sizes) {
  std::vector<uint64_t> next(sizes.size(), 0), count(sizes.size(), 0);
  uint32_t last_file = 0;
  for (uint64_t i = 0; i < q.items().size(); ++i) {
    const WorkQueue::Item& it = q.items()[i];
    EXPECT_LT(it.file, sizes.size());
    if (it.file >= sizes.size()) continue;
    EXPECT_GE(it.file, last_file) << "item " << i << " is out of file order";
    last_file = it.file;
    EXPECT_EQ(it.begin, next[it.file]) << "gap or overlap at item " << i << " of file " << it.file;
    EXPECT_LE(it.begin, it.end);
    if (sizes[it.file] > 0) {
      EXPECT_LT(it.begin, it.end) << "empty item " << i << " of a non-empty file";
    }
    next[it.file] = it.end;
    ++count[it.file];
  }
  for (size_t f = 0; f < sizes.size(); ++f) {
    EXPECT_EQ(next[f], sizes[f]) << "items of file " << f << " stop short of its size";
    EXPECT_GE(count[f], 1u) << "file " << f << " has no item";
  }
  return count;
}

TEST_F(WorkQueueTest, NumSlicesSpreadsItemsOverFilesBySize) {
  const std::vector<uint64_t> sizes = {kMiB, 3 * kMiB, 6 * kMiB, 100};
  std::vector<std::string> works;
  for (size_t i = 0; i < sizes.size(); ++i)
    works.push_back(dir_.File("s" + std::to_string(i), sizes[i]));
  auto o = Options("slices", works);
  o.num_slices = 100;
  auto q = WorkQueue::Open(o);
  const uint64_t n = q->num_items();
  EXPECT_GE(n, 98u);
  EXPECT_LE(n, 104u);
  const std::vector<uint64_t> count = CheckTiling(*q, sizes);
  const double total = 10.0 * kMiB + 100;
  for (size_t f = 0; f < 3; ++f) {
    const double share = 100.0 * sizes[f] / total;
    EXPECT_NEAR(static_cast<double>(count[f]), share, 2.0)
        << "file " << f << " of " << sizes[f] << " bytes";
  }
  EXPECT_EQ(count[3], 1u) << "a 100-byte file among MiB files gets one item";
  // Slices of one file are about equal.
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> range;  // file -> (min, max) length
  for (const auto& it : q->items()) {
    auto [pos, fresh] = range.try_emplace(it.file, it.end - it.begin, it.end - it.begin);
    pos->second.first = std::min(pos->second.first, it.end - it.begin);
    pos->second.second = std::max(pos->second.second, it.end - it.begin);
  }
  for (const auto& [file, mm] : range) {
    EXPECT_LE(mm.second, 2 * mm.first + 1) << "slices of file " << file << " vary from " << mm.first
                                           << " to " << mm.second << " bytes";
  }
}

TEST_F(WorkQueueTest, EveryFileGetsAtLeastOneItem) {
  std::vector<uint64_t> sizes(10, 1024);
  sizes.push_back(100 * kMiB);
  std::vector<std::string> works;
  for (size_t i = 0; i < sizes.size(); ++i)
    works.push_back(dir_.File("m" + std::to_string(i), sizes[i]));
  auto o = Options("atleast1", works);
  o.num_slices = 20;
  auto q = WorkQueue::Open(o);
  const auto count = CheckTiling(*q, sizes);
  for (size_t f = 0; f < 10; ++f) EXPECT_EQ(count[f], 1u);
  EXPECT_GE(count[10], 8u);

  // Fewer slices than files: still one item per file.
  auto few = Options("fewslices", works);
  few.num_slices = 2;
  auto q2 = WorkQueue::Open(few);
  EXPECT_EQ(q2->num_items(), works.size());
  CheckTiling(*q2, sizes);
}

TEST_F(WorkQueueTest, TinyFilesAreNotCutIntoEmptySlices) {
  auto o = Options("tiny", {dir_.File("tiny", 10)});
  o.num_slices = 100;
  auto q = WorkQueue::Open(o);
  EXPECT_LE(q->num_items(), 10u);
  CheckTiling(*q, {10});
}

TEST_F(WorkQueueTest, EmptyFilesGetOneEmptyItem) {
  const std::vector<uint64_t> sizes = {0, kMiB, 0};
  std::vector<std::string> works;
  for (size_t i = 0; i < sizes.size(); ++i)
    works.push_back(dir_.File("e" + std::to_string(i), sizes[i]));
  {
    auto q = WorkQueue::Open(Options("empty_plain", works));
    ASSERT_EQ(q->num_items(), 3u);
    CheckTiling(*q, sizes);
    EXPECT_EQ(Drain(*q).size(), 3u);
  }
  auto o = Options("empty_sliced", works);
  o.num_slices = 10;
  auto q = WorkQueue::Open(o);
  const auto count = CheckTiling(*q, sizes);
  EXPECT_EQ(count[0], 1u);
  EXPECT_EQ(count[2], 1u);
  EXPECT_GE(count[1], 8u);
  EXPECT_EQ(Drain(*q).size(), q->num_items());
}

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
  EXPECT_EQ(live->Ack(held), AckStatus::kOk);
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

void WriteSegment(const std::string& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0) << ErrnoText("open") << " " << path;
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(bytes.size())), 0);
  ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  ::close(fd);
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
    const size_t off = g.leases + lease * sizeof(tailcut::detail::LeaseSlot) +
                       offsetof(tailcut::detail::LeaseSlot, word);
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
                     static_cast<off_t>(g.leases + 6 * sizeof(tailcut::detail::LeaseSlot))),
            static_cast<ssize_t>(sizeof word));
  ::close(fd);
  WorkItem it;
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(q->TryTake(&it), TakeStatus::kOk);
    ASSERT_EQ(q->Ack(it), AckStatus::kOk);
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

// ============================================================ acks

TEST_F(WorkQueueTest, AckRefusesItemsItDoesNotHold) {
  auto o = Options("badack", dir_.Files("f", 4, {100}));
  auto q = WorkQueue::Open(o);
  WorkItem it;
  ASSERT_EQ(q->TryTake(&it), TakeStatus::kOk);
  EXPECT_EQ(q->Progress(it, it.begin), AckStatus::kOk);
  EXPECT_EQ(q->Ack(it), AckStatus::kOk);
  // No longer held: refused as what it is, and never counted twice.
  EXPECT_EQ(q->Ack(it), AckStatus::kAlreadyDone) << "second ack of the same item";
  EXPECT_EQ(q->GiveBack(it), AckStatus::kAlreadyDone) << "give back after ack";
  EXPECT_EQ(q->Progress(it, it.begin), AckStatus::kAlreadyDone) << "progress after ack";
  EXPECT_EQ(q->Stats().stale_acks, 0u) << "a second ack is not a stale one";
  EXPECT_EQ(q->Stats().done, 1u);
  WorkItem forged = it;
  forged.lease = 1u << 30;
  EXPECT_EQ(q->Ack(forged), AckStatus::kInvalid) << "lease slot out of range";
  EXPECT_EQ(q->Progress(forged, 0), AckStatus::kInvalid);
  EXPECT_EQ(q->GiveBack(forged), AckStatus::kInvalid);
  EXPECT_EQ(q->Ack(WorkItem{}), AckStatus::kInvalid) << "default item";
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
  EXPECT_EQ(q->GiveBack(it), AckStatus::kOk);
  EXPECT_NE(q->Ack(it), AckStatus::kOk) << "an item given back is no longer held";
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
  EXPECT_EQ(q->Ack(held[2]), AckStatus::kOk);
  EXPECT_EQ(q->TryTake(&extra), TakeStatus::kOk);
  for (int i : {0, 1, 3}) EXPECT_EQ(q->Ack(held[i]), AckStatus::kOk);
  EXPECT_EQ(q->Ack(extra), AckStatus::kOk);
  EXPECT_EQ(Drain(*q).size(), 15u);
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
  EXPECT_EQ(q->Progress(a, a.begin + 1, 7), AckStatus::kOk);
  EXPECT_EQ(q->Ack(a), AckStatus::kOk);
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
  EXPECT_EQ(q->Ack(b), AckStatus::kOk);
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
  EXPECT_EQ(b->TryTake(&piece), TakeStatus::kEmpty) << "an item never claimed is never split";
  uint64_t end = 0;
  ASSERT_EQ(a->Claim(it, kMiB, &end), AckStatus::kOk);
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
  ASSERT_EQ(a->Claim(it, size, &end), AckStatus::kOk);
  EXPECT_EQ(end, piece.begin);
  // A piece is split again like any claimed item: c, idle, takes the
  // unclaimed tail of b's piece (a's part is claimed to its end).
  uint64_t piece_end = 0;
  ASSERT_EQ(b->Claim(piece, piece.begin + 4096, &piece_end), AckStatus::kOk);
  EXPECT_EQ(piece_end, piece.end);
  WorkItem piece2;
  ASSERT_EQ(c->TryTake(&piece2), TakeStatus::kOk);
  EXPECT_TRUE(piece2.piece);
  EXPECT_EQ(piece2.ticket, it.ticket);
  EXPECT_EQ(piece2.end, piece.end);
  EXPECT_GT(piece2.begin, piece.begin + 4096);
  ASSERT_EQ(b->Claim(piece, piece.end, &piece_end), AckStatus::kOk);
  EXPECT_EQ(piece_end, piece2.begin) << "b must stop where c starts";
  EXPECT_EQ(b->Ack(piece), AckStatus::kOk);
  EXPECT_EQ(c->Ack(piece2), AckStatus::kOk);
  EXPECT_EQ(c->TryTake(&other), TakeStatus::kEmpty) << "a still holds its part";
  EXPECT_EQ(a->Ack(it), AckStatus::kOk);
  EXPECT_EQ(a->TryTake(&other), TakeStatus::kEnd);
  EXPECT_EQ(c->TryTake(&other), TakeStatus::kEnd);
  const QueueStats s = a->Stats();
  EXPECT_EQ(s.done, 1u);
  EXPECT_EQ(s.splits, 2u);
  uint64_t by_clients = 0;
  for (const ClientStats& cs : s.clients) by_clients += cs.splits;
  EXPECT_EQ(by_clients, 2u);
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
    ASSERT_EQ(a->Claim(it, kMiB, &end), AckStatus::kOk);
    EXPECT_EQ(b->TryTake(&other), TakeStatus::kEmpty);
    ASSERT_EQ(a->Claim(it, size, &end), AckStatus::kOk);
    EXPECT_EQ(end, size);
    EXPECT_EQ(a->Ack(it), AckStatus::kOk);
    EXPECT_EQ(b->TryTake(&other), TakeStatus::kEnd);
    EXPECT_EQ(a->Stats().splits, 0u);
  }
}

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
      EXPECT_EQ(q.Ack(it), AckStatus::kOk);
      p.acked.insert(key);
      continue;
    }
    uint64_t offset = it.begin;
    if ((i / 5) % 2 == 0 && it.end - it.begin >= 4) {
      EXPECT_EQ(q.Progress(it, it.begin + (it.end - it.begin) / 4, 3), AckStatus::kOk);
      offset = it.begin + (it.end - it.begin) / 2;
      EXPECT_EQ(q.Progress(it, offset, 5), AckStatus::kOk);
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
        if (q->Ack(it) != AckStatus::kOk) return c.Fail("ack refused");
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
    ASSERT_EQ(q->Ack(it), AckStatus::kOk);
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
        ASSERT_EQ(a->Ack(held[i]), AckStatus::kOk);
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
      if (q->Ack(held[i]) != AckStatus::kOk) return c.Fail("ack");
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
    if (q->Ack(it) != AckStatus::kOk) return c.Fail("ack refused");
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
    ASSERT_EQ(q->Ack(it), AckStatus::kOk);
  }
  EXPECT_EQ(q->TryTake(&it), TakeStatus::kEmpty) << "another live process holds the last item";
  auto t0 = Clock::now();
  EXPECT_EQ(q->Take(&it, t0 + milliseconds(300)), TakeStatus::kEmpty);
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
    ASSERT_EQ(q->Ack(it), AckStatus::kOk);
  }
  EXPECT_EQ(q->TryTake(&it), TakeStatus::kEmpty);
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
  EXPECT_EQ(q->Ack(it), AckStatus::kOk);
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
  EXPECT_EQ(q->TryTake(&c), TakeStatus::kEmpty);
  EXPECT_EQ(q->Ack(a), AckStatus::kOk);
  EXPECT_EQ(q->Ack(b), AckStatus::kOk);
  EXPECT_EQ(q->TryTake(&c), TakeStatus::kEnd);
  EXPECT_EQ(q->Take(&c), TakeStatus::kEnd);
}

}  // namespace
}  // namespace tailcut::test
