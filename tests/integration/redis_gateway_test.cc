// Acceptance tests of `store.kind: redis` with the real idemgate binary
// (SPEC §4.2, §5): two gateway processes sharing one standalone Redis or one
// 3-master Redis Cluster, in front of fake_upstream, which counts executions.
// "Exactly one request per key ever executes at a time, across threads,
// processes and gateway instances sharing a store."
//
// Every test starts its own redis-server processes on free loopback ports
// (the cluster is made once for its suite), and skips when Redis is not
// installed. The route `api` (every path) has identity none, so a client key
// K is stored as `t-_:_:_:api:K` under the Redis key `idemgate:r:t-_:_:_:api:K`.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <functional>
#include <iostream>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "integration/harness.h"
#include "store/redis/cluster.h"
#include "tests/redis/redis_server.h"

namespace idemgate::testing {
namespace {

namespace rt = ::idemgate::store::redis::testing;
using ::idemgate::store::redis::KeySlot;
using ::idemgate::store::redis::Reply;

constexpr int kDuplicates = 100;

std::string StoredKey(std::string_view key) { return "t-_:_:_:api:" + std::string(key); }
std::string RedisKey(std::string_view key) { return "idemgate:r:" + StoredKey(key); }
// How fake_upstream's by_key names a key: the header value the gateway forwarded.
std::string ForwardedKey(std::string_view key) { return "\"" + StoredKey(key) + "\""; }

bool Replayed(const HttpResponse& r) { return r.Header("Idempotent-Replayed") == "true"; }

struct GatewaySetup {
  std::vector<std::string> addresses;
  bool cluster = false;
  std::string redis_timeout = "1s";
  std::string on_error = "fail_closed";
  std::string idempotency = "{ policy: required }";
  std::string upstream_timeout = "10s";  // a route's lease must last at least this long
};

std::string ConfigYaml(const HostPort& fake, const GatewaySetup& s) {
  std::ostringstream y;
  y << "listen: 127.0.0.1:0\n"
    << "workers: 2\n"
    << "shutdown_grace: 5s\n"
    << "admin: { listen: 127.0.0.1:0 }\n"
    << "store:\n"
    << "  kind: redis\n"
    << "  on_error: " << s.on_error << "\n"
    << "  redis: { addresses: [";
  for (std::size_t i = 0; i < s.addresses.size(); ++i) y << (i > 0 ? ", " : "") << s.addresses[i];
  y << "], cluster: " << (s.cluster ? "true" : "false") << ", timeout: " << s.redis_timeout
    << " }\n"
    << "log: { level: info, format: json }\n"
    << "upstreams:\n"
    << "  fake: { url: http://" << fake.ToString()
    << ", timeout: " << s.upstream_timeout << ", connect_timeout: 2s, max_connections: 256 }\n"
    << "routes:\n"
    << "  - id: api\n"
    << "    match: { path_prefix: / }\n"
    << "    upstream: fake\n"
    << "    idempotency: " << s.idempotency << "\n";
  return y.str();
}

std::string Series(std::string_view family, std::string_view extra_label = "") {
  std::string s = std::string(family) + R"({tenant="_",project="_",route="api")";
  if (!extra_label.empty()) s += "," + std::string(extra_label);
  return s + "}";
}

HttpResponse Send(const GatewayProcess& g, const HttpRequest& req) {
  auto res = SendRequest(g.endpoint(), req, 60s);
  EXPECT_TRUE(res.ok()) << res.status().ToString();
  return res.ok() ? *res : HttpResponse{};
}

HttpResponse Admin(const GatewayProcess& g, std::string target) {
  auto res = SendRequest(g.admin(), HttpRequest{.target = std::move(target)});
  EXPECT_TRUE(res.ok()) << res.status().ToString();
  return res.ok() ? *res : HttpResponse{};
}

// A counter of one gateway; 0 while the series has not appeared.
double Metric(const GatewayProcess& g, const std::string& series) {
  return MetricValue(Admin(g, "/metrics").body, series).value_or(0.0);
}

// The sum of a counter over gateways.
double MetricSum(const std::vector<GatewayProcess*>& gws, const std::string& series) {
  double sum = 0;
  for (const GatewayProcess* g : gws) sum += Metric(*g, series);
  return sum;
}

// `n` copies of `req` released at once (a latch), client i to gws[i % size].
std::vector<std::optional<HttpResponse>> SendAtOnce(const std::vector<GatewayProcess*>& gws,
                                                    const HttpRequest& req, int n) {
  std::vector<std::optional<HttpResponse>> results(static_cast<std::size_t>(n));
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::latch start(n);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      const HostPort endpoint = gws[static_cast<std::size_t>(i) % gws.size()]->endpoint();
      start.arrive_and_wait();
      auto res = SendRequest(endpoint, req, 60s);
      if (res.ok()) {
        results[static_cast<std::size_t>(i)] = std::move(*res);
      } else {
        errors[static_cast<std::size_t>(i)] = res.status().ToString();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(results[static_cast<std::size_t>(i)].has_value())
        << "client " << i << " got no response: " << errors[static_cast<std::size_t>(i)];
  }
  return results;
}

// Keyed POSTs to /echo with a fresh key each, from `threads` client threads
// spread over the gateways, until Stop(). Keeps every outcome.
class Load {
 public:
  Load(std::vector<GatewayProcess*> gws, std::string prefix, int threads = 4)
      : gws_(std::move(gws)), prefix_(std::move(prefix)) {
    for (int t = 0; t < threads; ++t) {
      threads_.emplace_back([this, t] {
        for (int i = 0; !stop_.load(); ++i) {
          const GatewayProcess* g = gws_[static_cast<std::size_t>(t + i) % gws_.size()];
          const std::string key = prefix_ + "-" + std::to_string(t) + "-" + std::to_string(i);
          auto res = SendRequest(g->endpoint(), KeyedPost("/echo", key, R"({"load":true})"), 30s);
          std::lock_guard lock(mu_);
          if (res.ok()) {
            if (res->status == 200) ok_.fetch_add(1);
            if (res->status == 503) unavailable_.fetch_add(1);
            responses_.push_back(std::move(*res));
          } else {
            errors_.push_back(key + ": " + res.status().ToString());
          }
          done_.fetch_add(1);
        }
      });
    }
  }
  ~Load() { Stop(); }

