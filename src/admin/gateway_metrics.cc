#include "admin/gateway_metrics.h"

#include <array>
#include <charconv>

#include "admin/prometheus.h"

#ifndef IDEMGATE_VERSION_STRING
#define IDEMGATE_VERSION_STRING "unknown"
#endif

namespace idemgate::admin {
namespace {

namespace names = metric_names;

std::string_view OrNone(std::string_view v) { return v.empty() ? std::string_view("_") : v; }

std::vector<std::string> ScopeLabels(bool tenant_labels, std::string_view extra = {}) {
  std::vector<std::string> labels;
  if (tenant_labels) labels = {"tenant", "project"};
  labels.emplace_back("route");
  if (!extra.empty()) labels.emplace_back(extra);
  return labels;
}

}  // namespace

std::string_view ConflictReasonName(ConflictReason reason) {
  switch (reason) {
    case ConflictReason::kInFlight:
      return "in_flight";
    case ConflictReason::kWaitTimeout:
      return "wait_timeout";
    case ConflictReason::kFingerprintMismatch:
      return "fingerprint_mismatch";
    case ConflictReason::kLeaseLost:
      return "lease_lost";
  }
  return "unknown";
}

std::string_view StoreOpName(StoreOp op) {
  switch (op) {
    case StoreOp::kReserve:
      return "reserve";
    case StoreOp::kComplete:
      return "complete";
    case StoreOp::kRelease:
      return "release";
    case StoreOp::kGet:
      return "get";
    case StoreOp::kPurge:
      return "purge";
    case StoreOp::kWatch:
      return "watch";
    case StoreOp::kPing:
      return "ping";
  }
  return "unknown";
}

std::string_view BuildVersion() { return IDEMGATE_VERSION_STRING; }

GatewayMetrics::GatewayMetrics(GatewayMetricsOptions options)
    : uid_(detail::NextUid()),
      tenant_labels_(options.tenant_labels),
      registry_(Registry::Options{.max_series_per_family = options.max_series_per_family}) {
  const bool t = tenant_labels_;
  key_present_ = &registry_.AddCounter(
      names::kKeyPresent, "Requests that carried a usable idempotency key, by idempotency case.",
      ScopeLabels(t, "case"));
  key_missing_ = &registry_.AddCounter(
      names::kKeyMissing, "Requests refused with 400 missing-key because a route requires a key.",
      ScopeLabels(t, "class"));
  key_invalid_ = &registry_.AddCounter(
      names::kKeyInvalid,
      "Requests refused with 400 because the idempotency key was malformed or not allowed.",
      ScopeLabels(t, "reason"));
  translation_failed_ = &registry_.AddCounter(
      names::kTranslationFailed,
      "Webhook requests refused: 401 signature-invalid or 400 translation-failed (no usable event id).",
      ScopeLabels(t, "provider"));
  cache_hit_ = &registry_.AddCounter(
      names::kCacheHit, "Requests answered by replaying a stored response, by replayed status.",
      ScopeLabels(t, "status"));
  cache_miss_ = &registry_.AddCounter(
      names::kCacheMiss, "Keyed requests that found no usable record and reserved the key (most then go upstream).",
      ScopeLabels(t));
  wait_ = &registry_.AddCounter(names::kWait,
                                "Requests that waited for an in-flight original (in_flight: wait).",
                                ScopeLabels(t));
  shared_ = &registry_.AddCounter(names::kShared,
                                  "Requests that waited and were answered with their original's outcome that is not "
                                  "stored (a 5xx, 408/409/425/429, an upstream timeout or failure), without running.",
                                  ScopeLabels(t));
  conflict_ = &registry_.AddCounter(
      names::kConflict,
      "Keyed requests refused: in_flight and wait_timeout (409), fingerprint_mismatch (422), "
      "lease_lost (a completion refused because the reservation is gone: taken over after its lease, "
      "purged by an admin, or lost by the store).",
      ScopeLabels(t, "reason"));
  released_ = &registry_.AddCounter(
      names::kReservationReleased,
      "Reservations deleted without a stored response, so that a retry runs again.",
      ScopeLabels(t, "reason"));
  stored_ = &registry_.AddCounter(names::kStored, "Final responses written to the store.",
                                  ScopeLabels(t));
  store_errors_ = &registry_.AddCounter(
      names::kStoreErrors, "Store operations that failed, by operation.", ScopeLabels(t, "op"));
  lease_expired_ = &registry_.AddCounter(
      names::kLeaseExpired, "In-flight reservations taken over after their lease ended.",
      ScopeLabels(t));
  fail_open_ = &registry_.AddCounter(
      names::kFailOpen,
      "Requests forwarded without deduplication because the store failed (on_error: fail_open).",
      ScopeLabels(t));
  requests_refused_ = &registry_.AddCounter(
      names::kRequestsRefused,
      "Requests refused before routing, by reason: bad_request (400), uri_too_long (414), "
      "headers_too_large (431), version_not_supported (505), header_timeout (head not whole within "
      "header_timeout; no answer).",
      {"reason"});
  // Listed from start-up: a scrape shows 0 rather than no series.
  for (std::string_view reason :
       {"bad_request", "uri_too_long", "headers_too_large", "version_not_supported", "header_timeout"}) {
    requests_refused_->WithLabelValues({reason});
  }
  CounterFamily& refused = registry_.AddCounter(
      names::kConnectionsRefused,
      "Client connections closed as soon as they were accepted because the listener's connection limit "
      "(limits.max_connections on listen, 256 on admin.listen) was reached.",
      {"listener"});
  CounterFamily& handshakes = registry_.AddCounter(
      names::kTlsHandshakeFailures,
      "Client TLS handshakes that failed or did not finish within limits.header_timeout (each logged at debug).",
      {"listener"});
  for (Listener l : {Listener::kData, Listener::kAdmin}) {
    const std::string_view name = l == Listener::kData ? "data" : "admin";
    connections_refused_[static_cast<int>(l)] = &refused.WithLabelValues({name});
    tls_handshake_failures_[static_cast<int>(l)] = &handshakes.WithLabelValues({name});
  }
  request_duration_ = &registry_.AddHistogram(
      names::kRequestDuration,
      "Time from the request's first byte to the end of its response, in seconds.", ScopeLabels(t));
  upstream_duration_ = &registry_.AddHistogram(
      names::kUpstreamDuration,
      "Time of upstream exchanges, from connect to the end of the response, in seconds.",
      ScopeLabels(t));
  in_flight_ = &registry_.AddGauge(names::kRequestsInFlight, "Requests being handled right now.")
                    .WithLabelValues(std::span<const std::string_view>{});
  const std::string version =
      options.version.empty() ? std::string(BuildVersion()) : options.version;
  registry_.AddGauge(names::kBuildInfo, "Build information; the value is always 1.", {"version"})
      .WithLabelValues({version})
      .Set(1);
}

GatewayMetrics::~GatewayMetrics() = default;

// The series one thread resolved for one scope. Pointers into the registry
// and the route stats stay valid for the life of the GatewayMetrics (series
// are never removed), and an entry is only used by the object whose uid it
// carries.
struct GatewayMetrics::ScopeSeries {
  std::uint64_t owner = 0;  // uid of the GatewayMetrics; 0: empty
  std::string tenant;
  std::string project;
  std::string route;
  std::array<Metric*, kPlainCount> plain{};
  // Per labelled family, the series of the extra value used last.
  struct Last {
    std::string value;
    Metric* metric = nullptr;
  };
  std::array<Last, kExtraCount> extra{};
  RouteCounters* route_counters = nullptr;

