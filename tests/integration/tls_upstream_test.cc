// idemgate in front of an https upstream (fake_upstream with --tls-cert):
// requests and replays over TLS, connection reuse, and every way the TLS
// setup can be wrong (untrusted CA, wrong name, missing client certificate,
// unreadable files), plus a CA rotated by a reload.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "integration/harness.h"

namespace idemgate::testing {
namespace {

using namespace std::chrono_literals;

struct TlsOptions {
  std::string ca_file;
  std::string server_name;
  std::string cert_file;
  std::string key_file;
};

class TlsUpstreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pki = MakeTestPki(dir_.Join("pki"));
    ASSERT_TRUE(pki.ok()) << pki.status().ToString();
    pki_ = *pki;
  }

  void TearDown() override {
    if (!gateway_) return;
    if (HasFailure()) gateway_->DumpLogs();
    gateway_->Stop();
    gateway_.reset();
  }

  // fake_upstream serving HTTPS with `cert`/`key`; with `client_ca`, it
  // requires a client certificate signed by that CA.
  void StartTlsFake(const std::string& cert, const std::string& key, const std::string& client_ca = "") {
    std::vector<std::string> args = {"--port", "0", "--threads", "2", "--tls-cert", cert, "--tls-key", key};
    if (!client_ca.empty()) {
      args.push_back("--tls-client-ca");
      args.push_back(client_ca);
    }
    auto fake = StartServer(IDEMGATE_FAKE_UPSTREAM_PATH, args, dir_.Join("fake.ready"));
    ASSERT_TRUE(fake.ok()) << fake.status().ToString();
    fake_.emplace(std::move(*fake));
    fake_endpoint_ = fake_->Endpoint().value();
  }

  // A gateway with one route `/` to the TLS fake, reached as `host`; `upstream_extra` and
  // `route_extra` add keys (lines indented by four spaces) to the upstream and the route.
  std::string Yaml(const TlsOptions& tls, const std::string& host = "127.0.0.1",
                   const std::string& upstream_extra = "", const std::string& route_extra = "") const {
    std::string t = "{ ca_file: \"" + tls.ca_file + "\"";
    if (!tls.server_name.empty()) t += ", server_name: " + tls.server_name;
    if (!tls.cert_file.empty()) t += ", cert_file: \"" + tls.cert_file + "\", key_file: \"" + tls.key_file + "\"";
    t += " }";
    return "listen: 127.0.0.1:0\nworkers: 2\nshutdown_grace: 10s\nadmin: { listen: 127.0.0.1:0 }\n"
           "store: { kind: memory }\nlog: { level: info, format: json }\nupstreams:\n"
           "  secure:\n    url: https://" +
           host + ":" + std::to_string(fake_endpoint_.port) + "\n    connect_timeout: 2s\n    tls: " + t + "\n" +
           upstream_extra + "routes:\n  - id: pay\n    match: { path_prefix: / }\n    upstream: secure\n" +
           route_extra;
  }

  void StartGateway(const std::string& yaml) {
    auto g = GatewayProcess::Start(dir_, yaml);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    gateway_.emplace(std::move(*g));
  }

  HttpResponse Send(const HttpRequest& req) {
    auto res = SendRequest(gateway_->endpoint(), req);
    EXPECT_TRUE(res.ok()) << res.status().ToString();
    return res.ok() ? *res : HttpResponse{};
  }

  // The fake's counters, read through the gateway (so over TLS).
  FakeStats StatsThroughGateway() {
    const HttpResponse res = Send(HttpRequest{.target = "/__stats"});
    EXPECT_EQ(res.status, 200) << res.body;
    auto stats = ParseFakeStats(res.body);
    EXPECT_TRUE(stats.ok()) << stats.status().ToString();
    return stats.ok() ? *stats : FakeStats{};
  }

  // Asserts a 502 whose detail names a failed TLS handshake and `reason`.
  void ExpectHandshakeFailure(const HttpResponse& res, const std::string& reason) {
    ExpectProblem(res, 502, "upstream-unavailable");
    auto problem = ParseObject(res.body);
    const auto* detail = problem.if_contains("detail");
    ASSERT_NE(detail, nullptr) << res.body;
    const std::string text(detail->as_string());
    EXPECT_NE(text.find("TLS handshake failed"), std::string::npos) << text;
    EXPECT_NE(text.find(reason), std::string::npos) << text;
  }

  TempDir dir_;
  TestPki pki_;
  std::optional<Server> fake_;
  HostPort fake_endpoint_;
  std::optional<GatewayProcess> gateway_;
};

