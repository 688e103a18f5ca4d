// JWT verification (SPEC §6, identity::JwtVerifier::Verify) and the caller
// its claims map to (CallerFromClaims), with an HS256 secret and the RS256
// and ES256 keys of tests/identity/jwt_test.cc. The first byte's low bit
// picks what the rest is:
//  - 0: a token, verified as given at a fixed time under strict rules (iss,
//    aud, exp required) and lax ones. Checked: a token that verifies has the
//    signature this target computes or checks itself with OpenSSL under the
//    key of its alg, an allowed alg, a typ of JWT if any, no crit, claims
//    equal to its payload that pass the time, iss and aud rules as this
//    target reads them; a refusal has a short reason and never reports an
//    unknown kid together with success.
//  - 1: choices for a token signed here (alg, kid, typ, iss, aud, exp, nbf,
//    tenant/project/sub values of any bytes). Checked: it verifies exactly
//    when the rules say it should, to the claims written, which map to the
//    expected caller; and changing any one character of it, or signing it
//    with another key, makes it fail.

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>

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

#include "config/config.h"
#include "fuzz_target.h"
#include "identity/claims.h"
#include "identity/jwt.h"

namespace {

namespace identity = idemgate::identity;
namespace json = boost::json;
using identity::JwtAlgorithm;
using identity::JwtKey;
using identity::JwtRules;
using identity::JwtVerifier;

constexpr std::int64_t kNow = 1700000000;
constexpr std::int64_t kLeeway = 30;
constexpr std::string_view kSecret = "fuzz jwt secret, thirty-two bytes";
constexpr std::string_view kIssuer = "https://issuer.example";
constexpr std::string_view kAudience = "idemgate";

// The keys of tests/identity/jwt_test.cc (openssl genpkey; see there).
constexpr char kRsaPrivate[] = R"pem(-----BEGIN PRIVATE KEY-----
MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQCySZjRcFnXWKr1
tCDVU9/ZhYNvTAcpLZuMzlzLx+gdtpW3VdqRNmd+pH2Y8ieTj+cCP6JkOdJvYdYU
QOhRt8cHF7m9LwRdjFygxO+vDuJ9aMyr/RV57fojPAjj3K8t7ogTjsgFvfbCAN2g
ur8pdE1lBoAV4mKyQ+iatONrYUgqw5Rpg9VJUiOCt4/FRgZ7hHaaRy/LFNVjpIS7
mzUQEhQKxDFOj0AW4cBhp93zmbNlDbSUnb/3rvyJiXf7gt4Zluyf+9wkPlXATPfd
BchksyERxeeWb425RHY5Wbft6wH9cUUACmNTc3Cbgv8SQ5VAtWMski9uqPX02m8a
CDZ6DmpfAgMBAAECggEAOYm7+neuXuvcPLCV2hMYDqzilqQsOXNhHIeq9g89j31S
Axl/kNbEfuAaMqaP9DUAYj7kK0Fn8w9Zli6+a0UKw/S5ul72ozQ93prAGbiNitis
GSNz72ZIkF97JQKfPI0bOGifkA7XGJRL8mficr/4jE6VPrrRjGOTKX6QWKLMNhRf
gHlSN4/PyeDRYTOQFcTzp3MoJRkWTtg/cl/2hA2/ysyaNfj2B27HvagpE/Hc0NL3
epe84opSliV/VLl30rWIQ76Avw/PvkVOOzSsxqsFklryiBqlrKrLzs2Emvt5mCDP
b37JNu7Dfs4Wq23ognuGrgvRM5ek1Iw6bwimkclwkQKBgQDf68fSjaqSfeH6531s
qFHTPxLofUNvEqpQY8tWys5nCy/GsfCJGjpQxtCFml7/PFDzLlAw3axCFEu1eTvW
W2t55y8WYiPDRZgVgs6MuLfvXY09AOwsudZwUCT2BfJYlK8dIbSmyg+iIpDZkngV
zInBY0XWI55MBxf6Q5bvheUJsQKBgQDL1DlJvbGViY52gP9AdxT3fAUMck1GxlpG
OYw1rvswOfgs4DSEQWMsw0NG/ZMTdKLsJKr4RgwuCXHDhd5f7z79a9dTumlCyxxw
Cd9P0gN7eL/as6lTp9j3Rr7vTRpk2KuyTR4hH0IwdRb/IVF7GpQDOf8CTgC9Wlj3
bwuaxE2pDwKBgEyqByIZirrZCpPCyfh3sHwo7ipXKM1QkKsxX575lK1G8TaQGZB3
QFwDlcUIU1oDppt70czJOH7vP/SD6266ohN8iWyacTAcFbPXsywO2jrDxuWJ+VJe
1gJiDiWFZ7HYRhQtRBKOv8d9GibDtQWRn+BsQq7MRxg0nYr7tSOQrhghAoGBAMmY
jky73I9NLOVSMqNc5BTeydOEnZ+5gQHh2yYhefk57Jbd7bM9RMy6F6l4FWZxvs4W
ei7ygQtrdeRvXADAjSly5ta+EWvpnafGa+LzkVQmmoLBnWDLKxFvHFtshAVoM3E3
SuxxkTKCLIuMNZ2vLOOAEhMCeULOwB2B7BVXwIPLAoGASquHqS22vXJNJLe8xw1h
rwARTKaOJw/QyGnqHmlazDgDeJpoVIwgTfwMbpkgi7LCGWj9UTRoCxMdQa5S6PP2
20ubWeB3NHj8w33TyP3cZ1KeR4jcxFJqhzfedS6M/zsODdlzvqikN7vPRYSUYDGW
06Ii9E6gLIhHCkaycGyPnfk=
-----END PRIVATE KEY-----
)pem";
constexpr char kEcPrivate[] = R"pem(-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgcU2GsTuZ9pMIm9/v
jlZ4yBw7vD3YTqKQJ/WRX7Qt1juhRANCAASOe1qGLxWxrkolVpf7eQXU61t7XMjE
te8YqUWV+qkAcNoDyfuwb9eVoahNTkLn4d/LwmFWV1d/UF5B7P99cHol
-----END PRIVATE KEY-----
)pem";
// Another P-256 key, for "signed by someone else".
constexpr char kEcOtherPrivate[] = R"pem(-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgSX+S2ic6m6xAixlo
M/pHdxIrmzBOqXw682qvk9Zfn6+hRANCAAQgyYDmTeUBYMWNtTQw62lFltAh+lGO
VpA/Ey2c7tBZtXJtjcbIJUEvV41FT1J4sq18wzsDOlCgxIjj22D+g+iS
-----END PRIVATE KEY-----
)pem";

