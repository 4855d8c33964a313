// Record indexes: one sequential pass per file through the Reader's parser,
// kept in a cache directory tied to the file's identity, built for many
// files at once (see tailcut/record_index.h).
//
// Cache file layout (little-endian, as the host writes it; a file of another
// layout fails the magic or the CRC and is rebuilt):
//   "TCRIDX01"  u32 version  u32 reserved
//   u64 size  u64 mtime_ns  u64 inode  u64 device  u64 count
//   u32 path_bytes  u32 tag_bytes  path  tag
//   u64 offsets[count]  u64 sizes[count]
//   u32 CRC32C of every byte before it
#include "tailcut/record_index.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>

#include "tailcut/crc32c.h"

namespace tailcut {

namespace {

constexpr char kMagic[8] = {'T', 'C', 'R', 'I', 'D', 'X', '0', '1'};
constexpr uint32_t kVersion = 1;
// Bytes per read of the scan, at least. Small enough that the window stays in
// the core's L2 cache between the read's copy and the scan's look at it (as
// cat's 128 KiB buffer does): with 4 MiB the scan of 128-byte TFRecords ran at
// half cat's speed, a third of it in the copy.
constexpr size_t kScanBytes = 256 << 10;

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

[[noreturn]] void ThrowErrno(const std::string& what, int err) {
  throw Error(ErrorKindOfErrno(err), what + ": " + std::strerror(err));
}

// Reads up to `want` bytes at `at`; fewer only at the end of the file.
size_t ReadAt(int fd, char* out, size_t want, uint64_t at, const std::string& path) {
  size_t got = 0;
  while (got < want) {
    ssize_t n = ::pread(fd, out + got, want - got, static_cast<off_t>(at + got));
    if (n < 0) {
      if (errno == EINTR) continue;
      ThrowErrno(
          "file '" + Printable(path) + "' at offset " + std::to_string(at + got) + ": read failed",
          errno);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  return got;
}

uint64_t Fnv64(std::string_view text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The cache file of (path, format): readable names, a hash to keep them apart.
std::string CachePath(const std::string& dir, const std::string& absolute, const std::string& tag) {
  std::string base = std::filesystem::path(absolute).filename().string();
  if (base.size() > 80) base.resize(80);
  for (char& c : base)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx",
                static_cast<unsigned long long>(Fnv64(absolute + '\0' + tag)));
  std::string kind = tag.substr(0, tag.find(':'));
  return dir + "/" + base + "." + hash + "." + kind + ".tcidx";
}

template <typename T>
void Put(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof value);
}

class Cursor {
 public:
  explicit Cursor(std::string_view bytes) : bytes_(bytes) {}
  template <typename T>
  bool Get(T* value) {
    if (bytes_.size() - at_ < sizeof(T)) return false;
    std::memcpy(value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool Take(size_t n, std::string_view* out) {
    if (bytes_.size() - at_ < n) return false;
    *out = bytes_.substr(at_, n);
    at_ += n;
    return true;
  }
  size_t left() const { return bytes_.size() - at_; }

 private:
  std::string_view bytes_;
  size_t at_ = 0;
};

std::string Encode(const RecordIndex& index, const std::string& absolute, const std::string& tag) {
  std::string out(kMagic, sizeof kMagic);
  Put<uint32_t>(&out, kVersion);
  Put<uint32_t>(&out, 0);
  Put(&out, index.identity.size);
  Put(&out, index.identity.mtime_ns);
  Put(&out, index.identity.inode);
  Put(&out, index.identity.device);
  Put(&out, index.count);
  Put<uint32_t>(&out, static_cast<uint32_t>(absolute.size()));
  Put<uint32_t>(&out, static_cast<uint32_t>(tag.size()));
  out += absolute;
  out += tag;
  const size_t arrays = index.offsets.size() * sizeof(uint64_t);
  out.append(reinterpret_cast<const char*>(index.offsets.data()), arrays);
  out.append(reinterpret_cast<const char*>(index.sizes.data()), arrays);
  Put<uint32_t>(&out, Crc32c(out.data(), out.size()));
  return out;
}

// What a cache file says, or why it cannot be used ("" when it can).
struct Cached {
  FileIdentity identity;
  std::vector<uint64_t> offsets, sizes;
  uint64_t count = 0;
};

std::string Decode(std::string_view bytes, const std::string& absolute, const std::string& tag,
                   Cached* out) {
  if (bytes.size() < sizeof kMagic + 4 || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    return "not a record index (bad magic)";
  uint32_t crc;
  std::memcpy(&crc, bytes.data() + bytes.size() - 4, 4);
  if (Crc32c(bytes.data(), bytes.size() - 4) != crc) return "damaged (CRC mismatch)";
  Cursor c(bytes.substr(sizeof kMagic, bytes.size() - sizeof kMagic - 4));
  uint32_t version, reserved, path_bytes, tag_bytes;
  std::string_view path, file_tag;
  if (!c.Get(&version) || version != kVersion) return "of another version";
  if (!c.Get(&reserved) || !c.Get(&out->identity.size) || !c.Get(&out->identity.mtime_ns) ||
      !c.Get(&out->identity.inode) || !c.Get(&out->identity.device) || !c.Get(&out->count) ||
      !c.Get(&path_bytes) || !c.Get(&tag_bytes) || !c.Take(path_bytes, &path) ||
      !c.Take(tag_bytes, &file_tag))
    return "damaged (short header)";
  if (path != absolute || file_tag != tag) return "of another file (hash collision)";
  if (out->count > c.left() / 16 || c.left() != out->count * 16) return "damaged (bad length)";
  out->offsets.resize(out->count);
  out->sizes.resize(out->count);
  std::string_view arrays;
  c.Take(out->count * 8, &arrays);
  std::memcpy(out->offsets.data(), arrays.data(), arrays.size());
  c.Take(out->count * 8, &arrays);
  std::memcpy(out->sizes.data(), arrays.data(), arrays.size());
  uint64_t last_end = 0;
  for (uint64_t i = 0; i < out->count; ++i) {
    if (out->offsets[i] < last_end || out->sizes[i] > out->identity.size ||
        out->offsets[i] > out->identity.size - out->sizes[i])
      return "damaged (record " + std::to_string(i) + " out of order or past the file's end)";
    last_end = out->offsets[i] + out->sizes[i];
  }
  return "";
}

// Reads a cache file of ours: a regular file owned by this user. Returns
// false (with a reason, or none when there is no file) otherwise.
bool ReadCacheFile(const std::string& path, std::string* bytes, std::string* why) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno != ENOENT) *why = std::string("cannot be opened: ") + std::strerror(errno);
    return false;
  }
  Fd guard(fd);
  struct ::stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    *why = "is not a regular file";
    return false;
  }
  if (st.st_uid != ::geteuid()) {
    *why = "belongs to another user (uid " + std::to_string(st.st_uid) + ")";
    return false;
  }
  bytes->resize(static_cast<size_t>(st.st_size));
  try {
    if (ReadAt(fd, bytes->data(), bytes->size(), 0, path) != bytes->size()) {
      *why = "changed while read";
      return false;
    }
  } catch (const Error& e) {
    *why = e.what();
    return false;
  }
  return true;
}

// Writes the cache file whole or not at all: a private temporary file
// (created exclusively, 0600) renamed over it. Returns "" or why not.
std::string WriteCacheFile(const std::string& dir, const std::string& path,
                           const std::string& bytes) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    std::error_code ec;  // a missing parent: make it too
    std::filesystem::create_directories(dir, ec);
    if (ec) return "cannot create '" + Printable(dir) + "': " + ec.message();
  }
  static std::atomic<uint64_t> serial{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." +
                          std::to_string(serial.fetch_add(1, std::memory_order_relaxed));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return "cannot create '" + Printable(tmp) + "': " + std::strerror(errno);
  size_t put = 0;
  while (put < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + put, bytes.size() - put);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string why = std::strerror(n < 0 ? errno : EIO);
      ::close(fd);
      ::unlink(tmp.c_str());
      return "cannot write '" + Printable(tmp) + "': " + why;
    }
    put += static_cast<size_t>(n);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    return "cannot rename to '" + Printable(path) + "': " + why;
  }
  return "";
}

