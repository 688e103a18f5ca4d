#include "client/client.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/json/parse.hpp>
#include <boost/url/parse.hpp>
#include <boost/url/url_view.hpp>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <system_error>
#include <thread>

#include "client/lookup.h"
#include "client/quote.h"
#include "common/ascii.h"
#include "common/text.h"
#include "common/tls_peer.h"

// One HTTP/1.1 exchange over TCP or TLS (SendOnce) and the Response accessors.
namespace idemgate::client {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

constexpr std::uint32_t kMaxResponseHeader = 1024 * 1024;
// Unparsed bytes allowed beyond a full header block: one read's worth.
constexpr std::uint32_t kMaxPendingFraming = 64 * 1024;

// What a method or header name must be, for the messages refusing one.
constexpr std::string_view kTokenRule = "a token (letters, digits and !#$%&'*+-.^_`|~; no spaces)";

// Fields that frame the message or belong to one connection (RFC 9110
// §7.6.1, RFC 9112 §6): named as the key header, the key would be sent in a
// second Host or Content-Length line, or as Transfer-Encoding, and the server
// would refuse the request (400) on every attempt. Compared ignoring case and
// '_' for '-', as the gateway compares header names it reserves.
constexpr std::string_view kReservedKeyHeaders[] = {"Host", "Content-Length", "Transfer-Encoding", "Connection",
                                                    "Keep-Alive", "TE", "Trailer", "Upgrade", "Expect",
                                                    "Proxy-Connection"};

// The longest header name or value a request can carry: Beast keeps each in
// 16-bit offsets (with 2 bytes of its own).
constexpr std::size_t kMaxFieldBytes = 65533;

bool HasHeader(const std::vector<Header>& headers, std::string_view name) {
  return std::any_of(headers.begin(), headers.end(), [&](const Header& h) { return EqualsIgnoreCaseAscii(h.first, name); });
}

// The key as an sf-string (RFC 8941 §3.3.3): quoted, with `\` and `"` escaped.
// Only printable ASCII can be carried.
StatusOr<std::string> SfString(std::string_view key) {
  std::string out = "\"";
  for (char c : key) {
    if (c < 0x20 || c > 0x7e) {
      return InvalidArgumentError("the key " + QuoteInput(key) +
                                  " has a byte an sf-string cannot carry (printable ASCII only)");
    }
    if (c == '\\' || c == '"') out += '\\';
    out += c;
  }
  out += '"';
  return out;
}

// Where an http:// or https:// URL points.
struct Target {
  bool tls = false;         // https
  std::string host;         // name or address, without IPv6 brackets
  std::uint16_t port = 80;  // 443 for https without a port
  std::string host_header;  // as in the URL: host[:port]
  std::string target;       // origin-form: /path[?query]
};

Status BadUrl(std::string_view url, std::string_view why) {
  return InvalidArgumentError("bad URL " + QuoteInput(RedactUrl(url)) + ": " + std::string(why));
}

// Why `url` cannot be a URI as written (RFC 3986 has no place for these
// bytes unencoded), naming the first such byte and its offset; "" when it
// has none.
std::string UnencodedByte(std::string_view url) {
  for (std::size_t i = 0; i < url.size(); ++i) {
    const auto u = static_cast<unsigned char>(url[i]);
    const std::string at = " at offset " + std::to_string(i);
    if (u == ' ') return "it contains a space" + at + " (write it as %20)";
    if (u < 0x20 || u == 0x7f) return "it contains a control character" + at;
    if (u > 0x7f) return "it contains a non-ASCII byte" + at + " (percent-encode it)";
    if (std::string_view("\"<>\\^`{|}").find(url[i]) != std::string_view::npos) {
      return "it contains '" + std::string(1, url[i]) + "'" + at + " (percent-encode it)";
    }
  }
  return "";
}

StatusOr<Target> ParseUrl(std::string_view url) {
  if (const std::string why = UnencodedByte(url); !why.empty()) return BadUrl(url, why);
  const auto parsed = boost::urls::parse_uri(url);
  // Boost.URL's reasons ("leftover", "mismatch") do not help here.
  if (!parsed) return BadUrl(url, "not an absolute http:// or https:// URL");
  const boost::urls::url_view& u = *parsed;
  const bool tls = EqualsIgnoreCaseAscii(u.scheme(), "https");
  if (!tls && !EqualsIgnoreCaseAscii(u.scheme(), "http")) {
    return BadUrl(url, "only http:// and https:// are supported");
  }
  if (!u.has_authority() || u.has_userinfo()) return BadUrl(url, "needs a host and no user info");
  Target t;
  t.tls = tls;
  if (tls) t.port = 443;
  switch (u.host_type()) {
    case boost::urls::host_type::name:
      t.host = u.host_address();
      break;
    case boost::urls::host_type::ipv4:
    case boost::urls::host_type::ipv6:
      t.host = std::string(u.encoded_host_address());
      break;
    default:
      break;
  }
  if (t.host.empty()) return BadUrl(url, "no usable host");
  t.host_header = std::string(u.encoded_host());
  if (u.has_port() && !u.port().empty()) {
    // Parsed here: url_view::port_number() wraps values above 65535.
    const std::string_view digits = u.port();
    unsigned long port = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
    if (ec != std::errc() || end != digits.data() + digits.size() || port == 0 || port > 65535) {
      return BadUrl(url, "bad port");
    }
    t.port = static_cast<std::uint16_t>(port);
    t.host_header += ":" + std::string(digits);
  }
  t.target = u.encoded_path().empty() ? "/" : std::string(u.encoded_path());
  if (u.has_query()) t.target += "?" + std::string(u.encoded_query());
  return t;
}

// Methods whose requests carry no content unless a body is given, so no
// "Content-Length: 0" is sent for them (RFC 9110 §8.6).
bool MethodWithoutContent(std::string_view method) {
  return method == "GET" || method == "HEAD" || method == "DELETE" || method == "OPTIONS" || method == "TRACE";
}

// The request as it goes on the wire: the given headers in order (the key
// header excepted), then Host, Content-Length, Connection and the key.
StatusOr<http::request<http::string_body>> BuildRequest(const Request& request, const Target& target) {
  if (!IsToken(request.method)) {
    return InvalidArgumentError("bad method " + QuoteInput(request.method) + ": a method is " +
                                std::string(kTokenRule));
  }
  for (std::string_view reserved : kReservedKeyHeaders) {
    if (EqualsIgnoreCaseDashOrUnderscore(request.key_header, reserved)) {
      return InvalidArgumentError("key header " + request.key_header + ": " + std::string(reserved) +
                                  " frames the request or belongs to its connection, so the key cannot be sent in "
                                  "it (the server would refuse the request); name another (e.g. Idempotency-Key)");
    }
  }
  for (const auto& [name, value] : request.headers) {
    if (!IsToken(name)) {
      return InvalidArgumentError("bad header name " + QuoteInput(name) + ": a header name is " +
                                  std::string(kTokenRule));
    }
    if (name.size() > kMaxFieldBytes) {
      return InvalidArgumentError("header name " + QuoteInput(name.substr(0, 40)) + "... is " +
                                  std::to_string(name.size()) + " bytes long (at most " +
                                  std::to_string(kMaxFieldBytes) + ")");
    }
    if (value.size() > kMaxFieldBytes) {
      return InvalidArgumentError("header " + name + " has a value of " + std::to_string(value.size()) +
                                  " bytes (at most " + std::to_string(kMaxFieldBytes) + ")");
    }
    if (const std::size_t at = FieldControlCharacterAt(value); at != std::string_view::npos) {
      return InvalidArgumentError("header " + name + " has a control character in its value (" +
                                  QuoteInput(value.substr(at, 1)) + " at offset " + std::to_string(at) +
                                  "; only a tab is allowed)");
    }
    if (EqualsIgnoreCaseAscii(name, "Transfer-Encoding")) return InvalidArgumentError("Transfer-Encoding is not supported");
    if (EqualsIgnoreCaseAscii(name, "Content-Length") && value != std::to_string(request.body.size())) {
      return InvalidArgumentError("Content-Length " + value + " does not match the body's " +
                                  std::to_string(request.body.size()) + " bytes");
    }
    // Not a line of the key header, so it gives no key: a new one would be
    // sent on every run, and the gateway drops such a line (CGI-style
    // upstreams would read it as the key header), so every run would execute.
    if (!request.key_header.empty() && !EqualsIgnoreCaseAscii(name, request.key_header) &&
        EqualsIgnoreCaseDashOrUnderscore(name, request.key_header)) {
      return InvalidArgumentError("header " + name + " differs from the key header " + request.key_header +
                                  " only by '_' for '-': it is not taken as the key (the gateway drops such a "
                                  "line); spell it " + request.key_header);
    }
  }
  auto key = RequestKey(request);
  if (!key.ok()) return key.status();
  std::string key_value;
  if (!key->empty()) {
    if (!IsToken(request.key_header)) {
      return InvalidArgumentError("bad key header name " + QuoteInput(request.key_header) + ": a header name is " +
                                  std::string(kTokenRule));
    }
    if (request.key_header.size() > kMaxFieldBytes) {
      return InvalidArgumentError("the key header name is " + std::to_string(request.key_header.size()) +
                                  " bytes long (at most " + std::to_string(kMaxFieldBytes) + ")");
    }
    auto sf = SfString(*key);
    if (!sf.ok()) return sf.status();
    key_value = std::move(*sf);
    if (key_value.size() > kMaxFieldBytes) {
      return InvalidArgumentError("the key is " + std::to_string(key->size()) + " bytes long (as an sf-string, in " +
                                  request.key_header + ", at most " + std::to_string(kMaxFieldBytes) + " bytes)");
    }
  }
  if (target.host_header.size() > kMaxFieldBytes) {
    return InvalidArgumentError("the URL's host is " + std::to_string(target.host_header.size()) +
                                " bytes long (at most " + std::to_string(kMaxFieldBytes) + " in the Host header)");
  }
  http::request<http::string_body> req;
  req.version(11);
  req.method_string(request.method);
  req.target(target.target);
  for (const auto& [name, value] : request.headers) {
    if (!key->empty() && EqualsIgnoreCaseAscii(name, request.key_header)) continue;  // the key header is ours
    req.insert(name, value);
  }
  if (!HasHeader(request.headers, "Host")) req.insert(http::field::host, target.host_header);
  if (!HasHeader(request.headers, "Content-Length") &&
      (!request.body.empty() || !MethodWithoutContent(request.method))) {
    req.insert(http::field::content_length, std::to_string(request.body.size()));
  }
  if (!HasHeader(request.headers, "Connection")) req.insert(http::field::connection, "close");
  if (!key->empty()) req.insert(request.key_header, key_value);
  // The message as it would go out, the key's line included: one Host and at
  // most one Content-Length (RFC 9112 §3.2, §6.3: a server answers 400).
  if (req.count(http::field::host) > 1) {
    return InvalidArgumentError("two Host headers (a server must refuse such a request)");
  }
  if (req.count(http::field::content_length) > 1) {
    return InvalidArgumentError("two Content-Length headers (a server must refuse such a request)");
  }
  req.body() = request.body;
  return req;
}

// Runs one exchange's asynchronous operations, one at a time, on its
// private io_context. With an Interruption, its pipe is watched meanwhile:
// once it is readable the connection is closed, so the operation in progress
// ends (operation_aborted) and every later one fails at once.
class Runner {
 public:
  Runner(asio::io_context& io, const Interruption* interruption) : io_(io) {
    if (interruption == nullptr || interruption->fd() < 0) return;
    const int fd = ::dup(interruption->fd());  // the descriptor object closes its own
    if (fd >= 0) watch_.emplace(io_, fd);
  }

