// Fuzzes what a process does with a segment it finds under a queue's name:
// attach, validate, inspect, recover dead clients, take and ack. The input
// patches a valid segment image (fuzz_attach.h says how). Anything may fail
// with tailcut::Error; nothing may crash, hang or touch memory outside the
// segment. A queue that opens is drained to its end under a bound: a Take
// that finds nothing while no other client is registered is a hang (a damaged
// lease nobody can finish once made every Take wait for ever), and aborts.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "tailcut/work_queue.h"
#include "tests/fuzz/fuzz_attach.h"

namespace {

std::string g_dir;
std::vector<std::string> g_works;
std::string g_template;  // bytes of a healthy segment with live-looking state

tailcut::WorkQueueOptions Options(const std::string& name) {
  tailcut::WorkQueueOptions o;
  o.works = g_works;
  o.num_slices = 7;
  o.num_epochs = 2;
  o.seed = 1;
  o.name = name;
  o.max_clients = 4;
  o.leases_per_client = 2;
  o.attach_timeout = std::chrono::milliseconds(5);
  o.on_notice = [](const std::string&) {};
  return o;
}

void Init() {
  char tmpl[] = "/tmp/tailcut-fuzz-XXXXXX";
  g_dir = ::mkdtemp(tmpl);
  // The work files go when the fuzzer exits (a crash leaves them for the
  // artifact to be replayed against).
  std::atexit([] {
    std::error_code ignored;
    std::filesystem::remove_all(g_dir, ignored);
  });
  for (int i = 0; i < 3; ++i) {
    std::string p = g_dir + "/w" + std::to_string(i);
    int fd = ::open(p.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
    if (::ftruncate(fd, 1000 * (i + 1)) != 0) std::abort();
    ::close(fd);
    g_works.push_back(p);
  }
  // A segment with an open item, a done item and a closed client in it.
  std::string name = "fuzz-template-" + std::to_string(::getpid());
  auto q = tailcut::WorkQueue::Open(Options(name));
  tailcut::WorkItem a, b;
  q->Take(&a);
  q->Take(&b);
  q->Ack(a);
  g_template = tailcut::fuzz::ReadImage(tailcut::SegmentPath(name));
  q->GiveBack(b);
  q.reset();
  try {
    tailcut::RemoveQueue(name, true);
  } catch (const tailcut::Error&) {
  }
}

// Takes and acks until the end, as a job would; aborts on a hang.
void Drain(tailcut::WorkQueue& q) {
  tailcut::WorkItem item;
  // Takes wait in short steps: the template's client looks alive, so most
  // inputs end in the documented wait for its lease, and a 1 s wait per input
  // left the fuzzer at one input a second. A hang is 1 s of empty steps.
  int empty_steps = 0;
  for (int i = 0; i < 1000; ++i) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(10);
    switch (q.Take(&item, deadline)) {
      case tailcut::TakeStatus::kOk:
        q.Ack(item);
        empty_steps = 0;
        continue;
      case tailcut::TakeStatus::kEnd:
        return;
      case tailcut::TakeStatus::kLimit:
        break;
      case tailcut::TakeStatus::kTimeout: {
        // Waiting for items of a registered (live-looking) client is the
        // documented wait, not a hang.
        tailcut::QueueStats st = q.Stats();
        // Counted by slot, not pid: the template's client has our pid.
        int alive = 0;
        for (const auto& c : st.clients) alive += c.alive;
        if (alive > 1) return;
        if (++empty_steps < 100) {
          --i;
          continue;
        }
        std::fprintf(stderr,
                     "hang: Take found nothing for 1 s with no other client (done %llu of %llu, "
                     "%llu in flight)\n",
                     static_cast<unsigned long long>(st.done),
                     static_cast<unsigned long long>(st.total),
                     static_cast<unsigned long long>(st.in_flight));
        std::abort();
      }
    }
    std::fprintf(stderr,
                 "hang: Take says this process holds every lease, yet it acked all it took\n");
    std::abort();
  }
  std::fprintf(stderr, "hang: 1000 takes did not reach the end of 14 tickets\n");
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static bool initialised = (Init(), true);
  (void)initialised;
  const std::string name = "fuzz-" + std::to_string(::getpid());
  tailcut::fuzz::AttachImage(
      tailcut::SegmentPath(name), tailcut::fuzz::PatchedImage(g_template, data, size),
      [&] { tailcut::InspectQueue(name); },
      [&] {
        auto q = tailcut::WorkQueue::Open(Options(name));
        tailcut::WorkItem item;
        for (int i = 0; i < 20 && q->TryTake(&item) == tailcut::TakeStatus::kOk; ++i) {
          if (i % 3 == 0)
            q->GiveBack(item);
          else
            q->Ack(item);
        }
        q->SaveState();
        q->Stats();
        Drain(*q);
      });
  return 0;
}
