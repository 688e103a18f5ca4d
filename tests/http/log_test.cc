#include "common/log.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>

#include <boost/json.hpp>

namespace idemgate {
namespace {

namespace json = boost::json;

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::pipe(fds_), 0);
    SetLogFd(fds_[1]);
    SetLogFormat(LogFormat::kJson);
    SetLogLevel(LogLevel::kInfo);
  }
  void TearDown() override {
    SetLogFd(1);
    SetLogFormat(LogFormat::kJson);
    SetLogLevel(LogLevel::kInfo);
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  // Everything written so far (the pipe is small-message safe).
  std::string Drain() {
    ::close(fds_[1]);
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fds_[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<std::size_t>(n));
    fds_[1] = ::open("/dev/null", O_WRONLY);
    return out;
  }
  int fds_[2] = {-1, -1};
};

TEST_F(LogTest, RequestLineHasEverySpecFieldWithNullsForUnknowns) {
  RequestLogLine line;
  line.route = "payments";
  line.method = "POST";
  line.path = "/api/v1/payments";
  line.status = 201;
  line.duration_ms = 1.25;
  line.upstream_status = 201;
  line.upstream_ms = 0.5;
  line.request_id = "rid";
  line.cache_hit = false;
  std::string out;
  FormatRequestLog(line, out);
  boost::system::error_code ec;
  json::value v = json::parse(out, ec);
  ASSERT_FALSE(ec) << out;
  const json::object& o = v.as_object();
  for (const char* key : {"route", "method", "path", "status", "duration_ms", "tenant", "project", "subject",
                          "idempotency_case", "idempotency_policy", "idempotency_source",
                          "idempotency_key_namespaced", "operation_id", "cache_hit", "outcome", "upstream_status",
                          "upstream_ms", "request_id", "ts", "level", "msg"}) {
    EXPECT_TRUE(o.contains(key)) << key;
  }
  EXPECT_EQ(o.at("route").as_string(), "payments");
  EXPECT_EQ(o.at("status").as_int64(), 201);
  EXPECT_DOUBLE_EQ(o.at("duration_ms").to_number<double>(), 1.25);
  EXPECT_TRUE(o.at("tenant").is_null());
  EXPECT_TRUE(o.at("outcome").is_null());
  EXPECT_EQ(o.at("cache_hit").as_bool(), false);
  EXPECT_EQ(o.at("msg").as_string(), "request");
  EXPECT_EQ(out.find('\n'), std::string::npos);
}

TEST_F(LogTest, StatusIsNullWhenNoAnswerReachedTheClient) {
  std::string out;
  FormatRequestLog(RequestLogLine{.method = "POST", .path = "/"}, out);
  json::value v = json::parse(out);
  EXPECT_TRUE(v.at("status").is_null()) << out;
}

TEST_F(LogTest, StringsAreEscapedAndInvalidUtf8Replaced) {
  RequestLogLine line;
  line.method = "GET";
  line.path = std::string_view("/a\"b\\c\n\x01\xff\xc3\xa9", 11);
  std::string out;
  FormatRequestLog(line, out);
  boost::system::error_code ec;
  json::value v = json::parse(out, ec);
  ASSERT_FALSE(ec) << out;
  EXPECT_EQ(v.at("path").as_string(), "/a\"b\\c\n\x01\xef\xbf\xbd\xc3\xa9");
}

TEST_F(LogTest, LevelsFilterAndEachEventIsOneLine) {
  LogInfo("hello", {{"n", 3}, {"s", "x y"}, {"b", true}, {"none", nullptr}});
  LogDebug("hidden");
  SetLogLevel(LogLevel::kWarn);
  LogInfo("hidden too");
  LogError("bad", {{"error", "boom"}});
  WriteRequestLog(RequestLogLine{.method = "GET", .path = "/"});  // info: filtered
  const std::string out = Drain();
  const auto nl = out.find('\n');
  ASSERT_NE(nl, std::string::npos) << out;
  json::value first = json::parse(out.substr(0, nl));
  EXPECT_EQ(first.at("msg").as_string(), "hello");
  EXPECT_EQ(first.at("level").as_string(), "info");
  EXPECT_EQ(first.at("n").as_int64(), 3);
  EXPECT_EQ(first.at("s").as_string(), "x y");
  EXPECT_TRUE(first.at("none").is_null());
  const std::string rest = out.substr(nl + 1);
  ASSERT_EQ(std::count(rest.begin(), rest.end(), '\n'), 1) << rest;
  json::value second = json::parse(rest);
  EXPECT_EQ(second.at("level").as_string(), "error");
  EXPECT_EQ(second.at("error").as_string(), "boom");
}

TEST_F(LogTest, TextFormatIsKeyValue) {
  SetLogFormat(LogFormat::kText);
  LogWarn("slow thing", {{"ms", 12}, {"who", "a b"}});
  const std::string out = Drain();
  EXPECT_NE(out.find(" level=warn msg=\"slow thing\" ms=12 who=\"a b\"\n"), std::string::npos) << out;
  EXPECT_TRUE(out.starts_with("ts=")) << out;
}

TEST(LogLevelTest, ParseNames) {
  EXPECT_EQ(ParseLogLevel("debug"), LogLevel::kDebug);
  EXPECT_EQ(ParseLogLevel("error"), LogLevel::kError);
  EXPECT_EQ(ParseLogLevel("verbose"), std::nullopt);
  EXPECT_EQ(LogLevelName(LogLevel::kWarn), "warn");
}

}  // namespace
}  // namespace idemgate
