// Every public argument of tailcut/work_queue.h that has a range, and what
// happens outside it: one test per row of the argument table in
// docs/reliability.md. Also the error kinds and messages of the control path
// (errno mapping, unprintable bytes, sizes).
#include <sys/stat.h>

#include <cerrno>

#include "engine/segment.h"
#include "tests/engine/queue_test_util.h"

namespace tailcut::test {
namespace {

using std::chrono::milliseconds;

class ArgumentTest : public QueueTest {
 protected:
  WorkQueueOptions Options(std::string_view tag, std::vector<std::string> works) {
    return BaseOptions(NewName(tag), std::move(works));
  }
};

// ------------------------------------------------------------ Progress

// An offset past the end once made a checkpoint skip the rest of the item:
// the restored queue never handed it out again.
TEST_F(ArgumentTest, ProgressPastTheEndIsRefusedAndTheItemIsNotLost) {
  auto o = Options("progress", dir_.Files("f", 2, {1000}));
  o.keep_unfinished = true;  // closed unfinished, then removed by hand: kept until then
  o.shuffle = false;
  auto q = WorkQueue::Open(o);
  WorkItem it;
  ASSERT_EQ(q->TryTake(&it), TakeStatus::kOk);
  for (uint64_t bad :
       {it.end + 1, it.end + 500, uint64_t{1} << 48, uint64_t{1000000000000000}, ~uint64_t{0}})
    EXPECT_EQ(q->Progress(it, bad), ItemStatus::kOutOfRange) << "offset " << bad;
  EXPECT_EQ(q->Progress(it, it.begin), ItemStatus::kOk);
  EXPECT_EQ(q->Progress(it, 300), ItemStatus::kOk);
  EXPECT_EQ(q->Progress(it, 200), ItemStatus::kOk) << "true, and says less: changes nothing";
  EXPECT_EQ(q->Progress(it, it.end + 500), ItemStatus::kOutOfRange);
  // A forged copy of the item with a wider range changes nothing: the
  // lease's own range decides.
  WorkItem forged = it;
  forged.end = ~uint64_t{0};
  EXPECT_EQ(q->Progress(forged, it.end + 1), ItemStatus::kOutOfRange);
  const std::string state = q->SaveState();
  EXPECT_EQ(q->Progress(it, it.end), ItemStatus::kOk) << "the end itself: consumed to the end";
  ASSERT_EQ(q->GiveBack(it), ItemStatus::kOk);
  q->Close();
  q.reset();
  RemoveQueue(o.name, true);

  // Restored: the item resumes at 300, the highest offset that was accepted.
  auto r = BaseOptions(NewName("progress-restored"), o.works);
  r.shuffle = false;
  r.restore_state = state;
  auto q2 = WorkQueue::Open(r);
  std::vector<WorkItem> got = Drain(*q2);
  ASSERT_EQ(got.size(), 2u);
  bool resumed = false;
  for (const WorkItem& g : got)
    if (g.index == it.index) resumed = g.begin == 300 && g.end == it.end;
  EXPECT_TRUE(resumed) << "the item with progress 300 must come back as [300, 1000)";
}

TEST_F(ArgumentTest, ProgressBeforeTheBeginIsRefused) {
  auto o = Options("progress-begin", dir_.Files("f", 1, {1000}));
  o.num_slices = 2;
  o.shuffle = false;
  auto q = WorkQueue::Open(o);
  WorkItem a, b;
  ASSERT_EQ(q->TryTake(&a), TakeStatus::kOk);
  ASSERT_EQ(q->TryTake(&b), TakeStatus::kOk);
  ASSERT_EQ(b.begin, 500u);
  EXPECT_EQ(q->Progress(b, 499), ItemStatus::kOutOfRange);
  EXPECT_EQ(q->Progress(b, 0), ItemStatus::kOutOfRange);
  EXPECT_EQ(q->Progress(b, 500), ItemStatus::kOk);
}

// A piece split off another item has its own range; the item it was split
// off keeps its range as handed out (a record that starts before the lower
// end may end past it).
TEST_F(ArgumentTest, ProgressOfASplitItemAndOfItsPieceKeepTheirRanges) {
  auto o = Options("progress-split", dir_.Files("f", 1, {8 << 20}));
  o.min_split_bytes = 4096;
  auto owner = WorkQueue::Open(o);
  auto thief = WorkQueue::Open(o);
  WorkItem it, piece;
  ASSERT_EQ(owner->TryTake(&it), TakeStatus::kOk);
  uint64_t end = 0;
  ASSERT_EQ(owner->Claim(it, it.begin + 4096, &end), ItemStatus::kOk);
  ASSERT_EQ(thief->TryTake(&piece), TakeStatus::kOk);
  ASSERT_TRUE(piece.piece);
  EXPECT_EQ(owner->Progress(it, it.end), ItemStatus::kOk);
  EXPECT_EQ(thief->Progress(piece, piece.begin - 1), ItemStatus::kOutOfRange);
  EXPECT_EQ(thief->Progress(piece, piece.end + 1), ItemStatus::kOutOfRange);
  EXPECT_EQ(thief->Progress(piece, piece.end), ItemStatus::kOk);
}

// ------------------------------------------------------------ Claim, AgreeStep

// Claim takes any up_to: below the begin it claims nothing, past the end it
// claims to the end. Neither loses a byte: what is claimed is the owner's.
TEST_F(ArgumentTest, ClaimAcceptsAnyUpToAndClampsIt) {
  auto o = Options("claim", dir_.Files("f", 1, {8 << 20}));
  o.min_split_bytes = 4096;
  auto q = WorkQueue::Open(o);
  WorkItem it;
  ASSERT_EQ(q->TryTake(&it), TakeStatus::kOk);
  uint64_t end = 0;
  EXPECT_EQ(q->Claim(it, 0, &end), ItemStatus::kOk);
  EXPECT_EQ(end, it.end);
  EXPECT_EQ(q->Claim(it, ~uint64_t{0}, &end), ItemStatus::kOk);
  EXPECT_EQ(end, it.end);
  // Everything is claimed: nothing is left to split off.
  auto other = WorkQueue::Open(o);
  WorkItem none;
  EXPECT_EQ(other->TryTake(&none), TakeStatus::kTimeout);
  EXPECT_EQ(q->Ack(it), ItemStatus::kOk);
}

TEST_F(ArgumentTest, AgreeStepRefusesRanksOutOfRangeAndStepsThatGoBack) {
  auto o = Options("steps", dir_.Files("f", 1, {100}));
  o.max_clients = 4;
  auto q = WorkQueue::Open(o);
  const auto soon = std::chrono::steady_clock::now() + milliseconds(50);
  EXPECT_EQ(q->AgreeStep(0, 0, 0, true, soon), StepStatus::kInvalid) << "ranks 0";
  EXPECT_EQ(q->AgreeStep(2, 2, 0, true, soon), StepStatus::kInvalid) << "rank == ranks";
  EXPECT_EQ(q->AgreeStep(0, 5, 0, true, soon), StepStatus::kInvalid) << "ranks > max_clients";
  EXPECT_EQ(q->AgreeStep(0, 1, uint64_t{1} << 62, true, soon), StepStatus::kInvalid) << "step 2^62";
  EXPECT_EQ(q->AgreeStep(0, 1, 5, true, soon), StepStatus::kAllHaveBatch);
  EXPECT_EQ(q->AgreeStep(0, 1, 4, true, soon), StepStatus::kInvalid) << "a step that went back";
}

// ------------------------------------------------------------ options

struct OptionCase {
  const char* what;
  std::function<void(WorkQueueOptions&)> set;
  std::vector<std::string> needles;
};

TEST_F(ArgumentTest, OptionsOutOfRangeAreInvalidArgumentsNamingTheOption) {
  const auto works = dir_.Files("f", 3, {1000});
  const std::vector<OptionCase> cases = {
      {"num_epochs 0", [](auto& o) { o.num_epochs = 0; }, {"num_epochs is 0"}},
      {"num_epochs x items past 2^32 tickets",
       [](auto& o) { o.num_epochs = uint64_t{1} << 62; },
       {"3 items x 4611686018427387904 epochs exceeds 4294967296 tickets"}},
      {"num_epochs 2^64-1", [](auto& o) { o.num_epochs = ~uint64_t{0}; }, {"epochs exceeds"}},
      {"num_slices 0", [](auto& o) { o.num_slices = 0; }, {"num_slices is 0"}},
      {"num_slices x num_epochs past 2^32",
       [](auto& o) {
         o.num_slices = 3000;
         o.num_epochs = uint64_t{1} << 40;
       },
       {"epochs exceeds"}},
      {"num_clients 0", [](auto& o) { o.num_clients = 0; }, {"num_clients is 0"}},
      {"max_clients 0", [](auto& o) { o.max_clients = 0; }, {"max_clients must be 1..4096"}},
      {"max_clients 4097", [](auto& o) { o.max_clients = 4097; }, {"max_clients must be 1..4096"}},
      {"leases_per_client 0",
       [](auto& o) { o.leases_per_client = 0; },
       {"leases_per_client must be 1..256"}},
      {"leases_per_client 257",
       [](auto& o) { o.leases_per_client = 257; },
       {"leases_per_client must be 1..256"}},
      {"max_clients x leases_per_client",
       [](auto& o) {
         o.max_clients = 4096;
         o.leases_per_client = 8;
       },
       {"max_clients x leases_per_client is 32768; the limit is 16382"}},
      {"min_split_bytes 0",
       [](auto& o) { o.min_split_bytes = 0; },
       {"min_split_bytes is 0", "split_tail=false"}},
      {"min_split_bytes 2^48",
       [](auto& o) { o.min_split_bytes = uint64_t{1} << 48; },
       {"min_split_bytes is 281474976710656"}},
      {"split_multiple 0",
       [](auto& o) { o.split_multiple = 0; },
       {"split_multiple is 0", "1: split anywhere"}},
      {"attach_timeout -1 ms",
       [](auto& o) { o.attach_timeout = milliseconds(-1); },
       {"attach_timeout is -1 ms; it must be 0..604800000 ms"}},
      {"attach_timeout 8 days",
       [](auto& o) { o.attach_timeout = std::chrono::hours(24 * 8); },
       {"attach_timeout is 691200000 ms"}},
      {"attach_timeout max",
       [](auto& o) { o.attach_timeout = milliseconds::max(); },
       {"attach_timeout is"}},
      {"lease_timeout -1 ms",
       [](auto& o) { o.lease_timeout = milliseconds(-1); },
       {"lease_timeout is -1 ms"}},
      {"lease_timeout max",
       [](auto& o) { o.lease_timeout = milliseconds::max(); },
       {"lease_timeout is"}},
      {"format tag of 64 bytes",
       [](auto& o) { o.format = std::string(64, 'x'); },
       {"format tag longer than 63 bytes"}},
  };
  for (const OptionCase& c : cases) {
    auto o = Options("opt", works);
    c.set(o);
    EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kInvalidArgument, c.needles))
        << c.what;
    EXPECT_FALSE(PathExists(SegmentPath(o.name))) << c.what << ": refused, yet a segment was made";
  }
  // The limits themselves are accepted.
  auto o = Options("limits", works);
  o.max_clients = 2047;
  o.leases_per_client = 8;
  o.min_split_bytes = 1;
  o.attach_timeout = milliseconds(604800000);
  o.lease_timeout = milliseconds(604800000);
  EXPECT_NO_THROW(WorkQueue::Open(o));
}

