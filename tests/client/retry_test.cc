#include "client/client.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace idemgate::client {
namespace {

using std::chrono::seconds;
using std::chrono::system_clock;

constexpr std::uint64_t kMaxRandom = std::numeric_limits<std::uint64_t>::max();

// ---------------------------------------------------------------------------
// Classify

struct ClassifyCase {
  int status;
  const char* code;
  Verdict verdict;
};

std::string VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kSuccess: return "success";
    case Verdict::kRetry: return "retry";
    case Verdict::kFail: return "fail";
  }
  return "?";
}

TEST(ClassifyTest, Table) {
  const ClassifyCase cases[] = {
      // No response: transport error or timeout.
      {0, "", Verdict::kRetry},
      // 1xx..3xx.
      {100, "", Verdict::kSuccess},
      {200, "", Verdict::kSuccess},
      {201, "", Verdict::kSuccess},
      {204, "", Verdict::kSuccess},
      {302, "", Verdict::kSuccess},
      {304, "", Verdict::kSuccess},
      {399, "", Verdict::kSuccess},
      // The retryable statuses.
      {408, "", Verdict::kRetry},
      {425, "", Verdict::kRetry},
      {429, "", Verdict::kRetry},
      {429, "too-many-requests", Verdict::kRetry},
      {500, "", Verdict::kRetry},
      {500, "internal-error", Verdict::kRetry},
      {502, "", Verdict::kRetry},
      {502, "upstream-unavailable", Verdict::kRetry},
      {503, "", Verdict::kRetry},
      {503, "store-unavailable", Verdict::kRetry},
      {504, "", Verdict::kRetry},
      {504, "upstream-timeout", Verdict::kRetry},
      // 409 only as request-in-flight: without a code it is the upstream's own conflict.
      {409, "request-in-flight", Verdict::kRetry},
      {409, "", Verdict::kFail},
      {409, "key-reused", Verdict::kFail},
      {409, "conflict", Verdict::kFail},
      // Other 4xx, key-reused and other 5xx.
      {400, "", Verdict::kFail},
      {400, "missing-key", Verdict::kFail},
      {401, "", Verdict::kFail},
      {403, "", Verdict::kFail},
      {404, "", Verdict::kFail},
      {404, "not-found", Verdict::kFail},
      {413, "request-too-large", Verdict::kFail},
      {422, "key-reused", Verdict::kFail},
      {422, "", Verdict::kFail},
      {431, "", Verdict::kFail},
      {501, "", Verdict::kFail},
      {505, "", Verdict::kFail},
      {599, "", Verdict::kFail},
      // Not HTTP statuses.
      {-1, "", Verdict::kFail},
      {42, "", Verdict::kFail},
      {600, "", Verdict::kFail},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(VerdictName(Classify(c.status, c.code)), VerdictName(c.verdict))
        << "status " << c.status << " code \"" << c.code << "\"";
  }
}

// ---------------------------------------------------------------------------
// BackoffDelay

TEST(BackoffDelayTest, RangeEndsForTheExtremeRandomValues) {
  const RetryPolicy policy;  // 250 ms base, 5 s cap
  EXPECT_EQ(BackoffDelay(policy, 2, 0), Millis(0));
  EXPECT_EQ(BackoffDelay(policy, 2, kMaxRandom), Millis(250));
  EXPECT_EQ(BackoffDelay(policy, 2, kMaxRandom - 1), Millis(250));
  EXPECT_EQ(BackoffDelay(policy, 2, std::uint64_t{1} << 63), Millis(125));
  EXPECT_EQ(BackoffDelay(policy, 3, 0), Millis(0));
  EXPECT_EQ(BackoffDelay(policy, 3, kMaxRandom), Millis(500));
}

TEST(BackoffDelayTest, CapDoublesUntilMaxDelay) {
  const RetryPolicy policy;
  EXPECT_EQ(BackoffDelay(policy, 2, kMaxRandom), Millis(250));
  EXPECT_EQ(BackoffDelay(policy, 3, kMaxRandom), Millis(500));
  EXPECT_EQ(BackoffDelay(policy, 4, kMaxRandom), Millis(1000));
  EXPECT_EQ(BackoffDelay(policy, 5, kMaxRandom), Millis(2000));
  EXPECT_EQ(BackoffDelay(policy, 6, kMaxRandom), Millis(4000));
  EXPECT_EQ(BackoffDelay(policy, 7, kMaxRandom), Millis(5000));  // 8000 capped
  EXPECT_EQ(BackoffDelay(policy, 8, kMaxRandom), Millis(5000));
  EXPECT_EQ(BackoffDelay(policy, 64, kMaxRandom), Millis(5000));
  EXPECT_EQ(BackoffDelay(policy, 1000, kMaxRandom), Millis(5000));
  EXPECT_EQ(BackoffDelay(policy, std::numeric_limits<int>::max(), kMaxRandom), Millis(5000));
}

