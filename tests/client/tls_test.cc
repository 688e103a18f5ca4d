// SendOnce and Client over https://: against fake_upstream serving HTTPS with
// a throw-away PKI (MakeTestPki), and a one-connection TLS server in this
// process for how a connection may end. The trust rules (CA, host name or IP
// address, client certificates), the deadline, and bad TLS files.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/json.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "client/scripted_server.h"
#include "fakes/testing.h"
#include "http/chain_pki.h"

namespace idemgate::client {
namespace {

namespace json = boost::json;
using idemgate::testing::ChainPki;
using idemgate::testing::FakeStats;
using idemgate::testing::MakeChainPki;
using idemgate::testing::MakeTestPki;
using idemgate::testing::Server;
using idemgate::testing::StartServer;
using idemgate::testing::TempDir;
using idemgate::testing::TestPki;
using testing::Canned;
using testing::ScriptedServer;

constexpr Millis kTimeout{5000};

// The suite's PKI and fake_upstreams, started once: one with the CA's
// localhost/127.0.0.1 certificate, one with the other.test certificate and
// one that requires a client certificate.
class TlsSendTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto pki = MakeTestPki(dir_->Join("pki"));
    ASSERT_TRUE(pki.ok()) << pki.status().ToString();
    pki_ = new TestPki(*pki);
    good_ = Start("good", {"--tls-cert", pki_->server_cert, "--tls-key", pki_->server_key});
    other_ = Start("other", {"--tls-cert", pki_->other_cert, "--tls-key", pki_->other_key});
    mutual_ = Start("mutual", {"--tls-cert", pki_->server_cert, "--tls-key", pki_->server_key, "--tls-client-ca",
                               pki_->ca_file});
  }

  static void TearDownTestSuite() {
    delete good_;
    delete other_;
    delete mutual_;
    delete pki_;
    delete dir_;
    good_ = other_ = mutual_ = nullptr;
    pki_ = nullptr;
    dir_ = nullptr;
  }

  static Server* Start(const std::string& name, std::vector<std::string> args) {
    args.insert(args.begin(), {"--port", "0", "--threads", "1"});
    auto server = StartServer(IDEMGATE_FAKE_UPSTREAM_PATH, args, dir_->Join(name + ".ready"));
    EXPECT_TRUE(server.ok()) << server.status().ToString();
    return server.ok() ? new Server(std::move(*server)) : nullptr;
  }

  void SetUp() override {
    ASSERT_NE(pki_, nullptr);
    ASSERT_NE(good_, nullptr);
    ASSERT_NE(other_, nullptr);
    ASSERT_NE(mutual_, nullptr);
  }

  static std::uint16_t Port(const Server* server) { return server->Endpoint().value().port; }

  static std::string Url(const std::string& host, const Server* server, const std::string& path) {
    return "https://" + host + ":" + std::to_string(Port(server)) + path;
  }

  static Request Post(std::string url, std::string key = "k-tls") {
    Request request;
    request.url = std::move(url);
    request.headers = {{"Content-Type", "application/json"}};
    request.body = R"({"amount":100})";
    request.key = std::move(key);
    return request;
  }

  static TlsSettings Trusting() { return TlsSettings{.ca_file = pki_->ca_file}; }

  static json::object Json(const Response& response) {
    boost::system::error_code ec;
    json::value v = json::parse(response.body, ec);
    EXPECT_FALSE(ec) << response.body;
    return v.is_object() ? v.as_object() : json::object();
  }

  // The echoed request's first header `name`, or "".
  static std::string EchoedHeader(const json::object& echo, std::string_view name) {
    const auto* headers = echo.if_contains("headers");
    if (headers == nullptr || !headers->is_array()) return "";
    for (const auto& pair : headers->as_array()) {
      const auto& a = pair.as_array();
      if (idemgate::testing::IEquals(a.at(0).as_string(), name)) return std::string(a.at(1).as_string());
    }
    return "";
  }

