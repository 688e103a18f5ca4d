// fake_upstream: an HTTP/1.1 backend for integration tests that counts how
// often it executes requests.
//
//   fake_upstream [--port N] [--ready-file PATH] [--threads N]
//                 [--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]]
//                 [--serve-file URLPATH=FILE]...
//
// --serve-file URLPATH=FILE (repeatable; URLPATH starts with '/')
//   GET (or HEAD) URLPATH, without a query, answers 200 with FILE's current
//   content (read again on every request, so a test can rewrite it; write it
//   atomically) as Content-Type application/json; 404 JSON when FILE cannot
//   be read, 405 for other methods. Such requests count no execution. Used to
//   serve a JWKS to idemgate's identity.jwt.jwks_url.
// --tls-cert FILE, --tls-key FILE
//   serve HTTPS (TLS 1.2 or 1.3) instead of plain HTTP, with the PEM
//   certificate chain (leaf first) and the PEM private key in these files.
//   Every endpoint below behaves the same over TLS. A connection whose TLS
//   handshake fails is closed and counted in tls_handshake_failures (a
//   plain-HTTP request to the port is one). A clean close (a response without
//   keep-alive) sends a TLS close_notify first, waiting at most 200 ms for
//   the peer's; the /die-* endpoints and errors close the TCP connection
//   without one.
// --tls-client-ca FILE (with --tls-cert)
//   require a client certificate signed by a CA in the PEM FILE; a handshake
//   without one (or with another) fails. With TLS 1.3 the client may only
//   see that failure on its first read after the handshake.
//
// Endpoints (any method):
//   /echo, /echo/...      200, JSON {method, target, version, headers: [[name, value]...] in
//                         order, body (when UTF-8), body_base64, body_length, execution};
//                         each request header X-Echo-Set-Cookie: V adds "Set-Cookie: V" and
//                         each X-Echo-Header: "Name: V" adds "Name: V" to the response
//   /status/{code}        that status (200..599), JSON {status, execution}; request header
//                         X-Terminal: 1 adds Idempotency-Terminal: true; ?ms=N answers after N ms
//   /slow?ms=N            200 after N ms
//   /large?bytes=N        N bytes of a..z repeated, streamed; &chunked=1 for chunked coding
//   /die-mid-response     headers and part of a Content-Length body, then close
//   /die-before-response  reads the request, closes without answering
//   /bad-head/{code}?kind=K  status {code} with a head a proxy must refuse, then close: K is
//                         length-and-chunked (Content-Length beside Transfer-Encoding: chunked,
//                         the default), gzip-chunked, two-lengths (5 and 6) or huge (a header
//                         block over 64 KiB)
//   /answer-early/{code}  answers as /status/{code} (with Connection: close) as soon as the
//                         request head is read, without reading the body, then closes (a reset
//                         when body bytes are left unread); with ?then=wait it first keeps the
//                         connection 10 s without reading
//   /upload-sha256        streams the body, 200 JSON {bytes, sha256, execution}
//   anything else         404 JSON
//   /__stats              JSON {executions, by_key: {Idempotency-Key value: count}, connections,
//                         tls_handshake_failures}; connections counts accepted TCP
//                         connections (TLS or not), tls_handshake_failures is 0 without TLS
//   /__reset              zeroes the counters
// Every request except /__* and --serve-file paths counts one execution (by its raw Idempotency-Key
// value when present) before it is answered; `execution` is that count.
//
// Binds 127.0.0.1:N (0: ephemeral), then writes "listen=127.0.0.1:PORT\n" to
// PATH atomically (write to PATH.tmp, rename), or to stdout without
// --ready-file (the same with TLS). Unusable TLS files: a message on stderr,
// exit 1, before the ready file. SIGTERM or SIGINT: exit 0.
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "fakes/testing.h"

namespace idemgate::fakes {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace json = boost::json;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);
constexpr std::size_t kChunkBytes = 64 * 1024;
constexpr std::uint32_t kHeaderLimit = 64 * 1024;
// How long a clean TLS close waits for the peer's close_notify.
constexpr std::chrono::milliseconds kTlsShutdownWait{200};

