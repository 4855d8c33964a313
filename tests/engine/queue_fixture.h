// tests/engine/queue_fixture.h: queues for tests: names no other test or run
// can collide with, a guard that force-removes a queue when a test ends, the
// QueueTest fixture, error and item checks (FailsWith, CheckItem), Drain, the
// item table of a configuration, and the cleaner of segments a failed test
// binary left in /dev/shm.
#ifndef TAILCUT_TESTS_ENGINE_QUEUE_FIXTURE_H_
#define TAILCUT_TESTS_ENGINE_QUEUE_FIXTURE_H_

#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tailcut/error.h"
#include "tailcut/work_queue.h"
#include "tests/engine/temp_dir.h"
#include "tests/engine/test_basics.h"

namespace tailcut::test {

// A name unique to this process and call, e.g. "tctest_1234_7_order".
inline std::string UniqueQueueName(std::string_view tag) {
  static std::atomic<uint64_t> counter{0};
  return "tctest_" + std::to_string(::getpid()) + "_" + std::to_string(counter.fetch_add(1)) + "_" +
         std::string(tag);
}

// Force-removes the queue when the test ends (kNotFound is fine).
class QueueGuard {
 public:
  explicit QueueGuard(std::string name) : name_(std::move(name)) {}
  ~QueueGuard() {
    try {
      RemoveQueue(name_, /*force=*/true);
    } catch (const Error&) {
    }
  }
  QueueGuard(const QueueGuard&) = delete;
  QueueGuard& operator=(const QueueGuard&) = delete;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

// Options every test starts from: quiet notices unless a test captures them.
inline WorkQueueOptions BaseOptions(const std::string& name, std::vector<std::string> works) {
  WorkQueueOptions o;
  o.name = name;
  o.works = std::move(works);
  o.on_notice = [](const std::string&) {};
  return o;
}

// The fixture the engine suites share: a temporary directory for work files
// and fresh queue names that are force-removed when the test ends.
class QueueTest : public ::testing::Test {
 protected:
  std::string NewName(std::string_view tag) {
    std::string n = UniqueQueueName(tag);
    guards_.push_back(std::make_unique<QueueGuard>(n));
    return n;
  }
  TempDir dir_;
  std::vector<std::unique_ptr<QueueGuard>> guards_;
};

// Succeeds if f throws a tailcut::Error of `kind` whose message contains every
// needle; the failure message shows what happened instead.
inline ::testing::AssertionResult FailsWith(const std::function<void()>& f, ErrorKind kind,
                                            const std::vector<std::string>& needles = {}) {
  try {
    f();
  } catch (const tailcut::Error& e) {
    if (e.kind() != kind) {
      return ::testing::AssertionFailure()
             << "threw kind '" << ErrorKindName(e.kind()) << "' instead of '" << ErrorKindName(kind)
             << "': " << e.what();
    }
    for (const std::string& n : needles) {
      if (!Contains(e.what(), n)) {
        return ::testing::AssertionFailure() << "message does not name '" << n << "': " << e.what();
      }
    }
    return ::testing::AssertionSuccess() << e.what();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-tailcut exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw (expected " << ErrorKindName(kind) << ")";
}

inline const char* StatusName(TakeStatus s) { return TakeStatusName(s); }
inline const char* StatusName(ItemStatus s) { return ItemStatusName(s); }

inline std::string CheckItem(const WorkQueue& q, const WorkItem& it) {
  std::ostringstream out;
  const uint64_t n = q.num_items();
  if (n == 0) return "queue has no items but handed one out";
  if (it.epoch >= q.num_epochs()) {
    out << "epoch " << it.epoch << " >= num_epochs " << q.num_epochs();
  } else if (it.ticket / n != it.epoch) {
    out << "ticket " << it.ticket << " is not in epoch " << it.epoch << " (num_items " << n << ")";
  } else if (it.index >= n) {
    out << "index " << it.index << " >= num_items " << n;
  } else if (q.ItemAt(it.epoch, it.ticket % n) != it.index) {
    out << "ticket " << it.ticket << " maps to item " << q.ItemAt(it.epoch, it.ticket % n)
        << " but the item says index " << it.index;
  } else {
    const WorkQueue::Item& ref = q.items()[it.index];
    if (it.file != ref.file) {
      out << "item " << it.index << " file " << it.file << " != table file " << ref.file;
    } else if (it.file >= q.paths().size() || it.path != q.paths()[it.file]) {
      out << "item " << it.index << " path '" << it.path << "' is not paths()[" << it.file << "]";
    } else if (it.begin < ref.begin || it.begin > it.end || it.end > ref.end) {
      // Any part of the item: a restored item resumes at its progress, a
      // split moves an anchor's end down and a piece covers part of a tail.
      out << "item " << it.index << " range [" << it.begin << "," << it.end
          << ") does not fit table range [" << ref.begin << "," << ref.end << ")";
    }
  }
  return out.str();
}

// Takes and acks until kEnd, with a deadline per Take. Returns the items in
// the order taken. Fails the test on kTimeout (a hang) or a bad item/ack.
inline std::vector<WorkItem> Drain(WorkQueue& q, milliseconds per_take = milliseconds(20000)) {
  std::vector<WorkItem> got;
  for (;;) {
    WorkItem it;
    const TakeStatus st = q.Take(&it, Clock::now() + per_take);
    if (st == TakeStatus::kEnd) break;
    if (st != TakeStatus::kOk) {
      ADD_FAILURE() << "Take returned " << StatusName(st) << " (deadline " << per_take.count()
                    << " ms) in Drain, " << got.size() << " items in";
      break;
    }
    const std::string bad = CheckItem(q, it);
    EXPECT_EQ(bad, "");
    const ItemStatus a = q.Ack(it);
    EXPECT_EQ(a, ItemStatus::kOk) << "ack of ticket " << it.ticket;
    got.push_back(it);
  }
  return got;
}

// The item table a configuration gives, from a throwaway queue of the same
// works and slicing (opened and removed here).
inline std::vector<WorkQueue::Item> ItemTable(const std::vector<std::string>& works,
                                              std::optional<uint64_t> num_slices,
                                              const std::string& prefix = "") {
  auto o = BaseOptions(UniqueQueueName("probe"), works);
  o.num_slices = num_slices;
  o.prefix = prefix;
  o.shuffle = false;
  QueueGuard guard(o.name);
  auto q = WorkQueue::Open(o);
  std::vector<WorkQueue::Item> items = q->items();
  q->Close();
  return items;
}

// Removes segments this test binary left in /dev/shm (a test that failed
// half-way, a child killed before its guard ran).
class LeftoverSegmentCleaner : public ::testing::Environment {
 public:
  void TearDown() override {
    const std::string mark = ".tctest_" + std::to_string(::getpid()) + "_";
    DIR* d = ::opendir("/dev/shm");
    if (d == nullptr) return;
    std::vector<std::string> found;
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind("tailcut.", 0) == 0 && Contains(n, mark)) found.push_back(n);
    }
    ::closedir(d);
    for (const std::string& n : found) ::unlink(("/dev/shm/" + n).c_str());
  }
};

inline ::testing::Environment* const kLeftoverSegmentCleaner =
    ::testing::AddGlobalTestEnvironment(new LeftoverSegmentCleaner);

}  // namespace tailcut::test

#endif  // TAILCUT_TESTS_ENGINE_QUEUE_FIXTURE_H_
