// Integration tests of the idempotency engine end to end (SPEC §3, §4): the
// real idemgate binary with the memory store in front of fake_upstream,
// which counts its executions. Each test starts a gateway whose single route
// (`api`, every path) carries the `idempotency` settings under test.
#include <gtest/gtest.h>

#include <csignal>

#include <algorithm>
#include <atomic>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "integration/harness.h"

namespace idemgate::testing {
namespace {

namespace json = boost::json;

struct GatewaySetup {
  std::string idempotency = "{ policy: required }";  // the route's idempotency mapping
  std::string route_extra;                           // more keys of the route
  std::string store = "{ kind: memory }";
  std::string upstream_timeout = "10s";
  std::string identity = "{ mode: none }";
};

std::string ConfigYaml(const HostPort& fake, const GatewaySetup& s) {
  return GatewayConfigHead(fake, {.store = s.store,
                                  .identity = s.identity,
                                  .upstream = "timeout: " + s.upstream_timeout +
                                              ", connect_timeout: 2s, max_connections: 256"}) +
         "  - id: api\n    match: { path_prefix: / }\n    upstream: fake\n" + s.route_extra +
         "    idempotency: " + s.idempotency + "\n";
}

// Request log lines in `log` with outcome `outcome`.
int LoggedOutcomes(const std::string& log, std::string_view outcome) {
  const std::string field = "\"outcome\":\"" + std::string(outcome) + "\"";
  int n = 0;
  for (std::size_t at = log.find(field); at != std::string::npos; at = log.find(field, at + 1)) ++n;
  return n;
}

// KeyedPost(target, key) as bytes, for a client that must control its reads.
std::string RawKeyedPost(const std::string& target, const std::string& key) {
  return "POST " + target + " HTTP/1.1\r\nHost: t\r\nIdempotency-Key: \"" + key +
         "\"\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
}

class IdempotencyTest : public GatewaySuite {
 protected:
  void Start(const GatewaySetup& setup) { StartGateway(ConfigYaml(fake_endpoint_, setup)); }

