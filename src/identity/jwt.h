#pragma once

#include <boost/json/object.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

// identity.mode: jwt (SPEC §6): verification of a compact JWS (RFC 7515) bearer
// token signed with HS256, RS256 or ES256 (RFC 7518), and its registered time,
// issuer and audience claims (RFC 7519). Keys come from PEM public keys, a
// JWKS document (RFC 7517) or a shared secret; they are parsed once into a
// JwtVerifier, which is immutable and safe to share between threads. Keys
// that change at run time (a JWKS fetched from a URL) are passed to Verify.
namespace idemgate::identity {

enum class JwtAlgorithm { kHs256, kRs256, kEs256 };

// "HS256", "RS256", "ES256"; nullopt for anything else (including "none").
std::optional<JwtAlgorithm> JwtAlgorithmFromName(std::string_view name);
std::string_view JwtAlgorithmName(JwtAlgorithm algorithm);

struct JwtRules {
  std::vector<JwtAlgorithm> algorithms;  // accepted; a token with another `alg` is refused
  std::string issuer;                    // when set, `iss` must equal it
  std::string audience;                  // when set, `aud` (a string or an array of strings) must contain it
  std::int64_t leeway_seconds = 0;       // allowed clock skew for exp and nbf
  bool require_exp = true;               // a token without `exp` is refused
};

// One verification key.
struct JwtKey {
  std::string kid;  // empty: the key is also tried for tokens that name a kid
  JwtAlgorithm algorithm = JwtAlgorithm::kRs256;
  std::string secret;                    // kHs256: the shared secret's bytes
  std::shared_ptr<const void> public_key;  // kRs256/kEs256: an EVP_PKEY, owned (opaque here)
};

class JwtVerifier {
 public:
  // Parses a PEM public key ("-----BEGIN PUBLIC KEY-----", SubjectPublicKeyInfo)
  // for `algorithm` (an RSA key of at least 2048 bits for RS256, a P-256 key
  // for ES256). InvalidArgument with a reason otherwise.
  static StatusOr<JwtKey> KeyFromPem(std::string_view pem, JwtAlgorithm algorithm, std::string kid = {});
  // Parses a JWKS document: every key with "kty" RSA (n, e) or EC (crv
  // P-256, x, y) whose "use" is absent or "sig"; its "alg" when present must
  // be RS256 or ES256 matching the key type (else the key is skipped), and
  // when absent RSA means RS256 and EC P-256 means ES256. Keys of other
  // types are skipped. InvalidArgument when the text is not a JWKS or no key
  // is usable.
  static StatusOr<std::vector<JwtKey>> KeysFromJwks(std::string_view jwks);
  static JwtKey KeyFromSecret(std::string secret, std::string kid = {});

  JwtVerifier(std::vector<JwtKey> keys, JwtRules rules);

  // Verifies `token` (the compact serialization, without "Bearer ") at
  // `now_unix_seconds` and returns its claims set. Fails (InvalidArgument,
  // with a short reason that never echoes the token) when:
  //  - the token is not three base64url parts (no padding);
  //  - the header is not a JSON object with a string `alg` among the
  //    rules' algorithms (so "none" is always refused), an optional string
  //    `kid`, an optional `typ` that is "JWT" or "at+jwt" (RFC 9068 access
  //    tokens), case-insensitive, with or without an "application/" prefix,
  //    and no `crit`;
  //  - no key of that algorithm matches: with a `kid`, the keys of the
  //    token's algorithm with that kid (or without a kid); without one,
  //    every key of the token's algorithm is tried;
  //  - the signature does not verify (ES256: the JOSE r||s form, 64 bytes);
  //  - the payload is not a JSON object; `exp` (a number) is at or before
  //    now - leeway, or absent while required; `nbf` is after now + leeway;
  //    `iss` or `aud` do not match the rules.
  //
  // `more_keys` (may be null; only read during the call, never copied) are
  // candidates too, after the verifier's own keys: the keys of a JWKS fetched
  // from a URL, which change while the verifier stays (gateway/jwks_refresher.h).
  // When `unknown_kid` is given it is set to whether the token failed at the
  // key or signature step while naming a `kid` that no key of its algorithm
  // has (a key without a kid does not count): a sign that the issuer rotated
  // to a key not fetched yet. It is false for every other outcome.
  StatusOr<boost::json::object> Verify(std::string_view token, std::int64_t now_unix_seconds,
                                       const std::vector<JwtKey>* more_keys = nullptr,
                                       bool* unknown_kid = nullptr) const;

 private:
  std::vector<JwtKey> keys_;
  JwtRules rules_;
};

}  // namespace idemgate::identity
