#pragma once

#include <string_view>
#include <vector>

#include "common/status.h"
#include "config/config.h"
#include "config/identity_component.h"
#include "core/fingerprint.h"
#include "core/scope.h"

// identity.mode: trusted_headers (SPEC §6): an authenticating layer in front
// of idemgate (an API gateway, a service mesh) has verified the caller and
// names it in three request headers. Only for deployments where clients
// cannot reach idemgate around that layer.
namespace idemgate::identity {

// The longest tenant, project or subject value accepted.
inline constexpr std::size_t kMaxComponentLength = config::kMaxIdentityComponentLength;

// Reads the caller from `headers` (every request header line, in order).
// Each of the three configured headers must appear exactly once with 1..256
// visible ASCII characters; InvalidArgument otherwise, with a message naming
// the header and what is wrong. Pure; thread-safe.
StatusOr<core::Caller> CallerFromTrustedHeaders(const std::vector<core::HeaderView>& headers,
                                                const config::TrustedHeaders& names);

}  // namespace idemgate::identity