  // Concurrent duplicates waiting on an original (in_flight: wait) whose
  // outcome is not stored (a 500) answer with that outcome too, logged
  // `shared` with the original's operation id, instead of each running the
  // request again in turn: one execution for the whole burst. The key is left
  // free, so a later retry runs.
  void ExpectWaitersShareTheOriginalsOutcome(const std::string& target, const std::string& key, int status,
                                             const std::string& code) {
    constexpr int kClients = 8;
    const std::uint64_t before = Executions();
    const int shared_before = LoggedOutcomes(gateway_->Stdout(), "shared");
    std::vector<std::optional<HttpResponse>> results(kClients);
    std::optional<HttpResponse> original;
    std::thread first([&] { original = Send(KeyedPost(target, key)); });
    ASSERT_TRUE(PollUntil([&] { return Executions() >= before + 1; }, 10s));
    std::vector<std::thread> threads;
    for (int i = 0; i < kClients; ++i) {
      threads.emplace_back([&, i] {
        auto res = SendRequest(gateway_->endpoint(), KeyedPost(target, key), 30s);
        if (res.ok()) results[i] = *res;
      });
    }
    for (auto& th : threads) th.join();
    first.join();
    ASSERT_TRUE(original.has_value());
    EXPECT_EQ(original->status, status) << original->body;
    EXPECT_EQ(Executions(), before + 1);
    for (int i = 0; i < kClients; ++i) {
      ASSERT_TRUE(results[i].has_value()) << "client " << i << " got no response";
      EXPECT_EQ(results[i]->status, status) << results[i]->body;
      if (!code.empty()) ExpectProblem(*results[i], status, code);
      EXPECT_EQ(results[i]->Header("X-Operation-Id"), original->Header("X-Operation-Id"));
      EXPECT_FALSE(results[i]->HasHeader("Idempotent-Replayed"));
    }
    auto shared = [&] { return LoggedOutcomes(gateway_->Stdout(), "shared") - shared_before; };
    EXPECT_TRUE(PollUntil([&] { return shared() == kClients; }, 10s)) << shared() << " logged shared";
    EXPECT_EQ(MetricValue(Metrics(), R"(idempotency_shared_total{tenant="_",project="_",route="api"})").value_or(0),
              shared_before + kClients);
    // Not stored: a retry runs.
    (void)Send(KeyedPost(target, key));
    EXPECT_EQ(Executions(), before + 2);
  }
};

TEST_F(IdempotencyTest, ReplayedKeyExecutesOnceAndReplaysTheOriginal) {
  Start({});
  HttpRequest req = KeyedPost("/echo/pay", "order-1", R"({"amount":1000,"currency":"EUR"})");
  req.headers.push_back({"X-Echo-Set-Cookie", "a=1; Path=/"});
  req.headers.push_back({"X-Echo-Set-Cookie", "b=2; Path=/"});
  req.headers.push_back({"X-Echo-Header", "X-Custom: original"});
  const HttpResponse first = Send(req);
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_FALSE(first.HasHeader("Idempotent-Replayed"));
  const auto op = first.Header("X-Operation-Id");
  ASSERT_TRUE(op.has_value());
  EXPECT_TRUE(op->starts_with("op_")) << *op;

  // The retry spells the key as a bare token and the JSON with other order
  // and spacing: the same key, the same request.
  HttpRequest retry = req;
  retry.headers[0] = {"Idempotency-Key", "order-1"};
  retry.body = R"({ "currency": "EUR",  "amount": 1000 })";
  // A client cannot mark its own request as a replay.
  retry.headers.push_back({"Idempotent-Replayed", "true"});
  for (int i = 0; i < 3; ++i) {
    const HttpResponse again = Send(retry);
    EXPECT_EQ(again.status, 200);
    EXPECT_EQ(again.body, first.body);
    EXPECT_EQ(again.Header("Idempotent-Replayed"), "true");
    EXPECT_EQ(again.Header("X-Operation-Id"), op);
    EXPECT_EQ(again.Headers("Set-Cookie"), (std::vector<std::string>{"a=1; Path=/", "b=2; Path=/"}));
    EXPECT_EQ(again.Header("X-Custom"), "original");
    EXPECT_EQ(again.Header("Content-Type"), first.Header("Content-Type"));
  }
  EXPECT_EQ(Executions(), 1u);
  // The upstream saw the namespaced key, not the client's.
  auto echo = ParseObject(first.body);
  EXPECT_EQ(Values(EchoedHeaders(echo), "Idempotency-Key"),
            (std::vector<std::string>{"\"t-_:_:_:api:order-1\""}));
  const std::string metrics = Metrics();
  EXPECT_EQ(MetricValue(metrics, R"(idempotency_cache_hit_total{tenant="_",project="_",route="api",status="200"})"),
            3.0)
      << metrics;
  EXPECT_EQ(MetricValue(metrics, R"(idempotency_stored_total{tenant="_",project="_",route="api"})"), 1.0);
}

// An upstream cannot make its answer, or its replays, look like the
// gateway's own: the replay marks (Idempotent-Replayed, Idempotency-Replay)
// and X-Operation-Id it sends are removed from the original and the record.
TEST_F(IdempotencyTest, AnUpstreamsOwnReplayMarksAreRemoved) {
  Start({});
  HttpRequest req = KeyedPost("/echo/marks", "marks-1", R"({"a":1})");
  req.headers.push_back({"X-Echo-Header", "Idempotent-Replayed: true"});
  req.headers.push_back({"X-Echo-Header", "Idempotency-Replay: omitted"});
  req.headers.push_back({"X-Echo-Header", "X-Operation-Id: op_upstream"});
  const HttpResponse first = Send(req);
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_FALSE(first.HasHeader("Idempotent-Replayed"));
  EXPECT_FALSE(first.HasHeader("Idempotency-Replay"));
  EXPECT_NE(first.Header("X-Operation-Id"), "op_upstream");
  const HttpResponse replay = Send(req);
  EXPECT_EQ(replay.Header("Idempotent-Replayed"), "true");
  EXPECT_FALSE(replay.HasHeader("Idempotency-Replay"));
  EXPECT_EQ(replay.body, first.body);
  EXPECT_EQ(replay.Header("X-Operation-Id"), first.Header("X-Operation-Id"));
}

// Every answer carries exactly one X-Request-Id, the id of its log line: the
// upstream's own X-Request-Id is replaced (the upstream was sent the same id
// the client gets), and a replay carries the replaying request's id, not the
// original's, as does a 422.
TEST_F(IdempotencyTest, EveryAnswerCarriesTheRequestIdOfItsLogLine) {
  Start({});
  HttpRequest req = KeyedPost("/echo/rid", "rid-1", R"({"a":1})");
  req.headers.push_back({"X-Echo-Header", "X-Request-Id: upstream-own"});
  HttpRequest other = KeyedPost("/echo/rid", "rid-1", R"({"a":2})");
  std::vector<std::string> answered;
  for (const auto& [request, status] : {std::pair{&req, 200}, std::pair{&req, 200}, std::pair{&other, 422}}) {
    const HttpResponse res = Send(*request);
    EXPECT_EQ(res.status, status) << res.body;
    const std::vector<std::string> ids = res.Headers("X-Request-Id");
    ASSERT_EQ(ids.size(), 1u) << res.body;
    EXPECT_EQ(ids[0].size(), 32u) << ids[0];
    if (answered.empty()) {
      auto echo = ParseObject(res.body);
      EXPECT_EQ(Values(EchoedHeaders(echo), "X-Request-Id"), ids) << "the upstream saw another id";
    } else {
      EXPECT_EQ(res.Header("Idempotent-Replayed").has_value(), status == 200);
    }
    answered.push_back(ids[0]);
  }
  EXPECT_EQ(Executions(), 1u);
  std::vector<std::string> logged;
  ASSERT_TRUE(PollUntil(
      [&] {
        logged.clear();
        std::istringstream lines(gateway_->Stdout());
        for (std::string line; std::getline(lines, line);) {
          if (line.find("\"msg\":\"request\"") == std::string::npos) continue;
          logged.push_back(std::string(json::parse(line).at("request_id").as_string()));
        }
        return logged.size() >= answered.size();
      },
      5s));
  std::sort(logged.begin(), logged.end());
  std::sort(answered.begin(), answered.end());
  EXPECT_EQ(logged, answered);
}

// Mutated requests (bytes dropped, inserted, replaced and repeated, from keyed,
// chunked, recovery and absolute-form seeds; each client then ends its side)
// never get an error the gateway made for itself (5xx other than the
// upstream's) and never stop it: every answer is a well-formed response and
// the gateway still serves afterwards. The seed is fixed, so a failure names
// a request that can be replayed.
TEST_F(IdempotencyTest, MutatedRequestsNeverGetAnInternalErrorOrStopTheGateway) {
  Start({.idempotency = "{ policy: optional }", .route_extra = "    recovery: true\n"});
  const std::vector<std::string> seeds = {
      "POST /echo/pay HTTP/1.1\r\nHost: a\r\nIdempotency-Key: \"abc\"\r\nContent-Type: application/json\r\n"
      "Content-Length: 13\r\n\r\n{\"amount\":10}",
      "POST /echo/pay HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nIdempotency-Key: k\r\n"
      "Content-Type: application/json\r\n\r\n5;a=b\r\n{\"a\":\r\n2\r\n1}\r\n0\r\nT: x\r\n\r\n",
      "GET /echo/by-idempotency-key/abc?wait=1s HTTP/1.1\r\nHost: a\r\n\r\n",
      "PATCH http://h:1/echo/%7e//b?c=%zz HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
  };
  const std::vector<std::string> tokens = {"\r\n", "\n", ":", " ", std::string(1, '\0'), "\xff", "%", "%2e", "//",
                                           ";", ",", "\"", "\\", "0", "-1", "99999999999999999999", "chunked",
                                           "Transfer-Encoding", "Content-Length", "Idempotency-Key", "Host", "?",
                                           "HTTP/1.0", "{", "}"};
  std::mt19937 random(20261124);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(random() % n); };
  constexpr int kRequests = 1500;
  for (int i = 0; i < kRequests; ++i) {
    std::string bytes = seeds[pick(seeds.size())];
    const std::size_t edits = 1 + pick(6);
    for (std::size_t e = 0; e < edits; ++e) {
      const std::size_t at = pick(bytes.size() + 1);
      switch (pick(4)) {
        case 0: bytes.erase(at, 1 + pick(8)); break;
        case 1: bytes.insert(at, tokens[pick(tokens.size())]); break;
        case 2:
          if (!bytes.empty()) bytes[std::min(at, bytes.size() - 1)] = static_cast<char>(pick(256));
          break;
        default: bytes.insert(at, bytes.substr(pick(bytes.size() + 1), pick(40))); break;
      }
    }
    auto conn = RawConnection::Connect(gateway_->endpoint());
    ASSERT_TRUE(conn.ok()) << "request " << i << ": " << conn.status().ToString();
    (void)conn->Write(bytes);
    conn->ShutdownWrite();
    const std::string raw = conn->ReadUntilClosed(10s);
    if (raw.empty()) continue;  // nothing to answer: the client left before a whole header
    ASSERT_TRUE(raw.starts_with("HTTP/1.1 ") || raw.starts_with("HTTP/1.0 ")) << "request " << i << ": " << raw;
    ASSERT_GE(raw.size(), 12u) << raw;
    const std::string status = raw.substr(9, 3);
    // The fake upstream answers only 2xx/4xx here: a 5xx is the gateway's own.
    EXPECT_NE(status[0], '5') << "request " << i << " " << ::testing::PrintToString(bytes) << " got " << raw;
    if (status != "100") {
      auto res = ParseResponse(raw);
      EXPECT_TRUE(res.ok()) << "request " << i << ": " << raw;
    }
  }
  // Still serving, and still deduplicating.
  HttpRequest req = KeyedPost("/echo/after", "after-fuzz", R"({"n":1})");
  EXPECT_EQ(Send(req).status, 200);
  EXPECT_EQ(Send(req).Header("Idempotent-Replayed"), "true");
}

TEST_F(IdempotencyTest, ChangedPayloadIs422AndLeavesTheRecordUsable) {
  Start({});
  const HttpResponse first = Send(KeyedPost("/echo", "k-422", R"({"amount":1})"));
  ASSERT_EQ(first.status, 200);
  const HttpResponse changed = Send(KeyedPost("/echo", "k-422", R"({"amount":2})"));
  ExpectProblem(changed, 422, "key-reused");
  // Another path is another request too.
  ExpectProblem(Send(KeyedPost("/echo/other", "k-422", R"({"amount":1})")), 422, "key-reused");
  const HttpResponse again = Send(KeyedPost("/echo", "k-422", R"({"amount":1})"));
  EXPECT_EQ(again.status, 200);
  EXPECT_EQ(again.body, first.body);
  EXPECT_EQ(again.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(Executions(), 1u);
}

// A GET carrying X-HTTP-Method-Override: POST runs as a POST in Rails,
// Express, Laravel or ASP.NET: the route's policy and deduplication apply
// to it as to a POST, and it is forwarded as sent.
TEST_F(IdempotencyTest, MethodOverrideHeaderIsHandledAsTheMethodItNames) {
  Start({});
  for (const char* name : {"X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override"}) {
    const HttpResponse keyless = Send(HttpRequest{.target = "/echo/override", .headers = {{name, "POST"}}});
    ExpectProblem(keyless, 400, "missing-key");
  }
  EXPECT_EQ(Executions(), 0u);
  // A POST that names GET still needs its key: an upstream that ignores
  // the header runs it as a POST.
  const HttpResponse post_as_get = Send(HttpRequest{
      .method = "POST", .target = "/echo/override", .headers = {{"X-HTTP-Method-Override", "GET"}}, .body = "{}"});
  ExpectProblem(post_as_get, 400, "missing-key");
  EXPECT_EQ(Executions(), 0u);
  // Without one, a GET is not deduplicated and needs no key.
  ASSERT_EQ(Send(HttpRequest{.target = "/echo/override"}).status, 200);
  EXPECT_EQ(Executions(), 1u);

  HttpRequest keyed{.target = "/echo/override",
                    .headers = {{"X-HTTP-Method-Override", "POST"}, {"Idempotency-Key", "\"override-1\""}}};
  const HttpResponse first = Send(keyed);
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_FALSE(first.HasHeader("Idempotent-Replayed"));
  auto echo = ParseObject(first.body);
  EXPECT_EQ(echo.at("method").as_string(), "GET");
  EXPECT_EQ(Values(EchoedHeaders(echo), "X-HTTP-Method-Override"), (std::vector<std::string>{"POST"}));
  const HttpResponse again = Send(keyed);
  EXPECT_EQ(again.status, 200);
  EXPECT_EQ(again.body, first.body);
  EXPECT_EQ(again.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(Executions(), 2u);
  // Lines that disagree on the method are refused before anything else.
  HttpRequest ambiguous = keyed;
  ambiguous.headers.push_back({"X-HTTP-Method", "DELETE"});
  ExpectProblem(Send(ambiguous), 400, "bad-request");
  EXPECT_EQ(Executions(), 2u);
}

TEST_F(IdempotencyTest, ConcurrentDuplicateIs409InRejectMode) {
  Start({.idempotency = "{ policy: required, in_flight: reject }"});
  std::optional<HttpResponse> original;
  std::thread slow([&] { original = Send(KeyedPost("/slow?ms=1500", "k-409")); });
  ASSERT_TRUE(PollUntil([&] { return Executions() >= 1; }, 10s));
  const HttpResponse dup = Send(KeyedPost("/slow?ms=1500", "k-409"));
  ExpectProblem(dup, 409, "request-in-flight");
  ASSERT_TRUE(dup.Header("Retry-After").has_value());
  EXPECT_GE(std::stoi(*dup.Header("Retry-After")), 1);
  slow.join();
  ASSERT_TRUE(original.has_value());
  EXPECT_EQ(original->status, 200);
  // Once it landed the duplicate is a replay.
  const HttpResponse after = Send(KeyedPost("/slow?ms=1500", "k-409"));
  EXPECT_EQ(after.status, 200);
  EXPECT_EQ(after.body, original->body);
  EXPECT_EQ(Executions(), 1u);
}

TEST_F(IdempotencyTest, FiftyConcurrentDuplicatesInWaitModeExecuteOnce) {
  Start({.idempotency = "{ policy: required, in_flight: wait, wait_timeout: 20s }"});
  constexpr int kClients = 50;
  std::vector<std::optional<HttpResponse>> results(kClients);
  std::vector<std::thread> threads;
  std::atomic<int> go{0};
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      go.fetch_add(1);
      while (go.load() < kClients) std::this_thread::yield();
      auto res = SendRequest(gateway_->endpoint(), KeyedPost("/slow?ms=500", "k-wait", R"({"n":1})"), 30s);
      if (res.ok()) results[i] = *res;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(Executions(), 1u);
  int replays = 0;
  std::optional<std::string> op;
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(results[i].has_value()) << "client " << i << " got no response";
    EXPECT_EQ(results[i]->status, 200) << results[i]->body;
    EXPECT_EQ(results[i]->body, results[0]->body);
    if (!op) op = results[i]->Header("X-Operation-Id");
    EXPECT_EQ(results[i]->Header("X-Operation-Id"), op);
    if (results[i]->Header("Idempotent-Replayed") == "true") ++replays;
  }
  EXPECT_EQ(replays, kClients - 1);
}

TEST_F(IdempotencyTest, WaitModeGives409WhenTheOriginalOutlastsTheWait) {
  Start({.idempotency = "{ policy: required, in_flight: wait, wait_timeout: 300ms }"});
  std::thread slow([&] { Send(KeyedPost("/slow?ms=2000", "k-wait-timeout")); });
  ASSERT_TRUE(PollUntil([&] { return Executions() >= 1; }, 10s));
  ExpectProblem(Send(KeyedPost("/slow?ms=2000", "k-wait-timeout")), 409, "request-in-flight");
  slow.join();
  EXPECT_EQ(Executions(), 1u);
  EXPECT_EQ(MetricValue(Metrics(), R"(idempotency_conflict_total{tenant="_",project="_",route="api",reason="wait_timeout"})"),
            1.0);
}

TEST_F(IdempotencyTest, WaitersAnswerWithTheOriginalsUnstoredFailureInsteadOfRunningAgain) {
  Start({.idempotency = "{ policy: required, in_flight: wait, wait_timeout: 20s }"});
  ExpectWaitersShareTheOriginalsOutcome("/status/500?ms=1500", "k-shared-500", 500, "");
}

// An upstream that broke the exchange (a reset before any answer; a 500
// whose head is refused, so its outcome is not kept whole) is shared as the
// gateway's 502.
TEST_F(IdempotencyTest, WaitersAnswerWithTheOriginalsBrokenExchange) {
  Start({.idempotency = "{ policy: required, in_flight: wait, wait_timeout: 20s }"});
  ExpectWaitersShareTheOriginalsOutcome("/die-before-response?ms=1500", "k-shared-reset", 502, "upstream-unavailable");
  ExpectWaitersShareTheOriginalsOutcome("/bad-head/500?ms=1500", "k-shared-bad-head", 502, "upstream-unavailable");
}

// An upstream that timed out may still be running the request: its waiters
// answer 504 too rather than run it beside that call.
TEST_F(IdempotencyTest, WaitersDoNotRunBesideAnOriginalWhoseUpstreamTimedOut) {
  Start({.idempotency = "{ policy: required, in_flight: wait, wait_timeout: 20s }", .upstream_timeout = "1s"});
  ExpectWaitersShareTheOriginalsOutcome("/slow?ms=2500", "k-shared-timeout", 504, "upstream-timeout");
  // Its status line came, then the rest of its head did not in time.
  ExpectWaitersShareTheOriginalsOutcome("/stall-head/500?ms=2500", "k-shared-stall", 504, "upstream-timeout");
}

// Waiters whose clients closed their connections while the original ran do
// not take the key when the original releases it (a 500 is not stored): a
// run would answer nobody. They are logged client_gone or shared, not as
// conflicts, and the key stays free for the client's retry.
TEST_F(IdempotencyTest, WaitersWhoseClientsLeftDoNotTakeTheReleasedKey) {
  Start({.idempotency = "{ policy: required, in_flight: wait, wait_timeout: 20s }"});
  const std::string target = "/status/500?ms=1500";
  std::optional<HttpResponse> original;
  std::thread first([&] { original = Send(KeyedPost(target, "k-left")); });
  ASSERT_TRUE(PollUntil([&] { return Executions() >= 1; }, 10s));
  constexpr int kWaiters = 5;
  std::vector<RawConnection> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    auto conn = RawConnection::Connect(gateway_->endpoint());
    ASSERT_TRUE(conn.ok()) << conn.status().ToString();
    ASSERT_TRUE(conn->Write(RawKeyedPost(target, "k-left")).ok());
    waiters.push_back(std::move(*conn));
  }
  std::this_thread::sleep_for(300ms);  // they wait for the original
  for (RawConnection& conn : waiters) conn.Close();
  first.join();
  ASSERT_TRUE(original.has_value());
  EXPECT_EQ(original->status, 500);
  // Each is answered with the original's shared 500 (its write to a closed
  // connection may or may not fail: shared or client_gone), or, found gone
  // first, not run (client_gone).
  auto settled = [&] {
    const std::string log = gateway_->Stdout();
    return LoggedOutcomes(log, "client_gone") + LoggedOutcomes(log, "shared");
  };
  EXPECT_TRUE(PollUntil([&] { return settled() == kWaiters; }, 10s)) << settled() << " waiters settled";
  EXPECT_EQ(Executions(), 1u);
  const std::string metrics = Metrics();
  for (const std::string reason : {"in_flight", "wait_timeout"}) {
    EXPECT_FALSE(MetricValue(metrics, R"(idempotency_conflict_total{tenant="_",project="_",route="api",reason=")" +
                                          reason + R"("})")
                     .has_value())
        << reason;
  }
  // The key is free: the client's retry runs it.
  EXPECT_EQ(Send(KeyedPost("/status/500", "k-left")).status, 500);
  EXPECT_EQ(Executions(), 2u);
}

