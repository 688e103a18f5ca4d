#include "http/upstream_pool.h"

#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>

#include <boost/asio/connect.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>

#include "common/log.h"
#include "common/tls_peer.h"
#include "http/internal/tls_io.h"
#include "http/internal/upstream_impl.h"
#include "http/internal/tls_impl.h"

namespace idemgate::http {

using internal::error_code;
using internal::kTuple;
using internal::tcp;
namespace asio = internal::asio;

namespace {

// True when an idle keep-alive connection was closed by the upstream or got
// bytes nobody asked for: it must not carry a request. Bytes that arrive on
// an idle connection belong to no request (a body written after a HEAD or
// 204 head, a late second response): on a reused connection they would be
// read as the next request's response.
bool LooksStale(tcp::socket& socket) {
  // poll() with no wait instead of a peeking recv(): the kernel answers it
  // from the socket's state without taking the socket's lock.
  pollfd p{socket.native_handle(), POLLIN | POLLRDHUP, 0};
  const int r = ::poll(&p, 1, 0);
  if (r == 0) return false;
  if (r < 0) return errno != EINTR;
  return true;  // readable (closed, or unsolicited bytes), hung up, or an error
}

long long WholeMillis(internal::SteadyClock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

void CancelResolver(void* resolver) { static_cast<tcp::resolver*>(resolver)->cancel(); }

void SweepPool(void* pool, internal::SteadyTime now) { static_cast<UpstreamPool::Impl*>(pool)->SweepIdle(now); }

// Prepares a TLS session over `socket` for `name`: SNI (for a DNS name; RFC
// 6066 leaves IP addresses out) and the name or address the certificate
// must carry, checked by OpenSSL during the handshake.
std::unique_ptr<internal::TlsStream> NewTlsStream(tcp::socket& socket, const TlsContext& tls,
                                                  const std::string& name, std::string* error) {
  auto stream = std::make_unique<internal::TlsStream>(socket, tls.impl().context);
  if (!SetTlsPeerName(stream->native_handle(), name)) {
    *error = "cannot set the TLS server name \"" + name + "\"";
    return nullptr;
  }
  return stream;
}

}  // namespace

UpstreamPool::Impl::Impl(Worker& worker_ref, UpstreamTarget t)
    : worker(worker_ref),
      w(worker_ref.impl()),
      target(std::move(t)),
      sweeper(w.watchdog, &SweepPool, this) {
  error_code ec;
  auto a = asio::ip::make_address(target.host, ec);
  if (!ec) address = a;
  if (target.max_connections == 0) target.max_connections = 1;
}

Task<internal::Acquired> UpstreamPool::Impl::Connect(internal::SteadyTime by) {
  internal::Acquired result;
  ++open;
  ++connects;
  auto connection = std::make_unique<internal::UpstreamConnection>(w);
  const internal::SteadyTime connect_by = result.since + target.connect_timeout;
  connection->deadline.ExpireAt(std::min(connect_by, by));
  error_code ec;
  if (address) {
    std::tie(ec) = co_await connection->socket.async_connect(tcp::endpoint(*address, target.port), kTuple);
  } else {
    tcp::resolver resolver(w.io);
    internal::Deadline resolve_deadline(w.watchdog, &CancelResolver, &resolver);
    resolve_deadline.ExpireAt(connection->deadline.at());
    auto [resolve_ec, endpoints] =
        co_await resolver.async_resolve(target.host, std::to_string(target.port), kTuple);
    if (resolve_ec || resolve_deadline.fired()) {
      ec = resolve_ec ? resolve_ec : asio::error::timed_out;
      result.timed_out = resolve_deadline.fired();
    } else {
      std::tie(ec, std::ignore) = co_await asio::async_connect(connection->socket, endpoints, kTuple);
    }
  }
  bool fired = connection->deadline.fired();
  std::string why;
  if (ec || fired) {
    why = !fired ? ec.message()
          : by < connect_by
              ? "not connected within the " + std::to_string(WholeMillis(by - result.since)) +
                    "ms left to send the request inside its idempotency key's lease"
              : std::string("connect timeout");
  } else {
    connection->socket.set_option(tcp::no_delay(true), ec);
    connection->socket.non_blocking(true, ec);
    EnableReceiveQueueHint(connection->socket);
    if (target.tls) {
      // The handshake shares the connect deadline: connect_timeout bounds
      // the whole way to a usable connection.
      const std::string& name = target.tls_server_name.empty() ? target.host : target.tls_server_name;
      std::unique_ptr<internal::TlsStream> stream = NewTlsStream(connection->socket, *target.tls, name, &why);
      if (stream) {
        const error_code hs_ec = co_await internal::TlsHandshake(*stream, /*as_server=*/false);
        fired = connection->deadline.fired();
        if (fired) {
          why = "TLS handshake timeout";
        } else if (hs_ec) {
          why = "TLS handshake failed: " + hs_ec.message() + TlsVerifyVerdict(stream->native_handle());
        } else {
          connection->tls = std::move(stream);
        }
      }
    }
  }
  connection->deadline.Disarm();
  if (!why.empty()) {
    result.timed_out = result.timed_out || fired;
    // The client is told the upstream's name and the reason; its address,
    // the network's inside, goes to the log only.
    static LogLimiter limiter;
    LogWarn(limiter, "cannot connect to upstream",
            {{"upstream", target.name},
             {"address", target.host + ":" + std::to_string(target.port)},
             {"error", why}});
    result.error = "cannot connect to upstream " + target.name + ": " + why;
    connection.reset();
    --open;
    WakeOne();
    co_return result;
  }
  result.connection = std::move(connection);
  co_return result;
}

std::unique_ptr<internal::UpstreamConnection> UpstreamPool::Impl::TakeIdle() {
  const auto now = internal::SteadyClock::now();
  while (!idle.empty()) {
    std::unique_ptr<internal::UpstreamConnection> c = std::move(idle.back());
    idle.pop_back();
    // Checked before every reuse, however short its idle time: an upstream
    // may write bytes after a response that looked complete (a body after
    // a HEAD or 204 head, a second response), and those would be taken as
    // the answer to this request and every later one on the connection.
    // The check also spares a request that cannot be sent twice an upstream
    // that closed the connection without saying so. It costs a system call
    // of about 1 us per request (docs/benchmarks.md).
    if (now - c->idle_since > target.idle_timeout || LooksStale(c->socket)) {
      error_code ec;
      c->socket.close(ec);
      --open;
      continue;
    }
    c->reused = true;
    return c;
  }
  return nullptr;
}

Task<internal::Acquired> UpstreamPool::Impl::Acquire(bool fresh_only, internal::SteadyTime by) {
  const auto began = internal::SteadyClock::now();
  const auto give_up = std::min(began + target.connect_timeout, by);
  for (;;) {
    if (!fresh_only) {
      if (auto c = TakeIdle()) co_return internal::Acquired{std::move(c), false, {}};
    } else if (!idle.empty() && open >= target.max_connections) {
      // A fresh connection is needed and the pool is full: make room.
      error_code ec;
      idle.front()->socket.close(ec);
      idle.erase(idle.begin());
      --open;
    }
    if (open < target.max_connections) co_return co_await Connect(by);
    if (internal::SteadyClock::now() >= give_up) {
      // Truthful about the time: a keyed request waits only as long as its
      // lease leaves room to send it, which may be less than connect_timeout.
      std::string error = "upstream " + target.name + ": all " + std::to_string(target.max_connections) +
                          " connections of this worker are busy; none became free within " +
                          std::to_string(WholeMillis(give_up - began)) + "ms";
      if (by < began + target.connect_timeout) error += ", the time left to send the request inside its lease";
      co_return internal::Acquired{nullptr, true, std::move(error)};
    }
    asio::steady_timer timer(w.io, give_up);
    auto it = waiters.insert(waiters.end(), &timer);
    co_await timer.async_wait(kTuple);
    // Woken by Release (which removed us) or timed out (still listed).
    for (auto i = waiters.begin(); i != waiters.end(); ++i) {
      if (*i == &timer) {
        waiters.erase(i);
        break;
      }
    }
    (void)it;
  }
}

void UpstreamPool::Impl::WakeOne() {
  if (waiters.empty()) return;
  asio::steady_timer* t = waiters.front();
  waiters.pop_front();
  t->cancel();
}

void UpstreamPool::Impl::Release(std::unique_ptr<internal::UpstreamConnection> connection, bool reusable) {
  if (!connection) return;
  connection->deadline.Disarm();
  // With TLS, bytes already decrypted but not yet read count as left over.
  const bool drained =
      connection->buffer.size() == 0 && (!connection->tls || SSL_pending(connection->tls->native_handle()) == 0);
  if (reusable && target.keepalive && !w.draining && drained && connection->socket.is_open()) {
    connection->idle_since = internal::SteadyClock::now();
    connection->reused = false;
    idle.push_back(std::move(connection));
  } else {
    error_code ec;
    connection->socket.close(ec);
    connection.reset();
    --open;
  }
  WakeOne();
}

void UpstreamPool::Impl::SweepIdle(internal::SteadyTime now) {
  if (idle.empty()) return;
  polls.resize(idle.size());
  for (std::size_t i = 0; i < idle.size(); ++i) polls[i] = {idle[i]->socket.native_handle(), POLLIN | POLLRDHUP, 0};
  const int ready = ::poll(polls.data(), polls.size(), 0);
  if (ready < 0) return;  // EINTR (or ENOMEM): the next tick tries again
  // `idle` is oldest first (Release appends): with nothing ready and the
  // oldest within idle_timeout, every connection stays.
  if (ready == 0 && now - idle.front()->idle_since <= target.idle_timeout) return;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < idle.size(); ++i) {
    if (polls[i].revents == 0 && now - idle[i]->idle_since <= target.idle_timeout) {
      if (kept != i) idle[kept] = std::move(idle[i]);
      ++kept;
      continue;
    }
    error_code ec;
    idle[i]->socket.close(ec);
    idle[i].reset();
    --open;
    WakeOne();
  }
  idle.resize(kept);
}

UpstreamPool::UpstreamPool(Worker& worker, UpstreamTarget target)
    : impl_(std::make_unique<Impl>(worker, std::move(target))) {}

UpstreamPool::~UpstreamPool() = default;

const UpstreamTarget& UpstreamPool::target() const { return impl_->target; }
Worker& UpstreamPool::worker() { return impl_->worker; }
std::size_t UpstreamPool::open_connections() const { return impl_->open; }
std::size_t UpstreamPool::idle_connections() const { return impl_->idle.size(); }
std::uint64_t UpstreamPool::connects() const { return impl_->connects; }

void UpstreamPool::CloseIdle() {
  for (auto& c : impl_->idle) {
    error_code ec;
    c->socket.close(ec);
    --impl_->open;
  }
  impl_->idle.clear();
}

}  // namespace idemgate::http