  void Stop() {
    stop_ = true;
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  int ok() const { return ok_.load(); }
  int unavailable() const { return unavailable_.load(); }
  int done() const { return done_.load(); }
  // Only after Stop().
  const std::vector<HttpResponse>& responses() const { return responses_; }
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  std::vector<GatewayProcess*> gws_;
  std::string prefix_;
  std::atomic<bool> stop_{false};
  std::atomic<int> ok_{0}, unavailable_{0}, done_{0};
  std::mutex mu_;
  std::vector<HttpResponse> responses_;
  std::vector<std::string> errors_;
  std::vector<std::thread> threads_;
};

class RedisGatewayTestBase : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEMGATE_REQUIRE_REDIS();
    auto fake = StartFakeUpstream(dir_, 4);
    ASSERT_TRUE(fake.ok()) << fake.status().ToString();
    fake_.emplace(std::move(*fake));
    fake_endpoint_ = fake_->Endpoint().value();
  }

  void TearDown() override {
    for (auto& g : gateways_) {
      if (HasFailure()) g->DumpLogs();
      // A gateway a test killed is not stopped (Stop expects exit 0).
      if (g->process().Running()) g->Stop();
    }
    gateways_.clear();
  }

  // Starts a gateway; nullptr (and a test failure) when it does not start.
  GatewayProcess* StartGateway(const GatewaySetup& setup, const std::string& name) {
    auto g = GatewayProcess::Start(dir_, ConfigYaml(fake_endpoint_, setup), {}, name);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    if (!g.ok()) return nullptr;
    gateways_.push_back(std::make_unique<GatewayProcess>(std::move(*g)));
    return gateways_.back().get();
  }

  FakeStats Stats() {
    auto stats = FetchFakeStats(fake_endpoint_);
    EXPECT_TRUE(stats.ok()) << stats.status().ToString();
    return stats.ok() ? *stats : FakeStats{};
  }
  std::uint64_t Executions() { return Stats().executions; }

  // 100 copies of one request at once across `gws`, in_flight: wait: one
  // execution, every client gets its 200, body and X-Operation-Id.
  void ExpectWaitModeDedup(const std::vector<GatewayProcess*>& gws, const std::string& key) {
    const std::uint64_t before = Executions();
    const double misses_before = MetricSum(gws, Series("idempotency_cache_miss_total"));
    const auto results =
        SendAtOnce(gws, KeyedPost("/slow?ms=300", key, R"({"amount":100})"), kDuplicates);
    EXPECT_EQ(Executions(), before + 1);
    EXPECT_EQ(Stats().by_key[ForwardedKey(key)], 1u);
    const HttpResponse* original = nullptr;
    int originals = 0, replays = 0;
    for (const auto& r : results) {
      if (r && r->status == 200 && !Replayed(*r)) {
        original = &*r;
        ++originals;
      }
    }
    ASSERT_EQ(originals, 1) << "exactly one client gets the original (not replayed) response";
    const auto op = original->Header("X-Operation-Id");
    ASSERT_TRUE(op.has_value());
    for (std::size_t i = 0; i < results.size(); ++i) {
      if (!results[i]) continue;
      const HttpResponse& r = *results[i];
      EXPECT_EQ(r.status, 200) << "client " << i << ": " << r.body;
      EXPECT_EQ(r.body, original->body) << "client " << i;
      EXPECT_EQ(r.Header("X-Operation-Id"), op) << "client " << i;
      if (Replayed(r)) ++replays;
    }
    EXPECT_EQ(replays, kDuplicates - 1);
    // One reservation was made, by one of the two gateways.
    EXPECT_EQ(MetricSum(gws, Series("idempotency_cache_miss_total")), misses_before + 1);
    std::cout << "[ figures ] wait mode: 1 original, " << replays
              << " replays (waiters: " << MetricSum(gws, Series("idempotency_wait_total")) << ")\n";
  }

