// JWKS documents (RFC 7517, identity::JwtVerifier::KeysFromJwks), as read
// from identity.jwt.jwks_file or fetched from jwks_url. The first byte's low
// bit picks what the rest is:
//  - 0: the document's text. Checked: a document that is read holds at
//    least one key, each RS256 or ES256 with a public key; and a key that is
//    read verifies an ES256 token of the test key only if the text holds
//    that key's coordinates.
//  - 1: choices for a document written here from members of known kinds
//    (the test keys' JWKs, with and without kid, use and alg; keys for
//    encryption, of another type or curve, too short, off the curve, with a
//    mismatched alg, not objects), with fuzz-chosen kids in JSON escapes.
//    Checked: exactly the usable members are read, in order, with their kid
//    and algorithm, and the test EC key, when among them, verifies a token
//    it signed under its own kid.

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_target.h"
#include "identity/jwt.h"

namespace {

namespace identity = idemgate::identity;
using identity::JwtAlgorithm;
using identity::JwtKey;
using identity::JwtVerifier;

constexpr std::int64_t kNow = 1700000000;

// The test keys of tests/identity/jwt_test.cc: the EC key's private half (to sign) and the
// JWK parameters of it and of the RSA key, as the openssl command line printed them.
constexpr char kEcPrivate[] = R"pem(-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgcU2GsTuZ9pMIm9/v
jlZ4yBw7vD3YTqKQJ/WRX7Qt1juhRANCAASOe1qGLxWxrkolVpf7eQXU61t7XMjE
te8YqUWV+qkAcNoDyfuwb9eVoahNTkLn4d/LwmFWV1d/UF5B7P99cHol
-----END PRIVATE KEY-----
)pem";
constexpr std::string_view kEcX = "jntahi8Vsa5KJVaX-3kF1Otbe1zIxLXvGKlFlfqpAHA";
constexpr std::string_view kEcY = "2gPJ-7Bv15WhqE1OQufh38vCYVZXV39QXkHs_31weiU";
// The same x with its last coordinate changed: not on the curve.
constexpr std::string_view kEcYOff = "2gPJ-7Bv15WhqE1OQufh38vCYVZXV39QXkHs_31weiY";
constexpr std::string_view kRsaN =
    "skmY0XBZ11iq9bQg1VPf2YWDb0wHKS2bjM5cy8foHbaVt1XakTZnfqR9mPInk4_nAj-"
    "iZDnSb2HWFEDoUbfHBxe5vS8EXYxcoMTvrw7ifWjMq_0V"
    "ee36IzwI49yvLe6IE47IBb32wgDdoLq_"
    "KXRNZQaAFeJiskPomrTja2FIKsOUaYPVSVIjgrePxUYGe4R2mkcvyxTVY6SEu5s1EBIUCsQxTo9AFuHA"
    "Yafd85mzZQ20lJ2_9678iYl3-4LeGZbsn_vcJD5VwEz33QXIZLMhEcXnlm-NuUR2OVm37esB_XFFAApjU3Nwm4L_"
    "EkOVQLVjLJIvbqj19NpvGgg2"
    "eg5qXw";
// The first 1024 bits of that modulus, made odd: an RSA key too short for RS256.
constexpr std::string_view kRsaShortN =
    "skmY0XBZ11iq9bQg1VPf2YWDb0wHKS2bjM5cy8foHbaVt1XakTZnfqR9mPInk4_nAj-"
    "iZDnSb2HWFEDoUbfHBxe5vS8EXYxcoMTvrw7ifWjMq_0V"
    "ee36IzwI49yvLe6IE47IBb32wgDdoLq_KXRNZQaAFeJiskPomrTja2FIKsM";

template <auto Free>
struct Deleter {
  template <typename T>
  void operator()(T* p) const {
    Free(p);
  }
};
using BioPtr = std::unique_ptr<BIO, Deleter<BIO_free>>;
using EcdsaSigPtr = std::unique_ptr<ECDSA_SIG, Deleter<ECDSA_SIG_free>>;
using MdCtxPtr = std::unique_ptr<EVP_MD_CTX, Deleter<EVP_MD_CTX_free>>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY_free>>;

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