// ------------------------------------------------------------ messages

TEST_F(ArgumentTest, ErrnoMapsToOneKindEverywhere) {
  EXPECT_EQ(ErrorKindOfErrno(ENOENT), ErrorKind::kNotFound);
  EXPECT_EQ(ErrorKindOfErrno(ENOTDIR), ErrorKind::kNotFound);
  EXPECT_EQ(ErrorKindOfErrno(EACCES), ErrorKind::kPermission);
  EXPECT_EQ(ErrorKindOfErrno(EPERM), ErrorKind::kPermission);
  EXPECT_EQ(ErrorKindOfErrno(EROFS), ErrorKind::kPermission);
  EXPECT_EQ(ErrorKindOfErrno(ENOSPC), ErrorKind::kNoSpace);
  EXPECT_EQ(ErrorKindOfErrno(ENOMEM), ErrorKind::kNoSpace);
  EXPECT_EQ(ErrorKindOfErrno(ELOOP), ErrorKind::kInvalidArgument);
  EXPECT_EQ(ErrorKindOfErrno(ENAMETOOLONG), ErrorKind::kInvalidArgument);
  EXPECT_EQ(ErrorKindOfErrno(EIO), ErrorKind::kIo);
}

// ELOOP and ENAMETOOLONG were reported as permission errors.
TEST_F(ArgumentTest, ASymlinkLoopAndAnOverlongPathAreInvalidArgumentsNotPermission) {
  const std::string a = dir_.path() + "/loop_a", b = dir_.path() + "/loop_b";
  ASSERT_EQ(::symlink(b.c_str(), a.c_str()), 0) << ErrnoText("symlink");
  ASSERT_EQ(::symlink(a.c_str(), b.c_str()), 0) << ErrnoText("symlink");
  auto o = Options("eloop", {a});
  EXPECT_TRUE(FailsWith([&] { WorkQueue::Open(o); }, ErrorKind::kInvalidArgument,
                        {"work file '" + a + "' (works[0])", "Too many levels of symbolic links"}));
  const std::string longpath = dir_.path() + "/" + std::string(300, 'x');
  auto l = Options("toolong", {longpath});
  EXPECT_TRUE(
      FailsWith([&] { WorkQueue::Open(l); }, ErrorKind::kInvalidArgument, {"File name too long"}));
}

