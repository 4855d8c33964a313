// tailcut/record_format.h: how bytes of a file slice become records.
//
// The rule for every format: a slice [begin, end) of a file owns exactly the
// records that START inside it. A parser therefore starts at the first record
// boundary at or after begin (it may ask to be fed from a little before begin,
// see Begin) and reads past end to finish the last record it owns. Slices of
// one file, read independently, yield every record of the file exactly once.
//
// Formats
//  * fixed:    records of record_bytes each; a file whose size is not a
//              multiple of record_bytes is an error that names it.
//  * lines:    newline-delimited; a trailing '\r' is stripped; a last line
//              without '\n' is kept; an empty file has no records.
//  * tfrecord: u64 length, u32 masked CRC32C of the length, data, u32 masked
//              CRC32C of the data (little-endian); both CRCs are checked. A
//              slice that starts mid-file resynchronises by scanning for a
//              header whose length CRC matches and whose data CRC confirms it.
//              The slice before it checks the first record past its own end,
//              so a corrupt record there is reported, not skipped by both.
//  * file:     the whole file is one record, owned by the slice with begin 0
//              (and end > 0, unless the file is empty).
//  * tar:      a WebDataset shard: a record is one sample, the run of
//              consecutive regular members whose paths share a key (the path
//              up to the first '.' of its basename), from its first member's
//              first header block to the end of its last member's padded
//              data; tailcut/tar_sample.h splits it into members. ustar, GNU
//              long names and pax path/size are read; directories and other
//              non-regular members are skipped. Tar cannot be resynchronised
//              mid-file, so a slice that begins past offset 0 finds its first
//              sample in an index of sample starts, built by one pass over
//              the file's headers (data skipped by size) and cached per
//              process. A damaged header (checksum), a size that is neither
//              octal nor base-256, or a member cut short is an error naming
//              the file and offset.
// docs/record_formats.md has the details and the false-match odds.
//
// Contract
//  * A RecordParser serves one slice at a time and one thread at a time. It
//    owns no file and no buffer: the caller feeds it windows of file bytes and
//    keeps them alive while it uses the returned Record.
//  * Begin is control path (may throw tailcut::Error); Next, SetEnd and the
//    accessors are hot path: noexcept, no allocation, no system call.
#ifndef TAILCUT_RECORD_FORMAT_H_
#define TAILCUT_RECORD_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "tailcut/error.h"
#include "tailcut/export.h"

namespace tailcut {

enum class RecordFormatKind { kFixed, kLines, kTfrecord, kFile, kTar };

struct TAILCUT_EXPORT RecordFormat {
  RecordFormatKind kind = RecordFormatKind::kLines;
  uint64_t record_bytes = 0;                // kFixed only; > 0
  uint64_t max_record_bytes = 64ull << 20;  // larger records are an error

  // Parses "fixed", "lines", "tfrecord", "file" or "tar". record_bytes is required
  // for (and only allowed with) "fixed". Throws kInvalidArgument naming the
  // bad value and the accepted ones.
  static RecordFormat Parse(std::string_view name, uint64_t record_bytes = 0);
  // A stable tag for queue fingerprints, e.g. "fixed:128", "tfrecord".
  std::string Tag() const;
  // Whether a queue's format tag (WorkQueueOptions::format) allows reading
  // it in this format: an empty tag, or one that names no format (a tag of
  // the user's own), allows any; otherwise the kinds must match, and
  // "fixed:<n>" the record size ("fixed" alone allows any). max_record_bytes
  // is not compared.
  bool FitsTag(std::string_view tag) const;
};

// One record: a view into the window last passed to Next. Valid until the
// window's bytes are released or changed by the caller.
struct Record {
  const std::byte* data = nullptr;
  size_t size = 0;
  uint64_t offset = 0;  // file offset where the record starts (its header, for tfrecord and tar)
  // File offset just past the record (its trailing newline or CRC included):
  // where the next record starts, so the value to pass to WorkQueue::Commit
  // once this record is handed on. It may lie past the slice's end (the last
  // record a slice owns may end in the next one).
  uint64_t end = 0;
};

enum class ParseStatus {
  kRecord,    // *record is set; *consumed bytes of the window are used up
  kNeedMore,  // feed again from the current position with more bytes
  kDone,      // the slice has no more records
  kError,     // error() names the file, the offset and what is wrong
};

// A short lowercase name, e.g. "need more", for messages and logs.
TAILCUT_EXPORT const char* ParseStatusName(ParseStatus status) noexcept;

class TAILCUT_EXPORT RecordParser {
 public:
  static std::unique_ptr<RecordParser> Create(const RecordFormat& format);
  virtual ~RecordParser() = default;

  // Starts slice [begin, end) of `path`, a file of file_size bytes. Returns the
  // file offset from which the caller must feed bytes (<= begin; lines needs
  // the byte before begin). Throws tailcut::Error (e.g. fixed: size not a
  // multiple of record_bytes; begin/end out of range; tar with begin > 0: the
  // file cannot be read, or a damaged header hides where its samples start).
  virtual uint64_t Begin(std::string_view path, uint64_t file_size, uint64_t begin,
                         uint64_t end) = 0;

  // Parses from the current position. `window` holds the file bytes
  // [position(), position() + size); `eof` says the window reaches the end of
  // the file. Sets *consumed to how many bytes of the window the caller may
  // drop (the next call's window starts after them). On kNeedMore the caller
  // feeds a larger window (at least one more byte, or eof); a record that
  // would exceed max_record_bytes is kError.
  // Call it until kDone or kError (both stick until the next Begin): tfrecord
  // reads through the first record at or after end() to check it. kNeedMore
  // may come with *consumed > 0 (bytes skipped on the way to the first owned
  // record), never with the rest of the file in the window. Bytes past the
  // file_size given to Begin are ignored.
  virtual ParseStatus Next(const std::byte* window, size_t size, bool eof, Record* record,
                           size_t* consumed) noexcept = 0;

  // Lowers the slice end (tail splitting): records starting at or after
  // new_end are no longer owned. new_end must be >= the current position; a
  // new_end above end() is ignored.
  virtual void SetEnd(uint64_t new_end) noexcept = 0;

  // File offset of the next byte to parse (everything before it is consumed).
  virtual uint64_t position() const noexcept = 0;
  virtual uint64_t end() const noexcept = 0;
  // Records returned since Begin.
  virtual uint64_t records() const noexcept = 0;
  // After kError: "tfrecord file '/d/a.tfrecord' at offset 1234: data CRC
  // mismatch (record corrupt or not a TFRecord file)".
  virtual const std::string& error() const noexcept = 0;
};

}  // namespace tailcut

#endif  // TAILCUT_RECORD_FORMAT_H_
