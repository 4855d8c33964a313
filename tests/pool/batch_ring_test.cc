// BatchRing in one process: the hot path's statuses, ends of epochs,
// configuration checks, stats, and hostile segments.
#include "tailcut/batch_ring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "pool/ring_core.h"
#include "pool/ring_layout.h"

namespace tailcut {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string UniqueName(const char* what) {
  return std::string("ringtest.") + what + "." + std::to_string(::getpid());
}

struct RingGuard {
  explicit RingGuard(std::string n) : name(std::move(n)) { RemoveBatchRing(name); }
  ~RingGuard() { RemoveBatchRing(name); }
  std::string name;
};

BatchRingOptions Small(const std::string& name) {
  BatchRingOptions o;
  o.name = name;
  o.slot_bytes = 4096;
  o.num_slots = 3;
  o.max_clients = 8;
  o.attach_timeout = milliseconds(500);
  return o;
}

Clock::time_point Soon() { return Clock::now() + milliseconds(50); }

// The signatures before out-parameter-first, deadline-last: kept for one
// release, deprecated.
TEST(BatchRingTest, TheDeprecatedArgumentOrderStillWorks) {
  RingGuard g(UniqueName("old_order"));
  auto loader = BatchRing::Open(Small(g.name), RingRole::kLoader);
  auto trainer = BatchRing::Open(Small(g.name), RingRole::kTrainer);
  WritableBatch w;
  ReadyBatch r;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  ASSERT_EQ(loader->AcquireSlot(Soon(), &w), RingStatus::kOk);
  ASSERT_EQ(loader->Publish(w.token, 0, 1, 3), RingStatus::kOk);
  ASSERT_EQ(trainer->Pop(BatchRing::kAllEpochs, Soon(), &r), RingStatus::kOk);
#pragma GCC diagnostic pop
  EXPECT_EQ(r.data.size(), 3u);
  EXPECT_EQ(trainer->Release(r.token), RingStatus::kOk);
}

TEST(BatchRingTest, PublishedBatchIsPoppedInPlaceWithItsFields) {
  RingGuard g(UniqueName("basic"));
  auto loader = BatchRing::Open(Small(g.name), RingRole::kLoader);
  auto trainer = BatchRing::Open(Small(g.name), RingRole::kTrainer);
  WritableBatch w;
  ASSERT_EQ(loader->AcquireSlot(&w, Soon()), RingStatus::kOk);
  ASSERT_EQ(w.data.size(), 4096u);
  ASSERT_EQ(w.user_header.size(), BatchRing::kUserHeaderBytes);
  std::memcpy(w.data.data(), "hello", 5);
  std::memcpy(w.user_header.data(), "hdr", 3);
  ASSERT_EQ(loader->Publish(w.token, 2, 7, 5), RingStatus::kOk);
  ReadyBatch r;
  ASSERT_EQ(trainer->Pop(BatchRing::kAllEpochs, &r, Soon()), RingStatus::kOk);
  EXPECT_EQ(r.epoch, 2u);
  EXPECT_EQ(r.records, 7u);
  EXPECT_EQ(r.loader, loader->client_slot());
  ASSERT_EQ(r.data.size(), 5u);
  EXPECT_EQ(std::memcmp(r.data.data(), "hello", 5), 0);
  EXPECT_EQ(std::memcmp(r.user_header.data(), "hdr", 3), 0);
  // The same memory, mapped twice: no copy between the two.
  EXPECT_EQ(r.token.slot, w.token.slot);
  EXPECT_EQ(trainer->Release(r.token), RingStatus::kOk);
  EXPECT_EQ(trainer->Release(r.token), RingStatus::kStale);
  EXPECT_EQ(loader->Publish(w.token, 2, 7, 5), RingStatus::kStale);
  BatchRingStats s = trainer->Stats();
  EXPECT_EQ(s.published, 1u);
  EXPECT_EQ(s.released, 1u);
  EXPECT_EQ(s.stale_tokens, 2u);
  EXPECT_EQ(s.free, 3u);
  ASSERT_EQ(s.clients.size(), 2u);
}

TEST(BatchRingTest, BatchesComeOutInPublishOrder) {
  RingGuard g(UniqueName("order"));
  auto loader = BatchRing::Open(Small(g.name), RingRole::kLoader);
  auto trainer = BatchRing::Open(Small(g.name), RingRole::kTrainer);
  for (uint64_t round = 0; round < 10; ++round) {
    WritableBatch a, b;
    ASSERT_EQ(loader->AcquireSlot(&a, Soon()), RingStatus::kOk);
    ASSERT_EQ(loader->AcquireSlot(&b, Soon()), RingStatus::kOk);
    ASSERT_EQ(loader->Publish(b.token, 0, round * 2, 0), RingStatus::kOk);
    ASSERT_EQ(loader->Publish(a.token, 0, round * 2 + 1, 0), RingStatus::kOk);
    ReadyBatch r1, r2;
    ASSERT_EQ(trainer->Pop(0, &r1, Soon()), RingStatus::kOk);
    ASSERT_EQ(trainer->Pop(0, &r2, Soon()), RingStatus::kOk);
    EXPECT_EQ(r1.records, round * 2);
    EXPECT_EQ(r2.records, round * 2 + 1);
    ASSERT_EQ(trainer->Release(r2.token), RingStatus::kOk);
    ASSERT_EQ(trainer->Release(r1.token), RingStatus::kOk);
  }
}

TEST(BatchRingTest, LoaderWaitsForAFreeSlotAndTrainerForABatch) {
  RingGuard g(UniqueName("backpressure"));
  auto loader = BatchRing::Open(Small(g.name), RingRole::kLoader);
  auto trainer = BatchRing::Open(Small(g.name), RingRole::kTrainer);
  ReadyBatch r;
  auto t0 = Clock::now();
  EXPECT_EQ(trainer->Pop(BatchRing::kAllEpochs, &r, t0 + milliseconds(30)), RingStatus::kTimeout);
  EXPECT_GE(Clock::now() - t0, milliseconds(30));
  WritableBatch w[3];
  for (auto& b : w) ASSERT_EQ(loader->AcquireSlot(&b, Soon()), RingStatus::kOk);
  WritableBatch extra;
  t0 = Clock::now();
  EXPECT_EQ(loader->AcquireSlot(&extra, t0 + milliseconds(30)), RingStatus::kTimeout);
  EXPECT_GE(Clock::now() - t0, milliseconds(30));
  EXPECT_EQ(loader->Abandon(w[0].token), RingStatus::kOk);
  EXPECT_EQ(loader->Abandon(w[0].token), RingStatus::kStale);
  EXPECT_EQ(loader->AcquireSlot(&extra, Soon()), RingStatus::kOk);
}

TEST(BatchRingTest, PopEndsOnceTheEpochIsEndedAndNothingIsReady) {
  RingGuard g(UniqueName("end"));
  auto loader = BatchRing::Open(Small(g.name), RingRole::kLoader);
  auto trainer = BatchRing::Open(Small(g.name), RingRole::kTrainer);
  WritableBatch w;
  ASSERT_EQ(loader->AcquireSlot(&w, Soon()), RingStatus::kOk);
  ASSERT_EQ(loader->Publish(w.token, 0, 1, 0), RingStatus::kOk);
  loader->EndEpoch(0);
  ReadyBatch r;
  ASSERT_EQ(trainer->Pop(0, &r, Soon()), RingStatus::kOk);  // a ready batch comes first
  ASSERT_EQ(trainer->Release(r.token), RingStatus::kOk);
  EXPECT_EQ(trainer->Pop(0, &r, Clock::now() + milliseconds(1000)), RingStatus::kEnd);
  EXPECT_EQ(trainer->Pop(1, &r, Clock::now() + milliseconds(20)), RingStatus::kTimeout);
  // A batch of an ended epoch is refused and stays the loader's.
  ASSERT_EQ(loader->AcquireSlot(&w, Soon()), RingStatus::kOk);
  EXPECT_EQ(loader->Publish(w.token, 0, 1, 0), RingStatus::kClosed);
  EXPECT_EQ(loader->Publish(w.token, 1, 1, 0), RingStatus::kOk);
  loader->Close();
  ASSERT_EQ(trainer->Pop(BatchRing::kAllEpochs, &r, Soon()), RingStatus::kOk);
  ASSERT_EQ(trainer->Release(r.token), RingStatus::kOk);
  EXPECT_EQ(trainer->Pop(BatchRing::kAllEpochs, &r, Soon()), RingStatus::kEnd);
  EXPECT_TRUE(trainer->Stats().closed);
}

TEST(BatchRingTest, EndWakesATrainerThatWaits) {
  RingGuard g(UniqueName("endwake"));
  auto loader = BatchRing::Open(Small(g.name), RingRole::kLoader);
  auto trainer = BatchRing::Open(Small(g.name), RingRole::kTrainer);
  std::thread closer([&] {
    std::this_thread::sleep_for(milliseconds(30));
    loader->Close();
  });
  ReadyBatch r;
  auto t0 = Clock::now();
  EXPECT_EQ(trainer->Pop(BatchRing::kAllEpochs, &r, t0 + milliseconds(5000)), RingStatus::kEnd);
  EXPECT_LT(Clock::now() - t0, milliseconds(1000));
  closer.join();
}

// What `tailcut top` reads to flag a starving trainer: a wait in progress
// shows before it ends, and goes into wait_seconds when it does.
TEST(BatchRingTest, StatsShowAWaitInProgressAndAddItUpWhenItEnds) {
  RingGuard g(UniqueName("waiting"));
  auto loader = BatchRing::Open(Small(g.name), RingRole::kLoader);
  auto trainer = BatchRing::Open(Small(g.name), RingRole::kTrainer);
  auto trainer_row = [&] {
    BatchRingStats s = loader->Stats();
    for (const RingClientStats& c : s.clients) {
      EXPECT_GE(s.now_ns, c.joined_ns);
      EXPECT_GT(c.joined_ns, 0u);
      if (c.slot == trainer->client_slot()) return c;
    }
    ADD_FAILURE() << "no trainer row";
    return RingClientStats{};
  };
  EXPECT_EQ(trainer_row().waiting_seconds, 0.0);
  RingStatus popped = RingStatus::kInvalid;
  std::thread waiter([&] {
    ReadyBatch r;
    popped = trainer->Pop(BatchRing::kAllEpochs, &r, Clock::now() + milliseconds(60000));
    if (popped == RingStatus::kOk) trainer->Release(r.token);
  });
  // The waiter shows as waiting once it sleeps (however long that takes to happen).
  RingClientStats during;
  for (int i = 0; i < 10000 && (during = trainer_row()).waiting_seconds == 0; ++i)
    std::this_thread::sleep_for(milliseconds(1));
  EXPECT_GT(during.waiting_seconds, 0.0);
  EXPECT_EQ(during.wait_seconds, 0.0) << "nothing ended yet";
  WritableBatch w;
  ASSERT_EQ(loader->AcquireSlot(&w, Soon()), RingStatus::kOk);
  ASSERT_EQ(loader->Publish(w.token, 0, 1, 0), RingStatus::kOk);
  waiter.join();
  EXPECT_EQ(popped, RingStatus::kOk);
  RingClientStats after = trainer_row();
  EXPECT_EQ(after.waiting_seconds, 0.0);
  EXPECT_GE(after.wait_seconds, during.waiting_seconds);
}

TEST(BatchRingTest, WrongRoleAndBadArgumentsAreInvalid) {
  RingGuard g(UniqueName("roles"));
  auto loader = BatchRing::Open(Small(g.name), RingRole::kLoader);
  auto trainer = BatchRing::Open(Small(g.name), RingRole::kTrainer);
  WritableBatch w;
  ReadyBatch r;
  EXPECT_EQ(trainer->AcquireSlot(&w, Soon()), RingStatus::kInvalid);
  EXPECT_EQ(loader->Pop(0, &r, Soon()), RingStatus::kInvalid);
  ASSERT_EQ(loader->AcquireSlot(&w, Soon()), RingStatus::kOk);
  EXPECT_EQ(loader->Publish(w.token, 0, 1, 4097), RingStatus::kInvalid);
  EXPECT_EQ(loader->Publish(SlotToken{99, w.token.generation}, 0, 1, 1), RingStatus::kStale);
  EXPECT_EQ(loader->Publish(SlotToken{w.token.slot, w.token.generation + 4}, 0, 1, 1),
            RingStatus::kStale);
  EXPECT_EQ(trainer->Release(SlotToken{w.token.slot, w.token.generation}), RingStatus::kStale);
  EXPECT_EQ(loader->Publish(w.token, 0, 1, 1), RingStatus::kOk);
}

TEST(BatchRingTest, AttachWithAnotherConfigurationNamesTheField) {
  RingGuard g(UniqueName("mismatch"));
  auto first = BatchRing::Open(Small(g.name), RingRole::kLoader);
  BatchRingOptions o = Small(g.name);
  o.num_slots = 4;
  try {
    BatchRing::Open(o, RingRole::kTrainer);
    FAIL() << "attached with another num_slots";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfigMismatch);
    EXPECT_NE(std::string(e.what()).find("num_slots differs: 4 here, 3 in"), std::string::npos)
        << e.what();
  }
  o = Small(g.name);
  o.num_slots = 0;
  EXPECT_THROW(BatchRing::Open(o, RingRole::kTrainer), Error);
}

