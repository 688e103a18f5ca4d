#include "gateway/idempotency_stage.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <utility>
#include <vector>

#include "admin/gateway_metrics.h"
#include "common/ascii.h"
#include "common/log.h"
#include "common/units.h"
#include "config/resolve.h"
#include "core/decision.h"
#include "core/fingerprint.h"
#include "core/key.h"
#include "core/scope.h"
#include "common/request_path.h"
#include "gateway/route_table.h"
#include "http/problem.h"

namespace idemgate::gateway {

namespace {

using admin::ConflictReason;
using admin::MetricScope;
using admin::StoreOp;
using core::ReleaseReason;

MetricScope ScopeOf(const RequestContext& ctx) {
  return MetricScope{.route = ctx.route->id, .tenant = ctx.tenant, .project = ctx.project};
}

// Every value of the `name` lines, in order.
std::vector<std::string_view> HeaderLines(const http::RequestHead& head, std::string_view name) {
  std::vector<std::string_view> out;
  for (const http::HeaderView& h : head.headers) {
    if (core::HeaderNameEquals(h.name, name)) out.push_back(h.value);
  }
  return out;
}

// Whether the route's idempotency takes this request: by the method it is
// run as (a method override's) or, with an override, by its own. An upstream
// that ignores the override runs the request line's method, and one that
// honours it runs the override's: either way a key is asked for when the
// route would ask for it.
bool HandlesRequest(const RouteIdempotency& rules, const http::RequestHead& head) {
  return rules.HandlesMethod(head.effective_method()) ||
         (!head.method_override.empty() && rules.HandlesMethod(head.method));
}

// The upstream marked its response final (SPEC §4.3): `true` (or the
// structured-field boolean `?1`) in the terminal header.
bool MarkedTerminal(const std::vector<http::Header>& stripped, std::string_view terminal_header) {
  for (const http::Header& h : stripped) {
    if (!core::HeaderNameEquals(h.name, terminal_header)) continue;
    if (core::HeaderNameEquals(h.value, "true") || h.value == "?1" || h.value == "1") return true;
  }
  return false;
}

std::string KeyErrorDetail(core::KeyError error, const core::KeyRules& rules) {
  switch (error) {
    case core::KeyError::kDuplicate: return "the key header appears more than once";
    case core::KeyError::kList: return "the key header holds a list; send exactly one key";
    case core::KeyError::kParameters: return "the key header carries parameters; send the key alone";
    case core::KeyError::kEmpty: return "the key is empty";
    case core::KeyError::kBadString: return "the key is not a valid structured-field string";
    case core::KeyError::kBadCharset:
      return rules.extra_charset.empty() ? "the key holds a character outside [A-Za-z0-9._~-]"
                                         : "the key holds a character outside [A-Za-z0-9._~-] and this route's key.charset";
    case core::KeyError::kTooLong:
      return "the key is longer than " + std::to_string(rules.max_length) + " characters";
    case core::KeyError::kReservedPrefix: return "keys starting with \"t-\" are reserved";
    case core::KeyError::kColon: return "the key contains a colon";
    case core::KeyError::kNone:
    case core::KeyError::kMissing: break;
  }
  return "the key is invalid";
}

IdempotencyDecision Refuse(RequestContext& ctx, http::ProblemCode code, std::string_view detail,
                           std::string_view outcome,
                           std::optional<std::chrono::seconds> retry_after = std::nullopt) {
  ctx.log.outcome = outcome;
  return IdempotencyDecision::Respond(http::MakeProblem(code, detail, 0, retry_after));
}

ReleaseReason ReasonForTransport(const http::ForwardResult& result) {
  switch (result.outcome) {
    case http::ForwardOutcome::kConnectFailed: return ReleaseReason::kUpstreamConnect;
    case http::ForwardOutcome::kTimedOut: return ReleaseReason::kUpstreamTimeout;
    case http::ForwardOutcome::kClientGone: return ReleaseReason::kClientGone;
    case http::ForwardOutcome::kShutdown: return ReleaseReason::kShutdown;
    case http::ForwardOutcome::kNotForwarded:
      return result.status == 429 ? ReleaseReason::kAdmission : ReleaseReason::kResponseError;
    case http::ForwardOutcome::kCompleted:
    case http::ForwardOutcome::kUpstreamFailed:
    case http::ForwardOutcome::kRequestTooLarge:
    case http::ForwardOutcome::kBadRequest: break;
  }
  return ReleaseReason::kResponseError;
}

// A problem answer in the form an outcome is shared in (Engine::Share).
core::StoredResponse ProblemOutcome(http::ProblemCode code, std::string_view detail) {
  http::Response problem = http::MakeProblem(code, detail);
  core::StoredResponse out;
  out.status = problem.status;
  out.headers = std::move(problem.headers);
  out.body = std::move(problem.body);
  return out;
}

// What waiters share after their original's upstream timed out.
core::StoredResponse UpstreamTimeoutOutcome() {
  return ProblemOutcome(http::ProblemCode::kUpstreamTimeout,
                        "the original request with this key got no whole answer from the upstream in time and may "
                        "still be running there; this request was not sent: retry later");
}

// Holds the reservation of a request that went upstream and settles it
// exactly once: stores the response when it is final, else releases the key
// so that a retry runs again (SPEC §4.3).
class Settlement final : public http::ForwardObserver {
 public:
  Settlement(core::Engine& engine, admin::GatewayMetrics* metrics, const RouteIdempotency& rules,
             MetricScope scope, core::Reservation reservation)
      : engine_(engine), metrics_(metrics), rules_(rules), scope_(scope), reservation_(std::move(reservation)) {}

