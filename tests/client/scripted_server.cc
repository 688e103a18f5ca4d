#include "client/scripted_server.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <cctype>
#include <deque>
#include <mutex>
#include <thread>

#include "fakes/testing.h"

namespace idemgate::client::testing {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// The bytes of a canned answer: status line, its headers, Content-Length and Connection: close.
std::string Serialize(const Canned& canned) {
  std::string out = "HTTP/1.1 " + std::to_string(canned.status) + " Scripted\r\n";
  for (const auto& [name, value] : canned.headers) out += name + ": " + value + "\r\n";
  out += "Content-Length: " + std::to_string(canned.body.size()) + "\r\nConnection: close\r\n\r\n";
  out += canned.body;
  return out;
}

}  // namespace

Canned Canned::Answer(int status, std::vector<client::Header> headers, std::string body) {
  return Canned{Kind::kAnswer, status, std::move(headers), std::move(body)};
}

Canned Canned::Problem(int status, std::string_view code, std::vector<client::Header> headers) {
  headers.emplace_back("Content-Type", "application/problem+json");
  boost::json::object body{{"type", "urn:idemgate:problem:" + std::string(code)},
                           {"status", status},
                           {"code", code}};
  return Canned{Kind::kAnswer, status, std::move(headers), boost::json::serialize(body)};
}

Canned Canned::Raw(std::string bytes) { return Canned{Kind::kRaw, 0, {}, std::move(bytes)}; }
Canned Canned::Close() { return Canned{Kind::kClose, 0, {}, ""}; }
Canned Canned::NeverAnswer() { return Canned{Kind::kNeverAnswer, 0, {}, ""}; }

std::optional<std::string> Recorded::Get(std::string_view name) const {
  for (const auto& [field, value] : headers) {
    if (idemgate::testing::IEquals(field, name)) return value;
  }
  return std::nullopt;
}

int Recorded::Count(std::string_view name) const {
  int n = 0;
  for (const auto& header : headers) n += idemgate::testing::IEquals(header.first, name) ? 1 : 0;
  return n;
}

struct ScriptedServer::Impl {
  // One accepted connection: read one request, then act on the script.
  struct Connection : std::enable_shared_from_this<Connection> {
    Connection(Impl& server, tcp::socket socket) : server(server), socket(std::move(socket)) {
      parser.body_limit(256 * 1024 * 1024);
    }

    void Start() {
      http::async_read(socket, buffer, parser, [self = shared_from_this()](beast::error_code ec, std::size_t) {
        if (!ec) self->OnRequest();
      });
    }

    void OnRequest() {
      auto& message = parser.get();
      Recorded recorded;
      recorded.method = std::string(message.method_string());
      recorded.target = std::string(message.target());
      for (const auto& field : message) {
        recorded.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
      }
      recorded.body = message.body();
      const Canned action = server.Next(std::move(recorded));
      switch (action.kind) {
        case Canned::Kind::kAnswer:
          Write(Serialize(action));
          break;
        case Canned::Kind::kRaw:
          Write(action.body);
          break;
        case Canned::Kind::kClose: {
          beast::error_code ignored;
          socket.close(ignored);
          break;
        }
        case Canned::Kind::kNeverAnswer:
          server.held.push_back(shared_from_this());  // open until the server stops
          break;
      }
    }

    void Write(std::string bytes) {
      out = std::move(bytes);
      asio::async_write(socket, asio::buffer(out), [self = shared_from_this()](beast::error_code, std::size_t) {
        beast::error_code ignored;
        self->socket.shutdown(tcp::socket::shutdown_send, ignored);
        self->socket.close(ignored);
      });
    }

    Impl& server;
    tcp::socket socket;
    beast::flat_buffer buffer;
    http::request_parser<http::string_body> parser;
    std::string out;
  };

  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::vector<std::shared_ptr<Connection>> held;  // touched only on the server thread
  std::uint16_t port = 0;
  std::thread thread;

  mutable std::mutex mu;
  std::deque<Canned> script;
  std::vector<Recorded> recorded;

  // Records `request` and takes the next action.
  Canned Next(Recorded request) {
    std::lock_guard lock(mu);
    recorded.push_back(std::move(request));
    if (script.empty()) return Canned::Answer(599, {}, "the script is exhausted");
    Canned next = std::move(script.front());
    script.pop_front();
    return next;
  }

  void Accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec) return;
      std::make_shared<Connection>(*this, std::move(socket))->Start();
      Accept();
    });
  }
};

ScriptedServer::ScriptedServer() : impl_(std::make_unique<Impl>()) {
  const tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"), 0);
  impl_->acceptor.open(endpoint.protocol());
  impl_->acceptor.set_option(tcp::acceptor::reuse_address(true));
  impl_->acceptor.bind(endpoint);
  impl_->acceptor.listen();
  impl_->port = impl_->acceptor.local_endpoint().port();
  impl_->Accept();
  impl_->thread = std::thread([impl = impl_.get()] { impl->io.run(); });
}

ScriptedServer::~ScriptedServer() {
  impl_->io.stop();
  impl_->thread.join();
  impl_->held.clear();
}

void ScriptedServer::Push(Canned action) {
  std::lock_guard lock(impl_->mu);
  impl_->script.push_back(std::move(action));
}

std::vector<Recorded> ScriptedServer::requests() const {
  std::lock_guard lock(impl_->mu);
  return impl_->recorded;
}

std::uint16_t ScriptedServer::port() const { return impl_->port; }

std::string ScriptedServer::Url(std::string_view path) const {
  return "http://127.0.0.1:" + std::to_string(port()) + std::string(path);
}

std::uint16_t ClosedPort() {
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const std::uint16_t port = acceptor.local_endpoint().port();
  acceptor.close();
  return port;
}

}  // namespace idemgate::client::testing
