#include "core/key.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace idemgate::core {
namespace {

ParsedKey Parse(std::vector<std::string_view> values, const KeyRules& rules = {}) {
  return ParseIdempotencyKey(values, rules);
}

KeyError ErrorOf(std::string_view value, const KeyRules& rules = {}) {
  return Parse({value}, rules).error;
}

TEST(KeyTest, SfStringAndBareTokenAreTheSameKey) {
  const ParsedKey quoted = Parse({"\"abc-123\""});
  const ParsedKey bare = Parse({"abc-123"});
  ASSERT_TRUE(quoted.ok());
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(quoted.key, "abc-123");
  EXPECT_EQ(bare.key, "abc-123");
  EXPECT_TRUE(quoted.sf_string);
  EXPECT_FALSE(bare.sf_string);
}

TEST(KeyTest, AcceptsEveryBaseCharacter) {
  const std::string all = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~-";
  const ParsedKey k = Parse({all});
  ASSERT_TRUE(k.ok()) << KeyErrorReason(k.error);
  EXPECT_EQ(k.key, all);
}

TEST(KeyTest, AcceptsUuidsThatStartWithADigit) {
  const ParsedKey k = Parse({"5f0c7e2a-9b1d-4c3e-8f7a-1b2c3d4e5f60"});
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k.key, "5f0c7e2a-9b1d-4c3e-8f7a-1b2c3d4e5f60");
}

TEST(KeyTest, TrimsSurroundingSpacesAndTabs) {
  EXPECT_EQ(Parse({"  \"abc\"\t"}).key, "abc");
  EXPECT_EQ(Parse({"\t abc  "}).key, "abc");
}

