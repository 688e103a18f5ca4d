// Acceptance tests of the durable embedded store (SPEC §5, docs/operations.md
// "Signals") with the real idemgate binary in front of fake_upstream: records
// a client has seen survive `kill -9` and SIGTERM, reservations left behind
// never block a key for good, and a second process cannot open a data
// directory that a running gateway holds.
#include <gtest/gtest.h>

#include <csignal>

#include <atomic>
#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "integration/harness.h"

namespace idemgate::testing {
namespace {

// The route id is `api` and identity is off, so the gateway forwards a
// client key K as `"t-_:_:_:api:K"` and fake_upstream counts it under that.
std::string ForwardedKey(const std::string& key) { return "\"t-_:_:_:api:" + key + "\""; }

struct GatewaySetup {
  std::string data_path;
  // The lease must last at least the upstream timeout, the tenth of the
  // lease a keyed exchange keeps before its end and 100ms to get a
  // connection (check-config refuses less): the sentinel (4 s) fits in both.
  std::string lease = "5s";
  std::string upstream_timeout = "4400ms";
  std::string shutdown_grace = "10s";
  std::string listen = "127.0.0.1:0";
  std::string in_flight = "reject";
};

std::string ConfigYaml(const HostPort& fake, const GatewaySetup& s) {
  std::ostringstream y;
  y << "listen: " << s.listen << "\n"
    << "workers: 2\n"
    << "shutdown_grace: " << s.shutdown_grace << "\n"
    << "admin: { listen: 127.0.0.1:0 }\n"
    << "store: { kind: embedded, path: " << s.data_path << ", sync: false }\n"
    << "log: { level: info, format: json }\n"
    << "upstreams:\n"
    << "  fake: { url: http://" << fake.ToString()
    << ", timeout: " << s.upstream_timeout << ", connect_timeout: 2s, max_connections: 256 }\n"
    << "routes:\n"
    << "  - id: api\n"
    << "    match: { path_prefix: / }\n"
    << "    upstream: fake\n"
    << "    idempotency: { policy: required, in_flight: " << s.in_flight << ", lease: " << s.lease << " }\n";
  return y.str();
}

// One keyed request of the load: what it takes to send it again.
struct Sent {
  std::string key;
  std::string target;
  std::string body;
};

HttpRequest ToRequest(const Sent& s) { return KeyedPost(s.target, s.key, s.body); }

// One request on a fresh connection; a transport error fails the test.
HttpResponse Send(const HostPort& endpoint, const HttpRequest& req) {
  auto res = SendRequest(endpoint, req, 30s);
  EXPECT_TRUE(res.ok()) << res.status().ToString();
  return res.ok() ? *res : HttpResponse{};
}

struct Received {
  Sent sent;
  HttpResponse response;
};

// What the clients of a load saw, filled by several threads.
struct LoadOutcome {
  std::mutex mu;
  std::vector<Sent> answered;      // requests that got a full 200 (repeatable)
  std::vector<Received> received;  // every full 200, repeats included
  std::vector<Sent> unanswered;    // no full response: transport error (or a 5xx at shutdown)
  std::vector<std::string> unexpected;
  std::atomic<int> completed{0};  // requests that got a full response
};

class DurabilityTest : public FakeUpstreamSuite {
 protected:
  static constexpr int kThreads = 4;
  static constexpr int kRequestsPerThread = 150;
  // Responses received before the gateway is interrupted.
  static constexpr int kBeforeInterrupt = 200;
  // Held longer than any shutdown_grace used here, short enough to retry.
  static constexpr const char* kSentinelTarget = "/slow?ms=4000";
  static constexpr const char* kSentinelKey = "k-sentinel";

  void SetUp() override {
    FakeUpstreamSuite::SetUp();
    setup_.data_path = dir_.Join("data");
  }

  void TearDown() override {
    if (HasFailure()) {
      for (auto* g : {&first_, &gateway_}) {
        if (*g) (*g)->DumpLogs();
      }
    }
    if (gateway_ && gateway_->process().Running()) gateway_->Stop();
    gateway_.reset();
    first_.reset();
  }

  // Starts a gateway on setup_ as gateway_. `name` must differ between the
  // runs of a test: the ready file of a stopped run would be read again.
  void Start(std::string_view name) {
    auto g = GatewayProcess::Start(dir_, ConfigYaml(fake_endpoint_, setup_), {}, name);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    gateway_.emplace(std::move(*g));
  }