  bool Holds(std::uint64_t uid, const MetricScope& s) const {
    return owner == uid && route == s.route && tenant == s.tenant && project == s.project;
  }
};

namespace {
// Scopes a thread keeps, direct-mapped by a hash of the scope. A miss costs
// the lookups every event made before; the slots bound the memory.
constexpr std::size_t kScopeSlots = 32;
}  // namespace

GatewayMetrics::ScopeSeries& GatewayMetrics::Cached(const MetricScope& scope) {
  thread_local std::array<ScopeSeries, kScopeSlots> slots;
  // The events of one request come one after another: the slot used last is
  // usually the one, found without hashing.
  thread_local ScopeSeries* last = &slots[0];
  if (last->Holds(uid_, scope)) return *last;
  const std::hash<std::string_view> h;
  const std::size_t index =
      (h(scope.route) ^ (h(scope.tenant) * 31) ^ (h(scope.project) * 961)) % kScopeSlots;
  ScopeSeries& slot = slots[index];
  if (!slot.Holds(uid_, scope)) {
    slot.owner = uid_;
    slot.tenant.assign(scope.tenant);
    slot.project.assign(scope.project);
    slot.route.assign(scope.route);
    slot.plain.fill(nullptr);
    for (ScopeSeries::Last& extra : slot.extra) extra.metric = nullptr;
    slot.route_counters = nullptr;
  }
  last = &slot;
  return slot;
}

template <typename T>
T& GatewayMetrics::Series(Family<T>& family, const MetricScope& scope, std::string_view extra,
                          bool has_extra) {
  std::array<std::string_view, 4> values;
  std::size_t n = 0;
  if (tenant_labels_) {
    values[n++] = OrNone(scope.tenant);
    values[n++] = OrNone(scope.project);
  }
  values[n++] = scope.route;
  if (has_extra) values[n++] = extra;
  return family.WithLabelValues(std::span<const std::string_view>(values.data(), n));
}

template <typename T>
T& GatewayMetrics::Series(Plain which, Family<T>& family, const MetricScope& scope) {
  Metric*& cached = Cached(scope).plain[which];
  if (cached == nullptr) cached = &Series(family, scope);
  return static_cast<T&>(*cached);
}

template <typename T>
T& GatewayMetrics::Series(Extra which, Family<T>& family, const MetricScope& scope,
                          std::string_view extra) {
  ScopeSeries::Last& last = Cached(scope).extra[which];
  if (last.metric == nullptr || last.value != extra) {
    last.metric = &Series(family, scope, extra, true);
    last.value.assign(extra);
  }
  return static_cast<T&>(*last.metric);
}

RouteCounters& GatewayMetrics::Route(const MetricScope& scope) {
  RouteCounters*& cached = Cached(scope).route_counters;
  if (cached == nullptr) cached = &stats_.ForRoute(scope.route);
  return *cached;
}

void GatewayMetrics::RegisterRoute(std::string_view route) { stats_.ForRoute(route); }

void GatewayMetrics::RequestCompleted(const MetricScope& scope, double seconds) {
  Series(kRequestDurationSeries, *request_duration_, scope).Observe(seconds);
  Route(scope).requests.Inc();
}

void GatewayMetrics::UpstreamCompleted(const MetricScope& scope, double seconds) {
  Series(kUpstreamDurationSeries, *upstream_duration_, scope).Observe(seconds);
}

void GatewayMetrics::KeyPresent(const MetricScope& scope, std::string_view idempotency_case) {
  Series(kKeyPresentSeries, *key_present_, scope, idempotency_case).Inc();
}

void GatewayMetrics::KeyMissing(const MetricScope& scope, std::string_view missing_class) {
  Series(kKeyMissingSeries, *key_missing_, scope, missing_class).Inc();
  Route(scope).invalid.Inc();
}

void GatewayMetrics::KeyInvalid(const MetricScope& scope, std::string_view reason) {
  Series(kKeyInvalidSeries, *key_invalid_, scope, reason).Inc();
  Route(scope).invalid.Inc();
}

void GatewayMetrics::TranslationFailed(const MetricScope& scope, std::string_view provider) {
  Series(kTranslationFailedSeries, *translation_failed_, scope, provider).Inc();
  Route(scope).invalid.Inc();
}

void GatewayMetrics::CacheHit(const MetricScope& scope, int status) {
  char buf[16];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, status);
  Series(kCacheHitSeries, *cache_hit_, scope,
         std::string_view(buf, static_cast<std::size_t>(end - buf)))
      .Inc();
  Route(scope).hits.Inc();
}