TEST(BatchRingTest, AFullDevShmIsAClearErrorAndLeavesNothing) {
  RingGuard g(UniqueName("nospace"));
  BatchRingOptions o = Small(g.name);
  o.slot_bytes = uint64_t{1} << 36;  // 64 TiB in all: more than any /dev/shm here
  o.num_slots = 1024;
  try {
    BatchRing::Open(o, RingRole::kLoader);
    FAIL() << "reserved 64 TiB in /dev/shm";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNoSpace) << e.what();
    EXPECT_NE(std::string(e.what()).find("free"), std::string::npos) << e.what();
  }
  EXPECT_NE(::access(BatchRingSegmentPath(g.name).c_str(), F_OK), 0);
}

TEST(BatchRingTest, LastClientOfAClosedRingRemovesIt) {
  RingGuard g(UniqueName("lifetime"));
  std::string path = BatchRingSegmentPath(g.name);
  {
    auto loader = BatchRing::Open(Small(g.name), RingRole::kLoader);
    auto trainer = BatchRing::Open(Small(g.name), RingRole::kTrainer);
    EXPECT_EQ(::access(path.c_str(), F_OK), 0);
    loader->Close();
  }
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
  {
    auto loader = BatchRing::Open(Small(g.name), RingRole::kLoader);  // not closed: stays
  }
  EXPECT_EQ(::access(path.c_str(), F_OK), 0);
  BatchRingStats s = InspectBatchRing(g.name);
  EXPECT_EQ(s.num_slots, 3u);
  EXPECT_TRUE(s.clients.empty());
  EXPECT_TRUE(RemoveBatchRing(g.name));
  EXPECT_FALSE(RemoveBatchRing(g.name));
  EXPECT_THROW(InspectBatchRing(g.name), Error);
}

