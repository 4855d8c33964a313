// Tests of the "tar" record format (tailcut/record_format.h) and of
// tailcut/tar_sample.h: WebDataset shards written at run time by Python's
// tarfile (ustar, GNU and pax formats) and by GNU tar yield every sample
// exactly once with the right members and bytes, however the file is sliced
// and fed; a damaged shard is an error naming the file and the offset.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tailcut/record_format.h"
#include "tailcut/tar_sample.h"
#include "tests/io/reader_test_util.h"

namespace tailcut {
namespace {

namespace fs = std::filesystem;

// One sample as a reader should hand it out: its key and its members'
// (path, bytes), in archive order.
struct Sample {
  std::string key;
  std::vector<std::pair<std::string, std::string>> members;
  auto operator<=>(const Sample&) const = default;
};

struct Shard {
  std::string path;
  std::string bytes;
  std::vector<Sample> samples;  // in archive order
};

// The entries of every shard: samples of 1-3 members (one with a long path,
// one with a double suffix), a directory inside a sample's run (it does not
// end it) and a file without a key between samples (it belongs to none).
struct Entry {
  std::string path;
  bool directory = false;
  std::string bytes;
};

std::vector<Entry> MakeEntries() {
  std::mt19937_64 rng(7);
  std::vector<Entry> entries;
  const std::string long_dir = std::string(70, 'd') + "/" + std::string(50, 'e');  // path > 100
  static const size_t kSizes[] = {0, 1, 511, 512, 513, 3000, 1024, 9000, 77};
  for (int i = 0; i < 40; ++i) {
    char key[32];
    std::snprintf(key, sizeof key, "train/%06d", i);
    const std::string base = i == 5 ? long_dir + "/" + std::string(key + 6) : key;
    const int members = 1 + i % 3;
    static const char* kSuffixes[] = {".jpg", ".json", ".seg.png"};
    for (int m = 0; m < members; ++m) {
      Entry e;
      e.path = base + kSuffixes[m];
      e.bytes = Bytes(rng, kSizes[(i * 3 + m) % 9]);
      entries.push_back(e);
      if (i == 8 && m == 0) entries.push_back({"train/sub8/", true, ""});
    }
    if (i == 12) entries.push_back({"train/README", false, "no key: part of no sample\n"});
  }
  return entries;
}

std::vector<Sample> ExpectedSamples(const std::vector<Entry>& entries) {
  std::vector<Sample> samples;
  for (const Entry& e : entries) {
    if (e.directory || e.path.find('.') == std::string::npos) continue;
    const size_t slash = e.path.rfind('/');
    const std::string key = e.path.substr(0, e.path.find('.', slash + 1));
    if (samples.empty() || samples.back().key != key) samples.push_back({key, {}});
    samples.back().members.emplace_back(e.path, e.bytes);
  }
  return samples;
}

// Writes the entries under dir/stage and a shard with `how`: "ustar", "gnu"
// or "pax" through Python's tarfile, "gnutar" or "gnutar-posix" through tar.
// Returns false (with a reason) if the tool is missing.
bool WriteShard(const std::string& dir, const std::string& how, Shard* shard, std::string* why) {
  const std::vector<Entry> entries = MakeEntries();
  const std::string stage = dir + "/stage";
  std::string manifest;
  for (const Entry& e : entries) {
    if (e.directory) {
      fs::create_directories(stage + "/" + e.path);
    } else {
      fs::create_directories(fs::path(stage + "/" + e.path).parent_path());
      WriteFile(stage + "/" + e.path, e.bytes);
    }
    manifest += (e.directory ? e.path.substr(0, e.path.size() - 1) : e.path) + "\n";
  }
  WriteFile(dir + "/manifest", manifest);
  shard->path = dir + "/" + how + ".tar";
  std::string command;
  if (how.rfind("gnutar", 0) == 0) {
    command = "tar --no-recursion --format=" + std::string(how == "gnutar" ? "gnu" : "posix") +
              " -cf " + shard->path + " -C " + stage + " -T " + dir + "/manifest";
  } else {
    const std::string format = how == "ustar" ? "USTAR_FORMAT"
                               : how == "gnu" ? "GNU_FORMAT"
                                              : "PAX_FORMAT";
    command =
        "python3 -c 'import sys, tarfile\n"
        "stage, out, manifest = sys.argv[1:4]\n"
        "with tarfile.open(out, \"w\", format=tarfile." +
        format +
        ") as t:\n"
        "    for p in open(manifest).read().split(\"\\n\"):\n"
        "        if p: t.add(stage + \"/\" + p, arcname=p, recursive=False)\n' " +
        stage + " " + shard->path + " " + dir + "/manifest";
  }
  if (std::system(command.c_str()) != 0) {
    *why = "could not run: " + command;
    return false;
  }
  shard->bytes = ReadFile(shard->path);
  shard->samples = ExpectedSamples(entries);
  return true;
}

Sample ToSample(const Record& record) {
  TarSample sample(record);
  Sample out{sample.key(), {}};
  for (const TarMember& m : sample.members())
    out.members.emplace_back(m.path, std::string(reinterpret_cast<const char*>(m.data), m.size));
  return out;
}

struct SliceRun {
  std::vector<Sample> samples;
  std::vector<uint64_t> offsets;
  std::string error;
};

// Feeds slice [begin, end) the way a reader does: a window from the offset
// Begin returns that grows by `step` bytes whenever the parser needs more.
// With split_after > 0, the tail is split off (SetEnd at the parser's
// position) after that many samples, as an idle process does; *split says where.
SliceRun RunSlice(const Shard& shard, uint64_t begin, uint64_t end, size_t step,
                  RecordFormat format = RecordFormat::Parse("tar"), size_t split_after = 0,
                  uint64_t* split = nullptr) {
  SliceRun run;
  auto parser = RecordParser::Create(format);
  uint64_t at;
  try {
    at = parser->Begin(shard.path, shard.bytes.size(), begin, end);
  } catch (const Error& e) {
    run.error = e.what();
    return run;
  }
  size_t window = step;
  for (;;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(window, shard.bytes.size() - at));
    const bool eof = at + n >= shard.bytes.size();
    Record record;
    size_t consumed = 0;
    const ParseStatus status = parser->Next(
        reinterpret_cast<const std::byte*>(shard.bytes.data()) + at, n, eof, &record, &consumed);
    at += consumed;
    if (status == ParseStatus::kRecord) {
      run.samples.push_back(ToSample(record));
      run.offsets.push_back(record.offset);
      window = step;
      if (split_after > 0 && run.samples.size() == split_after) {
        parser->SetEnd(parser->position());
        *split = parser->position();
      }
    } else if (status == ParseStatus::kNeedMore) {
      EXPECT_FALSE(eof && consumed == 0) << "kNeedMore with the whole file in the window";
      if (eof && consumed == 0) return run;
      window = consumed > 0 ? std::max(window, step) : window + step;
    } else if (status == ParseStatus::kError) {
      run.error = parser->error();
      return run;
    } else {
      return run;
    }
  }
}

class TarShardTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    std::string why;
    if (!WriteShard(dir_.path(), GetParam(), &shard_, &why)) GTEST_SKIP() << why;
  }
  TempDir dir_;
  Shard shard_;
};

