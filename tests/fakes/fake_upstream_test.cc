// Tests of fake_upstream and of the idemgate_testing helpers it is driven by.
#include <gtest/gtest.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "fakes/testing.h"

namespace idemgate::testing {
namespace {

namespace json = boost::json;

class FakeUpstreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server =
        StartServer(IDEMGATE_FAKE_UPSTREAM_PATH, {"--port", "0"}, dir_.Join("fake.ready"));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_.emplace(std::move(*server));
    auto endpoint = server_->Endpoint();
    ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
    endpoint_ = *endpoint;
  }

  json::object Json(const HttpResponse& res) {
    boost::system::error_code ec;
    auto v = json::parse(res.body, ec);
    EXPECT_FALSE(ec) << res.body;
    return v.is_object() ? v.as_object() : json::object();
  }

  TempDir dir_;
  std::optional<Server> server_;
  HostPort endpoint_;
};

TEST_F(FakeUpstreamTest, ReadyFileNamesAnEphemeralLoopbackPort) {
  EXPECT_EQ(endpoint_.host, "127.0.0.1");
  EXPECT_NE(endpoint_.port, 0);
}

TEST_F(FakeUpstreamTest, EchoReturnsMethodTargetHeadersInOrderAndBody) {
  HttpRequest req{.method = "POST", .target = "/echo?x=1&y=2"};
  req.headers = {
      {"X-B", "second"}, {"X-A", "first"}, {"Content-Type", "text/plain"}, {"X-A", "again"}};
  req.body = "hello body";
  auto res = SendRequest(endpoint_, req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->Header("Content-Type"), "application/json");
  auto o = Json(*res);
  EXPECT_EQ(o["method"], "POST");
  EXPECT_EQ(o["target"], "/echo?x=1&y=2");
  EXPECT_EQ(o["body"], "hello body");
  EXPECT_EQ(o["body_base64"], "aGVsbG8gYm9keQ==");
  EXPECT_EQ(o["body_length"], 10);
  EXPECT_EQ(o["execution"], 1);
  std::vector<std::pair<std::string, std::string>> seen;
  for (const auto& h : o["headers"].as_array()) {
    seen.emplace_back(json::value_to<std::string>(h.as_array()[0]),
                      json::value_to<std::string>(h.as_array()[1]));
  }
  // Host comes first (added by the client), then the headers in wire order,
  // lines of one name not grouped together.
  ASSERT_GE(seen.size(), 5u);
  EXPECT_EQ(seen[0].first, "Host");
  EXPECT_EQ(seen[1], (std::pair<std::string, std::string>{"X-B", "second"}));
  EXPECT_EQ(seen[2], (std::pair<std::string, std::string>{"X-A", "first"}));
  EXPECT_EQ(seen[3], (std::pair<std::string, std::string>{"Content-Type", "text/plain"}));
  EXPECT_EQ(seen[4], (std::pair<std::string, std::string>{"X-A", "again"}));
}

