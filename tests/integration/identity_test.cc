// Integration tests of identity.mode jwt and api_key (SPEC §6): the real
// idemgate binary in front of fake_upstream. Tokens are signed here with
// OpenSSL directly (an RSA key made for the test, an HS256 secret);
// tests/identity checks the verifier's rules one by one.
#include <gtest/gtest.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "integration/harness.h"

namespace idemgate::testing {
namespace {

std::string Sha256Hex(std::string_view data) {
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), d, &n, EVP_sha256(), nullptr);
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) {
    out.push_back(kDigits[d[i] >> 4]);
    out.push_back(kDigits[d[i] & 15]);
  }
  return out;
}

std::int64_t Now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// claims: the payload's members, as JSON text without braces.
std::string Hs256Token(const std::string& secret, const std::string& claims, const std::string& alg = "HS256") {
  const std::string signing_input =
      Base64UrlEncode(R"({"alg":")" + alg + R"(","typ":"JWT"})") + "." + Base64UrlEncode("{" + claims + "}");
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(signing_input.data()), signing_input.size(), mac, &n);
  return signing_input + "." + Base64UrlEncode(std::string(reinterpret_cast<const char*>(mac), n));
}

using PkeyPtr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;

std::string Rs256Token(EVP_PKEY* key, const std::string& kid, const std::string& claims) {
  const std::string signing_input =
      Base64UrlEncode(R"({"alg":"RS256","kid":")" + kid + R"("})") + "." + Base64UrlEncode("{" + claims + "}");
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestSignInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key);
  std::size_t len = 0;
  EVP_DigestSign(ctx.get(), nullptr, &len, reinterpret_cast<const unsigned char*>(signing_input.data()),
                 signing_input.size());
  std::string sig(len, '\0');
  EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(sig.data()), &len,
                 reinterpret_cast<const unsigned char*>(signing_input.data()), signing_input.size());
  sig.resize(len);
  return signing_input + "." + Base64UrlEncode(sig);
}

std::string PublicPem(EVP_PKEY* key) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  PEM_write_bio_PUBKEY(bio.get(), key);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(n));
}

// A JWKS with the RSA public key of `key` under `kid`.
std::string RsaJwks(EVP_PKEY* key, const std::string& kid) {
  const auto param = [key](const char* name) {
    BIGNUM* raw = nullptr;
    EXPECT_EQ(EVP_PKEY_get_bn_param(key, name, &raw), 1) << name;
    std::unique_ptr<BIGNUM, decltype(&BN_free)> bn(raw, BN_free);
    std::string bytes(static_cast<std::size_t>(BN_num_bytes(bn.get())), '\0');
    BN_bn2bin(bn.get(), reinterpret_cast<unsigned char*>(bytes.data()));
    return Base64UrlEncode(bytes);
  };
  return R"({"keys":[{"kty":"RSA","use":"sig","kid":")" + kid + R"(","n":")" + param(OSSL_PKEY_PARAM_RSA_N) +
         R"(","e":")" + param(OSSL_PKEY_PARAM_RSA_E) + R"("}]})";
}

// Replaces `path` with `contents` in one rename, so a reader sees the old or the new text.
void WriteAtomically(const std::string& path, const std::string& contents) {
  ASSERT_TRUE(WriteFile(path + ".tmp", contents).ok());
  ASSERT_EQ(std::rename((path + ".tmp").c_str(), path.c_str()), 0);
}

constexpr char kSecret[] = "jwt-shared-secret-for-the-integration-tests";

std::string Claims(const std::string& tenant, const std::string& sub, std::int64_t exp = Now() + 300) {
  return R"("tenant":")" + tenant + R"(","project":"shop","sub":")" + sub + R"(","exp":)" + std::to_string(exp) +
         R"(,"iss":"https://auth.test","aud":["idemgate","other"])";
}

class IdentityTest : public GatewaySuite {
 protected:
  // `identity`: the identity block's lines (2-space indent).
  std::string Yaml(const std::string& identity) {
    return GatewayConfigHead(fake_endpoint_, {.identity = "\n" + identity}) +
           "  - id: api\n    match: { path_prefix: / }\n    upstream: fake\n    idempotency: { policy: required }\n";
  }

