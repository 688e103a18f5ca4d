#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/config.h"
#include "http/exchange.h"
#include "http/message.h"

// The seams of the per-request pipeline (SPEC §2):
//   parse -> route -> identity -> [buffer body] -> webhook -> idempotency
//   -> admission -> proxy (+ capture) -> log line
// Identity (identity_stage.h), webhook translation (webhook_stage.h) and the
// idempotency decision (idempotency_stage.h) are hooks; without them the
// gateway is a plain reverse proxy. Every hook method runs on the request's
// worker thread (Decide may await); a
// hook object is shared by all workers, so it must be safe to call
// concurrently (keep per-request state in the RequestContext or in the
// ForwardObserver it returns).
namespace idemgate::gateway {

template <typename T>
using Task = http::Task<T>;

struct RouteEntry;
class WebhookEndpoints;
class IdentityCredentials;

// Fields of the request's log line (SPEC §9) that hooks fill; unset ones are
// logged as null.
// The views must outlive the request: string literals or the snapshot's config.
struct LogFields {
  std::optional<std::string_view> idempotency_case;    // e.g. "REQUIRED_A"
  std::optional<std::string_view> idempotency_policy;  // "required", ...
  std::optional<std::string_view> idempotency_source;  // "header", "webhook", ...
  std::optional<std::string> idempotency_key_namespaced;
  std::optional<std::string> operation_id;
  std::optional<bool> cache_hit;
  std::optional<std::string_view> outcome;  // overrides the pipeline's own outcome word
};

// Everything the pipeline knows about one request, handed to every hook.
// Lives for the request; views stay valid until the pipeline returns.
struct RequestContext {
  http::Exchange* exchange = nullptr;
  const http::RequestHead* head = nullptr;
  const RouteEntry* route = nullptr;
  const config::Config* config = nullptr;  // the snapshot this request runs under
  const WebhookEndpoints* webhooks = nullptr;  // the snapshot's webhook endpoints, secrets read
  const IdentityCredentials* identity = nullptr;  // the snapshot's JWT keys or API keys
  std::string_view request_id;             // X-Request-Id passed on or generated
  // The request body, once buffered (only when a hook asked for it).
  std::string_view body;
  bool body_buffered = false;

  // Set by the identity hook (SPEC §6); empty: unknown ("_" in keys and metrics).
  std::string tenant;
  std::string project;
  std::string subject;
  // Set by the webhook hook (SPEC §7): the key lifted from the provider's id,
  // and the endpoint it came through (a view of the request path).
  std::optional<std::string> webhook_key;
  std::string_view webhook_endpoint;
  // Set by the idempotency hook's WantsBody: the valid key from the key
  // header, so Decide does not parse it again.
  std::optional<std::string> header_key;

  // Upstream request header changes gathered by identity/webhook hooks
  // (e.g. verified identity headers); merged into the ForwardRequest.
  std::vector<http::Header> set_headers;
  std::vector<std::string> remove_headers;

  LogFields log;
};

// Removes from the upstream request every header line whose name differs
// from `name` only by '_' for '-' (X_API_Key beside X-API-Key,
// Idempotency_Key beside Idempotency-Key), keeping `name` itself: CGI-style
// upstreams (WSGI, Rack, PHP) read such a line as `name`. For a `name`
// with a '_' of its own (X_Account), its '-' spelling is a look-alike too.
void DropHeaderLookalikes(RequestContext& ctx, std::string_view name);

// SPEC §2 step 3. nullopt: continue (identity fields set); a response: send
// it instead (401 problem). Synchronous: every identity mode verifies
// locally (headers, signatures, key files loaded at start), and a coroutine
// frame on every request would cost more than the check.
class IdentityHook {
 public:
  virtual ~IdentityHook() = default;
  virtual std::optional<http::Response> Identify(RequestContext& ctx) = 0;
};

// SPEC §2 step 4 on `policy: webhook` routes.
class WebhookHook {
 public:
  virtual ~WebhookHook() = default;
  // Whether the request is a webhook's: Translate runs only then, after the
  // body is buffered (the signature covers the body).
  virtual bool Applies(const RequestContext& ctx) const = 0;
  // Of a request it applies to: false when the path names no endpoint of
  // the route's provider. Such a request is an unknown path like any other
  // (SPEC §7): 404 no-route, logged and counted without a route, before
  // identity and the body.
  virtual bool KnowsEndpoint(const RequestContext& /*ctx*/) const { return true; }
  // Of a request it applies to whose endpoint is known: a response when the
  // route does not take its method (405 method-not-allowed), sent before
  // identity and the body; nullopt to go on.
  virtual std::optional<http::Response> RefuseMethod(RequestContext& /*ctx*/) const { return std::nullopt; }
  // nullopt: continue, with the caller's identity set from the endpoint and
  // ctx.webhook_key set to the lifted id; a response: send it instead (404
  // not-found, 401 signature-invalid, 400 translation-failed). Synchronous
  // for the same reason as IdentityHook: secrets are loaded with the config.
  virtual std::optional<http::Response> Translate(RequestContext& ctx) = 0;
};

// What the idempotency step decided for one request.
struct IdempotencyDecision {
  enum class Kind {
    kForward,  // proxy the request (with `forward`'s changes)
    kRespond,  // answer with `response` (a replay or a problem); upstream not called
  };
  Kind kind = Kind::kForward;

  // kForward: header changes both ways and the capture cap. The pipeline
  // sets forward.observer from `observer` and forward.request_id itself.
  http::ForwardRequest forward;
  // kForward: when set, the response is captured and observer->OnResponse
  // gets it before the client has it all; observer->OnFinished is called
  // exactly once at the end in every case, including a 429 from admission
  // (outcome kNotForwarded, status 429) so a reservation is released in the
  // same request (SPEC §2 step 6).
  std::unique_ptr<http::ForwardObserver> observer;

  // kRespond: the answer.
  http::Response response;

  static IdempotencyDecision Forward() { return {}; }
  static IdempotencyDecision Respond(http::Response response) {
    IdempotencyDecision d;
    d.kind = Kind::kRespond;
    d.response = std::move(response);
    return d;
  }
};

// SPEC §2 step 5 (implemented by the engine integration over core::Engine).
class IdempotencyHook {
 public:
  virtual ~IdempotencyHook() = default;
  // Whether Decide needs the whole request body in ctx.body (to fingerprint
  // it). The pipeline then reads it, up to the route's max_request_bytes
  // (413 beyond), and forwards the buffered copy. A request that Decide
  // will refuse without looking at the body (an invalid key) is not read:
  // a client that sent `Expect: 100-continue` gets the 400 instead of
  // `100 Continue`. May note what it parsed in ctx for Decide.
  virtual bool WantsBody(RequestContext& ctx) = 0;
  virtual Task<IdempotencyDecision> Decide(RequestContext& ctx) = 0;
};

}  // namespace idemgate::gateway
