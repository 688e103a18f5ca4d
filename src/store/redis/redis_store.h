#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "common/units.h"
#include "config/config.h"
#include "core/store.h"
#include "store/redis/client.h"

namespace idemgate::store::redis {

// core::Store on Redis or Redis Cluster, shared by any number of gateways
// (SPEC §5, docs/store-redis.md).
//
// One Redis string per record: key `key_prefix + "r:" + key`, value
// core::EncodeRecord bytes. Reserve, Complete, Release and Purge are each one
// Lua script (EVALSHA, EVAL on NOSCRIPT), so one round trip and atomic;
// Get is one GET. TTLs: in-flight records live until their lease end plus
// `reservation_grace`; completed ones until Record::expires_ms (none when 0),
// both computed from `clock`, so the Redis server's clock does not matter.
// Lease and retention checks use the gateways' clocks (`now`): gateways
// sharing a store must keep their clocks in sync (NTP) to well under a lease.
//
// Complete, Release and Purge PUBLISH on `key_prefix + "c:" + key`; WatchKey
// subscribes through one shared pub/sub connection and also polls the key
// (watch_poll_min doubling to watch_poll_max), so a lost message only
// delays a waiter.
//
// Threading: the store runs its own I/O thread (see Client); operations may
// be called from any executor and resume on it. A worker thread that
// attached (AttachWorker) gets its own worker-bound Client on its
// io_context, with its own connection per node, so its operations run
// without a hand-off to the store's thread; pub/sub, Watch notifications
// and the stats refresh stay on the store's own client. Destroy the store
// only when no operation is running (nor a Release that Reserve left running
// in the background: on an attached worker, stop its loop first), every
// Watch is gone and every attached worker has detached.
class RedisStore final : public core::Store {
 public:
  struct Options {
    std::vector<std::string> addresses;  // host:port; exactly one unless cluster
    bool cluster = false;
    std::string username;  // ACL user; empty: default user
    std::string password;  // empty: no AUTH
    Duration timeout = std::chrono::milliseconds(200);  // per operation
    Duration connect_timeout = std::chrono::seconds(1);
    Duration reconnect_min = std::chrono::milliseconds(50);
    Duration reconnect_max = std::chrono::seconds(2);
    // How long an in-flight record outlives its lease before Redis drops it.
    // Until then a retry with the same fingerprint takes it over (and one
    // with another fingerprint is refused); afterwards the key is new again.
    Duration reservation_grace = std::chrono::hours(1);
    // Extra Redis TTL on completed records past their retention end. Expiry
    // itself is decided with the gateways' `now`; this only keeps Redis from
    // dropping a record early for a gateway whose clock runs a little behind.
    Duration expiry_grace = std::chrono::seconds(1);
    Duration watch_poll_min = std::chrono::milliseconds(50);
    Duration watch_poll_max = std::chrono::seconds(1);
    // Cluster: Ping and the stats refresh reload a slot map older than this
    // before they ask every master (ClientOptions::masters_max_age).
    Duration masters_max_age = std::chrono::seconds(5);
    std::string key_prefix = "idemgate:";
    const Clock* clock = &SystemClock::Instance();
  };

  // store.redis from the config file; the password comes from the
  // environment variable named by password_env (InvalidArgument when that
  // is set but the variable is missing or empty).
  static StatusOr<Options> OptionsFromConfig(const config::Redis& redis);

  // Validates `options` (InvalidArgument) and starts the client. Does not
  // wait for Redis: an unreachable server makes operations (and Ping) fail
  // with Unavailable until it is back.
  static StatusOr<std::unique_ptr<RedisStore>> Connect(Options options);

  ~RedisStore() override;