  // GET /__stats of `server`, over TLS.
  static FakeStats Stats(const Server* server) {
    Request request;
    request.method = "GET";
    request.url = Url("127.0.0.1", server, "/__stats");
    auto response = SendOnce(request, kTimeout, Trusting());
    EXPECT_TRUE(response.ok()) << response.status().ToString();
    if (!response.ok()) return {};
    auto stats = idemgate::testing::ParseFakeStats(response->body);
    EXPECT_TRUE(stats.ok()) << stats.status().ToString();
    return stats.ok() ? *stats : FakeStats{};
  }

  static void ExpectError(const StatusOr<Response>& result, StatusCode code, const std::string& text) {
    ASSERT_FALSE(result.ok()) << "status " << result->status;
    EXPECT_EQ(result.status().code(), code) << result.status().ToString();
    EXPECT_NE(result.status().message().find(text), std::string::npos) << result.status().ToString();
  }

  static TempDir* dir_;
  static TestPki* pki_;
  static Server* good_;
  static Server* other_;
  static Server* mutual_;
};

TempDir* TlsSendTest::dir_ = nullptr;
TestPki* TlsSendTest::pki_ = nullptr;
Server* TlsSendTest::good_ = nullptr;
Server* TlsSendTest::other_ = nullptr;
Server* TlsSendTest::mutual_ = nullptr;

TEST_F(TlsSendTest, HttpsRequestByNameGetsTheResponse) {
  auto response = SendOnce(Post(Url("localhost", good_, "/echo/pay?x=1")), kTimeout, Trusting());
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 200);
  json::object echo = Json(*response);
  EXPECT_EQ(echo["method"].as_string(), "POST");
  EXPECT_EQ(echo["target"].as_string(), "/echo/pay?x=1");
  EXPECT_EQ(echo["body"].as_string(), R"({"amount":100})");
  EXPECT_EQ(EchoedHeader(echo, "Idempotency-Key"), "\"k-tls\"");
  EXPECT_EQ(EchoedHeader(echo, "Host"), "localhost:" + std::to_string(Port(good_)));
}

TEST_F(TlsSendTest, HttpsRequestByIpAddressAndUpperCaseScheme) {
  // The certificate carries IP:127.0.0.1; the scheme is case-insensitive.
  auto response = SendOnce(Post("HTTPS://127.0.0.1:" + std::to_string(Port(good_)) + "/echo/ip"), kTimeout,
                           Trusting());
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(EchoedHeader(Json(*response), "Idempotency-Key"), "\"k-tls\"");
}

TEST_F(TlsSendTest, LargeResponseAndHeadOverTls) {
  Request get;
  get.method = "GET";
  get.url = Url("127.0.0.1", good_, "/large?bytes=1000000&chunked=1");
  auto large = SendOnce(get, kTimeout, Trusting());
  ASSERT_TRUE(large.ok()) << large.status().ToString();
  EXPECT_EQ(large->status, 200);
  ASSERT_EQ(large->body.size(), 1000000u);
  EXPECT_EQ(large->body.substr(0, 26), "abcdefghijklmnopqrstuvwxyz");

  Request head;
  head.method = "HEAD";
  head.url = Url("localhost", good_, "/echo/head");
  auto headed = SendOnce(head, kTimeout, Trusting());
  ASSERT_TRUE(headed.ok()) << headed.status().ToString();
  EXPECT_EQ(headed->status, 200);
  EXPECT_TRUE(headed->body.empty());
}

TEST_F(TlsSendTest, AResponseOverTheRequestsBodyLimitIsRefused) {
  Request get;
  get.method = "GET";
  get.url = Url("127.0.0.1", good_, "/large?bytes=1000000&chunked=1");
  get.max_response_bytes = 1000000;  // exactly the body: still read whole
  auto whole = SendOnce(get, kTimeout, Trusting());
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(whole->body.size(), 1000000u);
  for (const char* chunked : {"0", "1"}) {
    get.url = Url("127.0.0.1", good_, std::string("/large?bytes=1000001&chunked=") + chunked);
    auto over = SendOnce(get, kTimeout, Trusting());
    ASSERT_FALSE(over.ok());
    EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted) << over.status().ToString();
    EXPECT_NE(over.status().message().find("over 1000000 bytes"), std::string::npos) << over.status().ToString();
  }
}