  // Keeps the stopped gateway (for its logs) as first_ and starts another on
  // the same store.
  void Restart() {
    first_ = std::move(gateway_);
    gateway_.reset();
    Start("restarted");
  }

  // A retry of a request whose key was released runs at once: 200, not a
  // replay (nor a 409 for a lease the stopped gateway left).
  void ExpectRetryRunsAtOnce(const HttpRequest& request) {
    const HttpResponse retry = Send(gateway_->endpoint(), request);
    EXPECT_EQ(retry.status, 200) << retry.body;
    EXPECT_FALSE(retry.HasHeader("Idempotent-Replayed"));
  }

  FakeStats Stats() {
    auto stats = FetchFakeStats(fake_endpoint_);
    EXPECT_TRUE(stats.ok()) << stats.status().ToString();
    return stats.ok() ? *stats : FakeStats{};
  }

  std::uint64_t ExecutionsOf(const std::string& key) {
    const FakeStats stats = Stats();
    auto it = stats.by_key.find(ForwardedKey(key));
    return it == stats.by_key.end() ? 0 : it->second;
  }

  // One client thread: new keys on /echo (every tenth on /slow?ms=300, so
  // that requests are in flight most of the time), and every fourth request
  // a repeat of a request some client already got an answer for. Stops at
  // the first request that gets no response.
  void ClientLoop(int t, LoadOutcome& out, const std::atomic<bool>& interrupted) {
    HttpClient client(gateway_->endpoint(), 30s);
    std::uint64_t pick = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(t + 1);
    for (int i = 0; i < kRequestsPerThread; ++i) {
      Sent sent;
      {
        std::lock_guard lock(out.mu);
        pick = pick * 6364136223846793005ull + 1442695040888963407ull;
        if (i % 4 == 3 && !out.answered.empty()) {
          sent = out.answered[(pick >> 33) % out.answered.size()];
        }
      }
      if (sent.key.empty()) {
        sent.key = "k-t" + std::to_string(t) + "-n" + std::to_string(i);
        sent.target = i % 10 == 5 ? "/slow?ms=300" : "/echo/t" + std::to_string(t);
        sent.body = R"({"thread":)" + std::to_string(t) + R"(,"n":)" + std::to_string(i) +
                    R"(,"note":"body of )" + sent.key + R"("})";
      }
      auto res = client.Send(ToRequest(sent));
      std::lock_guard lock(out.mu);
      if (!res.ok()) {
        out.unanswered.push_back(sent);
        return;
      }
      out.completed.fetch_add(1);
      if (res->status == 200) {
        out.received.push_back({sent, *res});
        out.answered.push_back(sent);
      } else if (res->status >= 500 && interrupted.load()) {
        // Given up while shutting down (what its client gets is pinned by
        // SigtermAnswers503ToAKeyedRequestPastTheGraceAndReleasesIt): not
        // stored, so retried below.
        out.unanswered.push_back(sent);
      } else {
        out.unexpected.push_back(sent.key + " " + sent.target + ": " + std::to_string(res->status) +
                                 " " + res->body);
      }
    }
  }

  // Runs the load and a keyed request to kSentinelTarget against gateway_,
  // calls `interrupt` once kBeforeInterrupt responses arrived and the
  // sentinel is executing upstream, and waits for every client.
  void RunLoadAndInterrupt(LoadOutcome& out, std::optional<StatusOr<HttpResponse>>& sentinel,
                           const std::function<void()>& interrupt) {
    std::atomic<bool> interrupted{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] { ClientLoop(t, out, interrupted); });
    }
    const bool loaded = PollUntil([&] { return out.completed.load() >= kBeforeInterrupt; }, 60s);
    std::thread sentinel_thread([&] {
      sentinel = SendRequest(gateway_->endpoint(),
                             KeyedPost(kSentinelTarget, kSentinelKey, R"({"sentinel":true})"), 30s);
    });
    const bool executing = PollUntil([&] { return ExecutionsOf(kSentinelKey) >= 1; }, 20s);
    interrupted.store(true);
    interrupt();
    for (auto& th : threads) th.join();
    sentinel_thread.join();
    std::lock_guard lock(out.mu);
    std::cerr << "load: " << out.completed.load() << " responses, " << out.received.size()
              << " of them 200, " << out.unanswered.size()
              << " requests unanswered at the interruption\n";
    EXPECT_TRUE(loaded) << "only " << out.completed.load() << " responses before the deadline";
    EXPECT_TRUE(executing) << "the sentinel request never reached the upstream";
  }

