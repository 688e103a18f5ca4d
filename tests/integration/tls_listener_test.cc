// idemgate with a top-level `tls` block: clients reach it over HTTPS. Keyed
// requests and replays, keep-alive, large bodies both ways, what the
// upstream is told (X-Forwarded-Proto: https), client certificates (also
// from a client_ca_file holding only an intermediate CA), the
// handshake deadline, certificates renewed by a reload, and start-up errors.
#include <gtest/gtest.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "http/chain_pki.h"
#include "integration/harness.h"

namespace idemgate::testing {
namespace {

using namespace std::chrono_literals;

std::vector<HeaderField> KeyHeaders(const std::string& key) {
  return {{"Idempotency-Key", "\"" + key + "\""}, {"Content-Type", "application/json"}};
}

class TlsListenerTest : public GatewaySuite {
 protected:
  void SetUp() override {
    GatewaySuite::SetUp();
    auto pki = MakeTestPki(dir_.Join("pki"));
    ASSERT_TRUE(pki.ok()) << pki.status().ToString();
    pki_ = *pki;
    // The listener's files, which a test may replace before a reload.
    cert_ = dir_.Join("listener.pem");
    key_ = dir_.Join("listener.key");
    std::filesystem::copy_file(pki_.server_cert, cert_);
    std::filesystem::copy_file(pki_.server_key, key_);
  }

  std::string Yaml(const std::string& tls_extra = "", const std::string& limits = "",
                   const ConfigHead& head = {}) const {
    std::string yaml = "tls: { cert_file: \"" + cert_ + "\", key_file: \"" + key_ + "\"" + tls_extra + " }\n";
    if (!limits.empty()) yaml += "limits: " + limits + "\n";
    yaml += GatewayConfigHead(fake_endpoint_, head);
    yaml += "  - id: pay\n    match: { path_prefix: / }\n    upstream: fake\n";
    return yaml;
  }

  TlsClientOptions Trusting() const { return TlsClientOptions{.ca_file = pki_.ca_file}; }

  TestPki pki_;
  std::string cert_;
  std::string key_;
};

TEST_F(TlsListenerTest, KeyedRequestsRunOnceAndReplayOverHttps) {
  StartGateway(Yaml());
  TlsClient client(gateway_->endpoint(), Trusting());
  auto first = client.Send("POST", "/echo/pay", R"({"amount":1000})", KeyHeaders("https-1"));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->status, 200) << first->body;
  auto echo = ParseObject(first->body);
  EXPECT_EQ(echo["body"].as_string(), R"({"amount":1000})");
  // The upstream learns that the client came over TLS.
  EXPECT_EQ(Values(EchoedHeaders(echo), "X-Forwarded-Proto"), (std::vector<std::string>{"https"}));

  auto again = client.Send("POST", "/echo/pay", R"({"amount":1000})", KeyHeaders("https-1"));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_EQ(again->status, 200) << again->body;
  EXPECT_EQ(Values(again->headers, "Idempotent-Replayed"), (std::vector<std::string>{"true"}));
  EXPECT_EQ(again->body, first->body);

  auto other = client.Send("POST", "/echo/pay", R"({"amount":9999})", KeyHeaders("https-1"));
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_EQ(other->status, 422);