TEST_P(TarShardTest, EverySampleOnceWithItsMembersAndBytesHoweverFed) {
  ASSERT_EQ(shard_.samples.size(), 40u);
  for (size_t step : {7ul, 100ul, 511ul, 512ul, 4096ul, 1ul << 20}) {
    SliceRun run = RunSlice(shard_, 0, shard_.bytes.size(), step);
    EXPECT_EQ(run.error, "") << "step " << step;
    EXPECT_TRUE(run.samples == shard_.samples)
        << "step " << step << ": " << run.samples.size() << " samples read";
  }
}

TEST_P(TarShardTest, SlicesCutAnywhereTogetherYieldEverySampleOnce) {
  const uint64_t size = shard_.bytes.size();
  const SliceRun whole = RunSlice(shard_, 0, size, 1 << 20);
  ASSERT_EQ(whole.samples.size(), shard_.samples.size());
  // Cuts at, around and between sample starts, and at evenly spaced offsets.
  std::vector<uint64_t> cuts;
  for (uint64_t start : whole.offsets)
    for (int64_t d : {-513, -1, 0, 1, 512})
      if (static_cast<int64_t>(start) + d > 0 && start + d < size) cuts.push_back(start + d);
  for (uint64_t slices : {2u, 3u, 7u, 31u})
    for (uint64_t k = 1; k < slices; ++k) cuts.push_back(size * k / slices);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  for (size_t stride : {1ul, 5ul, 17ul}) {
    std::vector<uint64_t> bounds = {0};
    for (size_t i = 0; i < cuts.size(); i += stride) bounds.push_back(cuts[i]);
    bounds.push_back(size);
    std::vector<Sample> got;
    for (size_t i = 0; i + 1 < bounds.size(); ++i) {
      SliceRun run = RunSlice(shard_, bounds[i], bounds[i + 1], 700);
      ASSERT_EQ(run.error, "") << "slice [" << bounds[i] << ", " << bounds[i + 1] << ")";
      for (uint64_t offset : run.offsets) {
        EXPECT_GE(offset, bounds[i]);
        EXPECT_LT(offset, bounds[i + 1]);
      }
      got.insert(got.end(), run.samples.begin(), run.samples.end());
    }
    EXPECT_TRUE(got == shard_.samples) << "stride " << stride << ": " << got.size() << " samples";
  }
}

