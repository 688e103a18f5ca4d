#include "store/redis/redis_store.h"

#include <openssl/evp.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <charconv>
#include <cstdlib>
#include <functional>

#include "common/digest.h"
#include "common/log.h"
#include "config/redis_names.h"

namespace idemgate::store::redis {

namespace asio = boost::asio;
using boost::system::error_code;
using core::Record;
using core::RecordState;

namespace {

// Reads the fields the scripts need out of a core::EncodeRecord value
// (version 1: version u8, state u8, fingerprint, owner, operation id as
// u32-length-prefixed bytes, then created, lease end and expiry as u64, all
// little-endian). Keep in step with src/core/record.cc.
constexpr std::string_view kPrelude = R"lua(
local function u32(s, i)
  local a, b, c, d = string.byte(s, i, i + 3)
  return a + b * 256 + c * 65536 + d * 16777216
end
local function parse(s)
  local n = #s
  if n < 2 or string.byte(s, 1) ~= 1 then return nil end
  local state = string.byte(s, 2)
  local pos = 3
  local fields = {}
  for f = 1, 3 do
    if pos + 3 > n then return nil end
    local len = u32(s, pos)
    if pos + 3 + len > n then return nil end
    fields[f] = string.sub(s, pos + 4, pos + 3 + len)
    pos = pos + 4 + len
  end
  if pos + 23 > n then return nil end
  local lease = u32(s, pos + 8) + u32(s, pos + 12) * 4294967296
  local expires = u32(s, pos + 16) + u32(s, pos + 20) * 4294967296
  return state, fields[1], fields[2], lease, expires
end
-- The state and owner only (Complete, Release): no table, one substring.
local function owner_of(s)
  local n = #s
  if n < 6 or string.byte(s, 1) ~= 1 then return nil end
  local at = 7 + u32(s, 3)
  if at + 3 > n then return nil end
  local len = u32(s, at)
  if at + 3 + len > n then return nil end
  return string.byte(s, 2), string.sub(s, at + 4, at + 3 + len)
end
local function corrupt()
  return redis.error_reply('IDEMGATE corrupt record at ' .. KEYS[1])
end
)lua";

// KEYS[1] record; ARGV[1] reservation bytes, ARGV[2] now (ms), ARGV[3]
// fingerprint, ARGV[4] TTL (ms). Returns {0} reserved, {1, old} taken over,
// {2, current} exists.
constexpr std::string_view kReserveBody = R"lua(
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[4])
  return {0}
end
local state, fp, owner, lease, expires = parse(cur)
if not state then return corrupt() end
local now = tonumber(ARGV[2])
if state == 2 then
  if expires ~= 0 and expires <= now then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[4])
    return {0}
  end
  return {2, cur}
end
if lease <= now and fp == ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[4])
  return {1, cur}
end
return {2, cur}
)lua";

// KEYS[1] record; ARGV[1] owner, ARGV[2] completed bytes, ARGV[3] TTL (ms,
// 0: none), ARGV[4] channel. Returns 1 done, 0 absent, -1 completed,
// -2 other owner.
constexpr std::string_view kCompleteBody = R"lua(
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local state, owner = owner_of(cur)
if not state then return corrupt() end
if state ~= 1 then return -1 end
if owner ~= ARGV[1] then return -2 end
if ARGV[3] == '0' then
  redis.call('SET', KEYS[1], ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
redis.call('PUBLISH', ARGV[4], 'completed')
return 1
)lua";

// KEYS[1] record; ARGV[1] owner, ARGV[2] channel. Returns as Complete.
constexpr std::string_view kReleaseBody = R"lua(
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local state, owner = owner_of(cur)
if not state then return corrupt() end
if state ~= 1 then return -1 end
if owner ~= ARGV[1] then return -2 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], 'released')
return 1
)lua";

// KEYS[1] record; ARGV[1] channel, ARGV[2] '1' to spare an in-flight record
// whose lease lasts (core::PurgeMode::kUnlessInFlight), ARGV[3] now (ms).
// Returns {0} absent, {1, state} deleted (state 0: undecodable, deleted all
// the same), {2, lease end} in flight and left untouched. Decided on the
// server from the stored bytes, so no reservation lands between the look and
// the delete. A completed record past its retention (kept by the TTL's
// expiry_grace, or by a clock behind the gateway's) is absent, as for Get:
// deleted without a PUBLISH, as its expiry would, and {0}.
constexpr std::string_view kPurgeBody = R"lua(
local cur = redis.call('GET', KEYS[1])
if not cur then return {0} end
local state, fp, owner, lease, expires = parse(cur)
local now = tonumber(ARGV[3])
if state == 2 and expires ~= 0 and expires <= now then
  redis.call('DEL', KEYS[1])
  return {0}
