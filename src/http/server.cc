#include "http/server.h"

#include <poll.h>
#include <sys/socket.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/http/error.hpp>
#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "common/ascii.h"
#include "common/log.h"
#include "common/request_path.h"
#include "http/headers.h"
#include "http/internal/exchange_impl.h"
#include "http/internal/tls_io.h"

namespace idemgate::http {

using internal::asio::ip::tcp;
namespace asio = internal::asio;
namespace beast = internal::beast;
namespace bhttp = internal::bhttp;
using internal::error_code;
using internal::kTuple;

namespace {

// Above this, an idle connection's read buffer is given back.
constexpr std::size_t kKeepBufferBytes = 16 * 1024;
constexpr auto kLingerTime = std::chrono::seconds(2);
constexpr std::size_t kLingerBytes = 1024 * 1024;

bool IsClientGone(const error_code& ec) {
  return ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message || ec == asio::error::eof ||
         ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
         ec == asio::error::operation_aborted || ec == asio::error::bad_descriptor;
}

// True when the Transfer-Encoding values name `chunked` once and nothing
// else. The gateway decodes only the chunked framing: a request whose body
// also carries another coding ("gzip, chunked") would reach the upstream
// without it, its body changed, so it is refused like any unknown coding.
bool OnlyChunked(std::size_t* chunked_count, std::string_view value) {
  for (const std::string_view item : SplitList(value)) {
    if (!NameEquals(item, "chunked")) return false;
    ++*chunked_count;
  }
  return true;
}

// True for the names of the method override headers: X-HTTP-Method-Override,
// X-HTTP-Method and X-Method-Override, also spelt with '_' for '-', which
// CGI-style servers (Rack, PHP) read as the same header. Beast knows none of
// them, so only names it does not know are asked, and their length decides
// most at once.
bool IsMethodOverrideName(std::string_view name) {
  switch (name.size()) {
    case 13: return EqualsIgnoreCaseDashOrUnderscore(name, "x-http-method");
    case 17: return EqualsIgnoreCaseDashOrUnderscore(name, "x-method-override");
    case 22: return EqualsIgnoreCaseDashOrUnderscore(name, "x-http-method-override");
    default: return false;
  }
}

// A method an override header may name: a token (RFC 9110 section 5.6.2)
// without lower-case letters, as for the request line's, and not CONNECT.
// A list ("POST, PUT") is not one.
bool IsValidOverrideMethod(std::string_view method) {
  if (!IsToken(method) || method == "CONNECT") return false;
  return std::none_of(method.begin(), method.end(), [](char c) { return c >= 'a' && c <= 'z'; });
}

// Fills `head` from the parsed request. Returns false when the request is
// unacceptable (answered 400).
bool BuildHead(const bhttp::request_parser<bhttp::buffer_body>& parser, bool merge_slashes, RequestHead& head,
               std::string& normalized_target, std::string_view* why) {
  const auto& msg = parser.get();
  head.method = std::string_view(msg.method_string().data(), msg.method_string().size());
  head.target = std::string_view(msg.target().data(), msg.target().size());
  // HTTP/1.2 to HTTP/1.9 reach this as HTTP/1.1 (MendRequestVersion).
  head.version = msg.version() == 10 ? 10 : 11;
  // Methods are case-sensitive (RFC 9110 section 9.1), and so is route and
  // idempotency matching; an upstream that upper-cases them (Werkzeug,
  // Django) would run "post" as a POST that skipped both. Refused, as nginx
  // does.
  if (std::any_of(head.method.begin(), head.method.end(), [](char c) { return c >= 'a' && c <= 'z'; })) {
    *why = "a method with lower-case letters (methods are case-sensitive: POST, not post)";
    return false;
  }
  // CONNECT asks for a tunnel (RFC 9110 section 9.3.6), which the gateway
  // does not open; forwarded on a pooled connection, it could make an
  // upstream that is itself a proxy open one.
  if (head.method == "CONNECT") {
    *why = "CONNECT is not supported (the gateway opens no tunnels)";
    return false;
  }
  head.headers.clear();
  std::size_t hosts = 0;
  std::string_view host;
  bool has_transfer_encoding = false;
  bool transfer_encoding_ok = true;
  std::size_t chunked_codings = 0;
  head.expect_continue = false;
  head.method_override = {};
  std::size_t overrides = 0;
  bool overrides_disagree = false;
  for (const auto& f : msg) {
    const std::string_view name(f.name_string().data(), f.name_string().size());
    const std::string_view value(f.value().data(), f.value().size());
    head.headers.push_back({name, value});
    switch (f.name()) {
      case bhttp::field::host:
        ++hosts;
        host = value;
        break;
      case bhttp::field::transfer_encoding:
        has_transfer_encoding = true;
        transfer_encoding_ok = transfer_encoding_ok && OnlyChunked(&chunked_codings, value);
        break;
      case bhttp::field::expect:
        if (NameEquals(value, "100-continue")) head.expect_continue = true;
        break;
      case bhttp::field::unknown:
        if (IsMethodOverrideName(name)) {
          if (overrides++ == 0) {
            head.method_override = value;
          } else if (value != head.method_override) {
            overrides_disagree = true;
          }
        }
        break;
      default: break;
    }
  }
  head.chunked = parser.chunked();
  head.content_length.reset();
  if (auto cl = parser.content_length()) head.content_length = *cl;
  head.keep_alive = parser.keep_alive();
  if (head.version == 11 && hosts == 0) {
    *why = "missing Host header";
    return false;
  }
  // RFC 9112 section 3.2: more than one Host line, or an invalid value, is
  // a 400. Which of two hosts the request is for is not for the gateway to
  // guess: the upstream, a cache or a log could each pick another one.
  if (hosts > 1) {
    *why = "more than one Host header";
    return false;
  }
  if (hosts == 1 && !IsValidHostValue(host)) {
    *why = "invalid Host header";
    return false;
  }
  if (has_transfer_encoding && (!head.chunked || !transfer_encoding_ok || chunked_codings != 1)) {
    *why = "unsupported Transfer-Encoding";
    return false;
  }
  if (head.chunked && head.version == 10) {
    *why = "chunked coding in an HTTP/1.0 request";
    return false;
  }
  // The method an override header names is the one frameworks run (Rails,
  // Express, Laravel, ASP.NET), so routes and idempotency go by it; which of
  // two it is, or what a list or a lower-case name becomes, is theirs to
  // guess, not the gateway's.
  if (overrides_disagree) {
    *why = "method override headers (X-HTTP-Method-Override, X-HTTP-Method, X-Method-Override) that disagree";
    return false;
  }
  if (overrides > 0 && !IsValidOverrideMethod(head.method_override)) {
    *why = "an invalid method override (one upper-case method, not CONNECT)";
    return false;
  }
  auto parts = SplitTarget(head.target);
  if (!parts) {
    *why = "unsupported request target";
    return false;
  }
  head.path = parts->path;
  head.query = parts->query;
  head.path_and_query = parts->path_and_query;
  head.raw_path_and_query = parts->path_and_query;
  head.authority = parts->authority;
  if (head.authority.find('@') != std::string_view::npos) {
    *why = "user information in the request target";
    return false;
  }
  // The authority replaces Host (RFC 9112 section 3.2.2) and becomes the
  // upstream's Host and X-Forwarded-Host: the same rules as a Host value.
  if (!head.authority.empty() && !IsValidHostValue(head.authority)) {
    *why = "invalid authority in the request target";
    return false;
  }
  if (head.path.empty()) {
    // "http://h?q": an empty path is "/" (RFC 9110 section 4.2.3).
    normalized_target.assign("/");
    normalized_target.append(parts->path_and_query);
    head.path = std::string_view(normalized_target).substr(0, 1);
    head.path_and_query = normalized_target;
    head.raw_path_and_query = normalized_target;
    head.query = std::string_view(normalized_target).substr(2);
  }
  // RFC 3986 has no '\' in a path, and some upstreams read it as '/'
  // (to them "/reads\..\x" leaves the route it matched).
  if (head.path.find('\\') != std::string_view::npos) {
    *why = "a backslash in the path";
    return false;
  }
  if (PathNeedsNormalizing(head.path, merge_slashes)) {
    // Routing, the fingerprint and the upstream all see the normalised form.
    normalized_target.clear();
    NormalizePath(parts->path, merge_slashes, normalized_target);
    const std::size_t path_size = normalized_target.size();
    normalized_target.append(parts->path_and_query.substr(parts->path.size()));  // "?query", if any
    head.path = std::string_view(normalized_target).substr(0, path_size);
    head.path_and_query = normalized_target;
    if (!parts->query.empty()) head.query = std::string_view(normalized_target).substr(path_size + 1);
  }
  if (HasDotSegment(head.path)) {
    *why = "dot segments in the path";
    return false;
  }
  return true;
}

// One of Server::admitted_, held by a session from its accept to its end
// (also when its coroutine is destroyed without having run).
class AdmittedSlot {
 public:
  explicit AdmittedSlot(std::atomic<std::size_t>* count) : count_(count) {}
  AdmittedSlot(AdmittedSlot&& other) noexcept : count_(std::exchange(other.count_, nullptr)) {}
  AdmittedSlot& operator=(AdmittedSlot&&) = delete;
  ~AdmittedSlot() {
    if (count_ != nullptr) count_->fetch_sub(1, std::memory_order_relaxed);
  }

