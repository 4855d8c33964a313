// Record parsers: one small state machine per format over windows of file
// bytes that the caller feeds. Formats, slice ownership and the TFRecord
// resync are explained in docs/record_formats.md.
#include "tailcut/record_format.h"

#include <algorithm>
#include <bit>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <utility>

#include "io/tar_header.h"
#include "io/tar_index.h"
#include "tailcut/crc32c.h"

namespace tailcut {
namespace detail {
namespace {

constexpr std::pair<std::string_view, RecordFormatKind> kFormatNames[] = {
    {"fixed", RecordFormatKind::kFixed},       {"lines", RecordFormatKind::kLines},
    {"tfrecord", RecordFormatKind::kTfrecord}, {"file", RecordFormatKind::kFile},
    {"tar", RecordFormatKind::kTar},
};

std::string_view FormatName(RecordFormatKind kind) {
  for (const auto& [name, k] : kFormatNames) {
    if (k == kind) return name;
  }
  return "unknown";
}

// One unaligned load each: the resync scan does one per byte position.
uint32_t LoadLe32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return std::endian::native == std::endian::little ? v : __builtin_bswap32(v);
}

uint64_t LoadLe64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return std::endian::native == std::endian::little ? v : __builtin_bswap64(v);
}

// memchr for '\n', safe for an empty window whose pointer may be null.
const std::byte* FindNewline(const std::byte* p, size_t n) {
  return n == 0 ? nullptr : static_cast<const std::byte*>(std::memchr(p, '\n', n));
}

// Room in error() for everything but the path, so that building an error
// message after Begin never allocates.
constexpr size_t kErrorRoom = 400;

// What all formats share: the slice, the position, the sticky end state and
// the error text. Next clamps the window to the file size the slice was cut
// from and hands it to the format's Step.
class ParserBase : public RecordParser {
 public:
  ParserBase(const RecordFormat& format, const char* what) : format_(format), what_(what) {}

  uint64_t Begin(std::string_view path, uint64_t file_size, uint64_t begin, uint64_t end) final {
    if (begin > end || end > file_size) {
      throw Error(ErrorKind::kInvalidArgument,
                  std::string(what_) + " '" + std::string(path) + "': slice [" +
                      std::to_string(begin) + ", " + std::to_string(end) +
                      ") is not inside the file (" + std::to_string(file_size) +
                      " bytes); slice the file again");
    }
    path_.assign(path);
    error_.clear();
    error_.reserve(path_.size() + kErrorRoom);
    file_size_ = file_size;
    begin_ = begin;
    end_ = end;
    records_ = 0;
    final_ = ParseStatus::kNeedMore;
    pos_ = Start();
    return pos_;
  }

  ParseStatus Next(const std::byte* window, size_t size, bool eof, Record* record,
                   size_t* consumed) noexcept final {
    *consumed = 0;
    if (final_ != ParseStatus::kNeedMore) return final_;
    // Bytes past the size the file was sliced at belong to no slice; a window
    // that ends early with eof means the file shrank, and parsing stops there.
    View w{window, size, eof};
    if (size >= file_size_ - pos_) w = View{window, static_cast<size_t>(file_size_ - pos_), true};
    ParseStatus status = Step(w, record, consumed);
    if (status == ParseStatus::kDone || status == ParseStatus::kError) final_ = status;
    return status;
  }

  void SetEnd(uint64_t new_end) noexcept override { end_ = std::min(end_, new_end); }
  uint64_t position() const noexcept final { return pos_; }
  uint64_t end() const noexcept final { return end_; }
  uint64_t records() const noexcept final { return records_; }
  const std::string& error() const noexcept final { return error_; }

 protected:
  struct View {
    const std::byte* p;
    size_t n;
    bool at_end;  // the window reaches the end of the file
  };