end
if state and state == 1 and ARGV[2] == '1' and lease > now then
  return {2, lease}
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], 'purged')
return {1, state or 0}
)lua";

Status OwnerMismatch(std::int64_t code) {
  switch (code) {
    case 0: return FailedPreconditionError("redis store: no record for the key");
    case -1: return FailedPreconditionError("redis store: the record is already completed");
    default: return FailedPreconditionError("redis store: the record is held by another owner");
  }
}

// An error reply as a Status, or Internal when `reply` is not of `type`.
Status UnexpectedReply(const Reply& reply, std::string_view op) {
  if (reply.is_error()) return StatusFromErrorReply(reply.str);
  return InternalError("redis store: unexpected reply to " + std::string(op) + ": " + reply.DebugString());
}

StatusOr<Record> DecodeStored(const std::string& bytes) {
  auto r = core::DecodeRecord(bytes);
  if (!r.ok()) return InternalError("redis store: " + r.status().message());
  return r;
}

// Built outside coroutines: g++ 12 miscompiles braced lists in co_await expressions.
Command SetNxGetCommand(const std::string& record_key, const std::string& value, std::int64_t ttl_ms) {
  std::vector<std::string> args{"SET", record_key, value, "NX", "PX", std::to_string(ttl_ms), "GET"};
  return MakeCommand(args, 1);
}

Command GetCommand(const std::string& record_key) {
  std::vector<std::string> args{"GET", record_key};
  return MakeCommand(args, 1);
}

std::vector<std::string> Args(std::initializer_list<std::string_view> items) {
  std::vector<std::string> out;
  out.reserve(items.size());
  for (std::string_view s : items) out.emplace_back(s);
  return out;
}

// Runs detached on the client's I/O thread and reports to the caller with
// `done` (which posts to the caller's executor, as notifications do). A
// named coroutine rather than a lambda: g++ 12 mishandles lambda coroutines
// handed to co_spawn.
Task<void> SubscribeAndReport(std::shared_ptr<Subscriber> sub, std::string channel, std::shared_ptr<Listener> listener,
                              SteadyTime deadline, std::function<void()> done) {
  sub->Add(channel, std::move(listener));
  (void)co_await sub->WaitSubscribed(channel, deadline);
  done();
}

std::int64_t SteadyMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now().time_since_epoch()).count();
}

}  // namespace

struct RedisStore::Script {
  explicit Script(std::string_view body) : text(std::string(kPrelude) + std::string(body)), sha(Sha1Hex(text)) {}
  std::string text;
  std::string sha;
};

// What a watch waits on: its timer and the flag a notification sets. Owned
// by the RedisWatch, so it lives and dies on the watching caller's thread,
// together with that caller's io_context.
struct RedisStore::WatchSignal {
  explicit WatchSignal(asio::any_io_executor ex) : timer(std::move(ex)) {}
  asio::steady_timer timer;
  bool notified = false;
};

namespace {

// The end of a watch's subscription, reported to the watching caller on its
// own executor (see WatchKey).
struct SubscribeReport {
  explicit SubscribeReport(asio::any_io_executor ex) : timer(std::move(ex)) {}
  asio::steady_timer timer;
  bool done = false;
};

}  // namespace

// Open while an attached worker's io_context may still be posted to;
// DetachWorker closes it on the worker's thread once its loop has stopped.
struct RedisStore::WorkerGate {
  std::mutex mu;
  bool open = true;
};

// The part of a watch the subscriber holds, on the client's I/O thread, and
// releases there (possibly after the watcher's io_context is gone): it owns
// no I/O object of that context. Notify() hops to the watcher's executor
// and wakes the signal if the watch still exists; not at all once the
// watcher's worker has detached.
class RedisStore::WatchListener final : public Listener {
 public:
  WatchListener(asio::any_io_executor ex, std::weak_ptr<WatchSignal> signal, std::shared_ptr<WorkerGate> gate)
      : executor_(std::move(ex)), signal_(std::move(signal)), gate_(std::move(gate)) {}
  // Posts `fn` to a caller's executor from the client's I/O thread: at once
  // for a caller that is not an attached worker (no gate), and for a worker
  // only while its gate is open, so nothing is posted to an io_context that
  // is gone. A plain function object carries no work guard, so nothing of
  // the caller's io_context is left on the client's thread after the post.
  static void PostToCaller(const asio::any_io_executor& ex, const std::shared_ptr<WorkerGate>& gate,
                           std::function<void()> fn) {
    if (gate == nullptr) {
      asio::post(ex, std::move(fn));
      return;
    }
    std::lock_guard lock(gate->mu);
    if (gate->open) asio::post(ex, std::move(fn));
  }