// One pass over the file with the Reader's parser.
void Scan(int fd, const std::string& path, RecordIndex* index) {
  const uint64_t file_size = index->identity.size;
  std::unique_ptr<RecordParser> parser = RecordParser::Create(index->format);
  uint64_t pos = parser->Begin(path, file_size, 0, file_size);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::string window;
  size_t used = 0;
  bool eof = false;
  auto read_more = [&](size_t at_least) {
    if (used > 0) {
      window.erase(0, used);
      used = 0;
    }
    const size_t want = std::max(kScanBytes, at_least);
    const size_t have = window.size();
    window.resize(have + want);
    const uint64_t at = pos + have;
    const size_t got = ReadAt(fd, window.data() + have, want, at, path);
    window.resize(have + got);
    eof = got < want || at + got >= file_size;
  };
  read_more(0);
  for (;;) {
    Record record;
    size_t consumed = 0;
    const std::byte* data = reinterpret_cast<const std::byte*>(window.data()) + used;
    const uint64_t window_at = pos;  // the file offset of data[0]
    ParseStatus status = parser->Next(data, window.size() - used, eof, &record, &consumed);
    used += consumed;
    pos += consumed;
    if (status == ParseStatus::kRecord) {
      index->offsets.push_back(window_at + static_cast<uint64_t>(record.data - data));
      index->sizes.push_back(record.size);
    } else if (status == ParseStatus::kNeedMore) {
      if (eof)
        throw Error(ErrorKind::kCorrupt, "file '" + Printable(path) + "' at offset " +
                                             std::to_string(pos) +
                                             ": the parser asked for bytes past the end");
      read_more(window.size() - used);
    } else if (status == ParseStatus::kDone) {
      break;
    } else {
      throw Error(ErrorKind::kCorrupt, parser->error());
    }
  }
  index->count = index->offsets.size();
}