  // Format-specific part of Begin: checks the file, returns the feed offset.
  virtual uint64_t Start() = 0;
  // Format-specific part of Next; adds to *consumed what it uses up.
  virtual ParseStatus Step(View w, Record* record, size_t* consumed) noexcept = 0;

  ParseStatus Emit(const std::byte* data, size_t size, size_t used, Record* record,
                   size_t* consumed) noexcept {
    *record = Record{data, size, pos_, pos_ + used};
    pos_ += used;
    *consumed += used;
    ++records_;
    return ParseStatus::kRecord;
  }

  // Sets error() to "<what> '<path>' at offset <offset>: <message>".
  __attribute__((format(printf, 3, 4))) ParseStatus Fail(uint64_t offset, const char* format,
                                                         ...) noexcept {
    char message[kErrorRoom - 64];
    va_list args;
    va_start(args, format);
    vsnprintf(message, sizeof message, format, args);
    va_end(args);
    char at[40];
    snprintf(at, sizeof at, "' at offset %" PRIu64 ": ", offset);
    error_.assign(what_).append(" '").append(path_).append(at).append(message);
    return ParseStatus::kError;
  }

  const RecordFormat format_;
  const char* const what_;  // names the file in messages, e.g. "tfrecord file"
  std::string path_;
  std::string error_;
  uint64_t file_size_ = 0;
  uint64_t begin_ = 0;
  uint64_t end_ = 0;
  uint64_t pos_ = 0;
  uint64_t records_ = 0;
  ParseStatus final_ = ParseStatus::kDone;  // kDone or kError once reached; else kNeedMore
};

class FixedParser final : public ParserBase {
 public:
  explicit FixedParser(const RecordFormat& format)
      : ParserBase(format, "fixed-record file"), size_(format.record_bytes) {}

 private:
  uint64_t Start() override {
    if (file_size_ % size_ != 0) {
      throw Error(ErrorKind::kCorrupt,
                  "fixed-record file '" + path_ + "' is " + std::to_string(file_size_) +
                      " bytes, not a multiple of record_bytes " + std::to_string(size_) +
                      " (truncated file, or wrong record_bytes?)");
    }
    return begin_;
  }

  ParseStatus Step(View w, Record* record, size_t* consumed) noexcept override {
    uint64_t start = (pos_ + size_ - 1) / size_ * size_;
    if (start >= end_) return ParseStatus::kDone;
    size_t skip = start - pos_;  // only before the first record of a slice
    if (w.n - std::min(w.n, skip) < size_) {
      if (w.at_end) {
        return Fail(start,
                    "record of %" PRIu64 " bytes cut off: the file ends at %" PRIu64
                    " (it changed since it was sliced?)",
                    size_, pos_ + w.n);
      }
      size_t drop = std::min(w.n, skip);
      pos_ += drop;
      *consumed += drop;
      return ParseStatus::kNeedMore;
    }
    pos_ += skip;
    *consumed += skip;
    return Emit(w.p + skip, size_, size_, record, consumed);
  }

  const uint64_t size_;
};

class LinesParser final : public ParserBase {
 public:
  explicit LinesParser(const RecordFormat& format) : ParserBase(format, "text file") {}

 private:
  // Whether begin is a line start depends on the byte before it.
  uint64_t Start() override {
    at_line_start_ = begin_ == 0;
    scanned_ = 0;
    return begin_ == 0 ? 0 : begin_ - 1;
  }