  Task<void> OnResponse(http::CapturedResponse& captured) override {
    if (settled_) co_return;
    settled_ = true;
    const bool terminal = MarkedTerminal(captured.stripped, rules_.terminal_header);
    const core::Classification c =
        core::ClassifyResponse(captured.response.status, rules_.store_server_errors, terminal);
    if (c.disposition == core::Disposition::kRelease) {
      // Waiters of this process answer with this outcome too, rather than
      // each running the request again: as the original's client got it (its
      // X-Operation-Id among the captured fields), or, when it was not kept
      // whole, the gateway's word for it.
      if (!captured.response.body_omitted) {
        engine_.Share(reservation_, std::move(captured.response));
      } else if (captured.timed_out) {
        engine_.Share(reservation_, UpstreamTimeoutOutcome());
      } else {
        engine_.Share(reservation_,
                      ProblemOutcome(http::ProblemCode::kUpstreamUnavailable,
                                     "the original request with this key got a " +
                                         std::to_string(captured.response.status) +
                                         " from the upstream whose response was not kept whole (cut off, refused, or "
                                         "past max_response_bytes); this request was not sent: retry later"));
      }
      co_await Release(c.reason);
      co_return;
    }
    // The proxy has already framed what the client gets; the captured copy is ours.
    const Status stored =
        co_await engine_.Complete(reservation_, std::move(captured.response), rules_.retention, &Later, this);
    if (stored.ok()) {
      if (metrics_ != nullptr) metrics_->Stored(scope_);
      co_return;
    }
    if (stored.code() == StatusCode::kFailedPrecondition) {
      // The reservation is gone: another request took the key over after
      // our lease ended (its outcome wins), an admin purged it, or the store
      // lost it (a Redis restarted without persistence).
      if (metrics_ != nullptr) metrics_->Conflict(scope_, ConflictReason::kLeaseLost);
      core::LogReservationGone(reservation_);
      co_return;
    }
    // The upstream ran the request: releasing the key would let a retry run
    // it again. The reservation stays until its lease ends, so retries are
    // told 409 request-in-flight meanwhile, the same as after a crash; on a
    // store whose faults may pass, the completion is tried again meanwhile.
    if (metrics_ != nullptr) metrics_->StoreError(scope_, StoreOp::kComplete);
    if (engine_.store().FailedWritesMayPass()) {  // the engine tries again (Engine::Complete)
      static LogLimiter limiter;
      LogWarn(limiter, "response not stored: the store failed; trying again while the lease lasts",
              {{"key", reservation_.key}, {"operation_id", reservation_.operation_id}, {"error", stored.message()}});
      co_return;
    }
    static LogLimiter limiter;
    LogError(limiter, "response not stored: the store failed; the key stays reserved until its lease ends",
             {{"key", reservation_.key}, {"operation_id", reservation_.operation_id}, {"error", stored.message()}});
  }

