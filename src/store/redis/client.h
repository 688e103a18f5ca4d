#pragma once

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "store/redis/cluster.h"
#include "store/redis/connection.h"
#include "store/redis/resp.h"
#include "store/redis/subscriber.h"

namespace idemgate::store::redis {

struct ClientOptions {
  // Standalone: exactly one node. Cluster: any number of seed nodes; the
  // rest of the topology is learnt from CLUSTER SLOTS.
  std::vector<Address> seeds;
  bool cluster = false;
  ConnectionOptions connection;
  // Whole-command budget, redirects included.
  Duration timeout = std::chrono::milliseconds(200);
  // Slot map refreshes are at least this far apart.
  Duration refresh_interval = std::chrono::milliseconds(100);
  // Cluster: ExecuteOnMasters first reloads a slot map whose last refresh
  // began longer ago than this. Keyed commands keep the map fresh by their
  // MOVED replies; the commands run on every master (CLUSTER INFO, DBSIZE,
  // INFO) never get one, so a failover or scale-out that redirected none of
  // this client's commands would leave them asking the masters of before.
  Duration masters_max_age = std::chrono::seconds(5);
  Duration subscriber_ping = std::chrono::seconds(10);
};

// A command ready to send: its RESP bytes and where in them the key that
// routes it in a cluster lies. The hash slot is computed only when a cluster
// client routes it (a CRC16 over the key, needless for a standalone server).
struct Command {
  std::shared_ptr<const std::string> encoded;
  bool routed = false;
  std::size_t key_offset = 0;
  std::size_t key_size = 0;

  // The hash slot of the routing key; -1: any node.
  int Slot() const;
};

// `args` as a Command routed by args[key_index] (-1: unrouted).
Command MakeCommand(const std::vector<std::string>& args, int key_index = -1);

// Redis (standalone or Cluster) client with one pipelined Connection per
// node (and, once ExecuteAside was used, a second one per node for it). Two
// modes:
//  - owned thread (Client(options)): it runs one I/O thread with its own
//    io_context and a shared pub/sub Subscriber; callers on any executor hop
//    onto it per command and resume on their own executor;
//  - worker-bound (Client(options, io)): it lives on a caller's io_context
//    (a gateway worker thread), has no thread and no Subscriber, and runs
//    each command inline on the calling coroutine, without a hand-off. Every
//    call, Shutdown and the destructor must then be made on the one thread
//    that runs `io`, and the client must go before `io` does.
//
// Cluster: commands go to the master of their slot (slot map from CLUSTER
// SLOTS, loaded in the background at start). -MOVED updates that slot at
// once and schedules a background refresh; -ASK retries once on the named
// node behind ASKING; -TRYAGAIN retries after a short pause; connection
// failures and -CLUSTERDOWN schedule a refresh. A refresh takes the CLUSTER
// SLOTS reply of the first node that serves every slot, else the one that
// serves the most, asking the map's masters, the seeds and every other node
// known; a reply that serves no slot (a node that is no cluster member:
// never joined, or reset after a scale-in) never replaces the map. Nodes
// that answered CLUSTERDOWN or an empty map are asked last, and commands
// for a slot the map lacks avoid them. Commands are never resent after a transport
// failure (the server may have run them). A seed that answers CLUSTER SLOTS
// with "cluster support disabled" (a standalone server), while no node has a
// slot map, makes every command fail with Unavailable saying so.
//
// Thread-safety: Execute* may be called concurrently from any thread. The
// destructor must not run on the I/O thread, nor while calls are pending.
class Client {
 public:
  explicit Client(ClientOptions options);
  // Worker-bound: on the thread that runs (or is about to run) `io`.
  Client(ClientOptions options, boost::asio::io_context& io);
  // Shutdown().
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Runs one command. Completes with the server's reply (an error reply is a
  // value, except redirects, which are followed), or Unavailable (node
  // unreachable, connection lost), or DeadlineExceeded (no reply within
  // options.timeout).
  Task<StatusOr<Reply>> Execute(Command command);
  // As Execute, on a second connection per node that carries nothing but
  // these calls, dialled on first use: a read that must not wait behind
  // commands already on the usual connection (a write Redis holds during
  // CLIENT PAUSE WRITE keeps every command after it on its connection
  // waiting too).
  Task<StatusOr<Reply>> ExecuteAside(Command command);
  // Runs `args` on every master (every node of the slot map; the one node
  // when standalone), in order; one result per master. Cluster: a map older
  // than options.masters_max_age (or an empty one) is reloaded first (each
  // node asked within options.timeout); if that fails, the map in use is
  // kept and the failure logged.
  Task<std::vector<StatusOr<Reply>>> ExecuteOnMasters(std::vector<std::string> args);
  // Reloads the slot map now (cluster only; Ok when standalone).
  Task<Status> RefreshSlots();