// A non-ASCII name gave an empty message in Python (not UTF-8 once cut in
// the middle of a character), a NUL cut the message short.
TEST_F(ArgumentTest, UnprintableBytesInNamesAndPathsAreEscapedInMessages) {
  auto message_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
      return std::string(e.what());
    }
    ADD_FAILURE() << "did not throw";
    return std::string();
  };
  const auto works = dir_.Files("f", 1, {10});
  auto named = [&](const std::string& name) {
    auto o = BaseOptions(name, works);
    return message_of([&] { WorkQueue::Open(o); });
  };
  EXPECT_EQ(
      named("caf\xc3\xa9"),
      "queue name 'caf\xc3\xa9' contains '\xc3\xa9'; use only ASCII letters, digits, '.', '_' "
      "and '-'");
  const std::string with_nul = named(std::string("a\0b", 3));
  EXPECT_EQ(with_nul,
            "queue name 'a\\x00b' contains '\\x00'; use only ASCII letters, digits, "
            "'.', '_' and '-'");
  EXPECT_EQ(std::strlen(with_nul.c_str()), with_nul.size()) << "a NUL in the message";
  EXPECT_EQ(named("x\xff\n"),
            "queue name 'x\\xff\\x0a' contains '\\xff'; use only ASCII letters, "
            "digits, '.', '_' and '-'");
  // A path with a NUL would stat a different file (the part before it).
  auto o = Options("nulpath", {works[0] + std::string("\0junk", 5)});
  const std::string m = message_of([&] { WorkQueue::Open(o); });
  EXPECT_TRUE(Contains(m, "work file '" + works[0] + "\\x00junk' (works[0]) contains a NUL byte"))
      << m;
  EXPECT_EQ(Printable("tab\there \x7f \xe2\x82\xac \xed\xa0\x80"),
            "tab\\x09here \\x7f \xe2\x82\xac \\xed\\xa0\\x80");
}

TEST_F(ArgumentTest, ByteSizesAreExactWithTheirUnit) {
  EXPECT_EQ(tailcut::detail::ByteSize(0), "0 bytes");
  EXPECT_EQ(tailcut::detail::ByteSize(1), "1 byte");
  EXPECT_EQ(tailcut::detail::ByteSize(1023), "1023 bytes");
  EXPECT_EQ(tailcut::detail::ByteSize(1024), "1 KiB");
  EXPECT_EQ(tailcut::detail::ByteSize(262144), "256 KiB");  // was "1 MiB"
  EXPECT_EQ(tailcut::detail::ByteSize(1536), "1.5 KiB (1536 bytes)");
  EXPECT_EQ(tailcut::detail::ByteSize(12897484), "12.3 MiB (12897484 bytes)");
  EXPECT_EQ(tailcut::detail::ByteSize(uint64_t{3} << 30), "3 GiB");
  EXPECT_EQ(tailcut::detail::ByteSize(~uint64_t{0}), "16.0 EiB (18446744073709551615 bytes)");
}

}  // namespace
}  // namespace tailcut::test
