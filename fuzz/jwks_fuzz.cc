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

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "../tests/fakes/test_keys.h"
#include "fuzz_input.h"
#include "fuzz_reference.h"
#include "fuzz_target.h"
#include "identity/jwt.h"

namespace {

namespace identity = idemgate::identity;
using idemgate::fuzz::Base64Url;
using idemgate::fuzz::Es256Sign;
using idemgate::fuzz::JsonString;
using idemgate::fuzz::PrivateKey;
using idemgate::fuzz::Reader;
using idemgate::testing::kEcX;
using idemgate::testing::kEcY;
using idemgate::testing::kRsaAN;
using idemgate::testing::PkeyPtr;
using identity::JwtAlgorithm;
using identity::JwtKey;
using identity::JwtVerifier;

constexpr std::int64_t kNow = 1700000000;

// The test keys are those of tests/identity/jwt_test.cc (tests/fakes/test_keys.h): the EC key's
// private half (kEcPrivate) signs; the JWK parameters of it (kEcX, kEcY) and of the RSA key
// (kRsaAN) are as the openssl command line printed them.

// The same x with its last coordinate changed: not on the curve.
constexpr std::string_view kEcYOff = "2gPJ-7Bv15WhqE1OQufh38vCYVZXV39QXkHs_31weiY";
// The first 1024 bits of kRsaAN, made odd: an RSA key too short for RS256.
constexpr std::string_view kRsaShortN =
    "skmY0XBZ11iq9bQg1VPf2YWDb0wHKS2bjM5cy8foHbaVt1XakTZnfqR9mPInk4_nAj-"
    "iZDnSb2HWFEDoUbfHBxe5vS8EXYxcoMTvrw7ifWjMq_0V"
    "ee36IzwI49yvLe6IE47IBb32wgDdoLq_KXRNZQaAFeJiskPomrTja2FIKsM";

// An ES256 token (JOSE r || s signature) of the test EC key, naming `kid` when not empty.
std::string Es256Token(std::string_view kid_json) {
  static const PkeyPtr key = PrivateKey(idemgate::testing::kEcPrivate);
  std::string header = R"({"alg":"ES256")";
  if (!kid_json.empty()) header.append(R"(,"kid":)").append(kid_json);
  const std::string input = Base64Url(header + "}") + "." + Base64Url(R"({"exp":2000000000})");
  return input + "." + Base64Url(Es256Sign(key.get(), input));
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

// A kid of up to 8 input bytes as a JSON string literal (every byte \u00XX-escaped below
// 0x20 and for '"' and '\', else itself for ASCII, and U+0080..U+00FF in UTF-8), and the
// string it decodes to.
std::string Kid(Reader& in, std::string* decoded) {
  std::string bytes;
  for (std::size_t n = in.Byte() % 9; n > 0; --n) bytes.push_back(static_cast<char>(in.Byte()));
  return JsonString(bytes, decoded, /*raw_del=*/true);
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
        add("n", "\"" + std::string(kRsaAN) + "\"");
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
        add("n", "\"" + std::string(kRsaAN) + "\"");
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

IDEMGATE_FUZZ_TARGET(jwks) { return idemgate::fuzz::ByLowBit(data, size, CheckWritten, CheckText); }