  void Notify() override {
    PostToCaller(executor_, gate_, [signal = signal_] {
      if (auto s = signal.lock()) {
        s->notified = true;
        s->timer.cancel();
      }
    });
  }

 private:

  asio::any_io_executor executor_;
  std::weak_ptr<WatchSignal> signal_;
  std::shared_ptr<WorkerGate> gate_;
};

class RedisStore::RedisWatch final : public core::Watch {
 public:
  RedisWatch(RedisStore* store, std::string record_key, std::string channel, std::shared_ptr<WatchSignal> signal,
             std::shared_ptr<WatchListener> listener, std::optional<std::string> baseline)
      : store_(store),
        record_key_(std::move(record_key)),
        channel_(std::move(channel)),
        signal_(std::move(signal)),
        listener_(std::move(listener)),
        baseline_(std::move(baseline)) {}

  ~RedisWatch() override {
    asio::post(store_->client_->executor(),
               [sub = store_->client_->subscriber().shared_from_this(), channel = std::move(channel_),
                listener = std::move(listener_)] { sub->Remove(channel, listener.get()); });
  }

  Task<bool> Changed(Duration timeout) override {
    WatchSignal& l = *signal_;
    const SteadyTime deadline = SteadyClock::now() + timeout;
    Duration interval = store_->options_.watch_poll_min;
    for (;;) {
      if (l.notified) co_return true;
      const SteadyTime now = SteadyClock::now();
      if (now >= deadline) co_return false;
      l.timer.expires_at(std::min(deadline, now + interval));
      error_code ec;
      co_await l.timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      if (l.notified) co_return true;
      auto cs = co_await asio::this_coro::cancellation_state;
      if (cs.cancelled() != asio::cancellation_type::none) co_return false;
      if (SteadyClock::now() >= deadline) co_return false;
      auto reply = co_await store_->Here().Execute(GetCommand(record_key_));
      if (reply.ok() && (reply->type == Reply::Type::kString || reply->is_nil())) {
        std::optional<std::string> current;
        if (!reply->is_nil()) current = std::move(reply->str);
        if (current != baseline_) l.notified = true;
      }
      interval = std::min(interval * 2, store_->options_.watch_poll_max);
    }
  }

 private:
  RedisStore* store_;
  std::string record_key_;
  std::string channel_;
  std::shared_ptr<WatchSignal> signal_;
  std::shared_ptr<WatchListener> listener_;
  std::optional<std::string> baseline_;  // raw value when the watch was made
};

StatusOr<RedisStore::Options> RedisStore::OptionsFromConfig(const config::Redis& redis) {
  Options o;
  o.addresses = redis.addresses;
  o.cluster = redis.cluster;
  o.timeout = redis.timeout;
  o.username = redis.username;
  o.key_prefix = redis.key_prefix;
  if (!redis.password_env.empty()) {
    const char* value = std::getenv(redis.password_env.c_str());
    if (value == nullptr || *value == '\0') {
      return InvalidArgumentError("store.redis.password_env: environment variable " + redis.password_env +
                                  " is not set or empty");
    }
    o.password = value;
  }
  return o;
}

