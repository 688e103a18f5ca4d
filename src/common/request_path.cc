#include "common/request_path.h"

namespace idemgate {
namespace {

int HexDigitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool IsUnreserved(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         c == '_' || c == '~';
}

// The unreserved character that path[i..i+3) ("%XX") encodes, or 0.
char EncodedUnreserved(std::string_view path, std::size_t i) {
  if (i + 3 > path.size()) return 0;
  const int hi = HexDigitValue(path[i + 1]);
  const int lo = HexDigitValue(path[i + 2]);
  if (hi < 0 || lo < 0) return 0;
  const auto c = static_cast<unsigned char>(hi * 16 + lo);
  return IsUnreserved(c) ? static_cast<char>(c) : 0;
}

}  // namespace

bool PathNeedsNormalizing(std::string_view path, bool merge_slashes) {
  for (std::size_t i = path.find_first_of(merge_slashes ? "%/" : "%"); i != std::string_view::npos;
       i = path.find_first_of(merge_slashes ? "%/" : "%", i + 1)) {
    if (path[i] == '%') {
      if (EncodedUnreserved(path, i) != 0) return true;
    } else if (i + 1 < path.size() && path[i + 1] == '/') {
      return true;
    }
  }
  return false;
}

void NormalizePath(std::string_view path, bool merge_slashes, std::string& out) {
  out.reserve(out.size() + path.size());
  bool after_slash = false;
  for (std::size_t i = 0; i < path.size();) {
    const char c = path[i];
    if (c == '%') {
      if (const char decoded = EncodedUnreserved(path, i)) {
        out += decoded;
        after_slash = false;
        i += 3;
        continue;
      }
    } else if (c == '/') {
      const bool skip = merge_slashes && after_slash;
      after_slash = true;
      ++i;
      if (!skip) out += c;
      continue;
    }
    out += c;
    after_slash = false;
    ++i;
  }
}

}  // namespace idemgate
