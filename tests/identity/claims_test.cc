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
  EXPECT_FALSE(CallerFromClaims(Claims(R"({"org":"o1","app":"a1","uid":"u1","kind":""})"), jwt).ok());
  EXPECT_FALSE(CallerFromClaims(Claims(R"({"org":"o1","app":"a1","uid":"u1","kind":null})"), jwt).ok());
  EXPECT_FALSE(CallerFromClaims(Claims(R"({"org":"o1","app":"a1","uid":"u1","kind":["user"]})"), jwt).ok());
}

// A token without the configured type claim is typed as without the setting: the sub's own type,
// else identity.jwt.subject_type (configuration.md: "when no claim gives it").
TEST(CallerFromClaimsTest, AbsentTypeClaimFallsBackToTheDefault) {
  config::JwtIdentity jwt;
  jwt.claims.subject_type = "kind";
  auto c = CallerFromClaims(Claims(R"({"tenant":"t","project":"p","sub":"u1"})"), jwt);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->subject, "user:u1");
  jwt.subject_type = "service";
  c = CallerFromClaims(Claims(R"({"tenant":"t","project":"p","sub":"u1"})"), jwt);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->subject, "service:u1");
  // An already typed sub keeps its type, as it does without a type claim configured.
  c = CallerFromClaims(Claims(R"({"tenant":"t","project":"p","sub":"client:app-7"})"), jwt);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->subject, "client:app-7");
  // Present, the claim wins over the default.
  c = CallerFromClaims(Claims(R"({"tenant":"t","project":"p","sub":"u1","kind":"tenant_member"})"), jwt);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->subject, "tenant_member:u1");
}

// A sub that already carries a type is never typed twice ("service:user:u1"): with a type claim
// naming the same type it is kept, with a type claim naming another one the token is refused.
TEST(CallerFromClaimsTest, TypedSubjectAndTypeClaimNeverDoublePrefix) {
  config::JwtIdentity jwt;
  jwt.claims.subject_type = "kind";
  auto c = CallerFromClaims(Claims(R"({"tenant":"t","project":"p","sub":"service:billing","kind":"service"})"), jwt);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->subject, "service:billing");
  c = CallerFromClaims(Claims(R"({"tenant":"t","project":"p","sub":"user:u1","kind":"service"})"), jwt);
  ASSERT_FALSE(c.ok()) << c->subject;
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(), "the token's sub claim is typed user but its kind claim says service");
  // A colon after something that is not a type is part of the id, and gets the claim's type.
  c = CallerFromClaims(Claims(R"({"tenant":"t","project":"p","sub":"auth0|x:y","kind":"service"})"), jwt);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->subject, "service:auth0|x:y");
  c = CallerFromClaims(Claims(R"({"tenant":"t","project":"p","sub":"users:u1","kind":"client"})"), jwt);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->subject, "client:users:u1");
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
