#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/units.h"
#include "http/exchange.h"
#include "http/tls.h"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

// The HTTP/1.1 server (SPEC §2 step 1): one io_context per worker thread,
// each with its own acceptor on the same address (SO_REUSEPORT), so a
// connection and everything its requests do (upstream calls included) stay
// on one thread. Keep-alive; pipelined requests are answered in order, one
// at a time (the next request is read after the response).
namespace idemgate::http {

using namespace std::chrono_literals;

// Per-request limits and timeouts (config `limits`).
struct Limits {
  std::uint32_t max_header_bytes = 16 * 1024;        // request line + header block
  std::uint64_t max_request_bytes = 10 * 1024 * 1024;  // default body limit
  Duration header_timeout = 10s;  // from a request's first byte to the end of its header block
  Duration idle_timeout = 60s;    // keep-alive wait for the next request; also bounds
                                  // each body read from and each write to the client
  // Runs of '/' in a request path become one before routing and forwarding
  // (config `merge_slashes`); see http::NormalizePath.
  bool merge_slashes = true;
  // Client connections open at once over all workers (config
  // `limits.max_connections`); one beyond is closed as soon as it is
  // accepted, and Handler::ConnectionRefused is called. 0: no limit.
  std::size_t max_connections = 0;
  // What the refusal's log line names as the limit reached (a literal).
  std::string_view max_connections_name = "limits.max_connections";
};

// A request the server refused before it reached the handler (its head was
// unacceptable), or one whose head did not arrive in time. Views are valid
// for the call only.
struct RefusedRequest {
  int status = 0;            // the status answered; 0 for header_timeout (no answer)
  // "bad_request" (400: malformed request line, header or framing, or a head
  // the server does not accept), "uri_too_long" (414), "headers_too_large"
  // (431), "version_not_supported" (505: not HTTP/1.x), "header_timeout"
  // (the head was not whole within header_timeout of its first byte; the
  // connection is closed without an answer).
  std::string_view reason;
  std::string_view method;      // empty when the request line was not read whole
  std::string_view path;        // the request target without its query; empty likewise
  std::string_view request_id;  // sent back as X-Request-Id; empty for header_timeout
  std::string_view peer_ip;
  double duration_ms = 0;       // from the request's first byte
};

// Handles the requests of one listener. Handle runs on the exchange's worker
// thread and must leave a response sent (Respond or Forward); if it does
// not, the server answers 500. Must be safe to call concurrently from all
// workers.
class Handler {
 public:
  virtual ~Handler() = default;
  virtual Task<void> Handle(Exchange& exchange) = 0;
  // A request the server answered itself (400, 414, 431) before Handle, or
  // a connection it closed because a request's head did not arrive within
  // header_timeout; called on the worker thread before the answer is
  // written, so that such requests are logged and counted too. Must not
  // throw. Default: nothing.
  virtual void Refused(const RefusedRequest& /*refused*/) {}
  // A connection closed as soon as it was accepted because
  // Limits::max_connections were open; called on the worker thread. Must
  // not throw. Default: nothing.
  virtual void ConnectionRefused() {}
  // A client's TLS handshake on this listener failed or did not finish
  // within limits.header_timeout (the connection is closed without an
  // answer); called on the worker thread. Must not throw. Default: nothing.
  virtual void TlsHandshakeFailed() {}
};

// One I/O thread: its io_context, watchdog and connections. Opaque outside
// src/http (Impl is defined in http/internal/worker_impl.h); obtained from
// Exchange::worker() or Server::worker(). Owned by the Server.
class Worker {
 public:
  struct Impl;
  Worker(std::size_t index, std::unique_ptr<Impl> impl);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  std::size_t index() const { return index_; }
  Impl& impl() { return *impl_; }

 private:
  std::size_t index_;
  std::unique_ptr<Impl> impl_;
};

struct ServerOptions {
  std::size_t workers = 0;  // 0: std::thread::hardware_concurrency()
  Limits limits;
  // How often the per-worker watchdog checks deadlines; timeouts fire up to
  // this late.
  Duration tick = 100ms;
  // Called on each worker thread before it starts running its io_context,
  // and after it stopped (the io_context still exists then); e.g. for
  // core::Store::AttachWorker / DetachWorker. Server::Start returns after
  // every worker's on_worker_start has returned.
  std::function<void(boost::asio::io_context&)> on_worker_start;
  std::function<void(boost::asio::io_context&)> on_worker_stop;
};

struct BoundAddress {
  std::string host;  // as given ("127.0.0.1", "::1")
  std::uint16_t port = 0;
  std::string ToString() const;  // "127.0.0.1:8080", "[::1]:8080"
};

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();  // Stop(0s) when still running
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and listens on host:port before Start. `all_workers`: one acceptor
  // per worker with SO_REUSEPORT (port 0: the first acceptor takes an
  // ephemeral port and the others bind that port); else one acceptor on
  // worker 0. `handler` must outlive the server. With `tls` (which must
  // outlive the server too), every connection starts with a TLS handshake
  // using the slot's context at the time it is accepted.
  StatusOr<BoundAddress> Listen(const std::string& host, std::uint16_t port, Handler& handler, bool all_workers,
                                TlsContextSlot* tls = nullptr);

  // Starts the worker threads; accepting begins. Returns once every worker
  // has run ServerOptions::on_worker_start.
  void Start();

  // Graceful stop (blocks): closes the listeners, closes idle keep-alive
  // connections, lets in-flight requests finish (their responses carry
  // Connection: close) for up to `grace`, then cancels whatever remains and
  // waits for the workers to unwind. Returns true when every connection
  // finished within `grace`. Idempotent; callable from any thread except a
  // worker thread.
  bool Stop(Duration grace);

  // Ends the grace of a Stop running (or about to run) at once: what
  // remains is cancelled as when the grace is over. Thread-safe; for a
  // second SIGTERM during the drain.
  void EndGrace() { grace_ended_.store(true, std::memory_order_relaxed); }

  // New limits for requests that start after the call (config reload).
  // Thread-safe.
  void SetLimits(const Limits& limits);

  std::size_t worker_count() const { return workers_.size(); }
  Worker& worker(std::size_t i) { return *workers_[i]; }
  // Connections open now, over all workers (approximate while running).
  std::size_t open_connections() const;

 private:
  ServerOptions options_;
  // Connections accepted and not yet closed, over all workers: what
  // Limits::max_connections bounds. Outlives the workers.
  std::atomic<std::size_t> admitted_{0};
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::thread> threads_;
  bool started_ = false;
  bool stopped_ = false;
  std::atomic<bool> grace_ended_{false};
};

}  // namespace idemgate::http
