#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/secrets.h"
#include "common/status.h"
#include "config/config.h"
#include "gateway/hooks.h"
#include "webhooks/providers.h"

namespace idemgate::admin {
class GatewayMetrics;
}

// SPEC §2 step 4 and §7: requests on `policy: webhook` routes. The route's
// `{webhook_id}` segment names an endpoint of `webhooks.endpoints`; the
// endpoint gives the caller's identity (its tenant and project, subject
// `service:webhook-ingest`) and the secret; the provider's signature is
// checked and its event id becomes the idempotency key.
namespace idemgate::gateway {

// The subject of every webhook request (SPEC §7).
inline constexpr std::string_view kWebhookSubject = "service:webhook-ingest";

// One endpoint, ready to verify with.
struct ResolvedEndpoint {
  std::string id;
  std::string tenant;
  std::string project;
  webhooks::Provider provider = webhooks::Provider::kGeneric;
  std::string secret;
  std::string public_url;  // "scheme://host[:port]", or empty
  std::optional<webhooks::GenericSpec> generic;
};

// The endpoints of one config, secrets read. Immutable; shared by workers.
class WebhookEndpoints {
 public:
  // Reads every endpoint's secret: the environment variable named by
  // secret_env, or the file at secret_file (one trailing line break
  // dropped). Fails, naming the endpoint, when a variable is unset or empty,
  // or a file cannot be read or is empty.
  static StatusOr<std::shared_ptr<const WebhookEndpoints>> Resolve(const config::Config& config,
                                                                 const EnvLookup& env);

  const ResolvedEndpoint* Find(std::string_view id) const;
  std::size_t size() const { return by_id_.size(); }

 private:
  std::map<std::string, ResolvedEndpoint, std::less<>> by_id_;
};

struct WebhookStageOptions {
  // Optional; must outlive the stage.
  admin::GatewayMetrics* metrics = nullptr;
  // The time for Stripe's tolerance; must outlive the stage.
  const Clock* clock = &SystemClock::Instance();
};

// Stateless per request; safe to share between workers.
class WebhookStage final : public WebhookHook {
 public:
  explicit WebhookStage(WebhookStageOptions options = {});

  // Every method on a `policy: webhook` route: a sender's request is
  // verified, or refused, whatever it asks, so none reaches the upstream
  // unsigned.
  bool Applies(const RequestContext& ctx) const override;
  // Whether the route's {webhook_id} names an endpoint of its provider.
  bool KnowsEndpoint(const RequestContext& ctx) const override;
  // 405 method-not-allowed, with an Allow header, for a method outside the
  // route's idempotency `methods`: the signatures do not cover the method,
  // so a signed request re-sent with another one would otherwise be
  // verified and forwarded without a key, and run again.
  std::optional<http::Response> RefuseMethod(RequestContext& ctx) const override;

  // 404 no-route (as for any unknown path) for an id that names no endpoint
  // of the route's provider,
  // 401 signature-invalid, 400 translation-failed (no event id, or one that
  // is not a valid key under the route's key rules). On success sets the
  // caller (and, with identity trusted_headers, those headers upstream) and
  // ctx.webhook_key.
  std::optional<http::Response> Translate(RequestContext& ctx) override;

 private:
  WebhookStageOptions options_;
};

}  // namespace idemgate::gateway