  void StartJwt() {
    rsa_.reset(EVP_RSA_gen(2048));
    ASSERT_NE(rsa_, nullptr);
    {
      std::ofstream f(dir_.Join("rsa.pem"));
      f << PublicPem(rsa_.get());
    }
    StartGateway(Yaml("  mode: jwt\n"
                      "  jwt:\n"
                      "    algorithms: [RS256, HS256]\n"
                      "    public_keys: [ { file: " +
                      dir_.Join("rsa.pem") +
                      ", kid: rsa-1, alg: RS256 } ]\n"
                      "    secret_env: JWT_SECRET\n"
                      "    issuer: https://auth.test\n"
                      "    audience: idemgate\n"
                      "    leeway: 5s\n"),
                 {{"JWT_SECRET", kSecret}});
  }

  HttpRequest Authorized(const std::string& token, const std::string& key) {
    HttpRequest req = KeyedPost("/echo/pay", key, R"({"amount":1})");
    req.headers.push_back({"Authorization", "Bearer " + token});
    return req;
  }

  PkeyPtr rsa_{nullptr, EVP_PKEY_free};
};

TEST_F(IdentityTest, JwtCallersAreScopedApartAndTheirIdentityIsSetUpstream) {
  StartJwt();
  HttpRequest alice = Authorized(Hs256Token(kSecret, Claims("acme", "alice")), "k1");
  alice.headers.push_back({"X-Tenant-Id", "globex"});  // a client cannot name its own tenant
  // Nor in a spelling that CGI-style upstreams read as the same variable.
  alice.headers.push_back({"X_Tenant_Id", "globex"});
  alice.headers.push_back({"x_subject", "user:root"});
  const HttpResponse first = Send(alice);
  ASSERT_EQ(first.status, 200) << first.body;
  ExpectUpstreamIdentity(first, "acme", "shop", "user:alice");
  auto echo = ParseObject(first.body);
  EXPECT_TRUE(Values(EchoedHeaders(echo), "X_Tenant_Id").empty());
  EXPECT_TRUE(Values(EchoedHeaders(echo), "x_subject").empty());
  EXPECT_EQ(Values(EchoedHeaders(echo), "Idempotency-Key"),
            (std::vector<std::string>{"\"t-acme:shop:user:alice:api:k1\""}));

  // Alice's retry is replayed; Bob's request under the same key is his own.
  EXPECT_EQ(Send(alice).Header("Idempotent-Replayed"), "true");
  const HttpResponse bob = Send(Authorized(Hs256Token(kSecret, Claims("acme", "bob")), "k1"));
  EXPECT_EQ(bob.status, 200);
  EXPECT_FALSE(bob.HasHeader("Idempotent-Replayed"));
  EXPECT_EQ(Executions(), 2u);

  // RS256 with the PEM key, and a subject that is already typed.
  const HttpResponse service =
      Send(Authorized(Rs256Token(rsa_.get(), "rsa-1", Claims("acme", "service:billing")), "k1"));
  ASSERT_EQ(service.status, 200) << service.body;
  ExpectUpstreamIdentity(service, "acme", "shop", "service:billing");
  EXPECT_EQ(Executions(), 3u);
}

