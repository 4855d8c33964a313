// ReadRecords: records of a RecordFiles read in any order (see
// tailcut/record_index.h).
//
// Two ways, chosen by ReadRecordsOptions::path (docs/shuffle.md, "Reads",
// has the numbers):
//  * A mapping (kMap, the default). A batch of a global shuffle is a few
//    hundred small records scattered over the data set. With the page cache
//    hot, a read per record costs a system call, most of the time of the
//    batch for records of a few hundred bytes; a copy from a mapping costs a
//    page-table walk. Where a file cannot be mapped, preads sorted by offset
//    and coalesced (adjacent records in one read) are the fallback, run in
//    parallel (tbb) when threads > 1.
//  * Reads through an IoBackend (kUring, kPread): on a cold disk a copy from
//    a mapping faults its page in and waits, one record at a time; the same
//    records as one batch of io_uring reads (io/record_device_reads.h) keep
//    up to queue_depth of them at the device at once. O_DIRECT bypasses the
//    page cache where the data set is larger than memory anyway.
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
#include <sys/stat.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "io/io_backend.h"
#include "io/record_device_reads.h"
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

[[noreturn]] void ThrowDataCrc(const RecordIndex& index, uint64_t offset) {
  throw Error(ErrorKind::kCorrupt, "tfrecord file '" + Printable(index.path) + "' at offset " +
                                       std::to_string(offset) +
                                       ": data CRC mismatch (the file changed or decayed since "
                                       "it was indexed)");
}

// Copies the records of a run out of bytes read from its file: `bytes` holds
// the file's bytes from file offset `bytes_offset` on. Checks TFRecord data CRCs.
void Deliver(const RecordIndex& index, const std::vector<Want>& wants, const Run& run,
             const char* bytes, uint64_t bytes_offset, const std::vector<uint64_t>& out_at,
             char* out) {
  const bool tfrecord = index.format.kind == RecordFormatKind::kTfrecord;
  for (size_t k = run.first; k < run.last; ++k) {
    const Want& w = wants[k];
    const char* payload = bytes + (w.payload - bytes_offset);
    if (tfrecord) {
      uint32_t stored;
      std::memcpy(&stored, payload + w.size, 4);
      if (MaskCrc32c(Crc32c(payload, w.size)) != stored) ThrowDataCrc(index, w.begin);
    }
    std::memcpy(out + out_at[w.order], payload, w.size);
  }
}

[[noreturn]] void ThrowTruncated(const RecordIndex& index, uint64_t offset) {
  throw Error(ErrorKind::kIo, "record file '" + Printable(index.path) + "' at offset " +
                                  std::to_string(offset) +
                                  ": the file ends there; it was truncated since it was "
                                  "indexed (restore it, or index it again)");
}

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
    if (n == 0) ThrowTruncated(index, head.begin + got);
    got += static_cast<size_t>(n);
  }
  Deliver(index, wants, run, staging.data(), head.begin, out_at, out);
}

// Copies wants[first, last) from their files' mappings (maps[file]). Returns
// false, with *faulted set to the want whose copy faulted, when a mapping
// faulted (its file was truncated).
bool CopyWants(const RecordFiles& files, const std::vector<Want>& wants, size_t first, size_t last,
               const std::vector<const char*>& maps, const std::vector<uint64_t>& out_at, char* out,
               size_t* faulted) {
  const bool tfrecord = files.file(wants[first].file).format.kind == RecordFormatKind::kTfrecord;
  volatile size_t k = first;  // read after a jump back
  volatile bool crc_failed = false;
  sigjmp_buf guard;
  if (sigsetjmp(guard, 0) != 0) {
    t_guard = nullptr;
    *faulted = k;
    return false;
  }
  t_guard = &guard;
  while (k < last) {
    const Want& w = wants[k];
    const char* payload = maps[w.file] + w.payload;
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
  if (crc_failed) ThrowDataCrc(files.file(wants[k].file), wants[k].begin);
  return true;
}

[[noreturn]] void ThrowFaulted(const RecordFiles& files, const Want& w) {
  throw Error(ErrorKind::kIo, "record file '" + Printable(files.file(w.file).path) +
                                  "' at offset " + std::to_string(w.begin) +
                                  ": the file ends before it; it was truncated since it "
                                  "was indexed (restore it, or index it again)");
}

// ---- Reads through an IoBackend (kUring, kPread) ---------------------------

constexpr uint64_t kPage = 4096;
constexpr uint64_t kMaxPiece = uint64_t{4} << 20;  // one read's bytes at most (a multiple of kPage)

using Notice = std::function<void(const std::string&)>;

// Filesystems whose O_DIRECT refusal was noticed (once each per process).
std::mutex g_direct_mu;
std::set<dev_t> g_direct_noticed;
std::atomic<bool> g_uring_noticed{false};

void NoticeDirectRefused(const Notice& notice, int fd, const std::string& path,
                         const std::string& why) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return;
  {
    std::lock_guard<std::mutex> lock(g_direct_mu);
    if (!g_direct_noticed.insert(st.st_dev).second) return;
  }
  notice("tailcut: O_DIRECT is not supported for '" + Printable(path) + "' (" + why +
         "); reading record files on its filesystem buffered");
}