TEST_F(IdempotencyTest, EveryInvalidKeyClassIs400) {
  Start({});
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"\"a\"", "\"b\""}, "duplicate"},
      {{"\"a\", \"b\""}, "list"},
      {{"\"a\";x=1"}, "parameters"},
      {{"\"\""}, "empty"},
      {{"\"a\\nb\""}, "bad_string"},
      {{"\"abc"}, "bad_string"},
      {{"a b"}, "charset"},
      {{"a/b"}, "charset"},
      {{std::string(256, 'k')}, "too_long"},
      {{"t-abc"}, "reserved_prefix"},
      {{"a:b"}, "colon"},
  };
  for (const auto& [lines, reason] : cases) {
    SCOPED_TRACE(reason + ": " + lines[0]);
    HttpRequest req{.method = "POST", .target = "/echo", .body = "{}"};
    for (const auto& v : lines) req.headers.push_back({"Idempotency-Key", v});
    ExpectProblem(Send(req), 400, "invalid-key");
  }
  ExpectProblem(Send(KeyedPost("/echo", "")), 400, "missing-key");
  EXPECT_EQ(Executions(), 0u);
  const std::string metrics = Metrics();
  EXPECT_EQ(MetricValue(metrics, R"(idempotency_key_invalid_total{tenant="_",project="_",route="api",reason="bad_string"})"),
            2.0)
      << metrics;
  EXPECT_EQ(MetricValue(metrics, R"(idempotency_key_missing_total{tenant="_",project="_",route="api",class="required"})"),
            1.0);
  // The longest valid key passes.
  EXPECT_EQ(Send(KeyedPost("/echo", std::string(255, 'k'))).status, 200);
}

// A client that asks `Expect: 100-continue` before a large body learns of
// an invalid key (or a missing one) at once: the 400 comes instead of
// `100 Continue`, and the body is never asked for. A valid key still gets
// `100 Continue`, and the request runs.
TEST_F(IdempotencyTest, ExpectContinueWithABadKeyIsRefusedBeforeTheBody) {
  Start({});
  auto ask = [&](const std::string& key_line) {
    RawConnection conn = *RawConnection::Connect(gateway_->endpoint());
    EXPECT_TRUE(conn.Write("POST /echo HTTP/1.1\r\nHost: t\r\n" + key_line +
                           "Expect: 100-continue\r\nContent-Length: 1000000\r\n\r\n")
                    .ok());
    std::string raw;
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    while (raw.find("\r\n\r\n") == std::string::npos && !conn.closed() &&
           std::chrono::steady_clock::now() < give_up) {
      auto piece = conn.ReadSome(1s);
      if (piece.ok()) raw += *piece;
    }
    return raw;
  };
  for (const std::string line : {"Idempotency-Key: a/b\r\n", "Idempotency-Key: \"a\", \"b\"\r\n", ""}) {
    SCOPED_TRACE(line);
    const std::string raw = ask(line);
    EXPECT_TRUE(raw.starts_with("HTTP/1.1 400")) << raw;
  }
  EXPECT_TRUE(ask("Idempotency-Key: \"k-continue\"\r\n").starts_with("HTTP/1.1 100 Continue\r\n"));
  EXPECT_EQ(Executions(), 0u);
}

TEST_F(IdempotencyTest, KeyOnAMethodOutsideTheListIsNotIntercepted) {
  Start({});
  HttpRequest get{.method = "GET", .target = "/echo"};
  get.headers = {{"Idempotency-Key", "\"k-get\""}};
  for (int i = 0; i < 2; ++i) {
    const HttpResponse res = Send(get);
    EXPECT_EQ(res.status, 200);
    EXPECT_FALSE(res.HasHeader("Idempotent-Replayed"));
    EXPECT_FALSE(res.HasHeader("X-Operation-Id"));
    auto echo = ParseObject(res.body);
    // The header reaches the upstream untouched.
    EXPECT_EQ(Values(EchoedHeaders(echo), "Idempotency-Key"), (std::vector<std::string>{"\"k-get\""}));
  }
  EXPECT_EQ(Executions(), 2u);
}