// Execution and connection counters shared by every session.
// Thread-safe: all members lock mu_.
class Counters {
 public:
  // Counts one execution (and one for `key` when present); returns the
  // process-wide execution number of this request, starting at 1.
  std::uint64_t CountExecution(const std::optional<std::string>& key) {
    std::lock_guard lock(mu_);
    ++executions_;
    if (key) ++by_key_[*key];
    return executions_;
  }

  void CountConnection() {
    std::lock_guard lock(mu_);
    ++connections_;
  }

  void CountHandshakeFailure() {
    std::lock_guard lock(mu_);
    ++tls_handshake_failures_;
  }

  void Reset() {
    std::lock_guard lock(mu_);
    executions_ = 0;
    connections_ = 0;
    tls_handshake_failures_ = 0;
    by_key_.clear();
  }

  std::string StatsJson() {
    std::lock_guard lock(mu_);
    json::object by_key;
    for (const auto& [key, count] : by_key_) by_key[key] = count;
    json::object stats;
    stats["executions"] = executions_;
    stats["by_key"] = std::move(by_key);
    stats["connections"] = connections_;
    stats["tls_handshake_failures"] = tls_handshake_failures_;
    return json::serialize(stats);
  }

 private:
  std::mutex mu_;
  std::uint64_t executions_ = 0;
  std::uint64_t connections_ = 0;
  std::uint64_t tls_handshake_failures_ = 0;
  std::map<std::string, std::uint64_t> by_key_;
};

