// ReadRecords: records of a RecordFiles read in any order (see
// tailcut/record_index.h).
//
// Why a mapping and not the Reader's io_uring: a batch of a global shuffle is
// a few hundred small records scattered over the data set. With the page
// cache hot, one pread per record costs about a microsecond of system call,
// most of the time of the batch for records of a few hundred bytes; a copy
// from a mapping costs a page-table walk. Where a file cannot be mapped,
// preads sorted by offset and coalesced (adjacent records in one read) are
// the fallback, run in parallel (tbb) when threads > 1 for a cold disk.
//
// A truncated file faults on the copy (SIGBUS). The copy runs under a
// per-thread guard: a SIGBUS handler, installed once, jumps back to the
// guard's sigsetjmp when the fault is a guarded copy's and passes any other
// SIGBUS to the handler it replaced. Nothing with a destructor lives between
// the sigsetjmp and the copy, so the jump skips no cleanup.
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "tailcut/crc32c.h"
#include "tailcut/record_index.h"
#include "tailcut/work_file.h"

namespace tailcut {

namespace detail {

// The mappings of a RecordFiles' files, made on first use. A file that
// cannot be mapped is remembered as such (read with pread from then on).
class RecordMaps {
 public:
  ~RecordMaps() {
    for (const Map& m : maps_)
      if (m.bytes != nullptr) ::munmap(const_cast<char*>(m.bytes), m.size);
  }

  // The mapping of file f (opened with the checks of tailcut/work_file.h),
  // or null when it cannot be mapped. Throws the file's error when it cannot
  // be opened or is not the file indexed.
  const char* Get(size_t f, const RecordIndex& index) {
    std::lock_guard<std::mutex> lock(mu_);
    if (maps_.size() <= f) maps_.resize(f + 1);
    Map& m = maps_[f];
    if (m.tried) return m.bytes;
    WorkFile file = OpenWorkFile(index.path, &index.identity);
    if (file.fd < 0) throw Error(file.kind, file.error);
    m.tried = true;
    m.size = index.identity.size;
    if (m.size > 0) {
      void* p = ::mmap(nullptr, m.size, PROT_READ, MAP_SHARED, file.fd, 0);
      if (p != MAP_FAILED) {
        ::madvise(p, m.size, MADV_RANDOM);  // no read-ahead around a random record
        m.bytes = static_cast<const char*>(p);
      }
    }
    ::close(file.fd);
    return m.bytes;
  }

