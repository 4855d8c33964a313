// Tests of engine/segment.h: creating, attaching to, validating and removing
// the POSIX shared-memory object behind a queue name, and each state of the
// attach state machine (AttachSegment). Damaged segments are written by hand
// into real objects in /dev/shm, one bad field at a time, and must be refused
// with an error that names the segment and the field.
#include "engine/segment.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "engine/robust_mutex.h"
#include "tailcut/error.h"
#include "tests/engine/queue_test_util.h"

namespace tailcut::detail {
namespace {

using std::chrono::milliseconds;
using test::ChildContext;
using test::Children;
using test::ChildResult;
using test::Contains;
using test::ErrnoText;
using test::UniqueQueueName;

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Runs `f`, which must throw tailcut::Error of `kind`; returns its message.
std::string ErrorOf(const std::function<void()>& f, ErrorKind kind) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

class SegmentTest : public ::testing::Test {
 protected:
  // A fresh queue name whose object is removed at the end of the test.
  std::string NewName(const char* tag) {
    names_.push_back(UniqueQueueName(tag));
    return names_.back();
  }
  void TearDown() override {
    for (const std::string& n : names_) ::shm_unlink(Segment::ObjectName(n).c_str());
  }

  // Makes the object by hand, as a process that is not tailcut could.
  void MakeRawObject(const std::string& name, mode_t mode, off_t size) {
    const std::string object = "/" + Segment::ObjectName(name);
    const int fd = ::shm_open(object.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_GE(fd, 0) << ErrnoText("shm_open");
    ASSERT_EQ(::fchmod(fd, mode), 0) << ErrnoText("fchmod");
    ASSERT_EQ(::ftruncate(fd, size), 0) << ErrnoText("ftruncate");
    ::close(fd);
  }

  std::vector<std::string> names_;
};

// A well-formed segment written by hand: 2 files, 3 items, 2 epochs.
class ValidSegmentTest : public SegmentTest {
 protected:
  void SetUp() override {
    name_ = NewName("valid");
    geometry_ = ComputeGeometry(2, 3, 6, 16, 4, 2);
    ASSERT_NE(geometry_.total, 0u);
    seg_ = Segment::CreateExclusive(name_, geometry_.total);
    ASSERT_NE(seg_, nullptr);
    seg_->SetGeometry(geometry_);
    Header& h = seg_->header();
    h.layout_version = kLayoutVersion;
    h.total_size = geometry_.total;
    h.num_files = 2;
    h.num_items = 3;
    h.num_epochs = 2;
    h.total_tickets = 6;
    h.path_bytes = 16;
    h.max_clients = 4;
    h.leases_per_client = 2;
    InitRobustMutex(&h.admin_mutex);
    InitRobustMutex(&h.sweep_mutex);
    for (uint64_t c = 0; c < 4; ++c) InitRobustMutex(&seg_->client(c).life);
    std::memcpy(seg_->path_bytes(), "/data/a/data/bb_", 16);
    seg_->file(0) = {0, 7, 100};
    seg_->file(1) = {7, 8, 50};
    seg_->item(0) = {0, 0, 60};
    seg_->item(1) = {0, 60, 100};
    seg_->item(2) = {1, 0, 50};
    h.magic.store(kSegmentMagic, std::memory_order_release);
  }

  std::unique_ptr<Segment> Attach() {
    auto seg = Segment::OpenExisting(name_, milliseconds(1000));
    EXPECT_NE(seg, nullptr);
    return seg;
  }

  // Validate's message after `damage`, checking that it is kCorrupt and
  // names the segment and how to remove it.
  std::string CorruptMessage(const std::function<void(Segment&)>& damage) {
    damage(*seg_);
    auto seg = Attach();
    if (seg == nullptr) return "";
    const std::string msg = ErrorOf([&] { seg->Validate(); }, ErrorKind::kCorrupt);
    EXPECT_TRUE(Contains(msg, seg_->path())) << msg;
    EXPECT_TRUE(Contains(msg, "tailcut rm --force " + name_)) << msg;
    return msg;
  }