std::string Base64(std::string_view in) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const std::uint32_t v =
        (std::uint8_t(in[i]) << 16) | (std::uint8_t(in[i + 1]) << 8) | std::uint8_t(in[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i + 1 == in.size()) {
    const std::uint32_t v = std::uint8_t(in[i]) << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const std::uint32_t v = (std::uint8_t(in[i]) << 16) | (std::uint8_t(in[i + 1]) << 8);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

bool IsValidUtf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t extra = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + extra >= s.size()) return false;
    for (std::size_t k = 1; k <= extra; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((extra == 1 && cp < 0x80) || (extra == 2 && cp < 0x800) || (extra == 3 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += extra + 1;
  }
  return true;
}

// Value of `name` in the query string `query` ("a=1&b=2"), undecoded.
std::optional<std::string_view> QueryParam(std::string_view query, std::string_view name) {
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    const auto eq = pair.find('=');
    if (pair.substr(0, eq) == name) {
      return eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return std::nullopt;
}

std::optional<std::uint64_t> ParseUint(std::string_view s) {
  std::uint64_t v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

using testing::HeaderField;
using testing::ParseHeaderBlock;
using testing::Sha256;

std::string_view BufferView(const beast::flat_buffer& buffer) {
  return {static_cast<const char*>(buffer.data().data()), buffer.size()};
}

struct Reply {
  unsigned status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string content_type = "application/json";
};

std::string JsonBody(json::object o) { return json::serialize(o); }

// How a connection's request loop ended.
enum class End {
  kClose,  // after a response without keep-alive: close cleanly
  kAbort,  // /die-*: close the TCP connection (over TLS without close_notify)
  kError,  // the peer closed, a read or write failed, a malformed request: drop it
};

// The --serve-file reply for `file` to `method`.
Reply ServedFile(http::verb method, const std::string& file) {
  Reply reply;
  if (method != http::verb::get && method != http::verb::head) {
    reply.status = 405;
    reply.headers.emplace_back("Allow", "GET, HEAD");
    reply.body = R"({"error":"only GET and HEAD"})";
    return reply;
  }
  std::ifstream in(file, std::ios::binary);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.is_open() || in.bad()) {
    json::object o;
    o["error"] = "cannot read the served file";
    o["file"] = file;
    reply.status = 404;
    reply.body = JsonBody(std::move(o));
    return reply;
  }
  reply.body = std::move(content);
  return reply;
}

class Server {
 public:
  // `tls`: serve HTTPS with that context (which must outlive the sessions);
  // null: plain HTTP. `files`: the --serve-file paths and their files.
  Server(asio::io_context& ioc, ssl::context* tls, std::map<std::string, std::string> files)
      : ioc_(ioc), tls_(tls), files_(std::move(files)) {}

  asio::awaitable<void> Accept(tcp::acceptor acceptor) {
    for (;;) {
      auto [ec, socket] = co_await acceptor.async_accept(kTuple);
      if (ec == asio::error::operation_aborted) co_return;
      if (ec) continue;  // e.g. EMFILE: keep serving the connections we have
      counters_.CountConnection();
      socket.set_option(tcp::no_delay(true), ec);
      if (tls_) {
        // A strand: the bounded TLS shutdown cancels the socket from a timer.
        asio::co_spawn(asio::make_strand(ioc_), TlsSession(std::move(socket)), asio::detached);
      } else {
        asio::co_spawn(ioc_, PlainSession(std::move(socket)), asio::detached);
      }
    }
  }

 private:
  asio::awaitable<void> PlainSession(tcp::socket socket) {
    const End end = co_await Serve(socket);
    if (end == End::kError) co_return;
    beast::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_send, ignored);
    socket.close(ignored);
  }

  asio::awaitable<void> TlsSession(tcp::socket socket) {
    ssl::stream<tcp::socket> stream(std::move(socket), *tls_);
    if (auto [ec] = co_await stream.async_handshake(ssl::stream_base::server, kTuple); ec) {
      counters_.CountHandshakeFailure();
      std::cerr << "fake_upstream: TLS handshake failed: " + ec.message() + "\n" << std::flush;
      beast::error_code ignored;
      stream.next_layer().close(ignored);
      co_return;
    }
    const End end = co_await Serve(stream);
    if (end == End::kError) co_return;
    if (end == End::kClose) {
      // close_notify, then wait for the peer's, but not for long. The timer
      // runs on this coroutine's strand; `done` keeps a late expiry from
      // touching the stream once this coroutine has moved on.
      auto done = std::make_shared<bool>(false);
      asio::steady_timer timer(co_await asio::this_coro::executor);
      timer.expires_after(kTlsShutdownWait);
      timer.async_wait([done, &stream](beast::error_code ec) {
        if (ec || *done) return;
        beast::error_code ignored;
        stream.next_layer().cancel(ignored);
      });
      co_await stream.async_shutdown(kTuple);
      *done = true;
      timer.cancel();
    }
    beast::error_code ignored;
    stream.next_layer().shutdown(tcp::socket::shutdown_send, ignored);
    stream.next_layer().close(ignored);
  }

  // One connection: requests are served in order until either side closes.
  template <typename Stream>
  asio::awaitable<End> Serve(Stream& stream) {
    beast::flat_buffer buffer;
    std::vector<char> chunk(kChunkBytes);
    for (;;) {
      // Beast's field container groups lines of the same name, so the wire
      // order /echo reports is taken from the raw header block first.
      std::size_t header_end = std::string_view::npos;
      while ((header_end = BufferView(buffer).find("\r\n\r\n")) == std::string_view::npos) {
        if (buffer.size() > kHeaderLimit) co_return End::kError;
        auto [rec, rn] = co_await stream.async_read_some(buffer.prepare(kChunkBytes), kTuple);
        if (rec) co_return End::kError;
        buffer.commit(rn);
      }
      const std::vector<HeaderField> wire_fields =
          ParseHeaderBlock(BufferView(buffer).substr(0, header_end + 4));

      http::request_parser<http::buffer_body> parser;
      parser.header_limit(kHeaderLimit);
      parser.body_limit(std::numeric_limits<std::uint64_t>::max());
      auto [ec, n] = co_await http::async_read_header(stream, buffer, parser, kTuple);
      if (ec) co_return End::kError;
      auto& req = parser.get();
      const std::string target(req.target());
      const auto qpos = target.find('?');
      const std::string path = target.substr(0, qpos);
      const std::string query = qpos == std::string::npos ? "" : target.substr(qpos + 1);

      if (path.starts_with("/answer-early/")) {
        std::optional<std::string> key;
        if (auto it = req.find("Idempotency-Key"); it != req.end()) key = std::string(it->value());
        const std::uint64_t execution = counters_.CountExecution(key);
        Reply early = StatusReply(req, path.substr(14), execution);
        if (!co_await Write(stream, early, false, req.method() == http::verb::head)) co_return End::kError;
        if (QueryParam(query, "then").value_or("") == "wait") {
          asio::steady_timer timer(co_await asio::this_coro::executor);
          timer.expires_after(std::chrono::seconds(10));
          co_await timer.async_wait(kTuple);
        }
        co_return End::kAbort;
      }

      if (beast::iequals(req[http::field::expect], "100-continue")) {
        static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
        auto [wec, wn] = co_await asio::async_write(stream, asio::buffer(kContinue), kTuple);
        if (wec) co_return End::kError;
      }

      // Read the body: hashed on the fly for /upload-sha256, kept otherwise.
      const bool hash_only = path == "/upload-sha256";
      std::string body;
      Sha256 sha;
      std::uint64_t body_bytes = 0;
      while (!parser.is_done()) {
        req.body().data = chunk.data();
        req.body().size = chunk.size();
        auto [rec, rn] = co_await http::async_read(stream, buffer, parser, kTuple);
        if (rec == http::error::need_buffer) rec = {};
        if (rec) co_return End::kError;
        const std::size_t got = chunk.size() - req.body().size;
        body_bytes += got;
        if (hash_only) {
          sha.Update(std::string_view(chunk.data(), got));
        } else {
          body.append(chunk.data(), got);
        }
      }
      const bool keep_alive = req.keep_alive();
      const bool head = req.method() == http::verb::head;

      // Replies are named variables: GCC 12 destroys some temporaries in a
      // co_await expression twice.
      if (path == "/__stats" || path == "/__reset") {
        Reply control;
        if (path == "/__reset") {
          counters_.Reset();
          control.body = R"({"reset":true})";
        } else {
          control.body = counters_.StatsJson();
        }
        const bool written = co_await Write(stream, control, keep_alive, head);
        if (!written) co_return End::kError;
        if (!keep_alive) co_return End::kClose;
        continue;
      }

      if (auto file = files_.find(target); file != files_.end()) {
        Reply served = ServedFile(req.method(), file->second);
        if (!co_await Write(stream, served, keep_alive, head)) co_return End::kError;
        if (!keep_alive) co_return End::kClose;
        continue;
      }

      std::optional<std::string> key;
      if (auto it = req.find("Idempotency-Key"); it != req.end()) key = std::string(it->value());
      const std::uint64_t execution = counters_.CountExecution(key);

      if (path == "/die-before-response" || path.starts_with("/bad-head/")) {
        // ?ms=N: after a pause (a request in flight that long, then broken).
        if (const auto ms = ParseUint(QueryParam(query, "ms").value_or(""))) {
          asio::steady_timer timer(co_await asio::this_coro::executor);
          timer.expires_after(std::chrono::milliseconds(*ms));
          co_await timer.async_wait(kTuple);
        }
      }
      if (path == "/die-before-response") {
        co_return End::kAbort;
      }
      if (path.starts_with("/stall-head/")) {
        // A status line and one field, then nothing for ?ms=N (default 10 s):
        // a head that never completes in time.
        const std::string bytes = "HTTP/1.1 " + path.substr(12) + " Whatever\r\nX-A: 1\r\n";
        co_await asio::async_write(stream, asio::buffer(bytes), kTuple);
        asio::steady_timer timer(co_await asio::this_coro::executor);
        timer.expires_after(std::chrono::milliseconds(ParseUint(QueryParam(query, "ms").value_or("")).value_or(10000)));
        co_await timer.async_wait(kTuple);
        co_return End::kAbort;
      }
      if (path == "/die-mid-response") {
        static constexpr std::string_view kPartial =
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1000\r\n\r\n"
            "this body stops well before its declared length";
        co_await asio::async_write(stream, asio::buffer(kPartial), kTuple);
        co_return End::kAbort;
      }
      if (path.starts_with("/bad-head/")) {
        const std::string kind(QueryParam(query, "kind").value_or("length-and-chunked"));
        std::string bytes = "HTTP/1.1 " + path.substr(10) + " Whatever\r\n";
        if (kind == "gzip-chunked") {
          bytes += "Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
        } else if (kind == "two-lengths") {
          bytes += "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!";
        } else if (kind == "huge") {
          bytes += "X-Filler: " + std::string(70 * 1024, 'f') + "\r\nContent-Length: 5\r\n\r\nhello";
        } else {
          bytes += "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
        }
        co_await asio::async_write(stream, asio::buffer(bytes), kTuple);
        co_return End::kAbort;
      }
      if (path == "/large") {
        if (!co_await WriteLarge(stream, query, execution, keep_alive, head)) co_return End::kError;
        if (!keep_alive) co_return End::kClose;
        continue;
      }

      Reply reply;
      if (path == "/echo" || path.starts_with("/echo/")) {
        reply = Echo(req, wire_fields, body, execution);
      } else if (path.starts_with("/status/")) {
        if (const auto ms = ParseUint(QueryParam(query, "ms").value_or(""))) {
          asio::steady_timer timer(co_await asio::this_coro::executor);
          timer.expires_after(std::chrono::milliseconds(*ms));
          co_await timer.async_wait(kTuple);
        }
        reply = StatusReply(req, path.substr(8), execution);
      } else if (path == "/slow") {
        const auto ms = ParseUint(QueryParam(query, "ms").value_or("")).value_or(1000);
        asio::steady_timer timer(co_await asio::this_coro::executor);
        timer.expires_after(std::chrono::milliseconds(ms));
        co_await timer.async_wait(kTuple);
        json::object o;
        o["slept_ms"] = ms;
        o["execution"] = execution;
        reply.body = JsonBody(std::move(o));
      } else if (path == "/upload-sha256") {
        json::object o;
        o["bytes"] = body_bytes;
        o["sha256"] = sha.HexDigest();
        o["execution"] = execution;
        reply.body = JsonBody(std::move(o));
      } else {
        json::object o;
        o["error"] = "not found";
        o["path"] = path;
        o["execution"] = execution;
        reply.status = 404;
        reply.body = JsonBody(std::move(o));
      }
      if (!co_await Write(stream, reply, keep_alive, head)) co_return End::kError;
      if (!keep_alive) co_return End::kClose;
    }
  }

  static Reply Echo(const http::request<http::buffer_body>& req,
                    const std::vector<HeaderField>& fields, const std::string& body,
                    std::uint64_t execution) {
    Reply reply;
    json::array headers;
    for (const auto& [name, value] : fields) {
      headers.push_back(json::array{json::string(name), json::string(value)});
      if (beast::iequals(name, "X-Echo-Set-Cookie")) {
        reply.headers.emplace_back("Set-Cookie", value);
      } else if (beast::iequals(name, "X-Echo-Header")) {
        const std::string_view v = value;
        const auto colon = v.find(':');
        if (colon != std::string_view::npos) {
          std::string_view value = v.substr(colon + 1);
          while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
          reply.headers.emplace_back(std::string(v.substr(0, colon)), std::string(value));
        }
      }
    }
    json::object o;
    o["method"] = json::string(req.method_string());
    o["target"] = json::string(req.target());
    o["version"] = req.version();
    o["headers"] = std::move(headers);
    if (IsValidUtf8(body)) o["body"] = body;
    o["body_base64"] = Base64(body);
    o["body_length"] = body.size();
    o["execution"] = execution;
    reply.body = JsonBody(std::move(o));
    return reply;
  }

  static Reply StatusReply(const http::request<http::buffer_body>& req, std::string_view code_text,
                           std::uint64_t execution) {
    Reply reply;
    const auto code = ParseUint(code_text);
    if (!code || *code < 200 || *code > 599) {
      reply.status = 400;
      reply.body = R"({"error":"status must be 200..599"})";
      return reply;
    }
    reply.status = static_cast<unsigned>(*code);
    if (req["X-Terminal"] == "1") reply.headers.emplace_back("Idempotency-Terminal", "true");
    if (reply.status != 204 && reply.status != 304) {
      json::object o;
      o["status"] = reply.status;
      o["execution"] = execution;
      reply.body = JsonBody(std::move(o));
    }
    return reply;
  }

  // Writes `reply` (only its header for HEAD); false when the connection failed.
  template <typename Stream>
  static asio::awaitable<bool> Write(Stream& stream, const Reply& reply, bool keep_alive,
                                     bool head) {
    http::response<http::string_body> res;
    res.result(reply.status);
    res.version(11);
    res.set(http::field::server, "fake_upstream");
    if (!reply.body.empty()) res.set(http::field::content_type, reply.content_type);
    for (const auto& [name, value] : reply.headers) res.insert(name, value);
    res.body() = reply.body;
    res.keep_alive(keep_alive);
    res.prepare_payload();
    if (head) {
      http::response<http::empty_body> header_only(res.base());
      auto [ec, n] = co_await http::async_write(stream, header_only, kTuple);
      co_return !ec;
    }
    auto [ec, n] = co_await http::async_write(stream, res, kTuple);
    co_return !ec;
  }

  // /large?bytes=N[&chunked=1]: N bytes of a repeating a..z pattern, streamed.
  template <typename Stream>
  static asio::awaitable<bool> WriteLarge(Stream& stream, std::string_view query,
                                          std::uint64_t execution, bool keep_alive, bool head) {
    const std::uint64_t total = ParseUint(QueryParam(query, "bytes").value_or("")).value_or(0);
    const bool chunked = QueryParam(query, "chunked").value_or("") == "1";
    std::string header =
        "HTTP/1.1 200 OK\r\nServer: fake_upstream\r\nContent-Type: application/octet-stream\r\n";
    header += "X-Execution: " + std::to_string(execution) + "\r\n";
    if (!keep_alive) header += "Connection: close\r\n";
    header += chunked ? std::string("Transfer-Encoding: chunked\r\n")
                      : "Content-Length: " + std::to_string(total) + "\r\n";
    header += "\r\n";
    if (auto [ec, n] = co_await asio::async_write(stream, asio::buffer(header), kTuple); ec)
      co_return false;
    if (head) co_return true;
    std::string piece;
    std::uint64_t sent = 0;
    while (sent < total) {
      const std::size_t len =
          static_cast<std::size_t>(std::min<std::uint64_t>(kChunkBytes, total - sent));
      piece.clear();
      if (chunked) {
        char size_line[32];
        const int k = std::snprintf(size_line, sizeof size_line, "%zx\r\n", len);
        piece.append(size_line, static_cast<std::size_t>(k));
      }
      for (std::size_t i = 0; i < len; ++i) piece += static_cast<char>('a' + (sent + i) % 26);
      if (chunked) piece += "\r\n";
      if (auto [ec, n] = co_await asio::async_write(stream, asio::buffer(piece), kTuple); ec)
        co_return false;
      sent += len;
    }
    if (chunked) {
      static constexpr std::string_view kLast = "0\r\n\r\n";
      if (auto [ec, n] = co_await asio::async_write(stream, asio::buffer(kLast), kTuple); ec)
        co_return false;
    }
    co_return true;
  }

  asio::io_context& ioc_;
  ssl::context* const tls_;
  const std::map<std::string, std::string> files_;  // --serve-file: URL path -> file
  Counters counters_;
};

bool WriteReadyFile(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << contents;
    if (!out.flush()) return false;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  return !ec;
}

int Usage() {
  std::cerr << "usage: fake_upstream [--port N] [--ready-file PATH] [--threads N]\n"
               "                     [--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]]\n"
               "                     [--serve-file URLPATH=FILE]...\n";
  return 2;
}

// The server side of TLS 1.2 and 1.3 with `cert_file` (a PEM chain) and
// `key_file`; with `client_ca_file`, clients must present a certificate
// signed by a CA in it. Fails with a message naming the file.
std::unique_ptr<ssl::context> MakeTlsContext(const std::string& cert_file,
                                             const std::string& key_file,
                                             const std::string& client_ca_file,
                                             std::string& error) {
  auto ctx = std::make_unique<ssl::context>(ssl::context::tls_server);
  SSL_CTX* const native = ctx->native_handle();
  beast::error_code ec;
  if (SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION) != 1 ||
      SSL_CTX_set_max_proto_version(native, TLS1_3_VERSION) != 1) {
    error = "cannot limit TLS to versions 1.2 and 1.3";
    return nullptr;
  }
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_compression, ec);
  ctx->use_certificate_chain_file(cert_file, ec);
  if (ec) {
    error = "cannot use certificate chain " + cert_file + ": " + ec.message();
    return nullptr;
  }
  ctx->use_private_key_file(key_file, ssl::context::pem, ec);
  if (ec) {
    error = "cannot use private key " + key_file + ": " + ec.message();
    return nullptr;
  }
  if (SSL_CTX_check_private_key(native) != 1) {
    error = "private key " + key_file + " does not match certificate " + cert_file;
    return nullptr;
  }
  if (!client_ca_file.empty()) {
    ctx->load_verify_file(client_ca_file, ec);
    if (ec) {
      error = "cannot load client CA " + client_ca_file + ": " + ec.message();
      return nullptr;
    }
    // The CertificateRequest names the acceptable CAs (takes ownership).
    if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(client_ca_file.c_str())) {
      SSL_CTX_set_client_CA_list(native, names);
    }
    ctx->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert, ec);
    // Resumed sessions (of clients that cache them) need a session id context.
    static constexpr unsigned char kSessionContext[] = "fake_upstream";
    SSL_CTX_set_session_id_context(native, kSessionContext, sizeof kSessionContext - 1);
  }
  ERR_clear_error();
  return ctx;
}