TEST_F(TlsUpstreamTest, KeyedRequestsRunOnceAndReplayOverTls) {
  StartTlsFake(pki_.server_cert, pki_.server_key);
  StartGateway(Yaml({.ca_file = pki_.ca_file}));

  const HttpResponse first = Send(KeyedPost("/echo/pay", "tls-1", R"({"amount":1000})"));
  ASSERT_EQ(first.status, 200) << first.body;
  auto echo = ParseObject(first.body);
  EXPECT_EQ(echo["execution"].as_int64(), 1);
  EXPECT_EQ(echo["body"].as_string(), R"({"amount":1000})");
  EXPECT_TRUE(Values(first.headers, "Idempotent-Replayed").empty());

  const HttpResponse again = Send(KeyedPost("/echo/pay", "tls-1", R"({"amount":1000})"));
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(Values(again.headers, "Idempotent-Replayed"), (std::vector<std::string>{"true"}));
  EXPECT_EQ(again.body, first.body);

  const FakeStats stats = StatsThroughGateway();
  EXPECT_EQ(stats.executions, 1u);
  EXPECT_EQ(stats.tls_handshake_failures, 0u);
}

TEST_F(TlsUpstreamTest, TlsConnectionsAreKeptAliveAndReused) {
  StartTlsFake(pki_.server_cert, pki_.server_key);
  StartGateway(Yaml({.ca_file = pki_.ca_file}));
  // One client connection stays on one worker, whose pool keeps one TLS
  // connection to the upstream: one handshake for all of these requests.
  HttpClient client(gateway_->endpoint());
  for (int i = 0; i < 20; ++i) {
    auto res = client.Send(KeyedPost("/echo/reuse", "reuse-" + std::to_string(i), "{}"));
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    ASSERT_EQ(res->status, 200) << res->body;
  }
  auto stats = client.Send(HttpRequest{.target = "/__stats"});
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  auto parsed = ParseFakeStats(stats->body);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->executions, 20u);
  EXPECT_EQ(parsed->connections, 1u);
  EXPECT_EQ(client.connections_opened(), 1);
}

// An https upstream that answers before it has read the whole request and
// then keeps the connection without reading (/answer-early/201?then=wait, for
// 10 s) or closes it: the gateway's send, blocked, notices the answer while
// it waits for room, as over plain http, instead of running into the
// upstream timeout (a 504 that released the key, so that the retry ran the
// request again). The answer is relayed and stored; the retry replays it. A
// body as large that the upstream reads whole still goes through.
TEST_F(TlsUpstreamTest, AnAnswerBeforeTheWholeBodyIsRelayedAndStoredOverTls) {
  StartTlsFake(pki_.server_cert, pki_.server_key);
  StartGateway(Yaml({.ca_file = pki_.ca_file}, "127.0.0.1", "    timeout: 5s\n", "    max_request_bytes: 32MiB\n"));
  const std::string body(16 * 1024 * 1024, 'b');  // far more than the socket buffers in between hold
  for (const char* then : {"wait", "close"}) {
    SCOPED_TRACE(then);
    HttpRequest early =
        KeyedPost(std::string("/answer-early/201?then=") + then, std::string("tls-early-") + then, body);
    early.headers[1] = {"Content-Type", "application/octet-stream"};
    const HttpResponse first = Send(early);
    EXPECT_EQ(first.status, 201) << first.body;
    EXPECT_FALSE(first.HasHeader("Idempotent-Replayed"));
    const HttpResponse retry = Send(early);
    EXPECT_EQ(retry.status, 201) << retry.body;
    EXPECT_EQ(retry.Header("Idempotent-Replayed"), "true");
    EXPECT_EQ(retry.body, first.body);
  }

  HttpRequest upload = KeyedPost("/upload-sha256", "tls-upload", body);
  upload.headers[1] = {"Content-Type", "application/octet-stream"};
  const HttpResponse whole = Send(upload);
  ASSERT_EQ(whole.status, 200) << whole.body;
  EXPECT_EQ(ParseObject(whole.body)["bytes"].as_int64(), static_cast<std::int64_t>(body.size()));

  const FakeStats stats = StatsThroughGateway();
  EXPECT_EQ(stats.executions, 3u);
  EXPECT_EQ(stats.by_key.size(), 3u);
  for (const auto& [key, runs] : stats.by_key) EXPECT_EQ(runs, 1u) << key;
}

TEST_F(TlsUpstreamTest, AnUntrustedCertificateIs502AndTheKeyIsReleased) {
  StartTlsFake(pki_.server_cert, pki_.server_key);
  StartGateway(Yaml({.ca_file = pki_.other_ca_file}));
  ExpectHandshakeFailure(Send(KeyedPost("/echo/pay", "untrusted", "{}")), "certificate verify failed");
  // Not stored and not left in flight: the retry runs (and fails) again
  // instead of getting a replay or 409.
  ExpectHandshakeFailure(Send(KeyedPost("/echo/pay", "untrusted", "{}")), "certificate verify failed");
}

