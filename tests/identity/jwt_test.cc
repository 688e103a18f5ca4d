#include "identity/jwt.h"

#include <gtest/gtest.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <boost/json/value.hpp>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "fakes/test_keys.h"
#include "fakes/testing.h"

namespace idemgate::identity {
namespace {

// ---------------------------------------------------------------------------
// Test keys (tests/fakes/test_keys.h) and tokens

using idemgate::testing::kEc384Public;
using idemgate::testing::kEcBPrivate;
using idemgate::testing::kEcBPublic;
using idemgate::testing::kEcPrivate;
using idemgate::testing::kEcPublic;
using idemgate::testing::kEcX;
using idemgate::testing::kEcY;
using idemgate::testing::kRsa1024Public;
using idemgate::testing::kRsaAN;
using idemgate::testing::kRsaAPrivate;
using idemgate::testing::kRsaAPublic;
using idemgate::testing::kRsaBPrivate;
using idemgate::testing::kRsaBPublic;

// Tokens signed with the openssl command line (`openssl dgst -sha256 -sign`, the ES256 DER signature
// taken apart with `openssl asn1parse` into r || s) over
//   {"alg":"RS256","typ":"JWT"} / {"alg":"ES256","typ":"JWT"} and
//   {"sub":"cli-user","iss":"https://issuer.example","aud":"idemgate","exp":2000000000}
constexpr char kCliRs256Token[] =
    "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9."
    "eyJzdWIiOiJjbGktdXNlciIsImlzcyI6Imh0dHBzOi8vaXNzdWVyLmV4YW1wbGUiLCJhdWQiOiJpZGVtZ2F0ZSIsImV4cCI6MjAwMDAwMDAwMH0."
    "ToPu3i_v8ZpCju2XuEJyiGUlucIWtxMPza8uU04Zj78uUg_SRWBu2MDDFOS3cDGUbS5BaWzYt4NzSVpNPpCJPYDEfVJg8zG5PhQriqusilENr3AE"
    "5OhE27D5P1GNPqoC6KyzLXlil_STkctj9tyW04SGp1OW3kkA46BTRM5Zk9rDkZMHbdkTTr4HvP6I_Kp9b2bfSMGf-KXSFnAdD0V_wz65Lfl2Exxq"
    "9l-MqLc_p4mMXq6Y41z-Ob7fBcyTp8NFDOGKXUutcgxUpTB-FXDktbAix_ZJlKaRPTrKTlWLfYpUmhTVp2dA3Ppf_k5HG9aG5eYhw5ChEPrV7E_5"
    "JXFMVg";
constexpr char kCliEs256Token[] =
    "eyJhbGciOiJFUzI1NiIsInR5cCI6IkpXVCJ9."
    "eyJzdWIiOiJjbGktdXNlciIsImlzcyI6Imh0dHBzOi8vaXNzdWVyLmV4YW1wbGUiLCJhdWQiOiJpZGVtZ2F0ZSIsImV4cCI6MjAwMDAwMDAwMH0."
    "cVCDa1_wCDFGCcN9LnBiBYopldqXif6jKlTAIeL4gh9XJFhUIFnGBqYICRE9NHD0bzvK2lxDpCQwdcEHvBJGRQ";

// RFC 7515 Appendix A.1: the JWK "k" of the HS256 key, and the JWS it computes.
constexpr char kRfcKey[] = "AyM1SysPpbyDfgZld3umj1qzKObwVMkoqQ-EstJQLr_T-1qS0gZH75aKtMN3Yj0iPS4hcgUuTwjAzZr1Z9CAow";
constexpr char kRfcToken[] =
    "eyJ0eXAiOiJKV1QiLA0KICJhbGciOiJIUzI1NiJ9."
    "eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ."
    "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";

constexpr std::int64_t kNow = 1700000000;
constexpr char kSecret[] = "a shared secret of at least thirty-two bytes";

// ---------------------------------------------------------------------------
// Token building, with OpenSSL and the private keys only

using idemgate::testing::Base64UrlEncode;
using idemgate::testing::BignumPtr;
using idemgate::testing::PkeyPtr;

// Lenient decoder for the test's own fixed inputs.
std::string Base64UrlDecode(std::string_view text) {
  std::string out;
  std::uint32_t bits = 0;
  int count = 0;
  for (char c : text) {
    const std::string_view alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    bits = (bits << 6) | static_cast<std::uint32_t>(alphabet.find(c));
    count += 6;
    if (count >= 8) {
      count -= 8;
      out.push_back(static_cast<char>((bits >> count) & 0xff));
    }
  }
  return out;
}

PkeyPtr PrivateKey(const char* pem) {
  PkeyPtr key = idemgate::testing::ReadPrivateKey(pem);
  EXPECT_NE(key, nullptr);
  return key;
}

PkeyPtr PublicKey(const char* pem) {
  PkeyPtr key = idemgate::testing::ReadPublicKey(pem);
  EXPECT_NE(key, nullptr);
  return key;
}

// EVP_DigestSign with SHA-256: PKCS #1 v1.5 for RSA, DER for ECDSA.
std::string DigestSign(EVP_PKEY* key, std::string_view input) {
  std::string signature = idemgate::testing::DigestSign(key, input);
  EXPECT_FALSE(signature.empty());
  return signature;
}

using Signer = std::function<std::string(std::string_view)>;

Signer Hs256(std::string secret) {
  return [secret](std::string_view input) {
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
         reinterpret_cast<const unsigned char*>(input.data()), input.size(), mac, &size);
    return std::string(reinterpret_cast<const char*>(mac), size);
  };
}

Signer Rs256(const char* private_pem) {
  return [private_pem](std::string_view input) { return DigestSign(PrivateKey(private_pem).get(), input); };
}

// The JOSE form: r || s, each left-padded to 32 bytes.
Signer Es256(const char* private_pem) {
  return [private_pem](std::string_view input) {
    std::string raw =
        idemgate::testing::JoseFromDer(DigestSign(PrivateKey(private_pem).get(), input));
    EXPECT_EQ(raw.size(), 64u);
    return raw;
  };
}

// The ES256 signer, but with the DER signature EVP_DigestSign gives.
Signer Es256Der(const char* private_pem) {
  return [private_pem](std::string_view input) { return DigestSign(PrivateKey(private_pem).get(), input); };
}

std::string Token(std::string_view header, std::string_view payload, const Signer& sign) {
  const std::string input = Base64UrlEncode(header) + "." + Base64UrlEncode(payload);
  return input + "." + Base64UrlEncode(sign(input));
}

std::string Claims(std::int64_t exp) { return R"({"sub":"alice","exp":)" + std::to_string(exp) + "}"; }

// A JWK for an RSA or EC public key, its parameters read back with EVP_PKEY_get_bn_param.
std::string Jwk(const char* public_pem, std::string_view extra) {
  PkeyPtr key = PublicKey(public_pem);
  auto param = [&](const char* name, int pad) {
    BIGNUM* raw = nullptr;
    EXPECT_EQ(EVP_PKEY_get_bn_param(key.get(), name, &raw), 1) << name;
    BignumPtr bn(raw);
    std::string bytes(pad > 0 ? pad : BN_num_bytes(bn.get()), '\0');
    BN_bn2binpad(bn.get(), reinterpret_cast<unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
    return Base64UrlEncode(bytes);
  };
  std::string jwk = "{";
  if (EVP_PKEY_is_a(key.get(), "RSA")) {
    jwk += R"("kty":"RSA","n":")" + param(OSSL_PKEY_PARAM_RSA_N, 0) + R"(","e":")" + param(OSSL_PKEY_PARAM_RSA_E, 0) +
           R"(")";
  } else {
    const int size = (EVP_PKEY_get_bits(key.get()) + 7) / 8;
    jwk += R"("kty":"EC","x":")" + param(OSSL_PKEY_PARAM_EC_PUB_X, size) + R"(","y":")" +
           param(OSSL_PKEY_PARAM_EC_PUB_Y, size) + R"(")";
    if (std::string_view(extra).find("\"crv\"") == std::string_view::npos) jwk += R"(,"crv":"P-256")";
  }
  if (!extra.empty()) jwk += "," + std::string(extra);
  return jwk + "}";
}