  Task<void> OnNoResponse(const http::ForwardResult& result) override { co_await OnFinished(result); }

  Task<void> OnFinished(const http::ForwardResult& result) override {
    if (settled_) co_return;
    settled_ = true;
    const ReleaseReason reason = ReasonForTransport(result);
    // An upstream that timed out may still be running the request: a waiter
    // taking the key now would run it beside that call. One that could not
    // be reached, or broke the exchange, is likely to fail the waiters too.
    // They answer with the original's error instead. (A request never sent,
    // or whose client left, shares nothing: its waiters take the key.)
    switch (result.outcome) {
      case http::ForwardOutcome::kTimedOut:
        engine_.Share(reservation_, UpstreamTimeoutOutcome());
        break;
      case http::ForwardOutcome::kConnectFailed:
        engine_.Share(reservation_, ProblemOutcome(http::ProblemCode::kUpstreamUnavailable,
                                                   "the original request with this key could not reach the upstream; "
                                                   "this request was not sent: retry later"));
        break;
      case http::ForwardOutcome::kUpstreamFailed:
        engine_.Share(reservation_, ProblemOutcome(http::ProblemCode::kUpstreamUnavailable,
                                                   "the upstream broke the exchange of the original request with this "
                                                   "key or answered it with malformed HTTP; this request was not sent: "
                                                   "retry later"));
        break;
      default:
        break;
    }
    co_await Release(reason);
  }

 private:
  // For Engine::Complete: how its background attempts ended is counted as
  // the first attempt's would be, stored or lease_lost (the scope's views
  // point into the request, so the function owns copies).
  static core::Engine::Later Later(void* arg) {
    const auto* self = static_cast<const Settlement*>(arg);
    if (self->metrics_ == nullptr) return {};
    return [metrics = self->metrics_, route = std::string(self->scope_.route),
            tenant = std::string(self->scope_.tenant),
            project = std::string(self->scope_.project)](core::Engine::LaterOutcome outcome) {
      const MetricScope scope{route, tenant, project};
      if (outcome == core::Engine::LaterOutcome::kStored) {
        metrics->Stored(scope);
      } else {
        metrics->Conflict(scope, ConflictReason::kLeaseLost);
      }
    };
  }

  Task<void> Release(ReleaseReason reason) {
    const Status released = co_await engine_.Release(reservation_);
    if (released.ok()) {
      if (metrics_ != nullptr) metrics_->ReservationReleased(scope_, reason);
    } else if (released.code() != StatusCode::kFailedPrecondition) {
      // Unreleased, the key waits for its lease to end before a retry runs again.
      if (metrics_ != nullptr) metrics_->StoreError(scope_, StoreOp::kRelease);
      static LogLimiter limiter;
      LogError(limiter, "reservation not released: the store failed",
               {{"key", reservation_.key}, {"error", released.message()}});
    }
  }