TEST(BatchRingTest, LeavingHandsBackWhatTheClientHeld) {
  RingGuard g(UniqueName("leave"));
  auto loader = BatchRing::Open(Small(g.name), RingRole::kLoader);
  auto trainer = BatchRing::Open(Small(g.name), RingRole::kTrainer);
  {
    auto other = BatchRing::Open(Small(g.name), RingRole::kTrainer);
    WritableBatch w;
    ASSERT_EQ(loader->AcquireSlot(&w, Soon()), RingStatus::kOk);
    ASSERT_EQ(loader->Publish(w.token, 0, 42, 0), RingStatus::kOk);
    ReadyBatch r;
    ASSERT_EQ(other->Pop(0, &r, Soon()), RingStatus::kOk);
  }
  ReadyBatch r;
  ASSERT_EQ(trainer->Pop(0, &r, Soon()), RingStatus::kOk);
  EXPECT_EQ(r.records, 42u);
  EXPECT_EQ(trainer->Stats().redelivered, 1u);
}

// ------------------------------------------------------------ hostile segments

class HostileRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    guard_ = std::make_unique<RingGuard>(UniqueName("hostile"));
    { auto ring = BatchRing::Open(Small(guard_->name), RingRole::kLoader); }
    int fd = ::open(BatchRingSegmentPath(guard_->name).c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    geometry_ = detail::ComputeRingGeometry(4096, 3, 8);
    void* p = ::mmap(nullptr, geometry_.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    ASSERT_NE(p, MAP_FAILED);
    base_ = static_cast<char*>(p);
  }
  void TearDown() override {
    if (base_ != nullptr) ::munmap(base_, geometry_.total);
  }
  detail::RingCore core() { return detail::RingCore(base_, geometry_); }
  uint64_t* cell(size_t offset, uint64_t i) {
    return reinterpret_cast<uint64_t*>(base_ + offset) + i;
  }
  // Open must fail with kCorrupt, naming `what`.
  void ExpectOpenRejects(const std::string& what) {
    try {
      BatchRing::Open(Small(guard_->name), RingRole::kTrainer);
      FAIL() << "attached to a damaged ring (" << what << ")";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("RemoveBatchRing"), std::string::npos) << e.what();
    }
  }
  std::unique_ptr<RingGuard> guard_;
  detail::RingGeometry geometry_;
  char* base_ = nullptr;
};

