#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

// ASCII case folding for protocol tokens (header names, media types, schemes,
// JWT and webhook fields): only 'A'..'Z' fold; every other byte, those of
// UTF-8 included, compares as itself. One implementation for the whole
// project; header names are compared on every request, so the comparison
// works 8 bytes at a time.
namespace idemgate {

inline char LowerAscii(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

// The 8 bytes of `w` with 'A'..'Z' lower-cased and every other byte
// unchanged. Per byte, on its low 7 bits: adding 0x3f sets the high bit from
// 'A' (0x41) up, adding 0x25 from '[' (0x5b) up; neither sum carries into
// the next byte, and bytes with the high bit set are left alone.
inline std::uint64_t LowerAscii8(std::uint64_t w) {
  constexpr std::uint64_t k7f = 0x7f7f7f7f7f7f7f7fULL;
  constexpr std::uint64_t k80 = 0x8080808080808080ULL;
  const std::uint64_t low7 = w & k7f;
  const std::uint64_t from_a = low7 + 0x3f3f3f3f3f3f3f3fULL;
  const std::uint64_t past_z = low7 + 0x2525252525252525ULL;
  const std::uint64_t upper = from_a & ~past_z & ~w & k80;
  return w | (upper >> 2);
}

// True when `a` and `b` are equal ignoring ASCII case and counting '-' and
// '_' as one: header names that CGI-style servers (WSGI, Rack, PHP) read as
// the same variable (X-Tenant-Id and X_Tenant_Id).
inline bool EqualsIgnoreCaseDashOrUnderscore(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const char x = a[i] == '_' ? '-' : LowerAscii(a[i]);
    const char y = b[i] == '_' ? '-' : LowerAscii(b[i]);
    if (x != y) return false;
  }
  return true;
}

// True when `a` and `b` are equal ignoring ASCII case.
inline bool EqualsIgnoreCaseAscii(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  if (a.empty()) return true;
  // Names of one length mostly differ in their first byte: answer those
  // without the word arithmetic.
  if (LowerAscii(a[0]) != LowerAscii(b[0])) return false;
  std::size_t i = 0;
  for (; i + 8 <= a.size(); i += 8) {
    std::uint64_t wa;
    std::uint64_t wb;
    std::memcpy(&wa, a.data() + i, 8);
    std::memcpy(&wb, b.data() + i, 8);
    if (LowerAscii8(wa) != LowerAscii8(wb)) return false;
  }
  for (; i < a.size(); ++i) {
    if (LowerAscii(a[i]) != LowerAscii(b[i])) return false;
  }
  return true;
}

// True when `s` begins with `prefix`, ignoring ASCII case (URL schemes,
// authorization schemes).
inline bool StartsWithIgnoreCaseAscii(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && EqualsIgnoreCaseAscii(s.substr(0, prefix.size()), prefix);
}

// The offset of the first control character in a field value (RFC 9110
// §5.5: none but HTAB; CR, LF and NUL would break the message framing), or
// npos.
inline std::size_t FieldControlCharacterAt(std::string_view s) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto u = static_cast<unsigned char>(s[i]);
    if ((u < 0x20 && u != '\t') || u == 0x7f) return i;
  }
  return std::string_view::npos;
}

// RFC 9110 tchar: the characters of a method or a header field name.
inline bool IsTchar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

// RFC 9110 token: one or more tchar.
inline bool IsToken(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsTchar(c)) return false;
  }
  return true;
}

}  // namespace idemgate