  // 100 copies of one request at once across `gws`, in_flight: reject: one
  // execution; one 200 original, the rest 409 request-in-flight or, when they
  // came after the original landed, replays.
  void ExpectRejectModeDedup(const std::vector<GatewayProcess*>& gws, const std::string& key) {
    const std::uint64_t before = Executions();
    const HttpRequest req = KeyedPost("/slow?ms=3000", key, R"({"amount":200})");
    const double conflicts_before =
        MetricSum(gws, Series("idempotency_conflict_total", R"(reason="in_flight")"));
    const double hits_before =
        MetricSum(gws, Series("idempotency_cache_hit_total", R"(status="200")"));
    const double misses_before = MetricSum(gws, Series("idempotency_cache_miss_total"));
    const auto results = SendAtOnce(gws, req, kDuplicates);
    EXPECT_EQ(Executions(), before + 1);
    const HttpResponse* original = nullptr;
    int originals = 0, conflicts = 0, replays = 0;
    for (const auto& r : results) {
      if (r && r->status == 200 && !Replayed(*r)) {
        original = &*r;
        ++originals;
      }
    }
    ASSERT_EQ(originals, 1) << "exactly one client gets the original (not replayed) response";
    for (std::size_t i = 0; i < results.size(); ++i) {
      if (!results[i] || &*results[i] == original) continue;
      const HttpResponse& r = *results[i];
      SCOPED_TRACE("client " + std::to_string(i));
      if (r.status == 409) {
        ++conflicts;
        ExpectProblem(r, 409, "request-in-flight");
        EXPECT_TRUE(r.HasHeader("Retry-After"));
      } else if (r.status == 200 && Replayed(r)) {
        ++replays;
        EXPECT_EQ(r.body, original->body);
        EXPECT_EQ(r.Header("X-Operation-Id"), original->Header("X-Operation-Id"));
      } else {
        ADD_FAILURE() << "unexpected " << r.status << ": " << r.body;
      }
    }
    EXPECT_EQ(conflicts + replays, kDuplicates - 1);
    // The upstream holds the original for 3 s while 99 duplicates arrive.
    EXPECT_GE(conflicts, 1) << "no duplicate arrived while the original was in flight";
    // The gateways counted exactly what the clients saw.
    EXPECT_EQ(MetricSum(gws, Series("idempotency_conflict_total", R"(reason="in_flight")")),
              conflicts_before + conflicts);
    EXPECT_EQ(MetricSum(gws, Series("idempotency_cache_hit_total", R"(status="200")")),
              hits_before + replays);
    EXPECT_EQ(MetricSum(gws, Series("idempotency_cache_miss_total")), misses_before + 1);
    std::cout << "[ figures ] reject mode: 1 original, " << conflicts << " x 409, " << replays
              << " replays\n";
    // Once it landed, a retry on either gateway is a replay.
    for (GatewayProcess* g : gws) {
      const HttpResponse again = Send(*g, req);
      EXPECT_EQ(again.status, 200);
      EXPECT_TRUE(Replayed(again));
      EXPECT_EQ(again.body, original->body);
    }
    EXPECT_EQ(Executions(), before + 1);
  }

  TempDir dir_;
  std::optional<Server> fake_;
  HostPort fake_endpoint_;
  std::vector<std::unique_ptr<GatewayProcess>> gateways_;
};

// ---------------------------------------------------------------------------
// One standalone Redis per test.

class RedisGatewayTest : public RedisGatewayTestBase {
 protected:
  void SetUp() override {
    RedisGatewayTestBase::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_TRUE(redis_.Start());
  }

  GatewaySetup Standalone(std::string idempotency) {
    GatewaySetup s;
    s.addresses = {redis_.address()};
    s.idempotency = std::move(idempotency);
    return s;
  }

