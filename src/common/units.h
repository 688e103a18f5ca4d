#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace idemgate {

using Duration = std::chrono::milliseconds;

// Parses "250ms", "30s", "5m", "24h", "7d" (one integer and one unit; "0" alone
// is accepted as zero). Rejects negatives, fractions, overflow and unknown units.
StatusOr<Duration> ParseDuration(std::string_view text);

// Parses "512", "64B", "16KiB", "10MiB", "1GiB" (binary units) and "1KB"/"1MB"/"1GB"
// (decimal). Rejects negatives, fractions, overflow and unknown units.
StatusOr<std::uint64_t> ParseSize(std::string_view text);

// Shortest exact spelling: 90000ms -> "90s", 0 -> "0s".
std::string FormatDuration(Duration d);
// Shortest exact spelling: 1048576 -> "1MiB".
std::string FormatSize(std::uint64_t bytes);

}  // namespace idemgate
