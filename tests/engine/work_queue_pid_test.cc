// Pid reuse: liveness never trusts pids. A client is killed, and before
// anyone notices, the pid recorded in its slot is made the pid of a live
// process (as if the kernel had reused it). Its item must still come back.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "engine/segment_layout.h"
#include "tailcut/work_queue.h"

namespace tailcut {
namespace {

TEST(PidReuseTest, ADeadClientWhosePidNowBelongsToALiveProcessIsStillRecovered) {
  char tmpl[] = "/tmp/tailcut-pid-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  std::string work = dir + "/w";
  int wfd = ::open(work.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
  ASSERT_EQ(::ftruncate(wfd, 1 << 20), 0);
  ::close(wfd);
  WorkQueueOptions o;
  o.works = {work};
  o.num_slices = 4;
  o.name = "pid_reuse_" + std::to_string(::getpid());
  o.max_clients = 4;
  o.on_notice = [](const std::string&) {};

  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t victim = ::fork();
  if (victim == 0) {
    auto q = WorkQueue::Open(o);
    WorkItem it;
    if (q->TryTake(&it) != TakeStatus::kOk) std::_Exit(2);
    char c = 1;
    if (::write(ready[1], &c, 1) != 1) std::_Exit(3);
    ::pause();  // holds its item until killed
    std::_Exit(0);
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  ASSERT_EQ(::waitpid(victim, nullptr, 0), victim);

  // Rewrite the victim's recorded pid to ours, a live process.
  std::string path = SegmentPath(o.name);
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  struct stat st;
  ASSERT_EQ(::fstat(fd, &st), 0);
  void* p = ::mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  auto* h = static_cast<detail::Header*>(p);
  detail::Geometry g = detail::ComputeGeometry(h->num_files, h->num_items, h->total_tickets,
                                               h->path_bytes, h->max_clients, h->leases_per_client);
  ASSERT_EQ(g.total, static_cast<size_t>(st.st_size));
  auto* clients = reinterpret_cast<detail::ClientEntry*>(static_cast<char*>(p) + g.clients);
  int forged = 0;
  for (uint32_t s = 0; s < g.max_clients; ++s) {
    if (clients[s].pid.load() == victim) {
      clients[s].pid.store(::getpid());
      ++forged;
    }
  }
  ::munmap(p, st.st_size);
  ::close(fd);
  ASSERT_EQ(forged, 1);

  auto q = WorkQueue::Open(o);
  int taken = 0;
  WorkItem it;
  while (q->Take(&it, std::chrono::steady_clock::now() + std::chrono::seconds(10)) ==
         TakeStatus::kOk) {
    ++taken;
    ASSERT_EQ(q->Ack(it), ItemStatus::kOk);
  }
  EXPECT_EQ(taken, 4) << "the dead client's item must come back despite its pid being alive";
  QueueStats s = q->Stats();
  EXPECT_EQ(s.done, 4u);
  EXPECT_GE(s.recovered_items, 1u);
  q->Close();
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace tailcut
