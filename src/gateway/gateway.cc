#include "gateway/gateway.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>

#include "admin/gateway_metrics.h"
#include "common/ascii.h"
#include "common/log.h"
#include "config/names.h"
#include "http/headers.h"
#include "http/problem.h"
#include "http/tls.h"

namespace idemgate::gateway {

namespace {

using SteadyClock = std::chrono::steady_clock;

std::string PoolKey(const http::UpstreamTarget& t) {
  std::string key = t.name;
  key += '|';
  key += t.host;
  key += '|';
  key += std::to_string(t.port);
  key += '|';
  key += t.base_path;
  key += '|';
  key += std::to_string(t.connect_timeout.count());
  key += '|';
  key += std::to_string(t.timeout.count());
  key += '|';
  key += std::to_string(t.max_connections);
  key += t.keepalive ? "|ka" : "|close";
  if (t.tls) {
    // Each snapshot reads the TLS files again (rotated certificates take
    // effect on reload), so a TLS pool lives as long as its context.
    key += "|tls|";
    key += std::to_string(reinterpret_cast<std::uintptr_t>(t.tls.get()));
    key += '|';
    key += t.tls_server_name;
  }
  return key;
}

double Millis(SteadyClock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// What the pipeline reports for the log line and metrics.
struct PipelineResult {
  std::string_view outcome;
  int status = 0;
  std::optional<int> upstream_status;
  std::optional<double> upstream_ms;
};

}  // namespace

http::Limits LimitsFromConfig(const config::Config& config) {
  http::Limits limits;
  limits.max_header_bytes = static_cast<std::uint32_t>(
      std::min<std::uint64_t>(config.limits.max_header_bytes, std::numeric_limits<std::uint32_t>::max()));
  limits.max_request_bytes = config.limits.max_request_bytes;
  limits.header_timeout = config.limits.header_timeout;
  limits.idle_timeout = config.limits.idle_timeout;
  limits.merge_slashes = config.merge_slashes;
  limits.max_connections = static_cast<std::size_t>(config.limits.max_connections);
  return limits;
}

StatusOr<std::shared_ptr<const http::TlsContext>> UpstreamTlsFromConfig(const std::string& name,
                                                                        const config::Upstream& upstream) {
  auto tls = http::MakeUpstreamTls(http::UpstreamTlsOptions{
      .ca_file = upstream.tls.ca_file, .cert_file = upstream.tls.cert_file, .key_file = upstream.tls.key_file});
  if (!tls.ok()) return Status(tls.status().code(), "upstreams." + name + ".tls: " + tls.status().message());
  return tls;
}

http::UpstreamTarget UpstreamTargetFromConfig(const config::Upstream& upstream, std::size_t workers) {
  http::UpstreamTarget t;
  t.name = upstream.name;
  t.host = upstream.host;
  t.port = upstream.port;
  t.base_path = upstream.base_path;
  t.connect_timeout = upstream.connect_timeout;
  t.timeout = upstream.timeout;
  t.keepalive = upstream.keepalive;
  const std::size_t w = std::max<std::size_t>(workers, 1);
  t.max_connections = static_cast<std::uint32_t>(std::max<std::size_t>(1, (upstream.max_connections + w - 1) / w));
  return t;
}

struct Gateway::WorkerView {
  std::shared_ptr<const Snapshot> snapshot;
  std::vector<std::shared_ptr<http::UpstreamPool>> pools;  // by upstream index
};

// Padded so that two workers' slots never share a cache line.
struct alignas(64) Gateway::WorkerSlot {
  std::uint64_t version = 0;
  std::shared_ptr<WorkerView> view;
  std::map<std::string, std::shared_ptr<http::UpstreamPool>> pools;  // by PoolKey
};

Gateway::Gateway(GatewayOptions options) : options_(options) {
  const std::size_t n = std::max<std::size_t>(options_.workers, 1);
  slots_.reserve(n);
  for (std::size_t i = 0; i < n; ++i) slots_.push_back(std::make_unique<WorkerSlot>());
}

Gateway::~Gateway() = default;

StatusOr<std::unique_ptr<Gateway>> Gateway::Create(const config::Config& config, GatewayOptions options) {
  std::unique_ptr<Gateway> gateway(new Gateway(options));
  Status status = gateway->Reload(config);
  if (!status.ok()) return status;
  return gateway;
}

StatusOr<std::shared_ptr<const Snapshot>> Gateway::BuildSnapshot(const config::Config& config) {
  auto snapshot = std::make_shared<Snapshot>();
  auto owned = std::make_shared<const config::Config>(config);
  auto routes = RouteTable::Build(*owned, admission_);
  if (!routes.ok()) return routes.status();
  auto webhooks = WebhookEndpoints::Resolve(*owned, options_.env);
  if (!webhooks.ok()) return webhooks.status();
  snapshot->webhooks = std::move(*webhooks);
  auto identity = IdentityCredentials::Load(owned->identity, options_.env);
  if (!identity.ok()) return identity.status();
  snapshot->identity = std::move(*identity);
  snapshot->config = std::move(owned);
  snapshot->routes = std::move(*routes);
  for (const std::string& name : snapshot->routes.upstreams()) {
    const config::Upstream& u = snapshot->config->upstreams.at(name);
    http::UpstreamTarget target = UpstreamTargetFromConfig(u, slots_.size());
    if (target.name.empty()) target.name = name;
    if (u.scheme == "https") {
      auto tls = UpstreamTlsFromConfig(name, u);
      if (!tls.ok()) return tls.status();
      target.tls = std::move(*tls);
      target.tls_server_name = u.tls.server_name;
    }
    snapshot->upstreams.push_back(std::move(target));
  }
  return std::shared_ptr<const Snapshot>(std::move(snapshot));
}

Status Gateway::Reload(const config::Config& config) {
  auto built = BuildSnapshot(config);
  if (!built.ok()) return built.status();
  std::lock_guard lock(mu_);
  auto snapshot = std::const_pointer_cast<Snapshot>(*built);
  snapshot->version = version_.load(std::memory_order_relaxed) + 1;
  if (options_.metrics != nullptr) {
    for (const auto& r : snapshot->routes.routes()) options_.metrics->RegisterRoute(r.id);
  }
  current_ = std::move(snapshot);
  version_.store(current_->version, std::memory_order_release);
  return Status::Ok();
}

std::shared_ptr<const Snapshot> Gateway::snapshot() const {
  std::lock_guard lock(mu_);
  return current_;
}

std::shared_ptr<Gateway::WorkerView> Gateway::ViewFor(http::Worker& worker) {
  WorkerSlot& slot = *slots_[worker.index() % slots_.size()];
  const std::uint64_t version = version_.load(std::memory_order_acquire);
  if (slot.version == version && slot.view) return slot.view;
  auto view = std::make_shared<WorkerView>();
  view->snapshot = snapshot();
  std::map<std::string, std::shared_ptr<http::UpstreamPool>> pools;
  for (const http::UpstreamTarget& target : view->snapshot->upstreams) {
    const std::string key = PoolKey(target);
    auto it = slot.pools.find(key);
    std::shared_ptr<http::UpstreamPool> pool =
        it != slot.pools.end() ? it->second : std::make_shared<http::UpstreamPool>(worker, target);
    view->pools.push_back(pool);
    pools.emplace(key, std::move(pool));
  }
  // Pools no longer configured live on while a request of an older view
  // still holds them.
  slot.pools = std::move(pools);
  slot.view = std::move(view);
  slot.version = slot.view->snapshot->version;
  return slot.view;
}

void Gateway::ClosePools() {
  for (auto& slot : slots_) {
    slot->view.reset();
    slot->pools.clear();
    slot->version = 0;
  }
}

void DropHeaderLookalikes(RequestContext& ctx, std::string_view name) {
  // A look-alike differs by '_' for '-' (or the reverse, for a name that has
  // a '_'): one of the two names holds a '_'.
  const bool name_has_underscore = name.find('_') != std::string_view::npos;
  for (const http::HeaderView& h : ctx.head->headers) {
    if (!name_has_underscore && h.name.find('_') == std::string_view::npos) continue;
    if (EqualsIgnoreCaseDashOrUnderscore(h.name, name) && !EqualsIgnoreCaseAscii(h.name, name)) {
      ctx.remove_headers.emplace_back(h.name);
    }
  }
}

namespace {

// Why the pipeline answered by itself. The problem details are built in
// Refuse (a frame of its own, made only on these paths) to keep the
// pipeline's coroutine frame small.
enum class Refusal { kNoRoute, kOverrideRoute, kTooLarge, kMalformedBody, kBodyGone, kAdmission, kTenantAdmission };

Task<PipelineResult> Refuse(http::Exchange& ex, Refusal why, const RouteEntry* route, std::string_view tenant = {}) {
  http::ProblemCode code = http::ProblemCode::kBadRequest;
  std::string detail;
  std::string_view outcome;
  std::optional<std::chrono::seconds> retry_after;
  switch (why) {
    case Refusal::kNoRoute:
      code = http::ProblemCode::kNoRoute;
      detail = "no route matches " + std::string(ex.head().effective_method()) + " " + std::string(ex.head().path);
      outcome = "no_route";
      break;
    case Refusal::kOverrideRoute:
      // Whether the upstream runs the request as its own method or as the
      // override's is the upstream's business: both must be under the same
      // route, or one of them would skip that route's checks.
      detail = "the method override names " + std::string(ex.head().method_override) + ", but " +
               std::string(ex.head().method_override) + " and " + std::string(ex.head().method) + " " +
               std::string(ex.head().path) + " are for different routes; send the request as " +
               std::string(ex.head().method_override);
      outcome = "bad_request";
      break;
    case Refusal::kTooLarge:
      code = http::ProblemCode::kRequestTooLarge;
      detail = "the request body exceeds " + std::to_string(route->max_request_bytes) + " bytes";
      outcome = "request_too_large";
      break;
    case Refusal::kMalformedBody:
      detail = "malformed request body";
      outcome = "bad_request";
      break;
    case Refusal::kBodyGone:
      detail = "the request body did not arrive";
      outcome = "client_gone";
      break;
    case Refusal::kAdmission:
      code = http::ProblemCode::kTooManyRequests;
      detail = "route " + route->id + " has " + std::to_string(route->admission->limit()) + " requests in flight";
      outcome = "admission";
      retry_after = kAdmissionRetryAfter;
      break;
    case Refusal::kTenantAdmission:
      code = http::ProblemCode::kTooManyRequests;
      detail = "tenant " + std::string(tenant) + " has " + std::to_string(route->tenant_admission->limit()) +
               " requests in flight on route " + route->id;
      outcome = "admission";
      retry_after = kAdmissionRetryAfter;
      break;
  }
  http::Response r = http::MakeProblem(code, detail, 0, retry_after);
  const int status = r.status;
  co_await ex.Respond(std::move(r));
  co_return PipelineResult{outcome, status, std::nullopt, std::nullopt};
}

// Sends a hook's own answer.
Task<PipelineResult> Answer(http::Exchange& ex, http::Response response, std::string_view outcome) {
  const int status = response.status;
  co_await ex.Respond(std::move(response));
  co_return PipelineResult{outcome, status, std::nullopt, std::nullopt};
}

PipelineResult Summarize(const http::ForwardResult& result, const RouteEntry& route, const RequestContext& ctx,
                         const GatewayOptions& options) {
  PipelineResult out;
  out.outcome = http::ForwardOutcomeName(result.outcome);
  out.status = result.status;
  if (result.upstream_status != 0) out.upstream_status = result.upstream_status;
  // Whenever the upstream was contacted, answer or not (a 504 timeout
  // counts): the log's upstream_ms and the histogram agree.
  if (result.upstream_contacted) {
    out.upstream_ms = std::chrono::duration<double, std::milli>(result.upstream_duration).count();
  }
  if (options.metrics != nullptr && result.upstream_contacted) {
    options.metrics->UpstreamCompleted({.route = route.id, .tenant = ctx.tenant, .project = ctx.project},
                                       std::chrono::duration<double>(result.upstream_duration).count());
  }
  return out;
}

void MergeHeaderChanges(RequestContext& ctx, http::ForwardRequest& fr) {
  for (auto& h : ctx.set_headers) fr.set_headers.push_back(std::move(h));
  for (const auto& n : ctx.remove_headers) fr.remove_headers.push_back(n);
}

Task<PipelineResult> RunPipeline(http::Exchange& ex, RequestContext& ctx, const Snapshot& snap,
                                 const std::vector<std::shared_ptr<http::UpstreamPool>>& pools,
                                 const GatewayOptions& options, std::string_view generated_request_id) {
  const RouteEntry* route = snap.routes.Match(ctx.head->effective_method(), ctx.head->path);
  if (!ctx.head->method_override.empty() && ctx.head->method_override != ctx.head->method &&
      snap.routes.Match(ctx.head->method, ctx.head->path) != route) {
    co_return co_await Refuse(ex, Refusal::kOverrideRoute, nullptr);
  }
  if (route == nullptr) co_return co_await Refuse(ex, Refusal::kNoRoute, nullptr);
  ctx.route = route;
  const bool webhook = options.webhook != nullptr && options.webhook->Applies(ctx);
  if (webhook && !options.webhook->KnowsEndpoint(ctx)) {
    // An id that names no endpoint is an unknown path (SPEC §7): no route
    // in the log, the metrics or the stats.
    ctx.route = nullptr;
    co_return co_await Refuse(ex, Refusal::kNoRoute, nullptr);
  }
  if (webhook) {
    std::optional<http::Response> answer = options.webhook->RefuseMethod(ctx);
    if (answer) co_return co_await Answer(ex, std::move(*answer), "webhook_refused");
  }
  if (!ex.SetBodyLimit(route->max_request_bytes)) co_return co_await Refuse(ex, Refusal::kTooLarge, route);

  if (options.identity != nullptr) {
    std::optional<http::Response> answer = options.identity->Identify(ctx);
    if (answer) co_return co_await Answer(ex, std::move(*answer), "identity_refused");
  }

  if (webhook || (options.idempotency != nullptr && options.idempotency->WantsBody(ctx))) {
    const http::BodyStatus status = co_await ex.ReadBody();
    if (status == http::BodyStatus::kTooLarge) co_return co_await Refuse(ex, Refusal::kTooLarge, route);
    if (status == http::BodyStatus::kMalformed) co_return co_await Refuse(ex, Refusal::kMalformedBody, route);
    if (status != http::BodyStatus::kOk) co_return co_await Refuse(ex, Refusal::kBodyGone, route);
    ctx.body = ex.body();
    ctx.body_buffered = true;
  }

  if (webhook) {
    std::optional<http::Response> answer = options.webhook->Translate(ctx);
    if (answer) co_return co_await Answer(ex, std::move(*answer), "webhook_refused");
  }

  IdempotencyDecision decision;
  if (options.idempotency != nullptr) decision = co_await options.idempotency->Decide(ctx);
  if (decision.kind == IdempotencyDecision::Kind::kRespond) {
    co_return co_await Answer(ex, std::move(decision.response), "answered");
  }

  AdmissionSlot slot;
  TenantSlot tenant_slot;
  if (route->admission || route->tenant_admission) {
    std::optional<Refusal> refusal;
    std::string tenant;  // only for a per-tenant limit
    if (route->admission && !route->admission->TryAcquire()) {
      refusal = Refusal::kAdmission;
    } else {
      if (route->admission) slot = AdmissionSlot(route->admission.get());
      if (route->tenant_admission) {
        // An unknown tenant is "_", as in stored keys: one shared budget.
        tenant = ctx.tenant.empty() ? std::string("_") : ctx.tenant;
        if (route->tenant_admission->TryAcquire(tenant)) {
          tenant_slot = TenantSlot(route->tenant_admission.get(), std::move(tenant));
        } else {
          refusal = Refusal::kTenantAdmission;
          slot.Reset();
        }
      }
    }
    if (refusal) {
      if (decision.observer) {
        http::ForwardResult refused;
        refused.outcome = http::ForwardOutcome::kNotForwarded;
        refused.status = http::ProblemDefaultStatus(http::ProblemCode::kTooManyRequests);
        co_await decision.observer->OnFinished(refused);
      }
      co_return co_await Refuse(ex, *refusal, route, tenant);
    }
  }

  MergeHeaderChanges(ctx, decision.forward);
  decision.forward.request_id = generated_request_id;
  decision.forward.observer = decision.observer.get();
  // The slots are freed once the response is complete, before its last
  // bytes go out (or after Forward, when it fails): the client's next
  // request must not find its own finished one still counted.
  struct HeldSlots {
    AdmissionSlot* slot;
    TenantSlot* tenant_slot;
    static void Free(void* self) {
      auto* held = static_cast<HeldSlots*>(self);
      held->slot->Reset();
      held->tenant_slot->Reset();
    }
  } held{&slot, &tenant_slot};
  if (route->admission || route->tenant_admission) {
    decision.forward.on_complete = &HeldSlots::Free;
    decision.forward.on_complete_arg = &held;
  }
  const http::ForwardResult result = co_await ex.Forward(*pools[route->upstream_index], decision.forward);
  slot.Reset();
  tenant_slot.Reset();
  if (decision.observer) co_await decision.observer->OnFinished(result);
  co_return Summarize(result, *route, ctx, options);
}

// The request's log line (SPEC §9) and request metrics.
void FinishRequest(const RequestContext& ctx, const http::Exchange& ex, const PipelineResult& result,
                   double duration_ms, admin::GatewayMetrics* metrics) {
  if (metrics != nullptr && ctx.route != nullptr) {
    metrics->RequestCompleted({.route = ctx.route->id, .tenant = ctx.tenant, .project = ctx.project},
                              duration_ms / 1000.0);
  }
  if (!LogEnabled(LogLevel::kInfo)) return;
  const http::RequestHead& head = *ctx.head;
  auto opt = [](const std::optional<std::string>& s) -> std::optional<std::string_view> {
    if (s) return std::string_view(*s);
    return std::nullopt;
  };
  RequestLogLine line;
  if (ctx.route != nullptr) line.route = ctx.route->id;
  line.method = head.method;
  line.path = head.path;
  line.status = ex.status_sent() != 0 ? ex.status_sent() : result.status;
  line.duration_ms = duration_ms;
  // An unknown caller component is "_", as in stored keys and metric labels (SPEC §3.1).
  auto component = [](const std::string& c) { return c.empty() ? std::string_view("_") : std::string_view(c); };
  line.tenant = component(ctx.tenant);
  line.project = component(ctx.project);
  line.subject = component(ctx.subject);
  line.idempotency_case = ctx.log.idempotency_case;
  if (ctx.log.idempotency_policy) {
    line.idempotency_policy = *ctx.log.idempotency_policy;
  } else if (ctx.route != nullptr && ctx.route->config != nullptr) {
    line.idempotency_policy = config::Name(ctx.route->config->idempotency.policy);
    // The route's case goes with its policy, also for a request refused
    // before the idempotency step set it (401, 413, a webhook's signature).
    if (!line.idempotency_case && !ctx.route->idempotency.case_name.empty()) {
      line.idempotency_case = ctx.route->idempotency.case_name;
    }
  }
  line.idempotency_source = ctx.log.idempotency_source;
  line.idempotency_key_namespaced = opt(ctx.log.idempotency_key_namespaced);
  line.operation_id = opt(ctx.log.operation_id);
  line.cache_hit = ctx.log.cache_hit;
  line.outcome = ctx.log.outcome.value_or(result.outcome);
  line.upstream_status = result.upstream_status;
  line.upstream_ms = result.upstream_ms;
  line.request_id = ctx.request_id;
  WriteRequestLog(line);
}

}  // namespace

void Gateway::TlsHandshakeFailed() {
  if (options_.metrics != nullptr) options_.metrics->TlsHandshakeFailed();
}

void Gateway::ConnectionRefused() {
  if (options_.metrics != nullptr) options_.metrics->ConnectionRefused();
}

void Gateway::Refused(const http::RefusedRequest& refused) {
  if (options_.metrics != nullptr) options_.metrics->RequestRefused(refused.reason);
  if (refused.status == 0) {
    LogDebug("request head not received within header_timeout; connection closed",
             {{"peer", refused.peer_ip}, {"duration_ms", refused.duration_ms}});
    return;
  }
  if (!LogEnabled(LogLevel::kInfo)) return;
  auto known = [](std::string_view s) -> std::optional<std::string_view> {
    if (s.empty()) return std::nullopt;
    return s;
  };
  // As for any request that matched no route (SPEC §2.9: one line per request).
  RequestLogLine line;
  line.method = known(refused.method);
  line.path = known(refused.path);
  line.status = refused.status;
  line.duration_ms = refused.duration_ms;
  line.tenant = line.project = line.subject = "_";
  line.outcome = refused.reason;
  line.request_id = refused.request_id;
  WriteRequestLog(line);
}

Task<void> Gateway::Handle(http::Exchange& ex) {
  const auto started = SteadyClock::now();
  std::shared_ptr<WorkerView> view = ViewFor(ex.worker());
  const Snapshot& snap = *view->snapshot;
  const http::RequestHead& head = ex.head();
  std::optional<admin::GatewayMetrics::InFlightGuard> in_flight;
  if (options_.metrics != nullptr) in_flight.emplace(*options_.metrics);

  RequestContext ctx;
  ctx.exchange = &ex;
  ctx.head = &head;
  ctx.config = snap.config.get();
  ctx.webhooks = snap.webhooks.get();
  ctx.identity = snap.identity.get();
  std::string generated_id;
  const auto client_id = head.Find("x-request-id");
  if (client_id && http::IsAcceptableRequestId(*client_id) && head.Count("x-request-id") == 1) {
    ctx.request_id = *client_id;
  } else {
    generated_id = http::NewRequestId();
    ctx.request_id = generated_id;
  }
  // Every answer carries the id the request is logged under.
  ex.SetRequestId(ctx.request_id);

  const PipelineResult result = co_await RunPipeline(ex, ctx, snap, view->pools, options_, generated_id);
  FinishRequest(ctx, ex, result, Millis(SteadyClock::now() - started), options_.metrics);
}

}  // namespace idemgate::gateway