  // Starts one operation on `connection` (the stream's lowest layer) via
  // `start(handler)` and runs until it completes: the stream's expiry bounds
  // it, and the interruption cuts it short.
  template <typename Start>
  beast::error_code Run(beast::tcp_stream& connection, Start&& start) {
    if (cut_) return asio::error::operation_aborted;
    beast::error_code result = asio::error::operation_aborted;
    bool done = false;
    start([this, &result, &done](beast::error_code ec, auto&&...) {
      result = ec;
      done = true;
      if (watch_) {
        beast::error_code ignored;
        watch_->cancel(ignored);
      }
    });
    if (watch_) {
      watch_->async_wait(asio::posix::descriptor_base::wait_read, [this, &done, &connection](beast::error_code ec) {
        if (ec || done) return;
        cut_ = true;
        connection.close();
      });
    }
    io_.restart();
    io_.run();
    return result;
  }

  // True when the interruption cut the operation that ended with `ec` (one
  // that completed all the same stands).
  bool Cut(const beast::error_code& ec) const { return cut_ && ec; }

 private:
  asio::io_context& io_;
  std::optional<asio::posix::stream_descriptor> watch_;
  bool cut_ = false;
};

Status Interrupted(std::string_view step, const std::string& where) {
  return AbortedError("interrupted " + std::string(step) + " " + where);
}

// The lookup SendOnce uses (ReplaceLookupForTesting); empty: SystemLookup.
std::mutex g_lookup_mu;
internal::Lookup g_lookup;

internal::Lookup CurrentLookup() {
  std::lock_guard lock(g_lookup_mu);
  return g_lookup ? g_lookup : internal::Lookup(internal::SystemLookup);
}

// One lookup on its own thread, shared with it: whichever side is last
// closes the pipe on which the thread says it is done.
struct PendingLookup {
  std::mutex mu;
  std::optional<StatusOr<internal::Endpoints>> result;
  int done_read = -1;
  int done_write = -1;
  ~PendingLookup() {
    if (done_read >= 0) ::close(done_read);
    if (done_write >= 0) ::close(done_write);
  }
};

// Looks `host` up on a thread of its own and waits for it until `deadline`
// (DeadlineExceeded) or until `interruption` is triggered (Aborted),
// whichever comes first; a lookup given up on is left to finish on its own.
StatusOr<internal::Endpoints> ResolveWithin(const std::string& host, std::uint16_t port,
                                            std::chrono::steady_clock::time_point deadline,
                                            const Interruption* interruption, const std::string& where,
                                            const std::string& after) {
  auto pending = std::make_shared<PendingLookup>();
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    return UnavailableError("cannot resolve " + host + ": " + std::generic_category().message(errno));
  }
  pending->done_read = fds[0];
  pending->done_write = fds[1];
  try {
    std::thread([pending, lookup = CurrentLookup(), host, port]() {
      StatusOr<internal::Endpoints> found = UnavailableError("cannot resolve " + host);
      try {
        found = lookup(host, port);
      } catch (const std::exception& e) {
        found = UnavailableError("cannot resolve " + host + ": " + e.what());
      }
      {
        std::lock_guard lock(pending->mu);
        pending->result = std::move(found);
      }
      (void)!::write(pending->done_write, "x", 1);
    }).detach();
  } catch (const std::system_error& e) {
    return UnavailableError("cannot resolve " + host + ": no thread for the lookup (" + e.what() + ")");
  }
  const int stop = interruption != nullptr ? interruption->fd() : -1;
  for (;;) {
    if (interruption != nullptr && interruption->triggered()) return Interrupted("while resolving", where);
    {
      std::lock_guard lock(pending->mu);
      if (pending->result) return std::move(*pending->result);
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return DeadlineExceededError("timed out" + after + " resolving " + host);
    // In steps that fit poll's int milliseconds; without the interruption's
    // pipe, short ones, so that a trigger is still seen soon.
    const auto left = std::chrono::ceil<Millis>(deadline - now).count();
    const std::int64_t longest = stop >= 0 || interruption == nullptr ? 1'000'000 : 20;
    const int step = static_cast<int>(std::min<std::int64_t>(left, longest));
    pollfd watched[2] = {{.fd = pending->done_read, .events = POLLIN, .revents = 0},
                         {.fd = stop, .events = POLLIN, .revents = 0}};
    (void)::poll(watched, stop >= 0 ? 2 : 1, step);  // EINTR: the loop looks again
  }
}

// An error's text; for OpenSSL's errors only the reason ("certificate
// verify failed"), without Asio's " (SSL routines)" suffix.
std::string ErrorText(const beast::error_code& ec) {
  if (ec.category() == asio::error::get_ssl_category()) {
    if (const char* reason = ERR_reason_error_string(static_cast<unsigned long>(ec.value())); reason != nullptr) {
      return reason;
    }
  }
  return ec.message();
}

// InvalidArgument naming `file` (`what` it is) when it cannot be opened for reading.
Status CheckReadable(const std::string& file, std::string_view what) {
  std::FILE* f = std::fopen(file.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    return InvalidArgumentError("cannot read the TLS " + std::string(what) + " \"" + file + "\": " +
                                std::generic_category().message(err));
  }
  std::fclose(f);
  return Status::Ok();
}

// True when `file` holds a PEM private key under a passphrase (PKCS#8
// "ENCRYPTED PRIVATE KEY", or a traditional key with "Proc-Type: 4,ENCRYPTED").
bool IsEncryptedPem(const std::string& file) {
  std::FILE* f = std::fopen(file.c_str(), "rb");
  if (f == nullptr) return false;
  std::string text;
  char buf[4096];
  while (text.size() < (1u << 20)) {
    const std::size_t n = std::fread(buf, 1, sizeof buf, f);
    if (n == 0) break;
    text.append(buf, n);
  }
  std::fclose(f);
  return text.find("-----BEGIN ENCRYPTED PRIVATE KEY-----") != std::string::npos ||
         text.find("Proc-Type: 4,ENCRYPTED") != std::string::npos;
}

// A client context for `tls`: TLS 1.2 at least, the peer always verified
// against ca_file (or the system's trust store), and the client certificate
// when one is given. A file that cannot be used is an InvalidArgument naming it.
// Every certificate in ca_file is a trust anchor (X509_V_FLAG_PARTIAL_CHAIN):
// a file holding only an intermediate CA trusts what it signed.
Status ConfigureTls(ssl::context& ctx, const TlsSettings& tls) {
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return InvalidArgumentError("a TLS client certificate needs both a certificate file and a key file");
  }
  beast::error_code ec;
  if (SSL_CTX_set_min_proto_version(ctx.native_handle(), TLS1_2_VERSION) != 1) {
    return InternalError("cannot set the minimum TLS version");
  }
  ctx.set_verify_mode(ssl::verify_peer, ec);
  if (ec) return InternalError("cannot enable TLS peer verification: " + ErrorText(ec));
  if (tls.ca_file.empty()) {
    ctx.set_default_verify_paths(ec);
    if (ec) return FailedPreconditionError("cannot load the system's TLS trust store: " + ErrorText(ec));
  } else {
    if (Status s = CheckReadable(tls.ca_file, "CA file"); !s.ok()) return s;
    ctx.load_verify_file(tls.ca_file, ec);
    if (ec) {
      return InvalidArgumentError("cannot load the TLS CA file \"" + tls.ca_file + "\": " + ErrorText(ec));
    }
    X509_STORE_set_flags(SSL_CTX_get_cert_store(ctx.native_handle()), X509_V_FLAG_PARTIAL_CHAIN);
  }
  if (!tls.cert_file.empty()) {
    if (Status s = CheckReadable(tls.cert_file, "client certificate file"); !s.ok()) return s;
    if (Status s = CheckReadable(tls.key_file, "client key file"); !s.ok()) return s;
    ctx.use_certificate_chain_file(tls.cert_file, ec);
    if (ec) {
      return InvalidArgumentError("cannot load the TLS client certificate file \"" + tls.cert_file +
                                  "\": " + ErrorText(ec));
    }
    // Never ask for a passphrase: OpenSSL's default would prompt on the
    // terminal (and wait there), or fail without one with a bare
    // "processing error". An encrypted key fails to load instead.
    SSL_CTX_set_default_passwd_cb(ctx.native_handle(), [](char*, int, int, void*) { return 0; });
    ctx.use_private_key_file(tls.key_file, ssl::context::pem, ec);
    if (ec && IsEncryptedPem(tls.key_file)) {
      ERR_clear_error();
      return InvalidArgumentError("the TLS client key file \"" + tls.key_file +
                                  "\" is encrypted; a passphrase-protected key is not supported (write it "
                                  "unencrypted, e.g. `openssl pkey -in KEY -out KEY.plain`, readable only by you)");
    }
    if (ec) {
      return InvalidArgumentError("cannot load the TLS client key file \"" + tls.key_file + "\": " +
                                  ErrorText(ec));
    }
    if (SSL_CTX_check_private_key(ctx.native_handle()) != 1) {
      ERR_clear_error();
      return InvalidArgumentError("the TLS client key file \"" + tls.key_file +
                                  "\" does not match the certificate in \"" + tls.cert_file + "\"");
    }
  }
  return Status::Ok();
}

