// tiny_trainer QUEUE FILE...: reads every line of its share of FILE... through
// tailcut and prints "<lines> <sum of line lengths>" when the data runs out.
#include <cstdio>
#include <string>
#include <vector>

#include "tailcut/reader.h"
#include "tailcut/work_queue.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: tiny_trainer QUEUE FILE...\n");
    return 2;
  }
  try {
    tailcut::WorkQueueOptions options;
    options.name = argv[1];
    options.works.assign(argv + 2, argv + argc);
    options.num_slices = 12;
    options.num_clients = 3;
    options.seed = 1;
    auto queue = tailcut::WorkQueue::Open(options);
    tailcut::ReaderOptions reader_options;
    reader_options.format = tailcut::RecordFormat::Parse("lines");
    reader_options.buffer_budget_bytes = 1 << 20;
    reader_options.chunk_bytes = 64 << 10;
    auto reader = tailcut::Reader::Open(*queue, reader_options);
    tailcut::Record record;
    unsigned long lines = 0, bytes = 0;
    tailcut::ReadStatus status;
    while ((status = reader->NextRecord(&record)) == tailcut::ReadStatus::kOk) {
      ++lines;
      bytes += record.size;
    }
    if (status == tailcut::ReadStatus::kError) {
      std::fprintf(stderr, "tiny_trainer: %s\n", reader->error().c_str());
      return 1;
    }
    reader.reset();
    queue->Close();
    std::printf("%lu %lu\n", lines, bytes);
    return 0;
  } catch (const tailcut::Error& e) {
    std::fprintf(stderr, "tiny_trainer: %s\n", e.what());
    return 1;
  }
}