  core::Engine& engine_;
  admin::GatewayMetrics* metrics_;
  const RouteIdempotency& rules_;
  MetricScope scope_;
  core::Reservation reservation_;
  bool settled_ = false;
};

// The longest `?wait=` a recovery request may ask for.
constexpr Duration kMaxRecoveryWait = std::chrono::seconds(60);
constexpr std::string_view kRecoveryMarker = "/by-idempotency-key/";

// The {key} segment of a recovery path under `route`, if `path` is one.
std::optional<std::string_view> RecoverySegment(const RouteEntry& route, std::string_view path) {
  if (route.kind != RouteEntry::Kind::kPrefix || !path.starts_with(route.path)) return std::nullopt;
  std::string_view rest = path.substr(route.path.size());
  if (!rest.starts_with(kRecoveryMarker)) return std::nullopt;
  rest.remove_prefix(kRecoveryMarker.size());
  if (rest.empty() || rest.find('/') != std::string_view::npos) return std::nullopt;
  return rest;
}

// The value of `name` in a query string (first occurrence, not decoded);
// `*repeated` tells whether it occurs again after that.
std::optional<std::string_view> QueryParam(std::string_view query, std::string_view name, bool* repeated) {
  std::optional<std::string_view> value;
  *repeated = false;
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    if (pair.size() > name.size() && pair.starts_with(name) && pair[name.size()] == '=') {
      if (value) {
        *repeated = true;
        break;
      }
      value = pair.substr(name.size() + 1);
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return value;
}

// Percent-encodes everything outside RFC 3986's unreserved set.
std::string PercentEncode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

// `pattern` with every "{key}" replaced by `key`.
std::string SubstituteKey(std::string_view pattern, std::string_view key) {
  constexpr std::string_view kPlaceholder = "{key}";
  std::string out;
  std::size_t pos = 0;
  while (true) {
    const std::size_t at = pattern.find(kPlaceholder, pos);
    out.append(pattern.substr(pos, at - pos));
    if (at == std::string_view::npos) break;
    out.append(key);
    pos = at + kPlaceholder.size();
  }
  return out;
}

// Under dedup: upstream the upstream deduplicates by the key header it is
// sent, which must be the scoped key the gateway sets: where the gateway sets
// none (a method the route does not handle, a request without a key, a
// recovery request), a client's key header, its look-alike spellings
// (Idempotency_Key) and a client's replay header do not reach it. Otherwise
// such a key, passed as sent, would be deduplicated there unscoped: one
// naming another caller's scoped key would reach that caller's outcome.
void DropClientKeyForUpstreamDedup(RequestContext& ctx, const RouteIdempotency& rules) {
  if (rules.dedup != config::DedupMode::kUpstream) return;
  ctx.remove_headers.emplace_back(rules.header);
  DropHeaderLookalikes(ctx, rules.header);
  ctx.remove_headers.emplace_back(rules.replay_header);
}

http::Response ToResponse(core::StoredResponse stored) {
  http::Response r;
  r.status = stored.status;
  r.headers = std::move(stored.headers);
  r.body = std::move(stored.body);
  // A record's Content-Length is the original's: a HEAD response's is the
  // length a GET would get, for the server to send to HEAD again. The line
  // stays where it is: the server writes its own Content-Length there.
  for (const http::Header& h : r.headers) {
    if (!core::HeaderNameEquals(h.name, "content-length")) continue;
    std::uint64_t length = 0;
    const std::string& v = h.value;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), length);
    if (ec == std::errc() && end == v.data() + v.size() && !v.empty()) r.head_length = length;
    break;
  }
  return r;
}

}  // namespace

IdempotencyStage::IdempotencyStage(core::Engine& engine, IdempotencyStageOptions options)
    : engine_(engine), options_(options) {}

bool IdempotencyStage::WantsBody(RequestContext& ctx) {
  const RouteIdempotency& rules = ctx.route->idempotency;
  if (rules.dedup != config::DedupMode::kGateway) return false;
  switch (rules.policy) {
    case config::Policy::kWebhook: return rules.HandlesMethod(ctx.head->effective_method());
    case config::Policy::kRequired:
    case config::Policy::kOptional: {
      if (!HandlesRequest(rules, *ctx.head)) return false;
      const std::vector<std::string_view> lines = HeaderLines(*ctx.head, rules.header);
      if (lines.empty()) return false;  // forwarded or refused as it is
      // An invalid key is refused by Decide (which parses it again to say
      // why) without the body.
      core::ParsedKey parsed = core::ParseIdempotencyKey(lines, rules.key);
      if (!parsed.ok()) return false;
      ctx.header_key = std::move(parsed.key);
      return true;
    }
    case config::Policy::kPassthrough:
    case config::Policy::kProhibited: return false;
  }
  return false;
}

