#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include "admin/metrics.h"
#include "admin/stats.h"
#include "core/decision.h"
#include "core/store.h"

// The gateway's metrics (SPEC §9) behind one method per event, so callers
// never spell a metric name or a label. Every event method is thread-safe,
// never throws, and costs a per-thread cache lookup plus a few relaxed atomic
// adds: each thread keeps the resolved series of the (tenant, project, route)
// scopes it reported for recently, so the events of one request resolve their
// labels once. docs/operations.md lists every metric with its labels and meaning.
namespace idemgate::admin {

// Metric names, for tests and tools; callers use the GatewayMetrics methods.
namespace metric_names {
inline constexpr std::string_view kKeyPresent = "idempotency_key_present_total";
inline constexpr std::string_view kKeyMissing = "idempotency_key_missing_total";
inline constexpr std::string_view kKeyInvalid = "idempotency_key_invalid_total";
inline constexpr std::string_view kTranslationFailed = "transport_translation_failed_total";
inline constexpr std::string_view kCacheHit = "idempotency_cache_hit_total";
inline constexpr std::string_view kCacheMiss = "idempotency_cache_miss_total";
inline constexpr std::string_view kWait = "idempotency_wait_total";
inline constexpr std::string_view kShared = "idempotency_shared_total";
inline constexpr std::string_view kConflict = "idempotency_conflict_total";
inline constexpr std::string_view kReservationReleased = "idempotency_reservation_released_total";
inline constexpr std::string_view kStored = "idempotency_stored_total";
inline constexpr std::string_view kStoreErrors = "idempotency_store_errors_total";
inline constexpr std::string_view kLeaseExpired = "idempotency_lease_expired_total";
inline constexpr std::string_view kFailOpen = "idempotency_fail_open_total";
inline constexpr std::string_view kRequestDuration = "idemgate_request_duration_seconds";
inline constexpr std::string_view kUpstreamDuration = "idemgate_upstream_duration_seconds";
inline constexpr std::string_view kRequestsInFlight = "idemgate_requests_in_flight";
inline constexpr std::string_view kRequestsRefused = "idemgate_requests_refused_total";
inline constexpr std::string_view kConnectionsRefused = "idemgate_connections_refused_total";
inline constexpr std::string_view kTlsHandshakeFailures = "idemgate_tls_handshake_failures_total";
inline constexpr std::string_view kBuildInfo = "idemgate_build_info";
inline constexpr std::string_view kStoreKeys = "idemgate_store_keys";
inline constexpr std::string_view kStoreBytes = "idemgate_store_bytes";
inline constexpr std::string_view kStoreBodiesDropped = "idemgate_store_bodies_dropped_total";
}  // namespace metric_names

// Who an event is about. The views need only live for the call. An empty
// tenant or project is reported as "_" (the value SPEC §3.1 uses for "none").
struct MetricScope {
  std::string_view route;
  std::string_view tenant;
  std::string_view project;
};

// `reason` of idempotency_conflict_total.
enum class ConflictReason {
  kInFlight,             // "in_flight": 409 request-in-flight, in_flight: reject
  kWaitTimeout,          // "wait_timeout": 409 after in_flight: wait timed out
  kFingerprintMismatch,  // "fingerprint_mismatch": 422 key-reused
  kLeaseLost,            // "lease_lost": a completion refused because the reservation is gone
                         // (taken over, purged by an admin, lost by the store)
};

// `op` of idempotency_store_errors_total.
enum class StoreOp { kReserve, kComplete, kRelease, kGet, kPurge, kWatch, kPing };

// The route label of store errors made by the admin listener: parentheses
// are not allowed in route ids, so it names no configured route.
inline constexpr std::string_view kAdminRoute = "(admin)";

std::string_view ConflictReasonName(ConflictReason reason);
std::string_view StoreOpName(StoreOp op);
// The version compiled in (the CMake project version).
std::string_view BuildVersion();

struct GatewayMetricsOptions {
  // metrics.tenant_labels: label the idempotency families and histograms with
  // (tenant, project, route) instead of route only. Fixed for the life of the
  // object (a config reload cannot change label names; restart to change it).
  bool tenant_labels = true;
  // Value of idemgate_build_info{version}; empty: BuildVersion().
  std::string version;
  // Label sets per family beyond which events count into the "_overflow" series.
  std::size_t max_series_per_family = 10'000;
};

class GatewayMetrics {
 public:
  explicit GatewayMetrics(GatewayMetricsOptions options = {});
  ~GatewayMetrics();
  GatewayMetrics(const GatewayMetrics&) = delete;
  GatewayMetrics& operator=(const GatewayMetrics&) = delete;