TEST_F(TlsSendTest, HttpsWithoutAPortMeans443) {
  // Whatever is (or is not) on port 443, the attempt names it.
  Request request;
  request.url = "https://127.0.0.1/x";
  const auto result = SendOnce(request, Millis(2000), Trusting());
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("127.0.0.1:443"), std::string::npos) << result.status().ToString();
  EXPECT_NE(result.status().code(), StatusCode::kInvalidArgument) << result.status().ToString();
}

TEST_F(TlsSendTest, UntrustedCaFailsTheHandshake) {
  const auto result = SendOnce(Post(Url("localhost", good_, "/echo/x")), kTimeout,
                               TlsSettings{.ca_file = pki_->other_ca_file});
  ExpectError(result, StatusCode::kUnavailable, "TLS handshake with localhost:" + std::to_string(Port(good_)));
  ExpectError(result, StatusCode::kUnavailable, "certificate verify failed");
}

TEST_F(TlsSendTest, SystemTrustStoreDoesNotTrustTheTestCa) {
  const auto result = SendOnce(Post(Url("localhost", good_, "/echo/x")), kTimeout);
  ExpectError(result, StatusCode::kUnavailable, "certificate verify failed");
}

TEST_F(TlsSendTest, CertificateForAnotherNameFails) {
  // other.pem names other.test only: neither the address nor localhost matches.
  ExpectError(SendOnce(Post(Url("127.0.0.1", other_, "/echo/x")), kTimeout, Trusting()), StatusCode::kUnavailable,
              "certificate verify failed (IP address mismatch)");
  ExpectError(SendOnce(Post(Url("localhost", other_, "/echo/x")), kTimeout, Trusting()), StatusCode::kUnavailable,
              "certificate verify failed (hostname mismatch)");
}

TEST_F(TlsSendTest, MutualTlsNeedsTheClientCertificate) {
  const std::string url = Url("localhost", mutual_, "/echo/mtls");
  const auto without = SendOnce(Post(url, "k-mtls"), kTimeout, Trusting());
  ASSERT_FALSE(without.ok()) << without->status;
  EXPECT_EQ(without.status().code(), StatusCode::kUnavailable) << without.status().ToString();
  EXPECT_NE(without.status().message().find("localhost:" + std::to_string(Port(mutual_))), std::string::npos)
      << without.status().ToString();

  TlsSettings tls = Trusting();
  tls.cert_file = pki_->client_cert;
  tls.key_file = pki_->client_key;
  const auto with = SendOnce(Post(url, "k-mtls"), kTimeout, tls);
  ASSERT_TRUE(with.ok()) << with.status().ToString();
  EXPECT_EQ(with->status, 200);
  EXPECT_EQ(Json(*with)["execution"].as_int64(), 1);
}

TEST_F(TlsSendTest, UnusableTlsFilesAreInvalidArguments) {
  const std::string url = Url("localhost", good_, "/echo/files");
  const std::string missing = dir_->Join("no-such-ca.pem");
  ExpectError(SendOnce(Post(url), kTimeout, TlsSettings{.ca_file = missing}), StatusCode::kInvalidArgument,
              "\"" + missing + "\"");

  const std::string junk = dir_->Join("junk.pem");
  ASSERT_TRUE(idemgate::testing::WriteFile(junk, "not a certificate\n").ok());
  ExpectError(SendOnce(Post(url), kTimeout, TlsSettings{.ca_file = junk}), StatusCode::kInvalidArgument,
              "\"" + junk + "\"");

  TlsSettings tls = Trusting();
  tls.cert_file = pki_->client_cert;
  ExpectError(SendOnce(Post(url), kTimeout, tls), StatusCode::kInvalidArgument, "both");
  tls.key_file = dir_->Join("no-such.key");
  ExpectError(SendOnce(Post(url), kTimeout, tls), StatusCode::kInvalidArgument, "\"" + tls.key_file + "\"");
  tls.key_file = pki_->server_key;  // not the client certificate's key
  ExpectError(SendOnce(Post(url), kTimeout, tls), StatusCode::kInvalidArgument, "\"" + tls.key_file + "\"");
  tls.cert_file = junk;
  tls.key_file = pki_->client_key;
  ExpectError(SendOnce(Post(url), kTimeout, tls), StatusCode::kInvalidArgument, "\"" + junk + "\"");

  // An http:// URL does not use the TLS settings at all.
  ScriptedServer plain;
  plain.Push(Canned::Answer(204));
  auto response = SendOnce(Post(plain.Url("/")), kTimeout, TlsSettings{.ca_file = missing});
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 204);
}

