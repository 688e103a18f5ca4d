#include "identity/jwt.h"

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/param_build.h>
#include <openssl/pem.h>

#include <algorithm>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include <climits>
#include <cmath>
#include <cstddef>
#include <limits>
#include <utility>

#include "common/ascii.h"

namespace idemgate::identity {

namespace {

namespace json = boost::json;

constexpr std::size_t kMaxTokenLength = 16 * 1024;
constexpr std::size_t kMaxPemLength = 64 * 1024;
constexpr int kMinRsaBits = 2048;
// OpenSSL's own limit for RSA public key operations.
constexpr int kMaxRsaBits = 16384;
// The JWK "n" and "e" in bytes, with one leading zero byte tolerated in "n".
constexpr std::size_t kMaxRsaModulusBytes = kMaxRsaBits / 8 + 1;
constexpr std::size_t kMaxRsaExponentBytes = 64;
constexpr std::size_t kP256CoordinateSize = 32;

// ---------------------------------------------------------------------------
// OpenSSL ownership

template <auto Free>
struct Deleter {
  template <typename T>
  void operator()(T* p) const {
    Free(p);
  }
};

// OPENSSL_free is a macro; this gives it an address.
void FreeOpensslBytes(unsigned char* p) { OPENSSL_free(p); }

using BioPtr = std::unique_ptr<BIO, Deleter<BIO_free>>;
using BignumPtr = std::unique_ptr<BIGNUM, Deleter<BN_free>>;
using EcdsaSigPtr = std::unique_ptr<ECDSA_SIG, Deleter<ECDSA_SIG_free>>;
using MdCtxPtr = std::unique_ptr<EVP_MD_CTX, Deleter<EVP_MD_CTX_free>>;
using OpensslBytesPtr = std::unique_ptr<unsigned char, Deleter<FreeOpensslBytes>>;
using ParamBuildPtr = std::unique_ptr<OSSL_PARAM_BLD, Deleter<OSSL_PARAM_BLD_free>>;
using ParamPtr = std::unique_ptr<OSSL_PARAM, Deleter<OSSL_PARAM_free>>;
using PkeyCtxPtr = std::unique_ptr<EVP_PKEY_CTX, Deleter<EVP_PKEY_CTX_free>>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY_free>>;

// Drops the errors OpenSSL queues on this thread while in scope, so a refused key or token leaves
// nothing behind for unrelated code (a TLS stack reading ERR_get_error) to trip over.
class OpensslErrorScope {
 public:
  OpensslErrorScope() { ERR_set_mark(); }
  ~OpensslErrorScope() { ERR_pop_to_mark(); }
  OpensslErrorScope(const OpensslErrorScope&) = delete;
  OpensslErrorScope& operator=(const OpensslErrorScope&) = delete;
};

// Never null, even for an empty view (OpenSSL wants a pointer).
const unsigned char* BytesOf(std::string_view s) {
  static constexpr unsigned char kNothing = 0;
  return s.data() == nullptr ? &kNothing : reinterpret_cast<const unsigned char*>(s.data());
}

// The EVP_PKEY held by `key`, or null.
EVP_PKEY* PkeyOf(const JwtKey& key) { return static_cast<EVP_PKEY*>(const_cast<void*>(key.public_key.get())); }

// Hands `pkey` over to the type-erased, shared form JwtKey keeps.
std::shared_ptr<const void> SharePkey(PkeyPtr pkey) {
  return std::shared_ptr<const void>(
      pkey.release(), [](const void* p) { EVP_PKEY_free(static_cast<EVP_PKEY*>(const_cast<void*>(p))); });
}

// ---------------------------------------------------------------------------
// Encoding

// The 6-bit value of a base64url character, or -1 outside the URL-safe alphabet.
int Base64UrlValue(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '-') return 62;
  if (c == '_') return 63;
  return -1;
}

// Decodes unpadded base64url (RFC 7515 §2). nullopt on '=' or any other character outside the
// alphabet, on a length of 1 mod 4, and on non-zero bits left over in the last character (so that
// every byte string has exactly one accepted encoding).
std::optional<std::string> DecodeBase64Url(std::string_view in) {
  if (in.size() % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(in.size() / 4 * 3 + 2);
  std::uint32_t bits = 0;
  int count = 0;
  for (char c : in) {
    const int value = Base64UrlValue(c);
    if (value < 0) return std::nullopt;
    bits = ((bits << 6) | static_cast<std::uint32_t>(value)) & 0xffffu;
    count += 6;
    if (count >= 8) {
      count -= 8;
      out.push_back(static_cast<char>((bits >> count) & 0xffu));
    }
  }
  if ((bits & ((1u << count) - 1u)) != 0) return std::nullopt;
  return out;
}

// `text` parsed as a JSON object; nullopt when it is not valid JSON or not an object.
std::optional<json::object> ParseObject(std::string_view text) {
  json::error_code ec;
  json::value value = json::parse(text, ec);
  if (ec || !value.is_object()) return std::nullopt;
  return std::move(value.get_object());
}

// The string member `name` of `object`; null when absent or not a string.
const json::string* StringMember(const json::object& object, std::string_view name) {
  const json::value* value = object.if_contains(name);
  return value == nullptr ? nullptr : value->if_string();
}

// ---------------------------------------------------------------------------
// Keys

// Why `pkey` cannot verify `algorithm` signatures, or an empty view when it can. RS256 wants an
// RSA key of 2048 to 16384 bits, ES256 an EC key on the named curve P-256; either must also pass
// OpenSSL's public key check (for RSA this refuses public exponents below 65537).
std::string_view KeyProblem(EVP_PKEY* pkey, JwtAlgorithm algorithm) {
  switch (algorithm) {
    case JwtAlgorithm::kHs256:
      return "HS256 takes a shared secret, not a public key";
    case JwtAlgorithm::kRs256: {
      if (EVP_PKEY_is_a(pkey, "RSA") != 1) return "RS256 needs an RSA key";
      const int bits = EVP_PKEY_get_bits(pkey);
      if (bits < kMinRsaBits) return "RSA key is shorter than 2048 bits";
      if (bits > kMaxRsaBits) return "RSA key is longer than 16384 bits";
      break;
    }
    case JwtAlgorithm::kEs256: {
      if (EVP_PKEY_is_a(pkey, "EC") != 1) return "ES256 needs an EC key";
      char name[64] = {};
      std::size_t length = 0;
      if (EVP_PKEY_get_utf8_string_param(pkey, OSSL_PKEY_PARAM_GROUP_NAME, name, sizeof(name), &length) != 1) {
        return "EC key is not on a named curve";
      }
      const std::string_view group(name, std::min(length, sizeof(name)));
      if (group != "prime256v1" && group != "P-256") return "EC key is not on P-256";
      break;
    }
  }
  PkeyCtxPtr ctx(EVP_PKEY_CTX_new_from_pkey(nullptr, pkey, nullptr));
  if (ctx == nullptr || EVP_PKEY_public_check(ctx.get()) != 1) return "public key fails validation";
  return {};
}

// A public key of OpenSSL type `type` ("RSA", "EC") built from `params`; null on failure.
PkeyPtr PkeyFromParams(const char* type, OSSL_PARAM* params) {
  if (params == nullptr) return nullptr;
  PkeyCtxPtr ctx(EVP_PKEY_CTX_new_from_name(nullptr, type, nullptr));
  EVP_PKEY* pkey = nullptr;
  if (ctx == nullptr || EVP_PKEY_fromdata_init(ctx.get()) != 1 ||
      EVP_PKEY_fromdata(ctx.get(), &pkey, EVP_PKEY_PUBLIC_KEY, params) != 1) {
    return nullptr;
  }
  return PkeyPtr(pkey);
}

// An RSA public key from its big-endian modulus and exponent; null on failure.
PkeyPtr RsaPublicKey(std::string_view n, std::string_view e) {
  if (n.empty() || e.empty() || n.size() > kMaxRsaModulusBytes || e.size() > kMaxRsaExponentBytes) return nullptr;
  BignumPtr modulus(BN_bin2bn(BytesOf(n), static_cast<int>(n.size()), nullptr));
  BignumPtr exponent(BN_bin2bn(BytesOf(e), static_cast<int>(e.size()), nullptr));
  ParamBuildPtr build(OSSL_PARAM_BLD_new());
  if (modulus == nullptr || exponent == nullptr || build == nullptr ||
      OSSL_PARAM_BLD_push_BN(build.get(), OSSL_PKEY_PARAM_RSA_N, modulus.get()) != 1 ||
      OSSL_PARAM_BLD_push_BN(build.get(), OSSL_PKEY_PARAM_RSA_E, exponent.get()) != 1) {
    return nullptr;
  }
  ParamPtr params(OSSL_PARAM_BLD_to_param(build.get()));
  return PkeyFromParams("RSA", params.get());
}

// A P-256 public key from its 32-byte big-endian affine coordinates; null on failure, including a
// point that is not on the curve.
PkeyPtr P256PublicKey(std::string_view x, std::string_view y) {
  if (x.size() != kP256CoordinateSize || y.size() != kP256CoordinateSize) return nullptr;
  std::string point;
  point.reserve(1 + 2 * kP256CoordinateSize);
  point.push_back('\x04');  // uncompressed form
  point.append(x);
  point.append(y);
  ParamBuildPtr build(OSSL_PARAM_BLD_new());
  if (build == nullptr ||
      OSSL_PARAM_BLD_push_utf8_string(build.get(), OSSL_PKEY_PARAM_GROUP_NAME, "prime256v1", 0) != 1 ||
      OSSL_PARAM_BLD_push_octet_string(build.get(), OSSL_PKEY_PARAM_PUB_KEY, point.data(), point.size()) != 1) {
    return nullptr;
  }
  ParamPtr params(OSSL_PARAM_BLD_to_param(build.get()));
  return PkeyFromParams("EC", params.get());
}

// The signing key one JWKS member describes; nullopt when it is not a usable RS256 or ES256
// signature key (see KeysFromJwks).
std::optional<JwtKey> KeyFromJwk(const json::value& member) {
  const json::object* jwk = member.if_object();
  if (jwk == nullptr) return std::nullopt;
  if (jwk->contains("use")) {
    const json::string* use = StringMember(*jwk, "use");
    if (use == nullptr || *use != "sig") return std::nullopt;
  }
  // RFC 7517 §4.3: with key_ops, the key verifies only when "verify" is among them.
  if (jwk->contains("key_ops")) {
    const json::array* ops = jwk->at("key_ops").if_array();
    if (ops == nullptr) return std::nullopt;
    bool verify = false;
    for (const json::value& op : *ops) verify = verify || (op.is_string() && op.get_string() == "verify");
    if (!verify) return std::nullopt;
  }
  JwtKey key;
  if (jwk->contains("kid")) {
    const json::string* kid = StringMember(*jwk, "kid");
    if (kid == nullptr) return std::nullopt;
    key.kid = std::string(kid->data(), kid->size());
  }
  const json::string* kty = StringMember(*jwk, "kty");
  if (kty == nullptr) return std::nullopt;
  const bool has_alg = jwk->contains("alg");
  const json::string* alg = StringMember(*jwk, "alg");
  if (has_alg && alg == nullptr) return std::nullopt;

  PkeyPtr pkey;
  if (*kty == "RSA") {
    if (has_alg && *alg != "RS256") return std::nullopt;
    key.algorithm = JwtAlgorithm::kRs256;
    const json::string* n = StringMember(*jwk, "n");
    const json::string* e = StringMember(*jwk, "e");
    if (n == nullptr || e == nullptr) return std::nullopt;
    const std::optional<std::string> n_bytes = DecodeBase64Url(*n);
    const std::optional<std::string> e_bytes = DecodeBase64Url(*e);
    if (!n_bytes || !e_bytes) return std::nullopt;
    pkey = RsaPublicKey(*n_bytes, *e_bytes);
  } else if (*kty == "EC") {
    if (has_alg && *alg != "ES256") return std::nullopt;
    key.algorithm = JwtAlgorithm::kEs256;
    const json::string* crv = StringMember(*jwk, "crv");
    const json::string* x = StringMember(*jwk, "x");
    const json::string* y = StringMember(*jwk, "y");
    if (crv == nullptr || *crv != "P-256" || x == nullptr || y == nullptr) return std::nullopt;
    const std::optional<std::string> x_bytes = DecodeBase64Url(*x);
    const std::optional<std::string> y_bytes = DecodeBase64Url(*y);
    if (!x_bytes || !y_bytes) return std::nullopt;
    pkey = P256PublicKey(*x_bytes, *y_bytes);
  } else {
    return std::nullopt;
  }
  if (pkey == nullptr || !KeyProblem(pkey.get(), key.algorithm).empty()) return std::nullopt;
  key.public_key = SharePkey(std::move(pkey));
  return key;
}

// ---------------------------------------------------------------------------
// Signatures

// Whether `signature` is the SHA-256 signature of `input` under `pkey` in OpenSSL's form (PKCS #1
// v1.5 for RSA, DER for ECDSA).
bool DigestVerifies(EVP_PKEY* pkey, std::string_view input, std::string_view signature) {
  MdCtxPtr ctx(EVP_MD_CTX_new());
  return ctx != nullptr && EVP_DigestVerifyInit(ctx.get(), nullptr, EVP_sha256(), nullptr, pkey) == 1 &&
         EVP_DigestVerify(ctx.get(), BytesOf(signature), signature.size(), BytesOf(input), input.size()) == 1;
}

// The DER ECDSA-Sig-Value for a JOSE P-256 signature (r || s, 32 bytes each); empty on failure.
std::string JoseEcdsaToDer(std::string_view raw) {
  if (raw.size() != 2 * kP256CoordinateSize) return {};
  constexpr int kHalf = static_cast<int>(kP256CoordinateSize);
  EcdsaSigPtr sig(ECDSA_SIG_new());
  BignumPtr r(BN_bin2bn(BytesOf(raw), kHalf, nullptr));
  BignumPtr s(BN_bin2bn(BytesOf(raw) + kHalf, kHalf, nullptr));
  if (sig == nullptr || r == nullptr || s == nullptr || ECDSA_SIG_set0(sig.get(), r.get(), s.get()) != 1) return {};
  r.release();  // owned by `sig` now
  s.release();
  unsigned char* der = nullptr;
  const int length = i2d_ECDSA_SIG(sig.get(), &der);
  OpensslBytesPtr owned(der);
  if (length <= 0 || der == nullptr) return {};
  return std::string(reinterpret_cast<const char*>(der), static_cast<std::size_t>(length));
}

// Whether `signature` (decoded from the token) signs `input` under `key` with `algorithm`.
bool SignatureVerifies(const JwtKey& key, JwtAlgorithm algorithm, std::string_view input, std::string_view signature) {
  switch (algorithm) {
    case JwtAlgorithm::kHs256: {
      if (key.secret.empty() || key.secret.size() > INT_MAX) return false;
      unsigned char mac[EVP_MAX_MD_SIZE];
      unsigned int size = 0;
      if (HMAC(EVP_sha256(), key.secret.data(), static_cast<int>(key.secret.size()), BytesOf(input), input.size(), mac,
               &size) == nullptr) {
        return false;
      }
      return size == signature.size() && CRYPTO_memcmp(mac, signature.data(), size) == 0;
    }
    case JwtAlgorithm::kRs256: {
      EVP_PKEY* pkey = PkeyOf(key);
      return pkey != nullptr && EVP_PKEY_is_a(pkey, "RSA") == 1 && DigestVerifies(pkey, input, signature);
    }
    case JwtAlgorithm::kEs256: {
      EVP_PKEY* pkey = PkeyOf(key);
      if (pkey == nullptr || EVP_PKEY_is_a(pkey, "EC") != 1) return false;
      const std::string der = JoseEcdsaToDer(signature);
      return !der.empty() && DigestVerifies(pkey, input, der);
    }
  }
  return false;
}

// ---------------------------------------------------------------------------
// Claims

// A NumericDate claim's value; nullopt when it is not a finite number. long double holds every
// int64 and uint64 exactly (and so does the now ± leeway it is compared with).
static_assert(std::numeric_limits<long double>::digits >= 64, "NumericDate comparisons need a 64-bit mantissa");
std::optional<long double> NumericDate(const json::value& value) {
  if (const std::int64_t* i = value.if_int64()) return static_cast<long double>(*i);
  if (const std::uint64_t* u = value.if_uint64()) return static_cast<long double>(*u);
  if (const double* d = value.if_double()) {
    if (!std::isfinite(*d)) return std::nullopt;
    return static_cast<long double>(*d);
  }
  return std::nullopt;
}

// Whether `aud` (a string or an array of strings) names `audience`; nullopt when it is neither.
std::optional<bool> AudienceContains(const json::value& aud, std::string_view audience) {
  if (const json::string* one = aud.if_string()) return *one == audience;
  const json::array* many = aud.if_array();
  if (many == nullptr) return std::nullopt;
  bool found = false;
  for (const json::value& entry : *many) {
    const json::string* name = entry.if_string();
    if (name == nullptr) return std::nullopt;
    found = found || *name == audience;
  }
  return found;
}

// Whether a `typ` header value names a JWT: "JWT" (RFC 7519 §5.1) or "at+jwt" (an OAuth 2.0 access
// token, RFC 9068 §2.1), compared without regard to case, each with or without the "application/"
// prefix RFC 7515 §4.1.9 lets producers omit.
bool AcceptedTyp(std::string_view typ) {
  constexpr std::string_view kApplication = "application/";
  if (StartsWithIgnoreCaseAscii(typ, kApplication)) typ.remove_prefix(kApplication.size());
  return EqualsIgnoreCaseAscii(typ, "JWT") || EqualsIgnoreCaseAscii(typ, "at+jwt");
}

// Checks exp, nbf, iss and aud of a verified claims set against `rules` at `now`.
Status CheckClaims(const json::object& claims, const JwtRules& rules, std::int64_t now) {
  // A negative leeway would only shorten lifetimes in a surprising way; it counts as none.
  const long double leeway = static_cast<long double>(std::max<std::int64_t>(rules.leeway_seconds, 0));
  const long double current = static_cast<long double>(now);
  if (const json::value* exp = claims.if_contains("exp")) {
    const std::optional<long double> at = NumericDate(*exp);
    if (!at) return InvalidArgumentError("exp is not a number");
    if (current - leeway >= *at) return InvalidArgumentError("token expired");
  } else if (rules.require_exp) {
    return InvalidArgumentError("token has no exp");
  }
  if (const json::value* nbf = claims.if_contains("nbf")) {
    const std::optional<long double> at = NumericDate(*nbf);
    if (!at) return InvalidArgumentError("nbf is not a number");
    if (*at > current + leeway) return InvalidArgumentError("token not yet valid");
  }
  if (!rules.issuer.empty()) {
    const json::value* iss = claims.if_contains("iss");
    if (iss == nullptr) return InvalidArgumentError("token has no iss");
    const json::string* issuer = iss->if_string();
    if (issuer == nullptr || *issuer != rules.issuer) return InvalidArgumentError("issuer does not match");
  }
  if (!rules.audience.empty()) {
    const json::value* aud = claims.if_contains("aud");
    if (aud == nullptr) return InvalidArgumentError("token has no aud");
    const std::optional<bool> contains = AudienceContains(*aud, rules.audience);
    if (!contains) return InvalidArgumentError("aud is not a string or an array of strings");
    if (!*contains) return InvalidArgumentError("audience does not match");
  }
  return Status::Ok();
}

// The whole of JwtVerifier::Verify but the exception and OpenSSL error-queue guards. The candidate
// keys are `keys`, then `more_keys` when not null; *unknown_kid is as in JwtVerifier::Verify (the
// caller has set it to false).
StatusOr<json::object> VerifyToken(std::string_view token, std::int64_t now, const std::vector<JwtKey>& keys,
                                   const std::vector<JwtKey>* more_keys, const JwtRules& rules,
                                   bool* unknown_kid) {
  if (token.size() > kMaxTokenLength) return InvalidArgumentError("token is too long");
  const std::size_t first_dot = token.find('.');
  const std::size_t second_dot = first_dot == std::string_view::npos ? first_dot : token.find('.', first_dot + 1);
  if (second_dot == std::string_view::npos || token.find('.', second_dot + 1) != std::string_view::npos) {
    return InvalidArgumentError("token is not three parts");
  }
  const std::string_view signing_input = token.substr(0, second_dot);
  const std::optional<std::string> header_text = DecodeBase64Url(token.substr(0, first_dot));
  const std::optional<std::string> payload_text =
      DecodeBase64Url(token.substr(first_dot + 1, second_dot - first_dot - 1));
  const std::optional<std::string> signature = DecodeBase64Url(token.substr(second_dot + 1));
  if (!header_text || !payload_text || !signature) return InvalidArgumentError("token part is not base64url");

  // The JOSE header.
  const std::optional<json::object> header = ParseObject(*header_text);
  if (!header) return InvalidArgumentError("header is not a JSON object");
  const json::string* alg = StringMember(*header, "alg");
  if (alg == nullptr) return InvalidArgumentError("header has no alg");
  const std::optional<JwtAlgorithm> algorithm = JwtAlgorithmFromName(*alg);
  if (!algorithm || std::find(rules.algorithms.begin(), rules.algorithms.end(), *algorithm) == rules.algorithms.end()) {
    return InvalidArgumentError("algorithm not allowed");  // "none" among others
  }
  const json::string* kid = nullptr;
  if (header->contains("kid")) {
    kid = StringMember(*header, "kid");
    if (kid == nullptr) return InvalidArgumentError("kid is not a string");
  }
  if (header->contains("typ")) {
    const json::string* typ = StringMember(*header, "typ");
    if (typ == nullptr || !AcceptedTyp(*typ)) return InvalidArgumentError("typ is not JWT or at+jwt");
  }
  if (header->contains("crit")) return InvalidArgumentError("crit is not supported");
  if (*algorithm == JwtAlgorithm::kEs256 && signature->size() != 2 * kP256CoordinateSize) {
    return InvalidArgumentError("ES256 signature is not 64 bytes");
  }

  // The signature, under each candidate key in turn.
  bool any_key = false;
  bool kid_known = false;  // a key of the token's algorithm carries exactly the token's kid
  bool verified = false;
  const auto try_keys = [&](const std::vector<JwtKey>& candidates) {
    for (const JwtKey& key : candidates) {
      if (key.algorithm != *algorithm) continue;
      if (kid != nullptr && !key.kid.empty() && *kid != key.kid) continue;
      any_key = true;
      kid_known = kid_known || (kid != nullptr && !key.kid.empty());
      if (SignatureVerifies(key, *algorithm, signing_input, *signature)) {
        verified = true;
        return;
      }
    }
  };
  try_keys(keys);
  if (!verified && more_keys != nullptr) try_keys(*more_keys);
  if (!verified && kid != nullptr && !kid_known) *unknown_kid = true;
  if (!any_key) return InvalidArgumentError(kid != nullptr ? "no key for kid" : "no key for algorithm");
  if (!verified) return InvalidArgumentError("signature does not verify");

  // The claims set.
  std::optional<json::object> claims = ParseObject(*payload_text);
  if (!claims) return InvalidArgumentError("payload is not a JSON object");
  Status checked = CheckClaims(*claims, rules, now);
  if (!checked.ok()) return checked;
  return std::move(*claims);
}

}  // namespace

// The algorithm an `alg` header value names.
std::optional<JwtAlgorithm> JwtAlgorithmFromName(std::string_view name) {
  if (name == "HS256") return JwtAlgorithm::kHs256;
  if (name == "RS256") return JwtAlgorithm::kRs256;
  if (name == "ES256") return JwtAlgorithm::kEs256;
  return std::nullopt;
}

// The `alg` header value for `algorithm`.
std::string_view JwtAlgorithmName(JwtAlgorithm algorithm) {
  switch (algorithm) {
    case JwtAlgorithm::kHs256:
      return "HS256";
    case JwtAlgorithm::kRs256:
      return "RS256";
    case JwtAlgorithm::kEs256:
      return "ES256";
  }
  return {};
}

// Reads one SubjectPublicKeyInfo PEM key and checks that it suits `algorithm`.
StatusOr<JwtKey> JwtVerifier::KeyFromPem(std::string_view pem, JwtAlgorithm algorithm, std::string kid) {
  try {
    if (algorithm == JwtAlgorithm::kHs256) return InvalidArgumentError("HS256 takes a shared secret, not a PEM key");
    if (pem.empty() || pem.size() > kMaxPemLength) return InvalidArgumentError("not a PEM public key");
    OpensslErrorScope errors;
    BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
    if (bio == nullptr) return InternalError("cannot read the PEM text");
    // Never prompt for a passphrase: a public key has none.
    pem_password_cb* no_passphrase = [](char*, int, int, void*) { return 0; };
    PkeyPtr pkey(PEM_read_bio_PUBKEY(bio.get(), nullptr, no_passphrase, nullptr));
    if (pkey == nullptr) return InvalidArgumentError("not a PEM public key");
    const std::string_view problem = KeyProblem(pkey.get(), algorithm);
    if (!problem.empty()) return InvalidArgumentError(std::string(problem));
    JwtKey key;
    key.kid = std::move(kid);
    key.algorithm = algorithm;
    key.public_key = SharePkey(std::move(pkey));
    return key;
  } catch (...) {
    return InternalError("cannot read the PEM key");
  }
}

// Reads the RS256 and ES256 signature keys of a JWKS document, skipping the others.
StatusOr<std::vector<JwtKey>> JwtVerifier::KeysFromJwks(std::string_view jwks) {
  try {
    OpensslErrorScope errors;
    json::error_code ec;
    const json::value document = json::parse(jwks, ec);
    if (ec) return InvalidArgumentError("JWKS is not JSON");
    const json::object* root = document.if_object();
    const json::value* members = root == nullptr ? nullptr : root->if_contains("keys");
    const json::array* array = members == nullptr ? nullptr : members->if_array();
    if (array == nullptr) return InvalidArgumentError("JWKS has no keys array");
    std::vector<JwtKey> keys;
    for (const json::value& member : *array) {
      if (std::optional<JwtKey> key = KeyFromJwk(member)) keys.push_back(std::move(*key));
    }
    if (keys.empty()) return InvalidArgumentError("JWKS holds no usable signature key");
    return keys;
  } catch (...) {
    return InternalError("cannot read the JWKS");
  }
}

// An HS256 key; an empty secret is accepted here but never verifies a token.
JwtKey JwtVerifier::KeyFromSecret(std::string secret, std::string kid) {
  JwtKey key;
  key.kid = std::move(kid);
  key.algorithm = JwtAlgorithm::kHs256;
  key.secret = std::move(secret);
  return key;
}

// Keeps the keys and rules as given; they are checked when built (KeyFromPem, KeysFromJwks).
JwtVerifier::JwtVerifier(std::vector<JwtKey> keys, JwtRules rules) : keys_(std::move(keys)), rules_(std::move(rules)) {}

// Verifies `token` at `now_unix_seconds`; see the header for what is refused.
StatusOr<boost::json::object> JwtVerifier::Verify(std::string_view token, std::int64_t now_unix_seconds,
                                                  const std::vector<JwtKey>* more_keys, bool* unknown_kid) const {
  bool unknown = false;
  StatusOr<boost::json::object> result = InternalError("token cannot be verified");
  try {
    OpensslErrorScope errors;
    result = VerifyToken(token, now_unix_seconds, keys_, more_keys, rules_, &unknown);
  } catch (...) {
    unknown = false;
    result = InternalError("token cannot be verified");
  }
  if (unknown_kid != nullptr) *unknown_kid = unknown && !result.ok();
  return result;
}

}  // namespace idemgate::identity