  EXPECT_EQ(Executions(), 1u);
  // All of it on one TLS connection.
  EXPECT_EQ(client.connections(), 1);
}

TEST_F(TlsListenerTest, LargeBodiesCrossTheTlsListenerBothWays) {
  StartGateway(Yaml());
  TlsClient client(gateway_->endpoint(), Trusting(), 30s);
  std::string upload(3 * 1024 * 1024 + 17, '\0');
  for (std::size_t i = 0; i < upload.size(); ++i) upload[i] = static_cast<char>('a' + i * 7 % 26);
  auto sum = client.Send("POST", "/upload-sha256", upload, {{"Content-Type", "application/octet-stream"}});
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  ASSERT_EQ(sum->status, 200) << sum->body;
  auto json = ParseObject(sum->body);
  EXPECT_EQ(json["bytes"].as_int64(), static_cast<std::int64_t>(upload.size()));
  EXPECT_EQ(json["sha256"].as_string(), Sha256Hex(upload));

  for (const char* chunked : {"0", "1"}) {
    auto large = client.Send("GET", std::string("/large?bytes=2500000&chunked=") + chunked);
    ASSERT_TRUE(large.ok()) << large.status().ToString();
    ASSERT_EQ(large->status, 200);
    ASSERT_EQ(large->body.size(), 2500000u);
    EXPECT_EQ(large->body.substr(0, 26), "abcdefghijklmnopqrstuvwxyz");
  }
}

TEST_F(TlsListenerTest, AlpnSettlesOnHttp11) {
  StartGateway(Yaml());
  // curl and browsers offer h2 first; the listener answers http/1.1.
  TlsClientOptions offering = Trusting();
  offering.alpn = {"h2", "http/1.1"};
  TlsClient client(gateway_->endpoint(), offering);
  auto res = client.Send("GET", "/echo/alpn");
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(client.alpn(), "http/1.1");
  // A client offering only protocols it cannot have gets no ALPN answer,
  // not a failed handshake.
  TlsClientOptions h2_only = Trusting();
  h2_only.alpn = {"h2"};
  TlsClient other(gateway_->endpoint(), h2_only);
  ASSERT_TRUE(other.Connect().ok());
  EXPECT_EQ(other.alpn(), "");
}

TEST_F(TlsListenerTest, TheAdminListenerServesHttpsWithItsOwnTlsBlock) {
  const std::string admin = "{ listen: 127.0.0.1:0, tls: { cert_file: \"" + pki_.other_cert + "\", key_file: \"" +
                            pki_.other_key + "\" } }";
  StartGateway(Yaml("", "", ConfigHead{.admin = admin}));
  // Its own certificate (for other.test), not the main listener's.
  TlsClientOptions as_other = Trusting();
  as_other.verify_name = "other.test";
  auto health = TlsClient(gateway_->admin(), as_other).Send("GET", "/healthz");
  ASSERT_TRUE(health.ok()) << health.status().ToString();
  EXPECT_EQ(health->status, 200);
  auto metrics = TlsClient(gateway_->admin(), as_other).Send("GET", "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status().ToString();
  EXPECT_EQ(metrics->status, 200);
  EXPECT_NE(metrics->body.find("idemgate_request_duration_seconds"), std::string::npos);
  EXPECT_FALSE(TlsClient(gateway_->admin(), Trusting()).Connect().ok());  // not localhost's certificate
  auto plain = SendRequest(gateway_->admin(), HttpRequest{.target = "/healthz"}, 3s);
  EXPECT_FALSE(plain.ok() && plain->status == 200);
  // Both refused handshakes (a certificate the client does not trust, plain
  // HTTP) are counted under the admin listener, none under the data listener.
  std::string page;
  EXPECT_TRUE(PollUntil(
      [&] {
        auto m = TlsClient(gateway_->admin(), as_other).Send("GET", "/metrics");
        if (!m.ok()) return false;
        page = m->body;
        return MetricValue(page, "idemgate_tls_handshake_failures_total{listener=\"admin\"}") ==
               std::optional<double>(2.0);
      },
      10s, 20ms))
      << page;
  EXPECT_EQ(MetricValue(page, "idemgate_tls_handshake_failures_total{listener=\"data\"}"), std::optional<double>(0.0));
}

TEST_F(TlsListenerTest, PlainHttpGetsNoAnswerOnTheTlsPort) {
  StartGateway(Yaml());
  auto plain = SendRequest(gateway_->endpoint(), KeyedPost("/echo/pay", "plain-1"), 3s);
  EXPECT_FALSE(plain.ok() && plain->status == 200);
  // The listener still serves TLS clients, and the plain request ran nothing.
  auto res = TlsClient(gateway_->endpoint(), Trusting()).Send("GET", "/echo/after");
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(Executions(), 1u);
  // The failed handshake is counted.
  EXPECT_TRUE(PollUntil(
      [&] {
        return MetricValue(Metrics(), "idemgate_tls_handshake_failures_total{listener=\"data\"}") ==
               std::optional<double>(1.0);
      },
      10s, 20ms))
      << Metrics();
}

TEST_F(TlsListenerTest, ClientCertificatesAreRequiredWithClientCaFile) {
  StartGateway(Yaml(", client_ca_file: \"" + pki_.ca_file + "\""));
  // TLS 1.3 may finish the client's side of the handshake before the server
  // refuses it, so the refusal can show on the first read instead.
  auto anonymous = TlsClient(gateway_->endpoint(), Trusting()).Send("GET", "/echo/anon");
  EXPECT_FALSE(anonymous.ok() && anonymous->status == 200);
  TlsClientOptions with_cert = Trusting();
  with_cert.cert_file = pki_.client_cert;
  with_cert.key_file = pki_.client_key;
  auto res = TlsClient(gateway_->endpoint(), with_cert).Send("GET", "/echo/mtls");
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(Executions(), 1u);
}

// A client_ca_file holding only an intermediate CA (not its root) accepts
// the client certificates it signed, on the listener and the admin listener.
TEST_F(TlsListenerTest, AClientCaFileMayHoldOnlyAnIntermediateCa) {
  auto chain = MakeChainPki(dir_.Join("chain"));
  ASSERT_TRUE(chain.ok()) << chain.status().ToString();
  const std::string client_ca = ", client_ca_file: \"" + chain->intermediate + "\"";
  const std::string admin = "{ listen: 127.0.0.1:0, tls: { cert_file: \"" + cert_ + "\", key_file: \"" + key_ + "\"" +
                            client_ca + " } }";
  StartGateway(Yaml(client_ca, "", ConfigHead{.admin = admin}));
  TlsClientOptions with_cert = Trusting();
  with_cert.cert_file = chain->client_cert;
  with_cert.key_file = chain->client_key;
  auto res = TlsClient(gateway_->endpoint(), with_cert).Send("GET", "/echo/intermediate");
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200);
  auto health = TlsClient(gateway_->admin(), with_cert).Send("GET", "/healthz");
  ASSERT_TRUE(health.ok()) << health.status().ToString();
  EXPECT_EQ(health->status, 200);
  // A certificate from another CA is still refused.
  TlsClientOptions stranger = Trusting();
  stranger.cert_file = pki_.client_cert;
  stranger.key_file = pki_.client_key;
  auto refused = TlsClient(gateway_->endpoint(), stranger).Send("GET", "/echo/stranger");
  EXPECT_FALSE(refused.ok() && refused->status == 200);
  EXPECT_EQ(Executions(), 1u);
}

// Clients that cache sessions (libcurl, Java, nginx upstreams) offer the
// last one on their next connection: with client certificates required,
// the listener resumes it (or falls back to a full handshake), never
// aborting the handshake.
TEST_F(TlsListenerTest, ClientCertificateSessionsResume) {
  StartGateway(Yaml(", client_ca_file: \"" + pki_.ca_file + "\""));
  for (const int version : {TLS1_2_VERSION, 0}) {
    TlsClientOptions options = Trusting();
    options.cert_file = pki_.client_cert;
    options.key_file = pki_.client_key;
    options.resume_sessions = true;
    options.max_version = version;
    TlsClient client(gateway_->endpoint(), options);
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(client.Connect().ok()) << "TLS max " << version << ", connection " << i;
      auto res = client.Send("GET", "/echo/again");
      ASSERT_TRUE(res.ok()) << "TLS max " << version << ", connection " << i << ": " << res.status().ToString();
      EXPECT_EQ(res->status, 200);
      if (i > 0) {
        EXPECT_TRUE(client.resumed()) << "TLS max " << version << ", connection " << i;
      }
    }
  }
}

