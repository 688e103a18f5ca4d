#pragma once

#include <string>
#include <string_view>

// Internal to libidemclient: how error messages show an input (a URL, a
// header, a key) that may hold anything.
namespace idemgate::client {

// `s` in double quotes, with `"` and `\` escaped and every byte outside
// printable ASCII as \xNN, so a message naming it stays one readable line.
inline std::string QuoteInput(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u > 0x7e) {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
      continue;
    }
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  out += '"';
  return out;
}

}  // namespace idemgate::client
