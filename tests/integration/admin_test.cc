// Integration tests of the admin listener (SPEC §9, docs/operations.md "Admin
// API" and "Signals") with the real idemgate binary in front of
// fake_upstream: HEAD probes, 405 for other methods, a purge refused while
// the key's request runs, and the admin listener serving through the drain
// that follows SIGTERM.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "integration/harness.h"

namespace idemgate::testing {
namespace {

using namespace std::chrono_literals;

class AdminTest : public GatewaySuite {
 protected:
  void StartPassthrough() {
    StartGateway(GatewayConfigHead(fake_endpoint_) +
                 "  - id: api\n    match: { path_prefix: / }\n    upstream: fake\n"
                 "    idempotency: { policy: passthrough }\n");
  }
};

// Load balancers probe with HEAD: the same status and headers as GET, no body.
TEST_F(AdminTest, HeadProbesAnswerLikeGetWithoutABody) {
  StartPassthrough();
  HttpClient admin(gateway_->admin(), 10s);
  for (const std::string target : {"/healthz", "/readyz", "/metrics"}) {
    auto get = admin.Send(HttpRequest{.method = "GET", .target = target});
    auto head = admin.Send(HttpRequest{.method = "HEAD", .target = target});
    ASSERT_TRUE(get.ok()) << get.status().ToString();
    ASSERT_TRUE(head.ok()) << head.status().ToString();
    EXPECT_EQ(head->status, 200) << target;
    EXPECT_EQ(head->body, "") << target;
    EXPECT_EQ(head->Header("Content-Type"), get->Header("Content-Type")) << target;
    EXPECT_EQ(head->Header("Cache-Control"), "no-store") << target;
    EXPECT_TRUE(head->keep_alive) << target;
  }
  auto healthz = admin.Send(HttpRequest{.method = "HEAD", .target = "/healthz"});
  ASSERT_TRUE(healthz.ok());
  EXPECT_EQ(healthz->Header("Content-Length"), "2");  // of the GET body "ok"
  // All of it on the one connection: a HEAD answer carries no body to misread.
  EXPECT_EQ(admin.connections_opened(), 1);
}

TEST_F(AdminTest, OtherMethodsOnAdminPathsAre405WithAllow) {
  StartPassthrough();
  for (const auto& [method, target, allow] :
       {std::tuple{"POST", "/healthz", "GET, HEAD"}, std::tuple{"PUT", "/readyz", "GET, HEAD"},
        std::tuple{"DELETE", "/metrics", "GET, HEAD"}, std::tuple{"POST", "/admin/keys/t-a:b:c:d:e", "GET, HEAD, DELETE"}}) {
    auto res = SendRequest(gateway_->admin(), HttpRequest{.method = method, .target = target}, 10s);
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    ExpectProblem(*res, 405, "method-not-allowed");
    EXPECT_EQ(res->Header("Allow"), allow) << method << " " << target;
  }
  auto unknown = SendRequest(gateway_->admin(), HttpRequest{.method = "POST", .target = "/nope"}, 10s);
  ASSERT_TRUE(unknown.ok()) << unknown.status().ToString();
  ExpectProblem(*unknown, 404, "not-found");
}

// The admin listener serves at most 256 connections at once (not counted in
// limits.max_connections): one more is closed as soon as it is accepted, and a
// slot frees when an open connection closes.
TEST_F(AdminTest, AdminConnectionsBeyondTheirBoundAreClosedAtOnce) {
  StartPassthrough();
  std::vector<RawConnection> open;
  for (int i = 0; i < 256; ++i) {
    auto conn = RawConnection::Connect(gateway_->admin());
    ASSERT_TRUE(conn.ok()) << i << ": " << conn.status().ToString();
    open.push_back(std::move(*conn));
  }
  auto extra = RawConnection::Connect(gateway_->admin());
  ASSERT_TRUE(extra.ok()) << extra.status().ToString();
  auto read = extra->ReadSome(5s);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, "");
  EXPECT_TRUE(extra->closed());
  // The first ones are still open, and served.
  ASSERT_TRUE(open.front().Write("GET /healthz HTTP/1.1\r\nHost: admin\r\n\r\n").ok());
  auto served = open.front().ReadSome(5s);
  ASSERT_TRUE(served.ok()) << served.status().ToString();
  EXPECT_EQ(served->rfind("HTTP/1.1 200", 0), 0u) << *served;
  EXPECT_NE(gateway_->Stdout().find("\"limit\":\"admin listener\""), std::string::npos) << gateway_->Stdout();

