#include "test_upstream.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <thread>

namespace idemgate::httptest {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

std::uint64_t QueryNumber(std::string_view target, std::string_view name, std::uint64_t fallback) {
  const std::size_t q = target.find('?');
  if (q == std::string_view::npos) return fallback;
  std::string_view query = target.substr(q + 1);
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    const std::size_t eq = pair.find('=');
    if (eq != std::string_view::npos && pair.substr(0, eq) == name) {
      std::uint64_t v = fallback;
      std::from_chars(pair.data() + eq + 1, pair.data() + pair.size(), v);
      return v;
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return fallback;
}

}  // namespace

std::uint64_t Fnv1a(std::string_view data, std::uint64_t h) {
  for (unsigned char c : data) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string Pattern(std::size_t n, std::size_t offset) {
  std::string s(n, 'a');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (offset + i) % 26);
  return s;
}

std::vector<std::string> SeenRequest::Values(std::string_view name) const {
  std::vector<std::string> out;
  for (const auto& [n, v] : headers) {
    if (IEquals(n, name)) out.push_back(v);
  }
  return out;
}

struct TestUpstream::Impl {
  explicit Impl(TestUpstream& owner) : u(owner), acceptor(io) {}

  asio::awaitable<void> Accept() {
    for (;;) {
      auto [ec, socket] = co_await acceptor.async_accept(kTuple);
      if (ec) co_return;
      u.connections_.fetch_add(1);
      asio::co_spawn(io, Serve(std::move(socket)), asio::detached);
    }
  }

  asio::awaitable<bool> WritePieces(tcp::socket& s, bhttp::response<bhttp::buffer_body>& res,
                                    bhttp::response_serializer<bhttp::buffer_body>& sr, const std::string& data,
                                    bool more) {
    res.body().data = data.empty() ? nullptr : const_cast<char*>(data.data());
    res.body().size = data.size();
    res.body().more = more;
    auto [ec, n] = co_await bhttp::async_write(s, sr, kTuple);
    (void)n;
    co_return !ec || ec == bhttp::error::need_buffer;
  }

  // /early?status=S&then=close|wait: answers S "early" as soon as the
  // request head is in, without reading the body, then closes (a reset when
  // body bytes are left unread) or keeps the connection without reading.
  asio::awaitable<void> Early(tcp::socket& s, std::string_view target) {
    const std::string answer = "HTTP/1.1 " + std::to_string(QueryNumber(target, "status", 201)) +
                               " Early\r\nContent-Length: 5\r\n\r\nearly";
    auto [w_ec, w] = co_await asio::async_write(s, asio::buffer(answer), kTuple);
    (void)w;
    if (w_ec) co_return;
    u.early_answers_.fetch_add(1);
    if (target.find("then=wait") != std::string_view::npos) {
      asio::steady_timer timer(io, std::chrono::seconds(30));
      co_await timer.async_wait(kTuple);
    }
    boost::system::error_code ignored;
    s.close(ignored);
  }