  rt::RedisServer redis_;
};

TEST_F(RedisGatewayTest, HundredDuplicatesOnTwoGatewaysWaitModeExecuteOnce) {
  const GatewaySetup s = Standalone("{ policy: required, in_flight: wait, wait_timeout: 20s }");
  GatewayProcess* a = StartGateway(s, "gw-a");
  GatewayProcess* b = StartGateway(s, "gw-b");
  ASSERT_TRUE(a != nullptr && b != nullptr);
  ExpectWaitModeDedup({a, b}, "dup-wait");
  EXPECT_EQ(redis_.Run({"EXISTS", RedisKey("dup-wait")}).integer, 1);
}

TEST_F(RedisGatewayTest, HundredDuplicatesOnTwoGatewaysRejectModeExecuteOnce) {
  const GatewaySetup s = Standalone("{ policy: required, in_flight: reject }");
  GatewayProcess* a = StartGateway(s, "gw-a");
  GatewayProcess* b = StartGateway(s, "gw-b");
  ASSERT_TRUE(a != nullptr && b != nullptr);
  ExpectRejectModeDedup({a, b}, "dup-reject");
}

TEST_F(RedisGatewayTest, RedisKilledMidLoadFailsClosedAndRecoversAfterRestart) {
  GatewaySetup s = Standalone("{ policy: required }");
  s.redis_timeout = "200ms";
  GatewayProcess* a = StartGateway(s, "gw-a");
  GatewayProcess* b = StartGateway(s, "gw-b");
  ASSERT_TRUE(a != nullptr && b != nullptr);
  const std::vector<GatewayProcess*> gws = {a, b};

  Load load(gws, "closed");
  const bool warmed = PollUntil([&] { return load.ok() >= 20; }, 20s);
  redis_.Kill();
  const bool refused = PollUntil([&] { return load.unavailable() >= 10; }, 20s);
  load.Stop();
  ASSERT_TRUE(warmed) << "no successful keyed request before the kill";
  ASSERT_TRUE(refused) << "no 503 after Redis was killed";
  EXPECT_TRUE(load.errors().empty()) << load.errors().front();
  int unavailable = 0;
  for (const HttpResponse& r : load.responses()) {
    // Requests in flight at the kill may have reserved before it: 200.
    if (r.status == 200) continue;
    ++unavailable;
    ExpectProblem(r, 503, "store-unavailable");
  }

  // While Redis is down: keyed requests are refused without reaching the
  // upstream, readiness fails, and the gateways keep running.
  const std::uint64_t executions = Executions();
  for (GatewayProcess* g : gws) {
    const HttpResponse r = Send(*g, KeyedPost("/echo", "while-down"));
    ExpectProblem(r, 503, "store-unavailable");
    EXPECT_TRUE(r.HasHeader("Retry-After"));
    ++unavailable;
    ExpectProblem(Admin(*g, "/readyz"), 503, "store-unavailable");
    EXPECT_TRUE(g->process().Running());
  }
  EXPECT_EQ(Executions(), executions);

  // Same port again: the gateways reconnect by themselves. Every worker has
  // its own Redis connection, each with its own backoff, so a gateway is back
  // once ten requests in a row (on new connections, spread over its workers)
  // succeed, not at its first success.
  ASSERT_TRUE(redis_.Start());
  for (std::size_t i = 0; i < gws.size(); ++i) {
    int attempt = 0;
    const bool back = PollUntil(
        [&] {
          for (int n = 0; n < 10; ++n) {
            const HttpResponse r = Send(
                *gws[i],
                KeyedPost("/echo", "after-" + std::to_string(i) + "-" + std::to_string(attempt++)));
            if (r.status == 503) {
              ExpectProblem(r, 503, "store-unavailable");
              ++unavailable;
              return false;
            }
            EXPECT_EQ(r.status, 200) << r.body;
          }
          return true;
        },
        20s, 100ms);
    EXPECT_TRUE(back) << "gateway " << i << " did not recover after Redis restarted";
    EXPECT_TRUE(PollUntil([&] { return Admin(*gws[i], "/readyz").status == 200; }, 20s, 100ms));
  }
  // And deduplicate across instances again.
  const HttpResponse first = Send(*a, KeyedPost("/echo", "after-restart"));
  EXPECT_EQ(first.status, 200);
  const HttpResponse replay = Send(*b, KeyedPost("/echo", "after-restart"));
  EXPECT_EQ(replay.status, 200);
  EXPECT_TRUE(Replayed(replay));
  EXPECT_EQ(replay.body, first.body);

  // Every 503 a client saw is one failed reservation the gateways counted.
  EXPECT_EQ(MetricSum(gws, Series("idempotency_store_errors_total", R"(op="reserve")")),
            unavailable);
  std::cout << "[ figures ] fail_closed: " << load.ok() << " ok under load, " << unavailable
            << " x 503\n";
}

TEST_F(RedisGatewayTest, RedisKilledMidLoadFailsOpenAndCountsIt) {
  GatewaySetup s = Standalone("{ policy: required }");
  s.redis_timeout = "200ms";
  s.on_error = "fail_open";
  GatewayProcess* a = StartGateway(s, "gw-a");
  GatewayProcess* b = StartGateway(s, "gw-b");
  ASSERT_TRUE(a != nullptr && b != nullptr);
  const std::vector<GatewayProcess*> gws = {a, b};
  // Deduplicated while Redis is up.
  const HttpResponse stored = Send(*a, KeyedPost("/echo", "k-open"));
  ASSERT_EQ(stored.status, 200);
  ASSERT_TRUE(Replayed(Send(*b, KeyedPost("/echo", "k-open"))));

  constexpr int kThreads = 4;
  Load load(gws, "open", kThreads);
  const bool warmed = PollUntil([&] { return load.ok() >= 20; }, 20s);
  redis_.Kill();
  const int at_kill = load.done();
  const bool continued = PollUntil([&] { return load.done() >= at_kill + 30; }, 20s);
  load.Stop();
  ASSERT_TRUE(warmed && continued);
  EXPECT_TRUE(load.errors().empty()) << load.errors().front();
  for (const HttpResponse& r : load.responses()) EXPECT_EQ(r.status, 200) << r.body;
  // At most kThreads requests were past their reservation at the kill; every
  // later one was forwarded without deduplication.
  const double open_under_load = MetricSum(gws, Series("idempotency_fail_open_total"));
  EXPECT_GE(open_under_load, load.done() - at_kill - kThreads);

  // Counted one by one: the stored key (now forwarded again) and a new one, on each gateway.
  const std::uint64_t executions = Executions();
  for (GatewayProcess* g : gws) {
    const double before = Metric(*g, Series("idempotency_fail_open_total"));
    for (const char* key : {"k-open", "k-open-new"}) {
      const HttpResponse r = Send(*g, KeyedPost("/echo", key));
      EXPECT_EQ(r.status, 200) << r.body;
      EXPECT_FALSE(Replayed(r));
    }
    EXPECT_EQ(Metric(*g, Series("idempotency_fail_open_total")), before + 2);
    EXPECT_TRUE(g->process().Running());
  }
  EXPECT_EQ(Executions(), executions + 4);
  EXPECT_EQ(MetricSum(gws, Series("idempotency_fail_open_total")), open_under_load + 4);

  // After a restart deduplication resumes (the records died with the server).
  ASSERT_TRUE(redis_.Start());
  int attempt = 0;
  const bool dedup_back = PollUntil(
      [&] {
        const std::string key = "open-after-" + std::to_string(attempt++);
        const HttpResponse first = Send(*a, KeyedPost("/echo", key));
        EXPECT_EQ(first.status, 200);
        const HttpResponse second = Send(*b, KeyedPost("/echo", key));
        EXPECT_EQ(second.status, 200);
        return Replayed(second) && second.body == first.body;
      },
      20s, 100ms);
  EXPECT_TRUE(dedup_back);
  std::cout << "[ figures ] fail_open: " << load.done() - at_kill << " requests after the kill, "
            << open_under_load << " forwarded without dedup\n";
}

TEST_F(RedisGatewayTest, KilledOwnersReservationIsTakenOverByTheOtherGatewayAfterItsLease) {
  GatewaySetup s = Standalone("{ policy: required, in_flight: reject, lease: 6s }");
  s.upstream_timeout = "5300ms";
  GatewayProcess* a = StartGateway(s, "gw-a");
  GatewayProcess* b = StartGateway(s, "gw-b");
  ASSERT_TRUE(a != nullptr && b != nullptr);
  const HttpRequest req = KeyedPost("/slow?ms=5000", "k-orphan", R"({"amount":7})");

  // Gateway A reserves and forwards, then dies with kill -9 before answering.
  const auto sent_at = std::chrono::steady_clock::now();
  std::thread orphan(
      [&] { EXPECT_FALSE(SendRequest(a->endpoint(), req, 30s).ok()) << "A answered"; });
  const bool forwarded = PollUntil([&] { return Executions() >= 1; }, 10s);
  a->Kill();
  orphan.join();
  ASSERT_TRUE(forwarded);
  EXPECT_FALSE(a->process().Running());

  // Gateway B: 409 while the lease holds, then takes the key over.
  int conflicts = 0;
  std::optional<std::chrono::steady_clock::time_point> first_answer;
  std::optional<HttpResponse> taken;
  const bool took_over = PollUntil(
      [&] {
        const HttpResponse r = Send(*b, req);
        if (!first_answer) first_answer = std::chrono::steady_clock::now();
        if (r.status == 409) {
          ExpectProblem(r, 409, "request-in-flight");
          EXPECT_TRUE(r.HasHeader("Retry-After"));
          ++conflicts;
          return false;
        }
        taken = r;
        return true;
      },
      30s, 100ms);
  ASSERT_TRUE(took_over);
  // A's reservation was made after sent_at, so its lease ran at least until
  // sent_at + 6 s: an answer before then was given while the lease held.
  if (*first_answer - sent_at < 5900ms) {
    EXPECT_GE(conflicts, 1) << "B did not refuse while A's lease was valid";
  } else {
    std::cout
        << "[ note ] B's first answer came "
        << std::chrono::duration_cast<std::chrono::milliseconds>(*first_answer - sent_at).count()
        << " ms after A's request; its lease may have ended already\n";
  }
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->status, 200) << taken->body;
  EXPECT_FALSE(Replayed(*taken));
  EXPECT_EQ(ParseObject(taken->body)["execution"], 2) << "the retry executed again";
  EXPECT_EQ(Executions(), 2u);
  EXPECT_EQ(Metric(*b, Series("idempotency_lease_expired_total")), 1.0);
  EXPECT_EQ(Metric(*b, Series("idempotency_conflict_total", R"(reason="in_flight")")), conflicts);
  // The record is B's now.
  const HttpResponse replay = Send(*b, req);
  EXPECT_TRUE(Replayed(replay));
  EXPECT_EQ(replay.body, taken->body);
  EXPECT_EQ(replay.Header("X-Operation-Id"), taken->Header("X-Operation-Id"));
  EXPECT_EQ(Executions(), 2u);
  std::cout << "[ figures ] takeover: " << conflicts << " x 409 before the lease ended\n";
}

