#include "io/tar_index.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <list>
#include <mutex>
#include <tuple>

#include "tailcut/error.h"
#include "tailcut/work_file.h"

namespace tailcut::detail {
namespace {

// Most headers with their extended headers fit in one read of this size.
constexpr size_t kFirstRead = 4096;

struct Key {
  std::string path;
  uint64_t size, device, inode;
  int64_t mtime_ns;
  uint64_t max_extended_bytes;  // what counts as damage
  bool operator==(const Key& o) const {
    return std::tie(path, size, device, inode, mtime_ns, max_extended_bytes) ==
           std::tie(o.path, o.size, o.device, o.inode, o.mtime_ns, o.max_extended_bytes);
  }
};

// Reads [offset, offset + want) or up to file_size; false on a read error.
bool ReadAt(int fd, uint64_t offset, size_t want, std::string* out, int* err) {
  out->resize(want);
  size_t got = 0;
  while (got < want) {
    const ssize_t n = ::pread(fd, out->data() + got, want - got, static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *err = errno;
      return false;
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  out->resize(got);
  return true;
}

std::shared_ptr<TarIndex> Scan(int fd, const std::string& path, uint64_t file_size,
                               uint64_t max_extended_bytes) {
  auto index = std::make_shared<TarIndex>();
  std::string buffer, key;  // key: the current run's, as text
  bool in_run = false;
  uint64_t offset = 0;
  size_t want = kFirstRead;
  while (offset < file_size) {
    const size_t ask = static_cast<size_t>(std::min<uint64_t>(want, file_size - offset));
    int err = 0;
    if (!ReadAt(fd, offset, ask, &buffer, &err))
      throw Error(ErrorKind::kIo, "tar file '" + path + "' at offset " + std::to_string(offset) +
                                      ": read failed: " + std::strerror(err));
    const bool at_end = offset + buffer.size() >= file_size || buffer.size() < ask;
    TarEntry e;
    TarError error;
    const TarDecode d =
        DecodeTarEntry(reinterpret_cast<const std::byte*>(buffer.data()), buffer.size(), at_end,
                       offset, max_extended_bytes, &e, &error);
    if (d == TarDecode::kNeedMore) {
      want *= 2;  // a long extended header: read more of it
      continue;
    }
    if (d == TarDecode::kEnd) break;
    if (d == TarDecode::kError) {
      index->damaged = true;
      index->error = error;
      break;
    }
    if (e.truncated) {  // a sample may start here, but none after it
      if (e.member && (!in_run || e.path.ToString().substr(0, e.path.KeyLength()) != key))
        index->starts.push_back(e.start);
      index->damaged = true;
      index->error = error;
      break;
    }
    if (e.member) {
      std::string this_key = e.path.ToString().substr(0, e.path.KeyLength());
      if (!in_run || this_key != key) index->starts.push_back(e.start);
      key = std::move(this_key);
      in_run = true;
    } else if (e.size > 0) {
      in_run = false;  // skipped data ends a run (io/tar_header.h)
    }
    offset = e.next;
    want = kFirstRead;
  }
  return index;
}

}  // namespace

std::shared_ptr<const TarIndex> TarSampleIndex(const std::string& path, uint64_t file_size,
                                               uint64_t max_extended_bytes) {
  WorkFile file = OpenWorkFile(path, nullptr);
  if (file.fd < 0) throw Error(file.kind, file.error);
  const Key key{path,
                file_size,
                static_cast<uint64_t>(file.st.st_dev),
                static_cast<uint64_t>(file.st.st_ino),
                static_cast<int64_t>(file.st.st_mtim.tv_sec) * 1000000000 + file.st.st_mtim.tv_nsec,
                max_extended_bytes};
  static std::mutex mutex;
  static std::list<std::pair<Key, std::shared_ptr<const TarIndex>>> cache;  // most recent first
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto it = cache.begin(); it != cache.end(); ++it) {
      if (!(it->first == key)) continue;
      cache.splice(cache.begin(), cache, it);
      ::close(file.fd);
      return cache.front().second;
    }
  }
  std::shared_ptr<const TarIndex> index;
  try {
    index = Scan(file.fd, path, file_size, max_extended_bytes);
  } catch (...) {
    ::close(file.fd);
    throw;
  }
  ::close(file.fd);
  std::lock_guard<std::mutex> lock(mutex);
  cache.emplace_front(key, index);
  if (cache.size() > kTarIndexCacheFiles) cache.pop_back();
  return index;
}

}  // namespace tailcut::detail
