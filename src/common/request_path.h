#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

// Request path normalisation, applied before routing so that spellings of
// one path that an upstream treats alike cannot reach it through another
// route (and so around a webhook route's signature check, a required key or
// an admission limit):
// - percent-encoded unreserved characters (ALPHA, DIGIT, '-', '.', '_', '~')
//   are decoded, which RFC 3986 section 6.2.2.2 makes equivalent;
// - with `merge_slashes`, runs of '/' become one, as nginx does.
// Other escapes ("%2F", "%20") are left as they are, and so is an escape of a
// hex digit that would complete a '%' before it into a new escape ("%%34%31"
// does not become "%41"). The gateway forwards the normalised path, so the
// upstream sees what was routed; normalising it again changes nothing.
namespace idemgate {

// True when NormalizePath would change `path`.
bool PathNeedsNormalizing(std::string_view path, bool merge_slashes);
// Appends the normalised `path` to `out`.
void NormalizePath(std::string_view path, bool merge_slashes, std::string& out);

// True when a path segment is "." or ".." (also percent-encoded, any case),
// or is one once its parameters are cut ("..;x", ".;x", "%2e%2e;x",
// "..%3Bx"), as Tomcat and Spring cut them: such paths are refused so a
// route prefix cannot be sidestepped.
bool HasDotSegment(std::string_view path);

// Decodes %XX escapes (either case); every other byte is kept as is ('+'
// stays '+'). InvalidArgument on a '%' not followed by two hex digits.
StatusOr<std::string> PercentDecode(std::string_view text);

}  // namespace idemgate
