#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/request_path.h"

// Header helpers of the proxy (SPEC §2 step 7): hop-by-hop removal, the
// forwarding headers, request ids and W3C traceparent. Pure functions, no
// I/O, safe from any thread (random ids use a per-thread generator).
namespace idemgate::http {

// ASCII case-insensitive equality of header names.
bool NameEquals(std::string_view a, std::string_view b);

// True for the fields that never cross a proxy in either direction (RFC 9110
// §7.6.1 plus the usual extras): Connection, Keep-Alive, Proxy-Connection,
// TE, Trailer, Transfer-Encoding, Upgrade, Proxy-Authorization,
// Proxy-Authenticate. Transfer-Encoding is re-framed by the writer.
// Content-Length is not hop-by-hop.
bool IsHopByHop(std::string_view name);

// True for the client's forwarding fields, which never reach the upstream
// as sent: X-Forwarded-For, -Proto and -Host (the gateway writes its own),
// Forwarded (RFC 7239), X-Real-IP and X-Forwarded-Port, -Prefix, -Ssl and
// -Scheme (the gateway writes none of them), and
// those names spelled with '_' for '-' in any case (X_Forwarded_Host),
// which CGI-style upstreams (WSGI, Rack, PHP) read as the real field.
bool IsClientForwardingField(std::string_view name);

// Decides which fields of one message are dropped when forwarding: the
// hop-by-hop fields and every field named by a Connection header of that
// message. Feed it every Connection value first, then ask ShouldDrop for
// each field. Holds views into the Connection values, which must outlive it.
// No allocation for up to kInlineTokens named fields.
class HopByHopFilter {
 public:
  static constexpr std::size_t kInlineTokens = 8;

  // Adds the comma-separated tokens of one Connection header value
  // ("keep-alive, X-Foo"); empty elements and surrounding spaces are skipped.
  void AddConnectionValue(std::string_view value);
  // True when a field named `name` must not be forwarded.
  bool ShouldDrop(std::string_view name) const;
  // The field names collected from Connection values, in order.
  std::vector<std::string_view> tokens() const;

 private:
  std::array<std::string_view, kInlineTokens> inline_{};
  std::size_t inline_count_ = 0;
  std::vector<std::string_view> overflow_;
};

// The comma-separated elements of a list header value, trimmed, empty ones
// skipped ("a, ,b" -> {"a", "b"}).
std::vector<std::string_view> SplitList(std::string_view value);

// X-Forwarded-For for the upstream: the client's existing values (several
// header lines are joined with ", ") followed by `client_ip`.
std::string AppendForwardedFor(const std::vector<std::string_view>& existing, std::string_view client_ip);

// A client-sent X-Request-Id is passed on when it is 1..200 visible ASCII
// characters (0x21..0x7E); anything else is replaced by a generated one so
// that logs cannot be forged.
bool IsAcceptableRequestId(std::string_view value);
// 32 lower-case hex characters from 128 random bits.
std::string NewRequestId();
// The same, appended to `out` (no allocation once `out` has room).
void AppendNewRequestId(std::string& out);

// W3C Trace Context (https://www.w3.org/TR/trace-context/) traceparent:
// "00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>", lower-case hex,
// trace-id and parent-id not all zeros, version ff invalid. A higher version
// is accepted when it starts with a valid version-00 prefix followed by
// end-of-string or '-'.
bool IsValidTraceparent(std::string_view value);
// A fresh version-00 traceparent with random ids and the sampled flag unset.
std::string NewTraceparent();
// The trace-id part of a valid traceparent.
std::string_view TraceId(std::string_view traceparent);

// Appends `n` random lower-case hex characters (per-thread generator seeded
// from the OS; ids, not secrets).
void AppendRandomHex(std::size_t n, std::string& out);

// "Sun, 06 Nov 1994 08:49:37 GMT" for the current second, cached per thread.
std::string_view CurrentHttpDate();

// The result of splitting a request target.
struct TargetParts {
  std::string_view path;            // "/a/b"
  std::string_view query;           // "x=1" (without '?')
  std::string_view path_and_query;  // "/a/b?x=1", what is forwarded
  std::string_view authority;       // absolute-form only: "host:port"
};
// Splits an origin-form ("/a?b") or absolute-form ("http://h/a?b") target.
// nullopt for anything else (asterisk-form, authority-form, no leading '/').
// A fragment ('#...') is not allowed in a request target and rejected.
// An absolute-form target may have an empty path before its query
// ("http://h?q": path "", path_and_query "?q"), which stands for "/"; a
// caller forwarding it puts the '/' in front. The authority is not
// validated (IsValidHostValue).
std::optional<TargetParts> SplitTarget(std::string_view target);

// True when `value` is a valid Host field value (RFC 9110 section 7.2):
// uri-host [":" port], the host an IP-literal in brackets or a reg-name
// (RFC 3986 section 3.2.2), or empty (a target without an authority). A
// comma is refused although reg-name allows it: no DNS name has one, and
// many frameworks read the X-Forwarded-Host the value becomes as a list and
// take its first element, so the upstream would see two different hosts.
bool IsValidHostValue(std::string_view value);

// HasDotSegment: common/request_path.h.
using ::idemgate::HasDotSegment;

}  // namespace idemgate::http
