// io_bench: tailcut's read path on the user's own files, for run_io_bench.sh.
//
// Generates data files, or reads files through a WorkQueue and a Reader (raw
// chunks or records) in one or more processes, and prints one line of
// key=value results: bytes, seconds, GiB/s, records/s, peak RSS per process.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tailcut/crc32c.h"
#include "tailcut/reader.h"
#include "tailcut/work_queue.h"

namespace {

const char kUsage[] = R"(usage:
  io_bench --generate --dir DIR --kind raw|lines|tfrecord [--files N] [--size BYTES]
           [--record-bytes N]
  io_bench [read options] FILE...

Reads FILEs through a tailcut WorkQueue and Reader and prints one line:
  tailcut: mode=... backend=... direct=... processes=N bytes=B seconds=S gib_s=G
           records=R records_s=RS peak_rss_kib=K budget_kib=BK memory='...'
peak_rss_kib is the largest VmHWM of the reading processes.

Read options:
  --mode chunks|records   raw bytes of each slice (default), or records
  --format F              lines, tfrecord, file or fixed:N (records mode; default lines)
  --budget BYTES          buffer budget per process (default 64M)
  --chunk BYTES           chunk size = read size (default 4M)
  --depth N               reads in flight (default: the Reader's)
  --prefetch N            items taken ahead (default 2)
  --direct                O_DIRECT
  --backend B             default, uring or pread (default: default, i.e. TAILCUT_IO or uring)
  --pread-threads N       pread backend threads (default 2)
  --no-async              io_uring: no IOSQE_ASYNC for buffered reads
  --slices N              items in the queue (default: one per file)
  --epochs N              read the files N times (queue epochs; default 1)
  --processes N           reading processes sharing the queue (default 1)
  --touch                 read one byte per 64 of every chunk (chunks mode)

Generate options:
  --kind raw              random bytes
  --kind lines            lines of --record-bytes bytes, newline included (default 64)
  --kind tfrecord         TFRecords with --record-bytes payload bytes (default 1024)
  --files N               number of files (default 4), named DIR/tailcut_bench_KIND_I
  --size BYTES            total size (default 1G); suffixes K, M, G

Sizes take K, M and G suffixes (powers of 1024). Exit status: 0 ok, 1 a read
failed, 2 usage error.
)";

uint64_t ParseSize(const char* text) {
  char* end = nullptr;
  double v = strtod(text, &end);
  uint64_t unit = 1;
  if (end && *end) {
    switch (*end) {
      case 'k':
      case 'K':
        unit = 1ull << 10;
        break;
      case 'm':
      case 'M':
        unit = 1ull << 20;
        break;
      case 'g':
      case 'G':
        unit = 1ull << 30;
        break;
      case 't':
      case 'T':
        unit = 1ull << 40;
        break;
      default:
        fprintf(stderr, "io_bench: bad size '%s'\n", text);
        exit(2);
    }
  }
  return static_cast<uint64_t>(v * static_cast<double>(unit));
}

uint64_t PeakRssKib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6));
  }
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<uint64_t>(usage.ru_maxrss);
}

struct Args {
  bool generate = false;
  std::string dir;
  std::string kind = "raw";
  uint32_t files = 4;
  uint64_t size = 1ull << 30;
  uint64_t record_bytes = 0;
  std::string mode = "chunks";
  std::string format = "lines";
  uint64_t budget = 64ull << 20;
  uint64_t chunk = 4ull << 20;
  uint32_t depth = 0;
  uint32_t prefetch = 2;
  bool direct = false;
  std::string backend = "default";
  uint32_t pread_threads = 0;
  bool async = true;
  uint64_t slices = 0;
  uint64_t epochs = 1;
  uint32_t processes = 1;
  bool touch = false;
  std::vector<std::string> paths;
};

