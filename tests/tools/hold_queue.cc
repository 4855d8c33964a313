// tests/tools/hold_queue.cc: a queue client for the CLI test.
//
//   hold_queue NAME DIR [--take N] [--ack M] [--records R]
//
// Writes three small work files into DIR (if they are not there yet), opens
// the queue NAME over them (16 slices, 2 epochs, fixed seed), takes N items
// (default 3) and acks the first M of them (default 2), reports R records
// read of the first item it did not ack (as a reader that shuffles does
// before it acks anything), prints
// "ready <pid>" on stdout, and then holds the queue until stdin reaches end
// of file (it then closes the queue and exits 0) or the process is killed.
// Several holders of the same NAME and DIR join the same queue.

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "tailcut/error.h"
#include "tailcut/work_queue.h"

namespace {

constexpr uint64_t kFileSizes[] = {3000, 5000, 8000};

// Writes DIR/part-K with kFileSizes[K] bytes unless it exists with that size.
// Through a temporary name and a link, so a second holder never sees a
// half-written file nor replaces one.
std::vector<std::string> MakeWorks(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  std::vector<std::string> works;
  for (size_t k = 0; k < std::size(kFileSizes); ++k) {
    const std::filesystem::path path = dir / ("part-" + std::to_string(k));
    std::error_code error;
    if (std::filesystem::file_size(path, error) != kFileSizes[k] || error) {
      const std::filesystem::path temporary = path.string() + ".tmp." + std::to_string(::getpid());
      {
        std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
        for (uint64_t i = 0; i < kFileSizes[k]; ++i) out.put(static_cast<char>('a' + i % 26));
        if (!out) throw std::runtime_error("cannot write " + temporary.string());
      }
      // link, not rename: the first holder's file stays. Replacing it would
      // change the file's identity under a queue another holder made.
      if (::link(temporary.c_str(), path.c_str()) != 0 && errno != EEXIST)
        throw std::runtime_error("cannot link " + path.string() + ": " + std::strerror(errno));
      std::filesystem::remove(temporary);
    }
    works.push_back(path.string());
  }
  return works;
}

int Usage() {
  std::cerr << "usage: hold_queue NAME DIR [--take N] [--ack M] [--records R]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return Usage();
  const std::string name = argv[1];
  const std::string dir = argv[2];
  uint64_t take = 3;
  uint64_t ack = 2;
  uint64_t records = 0;
  for (int i = 3; i < argc; ++i) {
    const std::string flag = argv[i];
    if ((flag == "--take" || flag == "--ack" || flag == "--records") && i + 1 < argc) {
      (flag == "--take"  ? take
       : flag == "--ack" ? ack
                         : records) = std::strtoull(argv[++i], nullptr, 10);
    } else {
      return Usage();
    }
  }

  try {
    tailcut::WorkQueueOptions options;
    options.name = name;
    options.works = MakeWorks(dir);
    options.num_slices = 16;
    options.num_epochs = 2;
    options.seed = 7;
    options.num_clients = 1;
    std::unique_ptr<tailcut::WorkQueue> queue = tailcut::WorkQueue::Open(options);

    std::vector<tailcut::WorkItem> items;
    for (uint64_t i = 0; i < take; ++i) {
      tailcut::WorkItem item;
      const tailcut::TakeStatus status =
          queue->Take(&item, std::chrono::steady_clock::now() + std::chrono::seconds(5));
      if (status != tailcut::TakeStatus::kOk) {
        std::cerr << "hold_queue: take " << i << " found no item\n";
        return 1;
      }
      items.push_back(item);
    }
    for (uint64_t i = 0; i < ack && i < items.size(); ++i) {
      if (queue->Ack(items[i]) != tailcut::ItemStatus::kOk) {
        std::cerr << "hold_queue: ack " << i << " was refused\n";
        return 1;
      }
    }

    if (records > 0 && ack < items.size() &&
        queue->Progress(items[ack], items[ack].begin, records) != tailcut::ItemStatus::kOk) {
      std::cerr << "hold_queue: progress was refused\n";
      return 1;
    }

    std::printf("ready %d\n", static_cast<int>(::getpid()));
    std::fflush(stdout);

    // Hold until stdin closes.
    char buffer[256];
    for (;;) {
      const ssize_t n = ::read(STDIN_FILENO, buffer, sizeof buffer);
      if (n == 0) break;
      if (n < 0 && errno != EINTR) {
        std::cerr << "hold_queue: read stdin: " << std::strerror(errno) << '\n';
        break;
      }
    }
    queue->Close();
    return 0;
  } catch (const tailcut::Error& e) {
    std::cerr << "hold_queue: " << e.what() << '\n';
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "hold_queue: " << e.what() << '\n';
    return 1;
  }
}
