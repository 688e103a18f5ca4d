#include "store/redis/connection.h"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <random>

#include "common/receive.h"

namespace idemgate::store::redis {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

namespace {

constexpr std::size_t kReadChunk = 64 * 1024;
constexpr std::size_t kMaxWriteBatch = 4 * 1024 * 1024;

// A uniformly random duration in [d/2, d], so that many gateways do not
// redial a restarted server in lockstep.
Duration Jitter(Duration d) {
  thread_local std::minstd_rand rng(std::random_device{}());
  const auto half = d.count() / 2;
  if (half <= 0) return d;
  std::uniform_int_distribution<Duration::rep> dist(half, d.count());
  return Duration(dist(rng));
}

}  // namespace

constexpr std::string_view kAsking = "*1\r\n$6\r\nASKING\r\n";

struct Connection::Request {
  Request(asio::any_io_executor ex, std::shared_ptr<const std::string> b, bool a)
      : bytes(std::move(b)), asking(a), expected(a ? 2 : 1), timer(ex) {}
  std::shared_ptr<const std::string> bytes;
  bool asking;
  std::size_t expected;
  std::vector<Reply> replies;
  Status status;          // non-ok: failed without (all) replies
  bool done = false;      // replies complete or status set
  bool abandoned = false; // the caller gave up (deadline)
  SteadyTime sent{};
  asio::steady_timer timer;  // the caller waits on it; cancelled when done
};

struct Connection::Session {
  explicit Session(tcp::socket s) : socket(std::move(s)) {}
  tcp::socket socket;
  bool dead = false;
};

void Dialer::Cancel() {
  error_code ec;
  timer.cancel();
  resolver.cancel();
  socket.close(ec);
}

Task<StatusOr<tcp::socket>> Dial(std::shared_ptr<Dialer> d, Address address, ConnectionOptions options) {
  const std::string name = address.ToString();
  d->timed_out = false;
  d->timer.expires_after(options.connect_timeout);
  d->timer.async_wait([d](const error_code& ec) {
    if (ec) return;
    d->timed_out = true;
    error_code ignored;
    d->resolver.cancel();
    d->socket.close(ignored);
  });
  auto fail = [&](std::string_view what, const error_code& ec) -> Status {
    d->timer.cancel();
    if (d->timed_out) {
      return UnavailableError("redis " + name + ": " + std::string(what) + " timed out after " +
                              FormatDuration(options.connect_timeout));
    }
    return UnavailableError("redis " + name + ": " + std::string(what) + ": " + ec.message());
  };

  error_code ec;
  std::vector<tcp::endpoint> endpoints;
  const auto ip = asio::ip::make_address(address.host, ec);
  if (!ec) {
    endpoints.emplace_back(ip, address.port);
  } else {
    auto results = co_await d->resolver.async_resolve(address.host, std::to_string(address.port),
                                                      asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return fail("resolve", ec);
    for (const auto& r : results) endpoints.push_back(r.endpoint());
  }
  co_await asio::async_connect(d->socket, endpoints, asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return fail("connect", ec);
  d->socket.set_option(tcp::no_delay(true), ec);
  d->socket.set_option(asio::socket_base::keep_alive(true), ec);
  // Replies are read by ReadLoop right after each write: with the hint, a
  // read after the last reply waits for epoll instead of failing a receive.
  EnableReceiveQueueHint(d->socket);

  if (!options.password.empty()) {
    std::vector<std::string> auth = {"AUTH"};
    if (!options.username.empty()) auth.push_back(options.username);
    auth.push_back(options.password);
    const std::string cmd = EncodeCommand(auth);
    co_await asio::async_write(d->socket, asio::buffer(cmd), asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return fail("AUTH", ec);
    RespParser parser;
    Reply reply;
    char buf[512];
    for (;;) {
      const std::size_t n = co_await d->socket.async_read_some(asio::buffer(buf),
                                                               asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return fail("AUTH", ec);
      parser.Feed(buf, n);
      const auto res = parser.Next(&reply);
      if (res == RespParser::Result::kReply) break;
      if (res == RespParser::Result::kError) co_return fail("AUTH", asio::error::invalid_argument);
    }
    if (reply.is_error()) {
      d->timer.cancel();
      co_return UnavailableError("redis " + name + ": AUTH failed: " + reply.str);
    }
  }
  d->timer.cancel();
  co_return std::move(d->socket);
}

Connection::Connection(asio::any_io_executor ex, Address address, ConnectionOptions options)
    : ex_(ex),
      address_(std::move(address)),
      name_(address_.ToString()),
      options_(std::move(options)),
      backoff_timer_(ex) {}

Connection::~Connection() = default;

void Connection::Start() {
  if (state_ != State::kIdle) return;
  state_ = State::kConnecting;
  asio::co_spawn(ex_, Run(), asio::detached);
}

void Connection::Close() {
  if (state_ == State::kClosed) return;
  state_ = State::kClosed;
  backoff_timer_.cancel();
  if (dialer_) dialer_->Cancel();
  if (session_) DropSession("closed");
  const Status closed = UnavailableError("redis " + name_ + ": connection closed");
  FailAll(&to_send_, closed);
  FailAll(&in_flight_, closed);
}

void Connection::FailAll(std::deque<std::shared_ptr<Request>>* queue, const Status& status) {
  for (auto& r : *queue) {
    if (r->done) continue;
    r->done = true;
    r->status = status;
    r->timer.cancel();
  }
  queue->clear();
}

void Connection::DropSession(const std::string& why) {
  if (!session_ || session_->dead) return;
  session_->dead = true;
  error_code ec;
  session_->socket.shutdown(tcp::socket::shutdown_both, ec);
  session_->socket.close(ec);
  last_error_ = UnavailableError("redis " + name_ + ": " + why);
}

Task<void> Connection::Run() {
  auto self = shared_from_this();
  Duration backoff = options_.reconnect_min;
  while (state_ != State::kClosed) {
    state_ = State::kConnecting;
    dialer_ = std::make_shared<Dialer>(ex_);
    auto dialed = co_await Dial(dialer_, address_, options_);
    dialer_.reset();
    if (state_ == State::kClosed) break;
    if (!dialed.ok()) {
      last_error_ = dialed.status();
      state_ = State::kBackoff;
      FailAll(&to_send_, last_error_);
      if (on_failure_) on_failure_();
      backoff_timer_.expires_after(Jitter(backoff));
      error_code ec;
      co_await backoff_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      backoff = std::min(backoff * 2, options_.reconnect_max);
      continue;
    }
    backoff = options_.reconnect_min;
    auto session = std::make_shared<Session>(std::move(dialed).value());
    session_ = session;
    last_read_ = SteadyClock::now();
    ++connects_;
    state_ = State::kReady;
    MaybeWrite();
    Status lost = co_await ReadLoop(session);
    if (!session->dead) {
      session->dead = true;
      error_code ec;
      session->socket.close(ec);
      last_error_ = lost;
    }
    session_.reset();
    // Written commands have no reply coming; unwritten ones wait for the redial.
    FailAll(&in_flight_, last_error_);
    if (state_ != State::kClosed && on_failure_) on_failure_();
  }
  FailAll(&to_send_, UnavailableError("redis " + name_ + ": connection closed"));
  FailAll(&in_flight_, UnavailableError("redis " + name_ + ": connection closed"));
}

Task<Status> Connection::ReadLoop(std::shared_ptr<Session> s) {
  RespParser parser;
  auto buf = std::make_unique<char[]>(kReadChunk);
  Reply reply;
  for (;;) {
    error_code ec;
    const std::size_t n = co_await s->socket.async_read_some(DrainAwareBuffer(asio::buffer(buf.get(), kReadChunk)),
                                                             asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
      co_return UnavailableError("redis " + name_ + ": connection lost: " +
                                 (ec == asio::error::eof ? std::string("closed by server") : ec.message()));
    }
    last_read_ = SteadyClock::now();
    parser.Feed(buf.get(), n);
    for (;;) {
      const auto res = parser.Next(&reply);
      if (res == RespParser::Result::kNeedMore) break;
      if (res == RespParser::Result::kError) {
        co_return UnavailableError("redis " + name_ + ": " + parser.error());
      }
      if (in_flight_.empty()) {
        co_return UnavailableError("redis " + name_ + ": reply with no command outstanding");
      }
      Request& req = *in_flight_.front();
      req.replies.push_back(std::move(reply));
      if (req.replies.size() == req.expected) {
        req.done = true;
        req.timer.cancel();
        in_flight_.pop_front();
      }
    }
  }
}

void Connection::MaybeWrite() {
  if (writing_ || state_ != State::kReady || !session_ || session_->dead || to_send_.empty()) return;
  writing_ = true;
  asio::co_spawn(ex_, WriteLoop(session_), asio::detached);
}

Task<void> Connection::WriteLoop(std::shared_ptr<Session> s) {
  auto self = shared_from_this();
  std::vector<std::shared_ptr<Request>> batch;
  std::vector<asio::const_buffer> buffers;
  while (!s->dead && !to_send_.empty()) {
    batch.clear();
    buffers.clear();
    std::size_t bytes = 0;
    const SteadyTime now = SteadyClock::now();
    while (!to_send_.empty() && bytes < kMaxWriteBatch) {
      std::shared_ptr<Request> r = std::move(to_send_.front());
      to_send_.pop_front();
      if (r->abandoned || r->done) continue;
      r->sent = now;
      bytes += r->bytes->size();
      if (r->asking) buffers.push_back(asio::buffer(kAsking));
      buffers.push_back(asio::buffer(*r->bytes));
      in_flight_.push_back(r);
      batch.push_back(std::move(r));
    }
    if (batch.empty()) break;
    error_code ec;
    co_await asio::async_write(s->socket, buffers, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
      if (s == session_) DropSession("write failed: " + ec.message());
      break;
    }
  }
  writing_ = false;
  MaybeWrite();
}

void Connection::OnRequestTimeout() {
  if (!session_ || session_->dead || in_flight_.empty()) return;
  const SteadyTime since = std::max(in_flight_.front()->sent, last_read_);
  if (SteadyClock::now() - since >= options_.stall_timeout) {
    DropSession("no reply for " + FormatDuration(options_.stall_timeout) + " (server hung?)");
  }
}

Task<StatusOr<Reply>> Connection::Execute(std::shared_ptr<const std::string> encoded, SteadyTime deadline,
                                          bool asking) {
  auto self = shared_from_this();
  if (state_ == State::kIdle) Start();
  if (state_ == State::kClosed) co_return UnavailableError("redis " + name_ + ": connection closed");
  if (state_ == State::kBackoff) co_return last_error_;
  if (SteadyClock::now() >= deadline) co_return DeadlineExceededError("redis " + name_ + ": timed out");
  auto req = std::make_shared<Request>(ex_, std::move(encoded), asking);
  to_send_.push_back(req);
  MaybeWrite();
  req->timer.expires_at(deadline);
  error_code ec;
  co_await req->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  if (!req->done) {
    req->abandoned = true;
    OnRequestTimeout();
    co_return DeadlineExceededError("redis " + name_ + ": no reply in time");
  }
  if (!req->status.ok()) co_return req->status;
  if (asking && req->replies.front().is_error()) co_return std::move(req->replies.front());
  co_return std::move(req->replies.back());
}

}  // namespace idemgate::store::redis
