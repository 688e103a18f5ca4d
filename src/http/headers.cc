#include "http/headers.h"

#include <sys/random.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>

#include "common/ascii.h"

namespace idemgate::http {
namespace {

constexpr char kHexDigits[] = "0123456789abcdef";
// Two hex digits per byte value, so a random word becomes 16 digits in 8 lookups.
constexpr std::array<char, 512> kHexPairs = [] {
  std::array<char, 512> t{};
  for (std::size_t i = 0; i < 256; ++i) {
    t[2 * i] = kHexDigits[i >> 4];
    t[2 * i + 1] = kHexDigits[i & 15];
  }
  return t;
}();


bool IsLowerHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool AllZeros(std::string_view s) {
  for (char c : s) {
    if (c != '0') return false;
  }
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// xoshiro256** seeded from getrandom(2): fast, per thread, not for secrets.
class FastRandom {
 public:
  FastRandom() {
    if (getrandom(s_, sizeof(s_), 0) != static_cast<ssize_t>(sizeof(s_))) {
      std::random_device rd;
      for (auto& w : s_) w = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    }
    if ((s_[0] | s_[1] | s_[2] | s_[3]) == 0) s_[0] = 0x9E3779B97F4A7C15ull;
  }
  std::uint64_t Next() {
    const std::uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

 private:
  static std::uint64_t Rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
};

FastRandom& ThreadRandom() {
  thread_local FastRandom random;
  return random;
}

}  // namespace

bool NameEquals(std::string_view a, std::string_view b) { return EqualsIgnoreCaseAscii(a, b); }

bool IsHopByHop(std::string_view name) {
  // Dispatch on length first: most names are end-to-end and fail fast.
  switch (name.size()) {
    case 2: return NameEquals(name, "te");
    case 7: return NameEquals(name, "trailer") || NameEquals(name, "upgrade");
    case 10: return NameEquals(name, "connection") || NameEquals(name, "keep-alive");
    case 16: return NameEquals(name, "proxy-connection");
    case 17: return NameEquals(name, "transfer-encoding");
    case 18: return NameEquals(name, "proxy-authenticate");
    case 19: return NameEquals(name, "proxy-authorization");
    default: return false;
  }
}

bool IsClientForwardingField(std::string_view name) {
  // Dispatch on length first, as IsHopByHop does; a name is compared
  // ignoring '_' against '-' only when it holds a '_'.
  const auto is = [name](std::string_view field) {
    return NameEquals(name, field) ||
           (name.find('_') != std::string_view::npos && EqualsIgnoreCaseDashOrUnderscore(name, field));
  };
  switch (name.size()) {
    case 9: return NameEquals(name, "forwarded") || is("x-real-ip");
    case 15: return is("x-forwarded-for") || is("x-forwarded-ssl");
    case 16: return is("x-forwarded-host") || is("x-forwarded-port");
    case 17: return is("x-forwarded-proto");
    case 18: return is("x-forwarded-prefix") || is("x-forwarded-scheme");
    default: return false;
  }
}

void HopByHopFilter::AddConnectionValue(std::string_view value) {
  std::size_t start = 0;
  while (start <= value.size()) {
    std::size_t comma = value.find(',', start);
    if (comma == std::string_view::npos) comma = value.size();
    const std::string_view token = Trim(value.substr(start, comma - start));
    if (!token.empty()) {
      if (inline_count_ < kInlineTokens) {
        inline_[inline_count_++] = token;
      } else {
        overflow_.push_back(token);
      }
    }
    start = comma + 1;
  }
}

bool HopByHopFilter::ShouldDrop(std::string_view name) const {
  if (IsHopByHop(name)) return true;
  for (std::size_t i = 0; i < inline_count_; ++i) {
    if (NameEquals(inline_[i], name)) return true;
  }
  for (std::string_view t : overflow_) {
    if (NameEquals(t, name)) return true;
  }
  return false;
}

std::vector<std::string_view> HopByHopFilter::tokens() const {
  std::vector<std::string_view> out(inline_.begin(), inline_.begin() + static_cast<std::ptrdiff_t>(inline_count_));
  out.insert(out.end(), overflow_.begin(), overflow_.end());
  return out;
}

std::vector<std::string_view> SplitList(std::string_view value) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (start <= value.size()) {
    std::size_t comma = value.find(',', start);
    if (comma == std::string_view::npos) comma = value.size();
    const std::string_view item = Trim(value.substr(start, comma - start));
    if (!item.empty()) out.push_back(item);
    start = comma + 1;
  }
  return out;
}

std::string AppendForwardedFor(const std::vector<std::string_view>& existing, std::string_view client_ip) {
  std::string out;
  std::size_t size = client_ip.size();
  for (std::string_view v : existing) size += v.size() + 2;
  out.reserve(size);
  for (std::string_view v : existing) {
    const std::string_view t = Trim(v);
    if (t.empty()) continue;
    out += t;
    out += ", ";
  }
  out += client_ip;
  return out;
}

bool IsAcceptableRequestId(std::string_view value) {
  if (value.empty() || value.size() > 200) return false;
  for (char c : value) {
    if (c < 0x21 || c > 0x7E) return false;
  }
  return true;
}

void AppendRandomHex(std::size_t n, std::string& out) {
  FastRandom& random = ThreadRandom();
  const std::size_t start = out.size();
  out.resize(start + n);
  char* p = out.data() + start;
  for (; n >= 16; n -= 16) {
    const std::uint64_t v = random.Next();
    for (int b = 0; b < 8; ++b, p += 2) std::memcpy(p, &kHexPairs[2 * ((v >> (8 * b)) & 0xff)], 2);
  }
  if (n > 0) {
    std::uint64_t v = random.Next();
    for (std::size_t i = 0; i < n; ++i, v >>= 4) p[i] = kHexDigits[v & 15];
  }
}

void AppendNewRequestId(std::string& out) { AppendRandomHex(32, out); }

std::string NewRequestId() {
  std::string id;
  id.reserve(32);
  AppendNewRequestId(id);
  return id;
}

bool IsValidTraceparent(std::string_view value) {
  // version(2) '-' trace-id(32) '-' parent-id(16) '-' flags(2) = 55
  if (value.size() < 55) return false;
  const std::string_view version = value.substr(0, 2);
  if (!IsLowerHex(version) || version == "ff") return false;
  if (value[2] != '-' || value[35] != '-' || value[52] != '-') return false;
  const std::string_view trace_id = value.substr(3, 32);
  const std::string_view parent_id = value.substr(36, 16);
  const std::string_view flags = value.substr(53, 2);
  if (!IsLowerHex(trace_id) || !IsLowerHex(parent_id) || !IsLowerHex(flags)) return false;
  if (AllZeros(trace_id) || AllZeros(parent_id)) return false;
  if (version == "00") return value.size() == 55;
  // Future versions: the version-00 prefix followed by the end or '-'.
  return value.size() == 55 || value[55] == '-';
}

std::string NewTraceparent() {
  std::string out;
  out.reserve(55);
  out += "00-";
  do {
    out.resize(3);
    AppendRandomHex(32, out);
  } while (AllZeros(std::string_view(out).substr(3, 32)));
  out += '-';
  do {
    out.resize(36);
    AppendRandomHex(16, out);
  } while (AllZeros(std::string_view(out).substr(36, 16)));
  out += "-00";
  return out;
}

std::string_view TraceId(std::string_view traceparent) {
  if (traceparent.size() < 35) return {};
  return traceparent.substr(3, 32);
}

std::string_view CurrentHttpDate() {
  thread_local std::time_t cached_second = -1;
  thread_local char cached[32];
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  if (now != cached_second) {
    static constexpr const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                              "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    std::tm tm{};
    gmtime_r(&now, &tm);
    std::snprintf(cached, sizeof(cached), "%s, %02d %s %04d %02d:%02d:%02d GMT", kDays[tm.tm_wday], tm.tm_mday,
                  kMonths[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
    cached_second = now;
  }
  return std::string_view(cached, 29);
}

std::optional<TargetParts> SplitTarget(std::string_view target) {
  TargetParts parts;
  std::string_view rest = target;
  if (rest.empty()) return std::nullopt;
  if (rest.front() != '/') {
    // absolute-form: scheme "://" authority [path-abempty] ["?" query]
    const std::size_t scheme_end = rest.find("://");
    if (scheme_end == std::string_view::npos) return std::nullopt;
    const std::string_view scheme = rest.substr(0, scheme_end);
    if (!NameEquals(scheme, "http") && !NameEquals(scheme, "https")) return std::nullopt;
    rest.remove_prefix(scheme_end + 3);
    const std::size_t authority_end = rest.find_first_of("/?");
    parts.authority = rest.substr(0, authority_end);
    if (parts.authority.empty()) return std::nullopt;
    if (authority_end == std::string_view::npos) {
      parts.path = "/";
      parts.path_and_query = "/";
      return parts;
    }
    rest.remove_prefix(authority_end);
    // "http://h?q": an empty path, which stands for "/" (RFC 9110 section
    // 4.2.3); the caller forwards "/?q".
  }
  if (rest.find('#') != std::string_view::npos) return std::nullopt;
  parts.path_and_query = rest;
  const std::size_t q = rest.find('?');
  if (q == std::string_view::npos) {
    parts.path = rest;
  } else {
    parts.path = rest.substr(0, q);
    parts.query = rest.substr(q + 1);
  }
  return parts;
}

bool IsValidHostValue(std::string_view value) {
  auto is_hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); };
  auto is_alnum = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  std::size_t i = 0;
  if (!value.empty() && value.front() == '[') {
    // IP-literal: an IPv6 address or "v" IPvFuture; their characters.
    const std::size_t close = value.find(']');
    if (close == std::string_view::npos || close == 1) return false;
    for (char c : value.substr(1, close - 1)) {
      if (!is_alnum(c) && std::string_view(":.-_~!$&'()*+;=").find(c) == std::string_view::npos) return false;
    }
    i = close + 1;
  } else {
    // reg-name (which covers IPv4 addresses): unreserved, percent-encoded
    // and sub-delims characters, without the comma.
    for (; i < value.size() && value[i] != ':'; ++i) {
      const char c = value[i];
      if (c == '%') {
        if (i + 2 >= value.size() || !is_hex(value[i + 1]) || !is_hex(value[i + 2])) return false;
        i += 2;
      } else if (!is_alnum(c) && std::string_view("-._~!$&'()*+;=").find(c) == std::string_view::npos) {
        return false;
      }
    }
    // An empty host with a port (":80"): RFC 9110 section 4.2.1 has an
    // http URI with an empty host rejected.
    if (i == 0 && !value.empty()) return false;
  }
  if (i == value.size()) return true;
  if (value[i] != ':') return false;
  for (char c : value.substr(i + 1)) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace idemgate::http