// Writes the request and reads the response on a connected (and, for TLS,
// handshaken) `stream`: beast::tcp_stream or beast::ssl_stream over one,
// whose expiry bounds every step.
template <typename Stream>
StatusOr<Response> Converse(Runner& runner, Stream& stream, http::request<http::string_body>& req,
                            std::uint64_t max_body,
                            bool head, const std::string& where, const std::string& after) {
  beast::error_code ec = runner.Run(beast::get_lowest_layer(stream),
                                    [&](auto handler) { http::async_write(stream, req, std::move(handler)); });
  if (runner.Cut(ec)) return Interrupted("while sending to", where);
  if (ec == beast::error::timeout) return DeadlineExceededError("timed out" + after + " sending to " + where);
  if (ec) return UnavailableError("cannot send to " + where + ": " + ErrorText(ec));

  // Bounded: the parser limits the header block and the body, but not a
  // chunk-size line (with its extensions) or the trailer section, whose
  // bytes wait here until their line ends.
  beast::flat_buffer buffer(kMaxResponseHeader + kMaxPendingFraming);
  for (;;) {
    http::response_parser<http::string_body> parser;
    parser.header_limit(kMaxResponseHeader);
    parser.body_limit(max_body);
    if (head) parser.skip(true);
    ec = runner.Run(beast::get_lowest_layer(stream),
                    [&](auto handler) { http::async_read(stream, buffer, parser, std::move(handler)); });
    if (runner.Cut(ec)) return Interrupted("while waiting for the response from", where);
    if (ec == ssl::error::stream_truncated) {
      // The server closed the TCP connection without a TLS close_notify:
      // taken as a plain end of stream, so a body delimited by the close is
      // complete and anything else is cut short.
      if (!parser.got_some()) {
        ec = http::error::end_of_stream;
      } else if (parser.is_header_done() && !parser.is_done()) {
        parser.put_eof(ec);
      }
    }
    if (ec == beast::error::timeout) {
      return DeadlineExceededError("timed out" + after + " waiting for the response from " + where);
    }
    if (ec == http::error::end_of_stream) {
      return UnavailableError("connection closed by " + where + " before a response");
    }
    if (ec == http::error::body_limit) {
      return ResourceExhaustedError("response from " + where + " over " + std::to_string(max_body) + " bytes");
    }
    if (ec) return UnavailableError("cannot read the response from " + where + ": " + ErrorText(ec));
    auto& message = parser.get();
    const int status = static_cast<int>(message.result_int());
    if (status >= 100 && status < 200 && status != 101) continue;  // an interim response
    Response response;
    response.status = status;
    response.reason = std::string(message.reason());
    for (const auto& field : message) {
      response.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    }
    response.body = std::move(message.body());
    // Connection: close, so no TLS close_notify is waited for.
    beast::get_lowest_layer(stream).socket().shutdown(tcp::socket::shutdown_both, ec);
    return response;
  }
}

