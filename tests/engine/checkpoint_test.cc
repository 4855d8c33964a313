// Tests of engine/checkpoint.h: the bytes of a checkpoint. A restore trusts
// nothing it is given: anything but what SerializeState wrote is a kCorrupt
// error that names the queue and what is wrong, never a crash or a silently
// different state.
#include "engine/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "engine/config.h"
#include "tailcut/error.h"
#include "tailcut/work_queue.h"

namespace tailcut::detail {
namespace {

SavedState Sample() {
  SavedState s;
  s.fingerprint = 0x1234;
  s.num_items = 100;
  s.num_epochs = 2;
  s.seed = 7;
  s.low = 64;
  s.cursor = 150;
  s.words = {0xffull, 0x3ull};  // tickets [64, 192): (150 + 63) / 64 - 64 / 64 = 2 words
  s.pieces = {{65, 10, 20}, {149, 0, 5}};
  return s;
}

// The message of the error DeserializeState throws, or "" if it did not.
std::string Refusal(const std::string& bytes) {
  try {
    DeserializeState("q", bytes);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    return e.what();
  }
  return "";
}

// Rewrites the 64-bit word at `index` and fixes the checksum, so that only
// the checks after it can refuse the state.
std::string WithWord(std::string bytes, size_t index, uint64_t value);

TEST(CheckpointTest, RoundTripsEveryField) {
  const SavedState s = Sample();
  const SavedState back = DeserializeState("q", SerializeState(s));
  EXPECT_EQ(back.fingerprint, s.fingerprint);
  EXPECT_EQ(back.num_items, s.num_items);
  EXPECT_EQ(back.num_epochs, s.num_epochs);
  EXPECT_EQ(back.seed, s.seed);
  EXPECT_EQ(back.low, s.low);
  EXPECT_EQ(back.cursor, s.cursor);
  EXPECT_EQ(back.words, s.words);
  ASSERT_EQ(back.pieces.size(), 2u);
  EXPECT_EQ(back.pieces[1].ticket, 149u);
  EXPECT_EQ(back.pieces[1].end, 5u);
}

TEST(CheckpointTest, DamagedBytesAreCorruptErrorsNamingTheQueueAndWhat) {
  const std::string good = SerializeState(Sample());
  const std::string prefix = "queue 'q': restore_state is not a valid tailcut checkpoint (";
  EXPECT_EQ(Refusal(""), prefix + "0 bytes); pass the bytes SaveState() returned");
  EXPECT_NE(Refusal(good.substr(0, good.size() - 8)).find(prefix), std::string::npos);
  std::string flipped = good;
  flipped[8 * 9] ^= 1;  // the first done word
  EXPECT_NE(Refusal(flipped).find("checksum mismatch"), std::string::npos);
  std::string magic = good;
  magic[0] ^= 1;
  EXPECT_NE(Refusal(magic).find("bad magic"), std::string::npos);
  EXPECT_NE(Refusal(WithWord(good, 1, 9)).find("version 9"), std::string::npos);
  EXPECT_NE(Refusal(good + std::string(8, '\0')).find(prefix), std::string::npos);
}

TEST(FedRestoreTest, RoundTripsAndRefusesWhatItsHeaderDoesNotDescribe) {
  const std::string host = SerializeState(Sample());
  const std::string bytes = FedRestoreState("tailcut-global-state 1 ...", host, "token-1");
  ASSERT_TRUE(IsFedRestore(bytes));
  EXPECT_FALSE(IsFedRestore(host));
  const FedRestore back = DeserializeFedRestore("q", bytes);
  EXPECT_EQ(back.token, "token-1");
  EXPECT_EQ(back.tier, "tailcut-global-state 1 ...");
  EXPECT_EQ(back.host, host);
  auto refusal = [](const std::string& damaged) -> std::string {
    try {
      DeserializeFedRestore("q", damaged);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
      return e.what();
    }
    return "";
  };
  const std::string prefix = "queue 'q': restore_state is not a checkpoint of a job across hosts (";
  EXPECT_EQ(refusal(bytes.substr(0, bytes.size() - 1)),
            prefix +
                "its length does not match its header); pass the bytes FedRestoreState() "
                "returned");
  EXPECT_EQ(refusal(bytes + "x").find(prefix), 0u);
  EXPECT_EQ(refusal("tailcut-fed-restore 1 7 99999999999999999999 1\n").find(prefix), 0u);
  EXPECT_EQ(refusal("tailcut-fed-restore 1 7\ntoken-1"),
            prefix + "header fields missing); pass the bytes FedRestoreState() returned");
  EXPECT_EQ(refusal("tailcut-fed-restore 1 a b c\n"),
            prefix + "a header field is not a number); pass the bytes FedRestoreState() returned");
  EXPECT_EQ(refusal("tailcut-fed-restore 1 1 1 1"),
            prefix + "no header); pass the bytes FedRestoreState() returned");
}

TEST(CheckpointTest, CountsThatDoNotAddUpAreRefused) {
  const std::string good = SerializeState(Sample());
  // Words: 0 magic, 1 version, 2 fingerprint, 3 items, 4 epochs, 5 seed,
  // 6 low, 7 cursor, 8 word count, 9.. words, then the piece count.
  EXPECT_NE(Refusal(WithWord(good, 6, 151)).find("inconsistent counts"), std::string::npos)
      << "low above the cursor";
  EXPECT_NE(Refusal(WithWord(good, 7, 201)).find("inconsistent counts"), std::string::npos)
      << "cursor past every ticket";
  EXPECT_NE(Refusal(WithWord(good, 3, 0)).find("inconsistent counts"), std::string::npos);
  EXPECT_NE(Refusal(WithWord(good, 8, 1ull << 40)).find("word count out of range"),
            std::string::npos);
  EXPECT_NE(Refusal(WithWord(good, 11, 1ull << 40)).find("piece count out of range"),
            std::string::npos);
  EXPECT_NE(Refusal(WithWord(good, 12, 200)).find("piece out of range"), std::string::npos)
      << "a piece's ticket past every ticket";
  EXPECT_NE(Refusal(WithWord(good, 13, 30)).find("piece out of range"), std::string::npos)
      << "a piece that begins after its end";
}

// A checkpoint's resume offsets pass the checks Progress and Commit make:
// one inside a fixed-size record (a hand-made or damaged state) is refused,
// naming the ticket, the offset and the format, and no queue is left behind.
TEST(CheckpointRestoreTest, AResumeOffsetInsideAFixedSizeRecordIsRefused) {
  char path[] = "/tmp/tailcut_ckpt_fixed.XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 8 * 10000), 0);
  ::close(fd);
  WorkQueueOptions o;
  o.name = "tctest_ckpt_fixed_" + std::to_string(::getpid());
  o.works = {path};
  o.format = "fixed:8";
  o.shuffle = false;
  o.on_notice = [](const std::string&) {};
  std::string saved;
  {
    auto q = WorkQueue::Open(o);
    WorkItem item;
    ASSERT_EQ(q->TryTake(&item), TakeStatus::kOk);
    ASSERT_EQ(q->Commit(item, item.begin + 800), ItemStatus::kOk);
    saved = q->SaveState();
  }  // closed unfinished by its only process: removed
  SavedState s = DeserializeState(o.name, saved);
  ASSERT_EQ(s.pieces.size(), 1u);
  EXPECT_EQ(s.pieces[0].begin, 800u);
  s.pieces[0].begin = 803;
  o.restore_state = SerializeState(s);
  try {
    WorkQueue::Open(o);
    ADD_FAILURE() << "a restore that resumes mid-record was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    EXPECT_NE(std::string(e.what()).find("resumes ticket 0 at offset 803, inside a record of "
                                         "format 'fixed:8'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NE(::access(SegmentPath(o.name).c_str(), F_OK), 0) << "a refused restore left a segment";
  s.pieces[0].begin = 800;
  o.restore_state = SerializeState(s);
  {
    auto q = WorkQueue::Open(o);
    WorkItem item;
    ASSERT_EQ(q->TryTake(&item), TakeStatus::kOk);
    EXPECT_EQ(item.begin, 800u);
  }
  ::unlink(path);
}

// Tickets 0..9 handed out of 20: 0 and 2 done, 3 open from offset 100
// (records below it consumed), 1 and 4..9 neither done nor open. Past the
// cursor, a done bit (12) and a piece (15), as states of older builds had
// for items acked or split while the state was saved: no range there is
// reopened.
std::string Handed() {
  SavedState s;
  s.num_items = 10;
  s.num_epochs = 2;
  s.cursor = 10;
  s.words = {0b101 | 1ull << 12};
  s.pieces = {{3, 100, 200}, {15, 0, 10}};
  return SerializeState(s);
}

// The pieces ReopenRanges added to Handed(), as (ticket, begin, end).
std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> Added(const std::vector<Piece>& ranges,
                                                            uint64_t* count = nullptr) {
  const Reopened r = ReopenRanges("q", Handed(), ranges);
  if (count != nullptr) *count = r.ranges;
  const SavedState s = DeserializeState("q", r.state);
  std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> out;
  for (size_t i = 2; i < s.pieces.size(); ++i)  // after Handed()'s own
    out.emplace_back(s.pieces[i].ticket, s.pieces[i].begin, s.pieces[i].end);
  EXPECT_EQ(out.size(), r.ranges);
  return out;
}

using Ranges = std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>;

TEST(ReopenRangesTest, ARangeOfADoneTicketBecomesAPieceOnce) {
  uint64_t count = 0;
  EXPECT_EQ(Added({{2, 10, 20}, {0, 5, 9}, {2, 10, 20}}, &count), (Ranges{{0, 5, 9}, {2, 10, 20}}));
  EXPECT_EQ(count, 2u);
  // Below low / 64 * 64 a ticket is done without a bit.
  const SavedState s{.num_items = 100, .num_epochs = 2, .low = 70, .cursor = 80, .words = {0}};
  const Reopened r = ReopenRanges("q", SerializeState(s), {{10, 0, 4}, {70, 0, 4}});
  EXPECT_EQ(r.ranges, 1u);
  EXPECT_EQ(DeserializeState("q", r.state).pieces[0].ticket, 10u);
}

TEST(ReopenRangesTest, WhatAnOpenPieceCoversIsNotReopened) {
  EXPECT_EQ(Added({{3, 50, 150}}), (Ranges{{3, 50, 100}})) << "the piece covers the range's end";
  EXPECT_EQ(Added({{3, 150, 250}}), (Ranges{{3, 200, 250}})) << "the piece covers its begin";
  EXPECT_EQ(Added({{3, 120, 180}}), Ranges{}) << "the piece covers all of it";
  EXPECT_EQ(Added({{3, 0, 50}, {3, 40, 150}}), (Ranges{{3, 0, 50}, {3, 50, 100}}))
      << "a range added first covers the next one's begin";
}

TEST(ReopenRangesTest, TicketsPastTheCursorOrNeitherDoneNorOpenNeedNothing) {
  const Reopened r = ReopenRanges(
      "q", Handed(), {{10, 0, 5}, {12, 0, 5}, {15, 20, 30}, {19, 0, 5}, {1, 0, 5}, {4, 0, 5}});
  EXPECT_EQ(r.ranges, 0u);
  EXPECT_EQ(r.state, Handed());
}

// Handed()'s pieces after ConsumeRanges, as (ticket, begin, end).
Ranges Consumed(const std::vector<Piece>& ranges) {
  const SavedState s = DeserializeState("q", ConsumeRanges("q", Handed(), ranges));
  Ranges out;
  for (const Piece& p : s.pieces) out.emplace_back(p.ticket, p.begin, p.end);
  return out;
}

TEST(ConsumeRangesTest, WhatAUsedRangeHoldsOfAnOpenPieceIsCutOut) {
  EXPECT_EQ(Consumed({{3, 100, 140}}), (Ranges{{3, 140, 200}, {15, 0, 10}}))
      << "a batch used before its loader committed it";
  EXPECT_EQ(Consumed({{3, 120, 140}}), (Ranges{{3, 100, 120}, {3, 140, 200}, {15, 0, 10}}))
      << "from the middle: the piece splits";
  EXPECT_EQ(Consumed({{3, 50, 150}, {3, 150, 250}}), (Ranges{{3, 200, 200}, {15, 0, 10}}))
      << "all of it: an empty piece, its ticket done";
  EXPECT_EQ(Consumed({{0, 0, 5}, {1, 0, 5}, {4, 0, 5}, {12, 0, 5}}),
            (Ranges{{3, 100, 200}, {15, 0, 10}}))
      << "done, neither done nor open, or past the cursor: nothing changes";
}

TEST(ConsumeRangesTest, ARestoreReadsWhatIsLeftAndTakesAnEmptyPieceAsDone) {
  // Ticket 3 consumed to its end: not handed out again, though Handed() has
  // no done bit for it.
  const std::string state = ConsumeRanges("q", Handed(), {{3, 100, 200}});
  const Reopened r = ReopenRanges("q", state, {{3, 150, 160}});
  EXPECT_EQ(r.ranges, 1u) << "a consumed range counts as consumed";
  try {
    ConsumeRanges("q", Handed(), {{3, 20, 20}});
    ADD_FAILURE() << "an empty range was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "queue 'q': cannot consume range (ticket 3, begin 20, end 20): begin must be below "
              "end; pass the (ticket, begin, end) ranges of records taken from this queue");
  }
}

TEST(ReopenRangesTest, BadInputIsRefusedNamingWhat) {
  try {
    ReopenRanges("q", Handed().substr(8), {});
    ADD_FAILURE() << "truncated bytes were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
  }
  auto refusal = [](const Piece& p) -> std::string {
    try {
      ReopenRanges("q", Handed(), {{2, 10, 20}, p});
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      return e.what();
    }
    return "";
  };
  const std::string tail =
      "; pass the (ticket, begin, end) ranges of records taken from this queue";
  EXPECT_EQ(refusal({2, 20, 20}),
            "queue 'q': cannot reopen range (ticket 2, begin 20, end 20): begin must be below end" +
                tail);
  EXPECT_EQ(refusal({2, 30, 20}),
            "queue 'q': cannot reopen range (ticket 2, begin 30, end 20): begin must be below end" +
                tail);
  EXPECT_EQ(refusal({20, 0, 5}),
            "queue 'q': cannot reopen range (ticket 20, begin 0, end 5): the checkpoint has "
            "tickets 0..19" +
                tail);
}

// Two hosts of one fed job (200 tickets): host a finished 0..69 and 72, holds
// ticket 75 from offset 40 and (a piece past its cursor, meaningless) 150;
// host b finished 70, 71 and 130, holds 131 from 10 and 75 from 60 (fenced:
// both held it).
std::string HostA() {
  return SerializeState({.fingerprint = 9,
                         .num_items = 100,
                         .num_epochs = 2,
                         .seed = 3,
                         .low = 70,
                         .cursor = 80,
                         .words = {1ull << (72 - 64) | 1ull << (75 - 64)},
                         .pieces = {{75, 40, 90}, {150, 0, 5}}});
}

std::string HostB() {
  SavedState s{.fingerprint = 9,
               .num_items = 100,
               .num_epochs = 2,
               .seed = 3,
               .low = 0,
               .cursor = 140,
               .words = {0, 0, 0}};
  for (uint64_t t : {70, 71, 75, 130, 131}) s.words[t / 64] |= uint64_t{1} << (t % 64);
  s.pieces = {{131, 10, 50}, {75, 60, 120}, {130, 7, 7}};
  return SerializeState(s);
}

TEST(MergeStatesTest, DoneWhereAnyHostHasItDoneAndEveryHostsPiecesOnce) {
  const SavedState m = DeserializeState("q", MergeStates("q", {HostA(), HostB()}));
  EXPECT_EQ(m.fingerprint, 9u);
  EXPECT_EQ(m.seed, 3u);
  EXPECT_EQ(m.cursor, 140u);
  EXPECT_EQ(m.low, 73u) << "0..69 from a, 70 and 71 from b, 72 from a";
  auto done = [&](uint64_t t) {
    return t < m.low || ((m.words[t / 64 - m.low / 64] >> (t % 64)) & 1) != 0;
  };
  std::vector<uint64_t> done_above;
  for (uint64_t t = m.low; t < m.cursor; ++t)
    if (done(t)) done_above.push_back(t);
  EXPECT_EQ(done_above, (std::vector<uint64_t>{75, 130, 131}));
  Ranges pieces;
  for (const Piece& p : m.pieces) pieces.emplace_back(p.ticket, p.begin, p.end);
  EXPECT_EQ(pieces, (Ranges{{75, 40, 120}, {131, 10, 50}}))
      << "overlapping pieces of one ticket joined; none past a cursor; an empty one only done";
  EXPECT_EQ(MergeStates("q", {HostB(), HostA()}), MergeStates("q", {HostA(), HostB()}));
}

TEST(MergeStatesTest, OneStateComesBackAsItIsAndOtherJobsAreRefused) {
  EXPECT_EQ(MergeStates("q", {HostA()}), HostA());
  auto refusal = [](const std::vector<std::string>& states) -> std::string {
    try {
      MergeStates("q.n0", states);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(refusal({}), "queue 'q.n0': no checkpoint to merge: pass the host states to join");
  SavedState other = DeserializeState("q", HostB());
  other.seed = 4;
  EXPECT_EQ(refusal({HostA(), SerializeState(other)}),
            "queue 'q.n0': checkpoint 1 of the host states to merge is of another job than "
            "checkpoint 0 (data, items, epochs or seed differ): merge only the host states of "
            "one job");
  try {
    MergeStates("q", {HostA(), HostB().substr(8)});
    ADD_FAILURE() << "truncated bytes were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
  }
}

TEST(MergeStatesTest, AnEmptyStateIsOfTheSameJobWithNothingHandedOut) {
  const SavedState e = DeserializeState("q", EmptyState("q", HostB()));
  EXPECT_EQ(std::tie(e.fingerprint, e.num_items, e.num_epochs, e.seed),
            std::make_tuple(uint64_t{9}, uint64_t{100}, uint64_t{2}, uint64_t{3}));
  EXPECT_EQ(std::tie(e.low, e.cursor), std::make_tuple(uint64_t{0}, uint64_t{0}));
  EXPECT_TRUE(e.words.empty() && e.pieces.empty());
  EXPECT_EQ(MergeStates("q", {HostA(), EmptyState("q", HostA())}),
            MergeStates("q", {HostA(), HostA()}));
  try {
    EmptyState("q", HostA().substr(8));
    ADD_FAILURE() << "truncated bytes were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
  }
}

std::string WithWord(std::string bytes, size_t index, uint64_t value) {
  std::memcpy(bytes.data() + 8 * index, &value, 8);
  const uint64_t hash = HashBytes(bytes.data(), bytes.size() - 8);  // as SerializeState
  std::memcpy(bytes.data() + bytes.size() - 8, &hash, 8);
  return bytes;
}

}  // namespace
}  // namespace tailcut::detail