TEST_F(IdentityTest, JwtRefusals) {
  StartJwt();
  const HttpResponse anonymous = Send(KeyedPost("/echo/pay", "k2"));
  ExpectProblem(anonymous, 401, "unauthenticated");
  // RFC 9110 §11.6.1: a 401 carries a challenge.
  EXPECT_EQ(anonymous.Header("WWW-Authenticate"), "Bearer realm=\"idemgate\"");
  // A token that does not verify: RFC 6750 §3's invalid_token.
  const HttpResponse forged = Send(Authorized(Hs256Token("wrong-secret", Claims("acme", "alice")), "k2"));
  ExpectProblem(forged, 401, "unauthenticated");
  EXPECT_EQ(forged.Header("WWW-Authenticate"), "Bearer realm=\"idemgate\", error=\"invalid_token\"");
  ExpectProblem(Send(Authorized(Hs256Token(kSecret, Claims("acme", "alice", Now() - 60)), "k2")), 401,
                "unauthenticated");
  // Another issuer or audience.
  std::string claims = Claims("acme", "alice");
  ExpectProblem(Send(Authorized(Hs256Token(kSecret, claims.substr(0, claims.find(",\"iss\"")) + R"(,"iss":"x","aud":"idemgate")"), "k2")),
                401, "unauthenticated");
  ExpectProblem(Send(Authorized(Hs256Token(kSecret, claims.substr(0, claims.find(",\"aud\"")) + R"(,"aud":"else")"), "k2")),
                401, "unauthenticated");
  // No tenant claim.
  ExpectProblem(Send(Authorized(Hs256Token(kSecret, R"("project":"shop","sub":"alice","exp":)" +
                                                        std::to_string(Now() + 60) +
                                                        R"(,"iss":"https://auth.test","aud":"idemgate")"),
                                "k2")),
                401, "unauthenticated");
  // alg none, and an RS256 token whose kid names no key.
  const std::string unsigned_token = Base64UrlEncode(R"({"alg":"none"})") + "." + Base64UrlEncode("{" + claims + "}") + ".";
  ExpectProblem(Send(Authorized(unsigned_token, "k2")), 401, "unauthenticated");
  ExpectProblem(Send(Authorized(Rs256Token(rsa_.get(), "rsa-2", claims), "k2")), 401, "unauthenticated");
  // Not a Bearer token.
  HttpRequest basic = KeyedPost("/echo/pay", "k2");
  basic.headers.push_back({"Authorization", "Basic YWxpY2U6cHc="});
  ExpectProblem(Send(basic), 401, "unauthenticated");
  EXPECT_EQ(Executions(), 0u);
}

TEST_F(IdentityTest, ApiKeysIdentifyTheCallerAndStayAwayFromTheUpstream) {
  {
    std::ofstream f(dir_.Join("keys.yaml"));
    f << "keys:\n"
      << "  - { sha256: " << Sha256Hex("k_live_acme") << ", tenant: acme, project: shop, subject: \"service:billing\" }\n"
      << "  - { sha256: " << Sha256Hex("k_live_globex") << ", tenant: globex, project: web, subject: \"service:web\" }\n";
  }
  StartGateway(Yaml("  mode: api_key\n  api_key: { keys_file: " + dir_.Join("keys.yaml") + " }\n"));

  HttpRequest acme = KeyedPost("/echo/pay", "k3");
  acme.headers.push_back({"X-API-Key", "k_live_acme"});
  // Nor in a spelling that CGI-style upstreams read as the same variable.
  acme.headers.push_back({"X_API_Key", "k_live_acme"});
  acme.headers.push_back({"x-api_KEY", "k_live_acme"});
  const HttpResponse first = Send(acme);
  ASSERT_EQ(first.status, 200) << first.body;
  auto echo = ParseObject(first.body);
  const std::vector<HeaderField> seen = EchoedHeaders(echo);
  EXPECT_TRUE(Values(seen, "X-API-Key").empty());
  EXPECT_TRUE(Values(seen, "X_API_Key").empty());
  EXPECT_TRUE(Values(seen, "x-api_KEY").empty());
  EXPECT_EQ(Values(seen, "X-Tenant-Id"), (std::vector<std::string>{"acme"}));
  EXPECT_EQ(Values(seen, "Idempotency-Key"), (std::vector<std::string>{"\"t-acme:shop:service:billing:api:k3\""}));

  // The same key as a Bearer credential is the same caller: a replay.
  HttpRequest bearer = KeyedPost("/echo/pay", "k3");
  bearer.headers.push_back({"Authorization", "Bearer k_live_acme"});
  const HttpResponse again = Send(bearer);
  EXPECT_EQ(again.Header("Idempotent-Replayed"), "true");
  // Another tenant's key under the same Idempotency-Key runs on its own.
  HttpRequest globex = KeyedPost("/echo/pay", "k3");
  globex.headers.push_back({"X-API-Key", "k_live_globex"});
  EXPECT_FALSE(Send(globex).HasHeader("Idempotent-Replayed"));
  EXPECT_EQ(Executions(), 2u);

  HttpRequest unknown = KeyedPost("/echo/pay", "k3");
  unknown.headers.push_back({"X-API-Key", "k_live_nobody"});
  const HttpResponse refused = Send(unknown);
  ExpectProblem(refused, 401, "unauthenticated");
  EXPECT_EQ(refused.Header("WWW-Authenticate"), "Bearer realm=\"idemgate\", error=\"invalid_token\"");
  HttpRequest two = acme;
  two.headers.push_back({"Authorization", "Bearer k_live_globex"});
  ExpectProblem(Send(two), 401, "unauthenticated");
  const HttpResponse keyless = Send(KeyedPost("/echo/pay", "k3"));
  ExpectProblem(keyless, 401, "unauthenticated");
  EXPECT_EQ(keyless.Header("WWW-Authenticate"), "Bearer realm=\"idemgate\"");
  EXPECT_EQ(Executions(), 2u);

  // An empty key header holds no key: a Bearer key beside it is the caller,
  // and the empty line is not forwarded.
  HttpRequest empty_header = KeyedPost("/echo/pay", "k4");
  empty_header.headers.push_back({"X-API-Key", ""});
  empty_header.headers.push_back({"Authorization", "Bearer k_live_acme"});
  const HttpResponse bearer_only = Send(empty_header);
  ASSERT_EQ(bearer_only.status, 200) << bearer_only.body;
  auto echoed = ParseObject(bearer_only.body);
  EXPECT_TRUE(Values(EchoedHeaders(echoed), "X-API-Key").empty());
  HttpRequest empty_alone = KeyedPost("/echo/pay", "k5");
  empty_alone.headers.push_back({"X-API-Key", ""});
  ExpectProblem(Send(empty_alone), 401, "unauthenticated");
  EXPECT_EQ(Executions(), 3u);
}

TEST_F(IdentityTest, UnreadableKeysStopTheStart) {
  auto g = GatewayProcess::Start(dir_, Yaml("  mode: api_key\n  api_key: { keys_file: " + dir_.Join("none.yaml") + " }\n"));
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().ToString().find("identity.api_key.keys_file"), std::string::npos) << g.status().ToString();
  auto j = GatewayProcess::Start(dir_, Yaml("  mode: jwt\n  jwt: { algorithms: [HS256], secret_env: UNSET_SECRET }\n"),
                                 {}, "second");
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().ToString().find("UNSET_SECRET"), std::string::npos) << j.status().ToString();
  auto s = GatewayProcess::Start(dir_, Yaml("  mode: jwt\n  jwt: { algorithms: [HS256], secret_env: SHORT }\n"),
                                 {{"SHORT", "only-20-bytes-long.."}}, "third");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().ToString().find("shorter than 32 bytes"), std::string::npos) << s.status().ToString();
  // A public key as the HMAC secret would let anyone sign HS256 tokens.
  rsa_.reset(EVP_RSA_gen(2048));
  ASSERT_NE(rsa_, nullptr);
  auto p = GatewayProcess::Start(dir_, Yaml("  mode: jwt\n  jwt: { algorithms: [HS256, RS256], secret_env: PEM }\n"),
                                 {{"PEM", PublicPem(rsa_.get())}}, "fourth");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().ToString().find("the HS256 secret is a PEM or JWK key"), std::string::npos)
      << p.status().ToString();
  auto k = GatewayProcess::Start(
      dir_, Yaml("  mode: jwt\n  jwt: { algorithms: [HS256], secret_env: JWK }\n"),
      {{"JWK", R"({"kty":"RSA","n":"sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1Wl","e":"AQAB"})"}}, "fifth");
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().ToString().find("PEM or JWK"), std::string::npos) << k.status().ToString();
}