TEST_F(FakeUpstreamTest, ClientSendsAChunkedBodyWhenAskedTo) {
  HttpRequest req{.method = "POST", .target = "/echo", .body = std::string(70000, 'c')};
  req.headers = {{"Transfer-Encoding", "chunked"}};
  auto res = SendRequest(endpoint_, req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  auto o = Json(*res);
  EXPECT_EQ(o["body_length"], 70000);
  bool saw_te = false, saw_length = false;
  for (const auto& h : o["headers"].as_array()) {
    const auto name = json::value_to<std::string>(h.as_array()[0]);
    saw_te = saw_te || name == "Transfer-Encoding";
    saw_length = saw_length || name == "Content-Length";
  }
  EXPECT_TRUE(saw_te);
  EXPECT_FALSE(saw_length);
}

TEST_F(FakeUpstreamTest, EchoBinaryBodyIsBase64Only) {
  HttpRequest req{.method = "PUT", .target = "/echo"};
  req.body = std::string("\xff\x00\xfe", 3);
  auto res = SendRequest(endpoint_, req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  auto o = Json(*res);
  EXPECT_FALSE(o.contains("body"));
  EXPECT_EQ(o["body_base64"], "/wD+");
  EXPECT_EQ(o["body_length"], 3);
}

TEST_F(FakeUpstreamTest, EchoSetsCookiesAndExtraHeaders) {
  HttpRequest req{.target = "/echo"};
  req.headers = {{"X-Echo-Set-Cookie", "a=1; Path=/"},
                 {"X-Echo-Set-Cookie", "b=2; HttpOnly"},
                 {"X-Echo-Header", "X-Upstream-Extra: yes"}};
  auto res = SendRequest(endpoint_, req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->Headers("Set-Cookie"), (std::vector<std::string>{"a=1; Path=/", "b=2; HttpOnly"}));
  EXPECT_EQ(res->Header("X-Upstream-Extra"), "yes");
}

TEST_F(FakeUpstreamTest, StatusEndpointAndTerminalHeader) {
  auto res = SendRequest(endpoint_, HttpRequest{.method = "POST", .target = "/status/503"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 503);
  EXPECT_FALSE(res->HasHeader("Idempotency-Terminal"));
  EXPECT_EQ(Json(*res)["status"], 503);

  HttpRequest terminal{.method = "POST", .target = "/status/500"};
  terminal.headers = {{"X-Terminal", "1"}};
  res = SendRequest(endpoint_, terminal);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 500);
  EXPECT_EQ(res->Header("Idempotency-Terminal"), "true");

  res = SendRequest(endpoint_, HttpRequest{.method = "DELETE", .target = "/status/204"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 204);
  EXPECT_TRUE(res->body.empty());

  res = SendRequest(endpoint_, HttpRequest{.target = "/status/99"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 400);
}

TEST_F(FakeUpstreamTest, StatsCountExecutionsByRawKeyButNotThemselves) {
  for (const char* key : {"\"k1\"", "\"k1\"", "k1", "other"}) {
    HttpRequest req{.method = "POST", .target = "/echo"};
    req.headers = {{"Idempotency-Key", key}};
    ASSERT_TRUE(SendRequest(endpoint_, req).ok());
  }
  ASSERT_TRUE(SendRequest(endpoint_, HttpRequest{.target = "/no-such-path"}).ok());
  auto stats = FetchFakeStats(endpoint_);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  stats = FetchFakeStats(endpoint_);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->executions, 5u);
  EXPECT_EQ(stats->by_key,
            (std::map<std::string, std::uint64_t>{{"\"k1\"", 2}, {"k1", 1}, {"other", 1}}));
  // Five requests and two stats calls, each on its own connection.
  EXPECT_EQ(stats->connections, 7u);

  ASSERT_TRUE(ResetFake(endpoint_).ok());
  stats = FetchFakeStats(endpoint_);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->executions, 0u);
  EXPECT_TRUE(stats->by_key.empty());
  EXPECT_EQ(stats->connections, 1u);
}

TEST_F(FakeUpstreamTest, KeepAliveServesManyRequestsOnOneConnection) {
  HttpClient client(endpoint_);
  for (int i = 1; i <= 20; ++i) {
    auto res =
        client.Send(HttpRequest{.method = "POST", .target = "/echo", .body = std::to_string(i)});
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_TRUE(res->keep_alive);
    EXPECT_EQ(Json(*res)["execution"], i);
  }
  EXPECT_EQ(client.connections_opened(), 1);
  auto stats = FetchFakeStats(endpoint_);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->connections, 2u);  // the client's and the stats call's

  HttpRequest closing{.target = "/echo"};
  closing.headers = {{"Connection", "close"}};
  auto res = client.Send(closing);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_FALSE(res->keep_alive);
  EXPECT_FALSE(client.connected());
}

TEST_F(FakeUpstreamTest, HeadGetsHeadersOnly) {
  HttpClient client(endpoint_);
  for (const char* target : {"/echo", "/large?bytes=5000"}) {
    auto res = client.Send(HttpRequest{.method = "HEAD", .target = target});
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_EQ(res->status, 200);
    EXPECT_TRUE(res->body.empty());
    EXPECT_NE(res->Header("Content-Length").value_or("0"), "0");
  }
  auto res = client.Send(HttpRequest{.target = "/echo"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(Json(*res)["method"], "GET");
  EXPECT_EQ(client.connections_opened(), 1);
}

TEST_F(FakeUpstreamTest, ManyConcurrentConnections) {
  constexpr int kClients = 120;
  constexpr int kRequestsEach = 5;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      HttpClient client(endpoint_);
      for (int i = 0; i < kRequestsEach; ++i) {
        HttpRequest req{.method = "POST", .target = "/echo"};
        req.headers = {{"Idempotency-Key", "client-" + std::to_string(c)}};
        auto res = client.Send(req);
        if (!res.ok() || res->status != 200) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto stats = FetchFakeStats(endpoint_);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->executions, std::uint64_t{kClients * kRequestsEach});
  EXPECT_EQ(stats->by_key.size(), std::size_t{kClients});
  EXPECT_EQ(stats->by_key["client-7"], std::uint64_t{kRequestsEach});
  EXPECT_EQ(stats->connections, std::uint64_t{kClients + 1});
}

TEST_F(FakeUpstreamTest, SlowAnswersAfterWaiting) {
  auto res = SendRequest(endpoint_, HttpRequest{.target = "/slow?ms=50"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(Json(*res)["slept_ms"], 50);
}

std::string Pattern(std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<char>('a' + i % 26);
  return s;
}

TEST_F(FakeUpstreamTest, LargeBodyWithContentLengthAndChunked) {
  constexpr std::size_t kBytes = 300 * 1000 + 7;
  auto res =
      SendRequest(endpoint_, HttpRequest{.target = "/large?bytes=" + std::to_string(kBytes)});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->Header("Content-Length"), std::to_string(kBytes));
  EXPECT_EQ(res->body, Pattern(kBytes));

  HttpClient client(endpoint_);
  res = client.Send(HttpRequest{.target = "/large?bytes=" + std::to_string(kBytes) + "&chunked=1"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->Header("Transfer-Encoding"), "chunked");
  EXPECT_FALSE(res->HasHeader("Content-Length"));
  EXPECT_EQ(res->body, Pattern(kBytes));
  // The connection stays usable after a chunked body.
  res = client.Send(HttpRequest{.target = "/large?bytes=0&chunked=1"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->body, "");
  EXPECT_EQ(client.connections_opened(), 1);
}

TEST_F(FakeUpstreamTest, DieMidResponseIsAnErrorForTheClient) {
  auto res = SendRequest(endpoint_, HttpRequest{.target = "/die-mid-response"});
  EXPECT_FALSE(res.ok());

  auto raw = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  ASSERT_TRUE(raw->Write("GET /die-mid-response HTTP/1.1\r\nHost: x\r\n\r\n").ok());
  const std::string got = raw->ReadUntilClosed(10s);
  EXPECT_TRUE(raw->closed());
  EXPECT_TRUE(got.starts_with("HTTP/1.1 200 OK\r\n")) << got;
  EXPECT_FALSE(ParseResponse(got).ok());
}

TEST_F(FakeUpstreamTest, DieBeforeResponseClosesAndCounts) {
  auto res = SendRequest(
      endpoint_, HttpRequest{.method = "POST", .target = "/die-before-response", .body = "x"});
  EXPECT_FALSE(res.ok());
  auto stats = FetchFakeStats(endpoint_);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->executions, 1u);
}

TEST_F(FakeUpstreamTest, UploadIsHashedWhileStreaming) {
  constexpr std::uint64_t kBytes = 8 * 1024 * 1024 + 3;
  Sha256 expected;
  std::uint64_t produced = 0;
  HttpRequest req{.method = "POST", .target = "/upload-sha256"};
  req.stream_length = kBytes;
  req.stream = [&](char* out, std::size_t cap) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(cap, kBytes - produced));
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<char>((produced + i) * 31 % 251);
    expected.Update(std::string_view(out, n));
    produced += n;
    return n;
  };
  auto res = SendRequest(endpoint_, req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  auto o = Json(*res);
  EXPECT_EQ(o["bytes"], kBytes);
  EXPECT_EQ(o["sha256"], json::value(expected.HexDigest()));
}

TEST_F(FakeUpstreamTest, MalformedRequestClosesTheConnection) {
  auto raw = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  ASSERT_TRUE(raw->Write("THIS IS NOT HTTP\r\n\r\n").ok());
  raw->ReadUntilClosed(10s);
  EXPECT_TRUE(raw->closed());
}

TEST_F(FakeUpstreamTest, ExpectContinueIsHonoured) {
  auto raw = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(
      raw->Write(
             "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n")
          .ok());
  auto interim = raw->ReadSome(10s);
  ASSERT_TRUE(interim.ok());
  EXPECT_TRUE(interim->starts_with("HTTP/1.1 100 Continue")) << *interim;
  ASSERT_TRUE(raw->Write("abc").ok());
  std::string got;
  ASSERT_TRUE(PollUntil(
      [&] {
        auto piece = raw->ReadSome(100ms);
        if (piece.ok()) got += *piece;
        return ParseResponse(got).ok();
      },
      10s));
  auto res = ParseResponse(got);
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(Json(*res)["body"], "abc");
}

TEST_F(FakeUpstreamTest, SigtermExitsZero) {
  ASSERT_TRUE(server_->process.Signal(SIGTERM).ok());
  auto status = server_->process.WaitExit(10s);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->exited) << status->ToString();
  EXPECT_EQ(status->code, 0);
}

TEST(TestingHelpersTest, RefusedPortIsRefusedAndNotHandedOut) {
  auto refused = RefusedPort::Make();
  ASSERT_TRUE(refused.ok());
  EXPECT_FALSE(RawConnection::Connect(HostPort{"127.0.0.1", refused->port()}).ok());
  // While it lives, no socket bound to port 0 gets it.
  for (int i = 0; i < 200; ++i) {
    auto port = PickFreePort();
    ASSERT_TRUE(port.ok());
    EXPECT_NE(*port, refused->port());
  }
}

TEST(TestingHelpersTest, ParseHostPort) {
  auto hp = ParseHostPort("127.0.0.1:8080");
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->host, "127.0.0.1");
  EXPECT_EQ(hp->port, 8080);
  hp = ParseHostPort("[::1]:9");
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->host, "::1");
  EXPECT_EQ(hp->ToString(), "[::1]:9");
  EXPECT_FALSE(ParseHostPort("nohost").ok());
  EXPECT_FALSE(ParseHostPort("h:70000").ok());
}

TEST(TestingHelpersTest, ProcessExitCodesEnvAndOutput) {
  TempDir dir;
  ProcessOptions options;
  options.env = {{"IDEMGATE_TEST_VALUE", "forty-two"}};
  options.stdout_path = dir.Join("out.txt");
  auto p = Process::Start("/bin/sh", {"-c", "echo \"$IDEMGATE_TEST_VALUE\"; exit 3"}, options);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto status = p->WaitExit(10s);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->exited);
  EXPECT_EQ(status->code, 3);
  EXPECT_EQ(ReadFile(dir.Join("out.txt")).value(), "forty-two\n");

  EXPECT_FALSE(Process::Start(dir.Join("does-not-exist"), {}).ok());
}