// The one exchange behind SendOnce; may throw (allocation, Beast internals).
StatusOr<Response> Exchange(const Request& request, Millis timeout, const TlsSettings& tls,
                            const Interruption* interruption) {
  if (timeout < Millis{1}) {
    // An attempt that must end before it starts could only time out.
    return InvalidArgumentError("timeout " + std::to_string(timeout.count()) + " ms: it must be at least 1 ms");
  }
  auto target = ParseUrl(request.url);
  if (!target.ok()) return target.status();
  auto req = BuildRequest(request, *target);
  if (!req.ok()) return req.status();
  // The TLS files are read before anything goes on the network.
  std::optional<ssl::context> ctx;
  if (target->tls) {
    ctx.emplace(ssl::context::tls_client);
    if (Status s = ConfigureTls(*ctx, tls); !s.ok()) return s;
  }
  const std::string where = target->host + ":" + std::to_string(target->port);
  const std::string after = " after " + std::to_string(timeout.count()) + " ms";
  // Saturated: a timeout too long for the clock (centuries) means no deadline, not one in the past.
  const auto now = std::chrono::steady_clock::now();
  const auto room = std::chrono::floor<Millis>(std::chrono::steady_clock::time_point::max() - now);
  const auto deadline = timeout >= room ? std::chrono::steady_clock::time_point::max() : now + timeout;
  const bool head = request.method == "HEAD";

  if (interruption != nullptr && interruption->triggered()) return Interrupted("before connecting to", where);
  asio::io_context io;
  Runner runner(io, interruption);
  beast::error_code ec;
  std::vector<tcp::endpoint> endpoints;
  const auto address = asio::ip::make_address(target->host, ec);
  if (!ec) {
    endpoints.emplace_back(address, target->port);
  } else {
    // Bounded by the attempt's deadline and cut by the interruption, like
    // every later step: the system resolver's own timeouts can be far longer.
    auto resolved = ResolveWithin(target->host, target->port, deadline, interruption, where, after);
    if (!resolved.ok()) return resolved.status();
    endpoints = std::move(*resolved);
    if (endpoints.empty()) return UnavailableError("cannot resolve " + target->host + ": no address");
  }

  beast::tcp_stream stream(io);
  stream.expires_at(deadline);
  ec = runner.Run(stream, [&](auto handler) { stream.async_connect(endpoints, std::move(handler)); });
  if (runner.Cut(ec)) return Interrupted("while connecting to", where);
  if (ec == beast::error::timeout) return DeadlineExceededError("timed out" + after + " connecting to " + where);
  if (ec == asio::error::connection_refused) return UnavailableError("connection refused by " + where);
  if (ec) return UnavailableError("cannot connect to " + where + ": " + ec.message());
  if (!target->tls) return Converse(runner, stream, *req, request.max_response_bytes, head, where, after);

  // The handshake is bounded by the same deadline as the rest of the attempt.
  beast::ssl_stream<beast::tcp_stream> tls_stream(std::move(stream), *ctx);
  beast::get_lowest_layer(tls_stream).expires_at(deadline);
  if (!SetTlsPeerName(tls_stream.native_handle(), target->host)) {
    return InvalidArgumentError("cannot use \"" + target->host + "\" as a TLS server name");
  }
  ec = runner.Run(beast::get_lowest_layer(tls_stream),
                  [&](auto handler) { tls_stream.async_handshake(ssl::stream_base::client, std::move(handler)); });
  if (runner.Cut(ec)) return Interrupted("in the TLS handshake with", where);
  if (ec == beast::error::timeout) {
    return DeadlineExceededError("timed out" + after + " in the TLS handshake with " + where);
  }
  if (ec) {
    const std::string why = ErrorText(ec) + TlsVerifyVerdict(tls_stream.native_handle());
    ERR_clear_error();
    return UnavailableError("TLS handshake with " + where + " failed: " + why);
  }
  return Converse(runner, tls_stream, *req, request.max_response_bytes, head, where, after);
}

}  // namespace

