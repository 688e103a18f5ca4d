#pragma once

#include <cstddef>
#include <string_view>

// Rules for the names the Redis store puts on the wire, shared by the config
// validation and RedisStore::Connect (for callers that build Options
// directly). Each returns what is wrong, or an empty view when the name is
// fine.
namespace idemgate::config {

inline constexpr std::size_t kMaxRedisKeyPrefixBytes = 64;
inline constexpr std::size_t kMaxRedisUsernameBytes = 128;

// 1..64 visible ASCII characters without '{' or '}': a brace would make a
// Redis Cluster hash tag and put every record on one slot (one node).
constexpr std::string_view RedisKeyPrefixProblem(std::string_view prefix) {
  if (prefix.empty()) return "must not be empty";
  if (prefix.size() > kMaxRedisKeyPrefixBytes) return "must be at most 64 bytes";
  for (char c : prefix) {
    if (c == '{' || c == '}') return "must not contain '{' or '}' (a Redis Cluster hash tag)";
    if (c < 0x21 || c > 0x7e) return "must be visible ASCII characters (no spaces or control characters)";
  }
  return {};
}

// Empty (the default user), or 1..128 visible ASCII characters.
constexpr std::string_view RedisUsernameProblem(std::string_view username) {
  if (username.size() > kMaxRedisUsernameBytes) return "must be at most 128 bytes";
  for (char c : username) {
    if (c < 0x21 || c > 0x7e) return "must be visible ASCII characters (no spaces or control characters)";
  }
  return {};
}

}  // namespace idemgate::config