  // Every (key, response) a client fully received replays byte for byte
  // from the restarted gateway_, without executing anything upstream.
  void ExpectReceivedResponsesReplay(LoadOutcome& out) {
    std::map<std::string, const Received*> first;  // key -> first 200 received
    for (const Received& r : out.received) {
      auto [it, inserted] = first.emplace(r.sent.key, &r);
      if (inserted) continue;
      // Already before the interruption every answer to a key was the same.
      EXPECT_EQ(r.response.body, it->second->response.body) << r.sent.key;
      EXPECT_EQ(r.response.Header("X-Operation-Id"), it->second->response.Header("X-Operation-Id"))
          << r.sent.key;
    }
    EXPECT_GE(first.size(), static_cast<std::size_t>(kBeforeInterrupt / 2));
    // Each of them ran exactly once upstream.
    const FakeStats stats = Stats();
    for (const auto& [key, r] : first) {
      auto it = stats.by_key.find(ForwardedKey(key));
      EXPECT_TRUE(it != stats.by_key.end() && it->second == 1)
          << key << " executed " << (it == stats.by_key.end() ? 0 : it->second) << " times";
    }

    const std::uint64_t before = stats.executions;
    HttpClient client(gateway_->endpoint(), 30s);
    int mismatches = 0;
    for (const auto& [key, r] : first) {
      SCOPED_TRACE("key " + key + " " + r->sent.target);
      auto replay = client.Send(ToRequest(r->sent));
      ASSERT_TRUE(replay.ok()) << replay.status().ToString();
      const HttpResponse& orig = r->response;
      const bool same = replay->status == orig.status && replay->body == orig.body &&
                        replay->Header("X-Operation-Id") == orig.Header("X-Operation-Id") &&
                        replay->Header("Content-Type") == orig.Header("Content-Type") &&
                        replay->Header("Idempotent-Replayed") == "true";
      if (!same && ++mismatches <= 5) {
        EXPECT_EQ(replay->status, orig.status);
        EXPECT_EQ(replay->body, orig.body);
        EXPECT_EQ(replay->Header("X-Operation-Id"), orig.Header("X-Operation-Id"));
        EXPECT_EQ(replay->Header("Content-Type"), orig.Header("Content-Type"));
        EXPECT_EQ(replay->Header("Idempotent-Replayed"), "true");
      }
    }
    EXPECT_EQ(mismatches, 0) << "of " << first.size() << " keys whose response a client received";
    EXPECT_EQ(Stats().executions, before) << "replays after the restart executed upstream";
  }

  // Keys no client got an answer for. Each is retried until it is not 409
  // (`must_run_at_once`: the first attempt already), then must be a 200,
  // executed or replayed, and the next attempt a replay of it.
  void ExpectUnansweredKeysAreFree(LoadOutcome& out, const Sent& sentinel, bool must_run_at_once) {
    std::set<std::string> answered;
    for (const Received& r : out.received) answered.insert(r.sent.key);
    std::vector<Sent> pending{sentinel};
    std::set<std::string> seen{sentinel.key};
    for (const Sent& s : out.unanswered) {
      if (!answered.contains(s.key) && seen.insert(s.key).second) pending.push_back(s);
    }
    for (const Sent& s : pending) {
      SCOPED_TRACE("unanswered key " + s.key + " " + s.target);
      std::optional<HttpResponse> last;
      int attempts = 0;
      const bool free = PollUntil(
          [&] {
            ++attempts;
            auto res = SendRequest(gateway_->endpoint(), ToRequest(s), 30s);
            EXPECT_TRUE(res.ok()) << res.status().ToString();
            if (!res.ok()) return true;
            last = *res;
            return last->status != 409 || must_run_at_once;
          },
          20s, 100ms);
      ASSERT_TRUE(free) << "still 409 after " << attempts
                        << " attempts: " << (last ? last->body : "");
      ASSERT_TRUE(last.has_value());
      if (must_run_at_once) {
        EXPECT_NE(last->status, 409)
            << "the reservation was not released at shutdown: " << last->body;
      }
      EXPECT_EQ(last->status, 200) << last->body;
      if (last->status != 200) continue;
      const HttpResponse again = Send(gateway_->endpoint(), ToRequest(s));
      EXPECT_EQ(again.status, 200);
      EXPECT_EQ(again.Header("Idempotent-Replayed"), "true");
      EXPECT_EQ(again.body, last->body);
      EXPECT_EQ(again.Header("X-Operation-Id"), last->Header("X-Operation-Id"));
    }
  }