  ParseStatus Step(View w, Record* record, size_t* consumed) noexcept override {
    if (!at_line_start_) {
      // Skip to the byte after the first '\n' at or after begin - 1. A '\n' at
      // end - 1 or later starts a line that is not ours, so look no further.
      if (pos_ + 1 >= end_) return ParseStatus::kDone;
      size_t limit = static_cast<size_t>(std::min<uint64_t>(w.n, end_ - 1 - pos_));
      const std::byte* newline = FindNewline(w.p, limit);
      size_t skip = newline ? newline - w.p + 1 : limit;
      pos_ += skip;
      *consumed += skip;
      if (!newline) {
        return pos_ + 1 >= end_ || w.at_end ? ParseStatus::kDone : ParseStatus::kNeedMore;
      }
      at_line_start_ = true;
      w = View{w.p + skip, w.n - skip, w.at_end};
    }
    if (pos_ >= end_ || (w.at_end && w.n == 0)) return ParseStatus::kDone;

    // Bytes [0, scanned_) were searched by an earlier call that needed more.
    size_t from = std::min(scanned_, w.n);
    const std::byte* newline = FindNewline(w.p + from, w.n - from);
    size_t length = newline ? newline - w.p : w.n;
    if (length > format_.max_record_bytes) {
      return Fail(pos_,
                  "line longer than max_record_bytes (%" PRIu64
                  "); raise "
                  "max_record_bytes, or check that this is a text file",
                  format_.max_record_bytes);
    }
    if (!newline && !w.at_end) {
      scanned_ = w.n;
      return ParseStatus::kNeedMore;
    }
    scanned_ = 0;
    size_t size = length > 0 && w.p[length - 1] == std::byte{'\r'} ? length - 1 : length;
    return Emit(w.p, size, newline ? length + 1 : length, record, consumed);
  }

  bool at_line_start_ = false;
  size_t scanned_ = 0;
};

// u64 length, u32 masked CRC32C of those 8 bytes, data, u32 masked CRC32C of
// the data; all little-endian.
class TfrecordParser final : public ParserBase {
 public:
  explicit TfrecordParser(const RecordFormat& format) : ParserBase(format, "tfrecord file") {}

 private:
  static constexpr size_t kHeader = 12;
  static constexpr size_t kOverhead = 16;

  uint64_t Start() override {
    synced_ = begin_ == 0;
    return begin_;
  }

  ParseStatus Step(View w, Record* record, size_t* consumed) noexcept override {
    uint64_t file_end = w.at_end ? pos_ + w.n : file_size_;
    return synced_ ? Sequential(w, file_end, record, consumed)
                   : Resync(w, file_end, record, consumed);
  }

  bool HeaderOk(const std::byte* p) const { return MaskCrc32c(Crc32c(p, 8)) == LoadLe32(p + 8); }
  bool DataOk(const std::byte* p, uint64_t length) const {
    return MaskCrc32c(Crc32c(p + kHeader, length)) == LoadLe32(p + kHeader + length);
  }

  // pos_ is a record boundary: every record is checked, and so is the first
  // one at or after end_, which is not ours. The next slice resynchronises
  // exactly there; if that record is corrupt it skips it, so this slice must
  // be the one that reports it.
  ParseStatus Sequential(View w, uint64_t file_end, Record* record, size_t* consumed) {
    if (pos_ == file_end) return ParseStatus::kDone;
    if (w.n < kHeader) {
      if (!w.at_end) return ParseStatus::kNeedMore;
      return Fail(pos_,
                  "truncated record: %zu header bytes, the file ends at %" PRIu64
                  " (file cut short?)",
                  w.n, file_end);
    }
    uint64_t length = LoadLe64(w.p);
    if (!HeaderOk(w.p)) {
      return Fail(pos_, "length CRC mismatch (record corrupt or not a TFRecord file)");
    }
    if (length > format_.max_record_bytes) {
      return Fail(pos_,
                  "record of %" PRIu64 " bytes is longer than max_record_bytes (%" PRIu64
                  "); raise max_record_bytes if the file is right",
                  length, format_.max_record_bytes);
    }
    if (file_end - pos_ < kOverhead || length > file_end - pos_ - kOverhead) {
      return Fail(pos_,
                  "truncated record: header says %" PRIu64
                  " data bytes, the file ends "
                  "at %" PRIu64 " (file cut short?)",
                  length, file_end);
    }
    if (w.n < length + kOverhead) return ParseStatus::kNeedMore;
    if (!DataOk(w.p, length)) {
      return Fail(pos_, "data CRC mismatch (record corrupt or not a TFRecord file)");
    }
    if (pos_ >= end_) return ParseStatus::kDone;
    return Emit(w.p + kHeader, length, length + kOverhead, record, consumed);
  }

