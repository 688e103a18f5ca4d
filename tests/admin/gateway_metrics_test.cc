#include "admin/gateway_metrics.h"

#include <gtest/gtest.h>

#include <new>
#include <string>
#include <thread>
#include <vector>

namespace idemgate::admin {
namespace {

bool Contains(const std::string& text, const std::string& line) {
  return text.find(line) != std::string::npos;
}

const MetricScope kPay{.route = "payments", .tenant = "acme", .project = "shop"};

TEST(GatewayMetrics, DeclaresEverySpecFamilyBeforeAnyEvent) {
  GatewayMetrics metrics;
  const std::string text = metrics.RenderPrometheus();
  for (const char* counter :
       {"idempotency_key_present_total", "idempotency_key_missing_total",
        "idempotency_key_invalid_total", "transport_translation_failed_total",
        "idempotency_cache_hit_total", "idempotency_cache_miss_total", "idempotency_wait_total", "idempotency_shared_total",
        "idempotency_conflict_total", "idempotency_reservation_released_total",
        "idempotency_stored_total", "idempotency_store_errors_total",
        "idempotency_lease_expired_total", "idempotency_fail_open_total"}) {
    EXPECT_TRUE(Contains(text, std::string("# TYPE ") + counter + " counter\n")) << counter;
    EXPECT_TRUE(Contains(text, std::string("# HELP ") + counter + " ")) << counter;
  }
  EXPECT_TRUE(Contains(text, "# TYPE idemgate_request_duration_seconds histogram\n"));
  EXPECT_TRUE(Contains(text, "# TYPE idemgate_upstream_duration_seconds histogram\n"));
  EXPECT_TRUE(
      Contains(text, "# TYPE idemgate_requests_in_flight gauge\nidemgate_requests_in_flight 0\n"));
  EXPECT_TRUE(
      Contains(text, "idemgate_build_info{version=\"" + std::string(BuildVersion()) + "\"} 1\n"));
  EXPECT_FALSE(BuildVersion().empty());
}

// lease_lost counts every completion refused because the reservation went, an admin purge too.
TEST(GatewayMetrics, LeaseLostHelpNamesEveryCause) {
  const std::string text = GatewayMetrics().RenderPrometheus();
  const std::size_t help = text.find("# HELP idempotency_conflict_total ");
  ASSERT_NE(help, std::string::npos);
  const std::string line = text.substr(help, text.find('\n', help) - help);
  for (const char* cause : {"lease_lost", "taken over", "purged by an admin", "lost by the store"}) {
    EXPECT_TRUE(Contains(line, cause)) << cause << " in " << line;
  }
}

// Both listeners' series exist from the start, so a rate() over them never
// starts from a missing series.
TEST(GatewayMetrics, RefusedConnectionsAreCountedFromZeroPerListener) {
  GatewayMetrics metrics;
  const std::string before = metrics.RenderPrometheus();
  EXPECT_TRUE(Contains(before, "\nidemgate_connections_refused_total{listener=\"data\"} 0\n")) << before;
  EXPECT_TRUE(Contains(before, "\nidemgate_connections_refused_total{listener=\"admin\"} 0\n")) << before;
  metrics.ConnectionRefused();
  metrics.ConnectionRefused();
  metrics.ConnectionRefused(GatewayMetrics::Listener::kAdmin);
  const std::string after = metrics.RenderPrometheus();
  EXPECT_TRUE(Contains(after, "\nidemgate_connections_refused_total{listener=\"data\"} 2\n")) << after;
  EXPECT_TRUE(Contains(after, "\nidemgate_connections_refused_total{listener=\"admin\"} 1\n")) << after;
}

TEST(GatewayMetrics, FailedTlsHandshakesAreCountedFromZeroPerListener) {
  GatewayMetrics metrics;
  const std::string before = metrics.RenderPrometheus();
  EXPECT_TRUE(Contains(before, "\nidemgate_tls_handshake_failures_total{listener=\"data\"} 0\n")) << before;
  EXPECT_TRUE(Contains(before, "\nidemgate_tls_handshake_failures_total{listener=\"admin\"} 0\n")) << before;
  metrics.TlsHandshakeFailed();
  metrics.TlsHandshakeFailed(GatewayMetrics::Listener::kAdmin);
  metrics.TlsHandshakeFailed(GatewayMetrics::Listener::kAdmin);
  const std::string after = metrics.RenderPrometheus();
  EXPECT_TRUE(Contains(after, "\nidemgate_tls_handshake_failures_total{listener=\"data\"} 1\n")) << after;
  EXPECT_TRUE(Contains(after, "\nidemgate_tls_handshake_failures_total{listener=\"admin\"} 2\n")) << after;
}

TEST(GatewayMetrics, TenantLabelsOnGiveTenantProjectRoute) {
  GatewayMetrics metrics(GatewayMetricsOptions{.tenant_labels = true, .version = "9.9.9"});
  metrics.CacheHit(kPay, 201);
  metrics.CacheHit(kPay, 201);
  metrics.LeaseExpired({.route = "payments"});  // no identity: "_"
  metrics.RequestCompleted(kPay, 0.003);
  const std::string text = metrics.RenderPrometheus();
  EXPECT_TRUE(Contains(text,
                       "idempotency_cache_hit_total{tenant=\"acme\",project=\"shop\",route="
                       "\"payments\",status=\"201\"} 2\n"));
  EXPECT_TRUE(Contains(
      text, "idempotency_lease_expired_total{tenant=\"_\",project=\"_\",route=\"payments\"} 1\n"));
  EXPECT_TRUE(Contains(text,
                       "idemgate_request_duration_seconds_bucket{tenant=\"acme\",project=\"shop\","
                       "route=\"payments\",le=\"0.0025\"} 0\n"
                       "idemgate_request_duration_seconds_bucket{tenant=\"acme\",project=\"shop\","
                       "route=\"payments\",le=\"0.005\"} 1\n"));
  EXPECT_TRUE(Contains(text, "idemgate_build_info{version=\"9.9.9\"} 1\n"));
}

TEST(GatewayMetrics, TenantLabelsOffGiveRouteOnly) {
  GatewayMetrics metrics(GatewayMetricsOptions{.tenant_labels = false});
  EXPECT_FALSE(metrics.tenant_labels());
  metrics.CacheHit(kPay, 200);
  metrics.KeyInvalid(kPay, "charset");
  metrics.UpstreamCompleted(kPay, 20);
  const std::string text = metrics.RenderPrometheus();
  EXPECT_TRUE(Contains(text, "idempotency_cache_hit_total{route=\"payments\",status=\"200\"} 1\n"));
  EXPECT_TRUE(
      Contains(text, "idempotency_key_invalid_total{route=\"payments\",reason=\"charset\"} 1\n"));
  EXPECT_TRUE(Contains(
      text, "idemgate_upstream_duration_seconds_bucket{route=\"payments\",le=\"+Inf\"} 1\n"));
  EXPECT_TRUE(Contains(text, "idemgate_upstream_duration_seconds_sum{route=\"payments\"} 20\n"));
  EXPECT_FALSE(Contains(text, "tenant="));
}

struct EventCase {
  const char* name;
  void (*fire)(GatewayMetrics&);
  const char* line;                    // expected exposition line (route-only labels)
  std::uint64_t RouteStatsRow::*stat;  // the stats field it bumps, or null
};

TEST(GatewayMetrics, EachEventFeedsItsMetricAndStat) {
  const EventCase cases[] = {
      {"KeyPresent", [](GatewayMetrics& m) { m.KeyPresent(kPay, "REQUIRED_A"); },
       "idempotency_key_present_total{route=\"payments\",case=\"REQUIRED_A\"} 1", nullptr},
      {"KeyMissing", [](GatewayMetrics& m) { m.KeyMissing(kPay, "required"); },
       "idempotency_key_missing_total{route=\"payments\",class=\"required\"} 1",
       &RouteStatsRow::invalid},
      {"KeyInvalid", [](GatewayMetrics& m) { m.KeyInvalid(kPay, "too_long"); },
       "idempotency_key_invalid_total{route=\"payments\",reason=\"too_long\"} 1",
       &RouteStatsRow::invalid},
      {"TranslationFailed", [](GatewayMetrics& m) { m.TranslationFailed(kPay, "stripe"); },
       "transport_translation_failed_total{route=\"payments\",provider=\"stripe\"} 1",
       &RouteStatsRow::invalid},
      {"CacheHit", [](GatewayMetrics& m) { m.CacheHit(kPay, 404); },
       "idempotency_cache_hit_total{route=\"payments\",status=\"404\"} 1", &RouteStatsRow::hits},
      {"CacheMiss", [](GatewayMetrics& m) { m.CacheMiss(kPay); },
       "idempotency_cache_miss_total{route=\"payments\"} 1", &RouteStatsRow::misses},
      {"Waited", [](GatewayMetrics& m) { m.Waited(kPay); },
       "idempotency_wait_total{route=\"payments\"} 1", &RouteStatsRow::waits},
      {"ConflictInFlight", [](GatewayMetrics& m) { m.Conflict(kPay, ConflictReason::kInFlight); },
       "idempotency_conflict_total{route=\"payments\",reason=\"in_flight\"} 1",
       &RouteStatsRow::conflicts},
      {"ConflictWaitTimeout",
       [](GatewayMetrics& m) { m.Conflict(kPay, ConflictReason::kWaitTimeout); },
       "idempotency_conflict_total{route=\"payments\",reason=\"wait_timeout\"} 1",
       &RouteStatsRow::conflicts},
      {"ConflictLeaseLost", [](GatewayMetrics& m) { m.Conflict(kPay, ConflictReason::kLeaseLost); },
       "idempotency_conflict_total{route=\"payments\",reason=\"lease_lost\"} 1",
       &RouteStatsRow::conflicts},
      {"ConflictMismatch",
       [](GatewayMetrics& m) { m.Conflict(kPay, ConflictReason::kFingerprintMismatch); },
       "idempotency_conflict_total{route=\"payments\",reason=\"fingerprint_mismatch\"} 1",
       &RouteStatsRow::mismatches},
      {"Released",
       [](GatewayMetrics& m) { m.ReservationReleased(kPay, core::ReleaseReason::kAdmission); },
       "idempotency_reservation_released_total{route=\"payments\",reason=\"admission\"} 1",
       nullptr},
      {"Stored", [](GatewayMetrics& m) { m.Stored(kPay); },
       "idempotency_stored_total{route=\"payments\"} 1", &RouteStatsRow::stored},
      {"StoreError", [](GatewayMetrics& m) { m.StoreError(kPay, StoreOp::kReserve); },
       "idempotency_store_errors_total{route=\"payments\",op=\"reserve\"} 1",
       &RouteStatsRow::store_errors},
      {"LeaseExpired", [](GatewayMetrics& m) { m.LeaseExpired(kPay); },
       "idempotency_lease_expired_total{route=\"payments\"} 1", nullptr},
      {"FailOpen", [](GatewayMetrics& m) { m.FailOpen(kPay); },
       "idempotency_fail_open_total{route=\"payments\"} 1", nullptr},
      {"RequestCompleted", [](GatewayMetrics& m) { m.RequestCompleted(kPay, 0.5); },
       "idemgate_request_duration_seconds_count{route=\"payments\"} 1", &RouteStatsRow::requests},
  };
  for (const EventCase& c : cases) {
    GatewayMetrics metrics(GatewayMetricsOptions{.tenant_labels = false});
    c.fire(metrics);
    EXPECT_TRUE(Contains(metrics.RenderPrometheus(), std::string(c.line) + "\n")) << c.name;
    const auto rows = metrics.stats().Snapshot();
    ASSERT_EQ(rows.size(), c.stat == nullptr ? 0u : 1u) << c.name;
    if (c.stat != nullptr) {
      RouteStatsRow expected;
      expected.route = "payments";
      expected.*(c.stat) = 1;
      EXPECT_EQ(rows[0], expected) << c.name;
    }
  }
}

TEST(GatewayMetrics, ReasonNamesAreStable) {
  EXPECT_EQ(ConflictReasonName(ConflictReason::kInFlight), "in_flight");
  EXPECT_EQ(ConflictReasonName(ConflictReason::kWaitTimeout), "wait_timeout");
  EXPECT_EQ(ConflictReasonName(ConflictReason::kFingerprintMismatch), "fingerprint_mismatch");
  EXPECT_EQ(ConflictReasonName(ConflictReason::kLeaseLost), "lease_lost");
  EXPECT_EQ(StoreOpName(StoreOp::kReserve), "reserve");
  EXPECT_EQ(StoreOpName(StoreOp::kComplete), "complete");
  EXPECT_EQ(StoreOpName(StoreOp::kRelease), "release");
  EXPECT_EQ(StoreOpName(StoreOp::kGet), "get");
  EXPECT_EQ(StoreOpName(StoreOp::kPurge), "purge");
  EXPECT_EQ(StoreOpName(StoreOp::kWatch), "watch");
  EXPECT_EQ(StoreOpName(StoreOp::kPing), "ping");
}

TEST(GatewayMetrics, ReleasedUsesCoreReasonNamesAndSkipsNone) {
  GatewayMetrics metrics(GatewayMetricsOptions{.tenant_labels = false});
  metrics.ReservationReleased(kPay, core::ReleaseReason::kNone);
  metrics.ReservationReleased(kPay, core::ReleaseReason::kUpstreamConnect);
  metrics.ReservationReleased(kPay, core::ReleaseReason::kUpstreamConnect);
  const std::string text = metrics.RenderPrometheus();
  EXPECT_TRUE(Contains(text,
                       "idempotency_reservation_released_total{route=\"payments\",reason="
                       "\"upstream_connect\"} 2\n"));
  EXPECT_FALSE(Contains(text, "reason=\"\""));
}

TEST(GatewayMetrics, RegisterRouteShowsZeros) {
  GatewayMetrics metrics;
  metrics.RegisterRoute("payments");
  const auto rows = metrics.stats().Snapshot();
  ASSERT_EQ(rows.size(), 1u);
  RouteStatsRow expected;
  expected.route = "payments";
  EXPECT_EQ(rows[0], expected);
}

TEST(GatewayMetrics, StoreGaugesReadTheSourceAtScrape) {
  GatewayMetrics metrics;
  core::StoreStats stats{.keys = 7, .bytes = 1024};
  metrics.SetStoreStatsSource([&] { return stats; });
  std::string text = metrics.RenderPrometheus();
  EXPECT_TRUE(Contains(text, "\nidemgate_store_keys 7\n"));
  EXPECT_TRUE(Contains(text, "\nidemgate_store_bytes 1024\n"));
  stats.keys = 9;
  EXPECT_TRUE(Contains(metrics.RenderPrometheus(), "\nidemgate_store_keys 9\n"));
  metrics.SetStoreStatsSource(nullptr);
  text = metrics.RenderPrometheus();
  EXPECT_FALSE(Contains(text, "idemgate_store_keys"));
}

TEST(GatewayMetrics, InFlightGuardCountsItsLifetime) {
  GatewayMetrics metrics;
  {
    GatewayMetrics::InFlightGuard a(metrics);
    GatewayMetrics::InFlightGuard b(metrics);
    EXPECT_EQ(metrics.requests_in_flight().Value(), 2);
    GatewayMetrics::InFlightGuard moved(std::move(a));
    EXPECT_EQ(metrics.requests_in_flight().Value(), 2);
  }
  EXPECT_EQ(metrics.requests_in_flight().Value(), 0);
}

// Each thread caches the series of the scopes it saw last, in fewer slots
// than scopes here: interleaved events of many scopes (colliding in the
// cache) still land on their own series, and an extra label that changes
// (status, reason) is not taken for the one before.
TEST(GatewayMetrics, InterleavedScopesAndExtraLabelsKeepTheirOwnSeries) {
  GatewayMetrics metrics;
  constexpr int kScopes = 100;
  std::vector<std::string> routes, tenants;
  for (int i = 0; i < kScopes; ++i) {
    routes.push_back("r" + std::to_string(i % 10));
    tenants.push_back("t" + std::to_string(i / 10));
  }
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < kScopes; ++i) {
      const MetricScope scope{.route = routes[i], .tenant = tenants[i], .project = "p"};
      for (int k = 0; k <= i % 3; ++k) metrics.CacheMiss(scope);
      metrics.CacheHit(scope, 200 + i % 2);
      metrics.CacheHit(scope, 200);
      metrics.Conflict(scope, ConflictReason::kInFlight);
      metrics.Conflict(scope, ConflictReason::kFingerprintMismatch);
    }
  }
  const std::string text = metrics.RenderPrometheus();
  for (int i = 0; i < kScopes; ++i) {
    const std::string labels =
        "{tenant=\"" + tenants[i] + "\",project=\"p\",route=\"" + routes[i] + "\"";
    EXPECT_TRUE(Contains(text, "idempotency_cache_miss_total" + labels + "} " +
                                   std::to_string(3 * (i % 3 + 1)) + "\n"))
        << labels;
    if (i % 2 == 0) {
      EXPECT_TRUE(Contains(text, "idempotency_cache_hit_total" + labels + ",status=\"200\"} 6\n"))
          << labels;
      EXPECT_FALSE(Contains(text, "idempotency_cache_hit_total" + labels + ",status=\"201\"}"))
          << labels;
    } else {
      EXPECT_TRUE(Contains(text, "idempotency_cache_hit_total" + labels + ",status=\"200\"} 3\n"))
          << labels;
      EXPECT_TRUE(Contains(text, "idempotency_cache_hit_total" + labels + ",status=\"201\"} 3\n"))
          << labels;
    }
    EXPECT_TRUE(
        Contains(text, "idempotency_conflict_total" + labels + ",reason=\"in_flight\"} 3\n"))
        << labels;
    EXPECT_TRUE(Contains(
        text, "idempotency_conflict_total" + labels + ",reason=\"fingerprint_mismatch\"} 3\n"))
        << labels;
  }
  // Route stats: each route saw 10 scopes (tenants) x 3 rounds of hits.
  for (const RouteStatsRow& row : metrics.stats().Snapshot()) EXPECT_EQ(row.hits, 60u) << row.route;
}

