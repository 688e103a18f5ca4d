#include "client/client.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <regex>
#include <string>
#include <unordered_set>
#include <vector>

namespace idemgate::client {
namespace {

using std::chrono::milliseconds;
using std::chrono::system_clock;

const std::regex kUuid("^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$");

// The hex digit at text position `pos` as a number.
int Nibble(const std::string& uuid, std::size_t pos) {
  const char c = uuid.at(pos);
  return c <= '9' ? c - '0' : c - 'a' + 10;
}

// Version: the first digit of the third group; variant: the top two bits of the fourth group.
int Version(const std::string& uuid) { return Nibble(uuid, 14); }
int VariantBits(const std::string& uuid) { return Nibble(uuid, 19) >> 2; }

// The 48-bit timestamp of a UUID v7 (its first 12 hex digits).
std::uint64_t V7Millis(const std::string& uuid) {
  const std::string hex = uuid.substr(0, 8) + uuid.substr(9, 4);
  return std::stoull(hex, nullptr, 16);
}

TEST(KeysTest, V4HasFormatVersionAndVariant) {
  for (int i = 0; i < 200; ++i) {
    const std::string key = NewKeyV4();
    ASSERT_TRUE(std::regex_match(key, kUuid)) << key;
    EXPECT_EQ(Version(key), 4) << key;
    EXPECT_EQ(VariantBits(key), 0b10) << key;
  }
}

TEST(KeysTest, V4IsUniqueOver10kKeys) {
  std::unordered_set<std::string> seen;
  for (int i = 0; i < 10000; ++i) ASSERT_TRUE(seen.insert(NewKeyV4()).second) << "duplicate after " << i;
}

TEST(KeysTest, V7HasFormatVersionVariantAndTimestamp) {
  const auto now = system_clock::time_point(milliseconds(1'700'000'123'456));
  for (int i = 0; i < 200; ++i) {
    const std::string key = NewKeyV7(now);
    ASSERT_TRUE(std::regex_match(key, kUuid)) << key;
    EXPECT_EQ(Version(key), 7) << key;
    EXPECT_EQ(VariantBits(key), 0b10) << key;
    EXPECT_EQ(V7Millis(key), 1'700'000'123'456u) << key;
  }
}

TEST(KeysTest, V7TimestampFollowsTheClockAndDropsSubMilliseconds) {
  const auto now = system_clock::now();
  const auto ms = std::chrono::duration_cast<milliseconds>(now.time_since_epoch()).count();
  EXPECT_EQ(V7Millis(NewKeyV7(now)), static_cast<std::uint64_t>(ms));
  EXPECT_EQ(V7Millis(NewKeyV7(system_clock::time_point(milliseconds(1)) + std::chrono::microseconds(999))), 1u);
  EXPECT_EQ(NewKeyV7(system_clock::time_point(milliseconds(0))).substr(0, 13), "00000000-0000");
  // The 48-bit field keeps its big-endian order.
  EXPECT_EQ(NewKeyV7(system_clock::time_point(milliseconds(0x0123456789ab))).substr(0, 13), "01234567-89ab");
}

TEST(KeysTest, V7IsUniqueOver10kKeysInOneMillisecond) {
  const auto now = system_clock::now();
  std::unordered_set<std::string> seen;
  for (int i = 0; i < 10000; ++i) ASSERT_TRUE(seen.insert(NewKeyV7(now)).second) << "duplicate after " << i;
}

TEST(KeysTest, DerivedKeyIsAStableV8) {
  const std::string key = DerivedKey("payments", "user-42", "invoice-7", "charge", "v1");
  ASSERT_TRUE(std::regex_match(key, kUuid)) << key;
  EXPECT_EQ(Version(key), 8);
  EXPECT_EQ(VariantBits(key), 0b10);
  EXPECT_EQ(DerivedKey("payments", "user-42", "invoice-7", "charge", "v1"), key);
}

TEST(KeysTest, DerivedKeyKnownValue) {
  // SHA-256 over each part as an 8-byte big-endian length and its bytes:
  //   { printf '\0\0\0\0\0\0\0\x08payments'; printf '\0\0\0\0\0\0\0\x07user-42';
  //     printf '\0\0\0\0\0\0\0\x09invoice-7'; printf '\0\0\0\0\0\0\0\x06charge';
  //     printf '\0\0\0\0\0\0\0\x02v1'; } | openssl dgst -sha256
  //   = c972a26db0405dbd540dc4e040e0f0e83142e8018f75736652e1ce019d37c296
  // First 16 bytes with version 8 (byte 6: 0x5d -> 0x8d) and variant 10 (byte 8: 0x54 -> 0x94), as
  //   python3 -c "import hashlib,struct; parts=[b'payments',b'user-42',b'invoice-7',b'charge',b'v1'];
  //     b=bytearray(hashlib.sha256(b''.join(struct.pack('>Q',len(p))+p for p in parts)).digest()[:16]);
  //     b[6]=b[6]&0x0f|0x80; b[8]=b[8]&0x3f|0x80; h=b.hex();
  //     print('-'.join([h[:8],h[8:12],h[12:16],h[16:20],h[20:]]))"
  EXPECT_EQ(DerivedKey("payments", "user-42", "invoice-7", "charge", "v1"), "c972a26d-b040-8dbd-940d-c4e040e0f0e8");
}

TEST(KeysTest, DerivedKeyDiffersWhenAnyPartDiffers) {
  const std::string base = DerivedKey("d", "s", "e", "o", "v");
  EXPECT_NE(DerivedKey("D", "s", "e", "o", "v"), base);
  EXPECT_NE(DerivedKey("d", "S", "e", "o", "v"), base);
  EXPECT_NE(DerivedKey("d", "s", "E", "o", "v"), base);
  EXPECT_NE(DerivedKey("d", "s", "e", "O", "v"), base);
  EXPECT_NE(DerivedKey("d", "s", "e", "o", "V"), base);
  EXPECT_NE(DerivedKey("d", "s", "e", "o", ""), base);
}

TEST(KeysTest, DerivedKeyFramingPreventsCollisions) {
  EXPECT_NE(DerivedKey("ab", "c", "e", "o", "v"), DerivedKey("a", "bc", "e", "o", "v"));
  EXPECT_NE(DerivedKey("a:b", "c", "e", "o", "v"), DerivedKey("a", "b:c", "e", "o", "v"));
  EXPECT_NE(DerivedKey("", "", "", "", "x"), DerivedKey("x", "", "", "", ""));
  EXPECT_NE(DerivedKey("", "", "", "", ""), DerivedKey("", "", "", "", std::string(1, '\0')));
}

TEST(KeysTest, DerivedKeyCarriesArbitraryBytes) {
  const std::string binary("a\0b\xff", 4);
  const std::string key = DerivedKey(binary, "s", "e", "o", "v");
  EXPECT_TRUE(std::regex_match(key, kUuid)) << key;
  EXPECT_NE(key, DerivedKey("a", "s", "e", "o", "v"));
}

// ValidateKey: the gateway's rules for a raw key (core::ValidateRawKey with
// the default rules), explained, naming the key.
TEST(KeysTest, ValidateKeyAcceptsWhatTheGatewayAccepts) {
  for (const std::string& key : std::vector<std::string>{"order-42", "a", "A.b_c~d-9", "-t-", std::string(255, 'x')}) {
    EXPECT_TRUE(ValidateKey(key).ok()) << key << ": " << ValidateKey(key).ToString();
  }
  EXPECT_TRUE(ValidateKey(NewKeyV4()).ok());
  EXPECT_TRUE(ValidateKey(NewKeyV7()).ok());
  EXPECT_TRUE(ValidateKey(DerivedKey("billing", "user:alice", "invoice-9", "pay", "v1")).ok());
}

TEST(KeysTest, ValidateKeyRefusesWhatTheGatewayRefusesAndSaysWhy) {
  struct Case {
    std::string key;
    std::vector<std::string> said;  // parts of the message
  };
  const std::vector<Case> cases = {
      {"", {"empty"}},
      {std::string(256, 'x'), {"256 characters", "at most 255", "\"xxxx", "..."}},
      {"order:42", {"\"order:42\"", "colon"}},
      {"order 42", {"\"order 42\"", "[A-Za-z0-9._~-]", "\" \" at offset 5"}},
      {"a/b", {"\"/\" at offset 1"}},
      {"caf\xc3\xa9", {"\"caf\\xc3\\xa9\"", "\"\\xc3\" at offset 3"}},
      {"bad\nkey", {"\"bad\\x0akey\"", "offset 3"}},
      {"t-abc", {"\"t-abc\"", "\"t-\"", "reserved"}},
  };
  for (const Case& c : cases) {
    const Status status = ValidateKey(c.key);
    ASSERT_FALSE(status.ok()) << c.key;
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << c.key;
    for (const std::string& part : c.said) {
      EXPECT_NE(status.message().find(part), std::string::npos)
          << c.key << ": " << status.message() << " lacks " << part;
    }
  }
}

}  // namespace
}  // namespace idemgate::client
