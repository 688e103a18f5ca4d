#pragma once

#include "config/config.h"
#include "core/engine.h"
#include "gateway/hooks.h"

namespace idemgate::admin {
class GatewayMetrics;
}

// SPEC §2 step 5 over core::Engine: the route's policy, the key header
// (§3), the scope rewrite (§3.1), the fingerprint (§3.2), the decision
// (§4.2) and, for a request that proceeds, an observer that stores or
// releases the reservation once the upstream has answered (§4.3).
namespace idemgate::gateway {

struct IdempotencyStageOptions {
  // store.on_error: what a request does when the store fails at its decision.
  config::OnError on_error = config::OnError::kFailClosed;
  // Optional; must outlive the stage.
  admin::GatewayMetrics* metrics = nullptr;
};

// Stateless per request; safe to share between workers. `engine` must
// outlive it.
class IdempotencyStage final : public IdempotencyHook {
 public:
  IdempotencyStage(core::Engine& engine, IdempotencyStageOptions options);

  // True for a keyed request that the engine will fingerprint: a handled
  // method on a `required`, `optional` or `webhook` route with
  // `dedup: gateway`, carrying the key header (or on a webhook route).
  bool WantsBody(RequestContext& ctx) override;

  // Never throws. Answers by itself (a replay, or a problem: 400
  // missing-key / invalid-key / key-prohibited / translation-failed, 409
  // request-in-flight, 422 key-reused, 503 store-unavailable) or forwards,
  // with an observer when the request holds a reservation.
  Task<IdempotencyDecision> Decide(RequestContext& ctx) override;

 private:
  // SPEC §8: `GET {route path}/by-idempotency-key/{key}[?wait=10s]` on a
  // route with `recovery: true`; `key` is the last path segment.
  Task<IdempotencyDecision> Recover(RequestContext& ctx, std::string_view key);

  core::Engine& engine_;
  IdempotencyStageOptions options_;
};

}  // namespace idemgate::gateway