  // The request log line of `key` says the gateway gave it up at shutdown,
  // and the run ended past its grace.
  // The shutdown's summary line: `released` reservations given up with
  // reason shutdown, the grace `grace` (drained, over, ended_by_second_signal).
  static void ExpectReleasesSummarized(const std::string& log, std::int64_t released, const std::string& grace) {
    const std::size_t at = log.find("\"msg\":\"reservations released at shutdown\"");
    ASSERT_NE(at, std::string::npos) << log;
    const std::size_t begin = log.rfind('\n', at) + 1;
    const boost::json::value line = boost::json::parse(log.substr(begin, log.find('\n', at) - begin));
    EXPECT_EQ(line.at("released").as_int64(), released);
    EXPECT_EQ(line.at("reason").as_string(), "shutdown");
    EXPECT_EQ(line.at("grace").as_string(), grace);
  }

  static void ExpectShutdownLogged(const std::string& log, const std::string& key) {
    bool found = false;
    std::size_t pos = 0;
    while (pos < log.size()) {
      std::size_t end = log.find('\n', pos);
      if (end == std::string::npos) end = log.size();
      const std::string line = log.substr(pos, end - pos);
      pos = end + 1;
      if (line.find("\"msg\":\"request\"") == std::string::npos) continue;
      if (line.find("\"idempotency_key_namespaced\":\"t-_:_:_:api:" + key + "\"") ==
          std::string::npos)
        continue;
      found = true;
      EXPECT_NE(line.find("\"outcome\":\"shutdown\""), std::string::npos) << line;
    }
    EXPECT_TRUE(found) << "no request line for " << key;
    EXPECT_NE(log.find("\"msg\":\"stopped\",\"clean\":false"), std::string::npos);
  }

  TempDir dir_;
  GatewaySetup setup_;
  std::optional<GatewayProcess> first_;    // the interrupted run, kept for its logs
  std::optional<GatewayProcess> gateway_;  // the running one
};

TEST_F(DurabilityTest, KillNineLosesNoReceivedResponseAndStrandsNoKey) {
  Start("first");
  LoadOutcome out;
  std::optional<StatusOr<HttpResponse>> sentinel;
  RunLoadAndInterrupt(out, sentinel, [&] { gateway_->Kill(); });
  ASSERT_FALSE(gateway_->process().Running());
  EXPECT_TRUE(out.unexpected.empty())
      << out.unexpected.size()
      << " unexpected answers, first: " << (out.unexpected.empty() ? "" : out.unexpected[0]);
  ASSERT_TRUE(sentinel.has_value());
  EXPECT_FALSE(sentinel->ok()) << "the sentinel was answered before the kill: "
                               << sentinel->value().status;
  Restart();
  ExpectReceivedResponsesReplay(out);
  // Reservations cut by the kill stay until their 5 s lease ends (409 until
  // then), then a retry takes them over.
  ExpectUnansweredKeysAreFree(out, Sent{kSentinelKey, kSentinelTarget, R"({"sentinel":true})"},
                              /*must_run_at_once=*/false);
}