std::string Jwks(const std::vector<std::string>& jwks) {
  std::string out = R"({"keys":[)";
  for (std::size_t i = 0; i < jwks.size(); ++i) out += (i == 0 ? "" : ",") + jwks[i];
  return out + "]}";
}

// ---------------------------------------------------------------------------
// Verifier building and checking

JwtKey PemKey(const char* pem, JwtAlgorithm algorithm, std::string kid = {}) {
  auto key = JwtVerifier::KeyFromPem(pem, algorithm, std::move(kid));
  EXPECT_TRUE(key.ok()) << key.status().ToString();
  return key.ok() ? *key : JwtKey{};
}

JwtRules Rules(std::vector<JwtAlgorithm> algorithms) {
  JwtRules rules;
  rules.algorithms = std::move(algorithms);
  return rules;
}

const std::vector<JwtAlgorithm> kAll = {JwtAlgorithm::kHs256, JwtAlgorithm::kRs256, JwtAlgorithm::kEs256};

// A verifier that knows every test key: the secret, RSA key A and EC key A.
JwtVerifier AllKeys(JwtRules rules = Rules(kAll)) {
  return JwtVerifier({JwtVerifier::KeyFromSecret(kSecret), PemKey(kRsaAPublic, JwtAlgorithm::kRs256),
                      PemKey(kEcPublic, JwtAlgorithm::kEs256)},
                     std::move(rules));
}

// No part of `token` (nor the whole) appears in `message`.
void ExpectNothingOfToken(const std::string& message, std::string_view token) {
  if (token.size() >= 4) {
    EXPECT_EQ(message.find(token), std::string::npos) << message;
  }
  std::size_t start = 0;
  while (start <= token.size()) {
    std::size_t end = token.find('.', start);
    if (end == std::string_view::npos) end = token.size();
    const std::string_view part = token.substr(start, end - start);
    if (part.size() >= 4) {
      EXPECT_EQ(message.find(part), std::string::npos) << message;
    }
    start = end + 1;
  }
}

