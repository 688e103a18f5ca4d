#include "store/redis/cluster.h"

#include <array>
#include <charconv>

namespace idemgate::store::redis {
namespace {

constexpr std::array<std::uint16_t, 256> MakeCrcTable() {
  std::array<std::uint16_t, 256> table{};
  for (int i = 0; i < 256; ++i) {
    std::uint16_t crc = static_cast<std::uint16_t>(i << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) ? static_cast<std::uint16_t>((crc << 1) ^ 0x1021)
                           : static_cast<std::uint16_t>(crc << 1);
    }
    table[static_cast<std::size_t>(i)] = crc;
  }
  return table;
}

constexpr std::array<std::uint16_t, 256> kCrcTable = MakeCrcTable();

bool ParsePort(std::string_view s, std::uint16_t* port) {
  unsigned v = 0;
  auto res = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || res.ec != std::errc() || res.ptr != s.data() + s.size() || v == 0 || v > 65535) {
    return false;
  }
  *port = static_cast<std::uint16_t>(v);
  return true;
}

}  // namespace

std::uint16_t Crc16(std::string_view data) {
  std::uint16_t crc = 0;
  for (char c : data) {
    const auto idx = static_cast<std::uint8_t>((crc >> 8) ^ static_cast<std::uint8_t>(c));
    crc = static_cast<std::uint16_t>((crc << 8) ^ kCrcTable[idx]);
  }
  return crc;
}

int KeySlot(std::string_view key) {
  const auto open = key.find('{');
  if (open != std::string_view::npos) {
    const auto close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return Crc16(key) & (kSlotCount - 1);
}

std::string Address::ToString() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

StatusOr<Address> ParseAddress(std::string_view text) {
  Address a;
  std::string_view host, port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return InvalidArgumentError("redis address '" + std::string(text) + "': expected [host]:port");
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) {
      return InvalidArgumentError("redis address '" + std::string(text) + "': expected host:port");
    }
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (host.empty()) return InvalidArgumentError("redis address '" + std::string(text) + "': empty host");
  if (!ParsePort(port, &a.port)) {
    return InvalidArgumentError("redis address '" + std::string(text) + "': bad port");
  }
  a.host = std::string(host);
  return a;
}

std::optional<Redirect> ParseRedirect(const Reply& reply) {
  Redirect r;
  std::string_view rest;
  if (reply.IsErrorCode("MOVED")) {
    r.kind = Redirect::Kind::kMoved;
    rest = std::string_view(reply.str).substr(6);
  } else if (reply.IsErrorCode("ASK")) {
    r.kind = Redirect::Kind::kAsk;
    rest = std::string_view(reply.str).substr(4);
  } else {
    return std::nullopt;
  }
  const auto space = rest.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  std::string_view slot = rest.substr(0, space);
  std::string_view endpoint = rest.substr(space + 1);
  auto res = std::from_chars(slot.data(), slot.data() + slot.size(), r.slot);
  if (res.ec != std::errc() || res.ptr != slot.data() + slot.size() || r.slot < 0 || r.slot >= kSlotCount) {
    return std::nullopt;
  }
  const auto colon = endpoint.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  std::string_view host = endpoint.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "?") host = {};
  if (!ParsePort(endpoint.substr(colon + 1), &r.address.port)) return std::nullopt;
  r.address.host = std::string(host);
  return r;
}

StatusOr<std::vector<SlotRange>> ParseClusterSlots(const Reply& reply, const Address& queried) {
  if (reply.is_error()) return StatusFromErrorReply(reply.str);
  if (reply.type != Reply::Type::kArray) return InternalError("CLUSTER SLOTS: not an array");
  std::vector<SlotRange> ranges;
  ranges.reserve(reply.elements.size());
  for (const Reply& e : reply.elements) {
    if (e.type != Reply::Type::kArray || e.elements.size() < 3 ||
        e.elements[0].type != Reply::Type::kInteger || e.elements[1].type != Reply::Type::kInteger ||
        e.elements[2].type != Reply::Type::kArray || e.elements[2].elements.size() < 2) {
      return InternalError("CLUSTER SLOTS: malformed entry " + e.DebugString());
    }
    const Reply& node = e.elements[2];
    if ((node.elements[0].type != Reply::Type::kString && node.elements[0].type != Reply::Type::kStatus) ||
        node.elements[1].type != Reply::Type::kInteger) {
      return InternalError("CLUSTER SLOTS: malformed node " + node.DebugString());
    }
    SlotRange r;
    r.first = static_cast<int>(e.elements[0].integer);
    r.last = static_cast<int>(e.elements[1].integer);
    if (r.first < 0 || r.last >= kSlotCount || r.first > r.last || node.elements[1].integer <= 0 ||
        node.elements[1].integer > 65535) {
      return InternalError("CLUSTER SLOTS: bad range " + e.DebugString());
    }
    r.master.host = node.elements[0].str;
    if (r.master.host.empty() || r.master.host == "?") r.master.host = queried.host;
    r.master.port = static_cast<std::uint16_t>(node.elements[1].integer);
    ranges.push_back(std::move(r));
  }
  return ranges;
}

}  // namespace idemgate::store::redis
