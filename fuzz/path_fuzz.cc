// Request path normalisation (PathNeedsNormalizing / NormalizePath), with and
// without merge_slashes; the whole input is the path. Checked, for both
// settings: the check agrees with the normaliser; normalising is idempotent
// and never lengthens; NormalizePath appends; and the normalised path means
// what the path as sent means to an upstream that percent-decodes once
// (slash runs merged first when asked), with the same literal '/' between
// segments. The last is what routing relies on: the upstream must act on the
// path the routes were matched against.

#include <string>
#include <string_view>

#include "common/request_path.h"
#include "fuzz_target.h"

namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Decodes every "%XX" once, leaving a '%' not followed by two hex digits as
// it is, as lenient HTTP servers do. Encoded bytes are marked so that an
// encoded '/' does not equal a literal one.
std::u16string DecodeOnce(std::string_view path) {
  std::u16string out;
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '%' && i + 2 < path.size() && HexValue(path[i + 1]) >= 0 && HexValue(path[i + 2]) >= 0) {
      const int byte = HexValue(path[i + 1]) * 16 + HexValue(path[i + 2]);
      // Unreserved characters mean the same encoded or not (RFC 3986
      // section 6.2.2.2); any other byte keeps a mark of its encoding.
      const bool unreserved = (byte >= 'a' && byte <= 'z') || (byte >= 'A' && byte <= 'Z') ||
                              (byte >= '0' && byte <= '9') || byte == '-' || byte == '.' || byte == '_' ||
                              byte == '~';
      out.push_back(static_cast<char16_t>(unreserved ? byte : 0x100 + byte));
      i += 2;
    } else {
      out.push_back(static_cast<char16_t>(static_cast<unsigned char>(path[i])));
    }
  }
  return out;
}

std::string MergeSlashes(std::string_view path) {
  std::string out;
  for (char c : path) {
    if (c == '/' && !out.empty() && out.back() == '/') continue;
    out.push_back(c);
  }
  return out;
}

void Check(std::string_view path, bool merge_slashes) {
  std::string normal;
  idemgate::NormalizePath(path, merge_slashes, normal);
  FUZZ_CHECK(idemgate::PathNeedsNormalizing(path, merge_slashes) == (normal != path));
  FUZZ_CHECK(normal.size() <= path.size());

  // Idempotent: what was routed is already in normal form.
  std::string again;
  idemgate::NormalizePath(normal, merge_slashes, again);
  FUZZ_CHECK(again == normal);
  FUZZ_CHECK(!idemgate::PathNeedsNormalizing(normal, merge_slashes));

  // Appends to what is there.
  std::string appended = "x/";
  idemgate::NormalizePath(path, merge_slashes, appended);
  FUZZ_CHECK(appended == "x/" + normal);

  // The same path for an upstream that decodes once.
  const std::string sent = merge_slashes ? MergeSlashes(path) : std::string(path);
  FUZZ_CHECK(DecodeOnce(normal) == DecodeOnce(sent));
  if (merge_slashes) FUZZ_CHECK(normal.find("//") == std::string::npos);
}

}  // namespace

IDEMGATE_FUZZ_TARGET(path) {
  const std::string_view path = idemgate::fuzz::AsView(data, size);
  Check(path, false);
  Check(path, true);
  return 0;
}
