// tailcut/record_index.h: where every record of a file lies, found once and
// kept, so that records can be read in any order (global shuffle).
//
// A RecordIndex lists, for each record of one file in file order, the file
// offset and size of its payload: the bytes a reader hands out (a line
// without its '\n' and trailing '\r', a TFRecord's data, a tar sample's raw
// bytes, a fixed-size record). Fixed-size records are computed, never
// stored; "file" is one record; lines and tar are found by one sequential
// pass through the same RecordParser the Reader uses
// (tailcut/record_format.h), TFRecord by a pass over its headers (each
// length and its CRC checked, the data skipped: its CRC is checked as each
// record is read). A damaged file is an error naming the file and the
// offset.
//
// The index is kept in a cache directory (RecordIndexOptions::cache_dir), one
// file per (absolute path, format), tied to the data file's identity
// (device, inode, size, mtime). A later build whose file still has that
// identity loads it instead of scanning (a second run pays nothing); one
// whose file changed, or whose cache file is damaged or not ours, scans
// again and says so through the notice callback.
//
// RecordFiles joins the indexes of several files into one numbering: record
// r of the data set is record r - first(f) of file f. ReadRecords reads any
// set of them: copied from mappings of the files, or with as few reads as
// possible (positions sorted, records that touch or nearly touch coalesced
// into one read, reads issued in parallel).
//
// Contract
//  * Control path throughout: functions allocate, make system calls and
//    throw tailcut::Error naming the file (and the offset, for a record that
//    does not parse, kCorrupt).
//  * BuildRecordFiles may run its callbacks on any of its threads, one at a
//    time (serialised by it). A built RecordFiles is immutable: any thread
//    may read it and call ReadRecords on it.
//  * The data files must not change once indexed: ReadRecords checks each
//    file's identity when it opens it (kConfigMismatch / kIo on a change,
//    as tailcut/work_file.h does for a queue's files) and each TFRecord's
//    data CRC again as it reads it.
#ifndef TAILCUT_RECORD_INDEX_H_
#define TAILCUT_RECORD_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tailcut/error.h"
#include "tailcut/export.h"
#include "tailcut/record_format.h"
#include "tailcut/work_queue.h"

namespace tailcut {

// The records of one file.
struct TAILCUT_EXPORT RecordIndex {
  std::string path;
  FileIdentity identity;
  RecordFormat format;
  // kFixed: empty (record i is at i * record_bytes); otherwise one entry per
  // record, ascending.
  std::vector<uint64_t> offsets;  // file offset of each record's payload
  std::vector<uint64_t> sizes;    // its payload's size in bytes
  uint64_t count = 0;             // records in the file

  uint64_t Offset(uint64_t i) const noexcept {
    return offsets.empty() ? i * format.record_bytes : offsets[i];
  }
  uint64_t Size(uint64_t i) const noexcept {
    return sizes.empty() ? format.record_bytes : sizes[i];
  }
};

struct RecordIndexOptions {
  // Where indexes are kept ("" keeps none: every build scans). Created (0700)
  // when missing. DefaultRecordIndexDir() is $TAILCUT_INDEX_DIR, else
  // $XDG_CACHE_HOME/tailcut/index, else ~/.cache/tailcut/index.
  std::string cache_dir;
  // Files indexed at once (0: one per hardware thread, at most 8).
  size_t threads = 0;
  // A one-line notice: an index rebuilt because its file changed, a cache
  // that cannot be written.
  std::function<void(const std::string&)> notice;
  // Progress of a build: files done of total, bytes scanned so far (loaded
  // indexes count as done with no bytes scanned).
  std::function<void(size_t files_done, size_t files_total, uint64_t bytes_scanned)> progress;
};

TAILCUT_EXPORT std::string DefaultRecordIndexDir();

// The index of one file: loaded from options.cache_dir when it holds one of
// this file as it is now, else built by one pass and stored there. Throws
// tailcut::Error naming the file (and the offset of a record that does not
// parse). Any format: fixed and file are computed, never cached.
TAILCUT_EXPORT std::shared_ptr<const RecordIndex> LoadOrBuildRecordIndex(
    const std::string& path, const RecordFormat& format, const RecordIndexOptions& options,
    bool* scanned = nullptr);

// How ReadRecords reaches the records' bytes (docs/shuffle.md, "Reads", has
// the numbers behind the default).
enum class RecordReadPath {
  // kUring where the environment has TAILCUT_IO=uring (the variable the
  // Reader honours), else kMap: TAILCUT_IO=pread, which makes the Reader's
  // hot reads faster, would make records' slower, so it keeps the mapping.
  // Another value of TAILCUT_IO is kInvalidArgument, as for the Reader.
  kDefault,
  // Copies from a mapping of each file: the fastest with the page cache hot
  // (a copy per record, no system call); on a cold disk each copy faults in
  // its page, one fault at a time. A file that cannot be mapped is read with
  // pread, `threads` reads at once.
  kMap,
  // One io_uring per thread: the batch's reads (sorted, coalesced) submitted
  // together, up to queue_depth in flight, so a cold disk serves them in
  // parallel. Where io_uring is unavailable (old kernel, seccomp,
  // kernel.io_uring_disabled), the same reads by pread threads, with a
  // one-line notice once per process.
  kUring,
  // The reads of kUring by pread threads (max(threads, 2) of them).
  kPread,
};

struct ReadRecordsOptions {
  RecordReadPath path = RecordReadPath::kDefault;
  // kMap's pread fallback: reads at once; kPread: pread threads (at least 2).
  size_t threads = 1;
  // Records at most max_gap bytes apart are read by one read.
  uint64_t max_gap = 4096;
  // kUring and kPread: reads in flight at once (1 to 4096).
  uint32_t queue_depth = 64;
  // kUring and kPread: O_DIRECT reads (offsets, lengths and buffers aligned
  // to the file's direct-I/O alignment), bypassing the page cache. A file
  // whose filesystem refuses O_DIRECT is read buffered, with a notice once
  // per filesystem.
  bool direct = false;
  // Where one-line notices go (the fallbacks above). Default: stderr.
  std::function<void(const std::string&)> on_notice;
};

// Several files numbered as one data set.
namespace detail {
class RecordMaps;
}  // namespace detail

class TAILCUT_EXPORT RecordFiles {
 public:
  RecordFiles();
  ~RecordFiles();
  RecordFiles(const RecordFiles&) = delete;
  RecordFiles& operator=(const RecordFiles&) = delete;