TEST_F(IdempotencyTest, FinalStatusesAreStoredAndServerErrorsAreNot) {
  Start({});
  // 404 is final: replayed.
  EXPECT_EQ(Send(KeyedPost("/status/404", "k-404")).status, 404);
  const HttpResponse replay404 = Send(KeyedPost("/status/404", "k-404"));
  EXPECT_EQ(replay404.status, 404);
  EXPECT_EQ(replay404.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(Executions(), 1u);
  // 500 is not: the retry runs again.
  EXPECT_EQ(Send(KeyedPost("/status/500", "k-500")).status, 500);
  const HttpResponse again500 = Send(KeyedPost("/status/500", "k-500"));
  EXPECT_EQ(again500.status, 500);
  EXPECT_FALSE(again500.HasHeader("Idempotent-Replayed"));
  EXPECT_EQ(Executions(), 3u);
  // Neither are 408/409/425/429.
  for (int code : {408, 409, 425, 429}) {
    const std::string target = "/status/" + std::to_string(code);
    const std::string key = "k-" + std::to_string(code);
    EXPECT_EQ(Send(KeyedPost(target, key)).status, code);
    EXPECT_FALSE(Send(KeyedPost(target, key)).HasHeader("Idempotent-Replayed")) << code;
  }
  EXPECT_EQ(Executions(), 11u);
  // The terminal header makes a 503 final and never reaches the client.
  HttpRequest terminal = KeyedPost("/status/503", "k-terminal");
  terminal.headers.push_back({"X-Terminal", "1"});
  const HttpResponse t1 = Send(terminal);
  EXPECT_EQ(t1.status, 503);
  EXPECT_FALSE(t1.HasHeader("Idempotency-Terminal"));
  const HttpResponse t2 = Send(terminal);
  EXPECT_EQ(t2.status, 503);
  EXPECT_EQ(t2.Header("Idempotent-Replayed"), "true");
  EXPECT_FALSE(t2.HasHeader("Idempotency-Terminal"));
  EXPECT_EQ(Executions(), 12u);
  const std::string metrics = Metrics();
  EXPECT_EQ(MetricValue(metrics, R"(idempotency_reservation_released_total{tenant="_",project="_",route="api",reason="server_error"})"),
            2.0)
      << metrics;
}

// A HEAD response's Content-Length is the length a GET would get (RFC 9110
// section 9.3.2): its replay carries the same, not the empty stored body's.
TEST_F(IdempotencyTest, AHeadReplayKeepsTheLengthAGetWouldGet) {
  Start({.idempotency = "{ policy: required, methods: [POST, HEAD] }"});
  HttpRequest head{.method = "HEAD", .target = "/echo/h", .headers = {{"Idempotency-Key", "h-1"}}};
  const HttpResponse first = Send(head);
  ASSERT_EQ(first.status, 200);
  const auto length = first.Header("Content-Length");
  ASSERT_TRUE(length.has_value());
  ASSERT_NE(*length, "0");
  const HttpResponse again = Send(head);
  EXPECT_EQ(again.status, 200);
  EXPECT_EQ(again.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(again.Header("Content-Length"), length);
  EXPECT_TRUE(again.body.empty());
  EXPECT_EQ(Executions(), 1u);
}

// A replay has the original's header lines in the original's order
// (docs/engine.md, Replay): Date refreshed where the original had it,
// Content-Length where the original had it; only the replay header is
// added, and X-Request-Id is the replaying request's.
TEST_F(IdempotencyTest, AReplayKeepsTheOriginalsHeaderOrder) {
  Start({.idempotency = "{ policy: required, methods: [POST, HEAD] }"});
  const auto lines = [](const HttpResponse& r, bool with_values) {
    std::vector<std::string> out;
    for (const auto& [name, value] : r.headers) {
      if (name == "Idempotent-Replayed") continue;
      const bool fresh = name == "Date" || name == "X-Request-Id";
      out.push_back(with_values && !fresh ? name + ": " + value : name);
    }
    return out;
  };
  HttpRequest post = KeyedPost("/echo/order", "order-h", R"({"n":1})");
  post.headers.push_back({"X-Echo-Header", "Date: Mon, 01 Jan 2024 00:00:00 GMT"});
  post.headers.push_back({"X-Echo-Set-Cookie", "a=1"});
  post.headers.push_back({"X-Echo-Header", "x-MiXed-Case: v"});
  post.headers.push_back({"X-Echo-Header", "X-Empty: "});
  post.headers.push_back({"X-Echo-Set-Cookie", "b=2"});
  HttpRequest head = post;
  head.method = "HEAD";
  head.headers[0] = {"Idempotency-Key", "order-h-head"};
  head.body.clear();
  for (const HttpRequest& req : {post, head}) {
    const HttpResponse first = Send(req);
    ASSERT_EQ(first.status, 200) << first.body;
    ASSERT_TRUE(first.HasHeader("Content-Length"));
    const HttpResponse again = Send(req);
    ASSERT_EQ(again.Header("Idempotent-Replayed"), "true") << req.method;
    EXPECT_EQ(lines(again, true), lines(first, true)) << req.method;
    EXPECT_EQ(again.body, first.body);
  }
  // Date has the time of the replay.
  EXPECT_NE(Send(post).Header("Date"), "Mon, 01 Jan 2024 00:00:00 GMT");
  EXPECT_EQ(Executions(), 2u);
}

// A status Beast has no name for goes out with an empty reason phrase on a
// replay, never the library's "<unknown-status>" placeholder.
TEST_F(IdempotencyTest, AReplayedStatusWithoutANameHasNoPlaceholderReason) {
  Start({});
  ASSERT_EQ(Send(KeyedPost("/status/418", "k-418")).status, 418);
  RawConnection conn = *RawConnection::Connect(gateway_->endpoint());
  ASSERT_TRUE(conn.Write(RawKeyedPost("/status/418", "k-418")).ok());
  std::string raw;
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  while (raw.find("\r\n\r\n") == std::string::npos && !conn.closed() &&
         std::chrono::steady_clock::now() < give_up) {
    auto piece = conn.ReadSome(1s);
    if (piece.ok()) raw += *piece;
  }
  EXPECT_TRUE(raw.starts_with("HTTP/1.1 418 \r\n")) << raw.substr(0, 100);
  EXPECT_NE(raw.find("Idempotent-Replayed: true"), std::string::npos) << raw.substr(0, 300);
  EXPECT_EQ(Executions(), 1u);
}

TEST_F(IdempotencyTest, StoreServerErrorsStoresA500) {
  Start({.idempotency = "{ policy: required, store_server_errors: true }"});
  EXPECT_EQ(Send(KeyedPost("/status/500", "k-500s")).status, 500);
  const HttpResponse again = Send(KeyedPost("/status/500", "k-500s"));
  EXPECT_EQ(again.status, 500);
  EXPECT_EQ(again.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(Executions(), 1u);
}

TEST_F(IdempotencyTest, AdmissionRefusalDoesNotPoisonTheKey) {
  Start({.route_extra = "    max_in_flight: 1\n"});
  std::thread hog([&] { Send(KeyedPost("/slow?ms=1500", "k-hog")); });
  ASSERT_TRUE(PollUntil([&] { return Executions() >= 1; }, 10s));
  const HttpResponse refused = Send(KeyedPost("/echo", "k-admission"));
  ExpectProblem(refused, 429, "too-many-requests");
  EXPECT_TRUE(refused.HasHeader("Retry-After"));
  hog.join();
  // The same key runs now: the 429 released its reservation.
  const HttpResponse later = Send(KeyedPost("/echo", "k-admission"));
  EXPECT_EQ(later.status, 200) << later.body;
  EXPECT_FALSE(later.HasHeader("Idempotent-Replayed"));
  EXPECT_EQ(Executions(), 2u);
  EXPECT_EQ(MetricValue(Metrics(), R"(idempotency_reservation_released_total{tenant="_",project="_",route="api",reason="admission"})"),
            1.0);
}

TEST_F(IdempotencyTest, PerTenantAdmissionKeepsOneTenantFromTakingTheRoute) {
  Start({.route_extra = "    max_in_flight_per_tenant: 1\n", .identity = "{ mode: trusted_headers }"});
  auto as = [](HttpRequest req, const std::string& tenant) {
    req.headers.push_back({"X-Tenant-Id", tenant});
    req.headers.push_back({"X-Project-Id", "p"});
    req.headers.push_back({"X-Subject", "user:u"});
    return req;
  };
  std::thread hog([&] { Send(as(KeyedPost("/slow?ms=1500", "k-hog"), "acme")); });
  ASSERT_TRUE(PollUntil([&] { return Executions() >= 1; }, 10s));
  // acme has its one request in flight; globex is not held back by it.
  const HttpResponse refused = Send(as(KeyedPost("/echo", "k-t"), "acme"));
  ExpectProblem(refused, 429, "too-many-requests");
  EXPECT_TRUE(refused.HasHeader("Retry-After"));
  EXPECT_NE(refused.body.find("tenant acme"), std::string::npos) << refused.body;
  EXPECT_EQ(Send(as(KeyedPost("/echo", "k-t"), "globex")).status, 200);
  hog.join();
  // The refusal released acme's reservation: the same key runs now.
  const HttpResponse later = Send(as(KeyedPost("/echo", "k-t"), "acme"));
  EXPECT_EQ(later.status, 200) << later.body;
  EXPECT_FALSE(later.HasHeader("Idempotent-Replayed"));
  EXPECT_EQ(Executions(), 3u);
}

// A lease shorter than the upstream timeout is refused by check-config, so a
// live owner on one gateway cannot lose its key; the takeover of an expired
// lease and the compare-and-set against the stalled loser are tested with
// two gateways on one Redis (RedisGatewayTest) and in the engine tests.

TEST_F(IdempotencyTest, ResponseAboveTheCapStreamsThroughAndReplaysWithoutBody) {
  Start({.idempotency = "{ policy: required, max_response_bytes: 1KiB }"});
  const HttpResponse first = Send(KeyedPost("/large?bytes=5000", "k-large"));
  EXPECT_EQ(first.status, 200);
  EXPECT_EQ(first.body.size(), 5000u);
  const HttpResponse replay = Send(KeyedPost("/large?bytes=5000", "k-large"));
  EXPECT_EQ(replay.status, 200);
  EXPECT_TRUE(replay.body.empty());
  EXPECT_EQ(replay.Header("Idempotency-Replay"), "omitted");
  EXPECT_EQ(replay.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(Executions(), 1u);
  // A body at the cap is kept.
  const HttpResponse small = Send(KeyedPost("/large?bytes=1024", "k-small"));
  EXPECT_EQ(Send(KeyedPost("/large?bytes=1024", "k-small")).body, small.body);
}

// An upstream that sent its status line and then broke off ran the request:
// its final status is stored (the body omitted), so the retry is a replay,
// never a second run.
TEST_F(IdempotencyTest, AResponseBrokenOffAfterItsStatusIsStoredNotRunAgain) {
  Start({});
  auto first = SendRequest(gateway_->endpoint(), KeyedPost("/die-mid-response", "k-broken"));
  if (first.ok()) {
    EXPECT_TRUE(first->status == 200 || first->status == 502) << first->status;
  }
  const HttpResponse retry = Send(KeyedPost("/die-mid-response", "k-broken"));
  EXPECT_EQ(retry.status, 200);
  EXPECT_EQ(retry.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(retry.Header("Idempotency-Replay"), "omitted");
  EXPECT_TRUE(retry.body.empty());
  EXPECT_EQ(Executions(), 1u);
}

// An upstream that answered with a final status and a head the gateway
// refuses (Content-Length beside Transfer-Encoding: chunked, a coding other
// than chunked, two lengths, a header block over 64 KiB) ran the request:
// the client gets 502, the status is stored without the head's fields or
// body, and a retry is a replay, never a second run. A 500 is released, as
// with any head.
TEST_F(IdempotencyTest, AFinalStatusWithARefusedHeadIsStoredNotRunAgain) {
  Start({});
  std::uint64_t ran = 0;
  for (const char* kind : {"length-and-chunked", "gzip-chunked", "two-lengths", "huge"}) {
    SCOPED_TRACE(kind);
    const std::string key = std::string("k-bad-head-") + kind;
    const std::string target = std::string("/bad-head/201?kind=") + kind;
    ExpectProblem(Send(KeyedPost(target, key)), 502, "upstream-unavailable");
    const HttpResponse retry = Send(KeyedPost(target, key));
    EXPECT_EQ(retry.status, 201) << retry.body;
    EXPECT_EQ(retry.Header("Idempotent-Replayed"), "true");
    EXPECT_EQ(retry.Header("Idempotency-Replay"), "omitted");
    EXPECT_TRUE(retry.body.empty());
    EXPECT_EQ(Executions(), ++ran);
  }
  for (int i = 0; i < 2; ++i) {
    ExpectProblem(Send(KeyedPost("/bad-head/500", "k-bad-head-500")), 502, "upstream-unavailable");
  }
  EXPECT_EQ(Executions(), ran + 2);
  const std::string metrics = Metrics();
  EXPECT_EQ(MetricValue(metrics, R"(idempotency_stored_total{tenant="_",project="_",route="api"})"), 4.0);
  EXPECT_EQ(MetricValue(metrics, R"(idempotency_reservation_released_total{tenant="_",project="_",route="api",reason="server_error"})"),
            2.0);
  EXPECT_EQ(MetricValue(metrics, R"(idempotency_reservation_released_total{tenant="_",project="_",route="api",reason="response_error"})")
                .value_or(0),
            0.0);
}

// An upstream that answers before it has read the whole body (a 201 that
// ignores it, an early 413) and then closes, which fails the gateway's send,
// or keeps the connection without reading, which blocks it: the client gets
// that answer, not a 502 or 504, and it is stored, so a retry is a replay,
// never a second run.
TEST_F(IdempotencyTest, AnAnswerBeforeTheWholeBodyIsRelayedAndStored) {
  Start({.route_extra = "    max_request_bytes: 32MiB\n", .upstream_timeout = "5s"});
  const std::string body(16 * 1024 * 1024, 'b');  // far more than the socket buffers in between hold
  std::uint64_t ran = 0;
  for (const auto& [status, then] : {std::pair{"201", "close"}, std::pair{"201", "wait"}, std::pair{"413", "close"}}) {
    const std::string target = std::string("/answer-early/") + status + "?then=" + then;
    SCOPED_TRACE(target);
    HttpRequest req = KeyedPost(target, std::string("k-early-") + status + "-" + then, body);
    req.headers[1] = {"Content-Type", "application/octet-stream"};
    const HttpResponse first = Send(req);
    EXPECT_EQ(first.status, std::stoi(status)) << first.body;
    EXPECT_FALSE(first.HasHeader("Idempotent-Replayed"));
    const HttpResponse retry = Send(req);
    EXPECT_EQ(retry.status, std::stoi(status)) << retry.body;
    EXPECT_EQ(retry.Header("Idempotent-Replayed"), "true");
    EXPECT_EQ(retry.body, first.body);
    EXPECT_EQ(Executions(), ++ran);
  }
}

// A store with room for the reservation but not for the response (a
// response larger than the whole memory store, then one more arriving once
// the store is full of other records): the upstream ran, so the outcome is
// kept without its body and the retry is a replay, even after the lease, never
// a second run.
TEST_F(IdempotencyTest, AResponseTheFullStoreCannotHoldWholeIsReplayedWithoutItsBody) {
  Start({.idempotency = "{ policy: required, lease: 1s }",
         .store = "{ kind: memory, max_bytes: 3KiB }",
         .upstream_timeout = "800ms"});
  const HttpResponse first = Send(KeyedPost("/large?bytes=4000", "k-no-room"));
  EXPECT_EQ(first.status, 200);
  EXPECT_EQ(first.body.size(), 4000u);
  const HttpResponse retry = Send(KeyedPost("/large?bytes=4000", "k-no-room"));
  EXPECT_EQ(retry.status, 200);
  EXPECT_EQ(retry.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(retry.Header("Idempotency-Replay"), "omitted");
  EXPECT_EQ(retry.Header("X-Operation-Id"), first.Header("X-Operation-Id"));
  EXPECT_EQ(Executions(), 1u);

  // Fill the store with small responses: once it is full, new keys are
  // refused (503, nothing run) while those admitted all keep their outcome.
  std::vector<std::string> ran;
  for (int i = 0; i < 30; ++i) {
    const std::string key = "k-fill-" + std::to_string(i);
    const HttpResponse r = Send(KeyedPost("/large?bytes=400", key));
    if (r.status == 200) {
      ran.push_back(key);
    } else {
      ExpectProblem(r, 503, "store-unavailable");
    }
  }
  ASSERT_FALSE(ran.empty());
  ASSERT_LT(ran.size(), 30u);
  EXPECT_EQ(Executions(), 1u + ran.size());
  // Past every lease: a key left reserved would now be taken over and run again.
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  std::size_t omitted = 0;
  for (const std::string& key : ran) {
    const HttpResponse again = Send(KeyedPost("/large?bytes=400", key));
    EXPECT_EQ(again.status, 200) << key;
    EXPECT_EQ(again.Header("Idempotent-Replayed"), "true") << key;
    if (again.Header("Idempotency-Replay") == "omitted") {
      EXPECT_TRUE(again.body.empty()) << key;
      ++omitted;
    } else {
      EXPECT_EQ(again.body.size(), 400u) << key;
    }
  }
  EXPECT_EQ(Executions(), 1u + ran.size());
  const std::string metrics = Metrics();
  EXPECT_EQ(MetricValue(metrics, "idemgate_store_bodies_dropped_total"), static_cast<double>(1 + omitted));
  EXPECT_FALSE(MetricValue(metrics, R"(idempotency_store_errors_total{tenant="_",project="_",route="api",op="complete"})")
                   .has_value());
  EXPECT_NE(gateway_->Stdout().find("response stored without its body"), std::string::npos);
}

// A client that reads a keyed response slower than the lease allows: the
// gateway reads the response ahead of it (it fits max_response_bytes), so
// the outcome is stored whole at the upstream's pace and the client still
// gets every byte after pausing past the lease. The retry replays the whole
// body; the upstream ran once.
TEST_F(IdempotencyTest, ASlowClientPastTheLeaseStillGetsAndStoresTheWholeResponse) {
  Start({.idempotency = "{ policy: required, lease: 4s, max_response_bytes: 32MiB }", .upstream_timeout = "2s"});
  constexpr std::size_t kBytes = 12 * 1024 * 1024;  // beyond the socket buffers in between (about 4 MiB here)
  const std::string target = "/large?bytes=" + std::to_string(kBytes);
  RawConnection conn = *RawConnection::Connect(gateway_->endpoint());
  ASSERT_TRUE(conn.Write(RawKeyedPost(target, "k-slow-reader")).ok());
  std::this_thread::sleep_for(5s);  // past the lease
  std::string raw;
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  auto body_bytes = [&] {
    const std::size_t end = raw.find("\r\n\r\n");
    return end == std::string::npos ? 0 : raw.size() - end - 4;
  };
  while (body_bytes() < kBytes && !conn.closed() && std::chrono::steady_clock::now() < give_up) {
    auto piece = conn.ReadSome(1s);
    if (piece.ok()) raw += *piece;
  }
  ASSERT_TRUE(raw.starts_with("HTTP/1.1 200")) << raw.substr(0, 300);
  EXPECT_EQ(body_bytes(), kBytes);
  const HttpResponse retry = Send(KeyedPost(target, "k-slow-reader"));
  EXPECT_EQ(retry.status, 200);
  EXPECT_EQ(retry.Header("Idempotent-Replayed"), "true");
  EXPECT_FALSE(retry.HasHeader("Idempotency-Replay"));
  EXPECT_EQ(retry.body.size(), kBytes);
  EXPECT_EQ(retry.body, raw.substr(raw.find("\r\n\r\n") + 4));
  EXPECT_EQ(Executions(), 1u);
}

// A keyed response too large to record whole (past max_response_bytes),
// relayed to a client that stops reading: the relay must not outlive the
// lease, or a retry after the lease would take the key over and run the
// request a second time while the original is still going out. The client
// is cut at the lease's margin and the outcome is stored without its body.
TEST_F(IdempotencyTest, ARelayToAStalledClientDoesNotOutliveTheLease) {
  Start({.idempotency = "{ policy: required, lease: 2s, max_response_bytes: 1MiB }", .upstream_timeout = "1s"});
  constexpr std::size_t kBytes = 48 * 1024 * 1024;  // far beyond the socket buffers in between
  const std::string target = "/large?bytes=" + std::to_string(kBytes);
  RawConnection conn = *RawConnection::Connect(gateway_->endpoint());
  ASSERT_TRUE(conn.Write(RawKeyedPost(target, "k-stalled-reader")).ok());
  std::this_thread::sleep_for(2500ms);  // past the lease
  const HttpResponse retry = Send(KeyedPost(target, "k-stalled-reader"));
  EXPECT_EQ(retry.status, 200);
  EXPECT_EQ(retry.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(retry.Header("Idempotency-Replay"), "omitted");
  EXPECT_EQ(Executions(), 1u);
  // The stalled client's response was cut, never completed.
  const std::string raw = conn.ReadUntilClosed(30s);
  EXPECT_TRUE(conn.closed());
  EXPECT_TRUE(raw.starts_with("HTTP/1.1 200")) << raw.substr(0, 200);
  EXPECT_LT(raw.size(), kBytes);
}

// A keyed request that waits for a free upstream connection is sent only
// while the upstream's timeout still fits in what is left of its lease;
// else it gets 502 without being sent and its key is released. Sent later,
// it would still be running when a retry takes the key over after the lease,
// and the upstream would run it twice.
TEST_F(IdempotencyTest, AKeyedRequestIsNotSentWhenItsExchangeNoLongerFitsItsLease) {
  std::string yaml =
      GatewayConfigHead(fake_endpoint_, {.upstream = "timeout: 1s, connect_timeout: 6s, max_connections: 1"}) +
      "  - id: api\n    match: { path_prefix: / }\n    upstream: fake\n"
      "    idempotency: { policy: required, lease: 3s }\n";
  yaml.replace(yaml.find("workers: 2"), 10, "workers: 1");  // one worker: one upstream connection
  StartGateway(yaml);
  // Three requests without a key hold the only connection one after another (2.7 s).
  std::vector<std::thread> busy;
  for (int i = 0; i < 3; ++i) busy.emplace_back([&] { Send(HttpRequest{.target = "/slow?ms=900"}); });
  ASSERT_TRUE(PollUntil([&] { return Executions() >= 1; }, 10s));
  // K's lease (3 s, less 0.3 s of margin) leaves 1.7 s to send it with its 1 s timeout.
  const auto sent_at = std::chrono::steady_clock::now();
  std::optional<HttpResponse> original;
  std::thread keyed([&] { original = Send(KeyedPost("/slow?ms=900", "k-late")); });
  std::this_thread::sleep_until(sent_at + 3300ms);  // past K's lease
  const HttpResponse retry = Send(KeyedPost("/slow?ms=900", "k-late"));
  keyed.join();
  for (std::thread& t : busy) t.join();
  ASSERT_TRUE(original.has_value());
  ExpectProblem(*original, 502, "upstream-unavailable");
  EXPECT_NE(original->body.find("lease"), std::string::npos) << original->body;
  EXPECT_EQ(retry.status, 200) << retry.body;
  auto stats = FetchFakeStats(fake_endpoint_);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->by_key["\"t-_:_:_:api:k-late\""], 1u);
}

TEST_F(IdempotencyTest, RetentionExpiryMakesTheKeyNew) {
  Start({.idempotency = "{ policy: required, retention: 1s }"});
  EXPECT_EQ(Send(KeyedPost("/echo", "k-ret")).status, 200);
  EXPECT_EQ(Send(KeyedPost("/echo", "k-ret")).Header("Idempotent-Replayed"), "true");
  // Poll until the record expired: the next request runs again.
  const bool renewed = PollUntil(
      [&] { return !Send(KeyedPost("/echo", "k-ret")).HasHeader("Idempotent-Replayed"); }, 10s, 200ms);
  EXPECT_TRUE(renewed);
  EXPECT_EQ(Executions(), 2u);
}

TEST_F(IdempotencyTest, OptionalPassthroughAndProhibitedPolicies) {
  Start({.idempotency = "{ policy: optional }"});
  // No key: forwarded, not stored.
  EXPECT_EQ(Send(KeyedPost("/echo", "")).status, 200);
  EXPECT_EQ(Send(KeyedPost("/echo", "")).status, 200);
  EXPECT_EQ(Executions(), 2u);
  // With a key: deduplicated.
  Send(KeyedPost("/echo", "k-opt"));
  EXPECT_EQ(Send(KeyedPost("/echo", "k-opt")).Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(Executions(), 3u);
  gateway_->Stop();
  gateway_.reset();

  Start({.idempotency = "{ policy: passthrough }"});
  // The header is the upstream's business: forwarded as sent, even when invalid.
  for (int i = 0; i < 2; ++i) {
    const HttpResponse r = Send(KeyedPost("/echo", "a:b"));
    EXPECT_EQ(r.status, 200);
    auto echo = ParseObject(r.body);
    EXPECT_EQ(Values(EchoedHeaders(echo), "Idempotency-Key"), (std::vector<std::string>{"\"a:b\""}));
  }
  EXPECT_EQ(Executions(), 5u);
  gateway_->Stop();
  gateway_.reset();

  Start({.idempotency = "{ policy: prohibited }"});
  ExpectProblem(Send(KeyedPost("/echo", "k")), 400, "key-prohibited");
  EXPECT_EQ(Send(KeyedPost("/echo", "")).status, 200);
  EXPECT_EQ(Executions(), 6u);
}

TEST_F(IdempotencyTest, FingerprintHeadersAndJsonFields) {
  Start({.idempotency =
             "{ policy: required, fingerprint: { headers: [content-type, x-account], json_fields: [/amount] } }"});
  HttpRequest a = KeyedPost("/echo", "k-fp", R"({"amount":5,"note":"first"})");
  a.headers.push_back({"X-Account", "acct-1"});
  EXPECT_EQ(Send(a).status, 200);
  // Fields outside json_fields do not count; numbers compare by value.
  HttpRequest b = KeyedPost("/echo", "k-fp", R"({"note":"second","amount":5.0})");
  b.headers.push_back({"X-Account", "acct-1"});
  EXPECT_EQ(Send(b).Header("Idempotent-Replayed"), "true");
  // A header named in fingerprint.headers does.
  HttpRequest c = b;
  c.headers.back().value = "acct-2";
  ExpectProblem(Send(c), 422, "key-reused");
  EXPECT_EQ(Executions(), 1u);
  // Its X_Account spelling, which CGI-style upstreams read as X-Account too,
  // does not reach the upstream beside the line the fingerprint covers.
  HttpRequest d = KeyedPost("/echo", "k-fp-2", R"({"amount":7})");
  d.headers.push_back({"X-Account", "acct-1"});
  d.headers.push_back({"X_Account", "acct-2"});
  const HttpResponse sent = Send(d);
  ASSERT_EQ(sent.status, 200) << sent.body;
  auto echo = ParseObject(sent.body);
  const std::vector<HeaderField> seen = EchoedHeaders(echo);
  EXPECT_EQ(Values(seen, "X-Account"), (std::vector<std::string>{"acct-1"}));
  EXPECT_TRUE(Values(seen, "X_Account").empty());
}

// A fingerprinted header whose name has a '_' has its '-' spelling, which
// CGI-style upstreams read as the same, dropped too.
TEST_F(IdempotencyTest, FingerprintedHeaderWithAnUnderscoreDropsItsDashSpelling) {
  Start({.idempotency = "{ policy: required, fingerprint: { headers: [content-type, x_account] } }"});
  HttpRequest a = KeyedPost("/echo", "k-us", R"({"amount":5})");
  a.headers.push_back({"X_Account", "acct-1"});
  a.headers.push_back({"X-Account", "acct-2"});
  const HttpResponse sent = Send(a);
  ASSERT_EQ(sent.status, 200) << sent.body;
  auto echo = ParseObject(sent.body);
  const std::vector<HeaderField> seen = EchoedHeaders(echo);
  EXPECT_EQ(Values(seen, "X_Account"), (std::vector<std::string>{"acct-1"}));
  EXPECT_TRUE(Values(seen, "X-Account").empty());
}

// With host in fingerprint.headers, an absolute-form target's authority,
// which replaces Host and is what the upstream gets, is what counts.
TEST_F(IdempotencyTest, FingerprintHostIsTheAuthorityOfAnAbsoluteFormTarget) {
  Start({.idempotency = "{ policy: required, fingerprint: { headers: [host, content-type] } }"});
  HttpRequest a = KeyedPost("/echo", "k-host", R"({"amount":5})");
  a.target = "http://a.example/echo";
  a.headers.push_back({"Host", "a.example"});
  ASSERT_EQ(Send(a).status, 200);
  HttpRequest b = a;
  b.target = "http://b.example/echo";
  ExpectProblem(Send(b), 422, "key-reused");
  // The same authority with the Host line it replaces changed is the same request.
  HttpRequest c = a;
  c.headers.back().value = "c.example";
  EXPECT_EQ(Send(c).Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(Executions(), 1u);
}

// The store and the metrics' label names are set once at start: a reload that
// changes them keeps the running ones, and says so.
TEST_F(IdempotencyTest, AReloadThatChangesTheStoreKeepsTheRunningOneAndWarns) {
  Start({.store = "{ kind: memory, max_bytes: 64B }"});
  ExpectProblem(Send(KeyedPost("/echo", "k-reload")), 503, "store-unavailable");
  ASSERT_TRUE(WriteConfig(dir_,
                          ConfigYaml(fake_endpoint_, {.store = "{ kind: memory, max_bytes: 64B, on_error: fail_open }"}) +
                              "metrics: { tenant_labels: false }\n",
                          "idemgate.yaml")
                  .ok());
  ASSERT_TRUE(gateway_->process().Signal(SIGHUP).ok());
  ASSERT_TRUE(PollUntil([&] { return gateway_->Stdout().find("config reloaded") != std::string::npos; }, 10s));
  EXPECT_NE(gateway_->Stdout().find("store changes (kind, path, sync, max_bytes, on_error, redis) need a restart"),
            std::string::npos);
  EXPECT_NE(gateway_->Stdout().find("metrics.tenant_labels changes need a restart"), std::string::npos)
      << gateway_->Stdout();
  ExpectProblem(Send(KeyedPost("/echo", "k-reload")), 503, "store-unavailable");
  EXPECT_EQ(Executions(), 0u);
}

TEST_F(IdempotencyTest, FullMemoryStoreFailsClosedOrOpen) {
  // A store that refuses even the reservation: 503 (fail_closed) ...
  Start({.store = "{ kind: memory, max_bytes: 64B }"});
  const HttpResponse closed = Send(KeyedPost("/echo", "k-full"));
  ExpectProblem(closed, 503, "store-unavailable");
  const std::uint64_t before = Executions();
  EXPECT_EQ(before, 0u);
  gateway_->Stop();
  gateway_.reset();
  // ... or forwarded without deduplication (fail_open).
  Start({.store = "{ kind: memory, max_bytes: 64B, on_error: fail_open }"});
  EXPECT_EQ(Send(KeyedPost("/echo", "k-full")).status, 200);
  EXPECT_EQ(Send(KeyedPost("/echo", "k-full")).status, 200);
  EXPECT_EQ(Executions(), 2u);
  EXPECT_EQ(MetricValue(Metrics(), R"(idempotency_fail_open_total{tenant="_",project="_",route="api"})"), 2.0);
}

TEST_F(IdempotencyTest, UnreachableUpstreamReleasesTheKey) {
  RefusingPort dead;
  std::ostringstream y;
  y << "listen: 127.0.0.1:0\nadmin: { listen: 127.0.0.1:0 }\nstore: { kind: memory }\n"
    << "upstreams:\n  dead: { url: http://127.0.0.1:" << dead.port() << ", connect_timeout: 500ms }\n"
    << "routes:\n  - id: api\n    match: { path_prefix: / }\n    upstream: dead\n"
    << "    idempotency: { policy: required }\n";
  auto g = GatewayProcess::Start(dir_, y.str());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  gateway_.emplace(std::move(*g));
  // Every retry runs again (and gets 502), never 409: each releases the key
  // before its 502 is written (see InProcessProxyTest.ConnectRefusedIs502).
  // Each retry on a new connection, so that both workers take some.
  constexpr int kRetries = 40;
  for (int i = 0; i < kRetries; ++i) {
    ExpectProblem(Send(KeyedPost("/echo", "k-dead")), 502, "upstream-unavailable");
    if (HasFailure()) break;
  }
  EXPECT_EQ(MetricValue(Metrics(), R"(idempotency_reservation_released_total{tenant="_",project="_",route="api",reason="upstream_connect"})"),
            kRetries);
}

// A route that widens the key charset: such a key is written percent-encoded
// in a recovery path, and a refused one is told what the route allows.
TEST_F(IdempotencyTest, RecoveryDecodesTheKeyInThePath) {
  Start({.idempotency = "{ policy: required, key: { charset: \"=/\", max_length: 20 } }",
         .route_extra = "    recovery: true\n"});
  const HttpResponse original = Send(KeyedPost("/echo/pay", "a=b/c"));
  ASSERT_EQ(original.status, 200) << original.body;
  const HttpResponse recovered = Send(HttpRequest{.target = "/by-idempotency-key/a%3Db%2Fc"});
  EXPECT_EQ(recovered.status, 200) << recovered.body;
  EXPECT_EQ(recovered.body, original.body);
  EXPECT_EQ(recovered.Header("Idempotent-Replayed"), "true");
  ExpectProblem(Send(HttpRequest{.target = "/by-idempotency-key/a%3D"}), 404, "not-found");
  ExpectProblem(Send(HttpRequest{.target = "/by-idempotency-key/a%3"}), 400, "invalid-key");
  const HttpResponse plus = Send(KeyedPost("/echo/pay", "a+b"));
  ExpectProblem(plus, 400, "invalid-key");
  EXPECT_NE(plus.body.find("this route's key.charset"), std::string::npos) << plus.body;
  const HttpResponse longer = Send(KeyedPost("/echo/pay", std::string(21, 'k')));
  ExpectProblem(longer, 400, "invalid-key");
  EXPECT_NE(longer.body.find("longer than 20 characters"), std::string::npos) << longer.body;
  EXPECT_EQ(Executions(), 1u);
}

TEST_F(IdempotencyTest, RecoveryReturnsTheCallersStoredResponse) {
  Start({.idempotency = "{ policy: required, in_flight: reject }", .route_extra = "    recovery: true\n"});
  const HttpResponse original = Send(KeyedPost("/echo/pay", "k-rec", R"({"a":1})"));
  ASSERT_EQ(original.status, 200);
  // The route here is every path ("/"), so the recovery path is /by-idempotency-key/{key}.
  const HttpResponse recovered = Send(HttpRequest{.target = "/by-idempotency-key/k-rec"});
  EXPECT_EQ(recovered.status, 200);
  EXPECT_EQ(recovered.body, original.body);
  EXPECT_EQ(recovered.Header("X-Operation-Id"), original.Header("X-Operation-Id"));
  EXPECT_EQ(recovered.Header("Idempotent-Replayed"), "true");
  // HEAD is answered from the store as GET is, head only.
  const HttpResponse head = Send(HttpRequest{.method = "HEAD", .target = "/by-idempotency-key/k-rec"});
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.body, "");
  EXPECT_EQ(head.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(head.Header("Content-Length"), std::to_string(original.body.size()));
  EXPECT_EQ(Send(HttpRequest{.method = "HEAD", .target = "/by-idempotency-key/unknown"}).status, 404);
  ExpectProblem(Send(HttpRequest{.target = "/by-idempotency-key/unknown"}), 404, "not-found");
  ExpectProblem(Send(HttpRequest{.target = "/by-idempotency-key/a:b"}), 400, "invalid-key");
  ExpectProblem(Send(HttpRequest{.target = "/by-idempotency-key/k-rec?wait=soon"}), 400, "bad-request");
  // A wait given twice is refused, as the admin API refuses a repeated force.
  for (const std::string query : {"wait=1s&wait=2s", "wait=1s&x=1&wait=1s", "wait=soon&wait=1s"}) {
    const HttpResponse twice = Send(HttpRequest{.target = "/by-idempotency-key/k-rec?" + query});
    ExpectProblem(twice, 400, "bad-request");
    EXPECT_NE(twice.body.find("wait is given more than once"), std::string::npos) << query << ": " << twice.body;
  }
  EXPECT_EQ(Executions(), 1u);

  // In flight: 409 at once (or after a ?wait that runs out), or the
  // response once it lands with ?wait.
  std::thread slow([&] { Send(KeyedPost("/slow?ms=3000", "k-rec-slow")); });
  ASSERT_TRUE(PollUntil([&] { return Executions() >= 2; }, 10s));
  ExpectProblem(Send(HttpRequest{.target = "/by-idempotency-key/k-rec-slow"}), 409, "request-in-flight");
  ExpectProblem(Send(HttpRequest{.target = "/by-idempotency-key/k-rec-slow?wait=50ms"}), 409, "request-in-flight");
  const HttpResponse waited = Send(HttpRequest{.target = "/by-idempotency-key/k-rec-slow?wait=10s"});
  EXPECT_EQ(waited.status, 200);
  EXPECT_EQ(ParseObject(waited.body)["slept_ms"], 3000);
  slow.join();
  EXPECT_EQ(Executions(), 2u);

  // The metrics and stats say what the log says: the three recovered
  // responses (one to the HEAD) are cache hits, the two 409s conflicts.
  const std::string metrics = Metrics();
  EXPECT_EQ(MetricValue(metrics, R"(idempotency_cache_hit_total{tenant="_",project="_",route="api",status="200"})"),
            3.0)
      << metrics;
  EXPECT_EQ(MetricValue(metrics, R"(idempotency_conflict_total{tenant="_",project="_",route="api",reason="in_flight"})"),
            1.0);
  EXPECT_EQ(
      MetricValue(metrics, R"(idempotency_conflict_total{tenant="_",project="_",route="api",reason="wait_timeout"})"),
      1.0);
  auto stats = SendRequest(gateway_->admin(), HttpRequest{.target = "/admin/stats"});
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  json::object routes = ParseObject(stats->body)["routes"].as_object();
  EXPECT_EQ(routes["api"].at("hits").as_int64(), 3) << stats->body;
  EXPECT_EQ(routes["api"].at("conflicts").as_int64(), 2) << stats->body;
}

TEST_F(IdempotencyTest, DedupUpstreamForwardsTheScopedKeyAndRewritesRecovery) {
  Start({.idempotency = "{ policy: required, dedup: upstream }",
         .route_extra = "    recovery: true\n    recovery_upstream_path: /echo/attach/{key}\n"});
  // No storage in the gateway: every request reaches the upstream, with the scoped key.
  for (int i = 0; i < 2; ++i) {
    const HttpResponse r = Send(KeyedPost("/echo", "k-up"));
    EXPECT_EQ(r.status, 200);
    EXPECT_FALSE(r.HasHeader("Idempotent-Replayed"));
    auto echo = ParseObject(r.body);
    EXPECT_EQ(Values(EchoedHeaders(echo), "Idempotency-Key"), (std::vector<std::string>{"\"t-_:_:_:api:k-up\""}));
  }
  // Validation still applies.
  ExpectProblem(Send(KeyedPost("/echo", "")), 400, "missing-key");
  // Recovery names the key exactly as the upstream was sent it (the
  // sf-string, quotes included), which is what an upstream that keeps
  // outcomes by the header's value (Restate's ingress) looks up.
  const HttpResponse recovered = Send(HttpRequest{.target = "/by-idempotency-key/k-up"});
  EXPECT_EQ(recovered.status, 200);
  EXPECT_EQ(ParseObject(recovered.body)["target"], "/echo/attach/%22t-_%3A_%3A_%3Aapi%3Ak-up%22");
  EXPECT_EQ(Executions(), 3u);
}

// forward_key: raw sends the client's key in one spelling, whichever the
// client used ("K" and K are one key), and recovery names that same value.
TEST_F(IdempotencyTest, DedupUpstreamWithTheRawKeySendsOneSpellingAndRecoversIt) {
  Start({.idempotency = "{ policy: required, dedup: upstream, forward_key: raw }",
         .route_extra = "    recovery: true\n    recovery_upstream_path: /echo/attach/{key}\n"});
  HttpRequest bare = KeyedPost("/echo", "");
  bare.headers.push_back({"Idempotency-Key", "k-raw"});
  for (const HttpRequest& req : {KeyedPost("/echo", "k-raw"), bare}) {
    const HttpResponse r = Send(req);
    ASSERT_EQ(r.status, 200) << r.body;
    auto echo = ParseObject(r.body);
    EXPECT_EQ(Values(EchoedHeaders(echo), "Idempotency-Key"), (std::vector<std::string>{"\"k-raw\""}));
  }
  const HttpResponse recovered = Send(HttpRequest{.target = "/by-idempotency-key/k-raw"});
  EXPECT_EQ(recovered.status, 200);
  EXPECT_EQ(ParseObject(recovered.body)["target"], "/echo/attach/%22k-raw%22");
}

// Under dedup: upstream the upstream deduplicates by the key header, which
// the gateway sets to the scoped key: where it sets none (a method the route
// does not handle, a request without a key, a recovery request) a client's
// key header, its '_' and case look-alikes and its replay header never reach
// the upstream. Passed as sent, a key naming another caller's scoped key
// would be deduplicated there as that caller's.
TEST_F(IdempotencyTest, DedupUpstreamSendsNoClientKeyWhereTheGatewaySetsNone) {
  Start({.idempotency = "{ policy: optional, dedup: upstream, methods: [POST] }",
         .route_extra = "    recovery: true\n    recovery_upstream_path: /echo/attach/{key}\n"});
  const auto with_client_key = [](HttpRequest req, bool key_line = true) {
    if (key_line) req.headers.push_back({"Idempotency-Key", "\"t-acme:p1:user:alice:api:R9\""});
    req.headers.push_back({"Idempotency_Key", "t-acme:p1:user:alice:api:R9"});
    req.headers.push_back({"IDEMPOTENCY_key", "R9"});
    req.headers.push_back({"Idempotent-Replayed", "true"});
    return req;
  };
  const auto expect_no_client_key = [](const HttpResponse& r, const std::string& what) {
    ASSERT_EQ(r.status, 200) << what << ": " << r.body;
    auto echo = ParseObject(r.body);
    const auto seen = EchoedHeaders(echo);
    EXPECT_TRUE(Values(seen, "Idempotency-Key").empty()) << what;
    EXPECT_TRUE(Values(seen, "Idempotency_Key").empty()) << what;
    EXPECT_TRUE(Values(seen, "Idempotent-Replayed").empty()) << what;
  };
  for (const std::string method : {"PUT", "PATCH", "DELETE", "GET"}) {
    expect_no_client_key(Send(with_client_key(HttpRequest{.method = method, .target = "/echo"})), method);
  }
  // A POST without a key: nothing of the client's either (its look-alikes
  // and replay header).
  expect_no_client_key(Send(with_client_key(KeyedPost("/echo", ""), false)), "unkeyed POST");
  // Recovery: the upstream is asked for the caller's scoped key in the path,
  // and gets no key header of the client's.
  const HttpResponse recovered = Send(with_client_key(HttpRequest{.target = "/by-idempotency-key/k-up"}));
  expect_no_client_key(recovered, "recovery");
  EXPECT_EQ(ParseObject(recovered.body)["target"], "/echo/attach/%22t-_%3A_%3A_%3Aapi%3Ak-up%22");
  // A keyed POST still sends the scoped key alone.
  const HttpResponse r = Send(with_client_key(KeyedPost("/echo", "k-up"), false));
  ASSERT_EQ(r.status, 200) << r.body;
  auto echo = ParseObject(r.body);
  const auto seen = EchoedHeaders(echo);
  EXPECT_EQ(Values(seen, "Idempotency-Key"), (std::vector<std::string>{"\"t-_:_:_:api:k-up\""}));
  EXPECT_TRUE(Values(seen, "Idempotency_Key").empty());
  EXPECT_TRUE(Values(seen, "Idempotent-Replayed").empty());
}

// Header names that differ from the key header only by '_' for '-' are the
// same variable to CGI-style upstreams: they never reach the upstream where
// the gateway handles the key (beside its own scoped key, or instead of a
// key on an unkeyed request), and pass untouched where it does not.
TEST_F(IdempotencyTest, KeyHeaderLookalikesDoNotReachTheUpstream) {
  Start({.idempotency = "{ policy: optional }"});
  for (const std::string& key : {std::string("k-look"), std::string()}) {
    HttpRequest req = KeyedPost("/echo", key);
    req.headers.push_back({"Idempotency_Key", "t-victim:p:s:api:abc"});
    req.headers.push_back({"idempotency_key", "other"});
    const HttpResponse r = Send(req);
    ASSERT_EQ(r.status, 200) << r.body;
    auto echo = ParseObject(r.body);
    const auto seen = EchoedHeaders(echo);
    EXPECT_TRUE(Values(seen, "Idempotency_Key").empty()) << key;
    EXPECT_TRUE(Values(seen, "idempotency_key").empty()) << key;
  }
  // A method the route does not deduplicate: the request passes untouched.
  HttpRequest get{.method = "GET", .target = "/echo"};
  get.headers.push_back({"Idempotency_Key", "as-sent"});
  const HttpResponse r = Send(get);
  ASSERT_EQ(r.status, 200) << r.body;
  auto echo = ParseObject(r.body);
  EXPECT_EQ(Values(EchoedHeaders(echo), "Idempotency_Key"), (std::vector<std::string>{"as-sent"}));
}

// The recovery path holds the key itself, so a route whose charset allows
// ',' or ';' can recover such keys (the header needs the sf-string spelling
// for them); the sf-string spelling in the path still works for a plain key.
TEST_F(IdempotencyTest, RecoveryTakesTheKeyItselfFromThePath) {
  Start({.idempotency = "{ policy: required, key: { charset: \",;\" } }", .route_extra = "    recovery: true\n"});
  const HttpResponse first = Send(KeyedPost("/echo", "a,b;c"));
  ASSERT_EQ(first.status, 200) << first.body;
  const HttpResponse recovered = Send(HttpRequest{.target = "/by-idempotency-key/a%2Cb%3Bc"});
  EXPECT_EQ(recovered.status, 200) << recovered.body;
  EXPECT_EQ(recovered.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(recovered.body, first.body);
  ASSERT_EQ(Send(KeyedPost("/echo", "plain")).status, 200);
  EXPECT_EQ(Send(HttpRequest{.target = "/by-idempotency-key/%22plain%22"}).Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(Executions(), 2u);
}

TEST_F(IdempotencyTest, TrustedHeadersScopeKeysPerCaller) {
  Start({.idempotency = "{ policy: required, scope: subject }",
         .route_extra = "    recovery: true\n",
         .identity = "{ mode: trusted_headers }"});
  auto as = [](HttpRequest req, std::string tenant, std::string subject) {
    req.headers.push_back({"X-Tenant-Id", std::move(tenant)});
    req.headers.push_back({"X-Project-Id", "p1"});
    req.headers.push_back({"X-Subject", std::move(subject)});
    return req;
  };
  const HttpResponse alice = Send(as(KeyedPost("/echo", "shared-key"), "acme", "user:alice"));
  ASSERT_EQ(alice.status, 200) << alice.body;
  // Another subject, another tenant: the same raw key is another record, so each executes.
  const HttpResponse bob = Send(as(KeyedPost("/echo", "shared-key"), "acme", "user:bob"));
  EXPECT_EQ(bob.status, 200);
  EXPECT_FALSE(bob.HasHeader("Idempotent-Replayed"));
  const HttpResponse other = Send(as(KeyedPost("/echo", "shared-key"), "globex", "user:alice"));
  EXPECT_FALSE(other.HasHeader("Idempotent-Replayed"));
  EXPECT_EQ(Executions(), 3u);
  // The headers from the layer in front pass on; a client's look-alike
  // spellings, which CGI-style upstreams read as the same variables, do not.
  HttpRequest lookalikes = as(KeyedPost("/echo", "lookalike-key"), "acme", "user:alice");
  lookalikes.headers.push_back({"X_Tenant_Id", "globex"});
  lookalikes.headers.push_back({"X-Subject_", "user:root"});  // not a look-alike: another length
  lookalikes.headers.push_back({"x_project-ID", "p2"});
  const HttpResponse seen = Send(lookalikes);
  ASSERT_EQ(seen.status, 200) << seen.body;
  ExpectUpstreamIdentity(seen, "acme", "p1", "user:alice");
  auto seen_echo = ParseObject(seen.body);
  const auto seen_headers = EchoedHeaders(seen_echo);
  EXPECT_TRUE(Values(seen_headers, "X_Tenant_Id").empty());
  EXPECT_TRUE(Values(seen_headers, "x_project-ID").empty());
  EXPECT_EQ(Values(seen_headers, "X-Subject_"), (std::vector<std::string>{"user:root"}));
  EXPECT_EQ(Executions(), 4u);
  // Alice's retry is hers.
  const HttpResponse retry = Send(as(KeyedPost("/echo", "shared-key"), "acme", "user:alice"));
  EXPECT_EQ(retry.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(retry.body, alice.body);
  // Recovery too: Bob cannot read Alice's response; nobody without an identity can.
  const HttpResponse mallory = Send(as(HttpRequest{.target = "/by-idempotency-key/never-used"}, "acme", "user:bob"));
  ExpectProblem(mallory, 404, "not-found");
  const HttpResponse bob_reads = Send(as(HttpRequest{.target = "/by-idempotency-key/shared-key"}, "acme", "user:bob"));
  EXPECT_EQ(bob_reads.body, bob.body);
  EXPECT_NE(bob_reads.body, alice.body);
  const HttpResponse anonymous = Send(KeyedPost("/echo", "shared-key"));
  ExpectProblem(anonymous, 401, "unauthenticated");
  EXPECT_FALSE(anonymous.HasHeader("WWW-Authenticate"));  // authenticating is the front layer's business
  EXPECT_EQ(Executions(), 4u);
  // The log line names the caller and the namespaced key.
  EXPECT_NE(gateway_->Stdout().find(R"("idempotency_key_namespaced":"t-acme:p1:user:alice:api:shared-key")"),
            std::string::npos);
}

// The identity a request is scoped and stored under reaches the upstream
// whatever the client's Connection header names: the gateway sets the
// trusted headers' values as its own lines (as jwt and api_key set theirs),
// so they are not hop-by-hop fields of the client's to remove.
TEST_F(IdempotencyTest, TrustedHeadersReachTheUpstreamWhenConnectionNamesThem) {
  Start({.identity = "{ mode: trusted_headers, trusted_headers: { tenant: X-Org-Id } }"});
  HttpRequest req = KeyedPost("/echo", "named-in-connection");
  req.headers.push_back({"x-org-id", "acme"});
  req.headers.push_back({"X-Project-Id", "p1"});
  req.headers.push_back({"X-Subject", "user:alice"});
  req.headers.push_back({"Connection", "X-Org-Id, x-project-id"});
  req.headers.push_back({"Connection", "X-Subject"});
  // The default name of the one renamed header is not the caller's either.
  req.headers.push_back({"X-Tenant-Id", "evil"});
  req.headers.push_back({"X_Tenant_Id", "evil"});
  const HttpResponse res = Send(req);
  ASSERT_EQ(res.status, 200) << res.body;
  auto echo = ParseObject(res.body);
  const auto seen = EchoedHeaders(echo);
  EXPECT_EQ(Values(seen, "X-Org-Id"), (std::vector<std::string>{"acme"}));
  EXPECT_EQ(Values(seen, "X-Project-Id"), (std::vector<std::string>{"p1"}));
  EXPECT_EQ(Values(seen, "X-Subject"), (std::vector<std::string>{"user:alice"}));
  EXPECT_TRUE(Values(seen, "X-Tenant-Id").empty());
  EXPECT_TRUE(Values(seen, "X_Tenant_Id").empty());
  EXPECT_EQ(Values(seen, "Idempotency-Key"),
            (std::vector<std::string>{"\"t-acme:p1:user:alice:api:named-in-connection\""}));
}

}  // namespace
}  // namespace idemgate::testing