// Opens file f for the batch: O_DIRECT when asked and its filesystem takes
// it, else buffered with POSIX_FADV_RANDOM (a random record must not read
// ahead the pages after it). The fds opened go to *fds, closed by the caller.
detail::DeviceFile OpenForReads(const RecordIndex& index, bool direct, const Notice& notice,
                                std::vector<int>* fds) {
  WorkFile file = OpenWorkFile(index.path, &index.identity, direct ? O_DIRECT : 0);
  if (file.fd < 0 && direct && file.open_errno == EINVAL) {
    direct = false;
    file = OpenWorkFile(index.path, &index.identity);
    if (file.fd >= 0) NoticeDirectRefused(notice, file.fd, index.path, "open: Invalid argument");
  }
  if (file.fd < 0) throw Error(file.kind, file.error);
  fds->push_back(file.fd);
  detail::DeviceFile out;
  out.fd = file.fd;
  if (direct) {
    // statx(STATX_DIOALIGN) where the kernel has it (6.1+); else 4 KiB, a
    // multiple of every common logical block size (as the Reader).
    uint64_t align = kPage;
    struct statx sx {};
    if (::statx(file.fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
        (sx.stx_mask & STATX_DIOALIGN)) {
      align = std::max<uint64_t>({sx.stx_dio_offset_align, sx.stx_dio_mem_align, 1});
      if (sx.stx_dio_offset_align == 0) align = 0;  // no direct I/O on this file
    }
    if (align != 0 && align <= kPage) {
      out.direct = true;
      out.align = align;
      return out;
    }
    NoticeDirectRefused(notice, file.fd, index.path,
                        align == 0 ? std::string("statx: no direct-I/O alignment")
                                   : "alignment " + std::to_string(align));
    WorkFile buffered = OpenWorkFile(index.path, &index.identity);
    if (buffered.fd < 0) throw Error(buffered.kind, buffered.error);
    fds->push_back(buffered.fd);
    out.fd = buffered.fd;
  }
  ::posix_fadvise(out.fd, 0, 0, POSIX_FADV_RANDOM);
  return out;
}

// This thread's io_uring (and pread threads, where io_uring is unavailable
// or not asked for), set up on first use and kept for the next batch. A
// forked child does not use its parent's: it sets up its own.
struct ThreadRing {
  pid_t pid = 0;
  uint32_t depth = 0;
  std::unique_ptr<detail::IoBackend> ring;
  bool unavailable = false;  // setup failed in this thread: pread from now on
  uint32_t pread_depth = 0;
  size_t pread_threads = 0;
  std::unique_ptr<detail::IoBackend> pread;

  // After a fork the pread threads are the parent's: none of them runs here,
  // so they would never take a read. They are let go of, not stopped.
  void Forget() {
    (void)pread.release();
    pread_depth = 0;
    pread_threads = 0;
    // The ring's pages and fd are this process's copies: unmapping and
    // closing them leaves the parent's ring alone.
    ring.reset();
    depth = 0;
    unavailable = false;
  }
  ~ThreadRing() {
    if (pid != 0 && pid != ::getpid()) Forget();
  }
};
thread_local ThreadRing t_ring;

// The ring for queue_depth reads, or null (with a notice once per process)
// when io_uring cannot be set up.
// This thread's pread threads for queue_depth reads (kept like the ring).
detail::IoBackend* PreadThreads(uint32_t queue_depth, size_t threads) {
  ThreadRing& t = t_ring;
  const pid_t pid = ::getpid();
  if (t.pid != pid) {
    t.Forget();
    t.pid = pid;
  }
  if (!t.pread || t.pread_depth < queue_depth || t.pread_threads != threads) {
    t.pread.reset();
    t.pread = detail::MakePreadBackend(static_cast<uint32_t>(threads), queue_depth);
    t.pread_depth = queue_depth;
    t.pread_threads = threads;
  }
  return t.pread.get();
}

detail::IoBackend* Ring(uint32_t queue_depth, size_t pread_threads, bool by_env,
                        const Notice& notice) {
  ThreadRing& t = t_ring;
  const pid_t pid = ::getpid();
  if (t.pid != pid) {
    t.Forget();
    t.pid = pid;
  }
  if (t.unavailable) return nullptr;
  if (t.ring && t.depth >= queue_depth) return t.ring.get();
  t.ring.reset();
  detail::UringSettings settings;
  settings.queue_depth = queue_depth;
  // Buffered reads of a cold page complete asynchronously in the kernel
  // (a page-cache wait), not on io-wq workers: IOSQE_ASYNC would only cap
  // them at the workers' number.
  settings.async_buffered = false;
  settings.max_async_workers = 0;
  int err = 0;
  std::string problem;
  t.ring = detail::MakeUringBackend(settings, &err, &problem);
  if (t.ring) {
    t.depth = queue_depth;
    return t.ring.get();
  }
  t.unavailable = true;
  // Relaxed: the flag only keeps the notice to one line; no data rides on it.
  if (!g_uring_noticed.exchange(true, std::memory_order_relaxed)) {
    const char* hint = err == ENOSYS   ? " (kernel too old, or seccomp blocks io_uring)"
                       : err == EPERM  ? " (kernel.io_uring_disabled, or seccomp)"
                       : err == ENOMEM ? " (RLIMIT_MEMLOCK too low for the ring)"
                                       : "";
    notice("tailcut: io_uring unavailable for record reads: " + problem + hint + "; reading with " +
           std::to_string(pread_threads) + " pread threads (" +
           (by_env ? "unset TAILCUT_IO to read from mappings" : "path kPread silences this") + ")");
  }
  return nullptr;
}

struct FreeDeleter {
  void operator()(char* p) const noexcept { std::free(p); }
};

void ReadThroughBackend(const RecordFiles& files, const std::vector<Want>& wants,
                        const std::vector<Run>& runs, const std::vector<uint64_t>& out_at,
                        char* out, const ReadRecordsOptions& options, RecordReadPath path,
                        bool by_env) {
  const Notice notice = options.on_notice ? options.on_notice : [](const std::string& line) {
    std::fprintf(stderr, "%s\n", line.c_str());
  };
  const uint32_t depth = options.queue_depth;
  const size_t pread_threads = std::max<size_t>(options.threads, 2);

  // The batch's files, each opened once (slot[f]: its place in `open`).
  std::vector<int> fds;
  struct Closer {
    std::vector<int>* fds;
    ~Closer() {
      for (int fd : *fds) ::close(fd);
    }
  } closer{&fds};
  std::vector<size_t> slot(files.num_files(), SIZE_MAX);
  std::vector<detail::DeviceFile> open;
  std::vector<size_t> file_of_slot;
  for (const Run& run : runs) {
    const size_t f = wants[run.first].file;
    if (slot[f] != SIZE_MAX) continue;
    slot[f] = open.size();
    open.push_back(OpenForReads(files.file(f), options.direct, notice, &fds));
    file_of_slot.push_back(f);
  }

  // Each run's bytes (aligned out to its file's alignment when direct) at a
  // page-aligned place in one staging buffer, read in pieces of at most kMaxPiece.
  struct Span {
    uint64_t file_offset;  // of staging[at]
    uint64_t at;
  };
  std::vector<Span> spans(runs.size());
  std::vector<detail::DeviceRead> reads;
  uint64_t staging_bytes = 0;
  for (size_t k = 0; k < runs.size(); ++k) {
    const Run& run = runs[k];
    const size_t s = slot[wants[run.first].file];
    const uint64_t align = open[s].direct ? open[s].align : 1;
    uint64_t end = 0;
    for (size_t i = run.first; i < run.last; ++i) end = std::max(end, wants[i].end);
    const uint64_t aligned_offset = wants[run.first].begin / align * align;
    const uint64_t aligned_end = (end + align - 1) / align * align;
    spans[k] = Span{aligned_offset, staging_bytes};
    for (uint64_t o = aligned_offset; o < aligned_end; o += kMaxPiece) {
      detail::DeviceRead r;
      r.file = s;
      r.offset = o;
      r.len = static_cast<uint32_t>(std::min(kMaxPiece, aligned_end - o));
      r.need = static_cast<uint32_t>(std::min<uint64_t>(r.len, end - o));
      r.buf = reinterpret_cast<char*>(staging_bytes + (o - aligned_offset));  // based below
      reads.push_back(r);
    }
    staging_bytes += (aligned_end - aligned_offset + kPage - 1) / kPage * kPage;
  }
  std::unique_ptr<char, FreeDeleter> staging(
      static_cast<char*>(std::aligned_alloc(kPage, std::max(staging_bytes, kPage))));
  if (!staging)
    throw Error(ErrorKind::kNoSpace, "record reads: no memory for " +
                                         std::to_string(staging_bytes) + " bytes of staging");
  for (detail::DeviceRead& r : reads) r.buf = staging.get() + reinterpret_cast<uintptr_t>(r.buf);

  detail::IoBackend* backend = nullptr;
  if (path == RecordReadPath::kUring) backend = Ring(depth, pread_threads, by_env, notice);
  if (backend == nullptr) backend = PreadThreads(depth, pread_threads);
  auto refuse_direct = [&](size_t s) {
    const RecordIndex& index = files.file(file_of_slot[s]);
    WorkFile buffered = OpenWorkFile(index.path, &index.identity);
    if (buffered.fd < 0) return;  // the read fails with the EINVAL it got
    fds.push_back(buffered.fd);
    NoticeDirectRefused(notice, buffered.fd, index.path, "read: Invalid argument");
    ::posix_fadvise(buffered.fd, 0, 0, POSIX_FADV_RANDOM);
    open[s].fd = buffered.fd;
    open[s].direct = false;
  };
  // refuse_direct adds at most one fd per file, while reads are in flight:
  // no allocation may throw then.
  fds.reserve(fds.size() + open.size());
  detail::DeviceReadFailure failure;
  if (!detail::RunDeviceReads(*backend, depth, &open, &reads, refuse_direct, &failure)) {
    if (failure.backend_failed) {
      // Reads may still land in the staging buffer: it and the backend are let go of.
      const std::string name = backend->name();
      (void)staging.release();
      (void)(backend == t_ring.ring.get() ? t_ring.ring : t_ring.pread).release();
      t_ring.depth = t_ring.pread_depth = 0;
      throw Error(ErrorKind::kIo,
                  "record reads: " + name + " failed: " + std::strerror(failure.error));
    }
    const RecordIndex& index = files.file(file_of_slot[reads[failure.read].file]);
    if (failure.error == 0) ThrowTruncated(index, failure.offset);
    throw Error(ErrorKindOfErrno(failure.error),
                "record file '" + Printable(index.path) + "' at offset " +
                    std::to_string(failure.offset) + ": read failed (" + backend->name() +
                    "): " + std::strerror(failure.error));
  }
  for (size_t k = 0; k < runs.size(); ++k)
    Deliver(files.file(wants[runs[k].first].file), wants, runs[k], staging.get() + spans[k].at,
            spans[k].file_offset, out_at, out);
}

// The path asked for: options.path, else kUring where TAILCUT_IO=uring,
// else the mapping. TAILCUT_IO=pread keeps the mapping: it is set for the
// Reader's hot reads (docs/io.md), where pread threads for records would be
// 4x to 33x slower than copies from a mapping (docs/shuffle.md).
RecordReadPath ChoosePath(RecordReadPath asked, bool* by_env) {
  *by_env = false;
  if (asked != RecordReadPath::kDefault) return asked;
  const char* env = std::getenv("TAILCUT_IO");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "pread") == 0) return RecordReadPath::kMap;
  if (std::strcmp(env, "uring") == 0) {
    *by_env = true;
    return RecordReadPath::kUring;
  }
  throw Error(ErrorKind::kInvalidArgument,
              std::string("TAILCUT_IO='") + env + "' is not 'uring' or 'pread'");
}

}  // namespace

