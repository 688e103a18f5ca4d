// Config units: ParseDuration / ParseSize on the whole input as text, and
// FormatDuration / FormatSize on its first eight bytes as a number. Checked:
// both parsers agree with a reference in 128-bit arithmetic (which inputs
// are accepted, and the value: number × unit, refused when it does not fit);
// every value formats to a spelling that parses back to it, in the largest
// unit that divides it exactly.

#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "common/units.h"
#include "fuzz_target.h"

namespace {

using idemgate::Duration;
using U128 = unsigned __int128;

struct Unit {
  std::string_view name;
  std::uint64_t factor;
};

constexpr Unit kDurationUnits[] = {
    {"ms", 1}, {"s", 1000}, {"m", 60'000}, {"h", 3'600'000}, {"d", 86'400'000}};
constexpr Unit kSizeUnits[] = {{"", 1},          {"B", 1},      {"KiB", 1ULL << 10},    {"MiB", 1ULL << 20},
                               {"GiB", 1ULL << 30}, {"KB", 1000}, {"MB", 1'000'000}, {"GB", 1'000'000'000}};

// The reference: leading decimal digits (at least one, no sign, no space)
// then a unit from `units`; the number must fit 64 bits (leading zeros do
// not count) and the product must not exceed `max`.
std::optional<std::uint64_t> ReferenceParse(std::string_view text, const Unit* units, std::size_t n_units,
                                            U128 max, bool bare_zero) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0) return std::nullopt;
  U128 number = 0;
  for (std::size_t i = 0; i < digits; ++i) {
    number = number * 10 + static_cast<unsigned>(text[i] - '0');
    if (number > std::numeric_limits<std::uint64_t>::max()) return std::nullopt;
  }
  const std::string_view unit = text.substr(digits);
  if (bare_zero && unit.empty() && number == 0) return 0;
  for (std::size_t i = 0; i < n_units; ++i) {
    if (unit != units[i].name) continue;
    const U128 value = number * units[i].factor;  // < 2^64 · 2^37: no overflow
    if (value > max) return std::nullopt;
    return static_cast<std::uint64_t>(value);
  }
  return std::nullopt;
}

// `text` is <number><unit>, the number without leading zeros, the unit the
// largest of `units` (largest first) that divides `value`.
void CheckShortest(std::string_view text, std::uint64_t value, const Unit* units, std::size_t n_units) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  FUZZ_CHECK(digits > 0);
  FUZZ_CHECK(text[0] != '0' || (digits == 1 && value == 0));
  const std::string_view unit = text.substr(digits);
  if (value == 0) return;
  for (std::size_t i = 0; i < n_units; ++i) {
    if (value % units[i].factor == 0) {
      FUZZ_CHECK(unit == units[i].name);
      return;
    }
  }
  FUZZ_CHECK(false);  // the last unit is 1: never reached
}

}  // namespace

IDEMGATE_FUZZ_TARGET(units) {
  const std::string_view text = idemgate::fuzz::AsView(data, size);

  const auto duration = idemgate::ParseDuration(text);
  const auto want_duration = ReferenceParse(text, kDurationUnits, std::size(kDurationUnits),
                                            static_cast<U128>(std::numeric_limits<Duration::rep>::max()), true);
  FUZZ_CHECK(duration.ok() == want_duration.has_value());
  if (duration.ok()) {
    FUZZ_CHECK(duration->count() >= 0);
    FUZZ_CHECK(static_cast<std::uint64_t>(duration->count()) == *want_duration);
  }

  const auto bytes = idemgate::ParseSize(text);
  const auto want_bytes = ReferenceParse(text, kSizeUnits, std::size(kSizeUnits),
                                         std::numeric_limits<std::uint64_t>::max(), false);
  FUZZ_CHECK(bytes.ok() == want_bytes.has_value());
  if (bytes.ok()) FUZZ_CHECK(*bytes == *want_bytes);

  // Formatting: the first eight bytes as a number, and the values just parsed.
  std::uint64_t raw = 0;
  std::memcpy(&raw, data, std::min(size, sizeof raw));
  static constexpr Unit kFormatDurationUnits[] = {
      {"d", 86'400'000}, {"h", 3'600'000}, {"m", 60'000}, {"s", 1000}, {"ms", 1}};
  static constexpr Unit kFormatSizeUnits[] = {{"GiB", 1ULL << 30}, {"MiB", 1ULL << 20}, {"KiB", 1ULL << 10}, {"B", 1}};

  std::uint64_t sizes[] = {raw, raw >> 20 << 20, bytes.ok() ? *bytes : 0};
  for (const std::uint64_t n : sizes) {
    const std::string formatted = idemgate::FormatSize(n);
    const auto back = idemgate::ParseSize(formatted);
    FUZZ_CHECK(back.ok() && *back == n);
    CheckShortest(formatted, n, kFormatSizeUnits, std::size(kFormatSizeUnits));
  }

  // Parsed durations are never negative; a negative one still formats to
  // something the config loader accepts (zero).
  const auto max_rep = static_cast<std::uint64_t>(std::numeric_limits<Duration::rep>::max());
  const std::uint64_t ms = raw & max_rep;
  std::uint64_t durations[] = {ms, ms / 86'400'000 * 86'400'000, ms / 1000 * 1000,
                               duration.ok() ? static_cast<std::uint64_t>(duration->count()) : 0};
  for (const std::uint64_t n : durations) {
    const std::string formatted = idemgate::FormatDuration(Duration(static_cast<Duration::rep>(n)));
    const auto back = idemgate::ParseDuration(formatted);
    FUZZ_CHECK(back.ok() && static_cast<std::uint64_t>(back->count()) == n);
    if (n == 0) {
      FUZZ_CHECK(formatted == "0s");
    } else {
      CheckShortest(formatted, n, kFormatDurationUnits, std::size(kFormatDurationUnits));
    }
  }
  const std::string negative = idemgate::FormatDuration(Duration(-static_cast<Duration::rep>(ms) - 1));
  const auto negative_back = idemgate::ParseDuration(negative);
  FUZZ_CHECK(negative_back.ok() && negative_back->count() == 0);
  return 0;
}
