// Fuzzes what a process does with a segment it finds under a batch ring's
// name: inspect, attach (validate, recover dead clients), pop, release,
// acquire, publish, stats. The input patches a healthy ring image (a batch
// ready, positions moved on; fuzz_attach.h says how). Anything may fail with
// tailcut::Error or a status; nothing may crash, hang or touch memory outside
// the segment.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tailcut/batch_ring.h"
#include "tests/fuzz/fuzz_attach.h"

namespace {

std::string g_template;

tailcut::BatchRingOptions Options(const std::string& name) {
  tailcut::BatchRingOptions o;
  o.name = name;
  o.slot_bytes = 256;
  o.num_slots = 3;
  o.max_clients = 4;
  o.attach_timeout = std::chrono::milliseconds(5);
  return o;
}

void Init() {
  std::string name = "fuzz-template-" + std::to_string(::getpid());
  tailcut::RemoveBatchRing(name);
  {
    auto loader = tailcut::BatchRing::Open(Options(name), tailcut::RingRole::kLoader);
    auto trainer = tailcut::BatchRing::Open(Options(name), tailcut::RingRole::kTrainer);
    auto soon = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    for (int i = 0; i < 5; ++i) {  // move the positions on
      tailcut::WritableBatch w;
      tailcut::ReadyBatch r;
      if (loader->AcquireSlot(&w, soon) != tailcut::RingStatus::kOk ||
          loader->Publish(w.token, 0, i, 16) != tailcut::RingStatus::kOk ||
          trainer->Pop(0, &r, soon) != tailcut::RingStatus::kOk ||
          trainer->Release(r.token) != tailcut::RingStatus::kOk)
        std::abort();
    }
    tailcut::WritableBatch w;
    if (loader->AcquireSlot(&w, soon) != tailcut::RingStatus::kOk ||
        loader->Publish(w.token, 1, 9, 32) != tailcut::RingStatus::kOk)
      std::abort();
  }  // not closed: the segment stays, one batch READY
  g_template = tailcut::fuzz::ReadImage(tailcut::BatchRingSegmentPath(name));
  tailcut::RemoveBatchRing(name);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static bool initialised = (Init(), true);
  (void)initialised;
  const std::string name = "fuzz-" + std::to_string(::getpid());
  tailcut::fuzz::AttachImage(
      tailcut::BatchRingSegmentPath(name), tailcut::fuzz::PatchedImage(g_template, data, size),
      [&] { tailcut::InspectBatchRing(name); },
      [&] {
        auto trainer = tailcut::BatchRing::Open(Options(name), tailcut::RingRole::kTrainer);
        auto loader = tailcut::BatchRing::Open(Options(name), tailcut::RingRole::kLoader);
        auto now = std::chrono::steady_clock::now();
        for (int i = 0; i < 4; ++i) {
          tailcut::ReadyBatch r;
          if (trainer->Pop(tailcut::BatchRing::kAllEpochs, &r, now) == tailcut::RingStatus::kOk) {
            // Touch every byte handed out: a span past the slot would fault here.
            unsigned sum = 0;
            for (std::byte b : r.data) sum += static_cast<unsigned>(b);
            for (std::byte b : r.user_header) sum += static_cast<unsigned>(b);
            if (sum == 0xFFFFFFFFu) std::abort();
            trainer->Release(r.token);
          }
          tailcut::WritableBatch w;
          if (loader->AcquireSlot(&w, now) == tailcut::RingStatus::kOk) {
            std::memset(w.data.data(), 1, w.data.size());
            std::memset(w.user_header.data(), 2, w.user_header.size());
            loader->Publish(w.token, 2, 1, w.data.size());
          }
        }
        trainer->Stats();
      });
  return 0;
}
