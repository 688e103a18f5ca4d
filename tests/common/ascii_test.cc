#include "common/ascii.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>

namespace idemgate {
namespace {

// The definition, byte by byte.
bool NaiveEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto fold = [](unsigned char c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; };
    if (fold(static_cast<unsigned char>(a[i])) != fold(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

TEST(AsciiTest, LowerAscii8FoldsExactlyTheUpperCaseLettersOfEveryByte) {
  // Each of the 256 byte values in each of the 8 positions, with neighbours
  // that could carry into it if the arithmetic leaked between bytes.
  for (int pos = 0; pos < 8; ++pos) {
    for (int v = 0; v < 256; ++v) {
      for (std::uint8_t filler : {std::uint8_t{0x00}, std::uint8_t{0x5a}, std::uint8_t{0x7f}, std::uint8_t{0xff}}) {
        unsigned char bytes[8];
        std::memset(bytes, filler, 8);
        bytes[pos] = static_cast<unsigned char>(v);
        std::uint64_t w;
        std::memcpy(&w, bytes, 8);
        const std::uint64_t lowered = LowerAscii8(w);
        unsigned char out[8];
        std::memcpy(out, &lowered, 8);
        for (int i = 0; i < 8; ++i) {
          const unsigned char expected = static_cast<unsigned char>(LowerAscii(static_cast<char>(bytes[i])));
          ASSERT_EQ(out[i], expected) << "byte " << v << " at " << pos << ", filler " << int(filler);
        }
      }
    }
  }
}

TEST(AsciiTest, EqualsIgnoreCaseAsciiAgreesWithTheDefinition) {
  EXPECT_TRUE(EqualsIgnoreCaseAscii("Content-Type", "content-type"));
  EXPECT_TRUE(EqualsIgnoreCaseAscii("IDEMPOTENCY-KEY", "idempotency-key"));
  EXPECT_TRUE(EqualsIgnoreCaseAscii("", ""));
  EXPECT_FALSE(EqualsIgnoreCaseAscii("Content-Type", "content-typf"));
  EXPECT_FALSE(EqualsIgnoreCaseAscii("a", "ab"));
  // Pairs that a plain `| 0x20` would confuse: '^' and '~', '@' and '`',
  // '[' and '{', and bytes above 0x7f.
  EXPECT_FALSE(EqualsIgnoreCaseAscii("x-^^^^^^^^", "x-~~~~~~~~"));
  EXPECT_FALSE(EqualsIgnoreCaseAscii("@@@@@@@@@", "`````````"));
  EXPECT_FALSE(EqualsIgnoreCaseAscii("[[[[[[[[", "{{{{{{{{"));
  EXPECT_FALSE(EqualsIgnoreCaseAscii("\xc1\xc1\xc1\xc1\xc1\xc1\xc1\xc1", "\xe1\xe1\xe1\xe1\xe1\xe1\xe1\xe1"));

  // Random strings over a small alphabet that holds both cases of letters
  // and the confusable bytes, so that equal-ignoring-case pairs are common.
  std::mt19937 rng(42);
  const std::string alphabet = "aAzZ@`[{^~-_0\x7f\x80\xc1\xe1";
  for (int n = 0; n < 20000; ++n) {
    const std::size_t len = rng() % 20;
    std::string a;
    std::string b;
    for (std::size_t i = 0; i < len; ++i) {
      const char c = alphabet[rng() % alphabet.size()];
      a += c;
      // Usually the same letter in either case, sometimes another byte.
      b += rng() % 8 == 0 ? alphabet[rng() % alphabet.size()] : (rng() % 2 ? LowerAscii(c) : c);
    }
    ASSERT_EQ(EqualsIgnoreCaseAscii(a, b), NaiveEquals(a, b)) << a << " / " << b;
  }
}

}  // namespace
}  // namespace idemgate