// A passphrase-protected key is never asked for (OpenSSL would prompt on
// the terminal and wait): it fails at once, naming the file and saying it is
// encrypted, and is not retried.
TEST_F(TlsSendTest, AnEncryptedClientKeyFailsAtOnceWithoutAPrompt) {
  const std::string encrypted = dir_->Join("encrypted.key");
  {
    FILE* in = std::fopen(pki_->client_key.c_str(), "r");
    ASSERT_NE(in, nullptr);
    EVP_PKEY* key = PEM_read_PrivateKey(in, nullptr, nullptr, nullptr);
    std::fclose(in);
    ASSERT_NE(key, nullptr);
    FILE* out = std::fopen(encrypted.c_str(), "w");
    ASSERT_NE(out, nullptr);
    static char kPass[] = "secret";
    ASSERT_EQ(PEM_write_PKCS8PrivateKey(out, key, EVP_aes_128_cbc(), kPass, 6, nullptr, nullptr), 1);
    std::fclose(out);
    EVP_PKEY_free(key);
  }
  TlsSettings tls = Trusting();
  tls.cert_file = pki_->client_cert;
  tls.key_file = encrypted;
  const std::string url = Url("localhost", mutual_, "/echo/encrypted");
  const auto result = SendOnce(Post(url), kTimeout, tls);
  ExpectError(result, StatusCode::kInvalidArgument, "the TLS client key file \"" + encrypted + "\" is encrypted");
  EXPECT_EQ(result.status().message().find("processing error"), std::string::npos) << result.status().ToString();

  std::vector<Millis> sleeps;
  ClientOptions options;
  options.sleep = [&sleeps](Millis wait) { sleeps.push_back(wait); };
  options.tls = tls;
  Client client(options);
  const Outcome out = client.Send(Post(url, "k-encrypted"));
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.attempts, 1);
  EXPECT_TRUE(sleeps.empty());
  EXPECT_NE(out.error.find("is encrypted"), std::string::npos) << out.error;
}

TEST_F(TlsSendTest, OtherSchemesAreStillRejected) {
  for (const char* url : {"ftp://127.0.0.1/", "httpx://127.0.0.1/", "https://", "https://user:pw@127.0.0.1/",
                          "https://127.0.0.1:0/", "https://127.0.0.1:70000/"}) {
    Request request;
    request.url = url;
    const auto result = SendOnce(request, Millis(1000), Trusting());
    ASSERT_FALSE(result.ok()) << url;
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument) << url << ": " << result.status().ToString();
  }
  Request ftp;
  ftp.url = "ftp://127.0.0.1/";
  EXPECT_NE(SendOnce(ftp, Millis(1000)).status().message().find("only http:// and https:// are supported"),
            std::string::npos);
}

TEST_F(TlsSendTest, ServerGoneMidResponseIsUnavailable) {
  // Both close the TCP connection without a TLS close_notify.
  ExpectError(SendOnce(Post(Url("localhost", good_, "/die-before-response")), kTimeout, Trusting()),
              StatusCode::kUnavailable, "before a response");
  ExpectError(SendOnce(Post(Url("localhost", good_, "/die-mid-response")), kTimeout, Trusting()),
              StatusCode::kUnavailable, "cannot read the response");
}