// An ES256 token (JOSE r || s signature) of the test EC key, naming `kid` when not empty.
std::string Es256Token(std::string_view kid_json) {
  static const PkeyPtr key = [] {
    BioPtr bio(BIO_new_mem_buf(kEcPrivate, -1));
    PkeyPtr k(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
    FUZZ_CHECK(k != nullptr);
    return k;
  }();
  std::string header = R"({"alg":"ES256")";
  if (!kid_json.empty()) header.append(R"(,"kid":)").append(kid_json);
  const std::string input = Base64Url(header + "}") + "." + Base64Url(R"({"exp":2000000000})");
  MdCtxPtr ctx(EVP_MD_CTX_new());
  std::size_t size = 0;
  const auto* data = reinterpret_cast<const unsigned char*>(input.data());
  FUZZ_CHECK(EVP_DigestSignInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key.get()) == 1);
  FUZZ_CHECK(EVP_DigestSign(ctx.get(), nullptr, &size, data, input.size()) == 1);
  std::string der(size, '\0');
  FUZZ_CHECK(EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(der.data()), &size, data,
                            input.size()) == 1);
  const auto* p = reinterpret_cast<const unsigned char*>(der.data());
  EcdsaSigPtr sig(d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(size)));
  FUZZ_CHECK(sig != nullptr);
  unsigned char raw[64];
  FUZZ_CHECK(BN_bn2binpad(ECDSA_SIG_get0_r(sig.get()), raw, 32) == 32);
  FUZZ_CHECK(BN_bn2binpad(ECDSA_SIG_get0_s(sig.get()), raw + 32, 32) == 32);
  return input + "." + Base64Url(std::string_view(reinterpret_cast<const char*>(raw), sizeof(raw)));
}

// The token above without a kid: signed once, as ECDSA signing draws randomness.
const std::string& PlainToken() {
  static const std::string token = Es256Token({});
  return token;
}

bool VerifiesTestToken(const std::vector<JwtKey>& keys, const std::string& token) {
  const JwtVerifier verifier(keys, {.algorithms = {JwtAlgorithm::kEs256, JwtAlgorithm::kRs256}});
  return verifier.Verify(token, kNow).ok();
}

// ---------------------------------------------------------------------------
// Documents as given

void CheckText(std::string_view text) {
  const auto keys = JwtVerifier::KeysFromJwks(text);
  if (!keys.ok()) {
    FUZZ_CHECK(!keys.status().message().empty());
    return;
  }
  FUZZ_CHECK(!keys->empty());
  for (const JwtKey& key : *keys) {
    FUZZ_CHECK(key.algorithm == JwtAlgorithm::kRs256 || key.algorithm == JwtAlgorithm::kEs256);
    FUZZ_CHECK(key.public_key != nullptr && key.secret.empty());
  }
  // Only the test key's own coordinates verify its signature (JSON may escape them: \u0041 is A).
  if (VerifiesTestToken(*keys, PlainToken())) {
    FUZZ_CHECK(text.find("\"EC\"") != std::string_view::npos ||
               text.find("\\u") != std::string_view::npos);
    FUZZ_CHECK(
        (text.find(kEcX) != std::string_view::npos && text.find(kEcY) != std::string_view::npos) ||
        text.find("\\u") != std::string_view::npos);
  }
}

// ---------------------------------------------------------------------------
// Documents written here

class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  std::uint8_t Byte() {
    if (data_.empty()) return 0;
    const auto b = static_cast<std::uint8_t>(data_.front());
    data_.remove_prefix(1);
    return b;
  }
  bool Empty() const { return data_.empty(); }

 private:
  std::string_view data_;
};

// A kid of up to 8 input bytes as a JSON string literal (every byte \u00XX-escaped below
// 0x20 and for '"' and '\', else itself for ASCII, and U+0080..U+00FF in UTF-8), and the
// string it decodes to.
std::string Kid(Reader& in, std::string* decoded) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  const std::size_t n = in.Byte() % 9;
  for (std::size_t i = 0; i < n; ++i) {
    const auto u = in.Byte();
    if (u >= 0x80) {
      const char utf8[2] = {static_cast<char>(0xc0 | (u >> 6)),
                            static_cast<char>(0x80 | (u & 0x3f))};
      out.append(utf8, 2);
      decoded->append(utf8, 2);
      continue;
    }
    if (u < 0x20 || u == '"' || u == '\\') {
      out.append("\\u00").push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 0xf]);
    } else {
      out.push_back(static_cast<char>(u));
    }
    decoded->push_back(static_cast<char>(u));
  }
  return out + "\"";
}

struct Expected {
  bool usable;
  JwtAlgorithm algorithm;
  std::string kid;
  bool test_ec_key;
};