// Redis out of memory refuses a completion (the 600 KB response does not fit
// under maxmemory; the small reservation did). The upstream ran, so the key
// is not released; the gateway tries the completion again while the lease
// lasts, and once Redis takes writes again the retry is a replay, not a 409
// followed by a takeover that runs the request again.
TEST_F(RedisGatewayTest, ACompletionRedisRefusedIsStoredOnceRedisTakesWritesAgain) {
  GatewayProcess* g = StartGateway(Standalone("{ policy: required, in_flight: reject }"), "gw");
  ASSERT_TRUE(g != nullptr);
  const auto info = redis_.Run({"INFO", "memory"});
  const std::size_t at = info.str.find("used_memory:");
  ASSERT_NE(at, std::string::npos) << info.str;
  const long long used = std::stoll(info.str.substr(at + 12));
  ASSERT_EQ(redis_.Run({"CONFIG", "SET", "maxmemory-policy", "noeviction"}).type, ::idemgate::store::redis::Reply::Type::kStatus);
  ASSERT_EQ(redis_.Run({"CONFIG", "SET", "maxmemory", std::to_string(used + 300000)}).type, ::idemgate::store::redis::Reply::Type::kStatus);
  const HttpRequest req = KeyedPost("/large?bytes=600000", "k-oom");
  const HttpResponse first = Send(*g, req);
  EXPECT_EQ(first.status, 200);
  EXPECT_EQ(first.body.size(), 600000u);
  ASSERT_EQ(redis_.Run({"CONFIG", "SET", "maxmemory", "0"}).type, ::idemgate::store::redis::Reply::Type::kStatus);
  EXPECT_EQ(Metric(*g, Series("idempotency_store_errors_total", R"(op="complete")")), 1.0);
  std::optional<HttpResponse> replay;
  const bool answered = PollUntil(
      [&] {
        const HttpResponse r = Send(*g, req);
        if (r.status == 409) return false;
        replay = r;
        return true;
      },
      10s, 100ms);
  ASSERT_TRUE(answered) << "still 409: the completion was not tried again";
  EXPECT_TRUE(Replayed(*replay)) << replay->status << " " << replay->body.substr(0, 200);
  EXPECT_EQ(replay->body, first.body);
  EXPECT_EQ(Executions(), 1u);
  EXPECT_NE(g->Stdout().find("response stored on a later attempt"), std::string::npos);
  // Counted as stored, as a completion that landed at once is.
  EXPECT_EQ(Metric(*g, Series("idempotency_stored_total")), 1.0);
}

