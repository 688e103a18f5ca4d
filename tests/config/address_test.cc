#include "config/address.h"

#include <gtest/gtest.h>

#include "common/text.h"

namespace idemgate::config {
namespace {

TEST(ParseHostPortTest, AcceptsNamesIpv4AndBracketedIpv6) {
  StatusOr<HostPort> a = ParseHostPort("127.0.0.1:8080");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 8080);

  StatusOr<HostPort> b = ParseHostPort("redis-1.internal:6379");
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->host, "redis-1.internal");
  EXPECT_EQ(b->port, 6379);

  StatusOr<HostPort> c = ParseHostPort("[::1]:9090");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->host, "::1");
  EXPECT_EQ(c->port, 9090);

  StatusOr<HostPort> zero = ParseHostPort("localhost:0");
  ASSERT_TRUE(zero.ok()) << zero.status().message();
  EXPECT_EQ(zero->port, 0);
}

TEST(ParseHostPortTest, RejectsMalformedAddresses) {
  for (const char* bad :
       {"8080", "localhost", ":8080", "host:", "host:65536", "host:80x", "host:-1", "[::1", "[]:80",
        "[zz]:80", "ho st:80", "http://h:80", "::1:80", ""}) {
    StatusOr<HostPort> hp = ParseHostPort(bad);
    EXPECT_FALSE(hp.ok()) << "accepted \"" << bad << "\"";
    if (!hp.ok()) {
      EXPECT_EQ(hp.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(hp.status().message().find("host:port"), std::string::npos)
          << hp.status().message();
    }
  }
}

TEST(ParseUpstreamUrlTest, SplitsSchemeHostPortAndBasePath) {
  Upstream u;
  ASSERT_TRUE(ParseUpstreamUrl("http://127.0.0.1:9001", &u).ok());
  EXPECT_EQ(u.scheme, "http");
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, 9001);
  EXPECT_EQ(u.base_path, "");

  ASSERT_TRUE(ParseUpstreamUrl("http://backend.internal/api/v1/", &u).ok());
  EXPECT_EQ(u.host, "backend.internal");
  EXPECT_EQ(u.port, 80);
  EXPECT_EQ(u.base_path, "/api/v1");

  ASSERT_TRUE(ParseUpstreamUrl("HTTP://[::1]:8081/", &u).ok());
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, 8081);
  EXPECT_EQ(u.base_path, "");
}

// Credentials in a refused URL are not repeated in the error.
TEST(ParseUpstreamUrlTest, ErrorsDoNotRepeatCredentials) {
  Upstream u;
  const Status s = ParseUpstreamUrl("http://admin:UPSTREAMPASS@10.0.0.1:8080/", &u);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().find("UPSTREAMPASS"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("\"http://***@10.0.0.1:8080/\": user info is not allowed"), std::string::npos)
      << s.message();
}

TEST(ParseUpstreamUrlTest, HttpsDefaultsToPort443) {
  Upstream u;
  ASSERT_TRUE(ParseUpstreamUrl("https://payments.internal/v2", &u).ok());
  EXPECT_EQ(u.scheme, "https");
  EXPECT_EQ(u.host, "payments.internal");
  EXPECT_EQ(u.port, 443);
  EXPECT_EQ(u.base_path, "/v2");

  ASSERT_TRUE(ParseUpstreamUrl("HTTPS://127.0.0.1:8443", &u).ok());
  EXPECT_EQ(u.scheme, "https");
  EXPECT_EQ(u.port, 8443);
  EXPECT_EQ(u.base_path, "");
}

TEST(ParseUpstreamUrlTest, RejectsAnythingButHttpAndHttps) {
  for (const char* bad :
       {"https://", "https://h:0", "https://user@h", "httpx://h", "ftp://h", "127.0.0.1:9001", "http://", "http://:80",
        "http://h:", "http://h:0", "http://h:99999", "http://user@h:80", "http://h:80/x?y=1",
        "http://h/#f", "http://h:80//x", "http://h x:80", "http://h:80a"}) {
    Upstream u;
    u.host = "untouched";
    Status s = ParseUpstreamUrl(bad, &u);
    EXPECT_FALSE(s.ok()) << "accepted \"" << bad << "\"";
    EXPECT_EQ(u.host, "untouched") << bad;
    EXPECT_NE(s.message().find(RedactUrl(bad)), std::string::npos) << s.message();
  }
  Upstream u;
  Status ftp = ParseUpstreamUrl("ftp://h", &u);
  EXPECT_NE(ftp.message().find("scheme must be http or https"), std::string::npos) << ftp.message();
}

}  // namespace
}  // namespace idemgate::config