void ExpectRefused(const JwtVerifier& verifier, const std::string& token, std::int64_t now, std::string_view reason) {
  auto claims = verifier.Verify(token, now);
  ASSERT_FALSE(claims.ok()) << "expected: " << reason;
  EXPECT_EQ(claims.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(claims.status().message(), reason);
  ExpectNothingOfToken(claims.status().message(), token);
}

boost::json::object ExpectAccepted(const JwtVerifier& verifier, const std::string& token, std::int64_t now) {
  auto claims = verifier.Verify(token, now);
  EXPECT_TRUE(claims.ok()) << claims.status().ToString();
  return claims.ok() ? *claims : boost::json::object{};
}

// ---------------------------------------------------------------------------
// Algorithms

TEST(JwtAlgorithmTest, NamesRoundTripAndOthersAreUnknown) {
  for (JwtAlgorithm algorithm : kAll) EXPECT_EQ(JwtAlgorithmFromName(JwtAlgorithmName(algorithm)), algorithm);
  EXPECT_EQ(JwtAlgorithmName(JwtAlgorithm::kHs256), "HS256");
  EXPECT_EQ(JwtAlgorithmName(JwtAlgorithm::kRs256), "RS256");
  EXPECT_EQ(JwtAlgorithmName(JwtAlgorithm::kEs256), "ES256");
  for (std::string_view name : {"none", "None", "", "hs256", "RS384", "ES512", "PS256", "EdDSA", "HS256 "}) {
    EXPECT_FALSE(JwtAlgorithmFromName(name).has_value()) << name;
  }
}

// ---------------------------------------------------------------------------
// Published and command-line vectors

TEST(JwtVerifierTest, Rfc7515AppendixA1) {
  JwtRules rules = Rules({JwtAlgorithm::kHs256});
  rules.issuer = "joe";
  const JwtVerifier verifier({JwtVerifier::KeyFromSecret(Base64UrlDecode(kRfcKey))}, rules);
  const boost::json::object claims = ExpectAccepted(verifier, kRfcToken, 1300819379);
  EXPECT_EQ(claims.at("iss"), "joe");
  EXPECT_EQ(claims.at("exp"), 1300819380);
  EXPECT_EQ(claims.at("http://example.com/is_root"), true);
  ExpectRefused(verifier, kRfcToken, 1300819380, "token expired");
  ExpectRefused(verifier, kRfcToken, 1400000000, "token expired");

  rules.issuer = "jane";
  ExpectRefused(JwtVerifier({JwtVerifier::KeyFromSecret(Base64UrlDecode(kRfcKey))}, rules), kRfcToken, 1300819379,
                "issuer does not match");
  ExpectRefused(JwtVerifier({JwtVerifier::KeyFromSecret("another key")}, Rules({JwtAlgorithm::kHs256})), kRfcToken,
                1300819379, "signature does not verify");
}

TEST(JwtVerifierTest, TokensSignedByTheOpensslCommandLine) {
  JwtRules rules = Rules({JwtAlgorithm::kRs256, JwtAlgorithm::kEs256});
  rules.issuer = "https://issuer.example";
  rules.audience = "idemgate";
  const JwtVerifier verifier({PemKey(kRsaAPublic, JwtAlgorithm::kRs256), PemKey(kEcPublic, JwtAlgorithm::kEs256)},
                             rules);
  EXPECT_EQ(ExpectAccepted(verifier, kCliRs256Token, kNow).at("sub"), "cli-user");
  EXPECT_EQ(ExpectAccepted(verifier, kCliEs256Token, kNow).at("sub"), "cli-user");
  ExpectRefused(verifier, kCliRs256Token, 2000000000, "token expired");
  ExpectRefused(verifier, kCliEs256Token, 2000000000, "token expired");
}

// ---------------------------------------------------------------------------
// Signatures

TEST(JwtVerifierTest, EachAlgorithmIsAccepted) {
  const JwtVerifier verifier = AllKeys();
  const std::string payload = R"({"sub":"alice","exp":1700000100,"scope":["a","b"],"n":1})";
  for (const auto& [alg, signer] : std::vector<std::pair<std::string, Signer>>{
           {"HS256", Hs256(kSecret)}, {"RS256", Rs256(kRsaAPrivate)}, {"ES256", Es256(kEcPrivate)}}) {
    const std::string token = Token(R"({"alg":")" + alg + R"(","typ":"JWT"})", payload, signer);
    const boost::json::object claims = ExpectAccepted(verifier, token, kNow);
    EXPECT_EQ(claims.at("sub"), "alice") << alg;
    EXPECT_EQ(claims.at("scope").as_array().size(), 2u) << alg;
    EXPECT_EQ(claims.size(), 4u) << alg;
  }
}

TEST(JwtVerifierTest, WrongKeyIsRefused) {
  const JwtVerifier verifier = AllKeys();
  ExpectRefused(verifier, Token(R"({"alg":"HS256"})", Claims(kNow + 60), Hs256("another secret")), kNow,
                "signature does not verify");
  ExpectRefused(verifier, Token(R"({"alg":"RS256"})", Claims(kNow + 60), Rs256(kRsaBPrivate)), kNow,
                "signature does not verify");
  ExpectRefused(verifier, Token(R"({"alg":"ES256"})", Claims(kNow + 60), Es256(kEcBPrivate)), kNow,
                "signature does not verify");
}

TEST(JwtVerifierTest, TamperedTokensAreRefused) {
  const JwtVerifier verifier = AllKeys();
  for (const auto& [alg, signer] : std::vector<std::pair<std::string, Signer>>{
           {"HS256", Hs256(kSecret)}, {"RS256", Rs256(kRsaAPrivate)}, {"ES256", Es256(kEcPrivate)}}) {
    const std::string header = R"({"alg":")" + alg + R"("})";
    const std::string token = Token(header, Claims(kNow + 60), signer);
    ExpectAccepted(verifier, token, kNow);
    const std::size_t first = token.find('.');
    const std::size_t second = token.rfind('.');
    const std::string signature = token.substr(second);

    // Another payload under the original signature.
    const std::string payload = Base64UrlEncode(R"({"sub":"admin","exp":1700000060})");
    ExpectRefused(verifier, token.substr(0, first + 1) + payload + signature, kNow, "signature does not verify");
    // Another header (same algorithm, one more member) under the original signature.
    const std::string other_header = Base64UrlEncode(R"({"alg":")" + alg + R"(","typ":"JWT"})");
    ExpectRefused(verifier, other_header + token.substr(first, second - first) + signature, kNow,
                  "signature does not verify");
    // One signature bit flipped.
    std::string raw = Base64UrlDecode(signature.substr(1));
    raw[raw.size() / 2] ^= 0x01;
    ExpectRefused(verifier, token.substr(0, second + 1) + Base64UrlEncode(raw), kNow, "signature does not verify");
    // No signature at all.
    ExpectRefused(verifier, token.substr(0, second + 1), kNow,
                  alg == "ES256" ? "ES256 signature is not 64 bytes" : "signature does not verify");
  }
}

TEST(JwtVerifierTest, EverySingleCharacterChangeIsRefused) {
  const JwtVerifier verifier = AllKeys();
  const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.=+/ ";
  std::mt19937 random(7);
  for (const auto& [header, signer] :
       std::vector<std::pair<std::string, Signer>>{{R"({"alg":"HS256"})", Hs256(kSecret)},
                                                   {R"({"alg":"RS256"})", Rs256(kRsaAPrivate)},
                                                   {R"({"alg":"ES256"})", Es256(kEcPrivate)}}) {
    const std::string token = Token(header, Claims(kNow + 60), signer);
    ExpectAccepted(verifier, token, kNow);
    for (int i = 0; i < 200; ++i) {
      std::string changed = token;
      const std::size_t at = random() % changed.size();
      const char c = alphabet[random() % alphabet.size()];
      if (changed[at] == c) continue;
      changed[at] = c;
      auto claims = verifier.Verify(changed, kNow);
      EXPECT_FALSE(claims.ok()) << header << " changed at " << at;
      ExpectNothingOfToken(claims.status().message(), changed);
    }
  }
}

TEST(JwtVerifierTest, AlgNoneIsAlwaysRefused) {
  const JwtVerifier verifier = AllKeys();
  for (std::string_view alg : {"none", "None", "NONE", ""}) {
    const std::string header = Base64UrlEncode(R"({"alg":")" + std::string(alg) + R"("})");
    const std::string unsigned_token = header + "." + Base64UrlEncode(Claims(kNow + 60)) + ".";
    ExpectRefused(verifier, unsigned_token, kNow, "algorithm not allowed");
    // Not even with a signature of some allowed algorithm.
    ExpectRefused(verifier, Token(R"({"alg":")" + std::string(alg) + R"("})", Claims(kNow + 60), Hs256(kSecret)), kNow,
                  "algorithm not allowed");
  }
}

TEST(JwtVerifierTest, AlgorithmOutsideTheRulesIsRefused) {
  const std::string hs256 = Token(R"({"alg":"HS256"})", Claims(kNow + 60), Hs256(kSecret));
  ExpectRefused(AllKeys(Rules({JwtAlgorithm::kRs256, JwtAlgorithm::kEs256})), hs256, kNow, "algorithm not allowed");
  ExpectRefused(AllKeys(Rules({})), hs256, kNow, "algorithm not allowed");
  const std::string es256 = Token(R"({"alg":"ES256"})", Claims(kNow + 60), Es256(kEcPrivate));
  ExpectRefused(AllKeys(Rules({JwtAlgorithm::kRs256})), es256, kNow, "algorithm not allowed");
  ExpectAccepted(AllKeys(Rules({JwtAlgorithm::kEs256})), es256, kNow);
  ExpectRefused(AllKeys(), Token(R"({"alg":"RS512"})", Claims(kNow + 60), Hs256(kSecret)), kNow,
                "algorithm not allowed");
}

TEST(JwtVerifierTest, RsaPublicKeyUsedAsAnHmacSecretIsRefused) {
  // The classic confusion: an HS256 token whose HMAC key is the verifier's RSA public key text.
  const std::string forged = Token(R"({"alg":"HS256","typ":"JWT"})", Claims(kNow + 60), Hs256(kRsaAPublic));
  ExpectRefused(JwtVerifier({PemKey(kRsaAPublic, JwtAlgorithm::kRs256)}, Rules({JwtAlgorithm::kRs256})), forged, kNow,
                "algorithm not allowed");
  // Even with HS256 allowed, an RSA key never serves HMAC.
  ExpectRefused(
      JwtVerifier({PemKey(kRsaAPublic, JwtAlgorithm::kRs256)}, Rules({JwtAlgorithm::kRs256, JwtAlgorithm::kHs256})),
      forged, kNow, "no key for algorithm");
  // And an RS256 token is not checked against HS256 keys.
  const std::string rs256 = Token(R"({"alg":"RS256"})", Claims(kNow + 60), Rs256(kRsaAPrivate));
  ExpectRefused(JwtVerifier({JwtVerifier::KeyFromSecret(kRsaAPublic)}, Rules(kAll)), rs256, kNow,
                "no key for algorithm");
}

TEST(JwtVerifierTest, EmptySecretNeverVerifies) {
  const JwtVerifier verifier({JwtVerifier::KeyFromSecret("")}, Rules({JwtAlgorithm::kHs256}));
  ExpectRefused(verifier, Token(R"({"alg":"HS256"})", Claims(kNow + 60), Hs256("")), kNow, "signature does not verify");
}

TEST(JwtVerifierTest, KeyFromSecretKeepsSecretAndKid) {
  const JwtKey key = JwtVerifier::KeyFromSecret("s3cret", "k1");
  EXPECT_EQ(key.algorithm, JwtAlgorithm::kHs256);
  EXPECT_EQ(key.secret, "s3cret");
  EXPECT_EQ(key.kid, "k1");
  EXPECT_EQ(key.public_key, nullptr);
}

TEST(JwtVerifierTest, KidSelectsTheKey) {
  const JwtVerifier verifier(
      {PemKey(kRsaAPublic, JwtAlgorithm::kRs256, "a"), PemKey(kRsaBPublic, JwtAlgorithm::kRs256, "b")},
      Rules({JwtAlgorithm::kRs256}));
  ExpectAccepted(verifier, Token(R"({"alg":"RS256","kid":"b"})", Claims(kNow + 60), Rs256(kRsaBPrivate)), kNow);
  ExpectAccepted(verifier, Token(R"({"alg":"RS256","kid":"a"})", Claims(kNow + 60), Rs256(kRsaAPrivate)), kNow);
  // The kid names a key that did not sign.
  ExpectRefused(verifier, Token(R"({"alg":"RS256","kid":"a"})", Claims(kNow + 60), Rs256(kRsaBPrivate)), kNow,
                "signature does not verify");
  // Unknown kid, and a kid that is not a string.
  ExpectRefused(verifier, Token(R"({"alg":"RS256","kid":"c"})", Claims(kNow + 60), Rs256(kRsaBPrivate)), kNow,
                "no key for kid");
  ExpectRefused(verifier, Token(R"({"alg":"RS256","kid":7})", Claims(kNow + 60), Rs256(kRsaBPrivate)), kNow,
                "kid is not a string");
  // Without a kid every RS256 key is tried.
  ExpectAccepted(verifier, Token(R"({"alg":"RS256"})", Claims(kNow + 60), Rs256(kRsaBPrivate)), kNow);
  // A key of another algorithm with that kid does not count.
  const JwtVerifier mixed({JwtVerifier::KeyFromSecret(kSecret, "b"), PemKey(kRsaAPublic, JwtAlgorithm::kRs256, "a")},
                          Rules(kAll));
  ExpectRefused(mixed, Token(R"({"alg":"RS256","kid":"b"})", Claims(kNow + 60), Rs256(kRsaBPrivate)), kNow,
                "no key for kid");
}

// Keys passed to Verify (a JWKS fetched from a URL) are candidates after the verifier's own, and
// the caller learns when a token names a kid that no key has.
TEST(JwtVerifierTest, MoreKeysServeTooAndUnknownKidsAreReported) {
  const JwtVerifier verifier({PemKey(kRsaAPublic, JwtAlgorithm::kRs256, "a")}, Rules(kAll));
  const std::vector<JwtKey> fetched = {PemKey(kRsaBPublic, JwtAlgorithm::kRs256, "b")};
  const std::string by_b = Token(R"({"alg":"RS256","kid":"b"})", Claims(kNow + 60), Rs256(kRsaBPrivate));
  const std::string by_a = Token(R"({"alg":"RS256","kid":"a"})", Claims(kNow + 60), Rs256(kRsaAPrivate));
  const auto verify = [](const JwtVerifier& v, const std::string& token, const std::vector<JwtKey>* more,
                         bool expect_unknown) {
    bool unknown = !expect_unknown;  // Verify must set it either way
    auto claims = v.Verify(token, kNow, more, &unknown);
    EXPECT_EQ(unknown, expect_unknown);
    return claims;
  };

  // Without the fetched keys, kid "b" is unknown; with them the token verifies.
  auto claims = verify(verifier, by_b, nullptr, true);
  ASSERT_FALSE(claims.ok());
  EXPECT_EQ(claims.status().message(), "no key for kid");
  claims = verify(verifier, by_b, &fetched, false);
  ASSERT_TRUE(claims.ok()) << claims.status().ToString();
  EXPECT_EQ(claims->at("sub"), "alice");
  // The verifier's own keys still serve, with or without more keys; an empty list is no key.
  EXPECT_TRUE(verify(verifier, by_a, &fetched, false).ok());
  const std::vector<JwtKey> none;
  EXPECT_TRUE(verify(verifier, by_a, &none, false).ok());
  EXPECT_FALSE(verify(verifier, by_b, &none, true).ok());
  // The default arguments: no more keys, nothing reported.
  EXPECT_FALSE(verifier.Verify(by_b, kNow).ok());

  // A known kid whose key did not sign is a bad signature, not an unknown kid.
  const std::string b_signed_by_a = Token(R"({"alg":"RS256","kid":"b"})", Claims(kNow + 60), Rs256(kRsaAPrivate));
  claims = verify(verifier, b_signed_by_a, &fetched, false);
  EXPECT_EQ(claims.status().message(), "signature does not verify");
  // A kid known only under another algorithm is unknown.
  const JwtVerifier other_alg({JwtVerifier::KeyFromSecret(kSecret, "b")}, Rules(kAll));
  EXPECT_FALSE(verify(other_alg, by_b, nullptr, true).ok());
  // A key without a kid is tried for a token naming one: when it verifies, nothing is unknown;
  // when it does not, the kid still names no key.
  const JwtVerifier any_kid({PemKey(kRsaAPublic, JwtAlgorithm::kRs256)}, Rules(kAll));
  const std::string c_by_a = Token(R"({"alg":"RS256","kid":"c"})", Claims(kNow + 60), Rs256(kRsaAPrivate));
  const std::string c_by_b = Token(R"({"alg":"RS256","kid":"c"})", Claims(kNow + 60), Rs256(kRsaBPrivate));
  EXPECT_TRUE(verify(any_kid, c_by_a, nullptr, false).ok());
  claims = verify(any_kid, c_by_b, nullptr, true);
  EXPECT_EQ(claims.status().message(), "signature does not verify");
  // A token without a kid is never an unknown kid.
  const std::string no_kid = Token(R"({"alg":"RS256"})", Claims(kNow + 60), Rs256(kRsaBPrivate));
  EXPECT_EQ(verify(verifier, no_kid, nullptr, false).status().message(), "signature does not verify");
  // Failures before the keys (the header) or after the signature (the claims) are not about keys.
  const std::string none_alg = Base64UrlEncode(R"({"alg":"none","kid":"x"})") + "." + Base64UrlEncode(Claims(kNow + 60)) + ".";
  EXPECT_EQ(verify(verifier, none_alg, &fetched, false).status().message(), "algorithm not allowed");
  const std::string expired = Token(R"({"alg":"RS256","kid":"b"})", Claims(kNow - 60), Rs256(kRsaBPrivate));
  EXPECT_EQ(verify(verifier, expired, &fetched, false).status().message(), "token expired");
}

TEST(JwtVerifierTest, KeyWithoutKidServesTokensThatNameOne) {
  const JwtVerifier verifier(
      {PemKey(kRsaAPublic, JwtAlgorithm::kRs256, "a"), PemKey(kRsaBPublic, JwtAlgorithm::kRs256)},
      Rules({JwtAlgorithm::kRs256}));
  ExpectAccepted(verifier, Token(R"({"alg":"RS256","kid":"anything"})", Claims(kNow + 60), Rs256(kRsaBPrivate)), kNow);
  ExpectRefused(verifier, Token(R"({"alg":"RS256","kid":"anything"})", Claims(kNow + 60), Rs256(kRsaAPrivate)), kNow,
                "signature does not verify");
}

TEST(JwtVerifierTest, Es256SignatureMustBe64RawBytes) {
  const JwtVerifier verifier = AllKeys();
  const std::string token = Token(R"({"alg":"ES256"})", Claims(kNow + 60), Es256(kEcPrivate));
  const std::size_t dot = token.rfind('.');
  const std::string raw = Base64UrlDecode(token.substr(dot + 1));
  ASSERT_EQ(raw.size(), 64u);
  ExpectRefused(verifier, token.substr(0, dot + 1) + Base64UrlEncode(raw.substr(0, 63)), kNow,
                "ES256 signature is not 64 bytes");
  ExpectRefused(verifier, token.substr(0, dot + 1) + Base64UrlEncode(raw + '\0'), kNow, "ES256 signature is not 64 bytes");
  ExpectRefused(verifier, token.substr(0, dot + 1) + Base64UrlEncode('\0' + raw), kNow, "ES256 signature is not 64 bytes");
  // The DER form OpenSSL produces is not the JOSE form.
  ExpectRefused(verifier, Token(R"({"alg":"ES256"})", Claims(kNow + 60), Es256Der(kEcPrivate)), kNow,
                "ES256 signature is not 64 bytes");
  // r = 0 or s = 0 never verifies.
  ExpectRefused(verifier, token.substr(0, dot + 1) + Base64UrlEncode(std::string(32, '\0') + raw.substr(32)), kNow,
                "signature does not verify");
  ExpectRefused(verifier, token.substr(0, dot + 1) + Base64UrlEncode(std::string(64, '\0')), kNow,
                "signature does not verify");
}

// ---------------------------------------------------------------------------
// Header

TEST(JwtVerifierTest, TypMustBeJwtInAnyCase) {
  const JwtVerifier verifier = AllKeys();
  for (std::string_view typ : {"JWT", "jwt", "Jwt", "application/jwt", "APPLICATION/JWT"}) {
    ExpectAccepted(verifier,
                   Token(R"({"alg":"HS256","typ":")" + std::string(typ) + R"("})", Claims(kNow + 60), Hs256(kSecret)),
                   kNow);
  }
  for (std::string_view typ : {R"("JOSE+JSON")", R"("JOSE")", R"("")", "1", "null", R"(["JWT"])", R"("application/")",
                               R"("text/jwt")", R"("application/application/jwt")", R"("JWT ")", R"("secevent+jwt")",
                               R"("dpop+jwt")", R"("application/jose")"}) {
    ExpectRefused(verifier,
                  Token(R"({"alg":"HS256","typ":)" + std::string(typ) + "}", Claims(kNow + 60), Hs256(kSecret)), kNow,
                  "typ is not JWT or at+jwt");
  }
}

// RFC 9068 access tokens (Duende IdentityServer and other issuers of that profile) carry
// "at+jwt" or, with the media type's prefix, "application/at+jwt"; case does not matter.
TEST(JwtVerifierTest, TypAtJwtIsAccepted) {
  const JwtVerifier verifier = AllKeys();
  for (std::string_view typ : {"at+jwt", "AT+JWT", "At+Jwt", "application/at+jwt", "Application/AT+JWT"}) {
    ExpectAccepted(verifier,
                   Token(R"({"alg":"HS256","typ":")" + std::string(typ) + R"("})", Claims(kNow + 60), Hs256(kSecret)),
                   kNow);
    ExpectAccepted(verifier,
                   Token(R"({"alg":"ES256","typ":")" + std::string(typ) + R"("})", Claims(kNow + 60),
                         Es256(kEcPrivate)),
                   kNow);
  }
  // Only exactly these: no other "+jwt" type, nothing around them.
  for (std::string_view typ : {"at+jwt ", "at+jws", "at-jwt", "xat+jwt", "application/at+jwt/x", "application at+jwt"}) {
    ExpectRefused(verifier,
                  Token(R"({"alg":"HS256","typ":")" + std::string(typ) + R"("})", Claims(kNow + 60), Hs256(kSecret)),
                  kNow, "typ is not JWT or at+jwt");
  }
}

TEST(JwtVerifierTest, CritIsRefused) {
  const JwtVerifier verifier = AllKeys();
  ExpectRefused(verifier, Token(R"({"alg":"HS256","crit":["exp"],"exp":1})", Claims(kNow + 60), Hs256(kSecret)), kNow,
                "crit is not supported");
  ExpectRefused(verifier, Token(R"({"alg":"HS256","crit":[]})", Claims(kNow + 60), Hs256(kSecret)), kNow,
                "crit is not supported");
  ExpectRefused(verifier, Token(R"({"alg":"HS256","b64":false,"crit":["b64"]})", Claims(kNow + 60), Hs256(kSecret)),
                kNow, "crit is not supported");
}

TEST(JwtVerifierTest, HeaderMustBeAnObjectWithAStringAlg) {
  const JwtVerifier verifier = AllKeys();
  const Signer sign = Hs256(kSecret);
  ExpectRefused(verifier, Token("not json", Claims(kNow + 60), sign), kNow, "header is not a JSON object");
  ExpectRefused(verifier, Token(R"(["HS256"])", Claims(kNow + 60), sign), kNow, "header is not a JSON object");
  ExpectRefused(verifier, Token(R"("HS256")", Claims(kNow + 60), sign), kNow, "header is not a JSON object");
  ExpectRefused(verifier, Token(R"({"alg":"HS256",})", Claims(kNow + 60), sign), kNow, "header is not a JSON object");
  ExpectRefused(verifier, Token("", Claims(kNow + 60), sign), kNow, "header is not a JSON object");
  ExpectRefused(verifier, Token(R"({"typ":"JWT"})", Claims(kNow + 60), sign), kNow, "header has no alg");
  ExpectRefused(verifier, Token(R"({"alg":null})", Claims(kNow + 60), sign), kNow, "header has no alg");
  ExpectRefused(verifier, Token(R"({"alg":["HS256"]})", Claims(kNow + 60), sign), kNow, "header has no alg");
  // Duplicate members: the last one counts.
  ExpectRefused(verifier, Token(R"({"alg":"HS256","alg":"none"})", Claims(kNow + 60), sign), kNow,
                "algorithm not allowed");
}

// ---------------------------------------------------------------------------
// Form

TEST(JwtVerifierTest, MalformedTokensAreRefused) {
  const JwtVerifier verifier = AllKeys();
  const std::string good = Token(R"({"alg":"HS256"})", Claims(kNow + 60), Hs256(kSecret));
  ExpectAccepted(verifier, good, kNow);
  const std::size_t first = good.find('.');
  const std::size_t second = good.rfind('.');
  const std::string header = good.substr(0, first);
  const std::string payload = good.substr(first + 1, second - first - 1);
  const std::string signature = good.substr(second + 1);

  for (const std::string& token :
       {std::string(), std::string("."), std::string(".."), header, header + "." + payload, good + "." + signature,
        good + ".", "." + good, header + "." + payload + "." + signature + "." + payload}) {
    auto claims = verifier.Verify(token, kNow);
    ASSERT_FALSE(claims.ok());
    if (token == "..") {
      EXPECT_EQ(claims.status().message(), "header is not a JSON object");
    } else {
      EXPECT_EQ(claims.status().message(), "token is not three parts") << token;
    }
    ExpectNothingOfToken(claims.status().message(), token);
  }
  // Characters outside base64url, padding, impossible lengths, leftover bits.
  ExpectRefused(verifier, header + "=." + payload + "." + signature, kNow, "token part is not base64url");
  ExpectRefused(verifier, header + "." + payload + "==." + signature, kNow, "token part is not base64url");
  ExpectRefused(verifier, header + "." + payload + "." + signature + "=", kNow, "token part is not base64url");
  ExpectRefused(verifier, header + "." + payload + "." + signature.substr(0, 42) + "+" + signature.substr(43), kNow,
                "token part is not base64url");
  ExpectRefused(verifier, header + "." + payload + "." + signature.substr(0, 42) + "/" + signature.substr(43), kNow,
                "token part is not base64url");
  ExpectRefused(verifier, header + " ." + payload + "." + signature, kNow, "token part is not base64url");
  ExpectRefused(verifier, "Bearer " + good, kNow, "token part is not base64url");
  ExpectRefused(verifier, header + "." + payload + "AA." + signature, kNow, "token part is not base64url");
  ExpectRefused(verifier, std::string(1, '\0') + good, kNow, "token part is not base64url");
  // The signature is 32 bytes: 43 characters whose last one carries 2 unused bits, which must be 0.
  ASSERT_EQ(signature.size(), 43u);
  std::string loose = signature;
  const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  loose.back() = alphabet[alphabet.find(loose.back()) | 1];
  if (loose != signature) {
    ExpectRefused(verifier, header + "." + payload + "." + loose, kNow, "token part is not base64url");
  }
}

TEST(JwtVerifierTest, PayloadMustBeAJsonObject) {
  const JwtVerifier verifier = AllKeys();
  for (std::string_view payload : {"[1,2]", R"(["sub"])", R"("alice")", "42", "null", "", "{", R"({"exp":1}x)"}) {
    ExpectRefused(verifier, Token(R"({"alg":"RS256"})", payload, Rs256(kRsaAPrivate)), kNow,
                  "payload is not a JSON object");
  }
}

TEST(JwtVerifierTest, LongTokensAreRefused) {
  const JwtVerifier verifier = AllKeys();
  // A valid token of exactly 16 KiB passes; one byte more does not.
  const std::string prefix = R"({"sub":"alice","exp":1700000060,"pad":")";
  const std::string header = R"({"alg":"HS256"})";
  std::string pad;
  std::string token;
  for (std::size_t n = 12000;; ++n) {
    pad.assign(n, 'x');
    token = Token(header, prefix + pad + "\"}", Hs256(kSecret));
    if (token.size() >= 16 * 1024) break;
  }
  ASSERT_EQ(token.size(), 16u * 1024);
  ExpectAccepted(verifier, token, kNow);
  pad.push_back('x');
  token = Token(header, prefix + pad + "\"}", Hs256(kSecret));
  ASSERT_GT(token.size(), 16u * 1024);
  ExpectRefused(verifier, token, kNow, "token is too long");
  ExpectRefused(verifier, std::string(1 << 20, 'A'), kNow, "token is too long");
}