template <auto Free>
struct Deleter {
  template <typename T>
  void operator()(T* p) const {
    Free(p);
  }
};
using BioPtr = std::unique_ptr<BIO, Deleter<BIO_free>>;
using BignumPtr = std::unique_ptr<BIGNUM, Deleter<BN_free>>;
using EcdsaSigPtr = std::unique_ptr<ECDSA_SIG, Deleter<ECDSA_SIG_free>>;
using MdCtxPtr = std::unique_ptr<EVP_MD_CTX, Deleter<EVP_MD_CTX_free>>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY_free>>;

PkeyPtr PrivateKey(const char* pem) {
  BioPtr bio(BIO_new_mem_buf(pem, -1));
  PkeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  FUZZ_CHECK(key != nullptr);
  return key;
}

// The SubjectPublicKeyInfo PEM of a private key's public half, for KeyFromPem.
std::string PublicPem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  FUZZ_CHECK(PEM_write_bio_PUBKEY(bio.get(), key) == 1);
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(size));
}

struct Keys {
  PkeyPtr rsa = PrivateKey(kRsaPrivate);
  PkeyPtr ec = PrivateKey(kEcPrivate);
  PkeyPtr ec_other = PrivateKey(kEcOtherPrivate);
  // kid "hs" and "rsa-a"; the EC key has none, so it is tried for any kid.
  std::vector<JwtKey> verifier_keys = [this] {
    auto rsa_key = JwtVerifier::KeyFromPem(PublicPem(rsa.get()), JwtAlgorithm::kRs256, "rsa-a");
    auto ec_key = JwtVerifier::KeyFromPem(PublicPem(ec.get()), JwtAlgorithm::kEs256);
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
// Encodings and signatures, written here so that they check src/ rather than echo it.

std::string Base64Url(std::string_view bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  std::uint32_t bits = 0;
  int count = 0;
  for (const char c : bytes) {
    bits = (bits << 8 | static_cast<unsigned char>(c)) & 0xffffu;
    count += 8;
    while (count >= 6) {
      count -= 6;
      out.push_back(kAlphabet[(bits >> count) & 0x3f]);
    }
  }
  if (count > 0) out.push_back(kAlphabet[(bits << (6 - count)) & 0x3f]);
  return out;
}

// Unpadded base64url read back; nothing on another character.
std::optional<std::string> Base64UrlDecode(std::string_view text) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  std::uint32_t bits = 0;
  int count = 0;
  for (const char c : text) {
    const std::size_t value = kAlphabet.find(c);
    if (value == std::string_view::npos) return std::nullopt;
    bits = (bits << 6 | static_cast<std::uint32_t>(value)) & 0xffffu;
    count += 6;
    if (count >= 8) {
      count -= 8;
      out.push_back(static_cast<char>((bits >> count) & 0xffu));
    }
  }
  return out;
}

std::string HmacSha256(std::string_view key, std::string_view data) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  FUZZ_CHECK(HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                  reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac,
                  &size) != nullptr);
  return std::string(reinterpret_cast<const char*>(mac), size);
}