TEST_F(DurabilityTest, SigtermLosesNoReceivedResponseAndReleasesWhatItCannotFinish) {
  // A lease far longer than the test: a retry right after the restart is not
  // a 409 only because the reservation was released at shutdown.
  setup_.lease = "5m";
  setup_.shutdown_grace = "1s";
  Start("first");
  LoadOutcome out;
  std::optional<StatusOr<HttpResponse>> sentinel;
  RunLoadAndInterrupt(out, sentinel, [&] { gateway_->Stop(); });
  ASSERT_FALSE(gateway_->process().Running());
  EXPECT_TRUE(out.unexpected.empty())
      << out.unexpected.size()
      << " unexpected answers, first: " << (out.unexpected.empty() ? "" : out.unexpected[0]);
  // The sentinel outlasts shutdown_grace: not drained, so not answered 200.
  ASSERT_TRUE(sentinel.has_value());
  EXPECT_FALSE(sentinel->ok() && (*sentinel)->status == 200)
      << "the sentinel finished within shutdown_grace";
  ExpectShutdownLogged(gateway_->Stdout(), kSentinelKey);
  Restart();
  ExpectReceivedResponsesReplay(out);
  ExpectUnansweredKeysAreFree(out, Sent{kSentinelKey, kSentinelTarget, R"({"sentinel":true})"},
                              /*must_run_at_once=*/true);
  // The sentinel ran again after the restart: its reservation held nothing.
  EXPECT_EQ(ExecutionsOf(kSentinelKey), 2u);
}

// docs/operations.md "Signals": on SIGTERM, a request that outlasts
// shutdown_grace has its reservation released and its client gets a 503.
// Pins a bug: the server's "not answered" fallback (src/http/server.cc) sent
// such clients a 500 internal-error instead, and logged status 0.
TEST_F(DurabilityTest, SigtermAnswers503ToAKeyedRequestPastTheGraceAndReleasesIt) {
  setup_.lease = "5m";
  setup_.shutdown_grace = "500ms";
  Start("first");
  const Sent slow{"k-past-grace", kSentinelTarget, R"({"past":"grace"})"};
  std::optional<StatusOr<HttpResponse>> answer;
  std::thread client([&] { answer = SendRequest(gateway_->endpoint(), ToRequest(slow), 30s); });
  const bool executing = PollUntil([&] { return ExecutionsOf(slow.key) >= 1; }, 20s);
  gateway_->Stop();
  client.join();
  ASSERT_TRUE(executing);
  ASSERT_TRUE(answer.has_value());
  ASSERT_TRUE(answer->ok()) << "no answer at all: " << answer->status().ToString();
  ExpectProblem(**answer, 503, "");
  ExpectShutdownLogged(gateway_->Stdout(), slow.key);
  // /metrics is gone with the process: the count is logged.
  ExpectReleasesSummarized(gateway_->Stdout(), 1, "over");
  // Released, not left for a 5 minute lease: the retry runs at once.
  Restart();
  ExpectRetryRunsAtOnce(ToRequest(slow));
  EXPECT_EQ(ExecutionsOf(slow.key), 2u);
}

// Past shutdown_grace nothing is forwarded any more. Pins a bug: the
// release of an original cut at the end of the grace woke a request waiting
// for it (in_flight: wait), which took the key and ran the request upstream
// a second time while the gateway stopped, only to be cut a moment later.
TEST_F(DurabilityTest, SigtermPastTheGraceForwardsNoWaiterAndReleasesTheKey) {
  setup_.lease = "5m";
  setup_.shutdown_grace = "1s";
  setup_.in_flight = "wait";
  Start("first");
  const Sent slow{"k-waited-on", kSentinelTarget, R"({"waited":"on"})"};
  std::optional<StatusOr<HttpResponse>> original;
  std::optional<StatusOr<HttpResponse>> waiter;
  std::thread first([&] { original = SendRequest(gateway_->endpoint(), ToRequest(slow), 30s); });
  ASSERT_TRUE(PollUntil([&] { return ExecutionsOf(slow.key) >= 1; }, 20s));
  std::thread second([&] { waiter = SendRequest(gateway_->endpoint(), ToRequest(slow), 30s); });
  // Both requests are in the gateway: the second one waits for the first.
  const bool both_in = PollUntil(
      [&] {
        auto m = SendRequest(gateway_->admin(), HttpRequest{.target = "/metrics"}, 5s);
        return m.ok() && MetricValue(m->body, "idemgate_requests_in_flight") == 2.0;
      },
      20s);
  gateway_->Stop();
  first.join();
  second.join();
  ASSERT_TRUE(both_in);
  for (auto* answer : {&original, &waiter}) {
    ASSERT_TRUE(answer->has_value());
    ASSERT_TRUE((*answer)->ok()) << "no answer at all: " << (*answer)->status().ToString();
    ExpectProblem(***answer, 503, "shutting-down");
  }
  EXPECT_EQ(ExecutionsOf(slow.key), 1u) << "the waiter ran the request again at shutdown";
  ExpectShutdownLogged(gateway_->Stdout(), slow.key);
  // Released, not held by the waiter: the retry runs at once.
  Restart();
  ExpectRetryRunsAtOnce(ToRequest(slow));
  EXPECT_EQ(ExecutionsOf(slow.key), 2u);
}