TEST(TestingHelpersTest, DestructorKillsARunningChild) {
  pid_t pid = 0;
  {
    auto p = Process::Start("/bin/sleep", {"60"});
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    pid = p->pid();
    EXPECT_TRUE(p->Running());
    EXPECT_FALSE(p->WaitExit(50ms).has_value());
  }
  EXPECT_NE(::kill(pid, 0), 0);  // reaped: the pid no longer exists
}

TEST(TestingHelpersTest, ReadyFileWaitFailsEarlyWhenTheProcessExits) {
  TempDir dir;
  auto server = StartServer("/bin/false", {}, dir.Join("never.ready"), {}, 20s);
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("exit 1"), std::string::npos)
      << server.status().ToString();
}

TEST(TestingHelpersTest, ProcStatusReadsOwnMemory) {
  auto hwm = ProcStatusKiB(::getpid(), "VmHWM");
  ASSERT_TRUE(hwm.ok()) << hwm.status().ToString();
  EXPECT_GT(*hwm, 0u);
  EXPECT_FALSE(ProcStatusKiB(::getpid(), "NoSuchField").ok());
}

TEST(TestingHelpersTest, ParseResponseHandlesLengthChunkedAndEof) {
  auto r = ParseResponse("HTTP/1.1 201 Created\r\nContent-Length: 2\r\nX-A: 1\r\nX-A: 2\r\n\r\nok");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 201);
  EXPECT_EQ(r->body, "ok");
  EXPECT_EQ(r->Headers("x-a"), (std::vector<std::string>{"1", "2"}));
  r = ParseResponse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->body, "abc");
  r = ParseResponse("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil eof");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->body, "until eof");
  EXPECT_FALSE(ParseResponse("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort").ok());
  EXPECT_FALSE(ParseResponse("garbage\r\n\r\n").ok());
}

