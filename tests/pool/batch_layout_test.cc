// ReadBatchArrays over slots laid out by hand as tailcut.pool's loaders lay
// them out: the arrays of a batch with its table in the header or in the
// data, and every field that can be wrong refused by name, never read past.
#include "tailcut/batch_layout.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace tailcut {
namespace {

struct Slot {
  std::vector<std::byte> header = std::vector<std::byte>(kBatchHeaderBytes);
  std::vector<std::byte> data = std::vector<std::byte>(4096);
  std::vector<std::byte> table;

  void Put(std::vector<std::byte>& to, size_t at, const void* v, size_t n) {
    if (to.size() < at + n) to.resize(at + n);
    std::memcpy(to.data() + at, v, n);
  }
  void Array(BatchDtype dtype, uint64_t offset, std::vector<uint64_t> dims) {
    size_t at = table.size();
    uint8_t code = static_cast<uint8_t>(dtype), ndim = static_cast<uint8_t>(dims.size());
    Put(table, at, &code, 1);
    Put(table, at + 1, &ndim, 1);
    Put(table, at + 8, &offset, 8);
    Put(table, at + 16, dims.data(), 8 * dims.size());
  }
  // Writes the top of the header and the table: at byte 32 of the header,
  // or at `data_at` of the data.
  void Finish(uint32_t count, int64_t data_at = -1) {
    uint8_t where = data_at < 0 ? 0 : 1;
    uint64_t at = data_at < 0 ? 32 : static_cast<uint64_t>(data_at), size = table.size();
    Put(header, 0, "TCB2", 4);
    Put(header, 4, &count, 4);
    Put(header, 8, &where, 1);
    Put(header, 12, &at, 8);
    Put(header, 20, &size, 8);
    Put(data_at < 0 ? header : data, at, table.data(), table.size());
  }
  std::string Read(std::vector<BatchArray>* out, uint32_t* count = nullptr) {
    uint32_t n = 0;
    out->clear();
    std::string problem = ReadBatchArrays(header, data, &n, [&](uint32_t i, const BatchArray& a) {
      EXPECT_EQ(i, out->size());
      out->push_back(a);
    });
    if (count != nullptr) *count = n;
    return problem;
  }
};

TEST(BatchLayoutTest, ArraysOfATableInTheHeader) {
  Slot s;
  s.Array(BatchDtype::kFloat32, 0, {4, 8});
  s.Array(BatchDtype::kInt64, 128, {4});
  s.Array(BatchDtype::kUint8, 192, {0, 7});
  s.Finish(3);
  std::vector<BatchArray> got;
  uint32_t count = 0;
  ASSERT_EQ(s.Read(&got, &count), "");
  ASSERT_EQ(count, 3u);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].dtype, BatchDtype::kFloat32);
  EXPECT_EQ(got[0].ndim, 2u);
  EXPECT_EQ(got[0].dims[1], 8u);
  EXPECT_EQ(got[0].bytes, 128u);
  EXPECT_EQ(got[1].offset, 128u);
  EXPECT_EQ(got[1].bytes, 32u);
  EXPECT_EQ(got[2].bytes, 0u);
}

TEST(BatchLayoutTest, ArraysOfATableInTheData) {
  Slot s;
  for (int i = 0; i < 12; ++i) s.Array(BatchDtype::kComplex128, 64 * i, {2, 2});
  s.Finish(12, 1024);
  std::vector<BatchArray> got;
  ASSERT_EQ(s.Read(&got), "");
  ASSERT_EQ(got.size(), 12u);
  EXPECT_EQ(got[11].offset, 704u);
  EXPECT_EQ(got[11].bytes, 64u);
}

// Each broken slot and the words its refusal must have.
TEST(BatchLayoutTest, EveryBrokenFieldIsRefusedByName) {
  struct Case {
    const char* what;
    void (*breaks)(Slot&);
    const char* says;
  } cases[] = {
      {"magic", [](Slot& s) { s.header[1] = std::byte{0}; }, "bad header magic b'T\\x00B2'"},
      {"place", [](Slot& s) { s.header[8] = std::byte{2}; }, "bad array table place 2"},
      {"table past the header", [](Slot& s) { s.header[20] = std::byte{250}; },
       "is beyond the 240 bytes that may hold it"},
      {"table offset unaligned", [](Slot& s) { s.header[12] = std::byte{33}; }, "at 33 is beyond"},
      {"table offset huge", [](Slot& s) { std::memset(&s.header[12], 0xff, 8); },
       "at 18446744073709551615 is beyond"},
      {"too many arrays for the table", [](Slot& s) { s.header[4] = std::byte{4}; },
       "a table of 4 arrays in 48 bytes"},
      {"one array more than the table holds", [](Slot& s) { s.header[4] = std::byte{3}; },
       "its array table ends before array 2"},
      {"dtype", [](Slot& s) { s.header[32] = std::byte{14}; }, "bad entry of array 0 (dtype 14"},
      {"ndim", [](Slot& s) { s.header[33] = std::byte{33}; }, "(dtype 6, ndim 33)"},
      {"ndim past the table", [](Slot& s) { s.header[57] = std::byte{3}; },
       "bad entry of array 1 (dtype 4, ndim 3)"},
      {"array past the data", [](Slot& s) { s.header[41] = std::byte{0x10}; },
       "array 0 at 4096 of 32 bytes is beyond the batch's 4096 bytes"},
      {"dims overflowing",
       [](Slot& s) {
         std::memset(&s.header[48], 0xff, 8);
         std::memset(&s.header[48 + 24], 0xff, 8);
       },
       "of more than 2**62 bytes"},
  };
  for (const Case& c : cases) {
    Slot s;
    s.Array(BatchDtype::kFloat32, 0, {8});
    s.Array(BatchDtype::kInt64, 64, {2});
    s.Finish(2);
    c.breaks(s);
    std::vector<BatchArray> got;
    std::string problem = s.Read(&got);
    EXPECT_NE(problem.find(c.says), std::string::npos) << c.what << ": " << problem;
    EXPECT_EQ(problem.rfind("pooled batch: ", 0), 0u) << c.what;
    for (const BatchArray& a : got) EXPECT_LE(a.offset + a.bytes, s.data.size()) << c.what;
  }
}

TEST(BatchLayoutTest, AShortHeaderOrTableEndIsRefused) {
  Slot s;
  s.Array(BatchDtype::kUint8, 0, {8});
  s.Finish(1);
  std::vector<BatchArray> got;
  uint32_t n = 7;
  std::string problem = ReadBatchArrays(
      std::span(s.header).first(100), s.data, &n,
      [](uint32_t, const BatchArray&) { ADD_FAILURE() << "no array of a short header"; });
  EXPECT_NE(problem.find("a header of 100 bytes"), std::string::npos) << problem;
  EXPECT_EQ(n, 0u);
  // A table that ends inside the second entry (count says 2, 24 bytes hold 1.5).
  Slot t;
  t.Array(BatchDtype::kUint8, 0, {8});
  t.Finish(2);
  EXPECT_NE(t.Read(&got).find("a table of 2 arrays in 24 bytes"), std::string::npos);
  uint64_t size = 40;  // room for both entries' tops, not the second's dims
  t.Array(BatchDtype::kUint8, 64, {8, 8});
  std::memcpy(&t.header[20], &size, 8);
  t.Put(t.header, 32, t.table.data(), t.table.size());
  EXPECT_NE(t.Read(&got).find("bad entry of array 1 (dtype 0, ndim 2)"), std::string::npos)
      << t.Read(&got);
}

}  // namespace
}  // namespace tailcut