  // Closes every connection (queued and outstanding commands fail with
  // Unavailable), lets the I/O thread finish what is running and joins it.
  // Idempotent; not on the I/O thread; no call may be made afterwards. The
  // object stays valid, for owners whose background work still reads it
  // while the thread winds down. Worker-bound: closes the connections at
  // once (on the worker thread); their waiters resume when `io` runs again,
  // or are destroyed with it.
  void Shutdown();

  // The I/O thread's executor; Subscriber calls must run on it.
  boost::asio::any_io_executor executor() { return io_.get_executor(); }
  // Owned-thread mode only.
  Subscriber& subscriber() { return *subscriber_; }
  bool worker_bound() const { return own_io_ == nullptr; }
  // Commands this client has run (for tests).
  std::uint64_t commands() const { return commands_.load(std::memory_order_relaxed); }
  const ClientOptions& options() const { return options_; }

  // Counters, for tests and metrics.
  std::uint64_t moved_count() const { return moved_.load(std::memory_order_relaxed); }
  std::uint64_t ask_count() const { return ask_.load(std::memory_order_relaxed); }
  std::uint64_t refresh_count() const { return refreshes_.load(std::memory_order_relaxed); }

 private:
  // Execute (`aside` false) and ExecuteAside.
  Task<StatusOr<Reply>> ExecuteOn(Command command, bool aside);
  Task<StatusOr<Reply>> Route(Command command, SteadyTime deadline, bool aside);
  Task<std::vector<StatusOr<Reply>>> OnMasters(std::vector<std::string> args);
  Task<Status> RefreshOnce();
  Task<void> RefreshLoop();
  void RequestRefresh();
  std::shared_ptr<Connection> Node(const Address& address);
  // The ExecuteAside connection to `address`, made (not dialled) on first use.
  std::shared_ptr<Connection> AsideNode(const Address& address);
  std::shared_ptr<Connection> AnyNode();
  std::vector<std::shared_ptr<Connection>> Masters() const;
  Address NextSubscriberAddress();

  void Seed();

  const ClientOptions options_;
  std::unique_ptr<boost::asio::io_context> own_io_;  // owned-thread mode
  boost::asio::io_context& io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  // I/O thread only:
  std::map<std::string, std::shared_ptr<Connection>> nodes_;  // by Address::ToString()
  std::map<std::string, std::shared_ptr<Connection>> aside_;  // ExecuteAside's, likewise
  std::vector<Connection*> slots_;                             // cluster: slot -> master
  std::shared_ptr<Connection> standalone_;                     // standalone: the node
  // Cluster: nodes that answered CLUSTERDOWN or an empty slot map since
  // their last slot map was taken (see RefreshOnce).
  std::set<const Connection*> shunned_;
  bool closed_ = false;
  // Cluster: set when no node had a slot map and one said it has no cluster
  // support (a standalone server); every command fails with it until a
  // refresh loads a slot map.
  std::string not_a_cluster_;
  bool refreshing_ = false;
  bool refresh_again_ = false;
  SteadyTime refresh_started_{};  // when the last RefreshOnce began
  boost::asio::steady_timer refresh_timer_;
  std::size_t subscriber_rr_ = 0;
  std::shared_ptr<Subscriber> subscriber_;
  std::atomic<std::uint64_t> moved_{0}, ask_{0}, refreshes_{0}, commands_{0};
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace idemgate::store::redis