  // A closed connection gives its slot back.
  open.back().Close();
  const bool admitted = PollUntil(
      [&] {
        auto again = RawConnection::Connect(gateway_->admin());
        if (!again.ok() || !again->Write("GET /healthz HTTP/1.1\r\nHost: admin\r\n\r\n").ok()) return false;
        auto answer = again->ReadSome(2s);
        return answer.ok() && answer->rfind("HTTP/1.1 200", 0) == 0;
      },
      10s, 20ms);
  EXPECT_TRUE(admitted);
  // The data path was never limited by the admin listener's bound.
  EXPECT_EQ(Send(HttpRequest{.method = "GET", .target = "/echo/x"}).status, 200);
  // The refusal is counted under the admin listener (with the connections
  // the poll above may have had refused while the slot was freeing).
  open.clear();
  auto page = SendRequest(gateway_->admin(), HttpRequest{.target = "/metrics"}, 5s);
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  EXPECT_GE(MetricValue(page->body, "idemgate_connections_refused_total{listener=\"admin\"}").value_or(0), 1.0)
      << page->body;
  EXPECT_EQ(MetricValue(page->body, "idemgate_connections_refused_total{listener=\"data\"}"),
            std::optional<double>(0.0));
}

// docs/operations.md: DELETE /admin/keys/{key} refuses a key whose request is still running (409
// key-in-flight), so a duplicate waiting on it gets the original's response and the upstream runs the
// request once; without the refusal the duplicate would run it a second time beside the original.
TEST_F(AdminTest, PurgeOfAKeyInFlightIsRefusedAndTheRequestRunsOnce) {
  StartGateway(GatewayConfigHead(fake_endpoint_, {.admin = "{ listen: 127.0.0.1:0, token_env: TEST_ADMIN_TOKEN }"}) +
                   "  - id: api\n    match: { path_prefix: / }\n    upstream: fake\n"
                   "    idempotency: { policy: required, in_flight: wait, wait_timeout: 20s }\n",
               {{"TEST_ADMIN_TOKEN", "s3cret"}});
  const HttpRequest keyed{.method = "POST",
                          .target = "/slow?ms=3000",
                          .headers = {{"Idempotency-Key", "\"k-purge\""}, {"Content-Type", "application/json"}},
                          .body = "{}"};
  const HttpRequest purge{.method = "DELETE",
                          .target = "/admin/keys/t-_:_:_:api:k-purge",
                          .headers = {{"Authorization", "Bearer s3cret"}}};
  std::optional<StatusOr<HttpResponse>> original, duplicate;
  std::jthread first([&] { original.emplace(SendRequest(gateway_->endpoint(), keyed, 30s)); });
  ASSERT_TRUE(PollUntil([&] { return Executions() >= 1; }, 10s, 20ms));

  auto refused = SendRequest(gateway_->admin(), purge, 10s);
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  ExpectProblem(*refused, 409, "key-in-flight");
  EXPECT_TRUE(refused->Header("Retry-After").has_value());
  std::jthread second([&] { duplicate.emplace(SendRequest(gateway_->endpoint(), keyed, 30s)); });
  first.join();
  second.join();
  ASSERT_TRUE(original.has_value() && original->ok());
  ASSERT_TRUE(duplicate.has_value() && duplicate->ok());
  EXPECT_EQ((*original)->status, 200);
  EXPECT_EQ((*duplicate)->status, 200);
  EXPECT_EQ((*duplicate)->body, (*original)->body);
  EXPECT_EQ(Executions(), 1u);

  // Completed, the key is purged without force.
  auto purged = SendRequest(gateway_->admin(), purge, 10s);
  ASSERT_TRUE(purged.ok()) << purged.status().ToString();
  EXPECT_EQ(purged->status, 200);
  EXPECT_EQ(purged->body, "{\"purged\":true,\"state\":\"completed\"}\n");
}

// docs/operations.md: while draining after SIGTERM, /readyz answers 503 shutting-down and /healthz
// stays 200 — on new connections and on keep-alive ones — until the in-flight requests are done;
// then the admin listener goes too and the process exits 0.
TEST_F(AdminTest, AdminListenerServesThroughTheDrainThenStops) {
  StartPassthrough();
  const HostPort admin_endpoint = gateway_->admin();
  HttpClient kept(admin_endpoint, 10s);
  auto before = kept.Send(HttpRequest{.target = "/readyz"});
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  ASSERT_EQ(before->status, 200) << before->body;
  ASSERT_TRUE(kept.connected());

  std::optional<StatusOr<HttpResponse>> slow;
  // Joined on every way out of the test, an ASSERT's early return included.
  std::jthread client([&] {
    slow.emplace(SendRequest(gateway_->endpoint(), HttpRequest{.target = "/slow?ms=3000"}, 30s));
  });
  const bool reached = PollUntil([&] { return Executions() >= 1; }, 10s, 20ms);
  ASSERT_TRUE(reached);
  ASSERT_TRUE(gateway_->process().Signal(SIGTERM).ok());
  // The gateway has taken the signal once the data listener refuses connections.
  const bool draining = PollUntil(
      [&] { return !SendRequest(gateway_->endpoint(), HttpRequest{.target = "/echo"}, 1s).ok(); }, 5s, 20ms);
  EXPECT_TRUE(draining);

  // The keep-alive connection opened before SIGTERM still serves.
  auto ready = kept.Send(HttpRequest{.target = "/readyz"});
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  ExpectProblem(*ready, 503, "shutting-down");
  auto health = kept.Send(HttpRequest{.target = "/healthz"});
  ASSERT_TRUE(health.ok()) << health.status().ToString();
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(health->body, "ok");
  EXPECT_EQ(kept.connections_opened(), 1);
  // So do new connections, HEAD probes and the metrics.
  auto fresh_ready = SendRequest(admin_endpoint, HttpRequest{.target = "/readyz"}, 5s);
  ASSERT_TRUE(fresh_ready.ok()) << fresh_ready.status().ToString();
  ExpectProblem(*fresh_ready, 503, "shutting-down");
  auto head_ready = SendRequest(admin_endpoint, HttpRequest{.method = "HEAD", .target = "/readyz"}, 5s);
  ASSERT_TRUE(head_ready.ok()) << head_ready.status().ToString();
  EXPECT_EQ(head_ready->status, 503);
  auto fresh_health = SendRequest(admin_endpoint, HttpRequest{.method = "HEAD", .target = "/healthz"}, 5s);
  ASSERT_TRUE(fresh_health.ok()) << fresh_health.status().ToString();
  EXPECT_EQ(fresh_health->status, 200);
  auto metrics = SendRequest(admin_endpoint, HttpRequest{.target = "/metrics"}, 5s);
  ASSERT_TRUE(metrics.ok()) << metrics.status().ToString();
  EXPECT_EQ(metrics->status, 200);
  EXPECT_EQ(MetricValue(metrics->body, "idemgate_requests_in_flight"), 1.0) << metrics->body;

  // The in-flight request was finished, not cut.
  client.join();
  ASSERT_TRUE(slow.has_value());
  ASSERT_TRUE(slow->ok()) << slow->status().ToString();
  EXPECT_EQ((*slow)->status, 200);
  auto exit = gateway_->process().WaitExit(30s);
  ASSERT_TRUE(exit.has_value()) << "idemgate still running 30s after SIGTERM";
  EXPECT_TRUE(exit->exited && exit->code == 0) << exit->ToString();
  // Gone with the process: nothing answers on the admin address any more.
  EXPECT_FALSE(SendRequest(admin_endpoint, HttpRequest{.target = "/healthz"}, 2s).ok());
}

}  // namespace
}  // namespace idemgate::testing