 private:
  struct Map {
    bool tried = false;
    const char* bytes = nullptr;
    size_t size = 0;
  };
  std::mutex mu_;
  std::vector<Map> maps_;
};

}  // namespace detail

RecordFiles::RecordFiles() : maps_(std::make_unique<detail::RecordMaps>()) {}
RecordFiles::~RecordFiles() = default;

namespace {

// ---- The SIGBUS guard of copies from mappings -----------------------------

thread_local sigjmp_buf* t_guard = nullptr;
struct sigaction g_previous;  // the handler ours replaced
std::once_flag g_installed;

void OnSigbus(int sig, siginfo_t* info, void* context) {
  if (t_guard != nullptr) siglongjmp(*t_guard, 1);
  // Not a guarded copy's: the handler we replaced decides, as if we were not here.
  if (g_previous.sa_flags & SA_SIGINFO) {
    g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  } else {
    // Default (or ignored, which a fault cannot be): restore it; the faulting
    // access runs again on return and the default action ends the process.
    ::sigaction(SIGBUS, &g_previous, nullptr);
  }
}

void InstallGuard() {
  std::call_once(g_installed, [] {
    struct sigaction action {};
    action.sa_sigaction = OnSigbus;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGBUS, &action, &g_previous);
  });
}

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

// Copies the records of a run from the file's mapping. Returns false, with
// *fault set, when the mapping faulted (the file was truncated).
bool CopyRun(const RecordFiles& files, const std::vector<Want>& wants, const Run& run,
             const char* map, const std::vector<uint64_t>& out_at, char* out, uint64_t* fault) {
  const RecordIndex& index = files.file(wants[run.first].file);
  const bool tfrecord = index.format.kind == RecordFormatKind::kTfrecord;
  volatile size_t k = run.first;  // read after a jump back
  volatile bool crc_failed = false;
  sigjmp_buf guard;
  if (sigsetjmp(guard, 0) != 0) {
    t_guard = nullptr;
    *fault = wants[k].begin;
    return false;
  }
  t_guard = &guard;
  while (k < run.last) {
    const Want& w = wants[k];
    const char* payload = map + w.payload;
    if (tfrecord) {
      uint32_t stored;
      std::memcpy(&stored, payload + w.size, 4);
      if (MaskCrc32c(Crc32c(payload, w.size)) != stored) {
        crc_failed = true;
        break;
      }
    }
    std::memcpy(out + out_at[w.order], payload, w.size);
    k = k + 1;
  }
  t_guard = nullptr;
  if (crc_failed)
    throw Error(ErrorKind::kCorrupt, "tfrecord file '" + Printable(index.path) + "' at offset " +
                                         std::to_string(wants[k].begin) +
                                         ": data CRC mismatch (the file changed or decayed "
                                         "since it was indexed)");
  return true;
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
  // Each file's mapping (made on first use, with the checks of
  // tailcut/work_file.h), else an fd for pread, opened once per call.
  InstallGuard();
  std::vector<size_t> file_of_run(runs.size());
  std::vector<const char*> maps(files.num_files(), nullptr);
  std::vector<char> looked(files.num_files(), 0);
  std::vector<int> fds(files.num_files(), -1);
  struct Closer {
    std::vector<int>* fds;
    ~Closer() {
      for (int fd : *fds)
        if (fd >= 0) ::close(fd);
    }
  } closer{&fds};
  bool any_pread = false;
  for (size_t k = 0; k < runs.size(); ++k) {
    const size_t f = wants[runs[k].first].file;
    file_of_run[k] = f;
    if (looked[f]) continue;
    looked[f] = 1;
    const RecordIndex& index = files.file(f);
    maps[f] = files.maps_->Get(f, index);
    if (maps[f] != nullptr || index.identity.size == 0) continue;
    WorkFile file = OpenWorkFile(index.path, &index.identity);
    if (file.fd < 0) throw Error(file.kind, file.error);
    fds[f] = file.fd;
    any_pread = true;
  }
  // Random records miss every cache: ask for all of them first, so that the
  // misses overlap instead of following one another.
  for (const Want& w : wants)
    if (maps[w.file] != nullptr) __builtin_prefetch(maps[w.file] + w.payload);
  char* out = data->data();
  auto one = [&](size_t k) {
    const size_t f = file_of_run[k];
    if (maps[f] == nullptr) {
      ReadRun(files, wants, runs[k], fds[f], out_at, out);
      return;
    }
    uint64_t fault = 0;
    if (!CopyRun(files, wants, runs[k], maps[f], out_at, out, &fault))
      throw Error(ErrorKind::kIo, "record file '" + Printable(files.file(f).path) + "' at offset " +
                                      std::to_string(fault) +
                                      ": the file ends before it; it was truncated since it "
                                      "was indexed (restore it, or index it again)");
  };
  // Copies from mappings are memory copies: threads help only preads of a cold disk.
  if (threads <= 1 || runs.size() < 2 || !any_pread) {
    for (size_t k = 0; k < runs.size(); ++k) one(k);
    return;
  }
  // No more threads than the machine has: oneTBB warns, and they would only take turns.
  tbb::task_arena arena(std::min(static_cast<int>(threads), tbb::info::default_concurrency()));
  arena.execute([&] { tbb::parallel_for(size_t{0}, runs.size(), one); });
}

}  // namespace tailcut
