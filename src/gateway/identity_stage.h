#pragma once

#include "gateway/hooks.h"

// SPEC §2 step 3 for the identity modes this build has: `none` (every caller
// is (_, _, _)) and `trusted_headers` (identity/trusted_headers.h; a request
// without a usable identity gets 401 unauthenticated). Reads the mode from
// the request's config snapshot, so a reload applies to the next request.
// Stateless; safe to share between workers.
namespace idemgate::gateway {

class IdentityStage final : public IdentityHook {
 public:
  std::optional<http::Response> Identify(RequestContext& ctx) override;
};

}  // namespace idemgate::gateway