  std::string name_;
  Geometry geometry_;
  std::unique_ptr<Segment> seg_;
};

// ============================================================ names

TEST_F(SegmentTest, ObjectNameCarriesTheUserAndTheQueueName) {
  const std::string uid = std::to_string(::geteuid());
  EXPECT_EQ(Segment::ObjectName("q1"), "tailcut." + uid + ".q1");
  EXPECT_EQ(Segment::PathOf("q1"), "/dev/shm/tailcut." + uid + ".q1");
}

// ============================================================ create

TEST_F(SegmentTest, CreateExclusiveMakesAPrivateObjectOfTheRequestedSize) {
  const std::string name = NewName("create");
  auto seg = Segment::CreateExclusive(name, 1 << 16);
  ASSERT_NE(seg, nullptr);
  EXPECT_TRUE(seg->created());
  EXPECT_EQ(seg->size(), size_t{1} << 16);
  EXPECT_EQ(seg->path(), Segment::PathOf(name));
  EXPECT_EQ(seg->queue_name(), name);
  struct stat st;
  ASSERT_EQ(::stat(seg->path().c_str(), &st), 0) << ErrnoText("stat");
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_EQ(st.st_size, 1 << 16);
  // Reserved, not sparse: a full /dev/shm must fail here, not with SIGBUS later.
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, uint64_t{1} << 16);
  // Mapped read-write and zeroed.
  EXPECT_EQ(seg->header().magic.load(std::memory_order_relaxed), 0u);
  seg->header().total_size = 123;
}

TEST_F(SegmentTest, CreateExclusiveIgnoresAPermissiveUmask) {
  const std::string name = NewName("umask");
  const mode_t old = ::umask(0);
  auto seg = Segment::CreateExclusive(name, 4096);
  ::umask(old);
  ASSERT_NE(seg, nullptr);
  struct stat st;
  ASSERT_EQ(::stat(seg->path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST_F(SegmentTest, CreateExclusiveReturnsNullWhenTheNameExists) {
  const std::string name = NewName("excl");
  auto first = Segment::CreateExclusive(name, 4096);
  ASSERT_NE(first, nullptr);
  first->header().total_size = 77;
  EXPECT_EQ(Segment::CreateExclusive(name, 8192), nullptr);
  // The loser did not touch the winner's object.
  struct stat st;
  ASSERT_EQ(::stat(first->path().c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 4096);
  EXPECT_EQ(first->header().total_size, 77u);
}

TEST_F(SegmentTest, CreateExclusiveOnAFullDevShmIsNoSpaceAndLeavesNothing) {
  // In a child with a private mount namespace and a 256 KiB /dev/shm.
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
    try {
      Segment::CreateExclusive(name, 4 << 20);
      return c.Fail("a 4 MiB segment in a 256 KiB /dev/shm was created");
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (e.kind() != ErrorKind::kNoSpace) return c.Fail("not kNoSpace: " + msg);
      for (const char* part : {"cannot reserve 4 MiB", "/dev/shm has", "free", name.c_str()})
        if (!Contains(msg, part))
          return c.Fail("message lacks '" + std::string(part) + "': " + msg);
    }
    if (PathExists(Segment::PathOf(name)))
      return c.Fail("the failed create left its object behind");
    // The name is free for a segment that fits.
    try {
      if (Segment::CreateExclusive(name, 64 << 10) == nullptr) return c.Fail("name still taken");
    } catch (const Error& e) {
      return c.Fail(std::string("a small segment after kNoSpace failed: ") + e.what());
    }
    return 0;
  });
  const ChildResult r = kids.Wait(0, milliseconds(30000));
  if (r.exited && r.exit_code == 77)
    GTEST_SKIP() << "cannot mount a small /dev/shm here: " << r.error;
  EXPECT_TRUE(r.Ok()) << r.Describe();
}

// ============================================================ attach

TEST_F(SegmentTest, OpenExistingOfAMissingQueueIsNotFound) {
  const std::string name = NewName("missing");
  const std::string msg =
      ErrorOf([&] { Segment::OpenExisting(name, milliseconds(10)); }, ErrorKind::kNotFound);
  EXPECT_TRUE(Contains(msg, "'" + name + "'")) << msg;
  EXPECT_TRUE(Contains(msg, Segment::PathOf(name))) << msg;
}

TEST_F(SegmentTest, OpenExistingMapsTheCreatorsObject) {
  const std::string name = NewName("attach");
  auto creator = Segment::CreateExclusive(name, 3 * kMinSegmentSize);
  ASSERT_NE(creator, nullptr);
  auto attacher = Segment::OpenExisting(name, milliseconds(100));
  ASSERT_NE(attacher, nullptr);
  EXPECT_FALSE(attacher->created());
  EXPECT_EQ(attacher->size(), 3 * kMinSegmentSize);
  creator->header().num_items = 4242;
  EXPECT_EQ(attacher->header().num_items, 4242u);
  attacher->header().num_files = 17;
  EXPECT_EQ(creator->header().num_files, 17u);
}

TEST_F(SegmentTest, OpenExistingWaitsForTheCreatorToSizeTheObject) {
  const std::string name = NewName("late_size");
  MakeRawObject(name, 0600, 0);
  std::thread creator([&] {
    std::this_thread::sleep_for(milliseconds(50));
    const int fd = ::shm_open(("/" + Segment::ObjectName(name)).c_str(), O_RDWR, 0);
    if (fd >= 0) {
      (void)::ftruncate(fd, static_cast<off_t>(2 * kMinSegmentSize));
      ::close(fd);
    }
  });
  std::unique_ptr<Segment> seg;
  EXPECT_NO_THROW(seg = Segment::OpenExisting(name, milliseconds(5000)));
  creator.join();
  ASSERT_NE(seg, nullptr);
  EXPECT_EQ(seg->size(), 2 * kMinSegmentSize);
}

TEST_F(SegmentTest, AnEmptyObjectThatNeverGrowsTimesOut) {
  const std::string name = NewName("empty");
  MakeRawObject(name, 0600, 0);
  const auto start = std::chrono::steady_clock::now();
  const std::string msg =
      ErrorOf([&] { Segment::OpenExisting(name, milliseconds(40)); }, ErrorKind::kTimeout);
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(40));
  EXPECT_TRUE(Contains(msg, Segment::PathOf(name))) << msg;
  EXPECT_TRUE(Contains(msg, "did not grow for 40 ms")) << msg;
  EXPECT_TRUE(PathExists(Segment::PathOf(name))) << "a plain attach must not remove it";
}

TEST_F(SegmentTest, AnAbandonedEmptyObjectIsRemovedWhenTheCallerAsks) {
  const std::string name = NewName("abandoned");
  MakeRawObject(name, 0600, 0);
  bool abandoned = false;
  std::unique_ptr<Segment> seg;
  EXPECT_NO_THROW(seg = Segment::OpenExisting(name, milliseconds(20), &abandoned));
  EXPECT_EQ(seg, nullptr);
  EXPECT_TRUE(abandoned);
  EXPECT_FALSE(PathExists(Segment::PathOf(name)));
}

TEST_F(SegmentTest, AnObjectSmallerThanAHeaderIsCorrupt) {
  const std::string name = NewName("tiny");
  MakeRawObject(name, 0600, 10);
  const std::string msg =
      ErrorOf([&] { Segment::OpenExisting(name, milliseconds(1000)); }, ErrorKind::kCorrupt);
  EXPECT_TRUE(Contains(msg, "is 10 bytes")) << msg;
  EXPECT_TRUE(Contains(msg, "tailcut rm --force " + name)) << msg;
}

TEST_F(SegmentTest, AnObjectWritableByOthersIsRefused) {
  for (mode_t mode : {mode_t{0666}, mode_t{0620}, mode_t{0602}}) {
    const std::string name = NewName("mode");
    MakeRawObject(name, mode, static_cast<off_t>(kMinSegmentSize));
    const std::string msg =
        ErrorOf([&] { Segment::OpenExisting(name, milliseconds(10)); }, ErrorKind::kPermission);
    char octal[8];
    std::snprintf(octal, sizeof(octal), "0%o", static_cast<unsigned>(mode));
    EXPECT_TRUE(Contains(msg, std::string("mode ") + octal)) << msg;
    EXPECT_TRUE(Contains(msg, Segment::PathOf(name))) << msg;
    EXPECT_TRUE(Contains(msg, "tailcut rm --force " + name)) << msg;
  }
}

TEST_F(SegmentTest, AnObjectOwnedBySomeoneElseIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "only root can give an object to another user";
  const std::string name = NewName("owner");
  MakeRawObject(name, 0600, static_cast<off_t>(kMinSegmentSize));
  ASSERT_EQ(::chown(Segment::PathOf(name).c_str(), 65534, 65534), 0) << ErrnoText("chown");
  // Root may open it, and must still refuse to adopt it.
  const std::string msg =
      ErrorOf([&] { Segment::OpenExisting(name, milliseconds(10)); }, ErrorKind::kPermission);
  EXPECT_TRUE(Contains(msg, "owned by uid 65534")) << msg;
  EXPECT_TRUE(Contains(msg, Segment::PathOf(name))) << msg;
}

TEST_F(SegmentTest, AnotherUsersPrivateObjectIsAPermissionError) {
  // A user who cannot even open the object (EACCES): root makes a 0600
  // object under the name a second user's queue would have.
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as a second user";
  const std::string name = UniqueQueueName("other_user");
  const std::string object = "tailcut.65534." + name;
  const int fd = ::shm_open(("/" + object).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0) << ErrnoText("shm_open");
  ::close(fd);
  Children kids(1, 1);
  kids.Spawn([&](ChildContext& c) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) {
      c.Fail(ErrnoText("setuid"));
      return 77;
    }
    try {
      Segment::OpenExisting(name, milliseconds(10));
      return c.Fail("opened another user's 0600 object");
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kPermission)
        return c.Fail(std::string("not kPermission: ") + e.what());
      if (!Contains(e.what(), "belongs to another user"))
        return c.Fail(std::string("message: ") + e.what());
    }
    return 0;
  });
  const ChildResult r = kids.Wait(0, milliseconds(10000));
  ::shm_unlink(("/" + object).c_str());
  if (r.exited && r.exit_code == 77) GTEST_SKIP() << "cannot become uid 65534: " << r.error;
  EXPECT_TRUE(r.Ok()) << r.Describe();
}

