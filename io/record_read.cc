// ReadRecords: records of a RecordFiles read in any order, sorted and
// coalesced into few reads (see tailcut/record_index.h).
//
// Why pread into a staging buffer rather than the Reader's io_uring: a batch
// of a global shuffle is a few hundred small reads scattered over the data
// set, issued once per batch; with the page cache hot, a pread is a copy, and
// the cost is the number of system calls, which coalescing cuts. Reads of
// different files run in parallel (tbb) when threads > 1, which keeps
// several requests in flight on a cold disk.
#include <fcntl.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "tailcut/crc32c.h"
#include "tailcut/record_index.h"
#include "tailcut/work_file.h"

namespace tailcut {

namespace {

constexpr uint64_t kTfrecordHeader = 12;  // u64 length, u32 masked CRC of it
constexpr uint64_t kTfrecordFooter = 4;   // u32 masked CRC of the data

struct Want {
  size_t file;
  uint64_t begin, end;  // the bytes to read: the payload, and a TFRecord's CRCs
  uint64_t payload, size;
  size_t order;  // its place in the caller's positions
};

// A run of wants of one file read with one pread: wants[first, last).
struct Run {
  size_t first, last;
};

void ReadRun(const RecordFiles& files, const std::vector<Want>& wants, const Run& run, int fd,
             const std::vector<uint64_t>& out_at, char* out) {
  const Want& head = wants[run.first];
  const RecordIndex& index = files.file(head.file);
  uint64_t end = 0;
  for (size_t k = run.first; k < run.last; ++k) end = std::max(end, wants[k].end);
  std::string staging(end - head.begin, '\0');
  size_t got = 0;
  while (got < staging.size()) {
    ssize_t n = ::pread(fd, staging.data() + got, staging.size() - got,
                        static_cast<off_t>(head.begin + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw Error(ErrorKindOfErrno(errno), "record file '" + Printable(index.path) +
                                               "' at offset " + std::to_string(head.begin + got) +
                                               ": read failed: " + std::strerror(errno));
    if (n == 0)
      throw Error(ErrorKind::kIo, "record file '" + Printable(index.path) + "' at offset " +
                                      std::to_string(head.begin + got) +
                                      ": the file ends there; it was truncated since it was "
                                      "indexed (restore it, or index it again)");
    got += static_cast<size_t>(n);
  }
  const bool tfrecord = index.format.kind == RecordFormatKind::kTfrecord;
  for (size_t k = run.first; k < run.last; ++k) {
    const Want& w = wants[k];
    const char* payload = staging.data() + (w.payload - head.begin);
    if (tfrecord) {
      uint32_t stored;
      std::memcpy(&stored, payload + w.size, 4);
      if (MaskCrc32c(Crc32c(payload, w.size)) != stored)
        throw Error(ErrorKind::kCorrupt,
                    "tfrecord file '" + Printable(index.path) + "' at offset " +
                        std::to_string(w.begin) +
                        ": data CRC mismatch (the file changed or decayed since it was "
                        "indexed)");
    }
    std::memcpy(out + out_at[w.order], payload, w.size);
  }
}

}  // namespace

void ReadRecords(const RecordFiles& files, const std::vector<uint64_t>& positions,
                 std::string* data, std::vector<uint64_t>* ends, size_t threads, uint64_t max_gap) {
  std::vector<Want> wants(positions.size());
  std::vector<uint64_t> out_at(positions.size());
  uint64_t total = 0;
  for (size_t k = 0; k < positions.size(); ++k) {
    const uint64_t r = positions[k];
    if (r >= files.size())
      throw Error(ErrorKind::kInvalidArgument, "record " + std::to_string(r) +
                                                   " is out of range: the files hold " +
                                                   std::to_string(files.size()) + " records");
    size_t f;
    uint64_t i;
    files.Locate(r, &f, &i);
    const RecordIndex& index = files.file(f);
    Want& w = wants[k];
    w.file = f;
    w.payload = index.Offset(i);
    w.size = index.Size(i);
    w.begin = w.payload;
    w.end = w.payload + w.size;
    if (index.format.kind == RecordFormatKind::kTfrecord) {
      w.begin -= kTfrecordHeader;
      w.end += kTfrecordFooter;
    }
    w.order = k;
    out_at[k] = total;
    total += w.size;
  }
  const size_t base = data->size();
  data->resize(base + total);
  ends->reserve(ends->size() + positions.size());
  for (size_t k = 0; k < positions.size(); ++k) ends->push_back(base + out_at[k] + wants[k].size);
  for (uint64_t& at : out_at) at += base;

  std::sort(wants.begin(), wants.end(), [](const Want& a, const Want& b) {
    return a.file != b.file ? a.file < b.file : a.begin < b.begin;
  });
  std::vector<Run> runs;
  uint64_t run_end = 0;  // the end of the last run's bytes
  for (size_t k = 0; k < wants.size(); ++k) {
    if (!runs.empty() && wants[k - 1].file == wants[k].file &&
        wants[k].begin <= run_end + max_gap) {
      runs.back().last = k + 1;
      run_end = std::max(run_end, wants[k].end);
      continue;
    }
    runs.push_back(Run{k, k + 1});
    run_end = wants[k].end;
  }
  // The files to open, each once, checked as a queue's reader checks them.
  std::vector<size_t> file_of_run(runs.size());
  std::vector<int> fds(files.num_files(), -1);
  struct Closer {
    std::vector<int>* fds;
    ~Closer() {
      for (int fd : *fds)
        if (fd >= 0) ::close(fd);
    }
  } closer{&fds};
  for (size_t k = 0; k < runs.size(); ++k) {
    const size_t f = wants[runs[k].first].file;
    file_of_run[k] = f;
    if (fds[f] >= 0) continue;
    const RecordIndex& index = files.file(f);
    WorkFile file = OpenWorkFile(index.path, &index.identity);
    if (file.fd < 0) throw Error(file.kind, file.error);
    fds[f] = file.fd;
  }
  char* out = data->data();
  if (threads <= 1 || runs.size() < 2) {
    for (size_t k = 0; k < runs.size(); ++k)
      ReadRun(files, wants, runs[k], fds[file_of_run[k]], out_at, out);
    return;
  }
  // No more threads than the machine has: oneTBB warns, and they would only take turns.
  tbb::task_arena arena(std::min(static_cast<int>(threads), tbb::info::default_concurrency()));
  arena.execute([&] {
    tbb::parallel_for(size_t{0}, runs.size(), [&](size_t k) {
      ReadRun(files, wants, runs[k], fds[file_of_run[k]], out_at, out);
    });
  });
}

}  // namespace tailcut
