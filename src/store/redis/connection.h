#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/units.h"
#include "core/store.h"
#include "store/redis/cluster.h"
#include "store/redis/resp.h"

namespace idemgate::store::redis {

using core::Task;
using SteadyClock = std::chrono::steady_clock;
using SteadyTime = SteadyClock::time_point;

struct ConnectionOptions {
  std::string username;  // ACL user for AUTH; empty: the default user
  std::string password;  // empty: no AUTH
  Duration connect_timeout = std::chrono::seconds(1);  // TCP connect + AUTH
  Duration reconnect_min = std::chrono::milliseconds(50);
  Duration reconnect_max = std::chrono::seconds(2);
  // Replies owed but not a byte received for this long: the server is taken
  // as hung and the connection is dropped and redialled.
  Duration stall_timeout = std::chrono::seconds(1);
};

// State of one connection attempt, shared so that Close() can abort it.
struct Dialer {
  explicit Dialer(boost::asio::any_io_executor ex) : socket(ex), resolver(ex), timer(ex) {}
  // Aborts the attempt: Dial() then fails promptly.
  void Cancel();

  boost::asio::ip::tcp::socket socket;
  boost::asio::ip::tcp::resolver resolver;
  boost::asio::steady_timer timer;
  bool timed_out = false;
};

// Connects to `address` (TCP_NODELAY, SO_KEEPALIVE) and sends AUTH when a
// password is set, all within options.connect_timeout. Failures are
// Unavailable. Runs on `dialer`'s executor.
Task<StatusOr<boost::asio::ip::tcp::socket>> Dial(std::shared_ptr<Dialer> dialer, Address address,
                                                   ConnectionOptions options);

// One pipelined connection to one Redis node. Any number of commands may be
// outstanding: they are written in order (coalesced into as few writes as
// possible) and replies are matched to them in order. The connection redials
// by itself with exponential backoff (with jitter) after a failure.
//
// While dialling, commands queue; while backing off after a failed dial,
// commands fail at once with Unavailable (so a dead node costs no waiting).
// Commands already written when the connection drops fail with Unavailable:
// the server may or may not have run them.
//
// Thread-safety: every member must be called on the executor given to the
// constructor (a single-threaded io_context). Owned through shared_ptr: its
// coroutines keep it alive until they end, which Close() brings about.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  enum class State { kIdle, kConnecting, kReady, kBackoff, kClosed };

  Connection(boost::asio::any_io_executor ex, Address address, ConnectionOptions options);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Starts dialling in the background. Idempotent.
  void Start();
  // Stops for good: the socket closes, queued and outstanding commands fail
  // with Unavailable, no redial happens. Idempotent.
  void Close();

  // Writes `encoded` (one command; with `asking`, an ASKING command goes
  // right before it) and completes with its reply, or: Unavailable
  // (connection down or lost), DeadlineExceeded (no reply by `deadline`; the
  // reply, if it comes, is dropped). With `asking`, an error reply to ASKING
  // is returned instead of the command's reply.
  Task<StatusOr<Reply>> Execute(std::shared_ptr<const std::string> encoded, SteadyTime deadline,
                                bool asking = false);

  // Called on the executor whenever a dial fails or a connection drops
  // (used by the cluster client to refresh its slot map).
  void set_on_failure(std::function<void()> f) { on_failure_ = std::move(f); }

  const Address& address() const { return address_; }
  State state() const { return state_; }
  // Successful dials so far.
  std::uint64_t connects() const { return connects_; }

 private:
  struct Request;
  struct Session;

  Task<void> Run();
  Task<Status> ReadLoop(std::shared_ptr<Session> session);
  Task<void> WriteLoop(std::shared_ptr<Session> session);
  void MaybeWrite();
  void OnRequestTimeout();
  void DropSession(const std::string& why);
  static void FailAll(std::deque<std::shared_ptr<Request>>* queue, const Status& status);

  boost::asio::any_io_executor ex_;
  Address address_;
  std::string name_;  // address as text, for messages
  ConnectionOptions options_;
  State state_ = State::kIdle;
  Status last_error_;
  boost::asio::steady_timer backoff_timer_;
  std::shared_ptr<Dialer> dialer_;
  std::shared_ptr<Session> session_;
  bool writing_ = false;
  std::deque<std::shared_ptr<Request>> to_send_;    // queued, not yet written
  std::deque<std::shared_ptr<Request>> in_flight_;  // written, replies owed
  SteadyTime last_read_{};
  std::uint64_t connects_ = 0;
  std::function<void()> on_failure_;
};

}  // namespace idemgate::store::redis