TEST_P(TarShardTest, ATailSplitOffMidSliceIsReadOnceByWhoeverTakesIt) {
  // The owner lowers its end past what it has parsed; the tail [split, end)
  // is a new slice that starts at a sample's end, not at a header of its own.
  const uint64_t size = shard_.bytes.size();
  for (size_t after : {1ul, 7ul, 20ul}) {
    uint64_t split = 0;
    SliceRun head = RunSlice(shard_, 0, size, 700, RecordFormat::Parse("tar"), after, &split);
    ASSERT_EQ(head.error, "");
    EXPECT_EQ(head.samples.size(), after);
    SliceRun tail = RunSlice(shard_, split, size, 700);
    ASSERT_EQ(tail.error, "");
    std::vector<Sample> got = head.samples;
    got.insert(got.end(), tail.samples.begin(), tail.samples.end());
    EXPECT_TRUE(got == shard_.samples) << "split after " << after << " samples at " << split;
  }
}

TEST_P(TarShardTest, AReaderWithSmallChunksReadsEverySampleOnce) {
  // The whole path: a queue of slices, a Reader with 4 KiB chunks, so that
  // samples cross chunk boundaries and slices start mid-sample.
  for (uint64_t num_slices : {0u, 9u}) {
    DataSet data;
    data.format = RecordFormat::Parse("tar");
    data.paths = {shard_.path};
    const std::string name = UniqueQueueName();
    QueueCleanup cleanup{name};
    WorkQueueOptions options = QueueOptions(data, name, num_slices);
    if (num_slices == 0) options.num_slices.reset();  // one item per file
    auto queue = WorkQueue::Open(options);
    auto reader = Reader::Open(*queue, SmallReaderOptions(data.format, IoBackend::kPread, false));
    Outcome outcome = ReadRecords(*reader);
    EXPECT_EQ(outcome.last, ReadStatus::kEnd) << outcome.error;
    std::vector<Sample> got;
    for (const std::string& bytes : outcome.records) {
      Record r{reinterpret_cast<const std::byte*>(bytes.data()), bytes.size(), 0, bytes.size()};
      got.push_back(ToSample(r));
    }
    std::vector<Sample> want = shard_.samples;
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    EXPECT_TRUE(got == want) << "num_slices " << num_slices << ": " << got.size() << " samples";
  }
}

