#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "config/config.h"

// Parsing of the network addresses a config holds: listen addresses, Redis
// addresses and upstream URLs. Pure functions, safe from any thread.
namespace idemgate::config {

struct HostPort {
  std::string host;  // a name, an IPv4 address, or an IPv6 address without brackets
  std::uint16_t port = 0;
};

// Parses "host:port". host is a DNS name, an IPv4 address or a bracketed IPv6
// address ("[::1]:8080"; the brackets are not kept). port is 0..65535 (0 asks
// the kernel for a free port; callers that need a real port check for 0).
// The message names what is wrong, without a key or line.
StatusOr<HostPort> ParseHostPort(std::string_view text);

// Parses "http://host[:port][/base]" or "https://host[:port][/base]" into
// upstream->scheme ("http" or "https"), host, port (80 or 443 when absent)
// and base_path ("" or "/base" without a trailing '/').
// Leaves upstream->url and every other member untouched; on error leaves
// *upstream unchanged. Rejects other schemes, user info, query and fragment.
Status ParseUpstreamUrl(std::string_view url, Upstream* upstream);

// True for a valid DNS name or IPv4 address (letters, digits, '-', '.', '_').
bool IsValidHostName(std::string_view host);

}  // namespace idemgate::config