TEST_F(TlsUpstreamTest, TheCertificateMustNameTheHostOrServerName) {
  // The certificate names localhost and 127.0.0.1, not other.test.
  StartTlsFake(pki_.server_cert, pki_.server_key);
  StartGateway(Yaml({.ca_file = pki_.ca_file, .server_name = "other.test"}));
  ExpectHandshakeFailure(Send(KeyedPost("/echo/pay", "name-1", "{}")), "hostname mismatch");
  gateway_->Stop();
  gateway_.reset();

  // Reached by its DNS name, which the certificate carries.
  StartGateway(Yaml({.ca_file = pki_.ca_file}, "localhost"));
  EXPECT_EQ(Send(KeyedPost("/echo/pay", "name-2", "{}")).status, 200);
}

TEST_F(TlsUpstreamTest, ServerNameReachesAnUpstreamByAddressUnderAnotherName) {
  // other.pem names only other.test: reached at 127.0.0.1 it fails the
  // address check, and with server_name: other.test it passes.
  StartTlsFake(pki_.other_cert, pki_.other_key);
  StartGateway(Yaml({.ca_file = pki_.ca_file}));
  ExpectHandshakeFailure(Send(KeyedPost("/echo/pay", "sni-1", "{}")), "IP address mismatch");
  gateway_->Stop();
  gateway_.reset();

  StartGateway(Yaml({.ca_file = pki_.ca_file, .server_name = "other.test"}));
  const HttpResponse res = Send(KeyedPost("/echo/pay", "sni-2", "{}"));
  ASSERT_EQ(res.status, 200) << res.body;
}

TEST_F(TlsUpstreamTest, MutualTlsNeedsTheClientCertificate) {
  StartTlsFake(pki_.server_cert, pki_.server_key, pki_.ca_file);
  StartGateway(Yaml({.ca_file = pki_.ca_file}));
  const HttpResponse refused = Send(KeyedPost("/echo/pay", "mtls-1", "{}"));
  ExpectProblem(refused, 502, "upstream-unavailable");
  gateway_->Stop();
  gateway_.reset();

  StartGateway(Yaml({.ca_file = pki_.ca_file, .cert_file = pki_.client_cert, .key_file = pki_.client_key}));
  const HttpResponse res = Send(KeyedPost("/echo/pay", "mtls-2", "{}"));
  ASSERT_EQ(res.status, 200) << res.body;
  EXPECT_EQ(StatsThroughGateway().executions, 1u);
}

TEST_F(TlsUpstreamTest, AnUnreadableTlsFileStopsTheStart) {
  StartTlsFake(pki_.server_cert, pki_.server_key);
  auto g = GatewayProcess::Start(dir_, Yaml({.ca_file = dir_.Join("missing-ca.pem")}));
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("upstreams.secure.tls"), std::string::npos) << g.status().message();
  EXPECT_NE(g.status().message().find("missing-ca.pem"), std::string::npos) << g.status().message();

  // A client key that does not belong to the certificate.
  auto mismatched = GatewayProcess::Start(
      dir_, Yaml({.ca_file = pki_.ca_file, .cert_file = pki_.client_cert, .key_file = pki_.server_key}));
  ASSERT_FALSE(mismatched.ok());
  EXPECT_NE(mismatched.status().message().find("does not match"), std::string::npos)
      << mismatched.status().message();
}

TEST_F(TlsUpstreamTest, ARotatedCaFileTakesEffectOnReload) {
  StartTlsFake(pki_.server_cert, pki_.server_key);
  const std::string ca = dir_.Join("trusted.pem");
  std::filesystem::copy_file(pki_.other_ca_file, ca);
  StartGateway(Yaml({.ca_file = ca}));
  ExpectHandshakeFailure(Send(KeyedPost("/echo/pay", "rot-1", "{}")), "certificate verify failed");

  std::filesystem::copy_file(pki_.ca_file, ca, std::filesystem::copy_options::overwrite_existing);
  ASSERT_TRUE(gateway_->process().Signal(SIGHUP).ok());
  // The reload is asynchronous: wait until the new trust anchor is used.
  int status = 0;
  for (int i = 0; i < 100 && status != 200; ++i) {
    status = Send(KeyedPost("/echo/pay", "rot-2", "{}")).status;
    if (status != 200) std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(status, 200);

  // A reload whose CA file cannot be read keeps the running config.
  std::filesystem::remove(ca);
  ASSERT_TRUE(gateway_->process().Signal(SIGHUP).ok());
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(Send(KeyedPost("/echo/pay", "rot-3", "{}")).status, 200);
  EXPECT_NE(gateway_->Stdout().find("trusted.pem"), std::string::npos);
}

}  // namespace
}  // namespace idemgate::testing
