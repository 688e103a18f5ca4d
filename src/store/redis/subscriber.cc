#include "store/redis/subscriber.h"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

namespace idemgate::store::redis {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

struct Subscriber::Session {
  Session(tcp::socket s, asio::any_io_executor ex) : socket(std::move(s)), ping_timer(ex) {}
  void Kill() {
    if (dead) return;
    dead = true;
    error_code ec;
    socket.close(ec);
    ping_timer.cancel();
  }
  tcp::socket socket;
  asio::steady_timer ping_timer;
  bool dead = false;
  SteadyTime last_read{};
  SteadyTime ping_sent{};
};

Subscriber::Subscriber(asio::any_io_executor ex, ConnectionOptions options,
                       std::function<Address()> next_address, Duration ping_interval)
    : ex_(ex),
      options_(std::move(options)),
      next_address_(std::move(next_address)),
      ping_interval_(ping_interval),
      backoff_timer_(ex) {}

Subscriber::~Subscriber() = default;

void Subscriber::Add(const std::string& channel, std::shared_ptr<Listener> listener) {
  if (closed_) return;
  auto [it, inserted] = channels_.try_emplace(channel);
  it->second.listeners.push_back(std::move(listener));
  if (inserted && session_) Send({"SUBSCRIBE", channel});
  if (!started_) {
    started_ = true;
    asio::co_spawn(ex_, Run(), asio::detached);
  }
}

void Subscriber::Remove(const std::string& channel, const Listener* listener) {
  auto it = channels_.find(channel);
  if (it == channels_.end()) return;
  auto& ls = it->second.listeners;
  ls.erase(std::remove_if(ls.begin(), ls.end(), [&](const auto& l) { return l.get() == listener; }), ls.end());
  if (!ls.empty()) return;
  for (auto* w : it->second.waiters) w->cancel();
  channels_.erase(it);
  if (session_) Send({"UNSUBSCRIBE", channel});
}

Task<bool> Subscriber::WaitSubscribed(std::string channel, SteadyTime deadline) {
  auto self = shared_from_this();
  auto it = channels_.find(channel);
  if (it == channels_.end()) co_return false;
  if (it->second.confirmed) co_return true;
  asio::steady_timer timer(ex_, deadline);
  it->second.waiters.push_back(&timer);
  error_code ec;
  co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  it = channels_.find(channel);
  if (it == channels_.end()) co_return false;
  auto& ws = it->second.waiters;
  ws.erase(std::remove(ws.begin(), ws.end(), &timer), ws.end());
  co_return it->second.confirmed;
}

void Subscriber::Confirm(Channel& channel) {
  channel.confirmed = true;
  for (auto* w : channel.waiters) w->cancel();
  channel.waiters.clear();
}

void Subscriber::Close() {
  if (closed_) return;
  closed_ = true;
  backoff_timer_.cancel();
  if (dialer_) dialer_->Cancel();
  if (session_) session_->Kill();
  for (auto& [name, ch] : channels_) {
    for (auto* w : ch.waiters) w->cancel();
    ch.waiters.clear();
  }
}

void Subscriber::Send(std::vector<std::string> args) {
  AppendCommand(&out_, args);
  MaybeWrite();
}

void Subscriber::MaybeWrite() {
  if (writing_ || !session_ || session_->dead || out_.empty()) return;
  writing_ = true;
  asio::co_spawn(ex_, WriteLoop(session_), asio::detached);
}

Task<void> Subscriber::WriteLoop(std::shared_ptr<Session> s) {
  auto self = shared_from_this();
  std::string chunk;
  while (!s->dead && !out_.empty()) {
    chunk.clear();
    chunk.swap(out_);
    error_code ec;
    co_await asio::async_write(s->socket, asio::buffer(chunk), asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
      s->Kill();
      break;
    }
  }
  writing_ = false;
  MaybeWrite();
}

Task<void> Subscriber::Run() {
  auto self = shared_from_this();
  Duration backoff = options_.reconnect_min;
  bool had_session = false;
  while (!closed_) {
    dialer_ = std::make_shared<Dialer>(ex_);
    auto dialed = co_await Dial(dialer_, next_address_(), options_);
    dialer_.reset();
    if (closed_) break;
    if (!dialed.ok()) {
      backoff_timer_.expires_after(backoff);
      error_code ec;
      co_await backoff_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      backoff = std::min(backoff * 2, options_.reconnect_max);
      continue;
    }
    backoff = options_.reconnect_min;
    ++connects_;
    auto session = std::make_shared<Session>(std::move(dialed).value(), ex_);
    session_ = session;
    out_.clear();
    if (!channels_.empty()) {
      std::vector<std::string> args = {"SUBSCRIBE"};
      for (auto& [name, ch] : channels_) {
        ch.confirmed = false;
        args.push_back(name);
      }
      Send(std::move(args));
    }
    if (had_session) {
      // Messages published while we were away are lost: let every waiter re-read.
      for (auto& [name, ch] : channels_) {
        for (auto& l : ch.listeners) l->Notify();
      }
    }
    had_session = true;
    session->last_read = SteadyClock::now();
    asio::co_spawn(ex_, PingLoop(session), asio::detached);
    // Why the session ended does not change what follows: redial with
    // backoff, and every waiter re-reads meanwhile (polling covers the gap).
    (void)co_await ReadLoop(session);
    session->Kill();
    session_.reset();
    for (auto& [name, ch] : channels_) ch.confirmed = false;
  }
}

Task<void> Subscriber::PingLoop(std::shared_ptr<Session> s) {
  auto self = shared_from_this();
  while (!s->dead) {
    s->ping_timer.expires_after(ping_interval_);
    error_code ec;
    co_await s->ping_timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (s->dead) break;
    if (s->ping_sent > s->last_read) {
      s->Kill();  // nothing, not even the last PONG, came back
      break;
    }
    s->ping_sent = SteadyClock::now();
    if (s == session_) Send({"PING"});
  }
}

Task<Status> Subscriber::ReadLoop(std::shared_ptr<Session> s) {
  RespParser parser;
  std::vector<char> buf(16 * 1024);
  Reply reply;
  for (;;) {
    error_code ec;
    const std::size_t n =
        co_await s->socket.async_read_some(asio::buffer(buf), asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return UnavailableError("redis subscriber: " + ec.message());
    s->last_read = SteadyClock::now();
    parser.Feed(buf.data(), n);
    for (;;) {
      const auto res = parser.Next(&reply);
      if (res == RespParser::Result::kNeedMore) break;
      if (res == RespParser::Result::kError) co_return UnavailableError("redis subscriber: " + parser.error());
      OnPush(reply);
    }
  }
}

void Subscriber::OnPush(const Reply& reply) {
  if (reply.type != Reply::Type::kArray || reply.elements.size() < 2) return;
  const std::string& kind = reply.elements[0].str;
  const std::string& channel = reply.elements[1].str;
  auto it = channels_.find(channel);
  if (it == channels_.end()) return;
  if (kind == "message") {
    // Copy: a listener's Notify may lead (via its owner) to Remove.
    auto listeners = it->second.listeners;
    for (auto& l : listeners) l->Notify();
  } else if (kind == "subscribe") {
    Confirm(it->second);
  }
}

}  // namespace idemgate::store::redis
