#pragma once

// The pool's internals, shared by upstream_pool.cc and proxy.cc. Internal
// to src/http: include only from .cc files of src/http.

#include <poll.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "http/internal/exchange_impl.h"
#include "http/upstream_pool.h"

namespace idemgate::http {
namespace internal {

// One TCP connection to the upstream with its read buffer and deadline, and
// for an https upstream the TLS session over it. The deadline cancels the
// socket, which also ends a TLS operation waiting on it.
struct UpstreamConnection {
  explicit UpstreamConnection(Worker::Impl& w)
      : socket(w.io), deadline(w.watchdog, &CancelSocket, &socket) {}

  tcp::socket socket;
  std::unique_ptr<TlsStream> tls;  // set once the handshake succeeded (https only)
  beast::flat_buffer buffer;
  Deadline deadline;
  SteadyTime idle_since{};
  bool reused = false;  // taken from the idle list (it served a request before)
};

struct Acquired {
  std::unique_ptr<UpstreamConnection> connection;  // null on failure
  bool timed_out = false;  // connect (or waiting for a free connection) took too long
  std::string error;       // why, on failure
  // When the connect began (or the idle connection was taken): the start of
  // the upstream exchange, without the wait for a free connection.
  SteadyTime since = SteadyClock::now();
};

}  // namespace internal

struct UpstreamPool::Impl {
  Impl(Worker& worker, UpstreamTarget target);

  // A connection for one exchange: an idle one that still looks alive (most
  // recently used first) unless `fresh_only`, else a new one if the pool is
  // below max_connections, else waits up to connect_timeout for one to be
  // returned. Neither the wait nor the connect goes past `by` (a keyed
  // request's last moment to be sent inside its lease).
  Task<internal::Acquired> Acquire(bool fresh_only, internal::SteadyTime by = internal::SteadyTime::max());
  // The idle part of Acquire without a coroutine (the common case under
  // load): an idle connection that still looks alive (neither closed by the
  // upstream nor holding unread bytes), or null.
  std::unique_ptr<internal::UpstreamConnection> TakeIdle();
  // Gives a connection back: kept idle when `reusable`, else closed. Wakes
  // one waiter.
  void Release(std::unique_ptr<internal::UpstreamConnection> connection, bool reusable);
  // Closes the idle connections the upstream closed, that hold bytes nobody
  // asked for, or that are past idle_timeout: on every watchdog tick, so
  // that none lingers (in CLOSE-WAIT, holding a descriptor and the
  // upstream's resources) until a request would take it. One poll() for all
  // of them, none when the pool has no idle connection.
  void SweepIdle(internal::SteadyTime now);

  Worker& worker;
  Worker::Impl& w;
  UpstreamTarget target;
  std::optional<boost::asio::ip::address> address;  // set when target.host is an IP literal
  std::vector<std::unique_ptr<internal::UpstreamConnection>> idle;
  std::list<boost::asio::steady_timer*> waiters;
  std::size_t open = 0;
  std::uint64_t connects = 0;
  std::vector<pollfd> polls;  // SweepIdle's, kept for its capacity
  internal::Ticker sweeper;

 private:
  Task<internal::Acquired> Connect(internal::SteadyTime by);
  void WakeOne();
};

}  // namespace idemgate::http