int Main(int argc, char** argv) {
  std::uint64_t port = 0;
  std::uint64_t threads = 2;
  std::string ready_file;
  std::string tls_cert, tls_key, tls_client_ca;
  std::map<std::string, std::string> files;  // --serve-file
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (i + 1 >= argc) return Usage();
    const std::string_view value = argv[++i];
    if (arg == "--port") {
      auto v = ParseUint(value);
      if (!v || *v > 65535) return Usage();
      port = *v;
    } else if (arg == "--threads") {
      auto v = ParseUint(value);
      if (!v || *v == 0 || *v > 64) return Usage();
      threads = *v;
    } else if (arg == "--ready-file") {
      ready_file = value;
    } else if (arg == "--tls-cert") {
      tls_cert = value;
    } else if (arg == "--tls-key") {
      tls_key = value;
    } else if (arg == "--tls-client-ca") {
      tls_client_ca = value;
    } else if (arg == "--serve-file") {
      const std::size_t eq = value.find('=');
      if (eq == std::string_view::npos || eq == 0 || value.front() != '/' || eq + 1 == value.size()) return Usage();
      files[std::string(value.substr(0, eq))] = std::string(value.substr(eq + 1));
    } else {
      return Usage();
    }
  }
  if (tls_cert.empty() != tls_key.empty() || (!tls_client_ca.empty() && tls_cert.empty())) {
    return Usage();
  }
  // Made before the io_context, so it outlives every session.
  std::unique_ptr<ssl::context> tls;
  if (!tls_cert.empty()) {
    std::string error;
    tls = MakeTlsContext(tls_cert, tls_key, tls_client_ca, error);
    if (!tls) {
      std::cerr << "fake_upstream: " << error << "\n";
      return 1;
    }
  }

  asio::io_context ioc;
  tcp::acceptor acceptor(ioc);
  beast::error_code ec;
  const tcp::endpoint endpoint(asio::ip::make_address_v4("127.0.0.1"),
                               static_cast<std::uint16_t>(port));
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    std::cerr << "fake_upstream: cannot listen on 127.0.0.1:" << port << ": " << ec.message()
              << "\n";
    return 1;
  }
  const auto bound = acceptor.local_endpoint();

  Server server(ioc, tls.get(), std::move(files));
  asio::co_spawn(ioc, server.Accept(std::move(acceptor)), asio::detached);
  asio::signal_set signals(ioc, SIGTERM, SIGINT);
  signals.async_wait([&ioc](const beast::error_code&, int) { ioc.stop(); });

  const std::string ready = "listen=127.0.0.1:" + std::to_string(bound.port()) + "\n";
  if (!ready_file.empty() && !WriteReadyFile(ready_file, ready)) {
    std::cerr << "fake_upstream: cannot write " << ready_file << "\n";
    return 1;
  }
  if (ready_file.empty()) std::cout << ready << std::flush;

  std::vector<std::thread> pool;
  for (std::uint64_t i = 1; i < threads; ++i) pool.emplace_back([&ioc] { ioc.run(); });
  ioc.run();
  for (auto& t : pool) t.join();
  return 0;
}

}  // namespace
}  // namespace idemgate::fakes

int main(int argc, char** argv) { return idemgate::fakes::Main(argc, argv); }