// docs/operations.md "Signals": a second SIGTERM during the drain ends the
// grace at once; the request still running is cut, its client gets 503 and
// its reservation is released (unlike kill -9). Pins a bug: the second
// signal was ignored, leaving only kill -9 as a faster way out.
TEST_F(DurabilityTest, SecondSigtermEndsTheGraceAndStillReleasesTheKey) {
  setup_.lease = "5m";
  setup_.upstream_timeout = "2m";
  setup_.shutdown_grace = "2m";
  Start("first");
  const Sent slow{"k-second-signal", "/slow?ms=90000", R"({"second":"signal"})"};
  std::optional<StatusOr<HttpResponse>> answer;
  std::thread client([&] { answer = SendRequest(gateway_->endpoint(), ToRequest(slow), 150s); });
  const bool executing = PollUntil([&] { return ExecutionsOf(slow.key) >= 1; }, 20s);
  ASSERT_TRUE(gateway_->process().Signal(SIGTERM).ok());
  const bool draining = PollUntil(
      [&] { return gateway_->Stdout().find("\"msg\":\"stopping\"") != std::string::npos; }, 20s);
  ASSERT_TRUE(gateway_->process().Signal(SIGTERM).ok());
  // Far sooner than the two minute grace.
  const auto exit = gateway_->process().WaitExit(30s);
  client.join();
  ASSERT_TRUE(executing);
  ASSERT_TRUE(draining);
  ASSERT_TRUE(exit.has_value()) << "the second SIGTERM did not end the grace";
  EXPECT_TRUE(exit->exited && exit->code == 0) << exit->ToString();
  ASSERT_TRUE(answer.has_value());
  ASSERT_TRUE(answer->ok()) << "no answer at all: " << answer->status().ToString();
  ExpectProblem(**answer, 503, "shutting-down");
  const std::string log = gateway_->Stdout();
  EXPECT_NE(log.find("\"msg\":\"second signal: ending the shutdown grace now"), std::string::npos) << log;
  ExpectShutdownLogged(log, slow.key);
  ExpectReleasesSummarized(log, 1, "ended_by_second_signal");
  // Released: the retry runs at once instead of meeting a 5 minute lease.
  Restart();
  ExpectRetryRunsAtOnce(KeyedPost("/echo", slow.key, slow.body));
}

TEST_F(DurabilityTest, SecondProcessOnAHeldDataDirectoryFailsNamingThePath) {
  Start("first");
  const HttpResponse original = Send(gateway_->endpoint(), KeyedPost("/echo", "k-lock"));
  ASSERT_EQ(original.status, 200);

  // Same data path, its own ports.
  auto config = WriteConfig(dir_, ConfigYaml(fake_endpoint_, setup_), "second.yaml");
  ASSERT_TRUE(config.ok());
  ProcessOptions options;
  options.stdout_path = dir_.Join("second.out");
  options.stderr_path = dir_.Join("second.err");
  auto second = Process::Start(
      IDEMGATE_BIN, {"--config", *config, "--ready-file", dir_.Join("second.ready")}, options);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  const auto exit = second->WaitExit(30s);
  ASSERT_TRUE(exit.has_value()) << "a second idemgate on a held data directory kept running";
  const std::string err = ReadFileOrEmpty(options.stderr_path);
  EXPECT_TRUE(exit->exited && exit->code != 0) << exit->ToString() << "\n" << err;
  EXPECT_NE(err.find(setup_.data_path), std::string::npos) << err;
  EXPECT_NE(err.find("already in use"), std::string::npos) << err;
  EXPECT_FALSE(ReadFile(dir_.Join("second.ready")).ok())
      << "the second process reported itself ready";

  // The running gateway is unaffected and still has its record.
  const HttpResponse replay = Send(gateway_->endpoint(), KeyedPost("/echo", "k-lock"));
  EXPECT_EQ(replay.status, 200);
  EXPECT_EQ(replay.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(replay.body, original.body);
  EXPECT_EQ(Stats().executions, 1u);
}

}  // namespace
}  // namespace idemgate::testing