  // Finds the first offset >= begin_ holding a header whose length CRC
  // matches, whose length fits, and whose data CRC matches; a candidate that
  // fails any check is a false start (or a corrupt record, which the previous
  // slice reports), and the scan moves on by one byte.
  ParseStatus Resync(View w, uint64_t file_end, Record* record, size_t* consumed) {
    for (size_t i = 0;; ++i) {
      uint64_t at = pos_ + i;
      if (at >= end_ || file_end - at < kOverhead) return ParseStatus::kDone;
      // Not at_end here: then w.n - i == file_end - at >= kOverhead.
      if (w.n - i < kHeader) return Skip(i, consumed);
      const std::byte* p = w.p + i;
      uint64_t length = LoadLe64(p);
      // The length bound first: it is cheaper than the CRC and rejects most bytes.
      if (length > format_.max_record_bytes || length > file_end - at - kOverhead) continue;
      if (!HeaderOk(p)) continue;
      if (w.n - i < length + kOverhead) return Skip(i, consumed);
      if (!DataOk(p, length)) continue;
      Skip(i, consumed);
      synced_ = true;
      return Emit(p + kHeader, length, length + kOverhead, record, consumed);
    }
  }

  ParseStatus Skip(size_t bytes, size_t* consumed) {
    pos_ += bytes;
    *consumed += bytes;
    return ParseStatus::kNeedMore;
  }

  bool synced_ = false;  // pos_ is a record boundary
};

// WebDataset tar shards (io/tar_header.h): a record is one sample, from its
// first member's first header block to the end of its last member's padded
// data. A slice owns the samples that start inside it; a slice that begins
// past 0 skips to its first sample start, found in the file's index.
class TarParser final : public ParserBase {
 public:
  explicit TarParser(const RecordFormat& format) : ParserBase(format, "tar file") {}

 private:
  uint64_t Start() override {
    skip_to_ = begin_;
    if (begin_ == 0) return 0;
    const auto index = TarSampleIndex(path_, file_size_, format_.max_record_bytes);
    const auto& starts = index->starts;
    const auto first = std::lower_bound(starts.begin(), starts.end(), begin_);
    if (first != starts.end()) {
      skip_to_ = *first;
    } else if (index->damaged) {
      // The damage hides where this slice's samples start.
      throw Error(ErrorKind::kCorrupt, "tar file '" + path_ + "' at offset " +
                                           std::to_string(index->error.offset) + ": " +
                                           index->error.text);
    } else {
      skip_to_ = file_size_;  // no sample starts at or after begin
    }
    // Fed from begin, as every format is; the bytes up to skip_to_ (at most
    // the rest of one sample) are dropped unparsed.
    return begin_;
  }