// An owner that stalls past its lease (a paused process, a long GC pause on
// its host) loses the key to a retry on another gateway, and when it wakes
// its outcome never overwrites the new owner's record: the completion is a
// compare-and-set on the owner token (SPEC §4.2).
TEST_F(RedisGatewayTest, AStalledOwnerLosesItsLeaseAndCannotOverwriteTheTakeover) {
  GatewaySetup s = Standalone("{ policy: required, in_flight: reject, lease: 2s }");
  s.upstream_timeout = "1700ms";
  GatewayProcess* a = StartGateway(s, "gw-a");
  GatewayProcess* b = StartGateway(s, "gw-b");
  ASSERT_TRUE(a != nullptr && b != nullptr);
  const HttpRequest req = KeyedPost("/slow?ms=600", "k-stalled", R"({"amount":9})");

  std::optional<StatusOr<HttpResponse>> original;
  std::thread owner([&] { original = SendRequest(a->endpoint(), req, 60s); });
  const bool forwarded = PollUntil([&] { return Executions() >= 1; }, 10s);
  ASSERT_TRUE(a->process().Signal(SIGSTOP).ok());
  if (!forwarded) {
    (void)a->process().Signal(SIGCONT);
    owner.join();
    FAIL() << "A never forwarded the request";
  }
  // B: 409 while A's lease holds, then the key is B's.
  std::optional<HttpResponse> taken;
  const bool took_over = PollUntil(
      [&] {
        const HttpResponse r = Send(*b, req);
        if (r.status == 409) return false;
        taken = r;
        return true;
      },
      20s, 100ms);
  // A wakes: its upstream answer has long been waiting for it.
  ASSERT_TRUE(a->process().Signal(SIGCONT).ok());
  owner.join();
  ASSERT_TRUE(took_over);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->status, 200) << taken->body;
  EXPECT_FALSE(Replayed(*taken));
  EXPECT_EQ(ParseObject(taken->body)["execution"], 2);
  EXPECT_EQ(Metric(*b, Series("idempotency_lease_expired_total")), 1.0);
  // A's client got its own answer (or A's upstream wait was cut on waking),
  // but the stored record is B's, whichever gateway is asked.
  ASSERT_TRUE(original.has_value());
  if (original->ok() && (*original)->status == 200) {
    EXPECT_EQ(ParseObject((*original)->body)["execution"], 1);
    EXPECT_TRUE(PollUntil(
        [&] { return Metric(*a, Series("idempotency_conflict_total", R"(reason="lease_lost")")) == 1.0; }, 10s));
  }
  for (GatewayProcess* g : {a, b}) {
    const HttpResponse replay = Send(*g, req);
    EXPECT_TRUE(Replayed(replay));
    EXPECT_EQ(ParseObject(replay.body)["execution"], 2);
    EXPECT_EQ(replay.Header("X-Operation-Id"), taken->Header("X-Operation-Id"));
  }
  EXPECT_EQ(Executions(), 2u);
}

