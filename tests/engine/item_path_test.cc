// WorkItem::path's debug check (tailcut/item_path.h): a path read after its
// WorkQueue was destroyed aborts with a message, never reads freed memory.
// The check is compiled into code built without NDEBUG, so this file always
// is (the library's own build type does not matter: the check is inline).
#undef NDEBUG

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "engine/queue_test_util.h"
#include "tailcut/work_queue.h"

namespace tailcut::test {
namespace {

constexpr const char* kAfterDestruction = "WorkItem::path read after its WorkQueue was destroyed";

class ItemPathTest : public QueueTest {
 protected:
  std::unique_ptr<WorkQueue> Open(const std::string& tag) {
    WorkQueueOptions o = BaseOptions(NewName(tag), dir_.Files(tag, 2, {4096}));
    return WorkQueue::Open(o);
  }
};

using ItemPathDeathTest = ItemPathTest;

TEST_F(ItemPathDeathTest, AReadAfterTheQueueIsDestroyedAbortsSayingSo) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a queue runs a thread
  auto q = Open("after_destroy");
  WorkItem item;
  ASSERT_EQ(q->TryTake(&item), TakeStatus::kOk);
  ASSERT_EQ(q->Ack(item), AckStatus::kOk);
  const std::string copy(item.path);
  q.reset();
  EXPECT_DEATH((void)std::string(item.path), kAfterDestruction);
  EXPECT_DEATH((void)item.path.size(), kAfterDestruction);
  EXPECT_NE(copy.find("after_destroy"), std::string::npos) << copy;  // the copy stays good
}

TEST_F(ItemPathDeathTest, AnotherQueueInTheFreedSlotDoesNotRevivePaths) {
  // Forked at the statement, not run again from the start: a child that opened
  // the second queue itself and aborted would leave it in /dev/shm.
  GTEST_FLAG_SET(death_test_style, "fast");
  auto q = Open("old");
  WorkItem item;
  ASSERT_EQ(q->TryTake(&item), TakeStatus::kOk);
  ASSERT_EQ(q->Ack(item), AckStatus::kOk);
  q.reset();
  auto next = Open("new");  // most likely in the slot the first one freed
  EXPECT_DEATH((void)item.path.view(), kAfterDestruction);
}

TEST_F(ItemPathTest, PathsReadLikeStringViewsWhileTheQueueLivesClosedOrNot) {
  auto q = Open("alive");
  WorkItem item;
  ASSERT_EQ(q->TryTake(&item), TakeStatus::kOk);
  EXPECT_EQ(item.path, q->paths()[item.file]);
  EXPECT_EQ(std::string_view(item.path), q->paths()[item.file]);
  EXPECT_EQ(item.path.size(), q->paths()[item.file].size());
  ASSERT_EQ(q->Ack(item), AckStatus::kOk);
  q->Close();  // the object lives on: its paths too
  EXPECT_EQ(std::string(item.path), q->paths()[item.file]);
}

TEST_F(ItemPathTest, PathsNotFromAQueueAreNeverChecked) {
  WorkItem none;
  EXPECT_TRUE(none.path.empty());
  const std::string mine = "/data/mine.bin";
  WorkItem own;
  own.path = mine;
  EXPECT_EQ(own.path, "/data/mine.bin");
}

}  // namespace
}  // namespace tailcut::test
