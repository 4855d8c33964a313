// record_read_bench: ReadRecords' paths (tailcut/record_index.h) on a cold
// and a hot page cache, for run_record_read_bench.sh (which adds fio).
//
// One file of fixed-size records; the same random records (no repeats) are
// read in batches of --batch by each path, --reps times, and the median
// records/s printed with its ratio to the mapping's, measured in the same
// run: cold (the file's pages evicted before each rep with
// POSIX_FADV_DONTNEED, checked with mincore) and hot (every page cached and,
// for the mapping, mapped by a first untimed pass, as in a long job).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tailcut/record_index.h"

namespace {

const char kUsage[] = R"(usage:
  record_read_bench --generate SIZE --file PATH
  record_read_bench --file PATH --record-bytes N [--records R] [--batch B]
                    [--depth D] [--reps K]

Reads R random records (default 20000) of PATH, a file of fixed-size records
of N bytes, in batches of B (default 256) with each ReadRecords path, and
prints one line per case:
  case=uring_cold records_s=... ratio=... resident_before=...%
ratio: records/s over the mapping's, cold over map_cold, hot over map_hot.
Cases: map_cold, uring_cold, uring_direct_cold, pread_cold (2 threads),
map_hot, uring_hot, pread_hot.
--depth: io_uring reads in flight (default 64); --reps: runs per case (default 3).
)";

uint64_t ParseSize(const char* text) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  uint64_t unit = 1;
  if (end && (*end == 'K' || *end == 'k')) unit = 1ull << 10;
  if (end && (*end == 'M' || *end == 'm')) unit = 1ull << 20;
  if (end && (*end == 'G' || *end == 'g')) unit = 1ull << 30;
  return static_cast<uint64_t>(v * static_cast<double>(unit));
}

int Generate(const std::string& path, uint64_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    std::perror(path.c_str());
    return 1;
  }
  std::mt19937_64 rng(1);
  std::vector<uint64_t> block(1 << 17);  // 1 MiB
  for (uint64_t done = 0; done < size;) {
    for (uint64_t& w : block) w = rng();
    const uint64_t n = std::min<uint64_t>(size - done, block.size() * 8);
    if (std::fwrite(block.data(), 1, n, f) != n) {
      std::perror(path.c_str());
      return 1;
    }
    done += n;
  }
  std::fclose(f);
  return 0;
}

// Evicts the file's pages from the page cache and returns the share of its
// pages still resident (mincore of a fresh mapping), in percent.
double Evict(const std::string& path, bool evict) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {};
  ::fstat(fd, &st);
  if (evict) {
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return -1;
  std::vector<unsigned char> in((size + 4095) / 4096);
  ::mincore(map, size, in.data());
  ::munmap(map, size);
  size_t resident = 0;
  for (unsigned char c : in) resident += c & 1;
  return 100.0 * static_cast<double>(resident) / static_cast<double>(in.size());
}

void Warm(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  std::vector<char> buf(1 << 20);
  while (::read(fd, buf.data(), buf.size()) > 0) {
  }
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  std::string file;
  uint64_t generate = 0, record_bytes = 0, records = 20000, batch = 256, reps = 3;
  uint32_t depth = 64;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (!v) {
      std::fputs(kUsage, stderr);
      return 2;
    }
    ++i;
    if (a == "--file") {
      file = v;
    } else if (a == "--generate") {
      generate = ParseSize(v);
    } else if (a == "--record-bytes") {
      record_bytes = ParseSize(v);
    } else if (a == "--records") {
      records = ParseSize(v);
    } else if (a == "--batch") {
      batch = ParseSize(v);
    } else if (a == "--depth") {
      depth = static_cast<uint32_t>(ParseSize(v));
    } else if (a == "--reps") {
      reps = ParseSize(v);
    } else {
      std::fputs(kUsage, stderr);
      return 2;
    }
  }
  if (file.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  if (generate) return Generate(file, generate);
  if (record_bytes == 0 || batch == 0 || reps == 0) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const tailcut::RecordFormat format = tailcut::RecordFormat::Parse("fixed", record_bytes);
  uint64_t total = tailcut::RecordFiles::Build({file}, format, {})->size();
  records = std::min(records, total);
  // The same records for every case: a seeded draw without repeats.
  std::vector<uint64_t> positions;
  {
    std::mt19937_64 rng(7);
    std::vector<uint64_t> all(total);
    std::iota(all.begin(), all.end(), 0);
    for (uint64_t k = 0; k < records; ++k) {
      std::swap(all[k], all[k + rng() % (total - k)]);
      positions.push_back(all[k]);
    }
  }
  struct Case {
    const char* name;
    tailcut::RecordReadPath path;
    bool direct, cold;
  };
  const Case cases[] = {
      {"map_cold", tailcut::RecordReadPath::kMap, false, true},
      {"uring_cold", tailcut::RecordReadPath::kUring, false, true},
      {"uring_direct_cold", tailcut::RecordReadPath::kUring, true, true},
      {"pread_cold", tailcut::RecordReadPath::kPread, false, true},
      {"map_hot", tailcut::RecordReadPath::kMap, false, false},
      {"uring_hot", tailcut::RecordReadPath::kUring, false, false},
      {"pread_hot", tailcut::RecordReadPath::kPread, false, false},
  };
  double base = 0;
  for (const Case& c : cases) {
    tailcut::ReadRecordsOptions options;
    options.path = c.path;
    options.direct = c.direct;
    options.queue_depth = depth;
    std::string data;
    std::vector<uint64_t> ends;
    std::vector<uint64_t> group;
    auto run = [&](const tailcut::RecordFiles& files) {
      const auto start = std::chrono::steady_clock::now();
      for (uint64_t at = 0; at < positions.size(); at += batch) {
        group.assign(positions.begin() + static_cast<ptrdiff_t>(at),
                     positions.begin() + static_cast<ptrdiff_t>(std::min(at + batch, records)));
        data.clear();
        ends.clear();
        tailcut::ReadRecords(files, group, &data, &ends, options);
      }
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return static_cast<double>(records) / s;
    };
    std::vector<double> rates;
    double resident = 0;
    if (c.cold) {
      for (uint64_t rep = 0; rep < reps; ++rep) {
        // A fresh RecordFiles each time: its mapping is made anew (pages
        // mapped by an older one could not be evicted).
        resident = std::max(resident, Evict(file, true));
        rates.push_back(run(*tailcut::RecordFiles::Build({file}, format, {})));
      }
    } else {
      // Hot as in a long job: every page cached and, for the mapping, mapped
      // (a first, untimed pass takes the minor faults).
      Warm(file);
      auto files = tailcut::RecordFiles::Build({file}, format, {});
      run(*files);
      resident = Evict(file, false);
      for (uint64_t rep = 0; rep < reps; ++rep) rates.push_back(run(*files));
    }
    std::sort(rates.begin(), rates.end());
    const double median = rates[rates.size() / 2];
    if (std::strcmp(c.name, "map_cold") == 0 || std::strcmp(c.name, "map_hot") == 0) base = median;
    std::printf(
        "case=%s record_bytes=%llu records=%llu batch=%llu depth=%u records_s=%.0f "
        "ratio=%.2f resident_before=%.1f%%\n",
        c.name, static_cast<unsigned long long>(record_bytes),
        static_cast<unsigned long long>(records), static_cast<unsigned long long>(batch), depth,
        median, median / base, resident);
    std::fflush(stdout);
  }
  return 0;
}