// ============================================================ removal

TEST_F(SegmentTest, UnlinkIfSameRemovesTheObjectOnce) {
  const std::string name = NewName("unlink");
  auto seg = Segment::CreateExclusive(name, 4096);
  ASSERT_NE(seg, nullptr);
  EXPECT_TRUE(seg->UnlinkIfSame());
  EXPECT_FALSE(PathExists(seg->path()));
  EXPECT_FALSE(seg->UnlinkIfSame());
  // The mapping outlives the name.
  seg->header().total_size = 5;
  EXPECT_EQ(seg->header().total_size, 5u);
}

TEST_F(SegmentTest, UnlinkIfSameLeavesAReplacementAlone) {
  const std::string name = NewName("replaced");
  auto old_seg = Segment::CreateExclusive(name, 4096);
  ASSERT_NE(old_seg, nullptr);
  ASSERT_TRUE(old_seg->UnlinkIfSame());
  auto new_seg = Segment::CreateExclusive(name, 4096);
  ASSERT_NE(new_seg, nullptr);
  EXPECT_FALSE(old_seg->UnlinkIfSame());
  EXPECT_TRUE(PathExists(new_seg->path()));
  // An attacher's handle removes it like the creator's.
  auto attacher = Segment::OpenExisting(name, milliseconds(10));
  ASSERT_NE(attacher, nullptr);
  EXPECT_TRUE(attacher->UnlinkIfSame());
  EXPECT_FALSE(PathExists(new_seg->path()));
}