void GatewayMetrics::CacheMiss(const MetricScope& scope) {
  Series(kCacheMissSeries, *cache_miss_, scope).Inc();
  Route(scope).misses.Inc();
}

void GatewayMetrics::Waited(const MetricScope& scope) {
  Series(kWaitSeries, *wait_, scope).Inc();
  Route(scope).waits.Inc();
}

void GatewayMetrics::Shared(const MetricScope& scope) { Series(kSharedSeries, *shared_, scope).Inc(); }

void GatewayMetrics::Conflict(const MetricScope& scope, ConflictReason reason) {
  Series(kConflictSeries, *conflict_, scope, ConflictReasonName(reason)).Inc();
  RouteCounters& route = Route(scope);
  (reason == ConflictReason::kFingerprintMismatch ? route.mismatches : route.conflicts).Inc();
}

void GatewayMetrics::ReservationReleased(const MetricScope& scope, core::ReleaseReason reason) {
  if (reason == core::ReleaseReason::kNone) return;
  if (reason == core::ReleaseReason::kShutdown) shutdown_releases_.fetch_add(1, std::memory_order_relaxed);
  Series(kReleasedSeries, *released_, scope, core::ReleaseReasonName(reason)).Inc();
}

void GatewayMetrics::Stored(const MetricScope& scope) {
  Series(kStoredSeries, *stored_, scope).Inc();
  Route(scope).stored.Inc();
}

