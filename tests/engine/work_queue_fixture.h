// tests/engine/work_queue_fixture.h: the fixture of the WorkQueueTest suites
// (work_queue_test.cc, work_queue_order_test.cc, work_queue_bad_input_test.cc,
// work_queue_checkpoint_test.cc, work_queue_lifetime_test.cc): queue options
// under a fresh guarded name, a queue run start to end in this process, and
// a segment image written under a queue's name.
#ifndef TAILCUT_TESTS_ENGINE_WORK_QUEUE_FIXTURE_H_
#define TAILCUT_TESTS_ENGINE_WORK_QUEUE_FIXTURE_H_

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tailcut/work_queue.h"
#include "tests/engine/queue_fixture.h"

namespace tailcut::test {

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

// Writes a segment image (e.g. a damaged copy of a real one) at path.
inline void WriteSegment(const std::string& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0) << ErrnoText("open") << " " << path;
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(bytes.size())), 0);
  ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

}  // namespace tailcut::test

#endif  // TAILCUT_TESTS_ENGINE_WORK_QUEUE_FIXTURE_H_