// ============================================================ magic

TEST_F(SegmentTest, WaitForMagicTimesOutOnAnUnpublishedSegment) {
  const std::string name = NewName("nomagic");
  auto seg = Segment::CreateExclusive(name, kMinSegmentSize);
  ASSERT_NE(seg, nullptr);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(seg->WaitForMagic(milliseconds(30)));
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(30));
}

TEST_F(SegmentTest, WaitForMagicSeesAMagicPublishedLater) {
  const std::string name = NewName("latemagic");
  auto seg = Segment::CreateExclusive(name, kMinSegmentSize);
  ASSERT_NE(seg, nullptr);
  auto attacher = Segment::OpenExisting(name, milliseconds(10));
  ASSERT_NE(attacher, nullptr);
  std::thread creator([&] {
    std::this_thread::sleep_for(milliseconds(30));
    seg->header().magic.store(kSegmentMagic, std::memory_order_release);
  });
  EXPECT_TRUE(attacher->WaitForMagic(milliseconds(5000)));
  creator.join();
}

TEST_F(SegmentTest, WaitForMagicReturnsAtOnceOnGarbageSoValidateCanNameIt) {
  const std::string name = NewName("garbage");
  auto seg = Segment::CreateExclusive(name, kMinSegmentSize);
  ASSERT_NE(seg, nullptr);
  seg->header().magic.store(0x0123456789abcdefull, std::memory_order_release);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(seg->WaitForMagic(milliseconds(5000)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1000));
}

// ============================================================ validation

TEST_F(ValidSegmentTest, AWellFormedSegmentValidatesWithItsGeometry) {
  auto seg = Attach();
  ASSERT_NE(seg, nullptr);
  EXPECT_TRUE(seg->WaitForMagic(milliseconds(10)));
  ASSERT_NO_THROW(seg->Validate());
  const Geometry& g = seg->geometry();
  EXPECT_EQ(g.total, geometry_.total);
  EXPECT_EQ(g.items, geometry_.items);
  EXPECT_EQ(g.bitmap, geometry_.bitmap);
  EXPECT_EQ(seg->item(1).begin, 60u);
  EXPECT_EQ(seg->file(1).size, 50u);
  EXPECT_EQ(std::string(seg->path_bytes() + seg->file(1).path_offset, seg->file(1).path_length),
            "/data/bb");
}

