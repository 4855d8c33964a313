// Tests of engine/shm_object.h: the one module through which every
// shared-memory object is created, opened, reserved, mapped and removed.
// Each way a system call of it can fail is made to happen, for real where a
// test can (a name /dev/shm refuses, another user's object, a mapping larger
// than the address space, a full descriptor table) and through the module's
// seam (InjectShmFailure) where it cannot (a full /dev/shm, fchmod, fstat);
// each must be a tailcut::Error of the kind ErrorKindOfErrno gives, whose
// message names the object and the fix, and must leave nothing in /dev/shm.
#include "engine/shm_object.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/fork_child.h"

namespace tailcut::detail {
namespace {

using std::chrono::milliseconds;

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

class ShmObjectTest : public ::testing::Test {
 protected:
  // A name no other test or run uses, as a queue's would be.
  ShmName NewName(const std::string& tag) {
    static int counter = 0;
    const std::string queue = "shm_object_test." + std::to_string(::getpid()) + "." + tag + "." +
                              std::to_string(counter++);
    ShmName n{"tailcut." + std::to_string(::geteuid()) + "." + queue, "queue '" + queue + "'",
              "queue", "Remove it with `tailcut rm --force " + queue + "`"};
    objects_.push_back(n.object);
    return n;
  }
  void TearDown() override {
    for (int c = 0; c <= static_cast<int>(ShmCall::kUnlink); ++c)
      InjectShmFailure(static_cast<ShmCall>(c), 0);
    for (const std::string& o : objects_) {
      EXPECT_FALSE(Exists(ShmPath(o)) && ShouldBeGone(o)) << ShmPath(o) << " was left behind";
      ::shm_unlink(o.c_str());
    }
  }
  // Objects a test expects to be gone once it ends.
  bool ShouldBeGone(const std::string& object) const {
    for (const std::string& k : kept_)
      if (k == object) return false;
    return true;
  }
  void Keep(const ShmName& n) { kept_.push_back(n.object); }

  // Runs `f`, which must throw tailcut::Error of `kind` naming `name`'s path
  // and `fix`; returns its message.
  std::string FailureOf(const std::function<void()>& f, ErrorKind kind, const ShmName& name,
                        const std::string& fix) {
    try {
      f();
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(e.kind(), kind) << ErrorKindName(e.kind()) << ": " << msg;
      EXPECT_TRUE(Contains(msg, name.owner + ": ") || Contains(msg, name.owner + " "))
          << "does not name the owner: " << msg;
      EXPECT_TRUE(Contains(msg, ShmPath(name.object))) << "does not name the object: " << msg;
      EXPECT_TRUE(Contains(msg, fix)) << "does not say the fix: " << msg;
      return msg;
    }
    ADD_FAILURE() << "no error";
    return "";
  }