  // Makes `route` appear in /admin/stats (with zeros) before its first request.
  void RegisterRoute(std::string_view route);

  // Every request, once, when its response has been sent (or the client has
  // gone): request duration histogram; stats `requests`.
  void RequestCompleted(const MetricScope& scope, double seconds);
  // Every upstream exchange, from connect to the end of the response.
  void UpstreamCompleted(const MetricScope& scope, double seconds);
  // A request the server refused before routing (http::RefusedRequest):
  // `reason` is "bad_request", "uri_too_long", "headers_too_large",
  // "version_not_supported" or "header_timeout". Not in the route stats (no route).
  void RequestRefused(std::string_view reason);
  // Which listener a connection-level event happened on: the `listener` label
  // of idemgate_connections_refused_total and
  // idemgate_tls_handshake_failures_total ("data" for `listen`, "admin" for
  // `admin.listen`).
  enum class Listener { kData, kAdmin };
  // A client connection closed as soon as it was accepted because the
  // listener's connection limit was reached (http::Handler::ConnectionRefused).
  void ConnectionRefused(Listener listener = Listener::kData);
  // A client's TLS handshake failed or timed out
  // (http::Handler::TlsHandshakeFailed).
  void TlsHandshakeFailed(Listener listener = Listener::kData);

  // A request carried a usable key (or the webhook translation produced one);
  // `idempotency_case` is the policy's case name (e.g. "REQUIRED_A").
  void KeyPresent(const MetricScope& scope, std::string_view idempotency_case);
  // No key on a route that needs one; `missing_class` says which kind of
  // route ("required", ...). Stats: invalid.
  void KeyMissing(const MetricScope& scope, std::string_view missing_class);
  // A key refused as malformed or prohibited; `reason` is
  // core::KeyErrorReason(error), or "prohibited" on a `prohibited` route.
  // Stats: invalid.
  void KeyInvalid(const MetricScope& scope, std::string_view reason);
  // A webhook whose provider id could not be lifted. Stats: invalid.
  void TranslationFailed(const MetricScope& scope, std::string_view provider);
  // A completed record was replayed with HTTP `status`. Stats: hits.
  void CacheHit(const MetricScope& scope, int status);
  // A keyed request found no record and was reserved and forwarded. Stats: misses.
  void CacheMiss(const MetricScope& scope);
  // A request attached to an in-flight original (in_flight: wait). Stats: waits.
  void Waited(const MetricScope& scope);
  // A request that waited was answered with its original's unstored outcome
  // (core::BeginOutcome::kShared), and did not run.
  void Shared(const MetricScope& scope);
  // Stats: mismatches for kFingerprintMismatch, else conflicts.
  void Conflict(const MetricScope& scope, ConflictReason reason);
  // A reservation was deleted so that a retry runs again; the label is
  // core::ReleaseReasonName(reason). kNone (nothing released) is not counted.
  void ReservationReleased(const MetricScope& scope, core::ReleaseReason reason);
  // ReservationReleased with kShutdown so far, over every scope: the
  // process logs it as it stops, since the admin listener (and so
  // /metrics) closes right after those releases.
  std::uint64_t shutdown_releases() const { return shutdown_releases_.load(std::memory_order_relaxed); }
  // A final response was written to the store. Stats: stored.
  void Stored(const MetricScope& scope);
  // A store operation failed. Stats: store_errors.
  void StoreError(const MetricScope& scope, StoreOp op);
  // A store operation of the admin listener failed (/readyz's ping, a key
  // read or purge): counted with route kAdminRoute, tenant and project "_";
  // not in any route's stats.
  void AdminStoreError(StoreOp op);
  // An in-flight record whose lease had ended was taken over.
  void LeaseExpired(const MetricScope& scope);
  // store.on_error: fail_open forwarded a request without deduplication.
  void FailOpen(const MetricScope& scope);