TEST_F(ValidSegmentTest, BadMagicIsNamed) {
  const std::string msg = CorruptMessage(
      [](Segment& s) { s.header().magic.store(0x4141414141414141ull, std::memory_order_release); });
  EXPECT_TRUE(Contains(msg, "bad magic number")) << msg;
}

TEST_F(ValidSegmentTest, AnotherLayoutVersionIsNamedWithBothVersions) {
  const std::string msg =
      CorruptMessage([](Segment& s) { s.header().layout_version = kLayoutVersion + 7; });
  EXPECT_TRUE(Contains(msg, "layout version " + std::to_string(kLayoutVersion + 7))) << msg;
  EXPECT_TRUE(Contains(msg, "reads " + std::to_string(kLayoutVersion))) << msg;
}

TEST_F(ValidSegmentTest, ASizeThatDisagreesWithTheHeaderIsNamed) {
  const std::string msg = CorruptMessage([](Segment& s) { s.header().total_size += 64; });
  EXPECT_TRUE(Contains(msg, "header says " + std::to_string(geometry_.total + 64) + " bytes"))
      << msg;
  EXPECT_TRUE(Contains(msg, "object has " + std::to_string(geometry_.total))) << msg;
}

TEST_F(ValidSegmentTest, CheckPreambleAloneCatchesTheVersion) {
  seg_->header().layout_version = 1;
  auto seg = Attach();
  ASSERT_NE(seg, nullptr);
  const std::string msg = ErrorOf([&] { seg->CheckPreamble(); }, ErrorKind::kCorrupt);
  EXPECT_TRUE(Contains(msg, "layout version 1")) << msg;
}

TEST_F(ValidSegmentTest, InconsistentCountsAreNamed) {
  const std::string msg = CorruptMessage([](Segment& s) { s.header().total_tickets = 7; });
  EXPECT_TRUE(Contains(msg, "inconsistent counts (items 3, epochs 2, tickets 7)")) << msg;
  const std::string zero = CorruptMessage([](Segment& s) {
    s.header().total_tickets = 6;
    s.header().num_epochs = 0;
  });
  EXPECT_TRUE(Contains(zero, "inconsistent counts")) << zero;
}

TEST_F(ValidSegmentTest, CountsOutOfRangeAreNamed) {
  const std::string msg =
      CorruptMessage([](Segment& s) { s.header().max_clients = kMaxClients + 1; });
  EXPECT_TRUE(Contains(msg, "counts out of range")) << msg;
}

TEST_F(ValidSegmentTest, CountsThatNeedAnotherSizeAreNamed) {
  // Consistent, in range, but a layout of a different size than the object.
  const std::string msg = CorruptMessage([](Segment& s) { s.header().path_bytes = 4096; });
  EXPECT_TRUE(Contains(msg, "counts need")) << msg;
  EXPECT_TRUE(Contains(msg, "object has " + std::to_string(geometry_.total))) << msg;
}

TEST_F(ValidSegmentTest, AnUnterminatedFormatTagIsNamed) {
  const std::string msg = CorruptMessage(
      [](Segment& s) { std::memset(s.header().format, 'x', sizeof(s.header().format)); });
  EXPECT_TRUE(Contains(msg, "format tag not terminated")) << msg;
}

TEST_F(ValidSegmentTest, ADamagedAdminLockIsNamed) {
  const std::string msg = CorruptMessage(
      [](Segment& s) { std::memset(&s.header().admin_mutex, 0xff, sizeof(pthread_mutex_t)); });
  EXPECT_TRUE(Contains(msg, "admin or sweep lock is damaged")) << msg;
}

TEST_F(ValidSegmentTest, ADamagedClientLockIsNamedBySlot) {
  const std::string msg = CorruptMessage(
      [](Segment& s) { std::memset(&s.client(3).life, 0, sizeof(pthread_mutex_t)); });
  EXPECT_TRUE(Contains(msg, "client slot 3")) << msg;
}

TEST_F(ValidSegmentTest, AFileEntryOutsideThePathTableIsNamed) {
  const std::string msg = CorruptMessage([](Segment& s) { s.file(1).path_length = 10; });
  EXPECT_TRUE(Contains(msg, "file entry 1 points outside the path table")) << msg;
  const std::string wrapped = CorruptMessage([](Segment& s) {
    s.file(1).path_length = 8;
    s.file(0).path_offset = UINT64_MAX;
  });
  EXPECT_TRUE(Contains(wrapped, "file entry 0")) << wrapped;
}