Task<IdempotencyDecision> IdempotencyStage::Decide(RequestContext& ctx) {
  const RouteIdempotency& rules = ctx.route->idempotency;
  admin::GatewayMetrics* metrics = options_.metrics;
  const MetricScope scope = ScopeOf(ctx);
  ctx.log.idempotency_case = rules.case_name;

  // HEAD as GET (RFC 9110 section 9.3.2): the same answer, head only.
  if (ctx.route->config->recovery &&
      (ctx.head->effective_method() == "GET" || ctx.head->effective_method() == "HEAD") &&
      rules.policy != config::Policy::kProhibited) {
    if (auto segment = RecoverySegment(*ctx.route, ctx.head->path)) co_return co_await Recover(ctx, *segment);
  }
  if (rules.policy == config::Policy::kPassthrough) co_return IdempotencyDecision::Forward();
  if (rules.policy == config::Policy::kProhibited) {
    // Every method: a key on such a route is a client mistake whatever it asks.
    DropHeaderLookalikes(ctx, rules.header);
    if (ctx.head->Count(rules.header) == 0) co_return IdempotencyDecision::Forward();
    if (metrics != nullptr) metrics->KeyInvalid(scope, "prohibited");
    co_return Refuse(ctx, http::ProblemCode::kKeyProhibited,
                     "route " + ctx.route->id + " does not accept an " + rules.header + " header",
                     "key_prohibited");
  }
  if (!HandlesRequest(rules, *ctx.head)) {
    DropClientKeyForUpstreamDedup(ctx, rules);
    co_return IdempotencyDecision::Forward();
  }
  // An Idempotency_Key line would reach the upstream unscoped beside the
  // gateway's own (or, above, past a prohibited route's refusal).
  DropHeaderLookalikes(ctx, rules.header);

  std::string raw;
  if (rules.policy == config::Policy::kWebhook) {
    if (!ctx.webhook_key) {
      if (metrics != nullptr) metrics->TranslationFailed(scope, ctx.route->config->idempotency.provider);
      co_return Refuse(ctx, http::ProblemCode::kTranslationFailed,
                       "no event id to use as the idempotency key", "translation_failed");
    }
    raw = *ctx.webhook_key;
    ctx.log.idempotency_source = "webhook";
  } else if (ctx.header_key) {
    raw = std::move(*ctx.header_key);  // parsed by WantsBody
    ctx.log.idempotency_source = "header";
  } else {
    const std::vector<std::string_view> lines = HeaderLines(*ctx.head, rules.header);
    if (lines.empty()) {
      if (rules.policy == config::Policy::kOptional) {
        DropClientKeyForUpstreamDedup(ctx, rules);
        co_return IdempotencyDecision::Forward();
      }
      if (metrics != nullptr) metrics->KeyMissing(scope, "required");
      co_return Refuse(ctx, http::ProblemCode::kMissingKey,
                       "route " + ctx.route->id + " requires an " + rules.header + " header on " +
                           std::string(ctx.head->effective_method()),
                       "missing_key");
    }
    core::ParsedKey parsed = core::ParseIdempotencyKey(lines, rules.key);
    if (!parsed.ok()) {
      if (metrics != nullptr) metrics->KeyInvalid(scope, core::KeyErrorReason(parsed.error));
      co_return Refuse(ctx, http::ProblemCode::kInvalidKey, KeyErrorDetail(parsed.error, rules.key), "invalid_key");
    }
    raw = std::move(parsed.key);
    ctx.log.idempotency_source = "header";
  }
  if (metrics != nullptr) metrics->KeyPresent(scope, rules.case_name);

  const core::Caller caller{ctx.tenant, ctx.project, ctx.subject};
  std::string scoped;
  if (ctx.webhook_endpoint.empty()) {
    scoped = core::ScopedKey(rules.scope, caller, ctx.route->id, raw);
  } else {
    // Each webhook endpoint keeps its own keys: an id is unique only per
    // sender (a generic sender's counter), and one event sent to two
    // endpoints (an endpoint being replaced, or two with their own API
    // versions) is two deliveries, each to be run and answered, not a
    // reused key (docs/configuration.md).
    std::string route_and_endpoint = ctx.route->id;
    route_and_endpoint += '/';
    route_and_endpoint += ctx.webhook_endpoint;
    scoped = core::ScopedKey(rules.scope, caller, route_and_endpoint, raw);
  }
  ctx.log.idempotency_key_namespaced = scoped;

  IdempotencyDecision decision;
  http::ForwardRequest& fr = decision.forward;
  switch (rules.forward_key) {
    case config::ForwardKey::kNamespaced:
      fr.set_headers.push_back({rules.header, core::SerializeKeyAsSfString(scoped)});
      break;
    case config::ForwardKey::kRaw:
      // One spelling whatever the client sent ("K" and K are one key, SPEC
      // §3), so that an upstream deduplicating by the header's value sees
      // one key, and recovery can name it.
      fr.set_headers.push_back({rules.header, core::SerializeKeyAsSfString(raw)});
      break;
    case config::ForwardKey::kNone: fr.remove_headers.push_back(rules.header); break;
  }
  // A client cannot make its request, or the upstream its response, look replayed.
  fr.remove_headers.push_back(rules.replay_header);
  if (rules.dedup == config::DedupMode::kUpstream) co_return decision;

  core::FingerprintRequest fp;
  fp.method = ctx.head->effective_method();
  fp.route_id = ctx.route->id;
  fp.target = ctx.head->path_and_query;
  fp.headers.reserve(ctx.head->headers.size() + 1);
  // An absolute-form target's authority replaces Host (RFC 9112 section
  // 3.2.2) and is what the upstream gets: the fingerprint covers it.
  const bool absolute_form = !ctx.head->authority.empty();
  for (const http::HeaderView& h : ctx.head->headers) {
    if (!absolute_form || !EqualsIgnoreCaseAscii(h.name, "host")) fp.headers.push_back({h.name, h.value});
  }
  if (absolute_form) fp.headers.push_back({"Host", ctx.head->authority});
  fp.body = ctx.body;
  // A header the fingerprint covers cannot be changed through an
  // X_Account spelling that CGI-style upstreams read as X-Account.
  for (const std::string& name : rules.fingerprint.headers) DropHeaderLookalikes(ctx, name);

  core::KeyedRequest request;
  request.key = std::move(scoped);
  request.fingerprint = core::ComputeFingerprint(fp, rules.fingerprint);
  request.lease = rules.lease;
  request.in_flight = rules.in_flight;
  request.wait_timeout = rules.wait_timeout;
  // Past shutdown_grace the key is not taken any more (a waiter woken by the
  // original's release at shutdown would run the request again); nor by a
  // waiter whose client has closed its connection meanwhile.
  if (ctx.exchange != nullptr) {
    request.cancelled = [](const void* ex) { return static_cast<const http::Exchange*>(ex)->stopping(); };
    request.abandoned = [](const void* ex) { return static_cast<const http::Exchange*>(ex)->client_gone(); };
    request.cancelled_arg = ctx.exchange;
  }
  core::BeginResult begun = co_await engine_.Begin(std::move(request));
  if (begun.waited && metrics != nullptr) metrics->Waited(scope);
  if (metrics != nullptr) {
    // Store errors the engine met while waiting (it kept waiting through them).
    for (int i = 0; i < begun.wait_watch_errors; ++i) metrics->StoreError(scope, StoreOp::kWatch);
    for (int i = 0; i < begun.wait_get_errors; ++i) metrics->StoreError(scope, StoreOp::kGet);
  }

  switch (begun.outcome) {
    case core::BeginOutcome::kProceed: {
      core::Reservation& reservation = begun.reservation;
      if (metrics != nullptr) metrics->CacheMiss(scope);
      if (begun.taken_over) {
        if (metrics != nullptr) metrics->LeaseExpired(scope);
        static LogLimiter limiter;
        LogWarn(limiter, "lease expired; the key is taken over and the request runs again",
                {{"key", reservation.key},
                 {"previous_operation_id",
                  begun.record ? std::string_view(begun.record->operation_id) : std::string_view()},
                 {"operation_id", reservation.operation_id}});
      }
      ctx.log.operation_id = reservation.operation_id;
      ctx.log.cache_hit = false;
      fr.strip_response_headers = rules.strip_response_headers;
      fr.add_response_headers.push_back({std::string(core::kOperationIdHeader), reservation.operation_id});
      fr.capture_max_body_bytes = rules.max_response_bytes;
      // The response's relay ends inside the lease (with a tenth of it, at
      // most a second, left to store the outcome), so the key cannot be
      // taken over while a slow client is still reading the original; and
      // the request is sent only while the upstream timeout fits before
      // then (a wait for a free upstream connection eats into the lease).
      fr.finish_by = std::chrono::steady_clock::now() + rules.lease - config::LeaseMargin(rules.lease);
      decision.observer =
          std::make_unique<Settlement>(engine_, metrics, rules, scope, std::move(reservation));
      co_return decision;
    }
    case core::BeginOutcome::kReplay: {
      const core::Record& record = *begun.record;
      if (metrics != nullptr) metrics->CacheHit(scope, record.response.status);
      ctx.log.operation_id = record.operation_id;
      ctx.log.cache_hit = true;
      ctx.log.outcome = "replayed";
      co_return IdempotencyDecision::Respond(
          ToResponse(core::BuildReplay(record, rules.replay_header, engine_.clock().NowMillis())));
    }
    case core::BeginOutcome::kKeyReused:
      if (metrics != nullptr) metrics->Conflict(scope, ConflictReason::kFingerprintMismatch);
      co_return Refuse(ctx, http::ProblemCode::kKeyReused,
                       "this key was already used with a different request; use a new key for a new request",
                       "key_reused");
    case core::BeginOutcome::kInFlight:
      if (metrics != nullptr) {
        metrics->Conflict(scope, begun.waited ? ConflictReason::kWaitTimeout : ConflictReason::kInFlight);
      }
      co_return Refuse(ctx, http::ProblemCode::kRequestInFlight,
                       begun.waited ? "the original request with this key is still in flight after waiting"
                                    : "the original request with this key is still in flight; retry later",
                       "in_flight", begun.retry_after);
    case core::BeginOutcome::kCancelled:
      co_return Refuse(ctx, http::ProblemCode::kShuttingDown,
                       "the gateway stopped before the request could run; retry", "shutdown");
    case core::BeginOutcome::kClientGone:
      // Not a conflict: the key was free, but nobody waits for this run.
      // The answer reaches a client that only half-closed.
      co_return Refuse(ctx, http::ProblemCode::kBadRequest,
                       "the connection was closed while the request waited for the original with this key; "
                       "it did not run",
                       "client_gone");
    case core::BeginOutcome::kShared: {
      // The original this request waited on released the key with an
      // outcome that is not stored (Engine::Share): this request answers
      // with it too, not replayed, and did not run.
      if (metrics != nullptr) metrics->Shared(scope);
      ctx.log.operation_id = begun.shared->operation_id;
      ctx.log.outcome = "shared";
      co_return IdempotencyDecision::Respond(ToResponse(begun.shared->response));
    }
    case core::BeginOutcome::kStoreError:
      break;
  }

  if (metrics != nullptr) metrics->StoreError(scope, StoreOp::kReserve);
  if (options_.on_error == config::OnError::kFailOpen) {
    if (metrics != nullptr) metrics->FailOpen(scope);
    static LogLimiter limiter;
    LogWarn(limiter, "store failed; forwarding without deduplication (store.on_error: fail_open)",
            {{"route", ctx.route->id}, {"error", begun.status.message()}});
    co_return decision;
  }
  static LogLimiter limiter;
  LogError(limiter, "store failed; refusing the keyed request (store.on_error: fail_closed)",
           {{"route", ctx.route->id}, {"error", begun.status.message()}});
  co_return Refuse(ctx, http::ProblemCode::kStoreUnavailable,
                   "the idempotency store is unavailable; retry later", "store_unavailable",
                   std::chrono::seconds(1));
}

