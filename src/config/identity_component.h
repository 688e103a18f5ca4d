#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

// The rule every tenant, project and subject follows, whoever names it: a
// caller's trusted headers, token or API key, or a webhook endpoint of the
// config. These values are sent upstream in header lines, become metric
// labels and are spelled into stored and forwarded idempotency keys.
namespace idemgate::config {

// The longest tenant, project or subject accepted.
inline constexpr std::size_t kMaxIdentityComponentLength = 256;

// True for 1..256 visible ASCII characters (0x21..0x7e): a tenant, project or
// subject.
inline bool IsIdentityComponent(std::string_view s) {
  if (s.empty() || s.size() > kMaxIdentityComponentLength) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u > 0x20 && u < 0x7f;
  });
}

}  // namespace idemgate::config
