// global_order_bench: records/s of the GlobalOrderReader (every record of
// the files in one seeded permutation, read by number) against the Reader in
// file order on the same files, page cache hot, in one process.
//
// For each case (fixed-size records and TFRecords, of 128 bytes and 4 KiB)
// it writes the files, reads them once (hot, and the record index built),
// then reads one epoch with each reader `--reps` times, alternating, and
// prints the median records/s of each and the ratio global / file order
// (the median of the per-rep ratios and their range), and the records/s of
// the same reads by hand (the permutation and ReadRecords, no queue, no
// reader): the floor of the global order's cost. Both readers' consumers
// look at the first and last byte of every record; batches of --batch.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tailcut/crc32c.h"
#include "tailcut/global_order_reader.h"
#include "tailcut/reader.h"
#include "tailcut/record_index.h"
#include "tailcut/sample_order.h"
#include "tailcut/work_queue.h"

namespace {

namespace fs = std::filesystem;

const char kUsage[] = R"(usage: global_order_bench [--dir DIR] [--reps N] [--epochs N] [--batch N]
                          [--files N] [--cases LIST]

Reads the same files with the Reader in file order and with the
GlobalOrderReader (global shuffle), page cache hot, one process, and prints
records/s of both and the ratio global / file order per case.

  --dir DIR     where the data files go (default: $TMPDIR or /tmp); removed after
  --reps N      runs of each reader per case, alternating (default 5)
  --epochs N    epochs each run reads (default 4)
  --batch N     records per NextBatch (default 256)
  --files N     files per case (default 8)
  --cases LIST  comma-separated subset of fixed128,tfrecord128,fixed4k,tfrecord4k
)";

struct Case {
  const char* name;
  bool tfrecord;
  size_t record_bytes;
  size_t records;  // in all files
};

const Case kCases[] = {
    {"fixed128", false, 128, 400000},
    {"tfrecord128", true, 128, 400000},
    {"fixed4k", false, 4096, 64000},
    {"tfrecord4k", true, 4096, 64000},
};

uint64_t g_sink = 0;  // what the consumers computed, printed so it is not optimised away

std::vector<std::string> WriteFiles(const std::string& dir, const Case& c, size_t files) {
  std::mt19937_64 rng(7);
  std::vector<std::string> paths;
  std::string record(c.record_bytes, '\0');
  for (size_t f = 0; f < files; ++f) {
    std::string content;
    const size_t n = c.records / files;
    content.reserve(n * (c.record_bytes + 16));
    for (size_t i = 0; i < n; ++i) {
      for (char& ch : record) ch = static_cast<char>(rng());
      if (!c.tfrecord) {
        content += record;
        continue;
      }
      const uint64_t length = record.size();
      char header[12];
      std::memcpy(header, &length, 8);
      const uint32_t length_crc = tailcut::MaskCrc32c(tailcut::Crc32c(header, 8));
      std::memcpy(header + 8, &length_crc, 4);
      content.append(header, 12);
      content += record;
      const uint32_t data_crc = tailcut::MaskCrc32c(tailcut::Crc32c(record.data(), record.size()));
      content.append(reinterpret_cast<const char*>(&data_crc), 4);
    }
    paths.push_back(dir + "/" + c.name + "_" + std::to_string(f));
    std::ofstream(paths.back(), std::ios::binary)
        .write(content.data(), static_cast<std::streamsize>(content.size()));
  }
  return paths;
}

tailcut::RecordFormat FormatOf(const Case& c) {
  return c.tfrecord ? tailcut::RecordFormat::Parse("tfrecord")
                    : tailcut::RecordFormat::Parse("fixed", c.record_bytes);
}

void Use(const tailcut::Record* records, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const auto* p = reinterpret_cast<const unsigned char*>(records[i].data);
    g_sink += p[0] + p[records[i].size - 1];
  }
}

std::string QueueName(const char* what) {
  static int counter = 0;
  return std::string("gob_") + what + "_" + std::to_string(getpid()) + "_" +
         std::to_string(counter++);
}

tailcut::WorkQueueOptions Quiet(tailcut::WorkQueueOptions o) {
  o.on_notice = [](const std::string&) {};
  return o;
}

// Records/s of one epoch read with the Reader in file order.
double FileOrder(const std::vector<std::string>& paths, const Case& c, size_t batch,
                 uint64_t epochs, size_t* records) {
  tailcut::WorkQueueOptions qo;
  qo.num_epochs = epochs;
  qo.works = paths;
  qo.shuffle = false;
  qo.name = QueueName("file");
  qo.format = FormatOf(c).Tag();
  auto queue = tailcut::WorkQueue::Open(Quiet(qo));
  tailcut::ReaderOptions ro;
  ro.format = FormatOf(c);
  ro.cuda_register = false;
  ro.on_notice = [](const std::string&) {};
  auto reader = tailcut::Reader::Open(*queue, ro);
  std::vector<tailcut::Record> out(batch);
  size_t n = 0, total = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (reader->NextBatch(out.data(), batch, &n) == tailcut::ReadStatus::kOk) {
    Use(out.data(), n);
    total += n;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!reader->error().empty()) {
    std::fprintf(stderr, "file order: %s\n", reader->error().c_str());
    std::exit(1);
  }
  *records = total;
  return static_cast<double>(total) / seconds;
}

