#pragma once

#include <algorithm>

#include "config/config.h"

// The values a route uses where config.h leaves a member unset on purpose
// (SPEC §11). Pure, safe from any thread.
namespace idemgate::config {

inline constexpr Duration kLeaseMargin = std::chrono::seconds(5);

// The route's scope, else subject when the caller is identified (an
// identity mode is configured, or the route is a webhook's, whose endpoint
// names the tenant and project), else global.
inline Scope EffectiveScope(const Idempotency& idempotency, const Identity& identity) {
  if (idempotency.scope) return *idempotency.scope;
  if (idempotency.policy == Policy::kWebhook) return Scope::kSubject;
  return identity.mode == IdentityMode::kNone ? Scope::kGlobal : Scope::kSubject;
}

// Whether the gateway reserves and stores keys on a route with these
// settings: policy required, optional or webhook, deduplicated by the gateway
// (not dedup: upstream).
inline bool StoresKeys(const Idempotency& idempotency) {
  const bool keyed = idempotency.policy == Policy::kRequired || idempotency.policy == Policy::kOptional ||
                     idempotency.policy == Policy::kWebhook;
  return keyed && idempotency.dedup == DedupMode::kGateway;
}

// The route's lease, else its upstream's timeout + 5s.
inline Duration EffectiveLease(const Idempotency& idempotency, const Upstream& upstream) {
  if (idempotency.lease) return *idempotency.lease;
  return upstream.timeout + kLeaseMargin;
}

// How long before its lease ends a keyed exchange must be over: a tenth of
// the lease, at most a second, left to store the outcome. A keyed request is
// sent upstream only while its upstream's timeout still fits before that.
inline Duration LeaseMargin(Duration lease) { return std::min<Duration>(lease / 10, std::chrono::seconds(1)); }

// The least time a route's lease leaves, beyond its upstream's timeout and
// the LeaseMargin, to get an upstream connection: a lease without it would
// let no keyed request be sent.
inline constexpr Duration kLeaseConnectAllowance = std::chrono::milliseconds(100);

// The shortest lease a route whose upstream has `timeout` may have.
inline Duration LeastLease(Duration timeout) {
  const Duration needed = timeout + kLeaseConnectAllowance;
  Duration least = needed + std::min<Duration>(needed / 9, std::chrono::seconds(1));
  while (least - LeaseMargin(least) < needed) ++least;
  return least;
}

// The route's body limit, else limits.max_request_bytes.
inline std::uint64_t EffectiveMaxRequestBytes(const Route& route, const Limits& limits) {
  return route.max_request_bytes ? *route.max_request_bytes : limits.max_request_bytes;
}

}  // namespace idemgate::config