TEST_F(HostileRingTest, BadMagicIsRejected) {
  core().header().magic.store(42);
  ExpectOpenRejects("bad magic");
}

TEST_F(HostileRingTest, CountsThatDoNotAddUpAreRejected) {
  core().header().num_slots = 4000;
  ExpectOpenRejects("bytes");
}

TEST_F(HostileRingTest, ASlotIdOutOfRangeInARingIsRejected) {
  *cell(geometry_.free_cells, 1) = detail::FullCell(0, 77, 0);
  ExpectOpenRejects("names slot 77");
}

TEST_F(HostileRingTest, ASlotStateOrOwnerOutOfRangeIsRejected) {
  core().slot(1).word.store(6);
  ExpectOpenRejects("slot 1 has state 6");
  core().slot(1).word.store(detail::SlotWord(detail::kSlotPopped, 500, 3));
  ExpectOpenRejects("names client 500");
}

TEST_F(HostileRingTest, PositionsFarApartAreRejected) {
  reinterpret_cast<detail::IdRing*>(base_ + geometry_.ready_ring)->tail.store(1000);
  ExpectOpenRejects("more than");
}

TEST_F(HostileRingTest, ALapFromNowhereIsRejected) {
  *cell(geometry_.ready_cells, 2) = detail::EmptyCell(9);
  ExpectOpenRejects("has lap 9");
}