// ---------------------------------------------------------------------------
// The test PKI and fake_upstream over TLS

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

struct X509Free {
  void operator()(X509* p) const { X509_free(p); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;

X509Ptr LoadCert(const std::string& path) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_file(path.c_str(), "r"), &BIO_free);
  if (!bio) return nullptr;
  return X509Ptr(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> LoadKey(const std::string& path) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_file(path.c_str(), "r"), &BIO_free);
  EVP_PKEY* key = bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr;
  return {key, &EVP_PKEY_free};
}

// Verifies the certificate in `cert_file` for `purpose` (X509_PURPOSE_SSL_*)
// with `ca_file` as the only trust anchor: "" when it verifies, else why not.
std::string VerifyCert(const std::string& cert_file, const std::string& ca_file, int purpose) {
  X509Ptr cert = LoadCert(cert_file);
  if (!cert) return "cannot read " + cert_file;
  std::unique_ptr<X509_STORE, decltype(&X509_STORE_free)> store(X509_STORE_new(), &X509_STORE_free);
  if (!store || X509_STORE_load_file(store.get(), ca_file.c_str()) != 1) {
    return "cannot load " + ca_file;
  }
  std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> ctx(X509_STORE_CTX_new(),
                                                                      &X509_STORE_CTX_free);
  if (!ctx || X509_STORE_CTX_init(ctx.get(), store.get(), cert.get(), nullptr) != 1 ||
      X509_STORE_CTX_set_purpose(ctx.get(), purpose) != 1) {
    return "cannot set up the verification";
  }
  if (X509_verify_cert(ctx.get()) == 1) return "";
  return X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get()));
}