  asio::awaitable<void> Serve(tcp::socket s) {
    beast::flat_buffer buffer;
    for (;;) {
      bhttp::request_parser<bhttp::buffer_body> parser;
      parser.body_limit(boost::none);
      parser.header_limit(64 * 1024);
      auto [ec, n] = co_await bhttp::async_read_header(s, buffer, parser, kTuple);
      (void)n;
      if (ec) {
        if (buffer.size() == 0) u.closed_between_requests_.fetch_add(1);
        co_return;
      }
      u.requests_.fetch_add(1);
      auto& req = parser.get();
      const std::string full_target(req.target());
      // A "/base" prefix (an upstream base_path) is ignored for routing.
      const std::string target = full_target.starts_with("/base/") ? full_target.substr(5) : full_target;
      if (target.starts_with("/early")) {
        co_await Early(s, target);
        co_return;
      }
      if (QueryNumber(target, "continue", 0) != 0) {
        // An interim 100 (Continue) unasked (RFC 9110 section 15.2.1), then
        // a pause before the body is read, long enough for a large body to
        // fill the socket buffers in between.
        static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
        auto [w_ec, w] = co_await asio::async_write(s, asio::buffer(kContinue.data(), kContinue.size()), kTuple);
        (void)w;
        if (w_ec) co_return;
        asio::steady_timer timer(io, std::chrono::milliseconds(200));
        co_await timer.async_wait(kTuple);
      }
      const bool sink = target.starts_with("/sink");
      std::string body;
      std::uint64_t bytes = 0;
      std::uint64_t hash = Fnv1a({});
      char block[16 * 1024];
      while (!parser.is_done()) {
        req.body().data = block;
        req.body().size = sizeof(block);
        auto [read_ec, m] = co_await bhttp::async_read_some(s, buffer, parser, kTuple);
        (void)m;
        if (read_ec && read_ec != bhttp::error::need_buffer) co_return;
        const std::size_t got = sizeof(block) - req.body().size;
        if (sink) {
          bytes += got;
          hash = Fnv1a(std::string_view(block, got), hash);
          u.sink_bytes_.fetch_add(got);
        } else {
          body.append(block, got);
        }
      }
      const bool keep_alive = req.keep_alive();

      if (target.starts_with("/echo")) {
        SeenRequest seen;
        seen.method = std::string(req.method_string());
        seen.target = full_target;
        for (const auto& f : req) seen.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
        seen.body = body;
        {
          std::lock_guard lock(u.mu_);
          u.last_echo_ = std::move(seen);
        }
        bhttp::response<bhttp::string_body> res(bhttp::status::ok, 11);
        res.set(bhttp::field::content_type, "text/plain");
        res.insert("Connection", "X-Hop");
        res.insert("X-Hop", "hop value");
        res.insert("Keep-Alive", "timeout=77");
        res.insert("X-Secret", "s");
        res.insert("Set-Cookie", "a=1; Path=/");
        res.insert("Set-Cookie", "b=2; HttpOnly");
        res.insert("X-Upstream", "yes");
        res.body() = body;
        res.prepare_payload();
        auto [w_ec, w] = co_await bhttp::async_write(s, res, kTuple);
        (void)w;
        if (w_ec) co_return;
      } else if (sink) {
        char text[96];
        const int len = std::snprintf(text, sizeof(text), "bytes=%llu fnv=%016llx",
                                      static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(hash));
        bhttp::response<bhttp::string_body> res(bhttp::status::ok, 11);
        res.body().assign(text, static_cast<std::size_t>(len));
        res.prepare_payload();
        auto [w_ec, w] = co_await bhttp::async_write(s, res, kTuple);
        (void)w;
        if (w_ec) co_return;
      } else if (target.starts_with("/large")) {
        const std::uint64_t total = QueryNumber(target, "n", 1000);
        bhttp::response<bhttp::buffer_body> res(bhttp::status::ok, 11);
        res.chunked(true);
        bhttp::response_serializer<bhttp::buffer_body> sr(res);
        std::uint64_t sent = 0;
        while (sent < total) {
          const std::size_t piece = static_cast<std::size_t>(std::min<std::uint64_t>(16 * 1024, total - sent));
          const std::string data = Pattern(piece, static_cast<std::size_t>(sent));
          sent += piece;
          if (!co_await WritePieces(s, res, sr, data, true)) co_return;
        }
        if (!co_await WritePieces(s, res, sr, {}, false)) co_return;
      } else if (target.starts_with("/gated")) {
        const std::uint64_t total = QueryNumber(target, "n", 1000);
        const std::uint64_t first = std::min(total, QueryNumber(target, "first", total / 2));
        bhttp::response<bhttp::buffer_body> res(bhttp::status::ok, 11);
        res.content_length(total);
        bhttp::response_serializer<bhttp::buffer_body> sr(res);
        if (!co_await WritePieces(s, res, sr, Pattern(static_cast<std::size_t>(first)), true)) co_return;
        asio::steady_timer timer(io);
        while (!u.gate_.load()) {
          timer.expires_after(std::chrono::milliseconds(5));
          co_await timer.async_wait(kTuple);
        }
        const std::string rest = Pattern(static_cast<std::size_t>(total - first), static_cast<std::size_t>(first));
        if (!co_await WritePieces(s, res, sr, rest, false)) co_return;
      } else if (target.starts_with("/late")) {
        // /late?ms=N: 201 "late" after N ms.
        asio::steady_timer timer(io, std::chrono::milliseconds(QueryNumber(target, "ms", 300)));
        co_await timer.async_wait(kTuple);
        bhttp::response<bhttp::string_body> res(bhttp::status::created, 11);
        res.body() = "late";
        res.prepare_payload();
        auto [w_ec, w] = co_await bhttp::async_write(s, res, kTuple);
        (void)w;
        if (w_ec) co_return;
      } else if (target.starts_with("/slow")) {
        asio::steady_timer timer(io, std::chrono::seconds(20));
        co_await timer.async_wait(kTuple);
        bhttp::response<bhttp::string_body> res(bhttp::status::ok, 11);
        res.body() = "slow";
        res.prepare_payload();
        co_await bhttp::async_write(s, res, kTuple);
      } else if (target.starts_with("/close")) {
        bhttp::response<bhttp::string_body> res(bhttp::status::ok, 11);
        res.body() = "closing";
        res.prepare_payload();
        co_await bhttp::async_write(s, res, kTuple);
        boost::system::error_code ignored;
        s.shutdown(tcp::socket::shutdown_both, ignored);
        s.close(ignored);
        u.closed_after_answer_.fetch_add(1);
        co_return;
      } else if (target.starts_with("/halfclose")) {
        // 200 "ok" on a connection kept open; once OpenGate(), a FIN (the
        // write side closed), the read side still waiting for a request.
        bhttp::response<bhttp::string_body> res(bhttp::status::ok, 11);
        res.body() = "ok";
        res.prepare_payload();
        auto [w_ec, w] = co_await bhttp::async_write(s, res, kTuple);
        (void)w;
        if (w_ec) co_return;
        asio::steady_timer timer(io);
        while (!u.gate_.load()) {
          timer.expires_after(std::chrono::milliseconds(5));
          co_await timer.async_wait(kTuple);
        }
        boost::system::error_code ignored;
        s.shutdown(tcp::socket::shutdown_send, ignored);
        u.half_closed_.fetch_add(1);
      } else if (target.starts_with("/vanish")) {
        // Takes the request and goes away without a byte of answer, as an
        // upstream that crashed while handling it.
        boost::system::error_code ignored;
        s.shutdown(tcp::socket::shutdown_both, ignored);
        s.close(ignored);
        co_return;
      } else if (target.starts_with("/eof")) {
        // A body delimited by the connection's end, written in one piece
        // and followed at once by the FIN, so both usually arrive together.
        static constexpr std::string_view kWhole =
            "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nthe body ends where the connection does";
        co_await asio::async_write(s, asio::buffer(kWhole.data(), kWhole.size()), kTuple);
        boost::system::error_code ignored;
        s.shutdown(tcp::socket::shutdown_both, ignored);
        s.close(ignored);
        co_return;
      } else if (target.starts_with("/canned/")) {
        // Responses as some upstreams write them, byte for byte.
        static const std::string kHugeHead = "HTTP/1.1 201 Created\r\nX-Filler: " + std::string(70 * 1024, 'f') +
                                             "\r\nContent-Length: 2\r\n\r\nok";
        // A head a few bytes past the 64 KiB limit, its last bytes read after
        // the parser took the status line (the proxy reads 4 KiB at a time).
        static const std::string kJustOverHead = "HTTP/1.1 201 Created\r\nX-Filler: " + std::string(65485, 'f') +
                                                 "\r\nContent-Length: 2\r\n\r\nok";
        // 16 MiB of 103 heads, then a 200: more than a client that reads
        // nothing takes, so the gateway's write of an interim head stalls.
        static const std::string kHintFlood = [] {
          const std::string one = "HTTP/1.1 103 Early Hints\r\nLink: </" + std::string(1000, 'a') + ">\r\n\r\n";
          std::string all;
          while (all.size() < (16u << 20)) all += one;
          return all + "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
        }();
        static const std::pair<std::string_view, std::string_view> kCanned[] = {
            {"hint-flood", kHintFlood},
            {"two-lengths", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nContent-Length: 5\r\n\r\nhello"},
            {"early-hints",
             "HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n"
             "Connection: X-Hop\r\nX-Hop: 1\r\nContent-Length: 7\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n"
             "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"},
            {"dated", "HTTP/1.1 200 OK\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\nContent-Length: 5\r\n\r\nhello"},
            {"length-list", "HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello"},
            {"length-zeros", "HTTP/1.1 200 OK\r\nContent-Length: 0005\r\n\r\nhello"},
            {"204-length", "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"},
            {"gzip-length", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nContent-Length: 5\r\n\r\nhello"},
            {"gzip-chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
            {"status-600", "HTTP/1.1 600 Beyond\r\nContent-Length: 2\r\n\r\nok"},
            {"status-999", "HTTP/1.1 999 Beyond\r\nContent-Length: 2\r\n\r\nok"},
            {"status-099", "HTTP/1.1 099 Below\r\nContent-Length: 2\r\n\r\nok"},
            {"304-length", "HTTP/1.1 304 Not Modified\r\nContent-Length: 007\r\nETag: \"e\"\r\n\r\n"},
            // Final statuses with a head the proxy refuses.
            {"201-length-chunked",
             "HTTP/1.1 201 Created\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
            {"201-gzip-chunked",
             "HTTP/1.1 201 Created\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
            {"201-two-lengths", "HTTP/1.1 201 Created\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"},
            {"201-huge-head", kHugeHead},
            {"201-head-just-over", kJustOverHead},
            {"201-bare-cr", "HTTP/1.1 201 Created\r\nX-A: a\rb\r\nContent-Length: 2\r\n\r\nok"},
            // Heads the proxy mends (bare LF line ends, no space after the
            // status code) before parsing them.
            {"201-bare-lf", "HTTP/1.1 201 Created\nContent-Length: 2\nX-A: b\n\nok"},
            {"201-some-bare-lf", "HTTP/1.1 201 Created\r\nContent-Length: 2\nX-A: b\r\n\nok"},
            {"201-no-reason", "HTTP/1.1 201\r\nContent-Length: 2\r\nX-A: b\r\n\r\nok"},
            {"201-no-reason-bare-lf", "HTTP/1.1 201\nX-A: b\nContent-Length: 2\n\nok"},
            {"100-bare-lf-then-201", "HTTP/1.1 100 Continue\n\nHTTP/1.1 201 Created\nX-A: b\nContent-Length: 2\n\nok"},
            {"201-bare-lf-body", "HTTP/1.1 201 Created\nContent-Length: 6\nX-A: b\n\no\nk\r\n\n"},
            {"100-then-201-two-lengths",
             "HTTP/1.1 100 Continue\r\n\r\n"
             "HTTP/1.1 201 Created\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"},
            {"500-length-chunked",
             "HTTP/1.1 500 Oops\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
            {"101-upgrade", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n"},
        };
        const std::string_view name = std::string_view(target).substr(8);
        std::string_view bytes;
        for (const auto& [n, b] : kCanned) {
          if (n == name) bytes = b;
        }
        auto [w_ec, w] = co_await asio::async_write(s, asio::buffer(bytes.data(), bytes.size()), kTuple);
        (void)w;
        if (w_ec || bytes.empty()) co_return;
      } else if (target.starts_with("/stray")) {
        const std::uint64_t status = QueryNumber(target, "status", 200);
        const bool announce = QueryNumber(target, "announce", 0) != 0 || req.method() == bhttp::verb::head;
        std::string head = "HTTP/1.1 " + std::to_string(status) + " Whatever\r\n";
        if (announce) {
          head += "Content-Length: " + std::to_string(kStray.size()) + "\r\n\r\n";
        } else if (status == 200) {
          head += "Content-Length: 2\r\n\r\nok";
        } else {
          head += "\r\n";
        }
        auto [w_ec, w] = co_await asio::async_write(s, asio::buffer(head), kTuple);
        (void)w;
        if (w_ec) co_return;
        asio::steady_timer timer(io);
        while (!u.gate_.load()) {
          timer.expires_after(std::chrono::milliseconds(5));
          co_await timer.async_wait(kTuple);
        }
        auto [s_ec, sn] = co_await asio::async_write(s, asio::buffer(kStray.data(), kStray.size()), kTuple);
        (void)sn;
        if (s_ec) co_return;
        u.stray_written_.fetch_add(1);
      } else if (target.starts_with("/reset")) {
        // Part of a response, then a reset (SO_LINGER 0) right behind it:
        // both reach the gateway before it reads.
        const bool in_head = target.find("at=head") != std::string::npos;
        static constexpr std::string_view kHeadPart = "HTTP/1.1 200 OK\r\nContent-Le";
        static constexpr std::string_view kBodyPart = "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789";
        const std::string_view part = in_head ? kHeadPart : kBodyPart;
        boost::system::error_code ignored;
        s.set_option(asio::socket_base::linger(true, 0), ignored);
        (void)::send(s.native_handle(), part.data(), part.size(), MSG_NOSIGNAL);
        s.close(ignored);
        co_return;
      } else if (target.starts_with("/die")) {
        static constexpr std::string_view kTorso = "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789";
        co_await asio::async_write(s, asio::buffer(kTorso.data(), kTorso.size()), kTuple);
        boost::system::error_code ignored;
        s.shutdown(tcp::socket::shutdown_both, ignored);
        s.close(ignored);
        co_return;
      } else {
        bhttp::response<bhttp::string_body> res(bhttp::status::not_found, 11);
        res.body() = "not found";
        res.prepare_payload();
        auto [w_ec, w] = co_await bhttp::async_write(s, res, kTuple);
        (void)w;
        if (w_ec) co_return;
      }
      if (!keep_alive) co_return;
    }
  }

  TestUpstream& u;
  asio::io_context io{1};
  tcp::acceptor acceptor;
  std::thread thread;
};

TestUpstream::TestUpstream() : impl_(std::make_unique<Impl>(*this)) {
  const tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"), 0);
  impl_->acceptor.open(endpoint.protocol());
  impl_->acceptor.set_option(asio::socket_base::reuse_address(true));
  impl_->acceptor.bind(endpoint);
  impl_->acceptor.listen();
  port_ = impl_->acceptor.local_endpoint().port();
  asio::co_spawn(impl_->io, impl_->Accept(), asio::detached);
  impl_->thread = std::thread([this] { impl_->io.run(); });
}

TestUpstream::~TestUpstream() {
  impl_->io.stop();
  impl_->thread.join();
}

SeenRequest TestUpstream::last_echo() const {
  std::lock_guard lock(mu_);
  return last_echo_;
}

}  // namespace idemgate::httptest
