// JWT verification (SPEC §6, identity::JwtVerifier::Verify) and the caller
// its claims map to (CallerFromClaims), with an HS256 secret and the RS256
// and ES256 keys of tests/identity/jwt_test.cc. The first byte's low bit
// picks what the rest is:
//  - 0: a token, verified as given at a fixed time under strict rules (iss,
//    aud, exp required) and lax ones. Checked: a token that verifies has the
//    signature this target computes or checks itself with OpenSSL under the
//    key of its alg, an allowed alg, a typ of JWT or at+jwt (RFC 9068, with
//    or without "application/") if any, no crit, claims
//    equal to its payload that pass the time, iss and aud rules as this
//    target reads them; a refusal has a short reason and never reports an
//    unknown kid together with success.
//  - 1: choices for a token signed here (alg, kid, typ, iss, aud, exp, nbf,
//    tenant/project/sub values of any bytes). Checked: it verifies exactly
//    when the rules say it should, to the claims written, which map to the
//    expected caller; and changing any one character of it, or signing it
//    with another key, makes it fail.

#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/evp.h>

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../tests/fakes/test_keys.h"
#include "config/config.h"
#include "fuzz_input.h"
#include "fuzz_reference.h"
#include "fuzz_target.h"
#include "identity/claims.h"
#include "identity/jwt.h"

namespace {

namespace identity = idemgate::identity;
namespace json = boost::json;
using idemgate::fuzz::Base64Url;
using idemgate::fuzz::Base64UrlDecode;
using idemgate::fuzz::DigestSign;
using idemgate::fuzz::Es256Sign;
using idemgate::fuzz::Hmac;
using idemgate::fuzz::IsCallerComponent;
using idemgate::fuzz::JsonString;
using idemgate::fuzz::PrivateKey;
using idemgate::fuzz::Reader;
using idemgate::testing::EcdsaSigPtr;
using idemgate::testing::MdCtxPtr;
using idemgate::testing::PkeyPtr;
using identity::JwtAlgorithm;
using identity::JwtKey;
using identity::JwtRules;
using identity::JwtVerifier;

constexpr std::int64_t kNow = 1700000000;
constexpr std::int64_t kLeeway = 30;
constexpr std::string_view kSecret = "fuzz jwt secret, thirty-two bytes";
constexpr std::string_view kIssuer = "https://issuer.example";
constexpr std::string_view kAudience = "idemgate";

// The keys of tests/identity/jwt_test.cc (tests/fakes/test_keys.h): RSA A, EC A, and EC B for
// "signed by someone else".
struct Keys {
  PkeyPtr rsa = PrivateKey(idemgate::testing::kRsaAPrivate);
  PkeyPtr ec = PrivateKey(idemgate::testing::kEcPrivate);
  PkeyPtr ec_other = PrivateKey(idemgate::testing::kEcBPrivate);
  // kid "hs" and "rsa-a"; the EC key has none, so it is tried for any kid.
  std::vector<JwtKey> verifier_keys = [] {
    auto rsa_key =
        JwtVerifier::KeyFromPem(idemgate::testing::kRsaAPublic, JwtAlgorithm::kRs256, "rsa-a");
    auto ec_key = JwtVerifier::KeyFromPem(idemgate::testing::kEcPublic, JwtAlgorithm::kEs256);
    FUZZ_CHECK(rsa_key.ok() && ec_key.ok());
    return std::vector<JwtKey>{JwtVerifier::KeyFromSecret(std::string(kSecret), "hs"), *rsa_key,
                               *ec_key};
  }();
  JwtVerifier strict{
      verifier_keys,
      JwtRules{.algorithms = {JwtAlgorithm::kHs256, JwtAlgorithm::kRs256, JwtAlgorithm::kEs256},
               .issuer = std::string(kIssuer),
               .audience = std::string(kAudience),
               .leeway_seconds = kLeeway,
               .require_exp = true}};
  JwtVerifier lax{
      verifier_keys,
      JwtRules{.algorithms = {JwtAlgorithm::kHs256, JwtAlgorithm::kEs256}, .require_exp = false}};
};

const Keys& TheKeys() {
  static const Keys keys;
  return keys;
}

// ---------------------------------------------------------------------------
// Signature checks, written here so that they check src/ rather than echo it (as are the
// encodings and signing, in fuzz_reference.h).

bool DigestVerifies(EVP_PKEY* key, std::string_view input, std::string_view signature) {
  MdCtxPtr ctx(EVP_MD_CTX_new());
  return EVP_DigestVerifyInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key) == 1 &&
         EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                          signature.size(), reinterpret_cast<const unsigned char*>(input.data()),
                          input.size()) == 1;
}

