#include "identity/claims.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

#include "config/names.h"
#include "identity/trusted_headers.h"

namespace idemgate::identity {

namespace {

// A claim's string value (a string, or an integer written in decimal).
std::optional<std::string> ClaimString(const boost::json::object& claims, const std::string& name) {
  const boost::json::value* v = claims.if_contains(name);
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) return std::string(v->get_string());
  if (v->is_int64()) return std::to_string(v->get_int64());
  if (v->is_uint64()) return std::to_string(v->get_uint64());
  return std::nullopt;
}

bool IsSubjectType(std::string_view type) {
  return std::find(std::begin(config::kSubjectTypes), std::end(config::kSubjectTypes), type) !=
         std::end(config::kSubjectTypes);
}

}  // namespace

// The caller named by a verified token's claims (SPEC §6): tenant, project
// and a typed subject "<type>:<id>".
StatusOr<core::Caller> CallerFromClaims(const boost::json::object& claims, const config::JwtIdentity& jwt) {
  core::Caller caller;
  const std::pair<const std::string*, std::string*> parts[] = {
      {&jwt.claims.tenant, &caller.tenant}, {&jwt.claims.project, &caller.project}, {&jwt.claims.subject, &caller.subject}};
  for (const auto& [claim, out] : parts) {
    std::optional<std::string> value = ClaimString(claims, *claim);
    if (!value || !IsIdentityComponent(*value)) {
      return InvalidArgumentError("the token's " + *claim + " claim is missing or not 1..256 visible characters");
    }
    *out = std::move(*value);
  }
  // The type the subject value carries itself ("service:billing"); empty when it has none.
  std::string_view own_type;
  const std::size_t colon = caller.subject.find(':');
  if (colon != std::string::npos && IsSubjectType(std::string_view(caller.subject).substr(0, colon))) {
    own_type = std::string_view(caller.subject).substr(0, colon);
  }
  // The type claim, when configured and present in the token, gives the type; a token without it
  // falls back to the subject's own type, then to the configured default.
  if (!jwt.claims.subject_type.empty() && claims.contains(jwt.claims.subject_type)) {
    std::optional<std::string> claimed = ClaimString(claims, jwt.claims.subject_type);
    if (!claimed || !IsSubjectType(*claimed)) {
      return InvalidArgumentError("the token's " + jwt.claims.subject_type +
                                  " claim is not one of user, service, tenant_member, client");
    }
    if (!own_type.empty()) {
      // Never "service:user:u1": a subject typed like the claim is kept, one typed otherwise is refused.
      if (own_type != *claimed) {
        return InvalidArgumentError("the token's " + jwt.claims.subject + " claim is typed " + std::string(own_type) +
                                    " but its " + jwt.claims.subject_type + " claim says " + *claimed);
      }
      return caller;
    }
    caller.subject = *claimed + ":" + caller.subject;
    return caller;
  }
  if (own_type.empty()) caller.subject = jwt.subject_type + ":" + caller.subject;
  return caller;
}

}  // namespace idemgate::identity