TEST_F(HostileRingTest, DamageAfterAttachIsRefusedOnUseNeverFollowed) {
  auto trainer = BatchRing::Open(Small(guard_->name), RingRole::kTrainer);
  auto loader = BatchRing::Open(Small(guard_->name), RingRole::kLoader);
  // A full cell at the ready ring's head that names a slot past the end.
  *cell(geometry_.ready_cells, 0) = detail::FullCell(0, 4000, 0);
  ReadyBatch r;
  EXPECT_EQ(trainer->Pop(BatchRing::kAllEpochs, &r, Soon()), RingStatus::kCorrupt);
  // A published batch whose size was raised past the slot is not handed out.
  *cell(geometry_.ready_cells, 0) = detail::EmptyCell(0);
  WritableBatch w;
  ASSERT_EQ(loader->AcquireSlot(&w, Soon()), RingStatus::kOk);
  ASSERT_EQ(loader->Publish(w.token, 0, 1, 10), RingStatus::kOk);
  core().slot(w.token.slot).bytes.store(1 << 30);
  EXPECT_EQ(trainer->Pop(BatchRing::kAllEpochs, &r, Soon()), RingStatus::kCorrupt);
  EXPECT_EQ(trainer->Stats().free, 3u);  // and its slot went back
  // Head and tail thrown far away: refused, not followed.
  auto* ready = reinterpret_cast<detail::IdRing*>(base_ + geometry_.ready_ring);
  ready->head.store(uint64_t{12345} << 3);  // lap 12345 of an 8-cell ring
  ready->tail.store(uint64_t{12345} << 3);
  EXPECT_EQ(trainer->Pop(BatchRing::kAllEpochs, &r, Soon()), RingStatus::kCorrupt);
}

}  // namespace
}  // namespace tailcut