namespace internal {

StatusOr<Endpoints> SystemLookup(const std::string& host, std::uint16_t port) {
  asio::io_context io;
  tcp::resolver resolver(io);
  beast::error_code ec;
  const auto results = resolver.resolve(host, std::to_string(port), ec);
  if (ec) return UnavailableError("cannot resolve " + host + ": " + ec.message());
  Endpoints endpoints;
  for (const auto& entry : results) endpoints.push_back(entry.endpoint());
  return endpoints;
}

Lookup ReplaceLookupForTesting(Lookup lookup) {
  std::lock_guard lock(g_lookup_mu);
  std::swap(g_lookup, lookup);
  return lookup;
}

}  // namespace internal

// First value of `name`, compared case-insensitively.
std::optional<std::string> Response::Header(std::string_view name) const {
  for (const auto& [field, value] : headers) {
    if (EqualsIgnoreCaseAscii(field, name)) return value;
  }
  return std::nullopt;
}

// The string `code` member of an application/problem+json body.
std::string Response::ProblemCode() const {
  const auto content_type = Header("Content-Type");
  if (!content_type) return "";
  std::string_view media = *content_type;
  media = media.substr(0, media.find(';'));
  while (!media.empty() && (media.back() == ' ' || media.back() == '\t')) media.remove_suffix(1);
  while (!media.empty() && (media.front() == ' ' || media.front() == '\t')) media.remove_prefix(1);
  if (!EqualsIgnoreCaseAscii(media, "application/problem+json")) return "";
  try {
    boost::system::error_code ec;
    const boost::json::value json = boost::json::parse(body, ec);
    if (ec || !json.is_object()) return "";
    const auto* code = json.as_object().if_contains("code");
    if (code == nullptr || !code->is_string()) return "";
    return std::string(code->as_string());
  } catch (const std::exception&) {
    return "";
  }
}

