// Tests for tailcut/crc32c.h: published CRC32C vectors, both implementations
// against each other and a bit-at-a-time reference, the TFRecord mask and
// the TFRecord framing.
#include "tailcut/crc32c.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "io/crc32c_internal.h"

namespace tailcut {
namespace {

// Straight from the definition: reflected polynomial 0x82f63b78, one bit at a time.
uint32_t ReferenceCrc32c(const std::string& data) {
  uint32_t c = ~0u;
  for (unsigned char byte : data) {
    c ^= byte;
    for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
  }
  return ~c;
}

std::string Bytes(std::initializer_list<int> values) {
  std::string s;
  for (int v : values) s.push_back(static_cast<char>(v));
  return s;
}

std::string Iota(int first, int step) {
  std::string s;
  for (int i = 0; i < 32; ++i) s.push_back(static_cast<char>(first + i * step));
  return s;
}

using Crc32cFunction = uint32_t (*)(const void*, size_t, uint32_t) noexcept;

void ExpectPublishedVectors(Crc32cFunction crc) {
  // RFC 3720 (iSCSI) appendix B.4, and the usual check value.
  EXPECT_EQ(crc("123456789", 9, 0), 0xE3069283u);
  EXPECT_EQ(crc(std::string(32, '\0').data(), 32, 0), 0x8A9136AAu);
  EXPECT_EQ(crc(std::string(32, '\xff').data(), 32, 0), 0x62A8AB43u);
  EXPECT_EQ(crc(Iota(0, 1).data(), 32, 0), 0x46DD794Eu);
  EXPECT_EQ(crc(Iota(31, -1).data(), 32, 0), 0x113FDB5Cu);
  EXPECT_EQ(crc("", 0, 0), 0u);
}

TEST(Crc32cTest, MatchesPublishedVectors) { ExpectPublishedVectors(&Crc32c); }

TEST(Crc32cTest, TablePathMatchesPublishedVectors) { ExpectPublishedVectors(&detail::Crc32cTable); }

TEST(Crc32cTest, HardwarePathMatchesPublishedVectors) {
  if (!detail::Crc32cHasHardware()) GTEST_SKIP() << "CPU lacks SSE4.2";
  ExpectPublishedVectors(&detail::Crc32cHardware);
}

TEST(Crc32cTest, HardwareTableAndReferenceAgreeOnRandomInputs) {
  std::mt19937_64 rng(20240611);
  std::string buffer(5000, '\0');
  for (char& c : buffer) c = static_cast<char>(rng());
  for (int i = 0; i < 3000; ++i) {
    // Every alignment and every tail length, short and long.
    size_t offset = rng() % 64;
    size_t size = i < 200 ? i : rng() % (buffer.size() - offset);
    const char* data = buffer.data() + offset;
    uint32_t reference = ReferenceCrc32c(std::string(data, size));
    ASSERT_EQ(detail::Crc32cTable(data, size, 0), reference) << "size " << size;
    ASSERT_EQ(Crc32c(data, size), reference) << "size " << size;
    if (detail::Crc32cHasHardware()) {
      ASSERT_EQ(detail::Crc32cHardware(data, size, 0), reference) << "size " << size;
    }
  }
}

TEST(Crc32cTest, ContinuingFromACrcEqualsOneCallOverTheWhole) {
  std::mt19937_64 rng(7);
  std::string data(1000, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  for (size_t cut : {0, 1, 7, 8, 9, 500, 999, 1000}) {
    uint32_t whole = Crc32c(data.data(), data.size());
    uint32_t first = Crc32c(data.data(), cut);
    EXPECT_EQ(Crc32c(data.data() + cut, data.size() - cut, first), whole) << "cut " << cut;
    EXPECT_EQ(detail::Crc32cTable(data.data() + cut, data.size() - cut, first), whole);
  }
}

TEST(Crc32cTest, MaskRotatesRightBy15AndAddsTheTfrecordConstant) {
  EXPECT_EQ(MaskCrc32c(0), 0xa282ead8u);
  EXPECT_EQ(MaskCrc32c(0x80000000u), 0xa283ead8u);
  EXPECT_EQ(MaskCrc32c(0xffffffffu), 0xa282ead7u);  // the addition wraps
  EXPECT_EQ(MaskCrc32c(0x12345678u), 0x4f730f40u);
  // The point of the mask: a CRC of data that embeds CRCs is not trivially one.
  uint32_t crc = Crc32c("foo", 3);
  EXPECT_NE(MaskCrc32c(crc), crc);
  EXPECT_NE(MaskCrc32c(MaskCrc32c(crc)), crc);
}

TEST(Crc32cTest, AppendTfrecordWritesLengthHeaderDataAndFooter) {
  std::string out = "x";
  AppendTfrecord(&out, "hello");
  AppendTfrecord(&out, "");
  // Bytes computed with an independent implementation of the TFRecord framing.
  std::string hello = Bytes({0x05, 0, 0, 0, 0, 0, 0, 0, 0xea, 0xb2, 0x04, 0x3e}) + "hello" +
                      Bytes({0xbb, 0x1f, 0x1c, 0x19});
  std::string empty =
      Bytes({0, 0, 0, 0, 0, 0, 0, 0, 0x29, 0x03, 0x98, 0x07}) + Bytes({0xd8, 0xea, 0x82, 0xa2});
  EXPECT_EQ(out, "x" + hello + empty);
}

}  // namespace
}  // namespace tailcut
