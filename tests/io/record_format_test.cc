// Tests for tailcut/record_format.h. The central property: however a file is
// cut into slices, and however the bytes are fed (tiny or large windows,
// tails split off mid-slice), the slices together yield every record of the
// file exactly once. Bad input is an error that names the file and offset.
#include "tailcut/record_format.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "tailcut/crc32c.h"

// Counts heap allocations, so a test can check that Next never allocates.
namespace {
std::atomic<uint64_t> g_allocations{0};
}  // namespace

void* operator new(size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
// Out of line, so the compiler does not pair the free with a new it inlined.
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace tailcut {
namespace {

struct Rec {
  uint64_t offset;
  std::string data;
  auto operator<=>(const Rec&) const = default;
};

struct TestFile {
  std::string path;
  std::string bytes = {};
  std::vector<Rec> records = {};       // what the file yields, in order
  std::vector<uint64_t> awkward = {};  // offsets worth cutting at
};

struct SliceRun {
  std::vector<Rec> records;
  std::string error;   // set on kError
  uint64_t split = 0;  // where the tail was split off (the slice end if it was not)
};

const std::byte* Bytes(const std::string& s) {
  return reinterpret_cast<const std::byte*>(s.data());
}

// Feeds slice [begin, end) of `file` through `parser` the way a reader does: a
// window that grows by 1..max_window bytes whenever the parser needs more,
// with consumed bytes dropped from its front. When split_after >= 0, once that
// many records are out, the slice end is lowered to a random point at or
// after position() (tail splitting) and run->split says where.
void RunSlice(RecordParser& parser, const TestFile& file, uint64_t begin, uint64_t end,
              std::mt19937_64& rng, size_t max_window, SliceRun* run, int split_after = -1) {
  const std::string& bytes = file.bytes;
  uint64_t next = parser.Begin(file.path, bytes.size(), begin, end);
  ASSERT_LE(next, begin);
  run->split = end;
  uint64_t last_end = 0;  // Record::end of the record yielded last
  std::string window;     // bytes [parser.position(), next)
  auto extend = [&] {
    size_t n = std::min<uint64_t>(1 + rng() % max_window, bytes.size() - next);
    window.append(bytes, next, n);
    next += n;
  };
  extend();
  for (uint64_t calls = 0;; ++calls) {
    ASSERT_LT(calls, 100'000'000u) << "no progress";
    ASSERT_EQ(parser.position() + window.size(), next);
    if (static_cast<int>(run->records.size()) == split_after) {
      split_after = -1;
      uint64_t from = std::max(parser.position(), begin);
      if (from < parser.end()) {
        run->split = from + rng() % (parser.end() - from + 1);
        parser.SetEnd(run->split);
        ASSERT_EQ(parser.end(), run->split);
      }
    }
    bool eof = next == bytes.size();
    Record record;
    size_t consumed = 0;
    const std::byte* w = Bytes(window);
    ParseStatus status = parser.Next(w, window.size(), eof, &record, &consumed);
    ASSERT_LE(consumed, window.size());
    switch (status) {
      case ParseStatus::kRecord:
        if (record.size > 0) {
          ASSERT_GE(record.data, w);
          ASSERT_LE(record.data + record.size, w + window.size());
        }
        EXPECT_GE(record.offset, begin);
        EXPECT_TRUE(record.offset < parser.end() || bytes.empty()) << record.offset;
        // Record::end is where the next record starts: the parser's position
        // after it, and (within a slice) the next record's offset.
        EXPECT_EQ(record.end, parser.position()) << record.offset;
        EXPECT_TRUE(record.end > record.offset || bytes.empty()) << record.offset;
        if (!run->records.empty()) EXPECT_EQ(record.offset, last_end);
        last_end = record.end;
        run->records.push_back(
            {record.offset, std::string(reinterpret_cast<const char*>(record.data), record.size)});
        EXPECT_EQ(parser.records(), run->records.size());
        window.erase(0, consumed);
        break;
      case ParseStatus::kNeedMore:
        ASSERT_FALSE(eof) << "kNeedMore with the whole file in the window";
        window.erase(0, consumed);
        extend();
        break;
      case ParseStatus::kDone:
      case ParseStatus::kError:
        if (status == ParseStatus::kError) {
          run->error = parser.error();
          EXPECT_NE(run->error.find(file.path), std::string::npos) << run->error;
        }
        // The end state sticks.
        EXPECT_EQ(parser.Next(w, window.size(), eof, &record, &consumed), status);
        return;
    }
  }
}

// Cuts the file at `cuts` (repeats make empty slices), runs every slice with
// the same parser, and, with split_tails, splits tails off some of them and
// runs those as slices of their own. Every slice must end without error.
void RunPartition(RecordParser& parser, const TestFile& file, std::vector<uint64_t> cuts,
                  std::mt19937_64& rng, size_t max_window, bool split_tails,
                  std::vector<Rec>* records, int* slices) {
  cuts.push_back(0);
  cuts.push_back(file.bytes.size());
  std::sort(cuts.begin(), cuts.end());
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    uint64_t begin = cuts[i], end = cuts[i + 1];
    while (true) {
      SliceRun run;
      int split_after = split_tails && rng() % 3 == 0 ? static_cast<int>(rng() % 4) : -1;
      RunSlice(parser, file, begin, end, rng, max_window, &run, split_after);
      if (testing::Test::HasFatalFailure()) return;
      ++*slices;
      ASSERT_EQ(run.error, "") << "slice [" << begin << ", " << end << ")";
      records->insert(records->end(), run.records.begin(), run.records.end());
      if (run.split == end) break;
      begin = run.split;  // the split-off tail is a slice of its own
    }
  }
}

testing::AssertionResult SameRecords(std::vector<Rec> expected, std::vector<Rec> actual) {
  std::sort(expected.begin(), expected.end());
  std::sort(actual.begin(), actual.end());
  for (size_t i = 0; i < std::max(expected.size(), actual.size()); ++i) {
    if (i >= expected.size() || i >= actual.size() || expected[i] != actual[i]) {
      auto describe = [i](const std::vector<Rec>& v) {
        return i < v.size() ? "record at offset " + std::to_string(v[i].offset) + " of " +
                                  std::to_string(v[i].data.size()) + " bytes"
                            : std::string("nothing");
      };
      return testing::AssertionFailure()
             << expected.size() << " records expected, " << actual.size() << " yielded; #" << i
             << " expected " << describe(expected) << ", got " << describe(actual);
    }
  }
  return testing::AssertionSuccess();
}

// Runs each file whole, cut at all its awkward offsets at once, and cut at
// random (with random tail splits), each time with a random window bound.
// Returns the number of slices run.
int ExpectEverySlicingYieldsEachRecordOnce(const RecordFormat& format,
                                           const std::vector<TestFile>& files, uint64_t seed) {
  static constexpr size_t kWindows[] = {1, 2, 5, 16, 100, 700, 4096};
  auto parser = RecordParser::Create(format);
  std::mt19937_64 rng(seed);
  int slices = 0;
  for (const TestFile& file : files) {
    SCOPED_TRACE(file.path);
    for (int round = 0; round < 10; ++round) {
      std::vector<uint64_t> cuts;
      if (round == 1) cuts = file.awkward;
      int random_cuts = round >= 2 ? static_cast<int>(rng() % 16) : 0;
      for (int i = 0; i < random_cuts; ++i) {
        cuts.push_back(!file.awkward.empty() && rng() % 2
                           ? file.awkward[rng() % file.awkward.size()]
                           : rng() % (file.bytes.size() + 1));
      }
      size_t max_window = kWindows[rng() % std::size(kWindows)];
      SCOPED_TRACE("round " + std::to_string(round) + ", window " + std::to_string(max_window));
      std::vector<Rec> got;
      RunPartition(*parser, file, cuts, rng, max_window, round >= 2, &got, &slices);
      if (testing::Test::HasFatalFailure()) return slices;
      EXPECT_TRUE(SameRecords(file.records, got));
    }
  }
  return slices;
}

std::string RandomText(std::mt19937_64& rng, size_t size) {
  std::string s(size, ' ');
  for (char& c : s) c = static_cast<char>('a' + rng() % 26);
  return s;
}

std::string RandomBytes(std::mt19937_64& rng, size_t size) {
  std::string s(size, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// Mostly short, often empty, now and then larger than the largest window.
size_t RandomRecordSize(std::mt19937_64& rng) {
  int roll = rng() % 100;
  if (roll < 20) return 0;
  if (roll < 80) return 1 + rng() % 80;
  if (roll < 95) return 80 + rng() % 2000;
  return 5000 + rng() % 15000;
}

void ClampAndSort(std::vector<uint64_t>* offsets, uint64_t size) {
  for (uint64_t& o : *offsets) o = std::min(o, size);
  std::sort(offsets->begin(), offsets->end());
  offsets->erase(std::unique(offsets->begin(), offsets->end()), offsets->end());
}

// ---------------------------------------------------------------- RecordFormat

TEST(RecordFormatTest, ParseAcceptsTheFourFormats) {
  EXPECT_EQ(RecordFormat::Parse("lines").kind, RecordFormatKind::kLines);
  EXPECT_EQ(RecordFormat::Parse("tfrecord").kind, RecordFormatKind::kTfrecord);
  EXPECT_EQ(RecordFormat::Parse("file").kind, RecordFormatKind::kFile);
  RecordFormat fixed = RecordFormat::Parse("fixed", 128);
  EXPECT_EQ(fixed.kind, RecordFormatKind::kFixed);
  EXPECT_EQ(fixed.record_bytes, 128u);
}

TEST(RecordFormatTest, ParseRejectsUnknownNamesAndMisplacedRecordBytes) {
  for (auto [name, bytes] : {std::pair<const char*, uint64_t>{"csv", 0},
                             {"Lines", 0},
                             {"fixed", 0},
                             {"lines", 16},
                             {"tfrecord", 8}}) {
    try {
      RecordFormat::Parse(name, bytes);
      ADD_FAILURE() << name << " " << bytes << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

TEST(RecordFormatTest, TagNamesTheFormatAndTheFixedRecordSize) {
  EXPECT_EQ(RecordFormat::Parse("fixed", 128).Tag(), "fixed:128");
  EXPECT_EQ(RecordFormat::Parse("lines").Tag(), "lines");
  EXPECT_EQ(RecordFormat::Parse("tfrecord").Tag(), "tfrecord");
  EXPECT_EQ(RecordFormat::Parse("file").Tag(), "file");
}

TEST(RecordFormatTest, BeginRejectsASliceOutsideTheFile) {
  auto parser = RecordParser::Create(RecordFormat::Parse("lines"));
  EXPECT_THROW(parser->Begin("/d/a.txt", 10, 0, 11), Error);
  EXPECT_THROW(parser->Begin("/d/a.txt", 10, 6, 5), Error);
}

TEST(RecordFormatTest, NextAllocatesNothingEvenWhenItFails) {
  std::string tfrecord;
  AppendTfrecord(&tfrecord, std::string(100, 'a'));
  AppendTfrecord(&tfrecord, std::string(100, 'b'));
  tfrecord[150] ^= 1;
  struct Case {
    RecordFormat format;
    std::string bytes;
    ParseStatus last;
  } cases[] = {
      {RecordFormat::Parse("fixed", 4), "aaaabbbbcccc", ParseStatus::kDone},
      {RecordFormat::Parse("lines"), "a\nbb\r\n\nccc", ParseStatus::kDone},
      {RecordFormat::Parse("lines"), "a\n" + std::string(100, 'x'), ParseStatus::kError},
      {RecordFormat::Parse("tfrecord"), tfrecord, ParseStatus::kError},
      {RecordFormat::Parse("file"), "whole", ParseStatus::kDone},
  };
  cases[2].format.max_record_bytes = 10;
  for (Case& c : cases) {
    auto parser = RecordParser::Create(c.format);
    parser->Begin("/d/some/long/path/name/for/the/message", c.bytes.size(), 0, c.bytes.size());
    const std::byte* w = Bytes(c.bytes);
    size_t left = c.bytes.size();
    Record record;
    size_t consumed;
    ParseStatus status;
    uint64_t before = g_allocations.load();
    while ((status = parser->Next(w, left, true, &record, &consumed)) == ParseStatus::kRecord) {
      w += consumed;
      left -= consumed;
    }
    EXPECT_EQ(g_allocations.load(), before) << c.format.Tag();
    EXPECT_EQ(status, c.last) << parser->error();
  }
}

TEST(RecordFormatTest, AnEmptyWindowMayBeNull) {
  Record record;
  size_t consumed;
  for (RecordFormat format : {RecordFormat::Parse("fixed", 5), RecordFormat::Parse("lines"),
                              RecordFormat::Parse("tfrecord"), RecordFormat::Parse("file")}) {
    auto parser = RecordParser::Create(format);
    for (uint64_t begin : {0, 3}) {
      parser->Begin("/d/x", 100, begin, 100);
      bool owns_nothing = format.kind == RecordFormatKind::kFile && begin > 0;
      EXPECT_EQ(parser->Next(nullptr, 0, false, &record, &consumed),
                owns_nothing ? ParseStatus::kDone : ParseStatus::kNeedMore)
          << format.Tag() << " from " << begin;
    }
    parser->Begin("/d/empty", 0, 0, 0);
    ParseStatus status = parser->Next(nullptr, 0, true, &record, &consumed);
    EXPECT_EQ(status,
              format.kind == RecordFormatKind::kFile ? ParseStatus::kRecord : ParseStatus::kDone)
        << format.Tag();
  }
}

// ----------------------------------------------------------------------- fixed

TestFile MakeFixedFile(std::mt19937_64& rng, uint64_t record_bytes, int count) {
  TestFile file{"/data/fixed-" + std::to_string(record_bytes) + "x" + std::to_string(count)};
  for (int i = 0; i < count; ++i) {
    uint64_t at = file.bytes.size();
    file.records.push_back({at, RandomBytes(rng, record_bytes)});
    file.bytes += file.records.back().data;
    for (uint64_t o : {at - 1, at, at + 1}) file.awkward.push_back(o);
  }
  ClampAndSort(&file.awkward, file.bytes.size());
  return file;
}

TEST(FixedParserTest, FixedSlicesYieldEveryRecordExactlyOnce) {
  std::mt19937_64 rng(1);
  int slices = 0;
  for (auto [record_bytes, count] : {std::pair{1, 0}, {1, 300}, {7, 200}, {64, 100}, {5000, 9}}) {
    slices += ExpectEverySlicingYieldsEachRecordOnce(RecordFormat::Parse("fixed", record_bytes),
                                                     {MakeFixedFile(rng, record_bytes, count)},
                                                     record_bytes);
  }
  EXPECT_GE(slices, 97);
}

TEST(FixedParserTest, FileSizeNotAMultipleOfTheRecordSizeThrowsNamingTheFile) {
  auto parser = RecordParser::Create(RecordFormat::Parse("fixed", 4));
  try {
    parser->Begin("/data/x.bin", 10, 4, 8);
    FAIL() << "accepted a 10-byte file of 4-byte records";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    std::string what = e.what();
    EXPECT_NE(what.find("/data/x.bin"), std::string::npos) << what;
    EXPECT_NE(what.find("10 bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("record_bytes 4"), std::string::npos) << what;
  }
}

TEST(FixedParserTest, CreateRejectsAZeroRecordSize) {
  RecordFormat format;
  format.kind = RecordFormatKind::kFixed;
  EXPECT_THROW(RecordParser::Create(format), Error);
}

// ----------------------------------------------------------------------- lines

// The reference: a line starts at 0 and after every '\n' before the end; it
// runs to the next '\n' or the end of the file; one trailing '\r' goes.
std::vector<Rec> ReferenceLines(const std::string& bytes) {
  std::vector<Rec> lines;
  for (size_t start = 0; start < bytes.size();) {
    size_t newline = std::min(bytes.find('\n', start), bytes.size());
    std::string line = bytes.substr(start, newline - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back({start, line});
    start = newline + 1;
  }
  return lines;
}

TestFile MakeLinesFile(std::string path, std::string bytes) {
  TestFile file{std::move(path), std::move(bytes)};
  file.records = ReferenceLines(file.bytes);
  for (uint64_t i = 0; i < file.bytes.size(); ++i) {
    if (file.bytes[i] != '\n') continue;
    for (uint64_t o : {i - 1, i, i + 1, i + 2}) file.awkward.push_back(o);
  }
  ClampAndSort(&file.awkward, file.bytes.size());
  return file;
}

TestFile MakeRandomLinesFile(std::mt19937_64& rng, int count, bool trailing_newline) {
  std::string bytes;
  for (int i = 0; i < count; ++i) {
    std::string line = RandomText(rng, RandomRecordSize(rng));
    if (!line.empty() && rng() % 10 == 0) line[rng() % line.size()] = '\r';  // not at the end
    bytes += line;
    if (i + 1 < count || trailing_newline) bytes += rng() % 3 == 0 ? "\r\n" : "\n";
  }
  return MakeLinesFile("/data/lines-" + std::to_string(count) + (trailing_newline ? "" : "-open"),
                       bytes);
}

TEST(LinesParserTest, LinesSlicesYieldEveryRecordExactlyOnce) {
  std::mt19937_64 rng(2);
  std::vector<TestFile> files = {
      MakeRandomLinesFile(rng, 300, true),       MakeRandomLinesFile(rng, 200, false),
      MakeRandomLinesFile(rng, 40, true),        MakeLinesFile("/data/empty", ""),
      MakeLinesFile("/data/newlines", "\n\n\n"), MakeLinesFile("/data/crlf", "\r\n\r\n"),
      MakeLinesFile("/data/open", "abc"),        MakeLinesFile("/data/open-cr", "x\r\ny\r"),
      MakeLinesFile("/data/cr", "\r"),
  };
  EXPECT_GE(ExpectEverySlicingYieldsEachRecordOnce(RecordFormat::Parse("lines"), files, 22), 97);
}

TEST(LinesParserTest, StripsOneCarriageReturnAndKeepsALastLineWithoutNewline) {
  TestFile file = MakeLinesFile("/d/a.txt", "a\r\r\nb\n\nc\r");
  std::vector<Rec> expected = {{0, "a\r"}, {4, "b"}, {6, ""}, {7, "c"}};
  EXPECT_EQ(file.records, expected);  // the reference agrees with the header comment
  auto parser = RecordParser::Create(RecordFormat::Parse("lines"));
  std::mt19937_64 rng(3);
  SliceRun run;
  RunSlice(*parser, file, 0, file.bytes.size(), rng, 3, &run);
  EXPECT_EQ(run.records, expected);
}

TEST(LinesParserTest, ASliceStartingRightAfterANewlineOwnsThatLine) {
  TestFile file = MakeLinesFile("/d/a.txt", "ab\ncd\nef");
  auto parser = RecordParser::Create(RecordFormat::Parse("lines"));
  std::mt19937_64 rng(4);
  SliceRun first, second;
  RunSlice(*parser, file, 0, 3, rng, 100, &first);
  RunSlice(*parser, file, 3, 8, rng, 100, &second);
  EXPECT_EQ(first.records, (std::vector<Rec>{{0, "ab"}}));
  EXPECT_EQ(second.records, (std::vector<Rec>{{3, "cd"}, {6, "ef"}}));
}

TEST(LinesParserTest, ALineLongerThanMaxRecordBytesIsAnErrorNamingItsOffset) {
  RecordFormat format = RecordFormat::Parse("lines");
  format.max_record_bytes = 10;
  auto parser = RecordParser::Create(format);
  TestFile file = MakeLinesFile("/d/long.txt", "0123456789\n" + std::string(11, 'x') + "\nok\n");
  std::mt19937_64 rng(5);
  for (size_t window : {1, 4, 100}) {
    SliceRun run;
    RunSlice(*parser, file, 0, file.bytes.size(), rng, window, &run);
    EXPECT_EQ(run.records, (std::vector<Rec>{{0, "0123456789"}}));
    EXPECT_NE(run.error.find("at offset 11"), std::string::npos) << run.error;
    EXPECT_NE(run.error.find("max_record_bytes"), std::string::npos) << run.error;
  }
  // A slice that does not own the long line skips it without complaint.
  SliceRun run;
  RunSlice(*parser, file, 12, file.bytes.size(), rng, 4, &run);
  EXPECT_EQ(run.error, "");
  EXPECT_EQ(run.records, (std::vector<Rec>{{23, "ok"}}));
}

// -------------------------------------------------------------------- tfrecord

TestFile MakeTfrecordFile(std::string path, const std::vector<std::string>& payloads) {
  TestFile file{std::move(path)};
  for (const std::string& payload : payloads) {
    uint64_t at = file.bytes.size();
    uint64_t data_end = at + 12 + payload.size();
    file.records.push_back({at, payload});
    AppendTfrecord(&file.bytes, payload);
    // Inside the length, inside the length CRC, at the data, inside the data CRC.
    for (uint64_t o :
         {at - 1, at, at + 1, at + 4, at + 7, at + 8, at + 11, at + 12, at + 13,
          at + 12 + payload.size() / 2, data_end - 1, data_end, data_end + 1, data_end + 3}) {
      file.awkward.push_back(o);
    }
  }
  ClampAndSort(&file.awkward, file.bytes.size());
  return file;
}

std::vector<std::string> RandomPayloads(std::mt19937_64& rng, int count) {
  std::vector<std::string> payloads;
  for (int i = 0; i < count; ++i) {
    size_t size = RandomRecordSize(rng);
    // Zeros and small integers as well as noise: structured data is where a
    // length-only check would find false starts.
    payloads.push_back(rng() % 4 == 0 ? std::string(size, '\0') : RandomBytes(rng, size));
  }
  return payloads;
}

TEST(TfrecordParserTest, TfrecordSlicesYieldEveryRecordExactlyOnce) {
  std::mt19937_64 rng(6);
  std::vector<TestFile> files = {
      MakeTfrecordFile("/data/a.tfrecord", RandomPayloads(rng, 200)),
      MakeTfrecordFile("/data/b.tfrecord", RandomPayloads(rng, 30)),
      MakeTfrecordFile("/data/empty.tfrecord", {}),
      MakeTfrecordFile("/data/one-empty.tfrecord", {""}),
      MakeTfrecordFile("/data/huge.tfrecord",
                       {RandomBytes(rng, 30000), "", "x", RandomBytes(rng, 9000)}),
  };
  EXPECT_GE(ExpectEverySlicingYieldsEachRecordOnce(RecordFormat::Parse("tfrecord"), files, 33), 97);
}

TEST(TfrecordParserTest, EveryTruncationYieldsThePrefixThenANamedError) {
  std::mt19937_64 rng(7);
  TestFile whole = MakeTfrecordFile(
      "/d/t.tfrecord", {"", "a", "hello", "", RandomBytes(rng, 40), RandomBytes(rng, 300), "xy"});
  auto parser = RecordParser::Create(RecordFormat::Parse("tfrecord"));
  for (uint64_t n = 0; n <= whole.bytes.size(); ++n) {
    SCOPED_TRACE("prefix " + std::to_string(n));
    TestFile file{whole.path, whole.bytes.substr(0, n)};
    std::vector<Rec> complete;
    uint64_t cut_record = n;  // offset of the record the cut falls in
    for (const Rec& r : whole.records) {
      if (r.offset + 16 + r.data.size() <= n) {
        complete.push_back(r);
      } else if (r.offset < n) {
        cut_record = r.offset;
      }
    }
    // One slice, then two slices cut at a random point: the same records, and
    // the cut record is reported (by the slice whose chain reaches it).
    for (uint64_t cut : {uint64_t{0}, rng() % (n + 1)}) {
      std::vector<Rec> got;
      std::string errors;
      for (auto [b, e] : {std::pair{uint64_t{0}, cut}, std::pair{cut, n}}) {
        SliceRun run;
        RunSlice(*parser, file, b, e, rng, 1 + rng() % 64, &run);
        ASSERT_FALSE(HasFatalFailure());
        got.insert(got.end(), run.records.begin(), run.records.end());
        errors += run.error;
      }
      EXPECT_TRUE(SameRecords(complete, got));
      if (cut_record == n) {
        EXPECT_EQ(errors, "");
      } else {
        EXPECT_NE(errors.find("at offset " + std::to_string(cut_record) + ": truncated record"),
                  std::string::npos)
            << errors;
      }
    }
  }
}

TEST(TfrecordParserTest, SingleBitFlipsAreNamedErrorsNeverWrongRecords) {
  std::mt19937_64 rng(8);
  TestFile original = MakeTfrecordFile("/d/flip.tfrecord", RandomPayloads(rng, 12));
  auto parser = RecordParser::Create(RecordFormat::Parse("tfrecord"));
  for (int flip = 0; flip < 400; ++flip) {
    TestFile file = original;
    uint64_t bit = rng() % (file.bytes.size() * 8);
    file.bytes[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    uint64_t hit = 0;  // the record holding the flipped byte
    for (const Rec& r : file.records) {
      if (r.offset <= bit / 8) hit = r.offset;
    }
    SCOPED_TRACE("bit " + std::to_string(bit) + " in the record at " + std::to_string(hit));
    // Whole file as one slice, then cut in four at random.
    std::vector<uint64_t> cuts = {0, file.bytes.size()};
    for (int i = 0; i < 2; ++i) {
      std::vector<Rec> got;
      std::string errors;
      for (size_t s = 0; s + 1 < cuts.size(); ++s) {
        SliceRun run;
        RunSlice(*parser, file, cuts[s], cuts[s + 1], rng, 1 + rng() % 500, &run);
        ASSERT_FALSE(HasFatalFailure());
        got.insert(got.end(), run.records.begin(), run.records.end());
        errors += run.error;
      }
      // CRC32C catches every single-bit error, and the slice whose chain of
      // records reaches the damaged one reports it, whoever owns it.
      EXPECT_NE(errors.find("at offset " + std::to_string(hit) + ": "), std::string::npos)
          << errors;
      for (const Rec& r : got) {
        EXPECT_TRUE(std::binary_search(original.records.begin(), original.records.end(), r))
            << "wrong record at " << r.offset;
      }
      for (int c = 0; c < 3; ++c) cuts.push_back(rng() % (file.bytes.size() + 1));
      std::sort(cuts.begin(), cuts.end());
    }
  }
}

TEST(TfrecordParserTest, ACorruptRecordAtASliceStartIsReportedByThePreviousSlice) {
  TestFile file = MakeTfrecordFile("/d/c.tfrecord", {"first", "second", "third"});
  uint64_t second = file.records[1].offset, third = file.records[2].offset;
  file.bytes[second + 12] ^= 0x20;  // "second" -> "Second": its data CRC fails
  auto parser = RecordParser::Create(RecordFormat::Parse("tfrecord"));
  std::mt19937_64 rng(9);
  SliceRun before, after;
  RunSlice(*parser, file, 0, second, rng, 4096, &before);
  RunSlice(*parser, file, second, file.bytes.size(), rng, 4096, &after);
  // The slice that starts there cannot tell a corrupt record from a false
  // start, so it moves on; the previous slice checks the record past its end.
  EXPECT_EQ(before.records, (std::vector<Rec>{{0, "first"}}));
  EXPECT_NE(before.error.find("at offset " + std::to_string(second) + ": data CRC mismatch"),
            std::string::npos)
      << before.error;
  EXPECT_EQ(after.records, (std::vector<Rec>{{third, "third"}}));
  EXPECT_EQ(after.error, "");
}

TEST(TfrecordParserTest, ARecordLongerThanMaxRecordBytesIsAnErrorOnlyForItsChain) {
  RecordFormat format = RecordFormat::Parse("tfrecord");
  format.max_record_bytes = 100;
  TestFile file = MakeTfrecordFile("/d/big.tfrecord", {"a", std::string(101, 'b'), "c"});
  auto parser = RecordParser::Create(format);
  std::mt19937_64 rng(10);
  SliceRun whole, later;
  RunSlice(*parser, file, 0, file.bytes.size(), rng, 64, &whole);
  EXPECT_EQ(whole.records, (std::vector<Rec>{{0, "a"}}));
  EXPECT_NE(whole.error.find("at offset 17: record of 101 bytes is longer than max_record_bytes"),
            std::string::npos)
      << whole.error;
  // A slice starting inside it cannot take it as a start; it finds "c".
  RunSlice(*parser, file, 20, file.bytes.size(), rng, 64, &later);
  EXPECT_EQ(later.records, (std::vector<Rec>{{file.records[2].offset, "c"}}));
  EXPECT_EQ(later.error, "");
}

// Known limit of any resync: a payload that is itself TFRecord framing looks
// like records to a slice that starts inside it. Its chain then runs into the
// outer framing, which it reports, so the damage is loud, not silent.
TEST(TfrecordParserTest, ASliceStartingInsideANestedTfrecordPayloadEndsInAnError) {
  std::string inner;
  for (const char* s : {"inner-1", "inner-2", "inner-3"}) AppendTfrecord(&inner, s);
  TestFile file = MakeTfrecordFile("/d/nested.tfrecord", {inner, "outer-2", "outer-3"});
  auto parser = RecordParser::Create(RecordFormat::Parse("tfrecord"));
  std::mt19937_64 rng(11);
  SliceRun head, tail;
  RunSlice(*parser, file, 0, 13, rng, 4096, &head);
  RunSlice(*parser, file, 13, file.bytes.size(), rng, 4096, &tail);
  EXPECT_EQ(head.records, (std::vector<Rec>{{0, inner}}));
  EXPECT_EQ(head.error, "");
  EXPECT_NE(tail.error.find("length CRC mismatch"), std::string::npos) << tail.error;
}

// ------------------------------------------------------------------------ file

TEST(FileParserTest, TheSliceAtOffsetZeroOwnsTheWholeFileExactlyOnce) {
  std::mt19937_64 rng(12);
  std::vector<TestFile> files;
  for (size_t size : {1, 3000, 50000}) {
    TestFile file{"/data/blob-" + std::to_string(size), RandomBytes(rng, size)};
    file.records = {{0, file.bytes}};
    file.awkward = {0, 1, size / 2, size - 1};
    ClampAndSort(&file.awkward, size);
    files.push_back(file);
  }
  EXPECT_GE(ExpectEverySlicingYieldsEachRecordOnce(RecordFormat::Parse("file"), files, 44), 97);
}

TEST(FileParserTest, AnEmptyFileIsOneEmptyRecord) {
  TestFile file{"/d/empty.bin"};
  auto parser = RecordParser::Create(RecordFormat::Parse("file"));
  std::mt19937_64 rng(15);
  SliceRun run;
  RunSlice(*parser, file, 0, 0, rng, 10, &run);
  EXPECT_EQ(run.records, (std::vector<Rec>{{0, ""}}));
  EXPECT_EQ(run.error, "");
}

TEST(FileParserTest, LoweringTheEndToZeroHandsTheFileToTheNewSlice) {
  TestFile file{"/d/f.bin", "contents"};
  auto parser = RecordParser::Create(RecordFormat::Parse("file"));
  parser->Begin(file.path, file.bytes.size(), 0, file.bytes.size());
  parser->SetEnd(0);
  Record record;
  size_t consumed;
  EXPECT_EQ(parser->Next(Bytes(file.bytes), file.bytes.size(), true, &record, &consumed),
            ParseStatus::kDone);
  std::mt19937_64 rng(13);
  SliceRun split_off;
  RunSlice(*parser, file, 0, file.bytes.size(), rng, 3, &split_off);
  EXPECT_EQ(split_off.records, (std::vector<Rec>{{0, "contents"}}));
}

TEST(FileParserTest, AFileLargerThanMaxRecordBytesIsAnError) {
  RecordFormat format = RecordFormat::Parse("file");
  format.max_record_bytes = 100;
  TestFile file{"/d/big.bin", std::string(101, 'x')};
  auto parser = RecordParser::Create(format);
  std::mt19937_64 rng(14);
  SliceRun run;
  RunSlice(*parser, file, 0, file.bytes.size(), rng, 4096, &run);
  EXPECT_TRUE(run.records.empty());
  EXPECT_NE(run.error.find("101 bytes, more than max_record_bytes (100)"), std::string::npos)
      << run.error;
}

}  // namespace
}  // namespace tailcut