TEST(TestPkiTest, WritesAChainThatVerifies) {
  TempDir dir;
  auto pki = MakeTestPki(dir.Join("pki"));
  ASSERT_TRUE(pki.ok()) << pki.status().ToString();
  EXPECT_EQ(pki->dir, dir.Join("pki"));
  for (const std::string* file :
       {&pki->ca_file, &pki->server_cert, &pki->server_key, &pki->other_cert, &pki->other_key,
        &pki->client_cert, &pki->client_key, &pki->other_ca_file}) {
    EXPECT_TRUE(file->starts_with(pki->dir + "/")) << *file;
    const std::string pem = ReadFileOrEmpty(*file);
    EXPECT_TRUE(pem.starts_with("-----BEGIN ")) << *file << ": " << pem;
  }
  EXPECT_EQ(pki->ca_file, dir.Join("pki/ca.pem"));
  EXPECT_EQ(pki->other_ca_file, dir.Join("pki/other-ca.pem"));
  struct stat st {};
  ASSERT_EQ(::stat(pki->server_key.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  // The CAs are CAs; the leaves are not.
  X509Ptr ca = LoadCert(pki->ca_file);
  X509Ptr other_ca = LoadCert(pki->other_ca_file);
  X509Ptr server = LoadCert(pki->server_cert);
  X509Ptr other = LoadCert(pki->other_cert);
  X509Ptr client = LoadCert(pki->client_cert);
  ASSERT_TRUE(ca && other_ca && server && other && client);
  EXPECT_EQ(X509_check_ca(ca.get()), 1);
  EXPECT_EQ(X509_check_ca(other_ca.get()), 1);
  EXPECT_EQ(X509_check_ca(server.get()), 0);
  EXPECT_EQ(X509_get_version(server.get()), X509_VERSION_3);
  EXPECT_EQ(X509_check_issued(ca.get(), server.get()), X509_V_OK);
  EXPECT_NE(X509_check_issued(other_ca.get(), server.get()), X509_V_OK);

  // Each key belongs to its certificate.
  EXPECT_EQ(X509_check_private_key(server.get(), LoadKey(pki->server_key).get()), 1);
  EXPECT_EQ(X509_check_private_key(other.get(), LoadKey(pki->other_key).get()), 1);
  EXPECT_EQ(X509_check_private_key(client.get(), LoadKey(pki->client_key).get()), 1);
  EXPECT_NE(X509_check_private_key(server.get(), LoadKey(pki->client_key).get()), 1);
  ERR_clear_error();

  // Names: the server certificate is for localhost and 127.0.0.1, the other
  // one for other.test only.
  EXPECT_EQ(X509_check_host(server.get(), "localhost", 0, 0, nullptr), 1);
  EXPECT_EQ(X509_check_ip_asc(server.get(), "127.0.0.1", 0), 1);
  EXPECT_NE(X509_check_ip_asc(server.get(), "127.0.0.2", 0), 1);
  EXPECT_EQ(X509_check_host(other.get(), "other.test", 0, 0, nullptr), 1);
  EXPECT_NE(X509_check_host(other.get(), "localhost", 0, 0, nullptr), 1);
  EXPECT_NE(X509_check_ip_asc(other.get(), "127.0.0.1", 0), 1);

  // Chains: to ca.pem, for the right purpose; never to other-ca.pem.
  EXPECT_EQ(VerifyCert(pki->server_cert, pki->ca_file, X509_PURPOSE_SSL_SERVER), "");
  EXPECT_EQ(VerifyCert(pki->other_cert, pki->ca_file, X509_PURPOSE_SSL_SERVER), "");
  EXPECT_EQ(VerifyCert(pki->client_cert, pki->ca_file, X509_PURPOSE_SSL_CLIENT), "");
  EXPECT_NE(VerifyCert(pki->client_cert, pki->ca_file, X509_PURPOSE_SSL_SERVER), "");
  EXPECT_NE(VerifyCert(pki->server_cert, pki->other_ca_file, X509_PURPOSE_SSL_SERVER), "");
  EXPECT_NE(VerifyCert(pki->client_cert, pki->other_ca_file, X509_PURPOSE_SSL_CLIENT), "");
  EXPECT_EQ(VerifyCert(pki->ca_file, pki->ca_file, X509_PURPOSE_ANY), "");
  EXPECT_EQ(VerifyCert(pki->other_ca_file, pki->other_ca_file, X509_PURPOSE_ANY), "");
}

TEST(TestPkiTest, EveryCallMakesNewKeys) {
  TempDir dir;
  auto first = MakeTestPki(dir.Join("a"));
  auto second = MakeTestPki(dir.Join("b"));
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NE(ReadFileOrEmpty(first->ca_file), ReadFileOrEmpty(second->ca_file));
  EXPECT_NE(VerifyCert(first->server_cert, second->ca_file, X509_PURPOSE_SSL_SERVER), "");
}

TEST(TestPkiTest, FailureNamesTheStep) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir.Join("file"), "not a directory").ok());
  auto pki = MakeTestPki(dir.Join("file/pki"));
  ASSERT_FALSE(pki.ok());
  EXPECT_NE(pki.status().message().find(dir.Join("file/pki")), std::string::npos)
      << pki.status().ToString();
}

class FakeUpstreamTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pki = MakeTestPki(dir_.Join("pki"));
    ASSERT_TRUE(pki.ok()) << pki.status().ToString();
    pki_ = *pki;
  }

  // Starts the fake with the server certificate and `extra` arguments.
  void StartTls(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--port",         "0",         "--tls-cert",
                                     pki_.server_cert, "--tls-key", pki_.server_key};
    args.insert(args.end(), extra.begin(), extra.end());
    auto server = StartServer(IDEMGATE_FAKE_UPSTREAM_PATH, args, dir_.Join("fake.ready"));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_.emplace(std::move(*server));
    auto endpoint = server_->Endpoint();
    ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
    endpoint_ = *endpoint;
  }

  TlsClientOptions Trusting() const { return TlsClientOptions{.ca_file = pki_.ca_file}; }
  TlsClientOptions WithClientCert() const {
    return TlsClientOptions{
        .ca_file = pki_.ca_file, .cert_file = pki_.client_cert, .key_file = pki_.client_key};
  }

  // The stats, over a fresh TLS connection presenting the client certificate.
  StatusOr<FakeStats> Stats() { return TlsClient(endpoint_, WithClientCert()).Stats(); }

  // Waits (briefly) for the fake to have counted `n` handshake failures.
  bool HandshakeFailuresReach(std::uint64_t n) {
    return PollUntil(
        [&] {
          auto stats = Stats();
          return stats.ok() && stats->tls_handshake_failures >= n;
        },
        5s, 20ms);
  }

  static json::object Json(const HttpResponse& res) {
    boost::system::error_code ec;
    auto v = json::parse(res.body, ec);
    EXPECT_FALSE(ec) << res.body;
    return v.is_object() ? v.as_object() : json::object();
  }

  // SIGTERM: the fake exits 0 (under ASan: no leak or error after the test's
  // traffic either).
  void ExpectCleanExit() {
    ASSERT_TRUE(server_->process.Signal(SIGTERM).ok());
    auto status = server_->process.WaitExit(10s);
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(status->exited) << status->ToString();
    EXPECT_EQ(status->code, 0);
  }

  TempDir dir_;
  TestPki pki_;
  std::optional<Server> server_;
  HostPort endpoint_;
};

TEST_F(FakeUpstreamTlsTest, EchoOverHttpsKeepsTheConnectionAlive) {
  StartTls();
  TlsClient client(endpoint_, Trusting());
  auto res = client.Send("POST", "/echo?tls=1", "hello over tls", {{"Idempotency-Key", "k"}});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200);
  EXPECT_TRUE(res->keep_alive);
  auto o = Json(*res);
  EXPECT_EQ(o["method"], "POST");
  EXPECT_EQ(o["target"], "/echo?tls=1");
  EXPECT_EQ(o["body"], "hello over tls");
  EXPECT_EQ(o["execution"], 1);

  res = client.Send("PUT", "/echo", "second");
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(Json(*res)["body"], "second");
  EXPECT_EQ(Json(*res)["execution"], 2);

  // The stats over the same connection: one TCP connection in all.
  auto stats = client.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->executions, 2u);
  EXPECT_EQ(stats->by_key, (std::map<std::string, std::uint64_t>{{"k", 1}}));
  EXPECT_EQ(stats->connections, 1u);
  EXPECT_EQ(stats->tls_handshake_failures, 0u);
  EXPECT_EQ(client.connections(), 1);
}

TEST_F(FakeUpstreamTlsTest, CertificateVerifiesForTheLoopbackAddressToo) {
  StartTls();
  TlsClientOptions by_ip = Trusting();
  by_ip.verify_name = "127.0.0.1";
  auto res = TlsClient(endpoint_, by_ip).Send("GET", "/status/201");
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 201);

  TlsClientOptions tls12 = Trusting();
  tls12.max_version = TLS1_2_VERSION;
  res = TlsClient(endpoint_, tls12).Send("GET", "/echo");
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200);
}

