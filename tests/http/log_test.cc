#include "common/log.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <sstream>
#include <thread>
#include <vector>

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

// Each line of `out`, parsed.
std::vector<json::value> Lines(const std::string& out) {
  std::vector<json::value> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  return lines;
}

TEST(LogLimiterTest, AllowsABurstPerIntervalAndCountsTheRest) {
  LogLimiter limiter;
  std::uint64_t suppressed = 99;
  for (std::uint32_t i = 0; i < LogLimiter::kBurst; ++i) {
    ASSERT_TRUE(limiter.Allow(5000, &suppressed)) << i;
    EXPECT_EQ(suppressed, 0u);
  }
  for (int i = 0; i < 25; ++i) EXPECT_FALSE(limiter.Allow(5000 + i, &suppressed));
  EXPECT_FALSE(limiter.Allow(5000 + LogLimiter::kIntervalMs - 1, &suppressed));
  // A new interval: the first line allowed carries what was refused.
  ASSERT_TRUE(limiter.Allow(5000 + LogLimiter::kIntervalMs, &suppressed));
  EXPECT_EQ(suppressed, 26u);
  ASSERT_TRUE(limiter.Allow(5000 + LogLimiter::kIntervalMs, &suppressed));
  EXPECT_EQ(suppressed, 0u);
}

TEST(LogLimiterTest, ConcurrentCallersShareOneBudgetAndLoseNoCount) {
  LogLimiter limiter;
  constexpr int kThreads = 8;
  constexpr int kCalls = 2000;
  std::atomic<int> allowed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      std::uint64_t suppressed = 0;
      for (int i = 0; i < kCalls; ++i) {
        if (limiter.Allow(100, &suppressed)) allowed.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(allowed.load(), static_cast<int>(LogLimiter::kBurst));
  std::uint64_t suppressed = 0;
  ASSERT_TRUE(limiter.Allow(100 + LogLimiter::kIntervalMs, &suppressed));
  EXPECT_EQ(suppressed, static_cast<std::uint64_t>(kThreads * kCalls) - LogLimiter::kBurst);
}

TEST_F(LogTest, LimitedSiteWritesABurstThenOneLineSayingHowManyWereSuppressed) {
  LogLimiter limiter;
  SetLogLevel(LogLevel::kWarn);
  for (int i = 0; i < 1000; ++i) {
    LogAt(limiter, 7000, LogLevel::kError, "store failed", {{"route", "payments"}, {"n", i}});
  }
  LogAt(limiter, 7000 + LogLimiter::kIntervalMs, LogLevel::kError, "store failed", {{"route", "payments"}});
  const std::vector<json::value> lines = Lines(Drain());
  ASSERT_EQ(lines.size(), LogLimiter::kBurst + 1);
  for (std::uint32_t i = 0; i < LogLimiter::kBurst; ++i) {
    EXPECT_EQ(lines[i].at("n").as_int64(), i);
    EXPECT_FALSE(lines[i].as_object().contains("suppressed"));
  }
  const json::object& last = lines.back().as_object();
  EXPECT_EQ(last.at("msg").as_string(), "store failed");
  EXPECT_EQ(last.at("level").as_string(), "error");
  EXPECT_EQ(last.at("route").as_string(), "payments");
  EXPECT_EQ(last.at("suppressed").as_int64(), 1000 - static_cast<std::int64_t>(LogLimiter::kBurst));
}

TEST_F(LogTest, LimitedSitesAreIndependentAndDisabledLevelsSpendNoBudget) {
  LogLimiter a;
  LogLimiter b;
  SetLogLevel(LogLevel::kWarn);
  for (int i = 0; i < 50; ++i) LogAt(a, 0, LogLevel::kInfo, "filtered");
  for (int i = 0; i < 50; ++i) LogAt(a, 0, LogLevel::kWarn, "a");
  for (int i = 0; i < 50; ++i) LogAt(b, 0, LogLevel::kWarn, "b");
  LogWarn(b, "b");  // the real clock is far past 0: a new interval
  const std::vector<json::value> lines = Lines(Drain());
  ASSERT_EQ(lines.size(), 2 * LogLimiter::kBurst + 1);
  EXPECT_EQ(std::count_if(lines.begin(), lines.end(), [](const json::value& v) { return v.at("msg") == "a"; }),
            static_cast<long>(LogLimiter::kBurst));
  EXPECT_EQ(lines.back().at("suppressed").as_int64(), 50 - static_cast<std::int64_t>(LogLimiter::kBurst));
}

TEST(LogLevelTest, ParseNames) {
  EXPECT_EQ(ParseLogLevel("debug"), LogLevel::kDebug);
  EXPECT_EQ(ParseLogLevel("error"), LogLevel::kError);
  EXPECT_EQ(ParseLogLevel("verbose"), std::nullopt);
  EXPECT_EQ(LogLevelName(LogLevel::kWarn), "warn");
}

}  // namespace
}  // namespace idemgate
