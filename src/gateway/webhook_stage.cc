#include "gateway/webhook_stage.h"

#include "admin/gateway_metrics.h"
#include "common/ascii.h"
#include "core/key.h"
#include "gateway/identity_stage.h"
#include "gateway/route_table.h"
#include "http/headers.h"
#include "http/problem.h"

namespace idemgate::gateway {

namespace {

webhooks::GenericSpec ToSpec(const config::GenericWebhook& g) {
  webhooks::GenericSpec spec;
  spec.header = g.header;
  spec.algorithm = g.algorithm == "sha1" ? webhooks::GenericSpec::Algorithm::kSha1
                                         : webhooks::GenericSpec::Algorithm::kSha256;
  spec.encoding = g.encoding == "base64" ? webhooks::GenericSpec::Encoding::kBase64
                                         : webhooks::GenericSpec::Encoding::kHex;
  spec.prefix = g.prefix;
  spec.id_header = g.id_header;
  spec.id_pointer = g.id_pointer;
  spec.id_form_fields = g.id_form_fields;
  return spec;
}

// The first item of a comma-separated forwarding header, trimmed.
std::string_view FirstItem(std::string_view value) {
  value = value.substr(0, std::min(value.find(','), value.size()));
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
  return value;
}

// The URL the sender called, as it signed it (Twilio): the endpoint's
// public_url, else what a proxy in front reports, else what this request
// says, followed by the path and query as received (not normalised).
std::string SignedUrl(const ResolvedEndpoint& endpoint, const http::RequestHead& head) {
  std::string url;
  if (!endpoint.public_url.empty()) {
    url = endpoint.public_url;
  } else {
    const std::optional<std::string_view> proto = head.Find("x-forwarded-proto");
    std::optional<std::string_view> host = head.Find("x-forwarded-host");
    if (!host && !head.authority.empty()) host = head.authority;  // an absolute-form target's, not Host's
    if (!host) host = head.Find("host");
    // Only a scheme and a host[:port] are taken from them: any other text
    // would be signed URL text of the sender's choosing (a path, a query),
    // and the signed text would no longer say where the URL ends.
    const std::string_view scheme = proto ? FirstItem(*proto) : std::string_view();
    if (EqualsIgnoreCaseAscii(scheme, "https") || EqualsIgnoreCaseAscii(scheme, "http")) {
      for (const char c : scheme) url.push_back(LowerAscii(c));  // "HTTPS" is the https Twilio signs
    } else {
      url = head.secure ? "https" : "http";
    }
    url += "://";
    if (host && http::IsValidHostValue(FirstItem(*host))) url += FirstItem(*host);
  }
  url += head.raw_path_and_query;
  return url;
}

}  // namespace

StatusOr<std::shared_ptr<const WebhookEndpoints>> WebhookEndpoints::Resolve(const config::Config& config,
                                                                           const EnvLookup& env) {
  auto endpoints = std::make_shared<WebhookEndpoints>();
  std::size_t inline_index = 0;
  std::size_t file_index = 0;
  for (const config::WebhookEndpoint& w : config.webhooks) {
    // "webhooks.endpoints[i] (id)", or "<webhooks.file>:<line>: endpoints[i] (id)".
    const std::string where = w.file.empty()
                                  ? "webhooks.endpoints[" + std::to_string(inline_index++) + "] (" + w.id + ")"
                                  : w.file + ":" + std::to_string(w.line) + ": endpoints[" +
                                        std::to_string(file_index++) + "] (" + w.id + ")";
    ResolvedEndpoint e;
    e.id = w.id;
    e.tenant = w.tenant;
    e.project = w.project;
    const std::optional<webhooks::Provider> provider = webhooks::ProviderFromName(w.provider);
    if (!provider) return InvalidArgumentError(where + ": unknown provider " + w.provider);
    e.provider = *provider;
    StatusOr<std::string> secret = ReadSecret(w.secret_env, w.secret_file, env);
    if (!secret.ok()) {
      return InvalidArgumentError(where + ": " + (w.secret_env.empty() ? "secret_file: " : "secret_env: ") +
                                  secret.status().message());
    }
    if (e.provider == webhooks::Provider::kStandardWebhooks && !webhooks::StandardWebhooksKey(*secret)) {
      return InvalidArgumentError(where + ": a standard_webhooks secret is \"whsec_\" followed by base64 (as the "
                                          "sender shows it), and this one is not");
    }
    e.secret = std::move(*secret);
    e.public_url = w.public_url;
    if (w.generic) e.generic = ToSpec(*w.generic);
    endpoints->by_id_.emplace(e.id, std::move(e));
  }
  return std::shared_ptr<const WebhookEndpoints>(std::move(endpoints));
}

const ResolvedEndpoint* WebhookEndpoints::Find(std::string_view id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

WebhookStage::WebhookStage(WebhookStageOptions options) : options_(options) {}

bool WebhookStage::Applies(const RequestContext& ctx) const {
  return ctx.route != nullptr && ctx.route->idempotency.policy == config::Policy::kWebhook;
}

namespace {

// The endpoint the route's {webhook_id} names, if it is one of the route's provider.
const ResolvedEndpoint* FindEndpoint(const RequestContext& ctx) {
  const RouteEntry& route = *ctx.route;
  const std::string_view id = route.WebhookId(ctx.head->path);
  const ResolvedEndpoint* endpoint = ctx.webhooks != nullptr ? ctx.webhooks->Find(id) : nullptr;
  if (endpoint == nullptr || webhooks::ProviderName(endpoint->provider) != route.config->idempotency.provider) {
    return nullptr;
  }
  return endpoint;
}

}  // namespace

bool WebhookStage::KnowsEndpoint(const RequestContext& ctx) const { return FindEndpoint(ctx) != nullptr; }

std::optional<http::Response> WebhookStage::RefuseMethod(RequestContext& ctx) const {
  const RouteIdempotency& rules = ctx.route->idempotency;
  if (rules.HandlesMethod(ctx.head->effective_method())) return std::nullopt;
  std::string allow;
  for (const std::string& method : rules.methods) allow.append(allow.empty() ? "" : ", ").append(method);
  ctx.log.outcome = "method_not_allowed";
  http::Response r = http::MakeProblem(http::ProblemCode::kMethodNotAllowed,
                                       "webhook route " + ctx.route->id + " takes " + allow + ", not " +
                                           std::string(ctx.head->effective_method()));
  r.headers.push_back({"Allow", std::move(allow)});
  return r;
}

std::optional<http::Response> WebhookStage::Translate(RequestContext& ctx) {
  const RouteEntry& route = *ctx.route;
  const std::string& provider_name = route.config->idempotency.provider;
  const ResolvedEndpoint* endpoint = FindEndpoint(ctx);
  if (endpoint == nullptr) {
    // The pipeline refuses an unknown id before this (KnowsEndpoint); this
    // is for a caller that does not. The same answer as for any unknown
    // path: whether an id exists (for another provider) is not told.
    ctx.log.outcome = "no_route";
    return http::MakeProblem(
        http::ProblemCode::kNoRoute,
        "no route matches " + std::string(ctx.head->effective_method()) + " " + std::string(ctx.head->path));
  }
  ctx.tenant = endpoint->tenant;
  ctx.project = endpoint->project;
  ctx.subject = std::string(kWebhookSubject);

  webhooks::WebhookRequest request;
  const std::string url = SignedUrl(*endpoint, *ctx.head);
  request.url = url;
  request.headers.reserve(ctx.head->headers.size());
  for (const http::HeaderView& h : ctx.head->headers) request.headers.push_back({h.name, h.value});
  request.body = ctx.body;
  request.now_unix_seconds = options_.clock->NowMillis() / 1000;
  webhooks::Translation t = webhooks::Translate(endpoint->provider, endpoint->generic ? &*endpoint->generic : nullptr,
                                              endpoint->secret, request);

  const admin::MetricScope scope{.route = route.id, .tenant = ctx.tenant, .project = ctx.project};
  if (t.outcome == webhooks::Translation::Outcome::kOk) {
    const core::KeyError error = core::ValidateRawKey(t.key, route.idempotency.key);
    if (error != core::KeyError::kNone) {
      t.outcome = webhooks::Translation::Outcome::kNoId;
      t.detail = "the event id is not a valid idempotency key (" + std::string(core::KeyErrorReason(error)) + ")";
    }
  }
  switch (t.outcome) {
    case webhooks::Translation::Outcome::kOk: break;
    case webhooks::Translation::Outcome::kSignatureInvalid:
      if (options_.metrics != nullptr) options_.metrics->TranslationFailed(scope, provider_name);
      ctx.log.outcome = "signature_invalid";
      return http::MakeProblem(http::ProblemCode::kSignatureInvalid, provider_name + ": " + t.detail);
    case webhooks::Translation::Outcome::kNoId:
      if (options_.metrics != nullptr) options_.metrics->TranslationFailed(scope, provider_name);
      ctx.log.outcome = "translation_failed";
      return http::MakeProblem(http::ProblemCode::kTranslationFailed, provider_name + ": " + t.detail);
  }
  ctx.webhook_key = std::move(t.key);
  ctx.webhook_endpoint = route.WebhookId(ctx.head->path);

  // The identity an authenticating layer would have set: the endpoint's,
  // never what the sender wrote (the signature does not cover headers), in
  // every identity mode.
  SetUpstreamIdentity(ctx, UpstreamIdentityHeaders(ctx.config->identity));
  return std::nullopt;
}

}  // namespace idemgate::gateway
