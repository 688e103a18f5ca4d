#include "http/headers.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace idemgate::http {
namespace {

TEST(HeadersTest, NameEqualsIgnoresAsciiCase) {
  EXPECT_TRUE(NameEquals("Content-Type", "content-type"));
  EXPECT_TRUE(NameEquals("X-A", "x-a"));
  EXPECT_FALSE(NameEquals("X-A", "X-B"));
  EXPECT_FALSE(NameEquals("X-A", "X-A "));
}

TEST(HeadersTest, HopByHopList) {
  for (const char* name : {"Connection", "keep-alive", "Proxy-Connection", "TE", "Trailer", "Transfer-Encoding",
                           "UPGRADE", "Proxy-Authorization", "Proxy-Authenticate"}) {
    EXPECT_TRUE(IsHopByHop(name)) << name;
  }
  for (const char* name : {"Content-Length", "Content-Type", "Authorization", "Set-Cookie", "Te-Extra", "Host",
                           "X-Forwarded-For", "Trailers"}) {
    EXPECT_FALSE(IsHopByHop(name)) << name;
  }
}

TEST(HeadersTest, ClientForwardingFields) {
  for (const char* name : {"X-Forwarded-For", "x-forwarded-host", "X-FORWARDED-PROTO", "Forwarded", "X-Real-IP",
                           "X_Forwarded_For", "x_forwarded_host", "X-Forwarded_Proto", "X_REAL_IP", "x-real_ip",
                           "X-Forwarded-Port", "X_Forwarded_Port", "X-Forwarded-Prefix", "X-Forwarded-Ssl",
                           "x-forwarded-scheme"}) {
    EXPECT_TRUE(IsClientForwardingField(name)) << name;
  }
  for (const char* name : {"Forwarded_", "X-Forwarded-Ports", "X-Forwarded-Prefixes", "X-Forwarded-Hosts", "X-Real-IPs",
                           "X.Real.IP", "X_Custom_Field", "Host", ""}) {
    EXPECT_FALSE(IsClientForwardingField(name)) << name;
  }
}

TEST(HeadersTest, FilterDropsFieldsNamedByConnection) {
  HopByHopFilter filter;
  filter.AddConnectionValue("keep-alive, X-Hop-One ,,x-hop-two");
  filter.AddConnectionValue("close");
  EXPECT_TRUE(filter.ShouldDrop("X-Hop-One"));
  EXPECT_TRUE(filter.ShouldDrop("X-HOP-TWO"));
  EXPECT_TRUE(filter.ShouldDrop("Keep-Alive"));
  EXPECT_TRUE(filter.ShouldDrop("Transfer-Encoding"));
  EXPECT_FALSE(filter.ShouldDrop("X-Hop"));
  EXPECT_FALSE(filter.ShouldDrop("Content-Length"));
  EXPECT_EQ(filter.tokens(), (std::vector<std::string_view>{"keep-alive", "X-Hop-One", "x-hop-two", "close"}));
}

TEST(HeadersTest, FilterHandlesMoreTokensThanItsInlineRoom) {
  HopByHopFilter filter;
  std::vector<std::string> names;
  for (int i = 0; i < 20; ++i) names.push_back("X-N" + std::to_string(i));
  std::string value;
  for (const auto& n : names) value += n + ",";
  filter.AddConnectionValue(value);
  for (const auto& n : names) EXPECT_TRUE(filter.ShouldDrop(n)) << n;
  EXPECT_FALSE(filter.ShouldDrop("X-N20"));
  EXPECT_EQ(filter.tokens().size(), 20u);
}

TEST(HeadersTest, SplitListTrimsAndSkipsEmpties) {
  EXPECT_EQ(SplitList(" a, ,b\t,c "), (std::vector<std::string_view>{"a", "b", "c"}));
  EXPECT_TRUE(SplitList("").empty());
  EXPECT_TRUE(SplitList(" , ").empty());
}

TEST(HeadersTest, ForwardedForAppendsTheClient) {
  EXPECT_EQ(AppendForwardedFor({}, "10.0.0.1"), "10.0.0.1");
  EXPECT_EQ(AppendForwardedFor({"203.0.113.1"}, "10.0.0.1"), "203.0.113.1, 10.0.0.1");
  EXPECT_EQ(AppendForwardedFor({"a, b", " c "}, "::1"), "a, b, c, ::1");
  EXPECT_EQ(AppendForwardedFor({""}, "10.0.0.1"), "10.0.0.1");
}

TEST(HeadersTest, RequestIdAcceptance) {
  EXPECT_TRUE(IsAcceptableRequestId("abc-123_XYZ"));
  EXPECT_FALSE(IsAcceptableRequestId(""));
  EXPECT_FALSE(IsAcceptableRequestId("has space"));
  EXPECT_FALSE(IsAcceptableRequestId("line\nbreak"));
  EXPECT_FALSE(IsAcceptableRequestId(std::string(201, 'a')));
  EXPECT_TRUE(IsAcceptableRequestId(std::string(200, 'a')));
  const std::string id = NewRequestId();
  EXPECT_EQ(id.size(), 32u);
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(NewRequestId(), id);
}

// Whole words become 16 digits through a byte table, the rest digit by
// digit: every length keeps what was there, appends n lowercase hex digits,
// and over many draws every digit shows up at every position.
TEST(HeadersTest, AppendRandomHexAppendsEveryLengthWithEveryDigitEverywhere) {
  for (std::size_t n = 0; n <= 40; ++n) {
    std::string out = "prefix-";
    AppendRandomHex(n, out);
    ASSERT_EQ(out.size(), 7 + n);
    EXPECT_TRUE(out.starts_with("prefix-"));
    EXPECT_EQ(out.find_first_not_of("0123456789abcdef", 7), std::string::npos) << out;
  }
  std::vector<std::set<char>> digits(40);
  for (int draw = 0; draw < 2000; ++draw) {
    std::string out;
    AppendRandomHex(40, out);
    for (std::size_t i = 0; i < out.size(); ++i) digits[i].insert(out[i]);
  }
  for (std::size_t i = 0; i < digits.size(); ++i) EXPECT_EQ(digits[i].size(), 16u) << "position " << i;
}

TEST(HeadersTest, TraceparentValidation) {
  EXPECT_TRUE(IsValidTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
  EXPECT_TRUE(IsValidTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"));
  // Future version with extra fields.
  EXPECT_TRUE(IsValidTraceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"));
  EXPECT_FALSE(IsValidTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"));
  EXPECT_FALSE(IsValidTraceparent("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
  EXPECT_FALSE(IsValidTraceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01"));
  EXPECT_FALSE(IsValidTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"));
  EXPECT_FALSE(IsValidTraceparent("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"));
  EXPECT_FALSE(IsValidTraceparent("00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01"));
  EXPECT_FALSE(IsValidTraceparent("00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
  EXPECT_FALSE(IsValidTraceparent(""));
}

TEST(HeadersTest, NewTraceparentIsValidAndRandom) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string tp = NewTraceparent();
    EXPECT_TRUE(IsValidTraceparent(tp)) << tp;
    EXPECT_EQ(tp.size(), 55u);
    EXPECT_TRUE(tp.starts_with("00-"));
    EXPECT_TRUE(tp.ends_with("-00"));
    EXPECT_EQ(TraceId(tp).size(), 32u);
    seen.insert(tp);
  }
  EXPECT_EQ(seen.size(), 100u);
}

TEST(HeadersTest, SplitTargetOriginAndAbsoluteForms) {
  auto o = SplitTarget("/a/b?x=1&y");
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->path, "/a/b");
  EXPECT_EQ(o->query, "x=1&y");
  EXPECT_EQ(o->path_and_query, "/a/b?x=1&y");
  EXPECT_TRUE(o->authority.empty());

  auto a = SplitTarget("http://example.com:8080/p?q");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->authority, "example.com:8080");
  EXPECT_EQ(a->path, "/p");
  EXPECT_EQ(a->path_and_query, "/p?q");

  auto bare = SplitTarget("http://example.com");
  ASSERT_TRUE(bare.has_value());
  EXPECT_EQ(bare->path_and_query, "/");

  // An empty path before a query: the caller forwards "/?q".
  auto query_only = SplitTarget("http://example.com?q=1");
  ASSERT_TRUE(query_only.has_value());
  EXPECT_EQ(query_only->authority, "example.com");
  EXPECT_EQ(query_only->path, "");
  EXPECT_EQ(query_only->query, "q=1");
  EXPECT_EQ(query_only->path_and_query, "?q=1");

  EXPECT_FALSE(SplitTarget("*").has_value());
  EXPECT_FALSE(SplitTarget("example.com:443").has_value());
  EXPECT_FALSE(SplitTarget("").has_value());
  EXPECT_FALSE(SplitTarget("/a#frag").has_value());
  EXPECT_FALSE(SplitTarget("ftp://h/x").has_value());
}

TEST(HeadersTest, HostValueValidation) {
  for (const char* ok : {"", "a.example", "a.example:8080", "A-b_c~d.EXAMPLE:", "127.0.0.1", "127.0.0.1:80",
                         "[::1]", "[::1]:443", "[v1.x]", "xn--bcher-kva.example", "a%2Db.example", "a!$&'()*+;=b"}) {
    EXPECT_TRUE(IsValidHostValue(ok)) << ok;
  }
  for (const char* bad : {"a.example, b.example", "a.example,b.example", "x@y z", "x@y", "a b", ":80", "a:8x",
                          "a:80:90", "[::1", "[]", "[::1]x", "a/b", "a%2", "a%zz", "a\tb", "a\"b", "\x80"}) {
    EXPECT_FALSE(IsValidHostValue(bad)) << bad;
  }
}

TEST(HeadersTest, DotSegmentsAreFound) {
  EXPECT_TRUE(HasDotSegment("/a/../b"));
  EXPECT_TRUE(HasDotSegment("/a/./b"));
  EXPECT_TRUE(HasDotSegment("/.."));
  EXPECT_TRUE(HasDotSegment("/a/%2e%2E/b"));
  EXPECT_TRUE(HasDotSegment("/a/.%2e"));
  EXPECT_TRUE(HasDotSegment("/a/%2e"));
  EXPECT_FALSE(HasDotSegment("/a/...b"));
  EXPECT_FALSE(HasDotSegment("/a/b.c"));
  EXPECT_FALSE(HasDotSegment("/.well-known/x"));
  EXPECT_FALSE(HasDotSegment("/"));
  EXPECT_FALSE(HasDotSegment("/a//b"));
  // Tomcat and Spring cut ";parameters" before resolving dot segments.
  EXPECT_TRUE(HasDotSegment("/x/..;/api/v1/payments"));
  EXPECT_TRUE(HasDotSegment("/x/..;x/y"));
  EXPECT_TRUE(HasDotSegment("/x/.;x"));
  EXPECT_TRUE(HasDotSegment("/x/%2e%2E;x/y"));
  EXPECT_TRUE(HasDotSegment("/x/.%2e;"));
  EXPECT_TRUE(HasDotSegment("/x/..%3Bx/y"));
  EXPECT_TRUE(HasDotSegment("/x/..%3b"));
  EXPECT_FALSE(HasDotSegment("/x/...;x"));
  EXPECT_FALSE(HasDotSegment("/x/;x"));
  EXPECT_FALSE(HasDotSegment("/x/a..;x"));
  EXPECT_FALSE(HasDotSegment("/x/b;..;x"));
  EXPECT_FALSE(HasDotSegment("/x/..x;y"));
}

TEST(HeadersTest, HttpDateHasImfFixdateShape) {
  const std::string_view d = CurrentHttpDate();
  ASSERT_EQ(d.size(), 29u) << d;
  EXPECT_EQ(d.substr(3, 2), ", ");
  EXPECT_TRUE(d.ends_with(" GMT"));
}

}  // namespace
}  // namespace idemgate::http
