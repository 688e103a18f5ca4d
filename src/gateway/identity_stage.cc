#include "gateway/identity_stage.h"

#include "gateway/route_table.h"
#include "http/problem.h"
#include "identity/trusted_headers.h"

namespace idemgate::gateway {

std::optional<http::Response> IdentityStage::Identify(RequestContext& ctx) {
  const config::Identity& identity = ctx.config->identity;
  if (identity.mode != config::IdentityMode::kTrustedHeaders) return std::nullopt;
  // A webhook's sender is identified by its endpoint and signature (webhook_stage.h).
  if (ctx.route != nullptr && ctx.route->idempotency.policy == config::Policy::kWebhook) return std::nullopt;
  StatusOr<core::Caller> caller = identity::CallerFromTrustedHeaders(ctx.head->headers, identity.trusted_headers);
  if (!caller.ok()) {
    ctx.log.outcome = "unauthenticated";
    return http::MakeProblem(http::ProblemCode::kUnauthenticated, caller.status().message());
  }
  ctx.tenant = std::move(caller->tenant);
  ctx.project = std::move(caller->project);
  ctx.subject = std::move(caller->subject);
  return std::nullopt;
}

}  // namespace idemgate::gateway