TEST(BackoffDelayTest, StaysWithinBoundsForAnyRandomValue) {
  const RetryPolicy policy{.max_attempts = 10, .base_delay = Millis(100), .max_delay = Millis(3000)};
  std::mt19937_64 rng(7);
  for (int attempt = 2; attempt <= 10; ++attempt) {
    const std::int64_t cap = std::min<std::int64_t>(3000, 100LL << (attempt - 2));
    Millis lowest = Millis::max();
    Millis highest = Millis::min();
    for (int i = 0; i < 2000; ++i) {
      const Millis d = BackoffDelay(policy, attempt, rng());
      ASSERT_GE(d.count(), 0);
      ASSERT_LE(d.count(), cap) << "attempt " << attempt;
      lowest = std::min(lowest, d);
      highest = std::max(highest, d);
    }
    // Full jitter: the draws spread over the whole range.
    EXPECT_LT(lowest.count(), cap / 10 + 1) << "attempt " << attempt;
    EXPECT_GT(highest.count(), cap - cap / 10 - 1) << "attempt " << attempt;
  }
}

TEST(BackoffDelayTest, DegeneratePolicies) {
  EXPECT_EQ(BackoffDelay(RetryPolicy{}, 1, kMaxRandom), Millis(0));  // no wait before the first attempt
  EXPECT_EQ(BackoffDelay(RetryPolicy{}, 0, kMaxRandom), Millis(0));
  EXPECT_EQ(BackoffDelay(RetryPolicy{.base_delay = Millis(0)}, 5, kMaxRandom), Millis(0));
  EXPECT_EQ(BackoffDelay(RetryPolicy{.base_delay = Millis(500), .max_delay = Millis(0)}, 3, kMaxRandom), Millis(0));
  EXPECT_EQ(BackoffDelay(RetryPolicy{.base_delay = Millis(-5)}, 3, kMaxRandom), Millis(0));
  // A base above the cap is capped from the first retry.
  EXPECT_EQ(BackoffDelay(RetryPolicy{.base_delay = Millis(9000), .max_delay = Millis(100)}, 2, kMaxRandom),
            Millis(100));
  // Large values do not overflow.
  const RetryPolicy huge{.base_delay = Millis(1LL << 40), .max_delay = Millis::max()};
  EXPECT_EQ(BackoffDelay(huge, 2, kMaxRandom), Millis(1LL << 40));
  EXPECT_EQ(BackoffDelay(huge, 40, kMaxRandom), Millis::max());
}

// ---------------------------------------------------------------------------
// ValidatePolicy

TEST(ValidatePolicyTest, TheDefaultsAndTheBoundsThemselvesPass) {
  EXPECT_TRUE(ValidatePolicy(RetryPolicy{}).ok());
  EXPECT_TRUE(ValidatePolicy(RetryPolicy{.max_attempts = 1, .base_delay = Millis(0), .max_delay = Millis(0),
                                         .timeout = Millis(1)})
                  .ok());
  EXPECT_TRUE(ValidatePolicy(RetryPolicy{.max_attempts = kMaxAttempts, .base_delay = kMaxPolicyDuration,
                                         .max_delay = kMaxPolicyDuration, .timeout = kMaxPolicyDuration})
                  .ok());
  EXPECT_EQ(kMaxAttempts, 100);
  EXPECT_EQ(kMaxPolicyDuration, std::chrono::days(365));
}