  ParseStatus Step(View w, Record* record, size_t* consumed) noexcept override {
    if (pos_ < skip_to_) {
      if (skip_to_ >= end_) return ParseStatus::kDone;
      const size_t skip = static_cast<size_t>(std::min<uint64_t>(w.n, skip_to_ - pos_));
      pos_ += skip;
      *consumed += skip;
      if (pos_ < skip_to_) {
        if (!w.at_end) return ParseStatus::kNeedMore;
        return Fail(skip_to_,
                    "the file ends at %" PRIu64
                    ", before this sample (it changed since it was indexed?)",
                    pos_);
      }
      w = View{w.p + skip, w.n - skip, w.at_end};
    }
    // Up to the first entry that is a sample member: skipped entries between
    // samples belong to none.
    TarEntry first;
    size_t at = 0;
    for (;;) {
      const TarDecode d = Decode(w, at, &first);
      if (d == TarDecode::kEnd) return ParseStatus::kDone;
      if (d == TarDecode::kError) return Fail(error_.offset, "%s", error_.text);
      if (d == TarDecode::kEntry && first.truncated) return Fail(error_.offset, "%s", error_.text);
      if (d == TarDecode::kNeedMore) {
        // Drop the skipped entries; keep the one cut off.
        pos_ += at;
        *consumed += at;
        return ParseStatus::kNeedMore;
      }
      if (first.member) break;
      at = static_cast<size_t>(std::min<uint64_t>(first.next - pos_, w.n));
      if (first.next - pos_ > w.n) {  // a skipped entry's data runs past the window
        pos_ += at;
        *consumed += at;
        if (w.at_end) return ParseStatus::kDone;
        skip_to_ = first.next;
        return ParseStatus::kNeedMore;
      }
    }
    if (first.start >= end_) {
      pos_ += at;
      *consumed += at;
      return ParseStatus::kDone;
    }
    pos_ += at;
    *consumed += at;
    w = View{w.p + at, w.n - at, w.at_end};
    // The sample: members that share first's key, up to the next member with
    // another key or the end of the archive. first's path points into w,
    // which stays put until the sample is emitted.
    uint64_t sample_end = first.next;
    for (size_t next_at = static_cast<size_t>(std::min<uint64_t>(first.next - pos_, w.n));;) {
      if (sample_end - pos_ > format_.max_record_bytes)
        return Fail(pos_,
                    "sample of more than max_record_bytes (%" PRIu64
                    "); raise max_record_bytes, or check that consecutive members do not share "
                    "a key by mistake",
                    format_.max_record_bytes);
      if (first.next - pos_ > w.n || sample_end - pos_ > w.n) break;  // need the data first
      TarEntry e;
      const TarDecode d = Decode(w, next_at, &e);
      if (d == TarDecode::kError) return Fail(error_.offset, "%s", error_.text);
      if (d == TarDecode::kNeedMore) break;
      const bool other = e.member ? !e.path.SameKey(first.path) : e.size > 0;
      if (d == TarDecode::kEnd || other) {
        const size_t size = static_cast<size_t>(sample_end - pos_);
        return Emit(w.p, size, size, record, consumed);
      }
      if (e.truncated) return Fail(error_.offset, "%s", error_.text);
      if (e.member) sample_end = e.next;
      next_at = static_cast<size_t>(e.next - pos_);
    }
    if (w.at_end) {
      // Cannot happen: at the end of the file every decode ends in an entry,
      // the end or an error. Guard against a loop regardless.
      return Fail(pos_, "sample runs past the end of the file at %" PRIu64, pos_ + w.n);
    }
    return ParseStatus::kNeedMore;
  }

  // Decodes the entry at window index `at`; error_ holds the text on kError.
  TarDecode Decode(View w, size_t at, TarEntry* entry) {
    return DecodeTarEntry(w.p + at, w.n - at, w.at_end, pos_ + at, format_.max_record_bytes, entry,
                          &error_);
  }

  uint64_t skip_to_ = 0;  // the first sample start at or after begin
  TarError error_;
};

class FileParser final : public ParserBase {
 public:
  explicit FileParser(const RecordFormat& format) : ParserBase(format, "file") {}

 private:
  uint64_t Start() override { return begin_; }