// TFRecord: each record's 12-byte header is checked here (its length and the
// length's CRC) and its data skipped; the data CRC is checked as each record is
// read (ReadRecords), so no record reaches a reader unchecked while the scan
// costs a read of the file, not a CRC of every byte of it (the CRC alone ran
// at about the speed of `cat` from the page cache). Reads go forward in
// kScanBytes windows; a record longer than a window is skipped, not read.
void ScanTfrecord(int fd, const std::string& path, RecordIndex* index) {
  constexpr uint64_t kHeader = 12, kOverhead = 16;  // u64 length, u32 CRC; u32 data CRC
  constexpr size_t kSampleRecords = 256;            // records that size the index's vectors
  const uint64_t size = index->identity.size;
  auto fail = [&](uint64_t at, const std::string& what) {
    throw Error(ErrorKind::kCorrupt, "tfrecord file '" + Printable(path) + "' at offset " +
                                         std::to_string(at) + ": " + what);
  };
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::string window(kScanBytes, '\0');
  uint64_t window_at = 0;
  size_t window_size = 0;
  uint64_t pos = 0;
  while (pos < size) {
    if (size - pos < kHeader)
      fail(pos, "truncated record: " + std::to_string(size - pos) +
                    " header bytes, the file ends at " + std::to_string(size) +
                    " (file cut short?)");
    if (pos < window_at || pos + kHeader > window_at + window_size) {
      window_at = pos;
      window_size = ReadAt(fd, window.data(), window.size(), pos, path);
      if (window_size < kHeader)
        fail(pos, "the file ends at " + std::to_string(pos + window_size) +
                      " while it was indexed (changed under the scan?)");
    }
    const char* header = window.data() + (pos - window_at);
    uint64_t length;
    uint32_t length_crc;
    std::memcpy(&length, header, 8);
    std::memcpy(&length_crc, header + 8, 4);
    if (MaskCrc32c(Crc32c(header, 8)) != length_crc)
      fail(pos, "length CRC mismatch (record corrupt or not a TFRecord file)");
    if (length > index->format.max_record_bytes)
      fail(pos, "record of " + std::to_string(length) + " bytes is longer than max_record_bytes (" +
                    std::to_string(index->format.max_record_bytes) +
                    "); raise max_record_bytes if the file is right");
    if (size - pos < kOverhead || length > size - pos - kOverhead)
      fail(pos, "truncated record: header says " + std::to_string(length) +
                    " data bytes, the file ends at " + std::to_string(size) + " (file cut short?)");
    index->offsets.push_back(pos + kHeader);
    index->sizes.push_back(length);
    pos += kOverhead + length;
    if (index->offsets.size() == kSampleRecords) {
      // The file's records as long as its first ones on average: reserved
      // once, where growing by doubling copied the vectors and faulted in
      // new pages several times (a tenth of a scan of 128-byte records). An
      // estimate too high reserves address space, not memory (pages are
      // touched as records are appended), and is given back below.
      const uint64_t estimate = size / (pos / kSampleRecords) + 1;
      index->offsets.reserve(estimate);
      index->sizes.reserve(estimate);
    }
  }
  index->count = index->offsets.size();
  if (index->offsets.capacity() > 2 * index->count + 1024) {  // the estimate was far off
    index->offsets.shrink_to_fit();
    index->sizes.shrink_to_fit();
  }
}

}  // namespace