TEST_F(ValidSegmentTest, AnItemOutOfRangeIsNamed) {
  struct Case {
    const char* what;
    ItemEntry entry;
  };
  for (const Case& c : {Case{"file index", {2, 0, 10}}, Case{"past the file's end", {1, 0, 51}},
                        Case{"begin after end", {1, 20, 10}}}) {
    const std::string msg = CorruptMessage([&](Segment& s) { s.item(2) = c.entry; });
    EXPECT_TRUE(Contains(msg, "item 2 is out of range")) << c.what << ": " << msg;
  }
}

// ============================================================ the attach state machine

// Runs `f`, which must throw tailcut::Error of `kind` naming the segment of
// `name` and what to do; returns its message.
std::string AttachErrorOf(const std::string& name, const std::function<void()>& f, ErrorKind kind) {
  const std::string msg = ErrorOf(f, kind);
  EXPECT_TRUE(Contains(msg, Segment::PathOf(name))) << msg;
  return msg;
}

constexpr AttachMode kBothModes[] = {AttachMode::kJoin, AttachMode::kInspect};

const char* ModeName(AttachMode mode) { return mode == AttachMode::kJoin ? "join" : "inspect"; }

// Another thread holds the admin mutex from construction until Release.
class AdminHolder {
 public:
  explicit AdminHolder(pthread_mutex_t* mu) {
    thread_ = std::thread([this, mu] {
      bool died = false;
      if (LockRobustFor(mu, milliseconds(5000), &died) != 0) return;
      std::unique_lock<std::mutex> lock(m_);
      locked_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return release_; });
      pthread_mutex_unlock(mu);
    });
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait_for(lock, milliseconds(5000), [&] { return locked_; });
  }
  ~AdminHolder() {
    {
      std::lock_guard<std::mutex> lock(m_);
      release_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  bool locked() {
    std::lock_guard<std::mutex> lock(m_);
    return locked_;
  }

 private:
  std::thread thread_;
  std::mutex m_;
  std::condition_variable cv_;
  bool locked_ = false, release_ = false;
};

// From a thread of its own: is the mutex free?
bool MutexIsFree(pthread_mutex_t* mu) {
  int rc = -1;
  std::thread([&] {
    rc = TryLockRobust(mu);
    if (rc == 0) pthread_mutex_unlock(mu);
  }).join();
  return rc == 0;
}

TEST_F(SegmentTest, AttachToAMissingQueueIsNotFound) {
  const std::string name = NewName("attach_missing");
  for (AttachMode mode : kBothModes) {
    SCOPED_TRACE(ModeName(mode));
    Attachment a = AttachSegment(name, mode, milliseconds(10));
    EXPECT_EQ(a.state, AttachState::kNotFound);
    EXPECT_EQ(a.segment, nullptr);
    ASSERT_TRUE(a.problem.has_value());
    EXPECT_EQ(a.problem->kind(), ErrorKind::kNotFound);
    EXPECT_TRUE(Contains(a.problem->what(), "'" + name + "' does not exist")) << a.problem->what();
    EXPECT_TRUE(Contains(a.problem->what(), Segment::PathOf(name))) << a.problem->what();
  }
}

TEST_F(SegmentTest, AnEmptyObjectIsUnsizedAndLeftInPlace) {
  const std::string name = NewName("attach_unsized");
  MakeRawObject(name, 0600, 0);
  Attachment a = AttachSegment(name, AttachMode::kJoin, milliseconds(20));
  EXPECT_EQ(a.state, AttachState::kUnsized);
  ASSERT_NE(a.segment, nullptr);
  ASSERT_TRUE(a.problem.has_value());
  EXPECT_EQ(a.problem->kind(), ErrorKind::kTimeout);
  EXPECT_TRUE(Contains(a.problem->what(),
                       "is 0 bytes, too small for a queue, and did not grow "
                       "for 20 ms (its creator probably died)"))
      << a.problem->what();
  EXPECT_TRUE(PathExists(Segment::PathOf(name))) << "the machine removes nothing";
  // Removing it is the caller's choice, made through the handle it returns.
  EXPECT_TRUE(a.segment->UnlinkIfSame());
  EXPECT_FALSE(PathExists(Segment::PathOf(name)));
}

TEST_F(SegmentTest, AToolSeesAnEmptyObjectAsUnsizedAtOnce) {
  const std::string name = NewName("attach_unsized_tool");
  MakeRawObject(name, 0600, 0);
  const auto start = std::chrono::steady_clock::now();
  Attachment a = AttachSegment(name, AttachMode::kInspect, milliseconds(0));
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1000));
  EXPECT_EQ(a.state, AttachState::kUnsized);
  ASSERT_TRUE(a.problem.has_value());
  EXPECT_TRUE(Contains(a.problem->what(), "did not grow for 0 ms")) << a.problem->what();
}

