#include "gateway/identity_stage.h"

#include <openssl/evp.h>

#include <algorithm>
#include <chrono>

#include "common/ascii.h"
#include "common/digest.h"
#include "core/decision.h"
#include "core/fingerprint.h"
#include "gateway/route_table.h"
#include "http/problem.h"
#include "identity/api_keys.h"
#include "identity/claims.h"
#include "identity/trusted_headers.h"

namespace idemgate::gateway {

namespace {

// The headers that carry the verified caller upstream in the jwt and
// api_key modes (the trusted_headers defaults, so one upstream reads the
// same names whichever mode is in front of it).
const config::TrustedHeaders kUpstreamIdentityHeaders{};

constexpr std::size_t kMinHs256SecretBytes = 32;

// "Bearer <credentials>" (the scheme case-insensitive); nullopt otherwise.
std::optional<std::string_view> BearerCredentials(std::string_view value) {
  constexpr std::string_view kScheme = "bearer";
  if (value.size() <= kScheme.size() + 1 || !StartsWithIgnoreCaseAscii(value, kScheme)) return std::nullopt;
  if (value[kScheme.size()] != ' ') return std::nullopt;
  std::string_view rest = value.substr(kScheme.size() + 1);
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  while (!rest.empty() && (rest.back() == ' ' || rest.back() == '\t')) rest.remove_suffix(1);
  if (rest.empty()) return std::nullopt;
  return rest;
}

// The only value of header `name`; an error naming it when it is absent or repeated.
StatusOr<std::string_view> SingleHeader(const http::RequestHead& head, std::string_view name) {
  std::optional<std::string_view> found;
  for (const http::HeaderView& h : head.headers) {
    if (!core::HeaderNameEquals(h.name, name)) continue;
    if (found) return InvalidArgumentError("the " + std::string(name) + " header appears more than once");
    found = h.value;
  }
  if (!found) return NotFoundError("the " + std::string(name) + " header is missing");
  return *found;
}

}  // namespace

const config::TrustedHeaders& UpstreamIdentityHeaders(const config::Identity& identity) {
  return identity.mode == config::IdentityMode::kTrustedHeaders ? identity.trusted_headers
                                                                 : kUpstreamIdentityHeaders;
}

void DropIdentityLookalikes(RequestContext& ctx, const config::TrustedHeaders& names) {
  for (const http::HeaderView& h : ctx.head->headers) {
    if (h.name.find('_') == std::string_view::npos) continue;
    for (const std::string* name : {&names.tenant, &names.project, &names.subject}) {
      if (EqualsIgnoreCaseDashOrUnderscore(h.name, *name) && !core::HeaderNameEquals(h.name, *name)) {
        ctx.remove_headers.emplace_back(h.name);
        break;
      }
    }
  }
}

void DropClientIdentity(RequestContext& ctx, const config::TrustedHeaders& names) {
  for (const http::HeaderView& h : ctx.head->headers) {
    for (const std::string* name : {&names.tenant, &names.project, &names.subject}) {
      if (EqualsIgnoreCaseDashOrUnderscore(h.name, *name)) {
        ctx.remove_headers.emplace_back(h.name);
        break;
      }
    }
  }
}

void SetUpstreamIdentity(RequestContext& ctx, const config::TrustedHeaders& names) {
  // trusted_headers under names of its own: a client's lines under the
  // default names (which jwt and api_key set, and which an upstream shared
  // with such a deployment reads) are not the caller's either.
  if (names.tenant != kUpstreamIdentityHeaders.tenant || names.project != kUpstreamIdentityHeaders.project ||
      names.subject != kUpstreamIdentityHeaders.subject) {
    DropClientIdentity(ctx, kUpstreamIdentityHeaders);
  }
  DropIdentityLookalikes(ctx, names);
  for (const std::string* name : {&names.tenant, &names.project, &names.subject}) ctx.remove_headers.push_back(*name);
  ctx.set_headers.push_back({names.tenant, ctx.tenant});
  ctx.set_headers.push_back({names.project, ctx.project});
  ctx.set_headers.push_back({names.subject, ctx.subject});
}

StatusOr<std::shared_ptr<const IdentityCredentials>> IdentityCredentials::Load(const config::Identity& identity,
                                                                              const EnvLookup& env) {
  auto credentials = std::make_shared<IdentityCredentials>();
  if (identity.mode == config::IdentityMode::kJwt) {
    const config::JwtIdentity& j = identity.jwt;
    std::vector<identity::JwtKey> keys;
    for (std::size_t i = 0; i < j.public_keys.size(); ++i) {
      const config::JwtPublicKey& k = j.public_keys[i];
      const std::string where = "identity.jwt.public_keys[" + std::to_string(i) + "] (" + k.file + ")";
      StatusOr<std::string> pem = ReadWholeFile(k.file);
      if (!pem.ok()) return InvalidArgumentError(where + ": " + pem.status().message());
      const auto alg = identity::JwtAlgorithmFromName(k.alg);
      if (!alg) return InvalidArgumentError(where + ": unknown algorithm " + k.alg);
      StatusOr<identity::JwtKey> key = identity::JwtVerifier::KeyFromPem(*pem, *alg, k.kid);
      if (!key.ok()) return InvalidArgumentError(where + ": " + key.status().message());
      keys.push_back(std::move(*key));
    }
    if (!j.jwks_file.empty()) {
      const std::string where = "identity.jwt.jwks_file (" + j.jwks_file + ")";
      StatusOr<std::string> text = ReadWholeFile(j.jwks_file);
      if (!text.ok()) return InvalidArgumentError(where + ": " + text.status().message());
      StatusOr<std::vector<identity::JwtKey>> jwks = identity::JwtVerifier::KeysFromJwks(*text);
      if (!jwks.ok()) return InvalidArgumentError(where + ": " + jwks.status().message());
      for (identity::JwtKey& key : *jwks) keys.push_back(std::move(key));
    }
    if (!j.secret_env.empty() || !j.secret_file.empty()) {
      StatusOr<std::string> secret = ReadSecret(j.secret_env, j.secret_file, env);
      if (!secret.ok()) return InvalidArgumentError("identity.jwt: " + secret.status().message());
      // RFC 7518 §3.2: an HS256 key is at least as long as the hash.
      if (secret->size() < kMinHs256SecretBytes) {
        return InvalidArgumentError("identity.jwt: the HS256 secret is shorter than " +
                                    std::to_string(kMinHs256SecretBytes) + " bytes");
      }
      // A key given as the HMAC secret makes whoever holds it (a public key:
      // anyone) able to sign tokens with HS256.
      if (secret->find("-----BEGIN") != std::string::npos || secret->find("\"kty\"") != std::string::npos) {
        return InvalidArgumentError(
            "identity.jwt: the HS256 secret is a PEM or JWK key; give RSA and EC keys as public_keys or a JWKS, "
            "never as the HMAC secret (anyone holding a public key could then sign HS256 tokens)");
      }
      keys.push_back(identity::JwtVerifier::KeyFromSecret(std::move(*secret)));
    }
    identity::JwtRules rules;
    for (const std::string& name : j.algorithms) {
      if (const auto alg = identity::JwtAlgorithmFromName(name)) rules.algorithms.push_back(*alg);
    }
    rules.issuer = j.issuer;
    rules.audience = j.audience;
    rules.leeway_seconds = std::chrono::duration_cast<std::chrono::seconds>(j.leeway).count();
    rules.require_exp = j.require_exp;
    credentials->jwt_.emplace(std::move(keys), std::move(rules));
  } else if (identity.mode == config::IdentityMode::kApiKey) {
    const std::string& file = identity.api_key.keys_file;
    StatusOr<std::string> text = ReadWholeFile(file);
    if (!text.ok()) return InvalidArgumentError("identity.api_key.keys_file: " + text.status().message());
    auto keys = identity::ParseApiKeys(*text, file);
    if (!keys.ok()) return keys.status();
    credentials->api_keys_ = std::move(*keys);
  }
  return std::shared_ptr<const IdentityCredentials>(std::move(credentials));
}

const core::Caller* IdentityCredentials::FindApiKey(std::string_view key) const {
  auto it = api_keys_.find(Sha256Hex(key));
  return it == api_keys_.end() ? nullptr : &it->second;
}

IdentityStage::IdentityStage(IdentityStageOptions options) : options_(options) {}

std::optional<http::Response> IdentityStage::Identify(RequestContext& ctx) {
  const config::Identity& identity = ctx.config->identity;
  // A webhook's sender is identified by its endpoint and signature (webhook_stage.h).
  if (ctx.route != nullptr && ctx.route->idempotency.policy == config::Policy::kWebhook) {
    if (identity.mode == config::IdentityMode::kApiKey) {
      // No key is read here, and none is forwarded either: what a caller
      // sent as an API key (in any spelling, or as a Bearer credential)
      // stays away from the upstream on every route.
      ctx.remove_headers.push_back(identity.api_key.header);
      DropHeaderLookalikes(ctx, identity.api_key.header);
      for (const http::HeaderView& h : ctx.head->headers) {
        if (EqualsIgnoreCaseAscii(h.name, "authorization") && BearerCredentials(h.value)) {
          ctx.remove_headers.push_back("Authorization");
          break;
        }
      }
    }
    return std::nullopt;
  }
  if (identity.mode == config::IdentityMode::kNone) {
    // SPEC §6: client-sent identity headers are dropped in every mode; here
    // nothing takes their place, and an upstream reading them sees none.
    DropClientIdentity(ctx, kUpstreamIdentityHeaders);
    return std::nullopt;
  }

  // `invalid`: a credential was presented and is not good (RFC 6750 §3:
  // error="invalid_token"); otherwise none was, and the challenge has no error.
  auto refuse = [&ctx, &identity](const std::string& why, bool invalid = false) {
    ctx.log.outcome = "unauthenticated";
    http::Response r = http::MakeProblem(http::ProblemCode::kUnauthenticated, why);
    // RFC 9110 §11.6.1: a 401 carries a challenge. trusted_headers has none
    // to offer: its caller authenticates with the layer in front.
    if (identity.mode == config::IdentityMode::kJwt || identity.mode == config::IdentityMode::kApiKey) {
      r.headers.push_back(
          {"WWW-Authenticate", invalid ? "Bearer realm=\"idemgate\", error=\"invalid_token\"" : "Bearer realm=\"idemgate\""});
    }
    return r;
  };
  StatusOr<core::Caller> caller = core::Caller{};  // every mode below sets it
  std::vector<std::string_view> credential_headers;  // api_key: where the key came, kept from the upstream
  switch (identity.mode) {
    case config::IdentityMode::kNone: return std::nullopt;
    case config::IdentityMode::kTrustedHeaders:
      caller = identity::CallerFromTrustedHeaders(ctx.head->headers, identity.trusted_headers);
      break;
    case config::IdentityMode::kJwt: {
      const identity::JwtVerifier* verifier = ctx.identity != nullptr ? ctx.identity->jwt() : nullptr;
      if (verifier == nullptr) return refuse("no token verifier is configured");
      StatusOr<std::string_view> authorization = SingleHeader(*ctx.head, "authorization");
      if (!authorization.ok()) return refuse(authorization.status().message() + " (a Bearer token is needed)");
      const std::optional<std::string_view> token = BearerCredentials(*authorization);
      if (!token) return refuse("the Authorization header does not hold a Bearer token");
      // The keys fetched from identity.jwt.jwks_url, held for this request only.
      JwksRefresher* const jwks = identity.jwt.jwks_url.empty() ? nullptr : options_.jwks;
      const std::shared_ptr<const std::vector<identity::JwtKey>> fetched =
          jwks != nullptr ? jwks->Keys() : nullptr;
      bool unknown_kid = false;
      StatusOr<boost::json::object> claims =
          verifier->Verify(*token, options_.clock->NowMillis() / 1000, fetched.get(), &unknown_kid);
      if (!claims.ok()) {
        if (unknown_kid && jwks != nullptr) jwks->RequestRefresh();
        return refuse("the bearer token is not valid: " + claims.status().message(), true);
      }
      caller = identity::CallerFromClaims(*claims, identity.jwt);
      break;
    }
    case config::IdentityMode::kApiKey: {
      if (ctx.identity == nullptr) return refuse("no API keys are configured");
      StatusOr<std::string_view> in_header = SingleHeader(*ctx.head, identity.api_key.header);
      StatusOr<std::string_view> authorization = SingleHeader(*ctx.head, "authorization");
      std::optional<std::string_view> key;
      if (in_header.ok()) {
        // An empty line holds no key (as an empty Bearer holds none), and
        // is not forwarded either.
        if (!in_header->empty()) key = *in_header;
        credential_headers.push_back(identity.api_key.header);
      } else if (in_header.status().code() != StatusCode::kNotFound) {
        return refuse(in_header.status().message());
      }
      if (authorization.ok()) {
        const std::optional<std::string_view> bearer = BearerCredentials(*authorization);
        if (bearer && key && *bearer != *key) return refuse("two different API keys were sent");
        if (bearer) {
          key = bearer;
          credential_headers.push_back("Authorization");
        }
      }
      if (!key || key->empty()) {
        return refuse("an API key is needed (" + identity.api_key.header + " or Authorization: Bearer)");
      }
      const core::Caller* found = ctx.identity->FindApiKey(*key);
      if (found == nullptr) return refuse("unknown API key", true);
      caller = *found;
      break;
    }
  }
  if (!caller.ok()) return refuse(caller.status().message());
  ctx.tenant = std::move(caller->tenant);
  ctx.project = std::move(caller->project);
  ctx.subject = std::move(caller->subject);

  // trusted_headers too: the layer in front set the real ones, which the
  // upstream gets as the gateway's own lines, so a client's Connection
  // naming them (hop-by-hop removal) cannot take them away from a request
  // stored under them.
  SetUpstreamIdentity(ctx, UpstreamIdentityHeaders(identity));
  if (identity.mode == config::IdentityMode::kApiKey) {
    // The key is not forwarded, in no spelling (X_API_Key: CGI-style
    // upstreams read it as X-API-Key).
    for (std::string_view name : credential_headers) ctx.remove_headers.push_back(std::string(name));
    DropHeaderLookalikes(ctx, identity.api_key.header);
  }
  return std::nullopt;
}

}  // namespace idemgate::gateway
