#pragma once

#include <string>
#include <string_view>

// Lower-case hex, one implementation for the project (fingerprints and owner
// tokens in admin output, SHA-1/SHA-256 digests of scripts, keys and bodies).
namespace idemgate {

inline std::string ToHex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(bytes.size() * 2, '\0');
  char* p = out.data();
  for (const char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    *p++ = kDigits[u >> 4];
    *p++ = kDigits[u & 0xf];
  }
  return out;
}

}  // namespace idemgate