void GatewayMetrics::StoreError(const MetricScope& scope, StoreOp op) {
  Series(kStoreErrorsSeries, *store_errors_, scope, StoreOpName(op)).Inc();
  Route(scope).store_errors.Inc();
}

void GatewayMetrics::AdminStoreError(StoreOp op) {
  Series(*store_errors_, MetricScope{.route = kAdminRoute}, StoreOpName(op), true).Inc();
}

void GatewayMetrics::LeaseExpired(const MetricScope& scope) {
  Series(kLeaseExpiredSeries, *lease_expired_, scope).Inc();
}

void GatewayMetrics::ConnectionRefused(Listener listener) { connections_refused_[static_cast<int>(listener)]->Inc(); }

void GatewayMetrics::TlsHandshakeFailed(Listener listener) {
  tls_handshake_failures_[static_cast<int>(listener)]->Inc();
}

void GatewayMetrics::RequestRefused(std::string_view reason) {
  requests_refused_->WithLabelValues({reason}).Inc();
}

void GatewayMetrics::FailOpen(const MetricScope& scope) {
  Series(kFailOpenSeries, *fail_open_, scope).Inc();
}

void GatewayMetrics::SetStoreStatsSource(std::function<core::StoreStats()> source) {
  if (!source) {
    registry_.SetCallbackGauge(names::kStoreKeys, "", nullptr);
    registry_.SetCallbackGauge(names::kStoreBytes, "", nullptr);
    registry_.SetCallbackCounter(names::kStoreBodiesDropped, "", nullptr);
    return;
  }
  auto shared = std::make_shared<std::function<core::StoreStats()>>(std::move(source));
  registry_.SetCallbackGauge(names::kStoreKeys,
                             "Live records in the store (approximate for persistent stores).",
                             [shared] { return static_cast<double>((*shared)().keys); });
  registry_.SetCallbackGauge(names::kStoreBytes, "Encoded bytes held by the store (approximate).",
                             [shared] { return static_cast<double>((*shared)().bytes); });
  registry_.SetCallbackCounter(names::kStoreBodiesDropped,
                               "Responses stored without their body: the memory store had no room for "
                               "them whole (max_bytes), or the Redis store could not read them back "
                               "within store.redis.timeout.",
                               [shared] { return static_cast<double>((*shared)().bodies_dropped); });
}

std::string GatewayMetrics::RenderPrometheus() const {
  return FormatPrometheus(registry_.Collect());
}

}  // namespace idemgate::admin