// ---------------------------------------------------------------------------
// Claims

TEST(JwtVerifierTest, ExpiryWithAndWithoutLeeway) {
  const JwtVerifier verifier = AllKeys();
  const Signer sign = Hs256(kSecret);
  const std::string header = R"({"alg":"HS256"})";
  ExpectAccepted(verifier, Token(header, Claims(kNow + 1), sign), kNow);
  ExpectRefused(verifier, Token(header, Claims(kNow), sign), kNow, "token expired");  // at exp
  ExpectRefused(verifier, Token(header, Claims(kNow - 1), sign), kNow, "token expired");
  ExpectRefused(verifier, Token(header, Claims(0), sign), kNow, "token expired");
  ExpectRefused(verifier, Token(header, Claims(-5), sign), kNow, "token expired");

  JwtRules rules = Rules(kAll);
  rules.leeway_seconds = 30;
  const JwtVerifier lenient = AllKeys(rules);
  ExpectAccepted(lenient, Token(header, Claims(kNow), sign), kNow);
  ExpectAccepted(lenient, Token(header, Claims(kNow - 29), sign), kNow);
  ExpectRefused(lenient, Token(header, Claims(kNow - 30), sign), kNow, "token expired");  // now - leeway == exp
  ExpectRefused(lenient, Token(header, Claims(kNow - 31), sign), kNow, "token expired");

  // A negative leeway counts as none.
  rules.leeway_seconds = -30;
  ExpectAccepted(AllKeys(rules), Token(header, Claims(kNow + 1), sign), kNow);
}