// A GatewayMetrics made where an earlier one was (same address, same thread)
// never sees the earlier one's cached series.
TEST(GatewayMetrics, ANewObjectDoesNotReuseAnEarlierObjectsCachedSeries) {
  alignas(GatewayMetrics) unsigned char storage[sizeof(GatewayMetrics)];
  auto* first = new (storage) GatewayMetrics();
  first->CacheMiss(kPay);
  first->Stored(kPay);
  first->~GatewayMetrics();
  auto* second = new (storage) GatewayMetrics();
  second->CacheMiss(kPay);
  const std::string text = second->RenderPrometheus();
  EXPECT_TRUE(Contains(
      text, "idempotency_cache_miss_total{tenant=\"acme\",project=\"shop\",route=\"payments\"} 1\n"));
  const auto rows = second->stats().Snapshot();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].misses, 1u);
  EXPECT_EQ(rows[0].stored, 0u);
  second->~GatewayMetrics();
}

TEST(GatewayMetrics, ConcurrentEventsFromFourThreadsAddUp) {
  GatewayMetrics metrics;
  constexpr int kPerThread = 20'000;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const std::string tenant = "tenant" + std::to_string(t % 2);
      for (int i = 0; i < kPerThread; ++i) {
        GatewayMetrics::InFlightGuard guard(metrics);
        metrics.CacheHit({.route = "payments", .tenant = tenant, .project = "p"}, 200);
        metrics.RequestCompleted({.route = "payments", .tenant = tenant, .project = "p"}, 0.001);
      }
    });
  }
  for (auto& th : threads) th.join();
  const std::string text = metrics.RenderPrometheus();
  const std::string each = std::to_string(2 * kPerThread);
  EXPECT_TRUE(
      Contains(text,
               "idempotency_cache_hit_total{tenant=\"tenant0\",project=\"p\",route=\"payments\","
               "status=\"200\"} " +
                   each + "\n"));
  EXPECT_TRUE(
      Contains(text,
               "idempotency_cache_hit_total{tenant=\"tenant1\",project=\"p\",route=\"payments\","
               "status=\"200\"} " +
                   each + "\n"));
  EXPECT_TRUE(Contains(text,
                       "idemgate_request_duration_seconds_count{tenant=\"tenant1\",project=\"p\","
                       "route=\"payments\"} " +
                           each + "\n"));
  const auto rows = metrics.stats().Snapshot();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].hits, 4u * kPerThread);
  EXPECT_EQ(rows[0].requests, 4u * kPerThread);
  EXPECT_EQ(metrics.requests_in_flight().Value(), 0);
}

}  // namespace
}  // namespace idemgate::admin