StatusOr<std::unique_ptr<RedisStore>> RedisStore::Connect(Options options) {
  if (options.addresses.empty()) return InvalidArgumentError("store.redis.addresses: at least one is needed");
  if (!options.cluster && options.addresses.size() > 1) {
    return InvalidArgumentError(
        "store.redis.addresses: a standalone server takes exactly one address (set cluster: true for Redis "
        "Cluster)");
  }
  if (options.timeout <= Duration::zero()) return InvalidArgumentError("store.redis.timeout: must be positive");
  if (auto problem = config::RedisKeyPrefixProblem(options.key_prefix); !problem.empty()) {
    return InvalidArgumentError("store.redis.key_prefix: " + std::string(problem));
  }
  if (auto problem = config::RedisUsernameProblem(options.username); !problem.empty()) {
    return InvalidArgumentError("store.redis.username: " + std::string(problem));
  }
  if (!options.username.empty() && options.password.empty()) {
    return InvalidArgumentError("store.redis.username: needs a password");
  }
  if (options.connect_timeout <= Duration::zero() || options.reconnect_min <= Duration::zero() ||
      options.reconnect_max < options.reconnect_min || options.watch_poll_min <= Duration::zero() ||
      options.watch_poll_max < options.watch_poll_min || options.reservation_grace < Duration::zero() ||
      options.expiry_grace < Duration::zero() || options.masters_max_age < Duration::zero()) {
    return InvalidArgumentError("redis store: bad timing options");
  }
  if (options.clock == nullptr) return InvalidArgumentError("redis store: no clock");
  ClientOptions co;
  for (const std::string& a : options.addresses) {
    auto address = ParseAddress(a);
    if (!address.ok()) return InvalidArgumentError("store.redis.addresses: " + address.status().message());
    co.seeds.push_back(*address);
  }
  co.cluster = options.cluster;
  co.timeout = options.timeout;
  co.masters_max_age = options.masters_max_age;
  co.connection.username = options.username;
  co.connection.password = options.password;
  co.connection.connect_timeout = options.connect_timeout;
  co.connection.reconnect_min = options.reconnect_min;
  co.connection.reconnect_max = options.reconnect_max;
  co.connection.stall_timeout = std::max<Duration>(std::chrono::seconds(1), 2 * options.timeout);
  auto client = std::make_unique<Client>(co);
  return std::unique_ptr<RedisStore>(new RedisStore(std::move(options), std::move(co), std::move(client)));
}

RedisStore::RedisStore(Options options, ClientOptions client_options, std::unique_ptr<Client> client)
    : options_(std::move(options)),
      client_options_(std::move(client_options)),
      client_(std::move(client)),
      max_body_bytes_(MaxBodyBytes(options_.timeout)) {}

std::uint64_t RedisStore::MaxBodyBytes(Duration timeout) {
  const auto ms = static_cast<std::uint64_t>(std::max<std::int64_t>(0, timeout.count()));
  // 256 MiB / 32 MiB/s = 8 s: a longer timeout no longer raises the cap.
  if (ms >= 8000) return kMaxBodyBytesCeiling;
  return ms * kBodyBytesPerSecond / 1000;
}

RedisStore::~RedisStore() {
  // Joins the I/O thread first: background work (stats) still uses members.
  client_->Shutdown();
}

namespace {
// The worker-bound client of the calling thread, and the store it belongs to.
struct ThreadClient {
  const RedisStore* store = nullptr;
  Client* client = nullptr;
  std::shared_ptr<void> gate;  // the worker's RedisStore::WorkerGate
};
thread_local ThreadClient this_thread_client;
}  // namespace

Client& RedisStore::Here() {
  if (this_thread_client.store == this) return *this_thread_client.client;
  return *client_;
}

void RedisStore::AttachWorker(boost::asio::io_context& io) {
  auto client = std::make_unique<Client>(client_options_, io);
  auto gate = std::make_shared<WorkerGate>();
  this_thread_client = ThreadClient{this, client.get(), gate};
  std::lock_guard lock(workers_mu_);
  worker_clients_.push_back(WorkerClient{&io, std::move(client), std::move(gate)});
}

void RedisStore::DetachWorker(boost::asio::io_context& io) {
  std::unique_ptr<Client> client;
  std::shared_ptr<WorkerGate> gate;
  {
    std::lock_guard lock(workers_mu_);
    auto it = std::find_if(worker_clients_.begin(), worker_clients_.end(),
                           [&io](const WorkerClient& entry) { return entry.io == &io; });
    if (it == worker_clients_.end()) return;
    client = std::move(it->client);
    gate = std::move(it->gate);
    worker_clients_.erase(it);
  }
  {
    // From here on no notification is posted to `io`: its loop has stopped,
    // and it may be destroyed while watches made on it are still subscribed.
    std::lock_guard lock(gate->mu);
    gate->open = false;
  }
  if (this_thread_client.client == client.get()) this_thread_client = ThreadClient{};
  client.reset();  // closes its connections, here on the worker thread, before `io` goes
}

std::size_t RedisStore::attached_workers() const {
  std::lock_guard lock(workers_mu_);
  return worker_clients_.size();
}

std::string RedisStore::RecordKey(std::string_view key) const {
  std::string k = options_.key_prefix;
  k += "r:";
  k += key;
  return k;
}