void CheckWritten(std::string_view data) {
  Reader in(data);
  std::string text = R"({"keys":[)";
  std::vector<Expected> expected;
  std::string test_ec_kid_json;  // the kid of the first usable test EC key, as written
  for (int i = 0; i < 6 && !in.Empty(); ++i) {
    const std::uint8_t kind = in.Byte();
    const std::uint8_t extra = in.Byte();
    std::string kid;
    std::string kid_json;
    if (extra & 1) kid_json = Kid(in, &kid);
    std::string member = "{";
    const auto add = [&](std::string_view name, std::string_view value) {
      if (member.size() > 1) member += (extra & 2) ? " , " : ",";
      member.append("\"").append(name).append("\":").append(value);
    };
    if (!kid_json.empty()) add("kid", kid_json);
    Expected e{true, JwtAlgorithm::kEs256, kid, false};
    switch (kind % 12) {
      case 0:
      case 1:  // the test EC key, "use":"sig" or none, "alg":"ES256" or none
        add("kty", "\"EC\"");
        add("crv", "\"P-256\"");
        add("x", "\"" + std::string(kEcX) + "\"");
        add("y", "\"" + std::string(kEcY) + "\"");
        if (kind % 12 == 1) add("use", "\"sig\"");
        if (extra & 4) add("alg", "\"ES256\"");
        e.test_ec_key = true;
        break;
      case 2:  // the test RSA key
        add("kty", "\"RSA\"");
        add("n", "\"" + std::string(kRsaN) + "\"");
        add("e", "\"AQAB\"");
        if (extra & 4) add("alg", "\"RS256\"");
        e.algorithm = JwtAlgorithm::kRs256;
        break;
      case 3:  // for encryption
        add("kty", "\"EC\"");
        add("use", "\"enc\"");
        add("crv", "\"P-256\"");
        add("x", "\"" + std::string(kEcX) + "\"");
        add("y", "\"" + std::string(kEcY) + "\"");
        e.usable = false;
        break;
      case 4:  // an alg that does not fit the type
        add("kty", "\"RSA\"");
        add("alg", (extra & 4) ? "\"ES256\"" : "\"RS512\"");
        add("n", "\"" + std::string(kRsaN) + "\"");
        add("e", "\"AQAB\"");
        e.usable = false;
        break;
      case 5:  // off the curve
        add("kty", "\"EC\"");
        add("crv", "\"P-256\"");
        add("x", "\"" + std::string(kEcX) + "\"");
        add("y", "\"" + std::string(kEcYOff) + "\"");
        e.usable = false;
        break;
      case 6:  // too short
        add("kty", "\"RSA\"");
        add("n", "\"" + std::string(kRsaShortN) + "\"");
        add("e", "\"AQAB\"");
        e.usable = false;
        break;
      case 7:  // a symmetric key: never read from a JWKS
        add("kty", "\"oct\"");
        add("k", "\"c2VjcmV0\"");
        e.usable = false;
        break;
      case 8:  // another curve's name
        add("kty", "\"EC\"");
        add("crv", (extra & 4) ? "\"P-384\"" : "\"p-256\"");
        add("x", "\"" + std::string(kEcX) + "\"");
        add("y", "\"" + std::string(kEcY) + "\"");
        e.usable = false;
        break;
      case 9:  // padded base64
        add("kty", "\"EC\"");
        add("crv", "\"P-256\"");
        add("x", "\"" + std::string(kEcX) + "=\"");
        add("y", "\"" + std::string(kEcY) + "\"");
        e.usable = false;
        break;
      case 10:  // a kid or use that is not a string
        add("kty", "\"EC\"");
        add((extra & 4) && kid_json.empty() ? "kid" : "use", "7");
        add("crv", "\"P-256\"");
        add("x", "\"" + std::string(kEcX) + "\"");
        add("y", "\"" + std::string(kEcY) + "\"");
        e.usable = false;
        break;
      default:  // not an object
        member = (extra & 4) ? "[" : "\"key";
        member += (extra & 4) ? "]" : "\"";
        e.usable = false;
        break;
    }
    if (member.front() == '{') member += "}";
    // A duplicate "kid" member after the others would be another test; keep one.
    if (e.usable && e.test_ec_key && test_ec_kid_json.empty() && !kid_json.empty())
      test_ec_kid_json = kid_json;
    if (i > 0) text += ",";
    text += member;
    expected.push_back(e);
  }
  text += "]}";

  const auto keys = JwtVerifier::KeysFromJwks(text);
  std::vector<const Expected*> usable;
  for (const Expected& e : expected) {
    if (e.usable) usable.push_back(&e);
  }
  FUZZ_CHECK(keys.ok() == !usable.empty());
  if (!keys.ok()) return;
  FUZZ_CHECK(keys->size() == usable.size());
  bool any_test_ec_key = false;
  for (std::size_t i = 0; i < usable.size(); ++i) {
    FUZZ_CHECK((*keys)[i].algorithm == usable[i]->algorithm);
    FUZZ_CHECK((*keys)[i].kid == usable[i]->kid);
    any_test_ec_key = any_test_ec_key || usable[i]->test_ec_key;
  }
  FUZZ_CHECK(VerifiesTestToken(*keys, PlainToken()) == any_test_ec_key);
  if (!test_ec_kid_json.empty()) FUZZ_CHECK(VerifiesTestToken(*keys, Es256Token(test_ec_kid_json)));
}

}  // namespace

IDEMGATE_FUZZ_TARGET(jwks) {
  if (size == 0) return 0;
  const std::string_view rest = idemgate::fuzz::AsView(data + 1, size - 1);
  if (data[0] & 1) {
    CheckWritten(rest);
  } else {
    CheckText(rest);
  }
  return 0;
}