TEST(JwtVerifierTest, ExpAcceptsIntegersUnsignedAndFractions) {
  const JwtVerifier verifier = AllKeys();
  const Signer sign = Hs256(kSecret);
  const std::string header = R"({"alg":"HS256"})";
  ExpectAccepted(verifier, Token(header, R"({"exp":1700000000.5})", sign), kNow);
  ExpectRefused(verifier, Token(header, R"({"exp":1699999999.5})", sign), kNow, "token expired");
  ExpectRefused(verifier, Token(header, R"({"exp":1.7e9})", sign), kNow, "token expired");
  ExpectAccepted(verifier, Token(header, R"({"exp":1.8e9})", sign), kNow);
  ExpectAccepted(verifier, Token(header, R"({"exp":18446744073709551615})", sign), kNow);  // uint64
  ExpectAccepted(verifier, Token(header, R"({"exp":9223372036854775807})", sign), kNow);
  ExpectAccepted(verifier, Token(header, R"({"exp":1e300})", sign), kNow);
  ExpectRefused(verifier, Token(header, R"({"exp":-9223372036854775808})", sign), kNow, "token expired");
  ExpectAccepted(verifier, Token(header, R"({"exp":1700000060})", sign), std::numeric_limits<std::int64_t>::min());
  ExpectRefused(verifier, Token(header, R"({"exp":9223372036854775807})", sign),
                std::numeric_limits<std::int64_t>::max(), "token expired");
  for (std::string_view exp : {R"("1800000000")", "true", "null", "[1800000000]", "{}", "1e400"}) {
    ExpectRefused(verifier, Token(header, R"({"exp":)" + std::string(exp) + "}", sign), kNow, "exp is not a number");
  }
}

