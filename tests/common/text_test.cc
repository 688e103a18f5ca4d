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

}  // namespace
}  // namespace idemgate
