// tests/tools/hold_ring.cc: a batch ring client for the CLI test.
//
//   hold_ring NAME loader PUBLISH          publishes PUBLISH batches of epoch 0
//   hold_ring NAME trainer POP [--wait]    pops POP batches and keeps them;
//                                          with --wait, then waits in Pop for
//                                          more (a starving trainer)
//
// Opens the ring NAME (4 slots of 64 KiB), does the above, prints
// "ready <pid>" on stdout and holds the ring until stdin reaches end of file
// (then closes the ring, which the last client removes, and exits 0) or the
// process is killed.

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "tailcut/batch_ring.h"
#include "tailcut/error.h"

int main(int argc, char** argv) {
  const bool wait = argc == 5 && std::strcmp(argv[4], "--wait") == 0;
  if ((argc != 4 && !wait) ||
      (std::strcmp(argv[2], "loader") != 0 && std::strcmp(argv[2], "trainer") != 0)) {
    std::cerr << "usage: hold_ring NAME loader|trainer COUNT [--wait]\n";
    return 2;
  }
  const bool loader = std::strcmp(argv[2], "loader") == 0;
  const uint64_t count = std::strtoull(argv[3], nullptr, 10);
  try {
    tailcut::BatchRingOptions options;
    options.name = argv[1];
    options.slot_bytes = 64 << 10;
    options.num_slots = 4;
    auto ring = tailcut::BatchRing::Open(
        options, loader ? tailcut::RingRole::kLoader : tailcut::RingRole::kTrainer);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (uint64_t i = 0; i < count; ++i) {
      tailcut::RingStatus status;
      if (loader) {
        tailcut::WritableBatch batch;
        status = ring->AcquireSlot(&batch, deadline);
        if (status == tailcut::RingStatus::kOk) {
          std::memset(batch.data.data(), static_cast<int>(i), 1024);
          status = ring->Publish(batch.token, 0, 8, 1024);
        }
      } else {
        tailcut::ReadyBatch batch;
        status = ring->Pop(tailcut::BatchRing::kAllEpochs, &batch, deadline);
      }
      if (status != tailcut::RingStatus::kOk) {
        std::cerr << "hold_ring: " << tailcut::RingStatusName(status) << '\n';
        return 1;
      }
    }
    // Pops on (and keeps what it gets) until the ring is closed below.
    std::thread waiter;
    if (wait && !loader) {
      waiter = std::thread([&ring] {
        tailcut::ReadyBatch batch;
        while (ring->Pop(tailcut::BatchRing::kAllEpochs, &batch,
                         std::chrono::steady_clock::time_point::max()) ==
               tailcut::RingStatus::kOk) {
        }
      });
    }
    std::cout << "ready " << ::getpid() << std::endl;
    std::string line;
    while (std::getline(std::cin, line)) {
    }
    ring->Close();
    if (waiter.joinable()) waiter.join();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "hold_ring: " << e.what() << '\n';
    return 1;
  }
}