std::string DefaultRecordIndexDir() {
  if (const char* dir = std::getenv("TAILCUT_INDEX_DIR"); dir && *dir) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::string(xdg) + "/tailcut/index";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/tailcut/index";
  return "/tmp/tailcut-index-" + std::to_string(::geteuid());
}

std::shared_ptr<const RecordIndex> LoadOrBuildRecordIndex(const std::string& path,
                                                          const RecordFormat& format,
                                                          const RecordIndexOptions& options,
                                                          bool* scanned) {
  if (scanned) *scanned = false;
  auto index = std::make_shared<RecordIndex>();
  index->path = path;
  index->format = format;
  const std::string shown = Printable(path);
  int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (raw < 0) ThrowErrno("record file '" + shown + "': cannot open", errno);
  Fd fd(raw);
  struct ::stat st;
  if (::fstat(fd.get(), &st) != 0) ThrowErrno("record file '" + shown + "': cannot stat", errno);
  if (!S_ISREG(st.st_mode))
    throw Error(ErrorKind::kInvalidArgument,
                "record file '" + shown + "' is not a regular file: give files of records");
  index->identity = IdentityOf(st);
  const uint64_t size = index->identity.size;
  if (format.kind == RecordFormatKind::kFixed) {
    RecordParser::Create(format)->Begin(path, size, 0, size);  // size a multiple of record_bytes
    index->count = size / format.record_bytes;
    return index;
  }
  if (format.kind == RecordFormatKind::kFile) {
    index->offsets = {0};
    index->sizes = {size};
    index->count = 1;
    return index;
  }
  std::error_code ec;
  const std::string absolute = std::filesystem::absolute(path, ec).lexically_normal().string();
  const std::string tag = format.Tag();
  std::string cache;
  if (!options.cache_dir.empty()) {
    cache = CachePath(options.cache_dir, ec ? path : absolute, tag);
    std::string bytes, why;
    if (ReadCacheFile(cache, &bytes, &why)) {
      Cached cached;
      why = Decode(bytes, ec ? path : absolute, tag, &cached);
      if (why.empty() && cached.identity == index->identity) {
        index->offsets = std::move(cached.offsets);
        index->sizes = std::move(cached.sizes);
        index->count = cached.count;
        return index;
      }
      if (why.empty())
        why = "the file changed since it was indexed (" +
              DescribeFileChange(cached.identity, index->identity) + ")";
    }
    if (!why.empty() && options.notice)
      options.notice("record index of '" + shown + "' rebuilt: its cache '" + Printable(cache) +
                     "' " + (why.rfind("the file", 0) == 0 ? "is stale: " : "") + why);
  }
  if (format.kind == RecordFormatKind::kTfrecord)
    ScanTfrecord(fd.get(), path, index.get());
  else
    Scan(fd.get(), path, index.get());
  if (scanned) *scanned = true;
  // The file must not have changed under the scan: an index of a file being
  // written is wrong at once.
  struct ::stat after;
  if (::fstat(fd.get(), &after) == 0 && !(IdentityOf(after) == index->identity))
    throw Error(ErrorKind::kIo, "record file '" + shown + "' changed while it was indexed (" +
                                    DescribeFileChange(index->identity, IdentityOf(after)) +
                                    "): index it once it is complete");
  if (!cache.empty()) {
    std::string why =
        WriteCacheFile(options.cache_dir, cache, Encode(*index, ec ? path : absolute, tag));
    if (!why.empty() && options.notice)
      options.notice("record index of '" + shown + "' not kept (" + why +
                     "): the next run indexes it again; set TAILCUT_INDEX_DIR to a writable "
                     "directory");
  }
  return index;
}