INSTANTIATE_TEST_SUITE_P(Writers, TarShardTest,
                         ::testing::Values("ustar", "gnu", "pax", "gnutar", "gnutar-posix"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// --- Damage ----------------------------------------------------------------

class TarDamageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!WriteShard(dir_.path(), "gnu", &shard_, &why)) GTEST_SKIP() << why;
    whole_ = RunSlice(shard_, 0, shard_.bytes.size(), 1 << 20);
    ASSERT_EQ(whole_.samples.size(), shard_.samples.size());
  }
  // Rewrites the shard's file with `bytes`.
  void Save() { WriteFile(shard_.path, shard_.bytes); }
  // Fixes the checksum of the header block at `offset` after an edit.
  void Reseal(uint64_t offset) {
    char* h = shard_.bytes.data() + offset;
    std::memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; ++i) sum += static_cast<unsigned char>(h[i]);
    std::snprintf(h + 148, 8, "%06o", sum);
  }
  TempDir dir_;
  Shard shard_;
  SliceRun whole_;
};

std::string At(const Shard& shard, uint64_t offset) {
  return "tar file '" + shard.path + "' at offset " + std::to_string(offset) + ": ";
}

TEST_F(TarDamageTest, ADamagedHeaderIsAnErrorNamingFileAndOffset) {
  const uint64_t at = whole_.offsets[3];
  shard_.bytes[at + 3] ^= 0x20;  // a byte of the name: the checksum no longer matches
  Save();
  const SliceRun run = RunSlice(shard_, 0, shard_.bytes.size(), 4096);
  EXPECT_EQ(run.samples.size(), 2u);  // the third sample's end is the damaged header
  EXPECT_NE(run.error.find(At(shard_, at) + "header checksum mismatch"), std::string::npos)
      << run.error;
  // A slice that starts past the damage cannot find its samples: the same error.
  const SliceRun later = RunSlice(shard_, at + 1, shard_.bytes.size(), 4096);
  EXPECT_NE(later.error.find(At(shard_, at) + "header checksum mismatch"), std::string::npos)
      << later.error;
}

TEST_F(TarDamageTest, ASizeFieldThatIsNotOctalIsAnError) {
  const uint64_t at = whole_.offsets[4];
  std::memcpy(shard_.bytes.data() + at + 124, "00000zz0000", 11);
  Reseal(at);
  Save();
  const SliceRun run = RunSlice(shard_, 0, shard_.bytes.size(), 4096);
  EXPECT_NE(
      run.error.find(At(shard_, at) + "size field '00000zz0000?' is neither octal nor base-256"),
      std::string::npos)
      << run.error;
}

TEST_F(TarDamageTest, ABase256SizeFieldIsRead) {
  // GNU tar writes sizes of 8 GiB and more in base-256: the same size that
  // way must read the same samples.
  const uint64_t at = whole_.offsets[4];
  const SliceRun before = RunSlice(shard_, 0, shard_.bytes.size(), 4096);
  uint64_t size = 0;
  for (int i = 0; i < 11 && shard_.bytes[at + 124 + i] >= '0'; ++i)
    size = size * 8 + (shard_.bytes[at + 124 + i] - '0');
  unsigned char field[12] = {0x80};
  for (int i = 0; i < 8; ++i) field[11 - i] = static_cast<unsigned char>(size >> (8 * i));
  std::memcpy(shard_.bytes.data() + at + 124, field, 12);
  Reseal(at);
  Save();
  const SliceRun after = RunSlice(shard_, 0, shard_.bytes.size(), 4096);
  EXPECT_EQ(after.error, "");
  EXPECT_TRUE(after.samples == before.samples);
}