Task<IdempotencyDecision> IdempotencyStage::Recover(RequestContext& ctx, std::string_view key) {
  const RouteIdempotency& rules = ctx.route->idempotency;
  ctx.log.outcome = "recovery";
  // The segment is percent-decoded: a key whose route widens the charset
  // may hold characters a path must escape ('=' as %3D, '/' as %2F).
  StatusOr<std::string> decoded = PercentDecode(key);
  if (!decoded.ok()) {
    if (options_.metrics != nullptr) options_.metrics->KeyInvalid(ScopeOf(ctx), "bad_string");
    co_return Refuse(ctx, http::ProblemCode::kInvalidKey, "the key in the path is not validly percent-encoded",
                     "invalid_key");
  }
  // The segment is the key itself; a client may also give it in its header
  // spelling (an sf-string, "abc" as %22abc%22), which the default charset
  // cannot hold.
  core::ParsedKey parsed;
  parsed.error = core::ValidateRawKey(*decoded, rules.key);
  if (parsed.ok()) {
    parsed.key = std::move(*decoded);
  } else if (core::ParsedKey spelled = core::ParseIdempotencyKey({std::string_view(*decoded)}, rules.key);
             spelled.ok() && decoded->starts_with('"')) {
    parsed = std::move(spelled);
  }
  if (!parsed.ok()) {
    if (options_.metrics != nullptr) options_.metrics->KeyInvalid(ScopeOf(ctx), core::KeyErrorReason(parsed.error));
    co_return Refuse(ctx, http::ProblemCode::kInvalidKey, KeyErrorDetail(parsed.error, rules.key), "invalid_key");
  }
  Duration wait{0};
  bool wait_repeated = false;
  const std::optional<std::string_view> wait_text = QueryParam(ctx.head->query, "wait", &wait_repeated);
  if (wait_repeated) {
    // Which of two waits was meant cannot be told (the admin API refuses a
    // repeated force alike).
    co_return Refuse(ctx, http::ProblemCode::kBadRequest, "wait is given more than once", "bad_request");
  }
  if (wait_text) {
    StatusOr<Duration> parsed_wait = ParseDuration(*wait_text);
    if (!parsed_wait.ok()) {
      co_return Refuse(ctx, http::ProblemCode::kBadRequest, "wait must be a duration such as 10s or 500ms",
                       "bad_request");
    }
    wait = std::min(*parsed_wait, kMaxRecoveryWait);
  }
  const core::Caller caller{ctx.tenant, ctx.project, ctx.subject};
  std::string scoped = core::ScopedKey(rules.scope, caller, ctx.route->id, parsed.key);
  ctx.log.idempotency_key_namespaced = scoped;
  ctx.log.idempotency_source = "recovery";

  if (rules.dedup == config::DedupMode::kUpstream) {
    // The upstream keeps the outcome under the key it was sent: the header
    // value byte for byte (an sf-string, quotes included; Restate's ingress,
    // for one, takes the value as an opaque string).
    const std::string forwarded = core::SerializeKeyAsSfString(
        rules.forward_key == config::ForwardKey::kNamespaced ? std::string_view(scoped) : std::string_view(parsed.key));
    DropClientKeyForUpstreamDedup(ctx, rules);
    IdempotencyDecision decision;
    decision.forward.target = SubstituteKey(ctx.route->config->recovery_upstream_path, PercentEncode(forwarded));
    co_return decision;
  }

  core::LookupResult found = co_await engine_.Lookup(std::move(scoped), wait);
  switch (found.outcome) {
    case core::LookupOutcome::kCompleted:
      // A stored response answered: a cache hit, in the metrics and stats
      // as in the log.
      if (options_.metrics != nullptr) options_.metrics->CacheHit(ScopeOf(ctx), found.record->response.status);
      ctx.log.operation_id = found.record->operation_id;
      ctx.log.cache_hit = true;
      co_return IdempotencyDecision::Respond(
          ToResponse(core::BuildReplay(*found.record, rules.replay_header, engine_.clock().NowMillis())));
    case core::LookupOutcome::kInFlight:
      // A 409 like a keyed request's: after a ?wait= that ran out, a wait timeout.
      if (options_.metrics != nullptr) {
        options_.metrics->Conflict(ScopeOf(ctx), wait.count() > 0 ? ConflictReason::kWaitTimeout
                                                                  : ConflictReason::kInFlight);
      }
      ctx.log.operation_id = found.record->operation_id;
      co_return Refuse(ctx, http::ProblemCode::kRequestInFlight,
                       "the request with this key is still in flight; retry later", "in_flight",
                       found.retry_after);
    case core::LookupOutcome::kNotFound:
      co_return Refuse(ctx, http::ProblemCode::kNotFound, "no stored response for this key", "not_found");
    case core::LookupOutcome::kStoreError:
      break;
  }
  if (options_.metrics != nullptr) options_.metrics->StoreError(ScopeOf(ctx), StoreOp::kGet);
  static LogLimiter limiter;
  LogError(limiter, "store failed during recovery", {{"route", ctx.route->id}, {"error", found.status.message()}});
  co_return Refuse(ctx, http::ProblemCode::kStoreUnavailable, "the idempotency store is unavailable; retry later",
                   "store_unavailable", std::chrono::seconds(1));
}

}  // namespace idemgate::gateway
