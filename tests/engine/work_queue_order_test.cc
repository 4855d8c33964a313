// Tests of tailcut/work_queue.h: the order items are handed out in (seeds and
// the shuffle bijection) and how works are sliced into items.
#include "tests/engine/queue_test_util.h"
#include "tests/engine/work_queue_fixture.h"

namespace tailcut::test {
namespace {

using std::chrono::milliseconds;

// ============================================================ order

TEST_F(WorkQueueTest, SameSeedGivesTheSameOrder) {
  const auto works = dir_.Files("f", 5, {kMiB, 3 * kMiB});
  auto a = Options("same_seed_a", works);
  a.num_slices = 200;
  a.num_epochs = 3;
  a.seed = 42;
  auto b = a;
  b.name = NewName("same_seed_b");
  const Order first = RunOrder(a);
  const Order second = RunOrder(b);
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(first, second);
}

TEST_F(WorkQueueTest, DifferentSeedsGiveDifferentOrders) {
  const auto works = dir_.Files("f", 5, {kMiB});
  auto a = Options("seed1", works);
  a.num_slices = 200;
  a.seed = 1;
  auto b = a;
  b.name = NewName("seed2");
  b.seed = 2;
  EXPECT_NE(RunOrder(a), RunOrder(b));
}

TEST_F(WorkQueueTest, EachEpochIsAPermutationInTicketOrder) {
  const auto works = dir_.Files("f", 4, {kMiB, 2 * kMiB});
  auto o = Options("perm", works);
  o.num_slices = 300;
  o.num_epochs = 4;
  o.seed = 7;
  auto q = WorkQueue::Open(o);
  const uint64_t n = q->num_items();
  ASSERT_GT(n, 100u);
  EXPECT_EQ(q->seed(), 7u);
  EXPECT_EQ(q->Stats().seed, 7u);
  EXPECT_TRUE(q->Stats().shuffle);
  const std::vector<WorkItem> got = Drain(*q);
  ASSERT_EQ(got.size(), n * 4);
  std::vector<std::vector<uint64_t>> epochs(4);
  for (uint64_t t = 0; t < got.size(); ++t) {
    // One process, one thread, nothing recovered: tickets come in order.
    ASSERT_EQ(got[t].ticket, t);
    ASSERT_EQ(got[t].epoch, t / n);
    ASSERT_EQ(got[t].index, q->ItemAt(t / n, t % n));
    epochs[t / n].push_back(got[t].index);
  }
  for (uint64_t e = 0; e < 4; ++e) {
    std::vector<uint64_t> sorted = epochs[e];
    std::sort(sorted.begin(), sorted.end());
    for (uint64_t i = 0; i < n; ++i)
      ASSERT_EQ(sorted[i], i) << "epoch " << e << " is not a permutation";
    std::vector<uint64_t> identity(n);
    std::iota(identity.begin(), identity.end(), 0);
    EXPECT_NE(epochs[e], identity) << "epoch " << e << " was not shuffled";
    for (uint64_t f = 0; f < e; ++f)
      EXPECT_NE(epochs[e], epochs[f]) << "epochs " << f << " and " << e << " agree";
  }
}

TEST_F(WorkQueueTest, WithoutShuffleItemsComeInFileAndByteOrder) {
  const std::vector<std::string> works = {dir_.File("c", 3 * kMiB), dir_.File("a", kMiB),
                                          dir_.File("b", 2 * kMiB)};
  auto o = Options("noshuffle", works);
  o.shuffle = false;
  o.num_slices = 12;
  o.num_epochs = 2;
  auto q = WorkQueue::Open(o);
  EXPECT_FALSE(q->Stats().shuffle);
  const uint64_t n = q->num_items();
  const auto& items = q->items();
  ASSERT_EQ(items.size(), n);
  for (uint64_t i = 1; i < n; ++i) {
    const bool ordered = items[i - 1].file < items[i].file ||
                         (items[i - 1].file == items[i].file && items[i - 1].end == items[i].begin);
    EXPECT_TRUE(ordered) << "item " << i << " (file " << items[i].file << " @" << items[i].begin
                         << ") does not follow item " << i - 1;
  }
  const std::vector<WorkItem> got = Drain(*q);
  ASSERT_EQ(got.size(), 2 * n);
  for (uint64_t t = 0; t < got.size(); ++t) {
    EXPECT_EQ(got[t].index, t % n) << "ticket " << t;
    EXPECT_EQ(q->ItemAt(t / n, t % n), t % n);
  }
  // Works order is kept: the first item belongs to "c", the first works entry.
  EXPECT_EQ(q->paths()[items[0].file], works[0]);
}

TEST_F(WorkQueueTest, UnsetSeedIsDrawnOnceAndSharedByAttachers) {
  const auto works = dir_.Files("f", 3, {kMiB});
  auto o = Options("noseed", works);
  o.num_slices = 30;
  auto creator = WorkQueue::Open(o);
  auto attacher = WorkQueue::Open(o);
  EXPECT_EQ(creator->seed(), attacher->seed());
  EXPECT_EQ(creator->Stats().seed, creator->seed());
  EXPECT_EQ(attacher->Stats().seed, creator->seed());
  for (uint64_t p = 0; p < creator->num_items(); ++p) {
    ASSERT_EQ(creator->ItemAt(0, p), attacher->ItemAt(0, p));
  }
  // Another queue draws its own seed (equal with probability 2^-64).
  auto other = o;
  other.name = NewName("noseed_other");
  auto q2 = WorkQueue::Open(other);
  EXPECT_NE(q2->seed(), creator->seed()) << "an unset seed should be drawn at random";
}

TEST_F(WorkQueueTest, ItemAtIsABijectionForManySizes) {
  for (const uint64_t n : {1, 2, 3, 7, 64, 1000, 4097}) {
    SCOPED_TRACE("num_slices " + std::to_string(n));
    auto o = Options("bij", {dir_.File("b" + std::to_string(n), n * 4096)});
    if (n > 1) o.num_slices = n;
    o.num_epochs = 3;
    o.seed = 1234 + n;
    auto q = WorkQueue::Open(o);
    const uint64_t m = q->num_items();
    EXPECT_LE(m > n ? m - n : n - m, 1u)
        << "one file with num_slices " << n << " gave " << m << " items";
    std::vector<std::vector<uint64_t>> perms(3);
    for (uint64_t e = 0; e < 3; ++e) {
      std::vector<bool> seen(m);
      for (uint64_t p = 0; p < m; ++p) {
        const uint64_t i = q->ItemAt(e, p);
        ASSERT_LT(i, m) << "epoch " << e << " position " << p;
        ASSERT_FALSE(seen[i]) << "item " << i << " appears twice in epoch " << e;
        seen[i] = true;
        perms[e].push_back(i);
      }
    }
    if (m >= 64) {
      EXPECT_NE(perms[0], perms[1]);
      EXPECT_NE(perms[1], perms[2]);
    }
    // Deterministic: the same object answers the same again.
    for (uint64_t p = 0; p < m; p += 1 + m / 50) EXPECT_EQ(q->ItemAt(1, p), perms[1][p]);
  }
}

// ============================================================ slicing

TEST_F(WorkQueueTest, WithoutNumSlicesEachFileIsOneItem) {
  const std::vector<uint64_t> sizes = {10, 4096, kMiB + 3};
  std::vector<std::string> works;
  for (size_t i = 0; i < sizes.size(); ++i)
    works.push_back(dir_.File("w" + std::to_string(i), sizes[i]));
  auto q = WorkQueue::Open(Options("one_per_file", works));
  ASSERT_EQ(q->num_items(), 3u);
  EXPECT_EQ(q->paths(), works);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(q->items()[i].file, i);
    EXPECT_EQ(q->items()[i].begin, 0u);
    EXPECT_EQ(q->items()[i].end, sizes[i]);
  }
}

TEST_F(WorkQueueTest, PrefixIsPrependedToEveryWork) {
  dir_.File("x.rec", 100);
  dir_.File("y.rec", 200);
  auto o = Options("prefix", {"x.rec", "y.rec"});
  o.prefix = dir_.path() + "/";
  auto q = WorkQueue::Open(o);
  ASSERT_EQ(q->paths().size(), 2u);
  EXPECT_EQ(q->paths()[0], dir_.path() + "/x.rec");
  EXPECT_EQ(q->paths()[1], dir_.path() + "/y.rec");
  for (const WorkItem& it : Drain(*q)) EXPECT_EQ(it.path, q->paths()[it.file]);
}

// Items of every file tile [0, size) in byte order, none empty unless the
// file is; returns the item count per file.
std::vector<uint64_t> CheckTiling(const WorkQueue& q, const std::vector<uint64_t>& sizes) {
  std::vector<uint64_t> next(sizes.size(), 0), count(sizes.size(), 0);
  uint32_t last_file = 0;
  for (uint64_t i = 0; i < q.items().size(); ++i) {
    const WorkQueue::Item& it = q.items()[i];
    EXPECT_LT(it.file, sizes.size());
    if (it.file >= sizes.size()) continue;
    EXPECT_GE(it.file, last_file) << "item " << i << " is out of file order";
    last_file = it.file;
    EXPECT_EQ(it.begin, next[it.file]) << "gap or overlap at item " << i << " of file " << it.file;
    EXPECT_LE(it.begin, it.end);
    if (sizes[it.file] > 0) {
      EXPECT_LT(it.begin, it.end) << "empty item " << i << " of a non-empty file";
    }
    next[it.file] = it.end;
    ++count[it.file];
  }
  for (size_t f = 0; f < sizes.size(); ++f) {
    EXPECT_EQ(next[f], sizes[f]) << "items of file " << f << " stop short of its size";
    EXPECT_GE(count[f], 1u) << "file " << f << " has no item";
  }
  return count;
}

TEST_F(WorkQueueTest, NumSlicesSpreadsItemsOverFilesBySize) {
  const std::vector<uint64_t> sizes = {kMiB, 3 * kMiB, 6 * kMiB, 100};
  std::vector<std::string> works;
  for (size_t i = 0; i < sizes.size(); ++i)
    works.push_back(dir_.File("s" + std::to_string(i), sizes[i]));
  auto o = Options("slices", works);
  o.num_slices = 100;
  auto q = WorkQueue::Open(o);
  const uint64_t n = q->num_items();
  EXPECT_GE(n, 98u);
  EXPECT_LE(n, 104u);
  const std::vector<uint64_t> count = CheckTiling(*q, sizes);
  const double total = 10.0 * kMiB + 100;
  for (size_t f = 0; f < 3; ++f) {
    const double share = 100.0 * sizes[f] / total;
    EXPECT_NEAR(static_cast<double>(count[f]), share, 2.0)
        << "file " << f << " of " << sizes[f] << " bytes";
  }
  EXPECT_EQ(count[3], 1u) << "a 100-byte file among MiB files gets one item";
  // Slices of one file are about equal.
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> range;  // file -> (min, max) length
  for (const auto& it : q->items()) {
    auto [pos, fresh] = range.try_emplace(it.file, it.end - it.begin, it.end - it.begin);
    pos->second.first = std::min(pos->second.first, it.end - it.begin);
    pos->second.second = std::max(pos->second.second, it.end - it.begin);
  }
  for (const auto& [file, mm] : range) {
    EXPECT_LE(mm.second, 2 * mm.first + 1) << "slices of file " << file << " vary from " << mm.first
                                           << " to " << mm.second << " bytes";
  }
}

TEST_F(WorkQueueTest, EveryFileGetsAtLeastOneItem) {
  std::vector<uint64_t> sizes(10, 1024);
  sizes.push_back(100 * kMiB);
  std::vector<std::string> works;
  for (size_t i = 0; i < sizes.size(); ++i)
    works.push_back(dir_.File("m" + std::to_string(i), sizes[i]));
  auto o = Options("atleast1", works);
  o.num_slices = 20;
  auto q = WorkQueue::Open(o);
  const auto count = CheckTiling(*q, sizes);
  for (size_t f = 0; f < 10; ++f) EXPECT_EQ(count[f], 1u);
  EXPECT_GE(count[10], 8u);

  // Fewer slices than files: still one item per file.
  auto few = Options("fewslices", works);
  few.num_slices = 2;
  auto q2 = WorkQueue::Open(few);
  EXPECT_EQ(q2->num_items(), works.size());
  CheckTiling(*q2, sizes);
}

TEST_F(WorkQueueTest, TinyFilesAreNotCutIntoEmptySlices) {
  auto o = Options("tiny", {dir_.File("tiny", 10)});
  o.num_slices = 100;
  auto q = WorkQueue::Open(o);
  EXPECT_LE(q->num_items(), 10u);
  CheckTiling(*q, {10});
}

TEST_F(WorkQueueTest, EmptyFilesGetOneEmptyItem) {
  const std::vector<uint64_t> sizes = {0, kMiB, 0};
  std::vector<std::string> works;
  for (size_t i = 0; i < sizes.size(); ++i)
    works.push_back(dir_.File("e" + std::to_string(i), sizes[i]));
  {
    auto q = WorkQueue::Open(Options("empty_plain", works));
    ASSERT_EQ(q->num_items(), 3u);
    CheckTiling(*q, sizes);
    EXPECT_EQ(Drain(*q).size(), 3u);
  }
  auto o = Options("empty_sliced", works);
  o.num_slices = 10;
  auto q = WorkQueue::Open(o);
  const auto count = CheckTiling(*q, sizes);
  EXPECT_EQ(count[0], 1u);
  EXPECT_EQ(count[2], 1u);
  EXPECT_GE(count[1], 8u);
  EXPECT_EQ(Drain(*q).size(), q->num_items());
}

}  // namespace
}  // namespace tailcut::test