// identity.jwt.jwks_url (an extension of SPEC §6): the JWKS is fetched from the identity provider
// (a second fake_upstream serving a file) at start and again as soon as a token names a kid it
// does not hold.
TEST_F(IdentityTest, JwtKeysComeFromAJwksUrlAndFollowAKeyRotation) {
  PkeyPtr a(EVP_RSA_gen(2048), EVP_PKEY_free);
  PkeyPtr b(EVP_RSA_gen(2048), EVP_PKEY_free);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::string jwks = dir_.Join("jwks.json");
  WriteAtomically(jwks, RsaJwks(a.get(), "a"));
  auto idp = StartServer(IDEMGATE_FAKE_UPSTREAM_PATH,
                         {"--port", "0", "--serve-file", "/.well-known/jwks.json=" + jwks}, dir_.Join("idp.ready"));
  ASSERT_TRUE(idp.ok()) << idp.status().ToString();
  const std::string url = "http://" + idp->Endpoint().value().ToString() + "/.well-known/jwks.json";
  const auto yaml = [this](const std::string& jwks_url) {
    return Yaml("  mode: jwt\n"
                "  jwt:\n"
                "    algorithms: [RS256]\n"
                "    jwks_url: \"" + jwks_url + "\"\n"
                "    jwks_timeout: 2s\n"
                "    issuer: https://auth.test\n"
                "    audience: idemgate\n");
  };
  StartGateway(yaml(url));

  const HttpResponse first = Send(Authorized(Rs256Token(a.get(), "a", Claims("acme", "alice")), "j1"));
  ASSERT_EQ(first.status, 200) << first.body;
  ExpectUpstreamIdentity(first, "acme", "shop", "user:alice");

  // The provider rotates to key B. The first token signed with it may be refused (it makes the
  // gateway fetch the JWKS again at once); within moments, tokens with kid "b" are accepted.
  WriteAtomically(jwks, RsaJwks(b.get(), "b"));
  const std::string by_b = Rs256Token(b.get(), "b", Claims("acme", "bob"));
  int last_status = 0;
  const bool accepted = PollUntil(
      [&] {
        const HttpResponse res = Send(Authorized(by_b, "j2"));
        last_status = res.status;
        return res.status == 200;
      },
      2s, 50ms);
  ASSERT_TRUE(accepted) << "last status " << last_status;
  // Key A went with the rotation.
  ExpectProblem(Send(Authorized(Rs256Token(a.get(), "a", Claims("acme", "alice")), "j3")), 401, "unauthenticated");
  EXPECT_EQ(Executions(), 2u);

  // A reload to a jwks_url that cannot be fetched keeps the running config and its keys.
  RefusingPort refusing;
  ASSERT_TRUE(WriteConfig(dir_, yaml("http://127.0.0.1:" + std::to_string(refusing.port()) + "/jwks.json")).ok());
  ASSERT_TRUE(gateway_->process().Signal(SIGHUP).ok());
  EXPECT_TRUE(PollUntil(
      [&] {
        const std::string out = gateway_->Stdout();
        return out.find("config reload failed") != std::string::npos &&
               out.find("identity.jwt.jwks_url") != std::string::npos;
      },
      10s));
  const HttpResponse still = Send(Authorized(by_b, "j4"));
  EXPECT_EQ(still.status, 200) << still.body;
}

