#include "identity/trusted_headers.h"

#include <gtest/gtest.h>

namespace idemgate::identity {
namespace {

const config::TrustedHeaders kNames;  // X-Tenant-Id, X-Project-Id, X-Subject

TEST(TrustedHeadersTest, ReadsTheThreeHeadersCaseInsensitively) {
  std::vector<core::HeaderView> headers = {
      {"x-tenant-id", "acme"}, {"Accept", "*/*"}, {"X-PROJECT-ID", "billing"}, {"X-Subject", "user:alice"}};
  auto caller = CallerFromTrustedHeaders(headers, kNames);
  ASSERT_TRUE(caller.ok()) << caller.status().ToString();
  EXPECT_EQ(caller->tenant, "acme");
  EXPECT_EQ(caller->project, "billing");
  EXPECT_EQ(caller->subject, "user:alice");
}

TEST(TrustedHeadersTest, ConfiguredNamesAreUsed) {
  config::TrustedHeaders names{.tenant = "X-Org", .project = "X-Proj", .subject = "X-User"};
  std::vector<core::HeaderView> headers = {{"X-Org", "o"}, {"X-Proj", "p"}, {"X-User", "u"}};
  ASSERT_TRUE(CallerFromTrustedHeaders(headers, names).ok());
  // The default names mean nothing then.
  std::vector<core::HeaderView> defaults = {{"X-Tenant-Id", "o"}, {"X-Project-Id", "p"}, {"X-Subject", "u"}};
  EXPECT_FALSE(CallerFromTrustedHeaders(defaults, names).ok());
}

TEST(TrustedHeadersTest, MissingEmptyRepeatedLongOrNonAsciiValuesAreRefused) {
  const std::vector<core::HeaderView> base = {{"X-Tenant-Id", "t"}, {"X-Project-Id", "p"}, {"X-Subject", "s"}};
  const std::string long_value(kMaxComponentLength + 1, 'a');
  const std::string max_value(kMaxComponentLength, 'a');
  struct Case {
    std::vector<core::HeaderView> headers;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"X-Project-Id", "p"}, {"X-Subject", "s"}}, "X-Tenant-Id header is missing"},
      {{{"X-Tenant-Id", ""}, {"X-Project-Id", "p"}, {"X-Subject", "s"}}, "X-Tenant-Id header is missing"},
      {{{"X-Tenant-Id", "t"}, {"X-Subject", "s"}}, "X-Project-Id header is missing"},
      {{{"X-Tenant-Id", "t"}, {"X-Project-Id", "p"}}, "X-Subject header is missing"},
      {{{"X-Tenant-Id", "t"}, {"X-Tenant-Id", "u"}, {"X-Project-Id", "p"}, {"X-Subject", "s"}},
       "X-Tenant-Id header appears more than once"},
      {{{"X-Tenant-Id", long_value}, {"X-Project-Id", "p"}, {"X-Subject", "s"}}, "longer than 256"},
      {{{"X-Tenant-Id", "t"}, {"X-Project-Id", "p q"}, {"X-Subject", "s"}}, "outside visible ASCII"},
      {{{"X-Tenant-Id", "t"}, {"X-Project-Id", "p"}, {"X-Subject", "\xc3\xa9"}}, "outside visible ASCII"},
  };
  for (const Case& c : cases) {
    auto caller = CallerFromTrustedHeaders(c.headers, kNames);
    ASSERT_FALSE(caller.ok()) << c.message;
    EXPECT_NE(caller.status().message().find(c.message), std::string::npos) << caller.status().message();
  }
  std::vector<core::HeaderView> longest = base;
  longest[0].value = max_value;
  EXPECT_TRUE(CallerFromTrustedHeaders(longest, kNames).ok());
}

}  // namespace
}  // namespace idemgate::identity