// ---------------------------------------------------------------------------
// One 3-master Redis Cluster for the suite (creating one takes seconds).

class RedisClusterGatewayTest : public RedisGatewayTestBase {
 protected:
  static void SetUpTestSuite() {
    if (!rt::RedisInstalled()) return;
    cluster_ = new rt::RedisCluster(3);
    started_ = cluster_->Start();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  void SetUp() override {
    RedisGatewayTestBase::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_TRUE(started_);
  }

  // Gateway A knows every node, B only node 1: the rest is discovered.
  std::vector<GatewayProcess*> StartTwo(const std::string& idempotency) {
    GatewaySetup s;
    s.cluster = true;
    s.idempotency = idempotency;
    s.addresses = cluster_->addresses();
    GatewayProcess* a = StartGateway(s, "gw-a");
    s.addresses = {cluster_->node(1).address()};
    GatewayProcess* b = StartGateway(s, "gw-b");
    if (a == nullptr || b == nullptr) return {};
    return {a, b};
  }

  // The record of `key` is on the master of its slot.
  void ExpectOnItsMaster(const std::string& key) {
    const int slot = KeySlot(RedisKey(key));
    EXPECT_EQ(cluster_->node(0).Run({"CLUSTER", "KEYSLOT", RedisKey(key)}).integer, slot);
    const int owner = cluster_->OwnerOf(slot);
    ASSERT_GE(owner, 0);
    EXPECT_EQ(cluster_->node(owner).Run({"EXISTS", RedisKey(key)}).integer, 1) << key;
  }

  // errorstat_MOVED of a node's INFO errorstats (Redis >= 6.2).
  static long MovedReplies(rt::RedisServer& node) {
    const std::string info = node.Run({"INFO", "errorstats"}).str;
    const std::string tag = "errorstat_MOVED:count=";
    const auto pos = info.find(tag);
    return pos == std::string::npos ? 0 : std::stol(info.substr(pos + tag.size()));
  }

  static rt::RedisCluster* cluster_;
  static ::testing::AssertionResult started_;
};

rt::RedisCluster* RedisClusterGatewayTest::cluster_ = nullptr;
::testing::AssertionResult RedisClusterGatewayTest::started_ = ::testing::AssertionFailure()
                                                               << "not started";

TEST_F(RedisClusterGatewayTest, HundredDuplicatesOnTwoGatewaysWaitModeExecuteOnce) {
  const auto gws = StartTwo("{ policy: required, in_flight: wait, wait_timeout: 20s }");
  ASSERT_EQ(gws.size(), 2u);
  ExpectWaitModeDedup(gws, "cluster-dup-wait");
  ExpectOnItsMaster("cluster-dup-wait");
}

TEST_F(RedisClusterGatewayTest, HundredDuplicatesOnTwoGatewaysRejectModeExecuteOnce) {
  const auto gws = StartTwo("{ policy: required, in_flight: reject }");
  ASSERT_EQ(gws.size(), 2u);
  ExpectRejectModeDedup(gws, "cluster-dup-reject");
  ExpectOnItsMaster("cluster-dup-reject");
}

TEST_F(RedisClusterGatewayTest, SlotMigratedUnderLoadIsFollowedWithoutErrors) {
  // Plain client keys (no hash tags) whose records share one slot.
  const int slot = KeySlot(RedisKey("mv-0"));
  std::vector<std::string> pool;
  for (int i = 0; pool.size() < 200; ++i) {
    const std::string key = "mv-" + std::to_string(i);
    if (KeySlot(RedisKey(key)) == slot) pool.push_back(key);
  }
  const std::string after_key = pool.back();  // kept for the check after the move
  pool.pop_back();

  const auto gws = StartTwo("{ policy: required, in_flight: wait, wait_timeout: 20s }");
  ASSERT_EQ(gws.size(), 2u);
  const int from = cluster_->OwnerOf(slot);
  ASSERT_GE(from, 0);
  const int to = (from + 1) % cluster_->size();
  const long moved_before = MovedReplies(cluster_->node(from));

  // Each client thread alternates a fresh key of the slot with a repeat of
  // one of its own earlier keys, and the two gateways.
  struct Outcome {
    std::string key;
    bool fresh = false;
    std::optional<HttpResponse> res;
    std::string error;
  };
  std::mutex mu;
  std::vector<Outcome> outcomes;
  std::atomic<std::size_t> next_fresh{0};
  std::atomic<int> done{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::string> mine;
      for (int i = 0; !stop.load(); ++i) {
        Outcome o;
        if (i % 2 == 0 || mine.empty()) {
          const std::size_t n = next_fresh.fetch_add(1);
          if (n < pool.size()) {
            o.key = pool[n];
            o.fresh = true;
          }
        }
        if (o.key.empty()) {
          if (mine.empty()) break;
          o.key = mine[static_cast<std::size_t>(i) % mine.size()];
        }
        auto res = SendRequest(gws[static_cast<std::size_t>(t + i) % 2]->endpoint(),
                               KeyedPost("/echo", o.key, R"({"moving":true})"), 30s);
        if (res.ok()) {
          o.res = std::move(*res);
        } else {
          o.error = res.status().ToString();
        }
        if (o.fresh) mine.push_back(o.key);
        std::lock_guard lock(mu);
        outcomes.push_back(std::move(o));
        done.fetch_add(1);
      }
    });
  }
  const bool warmed = PollUntil([&] { return done.load() >= 40; }, 20s);
  const ::testing::AssertionResult migrated = cluster_->MigrateSlot(slot, from, to);
  const int done_at_move = done.load();
  const bool continued = PollUntil([&] { return done.load() >= done_at_move + 40; }, 20s);
  stop = true;
  for (auto& t : threads) t.join();
  ASSERT_TRUE(warmed);
  ASSERT_TRUE(migrated);
  ASSERT_TRUE(continued) << "requests stopped completing after the move";
  EXPECT_EQ(cluster_->OwnerOf(slot), to);
  EXPECT_GT(MovedReplies(cluster_->node(from)), moved_before) << "no gateway was redirected";

  // No error at all, and every key executed once: repeats are replays of it.
  std::map<std::string, std::string> first_body;
  int fresh = 0, repeats = 0;
  for (const Outcome& o : outcomes) {
    if (o.fresh) first_body[o.key] = o.res ? o.res->body : "";
  }
  for (const Outcome& o : outcomes) {
    SCOPED_TRACE(o.key);
    ASSERT_TRUE(o.res.has_value()) << o.error;
    ASSERT_EQ(o.res->status, 200) << o.res->body;
    EXPECT_EQ(Replayed(*o.res), !o.fresh);
    EXPECT_EQ(o.res->body, first_body[o.key]);
    (o.fresh ? fresh : repeats) += 1;
  }
  FakeStats stats = Stats();
  EXPECT_EQ(stats.executions, static_cast<std::uint64_t>(fresh));
  for (const auto& [key, body] : first_body) EXPECT_EQ(stats.by_key[ForwardedKey(key)], 1u) << key;
  EXPECT_EQ(cluster_->node(to).Run({"EXISTS", RedisKey(pool.front())}).integer, 1);
  std::cout << "[ figures ] migration of slot " << slot << " from node " << from << " to " << to
            << ": " << fresh << " keys executed, " << repeats << " replays, " << done_at_move
            << " requests before the move, " << MovedReplies(cluster_->node(from)) - moved_before
            << " MOVED replies\n";

  // Deduplication still holds on the moved slot.
  ExpectWaitModeDedup(gws, after_key);
  EXPECT_EQ(cluster_->node(to).Run({"EXISTS", RedisKey(after_key)}).integer, 1);
}

}  // namespace
}  // namespace idemgate::testing
