#include "client/client.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <limits>
#include <string>

// The retry policy: which answers are worth another attempt, and how long to wait.
namespace idemgate::client {

namespace {

// Retry-After delay-seconds above this are treated as this (about 31 700 years).
constexpr std::uint64_t kMaxRetryAfterSeconds = 1'000'000'000'000ULL;

bool IsOws(char c) { return c == ' ' || c == '\t'; }

std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && IsOws(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsOws(s.back())) s.remove_suffix(1);
  return s;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// The value of `digits` (all ASCII digits, as checked by the caller).
int DigitsValue(std::string_view digits) {
  int value = 0;
  for (char c : digits) value = value * 10 + (c - '0');
  return value;
}

// True when s[pos, pos + n) are all digits.
bool DigitsAt(std::string_view s, std::size_t pos, std::size_t n) {
  if (pos + n > s.size()) return false;
  return std::all_of(s.begin() + static_cast<std::ptrdiff_t>(pos), s.begin() + static_cast<std::ptrdiff_t>(pos + n),
                     IsDigit);
}

constexpr std::array<std::string_view, 7> kDays = {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"};
constexpr std::array<std::string_view, 7> kLongDays = {"Monday", "Tuesday",  "Wednesday", "Thursday",
                                                       "Friday", "Saturday", "Sunday"};
constexpr std::array<std::string_view, 12> kMonths = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                      "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

// A month name's number (1..12), or 0.
unsigned MonthNumber(std::string_view name) {
  const auto month = std::find(kMonths.begin(), kMonths.end(), name);
  return month == kMonths.end() ? 0 : static_cast<unsigned>(month - kMonths.begin() + 1);
}

// The instant of a date and a time-of-day "hh:mm:ss" at s[at, at + 8), or
// nullopt when either is not a real one (second 60: a leap second, as RFC
// 9110 allows). The day of the week is not checked against the date.
std::optional<std::chrono::sys_seconds> Instant(int year, unsigned month, std::string_view day, std::string_view s,
                                                std::size_t at) {
  if (month == 0 || at + 8 > s.size() || s[at + 2] != ':' || s[at + 5] != ':' || !DigitsAt(s, at, 2) ||
      !DigitsAt(s, at + 3, 2) || !DigitsAt(s, at + 6, 2)) {
    return std::nullopt;
  }
  const int hour = DigitsValue(s.substr(at, 2));
  const int minute = DigitsValue(s.substr(at + 3, 2));
  const int second = DigitsValue(s.substr(at + 6, 2));
  if (hour > 23 || minute > 59 || second > 60) return std::nullopt;  // 60: a leap second
  const std::chrono::year_month_day date{std::chrono::year{year}, std::chrono::month{month},
                                         std::chrono::day{static_cast<unsigned>(DigitsValue(day))}};
  if (!date.ok()) return std::nullopt;
  return std::chrono::sys_days{date} + std::chrono::hours{hour} + std::chrono::minutes{minute} +
         std::chrono::seconds{second};
}

// An IMF-fixdate (RFC 9110 §5.6.7), e.g. "Sun, 06 Nov 1994 08:49:37 GMT".
std::optional<std::chrono::sys_seconds> ParseImfFixdate(std::string_view s) {
  // "Sun, 06 Nov 1994 08:49:37 GMT"
  //  0123456789012345678901234567 8
  if (s.size() != 29) return std::nullopt;
  if (std::find(kDays.begin(), kDays.end(), s.substr(0, 3)) == kDays.end()) return std::nullopt;
  if (s.substr(3, 2) != ", " || s[7] != ' ' || s[11] != ' ' || s[16] != ' ' || s.substr(25) != " GMT") {
    return std::nullopt;
  }
  if (!DigitsAt(s, 5, 2) || !DigitsAt(s, 12, 4)) return std::nullopt;
  return Instant(DigitsValue(s.substr(12, 4)), MonthNumber(s.substr(8, 3)), s.substr(5, 2), s, 17);
}

// The obsolete RFC 850 form, which recipients must still accept (RFC 9110
// §5.6.7): "Sunday, 06-Nov-94 08:49:37 GMT". Its two-digit year is the one
// with those digits that puts the date from 50 years before `now` (excluded)
// to 50 years after it (included), by the calendar, to the second: a date
// that appears more than 50 years ahead is in the most recent past such year.
std::optional<std::chrono::sys_seconds> ParseRfc850Date(std::string_view s, std::chrono::system_clock::time_point now) {
  const std::size_t comma = s.find(',');
  if (comma == std::string_view::npos ||
      std::find(kLongDays.begin(), kLongDays.end(), s.substr(0, comma)) == kLongDays.end()) {
    return std::nullopt;
  }
  // ", 06-Nov-94 08:49:37 GMT"
  //  012345678901234567890123
  const std::string_view rest = s.substr(comma);
  if (rest.size() != 24 || rest[1] != ' ' || rest[4] != '-' || rest[8] != '-' || rest[11] != ' ' ||
      rest.substr(20) != " GMT" || !DigitsAt(rest, 2, 2) || !DigitsAt(rest, 9, 2)) {
    return std::nullopt;
  }
  const auto today_days = std::chrono::floor<std::chrono::days>(now);
  const std::chrono::year_month_day today{today_days};
  const auto time_of_day = std::chrono::floor<std::chrono::seconds>(now) - today_days;
  // `now` moved by whole calendar years (a 29 February becomes 1 March where there is none).
  const auto years_from_now = [&](int years) {
    return std::chrono::sys_days{std::chrono::year_month_day{today.year() + std::chrono::years{years}, today.month(),
                                                             today.day()}} +
           time_of_day;
  };
  const int this_year = static_cast<int>(today.year());
  int year = this_year - this_year % 100 + DigitsValue(rest.substr(9, 2));
  const unsigned month = MonthNumber(rest.substr(5, 3));
  const std::string_view day = rest.substr(2, 2);
  // Within a year of the window first (so the comparisons below need one step at most).
  if (year > this_year + 50) {
    year -= 100;
  } else if (year < this_year - 50) {
    year += 100;
  }
  if (month != 0) {
    // The date in `year` as a day count (an invalid day, 29 February, counts as the next day here;
    // Instant refuses it below), compared with now + 50 years and now - 50 years.
    const auto at = [&](int y) -> std::optional<std::chrono::sys_seconds> {
      const auto whole = Instant(y, month, "01", rest, 12);
      if (!whole) return std::nullopt;
      return *whole + std::chrono::days{DigitsValue(day) - 1};
    };
    if (const auto instant = at(year)) {
      if (*instant > years_from_now(50)) {
        year -= 100;
      } else if (*instant <= years_from_now(-50)) {
        year += 100;  // 50 years ahead at most is still ahead
      }
    }
  }
  return Instant(year, month, day, rest, 12);
}

// The obsolete asctime() form, which recipients must still accept (RFC 9110
// §5.6.7): "Sun Nov  6 08:49:37 1994" (a day under 10 after a space).
std::optional<std::chrono::sys_seconds> ParseAsctimeDate(std::string_view s) {
  // "Sun Nov  6 08:49:37 1994"
  //  012345678901234567890123
  if (s.size() != 24) return std::nullopt;
  if (std::find(kDays.begin(), kDays.end(), s.substr(0, 3)) == kDays.end()) return std::nullopt;
  if (s[3] != ' ' || s[7] != ' ' || s[10] != ' ' || s[19] != ' ' || !DigitsAt(s, 20, 4)) return std::nullopt;
  const bool one_digit = s[8] == ' ';
  if (!DigitsAt(s, 9, 1) || (!one_digit && !DigitsAt(s, 8, 1))) return std::nullopt;
  const std::string_view day = one_digit ? s.substr(9, 1) : s.substr(8, 2);
  return Instant(DigitsValue(s.substr(20, 4)), MonthNumber(s.substr(4, 3)), day, s, 11);
}

}  // namespace

// Each field within its bounds, or InvalidArgument naming it.
Status ValidatePolicy(const RetryPolicy& policy) {
  const auto text = [](Millis value) { return std::to_string(value.count()) + " ms"; };
  if (policy.max_attempts < 1 || policy.max_attempts > kMaxAttempts) {
    return InvalidArgumentError("retry policy: max_attempts " + std::to_string(policy.max_attempts) +
                                " is out of range (1 to " + std::to_string(kMaxAttempts) + ")");
  }
  const auto check = [&](std::string_view name, Millis value, Millis min) -> Status {
    if (value >= min && value <= kMaxPolicyDuration) return Status::Ok();
    return InvalidArgumentError("retry policy: " + std::string(name) + " " + text(value) + " is out of range (" +
                                text(min) + " to 365 days)");
  };
  if (Status s = check("base_delay", policy.base_delay, Millis{0}); !s.ok()) return s;
  if (Status s = check("max_delay", policy.max_delay, Millis{0}); !s.ok()) return s;
  return check("timeout", policy.timeout, Millis{1});
}

// The verdict on one attempt's answer (SPEC §10).
Verdict Classify(int status, std::string_view problem_code) {
  switch (status) {
    case 0:
    case 408:
    case 425:
    case 429:
    case 500:
    case 502:
    case 503:
    case 504:
      return Verdict::kRetry;
    case 409:
      // Only the gateway's "the key's first request still runs": a 409 without that code
      // is the upstream's own answer (not stored), and another attempt would run it again.
      return problem_code == "request-in-flight" ? Verdict::kRetry : Verdict::kFail;
    default:
      break;
  }
  if (status >= 100 && status < 400) return Verdict::kSuccess;
  return Verdict::kFail;
}

// Full jitter: `random` scaled onto [0, cap] (0 gives 0, the largest value gives cap).
Millis BackoffDelay(const RetryPolicy& policy, int next_attempt, std::uint64_t random) {
  if (next_attempt < 2) return Millis{0};  // no wait before the first attempt
  const std::int64_t base = std::max<std::int64_t>(0, policy.base_delay.count());
  const std::int64_t max_delay = std::max<std::int64_t>(0, policy.max_delay.count());
  const int shift = next_attempt - 2;
  std::int64_t cap = 0;
  if (base == 0) {
    cap = 0;
  } else if (shift >= 62 || base > (max_delay >> shift)) {
    cap = max_delay;  // base * 2^shift would pass max_delay (or overflow)
  } else {
    cap = base << shift;
  }
  const auto span = static_cast<unsigned __int128>(static_cast<std::uint64_t>(cap) + 1);
  return Millis{static_cast<std::int64_t>((static_cast<unsigned __int128>(random) * span) >> 64)};
}

// delay-seconds or an HTTP-date (IMF-fixdate, or the obsolete RFC 850 or asctime form), as a wait from `now`.
std::optional<Millis> ParseRetryAfter(std::string_view value, std::chrono::system_clock::time_point now) {
  value = TrimOws(value);
  if (value.empty()) return std::nullopt;
  if (std::all_of(value.begin(), value.end(), IsDigit)) {
    std::uint64_t seconds = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), seconds);
    if (ec == std::errc::result_out_of_range || seconds > kMaxRetryAfterSeconds) seconds = kMaxRetryAfterSeconds;
    else if (ec != std::errc() || end != value.data() + value.size()) return std::nullopt;
    return std::chrono::duration_cast<Millis>(std::chrono::seconds{static_cast<std::int64_t>(seconds)});
  }
  auto date = ParseImfFixdate(value);
  if (!date) date = ParseRfc850Date(value, now);
  if (!date) date = ParseAsctimeDate(value);
  if (!date) return std::nullopt;
  // ceil(date - now) in milliseconds, without taking the date to the clock's
  // nanoseconds (which end in 2262).
  const auto now_seconds = std::chrono::floor<std::chrono::seconds>(now);
  const Millis wait = std::chrono::duration_cast<Millis>(*date - now_seconds) -
                      std::chrono::floor<Millis>(now - now_seconds);
  return std::max(wait, Millis{0});
}

}  // namespace idemgate::client
