#include "config/address.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include "common/ascii.h"
#include "common/text.h"

namespace idemgate::config {
namespace {

bool IsHostChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

bool IsIpv6Char(char c) {
  return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.';
}

// Parses a decimal port of 1..5 digits into *port; false on anything else.
bool ParsePort(std::string_view text, std::uint32_t* port) {
  if (text.empty() || text.size() > 5) return false;
  if (!std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  std::uint32_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size() || value > 65535) return false;
  *port = value;
  return true;
}

// Splits an authority into host and the text after the host (":port" or "").
// Handles "[v6]". Returns false with *why set when the host part is malformed.
bool SplitAuthority(std::string_view authority, std::string* host, std::string_view* rest,
                    std::string* why) {
  if (!authority.empty() && authority.front() == '[') {
    std::size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      *why = "unterminated '[' in IPv6 address";
      return false;
    }
    std::string_view v6 = authority.substr(1, close - 1);
    if (v6.empty() || v6.find(':') == std::string_view::npos ||
        !std::all_of(v6.begin(), v6.end(), IsIpv6Char)) {
      *why = "invalid IPv6 address \"" + std::string(v6) + "\"";
      return false;
    }
    *host = std::string(v6);
    *rest = authority.substr(close + 1);
    return true;
  }
  std::size_t colon = authority.find(':');
  std::string_view name = authority.substr(0, colon);
  if (name.empty()) {
    *why = "missing host";
    return false;
  }
  if (!IsValidHostName(name)) {
    *why = "invalid host \"" + std::string(name) + "\"";
    return false;
  }
  *host = std::string(name);
  *rest = colon == std::string_view::npos ? std::string_view() : authority.substr(colon);
  return true;
}

}  // namespace

bool IsValidHostName(std::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  if (host.front() == '.' || host.front() == '-') return false;
  return std::all_of(host.begin(), host.end(), IsHostChar);
}

StatusOr<HostPort> ParseHostPort(std::string_view text) {
  const std::string quoted = "\"" + std::string(text) + "\"";
  HostPort out;
  std::string_view rest;
  std::string why;
  const std::string expected = " (expected host:port, e.g. 127.0.0.1:8080 or [::1]:8080)";
  if (!SplitAuthority(text, &out.host, &rest, &why)) {
    return InvalidArgumentError("invalid address " + quoted + ": " + why + expected);
  }
  if (rest.empty() || rest.front() != ':') {
    return InvalidArgumentError("invalid address " + quoted + ": missing port" + expected);
  }
  std::uint32_t port = 0;
  if (!ParsePort(rest.substr(1), &port)) {
    return InvalidArgumentError("invalid address " + quoted + ": port \"" +
                                std::string(rest.substr(1)) + "\" is not a number in 0..65535" +
                                expected);
  }
  out.port = static_cast<std::uint16_t>(port);
  return out;
}

Status ParseUpstreamUrl(std::string_view url, Upstream* upstream) {
  const std::string quoted = "\"" + RedactUrl(url) + "\"";
  const std::string expected =
      " (expected http://host[:port][/base] or https://host[:port][/base], e.g. http://127.0.0.1:9001)";
  for (char c : url) {
    const auto uc = static_cast<unsigned char>(c);
    if (uc <= 0x20 || uc >= 0x7f) {
      return InvalidArgumentError("invalid upstream url " + quoted +
                                  ": contains white space or a non-ASCII character");
    }
  }
  const bool tls = StartsWithIgnoreCaseAscii(url, "https://");
  if (!tls && !StartsWithIgnoreCaseAscii(url, "http://")) {
    return InvalidArgumentError("invalid upstream url " + quoted + ": scheme must be http or https" +
                                expected);
  }
  std::string_view after = url.substr(tls ? 8 : 7);
  if (after.find_first_of("?#") != std::string_view::npos) {
    return InvalidArgumentError("invalid upstream url " + quoted +
                                ": a query or fragment is not allowed" + expected);
  }
  std::size_t slash = after.find('/');
  std::string_view authority = after.substr(0, slash);
  std::string_view path =
      slash == std::string_view::npos ? std::string_view() : after.substr(slash);
  if (authority.find('@') != std::string_view::npos) {
    return InvalidArgumentError("invalid upstream url " + quoted + ": user info is not allowed" +
                                expected);
  }
  std::string host;
  std::string_view rest;
  std::string why;
  if (!SplitAuthority(authority, &host, &rest, &why)) {
    return InvalidArgumentError("invalid upstream url " + quoted + ": " + why + expected);
  }
  std::uint32_t port = tls ? 443 : 80;
  if (!rest.empty()) {
    if (rest.front() != ':' || !ParsePort(rest.substr(1), &port) || port == 0) {
      return InvalidArgumentError("invalid upstream url " + quoted + ": port \"" +
                                  std::string(rest.substr(rest.front() == ':' ? 1 : 0)) +
                                  "\" is not a number in 1..65535" + expected);
    }
  }
  if (path.find("//") != std::string_view::npos) {
    return InvalidArgumentError("invalid upstream url " + quoted +
                                ": base path contains an empty segment" + expected);
  }
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  upstream->scheme = tls ? "https" : "http";
  upstream->host = std::move(host);
  upstream->port = static_cast<std::uint16_t>(port);
  upstream->base_path = std::string(path);
  return Status::Ok();
}

}  // namespace idemgate::config