TEST_F(SegmentTest, ASizedObjectWithoutMagicIsUnpublished) {
  const std::string name = NewName("attach_unpublished");
  auto creator = Segment::CreateExclusive(name, kMinSegmentSize);
  ASSERT_NE(creator, nullptr);
  for (AttachMode mode : kBothModes) {
    SCOPED_TRACE(ModeName(mode));
    Attachment a = AttachSegment(name, mode, milliseconds(mode == AttachMode::kJoin ? 20 : 0));
    EXPECT_EQ(a.state, AttachState::kUnpublished);
    ASSERT_NE(a.segment, nullptr);
    EXPECT_EQ(a.segment->size(), kMinSegmentSize);
    EXPECT_EQ(a.admin, nullptr);
    ASSERT_TRUE(a.problem.has_value());
    EXPECT_EQ(a.problem->kind(), ErrorKind::kCorrupt);
    EXPECT_TRUE(Contains(a.problem->what(), "bad magic number")) << a.problem->what();
    EXPECT_TRUE(Contains(a.problem->what(), "tailcut rm --force " + name)) << a.problem->what();
  }
  EXPECT_TRUE(PathExists(Segment::PathOf(name)));
}

TEST_F(SegmentTest, AttachRefusesAnotherUsersObjectAndATinyOneByThrowing) {
  const std::string writable = NewName("attach_mode");
  MakeRawObject(writable, 0666, static_cast<off_t>(kMinSegmentSize));
  const std::string tiny = NewName("attach_tiny");
  MakeRawObject(tiny, 0600, 10);
  for (AttachMode mode : kBothModes) {
    SCOPED_TRACE(ModeName(mode));
    AttachErrorOf(
        writable, [&] { AttachSegment(writable, mode, milliseconds(10)); }, ErrorKind::kPermission);
    const std::string msg = AttachErrorOf(
        tiny, [&] { AttachSegment(tiny, mode, milliseconds(10)); }, ErrorKind::kCorrupt);
    EXPECT_TRUE(Contains(msg, "is 10 bytes")) << msg;
  }
}

TEST_F(ValidSegmentTest, AReadySegmentIsAttachedAndAJoinerHoldsItsAdminLock) {
  seg_->header().state.store(kReady, std::memory_order_release);
  {
    Attachment a = AttachSegment(name_, AttachMode::kJoin, milliseconds(100));
    ASSERT_EQ(a.state, AttachState::kAttached);
    EXPECT_FALSE(a.problem.has_value());
    ASSERT_NE(a.segment, nullptr);
    EXPECT_EQ(a.segment->geometry().total, geometry_.total);
    EXPECT_EQ(a.segment->item(1).begin, 60u);
    ASSERT_NE(a.admin, nullptr);
    EXPECT_FALSE(MutexIsFree(&seg_->header().admin_mutex));
  }
  EXPECT_TRUE(MutexIsFree(&seg_->header().admin_mutex)) << "released with the attachment";
  Attachment tool = AttachSegment(name_, AttachMode::kInspect, milliseconds(0));
  ASSERT_EQ(tool.state, AttachState::kAttached);
  EXPECT_EQ(tool.admin, nullptr);
  EXPECT_TRUE(MutexIsFree(&seg_->header().admin_mutex)) << "a tool never locks";
}

TEST_F(ValidSegmentTest, ACreatingSegmentIsCreatingInBothModes) {
  seg_->header().state.store(kCreating, std::memory_order_release);
  for (AttachMode mode : kBothModes) {
    SCOPED_TRACE(ModeName(mode));
    Attachment a = AttachSegment(name_, mode, milliseconds(100));
    EXPECT_EQ(a.state, AttachState::kCreating);
    EXPECT_EQ(a.admin != nullptr, mode == AttachMode::kJoin);
    ASSERT_TRUE(a.problem.has_value());
    EXPECT_EQ(a.problem->kind(), ErrorKind::kCorrupt);
    EXPECT_TRUE(Contains(a.problem->what(),
                         "is not ready (being created, removed, or its creator died); retry, or "
                         "remove it with `tailcut rm --force " +
                             name_ + "`"))
        << a.problem->what();
  }
}