int Generate(const Args& a) {
  if (a.dir.empty()) {
    fprintf(stderr, "io_bench: --generate needs --dir\n");
    return 2;
  }
  std::mt19937_64 rng(12345);
  uint64_t per_file = a.size / a.files;
  std::vector<char> block(1 << 20);
  for (uint32_t f = 0; f < a.files; ++f) {
    std::string path = a.dir + "/tailcut_bench_" + a.kind + "_" + std::to_string(f);
    FILE* out = fopen(path.c_str(), "wb");
    if (!out) {
      fprintf(stderr, "io_bench: cannot create %s: %s\n", path.c_str(), strerror(errno));
      return 1;
    }
    uint64_t written = 0;
    std::string buffer;
    while (written < per_file) {
      buffer.clear();
      if (a.kind == "raw") {
        for (size_t i = 0; i < block.size(); i += 8) {
          uint64_t v = rng();
          memcpy(block.data() + i, &v, 8);
        }
        buffer.assign(block.data(), std::min<uint64_t>(block.size(), per_file - written));
      } else if (a.kind == "lines") {
        uint64_t n = a.record_bytes ? a.record_bytes : 64;
        std::string line(n, 'a');
        while (buffer.size() < (1u << 20)) {
          for (uint64_t i = 0; i + 1 < n; ++i) line[i] = static_cast<char>('a' + rng() % 26);
          line[n - 1] = '\n';
          buffer += line;
        }
      } else if (a.kind == "tfrecord") {
        uint64_t n = a.record_bytes ? a.record_bytes : 1024;
        std::string payload(n, '\0');
        while (buffer.size() < (1u << 20)) {
          for (char& c : payload) c = static_cast<char>(rng());
          tailcut::AppendTfrecord(&buffer, payload);
        }
      } else {
        fprintf(stderr, "io_bench: --kind must be raw, lines or tfrecord\n");
        return 2;
      }
      fwrite(buffer.data(), 1, buffer.size(), out);
      written += buffer.size();
    }
    fclose(out);
    printf("%s\n", path.c_str());
  }
  return 0;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Times are CLOCK_MONOTONIC seconds, comparable across the processes.
struct Result {
  double start = 0;  // first Next* call (queue and Reader already open)
  double end = 0;    // last Next* call returned
  double setup = 0;  // seconds to open the queue and the Reader
  uint64_t bytes = 0;
  uint64_t records = 0;
  uint64_t peak_rss_kib = 0;
  int failed = 0;
  char backend[16] = {};
  char memory[200] = {};
};

Result ReadOnce(const Args& a, const std::string& queue_name) {
  Result r;
  tailcut::WorkQueueOptions q;
  q.works = a.paths;
  q.shuffle = false;
  q.num_epochs = a.epochs;
  q.name = queue_name;
  q.num_clients = a.processes;
  if (a.slices) q.num_slices = a.slices;
  tailcut::RecordFormat format;
  if (a.format.rfind("fixed:", 0) == 0) {
    format = tailcut::RecordFormat::Parse("fixed", std::stoull(a.format.substr(6)));
  } else {
    format = tailcut::RecordFormat::Parse(a.format);
  }
  q.format = a.mode == "records" ? format.Tag() : "raw";
  q.on_notice = [](const std::string&) {};
  double t_open = NowSeconds();
  auto queue = tailcut::WorkQueue::Open(q);

  tailcut::ReaderOptions o;
  o.format = format;
  o.mode = a.mode == "records" ? tailcut::ReadMode::kRecords : tailcut::ReadMode::kChunks;
  o.buffer_budget_bytes = a.budget;
  o.chunk_bytes = a.chunk;
  o.queue_depth = a.depth;
  o.prefetch_items = a.prefetch;
  o.direct = a.direct;
  o.backend = a.backend == "uring"   ? tailcut::IoBackend::kUring
              : a.backend == "pread" ? tailcut::IoBackend::kPread
                                     : tailcut::IoBackend::kDefault;
  o.pread_threads = a.pread_threads;
  o.uring_async_buffered = a.async;
  o.on_notice = [](const std::string& line) { fprintf(stderr, "%s\n", line.c_str()); };
  auto reader = tailcut::Reader::Open(*queue, o);
  snprintf(r.backend, sizeof r.backend, "%s", std::string(reader->backend_name()).c_str());
  snprintf(r.memory, sizeof r.memory, "%s", reader->memory_state().c_str());

  tailcut::ReadStatus status;
  uint64_t sink = 0;
  r.start = NowSeconds();
  r.setup = r.start - t_open;
  if (o.mode == tailcut::ReadMode::kChunks) {
    tailcut::ChunkView chunk;
    while ((status = reader->NextChunk(&chunk)) == tailcut::ReadStatus::kOk) {
      r.bytes += chunk.size;
      ++r.records;
      if (a.touch) {
        for (size_t i = 0; i < chunk.size; i += 64) sink += std::to_integer<uint8_t>(chunk.data[i]);
      }
    }
  } else {
    tailcut::Record batch[256];
    size_t n = 0;
    while ((status = reader->NextBatch(batch, 256, &n)) == tailcut::ReadStatus::kOk) {
      r.records += n;
      for (size_t i = 0; i < n; ++i) r.bytes += batch[i].size;
    }
  }
  r.end = NowSeconds();
  if (sink == 42) fprintf(stderr, " ");
  if (status == tailcut::ReadStatus::kError) {
    fprintf(stderr, "io_bench: %s\n", reader->error().c_str());
    r.failed = 1;
  }
  reader.reset();
  queue->Close();
  r.peak_rss_kib = PeakRssKib();
  return r;
}

int Read(const Args& a) {
  if (a.paths.empty()) {
    fprintf(stderr, "io_bench: no files to read (see --help)\n");
    return 2;
  }
  std::string name = "io_bench_" + std::to_string(getpid());
  try {
    tailcut::RemoveQueue(name, true);
  } catch (...) {
  }
  Result total;
  if (a.processes <= 1) {
    try {
      total = ReadOnce(a, name);
    } catch (const std::exception& e) {
      fprintf(stderr, "io_bench: %s\n", e.what());
      return 1;
    }
  } else {
    std::vector<pid_t> pids;
    std::vector<int> pipes;
    for (uint32_t i = 0; i < a.processes; ++i) {
      int fds[2];
      if (pipe(fds) != 0) return 1;
      pid_t pid = fork();
      if (pid == 0) {
        close(fds[0]);
        Result r;
        try {
          r = ReadOnce(a, name);
        } catch (const std::exception& e) {
          fprintf(stderr, "io_bench: %s\n", e.what());
          r.failed = 1;
        }
        ssize_t ignored = write(fds[1], &r, sizeof r);
        (void)ignored;
        _exit(0);
      }
      close(fds[1]);
      pids.push_back(pid);
      pipes.push_back(fds[0]);
    }
    for (size_t i = 0; i < pids.size(); ++i) {
      Result r;
      if (read(pipes[i], &r, sizeof r) != sizeof r) r.failed = 1;
      close(pipes[i]);
      waitpid(pids[i], nullptr, 0);
      total.start = i == 0 ? r.start : std::min(total.start, r.start);
      total.end = std::max(total.end, r.end);
      total.setup = std::max(total.setup, r.setup);
      total.bytes += r.bytes;
      total.records += r.records;
      total.peak_rss_kib = std::max(total.peak_rss_kib, r.peak_rss_kib);
      total.failed |= r.failed;
      memcpy(total.backend, r.backend, sizeof r.backend);
      memcpy(total.memory, r.memory, sizeof r.memory);
    }
  }
  // From the first read request of any process to the last record of all.
  double seconds = total.end - total.start;
  try {
    tailcut::RemoveQueue(name, true);
  } catch (...) {
  }
  printf("tailcut: mode=%s backend=%s direct=%d processes=%u bytes=%" PRIu64
         " seconds=%.4f gib_s=%.3f records=%" PRIu64 " records_s=%.0f peak_rss_kib=%" PRIu64
         " budget_kib=%" PRIu64 " setup_s=%.4f memory='%s'\n",
         a.mode.c_str(), total.backend, a.direct ? 1 : 0, a.processes, total.bytes, seconds,
         static_cast<double>(total.bytes) / seconds / (1ull << 30), total.records,
         static_cast<double>(total.records) / seconds, total.peak_rss_kib, a.budget >> 10,
         total.setup, total.memory);
  return total.failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        fprintf(stderr, "io_bench: %s needs a value (see --help)\n", arg.c_str());
        exit(2);
      }
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--generate") {
      a.generate = true;
    } else if (arg == "--dir") {
      a.dir = value();
    } else if (arg == "--kind") {
      a.kind = value();
    } else if (arg == "--files") {
      a.files = static_cast<uint32_t>(std::max<uint64_t>(1, ParseSize(value())));
    } else if (arg == "--size") {
      a.size = ParseSize(value());
    } else if (arg == "--record-bytes") {
      a.record_bytes = ParseSize(value());
    } else if (arg == "--mode") {
      a.mode = value();
    } else if (arg == "--format") {
      a.format = value();
    } else if (arg == "--budget") {
      a.budget = ParseSize(value());
    } else if (arg == "--chunk") {
      a.chunk = ParseSize(value());
    } else if (arg == "--depth") {
      a.depth = static_cast<uint32_t>(ParseSize(value()));
    } else if (arg == "--prefetch") {
      a.prefetch = static_cast<uint32_t>(ParseSize(value()));
    } else if (arg == "--direct") {
      a.direct = true;
    } else if (arg == "--backend") {
      a.backend = value();
    } else if (arg == "--pread-threads") {
      a.pread_threads = static_cast<uint32_t>(ParseSize(value()));
    } else if (arg == "--no-async") {
      a.async = false;
    } else if (arg == "--slices") {
      a.slices = ParseSize(value());
    } else if (arg == "--epochs") {
      a.epochs = std::max<uint64_t>(1, ParseSize(value()));
    } else if (arg == "--processes") {
      a.processes = static_cast<uint32_t>(std::max<uint64_t>(1, ParseSize(value())));
    } else if (arg == "--touch") {
      a.touch = true;
    } else if (!arg.empty() && arg[0] == '-') {
      fprintf(stderr, "io_bench: unknown option %s (see --help)\n", arg.c_str());
      return 2;
    } else {
      a.paths.push_back(arg);
    }
  }
  if (a.mode != "chunks" && a.mode != "records") {
    fprintf(stderr, "io_bench: --mode must be chunks or records\n");
    return 2;
  }
  if (a.backend != "default" && a.backend != "uring" && a.backend != "pread") {
    fprintf(stderr, "io_bench: --backend must be default, uring or pread\n");
    return 2;
  }
  try {
    return a.generate ? Generate(a) : Read(a);
  } catch (const std::exception& e) {
    fprintf(stderr, "io_bench: %s\n", e.what());
    return 2;
  }
}