std::string RedisStore::ChannelName(std::string_view key) const {
  std::string c = options_.key_prefix;
  c += "c:";
  c += key;
  return c;
}

Task<StatusOr<Reply>> RedisStore::RunScript(const Script& script, std::string key, std::vector<std::string> argv) {
  std::vector<std::string> args;
  args.reserve(4 + argv.size());
  args.push_back("EVALSHA");
  args.push_back(script.sha);
  args.push_back("1");
  args.push_back(RecordKey(key));
  for (auto& a : argv) args.push_back(std::move(a));
  auto reply = co_await Here().Execute(MakeCommand(args, 3));
  if (reply.ok() && reply->IsErrorCode("NOSCRIPT")) {
    // First use on this node, or the node restarted: EVAL also caches it.
    args[0] = "EVAL";
    args[1] = script.text;
    reply = co_await Here().Execute(MakeCommand(args, 3));
  }
  co_return reply;
}

Task<StatusOr<core::ReserveResult>> RedisStore::Reserve(std::string key, Record reservation, UnixMillis now) {
  if (reservation.state != RecordState::kInFlight) {
    co_return InvalidArgumentError("redis store: Reserve needs an in-flight record");
  }
  const std::int64_t ttl =
      std::max<std::int64_t>(1, reservation.lease_expires_ms - now) + options_.reservation_grace.count();
  std::string encoded = core::EncodeRecord(reservation);
  if (set_nx_get_.load(std::memory_order_relaxed)) {
    // One native command decides the common cases: a new key is written
    // (nil reply), and a live record that may not be replaced comes back
    // untouched. Only an expired record or an ended lease needs the script,
    // which looks again atomically. Cheaper for Redis than running Lua.
    Command set = SetNxGetCommand(RecordKey(key), encoded, ttl);
    auto reply = co_await Here().Execute(std::move(set));
    if (!reply.ok()) {
      co_return co_await ReserveByReading(std::move(key), std::move(reservation), now, reply.status(),
                                          /*may_land=*/true, /*landed_means_reserved=*/true);
    }
    if (reply->is_nil()) co_return core::ReserveResult{};
    if (reply->type == Reply::Type::kString) {
      auto existing = DecodeStored(reply->str);
      if (!existing.ok()) co_return existing.status();
      const bool replaceable =
          (existing->state == RecordState::kCompleted && existing->ExpiredAt(now)) ||
          (existing->LeaseEndedAt(now) && existing->fingerprint == reservation.fingerprint);
      if (!replaceable) {
        core::ReserveResult result;
        result.outcome = core::ReserveOutcome::kExists;
        result.existing = std::move(existing).value();
        co_return result;
      }
    } else if (reply->IsErrorCode("ERR") && reply->str.find("syntax") != std::string::npos) {
      // A server without NX+GET (before 7.0) refuses the syntax: use the script from now on.
      set_nx_get_.store(false, std::memory_order_relaxed);
    } else if (reply->is_error()) {
      // Refused (OOM, READONLY, MISCONF, NOREPLICAS, ...): nothing was written.
      co_return co_await ReserveByReading(std::move(key), std::move(reservation), now,
                                          StatusFromErrorReply(reply->str), /*may_land=*/false,
                                          /*landed_means_reserved=*/true);
    } else {
      co_return UnexpectedReply(*reply, "reserve");
    }
  }
  co_return co_await ReserveByScript(std::move(key), std::move(encoded), now, std::move(reservation), ttl);
}

