#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "common/clock.h"
#include "common/secrets.h"
#include "common/status.h"
#include "core/scope.h"
#include "gateway/hooks.h"
#include "gateway/jwks_refresher.h"
#include "identity/jwt.h"

// SPEC §2 step 3 for every identity mode (SPEC §6):
//  - `none`: every caller is (_, _, _);
//  - `trusted_headers` (identity/trusted_headers.h): three headers set by an
//    authenticating layer in front;
//  - `jwt`: `Authorization: Bearer <token>` verified (identity/jwt.h), the
//    caller read from the token's claims; the keys come from the snapshot's
//    credentials and, with identity.jwt.jwks_url, from a JwksRefresher;
//  - `api_key`: the key in the configured header (or `Authorization: Bearer`)
//    looked up by its SHA-256 in a keys file.
// A request without a usable identity gets 401 unauthenticated (with a
// `WWW-Authenticate: Bearer` challenge in the jwt and api_key modes). With
// jwt and api_key, the identity headers a client sent are removed and the
// verified caller is set on the upstream request (X-Tenant-Id, X-Project-Id,
// X-Subject); api_key also keeps the key itself (in any '_' spelling) from
// the upstream. With trusted_headers, the caller read from the configured
// headers is set on the upstream request under them the same way, so the
// upstream always gets the identity the request was scoped under (a client's
// Connection naming them does not remove the gateway's lines). Webhook
// routes are identified by their endpoint instead (webhook_stage.h), and set
// the endpoint's caller the same way in every mode. In every mode but none,
// header names that differ from an identity header only in '-' against '_'
// (`X_Tenant_Id`) are removed: CGI-style upstreams read both spellings as
// the same variable.
namespace idemgate::gateway {

// The names the verified caller is sent upstream under: the configured
// trusted headers in that mode, else X-Tenant-Id, X-Project-Id, X-Subject.
const config::TrustedHeaders& UpstreamIdentityHeaders(const config::Identity& identity);

// Removes from the upstream request every header a client sent under one of
// `names` spelled with '_' for '-' (or mixed), keeping the names themselves.
void DropIdentityLookalikes(RequestContext& ctx, const config::TrustedHeaders& names);

// Removes the identity headers under `names` the client sent, in any
// spelling (`_` for `-`), putting nothing in their place (identity mode none).
void DropClientIdentity(RequestContext& ctx, const config::TrustedHeaders& names);

// Replaces the identity headers the client sent (and their look-alikes) with
// ctx's caller under `names`.
void SetUpstreamIdentity(RequestContext& ctx, const config::TrustedHeaders& names);

// What jwt and api_key verify with, read from the files and variables the
// config names. Immutable; one per config snapshot.
class IdentityCredentials {
 public:
  // Reads the JWT keys (PEM files, a JWKS file, the HS256 secret; a
  // jwks_url is JwksRefresher's business, not read here) or the API
  // keys file for `identity`'s mode; nothing for the other modes. Fails,
  // naming the key and the file, on anything unreadable or malformed.
  static StatusOr<std::shared_ptr<const IdentityCredentials>> Load(const config::Identity& identity,
                                                                  const EnvLookup& env);

  const identity::JwtVerifier* jwt() const { return jwt_ ? &*jwt_ : nullptr; }
  // The caller of an API key (as presented), or null.
  const core::Caller* FindApiKey(std::string_view key) const;
  std::size_t api_key_count() const { return api_keys_.size(); }

 private:
  std::optional<identity::JwtVerifier> jwt_;
  std::unordered_map<std::string, core::Caller> api_keys_;  // by lower-case hex SHA-256 of the key
};

struct IdentityStageOptions {
  // The time for a JWT's exp and nbf; must outlive the stage.
  const Clock* clock = &SystemClock::Instance();
  // The keys of identity.jwt.jwks_url (null: that setting is ignored); must
  // outlive the stage. When the request's snapshot has a jwks_url, tokens are
  // verified with its keys too, and a token naming an unknown kid asks it for
  // a refresh (rate-limited there).
  JwksRefresher* jwks = nullptr;
};

// Reads the mode from the request's config snapshot and the credentials
// from ctx.identity, so a reload applies to the next request. Stateless;
// safe to share between workers.
class IdentityStage final : public IdentityHook {
 public:
  explicit IdentityStage(IdentityStageOptions options = {});
  std::optional<http::Response> Identify(RequestContext& ctx) override;

 private:
  IdentityStageOptions options_;
};

}  // namespace idemgate::gateway