TEST_F(FakeUpstreamTlsTest, WrongTrustAnchorOrNameFailsAndIsCounted) {
  StartTls();
  TlsClientOptions wrong_ca{.ca_file = pki_.other_ca_file};
  TlsClient untrusting(endpoint_, wrong_ca);
  EXPECT_FALSE(untrusting.Connect().ok());

  TlsClientOptions wrong_name = Trusting();
  wrong_name.verify_name = "other.test";
  TlsClient misnamed(endpoint_, wrong_name);
  EXPECT_FALSE(misnamed.Connect().ok());

  // The client's rejections end the server's handshakes too.
  EXPECT_TRUE(HandshakeFailuresReach(2));
  auto stats = Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->tls_handshake_failures, 2u);
  EXPECT_EQ(stats->executions, 0u);
}

TEST_F(FakeUpstreamTlsTest, PlainHttpToTheTlsPortGetsNoResponse) {
  StartTls();
  auto res = SendRequest(endpoint_, HttpRequest{.target = "/echo"}, 5s);
  EXPECT_FALSE(res.ok() && res->status == 200) << res->body;

  auto raw = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  ASSERT_TRUE(raw->Write("GET /__stats HTTP/1.1\r\nHost: x\r\n\r\n").ok());
  const std::string got = raw->ReadUntilClosed(5s);
  EXPECT_TRUE(raw->closed());
  EXPECT_FALSE(got.starts_with("HTTP/")) << got;

  ASSERT_TRUE(HandshakeFailuresReach(2));
  auto stats = Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->tls_handshake_failures, 2u);
  EXPECT_EQ(stats->executions, 0u);

  // The server is still serving; /__reset zeroes the failures too.
  TlsClient client(endpoint_, Trusting());
  auto reset = client.Send("POST", "/__reset");
  ASSERT_TRUE(reset.ok()) << reset.status().ToString();
  EXPECT_EQ(reset->status, 200);
  stats = client.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->tls_handshake_failures, 0u);
  EXPECT_EQ(stats->connections, 0u);
  ExpectCleanExit();
}

TEST_F(FakeUpstreamTlsTest, ClientCertificateIsRequiredWithClientCa) {
  StartTls({"--tls-client-ca", pki_.ca_file});

  // TLS 1.3: the client may finish its handshake before the server rejects
  // it; the rejection then arrives on the first read. No 200 either way.
  TlsClient anonymous(endpoint_, Trusting());
  auto res = anonymous.Send("GET", "/echo");
  EXPECT_FALSE(res.ok() && res->status == 200) << res->body;

  // TLS 1.2: the handshake itself fails.
  TlsClientOptions anonymous12 = Trusting();
  anonymous12.max_version = TLS1_2_VERSION;
  EXPECT_FALSE(TlsClient(endpoint_, anonymous12).Connect().ok());

  TlsClient identified(endpoint_, WithClientCert());
  res = identified.Send("POST", "/echo", "with a certificate");
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(Json(*res)["body"], "with a certificate");

  EXPECT_TRUE(HandshakeFailuresReach(2));
  auto stats = identified.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->tls_handshake_failures, 2u);
  EXPECT_EQ(stats->executions, 1u);
  ExpectCleanExit();
}

TEST_F(FakeUpstreamTlsTest, LargeBodiesCloseAndDieWorkOverTls) {
  StartTls();
  TlsClient client(endpoint_, Trusting());
  constexpr std::size_t kBytes = 300 * 1000 + 7;
  for (const char* chunked : {"0", "1"}) {
    auto res = client.Send(
        "GET", "/large?bytes=" + std::to_string(kBytes) + "&chunked=" + std::string(chunked));
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_EQ(res->body, Pattern(kBytes));
  }
  auto res = client.Send("POST", "/upload-sha256", "abc");
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(Json(*res)["sha256"], json::value(Sha256Hex("abc")));
  EXPECT_EQ(client.connections(), 1);

  // Connection: close ends with a close_notify: a clean end of stream.
  res = client.Send("GET", "/echo", "", {{"Connection", "close"}});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_FALSE(res->keep_alive);
  EXPECT_EQ(client.ReadAfterClose(), asio::error::eof);

  // /die-*: the response is cut short.
  EXPECT_FALSE(TlsClient(endpoint_, Trusting()).Send("GET", "/die-mid-response").ok());
  EXPECT_FALSE(TlsClient(endpoint_, Trusting()).Send("POST", "/die-before-response", "x").ok());
  auto stats = Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->executions, 6u);
  EXPECT_EQ(stats->tls_handshake_failures, 0u);
  ExpectCleanExit();
}

TEST_F(FakeUpstreamTlsTest, CleanCloseWaitsOnlyBrieflyForThePeer) {
  StartTls();
  TlsClient client(endpoint_, Trusting(), 5s);
  auto res = client.Send("POST", "/echo", "bye", {{"Connection", "close"}});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_FALSE(res->keep_alive);
  EXPECT_EQ(client.ReadAfterClose(), asio::error::eof);
  // This client never sends its own close_notify; the server closes the TCP
  // connection anyway, soon.
  const auto start = std::chrono::steady_clock::now();
  const auto ec = client.ReadTcpAfterClose();
  EXPECT_TRUE(ec == asio::error::eof || ec == asio::error::connection_reset) << ec.message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);

  auto stats = Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->executions, 1u);
  ExpectCleanExit();
}

