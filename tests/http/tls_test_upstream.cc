#include "tls_test_upstream.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <string_view>
#include <thread>

#include "test_upstream.h"

namespace idemgate::httptest {

namespace asio = boost::asio;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

namespace {

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

// The value of the Content-Length field in `head` (0 without one).
std::uint64_t ContentLength(std::string_view head) {
  static constexpr std::string_view kName = "\r\ncontent-length:";
  for (std::size_t i = 0; i + kName.size() <= head.size(); ++i) {
    std::size_t j = 0;
    while (j < kName.size() && std::tolower(static_cast<unsigned char>(head[i + j])) == kName[j]) ++j;
    if (j < kName.size()) continue;
    std::size_t v = i + j;
    while (v < head.size() && head[v] == ' ') ++v;
    std::uint64_t n = 0;
    std::from_chars(head.data() + v, head.data() + head.size(), n);
    return n;
  }
  return 0;
}

}  // namespace

struct TlsTestUpstream::Impl {
  Impl(TlsTestUpstream& owner, const std::string& cert_file, const std::string& key_file)
      : u(owner), context(ssl::context::tls_server), acceptor(io) {
    context.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                        ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
    context.use_certificate_chain_file(cert_file);
    context.use_private_key_file(key_file, ssl::context::pem);
  }

  asio::awaitable<void> Accept() {
    for (;;) {
      auto [ec, socket] = co_await acceptor.async_accept(kTuple);
      if (ec) co_return;
      u.connections_.fetch_add(1);
      asio::co_spawn(io, Serve(std::move(socket)), asio::detached);
    }
  }

  asio::awaitable<void> Serve(tcp::socket socket) {
    ssl::stream<tcp::socket> s(std::move(socket), context);
    if (auto [ec] = co_await s.async_handshake(ssl::stream_base::server, kTuple); ec) co_return;
    std::string in;
    std::string piece(64 * 1024, '\0');
    for (;;) {
      std::size_t end;
      while ((end = in.find("\r\n\r\n")) == std::string::npos) {
        auto [ec, n] = co_await s.async_read_some(asio::buffer(piece), kTuple);
        if (ec) co_return;
        in.append(piece.data(), n);
      }
      u.requests_.fetch_add(1);
      const std::string head = in.substr(0, end + 4);
      in.erase(0, end + 4);
      const std::string_view line(head.data(), head.find("\r\n"));
      const std::size_t sp = line.find(' ');
      const std::string_view target = line.substr(sp + 1, line.rfind(' ') - sp - 1);
      if (target.find("continue=1") != std::string_view::npos) {
        static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
        if (auto [ec, n] = co_await asio::async_write(s, asio::buffer(kContinue), kTuple); ec) co_return;
        asio::steady_timer pause(io, std::chrono::milliseconds(200));
        co_await pause.async_wait(kTuple);
      }
      if (target.starts_with("/reset")) {
        boost::system::error_code ignored;
        s.next_layer().close(ignored);
        co_return;
      }
      if (target.starts_with("/early")) {
        std::string_view status = "201";
        if (const std::size_t at = target.find("status="); at != std::string_view::npos) {
          status = target.substr(at + 7, 3);
        }
        const std::string answer = "HTTP/1.1 " + std::string(status) + " Early\r\nContent-Length: 5\r\n\r\nearly";
        if (auto [ec, n] = co_await asio::async_write(s, asio::buffer(answer), kTuple); ec) co_return;
        asio::steady_timer hold(io, std::chrono::hours(1));
        co_await hold.async_wait(kTuple);
        co_return;
      }
      // /sink (and anything else): the body, read whole.
      std::uint64_t left = ContentLength(head);
      std::uint64_t bytes = 0;
      std::uint64_t fnv = Fnv1a({});
      while (left > 0) {
        if (in.empty()) {
          auto [ec, n] = co_await s.async_read_some(asio::buffer(piece), kTuple);
          if (ec) co_return;
          in.append(piece.data(), n);
        }
        const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(left, in.size()));
        fnv = Fnv1a(std::string_view(in.data(), take), fnv);
        bytes += take;
        left -= take;
        in.erase(0, take);
      }
      char body[96];
      const int len = std::snprintf(body, sizeof(body), "bytes=%llu fnv=%016llx",
                                    static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(fnv));
      const std::string answer =
          "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(len) + "\r\n\r\n" + std::string(body, len);
      if (auto [ec, n] = co_await asio::async_write(s, asio::buffer(answer), kTuple); ec) co_return;
    }
  }

  TlsTestUpstream& u;
  asio::io_context io{1};
  ssl::context context;
  tcp::acceptor acceptor;
  std::thread thread;
};

TlsTestUpstream::TlsTestUpstream(const std::string& cert_file, const std::string& key_file)
    : impl_(std::make_unique<Impl>(*this, cert_file, key_file)) {
  const tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"), 0);
  impl_->acceptor.open(endpoint.protocol());
  impl_->acceptor.set_option(asio::socket_base::reuse_address(true));
  impl_->acceptor.bind(endpoint);
  impl_->acceptor.listen();
  port_ = impl_->acceptor.local_endpoint().port();
  asio::co_spawn(impl_->io, impl_->Accept(), asio::detached);
  impl_->thread = std::thread([this] { impl_->io.run(); });
}

TlsTestUpstream::~TlsTestUpstream() {
  impl_->io.stop();
  impl_->thread.join();
}

}  // namespace idemgate::httptest
