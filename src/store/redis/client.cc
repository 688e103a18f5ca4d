#include "store/redis/client.h"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <set>

#include "common/log.h"

namespace idemgate::store::redis {

namespace asio = boost::asio;
using boost::system::error_code;

namespace {

constexpr int kMaxAttempts = 6;  // redirects and TRYAGAIN pauses per command
constexpr Duration kTryAgainPause = std::chrono::milliseconds(20);

std::shared_ptr<const std::string> ClusterSlotsCommand() {
  static const auto command = std::make_shared<const std::string>("*2\r\n$7\r\nCLUSTER\r\n$5\r\nSLOTS\r\n");
  return command;
}

// co_spawn(..., use_awaitable) needs a default-constructible result.
Task<std::optional<StatusOr<Reply>>> Wrap(Task<StatusOr<Reply>> task) {
  co_return co_await std::move(task);
}

}  // namespace

int Command::Slot() const {
  if (!routed) return -1;
  return KeySlot(std::string_view(*encoded).substr(key_offset, key_size));
}

Command MakeCommand(const std::vector<std::string>& args, int key_index) {
  Command c;
  std::string encoded;
  if (key_index >= 0 && static_cast<std::size_t>(key_index) < args.size()) {
    const auto key = static_cast<std::size_t>(key_index);
    AppendCommand(&encoded, args, key, &c.key_offset);
    c.routed = true;
    c.key_size = args[key].size();
  } else {
    AppendCommand(&encoded, args);
  }
  c.encoded = std::make_shared<const std::string>(std::move(encoded));
  return c;
}

Client::Client(ClientOptions options)
    : options_(std::move(options)),
      own_io_(std::make_unique<asio::io_context>()),
      io_(*own_io_),
      work_(std::in_place, io_.get_executor()),
      refresh_timer_(io_) {
  if (options_.cluster) slots_.assign(kSlotCount, nullptr);
  subscriber_ = std::make_shared<Subscriber>(
      io_.get_executor(), options_.connection, [this] { return NextSubscriberAddress(); },
      options_.subscriber_ping);
  asio::post(io_, [this] { Seed(); });
  thread_ = std::thread([this] { io_.run(); });
}

Client::Client(ClientOptions options, asio::io_context& io)
    : options_(std::move(options)), io_(io), refresh_timer_(io_) {
  if (options_.cluster) slots_.assign(kSlotCount, nullptr);
  Seed();  // on the worker thread: the connections start dialling once `io` runs
}

void Client::Seed() {
  for (const Address& seed : options_.seeds) Node(seed);
  if (!options_.cluster) standalone_ = Node(options_.seeds.front());
  RequestRefresh();
}

Client::~Client() { Shutdown(); }

void Client::Shutdown() {
  auto close = [this] {
    closed_ = true;
    refresh_timer_.cancel();
    for (auto* group : {&nodes_, &aside_}) {
      for (auto& [name, conn] : *group) {
        conn->set_on_failure(nullptr);  // a connection may outlive this client in a pending handler
        conn->Close();
      }
    }
    if (subscriber_) subscriber_->Close();
  };
  if (worker_bound()) {
    if (!closed_) close();
    return;
  }
  if (!thread_.joinable()) return;
  asio::post(io_, close);
  work_.reset();
  thread_.join();
}

std::shared_ptr<Connection> Client::Node(const Address& address) {
  auto [it, inserted] = nodes_.try_emplace(address.ToString());
  if (inserted) {
    it->second = std::make_shared<Connection>(io_.get_executor(), address, options_.connection);
    if (closed_) {
      it->second->Close();
    } else {
      if (options_.cluster) it->second->set_on_failure([this] { RequestRefresh(); });
      it->second->Start();
    }
  }
  return it->second;
}

std::shared_ptr<Connection> Client::AsideNode(const Address& address) {
  auto [it, inserted] = aside_.try_emplace(address.ToString());
  if (inserted) {
    // Not started: its first command dials it.
    it->second = std::make_shared<Connection>(io_.get_executor(), address, options_.connection);
    if (closed_) it->second->Close();
  }
  return it->second;
}

std::shared_ptr<Connection> Client::AnyNode() {
  // A node that answered CLUSTERDOWN or an empty slot map only when no other
  // one is left: a seed that is no cluster member would answer every command
  // with CLUSTERDOWN.
  for (const bool avoid_shunned : {true, false}) {
    auto usable = [&](const Connection* c) {
      return c->state() != Connection::State::kBackoff && !(avoid_shunned && shunned_.contains(c));
    };
    if (options_.cluster) {
      for (Connection* c : slots_) {
        if (c != nullptr && usable(c)) return c->shared_from_this();
      }
    }
    for (const Address& seed : options_.seeds) {
      auto c = Node(seed);
      if (usable(c.get())) return c;
    }
  }
  return Node(options_.seeds.front());
}

std::vector<std::shared_ptr<Connection>> Client::Masters() const {
  std::vector<std::shared_ptr<Connection>> out;
  std::set<const Connection*> seen;
  for (Connection* c : slots_) {
    if (c != nullptr && seen.insert(c).second) out.push_back(c->shared_from_this());
  }
  return out;
}

Address Client::NextSubscriberAddress() {
  std::vector<Address> candidates = options_.seeds;
  for (const auto& [name, conn] : nodes_) {
    if (std::find(candidates.begin(), candidates.end(), conn->address()) == candidates.end()) {
      candidates.push_back(conn->address());
    }
  }
  return candidates[subscriber_rr_++ % candidates.size()];
}

Task<StatusOr<Reply>> Client::Execute(Command command) { return ExecuteOn(std::move(command), false); }

Task<StatusOr<Reply>> Client::ExecuteAside(Command command) { return ExecuteOn(std::move(command), true); }

Task<StatusOr<Reply>> Client::ExecuteOn(Command command, bool aside) {
  const SteadyTime deadline = SteadyClock::now() + options_.timeout;
  commands_.fetch_add(1, std::memory_order_relaxed);
  if (worker_bound()) co_return co_await Route(std::move(command), deadline, aside);  // already on io_
  auto result =
      co_await asio::co_spawn(io_, Wrap(Route(std::move(command), deadline, aside)), asio::use_awaitable);
  co_return std::move(*result);
}

Task<StatusOr<Reply>> Client::Route(Command command, SteadyTime deadline, bool aside) {
  if (closed_) co_return UnavailableError("redis: client closed");
  if (!not_a_cluster_.empty()) {
    RequestRefresh();  // spaced out; finds the slot map once the servers have one
    co_return UnavailableError(not_a_cluster_);
  }
  std::shared_ptr<Connection> conn;
  if (!options_.cluster) {
    conn = standalone_;
  } else if (const int slot = command.Slot(); slot >= 0 && slots_[static_cast<std::size_t>(slot)] != nullptr) {
    conn = slots_[static_cast<std::size_t>(slot)]->shared_from_this();
  } else {
    conn = AnyNode();
  }
  if (aside) conn = AsideNode(conn->address());
  bool asking = false;
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    StatusOr<Reply> reply = co_await conn->Execute(command.encoded, deadline, asking);
    if (!reply.ok()) {
      if (options_.cluster && reply.status().code() == StatusCode::kUnavailable) RequestRefresh();
      co_return reply;
    }
    if (!options_.cluster || !reply->is_error()) co_return reply;
    if (auto redirect = ParseRedirect(*reply)) {
      Address target = redirect->address;
      if (target.host.empty()) target.host = conn->address().host;
      std::shared_ptr<Connection> node = Node(target);
      conn = aside ? AsideNode(target) : node;
      if (redirect->kind == Redirect::Kind::kMoved) {
        moved_.fetch_add(1, std::memory_order_relaxed);
        slots_[static_cast<std::size_t>(redirect->slot)] = node.get();
        RequestRefresh();
        asking = false;
      } else {
        ask_.fetch_add(1, std::memory_order_relaxed);
        asking = true;
      }
      continue;
    }
    if (reply->IsErrorCode("TRYAGAIN") && SteadyClock::now() + kTryAgainPause < deadline) {
      asio::steady_timer pause(io_, kTryAgainPause);
      error_code ec;
      co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    if (reply->IsErrorCode("CLUSTERDOWN")) {
      // The next refresh asks other nodes first: this one may be no cluster
      // member at all (reset, or never joined), with an empty slot map.
      shunned_.insert(Node(conn->address()).get());
      RequestRefresh();
    }
    co_return reply;
  }
  co_return UnavailableError("redis: too many redirects");
}

Task<std::vector<StatusOr<Reply>>> Client::ExecuteOnMasters(std::vector<std::string> args) {
  commands_.fetch_add(1, std::memory_order_relaxed);
  if (worker_bound()) co_return co_await OnMasters(std::move(args));
  co_return co_await asio::co_spawn(io_, OnMasters(std::move(args)), asio::use_awaitable);
}

Task<std::vector<StatusOr<Reply>>> Client::OnMasters(std::vector<std::string> args) {
  std::vector<StatusOr<Reply>> results;
  if (closed_) {
    results.emplace_back(UnavailableError("redis: client closed"));
    co_return results;
  }
  if (!not_a_cluster_.empty()) {
    RequestRefresh();
    results.emplace_back(UnavailableError(not_a_cluster_));
    co_return results;
  }
  std::vector<std::shared_ptr<Connection>> targets;
  if (options_.cluster) {
    // Nothing redirects these commands: a master demoted by a failover
    // answers them as a replica, and a master added by a scale-out would
    // never be asked. So a map this old is reloaded first; refresh_started_
    // is set when a refresh begins, so concurrent callers share one.
    Status refreshed;
    if (Masters().empty() || SteadyClock::now() - refresh_started_ >= options_.masters_max_age) {
      refreshed = co_await RefreshOnce();
    }
    targets = Masters();
    if (targets.empty()) {
      results.emplace_back(refreshed.ok() ? UnavailableError("redis cluster: no slot is served") : refreshed);
      co_return results;
    }
    if (!refreshed.ok() && !closed_) {
      static LogLimiter limiter;
      LogWarn(limiter, "redis cluster: slot map refresh failed; asking the masters of the map in use",
              {{"error", refreshed.ToString()}});
    }
  } else {
    targets.push_back(standalone_);
  }
  auto encoded = std::make_shared<const std::string>(EncodeCommand(args));
  for (auto& conn : targets) {
    results.push_back(co_await conn->Execute(encoded, SteadyClock::now() + options_.timeout));
  }
  co_return results;
}

Task<Status> Client::RefreshSlots() {
  if (worker_bound()) co_return co_await RefreshOnce();
  co_return co_await asio::co_spawn(io_, RefreshOnce(), asio::use_awaitable);
}

Task<Status> Client::RefreshOnce() {
  if (!options_.cluster) co_return Status::Ok();
  if (closed_) co_return UnavailableError("redis: client closed");
  refresh_started_ = SteadyClock::now();
  // The masters of the current map, the seeds, then every other node known;
  // those that answered CLUSTERDOWN or an empty slot map last.
  std::vector<std::shared_ptr<Connection>> candidates = Masters();
  auto add = [&candidates](std::shared_ptr<Connection> c) {
    if (std::find(candidates.begin(), candidates.end(), c) == candidates.end()) candidates.push_back(std::move(c));
  };
  for (const Address& seed : options_.seeds) add(Node(seed));
  for (const auto& [name, conn] : nodes_) add(conn);
  std::stable_partition(candidates.begin(), candidates.end(),
                        [this](const auto& c) { return !shunned_.contains(c.get()); });
  const auto slots_command = ClusterSlotsCommand();
  Status last = UnavailableError("redis cluster: no node to ask for the slot map");
  std::string not_a_cluster;
  // The reply that serves the most slots. One that serves them all is taken
  // at once; else every candidate is asked. A node that is no cluster member
  // (never joined, or reset after a scale-in) answers with no slot at all:
  // taking that would leave every command without a node.
  std::vector<SlotRange> best;
  std::size_t best_served = 0;
  Connection* best_from = nullptr;
  for (auto& conn : candidates) {
    auto reply = co_await conn->Execute(slots_command, SteadyClock::now() + options_.timeout);
    if (closed_) co_return UnavailableError("redis: client closed");
    if (!reply.ok()) {
      last = reply.status();
      continue;
    }
    if (reply->is_error() && reply->str.find("cluster support disabled") != std::string::npos) {
      not_a_cluster = "redis " + conn->address().ToString() +
                      ": not a cluster node (store.redis.cluster is true): " + reply->str;
      last = UnavailableError(not_a_cluster);
      continue;
    }
    auto ranges = ParseClusterSlots(*reply, conn->address());
    if (!ranges.ok()) {
      last = ranges.status();
      continue;
    }
    std::vector<bool> served(kSlotCount, false);
    for (const SlotRange& r : *ranges) std::fill(served.begin() + r.first, served.begin() + r.last + 1, true);
    const auto count = static_cast<std::size_t>(std::count(served.begin(), served.end(), true));
    if (count == 0) {
      shunned_.insert(conn.get());
      last = UnavailableError("redis cluster: " + conn->address().ToString() +
                              " serves no slot (CLUSTER SLOTS is empty: not a member of the cluster)");
      continue;
    }
    if (count <= best_served) continue;
    best = std::move(ranges).value();
    best_served = count;
    best_from = conn.get();
    if (count == static_cast<std::size_t>(kSlotCount)) break;
  }
  if (best_from != nullptr) {
    std::vector<Connection*> next(kSlotCount, nullptr);
    for (const SlotRange& r : best) {
      Connection* master = Node(r.master).get();
      std::fill(next.begin() + r.first, next.begin() + r.last + 1, master);
    }
    slots_.swap(next);
    not_a_cluster_.clear();
    shunned_.erase(best_from);
    refreshes_.fetch_add(1, std::memory_order_relaxed);
    co_return Status::Ok();
  }
  // No node had a slot map (the map in use, if any, is kept); one without
  // cluster support at all means the configuration is wrong: everything
  // fails with that, rather than run unrouted on whichever seed answers (two
  // standalone servers would each hold half the records).
  if (!not_a_cluster.empty()) not_a_cluster_ = std::move(not_a_cluster);
  co_return last;
}

void Client::RequestRefresh() {
  if (!options_.cluster || closed_) return;
  if (refreshing_) {
    refresh_again_ = true;
    return;
  }
  refreshing_ = true;
  asio::co_spawn(io_, RefreshLoop(), asio::detached);
}

Task<void> Client::RefreshLoop() {
  do {
    refresh_again_ = false;
    (void)co_await RefreshOnce();
    if (closed_) break;
    // Space refreshes out: a burst of MOVED replies costs one more at most.
    refresh_timer_.expires_after(options_.refresh_interval);
    error_code ec;
    co_await refresh_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  } while (refresh_again_ && !closed_);
  refreshing_ = false;
}

}  // namespace idemgate::store::redis
