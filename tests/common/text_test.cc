#include "common/text.h"

#include <gtest/gtest.h>

namespace idemgate {
namespace {

TEST(RedactUrl, HidesUserInformationAndTheQuery) {
  EXPECT_EQ(RedactUrl("http://admin:s3cret@10.0.0.1:8080/x"), "http://***@10.0.0.1:8080/x");
  EXPECT_EQ(RedactUrl("https://idp.example/jwks?access_token=abc&x=1"), "https://idp.example/jwks?***");
  EXPECT_EQ(RedactUrl("https://u@h/p?q=1#frag"), "https://***@h/p?***#frag");
  // An '@' after the authority is not user information.
  EXPECT_EQ(RedactUrl("http://h/a@b"), "http://h/a@b");
  EXPECT_EQ(RedactUrl("http://h:1/path"), "http://h:1/path");
  EXPECT_EQ(RedactUrl("no scheme?token=1"), "no scheme?***");
  EXPECT_EQ(RedactUrl(""), "");
}

TEST(Printable, EscapesControlCharactersAndBytesThatAreNotUtf8) {
  EXPECT_EQ(Printable("plain text, caf\u00e9 \u20ac"), "plain text, caf\u00e9 \u20ac");
  EXPECT_EQ(Printable("a\tb\nc\rd"), "a\\tb\\nc\\rd");
  EXPECT_EQ(Printable("\x1b[31mred\x7f\x01"), "\\x1b[31mred\\x7f\\x01");
  EXPECT_EQ(Printable(std::string_view("nul\0", 4)), "nul\\x00");
  // C1 controls (U+0080..U+009F) escaped as code points, a lone or cut UTF-8 byte as a byte.
  EXPECT_EQ(Printable("\xc2\x9b" "2J"), "\\u009b2J");
  EXPECT_EQ(Printable("\xff\xc3"), "\\xff\\xc3");
  EXPECT_EQ(Printable("a\"b\\c"), "a\"b\\c");  // quotes and backslashes stay
}

}  // namespace
}  // namespace idemgate