  // A reserve whose write fails (refused: OOM, READONLY, MISCONF, ...; or
  // unanswered: timed out, connection lost) reads the record, with a budget
  // of its own, on the client's second connection (Client::ExecuteAside),
  // and answers kExists when a record is found that the write would have
  // left alone; otherwise it fails as the write did. So replays and 409s go
  // on while Redis takes no writes. When a write that may still run is
  // answered that way, a Release under its owner token is sent behind it on
  // the same connection (in the background, on the caller's executor).
  Task<StatusOr<core::ReserveResult>> Reserve(std::string key, core::Record reservation,
                                              UnixMillis now) override;
  // Bodies over MaxBodyBytes(timeout) are stored omitted (counted in
  // StoreStats::bodies_dropped, logged).
  Task<Status> Complete(std::string key, std::string owner, core::Record completed) override;
  Task<Status> Release(std::string key, std::string owner) override;
  Task<StatusOr<std::optional<core::Record>>> Get(std::string key, UnixMillis now) override;
  Task<StatusOr<core::PurgeResult>> Purge(std::string key, core::PurgeMode mode, UnixMillis now) override;
  Task<StatusOr<std::unique_ptr<core::Watch>>> WatchKey(std::string key) override;
  // Ok when every master answers PING; in a cluster, when every master of
  // the slot map answers CLUSTER INFO with cluster_state:ok (the map is
  // reloaded first when older than masters_max_age).
  Task<Status> Ping() override;
  // keys: DBSIZE summed over masters; bytes: used_memory summed over
  // masters. Both cover the whole database, not only this store's keys, and
  // are refreshed in the background at most every 5 s (0 until the first),
  // from the masters of a slot map no older than masters_max_age.
  // bodies_dropped: completions stored without their body by this store.
  core::StoreStats Stats() const override;

  // The largest response body stored with its record: what reads back
  // within `timeout` at kBodyBytesPerSecond, at most kMaxBodyBytesCeiling.
  // A record over it could be written but every read of it would time out.
  static constexpr std::uint64_t kBodyBytesPerSecond = 32u << 20;
  static constexpr std::uint64_t kMaxBodyBytesCeiling = 256u << 20;
  static std::uint64_t MaxBodyBytes(Duration timeout);
  // A command that timed out may still run when the server resumes.
  bool FailedWritesMayLand() const override { return true; }
  void AttachWorker(boost::asio::io_context& io) override;
  void DetachWorker(boost::asio::io_context& io) override;
  // Workers attached now (for tests).
  std::size_t attached_workers() const;

  // The Redis key and pub/sub channel of a record (for tests and operators).
  std::string RecordKey(std::string_view key) const;
  std::string ChannelName(std::string_view key) const;
  Client& client() { return *client_; }

 private:
  struct Script;
  class RedisWatch;
  class WatchListener;
  struct WatchSignal;
  struct WorkerGate;

  RedisStore(Options options, ClientOptions client_options, std::unique_ptr<Client> client);
  // The calling thread's worker-bound client when it attached, else the
  // store's own.
  Client& Here();
  // Runs `script` with KEYS[1] = record key of `key` and ARGV = `argv`.
  Task<StatusOr<Reply>> RunScript(const Script& script, std::string key, std::vector<std::string> argv);
  Task<void> RefreshStats() const;
  // The reserve script, for what `SET NX GET` cannot decide alone.
  Task<StatusOr<core::ReserveResult>> ReserveByScript(std::string key, std::string encoded, UnixMillis now,
                                                      core::Record reservation, std::int64_t ttl);
  // After the reserve's write failed with `failed`: decides on the record
  // read instead (see Reserve). `may_land`: the write was not refused and
  // may still run. `landed_means_reserved`: finding `reservation` itself
  // means the key was reserved (SET NX), not possibly taken over.
  Task<StatusOr<core::ReserveResult>> ReserveByReading(std::string key, core::Record reservation, UnixMillis now,
                                                       Status failed, bool may_land, bool landed_means_reserved);
  Task<void> ReleaseLanded(std::string key, std::string owner);

  const Options options_;
  const ClientOptions client_options_;
  std::unique_ptr<Client> client_;
  const std::uint64_t max_body_bytes_;
  mutable std::mutex workers_mu_;
  struct WorkerClient {
    boost::asio::io_context* io = nullptr;
    std::unique_ptr<Client> client;
    std::shared_ptr<WorkerGate> gate;  // closed by DetachWorker
  };
  std::vector<WorkerClient> worker_clients_;  // guarded
  mutable std::atomic<std::uint64_t> stats_keys_{0}, stats_bytes_{0};
  mutable std::atomic<std::int64_t> stats_at_ms_{0};  // steady ms of last refresh start
  mutable std::atomic<bool> stats_busy_{false};
  std::atomic<std::uint64_t> bodies_dropped_{0};
  // False once a server refused `SET ... NX GET` (Redis before 7.0): every
  // reserve then runs the script.
  std::atomic<bool> set_nx_get_{true};
};

}  // namespace idemgate::store::redis