TEST(KeyTest, EscapesInSfStringDecode) {
  KeyRules rules;
  rules.extra_charset = "\"\\";
  const ParsedKey k = Parse({R"("a\"b\\c")"}, rules);
  ASSERT_TRUE(k.ok()) << KeyErrorReason(k.error);
  EXPECT_EQ(k.key, "a\"b\\c");
  // Without the widened charset the decoded quote is not a key character.
  EXPECT_EQ(ErrorOf(R"("a\"b")"), KeyError::kBadCharset);
}

TEST(KeyTest, MissingWhenNoLine) { EXPECT_EQ(Parse({}).error, KeyError::kMissing); }

TEST(KeyTest, DuplicateLines) {
  EXPECT_EQ(Parse({"abc", "abc"}).error, KeyError::kDuplicate);
  EXPECT_EQ(Parse({"abc", "def", "ghi"}).error, KeyError::kDuplicate);
}

TEST(KeyTest, List) {
  EXPECT_EQ(ErrorOf("a,b"), KeyError::kList);
  EXPECT_EQ(ErrorOf("\"a\", \"b\""), KeyError::kList);
  EXPECT_EQ(ErrorOf("\"a\",b"), KeyError::kList);
}

TEST(KeyTest, Parameters) {
  EXPECT_EQ(ErrorOf("abc;x=1"), KeyError::kParameters);
  EXPECT_EQ(ErrorOf("\"abc\";x=1"), KeyError::kParameters);
  EXPECT_EQ(ErrorOf("\"abc\" ;x"), KeyError::kParameters);
}

TEST(KeyTest, DelimitersInsideTheStringAreNotStructure) {
  // A comma or semicolon inside quotes belongs to the key, which the charset
  // then refuses.
  EXPECT_EQ(ErrorOf("\"a,b\""), KeyError::kBadCharset);
  EXPECT_EQ(ErrorOf("\"a;b\""), KeyError::kBadCharset);
  KeyRules rules;
  rules.extra_charset = ",;";
  EXPECT_EQ(Parse({"\"a,b;c\""}, rules).key, "a,b;c");
}

TEST(KeyTest, Empty) {
  EXPECT_EQ(ErrorOf(""), KeyError::kEmpty);
  EXPECT_EQ(ErrorOf("   "), KeyError::kEmpty);
  EXPECT_EQ(ErrorOf("\"\""), KeyError::kEmpty);
}

TEST(KeyTest, BadEscapeOrUnterminatedString) {
  EXPECT_EQ(ErrorOf(R"("abc)"), KeyError::kBadString);
  EXPECT_EQ(ErrorOf(R"("a\nb")"), KeyError::kBadString);
  EXPECT_EQ(ErrorOf(R"("abc\)"), KeyError::kBadString);
  EXPECT_EQ(ErrorOf(R"("abc\")"), KeyError::kBadString);
  EXPECT_EQ(ErrorOf("\"abc\"def"), KeyError::kBadString);
  EXPECT_EQ(ErrorOf("\"a\x01z\""), KeyError::kBadString);
  EXPECT_EQ(ErrorOf("\"caf\xc3\xa9\""), KeyError::kBadString);
}

TEST(KeyTest, BadCharset) {
  EXPECT_EQ(ErrorOf("a b"), KeyError::kBadCharset);
  EXPECT_EQ(ErrorOf("\"a b\""), KeyError::kBadCharset);
  EXPECT_EQ(ErrorOf("abc/def"), KeyError::kBadCharset);
  EXPECT_EQ(ErrorOf("abc+def"), KeyError::kBadCharset);
  EXPECT_EQ(ErrorOf("caf\xc3\xa9"), KeyError::kBadCharset);
  EXPECT_EQ(ErrorOf("a\"b"), KeyError::kBadCharset);
}

TEST(KeyTest, ExtraCharsetWidens) {
  KeyRules rules;
  rules.extra_charset = "+/=";
  const ParsedKey k = Parse({"YWJj+/=="}, rules);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k.key, "YWJj+/==");
  EXPECT_EQ(ErrorOf("a b", rules), KeyError::kBadCharset);
}

TEST(KeyTest, TooLong) {
  const std::string max(255, 'k');
  EXPECT_TRUE(Parse({max}).ok());
  EXPECT_EQ(ErrorOf(max + "k"), KeyError::kTooLong);
  EXPECT_EQ(ErrorOf("\"" + max + "k\""), KeyError::kTooLong);
  KeyRules rules;
  rules.max_length = 4;
  EXPECT_TRUE(Parse({"abcd"}, rules).ok());
  EXPECT_EQ(ErrorOf("abcde", rules), KeyError::kTooLong);
}

TEST(KeyTest, LengthCountsDecodedCharacters) {
  KeyRules rules;
  rules.max_length = 3;
  rules.extra_charset = "\\";
  // Four bytes on the wire, three characters once decoded.
  EXPECT_TRUE(Parse({R"("a\\b")"}, rules).ok());
}

TEST(KeyTest, ReservedPrefix) {
  EXPECT_EQ(ErrorOf("t-abc"), KeyError::kReservedPrefix);
  EXPECT_EQ(ErrorOf("\"t-abc\""), KeyError::kReservedPrefix);
  EXPECT_TRUE(Parse({"tt-abc"}).ok());
  EXPECT_TRUE(Parse({"t_abc"}).ok());
  EXPECT_TRUE(Parse({"abc-t-"}).ok());
}

TEST(KeyTest, ColonNeverAllowedEvenWhenCharsetWidened) {
  EXPECT_EQ(ErrorOf("a:b"), KeyError::kColon);
  EXPECT_EQ(ErrorOf("\"t-x:y:z\""), KeyError::kColon);
  KeyRules rules;
  rules.extra_charset = ":";
  EXPECT_EQ(ErrorOf("a:b", rules), KeyError::kColon);
}

TEST(KeyTest, EveryReasonIsDistinct) {
  const KeyError all[] = {KeyError::kMissing,    KeyError::kDuplicate,  KeyError::kList,
                          KeyError::kParameters, KeyError::kEmpty,      KeyError::kBadString,
                          KeyError::kBadCharset, KeyError::kTooLong,    KeyError::kReservedPrefix,
                          KeyError::kColon};
  std::vector<std::string_view> seen;
  for (KeyError e : all) {
    const std::string_view reason = KeyErrorReason(e);
    EXPECT_FALSE(reason.empty());
    for (std::string_view s : seen) EXPECT_NE(s, reason);
    seen.push_back(reason);
  }
  EXPECT_EQ(KeyErrorReason(KeyError::kNone), "");
}

TEST(KeyTest, ValidateRawKey) {
  EXPECT_EQ(ValidateRawKey("abc", {}), KeyError::kNone);
  EXPECT_EQ(ValidateRawKey("", {}), KeyError::kEmpty);
  EXPECT_EQ(ValidateRawKey("a:b", {}), KeyError::kColon);
  EXPECT_EQ(ValidateRawKey("t-1", {}), KeyError::kReservedPrefix);
}

TEST(KeyTest, SerializeRoundTrips) {
  EXPECT_EQ(SerializeKeyAsSfString("abc"), "\"abc\"");
  EXPECT_EQ(SerializeKeyAsSfString("a\"b\\c"), R"("a\"b\\c")");
  KeyRules rules;
  rules.extra_charset = "\"\\";
  const std::string raw = "x\"y\\z";
  const std::string wire = SerializeKeyAsSfString(raw);
  EXPECT_EQ(Parse({wire}, rules).key, raw);
}

TEST(KeyTest, EscapesAnywhereInLongKeysRoundTrip) {
  // Escapes at the start, the end, next to each other and between long
  // runs of plain characters, in keys longer than any small-string buffer.
  KeyRules rules;
  rules.extra_charset = "\"\\";
  const std::string plain(40, 'k');
  for (const std::string& raw :
       {plain, "\"" + plain, plain + "\\", "\"\\" + plain + "\\\"", plain + "\"" + plain + "\\" + plain,
        std::string("\"\"\"\\\\"), std::string("a")}) {
    const std::string wire = SerializeKeyAsSfString(raw);
    std::string expected = "\"";
    for (char c : raw) {
      if (c == '"' || c == '\\') expected += '\\';
      expected += c;
    }
    expected += '"';
    EXPECT_EQ(wire, expected);
    const ParsedKey parsed = Parse({wire}, rules);
    EXPECT_TRUE(parsed.ok()) << wire;
    EXPECT_EQ(parsed.key, raw) << wire;
    EXPECT_TRUE(parsed.sf_string);
  }
  // A bad escape or a control character after a long run is still refused.
  EXPECT_EQ(Parse({"\"" + plain + "\\x\""}, rules).error, KeyError::kBadString);
  EXPECT_EQ(Parse({"\"" + plain + "\x01\""}, rules).error, KeyError::kBadString);
  EXPECT_EQ(Parse({"\"" + plain}, rules).error, KeyError::kBadString);
}

}  // namespace
}  // namespace idemgate::core
