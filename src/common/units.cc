#include "common/units.h"

#include <charconv>
#include <limits>

namespace idemgate {
namespace {

struct Unit {
  std::string_view name;
  std::uint64_t factor;
};

// Splits "123abc" into 123 and "abc"; fails on a missing or overflowing number.
bool SplitNumber(std::string_view text, std::uint64_t* number, std::string_view* unit) {
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(begin, end, *number);
  if (ec != std::errc() || ptr == begin) return false;
  *unit = std::string_view(ptr, static_cast<std::size_t>(end - ptr));
  return true;
}

bool MultiplyChecked(std::uint64_t a, std::uint64_t b, std::uint64_t* out) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return false;
  *out = a * b;
  return true;
}

// A unit that holds a digit or a point is a fraction ("1.5s") or several
// numbers with units ("1h30m"), which the parsers do not read.
bool LooksCompound(std::string_view unit) {
  return unit.find_first_of("0123456789.,") != std::string_view::npos;
}

}  // namespace

StatusOr<Duration> ParseDuration(std::string_view text) {
  static constexpr Unit kUnits[] = {
      {"ms", 1}, {"s", 1000}, {"m", 60'000}, {"h", 3'600'000}, {"d", 86'400'000},
  };
  std::uint64_t n = 0;
  std::string_view unit;
  if (!SplitNumber(text, &n, &unit)) {
    return InvalidArgumentError("invalid duration \"" + std::string(text) +
                                "\" (expected a whole number and a unit: 250ms, 30s, 5m, 24h, 7d)");
  }
  if (unit.empty() && n == 0) return Duration(0);
  for (const Unit& u : kUnits) {
    if (unit == u.name) {
      std::uint64_t ms = 0;
      if (!MultiplyChecked(n, u.factor, &ms) ||
          ms > static_cast<std::uint64_t>(std::numeric_limits<Duration::rep>::max())) {
        return InvalidArgumentError("duration \"" + std::string(text) + "\" is too large");
      }
      return Duration(static_cast<Duration::rep>(ms));
    }
  }
  if (LooksCompound(unit)) {
    return InvalidArgumentError("invalid duration \"" + std::string(text) +
                                "\" (one whole number and one unit, such as 1500ms or 90m: no fractions, no "
                                "combined units)");
  }
  return InvalidArgumentError("invalid duration \"" + std::string(text) +
                              "\" (unit must be one of ms, s, m, h, d)");
}

StatusOr<std::uint64_t> ParseSize(std::string_view text) {
  static constexpr Unit kUnits[] = {
      {"", 1},           {"B", 1},
      {"KiB", 1ULL << 10}, {"MiB", 1ULL << 20}, {"GiB", 1ULL << 30},
      {"KB", 1000ULL},   {"MB", 1000'000ULL}, {"GB", 1000'000'000ULL},
  };
  std::uint64_t n = 0;
  std::string_view unit;
  if (!SplitNumber(text, &n, &unit)) {
    return InvalidArgumentError("invalid size \"" + std::string(text) +
                                "\" (expected a whole number and a unit: 512B, 16KiB, 10MiB, 1GiB)");
  }
  for (const Unit& u : kUnits) {
    if (unit == u.name) {
      std::uint64_t bytes = 0;
      if (!MultiplyChecked(n, u.factor, &bytes)) {
        return InvalidArgumentError("size \"" + std::string(text) + "\" is too large");
      }
      return bytes;
    }
  }
  if (LooksCompound(unit)) {
    return InvalidArgumentError("invalid size \"" + std::string(text) +
                                "\" (one whole number and one unit, such as 1536KiB: no fractions)");
  }
  return InvalidArgumentError("invalid size \"" + std::string(text) +
                              "\" (unit must be one of B, KiB, MiB, GiB, KB, MB, GB)");
}

std::string FormatDuration(Duration d) {
  static constexpr Unit kUnits[] = {
      {"d", 86'400'000}, {"h", 3'600'000}, {"m", 60'000}, {"s", 1000}, {"ms", 1},
  };
  const auto ms = static_cast<std::uint64_t>(d.count() < 0 ? 0 : d.count());
  if (ms == 0) return "0s";
  for (const Unit& u : kUnits) {
    if (ms % u.factor == 0) return std::to_string(ms / u.factor) + std::string(u.name);
  }
  return std::to_string(ms) + "ms";
}

std::string FormatSize(std::uint64_t bytes) {
  static constexpr Unit kUnits[] = {{"GiB", 1ULL << 30}, {"MiB", 1ULL << 20}, {"KiB", 1ULL << 10}};
  if (bytes == 0) return "0B";
  for (const Unit& u : kUnits) {
    if (bytes % u.factor == 0) return std::to_string(bytes / u.factor) + std::string(u.name);
  }
  return std::to_string(bytes) + "B";
}

}  // namespace idemgate
