#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "store/redis/connection.h"

namespace idemgate::store::redis {

// Something waiting for messages on a channel.
class Listener {
 public:
  virtual ~Listener() = default;
  // Called on the subscriber's executor when a message arrives on the
  // channel, and after a reconnect (messages may have been lost meanwhile).
  // Must not block and must not call back into the Subscriber.
  virtual void Notify() = 0;
};

// One shared pub/sub connection: channels are reference-counted by their
// listeners (SUBSCRIBE on the first, UNSUBSCRIBE after the last). Dials
// lazily, on the first Add; redials with backoff, resubscribes everything and
// wakes every listener after a reconnect. A PING every `ping_interval`
// detects a half-open connection.
//
// In a cluster any node will do: classic PUBLISH is broadcast to every node.
// `next_address` is asked for the node to dial on every attempt.
//
// Thread-safety: every member must be called on the executor given to the
// constructor. Owned through shared_ptr (its coroutines keep it alive).
class Subscriber : public std::enable_shared_from_this<Subscriber> {
 public:
  Subscriber(boost::asio::any_io_executor ex, ConnectionOptions options,
             std::function<Address()> next_address,
             Duration ping_interval = std::chrono::seconds(10));
  ~Subscriber();
  Subscriber(const Subscriber&) = delete;
  Subscriber& operator=(const Subscriber&) = delete;

  void Add(const std::string& channel, std::shared_ptr<Listener> listener);
  void Remove(const std::string& channel, const Listener* listener);
  // Completes once the server confirmed the subscription to `channel`, or at
  // `deadline`, or at once if the channel has no listener. Returns whether it
  // is confirmed.
  Task<bool> WaitSubscribed(std::string channel, SteadyTime deadline);
  // Closes the connection for good; listeners stay registered but are never
  // notified again. Idempotent.
  void Close();

  std::size_t channel_count() const { return channels_.size(); }
  bool connected() const { return session_ != nullptr; }
  std::uint64_t connects() const { return connects_; }

 private:
  struct Channel {
    std::vector<std::shared_ptr<Listener>> listeners;
    bool confirmed = false;
    std::vector<boost::asio::steady_timer*> waiters;
  };
  struct Session;

  Task<void> Run();
  Task<Status> ReadLoop(std::shared_ptr<Session> session);
  Task<void> PingLoop(std::shared_ptr<Session> session);
  void Send(std::vector<std::string> args);
  void MaybeWrite();
  Task<void> WriteLoop(std::shared_ptr<Session> session);
  void OnPush(const Reply& reply);
  void Confirm(Channel& channel);

  boost::asio::any_io_executor ex_;
  ConnectionOptions options_;
  std::function<Address()> next_address_;
  Duration ping_interval_;
  bool started_ = false;
  bool closed_ = false;
  boost::asio::steady_timer backoff_timer_;
  std::shared_ptr<Dialer> dialer_;
  std::shared_ptr<Session> session_;
  std::string out_;  // encoded commands not yet written
  bool writing_ = false;
  std::map<std::string, Channel> channels_;
  std::uint64_t connects_ = 0;
};

}  // namespace idemgate::store::redis
