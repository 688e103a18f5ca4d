#include "gateway/route_table.h"

#include <gtest/gtest.h>

namespace idemgate::gateway {
namespace {

config::Route MakeRoute(std::string id, std::string prefix, std::string exact = "",
                        std::vector<std::string> methods = {}, std::string upstream = "app") {
  config::Route r;
  r.id = std::move(id);
  r.match.path_prefix = std::move(prefix);
  r.match.path = std::move(exact);
  r.match.methods = std::move(methods);
  r.upstream = std::move(upstream);
  return r;
}

config::Config MakeConfig(std::vector<config::Route> routes) {
  config::Config c;
  config::Upstream app;
  app.name = "app";
  app.host = "127.0.0.1";
  app.port = 9000;
  c.upstreams["app"] = app;
  config::Upstream other = app;
  other.name = "other";
  c.upstreams["other"] = other;
  c.routes = std::move(routes);
  return c;
}

std::string MatchId(const RouteTable& t, std::string_view method, std::string_view path) {
  const RouteEntry* r = t.Match(method, path);
  return r == nullptr ? "<none>" : r->id;
}

TEST(RouteTableTest, PrefixMatchesAtSegmentBoundaries) {
  AdmissionRegistry admission;
  const auto config = MakeConfig({MakeRoute("pay", "/api/v1/payments")});
  auto table = RouteTable::Build(config, admission);
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  EXPECT_EQ(MatchId(*table, "POST", "/api/v1/payments"), "pay");
  EXPECT_EQ(MatchId(*table, "POST", "/api/v1/payments/"), "pay");
  EXPECT_EQ(MatchId(*table, "POST", "/api/v1/payments/42/refunds"), "pay");
  EXPECT_EQ(MatchId(*table, "POST", "/api/v1/paymentsX"), "<none>");
  EXPECT_EQ(MatchId(*table, "POST", "/api/v1/payment"), "<none>");
  EXPECT_EQ(MatchId(*table, "POST", "/API/v1/payments"), "<none>");
}

TEST(RouteTableTest, TrailingSlashOnPrefixIsIgnoredAndRootMatchesAll) {
  AdmissionRegistry admission;
  const auto config = MakeConfig({MakeRoute("api", "/api/"), MakeRoute("all", "/")});
  auto table = RouteTable::Build(config, admission);
  ASSERT_TRUE(table.ok());
  EXPECT_EQ(MatchId(*table, "GET", "/api"), "api");
  EXPECT_EQ(MatchId(*table, "GET", "/api/x"), "api");
  EXPECT_EQ(MatchId(*table, "GET", "/apix"), "all");
  EXPECT_EQ(MatchId(*table, "GET", "/"), "all");
  EXPECT_EQ(MatchId(*table, "GET", "/anything/else"), "all");
}

// An exact path also matches with one trailing slash, the same resource to
// most frameworks: a catch-all behind it must not take "/pay/" past the
// exact route's checks.
TEST(RouteTableTest, ExactPathMatchesItselfAndOneTrailingSlash) {
  AdmissionRegistry admission;
  const auto config = MakeConfig({MakeRoute("exact", "", "/health"), MakeRoute("rest", "/x")});
  auto table = RouteTable::Build(config, admission);
  ASSERT_TRUE(table.ok());
  EXPECT_EQ(MatchId(*table, "GET", "/health"), "exact");
  EXPECT_EQ(MatchId(*table, "GET", "/health/"), "exact");
  EXPECT_EQ(MatchId(*table, "GET", "/health//"), "<none>");
  EXPECT_EQ(MatchId(*table, "GET", "/health/x"), "<none>");
  EXPECT_EQ(MatchId(*table, "GET", "/healthz"), "<none>");
  const auto with_catch_all = MakeConfig({MakeRoute("pay", "", "/pay"), MakeRoute("all", "/")});
  auto second = RouteTable::Build(with_catch_all, admission);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(MatchId(*second, "POST", "/pay/"), "pay");
  EXPECT_EQ(MatchId(*second, "POST", "/pay/1"), "all");
  const auto root = MakeConfig({MakeRoute("root", "", "/")});
  auto third = RouteTable::Build(root, admission);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(MatchId(*third, "GET", "/"), "root");
  EXPECT_EQ(MatchId(*third, "GET", "/x"), "<none>");
}

TEST(RouteTableTest, FirstMatchWinsAndMethodsFilter) {
  AdmissionRegistry admission;
  const auto config = MakeConfig({MakeRoute("writes", "/orders", "", {"POST", "PATCH"}),
                                  MakeRoute("orders", "/orders", "", {}, "other"), MakeRoute("all", "/")});
  auto table = RouteTable::Build(config, admission);
  ASSERT_TRUE(table.ok());
  EXPECT_EQ(MatchId(*table, "POST", "/orders/1"), "writes");
  EXPECT_EQ(MatchId(*table, "PATCH", "/orders/1"), "writes");
  EXPECT_EQ(MatchId(*table, "GET", "/orders/1"), "orders");
  EXPECT_EQ(MatchId(*table, "post", "/orders/1"), "orders");  // methods are case-sensitive
  EXPECT_EQ(MatchId(*table, "GET", "/other"), "all");
  const RouteEntry* orders = table->Match("GET", "/orders");
  ASSERT_NE(orders, nullptr);
  EXPECT_EQ(table->upstreams()[orders->upstream_index], "other");
  EXPECT_EQ(orders->config, &config.routes[1]);
}

TEST(RouteTableTest, WebhookIdSegmentMatchesOneNonEmptySegment) {
  AdmissionRegistry admission;
  auto exact = MakeRoute("stripe", "", "/hooks/stripe/{webhook_id}");
  auto prefix = MakeRoute("github", "/hooks/github/{webhook_id}/");
  auto middle = MakeRoute("twilio", "", "/hooks/{webhook_id}/twilio");
  for (auto* r : {&exact, &prefix, &middle}) r->idempotency.policy = config::Policy::kWebhook;
  const auto config = MakeConfig({exact, prefix, middle});
  auto table = RouteTable::Build(config, admission);
  ASSERT_TRUE(table.ok()) << table.status().ToString();

  EXPECT_EQ(MatchId(*table, "POST", "/hooks/stripe/acme"), "stripe");
  EXPECT_EQ(MatchId(*table, "POST", "/hooks/stripe/"), "<none>");
  EXPECT_EQ(MatchId(*table, "POST", "/hooks/stripe"), "<none>");
  EXPECT_EQ(MatchId(*table, "POST", "/hooks/stripe/acme/"), "stripe");
  EXPECT_EQ(MatchId(*table, "POST", "/hooks/stripe/acme/x"), "<none>");
  EXPECT_EQ(MatchId(*table, "POST", "/hooks/github/acme"), "github");
  EXPECT_EQ(MatchId(*table, "POST", "/hooks/github/acme/events/1"), "github");
  EXPECT_EQ(MatchId(*table, "POST", "/hooks/github//events"), "<none>");
  EXPECT_EQ(MatchId(*table, "POST", "/hooks/acme/twilio"), "twilio");
  EXPECT_EQ(MatchId(*table, "POST", "/hooks/acme/twilio/"), "twilio");
  EXPECT_EQ(MatchId(*table, "POST", "/hooks/acme/twilio/x"), "<none>");
  EXPECT_EQ(MatchId(*table, "POST", "/hooks/acme/twilioX"), "<none>");

  const RouteEntry* r = table->Match("POST", "/hooks/github/acme-1/events");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->WebhookId("/hooks/github/acme-1/events"), "acme-1");
  EXPECT_EQ(table->Match("POST", "/hooks/x.y/twilio")->WebhookId("/hooks/x.y/twilio"), "x.y");
  // Routes without the segment have no id.
  const auto plain = MakeConfig({MakeRoute("api", "/api")});
  auto plain_table = RouteTable::Build(plain, admission);
  ASSERT_TRUE(plain_table.ok());
  EXPECT_EQ(plain_table->Match("POST", "/api/x")->WebhookId("/api/x"), "");
}

TEST(RouteTableTest, NoRouteWithoutCatchAll) {
  AdmissionRegistry admission;
  const auto config = MakeConfig({MakeRoute("a", "/a", "", {"GET"})});
  auto table = RouteTable::Build(config, admission);
  ASSERT_TRUE(table.ok());
  EXPECT_EQ(table->Match("POST", "/a"), nullptr);
  EXPECT_EQ(table->Match("GET", "/b"), nullptr);
}

TEST(RouteTableTest, UnknownUpstreamIsRefused) {
  AdmissionRegistry admission;
  const auto config = MakeConfig({MakeRoute("a", "/a", "", {}, "nowhere")});
  auto table = RouteTable::Build(config, admission);
  ASSERT_FALSE(table.ok());
  EXPECT_NE(table.status().message().find("nowhere"), std::string::npos);
}

TEST(RouteTableTest, BodyLimitAndAdmissionPerRoute) {
  AdmissionRegistry admission;
  auto limited = MakeRoute("limited", "/l");
  limited.max_request_bytes = 1234;
  limited.max_in_flight = 2;
  auto config = MakeConfig({limited, MakeRoute("free", "/")});
  config.limits.max_request_bytes = 999;
  auto table = RouteTable::Build(config, admission);
  ASSERT_TRUE(table.ok());
  const RouteEntry* l = table->Match("GET", "/l");
  const RouteEntry* f = table->Match("GET", "/f");
  ASSERT_NE(l, nullptr);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(l->max_request_bytes, 1234u);
  EXPECT_EQ(f->max_request_bytes, 999u);
  EXPECT_EQ(f->admission, nullptr);
  ASSERT_NE(l->admission, nullptr);
  EXPECT_TRUE(l->admission->TryAcquire());
  EXPECT_TRUE(l->admission->TryAcquire());
  EXPECT_FALSE(l->admission->TryAcquire());
  EXPECT_EQ(l->admission->in_flight(), 2u);

  // A rebuilt table (a reload) shares the counter, with the new limit.
  config.routes[0].max_in_flight = 3;
  auto reloaded = RouteTable::Build(config, admission);
  ASSERT_TRUE(reloaded.ok());
  const RouteEntry* l2 = reloaded->Match("GET", "/l");
  EXPECT_EQ(l2->admission.get(), l->admission.get());
  EXPECT_TRUE(l2->admission->TryAcquire());
  EXPECT_FALSE(l2->admission->TryAcquire());
  {
    AdmissionSlot a(l2->admission.get());
    AdmissionSlot b(std::move(a));
  }
  EXPECT_EQ(l2->admission->in_flight(), 2u);
}

TEST(RouteTableTest, PerTenantAdmissionCountsEachTenantApart) {
  AdmissionRegistry admission;
  auto limited = MakeRoute("limited", "/l");
  limited.max_in_flight_per_tenant = 2;
  auto config = MakeConfig({limited, MakeRoute("free", "/")});
  auto table = RouteTable::Build(config, admission);
  ASSERT_TRUE(table.ok());
  const RouteEntry* l = table->Match("GET", "/l");
  ASSERT_NE(l->tenant_admission, nullptr);
  EXPECT_EQ(table->Match("GET", "/f")->tenant_admission, nullptr);
  TenantAdmission& t = *l->tenant_admission;
  EXPECT_TRUE(t.TryAcquire("acme"));
  EXPECT_TRUE(t.TryAcquire("acme"));
  EXPECT_FALSE(t.TryAcquire("acme"));
  EXPECT_TRUE(t.TryAcquire("globex"));
  EXPECT_EQ(t.in_flight("acme"), 2u);
  EXPECT_EQ(t.in_flight("globex"), 1u);
  {
    TenantSlot a(&t, "globex");  // takes over the slot acquired above
    TenantSlot b(std::move(a));
  }
  EXPECT_EQ(t.in_flight("globex"), 0u);
  // A tenant's entry lives only while it has requests in flight.
  EXPECT_EQ(t.tenants(), 1u);
  t.Release("acme");
  t.Release("acme");
  EXPECT_EQ(t.tenants(), 0u);
  t.Release("nobody");  // a release without an acquire changes nothing
  EXPECT_EQ(t.tenants(), 0u);

  // A reload shares the admission, with the new limit.
  EXPECT_TRUE(t.TryAcquire("acme"));
  config.routes[0].max_in_flight_per_tenant = 1;
  auto reloaded = RouteTable::Build(config, admission);
  ASSERT_TRUE(reloaded.ok());
  const RouteEntry* l2 = reloaded->Match("GET", "/l");
  EXPECT_EQ(l2->tenant_admission.get(), &t);
  EXPECT_FALSE(t.TryAcquire("acme"));
  EXPECT_EQ(t.limit(), 1u);
}

}  // namespace
}  // namespace idemgate::gateway
