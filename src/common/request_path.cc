#include "common/request_path.h"

#include "common/ascii.h"

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

// True when `written` ends in a '%' that is not (yet) an escape: "...%" or
// "...%X". Decoding a hex digit after it would make one ("%%34%31" would
// become "%41"), so a path that is normalised once more, or decoded by the
// upstream, would read as another path than the one routed; such an escape
// is left encoded.
bool EndsInOpenEscape(std::string_view written) {
  const std::size_t n = written.size();
  return (n >= 1 && written[n - 1] == '%') || (n >= 2 && written[n - 2] == '%' && HexDigitValue(written[n - 1]) >= 0);
}

// The character the escape at path[i] decodes to, when it is decoded after
// `written`; 0 when it stays as it is.
char DecodedAfter(std::string_view path, std::size_t i, std::string_view written) {
  const char decoded = EncodedUnreserved(path, i);
  if (decoded != 0 && HexDigitValue(decoded) >= 0 && EndsInOpenEscape(written)) return 0;
  return decoded;
}

}  // namespace

bool PathNeedsNormalizing(std::string_view path, bool merge_slashes) {
  for (std::size_t i = path.find_first_of(merge_slashes ? "%/" : "%"); i != std::string_view::npos;
       i = path.find_first_of(merge_slashes ? "%/" : "%", i + 1)) {
    if (path[i] == '%') {
      // Nothing before `i` changes, so what would be written is path[0, i).
      if (DecodedAfter(path, i, path.substr(0, i)) != 0) return true;
    } else if (i + 1 < path.size() && path[i + 1] == '/') {
      return true;
    }
  }
  return false;
}

void NormalizePath(std::string_view path, bool merge_slashes, std::string& out) {
  const std::size_t start = out.size();
  out.reserve(out.size() + path.size());
  bool after_slash = false;
  for (std::size_t i = 0; i < path.size();) {
    const char c = path[i];
    if (c == '%') {
      if (const char decoded = DecodedAfter(path, i, std::string_view(out).substr(start))) {
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

StatusOr<std::string> PercentDecode(std::string_view text) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    const bool complete = i + 2 < text.size();
    const int hi = complete ? hex(text[i + 1]) : -1;
    const int lo = complete ? hex(text[i + 2]) : -1;
    if (hi < 0 || lo < 0) {
      return InvalidArgumentError("malformed percent-encoding at offset " + std::to_string(i));
    }
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

namespace {

bool IsDotSegment(std::string_view seg) {
  // ".", "..", "%2e", "%2E", ".%2e", "%2e%2e", ..., also with parameters
  // ("..;x", "%2e%2e;x"): Tomcat and Spring cut a segment's ";parameters"
  // before resolving dot segments, so "/x/..;/pay" is "/pay" to them. An
  // encoded ';' ("%3B") ends the dots too, for servers that decode first.
  auto is_escape = [&seg](std::size_t i, char hi, char lo) {
    return i + 3 <= seg.size() && seg[i] == '%' && seg[i + 1] == hi && LowerAscii(seg[i + 2]) == lo;
  };
  std::size_t dots = 0;
  std::size_t i = 0;
  while (i < seg.size()) {
    if (seg[i] == '.') {
      ++dots;
      ++i;
    } else if (is_escape(i, '2', 'e')) {
      ++dots;
      i += 3;
    } else if (seg[i] == ';' || is_escape(i, '3', 'b')) {
      break;
    } else {
      return false;
    }
  }
  return dots == 1 || dots == 2;
}

}  // namespace

bool HasDotSegment(std::string_view path) {
  std::size_t start = 0;
  while (start < path.size()) {
    if (path[start] == '/') {
      ++start;
      continue;
    }
    std::size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    if (IsDotSegment(path.substr(start, end - start))) return true;
    start = end + 1;
  }
  return false;
}

}  // namespace idemgate