  // The record starts at 0, so the slice holding offset 0 owns it; an empty
  // file has no such slice and its one slice, [0, 0), owns it instead.
  ParseStatus Step(View w, Record* record, size_t* consumed) noexcept override {
    bool owned = begin_ == 0 && (end_ > 0 || file_size_ == 0);
    if (!owned || records_ > 0) return ParseStatus::kDone;
    if (file_size_ > format_.max_record_bytes) {
      return Fail(0,
                  "the file is %" PRIu64 " bytes, more than max_record_bytes (%" PRIu64
                  "); raise max_record_bytes or use a format that splits it",
                  file_size_, format_.max_record_bytes);
    }
    if (w.n < file_size_) {
      if (!w.at_end) return ParseStatus::kNeedMore;
      return Fail(0,
                  "the file ends at %zu, not at %" PRIu64
                  " (it changed since it was "
                  "sliced?)",
                  w.n, file_size_);
    }
    return Emit(w.p, w.n, w.n, record, consumed);
  }
};

}  // namespace
}  // namespace detail

RecordFormat RecordFormat::Parse(std::string_view name, uint64_t record_bytes) {
  for (const auto& [known, kind] : detail::kFormatNames) {
    if (name != known) continue;
    if (kind == RecordFormatKind::kFixed && record_bytes == 0) {
      throw Error(ErrorKind::kInvalidArgument,
                  "record format 'fixed' needs record_bytes > 0 (the size of one record)");
    }
    if (kind != RecordFormatKind::kFixed && record_bytes != 0) {
      throw Error(ErrorKind::kInvalidArgument,
                  "record_bytes (" + std::to_string(record_bytes) +
                      ") is only allowed with record format 'fixed', not '" + std::string(name) +
                      "'");
    }
    RecordFormat format;
    format.kind = kind;
    format.record_bytes = record_bytes;
    return format;
  }
  throw Error(ErrorKind::kInvalidArgument, "unknown record format '" + Printable(name) +
                                               "' (expected fixed, lines, tfrecord, file or tar)");
}

std::string RecordFormat::Tag() const {
  std::string tag(detail::FormatName(kind));
  if (kind == RecordFormatKind::kFixed) tag += ":" + std::to_string(record_bytes);
  // The TFRecord resync rejects candidates longer than max_record_bytes, so
  // processes with different limits could disagree on a slice's first record.
  if (kind == RecordFormatKind::kTfrecord && max_record_bytes != RecordFormat{}.max_record_bytes)
    tag += ":max=" + std::to_string(max_record_bytes);
  return tag;
}

bool RecordFormat::FitsTag(std::string_view tag) const {
  const size_t colon = tag.find(':');
  const std::string_view name = tag.substr(0, colon);
  for (const auto& [n, k] : detail::kFormatNames) {
    if (n != name) continue;
    if (k != kind) return false;
    // "fixed:<n>" names the record size; what follows a tfrecord tag (its
    // max_record_bytes) is the reader's to choose, as in Python.
    if (k == RecordFormatKind::kFixed && colon != std::string_view::npos)
      return tag.substr(colon + 1) == std::to_string(record_bytes);
    return true;
  }
  return true;  // no format's name: a tag of the user's own
}

std::unique_ptr<RecordParser> RecordParser::Create(const RecordFormat& format) {
  switch (format.kind) {
    case RecordFormatKind::kFixed:
      if (format.record_bytes == 0 || format.record_bytes > format.max_record_bytes) {
        throw Error(ErrorKind::kInvalidArgument,
                    "record format 'fixed': record_bytes (" + std::to_string(format.record_bytes) +
                        ") must be in [1, " + std::to_string(format.max_record_bytes) +
                        "] (max_record_bytes)");
      }
      return std::make_unique<detail::FixedParser>(format);
    case RecordFormatKind::kLines:
      return std::make_unique<detail::LinesParser>(format);
    case RecordFormatKind::kTfrecord:
      return std::make_unique<detail::TfrecordParser>(format);
    case RecordFormatKind::kFile:
      return std::make_unique<detail::FileParser>(format);
    case RecordFormatKind::kTar:
      return std::make_unique<detail::TarParser>(format);
  }
  throw Error(ErrorKind::kInvalidArgument,
              "unknown record format kind " + std::to_string(static_cast<int>(format.kind)));
}

}  // namespace tailcut