TEST_F(FakeUpstreamTlsTest, SigtermExitsZeroWithConnectionsOpen) {
  StartTls();
  TlsClient idle(endpoint_, Trusting());
  ASSERT_TRUE(idle.Connect().ok());
  // A connection stuck before its handshake, too.
  auto silent = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(silent.ok()) << silent.status().ToString();
  ExpectCleanExit();
}

TEST_F(FakeUpstreamTlsTest, BadTlsArgumentsStopTheStart) {
  const auto exit_code = [](const std::vector<std::string>& args) {
    auto p = Process::Start(IDEMGATE_FAKE_UPSTREAM_PATH, args);
    if (!p.ok()) return -1;
    auto status = p->WaitExit(10s);
    return status && status->exited ? status->code : -1;
  };
  EXPECT_EQ(exit_code({"--tls-cert", pki_.server_cert}), 2);
  EXPECT_EQ(exit_code({"--tls-client-ca", pki_.ca_file}), 2);
  EXPECT_EQ(exit_code({"--tls-cert", dir_.Join("missing.pem"), "--tls-key", pki_.server_key}), 1);
  EXPECT_EQ(exit_code({"--tls-cert", pki_.server_cert, "--tls-key", pki_.client_key}), 1);
  EXPECT_EQ(
      exit_code({"--tls-cert", pki_.server_cert, "--tls-key", pki_.server_key, "--tls-client-ca",
                 dir_.Join("missing.pem"), "--ready-file", dir_.Join("never.ready")}),
      1);
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("never.ready")));
}

TEST_F(FakeUpstreamTest, PlainStatsReportNoHandshakeFailures) {
  auto res = SendRequest(endpoint_, HttpRequest{.target = "/__stats"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(Json(*res)["tls_handshake_failures"], 0);
  auto stats = FetchFakeStats(endpoint_);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->tls_handshake_failures, 0u);
}

TEST(FakeUpstreamServeFileTest, ServesTheFilesCurrentContentWithoutCountingAnExecution) {
  TempDir dir;
  const std::string jwks = dir.Join("jwks.json");
  ASSERT_TRUE(WriteFile(jwks, R"({"keys":[]})").ok());
  auto server = StartServer(IDEMGATE_FAKE_UPSTREAM_PATH,
                            {"--port", "0", "--serve-file", "/.well-known/jwks.json=" + jwks, "--serve-file",
                             "/missing.json=" + dir.Join("missing.json")},
                            dir.Join("fake.ready"));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const HostPort endpoint = server->Endpoint().value();

  HttpClient client(endpoint);
  auto res = client.Send(HttpRequest{.target = "/.well-known/jwks.json"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->Header("Content-Type"), "application/json");
  EXPECT_EQ(res->body, R"({"keys":[]})");
  // Read again on every request.
  ASSERT_TRUE(WriteFile(jwks, R"({"keys":[{"kid":"b"}]})").ok());
  res = client.Send(HttpRequest{.target = "/.well-known/jwks.json"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->body, R"({"keys":[{"kid":"b"}]})");
  res = client.Send(HttpRequest{.method = "HEAD", .target = "/.well-known/jwks.json"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200);
  EXPECT_TRUE(res->body.empty());
  // Other methods, and a file that cannot be read.
  res = client.Send(HttpRequest{.method = "POST", .target = "/.well-known/jwks.json"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 405);
  EXPECT_EQ(res->Header("Allow"), "GET, HEAD");
  res = client.Send(HttpRequest{.target = "/missing.json"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 404);
  // None of them was an execution; other paths still are.
  auto stats = FetchFakeStats(endpoint);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->executions, 0u);
  res = client.Send(HttpRequest{.target = "/.well-known/jwks.json?x=1"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 404);
  stats = FetchFakeStats(endpoint);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->executions, 1u);
}

TEST(FakeUpstreamServeFileTest, MalformedServeFileIsAUsageError) {
  for (const std::string& value : {std::string("no-equals"), std::string("relative=/f"), std::string("=/f"),
                                   std::string("/path=")}) {
    auto p = Process::Start(IDEMGATE_FAKE_UPSTREAM_PATH, {"--serve-file", value},
                            ProcessOptions{.stderr_path = "/dev/null"});
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    auto status = p->WaitExit(10s);
    ASSERT_TRUE(status.has_value()) << value;
    EXPECT_TRUE(status->exited) << value;
    EXPECT_EQ(status->code, 2) << value;
  }
}

}  // namespace
}  // namespace idemgate::testing