// An sf-string ("abc"; only \\ and \" escaped, nothing after it) or the bare key.
StatusOr<std::string> KeyFromHeaderValue(std::string_view value) {
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
  if (value.empty() || value.front() != '"') return std::string(value);
  std::string key;
  for (std::size_t i = 1; i < value.size(); ++i) {
    char c = value[i];
    if (c == '"') {
      if (i + 1 != value.size()) return InvalidArgumentError("nothing may follow the quoted key (no parameters)");
      return key;
    }
    if (c == '\\') {
      if (i + 1 == value.size() || (value[i + 1] != '"' && value[i + 1] != '\\')) {
        return InvalidArgumentError("a backslash in a quoted key escapes only \" or \\");
      }
      c = value[++i];
    }
    key += c;
  }
  return InvalidArgumentError("the quoted key has no closing quote");
}

// `key`, else the key of the one line of the key header; the lines checked either way.
StatusOr<std::string> RequestKey(const Request& request) {
  const Header* line = nullptr;
  for (const Header& header : request.headers) {
    if (request.key_header.empty() || !EqualsIgnoreCaseAscii(header.first, request.key_header)) continue;
    if (line != nullptr) return InvalidArgumentError("two " + request.key_header + " headers (give the key once)");
    line = &header;
  }
  if (line == nullptr) return request.key;
  auto key = KeyFromHeaderValue(line->second);
  if (!key.ok()) return InvalidArgumentError("header " + line->first + ": " + key.status().message());
  if (key->empty()) {
    return InvalidArgumentError("header " + line->first + ": the key is empty (leave the header out for a new key)");
  }
  if (!request.key.empty() && *key != request.key) {
    return InvalidArgumentError("the key " + QuoteInput(request.key) + " and the " + line->first + " header's key " +
                                QuoteInput(*key) + " differ (give the key once)");
  }
  return std::move(*key);
}

// The checks SendOnce makes before it connects, without connecting: the URL
// and the request as it would go on the wire.
Status ValidateRequest(const Request& request) {
  try {
    auto target = ParseUrl(request.url);
    if (!target.ok()) return target.status();
    auto req = BuildRequest(request, *target);
    return req.ok() ? Status::Ok() : req.status();
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("out of memory checking the request");
  } catch (const std::exception& e) {
    return InternalError(std::string("cannot check the request: ") + e.what());
  }
}

// Runs one exchange, turning anything thrown into an error Status.
StatusOr<Response> SendOnce(const Request& request, Millis timeout, const TlsSettings& tls,
                            const Interruption* interruption) {
  try {
    StatusOr<Response> result = Exchange(request, timeout, tls, interruption);
    if (!result.ok()) ERR_clear_error();  // leave no OpenSSL errors of ours to the caller's thread
    return result;
  } catch (const boost::system::system_error& e) {
    return UnavailableError(std::string("HTTP exchange failed: ") + e.what());
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("out of memory during the HTTP exchange");
  } catch (const std::exception& e) {
    return InternalError(std::string("HTTP exchange failed: ") + e.what());
  }
}

}  // namespace idemgate::client