TEST_F(TlsSendTest, SilentServerHitsTheDeadlineInTheHandshake) {
  // A listening socket nobody accepts from: the TCP connection completes in
  // the backlog, and no ServerHello ever comes.
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  Request request;
  request.url = "https://localhost:" + std::to_string(ntohs(addr.sin_port)) + "/";
  const auto start = std::chrono::steady_clock::now();
  const auto result = SendOnce(request, Millis(300), Trusting());
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ::close(listener);
  ExpectError(result, StatusCode::kDeadlineExceeded, "TLS handshake");
  EXPECT_GE(elapsed, Millis(290));
  EXPECT_LT(elapsed, Millis(3000));
}

TEST_F(TlsSendTest, ClientRetriesAndParksThenReplaysOverTls) {
  TempDir dir;
  auto dlq = DeadLetterQueue::Open(dir.Join("dlq.sqlite"));
  ASSERT_TRUE(dlq.ok()) << dlq.status().ToString();
  std::vector<Millis> sleeps;
  ClientOptions options;
  options.policy.max_attempts = 3;
  options.dlq = dlq->get();
  options.sleep = [&sleeps](Millis wait) { sleeps.push_back(wait); };
  options.random = [] { return std::uint64_t{0}; };
  // Trusting the wrong CA: every attempt fails its handshake, which is retried.
  options.tls = TlsSettings{.ca_file = pki_->other_ca_file};
  Client wrong(options);
  const Outcome failed = wrong.Send(Post(Url("localhost", good_, "/echo/client"), "k-client-tls"));
  EXPECT_FALSE(failed.ok);
  EXPECT_EQ(failed.attempts, 3);
  EXPECT_EQ(sleeps.size(), 2u);
  EXPECT_NE(failed.error.find("certificate verify failed"), std::string::npos) << failed.error;
  ASSERT_TRUE(failed.dead_letter_id.has_value());

  // The replay uses the client's TLS settings too, under the original key.
  options.tls = Trusting();
  Client right(options);
  auto replayed = right.Replay(*failed.dead_letter_id);
  ASSERT_TRUE(replayed.ok()) << replayed.status().ToString();
  EXPECT_TRUE(replayed->ok) << replayed->error;
  EXPECT_EQ(replayed->attempts, 1);
  ASSERT_TRUE(replayed->response.has_value());
  EXPECT_EQ(EchoedHeader(Json(*replayed->response), "Idempotency-Key"), "\"k-client-tls\"");
  auto entry = (*dlq)->Get(*failed.dead_letter_id);
  ASSERT_TRUE(entry.ok());
  EXPECT_EQ(entry->status, EntryStatus::kReplayed);
  EXPECT_EQ(Stats(good_).by_key["\"k-client-tls\""], 1u);
}

TEST_F(TlsSendTest, ClientDoesNotRetryUnusableTlsFiles) {
  std::vector<Millis> sleeps;
  ClientOptions options;
  options.sleep = [&sleeps](Millis wait) { sleeps.push_back(wait); };
  options.tls = TlsSettings{.ca_file = dir_->Join("missing-ca.pem")};
  Client client(options);
  const Outcome out = client.Send(Post(Url("localhost", good_, "/echo/client")));
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.attempts, 1);
  EXPECT_TRUE(sleeps.empty());
  EXPECT_NE(out.error.find("missing-ca.pem"), std::string::npos) << out.error;
}

// ---------------------------------------------------------------------------
// How a TLS connection ends after the response

// Serves one HTTPS connection on 127.0.0.1: reads a request head, writes
// `response` and closes the TCP connection, with or without a TLS
// close_notify first.
class OneShotTlsServer {
 public:
  OneShotTlsServer(const TestPki& pki, std::string response, bool close_notify)
      : OneShotTlsServer(pki.server_cert, pki.server_key, std::move(response), close_notify) {}