  // idemgate_requests_in_flight; prefer InFlightGuard.
  Gauge& requests_in_flight() { return *in_flight_; }

  // Counts one request in idemgate_requests_in_flight for its lifetime.
  class InFlightGuard {
   public:
    explicit InFlightGuard(GatewayMetrics& metrics) : gauge_(&metrics.requests_in_flight()) {
      gauge_->Inc();
    }
    ~InFlightGuard() {
      if (gauge_ != nullptr) gauge_->Dec();
    }
    InFlightGuard(InFlightGuard&& other) noexcept : gauge_(std::exchange(other.gauge_, nullptr)) {}
    InFlightGuard& operator=(InFlightGuard&&) = delete;
    InFlightGuard(const InFlightGuard&) = delete;
    InFlightGuard& operator=(const InFlightGuard&) = delete;

   private:
    Gauge* gauge_;
  };

  // idemgate_store_keys, idemgate_store_bytes and
  // idemgate_store_bodies_dropped_total read `source` at each scrape (on the
  // scraping thread). `source` must stay callable until it is replaced or
  // this object is destroyed; an empty function removes them.
  void SetStoreStatsSource(std::function<core::StoreStats()> source);

  // The Prometheus text of every metric (runs the scrape-time callbacks).
  std::string RenderPrometheus() const;

  bool tenant_labels() const { return tenant_labels_; }
  Registry& registry() { return registry_; }
  RouteStats& stats() { return stats_; }
  const RouteStats& stats() const { return stats_; }

 private:
  struct ScopeSeries;
  // The families labelled by scope only, and those with one more label; the
  // index of each in a ScopeSeries.
  enum Plain { kCacheMissSeries, kWaitSeries, kSharedSeries, kStoredSeries, kLeaseExpiredSeries, kFailOpenSeries,
               kRequestDurationSeries, kUpstreamDurationSeries, kPlainCount };
  enum Extra { kKeyPresentSeries, kKeyMissingSeries, kKeyInvalidSeries, kTranslationFailedSeries,
               kCacheHitSeries, kConflictSeries, kReleasedSeries, kStoreErrorsSeries, kExtraCount };

  // This thread's cached series of `scope` (found or made).
  ScopeSeries& Cached(const MetricScope& scope);
  template <typename T>
  T& Series(Family<T>& family, const MetricScope& scope, std::string_view extra = {},
            bool has_extra = false);
  template <typename T>
  T& Series(Plain which, Family<T>& family, const MetricScope& scope);
  template <typename T>
  T& Series(Extra which, Family<T>& family, const MetricScope& scope, std::string_view extra);
  RouteCounters& Route(const MetricScope& scope);

  // Tells this object's entries in the per-thread caches from those of a
  // destroyed one at the same address; never reused.
  const std::uint64_t uid_;
  const bool tenant_labels_;
  Registry registry_;
  RouteStats stats_;

  CounterFamily* key_present_;
  CounterFamily* key_missing_;
  CounterFamily* key_invalid_;
  CounterFamily* translation_failed_;
  CounterFamily* cache_hit_;
  CounterFamily* cache_miss_;
  CounterFamily* wait_;
  CounterFamily* shared_;
  CounterFamily* conflict_;
  CounterFamily* released_;
  CounterFamily* stored_;
  CounterFamily* store_errors_;
  CounterFamily* lease_expired_;
  CounterFamily* fail_open_;
  CounterFamily* requests_refused_;
  Counter* connections_refused_[2];     // by Listener
  Counter* tls_handshake_failures_[2];  // by Listener
  std::atomic<std::uint64_t> shutdown_releases_{0};
  HistogramFamily* request_duration_;
  HistogramFamily* upstream_duration_;
  Gauge* in_flight_;
};

}  // namespace idemgate::admin
