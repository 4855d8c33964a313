// Tests of engine/config.h: slicing files into items, resolving options into
// a QueueConfig (stat, prefix, validation) and the fingerprint that every
// process of one queue, and every checkpoint of it, must share.
#include "engine/config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tailcut/error.h"
#include "tests/engine/queue_test_util.h"

namespace tailcut::detail {
namespace {

using test::Contains;
using test::TempDir;
using Item = WorkQueue::Item;

// Empty string when `items` tile every file of `sizes` exactly: in file
// order, contiguous, non-overlapping, at least one per file, no empty slice
// of a non-empty file. Otherwise what is wrong.
std::string TilingProblem(const std::vector<uint64_t>& sizes, const std::vector<Item>& items) {
  size_t i = 0;
  for (size_t f = 0; f < sizes.size(); ++f) {
    const std::string where = "file " + std::to_string(f) + ": ";
    if (i == items.size() || items[i].file != f) return where + "no item";
    uint64_t at = 0;
    for (; i < items.size() && items[i].file == f; ++i) {
      if (items[i].begin != at)
        return where + "item " + std::to_string(i) + " begins at " +
               std::to_string(items[i].begin) + ", expected " + std::to_string(at);
      if (items[i].end < items[i].begin)
        return where + "item " + std::to_string(i) + " ends before it begins";
      if (sizes[f] > 0 && items[i].end == items[i].begin)
        return where + "empty item " + std::to_string(i);
      at = items[i].end;
    }
    if (at != sizes[f])
      return where + "covered up to " + std::to_string(at) + " of " + std::to_string(sizes[f]);
  }
  if (i != items.size())
    return "item " + std::to_string(i) + " names file " + std::to_string(items[i].file);
  return "";
}

std::vector<uint64_t> CountPerFile(size_t num_files, const std::vector<Item>& items) {
  std::vector<uint64_t> count(num_files, 0);
  for (const Item& it : items) ++count.at(it.file);
  return count;
}

// ============================================================ SliceFiles

TEST(SliceFilesTest, WithoutNumSlicesGivesOneWholeItemPerFile) {
  const std::vector<uint64_t> sizes = {10, 0, 1 << 20, 1};
  const std::vector<Item> items = SliceFiles(sizes, 0);
  ASSERT_EQ(items.size(), sizes.size());
  for (uint32_t f = 0; f < sizes.size(); ++f) {
    EXPECT_EQ(items[f].file, f);
    EXPECT_EQ(items[f].begin, 0u);
    EXPECT_EQ(items[f].end, sizes[f]);
  }
}

TEST(SliceFilesTest, FewerSlicesThanFilesStillGivesOneItemPerFile) {
  const std::vector<uint64_t> sizes = {100, 200, 300, 400};
  for (uint64_t slices : {1, 2, 3, 4}) {
    const std::vector<Item> items = SliceFiles(sizes, slices);
    EXPECT_EQ(items.size(), sizes.size()) << "num_slices=" << slices;
    EXPECT_EQ(TilingProblem(sizes, items), "") << "num_slices=" << slices;
  }
}

TEST(SliceFilesTest, SpreadsSlicesOverFilesBySize) {
  // 1:2:3:4 of 100 slices.
  const std::vector<uint64_t> sizes = {1000, 2000, 3000, 4000};
  const std::vector<Item> items = SliceFiles(sizes, 100);
  EXPECT_EQ(TilingProblem(sizes, items), "");
  EXPECT_EQ(CountPerFile(sizes.size(), items), (std::vector<uint64_t>{10, 20, 30, 40}));
}

TEST(SliceFilesTest, SlicesOfOneFileDifferByAtMostOneByte) {
  const std::vector<uint64_t> sizes = {1000003, 7, 999};
  const std::vector<Item> items = SliceFiles(sizes, 1000);
  ASSERT_EQ(TilingProblem(sizes, items), "");
  for (uint32_t f = 0; f < sizes.size(); ++f) {
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const Item& it : items) {
      if (it.file != f) continue;
      lo = std::min(lo, it.end - it.begin);
      hi = std::max(hi, it.end - it.begin);
    }
    EXPECT_LE(hi - lo, 1u) << "file " << f;
  }
}

TEST(SliceFilesTest, RandomSizesTileEveryFileWithCountsCloseToTheirShare) {
  std::mt19937_64 rng(2024);
  for (int trial = 0; trial < 500; ++trial) {
    const size_t n = 1 + rng() % 40;
    std::vector<uint64_t> sizes(n);
    for (uint64_t& s : sizes) {
      switch (rng() % 4) {
        case 0:
          s = 0;
          break;
        case 1:
          s = rng() % 16;
          break;
        case 2:
          s = rng() % (1 << 20);
          break;
        default:
          s = rng() % (uint64_t{1} << 40);
          break;
      }
    }
    const uint64_t num_slices = 1 + rng() % 5000;
    const std::vector<Item> items = SliceFiles(sizes, num_slices);
    ASSERT_EQ(TilingProblem(sizes, items), "") << "trial " << trial;

    unsigned __int128 total = 0;
    for (uint64_t s : sizes) total += s;
    const std::vector<uint64_t> count = CountPerFile(n, items);
    for (size_t f = 0; f < n; ++f) {
      // Never more slices than bytes; otherwise the share, rounded either way,
      // or the one item every file has.
      if (sizes[f] > 0) EXPECT_LE(count[f], sizes[f]) << "trial " << trial << " file " << f;
      if (num_slices <= n || total == 0) {
        EXPECT_EQ(count[f], 1u) << "trial " << trial << " file " << f;
        continue;
      }
      const unsigned __int128 exact = static_cast<unsigned __int128>(num_slices) * sizes[f];
      const uint64_t floor_share = static_cast<uint64_t>(exact / total);
      const uint64_t ceil_share = floor_share + (exact % total != 0);
      const bool ok = count[f] == floor_share || count[f] == ceil_share ||
                      (count[f] == 1 && floor_share == 0) ||
                      (count[f] == sizes[f] && floor_share >= sizes[f]);
      EXPECT_TRUE(ok) << "trial " << trial << " file " << f << " of " << n << ": " << count[f]
                      << " slices, share " << floor_share << ".." << ceil_share;
    }
    // About num_slices in all: at least the slices the bytes allow, at most
    // one extra per file raised to its one item.
    uint64_t capacity = 0;
    for (uint64_t s : sizes) capacity += std::max<uint64_t>(s, 1);
    EXPECT_GE(items.size(), std::min<uint64_t>(std::max<uint64_t>(num_slices, n), capacity))
        << "trial " << trial;
    EXPECT_LT(items.size(), std::max<uint64_t>(num_slices, n) + n) << "trial " << trial;
  }
}

TEST(SliceFilesTest, GivesExactlyNumSlicesWhenEveryFileHasAWholeShare) {
  // Every file's share is at least one slice and at most its bytes: the
  // apportionment hands out exactly num_slices.
  const std::vector<uint64_t> sizes = {5000, 7001, 3000, 12345, 9900};
  for (uint64_t slices : {13, 17, 100, 1000, 37246}) {
    const std::vector<Item> items = SliceFiles(sizes, slices);
    EXPECT_EQ(TilingProblem(sizes, items), "") << "num_slices=" << slices;
    EXPECT_EQ(items.size(), slices) << "num_slices=" << slices;
  }
}

TEST(SliceFilesTest, EmptyFilesKeepOneEmptyItem) {
  const std::vector<uint64_t> sizes = {0, 100, 0};
  const std::vector<Item> items = SliceFiles(sizes, 10);
  ASSERT_EQ(TilingProblem(sizes, items), "");
  const std::vector<uint64_t> count = CountPerFile(sizes.size(), items);
  EXPECT_EQ(count[0], 1u);
  EXPECT_EQ(count[2], 1u);
  EXPECT_GE(count[1], 8u);
}

TEST(SliceFilesTest, AllFilesEmptyGivesOneItemPerFile) {
  const std::vector<uint64_t> sizes = {0, 0, 0};
  const std::vector<Item> items = SliceFiles(sizes, 50);
  EXPECT_EQ(TilingProblem(sizes, items), "");
  EXPECT_EQ(items.size(), 3u);
}

TEST(SliceFilesTest, NeverCutsAFileIntoMoreSlicesThanBytes) {
  const std::vector<uint64_t> sizes = {3};
  const std::vector<Item> items = SliceFiles(sizes, 10);
  ASSERT_EQ(TilingProblem(sizes, items), "");
  EXPECT_EQ(items.size(), 3u);
}

TEST(SliceFilesTest, ASingleHugeFileSplitsEvenlyWithoutOverflow) {
  // The largest file tailcut takes: size * j / k must not overflow 64 bits.
  const std::vector<uint64_t> sizes = {kMaxFileBytes};
  const std::vector<Item> items = SliceFiles(sizes, 1000000);
  ASSERT_EQ(items.size(), 1000000u);
  ASSERT_EQ(TilingProblem(sizes, items), "");
  for (const Item& it : items) ASSERT_LE(it.end - it.begin - kMaxFileBytes / 1000000, 1u);
}

TEST(SliceFilesTest, HugeFilesBesideSmallOnesKeepTheSmallOnesWhole) {
  const std::vector<uint64_t> sizes = {kMaxFileBytes, 10, kMaxFileBytes};
  const std::vector<Item> items = SliceFiles(sizes, 1000);
  ASSERT_EQ(TilingProblem(sizes, items), "");
  const std::vector<uint64_t> count = CountPerFile(sizes.size(), items);
  EXPECT_EQ(count[1], 1u);
  EXPECT_EQ(count[0] + count[2] + count[1], 1000u);
  EXPECT_LE(count[0] > count[2] ? count[0] - count[2] : count[2] - count[0], 1u);
}

// ============================================================ ResolveConfig

class ResolveConfigTest : public ::testing::Test {
 protected:
  WorkQueueOptions Options(std::vector<std::string> works) {
    WorkQueueOptions o;
    o.name = "config_test";
    o.works = std::move(works);
    return o;
  }
  // The message of the Error that ResolveConfig throws, checking its kind.
  std::string ErrorOf(const WorkQueueOptions& o, ErrorKind kind) {
    try {
      ResolveConfig(o);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "no error";
    return "";
  }
  TempDir dir_;
};

TEST_F(ResolveConfigTest, StatsEveryFileAndSlicesThem) {
  const std::string a = dir_.File("a", 1000), b = dir_.File("b", 3000), c = dir_.File("c", 0);
  auto o = Options({a, b, c});
  o.num_slices = 8;
  o.num_epochs = 3;
  const QueueConfig config = ResolveConfig(o);
  EXPECT_EQ(config.paths, (std::vector<std::string>{a, b, c}));
  EXPECT_EQ(config.sizes, (std::vector<uint64_t>{1000, 3000, 0}));
  EXPECT_EQ(config.total_bytes, 4000u);
  EXPECT_EQ(config.num_slices, 8u);
  EXPECT_EQ(config.num_epochs, 3u);
  EXPECT_EQ(TilingProblem(config.sizes, config.items), "");
  EXPECT_EQ(config.total_tickets(), config.items.size() * 3);
}

TEST_F(ResolveConfigTest, UnsetNumSlicesGivesOneItemPerFile) {
  const auto works = dir_.Files("f", 4, {10, 0, 1 << 20});
  const QueueConfig config = ResolveConfig(Options(works));
  EXPECT_EQ(config.num_slices, 0u);
  ASSERT_EQ(config.items.size(), 4u);
  EXPECT_EQ(TilingProblem(config.sizes, config.items), "");
}

TEST_F(ResolveConfigTest, PrependsThePrefixToEveryWork) {
  dir_.File("x", 5);
  dir_.File("y", 6);
  auto o = Options({"x", "y"});
  o.prefix = dir_.path() + "/";
  const QueueConfig config = ResolveConfig(o);
  EXPECT_EQ(config.paths, (std::vector<std::string>{dir_.path() + "/x", dir_.path() + "/y"}));
  EXPECT_EQ(config.sizes, (std::vector<uint64_t>{5, 6}));
}

TEST_F(ResolveConfigTest, MissingFileNamesThePrefixedPathItsIndexAndThePrefix) {
  dir_.File("x", 5);
  auto o = Options({"x", "missing"});
  o.prefix = dir_.path() + "/";
  const std::string msg = ErrorOf(o, ErrorKind::kNotFound);
  EXPECT_TRUE(Contains(msg, dir_.path() + "/missing")) << msg;
  EXPECT_TRUE(Contains(msg, "works[1]")) << msg;
  EXPECT_TRUE(Contains(msg, "prefix")) << msg;
  EXPECT_TRUE(Contains(msg, "config_test")) << msg;
}

TEST_F(ResolveConfigTest, TheFirstBadFileByIndexIsTheOneNamed) {
  // Enough works to stat in parallel: the message must still be stable.
  std::vector<std::string> works = dir_.Files("f", 300, {1});
  works[150] = dir_.path() + "/gone150";
  works[250] = dir_.path() + "/gone250";
  works[290] = dir_.path();  // a directory, later still
  for (int run = 0; run < 3; ++run) {
    const std::string msg = ErrorOf(Options(works), ErrorKind::kNotFound);
    EXPECT_TRUE(Contains(msg, "works[150]")) << msg;
    EXPECT_FALSE(Contains(msg, "gone250")) << msg;
  }
}

TEST_F(ResolveConfigTest, ADirectoryIsRefusedByName) {
  const std::string msg = ErrorOf(Options({dir_.path()}), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(Contains(msg, "'" + dir_.path() + "'")) << msg;
  EXPECT_TRUE(Contains(msg, "directory")) << msg;
}

TEST_F(ResolveConfigTest, AFifoIsRefusedAsNotARegularFile) {
  const std::string fifo = dir_.path() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string msg = ErrorOf(Options({dir_.File("ok", 1), fifo}), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(Contains(msg, fifo)) << msg;
  EXPECT_TRUE(Contains(msg, "works[1]")) << msg;
  EXPECT_TRUE(Contains(msg, "not a regular file")) << msg;
}

TEST_F(ResolveConfigTest, AnUnreadableFileIsAPermissionError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files whatever their mode";
  const std::string f = dir_.File("secret", 10);
  ASSERT_EQ(::chmod(f.c_str(), 0), 0);
  const std::string msg = ErrorOf(Options({f}), ErrorKind::kPermission);
  EXPECT_TRUE(Contains(msg, f)) << msg;
  EXPECT_TRUE(Contains(msg, "not readable")) << msg;
}

TEST_F(ResolveConfigTest, BadOptionsAreRefusedNamingTheOption) {
  const std::string f = dir_.File("f", 100);
  struct Case {
    const char* field;
    void (*set)(WorkQueueOptions&);
  };
  const Case cases[] = {
      {"works", [](WorkQueueOptions& o) { o.works.clear(); }},
      {"num_epochs", [](WorkQueueOptions& o) { o.num_epochs = 0; }},
      {"num_slices", [](WorkQueueOptions& o) { o.num_slices = 0; }},
      {"num_clients", [](WorkQueueOptions& o) { o.num_clients = 0; }},
      {"max_clients", [](WorkQueueOptions& o) { o.max_clients = 0; }},
      {"max_clients", [](WorkQueueOptions& o) { o.max_clients = kMaxClients + 1; }},
      {"leases_per_client", [](WorkQueueOptions& o) { o.leases_per_client = 0; }},
      {"leases_per_client",
       [](WorkQueueOptions& o) { o.leases_per_client = kMaxLeasesPerClient + 1; }},
      {"max_clients x leases_per_client",
       [](WorkQueueOptions& o) {
         o.max_clients = kMaxClients;
         o.leases_per_client = 8;
       }},
      {"format", [](WorkQueueOptions& o) { o.format = std::string(kFormatTagBytes, 'x'); }},
  };
  for (const Case& c : cases) {
    auto o = Options({f});
    c.set(o);
    const std::string msg = ErrorOf(o, ErrorKind::kInvalidArgument);
    EXPECT_TRUE(Contains(msg, c.field)) << c.field << ": " << msg;
    EXPECT_TRUE(Contains(msg, "'config_test'")) << c.field << ": " << msg;
  }
}

TEST_F(ResolveConfigTest, LimitsAreInclusive) {
  auto o = Options({dir_.File("f", 100)});
  o.max_clients = kMaxClients;
  o.leases_per_client = static_cast<uint32_t>(kMaxLeases / kMaxClients);
  o.format = std::string(kFormatTagBytes - 1, 'x');
  o.num_slices = 1;
  EXPECT_NO_THROW(ResolveConfig(o));
  o.max_clients = 1;
  o.leases_per_client = kMaxLeasesPerClient;
  EXPECT_NO_THROW(ResolveConfig(o));
}

TEST_F(ResolveConfigTest, TooManyTicketsNamesItemsAndEpochs) {
  auto o = Options({dir_.File("a", 10), dir_.File("b", 10)});
  o.num_epochs = kMaxTickets / 2;
  EXPECT_NO_THROW(ResolveConfig(o));
  o.num_epochs = kMaxTickets / 2 + 1;
  const std::string msg = ErrorOf(o, ErrorKind::kInvalidArgument);
  EXPECT_TRUE(Contains(msg, "2 items")) << msg;
  EXPECT_TRUE(Contains(msg, "epochs")) << msg;
}

TEST_F(ResolveConfigTest, BadQueueNamesAreRefused) {
  const std::string f = dir_.File("f", 1);
  for (const std::string& name :
       {std::string(), std::string(kMaxNameLength + 1, 'a'), std::string("a/b"), std::string("a b"),
        std::string("."), std::string("..")}) {
    auto o = Options({f});
    o.name = name;
    const std::string msg = ErrorOf(o, ErrorKind::kInvalidArgument);
    EXPECT_TRUE(Contains(msg, "queue name")) << "'" << name << "': " << msg;
  }
  EXPECT_NO_THROW(ValidateQueueName(std::string(kMaxNameLength, 'a')));
  EXPECT_NO_THROW(ValidateQueueName("Az09._-"));
  EXPECT_NO_THROW(ValidateQueueName("..."));
}

TEST_F(ResolveConfigTest, NameErrorsSayWhatIsWrong) {
  try {
    ValidateQueueName("bad/name");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(Contains(e.what(), "'bad/name'")) << e.what();
    EXPECT_TRUE(Contains(e.what(), "'/'")) << e.what();
  }
  try {
    ValidateQueueName(std::string(kMaxNameLength + 1, 'a'));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(Contains(e.what(), std::to_string(kMaxNameLength + 1))) << e.what();
  }
}

// A NUL in a user string is refused and shown escaped: C strings (and so
// messages and system calls) would end at it.
TEST_F(ResolveConfigTest, NulInNamesPrefixesAndPathsIsRefusedAndShownEscaped) {
  using namespace std::string_literals;
  const std::string a = dir_.File("a", 100);
  auto o = Options({a});
  o.name = "job\0x"s;
  EXPECT_EQ(ErrorOf(o, ErrorKind::kInvalidArgument),
            "queue name 'job\\x00x' contains '\\x00'; use only ASCII letters, digits, '.', '_' "
            "and '-'");
  o = Options({"a"});
  o.prefix = dir_.path() + "/\0"s;
  EXPECT_EQ(ErrorOf(o, ErrorKind::kInvalidArgument),
            "queue 'config_test': prefix '" + dir_.path() +
                "/\\x00' contains a NUL byte; no path has one");
  o = Options({a + "\0.bak"s});
  EXPECT_EQ(ErrorOf(o, ErrorKind::kInvalidArgument),
            "queue 'config_test': work file '" + a +
                "\\x00.bak' (works[0]) contains a NUL byte; no file has such a name");
  o = Options({a});
  o.format = "lines\0"s;
  EXPECT_EQ(ErrorOf(o, ErrorKind::kInvalidArgument),
            "queue 'config_test': format tag 'lines\\x00' contains a control character; use the "
            "tag RecordFormat::Tag() gives");
  try {
    ValidateQueueName("ring\nname", "batch ring name");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "batch ring name 'ring\\x0aname' contains '\\x0a'; use only ASCII letters, "
                 "digits, '.', '_' and '-'");
  }
}

// ============================================================ fingerprint

class FingerprintTest : public ResolveConfigTest {
 protected:
  void SetUp() override {
    works_ = dir_.Files("f", 3, {1000, 2000});
    base_ = Options(works_);
    base_.num_slices = 10;
    base_.num_epochs = 2;
    base_.seed = 7;
    base_.format = "lines";
  }
  uint64_t Of(const WorkQueueOptions& o) { return ResolveConfig(o).Fingerprint(); }
  std::vector<std::string> works_;
  WorkQueueOptions base_;
};

TEST_F(FingerprintTest, IsTheSameForTheSameOptions) { EXPECT_EQ(Of(base_), Of(base_)); }

TEST_F(FingerprintTest, ChangesWithEveryFieldThatDefinesTheDataOrItsOrder) {
  const uint64_t base = Of(base_);
  struct Case {
    const char* what;
    void (*set)(WorkQueueOptions&);
  };
  const Case cases[] = {
      {"works order", [](WorkQueueOptions& o) { std::swap(o.works[0], o.works[1]); }},
      {"one work fewer", [](WorkQueueOptions& o) { o.works.pop_back(); }},
      {"num_slices", [](WorkQueueOptions& o) { o.num_slices = 11; }},
      {"num_slices unset", [](WorkQueueOptions& o) { o.num_slices.reset(); }},
      {"num_epochs", [](WorkQueueOptions& o) { o.num_epochs = 3; }},
      {"shuffle", [](WorkQueueOptions& o) { o.shuffle = false; }},
      {"seed", [](WorkQueueOptions& o) { o.seed = 8; }},
      {"seed unset", [](WorkQueueOptions& o) { o.seed.reset(); }},
      {"format", [](WorkQueueOptions& o) { o.format = "tfrecord"; }},
      {"format empty", [](WorkQueueOptions& o) { o.format.clear(); }},
  };
  for (const Case& c : cases) {
    WorkQueueOptions o = base_;
    c.set(o);
    EXPECT_NE(Of(o), base) << c.what;
  }
}

TEST_F(FingerprintTest, ChangesWhenAFileChangesSize) {
  const uint64_t before = Of(base_);
  dir_.File("f0", 1001);
  EXPECT_NE(Of(base_), before);
}

TEST_F(FingerprintTest, ChangesWhenAFileIsReplacedByAnotherPathOfTheSameSize) {
  const uint64_t before = Of(base_);
  WorkQueueOptions o = base_;
  o.works[0] = dir_.File("other", 1000);
  EXPECT_NE(Of(o), before);
}

TEST_F(FingerprintTest, IgnoresOptionsThatDoNotChangeTheData) {
  const uint64_t base = Of(base_);
  WorkQueueOptions o = base_;
  o.name = "another_name";
  o.num_clients = 4;
  o.max_clients = 16;
  o.leases_per_client = 2;
  o.attach_timeout = std::chrono::milliseconds(1);
  o.lease_timeout = std::chrono::milliseconds(500);
  o.split_tail = !o.split_tail;
  o.min_split_bytes = 1;
  EXPECT_EQ(Of(o), base);
}

TEST_F(FingerprintTest, DependsOnTheResolvedPathNotHowThePrefixSplitsIt) {
  WorkQueueOptions o = base_;
  o.prefix = dir_.path() + "/";
  for (std::string& w : o.works) w = w.substr(o.prefix.size());
  EXPECT_EQ(Of(o), Of(base_));
}

TEST_F(FingerprintTest, WithoutAnExplicitSeedTheStoredSeedIsIgnored) {
  // The creator draws the seed then; the fingerprint must not depend on it.
  WorkQueueOptions o = base_;
  o.seed.reset();
  QueueConfig a = ResolveConfig(o), b = a;
  b.seed = 12345;
  EXPECT_EQ(a.Fingerprint(), b.Fingerprint());
}

TEST_F(FingerprintTest, PathAndSizeHashesSeeOnlyTheirOwnField) {
  const QueueConfig a = ResolveConfig(base_);
  QueueConfig b = a;
  b.sizes[0] += 1;
  EXPECT_EQ(a.PathsHash(), b.PathsHash());
  EXPECT_NE(a.SizesHash(), b.SizesHash());
  QueueConfig c = a;
  c.paths[0] += "x";
  EXPECT_NE(a.PathsHash(), c.PathsHash());
  EXPECT_EQ(a.SizesHash(), c.SizesHash());
  // Moving a byte from one path to the next is a different list of paths.
  QueueConfig d = a;
  d.paths = {"ab", "c", "d"};
  QueueConfig e = a;
  e.paths = {"a", "bc", "d"};
  EXPECT_NE(d.PathsHash(), e.PathsHash());
}

}  // namespace
}  // namespace tailcut::detail
