#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

// Internal to libidemclient: the name lookup behind SendOnce, and a seam for
// tests. SendOnce runs the lookup on a thread of its own and waits for it no
// longer than the attempt's deadline, or until its Interruption is
// triggered: the system resolver (getaddrinfo) cannot be cancelled, and may
// wait far longer than a timeout (an unreachable DNS server, say). A lookup
// given up on finishes on its thread, and its result is dropped.
namespace idemgate::client::internal {

using Endpoints = std::vector<boost::asio::ip::tcp::endpoint>;
// A blocking lookup of `host` (a name, not an address literal): its
// addresses with `port`, or Unavailable.
using Lookup = std::function<StatusOr<Endpoints>(const std::string& host, std::uint16_t port)>;

// The system's: asio's resolver, getaddrinfo.
StatusOr<Endpoints> SystemLookup(const std::string& host, std::uint16_t port);

// Makes `lookup` the one SendOnce uses (an empty one: SystemLookup again);
// returns the one it replaces. For tests.
Lookup ReplaceLookupForTesting(Lookup lookup);

}  // namespace idemgate::client::internal