TEST(JwtVerifierTest, ExpIsRequiredUnlessConfiguredOtherwise) {
  const std::string token = Token(R"({"alg":"HS256"})", R"({"sub":"alice"})", Hs256(kSecret));
  ExpectRefused(AllKeys(), token, kNow, "token has no exp");
  JwtRules rules = Rules(kAll);
  rules.require_exp = false;
  const JwtVerifier optional_exp = AllKeys(rules);
  EXPECT_EQ(ExpectAccepted(optional_exp, token, kNow).at("sub"), "alice");
  // A present exp is still checked.
  ExpectRefused(optional_exp, Token(R"({"alg":"HS256"})", Claims(kNow - 1), Hs256(kSecret)), kNow, "token expired");
}

TEST(JwtVerifierTest, NotBeforeWithAndWithoutLeeway) {
  const Signer sign = Hs256(kSecret);
  const std::string header = R"({"alg":"HS256"})";
  auto claims = [](std::int64_t nbf) { return R"({"exp":1800000000,"nbf":)" + std::to_string(nbf) + "}"; };
  const JwtVerifier verifier = AllKeys();
  ExpectAccepted(verifier, Token(header, claims(kNow), sign), kNow);
  ExpectAccepted(verifier, Token(header, claims(kNow - 100), sign), kNow);
  ExpectRefused(verifier, Token(header, claims(kNow + 1), sign), kNow, "token not yet valid");
  ExpectRefused(verifier, Token(header, claims(kNow + 3600), sign), kNow, "token not yet valid");
  ExpectAccepted(verifier, Token(header, R"({"exp":1800000000,"nbf":1700000000.0})", sign), kNow);
  ExpectRefused(verifier, Token(header, R"({"exp":1800000000,"nbf":1700000000.5})", sign), kNow, "token not yet valid");
  ExpectRefused(verifier, Token(header, R"({"exp":1800000000,"nbf":"1"})", sign), kNow, "nbf is not a number");

  JwtRules rules = Rules(kAll);
  rules.leeway_seconds = 30;
  const JwtVerifier lenient = AllKeys(rules);
  ExpectAccepted(lenient, Token(header, claims(kNow + 29), sign), kNow);
  ExpectAccepted(lenient, Token(header, claims(kNow + 30), sign), kNow);
  ExpectRefused(lenient, Token(header, claims(kNow + 31), sign), kNow, "token not yet valid");
}