bool Es256Verifies(EVP_PKEY* key, std::string_view input, std::string_view raw) {
  if (raw.size() != 64) return false;
  const auto* bytes = reinterpret_cast<const unsigned char*>(raw.data());
  EcdsaSigPtr sig(ECDSA_SIG_new());
  BIGNUM* r = BN_bin2bn(bytes, 32, nullptr);
  BIGNUM* s = BN_bin2bn(bytes + 32, 32, nullptr);
  FUZZ_CHECK(sig != nullptr && r != nullptr && s != nullptr &&
             ECDSA_SIG_set0(sig.get(), r, s) == 1);
  unsigned char* der = nullptr;
  const int length = i2d_ECDSA_SIG(sig.get(), &der);
  FUZZ_CHECK(length > 0);
  const bool ok =
      DigestVerifies(key, input, std::string_view(reinterpret_cast<const char*>(der), length));
  OPENSSL_free(der);
  return ok;
}

std::optional<double> Number(const json::value& v) {
  if (v.is_int64()) return static_cast<double>(v.get_int64());
  if (v.is_uint64()) return static_cast<double>(v.get_uint64());
  if (v.is_double()) return v.get_double();
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Tokens as given

void CheckVerified(const JwtVerifier& verifier, bool strict, std::string_view token) {
  bool unknown_kid = true;
  const auto result = verifier.Verify(token, kNow, nullptr, &unknown_kid);
  if (!result.ok()) {
    FUZZ_CHECK(!result.status().message().empty() && result.status().message().size() <= 64);
    return;
  }
  FUZZ_CHECK(!unknown_kid);

  // Three parts, each base64url.
  const std::size_t a = token.find('.');
  FUZZ_CHECK(a != std::string_view::npos);
  const std::size_t b = token.find('.', a + 1);
  FUZZ_CHECK(b != std::string_view::npos && token.find('.', b + 1) == std::string_view::npos);
  const auto header_text = Base64UrlDecode(token.substr(0, a));
  const auto payload_text = Base64UrlDecode(token.substr(a + 1, b - a - 1));
  const auto signature = Base64UrlDecode(token.substr(b + 1));
  FUZZ_CHECK(header_text && payload_text && signature);
  // Canonical: each part is the one encoding of its bytes.
  FUZZ_CHECK(Base64Url(*header_text) == token.substr(0, a));
  FUZZ_CHECK(Base64Url(*payload_text) == token.substr(a + 1, b - a - 1));
  FUZZ_CHECK(Base64Url(*signature) == token.substr(b + 1));

  boost::system::error_code ec;
  const json::value header = json::parse(*header_text, ec);
  FUZZ_CHECK(!ec && header.is_object());
  const json::object& h = header.get_object();
  FUZZ_CHECK(!h.contains("crit"));
  if (const json::value* typ = h.if_contains("typ")) {
    FUZZ_CHECK(typ->is_string());
    std::string lower(typ->get_string());
    for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
    if (lower.starts_with("application/")) lower.erase(0, 12);
    FUZZ_CHECK(lower == "jwt" || lower == "at+jwt");
  }
  const json::value* alg = h.if_contains("alg");
  FUZZ_CHECK(alg != nullptr && alg->is_string());
  const std::string_view signing_input = token.substr(0, b);
  const Keys& keys = TheKeys();
  if (alg->get_string() == "HS256") {
    FUZZ_CHECK(*signature == Hmac(EVP_sha256(), kSecret, signing_input));
  } else if (alg->get_string() == "RS256") {
    FUZZ_CHECK(strict && DigestVerifies(keys.rsa.get(), signing_input, *signature));
  } else {
    FUZZ_CHECK(alg->get_string() == "ES256" &&
               Es256Verifies(keys.ec.get(), signing_input, *signature));
  }

  const json::value payload = json::parse(*payload_text, ec);
  FUZZ_CHECK(!ec && payload.is_object() && payload.get_object() == *result);
  const json::object& claims = *result;
  const json::value* exp = claims.if_contains("exp");
  FUZZ_CHECK(exp != nullptr || !strict);
  if (exp != nullptr) {
    const auto at = Number(*exp);
    FUZZ_CHECK(at && std::isfinite(*at) &&
               *at > static_cast<double>(kNow - (strict ? kLeeway : 0)) - 1);
  }
  if (const json::value* nbf = claims.if_contains("nbf")) {
    const auto at = Number(*nbf);
    FUZZ_CHECK(at && std::isfinite(*at) &&
               *at <= static_cast<double>(kNow + (strict ? kLeeway : 0)) + 1);
  }
  if (strict) {
    const json::value* iss = claims.if_contains("iss");
    FUZZ_CHECK(iss != nullptr && iss->is_string() && iss->get_string() == kIssuer);
    const json::value* aud = claims.if_contains("aud");
    FUZZ_CHECK(aud != nullptr);
    bool found = aud->is_string() && aud->get_string() == kAudience;
    if (aud->is_array()) {
      for (const json::value& v : aud->get_array()) {
        FUZZ_CHECK(v.is_string());
        found = found || v.get_string() == kAudience;
      }
    }
    FUZZ_CHECK(found);
  }
}

// ---------------------------------------------------------------------------
// Tokens signed here

void CheckSigned(std::string_view data) {
  const Keys& keys = TheKeys();
  Reader in(data);
  const std::uint8_t algs = in.Byte();
  const std::uint8_t header_flags = in.Byte();
  const std::uint8_t claim_flags = in.Byte();

  // The header. RS256 signing is slow: one token in eight.
  const JwtAlgorithm algorithm = (algs & 7) == 0 ? JwtAlgorithm::kRs256
                                 : (algs & 1)    ? JwtAlgorithm::kEs256
                                                 : JwtAlgorithm::kHs256;
  const std::string_view alg = identity::JwtAlgorithmName(algorithm);
  bool ok = true;
  std::string header = "{\"alg\":\"" + std::string(alg) + "\"";
  switch (header_flags & 3) {
    case 0:
      break;
    case 1:  // its key's kid
      header += algorithm == JwtAlgorithm::kHs256 ? ",\"kid\":\"hs\""
                : algorithm == JwtAlgorithm::kRs256
                    ? ",\"kid\":\"rsa-a\""
                    : ",\"kid\":\"ec-1\"";  // not the EC key's: it has none
      break;
    case 2:  // a kid no key has: only the EC key, which has none, still serves it
      header += ",\"kid\":\"zzz\"";
      ok = ok && algorithm == JwtAlgorithm::kEs256;
      break;
    case 3:  // another key's kid
      header += algorithm == JwtAlgorithm::kHs256 ? ",\"kid\":\"rsa-a\"" : ",\"kid\":\"hs\"";
      ok = ok && algorithm == JwtAlgorithm::kEs256;
      break;
  }
  switch ((header_flags >> 2) & 3) {
    case 0:
      break;
    case 1:
      header += ",\"typ\":\"JWT\"";
      break;
    case 2:
      header += ",\"typ\":\"jwt\"";
      break;
    case 3:
      header += ",\"typ\":\"application/at+jwt\"";  // RFC 9068 access tokens are accepted too
      break;
  }
  if (header_flags & 0x10) {
    header += ",\"crit\":[\"exp\"]";
    ok = false;
  }
  header += "}";

  // The claims.
  std::string payload = "{";
  const auto member = [&](std::string_view name, std::string_view value) {
    if (payload.size() > 1) payload += ",";
    payload.append("\"").append(name).append("\":").append(value);
  };
  switch (claim_flags & 3) {
    case 0:
      ok = false;
      break;
    case 1:
      member("iss", "\"" + std::string(kIssuer) + "\"");
      break;
    case 2:
      member("iss", "\"https://issuer.example/\"");
      ok = false;
      break;
    case 3:
      member("iss", "[\"https://issuer.example\"]");
      ok = false;
      break;
  }
  switch ((claim_flags >> 2) & 3) {
    case 0:
      member("aud", "\"idemgate\"");
      break;
    case 1:
      member("aud", "[\"other\",\"idemgate\"]");
      break;
    case 2:
      member("aud", "[\"other\"]");
      ok = false;
      break;
    case 3:
      ok = false;
      break;
  }
  // exp: an integer, a fraction or nothing; nbf: an integer or nothing.
  const std::int64_t exp = kNow + in.Offset() % 100;
  if ((claim_flags & 0x30) == 0x30) {
    ok = false;
  } else if (claim_flags & 0x10) {
    member("exp", std::to_string(exp) + ".5");
    ok = ok && static_cast<double>(exp) + 0.5 > static_cast<double>(kNow - kLeeway);
  } else {
    member("exp", std::to_string(exp));
    ok = ok && exp > kNow - kLeeway;
  }
  const std::int64_t nbf = kNow + in.Offset() % 100;
  if (claim_flags & 0x40) {
    member("nbf", std::to_string(nbf));
    ok = ok && nbf <= kNow + kLeeway;
  }
  // tenant, project and sub: any bytes (as JSON escapes), or an integer for the tenant.
  std::string values[3];
  const char* names[3] = {"tenant", "project", "sub"};
  for (int i = 0; i < 3; ++i) {
    const std::size_t n = in.Byte() % 24;
    if (i == 0 && (claim_flags & 0x80)) {
      const std::int64_t number = static_cast<std::int16_t>(in.Word());
      values[i] = std::to_string(number);
      member(names[i], values[i]);
    } else {
      member(names[i], JsonString(in.Bytes(n), &values[i]));
    }
  }
  payload += "}";

  const std::string input = Base64Url(header) + "." + Base64Url(payload);
  const auto sign = [&](EVP_PKEY* ec_key, std::string_view secret) {
    switch (algorithm) {
      case JwtAlgorithm::kHs256:
        return Hmac(EVP_sha256(), secret, input);
      case JwtAlgorithm::kRs256:
        return DigestSign(keys.rsa.get(), input);
      case JwtAlgorithm::kEs256:
        return Es256Sign(ec_key, input);
    }
    return std::string();
  };
  const std::string token = input + "." + Base64Url(sign(keys.ec.get(), kSecret));

  bool unknown_kid = false;
  const auto result = keys.strict.Verify(token, kNow, nullptr, &unknown_kid);
  FUZZ_CHECK(result.ok() == ok);
  FUZZ_CHECK(!unknown_kid || (!ok && (header_flags & 3) >= 2));
  CheckVerified(keys.strict, true, token);
  if (ok) {
    boost::system::error_code ec;
    FUZZ_CHECK(json::parse(payload, ec) == json::value(*result) && !ec);
    // The caller: each component 1..256 visible characters; the sub typed "user:" unless it is
    // typed.
    const idemgate::config::JwtIdentity jwt;
    const auto caller = identity::CallerFromClaims(*result, jwt);
    const bool valid = IsCallerComponent(values[0]) && IsCallerComponent(values[1]) &&
                       IsCallerComponent(values[2]);
    FUZZ_CHECK(caller.ok() == valid);
    if (valid) {
      FUZZ_CHECK(caller->tenant == values[0] && caller->project == values[1]);
      bool typed = false;
      for (const std::string_view type : {"user:", "service:", "tenant_member:", "client:"}) {
        typed = typed || values[2].starts_with(type);
      }
      FUZZ_CHECK(caller->subject == (typed ? values[2] : "user:" + values[2]));
    }
  }

  // Any one character changed (to one of the alphabet or a '.'), or another signer: refused.
  const std::size_t at = std::size_t{in.Word()} % token.size();
  std::string changed = token;
  changed[at] = changed[at] == 'A' ? '.' : 'A';
  FUZZ_CHECK(!keys.strict.Verify(changed, kNow).ok());
  FUZZ_CHECK(!keys.lax.Verify(changed, kNow).ok());
  if (algorithm != JwtAlgorithm::kRs256) {
    const std::string forged = input + "." + Base64Url(sign(keys.ec_other.get(), "another secret"));
    FUZZ_CHECK(!keys.strict.Verify(forged, kNow).ok());
    FUZZ_CHECK(!keys.lax.Verify(forged, kNow).ok());
  }
  // The same header and claims with "alg":"none" and no signature.
  const std::string none = Base64Url(R"({"alg":"none"})") + "." + Base64Url(payload) + ".";
  FUZZ_CHECK(!keys.strict.Verify(none, kNow).ok() && !keys.lax.Verify(none, kNow).ok());
}

// A token as given, under both rule sets.
void CheckGiven(std::string_view token) {
  CheckVerified(TheKeys().strict, true, token);
  CheckVerified(TheKeys().lax, false, token);
}

}  // namespace

IDEMGATE_FUZZ_TARGET(jwt) { return idemgate::fuzz::ByLowBit(data, size, CheckSigned, CheckGiven); }