  OneShotTlsServer(const std::string& cert_file, const std::string& key_file, std::string response,
                   bool close_notify)
      : response_(std::move(response)), close_notify_(close_notify) {
    ctx_ = SSL_CTX_new(TLS_server_method());
    EXPECT_EQ(SSL_CTX_use_certificate_chain_file(ctx_, cert_file.c_str()), 1);
    EXPECT_EQ(SSL_CTX_use_PrivateKey_file(ctx_, key_file.c_str(), SSL_FILETYPE_PEM), 1);
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(listener_, 4), 0);
    socklen_t len = sizeof addr;
    EXPECT_EQ(::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }

  ~OneShotTlsServer() {
    stop_ = true;
    thread_.join();
    ::close(listener_);
    SSL_CTX_free(ctx_);
  }

  std::uint16_t port() const { return port_; }

 private:
  void Serve() {
    pollfd p{listener_, POLLIN, 0};
    while (!stop_) {
      if (::poll(&p, 1, 20) == 1) break;
    }
    if (stop_) return;
    const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    SSL* ssl = SSL_new(ctx_);
    SSL_set_fd(ssl, fd);
    if (SSL_accept(ssl) == 1) {
      std::string head;
      char buf[4096];
      while (head.find("\r\n\r\n") == std::string::npos) {
        const int n = SSL_read(ssl, buf, sizeof buf);
        if (n <= 0) break;
        head.append(buf, static_cast<std::size_t>(n));
      }
      SSL_write(ssl, response_.data(), static_cast<int>(response_.size()));
      if (close_notify_) SSL_shutdown(ssl);
    }
    SSL_free(ssl);
    ERR_clear_error();
    ::close(fd);
  }

  std::string response_;
  bool close_notify_;
  SSL_CTX* ctx_ = nullptr;
  int listener_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST_F(TlsSendTest, BodyEndingAtTheCloseIsCompleteWithOrWithoutCloseNotify) {
  for (const bool close_notify : {true, false}) {
    OneShotTlsServer server(*pki_, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the close", close_notify);
    Request request;
    request.method = "GET";
    request.url = "https://localhost:" + std::to_string(server.port()) + "/";
    auto response = SendOnce(request, kTimeout, Trusting());
    ASSERT_TRUE(response.ok()) << "close_notify " << close_notify << ": " << response.status().ToString();
    EXPECT_EQ(response->status, 200);
    EXPECT_EQ(response->body, "until the close") << "close_notify " << close_notify;
  }
}

TEST_F(TlsSendTest, LengthDelimitedBodyCutShortIsUnavailable) {
  OneShotTlsServer server(*pki_, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", false);
  Request request;
  request.method = "GET";
  request.url = "https://localhost:" + std::to_string(server.port()) + "/";
  ExpectError(SendOnce(request, kTimeout, Trusting()), StatusCode::kUnavailable, "cannot read the response");
}

// --cacert holding only the intermediate CA that signed the server's
// certificate: every certificate in the file is a trust anchor, its issuers
// need not be there. A CA that did not sign it is still refused.
TEST_F(TlsSendTest, ACaFileHoldingOnlyAnIntermediateIsATrustAnchor) {
  auto chain = MakeChainPki(dir_->Join("chain"));
  ASSERT_TRUE(chain.ok()) << chain.status().ToString();
  Request request;
  request.method = "GET";
  for (const std::string& ca : {chain->intermediate, chain->root}) {
    OneShotTlsServer server(chain->server_cert, chain->server_key, "HTTP/1.1 204 No Content\r\n\r\n", true);
    request.url = "https://localhost:" + std::to_string(server.port()) + "/";
    auto response = SendOnce(request, kTimeout, TlsSettings{.ca_file = ca});
    ASSERT_TRUE(response.ok()) << ca << ": " << response.status().ToString();
    EXPECT_EQ(response->status, 204);
  }
  OneShotTlsServer server(chain->server_cert, chain->server_key, "HTTP/1.1 204 No Content\r\n\r\n", true);
  request.url = "https://localhost:" + std::to_string(server.port()) + "/";
  ExpectError(SendOnce(request, kTimeout, Trusting()), StatusCode::kUnavailable, "certificate verify failed");
}

}  // namespace
}  // namespace idemgate::client