TEST_F(TlsListenerTest, AHandshakeMustFinishWithinHeaderTimeout) {
  StartGateway(Yaml("", "{ header_timeout: 500ms }"));
  auto raw = RawConnection::Connect(gateway_->endpoint());
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  const auto started = std::chrono::steady_clock::now();
  const std::string got = raw->ReadUntilClosed(5s);
  EXPECT_TRUE(raw->closed());
  EXPECT_TRUE(got.empty());
  EXPECT_LT(std::chrono::steady_clock::now() - started, 4s);
}

TEST_F(TlsListenerTest, ARenewedCertificateIsServedAfterAReload) {
  // First the certificate for other.test: a client expecting localhost
  // refuses it.
  std::filesystem::copy_file(pki_.other_cert, cert_, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(pki_.other_key, key_, std::filesystem::copy_options::overwrite_existing);
  StartGateway(Yaml());
  EXPECT_FALSE(TlsClient(gateway_->endpoint(), Trusting()).Connect().ok());
  TlsClientOptions as_other = Trusting();
  as_other.verify_name = "other.test";
  EXPECT_TRUE(TlsClient(gateway_->endpoint(), as_other).Connect().ok());

  std::filesystem::copy_file(pki_.server_cert, cert_, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(pki_.server_key, key_, std::filesystem::copy_options::overwrite_existing);
  ASSERT_TRUE(gateway_->process().Signal(SIGHUP).ok());
  bool renewed = false;
  for (int i = 0; i < 100 && !renewed; ++i) {
    renewed = TlsClient(gateway_->endpoint(), Trusting()).Connect().ok();
    if (!renewed) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(renewed);

  // A reload whose key cannot be read keeps serving the running certificate.
  std::filesystem::remove(key_);
  ASSERT_TRUE(gateway_->process().Signal(SIGHUP).ok());
  std::this_thread::sleep_for(300ms);
  auto res = TlsClient(gateway_->endpoint(), Trusting()).Send("GET", "/echo/still");
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(gateway_->Stdout().find("listener.key"), std::string::npos);
}

TEST_F(TlsListenerTest, AnUnreadableCertificateStopsTheStart) {
  std::filesystem::remove(cert_);
  auto g = GatewayProcess::Start(dir_, Yaml());
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("tls: TLS: cannot read listener certificate"), std::string::npos)
      << g.status().message();

  std::filesystem::copy_file(pki_.client_cert, cert_);  // not the key's certificate
  auto mismatched = GatewayProcess::Start(dir_, Yaml());
  ASSERT_FALSE(mismatched.ok());
  EXPECT_NE(mismatched.status().message().find("does not match"), std::string::npos)
      << mismatched.status().message();
}

// An expired certificate is served (the start does not fail on it), but
// the gateway says so: every client that verifies it will refuse.
TEST_F(TlsListenerTest, AnExpiredCertificateIsServedWithAWarning) {
  std::filesystem::copy_file(pki_.expired_cert, cert_, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(pki_.expired_key, key_, std::filesystem::copy_options::overwrite_existing);
  StartGateway(Yaml());
  EXPECT_FALSE(TlsClient(gateway_->endpoint(), Trusting()).Connect().ok());
  EXPECT_NE(gateway_->Stdout().find("the listener certificate has expired"), std::string::npos)
      << gateway_->Stdout();
}

// A passphrase-protected key is refused with a message that says so, and
// never with a passphrase prompt (which would block a start from a terminal).
TEST_F(TlsListenerTest, AnEncryptedKeyIsRefusedWithoutAPrompt) {
  {
    FILE* in = std::fopen(pki_.server_key.c_str(), "r");
    ASSERT_NE(in, nullptr);
    EVP_PKEY* key = PEM_read_PrivateKey(in, nullptr, nullptr, nullptr);
    std::fclose(in);
    ASSERT_NE(key, nullptr);
    FILE* out = std::fopen(key_.c_str(), "w");
    ASSERT_NE(out, nullptr);
    static char kPass[] = "secret";
    ASSERT_EQ(PEM_write_PKCS8PrivateKey(out, key, EVP_aes_128_cbc(), kPass, 6, nullptr, nullptr), 1);
    std::fclose(out);
    EVP_PKEY_free(key);
  }
  auto g = GatewayProcess::Start(dir_, Yaml());
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("is encrypted"), std::string::npos) << g.status().message();
  EXPECT_EQ(g.status().message().find("pass phrase"), std::string::npos) << g.status().message();

  // check-config reads the TLS files too, and says the same.
  const std::string file = dir_.Join("encrypted.yaml");
  ASSERT_TRUE(WriteFile(file, Yaml()).ok());
  ProcessOptions options;
  options.stdout_path = dir_.Join("check.out");
  options.stderr_path = dir_.Join("check.err");
  auto checker = Process::Start(IDEMGATE_BIN, {"check-config", file}, options);
  ASSERT_TRUE(checker.ok()) << checker.status().ToString();
  auto status = checker->WaitExit(30s);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->exited && status->code == 1) << status->ToString();
  const std::string output = ReadFileOrEmpty(dir_.Join("check.out")) + ReadFileOrEmpty(dir_.Join("check.err"));
  EXPECT_NE(output.find("tls: TLS: listener key"), std::string::npos) << output;
  EXPECT_NE(output.find("is encrypted"), std::string::npos) << output;
}

}  // namespace
}  // namespace idemgate::testing
