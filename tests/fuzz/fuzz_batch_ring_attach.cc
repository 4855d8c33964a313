// Fuzzes what a process does with a segment it finds under a batch ring's
// name: inspect, attach (validate, recover dead clients), pop, release,
// acquire, publish, stats. The input patches a healthy ring image (a batch
// ready, positions moved on) as records of [u32 offset][u8 length][length
// bytes]; an input starting with 0xFF is written raw instead. Anything may
// fail with tailcut::Error or a status; nothing may crash, hang or touch
// memory outside the segment.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tailcut/batch_ring.h"

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
  int fd = ::open(tailcut::BatchRingSegmentPath(name).c_str(), O_RDONLY);
  off_t size = ::lseek(fd, 0, SEEK_END);
  g_template.resize(static_cast<size_t>(size));
  if (::pread(fd, g_template.data(), g_template.size(), 0) != size) std::abort();
  ::close(fd);
  tailcut::RemoveBatchRing(name);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static bool initialised = (Init(), true);
  (void)initialised;
  std::string image;
  if (size > 0 && data[0] == 0xFF) {
    image.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  } else {
    image = g_template;
    size_t pos = 0;
    while (pos + 5 <= size) {
      uint32_t offset;
      std::memcpy(&offset, data + pos, 4);
      size_t len = data[pos + 4];
      pos += 5;
      len = std::min(len, size - pos);
      offset %= static_cast<uint32_t>(image.size());
      len = std::min(len, image.size() - offset);
      std::memcpy(image.data() + offset, data + pos, len);
      pos += len;
    }
  }
  std::string name = "fuzz-" + std::to_string(::getpid());
  std::string path = tailcut::BatchRingSegmentPath(name);
  int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
  if (fd < 0 || ::write(fd, image.data(), image.size()) != static_cast<ssize_t>(image.size()))
    std::abort();
  ::close(fd);
  try {
    tailcut::InspectBatchRing(name);
  } catch (const tailcut::Error&) {
  }
  try {
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
  } catch (const tailcut::Error&) {
  }
  ::unlink(path.c_str());
  return 0;
}
