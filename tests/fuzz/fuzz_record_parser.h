// Shared body of the fuzz_record_parser_<format> libFuzzer targets.
//
// An input is kParams parameter bytes followed by the file. The file is parsed
// once as one slice and once cut into up to four slices (one of them has its
// tail split off mid-way), fed through windows of 1..N bytes. A check that
// fails aborts, which libFuzzer reports as a crash:
//  * every record lies in the file where the format says, with those bytes;
//  * a slice yields only records that start inside it, in file order, and no
//    two slices yield the same offset;
//  * the single slice, when it ends cleanly, yields what an independent
//    reference split yields (fixed, lines, file) or records that tile the
//    file (tfrecord);
//  * when both runs end cleanly they yield the same records, and (except for
//    tfrecord, where a slice may only see what its chain reaches) an error in
//    one run is an error in the other.
#ifndef TAILCUT_TESTS_FUZZ_FUZZ_RECORD_PARSER_H_
#define TAILCUT_TESTS_FUZZ_FUZZ_RECORD_PARSER_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tailcut/record_format.h"

namespace tailcut::fuzz {

constexpr size_t kParams = 8;

#define FUZZ_CHECK(condition)                                                            \
  do {                                                                                   \
    if (!(condition)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #condition); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

struct Run {
  std::vector<std::pair<uint64_t, std::string>> records;
  bool failed = false;
};

inline uint64_t LoadLe64(std::string_view s) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(s[i]);
  return v;
}

// Checks one record against the file bytes, by format.
inline void CheckPlacement(const RecordFormat& format, std::string_view file, uint64_t offset,
                           std::string_view data) {
  switch (format.kind) {
    case RecordFormatKind::kFixed:
      FUZZ_CHECK(offset % format.record_bytes == 0 && data.size() == format.record_bytes);
      FUZZ_CHECK(file.substr(offset, data.size()) == data);
      break;
    case RecordFormatKind::kLines: {
      FUZZ_CHECK(offset == 0 || file[offset - 1] == '\n');
      FUZZ_CHECK(file.substr(offset, data.size()) == data);
      FUZZ_CHECK(data.find('\n') == std::string_view::npos);
      std::string_view rest = file.substr(offset + data.size());
      FUZZ_CHECK(rest.empty() || rest[0] == '\n' || rest == "\r" || rest.substr(0, 2) == "\r\n");
      break;
    }
    case RecordFormatKind::kTfrecord:
      FUZZ_CHECK(offset + 16 + data.size() <= file.size());
      FUZZ_CHECK(LoadLe64(file.substr(offset)) == data.size());
      FUZZ_CHECK(file.substr(offset + 12, data.size()) == data);
      break;
    case RecordFormatKind::kFile:
      FUZZ_CHECK(offset == 0 && data == file);
      break;
    case RecordFormatKind::kTar:  // a sample: its bytes as they lie in the file
      FUZZ_CHECK(offset % 512 == 0 && file.substr(offset, data.size()) == data);
      break;
  }
}

// Feeds slice [begin, end) through windows that grow by 1..max_window bytes.
// After split_after records (if >= 0) lowers the end to a point between the
// position and the end, and returns that point (end if it did not split).
inline uint64_t RunSlice(RecordParser& parser, const RecordFormat& format, std::string_view file,
                         uint64_t begin, uint64_t end, uint32_t* rng, size_t max_window,
                         int split_after, Run* run) {
  auto random = [rng] { return *rng = *rng * 1664525u + 1013904223u, *rng >> 8; };
  uint64_t next = parser.Begin("fuzz-input", file.size(), begin, end);
  FUZZ_CHECK(next <= begin);
  uint64_t split = end;
  std::string window;
  size_t count = 0;
  uint64_t last_offset = 0;
  while (true) {
    FUZZ_CHECK(parser.position() + window.size() == next);
    if (static_cast<int>(count) == split_after) {
      split_after = -1;
      uint64_t from = std::max(parser.position(), begin);
      if (from < parser.end()) {
        split = from + random() % (parser.end() - from + 1);
        parser.SetEnd(split);
      }
    }
    Record record;
    size_t consumed = 0;
    bool eof = next == file.size();
    auto* w = reinterpret_cast<const std::byte*>(window.data());
    ParseStatus status = parser.Next(w, window.size(), eof, &record, &consumed);
    FUZZ_CHECK(consumed <= window.size());
    if (status == ParseStatus::kDone) return split;
    if (status == ParseStatus::kError) {
      FUZZ_CHECK(parser.error().find("fuzz-input") != std::string::npos);
      run->failed = true;
      return split;
    }
    if (status == ParseStatus::kRecord) {
      FUZZ_CHECK(record.size == 0 ||
                 (record.data >= w && record.data + record.size <= w + window.size()));
      FUZZ_CHECK(record.offset >= begin && (record.offset < parser.end() || file.empty()));
      FUZZ_CHECK(count == 0 || record.offset > last_offset);
      std::string data(reinterpret_cast<const char*>(record.data), record.size);
      CheckPlacement(format, file, record.offset, data);
      run->records.emplace_back(record.offset, std::move(data));
      last_offset = record.offset;
      ++count;
    }
    window.erase(0, consumed);
    if (status == ParseStatus::kNeedMore) {
      FUZZ_CHECK(!eof);
      size_t n = std::min<uint64_t>(1 + random() % max_window, file.size() - next);
      window.append(file.substr(next, n));
      next += n;
    }
  }
}

// The records an independent, obvious reading of the file yields.
inline std::vector<std::pair<uint64_t, std::string>> Reference(const RecordFormat& format,
                                                               std::string_view file) {
  std::vector<std::pair<uint64_t, std::string>> records;
  if (format.kind == RecordFormatKind::kFixed) {
    for (uint64_t o = 0; o < file.size(); o += format.record_bytes) {
      records.emplace_back(o, file.substr(o, format.record_bytes));
    }
  } else if (format.kind == RecordFormatKind::kLines) {
    for (size_t start = 0; start < file.size();) {
      size_t newline = std::min(file.find('\n', start), file.size());
      std::string line(file.substr(start, newline - start));
      if (!line.empty() && line.back() == '\r') line.pop_back();
      records.emplace_back(start, line);
      start = newline + 1;
    }
  } else if (format.kind == RecordFormatKind::kFile) {
    records.emplace_back(0, file);
  }
  return records;
}

inline int FuzzRecordParser(RecordFormatKind kind, const uint8_t* data, size_t size) {
  if (size < kParams) return -1;
  const uint8_t* p = data;
  std::string_view file(reinterpret_cast<const char*>(data + kParams), size - kParams);
  RecordFormat format;
  format.kind = kind;
  if (kind == RecordFormatKind::kFixed) format.record_bytes = 1 + p[0] % 16;
  if (p[1] & 1) format.max_record_bytes = p[1] >> 1;  // small limits, to hit them
  if (kind == RecordFormatKind::kFixed) {
    format.max_record_bytes = std::max(format.max_record_bytes, format.record_bytes);
  }
  size_t max_window = p[2] >= 240 ? 4096 : 1 + p[2] % 64;
  uint32_t rng = p[3];
  int split_after = p[4] % 8 - 2;
  std::vector<uint64_t> cuts = {0, file.size()};
  for (int i = 5; i < 8; ++i) cuts.push_back(p[i] * file.size() / 255);
  std::sort(cuts.begin(), cuts.end());

  auto parser = RecordParser::Create(format);
  Run single;
  try {
    RunSlice(*parser, format, file, 0, file.size(), &rng, max_window, -1, &single);
  } catch (const Error&) {
    // Only fixed may refuse a file: its size is not a multiple of record_bytes.
    FUZZ_CHECK(kind == RecordFormatKind::kFixed && file.size() % format.record_bytes != 0);
    return 0;
  }
  if (!single.failed) {
    if (kind == RecordFormatKind::kTfrecord) {
      uint64_t at = 0;
      for (const auto& [offset, bytes] : single.records) {
        FUZZ_CHECK(offset == at);
        at += 16 + bytes.size();
      }
      FUZZ_CHECK(at == file.size());
    } else {
      FUZZ_CHECK(single.records == Reference(format, file));
    }
  }

  // An empty file has one slice, [0, 0); the single run was it.
  if (file.empty()) return 0;
  Run sliced;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    for (uint64_t begin = cuts[i], end = cuts[i + 1];;) {
      uint64_t split = RunSlice(*parser, format, file, begin, end, &rng, max_window,
                                i == 0 ? split_after : -1, &sliced);
      if (split == end) break;
      begin = split;
    }
  }
  std::vector<uint64_t> offsets;
  for (const auto& record : sliced.records) offsets.push_back(record.first);
  std::sort(offsets.begin(), offsets.end());
  FUZZ_CHECK(std::adjacent_find(offsets.begin(), offsets.end()) == offsets.end());
  if (!single.failed && !sliced.failed) {
    std::sort(sliced.records.begin(), sliced.records.end());
    FUZZ_CHECK(sliced.records == single.records);
  }
  if (kind != RecordFormatKind::kTfrecord) FUZZ_CHECK(single.failed == sliced.failed);
  return 0;
}

}  // namespace tailcut::fuzz

#endif  // TAILCUT_TESTS_FUZZ_FUZZ_RECORD_PARSER_H_
