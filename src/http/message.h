#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/fingerprint.h"
#include "core/record.h"

// Beast-free request and response types shared by the server, the proxy and
// the gateway pipeline.
namespace idemgate::http {

// One header line; repeated names (Set-Cookie) are separate entries.
using Header = core::Header;

// A response the gateway makes itself (a problem, a replay, an admin answer).
// Framing fields (Content-Length, Transfer-Encoding) and hop-by-hop fields in
// `headers` are ignored: the writer frames the body and manages Connection.
// The first Content-Length line only marks where the writer puts its own
// (after the other fields when there is none).
struct Response {
  int status = 200;
  std::vector<Header> headers;  // framing fields (Content-Length, ...) among them are ignored
  std::string body;
  // Sent as Content-Length instead of the body's size in answer to HEAD:
  // the length a GET would get (a replay of a recorded HEAD response).
  std::optional<std::uint64_t> head_length;
};

// One header line as parsed (views into the parser's storage).
using HeaderView = core::HeaderView;

// The head of one client request, as parsed. Views point into the parser's
// storage and stay valid until the exchange ends. The server reuses one
// RequestHead per connection, so building it costs no allocation after the
// first request.
struct RequestHead {
  std::string_view method;  // as sent, case-sensitive ("GET")
  // The method an X-HTTP-Method-Override, X-HTTP-Method or X-Method-Override
  // header names ("POST"); empty without one. Frameworks (Rails, Express,
  // Laravel, ASP.NET) run the request as that method, so routes and
  // idempotency go by it (effective_method()); the request is forwarded as sent.
  std::string_view method_override;
  std::string_view target;  // as sent: origin-form or absolute-form
  std::string_view path;    // the path of the target (absolute-form: without scheme and authority)
  std::string_view query;   // after '?', without it; empty when absent
  std::string_view path_and_query;  // origin-form of the target (what is forwarded), path normalised
                                    // (http::NormalizePath)
  std::string_view raw_path_and_query;  // the same as received, before normalising (what a sender signed)
  std::string_view authority;  // an absolute-form target's "host[:port]", which replaces Host (RFC 9112
                               // section 3.2.2); empty for origin-form
  int version = 11;         // 10 or 11
  std::vector<HeaderView> headers;  // wire order
  std::optional<std::uint64_t> content_length;
  bool chunked = false;          // Transfer-Encoding: chunked
  bool keep_alive = true;        // the client allows another request on the connection
  bool expect_continue = false;  // Expect: 100-continue
  std::string_view peer_ip;      // the client's address ("127.0.0.1", "::1")
  bool secure = false;           // the connection is TLS (a listener with `tls`)

  // The method routes, idempotency and the fingerprint go by: the override's, else `method`.
  std::string_view effective_method() const { return method_override.empty() ? method : method_override; }
  // True when the request has a body to read (chunked or Content-Length > 0).
  bool has_body() const { return chunked || (content_length && *content_length > 0); }
  // The first value of `name` (case-insensitive), if any.
  std::optional<std::string_view> Find(std::string_view name) const;
  // How many lines named `name` (case-insensitive) the request has.
  std::size_t Count(std::string_view name) const;
};

}  // namespace idemgate::http
