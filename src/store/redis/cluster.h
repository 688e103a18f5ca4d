#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "store/redis/resp.h"

// Pure Redis Cluster helpers: key slots, node addresses, redirect errors and
// the CLUSTER SLOTS reply. No I/O.
namespace idemgate::store::redis {

inline constexpr int kSlotCount = 16384;

// CRC16-CCITT (XModem: polynomial 0x1021, initial value 0), the checksum the
// cluster spec uses. Crc16("123456789") == 0x31C3.
std::uint16_t Crc16(std::string_view data);

// The hash slot of `key`: CRC16 of the key, or of the text inside its first
// non-empty `{...}` hash tag, modulo 16384.
int KeySlot(std::string_view key);

// host:port of a node. Hosts may be names or IPv4/IPv6 literals ("[::1]:6379").
struct Address {
  std::string host;
  std::uint16_t port = 0;

  std::string ToString() const;
  friend bool operator==(const Address&, const Address&) = default;
  friend auto operator<=>(const Address&, const Address&) = default;
};

// Parses "host:port", "[v6]:port" or "v6:port" (the last colon splits).
StatusOr<Address> ParseAddress(std::string_view text);

// A -MOVED or -ASK error: the slot and the node that serves it now. `host`
// is empty when the server left it unknown (then: the node that answered).
struct Redirect {
  enum class Kind { kMoved, kAsk };
  Kind kind = Kind::kMoved;
  int slot = 0;
  Address address;
};

std::optional<Redirect> ParseRedirect(const Reply& reply);

// One master's slot range from CLUSTER SLOTS.
struct SlotRange {
  int first = 0;
  int last = 0;  // inclusive
  Address master;
};

// Parses a CLUSTER SLOTS reply. A node entry with an empty or "?" host takes
// `queried`'s host (the node the command was sent to), as the spec says.
StatusOr<std::vector<SlotRange>> ParseClusterSlots(const Reply& reply, const Address& queried);

}  // namespace idemgate::store::redis