TEST_F(IdentityTest, AJwksUrlThatCannotBeFetchedStopsTheStart) {
  const auto yaml = [this](const std::string& jwks_url) {
    return Yaml("  mode: jwt\n  jwt: { jwks_url: \"" + jwks_url + "\", jwks_timeout: 2s }\n");
  };
  RefusingPort refusing;
  const std::string refused_url = "http://127.0.0.1:" + std::to_string(refusing.port()) + "/jwks.json";
  auto g = GatewayProcess::Start(dir_, yaml(refused_url));
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().ToString().find("idemgate: identity.jwt.jwks_url: " + refused_url + ": "), std::string::npos)
      << g.status().ToString();
  // An answer other than 200, and a 200 that is no JWKS.
  const std::string not_found = "http://" + fake_endpoint_.ToString() + "/status/404";
  auto h = GatewayProcess::Start(dir_, yaml(not_found), {}, "second");
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().ToString().find("identity.jwt.jwks_url: " + not_found + ": the server answered 404"),
            std::string::npos)
      << h.status().ToString();
  auto e = GatewayProcess::Start(dir_, yaml("http://" + fake_endpoint_.ToString() + "/echo"), {}, "third");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().ToString().find("JWKS has no keys array"), std::string::npos) << e.status().ToString();
}

}  // namespace
}  // namespace idemgate::testing