void ReadRecords(const RecordFiles& files, const std::vector<uint64_t>& positions,
                 std::string* data, std::vector<uint64_t>* ends, size_t threads, uint64_t max_gap) {
  ReadRecordsOptions options;
  options.threads = threads;
  options.max_gap = max_gap;
  ReadRecords(files, positions, data, ends, options);
}

void ReadRecords(const RecordFiles& files, const std::vector<uint64_t>& positions,
                 std::string* data, std::vector<uint64_t>* ends,
                 const ReadRecordsOptions& options) {
  bool by_env = false;
  const RecordReadPath path = ChoosePath(options.path, &by_env);
  if (options.queue_depth == 0 || options.queue_depth > 4096)
    throw Error(ErrorKind::kInvalidArgument,
                "ReadRecords: queue_depth " + std::to_string(options.queue_depth) +
                    " is out of range; give 1 to 4096 reads in flight");
  const uint64_t max_gap = options.max_gap;
  const size_t threads = options.threads;
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

  char* out = data->data();
  // Each file's mapping (made on first use, with the checks of
  // tailcut/work_file.h); null for a file that cannot be mapped.
  std::vector<const char*> maps(files.num_files(), nullptr);
  bool all_mapped = path == RecordReadPath::kMap;
  if (all_mapped) {
    InstallGuard();
    std::vector<char> looked(files.num_files(), 0);
    for (const Want& w : wants) {
      if (looked[w.file]) continue;
      looked[w.file] = 1;
      maps[w.file] = files.maps_->Get(w.file, files.file(w.file));
      all_mapped = all_mapped && maps[w.file] != nullptr;
    }
  }
  if (all_mapped) {
    // Copied in the order asked, not sorted: order matters to reads (runs,
    // coalescing), not to copies, and sorting a batch of 128-byte records
    // took a fifth of its time. The loads are started ahead of the copies.
    for (const Want& w : wants) __builtin_prefetch(maps[w.file] + w.payload);
    size_t faulted = 0;
    if (!wants.empty() && !CopyWants(files, wants, 0, wants.size(), maps, out_at, out, &faulted))
      ThrowFaulted(files, wants[faulted]);
    return;
  }

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
  if (path == RecordReadPath::kUring || path == RecordReadPath::kPread) {
    ReadThroughBackend(files, wants, runs, out_at, out, options, path, by_env);
    return;
  }
  // Some file cannot be mapped (vm.max_map_count reached, a file system
  // without mmap): its runs are read with pread, an fd opened once per call;
  // the others are copied from their mappings.
  std::vector<int> fds(files.num_files(), -1);
  struct Closer {
    std::vector<int>* fds;
    ~Closer() {
      for (int fd : *fds)
        if (fd >= 0) ::close(fd);
    }
  } closer{&fds};
  bool any_pread = false;
  for (const Run& run : runs) {
    const size_t f = wants[run.first].file;
    if (maps[f] != nullptr || fds[f] >= 0) continue;
    const RecordIndex& index = files.file(f);
    WorkFile file = OpenWorkFile(index.path, &index.identity);
    if (file.fd < 0) throw Error(file.kind, file.error);
    fds[f] = file.fd;
    any_pread = true;
  }
  auto one = [&](size_t k) {
    const Run& run = runs[k];
    const size_t f = wants[run.first].file;
    if (maps[f] == nullptr) {
      ReadRun(files, wants, run, fds[f], out_at, out);
      return;
    }
    size_t faulted = 0;
    if (!CopyWants(files, wants, run.first, run.last, maps, out_at, out, &faulted))
      ThrowFaulted(files, wants[faulted]);
  };
  // Threads only help reads (a cold disk); copies run here.
  if (threads <= 1 || runs.size() < 2 || !any_pread) {
    for (size_t k = 0; k < runs.size(); ++k) one(k);
    return;
  }
  tbb::task_arena arena(std::min(static_cast<int>(threads), tbb::info::default_concurrency()));
  arena.execute([&] { tbb::parallel_for(size_t{0}, runs.size(), one); });
}

}  // namespace tailcut