 private:
  std::atomic<std::size_t>* count_;
};

Task<void> Session(Worker& worker, tcp::socket socket, Handler& handler, std::shared_ptr<const TlsContext> tls,
                   AdmittedSlot /*slot*/) {
  internal::ClientConnection connection(worker, std::move(socket), handler, std::move(tls));
  co_await connection.Run();
}

Task<void> AcceptLoop(Worker& worker, internal::Listener& listener) {
  Worker::Impl& w = worker.impl();
  for (;;) {
    auto [ec, socket] = co_await listener.acceptor.async_accept(kTuple);
    if (ec) {
      if (ec == asio::error::operation_aborted || !listener.acceptor.is_open()) break;
      // Out of file descriptors or similar: back off instead of spinning.
      static LogLimiter limiter;
      LogWarn(limiter, "accept failed", {{"error", ec.message()}});
      asio::steady_timer timer(w.io, std::chrono::milliseconds(50));
      co_await timer.async_wait(kTuple);
      continue;
    }
    if (w.draining) {
      socket.close(ec);
      continue;
    }
    // Over limits.max_connections: closed at once, so that the client
    // learns it now and the accept queue keeps moving (a connection left in
    // it would wait for nothing, and one that is not taken from it would be
    // offered again at once).
    const std::size_t max_connections = w.limits.max_connections;
    if (w.admitted->fetch_add(1, std::memory_order_relaxed) >= max_connections && max_connections != 0) {
      w.admitted->fetch_sub(1, std::memory_order_relaxed);
      socket.close(ec);
      listener.handler->ConnectionRefused();
      static LogLimiter limiter;
      LogWarn(limiter, "connection refused: too many connections",
              {{"limit", w.limits.max_connections_name},
               {"max_connections", static_cast<std::uint64_t>(max_connections)}});
      continue;
    }
    AdmittedSlot slot(w.admitted);
    std::shared_ptr<const TlsContext> tls = listener.tls != nullptr ? listener.tls->Get() : nullptr;
    asio::co_spawn(w.io, Session(worker, std::move(socket), *listener.handler, std::move(tls), std::move(slot)),
                   asio::detached);
  }
}

}  // namespace

namespace internal {

void CancelSocket(void* socket) {
  error_code ec;
  static_cast<tcp::socket*>(socket)->cancel(ec);
}

BodyStatus BodyStatusFor(const error_code& ec, bool deadline_fired) {
  if (deadline_fired) return BodyStatus::kClientGone;
  if (ec == bhttp::error::body_limit) return BodyStatus::kTooLarge;
  if (IsClientGone(ec)) return BodyStatus::kClientGone;
  if (ec.category() == bhttp::make_error_code(bhttp::error::bad_chunk).category()) return BodyStatus::kMalformed;
  return BodyStatus::kClientGone;
}

ClientConnection::ClientConnection(Worker& worker_ref, tcp::socket s, Handler& h, std::shared_ptr<const TlsContext> t)
    : worker(worker_ref),
      w(worker_ref.impl()),
      socket(std::move(s)),
      tls_context(std::move(t)),
      deadline(w.watchdog, &CancelSocket, &socket),
      handler(h) {
  w.sessions.Add(this);
  w.connections.fetch_add(1, std::memory_order_relaxed);
  error_code ec;
  socket.non_blocking(true, ec);
  socket.set_option(tcp::no_delay(true), ec);
  EnableReceiveQueueHint(socket);
  const auto remote = socket.remote_endpoint(ec);
  if (!ec) peer_ip = remote.address().to_string();
}

ClientConnection::~ClientConnection() {
  w.sessions.Remove(this);
  w.connections.fetch_sub(1, std::memory_order_relaxed);
}

void ClientConnection::OnDrain() {
  if (idle) CancelSocket(&socket);
}

Task<bool> ClientConnection::WriteResponse(Response response, int version, bool head_only, bool close) {
  close = close || must_close || w.draining;
  const bool bodiless = response.status / 100 == 1 || response.status == 204 || response.status == 304;
  head_out.clear();
  AppendStatusLine(head_out, version, static_cast<unsigned>(response.status), {});
  bool has_date = false;
  bool has_length = false;
  const bool with_request_id = !request_id.empty();
  // The body's length, or in answer to HEAD the one a GET would get
  // (head_length); none on a bodiless status.
  const auto append_length = [&] {
    has_length = true;
    if (bodiless) return;
    const std::uint64_t length = head_only && response.head_length ? *response.head_length : response.body.size();
    char digits[24];
    auto [end, ec] = std::to_chars(digits, digits + sizeof(digits), length);
    (void)ec;
    AppendField(head_out, "Content-Length", std::string_view(digits, static_cast<std::size_t>(end - digits)));
  };
  for (const Header& h : response.headers) {
    // A Content-Length line (its value ignored) marks where ours goes: a
    // replay frames its body where the original had its length.
    if (NameEquals(h.name, "content-length")) {
      if (!has_length) append_length();
      continue;
    }
    if (IsHopByHop(h.name)) continue;
    if (NameEquals(h.name, "date")) has_date = true;
    // A replayed response may hold the original request's id.
    if (with_request_id && NameEquals(h.name, "x-request-id")) continue;
    AppendField(head_out, h.name, h.value);
  }
  if (!has_date) AppendField(head_out, "Date", CurrentHttpDate());
  if (with_request_id) AppendField(head_out, "X-Request-Id", request_id);
  if (!has_length) append_length();
  if (close && version != 10) AppendField(head_out, "Connection", "close");
  if (!close && version == 10) AppendField(head_out, "Connection", "keep-alive");
  head_out.append(kCrlf);

  IoVec iov;
  iov.Add(head_out);
  if (!head_only && !bodiless) iov.Add(response.body);
  deadline.ExpireAfter(w.limits.idle_timeout);
  error_code ec;
  if (tls) {
    ec = co_await TlsSendAll(*tls, iov, tls_out);
  } else if (!TrySend(socket, iov, ec)) {
    ec = co_await SendAll(socket, deadline, iov);
  }
  const bool ok = !ec && !deadline.fired();
  deadline.Disarm();
  if (!ok || close) must_close = true;
  co_return ok;
}

Task<void> ClientConnection::Refuse(std::optional<ProblemCode> code, std::string_view detail, std::string_view reason,
                                    int version, const RequestParser& parser, SteadyTime started) {
  const auto& msg = parser.get();
  RefusedRequest refused;
  refused.status = code ? ProblemDefaultStatus(*code) : 0;
  refused.reason = reason;
  // Empty until the request line was parsed whole.
  refused.method = std::string_view(msg.method_string().data(), msg.method_string().size());
  const std::string_view target(msg.target().data(), msg.target().size());
  refused.path = target.substr(0, target.find('?'));
  request_id.clear();
  if (code) {
    AppendNewRequestId(request_id);  // into the connection's buffer
    refused.request_id = request_id;
  }
  refused.peer_ip = peer_ip;
  refused.duration_ms = std::chrono::duration<double, std::milli>(SteadyClock::now() - started).count();
  handler.Refused(refused);
  if (!code) co_return;
  must_close = true;
  linger = true;
  co_await WriteResponse(MakeProblem(*code, detail), version, false, true);
}

Task<void> ClientConnection::LingeringClose() {
  error_code ec;
  socket.shutdown(tcp::socket::shutdown_send, ec);
  if (ec) co_return;
  Block block(w.blocks);
  std::size_t drained = 0;
  deadline.ExpireAfter(kLingerTime);
  while (drained < kLingerBytes && !deadline.fired()) {
    const std::size_t n = socket.read_some(asio::buffer(block.data(), block.size()), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) {
      if (co_await WaitReadable(socket, deadline)) break;
      continue;
    }
    if (ec) break;
    drained += n;
  }
  deadline.Disarm();
}

Task<void> ClientConnection::Run() {
  std::optional<internal::RequestParser> parser;
  bool first = true;
  head.peer_ip = peer_ip;
  if (tls_context) {
    // The handshake must finish within header_timeout, like a request's
    // header block; a client that fails it gets no HTTP answer. The TLS
    // session (about 90 KB with its buffers) is made only once the client
    // has sent something: a connection that stays silent costs what a plain
    // one does.
    deadline.ExpireAfter(w.limits.header_timeout);
    idle = true;
    auto [waited] = co_await socket.async_wait(tcp::socket::wait_read, kTuple);
    idle = false;
    // A client that closed without a byte (a port scan, a flood of
    // connections) is not worth a session either.
    bool eof = false;
    if (!waited) {
      char first_byte;
      const ssize_t peeked = ::recv(socket.native_handle(), &first_byte, 1, MSG_PEEK | MSG_DONTWAIT);
      eof = peeked == 0 || (peeked < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    if (waited || eof || deadline.fired() || w.draining) {
      deadline.Disarm();
      error_code ignored;
      socket.close(ignored);
      co_return;
    }
    std::unique_ptr<TlsStream> session = NewServerTlsStream(socket, *tls_context);
    const error_code ec = co_await TlsHandshake(*session, /*as_server=*/true);
    const bool fired = deadline.fired();
    deadline.Disarm();
    if (ec || fired) {
      LogDebug("TLS handshake failed", {{"peer", peer_ip}, {"error", fired ? std::string("timeout") : ec.message()}});
      handler.TlsHandshakeFailed();
      error_code ignored;
      socket.close(ignored);
      co_return;
    }
    tls = std::move(session);
    head.secure = true;
  }
  for (;;) {
    if (w.draining) break;
    const Limits limits = w.limits;
    // Wait for the first byte of the next request.
    bool timed_out = false;
    bool closed = false;
    // Empty lines before a request line are skipped (RFC 9112 section 2.2),
    // and those alone (the CRLF some clients send after a body) start no
    // request: the connection is still idle, under idle_timeout.
    Pump pump;
    bool gone = false;
    for (;;) {
      if (buffer.size() == 0) {
        deadline.ExpireAfter(first ? limits.header_timeout : limits.idle_timeout);
        idle = true;
        error_code ec;
        std::size_t n = 0;
        if (tls) {
          n = co_await TlsReadSome(*tls, buffer.prepare(kHeaderReadSize), ec);
        } else {
          std::tie(ec, n) =
              co_await socket.async_read_some(DrainAwareBuffer(buffer.prepare(kHeaderReadSize)), kTuple);
        }
        idle = false;
        buffer.commit(n);
        if (ec || deadline.fired()) {
          gone = true;
          break;
        }
      }
      SkipEmptyLinesBeforeRequest(buffer, pump);
      if (buffer.size() != 0 || pump.empty_lines >= kMaxEmptyLinesBeforeRequest) break;
    }
    if (gone) break;
    first = false;
    // Slow-loris bound: the whole header block within header_timeout of its
    // first byte.
    const SteadyTime started = SteadyClock::now();
    deadline.ExpireAt(started + limits.header_timeout);
    parser.emplace();
    parser->header_limit(limits.max_header_bytes);
    parser->body_limit(boost::none);  // checked per route; see Exchange::SetBodyLimit
    for (;;) {
      ParseHeader(*parser, buffer, limits.max_header_bytes, pump);
      if (!pump.need_more) break;
      error_code ec;
      std::size_t n = 0;
      if (tls) {
        n = co_await TlsReadSome(*tls, buffer.prepare(kHeaderReadSize), ec);
      } else {
        std::tie(ec, n) = co_await socket.async_read_some(DrainAwareBuffer(buffer.prepare(kHeaderReadSize)), kTuple);
      }
      if (deadline.fired()) {
        timed_out = true;
        break;
      }
      if (!OnReceive(*parser, buffer, ec, n, pump)) {
        closed = IsClientGone(pump.ec);
        break;
      }
    }
    deadline.Disarm();
    if (closed || timed_out) {
      linger = false;
      // A client too slow to send its header gets no answer; it is reported
      // (unless the cut was the shutdown's).
      if (timed_out && !w.watchdog.killing()) {
        co_await Refuse(std::nullopt, "the request head did not arrive within header_timeout", "header_timeout", 11,
                        *parser, started);
      }
      break;
    }
    if (pump.ec) {
      if ((pump.ec == bhttp::error::header_limit || pump.ec == bhttp::error::buffer_overflow) &&
          RequestTargetPastHeaderLimit(buffer, pump, limits.max_header_bytes)) {
        co_await Refuse(ProblemCode::kUriTooLong, "the request target exceeds the header limit", "uri_too_long", 11,
                        *parser, started);
      } else if (pump.version_not_supported) {
        co_await Refuse(ProblemCode::kHttpVersionNotSupported, "only HTTP/1.x is served on this listener",
                        "version_not_supported", 11, *parser, started);
      } else if (pump.ec == bhttp::error::header_limit || pump.ec == bhttp::error::buffer_overflow) {
        co_await Refuse(ProblemCode::kHeadersTooLarge, "the request header block exceeds the limit",
                        "headers_too_large", 11, *parser, started);
      } else if (!IsClientGone(pump.ec)) {
        co_await Refuse(ProblemCode::kBadRequest, "malformed HTTP request: " + pump.ec.message(), "bad_request", 11,
                        *parser, started);
      }
      break;
    }
    std::string_view why;
    if (!BuildHead(*parser, limits.merge_slashes, head, normalized_target, &why)) {
      co_await Refuse(ProblemCode::kBadRequest, why, "bad_request", head.version, *parser, started);
      break;
    }
    {
      request_id.clear();
      ExchangeImpl exchange(*this, *parser, limits);
      bool failed = false;
      try {
        co_await handler.Handle(exchange);
      } catch (const std::exception& e) {
        failed = true;
        static LogLimiter limiter;
        LogError(limiter, "request handler failed", {{"error", e.what()}});
      }
      if (failed) must_close = true;
      if (!exchange.responded()) {
        if (w.watchdog.killing()) {
          co_await exchange.Respond(MakeProblem(ProblemCode::kShuttingDown, "the gateway stopped; retry"), true);
        } else {
          co_await exchange.Respond(MakeProblem(ProblemCode::kInternal, "the request was not answered"), true);
        }
      }
    }
    if (must_close) break;
    if (buffer.size() == 0 && buffer.capacity() > kKeepBufferBytes) buffer.shrink_to_fit();
  }
  deadline.Disarm();
  if (socket.is_open()) {
    if (tls) TlsCloseNotify(*tls);
    if (linger && !w.watchdog.killing()) {
      co_await LingeringClose();
    } else {
      error_code ec;
      socket.shutdown(tcp::socket::shutdown_send, ec);
    }
    error_code ec;
    socket.close(ec);
  }
}

ExchangeImpl::ExchangeImpl(ClientConnection& connection, RequestParser& parser, const Limits& limits)
    : c_(connection),
      parser_(parser),
      limits_(limits),
      body_state_(connection.head.has_body() ? BodyState::kUnread : BodyState::kNone),
      body_limit_(limits.max_request_bytes) {}

bool ExchangeImpl::client_gone() const {
  if (!c_.socket.is_open()) return true;
  // poll() reports the socket's state whatever is queued before it: the
  // peer's FIN (POLLRDHUP) even behind bytes nobody read yet, a reset or
  // an error (POLLERR, POLLHUP).
  pollfd p{c_.socket.native_handle(), POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

bool ExchangeImpl::SetBodyLimit(std::uint64_t limit) {
  body_limit_ = limit;
  if (c_.head.content_length && *c_.head.content_length > limit) {
    // Refused (413): the body is not read, and the connection closes after
    // the answer (lingering, so the client still sending it gets the 413)
    // instead of waiting for a body known to be too large.
    c_.must_close = true;
    c_.linger = true;
    return false;
  }
  return true;
}

Task<bool> ExchangeImpl::SendContinueIfNeeded() {
  if (!c_.head.expect_continue || continue_sent_ || c_.head.version != 11) co_return true;
  continue_sent_ = true;
  co_return co_await SendInterim("HTTP/1.1 100 Continue\r\n\r\n");
}

Task<bool> ExchangeImpl::SendInterim(std::string_view head) {
  IoVec iov;
  iov.Add(head);
  c_.deadline.ExpireAfter(limits_.idle_timeout);
  error_code ec;
  if (c_.tls) {
    ec = co_await TlsSendAll(*c_.tls, iov, c_.tls_out);
  } else if (!TrySend(c_.socket, iov, ec)) {
    ec = co_await SendAll(c_.socket, c_.deadline, iov);
  }
  const bool ok = !ec && !c_.deadline.fired();
  c_.deadline.Disarm();
  co_return ok;
}

Task<ExchangeImpl::PieceResult> ExchangeImpl::ReadBodyPiece(char* data, std::size_t capacity, bool fill) {
  PieceResult result;
  auto& body = parser_.get().body();
  body.data = data;
  body.size = capacity;
  c_.deadline.ExpireAfter(limits_.idle_timeout);
  Pump pump;
  bool fired = false;
  for (;;) {
    ParseBody(parser_, c_.buffer, capacity, fill, limits_.max_header_bytes, pump);
    if (!pump.need_more) break;
    error_code ec;
    std::size_t n = 0;
    if (c_.tls) {
      n = co_await TlsReadSome(*c_.tls, c_.buffer.prepare(kBodyReadSize), ec);
    } else {
      std::tie(ec, n) = co_await c_.socket.async_read_some(DrainAwareBuffer(c_.buffer.prepare(kBodyReadSize)), kTuple);
    }
    if (c_.deadline.fired()) {
      fired = true;
      break;
    }
    // idle_timeout bounds the time without progress, not the whole read: a
    // body trickling in slowly but steadily is not cut.
    if (n > 0) c_.deadline.ExpireAfter(limits_.idle_timeout);
    if (!OnReceive(parser_, c_.buffer, ec, n, pump)) break;
  }
  c_.deadline.Disarm();
  result.bytes = pump.bytes;
  if (pump.ec || fired) {
    result.status = BodyStatusFor(pump.ec, fired);
    body_timed_out_ = fired && !c_.w.watchdog.killing();
    body_state_ = BodyState::kFailed;
    c_.must_close = true;
    c_.linger = result.status != BodyStatus::kClientGone;
  }
  co_return result;
}

Task<BodyStatus> ExchangeImpl::ReadBody() {
  switch (body_state_) {
    case BodyState::kNone:
    case BodyState::kBuffered: co_return BodyStatus::kOk;
    case BodyState::kStreamed:
    case BodyState::kFailed: co_return BodyStatus::kClientGone;
    case BodyState::kUnread: break;
  }
  if (c_.head.content_length && *c_.head.content_length > body_limit_) {
    body_state_ = BodyState::kFailed;
    c_.must_close = true;
    c_.linger = true;
    co_return BodyStatus::kTooLarge;
  }
  if (c_.head.expect_continue && !continue_sent_ && !co_await SendContinueIfNeeded()) {
    body_state_ = BodyState::kFailed;
    c_.must_close = true;
    co_return BodyStatus::kClientGone;
  }
  parser_.LimitBody(body_limit_, limits_.max_header_bytes);
  BodyStatus status = BodyStatus::kOk;
  if (c_.head.content_length) {
    // Known size: one read straight into the string.
    body_.resize(static_cast<std::size_t>(*c_.head.content_length));
    auto piece = co_await ReadBodyPiece(body_.data(), body_.size(), true);
    status = piece.status;
    if (status == BodyStatus::kOk) body_.resize(piece.bytes);
  } else {
    while (status == BodyStatus::kOk && !parser_.is_done()) {
      const std::size_t old = body_.size();
      const std::size_t room = internal::kBlockSize;
      body_.resize(old + room);
      auto piece = co_await ReadBodyPiece(body_.data() + old, room, false);
      body_.resize(old + piece.bytes);
      status = piece.status;
    }
  }
  if (status != BodyStatus::kOk) {
    // A client that stalled gets 408 now, and the caller's own answer to
    // kClientGone is not sent (Respond answers once).
    if (body_timed_out_) co_await Respond(MakeProblem(ProblemCode::kRequestTimeout, BodyTimeoutDetail()), true);
    co_return status;
  }
  body_state_ = BodyState::kBuffered;
  co_return BodyStatus::kOk;
}

std::string ExchangeImpl::BodyTimeoutDetail() const {
  return "the request body stalled: nothing more of it arrived for " + std::to_string(limits_.idle_timeout.count()) +
         "ms";
}

bool ExchangeImpl::CanDiscardBody() const {
  return body_state_ == BodyState::kUnread && !c_.head.expect_continue && !c_.head.chunked &&
         c_.head.content_length && *c_.head.content_length <= internal::kBlockSize;
}

Task<bool> ExchangeImpl::DiscardSmallBody() {
  Block block(c_.w.blocks);
  parser_.body_limit(boost::none);
  while (!parser_.is_done()) {
    auto piece = co_await ReadBodyPiece(block.data(), block.size(), true);
    if (piece.status != BodyStatus::kOk) co_return false;
  }
  body_state_ = BodyState::kStreamed;
  co_return true;
}

Task<void> ExchangeImpl::Respond(Response response, bool close) {
  if (responded_) co_return;
  responded_ = true;
  status_sent_ = response.status;
  // An unread body: a small one is read and dropped after the answer (which
  // then does not wait for it), for the connection to be reused; anything
  // else closes it, and the lingering close drains it.
  bool discard = false;
  if (body_state_ == BodyState::kUnread || body_state_ == BodyState::kFailed) {
    if (!c_.must_close && !close && c_.head.keep_alive && CanDiscardBody()) {
      discard = true;
    } else {
      close = true;
      c_.linger = c_.linger || body_state_ == BodyState::kUnread;
    }
  }
  const bool head_only = c_.head.method == "HEAD";
  co_await c_.WriteResponse(std::move(response), c_.head.version, head_only, close || !c_.head.keep_alive);
  if (discard && !c_.must_close && !co_await DiscardSmallBody()) c_.must_close = true;
}

Task<void> ExchangeImpl::ForwardProblem(ForwardResult& result, ForwardOutcome outcome, ProblemCode code) {
  if (c_.w.watchdog.killing()) {
    // Past shutdown_grace: every operation is being cancelled. The client
    // still learns why if its socket takes the answer at once (the write
    // does not wait: the watchdog cuts anything that would).
    Fail(result, ForwardOutcome::kShutdown);
    if (!responded_) {
      co_await Respond(MakeProblem(ProblemCode::kShuttingDown,
                                   "the gateway stopped before the upstream answered; retry"),
                       true);
      result.status = status_sent_;
    }
    co_return;
  }
  result.outcome = outcome;
  result.status = ProblemDefaultStatus(code);
  co_await Respond(MakeProblem(code, detail_), false);
}

}  // namespace internal

Worker::Worker(std::size_t index, std::unique_ptr<Impl> impl) : index_(index), impl_(std::move(impl)) {
  impl_->self = this;
}

Worker::~Worker() = default;

std::string BoundAddress::ToString() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

Server::Server(ServerOptions options) : options_(std::move(options)) {
  std::size_t n = options_.workers;
  if (n == 0) n = std::max(1u, std::thread::hardware_concurrency());
  workers_.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    workers_.push_back(std::make_unique<Worker>(i, std::make_unique<Worker::Impl>(options_)));
    workers_.back()->impl().admitted = &admitted_;
  }
}

Server::~Server() {
  if (started_ && !stopped_) Stop(Duration::zero());
}

StatusOr<BoundAddress> Server::Listen(const std::string& host, std::uint16_t port, Handler& handler,
                                      bool all_workers, TlsContextSlot* tls) {
  error_code ec;
  asio::ip::address address = asio::ip::make_address(host, ec);
  if (ec) {
    tcp::resolver resolver(workers_[0]->impl().io);
    auto results = resolver.resolve(host, std::to_string(port), ec);
    if (ec || results.empty()) {
      return UnavailableError("cannot resolve listen host " + host + ": " + ec.message());
    }
    address = results.begin()->endpoint().address();
  }
  std::uint16_t bind_port = port;
  const std::size_t count = all_workers ? workers_.size() : 1;
  for (std::size_t i = 0; i < count; ++i) {
    Worker::Impl& w = workers_[i]->impl();
    auto listener = std::make_unique<internal::Listener>(w.io, &handler, tls);
    auto& acceptor = listener->acceptor;
    const tcp::endpoint endpoint(address, bind_port);
    acceptor.open(endpoint.protocol(), ec);
    if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec && all_workers) {
      const int one = 1;
      if (::setsockopt(acceptor.native_handle(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0) {
        ec = error_code(errno, boost::system::system_category());
      }
    }
    if (!ec) acceptor.bind(endpoint, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return UnavailableError("cannot listen on " + BoundAddress{host, bind_port}.ToString() + ": " + ec.message());
    }
    if (bind_port == 0) bind_port = acceptor.local_endpoint(ec).port();
    w.listeners.push_back(std::move(listener));
  }
  return BoundAddress{address.to_string(), bind_port};
}

void Server::Start() {
  if (started_) return;
  started_ = true;
  for (auto& worker : workers_) {
    Worker::Impl& w = worker->impl();
    w.watchdog.Start();
    for (auto& listener : w.listeners) {
      asio::co_spawn(w.io, AcceptLoop(*worker, *listener), asio::detached);
    }
  }
  // Start returns once every worker has run its start hook, so whatever the
  // hooks attach (a store's per-worker clients) is in place for all workers
  // when the caller announces that the server is ready.
  struct StartBarrier {
    std::mutex mu;
    std::condition_variable cv;
    std::size_t left = 0;
  };
  auto barrier = std::make_shared<StartBarrier>();
  barrier->left = workers_.size();
  for (auto& worker : workers_) {
    threads_.emplace_back([&w = worker->impl(), this, barrier] {
      if (options_.on_worker_start) options_.on_worker_start(w.io);
      {
        std::lock_guard lock(barrier->mu);
        if (--barrier->left == 0) barrier->cv.notify_all();
      }
      w.io.run();
      if (options_.on_worker_stop) options_.on_worker_stop(w.io);
    });
  }
  std::unique_lock lock(barrier->mu);
  barrier->cv.wait(lock, [&barrier] { return barrier->left == 0; });
}

std::size_t Server::open_connections() const {
  std::size_t n = 0;
  for (const auto& worker : workers_) n += worker->impl().connections.load(std::memory_order_relaxed);
  return n;
}

void Server::SetLimits(const Limits& limits) {
  for (auto& worker : workers_) {
    Worker::Impl& w = worker->impl();
    if (started_ && !stopped_) {
      asio::post(w.io, [&w, limits] { w.limits = limits; });
    } else {
      w.limits = limits;
    }
  }
}

bool Server::Stop(Duration grace) {
  if (stopped_) return true;
  stopped_ = true;
  if (!started_) return true;
  for (auto& worker : workers_) {
    Worker::Impl& w = worker->impl();
    asio::post(w.io, [&w] {
      w.draining = true;
      for (auto& listener : w.listeners) {
        error_code ec;
        listener->acceptor.close(ec);
      }
      w.sessions.ForEach([](internal::SessionNode& s) { s.OnDrain(); });
    });
  }
  auto wait_until_closed = [this](std::chrono::steady_clock::time_point deadline, bool until_grace_ended) {
    while (open_connections() > 0 && std::chrono::steady_clock::now() < deadline &&
           !(until_grace_ended && grace_ended_.load(std::memory_order_relaxed))) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return open_connections() == 0;
  };
  const bool clean = wait_until_closed(std::chrono::steady_clock::now() + grace, true);
  if (!clean) {
    LogWarn(grace_ended_.load(std::memory_order_relaxed) ? "shutdown grace ended early; closing remaining connections"
                                                         : "shutdown grace over; closing remaining connections",
            {{"connections", static_cast<std::uint64_t>(open_connections())}});
    for (auto& worker : workers_) {
      Worker::Impl& w = worker->impl();
      asio::post(w.io, [&w] { w.watchdog.KillAll(); });
    }
    wait_until_closed(std::chrono::steady_clock::now() + std::chrono::seconds(5), false);
  }
  for (auto& worker : workers_) {
    Worker::Impl& w = worker->impl();
    asio::post(w.io, [&w] {
      w.watchdog.Stop();
      w.io.stop();
    });
  }
  for (auto& t : threads_) t.join();
  threads_.clear();
  return clean;
}

}  // namespace idemgate::http