Task<StatusOr<core::ReserveResult>> RedisStore::ReserveByScript(std::string key, std::string encoded,
                                                                UnixMillis now, Record reservation,
                                                                std::int64_t ttl) {
  static const Script kScript(kReserveBody);
  std::vector<std::string> argv;
  argv.push_back(std::move(encoded));
  argv.push_back(std::to_string(now));
  argv.push_back(reservation.fingerprint);
  argv.push_back(std::to_string(ttl));
  auto reply = co_await RunScript(kScript, key, std::move(argv));
  if (!reply.ok() || reply->is_error()) {
    // The script may have taken a record over: finding our own reservation
    // afterwards does not tell which it did, so that is left failed (the
    // engine releases it).
    co_return co_await ReserveByReading(std::move(key), std::move(reservation), now,
                                        reply.ok() ? StatusFromErrorReply(reply->str) : reply.status(),
                                        /*may_land=*/!reply.ok(), /*landed_means_reserved=*/false);
  }
  const Reply& r = *reply;
  if (r.type != Reply::Type::kArray || r.elements.empty() || r.elements[0].type != Reply::Type::kInteger) {
    co_return UnexpectedReply(r, "reserve");
  }
  core::ReserveResult result;
  switch (r.elements[0].integer) {
    case 0:
      result.outcome = core::ReserveOutcome::kReserved;
      co_return result;
    case 1:
      result.outcome = core::ReserveOutcome::kTakenOver;
      break;
    case 2:
      result.outcome = core::ReserveOutcome::kExists;
      break;
    default:
      co_return UnexpectedReply(r, "reserve");
  }
  if (r.elements.size() < 2 || r.elements[1].type != Reply::Type::kString) co_return UnexpectedReply(r, "reserve");
  auto existing = DecodeStored(r.elements[1].str);
  if (!existing.ok()) co_return existing.status();
  result.existing = std::move(existing).value();
  co_return result;
}

Task<StatusOr<core::ReserveResult>> RedisStore::ReserveByReading(std::string key, Record reservation,
                                                                 UnixMillis now, Status failed, bool may_land,
                                                                 bool landed_means_reserved) {
  // On the client's second connection: this one may hold the failed write
  // still (CLIENT PAUSE WRITE), and every command behind it.
  Command get = GetCommand(RecordKey(key));
  auto reply = co_await Here().ExecuteAside(std::move(get));
  if (!reply.ok() || reply->type != Reply::Type::kString) co_return failed;  // none, or unreadable too
  auto existing = DecodeStored(reply->str);
  if (!existing.ok()) co_return failed;
  if (existing->state == RecordState::kInFlight && existing->owner == reservation.owner) {
    // The write landed after all (the owner token is this call's alone).
    if (landed_means_reserved) co_return core::ReserveResult{};
    co_return failed;
  }
  // What the write would have replaced counts as no record: the key needs a
  // write, which is what failed.
  if ((existing->state == RecordState::kCompleted && existing->ExpiredAt(now)) ||
      (existing->LeaseEndedAt(now) && existing->fingerprint == reservation.fingerprint)) {
    co_return failed;
  }
  if (may_land) {
    // The write may still run (it was sent and never answered) and, should
    // the record go before it does, leave a reservation nobody holds.
    // Release runs on the same connection, so after the write if at all; the
    // owner token is this call's alone, so it deletes nothing else.
    asio::co_spawn(co_await asio::this_coro::executor, ReleaseLanded(std::move(key), std::move(reservation.owner)),
                   asio::detached);
  }
  core::ReserveResult result;
  result.outcome = core::ReserveOutcome::kExists;
  result.existing = std::move(existing).value();
  co_return result;
}

Task<void> RedisStore::ReleaseLanded(std::string key, std::string owner) {
  (void)co_await Release(std::move(key), std::move(owner));
}

Task<Status> RedisStore::Complete(std::string key, std::string owner, Record completed) {
  static const Script kScript(kCompleteBody);
  if (completed.state != RecordState::kCompleted) {
    co_return InvalidArgumentError("redis store: Complete needs a completed record");
  }
  std::uint64_t dropped = 0;
  if (completed.response.body.size() > max_body_bytes_) {
    // Stored, it could not be read back within store.redis.timeout: every
    // replay would fail. Kept as a response over max_response_bytes is.
    dropped = completed.response.DropBody();
  }
  const std::string operation_id = dropped > 0 ? completed.operation_id : std::string();
  const int status = completed.response.status;
  std::int64_t ttl = 0;
  if (completed.expires_ms != 0) {
    ttl = std::max<std::int64_t>(1, completed.expires_ms - options_.clock->NowMillis()) +
          options_.expiry_grace.count();
  }
  std::vector<std::string> argv;
  argv.push_back(std::move(owner));
  argv.push_back(core::EncodeRecord(completed));
  argv.push_back(std::to_string(ttl));
  argv.push_back(ChannelName(key));
  auto reply = co_await RunScript(kScript, key, std::move(argv));
  if (!reply.ok()) co_return reply.status();
  if (reply->type != Reply::Type::kInteger) co_return UnexpectedReply(*reply, "complete");
  if (reply->integer != 1) co_return OwnerMismatch(reply->integer);
  if (dropped > 0) {  // counted once stored: a completion may be tried more than once
    bodies_dropped_.fetch_add(1, std::memory_order_relaxed);
    static LogLimiter limiter;
    LogWarn(limiter, "response stored without its body: larger than the Redis store keeps at its timeout "
            "(store.redis.timeout); replays answer with an empty body and Idempotency-Replay: omitted",
            {{"key", key},
             {"operation_id", operation_id},
             {"status", status},
             {"body_bytes", dropped},
             {"max_body_bytes", max_body_bytes_}});
  }
  co_return Status::Ok();
}