  // The indexes of `paths` (LoadOrBuildRecordIndex), options.threads at a
  // time. The first error met is thrown (naming its file) once the others
  // have finished.
  static std::shared_ptr<const RecordFiles> Build(const std::vector<std::string>& paths,
                                                  const RecordFormat& format,
                                                  const RecordIndexOptions& options);

  uint64_t size() const noexcept { return total_; }
  size_t num_files() const noexcept { return files_.size(); }
  const RecordIndex& file(size_t f) const noexcept { return *files_[f]; }
  // Files whose index was scanned by Build (the others were loaded).
  size_t files_scanned() const noexcept { return scanned_; }
  // Where record r (< size()) lies: its file and its number in that file.
  void Locate(uint64_t r, size_t* file, uint64_t* record_in_file) const noexcept;

 private:
  std::vector<std::shared_ptr<const RecordIndex>> files_;
  std::vector<uint64_t> first_;  // first_[f]: the number of file f's first record
  uint64_t total_ = 0;
  size_t scanned_ = 0;
  // The files mapped for ReadRecords, each on first use (under its own lock).
  const std::unique_ptr<detail::RecordMaps> maps_;

  friend void ReadRecords(const RecordFiles&, const std::vector<uint64_t>&, std::string*,
                          std::vector<uint64_t>*, const ReadRecordsOptions&);
};

// The payloads of records `positions` (numbers of `files`, any order,
// repeats allowed), in the order asked, appended to *data: record k is
// data[ends[k] - size_k, ends[k]), *ends gets one entry per position (the
// end of each in *data). options.path says how bytes are read (see
// RecordReadPath). A TFRecord's data CRC is checked as it is read.
//
// kMap: each file is mapped (read-only, shared) on first use and records are
// copied from the mapping in the order asked (sorting pays for reads, not
// for copies). A file that cannot be mapped is read as below: records sorted
// by file and offset, those at most options.max_gap bytes apart in one
// read. A file truncated under a mapping faults (SIGBUS)
// on the copy: the copy catches that fault (a handler that passes every
// other SIGBUS on to the one it replaced) and throws.
// kUring, kPread: records sorted by file and offset, those at most
// options.max_gap bytes apart in one read; reads go to the device through a
// staging buffer; short
// reads are continued, -EAGAIN/-EINTR retried, a read that fails or ends
// early is an error naming file and offset, after every read in flight has
// completed.
//
// Throws tailcut::Error: kInvalidArgument for a position out of range or a
// bad option, the file's error when it cannot be opened or changed, kIo
// naming file and offset for a failed read or a file that ends early,
// kCorrupt naming file and offset for a TFRecord whose data CRC fails.
TAILCUT_EXPORT void ReadRecords(const RecordFiles& files, const std::vector<uint64_t>& positions,
                                std::string* data, std::vector<uint64_t>* ends,
                                const ReadRecordsOptions& options);

// The same with path kDefault.
TAILCUT_EXPORT void ReadRecords(const RecordFiles& files, const std::vector<uint64_t>& positions,
                                std::string* data, std::vector<uint64_t>* ends, size_t threads = 1,
                                uint64_t max_gap = 4096);

}  // namespace tailcut

#endif  // TAILCUT_RECORD_INDEX_H_