  std::vector<std::string> objects_, kept_;
};

// ============================================================ what works

TEST_F(ShmObjectTest, CreateExclusiveMakesAPrivateObjectAndRefusesAnExistingName) {
  const ShmName n = NewName("create");
  const mode_t old = ::umask(0077 | 0700);  // a umask that would shut out even the owner
  auto shm = ShmObject::CreateExclusive(n);
  ::umask(old);
  ASSERT_NE(shm, nullptr);
  Keep(n);
  struct stat st;
  ASSERT_EQ(::stat(shm->path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(shm->path(), "/dev/shm/" + n.object);
  EXPECT_EQ(ShmObject::CreateExclusive(n), nullptr);
  shm->Reserve(8192, "unused");
  EXPECT_EQ(shm->Size(), 8192u);
  shm->Map(8192);
  ASSERT_NE(shm->base(), nullptr);
  shm->base()[8191] = 7;
  auto other = ShmObject::Open(n);
  other->CheckOwned(0077);
  other->Map(8192);
  EXPECT_EQ(other->base()[8191], 7);
  EXPECT_TRUE(ShmObject::Unlink(n));
  EXPECT_FALSE(ShmObject::Unlink(n));
}

TEST_F(ShmObjectTest, UnlinkIfSameLeavesANameThatNowRefersToAnotherObject) {
  const ShmName n = NewName("same");
  auto first = ShmObject::CreateExclusive(n);
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(ShmObject::Unlink(n));
  auto second = ShmObject::CreateExclusive(n);
  ASSERT_NE(second, nullptr);
  EXPECT_FALSE(first->UnlinkIfSame());
  EXPECT_TRUE(Exists(second->path()));
  EXPECT_TRUE(second->UnlinkIfSame());
  EXPECT_FALSE(Exists(second->path()));
}

TEST_F(ShmObjectTest, WaitForSizeReturnsTheSizeLastSeenWhenItDidNotGrow) {
  const ShmName n = NewName("wait");
  auto shm = ShmObject::CreateExclusive(n);
  ASSERT_NE(shm, nullptr);
  EXPECT_EQ(shm->WaitForSize(4096, milliseconds(20)), 0u);
  shm->Reserve(4096, "unused");
  EXPECT_EQ(shm->WaitForSize(4096, milliseconds(0)), 4096u);
  shm->UnlinkIfSame();
}

// ============================================================ real failures

TEST_F(ShmObjectTest, ANameDevShmRefusesIsInvalidArgumentNamingAShorterName) {
  ShmName n = NewName("long");
  n.object += std::string(300, 'x');
  FailureOf([&] { ShmObject::CreateExclusive(n); }, ErrorKind::kInvalidArgument, n,
            "pick a shorter queue name");
  const ShmName slash = NewName("a/b");
  FailureOf([&] { ShmObject::Open(slash); }, ErrorKind::kInvalidArgument, slash,
            "pick a shorter queue name");
}

TEST_F(ShmObjectTest, OpeningAMissingObjectIsNotFoundNamingIt) {
  const ShmName n = NewName("missing");
  const std::string msg =
      FailureOf([&] { ShmObject::Open(n); }, ErrorKind::kNotFound, n, "does not exist");
  EXPECT_EQ(msg, n.owner + " does not exist (no " + ShmPath(n.object) + ")");
}

TEST_F(ShmObjectTest, AnotherUsersObjectCanNeitherBeOpenedNorRemoved) {
  // Real EACCES and EPERM: root makes a 0600 object, uid 65534 tries it.
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as a second user";
  const ShmName n = NewName("foreign");
  Keep(n);
  ASSERT_NE(ShmObject::CreateExclusive(n), nullptr);
  const std::string report = testing::InChild([&]() -> std::string {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) return "skip: cannot become uid 65534";
    const std::string fix =
        "it belongs to another user: remove it (as its owner or root) or "
        "pick another queue name";
    FailureOf([&] { ShmObject::Open(n); }, ErrorKind::kPermission, n, fix);
    FailureOf([&] { ShmObject::Unlink(n); }, ErrorKind::kPermission, n, fix);
    return ::testing::Test::HasFailure() ? "see the child's output" : "";
  });
  if (report.rfind("skip:", 0) == 0) GTEST_SKIP() << report;
  EXPECT_EQ(report, "");
  EXPECT_TRUE(Exists(ShmPath(n.object))) << "another user removed it";
}

TEST_F(ShmObjectTest, CheckOwnedRefusesAnotherUsersObjectAndOneOthersMayUse) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give an object away";
  const ShmName n = NewName("owned");
  Keep(n);
  auto shm = ShmObject::CreateExclusive(n);
  ASSERT_NE(shm, nullptr);
  ASSERT_EQ(::chmod(shm->path().c_str(), 0640), 0);
  auto opened = ShmObject::Open(n);
  opened->CheckOwned(0022);  // group-readable is fine for a queue
  std::string msg = FailureOf([&] { opened->CheckOwned(0077); }, ErrorKind::kPermission, n,
                              "tailcut makes 0600 segments. " + n.removal);
  EXPECT_TRUE(Contains(msg, "has mode 0640, readable by other users")) << msg;
  ASSERT_EQ(::chmod(shm->path().c_str(), 0666), 0);
  msg = FailureOf([&] { opened->CheckOwned(0022); }, ErrorKind::kPermission, n, n.removal);
  EXPECT_TRUE(Contains(msg, "has mode 0666, writable by other users")) << msg;
  ASSERT_EQ(::chown(shm->path().c_str(), 65534, 65534), 0);
  msg = FailureOf([&] { opened->CheckOwned(0022); }, ErrorKind::kPermission, n,
                  "remove it (as its owner or root) or pick another queue name");
  EXPECT_TRUE(Contains(msg, "is owned by uid 65534, not by you (uid 0)")) << msg;
}

TEST_F(ShmObjectTest, AMappingLargerThanTheAddressSpaceIsNoSpaceNamingTheLimit) {
  const ShmName n = NewName("map");
  auto shm = ShmObject::CreateExclusive(n);
  ASSERT_NE(shm, nullptr);
  const std::string msg =
      FailureOf([&] { shm->Map(uint64_t{1} << 60); }, ErrorKind::kNoSpace, n, "ulimit -v");
  EXPECT_TRUE(
      Contains(msg, "cannot map 1 EiB of segment " + shm->path() + ": Cannot allocate memory"))
      << msg;
  EXPECT_EQ(shm->base(), nullptr);
  shm->UnlinkIfSame();
}

TEST_F(ShmObjectTest, AFullDescriptorTableIsNamedWithTheLimitToRaise) {
  const ShmName n = NewName("emfile");
  const std::string report = testing::InChild([&]() -> std::string {
    // Real EMFILE: no descriptor above the ones already open.
    int highest = ::open("/dev/null", O_RDONLY);
    rlimit lim{static_cast<rlim_t>(highest), static_cast<rlim_t>(highest)};
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) return "setrlimit failed";
    FailureOf([&] { ShmObject::CreateExclusive(n); }, ErrorKind::kIo, n, "ulimit -n");
    return ::testing::Test::HasFailure() ? "see the child's output" : "";
  });
  EXPECT_EQ(report, "");
}

// ============================================================ injected failures

TEST_F(ShmObjectTest, AFullDevShmIsNoSpaceSayingWhatIsFreeAndLeavesNothing) {
  const ShmName n = NewName("nospace");
  auto shm = ShmObject::CreateExclusive(n);
  ASSERT_NE(shm, nullptr);
  InjectShmFailure(ShmCall::kReserve, ENOSPC);
  const std::string msg = FailureOf([&] { shm->Reserve(4 << 20, "use fewer items"); },
                                    ErrorKind::kNoSpace, n, "use fewer items");
  EXPECT_TRUE(Contains(msg, "cannot reserve 4 MiB for segment " + shm->path() +
                                ": No space left on device (/dev/shm has "))
      << msg;
  EXPECT_TRUE(Contains(msg, " free); use fewer items")) << msg;
  EXPECT_FALSE(Exists(shm->path()));
}

TEST_F(ShmObjectTest, ACreateThatFailsAfterMakingTheNameRemovesIt) {
  const ShmName chmod_fails = NewName("chmod");
  InjectShmFailure(ShmCall::kChmod, EPERM);
  FailureOf([&] { ShmObject::CreateExclusive(chmod_fails); }, ErrorKind::kPermission, chmod_fails,
            "mode 1777");
  const ShmName stat_fails = NewName("stat");
  InjectShmFailure(ShmCall::kStat, EIO);
  FailureOf([&] { ShmObject::CreateExclusive(stat_fails); }, ErrorKind::kIo, stat_fails,
            "check that /dev/shm is a tmpfs you may write to");
}

TEST_F(ShmObjectTest, EachCallsErrnoBecomesItsKindAndItsFix) {
  const ShmName n = NewName("errno");
  auto shm = ShmObject::CreateExclusive(n);
  ASSERT_NE(shm, nullptr);
  Keep(n);
  InjectShmFailure(ShmCall::kOpen, ENFILE);
  FailureOf([&] { ShmObject::Open(n); }, ErrorKind::kIo, n, "ulimit -n");
  InjectShmFailure(ShmCall::kOpen, ENAMETOOLONG);
  FailureOf([&] { ShmObject::Open(n); }, ErrorKind::kInvalidArgument, n, "pick a shorter");
  const ShmName denied = NewName("eacces");
  InjectShmFailure(ShmCall::kOpen, EACCES);
  FailureOf([&] { ShmObject::CreateExclusive(denied); }, ErrorKind::kPermission, denied,
            "mode 1777");
  InjectShmFailure(ShmCall::kStat, EIO);
  std::string msg = FailureOf([&] { shm->Size(); }, ErrorKind::kIo, n, "tmpfs");
  EXPECT_TRUE(Contains(msg, "cannot stat segment " + shm->path() + ": Input/output error")) << msg;
  InjectShmFailure(ShmCall::kStat, EIO);
  FailureOf([&] { shm->CheckOwned(0077); }, ErrorKind::kIo, n, "tmpfs");
  InjectShmFailure(ShmCall::kMap, ENODEV);
  msg = FailureOf([&] { shm->Map(4096); }, ErrorKind::kIo, n, "tmpfs");
  EXPECT_TRUE(Contains(msg, "cannot map 4 KiB of segment")) << msg;
  InjectShmFailure(ShmCall::kUnlink, EBUSY);
  FailureOf([&] { ShmObject::Unlink(n); }, ErrorKind::kIo, n, "tmpfs");
  InjectShmFailure(ShmCall::kUnlink, EBUSY);
  EXPECT_FALSE(shm->UnlinkIfSame());
  EXPECT_TRUE(Exists(shm->path()));
  // Consumed: the calls work again.
  EXPECT_EQ(shm->Size(), 0u);
  EXPECT_TRUE(shm->UnlinkIfSame());
}

}  // namespace
}  // namespace tailcut::detail