Task<Status> RedisStore::Release(std::string key, std::string owner) {
  static const Script kScript(kReleaseBody);
  std::vector<std::string> argv;
  argv.push_back(std::move(owner));
  argv.push_back(ChannelName(key));
  auto reply = co_await RunScript(kScript, std::move(key), std::move(argv));
  if (!reply.ok()) co_return reply.status();
  if (reply->type != Reply::Type::kInteger) co_return UnexpectedReply(*reply, "release");
  if (reply->integer == 1) co_return Status::Ok();
  co_return OwnerMismatch(reply->integer);
}

Task<StatusOr<std::optional<Record>>> RedisStore::Get(std::string key, UnixMillis now) {
  Command get = GetCommand(RecordKey(key));
  auto reply = co_await Here().Execute(std::move(get));
  if (!reply.ok()) co_return reply.status();
  if (reply->is_nil()) co_return std::optional<Record>();
  if (reply->type != Reply::Type::kString) co_return UnexpectedReply(*reply, "get");
  auto record = DecodeStored(reply->str);
  if (!record.ok()) co_return record.status();
  if (record->state == RecordState::kCompleted && record->ExpiredAt(now)) co_return std::optional<Record>();
  co_return std::optional<Record>(std::move(record).value());
}

Task<StatusOr<core::PurgeResult>> RedisStore::Purge(std::string key, core::PurgeMode mode, UnixMillis now) {
  static const Script kScript(kPurgeBody);
  std::vector<std::string> argv;
  argv.push_back(ChannelName(key));
  argv.push_back(mode == core::PurgeMode::kUnlessInFlight ? "1" : "0");
  argv.push_back(std::to_string(now));
  auto reply = co_await RunScript(kScript, std::move(key), std::move(argv));
  if (!reply.ok()) co_return reply.status();
  const auto integer_at = [&](std::size_t i) {
    return reply->elements.size() > i && reply->elements[i].type == Reply::Type::kInteger;
  };
  if (reply->type != Reply::Type::kArray || !integer_at(0)) co_return UnexpectedReply(*reply, "purge");
  core::PurgeResult result;
  switch (reply->elements[0].integer) {
    case 0:
      co_return result;
    case 1:
      if (!integer_at(1)) co_return UnexpectedReply(*reply, "purge");
      result.outcome = core::PurgeOutcome::kPurged;
      if (reply->elements[1].integer == static_cast<std::int64_t>(RecordState::kInFlight) ||
          reply->elements[1].integer == static_cast<std::int64_t>(RecordState::kCompleted)) {
        result.state = static_cast<RecordState>(reply->elements[1].integer);
      }
      co_return result;
    case 2:
      if (!integer_at(1)) co_return UnexpectedReply(*reply, "purge");
      result.outcome = core::PurgeOutcome::kInFlight;
      result.state = RecordState::kInFlight;
      result.lease_expires_ms = reply->elements[1].integer;
      co_return result;
    default:
      co_return UnexpectedReply(*reply, "purge");
  }
}

