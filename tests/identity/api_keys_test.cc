#include "identity/api_keys.h"

#include <gtest/gtest.h>

namespace idemgate::identity {
namespace {

constexpr char kHashA[] = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8";  // sha256("password")

TEST(ApiKeysTest, ParsesEntriesAndLowerCasesTheHash) {
  const std::string upper = "5E884898DA28047151D0E56F8DC6292773603D0D6AABBDD62A11EF721D1542D8";
  auto keys = ParseApiKeys("keys:\n  - { sha256: " + upper + ", tenant: acme, project: shop, subject: \"service:a\" }\n",
                           "keys.yaml");
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  ASSERT_EQ(keys->size(), 1u);
  const core::Caller& c = keys->at(kHashA);
  EXPECT_EQ(c.tenant, "acme");
  EXPECT_EQ(c.project, "shop");
  EXPECT_EQ(c.subject, "service:a");
}

TEST(ApiKeysTest, RefusesMalformedFilesNamingTheEntry) {
  const std::string entry = std::string("{ sha256: ") + kHashA + ", tenant: acme, project: shop, subject: s }";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"keys: [", "YAML syntax error"},
      {"other: []", "expected a mapping with a list `keys`"},
      {"keys:\n  - { sha256: abc, tenant: a, project: p, subject: s }", "keys[0].sha256: expected 64 hex digits"},
      {std::string("keys:\n  - { sha256: ") + kHashA + ", project: p, subject: s }", "keys[0].tenant"},
      {std::string("keys:\n  - { sha256: ") + kHashA + ", tenant: \"a b\", project: p, subject: s }", "keys[0].tenant"},
      {"keys:\n  - " + entry + "\n  - " + entry, "keys[1].sha256: the same key is listed twice"},
      {std::string("keys:\n  - { sha256: ") + kHashA + ", tenant: a, project: p, subject: s, role: x }",
       "keys[0]: unknown key role"},
  };
  for (const auto& [text, want] : bad) {
    auto keys = ParseApiKeys(text, "keys.yaml");
    ASSERT_FALSE(keys.ok()) << text;
    EXPECT_NE(keys.status().message().find(want), std::string::npos) << keys.status().message();
    EXPECT_EQ(keys.status().message().rfind("keys.yaml", 0), 0u) << keys.status().message();
  }
}

}  // namespace
}  // namespace idemgate::identity
