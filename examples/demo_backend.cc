// demo_backend: a tiny payments API to put behind idemgate in the quickstart.
//
//   demo_backend [--port 9001] [--host 127.0.0.1]
//
//   POST /api/v1/payments       201 {"payment_id", "amount", "currency", "execution", "status"};
//                               "amount" and "currency" are copied from the JSON request body when
//                               present; "execution" counts the payments this process has executed;
//                               "status" is always "succeeded"
//   GET  /api/v1/payments/{id}  200 with the stored payment, 404 if unknown
//   GET  /healthz               200 {"status": "ok"}
//   anything else               404 JSON
//
// Every executed payment is printed, so a replay that idemgate answers from its
// store visibly does not reach the backend. Single-threaded; not for production.
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <cstdint>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <string_view>

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace json = boost::json;
using tcp = asio::ip::tcp;

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);
constexpr std::string_view kPayments = "/api/v1/payments";

class Backend {
 public:
  http::response<http::string_body> Handle(const http::request<http::string_body>& req) {
    const std::string_view target = req.target();
    const std::string_view path = target.substr(0, target.find('?'));
    if (path == "/healthz") return Reply(req, http::status::ok, json::object{{"status", "ok"}});
    if (path == kPayments && req.method() == http::verb::post) return CreatePayment(req);
    if (path.starts_with(kPayments) && path.size() > kPayments.size() + 1 &&
        path[kPayments.size()] == '/' && req.method() == http::verb::get) {
      const std::string id(path.substr(kPayments.size() + 1));
      auto it = payments_.find(id);
      if (it == payments_.end()) {
        return Reply(req, http::status::not_found,
                     json::object{{"error", "no such payment"}, {"payment_id", id}});
      }
      return Reply(req, http::status::ok, it->second);
    }
    return Reply(req, http::status::not_found,
                 json::object{{"error", "not found"}, {"path", path}});
  }

 private:
  http::response<http::string_body> CreatePayment(const http::request<http::string_body>& req) {
    json::object request;
    if (!req.body().empty()) {
      boost::system::error_code ec;
      json::value body = json::parse(req.body(), ec);
      if (ec || !body.is_object()) {
        return Reply(req, http::status::bad_request,
                     json::object{{"error", "the body must be a JSON object"}});
      }
      request = std::move(body.as_object());
    }
    ++executions_;
    const std::string id = NewId();
    json::object payment;
    payment["payment_id"] = id;
    for (const char* field : {"amount", "currency"}) {
      if (auto* v = request.if_contains(field)) payment[field] = *v;
    }
    payment["execution"] = executions_;
    payment["status"] = "succeeded";
    payments_[id] = payment;
    std::cout << "demo_backend: executed payment " << id << " (execution " << executions_ << ")"
              << std::endl;
    auto res = Reply(req, http::status::created, payment);
    res.set(http::field::location, std::string(kPayments) + "/" + id);
    return res;
  }

  std::string NewId() {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string id = "pay_";
    std::uint64_t bits = random_();
    for (int i = 0; i < 16; ++i, bits >>= 4) id += kHex[bits & 15];
    return id;
  }

  static http::response<http::string_body> Reply(const http::request<http::string_body>& req,
                                                 http::status status, const json::object& body) {
    http::response<http::string_body> res(status, req.version());
    res.set(http::field::server, "demo_backend");
    res.set(http::field::content_type, "application/json");
    res.body() = json::serialize(body);
    res.keep_alive(req.keep_alive());
    res.prepare_payload();
    return res;
  }

  std::mt19937_64 random_{std::random_device{}()};
  std::uint64_t executions_ = 0;
  std::map<std::string, json::object> payments_;
};

asio::awaitable<void> Session(tcp::socket socket, Backend& backend) {
  beast::flat_buffer buffer;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(1024 * 1024);
    auto [ec, n] = co_await http::async_read(socket, buffer, parser, kTuple);
    if (ec) break;
    const auto res = backend.Handle(parser.get());
    auto [wec, wn] = co_await http::async_write(socket, res, kTuple);
    if (wec || !res.keep_alive()) break;
  }
  beast::error_code ignored;
  socket.shutdown(tcp::socket::shutdown_send, ignored);
}

asio::awaitable<void> Accept(tcp::acceptor& acceptor, Backend& backend) {
  for (;;) {
    auto [ec, socket] = co_await acceptor.async_accept(kTuple);
    if (ec == asio::error::operation_aborted) co_return;
    if (ec) continue;
    asio::co_spawn(acceptor.get_executor(), Session(std::move(socket), backend), asio::detached);
  }
}

constexpr std::string_view kUsage = "usage: demo_backend [--port 9001] [--host 127.0.0.1]\n";

int Usage() {
  std::cerr << kUsage;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string host = "127.0.0.1";
  unsigned long port = 9001;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (i + 1 >= argc) return Usage();
    const std::string value = argv[++i];
    if (arg == "--port") {
      char* end = nullptr;
      port = std::strtoul(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || port > 65535) return Usage();
    } else if (arg == "--host") {
      host = value;
    } else {
      return Usage();
    }
  }

  asio::io_context ioc;
  beast::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (ec) {
    std::cerr << "demo_backend: bad --host " << host << ": " << ec.message() << "\n";
    return 2;
  }
  const tcp::endpoint endpoint(address, static_cast<std::uint16_t>(port));
  tcp::acceptor acceptor(ioc);
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    std::cerr << "demo_backend: cannot listen on " << host << ":" << port << ": " << ec.message()
              << "\n";
    return 1;
  }

  Backend backend;
  asio::co_spawn(ioc, Accept(acceptor, backend), asio::detached);
  asio::signal_set signals(ioc, SIGINT, SIGTERM);
  signals.async_wait([&ioc](const beast::error_code&, int) { ioc.stop(); });
  std::cout << "demo_backend: listening on " << host << ":" << acceptor.local_endpoint().port()
            << std::endl;
  ioc.run();
  return 0;
}