TEST(ValidatePolicyTest, EachFieldOutOfBoundsIsNamed) {
  const Millis over = kMaxPolicyDuration + Millis(1);
  const std::vector<std::pair<RetryPolicy, std::string>> cases = {
      {{.max_attempts = 0}, "retry policy: max_attempts 0 is out of range (1 to 100)"},
      {{.max_attempts = -3}, "retry policy: max_attempts -3 is out of range (1 to 100)"},
      {{.max_attempts = 101}, "retry policy: max_attempts 101 is out of range (1 to 100)"},
      {{.max_attempts = std::numeric_limits<int>::max()},
       "retry policy: max_attempts 2147483647 is out of range (1 to 100)"},
      {{.base_delay = Millis(-1)}, "retry policy: base_delay -1 ms is out of range (0 ms to 365 days)"},
      {{.base_delay = over}, "retry policy: base_delay 31536000001 ms is out of range (0 ms to 365 days)"},
      {{.max_delay = Millis::min()},
       "retry policy: max_delay -9223372036854775808 ms is out of range (0 ms to 365 days)"},
      {{.max_delay = Millis::max()},
       "retry policy: max_delay 9223372036854775807 ms is out of range (0 ms to 365 days)"},
      {{.timeout = Millis(0)}, "retry policy: timeout 0 ms is out of range (1 ms to 365 days)"},
      {{.timeout = Millis(-250)}, "retry policy: timeout -250 ms is out of range (1 ms to 365 days)"},
      {{.timeout = Millis::max()}, "retry policy: timeout 9223372036854775807 ms is out of range (1 ms to 365 days)"},
  };
  for (const auto& [policy, message] : cases) {
    const Status s = ValidatePolicy(policy);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << message;
    EXPECT_EQ(s.message(), message);
  }
}

// ---------------------------------------------------------------------------
// ParseRetryAfter

const system_clock::time_point kNow = system_clock::time_point(seconds(784111777));  // Sun, 06 Nov 1994 08:49:37 GMT

