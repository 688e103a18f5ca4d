#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "common/units.h"

// A keep-alive connection pool to one upstream, owned by one worker
// (io_context): connections never cross threads, and each worker has its
// own pool per upstream. Not thread-safe: use it only on its worker's thread.
namespace idemgate::http {

using namespace std::chrono_literals;

class Worker;
class TlsContext;

struct UpstreamTarget {
  std::string name;       // for logs
  std::string host;       // IP literal or DNS name (resolved at each connect)
  std::uint16_t port = 80;
  std::string base_path;  // "" or "/x": prepended to every forwarded target
  Duration connect_timeout = 2s;
  // Bounds one whole upstream exchange, from the first byte of the request
  // written to the last byte of the response read.
  Duration timeout = 30s;
  // Connections this pool may have open at once (the gateway gives each
  // worker its share of the upstream's max_connections). A request that
  // finds them all busy waits up to connect_timeout for one, then fails 502.
  std::uint32_t max_connections = 256;
  // Idle connections are closed once idle this long (noticed on the
  // worker's next watchdog tick, and never reused past it). Sooner when the
  // upstream closes one or writes on it while idle.
  Duration idle_timeout = 55s;
  // false: no connection is reused; each request is sent with
  // "Connection: close" on a connection of its own.
  bool keepalive = true;
  // https upstreams: the TLS context (tls.h), and the name sent as
  // SNI and required in the server's certificate (`host` when empty). Null
  // for plain http.
  std::shared_ptr<const TlsContext> tls;
  std::string tls_server_name;

  // The port a Host header may leave out: 443 with TLS, else 80.
  std::uint16_t default_port() const { return tls ? 443 : 80; }
};

class UpstreamPool {
 public:
  struct Impl;

  // `worker` must outlive the pool; the pool must outlive every exchange
  // that forwards through it.
  UpstreamPool(Worker& worker, UpstreamTarget target);
  ~UpstreamPool();
  UpstreamPool(const UpstreamPool&) = delete;
  UpstreamPool& operator=(const UpstreamPool&) = delete;

  const UpstreamTarget& target() const;
  Worker& worker();
  // Connections open now (idle + in use) and idle in the pool.
  std::size_t open_connections() const;
  std::size_t idle_connections() const;
  // TCP connections made since the pool was created.
  std::uint64_t connects() const;
  // Closes idle connections; in-use ones are closed when returned.
  void CloseIdle();

  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace idemgate::http
