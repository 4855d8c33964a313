// BatchRing handles in a forked child (batch_ring.h: Fork): a child that
// uses or destroys its parent's loader and trainer objects changes nothing;
// the parent pops and releases every batch exactly once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>

#include "fork_child.h"
#include "tailcut/batch_ring.h"

namespace tailcut {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using tailcut::testing::InChild;

struct RingGuard {
  explicit RingGuard(std::string n) : name(std::move(n)) { RemoveBatchRing(name); }
  ~RingGuard() { RemoveBatchRing(name); }
  std::string name;
};

BatchRingOptions Small(const std::string& name) {
  BatchRingOptions o;
  o.name = name;
  o.slot_bytes = 4096;
  o.num_slots = 4;
  o.max_clients = 8;
  o.cuda_register = false;
  o.on_notice = [](const std::string&) {};
  return o;
}

Clock::time_point Soon() { return Clock::now() + milliseconds(50); }

TEST(BatchRingForkTest, AForkedChildThatUsesOrDestroysItsParentsRingChangesNothing) {
  RingGuard g("fork_" + std::to_string(::getpid()));
  auto loader = BatchRing::Open(Small(g.name), RingRole::kLoader);
  auto trainer = BatchRing::Open(Small(g.name), RingRole::kTrainer);
  WritableBatch filling, published;
  ASSERT_EQ(loader->AcquireSlot(&published, Soon()), RingStatus::kOk);
  std::memcpy(published.data.data(), "one", 3);
  ASSERT_EQ(loader->Publish(published.token, 0, 1, 3), RingStatus::kOk);
  ASSERT_EQ(loader->AcquireSlot(&filling, Soon()), RingStatus::kOk);
  const std::string segment = BatchRingSegmentPath(g.name);
  const int parent = ::getpid();
  EXPECT_EQ(InChild([&]() -> std::string {
              std::string bad;
              WritableBatch w;
              ReadyBatch r;
              if (loader->AcquireSlot(&w, Soon()) != RingStatus::kForked) bad += "AcquireSlot; ";
              if (loader->Publish(filling.token, 0, 1, 3) != RingStatus::kForked)
                bad += "Publish; ";
              if (loader->Abandon(filling.token) != RingStatus::kForked) bad += "Abandon; ";
              if (trainer->Pop(BatchRing::kAllEpochs, &r, Soon()) != RingStatus::kForked)
                bad += "Pop; ";
              if (trainer->Release(published.token) != RingStatus::kForked) bad += "Release; ";
              if (trainer->RecoverDeadClients() != 0) bad += "RecoverDeadClients; ";
              try {
                trainer->Stats();
                bad += "Stats did not throw; ";
              } catch (const Error& e) {
                const std::string want =
                    "batch ring '" + g.name + "' was opened by process " + std::to_string(parent);
                if (std::string(e.what()).find(want) == std::string::npos)
                  bad += std::string("Stats: ") + e.what() + "; ";
              }
              trainer->Close();  // must not end the parent's epochs
              loader.reset();
              trainer.reset();
              return bad;
            }),
            "");
  ASSERT_EQ(::access(segment.c_str(), F_OK), 0) << "the child removed the parent's ring";
  BatchRingStats st = trainer->Stats();
  EXPECT_FALSE(st.closed) << "the child closed the parent's ring";
  EXPECT_EQ(st.filling, 1u) << "the child's exit took the parent's slot";
  EXPECT_EQ(st.ready, 1u);
  int alive = 0;
  for (const RingClientStats& c : st.clients) alive += c.alive;
  EXPECT_EQ(alive, 2) << "the child released the parent's client slots";
  ReadyBatch r;
  ASSERT_EQ(trainer->Pop(BatchRing::kAllEpochs, &r, Soon()), RingStatus::kOk);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(r.data.data()), r.data.size()), "one");
  EXPECT_EQ(trainer->Release(r.token), RingStatus::kOk);
  EXPECT_EQ(loader->Publish(filling.token, 0, 1, 0), RingStatus::kOk);
  ASSERT_EQ(trainer->Pop(BatchRing::kAllEpochs, &r, Soon()), RingStatus::kOk);
  EXPECT_EQ(trainer->Release(r.token), RingStatus::kOk);
  trainer->Close();
  EXPECT_EQ(trainer->Pop(BatchRing::kAllEpochs, &r, Soon()), RingStatus::kEnd);
}

TEST(BatchRingForkTest, EveryRingStatusHasAName) {
  EXPECT_STREQ(RingStatusName(RingStatus::kCorrupt), "corrupt");
  EXPECT_STREQ(RingStatusName(RingStatus::kInvalid), "invalid");
  EXPECT_STREQ(RingStatusName(RingStatus::kForked), "forked");
  for (int s = 0; s <= static_cast<int>(RingStatus::kForked); ++s)
    EXPECT_STRNE(RingStatusName(static_cast<RingStatus>(s)), "?") << s;
}

}  // namespace
}  // namespace tailcut