Task<StatusOr<std::unique_ptr<core::Watch>>> RedisStore::WatchKey(std::string key) {
  auto ex = co_await asio::this_coro::executor;
  auto signal = std::make_shared<WatchSignal>(ex);
  std::shared_ptr<WorkerGate> gate;
  if (this_thread_client.store == this) gate = std::static_pointer_cast<WorkerGate>(this_thread_client.gate);
  auto listener = std::make_shared<WatchListener>(ex, signal, gate);
  std::string channel = ChannelName(key);
  std::string record_key = RecordKey(key);
  std::shared_ptr<Subscriber> sub = client_->subscriber().shared_from_this();
  const SteadyTime deadline = SteadyClock::now() + options_.timeout;
  // Subscribed before the baseline read, so no change after it goes unseen.
  // The subscription runs detached on the client's thread and reports back
  // by a post through the gate; this coroutine waits on a timer of its own
  // executor. (Awaiting a co_spawn on the client's executor instead left
  // that thread holding a work-tracking copy of this executor until its
  // completion had unwound there, which could be after a detaching worker's
  // io_context was destroyed: a use after free under ASan.)
  auto reported = std::make_shared<SubscribeReport>(ex);
  reported->timer.expires_at(deadline + std::chrono::seconds(1));
  auto done = [ex, gate, weak = std::weak_ptr<SubscribeReport>(reported)] {
    WatchListener::PostToCaller(ex, gate, [weak] {
      if (auto r = weak.lock()) {
        r->done = true;
        r->timer.cancel();
      }
    });
  };
  asio::co_spawn(client_->executor(), SubscribeAndReport(sub, channel, listener, deadline, std::move(done)),
                 asio::detached);
  if (!reported->done) {
    error_code wait_ec;
    co_await reported->timer.async_wait(asio::redirect_error(asio::use_awaitable, wait_ec));
  }
  Command get = GetCommand(record_key);
  auto reply = co_await Here().Execute(std::move(get));
  Status failed;
  if (!reply.ok()) {
    failed = reply.status();
  } else if (reply->type != Reply::Type::kString && !reply->is_nil()) {
    failed = UnexpectedReply(*reply, "get");
  }
  if (!failed.ok()) {
    asio::post(client_->executor(), [sub, channel, listener] { sub->Remove(channel, listener.get()); });
    co_return failed;
  }
  std::optional<std::string> baseline;
  if (!reply->is_nil()) baseline = std::move(reply->str);
  co_return std::unique_ptr<core::Watch>(
      new RedisWatch(this, std::move(record_key), std::move(channel), std::move(signal), std::move(listener),
                     std::move(baseline)));
}

Task<Status> RedisStore::Ping() {
  if (client_options_.cluster) {
    // PING is answered while the cluster is down; keyed commands are not.
    std::vector<std::string> info = Args({"CLUSTER", "INFO"});
    auto replies = co_await Here().ExecuteOnMasters(std::move(info));
    for (auto& r : replies) {
      if (!r.ok()) co_return r.status();
      if (r->type != Reply::Type::kString) co_return UnexpectedReply(*r, "cluster info");
      if (r->str.find("cluster_state:ok") == std::string::npos) {
        co_return UnavailableError("redis cluster: a master reports cluster_state:fail (keyed commands get "
                                   "CLUSTERDOWN)");
      }
    }
    co_return Status::Ok();
  }
  std::vector<std::string> ping = Args({"PING"});
  auto replies = co_await Here().ExecuteOnMasters(std::move(ping));
  for (auto& r : replies) {
    if (!r.ok()) co_return r.status();
    if (r->type != Reply::Type::kStatus || r->str != "PONG") co_return UnexpectedReply(*r, "ping");
  }
  co_return Status::Ok();
}

core::StoreStats RedisStore::Stats() const {
  const std::int64_t now = SteadyMillis();
  if (now - stats_at_ms_.load() >= 5000 && !stats_busy_.exchange(true)) {
    stats_at_ms_.store(now);
    asio::co_spawn(client_->executor(), RefreshStats(), asio::detached);
  }
  return {stats_keys_.load(), stats_bytes_.load(), bodies_dropped_.load(std::memory_order_relaxed)};
}

Task<void> RedisStore::RefreshStats() const {
  std::vector<std::string> dbsize = Args({"DBSIZE"});
  std::vector<std::string> info = Args({"INFO", "memory"});
  auto sizes = co_await client_->ExecuteOnMasters(std::move(dbsize));
  auto infos = co_await client_->ExecuteOnMasters(std::move(info));
  std::uint64_t keys = 0, bytes = 0;
  bool ok = true;
  for (auto& r : sizes) {
    if (r.ok() && r->type == Reply::Type::kInteger) {
      keys += static_cast<std::uint64_t>(r->integer);
    } else {
      ok = false;
    }
  }
  for (auto& r : infos) {
    if (!r.ok() || r->type != Reply::Type::kString) {
      ok = false;
      continue;
    }
    constexpr std::string_view kField = "used_memory:";
    const auto at = r->str.find(kField);
    if (at == std::string::npos) continue;
    std::uint64_t v = 0;
    const char* begin = r->str.data() + at + kField.size();
    std::from_chars(begin, r->str.data() + r->str.size(), v);
    bytes += v;
  }
  if (ok) {
    stats_keys_.store(keys);
    stats_bytes_.store(bytes);
  }
  stats_busy_.store(false);
}

}  // namespace idemgate::store::redis