std::shared_ptr<const RecordFiles> RecordFiles::Build(const std::vector<std::string>& paths,
                                                      const RecordFormat& format,
                                                      const RecordIndexOptions& options) {
  auto files = std::make_shared<RecordFiles>();
  const size_t n = paths.size();
  files->files_.resize(n);
  std::vector<char> scanned(n, 0);
  std::vector<std::exception_ptr> errors(n);
  std::mutex callbacks;  // one callback at a time, whatever thread
  size_t done = 0;
  uint64_t bytes = 0;
  RecordIndexOptions serial = options;
  if (options.notice)
    serial.notice = [&](const std::string& line) {
      std::lock_guard<std::mutex> lock(callbacks);
      options.notice(line);
    };
  size_t threads = options.threads;
  const size_t cores = static_cast<size_t>(tbb::info::default_concurrency());
  if (threads == 0) threads = std::min<size_t>(cores, 8);
  // No more threads than files, nor than the machine has (oneTBB warns, and they would take turns).
  tbb::task_arena arena(static_cast<int>(std::clamp<size_t>(std::min(threads, n), 1, cores)));
  arena.execute([&] {
    tbb::parallel_for(size_t{0}, n, [&](size_t i) {
      bool did_scan = false;
      try {
        files->files_[i] = LoadOrBuildRecordIndex(paths[i], format, serial, &did_scan);
      } catch (...) {
        errors[i] = std::current_exception();
      }
      scanned[i] = did_scan;
      std::lock_guard<std::mutex> lock(callbacks);
      ++done;
      if (did_scan) bytes += files->files_[i]->identity.size;
      if (options.progress) options.progress(done, n, bytes);
    });
  });
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  files->first_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    files->first_[i] = files->total_;
    files->total_ += files->files_[i]->count;
    files->scanned_ += scanned[i] ? 1 : 0;
  }
  return files;
}

void RecordFiles::Locate(uint64_t r, size_t* file, uint64_t* record_in_file) const noexcept {
  // The last file whose first record is <= r. It holds r: the next file's
  // first record is > r, and files with no records share their first with
  // the file after them, so the last of those equal firsts is never empty.
  // (No look at the file's own index: that was a cache miss per record.)
  auto it = std::upper_bound(first_.begin(), first_.end(), r);
  const size_t f = static_cast<size_t>(it - first_.begin()) - 1;
  *file = f;
  *record_in_file = r - first_[f];
}

}  // namespace tailcut