TEST_F(TarDamageTest, AMemberCutShortIsAnError) {
  // Cut the file inside the data of a large member near the end.
  size_t cut_sample = shard_.samples.size();
  uint64_t cut = 0;
  while (cut == 0 && cut_sample-- > 0)
    for (const auto& [path, bytes] : shard_.samples[cut_sample].members)
      if (bytes.size() >= 1000) {
        cut = shard_.bytes.find(bytes, whole_.offsets[cut_sample]) + 10;
        break;
      }
  ASSERT_GT(cut, 10u);
  shard_.bytes.resize(cut);
  Save();
  const SliceRun run = RunSlice(shard_, 0, shard_.bytes.size(), 4096);
  EXPECT_EQ(run.samples.size(), cut_sample);
  EXPECT_NE(run.error.find("truncated member"), std::string::npos) << run.error;
  EXPECT_NE(run.error.find("tar file '" + shard_.path + "' at offset "), std::string::npos)
      << run.error;
  EXPECT_NE(run.error.find("the file ends at " + std::to_string(cut)), std::string::npos)
      << run.error;
}

TEST_F(TarDamageTest, NotATarFileIsAnError) {
  shard_.bytes = std::string(4096, 'x');
  Save();
  const SliceRun run = RunSlice(shard_, 0, shard_.bytes.size(), 512);
  EXPECT_NE(run.error.find(At(shard_, 0) + "header checksum mismatch"), std::string::npos)
      << run.error;
}

TEST_F(TarDamageTest, ASampleLargerThanMaxRecordBytesIsAnError) {
  RecordFormat format = RecordFormat::Parse("tar");
  format.max_record_bytes = 4096;  // sample 7 holds 9000 bytes of data
  const SliceRun run = RunSlice(shard_, 0, shard_.bytes.size(), 512, format);
  EXPECT_NE(run.error.find("sample of more than max_record_bytes (4096)"), std::string::npos)
      << run.error;
  EXPECT_NE(run.error.find(At(shard_, whole_.offsets[run.samples.size()])), std::string::npos)
      << run.error;
}

TEST(TarGlobalHeaderTest, AGlobalPaxPathIsRefusedAndOtherGlobalKeysAreIgnored) {
  // Python's tarfile writes TarFile(pax_headers=...) as a global 'g' header.
  TempDir dir;
  const std::string stage = dir.path() + "/a.txt";
  WriteFile(stage, "hello");
  for (const std::string& key : {"comment", "path"}) {
    const std::string out = dir.path() + "/" + key + ".tar";
    const std::string command =
        "python3 -c 'import sys, tarfile\n"
        "with tarfile.open(sys.argv[1], \"w\", format=tarfile.PAX_FORMAT, "
        "pax_headers={sys.argv[3]: \"x\"}) as t: t.add(sys.argv[2], arcname=\"k/0001.txt\")' " +
        out + " " + stage + " " + key;
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    Shard shard{out, ReadFile(out), {}};
    const SliceRun run = RunSlice(shard, 0, shard.bytes.size(), 512);
    if (key == "comment") {
      EXPECT_EQ(run.error, "");
      ASSERT_EQ(run.samples.size(), 1u);
      EXPECT_EQ(run.samples[0].key, "k/0001");
    } else {
      EXPECT_NE(run.error.find(At(shard, 0) + "a global pax header sets path"), std::string::npos)
          << run.error;
    }
  }
}

TEST(TarFormatTest, TheNameParsesAndTagsAsTar) {
  const RecordFormat format = RecordFormat::Parse("tar");
  EXPECT_EQ(format.kind, RecordFormatKind::kTar);
  EXPECT_EQ(format.Tag(), "tar");
  EXPECT_TRUE(format.FitsTag("tar"));
  EXPECT_FALSE(format.FitsTag("lines"));
  try {
    RecordFormat::Parse("tarr");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("file or tar"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tailcut
