#include "common/text.h"

#include <algorithm>
#include <cstdint>

namespace idemgate {

bool IsValidUtf8(std::string_view bytes) {
  std::size_t i = 0;
  while (i < bytes.size()) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len;
    std::uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
      cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > bytes.size()) return false;
    for (std::size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(bytes[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += len;
  }
  return true;
}

std::string SanitizeUtf8(std::string_view bytes) {
  if (IsValidUtf8(bytes)) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() + 8);
  std::size_t i = 0;
  while (i < bytes.size()) {
    std::size_t len = 1;
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0xc0 && c < 0xe0) {
      len = 2;
    } else if (c >= 0xe0 && c < 0xf0) {
      len = 3;
    } else if (c >= 0xf0 && c < 0xf8) {
      len = 4;
    }
    if (c < 0x80) {
      out += bytes[i];
      ++i;
    } else if (i + len <= bytes.size() && len > 1 && IsValidUtf8(bytes.substr(i, len))) {
      out.append(bytes.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

std::string Printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto u = static_cast<unsigned char>(text[i]);
    if (u < 0x80) {
      if (u == '\t') {
        out += "\\t";
      } else if (u == '\n') {
        out += "\\n";
      } else if (u == '\r') {
        out += "\\r";
      } else if (u < 0x20 || u == 0x7f) {
        out += "\\x";
        out += kHex[u >> 4];
        out += kHex[u & 15];
      } else {
        out += text[i];
      }
      ++i;
      continue;
    }
    const std::size_t length = u >= 0xf0 ? 4 : u >= 0xe0 ? 3 : u >= 0xc0 ? 2 : 1;
    const std::string_view sequence = text.substr(i, length);
    if (length == 1 || sequence.size() != length || !IsValidUtf8(sequence)) {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
      ++i;
      continue;
    }
    const auto second = static_cast<unsigned char>(sequence.size() > 1 ? sequence[1] : 0);
    if (u == 0xc2 && second < 0xa0) {  // U+0080..U+009F
      out += "\\u00";
      out += kHex[second >> 4];
      out += kHex[second & 15];
    } else {
      out += sequence;
    }
    i += length;
  }
  return out;
}

std::string Base64(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    const std::size_t n = std::min<std::size_t>(3, bytes.size() - i);
    std::uint32_t v = 0;
    for (std::size_t k = 0; k < 3; ++k) {
      v = (v << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    }
    for (std::size_t k = 0; k < 4; ++k) out += k <= n ? kAlphabet[(v >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

std::string RedactUrl(std::string_view url) {
  std::string out;
  out.reserve(url.size());
  std::string_view rest = url;
  const std::size_t scheme_end = rest.find("://");
  if (scheme_end != std::string_view::npos) {
    out.append(rest.substr(0, scheme_end + 3));
    rest.remove_prefix(scheme_end + 3);
    const std::size_t authority_end = rest.find_first_of("/?#");
    const std::size_t at = rest.substr(0, authority_end).rfind('@');
    if (at != std::string_view::npos) {
      out.append("***");
      rest.remove_prefix(at);  // keeps the '@'
    }
  }
  const std::size_t query = rest.find('?');
  if (query == std::string_view::npos) {
    out.append(rest);
    return out;
  }
  out.append(rest.substr(0, query));
  out.append("?***");
  const std::size_t fragment = rest.find('#', query);
  if (fragment != std::string_view::npos) out.append(rest.substr(fragment));
  return out;
}

}  // namespace idemgate
