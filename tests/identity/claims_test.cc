#include "identity/claims.h"

#include <gtest/gtest.h>

#include <boost/json/parse.hpp>

namespace idemgate::identity {
namespace {

boost::json::object Claims(std::string_view text) { return boost::json::parse(text).as_object(); }

TEST(CallerFromClaimsTest, ReadsTheMappedClaimsAndTypesTheSubject) {
  config::JwtIdentity jwt;
  auto c = CallerFromClaims(Claims(R"({"tenant":"acme","project":"shop","sub":"alice"})"), jwt);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->tenant, "acme");
  EXPECT_EQ(c->project, "shop");
  EXPECT_EQ(c->subject, "user:alice");
  // Already typed: kept.
  c = CallerFromClaims(Claims(R"({"tenant":"acme","project":"shop","sub":"service:billing"})"), jwt);
  EXPECT_EQ(c->subject, "service:billing");
  // A colon that is not a known type is part of the id.
  c = CallerFromClaims(Claims(R"({"tenant":"acme","project":"shop","sub":"auth0|x:y"})"), jwt);
  EXPECT_EQ(c->subject, "user:auth0|x:y");
  // Integers are written in decimal; another default type.
  jwt.subject_type = "client";
  c = CallerFromClaims(Claims(R"({"tenant":7,"project":"shop","sub":12})"), jwt);
  EXPECT_EQ(c->tenant, "7");
  EXPECT_EQ(c->subject, "client:12");
}

TEST(CallerFromClaimsTest, OtherClaimNamesAndATypeClaim) {
  config::JwtIdentity jwt;
  jwt.claims = {.tenant = "org", .project = "app", .subject = "uid", .subject_type = "kind"};
  auto c = CallerFromClaims(Claims(R"({"org":"o1","app":"a1","uid":"u1","kind":"tenant_member"})"), jwt);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->tenant, "o1");
  EXPECT_EQ(c->project, "a1");
  EXPECT_EQ(c->subject, "tenant_member:u1");
  // The type claim must name a known type.
  EXPECT_FALSE(CallerFromClaims(Claims(R"({"org":"o1","app":"a1","uid":"u1","kind":"robot"})"), jwt).ok());
  EXPECT_FALSE(CallerFromClaims(Claims(R"({"org":"o1","app":"a1","uid":"u1"})"), jwt).ok());
}

TEST(CallerFromClaimsTest, RefusesMissingOrUnusableClaimsNamingThem) {
  const config::JwtIdentity jwt;
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"project":"shop","sub":"alice"})", "tenant"},
      {R"({"tenant":"acme","sub":"alice"})", "project"},
      {R"({"tenant":"acme","project":"shop"})", "sub"},
      {R"({"tenant":"","project":"shop","sub":"alice"})", "tenant"},
      {R"({"tenant":"a b","project":"shop","sub":"alice"})", "tenant"},
      {R"({"tenant":["acme"],"project":"shop","sub":"alice"})", "tenant"},
      {R"({"tenant":"acme","project":"shop","sub":true})", "sub"},
  };
  for (const auto& [text, claim] : bad) {
    auto c = CallerFromClaims(Claims(text), jwt);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_NE(c.status().message().find("token's " + claim + " claim"), std::string::npos) << c.status().message();
  }
  EXPECT_FALSE(CallerFromClaims(Claims(R"({"tenant":")" + std::string(257, 'x') + R"(","project":"p","sub":"s"})"), jwt).ok());
}

}  // namespace
}  // namespace idemgate::identity