TEST(ParseRetryAfterTest, DelaySeconds) {
  EXPECT_EQ(ParseRetryAfter("5", kNow), Millis(5000));
  EXPECT_EQ(ParseRetryAfter("0", kNow), Millis(0));
  EXPECT_EQ(ParseRetryAfter("120", kNow), Millis(120000));
  EXPECT_EQ(ParseRetryAfter(" 2 ", kNow), Millis(2000));
  EXPECT_EQ(ParseRetryAfter("007", kNow), Millis(7000));
  const auto huge = ParseRetryAfter("99999999999999999999999", kNow);
  ASSERT_TRUE(huge.has_value());
  EXPECT_GT(*huge, Millis(1'000'000'000));
}

TEST(ParseRetryAfterTest, RejectsWhatIsNeitherForm) {
  for (const char* bad : {"-1", "abc", "", "  ", "1.5", "+3", "5s", "0x10", "1 2",
                          "Sun, 06 Nov 1994 08:49:37 UTC", "Sun, 6 Nov 1994 08:49:37 GMT",
                          "Sun, 06 Nov 1994 24:00:00 GMT",
                          // The obsolete forms, malformed.
                          "Sun, 06-Nov-94 08:49:37 GMT", "Sunday, 06-Nov-1994 08:49:37 GMT",
                          "Sunday, 6-Nov-94 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 UTC",
                          "Sundae, 06-Nov-94 08:49:37 GMT", "Sunday, 31-Feb-94 08:49:37 GMT",
                          "Sunday, 06-Nov-94 08:61:37 GMT", "Sun Nov 6 08:49:37 1994", "Sun Nov 06 08:49:37 94",
                          "Sunday Nov  6 08:49:37 1994", "Sun Nov  6 08:49:37 1994 GMT", "Sun Foo  6 08:49:37 1994",
                          "Sun Nov  0 08:49:37 1994", "Sun Nov  6 8:49:37 1994",
                          "Sun, 31 Feb 1994 08:49:37 GMT", "Sun, 06 Foo 1994 08:49:37 GMT",
                          "Xyz, 06 Nov 1994 08:49:37 GMT", "Sun, 06 Nov 1994 08:49:37 GMT extra"}) {
    EXPECT_FALSE(ParseRetryAfter(bad, kNow).has_value()) << "\"" << bad << "\"";
  }
}

TEST(ParseRetryAfterTest, FutureDate) {
  EXPECT_EQ(ParseRetryAfter("Sun, 06 Nov 1994 08:49:47 GMT", kNow), Millis(10000));
  EXPECT_EQ(ParseRetryAfter("Mon, 07 Nov 1994 08:49:37 GMT", kNow), Millis(86'400'000));
  // From a time between two seconds, the wait is rounded up to the next millisecond.
  EXPECT_EQ(ParseRetryAfter("Sun, 06 Nov 1994 08:49:38 GMT", kNow + std::chrono::microseconds(250'500)),
            Millis(750));
  // A date past 2262 (the end of a nanosecond clock) still gives a long wait.
  const auto far = ParseRetryAfter("Fri, 31 Dec 9999 23:59:59 GMT", kNow);
  ASSERT_TRUE(far.has_value());
  EXPECT_GT(*far, Millis(std::chrono::hours(24 * 365) * 8000));
}

// RFC 9110 §5.6.7: recipients accept the obsolete RFC 850 and asctime forms too.
TEST(ParseRetryAfterTest, ObsoleteDateForms) {
  EXPECT_EQ(ParseRetryAfter("Sunday, 06-Nov-94 08:49:47 GMT", kNow), Millis(10000));
  EXPECT_EQ(ParseRetryAfter("Monday, 07-Nov-94 08:49:37 GMT", kNow), Millis(86'400'000));
  EXPECT_EQ(ParseRetryAfter("Sun Nov  6 08:49:47 1994", kNow), Millis(10000));
  EXPECT_EQ(ParseRetryAfter("Mon Nov  7 08:49:37 1994", kNow), Millis(86'400'000));
  EXPECT_EQ(ParseRetryAfter("Wed Nov 16 08:49:37 1994", kNow), Millis(10 * 86'400'000LL));
  EXPECT_EQ(ParseRetryAfter("  Sun Nov  6 08:49:47 1994 ", kNow), Millis(10000));
  EXPECT_EQ(ParseRetryAfter("Sunday, 06-Nov-94 08:49:37 GMT", kNow), Millis(0));
  EXPECT_EQ(ParseRetryAfter("Sun Nov  6 08:49:36 1994", kNow), Millis(0));
  // A two-digit year more than 50 years ahead is the century before: in 1994,
  // "44" is 2044 (a long wait) and "45" is 1945 (past).
  const auto soon = ParseRetryAfter("Thursday, 01-Jan-44 00:00:00 GMT", kNow);
  ASSERT_TRUE(soon.has_value());
  EXPECT_GT(*soon, Millis(std::chrono::hours(24 * 365) * 49));
  EXPECT_EQ(ParseRetryAfter("Monday, 01-Jan-45 00:00:00 GMT", kNow), Millis(0));
  // The window is 50 years to the day and second, not to the year: on
  // 25 Nov 2026, "25-Nov-76" at midnight is 2076 (50 years ahead: a long wait)
  // and "26-Nov-76" is 1976 (past); a second past midnight is past too.
  const system_clock::time_point late_2026 = std::chrono::sys_days{std::chrono::year{2026} / 11 / 25};
  const auto fifty = ParseRetryAfter("Wednesday, 25-Nov-76 00:00:00 GMT", late_2026);
  ASSERT_TRUE(fifty.has_value());
  EXPECT_GT(*fifty, Millis(std::chrono::hours(24 * 365) * 49));
  EXPECT_EQ(ParseRetryAfter("Thursday, 26-Nov-76 00:00:00 GMT", late_2026), Millis(0));
  EXPECT_EQ(ParseRetryAfter("Wednesday, 25-Nov-76 00:00:01 GMT", late_2026), Millis(0));
  // And 50 years back: on 1 Jun 2080, "01-Jul-30" is 2030 (past: 2130 would be more than 50 years
  // ahead), and "01-Jun-30" at midnight is 2130 (exactly 50 years ahead).
  const system_clock::time_point mid_2080 = std::chrono::sys_days{std::chrono::year{2080} / 6 / 1};
  EXPECT_EQ(ParseRetryAfter("Monday, 01-Jul-30 00:00:00 GMT", mid_2080), Millis(0));
  const auto back = ParseRetryAfter("Saturday, 01-Jun-30 00:00:00 GMT", mid_2080);
  ASSERT_TRUE(back.has_value());
  EXPECT_GT(*back, Millis(std::chrono::hours(24 * 365) * 49));
  // Against the real clock: "94" is 1994, past.
  EXPECT_EQ(ParseRetryAfter("Sunday, 06-Nov-94 08:49:37 GMT", system_clock::now()), Millis(0));
}

TEST(ParseRetryAfterTest, PastOrPresentDateIsZero) {
  EXPECT_EQ(ParseRetryAfter("Sun, 06 Nov 1994 08:49:37 GMT", kNow), Millis(0));
  EXPECT_EQ(ParseRetryAfter("Sat, 05 Nov 1994 08:49:37 GMT", kNow), Millis(0));
  EXPECT_EQ(ParseRetryAfter("Thu, 01 Jan 1970 00:00:00 GMT", kNow), Millis(0));
}

TEST(ParseRetryAfterTest, DateAgainstTheRealClock) {
  const auto now = system_clock::now();
  EXPECT_EQ(ParseRetryAfter("Sun, 06 Nov 1994 08:49:37 GMT", now), Millis(0));
  const auto wait = ParseRetryAfter("Wed, 01 Jan 2200 00:00:00 GMT", now);
  ASSERT_TRUE(wait.has_value());
  EXPECT_GT(*wait, Millis(std::chrono::hours(24 * 365) * 150));
}

}  // namespace
}  // namespace idemgate::client
