#include "identity/api_keys.h"

#include <gtest/gtest.h>

namespace idemgate::identity {
namespace {

constexpr char kHashA[] =
    "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8";  // sha256("password")
constexpr char kHashB[] = "8d2451d127fe11a26ddbbaa6d0d3063772926cd8f65e0d15174082ad898488e5";

std::string ErrorOf(const std::string& text) {
  auto keys = ParseApiKeys(text, "keys.yaml");
  return keys.ok() ? "(loaded)" : std::string(keys.status().message());
}

TEST(ApiKeysTest, ParsesEntriesAndLowerCasesTheHash) {
  const std::string upper = "5E884898DA28047151D0E56F8DC6292773603D0D6AABBDD62A11EF721D1542D8";
  auto keys = ParseApiKeys(
      "keys:\n  - { sha256: " + upper + ", tenant: acme, project: shop, subject: \"service:a\" }\n",
      "keys.yaml");
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  ASSERT_EQ(keys->size(), 1u);
  const core::Caller& c = keys->at(kHashA);
  EXPECT_EQ(c.tenant, "acme");
  EXPECT_EQ(c.project, "shop");
  EXPECT_EQ(c.subject, "service:a");
}

TEST(ApiKeysTest, ReadsANameAsALabelAndScalarsAsWritten) {
  auto keys = ParseApiKeys(
      std::string("keys:\n  - sha256: ") + kHashA +
          "\n    name: billing service\n    tenant: 42\n    project: true\n    subject: s\n",
      "keys.yaml");
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  const core::Caller& c = keys->at(kHashA);
  EXPECT_EQ(c.tenant, "42");
  EXPECT_EQ(c.project, "true");
  EXPECT_EQ(c.subject, "s");
}

TEST(ApiKeysTest, RefusesMalformedFilesNamingTheLineAndKey) {
  const std::string entry =
      std::string("{ sha256: ") + kHashA + ", tenant: acme, project: shop, subject: s }";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"keys: [", "keys.yaml:1: YAML syntax error: "},
      {"", "keys.yaml:1: expected a mapping with a list `keys`"},
      {"# none\nkeys:\n", "keys.yaml:2: keys: expected a list, got nothing"},
      {"keys:\n  - { sha256: abc, tenant: a, project: p, subject: s }",
       "keys.yaml:2: keys[0].sha256: expected 64 hex digits (the key's SHA-256)"},
      {"keys:\n  - " + entry + "\n  - [a]", "keys.yaml:3: keys[1]: expected a mapping, got a list"},
      {std::string("keys:\n  - { sha256: ") + kHashA + ", project: p, subject: s }",
       "keys.yaml:2: keys[0].tenant: missing; expected 1..256 visible ASCII characters"},
      {std::string("keys:\n  - sha256: ") + kHashA +
           "\n    tenant: a\n    project: \"a b\"\n    subject: s",
       "keys.yaml:4: keys[0].project: expected 1..256 visible ASCII characters"},
      {std::string("keys:\n  - sha256: ") + kHashA +
           "\n    tenant: a\n    project: p\n    subject: [s]",
       "keys.yaml:5: keys[0].subject: expected 1..256 visible ASCII characters, got a list"},
      {std::string("keys:\n  - sha256: ") + kHashA +
           "\n    tenant: a\n    project: p\n    subject: s\n    name: {a: b}",
       "keys.yaml:6: keys[0].name: expected a string, got a mapping"},
      {"keys:\n  - " + entry + "\n\n  - " + entry,
       "keys.yaml:4: keys[1].sha256: the same key is listed twice (first at line 2)"},
      {"keys: []\n---\nkeys: []\n", "keys.yaml:3: only one YAML document is allowed"},  // its first node
  };
  for (const auto& [text, want] : bad)
    EXPECT_EQ(ErrorOf(text).substr(0, want.size()), want) << text;
}

TEST(ApiKeysTest, RefusesUnknownKeys) {
  EXPECT_EQ(ErrorOf(std::string("keys:\n  - { sha256: ") + kHashA +
                    ", tenant: a, project: p, subject: s, role: x }"),
            "keys.yaml:2: keys[0].role: unknown key (allowed here: sha256, tenant, project, "
            "subject, name)");
  EXPECT_EQ(ErrorOf(std::string("keys:\n  - sha256: ") + kHashA +
                    "\n    tenat: a\n    project: p\n    subject: s"),
            "keys.yaml:3: keys[0].tenat: unknown key (did you mean \"tenant\"?)");
  EXPECT_EQ(ErrorOf(std::string("keys:\n  - { sha256: ") + kHashA +
                    ", tenant: a, project: p, subject: s }\n" + "other: []\n"),
            "keys.yaml:3: other: unknown key (allowed here: keys)");
}

TEST(ApiKeysTest, RefusesAKeyWrittenTwiceInOneMapping) {
  // yaml-cpp keeps one of the two; which one ran would depend on the library.
  EXPECT_EQ(ErrorOf(std::string("keys:\n  - { sha256: ") + kHashA +
                    ", tenant: first, tenant: second, project: p, subject: s }\n"),
            "keys.yaml:2: keys[0].tenant: duplicate key (first at line 2)");
  EXPECT_EQ(
      ErrorOf(std::string("keys:\n  - sha256: ") + kHashA +
              "\n    tenant: a\n    project: p\n    sha256: " + kHashB + "\n    subject: s\n"),
      "keys.yaml:5: keys[0].sha256: duplicate key (first at line 2)");
  EXPECT_EQ(ErrorOf(std::string("keys:\n  - { sha256: ") + kHashA +
                    ", tenant: a, project: p, subject: s }\n" + "keys: []\n"),
            "keys.yaml:3: keys: duplicate key (first at line 1)");
}

}  // namespace
}  // namespace idemgate::identity