TEST_F(ValidSegmentTest, ARemovedSegmentIsRemovedInBothModes) {
  seg_->header().state.store(kRemoved, std::memory_order_release);
  for (AttachMode mode : kBothModes) {
    SCOPED_TRACE(ModeName(mode));
    Attachment a = AttachSegment(name_, mode, milliseconds(100));
    EXPECT_EQ(a.state, AttachState::kRemoved);
    ASSERT_NE(a.segment, nullptr);
    EXPECT_TRUE(a.problem.has_value());
  }
  EXPECT_TRUE(PathExists(seg_->path())) << "the machine removes nothing";
}

TEST_F(ValidSegmentTest, AnUnknownStateIsCorrupt) {
  seg_->header().state.store(7, std::memory_order_release);
  const std::string join = AttachErrorOf(
      name_, [&] { AttachSegment(name_, AttachMode::kJoin, milliseconds(100)); },
      ErrorKind::kCorrupt);
  EXPECT_TRUE(Contains(join, "is in an unknown state; remove it with `tailcut rm --force " + name_))
      << join;
  const std::string tool = AttachErrorOf(
      name_, [&] { AttachSegment(name_, AttachMode::kInspect, milliseconds(0)); },
      ErrorKind::kCorrupt);
  EXPECT_TRUE(Contains(tool, "is not ready")) << tool;
  EXPECT_TRUE(MutexIsFree(&seg_->header().admin_mutex)) << "the lock is released on the throw";
}

TEST_F(ValidSegmentTest, AnyStateButReadyLeftByADeadLockHolderIsCreating) {
  // The holder of the admin lock died: whatever it was writing is half-done.
  seg_->header().state.store(7, std::memory_order_release);
  Children kids(1, 1);
  kids.Spawn([&](ChildContext& c) {
    bool died = false;
    if (LockRobustFor(&seg_->header().admin_mutex, milliseconds(5000), &died) != 0)
      return c.Fail("could not lock the admin mutex");
    return 0;  // exits holding it
  });
  ASSERT_TRUE(kids.Wait(0, milliseconds(10000)).Ok());
  Attachment a = AttachSegment(name_, AttachMode::kJoin, milliseconds(1000));
  EXPECT_EQ(a.state, AttachState::kCreating);
  EXPECT_NE(a.admin, nullptr);
}

TEST_F(ValidSegmentTest, AnAdminLockHeldPastTheWaitIsATimeoutNamingTheHolder) {
  seg_->header().state.store(kReady, std::memory_order_release);
  seg_->header().creator_pid = 4242;
  AdminHolder holder(&seg_->header().admin_mutex);
  ASSERT_TRUE(holder.locked());
  const auto start = std::chrono::steady_clock::now();
  const std::string msg = ErrorOf(
      [&] { AttachSegment(name_, AttachMode::kJoin, milliseconds(30)); }, ErrorKind::kTimeout);
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(30));
  EXPECT_TRUE(Contains(msg, "queue '" + name_ +
                                "': process 4242 has been creating or changing it "
                                "for more than 30 ms; is it stopped? "
                                "(attach_timeout)"))
      << msg;
  // A tool does not wait for the lock.
  EXPECT_EQ(AttachSegment(name_, AttachMode::kInspect, milliseconds(0)).state,
            AttachState::kAttached);
}

TEST_F(ValidSegmentTest, ABadPreambleOrTableThrowsInBothModes) {
  seg_->header().state.store(kReady, std::memory_order_release);
  seg_->header().layout_version = kLayoutVersion + 1;
  for (AttachMode mode : kBothModes) {
    SCOPED_TRACE(ModeName(mode));
    const std::string msg = AttachErrorOf(
        name_, [&] { AttachSegment(name_, mode, milliseconds(100)); }, ErrorKind::kCorrupt);
    EXPECT_TRUE(Contains(msg, "layout version " + std::to_string(kLayoutVersion + 1))) << msg;
  }
  seg_->header().layout_version = kLayoutVersion;
  seg_->item(2) = {1, 0, 51};
  for (AttachMode mode : kBothModes) {
    SCOPED_TRACE(ModeName(mode));
    const std::string msg = AttachErrorOf(
        name_, [&] { AttachSegment(name_, mode, milliseconds(100)); }, ErrorKind::kCorrupt);
    EXPECT_TRUE(Contains(msg, "item 2 is out of range")) << msg;
  }
  EXPECT_TRUE(MutexIsFree(&seg_->header().admin_mutex));
}

}  // namespace
}  // namespace tailcut::detail