TEST(JwtVerifierTest, IssuerMustMatchWhenSet) {
  const Signer sign = Hs256(kSecret);
  const std::string header = R"({"alg":"HS256"})";
  JwtRules rules = Rules(kAll);
  rules.issuer = "https://issuer.example";
  const JwtVerifier verifier = AllKeys(rules);
  ExpectAccepted(verifier, Token(header, R"({"exp":1800000000,"iss":"https://issuer.example"})", sign), kNow);
  ExpectRefused(verifier, Token(header, R"({"exp":1800000000,"iss":"https://issuer.example/"})", sign), kNow,
                "issuer does not match");
  ExpectRefused(verifier, Token(header, R"({"exp":1800000000,"iss":"HTTPS://ISSUER.EXAMPLE"})", sign), kNow,
                "issuer does not match");
  ExpectRefused(verifier, Token(header, R"({"exp":1800000000,"iss":["https://issuer.example"]})", sign), kNow,
                "issuer does not match");
  ExpectRefused(verifier, Token(header, R"({"exp":1800000000})", sign), kNow, "token has no iss");
  // Without an issuer rule any iss passes.
  ExpectAccepted(AllKeys(), Token(header, R"({"exp":1800000000,"iss":"anyone"})", sign), kNow);
}

TEST(JwtVerifierTest, AudienceMayBeAStringOrAnArray) {
  const Signer sign = Hs256(kSecret);
  const std::string header = R"({"alg":"HS256"})";
  auto claims = [](std::string_view aud) { return R"({"exp":1800000000,"aud":)" + std::string(aud) + "}"; };
  JwtRules rules = Rules(kAll);
  rules.audience = "idemgate";
  const JwtVerifier verifier = AllKeys(rules);
  ExpectAccepted(verifier, Token(header, claims(R"("idemgate")"), sign), kNow);
  ExpectAccepted(verifier, Token(header, claims(R"(["other","idemgate"])"), sign), kNow);
  ExpectAccepted(verifier, Token(header, claims(R"(["idemgate"])"), sign), kNow);
  ExpectRefused(verifier, Token(header, claims(R"("other")"), sign), kNow, "audience does not match");
  ExpectRefused(verifier, Token(header, claims(R"("idemgate2")"), sign), kNow, "audience does not match");
  ExpectRefused(verifier, Token(header, claims(R"(["other","another"])"), sign), kNow, "audience does not match");
  ExpectRefused(verifier, Token(header, claims("[]"), sign), kNow, "audience does not match");
  ExpectRefused(verifier, Token(header, claims("1"), sign), kNow, "aud is not a string or an array of strings");
  ExpectRefused(verifier, Token(header, claims(R"(["idemgate",1])"), sign), kNow,
                "aud is not a string or an array of strings");
  ExpectRefused(verifier, Token(header, claims(R"({"idemgate":true})"), sign), kNow,
                "aud is not a string or an array of strings");
  ExpectRefused(verifier, Token(header, R"({"exp":1800000000})", sign), kNow, "token has no aud");
  // Without an audience rule aud is not looked at.
  ExpectAccepted(AllKeys(), Token(header, claims(R"("other")"), sign), kNow);
}

// ---------------------------------------------------------------------------
// PEM keys

TEST(JwtKeyFromPemTest, ReadsRsaAndP256Keys) {
  auto rsa = JwtVerifier::KeyFromPem(kRsaAPublic, JwtAlgorithm::kRs256, "r1");
  ASSERT_TRUE(rsa.ok()) << rsa.status().ToString();
  EXPECT_EQ(rsa->kid, "r1");
  EXPECT_EQ(rsa->algorithm, JwtAlgorithm::kRs256);
  EXPECT_NE(rsa->public_key, nullptr);
  EXPECT_TRUE(rsa->secret.empty());
  auto ec = JwtVerifier::KeyFromPem(kEcPublic, JwtAlgorithm::kEs256);
  ASSERT_TRUE(ec.ok()) << ec.status().ToString();
  EXPECT_EQ(ec->kid, "");
  EXPECT_EQ(ec->algorithm, JwtAlgorithm::kEs256);
  EXPECT_NE(ec->public_key, nullptr);
}

TEST(JwtKeyFromPemTest, RefusesKeysThatDoNotFitTheAlgorithm) {
  struct Case {
    std::string pem;
    JwtAlgorithm algorithm;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {kRsa1024Public, JwtAlgorithm::kRs256, "RSA key is shorter than 2048 bits"},
      {kEc384Public, JwtAlgorithm::kEs256, "EC key is not on P-256"},
      {kRsaAPublic, JwtAlgorithm::kEs256, "ES256 needs an EC key"},
      {kEcPublic, JwtAlgorithm::kRs256, "RS256 needs an RSA key"},
      {kRsaAPublic, JwtAlgorithm::kHs256, "HS256 takes a shared secret, not a PEM key"},
      {kRsaAPrivate, JwtAlgorithm::kRs256, "not a PEM public key"},
      {kEcPrivate, JwtAlgorithm::kEs256, "not a PEM public key"},
      {"", JwtAlgorithm::kRs256, "not a PEM public key"},
      {"not a key", JwtAlgorithm::kRs256, "not a PEM public key"},
      {std::string(kRsaAPublic).substr(0, 200), JwtAlgorithm::kRs256, "not a PEM public key"},
      {"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", JwtAlgorithm::kRs256, "not a PEM public key"},
  };
  for (const Case& c : cases) {
    auto key = JwtVerifier::KeyFromPem(c.pem, c.algorithm);
    ASSERT_FALSE(key.ok()) << c.reason;
    EXPECT_EQ(key.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(key.status().message(), c.reason);
  }
}

// ---------------------------------------------------------------------------
// JWKS

TEST(JwtKeysFromJwksTest, ReadsKeysWhoseParametersCameFromTheCommandLine) {
  const std::string jwks = std::string(R"({"keys":[{"kty":"RSA","kid":"rsa-a","use":"sig","alg":"RS256","n":")") +
                           kRsaAN + R"(","e":"AQAB"},{"kty":"EC","kid":"ec-a","crv":"P-256","x":")" + kEcX +
                           R"(","y":")" + kEcY + R"("}]})";
  auto keys = JwtVerifier::KeysFromJwks(jwks);
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  ASSERT_EQ(keys->size(), 2u);
  EXPECT_EQ((*keys)[0].kid, "rsa-a");
  EXPECT_EQ((*keys)[0].algorithm, JwtAlgorithm::kRs256);
  EXPECT_EQ((*keys)[1].kid, "ec-a");
  EXPECT_EQ((*keys)[1].algorithm, JwtAlgorithm::kEs256);
  const JwtVerifier verifier(*keys, Rules({JwtAlgorithm::kRs256, JwtAlgorithm::kEs256}));
  ExpectAccepted(verifier, kCliRs256Token, kNow);
  ExpectAccepted(verifier, kCliEs256Token, kNow);
  ExpectAccepted(verifier, Token(R"({"alg":"ES256","kid":"ec-a"})", Claims(kNow + 60), Es256(kEcPrivate)), kNow);
  ExpectRefused(verifier, Token(R"({"alg":"ES256","kid":"rsa-a"})", Claims(kNow + 60), Es256(kEcPrivate)), kNow,
                "no key for kid");
}

TEST(JwtKeysFromJwksTest, SelectsByKid) {
  auto keys = JwtVerifier::KeysFromJwks(
      Jwks({Jwk(kRsaAPublic, R"("kid":"one")"), Jwk(kRsaBPublic, R"("kid":"two","alg":"RS256","use":"sig")"),
            Jwk(kEcBPublic, R"("kid":"three")")}));
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  ASSERT_EQ(keys->size(), 3u);
  const JwtVerifier verifier(*keys, Rules(kAll));
  ExpectAccepted(verifier, Token(R"({"alg":"RS256","kid":"two"})", Claims(kNow + 60), Rs256(kRsaBPrivate)), kNow);
  ExpectAccepted(verifier, Token(R"({"alg":"RS256","kid":"one"})", Claims(kNow + 60), Rs256(kRsaAPrivate)), kNow);
  ExpectAccepted(verifier, Token(R"({"alg":"ES256","kid":"three"})", Claims(kNow + 60), Es256(kEcBPrivate)), kNow);
  ExpectRefused(verifier, Token(R"({"alg":"RS256","kid":"one"})", Claims(kNow + 60), Rs256(kRsaBPrivate)), kNow,
                "signature does not verify");
  ExpectRefused(verifier, Token(R"({"alg":"RS256","kid":"four"})", Claims(kNow + 60), Rs256(kRsaBPrivate)), kNow,
                "no key for kid");
  ExpectRefused(verifier, Token(R"({"alg":"HS256","kid":"one"})", Claims(kNow + 60), Hs256(kSecret)), kNow,
                "no key for kid");
}

TEST(JwtKeysFromJwksTest, SkipsKeysThatAreNotUsableSignatureKeys) {
  std::string off_curve = Jwk(kEcPublic, R"("kid":"off-curve")");
  {
    // Change the last character of y: the point leaves the curve.
    const std::size_t y = off_curve.find(R"("y":")") + 5;
    const std::size_t end = off_curve.find('"', y);
    off_curve[end - 2] = off_curve[end - 2] == 'A' ? 'B' : 'A';
  }
  const std::vector<std::string> unusable = {
      Jwk(kRsaBPublic, R"("kid":"enc","use":"enc")"),
      Jwk(kRsaBPublic, R"("kid":"use-number","use":1)"),
      Jwk(kRsaBPublic, R"("kid":"encrypt-only","key_ops":["encrypt","wrapKey"])"),
      Jwk(kRsaBPublic, R"("kid":"no-ops","key_ops":[])"),
      Jwk(kRsaBPublic, R"("kid":"ops-string","key_ops":"verify")"),
      Jwk(kRsaBPublic, R"("kid":"rs512","alg":"RS512")"),
      Jwk(kRsaBPublic, R"("kid":"ps256","alg":"PS256")"),
      Jwk(kRsaBPublic, R"("kid":"es256-on-rsa","alg":"ES256")"),
      Jwk(kEcBPublic, R"("kid":"rs256-on-ec","alg":"RS256")"),
      Jwk(kEcBPublic, R"("kid":"alg-number","alg":256)"),
      Jwk(kRsaBPublic, R"("kid":7)"),
      Jwk(kRsa1024Public, R"("kid":"short")"),
      Jwk(kEc384Public, R"("kid":"p384","crv":"P-384")"),
      Jwk(kEc384Public, R"("kid":"p384-named-p256","crv":"P-256")"),
      off_curve,
      R"({"kty":"oct","kid":"hmac","k":"c2VjcmV0","alg":"HS256"})",
      R"({"kty":"OKP","kid":"ed","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"})",
      R"({"kid":"no-kty","n":"AQAB","e":"AQAB"})",
      R"({"kty":"RSA","kid":"no-n","e":"AQAB"})",
      R"({"kty":"RSA","kid":"bad-n","n":"not base64url!","e":"AQAB"})",
      R"({"kty":"RSA","kid":"padded-e","n":")" + std::string(kRsaAN) + R"(","e":"AQAB="})",
      R"({"kty":"EC","kid":"no-crv","x":")" + std::string(kEcX) + R"(","y":")" + std::string(kEcY) + R"("})",
      R"({"kty":"EC","kid":"short-x","crv":"P-256","x":"AQAB","y":")" + std::string(kEcY) + R"("})",
      R"("not an object")",
      "42",
  };
  // Alone, none of them makes a JWKS.
  for (const std::string& jwk : unusable) {
    auto keys = JwtVerifier::KeysFromJwks(Jwks({jwk}));
    ASSERT_FALSE(keys.ok()) << jwk;
    EXPECT_EQ(keys.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(keys.status().message(), "JWKS holds no usable signature key");
  }
  // Together with one good key, only that one is kept.
  std::vector<std::string> all = unusable;
  all.push_back(Jwk(kRsaAPublic, R"("kid":"good","use":"sig")"));
  all.push_back(Jwk(kRsaAPublic, R"("kid":"good-ops","key_ops":["sign","verify"])"));
  auto keys = JwtVerifier::KeysFromJwks(Jwks(all));
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  ASSERT_EQ(keys->size(), 2u);
  EXPECT_EQ((*keys)[0].kid, "good");
  EXPECT_EQ((*keys)[1].kid, "good-ops");
}

TEST(JwtKeysFromJwksTest, RefusesTextThatIsNotAJwks) {
  for (std::string_view text : {"", "{", "not json", R"({"keys":[)", "[]", R"({"keys":{}})", R"({"keys":"x"})",
                                R"({"key":[]})", R"({"keys":[]})", "null"}) {
    auto keys = JwtVerifier::KeysFromJwks(text);
    ASSERT_FALSE(keys.ok()) << text;
    EXPECT_EQ(keys.status().code(), StatusCode::kInvalidArgument) << text;
  }
  EXPECT_EQ(JwtVerifier::KeysFromJwks("{").status().message(), "JWKS is not JSON");
  EXPECT_EQ(JwtVerifier::KeysFromJwks("[]").status().message(), "JWKS has no keys array");
  EXPECT_EQ(JwtVerifier::KeysFromJwks(R"({"keys":[]})").status().message(), "JWKS holds no usable signature key");
}

// ---------------------------------------------------------------------------
// Sharing

TEST(JwtVerifierTest, KeysOutliveTheirSourceAndVerifyFromManyThreads) {
  std::vector<JwtKey> keys;
  {
    auto jwks = JwtVerifier::KeysFromJwks(Jwks({Jwk(kRsaAPublic, ""), Jwk(kEcPublic, "")}));
    ASSERT_TRUE(jwks.ok()) << jwks.status().ToString();
    keys = *jwks;  // copies share the EVP_PKEYs
  }
  const JwtVerifier verifier(keys, Rules(kAll));
  keys.clear();
  const std::string rs256 = Token(R"({"alg":"RS256"})", Claims(kNow + 60), Rs256(kRsaAPrivate));
  const std::string es256 = Token(R"({"alg":"ES256"})", Claims(kNow + 60), Es256(kEcPrivate));
  const std::string forged = Token(R"({"alg":"RS256"})", Claims(kNow + 60), Rs256(kRsaBPrivate));
  // Keys passed per call are shared, not copied, between the threads too.
  const std::vector<JwtKey> more = {PemKey(kRsaBPublic, JwtAlgorithm::kRs256, "b")};
  const std::string by_b = Token(R"({"alg":"RS256","kid":"b"})", Claims(kNow + 60), Rs256(kRsaBPrivate));
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        if (!verifier.Verify(rs256, kNow).ok()) ++failures[t];
        if (!verifier.Verify(es256, kNow).ok()) ++failures[t];
        if (verifier.Verify(forged, kNow).ok()) ++failures[t];
        if (!verifier.Verify(by_b, kNow, &more).ok()) ++failures[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int f : failures) EXPECT_EQ(f, 0);
}

}  // namespace
}  // namespace idemgate::identity