// PKCS #1 v1.5 (RSA) or DER ECDSA over SHA-256.
std::string DigestSign(EVP_PKEY* key, std::string_view input) {
  MdCtxPtr ctx(EVP_MD_CTX_new());
  std::size_t size = 0;
  const auto* data = reinterpret_cast<const unsigned char*>(input.data());
  FUZZ_CHECK(EVP_DigestSignInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key) == 1);
  FUZZ_CHECK(EVP_DigestSign(ctx.get(), nullptr, &size, data, input.size()) == 1);
  std::string signature(size, '\0');
  FUZZ_CHECK(EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(signature.data()), &size,
                            data, input.size()) == 1);
  signature.resize(size);
  return signature;
}

// ES256's JOSE form: r || s, 32 bytes each.
std::string Es256Sign(EVP_PKEY* key, std::string_view input) {
  const std::string der = DigestSign(key, input);
  const auto* p = reinterpret_cast<const unsigned char*>(der.data());
  EcdsaSigPtr sig(d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(der.size())));
  FUZZ_CHECK(sig != nullptr);
  unsigned char raw[64];
  FUZZ_CHECK(BN_bn2binpad(ECDSA_SIG_get0_r(sig.get()), raw, 32) == 32);
  FUZZ_CHECK(BN_bn2binpad(ECDSA_SIG_get0_s(sig.get()), raw + 32, 32) == 32);
  return std::string(reinterpret_cast<const char*>(raw), sizeof(raw));
}

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

// A JSON string literal of arbitrary bytes, and the string it decodes to: printable ASCII
// as itself, other bytes below 0x80 as \u00XX, the rest as U+0080..U+00FF in UTF-8.
std::string JsonString(std::string_view s, std::string* decoded) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x80) {
      const char utf8[2] = {static_cast<char>(0xc0 | (u >> 6)),
                            static_cast<char>(0x80 | (u & 0x3f))};
      out.append(utf8, 2);
      decoded->append(utf8, 2);
      continue;
    }
    if (u >= 0x20 && u < 0x7f && c != '"' && c != '\\') {
      out.push_back(c);
    } else {
      out.append("\\u00").push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 0xf]);
    }
    decoded->push_back(c);
  }
  return out + "\"";
}

bool IsVisible(std::string_view s) {
  if (s.empty() || s.size() > 256) return false;
  for (const char c : s) {
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f)
      return false;
  }
  return true;
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
    FUZZ_CHECK(lower == "jwt");
  }
  const json::value* alg = h.if_contains("alg");
  FUZZ_CHECK(alg != nullptr && alg->is_string());
  const std::string_view signing_input = token.substr(0, b);
  const Keys& keys = TheKeys();
  if (alg->get_string() == "HS256") {
    FUZZ_CHECK(*signature == HmacSha256(kSecret, signing_input));
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

class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  std::uint8_t Byte() {
    if (data_.empty()) return 0;
    const auto b = static_cast<std::uint8_t>(data_.front());
    data_.remove_prefix(1);
    return b;
  }
  std::int64_t Offset() { return static_cast<std::int16_t>(Byte() << 8 | Byte()); }
  std::string_view Bytes(std::size_t n) {
    const std::string_view out = data_.substr(0, n);
    data_.remove_prefix(out.size());
    return out;
  }

 private:
  std::string_view data_;
};

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
      header += ",\"typ\":\"at+jwt\"";
      ok = false;
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
      const std::int64_t number = static_cast<std::int16_t>(in.Byte() << 8 | in.Byte());
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
        return HmacSha256(secret, input);
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
    const bool valid = IsVisible(values[0]) && IsVisible(values[1]) && IsVisible(values[2]);
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
  const std::size_t at = (static_cast<std::size_t>(in.Byte()) << 8 | in.Byte()) % token.size();
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

}  // namespace

IDEMGATE_FUZZ_TARGET(jwt) {
  if (size == 0) return 0;
  const std::string_view rest = idemgate::fuzz::AsView(data + 1, size - 1);
  if (data[0] & 1) {
    CheckSigned(rest);
  } else {
    CheckVerified(TheKeys().strict, true, rest);
    CheckVerified(TheKeys().lax, false, rest);
  }
  return 0;
}