// Records/s of one epoch read with the GlobalOrderReader.
double GlobalOrder(const std::shared_ptr<const tailcut::RecordFiles>& files, size_t batch,
                   uint64_t epochs, size_t* records) {
  tailcut::WorkQueueOptions qo;
  qo.num_epochs = epochs;
  qo.name = QueueName("global");
  qo.seed = 1;
  auto queue =
      tailcut::WorkQueue::Open(Quiet(tailcut::GlobalOrderReader::QueueOptions(*files, qo)));
  auto reader = tailcut::GlobalOrderReader::Open(*queue, files);
  std::vector<tailcut::Record> out(batch);
  size_t n = 0, total = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (reader->NextBatch(out.data(), batch, &n) == tailcut::ReadStatus::kOk) {
    Use(out.data(), n);
    total += n;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!reader->error().empty()) {
    std::fprintf(stderr, "global order: %s\n", reader->error().c_str());
    std::exit(1);
  }
  *records = total;
  return static_cast<double>(total) / seconds;
}

// Records/s of the same reads without a queue or a reader: the records of
// the epoch's permutation, `batch` at a time, through ReadRecords (the floor
// of the global order's cost: what the reader adds is the rest).
double ReadsAlone(const std::shared_ptr<const tailcut::RecordFiles>& files, size_t batch,
                  uint64_t epochs) {
  tailcut::WorkQueueOptions qo;
  qo.name = QueueName("alone");
  qo.seed = 1;
  qo.num_epochs = epochs;
  auto queue =
      tailcut::WorkQueue::Open(Quiet(tailcut::GlobalOrderReader::QueueOptions(*files, qo)));
  std::vector<uint64_t> numbers;
  std::string data;
  std::vector<uint64_t> ends;
  uint64_t total = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t e = 0; e < epochs; ++e) {
    tailcut::SampleOrder order(*queue, e);
    for (uint64_t p = 0; p < files->size();) {
      numbers.clear();
      for (; p < files->size() && numbers.size() < batch; ++p) numbers.push_back(order[p]);
      data.clear();
      ends.clear();
      tailcut::ReadRecords(*files, numbers, &data, &ends);
      g_sink += static_cast<unsigned char>(data[0]) + ends.back();
      total += numbers.size();
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  queue->Close();
  return static_cast<double>(total) / seconds;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string base =
      std::getenv("TMPDIR") && *std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
  int reps = 5;
  uint64_t epochs = 4;
  size_t batch = 256, files = 8;
  std::string cases = "fixed128,tfrecord128,fixed4k,tfrecord4k";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--dir" && has_value) {
      base = argv[++i];
    } else if (arg == "--reps" && has_value) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--epochs" && has_value) {
      epochs = static_cast<uint64_t>(std::max(1, std::atoi(argv[++i])));
    } else if (arg == "--batch" && has_value) {
      batch = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--files" && has_value) {
      files = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--cases" && has_value) {
      cases = argv[++i];
    } else {
      std::fputs(kUsage, arg == "--help" ? stdout : stderr);
      return arg == "--help" ? 0 : 2;
    }
  }
  std::string pattern = base + "/tailcut_global_bench_XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    std::perror(pattern.c_str());
    return 1;
  }
  const std::string dir = pattern;
  std::printf("%-12s %9s %6s %14s %14s %8s %15s %14s\n", "case", "records", "files", "file_order/s",
              "global/s", "ratio", "ratio_range", "reads_alone/s");
  for (const Case& c : kCases) {
    if (("," + cases + ",").find(std::string(",") + c.name + ",") == std::string::npos) continue;
    const std::vector<std::string> paths = WriteFiles(dir, c, files);
    tailcut::RecordIndexOptions index;  // no cache: built in memory, once
    auto record_files = tailcut::RecordFiles::Build(paths, FormatOf(c), index);
    size_t n_file = 0, n_global = 0;
    FileOrder(paths, c, batch, 1, &n_file);  // warm-up: page cache, mappings, allocator
    GlobalOrder(record_files, batch, 1, &n_global);
    std::vector<double> file_rates, global_rates, ratios, alone_rates;
    for (int r = 0; r < reps; ++r) {
      const double f = FileOrder(paths, c, batch, epochs, &n_file);
      const double g = GlobalOrder(record_files, batch, epochs, &n_global);
      if (n_file != c.records / files * files * epochs || n_global != n_file) {
        std::fprintf(stderr, "%s: file order read %zu records, global %zu\n", c.name, n_file,
                     n_global);
        return 1;
      }
      alone_rates.push_back(ReadsAlone(record_files, batch, epochs));
      file_rates.push_back(f);
      global_rates.push_back(g);
      ratios.push_back(g / f);
    }
    char range[64];
    std::snprintf(range, sizeof range, "%.2f-%.2f", *std::min_element(ratios.begin(), ratios.end()),
                  *std::max_element(ratios.begin(), ratios.end()));
    std::printf("%-12s %9zu %6zu %14.0f %14.0f %7.2fx %15s %14.0f\n", c.name, n_file / epochs,
                files, Median(file_rates), Median(global_rates), Median(ratios), range,
                Median(alone_rates));
    std::fflush(stdout);
    for (const std::string& p : paths) fs::remove(p);
  }
  fs::remove_all(dir);
  std::printf("(batch %zu, %d runs of %llu epochs each; checksum %llu)\n", batch, reps,
              static_cast<unsigned long long>(epochs),
              static_cast<unsigned long long>(g_sink % 1000));
  return 0;
}
