// Integration tests of the proxy path (SPEC §2 steps 1, 2 and 7, §4.5, §9
// SIGTERM): the real idemgate binary in front of fake_upstream, both on port 0.
// Every route uses `policy: passthrough`, so these tests exercise HTTP parsing,
// limits, routing and proxying, not the idempotency engine.
#include <gtest/gtest.h>
#include <signal.h>

#include <boost/json.hpp>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "fakes/testing.h"
#include "integration/harness.h"

namespace idemgate::testing {
namespace {

namespace json = boost::json;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif

constexpr std::uint64_t kMiB = 1024 * 1024;
// I/O threads of the gateway under test: each has its own upstream pool.
constexpr int kWorkers = 2;

// The knobs the tests turn; everything else is fixed in ConfigYaml().
struct GatewayOptions {
  std::string max_request_bytes = "10MiB";
  std::string max_header_bytes = "16KiB";
  std::string header_timeout = "10s";
  std::string upstream_timeout = "10s";
  std::string shutdown_grace = "10s";
  bool merge_slashes = true;
  std::vector<std::pair<std::string, std::string>> env;  // extra environment
};

// Paths the fake serves; one route each, all to the fake.
constexpr const char* kFakeRoutes[] = {"/echo",         "/status/",          "/slow",
                                       "/large",        "/die-mid-response", "/die-before-response",
                                       "/upload-sha256"};

std::string ConfigYaml(const HostPort& fake, std::uint16_t dead_port, const GatewayOptions& o) {
  std::ostringstream y;
  y << "listen: 127.0.0.1:0\n"
    << "workers: " << kWorkers << "\n"
    << "shutdown_grace: " << o.shutdown_grace << "\n"
    << "limits:\n"
    << "  max_header_bytes: " << o.max_header_bytes << "\n"
    << "  max_request_bytes: " << o.max_request_bytes << "\n"
    << "  header_timeout: " << o.header_timeout << "\n"
    << "  idle_timeout: 60s\n"
    << "merge_slashes: " << (o.merge_slashes ? "true" : "false") << "\n"
    << "admin: { listen: 127.0.0.1:0 }\n"
    << "store: { kind: memory }\n"
    << "identity: { mode: none }\n"
    << "log: { level: info, format: json }\n"
    << "upstreams:\n"
    << "  fake: { url: http://" << fake.ToString() << ", timeout: " << o.upstream_timeout
    << ", connect_timeout: 2s, max_connections: 64 }\n"
    << "  dead: { url: http://127.0.0.1:" << dead_port << ", timeout: 2s, connect_timeout: 1s }\n"
    << "defaults:\n"
    << "  idempotency: { policy: passthrough }\n"
    << "routes:\n"
    << "  - id: dead\n"
    << "    match: { path_prefix: /dead }\n"
    << "    upstream: dead\n";
  int i = 0;
  for (const char* prefix : kFakeRoutes) {
    y << "  - id: fake-" << i++ << "\n"
      << "    match: { path_prefix: " << prefix << " }\n"
      << "    upstream: fake\n";
  }
  return y.str();
}

std::string Pattern(std::size_t n) {
  std::string s;
  s.reserve(n);
  for (std::size_t i = 0; i < n; ++i) s += static_cast<char>('a' + i % 26);
  return s;
}

class ProxyTest : public FakeUpstreamSuite {
 protected:
  static void SetUpTestSuite() {
    StartFake(2);
    dead_ = new RefusingPort();
    dead_port_ = dead_->port();
  }

  static void TearDownTestSuite() {
    delete dead_;
    dead_ = nullptr;
    FakeUpstreamSuite::TearDownTestSuite();
  }

  void TearDown() override {
    if (!gateway_) return;
    if (gateway_->process.Running()) {
      EXPECT_TRUE(gateway_->process.Signal(SIGTERM).ok());
    }
    auto status = gateway_->process.WaitExit(30s);
    EXPECT_TRUE(status.has_value()) << "idemgate did not exit within 30s of SIGTERM";
    if (status) {
      EXPECT_TRUE(status->exited && status->code == 0)
          << "idemgate ended with " << status->ToString();
    }
    if (HasFailure()) {
      for (const char* name : {"idemgate.out", "idemgate.err"}) {
        auto text = ReadFile(dir_.Join(name));
        std::string tail = text.ok() ? *text : "";
        if (tail.size() > 6000) tail = "..." + tail.substr(tail.size() - 6000);
        std::cerr << "---- " << name << " ----\n" << tail << "\n";
      }
    }
    gateway_.reset();
  }

  // Starts idemgate with ConfigYaml(options); fails the test if it does not
  // become ready.
  void StartGateway(const GatewayOptions& options = {}) {
    auto config = WriteConfig(dir_, ConfigYaml(fake_endpoint_, dead_port_, options));
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    ProcessOptions process_options;
    process_options.stdout_path = dir_.Join("idemgate.out");
    process_options.stderr_path = dir_.Join("idemgate.err");
    process_options.env = options.env;
    auto server = StartServer(IDEMGATE_BIN, {"--config", *config}, dir_.Join("idemgate.ready"),
                              process_options);
    ASSERT_TRUE(server.ok()) << server.status().ToString() << "\nstderr:\n"
                             << ReadFileOrEmpty(dir_.Join("idemgate.err")) << "\nstdout:\n"
                             << ReadFileOrEmpty(dir_.Join("idemgate.out"));
    gateway_.emplace(std::move(*server));
    auto endpoint = gateway_->Endpoint("listen");
    ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
    endpoint_ = *endpoint;
  }

  FakeStats Stats() {
    auto stats = FetchFakeStats(fake_endpoint_);
    EXPECT_TRUE(stats.ok()) << stats.status().ToString();
    return stats.ok() ? *stats : FakeStats{};
  }

  static RefusingPort* dead_;
  static std::uint16_t dead_port_;

  TempDir dir_;
  std::optional<Server> gateway_;
  HostPort endpoint_;
};

RefusingPort* ProxyTest::dead_ = nullptr;
std::uint16_t ProxyTest::dead_port_ = 0;

TEST_F(ProxyTest, ReadyFileNamesBothListeners) {
  StartGateway();
  EXPECT_EQ(endpoint_.host, "127.0.0.1");
  EXPECT_NE(endpoint_.port, 0);
  auto admin = gateway_->Endpoint("admin");
  ASSERT_TRUE(admin.ok()) << admin.status().ToString();
  EXPECT_NE(admin->port, 0);
  EXPECT_NE(admin->port, endpoint_.port);
}

TEST_F(ProxyTest, RequestPassesThroughWithEndToEndHeadersAndBodyUnchanged) {
  StartGateway();
  std::string body;
  for (int i = 0; i < 3000; ++i) body += static_cast<char>(i * 7 % 256);
  HttpRequest req{.method = "POST", .target = "/echo/sub/path?b=2&a=1&a=%20x"};
  req.headers = {
      {"Host", "api.example.test"},
      {"Content-Type", "application/octet-stream"},
      {"X-Custom", "first"},
      {"X-Other", "value with  two spaces"},
      {"X-Custom", "second"},
      {"Accept", "*/*"},
      {"Cookie", "a=1; b=2"},
      {"Authorization", "Bearer end-to-end"},
      // Hop-by-hop: the proxy must not forward these.
      {"Connection", "keep-alive, X-Hop-Only"},
      {"X-Hop-Only", "must not reach the upstream"},
      {"Keep-Alive", "timeout=5"},
      {"Proxy-Authorization", "Basic c2VjcmV0"},
      // Identity headers a client sent (SPEC §6), in any spelling: with
      // identity mode none nothing verified takes their place.
      {"X-Tenant-Id", "evil"},
      {"x-project-id", "evilp"},
      {"X_Subject", "user:admin"},
  };
  req.body = body;
  auto res = SendRequest(endpoint_, req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ASSERT_EQ(res->status, 200) << res->body;
  auto echo = ParseObject(res->body);
  EXPECT_EQ(echo["method"], "POST");
  EXPECT_EQ(echo["target"], "/echo/sub/path?b=2&a=1&a=%20x");
  EXPECT_EQ(echo["body_length"], body.size());
  auto seen = EchoedHeaders(echo);

  // End-to-end headers arrive with the same values; lines of one name keep
  // their order.
  EXPECT_EQ(Values(seen, "X-Custom"), (std::vector<std::string>{"first", "second"}));
  EXPECT_EQ(Values(seen, "X-Other"), (std::vector<std::string>{"value with  two spaces"}));
  EXPECT_EQ(Values(seen, "Content-Type"), (std::vector<std::string>{"application/octet-stream"}));
  EXPECT_EQ(Values(seen, "Accept"), (std::vector<std::string>{"*/*"}));
  EXPECT_EQ(Values(seen, "Cookie"), (std::vector<std::string>{"a=1; b=2"}));
  EXPECT_EQ(Values(seen, "Authorization"), (std::vector<std::string>{"Bearer end-to-end"}));
  // Only the order of lines with the same name is significant (RFC 9110
  // §5.3): the X-Custom values above keep theirs; where the X-Other line
  // lands between them is the proxy's choice.

  // Hop-by-hop headers are removed.
  EXPECT_TRUE(Values(seen, "X-Hop-Only").empty());
  EXPECT_TRUE(Values(seen, "Keep-Alive").empty());
  EXPECT_TRUE(Values(seen, "Proxy-Authorization").empty());
  for (const char* name : {"X-Tenant-Id", "X-Project-Id", "X-Subject", "X_Subject"}) {
    EXPECT_TRUE(Values(seen, name).empty()) << name;
  }
  for (const auto& v : Values(seen, "Connection"))
    EXPECT_EQ(v.find("X-Hop-Only"), std::string::npos) << v;

  // Forwarding headers are added.
  const auto xff = Values(seen, "X-Forwarded-For");
  ASSERT_EQ(xff.size(), 1u);
  EXPECT_NE(xff[0].find("127.0.0.1"), std::string::npos) << xff[0];
  EXPECT_EQ(Values(seen, "X-Forwarded-Proto"), (std::vector<std::string>{"http"}));
  EXPECT_EQ(Values(seen, "X-Forwarded-Host"), (std::vector<std::string>{"api.example.test"}));
  const auto request_id = Values(seen, "X-Request-Id");
  ASSERT_EQ(request_id.size(), 1u);
  EXPECT_FALSE(request_id[0].empty());
  const auto traceparent = Values(seen, "traceparent");
  ASSERT_EQ(traceparent.size(), 1u);
  // W3C Trace Context: 00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>.
  EXPECT_EQ(traceparent[0].size(), 55u) << traceparent[0];
  EXPECT_TRUE(traceparent[0].starts_with("00-")) << traceparent[0];

  // The body is byte for byte the same.
  ASSERT_TRUE(echo.contains("body_base64"));
  HttpRequest direct{.method = "POST", .target = "/echo", .body = body};
  auto direct_res = SendRequest(fake_endpoint_, direct);
  ASSERT_TRUE(direct_res.ok());
  EXPECT_EQ(echo["body_base64"], ParseObject(direct_res->body)["body_base64"]);
}

// The path is normalised before routing and forwarded as routed: encoded
// unreserved characters decoded, runs of '/' merged; other escapes and the
// query stay as sent.
TEST_F(ProxyTest, PathIsNormalisedForRoutingAndForwardedAsRouted) {
  StartGateway();
  auto res = SendRequest(endpoint_, HttpRequest{.target = "//%65cho//a%2Fb/%7Ex%20y?q=%70//&r"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(ParseObject(res->body)["target"], "/echo/a%2Fb/~x%20y?q=%70//&r");
  // A spelling that normalises to a dot segment is refused like one.
  res = SendRequest(endpoint_, HttpRequest{.target = "/echo/%2E%2e/status/200"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 400) << res->body;
}

TEST_F(ProxyTest, WithMergeSlashesOffDoubledSlashesAreKept) {
  StartGateway({.merge_slashes = false});
  auto res = SendRequest(endpoint_, HttpRequest{.target = "/echo//a%7E"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(ParseObject(res->body)["target"], "/echo//a~");
  // "//echo" no longer matches the /echo route.
  res = SendRequest(endpoint_, HttpRequest{.target = "//echo"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 404) << res->body;
}

TEST_F(ProxyTest, ClientRequestIdAndTraceparentArePassedOn) {
  StartGateway();
  const std::string trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
  HttpRequest req{.target = "/echo"};
  req.headers = {{"X-Request-Id", "client-chosen-id-123"},
                 {"traceparent", "00-" + trace_id + "-00f067aa0ba902b7-01"},
                 {"X-Forwarded-For", "203.0.113.9"}};
  auto res = SendRequest(endpoint_, req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ASSERT_EQ(res->status, 200);
  auto echo = ParseObject(res->body);
  auto seen = EchoedHeaders(echo);
  EXPECT_EQ(Values(seen, "X-Request-Id"), (std::vector<std::string>{"client-chosen-id-123"}));
  const auto traceparent = Values(seen, "traceparent");
  ASSERT_EQ(traceparent.size(), 1u);
  EXPECT_TRUE(traceparent[0].starts_with("00-" + trace_id + "-")) << traceparent[0];
  // The client's address is appended to an existing X-Forwarded-For.
  const auto xff = Values(seen, "X-Forwarded-For");
  ASSERT_EQ(xff.size(), 1u);
  EXPECT_TRUE(xff[0].starts_with("203.0.113.9")) << xff[0];
  EXPECT_NE(xff[0].find("127.0.0.1"), std::string::npos) << xff[0];
}

TEST_F(ProxyTest, ResponsePassesBackWithHeadersAndBodyUnchanged) {
  StartGateway();
  HttpRequest req{.target = "/echo"};
  req.headers = {{"X-Echo-Set-Cookie", "session=abc; Path=/; HttpOnly"},
                 {"X-Echo-Set-Cookie", "theme=dark; Max-Age=60"},
                 {"X-Echo-Header", "X-Upstream-Extra: kept as is"},
                 {"X-Echo-Header", "Cache-Control: no-store"},
                 // Hop-by-hop headers in the upstream's response.
                 {"X-Echo-Header", "Connection: X-Upstream-Hop"},
                 {"X-Echo-Header", "X-Upstream-Hop: must not reach the client"},
                 {"X-Echo-Header", "Keep-Alive: timeout=77"}};
  auto res = SendRequest(endpoint_, req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(res->Headers("Set-Cookie"),
            (std::vector<std::string>{"session=abc; Path=/; HttpOnly", "theme=dark; Max-Age=60"}));
  EXPECT_EQ(res->Header("X-Upstream-Extra"), "kept as is");
  EXPECT_EQ(res->Header("Cache-Control"), "no-store");
  EXPECT_EQ(res->Header("Content-Type"), "application/json");
  EXPECT_FALSE(res->HasHeader("X-Upstream-Hop"));
  for (const auto& v : res->Headers("Keep-Alive")) EXPECT_EQ(v.find("77"), std::string::npos) << v;
  for (const auto& v : res->Headers("Connection"))
    EXPECT_EQ(v.find("X-Upstream-Hop"), std::string::npos) << v;

  // Upstream status codes and bodies (errors included) are the upstream's.
  for (int code : {201, 418, 503}) {
    auto r = SendRequest(
        endpoint_, HttpRequest{.method = "POST", .target = "/status/" + std::to_string(code)});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->status, code);
    EXPECT_EQ(r->Header("Content-Type"), "application/json");
    EXPECT_EQ(ParseObject(r->body)["status"], code);
  }

  // Large bodies, with Content-Length and chunked, arrive byte for byte.
  constexpr std::size_t kBytes = 3 * kMiB + 11;
  HttpClient client(endpoint_);
  for (const char* chunked : {"0", "1"}) {
    SCOPED_TRACE(std::string("chunked=") + chunked);
    auto r = client.Send(
        HttpRequest{.target = "/large?bytes=" + std::to_string(kBytes) + "&chunked=" + chunked});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body.size(), kBytes);
    EXPECT_TRUE(r->body == Pattern(kBytes));
  }
}

TEST_F(ProxyTest, ChunkedRequestBodyArrivesIntact) {
  StartGateway();
  HttpRequest req{.method = "POST", .target = "/echo"};
  req.headers = {{"Transfer-Encoding", "chunked"}, {"Content-Type", "text/plain"}};
  req.body = Pattern(100000);
  auto res = SendRequest(endpoint_, req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ASSERT_EQ(res->status, 200);
  auto echo = ParseObject(res->body);
  EXPECT_EQ(echo["body_length"], 100000);
  EXPECT_EQ(echo["body"], json::value(Pattern(100000)));
}

TEST_F(ProxyTest, UpstreamConnectionsAreReused) {
  StartGateway();
  constexpr int kRequests = 60;
  HttpClient client(endpoint_);
  for (int i = 0; i < kRequests; ++i) {
    auto res =
        client.Send(HttpRequest{.method = "POST", .target = "/echo", .body = std::to_string(i)});
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    ASSERT_EQ(res->status, 200);
  }
  // One client connection is served by one gateway thread: one upstream
  // connection (and the stats call's own).
  EXPECT_LE(Stats().connections, 2u);
  ASSERT_TRUE(ResetFake(fake_endpoint_).ok());
  // Requests on fresh client connections reuse pooled upstream connections too.
  for (int i = 0; i < kRequests; ++i) {
    auto res = SendRequest(endpoint_, HttpRequest{.target = "/echo"});
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    ASSERT_EQ(res->status, 200);
  }
  EXPECT_EQ(client.connections_opened(), 1);
  const FakeStats stats = Stats();
  EXPECT_EQ(stats.executions, std::uint64_t{kRequests});
  // At most one upstream connection per gateway I/O thread, plus the stats
  // call's own: far below one per request.
  EXPECT_LE(stats.connections, std::uint64_t{kWorkers + 1});
}

TEST_F(ProxyTest, UnknownPathIs404Problem) {
  StartGateway();
  for (const char* method : {"GET", "POST"}) {
    auto res = SendRequest(endpoint_, HttpRequest{.method = method, .target = "/nothing/here"});
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    ExpectProblem(*res, 404, "no-route");
  }
  EXPECT_EQ(Stats().executions, 0u);
}

TEST_F(ProxyTest, BodyOverLimitIs413Problem) {
  GatewayOptions options;
  options.max_request_bytes = "1KiB";
  StartGateway(options);

  auto ok = SendRequest(
      endpoint_, HttpRequest{.method = "POST", .target = "/echo", .body = std::string(1024, 'x')});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->status, 200);

  auto res = SendRequest(
      endpoint_, HttpRequest{.method = "POST", .target = "/echo", .body = std::string(4096, 'x')});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ExpectProblem(*res, 413, "request-too-large");

  // Without Content-Length the limit applies to the chunked body as it arrives.
  HttpRequest chunked{.method = "POST", .target = "/echo", .body = std::string(4096, 'y')};
  chunked.headers = {{"Transfer-Encoding", "chunked"}};
  res = SendRequest(endpoint_, chunked);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ExpectProblem(*res, 413, "request-too-large");

  EXPECT_EQ(Stats().executions, 1u);
}

TEST_F(ProxyTest, HeaderBlockOverLimitIs431Problem) {
  StartGateway();
  HttpRequest req{.target = "/echo"};
  req.headers = {{"X-Big", std::string(20 * 1024, 'h')}};
  auto res = SendRequest(endpoint_, req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ExpectProblem(*res, 431, "headers-too-large");

  // Many small headers count too.
  HttpRequest many{.target = "/echo"};
  for (int i = 0; i < 400; ++i)
    many.headers.push_back({"X-H-" + std::to_string(i), std::string(60, 'v')});
  res = SendRequest(endpoint_, many);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ExpectProblem(*res, 431, "headers-too-large");
  EXPECT_EQ(Stats().executions, 0u);
}

TEST_F(ProxyTest, MalformedHttpIs400AndTheConnectionCloses) {
  StartGateway();
  const std::vector<std::string> malformed = {
      "THIS IS NOT HTTP\r\n\r\n",
      "GET /echo HTTP/1.1\r\nHost: x\r\nNo colon in this header line\r\n\r\n",
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: twelve\r\n\r\nhello",
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
  };
  for (const auto& bytes : malformed) {
    SCOPED_TRACE(bytes);
    auto conn = RawConnection::Connect(endpoint_);
    ASSERT_TRUE(conn.ok()) << conn.status().ToString();
    ASSERT_TRUE(conn->Write(bytes).ok());
    const std::string got = conn->ReadUntilClosed(15s);
    EXPECT_TRUE(conn->closed()) << "connection still open after a malformed request";
    auto res = ParseResponse(got);
    ASSERT_TRUE(res.ok()) << res.status().ToString() << ": " << got;
    ExpectProblem(*res, 400, "bad-request");
  }
  EXPECT_EQ(Stats().executions, 0u);
}

TEST_F(ProxyTest, UpstreamRefusingConnectionsIs502Problem) {
  StartGateway();
  auto res = SendRequest(endpoint_,
                         HttpRequest{.method = "POST", .target = "/dead/anything", .body = "{}"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ExpectProblem(*res, 502, "upstream-unavailable");
}

TEST_F(ProxyTest, UpstreamTooSlowIs504Problem) {
  GatewayOptions options;
  options.upstream_timeout = "300ms";
  StartGateway(options);
  auto res = SendRequest(endpoint_, HttpRequest{.target = "/slow?ms=5000"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ExpectProblem(*res, 504, "upstream-timeout");
}

TEST_F(ProxyTest, SlowLorisIsCutAtHeaderTimeout) {
  GatewayOptions options;
  options.header_timeout = "1s";
  StartGateway(options);
  auto conn = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  ASSERT_TRUE(conn->Write("GET /echo HTTP/1.1\r\nHost: x\r\nX-Slow: ").ok());
  // One byte every 200 ms: each read makes progress, the header block never
  // ends. The bound is generous; the point is that it is cut at all.
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  while (!conn->closed() && std::chrono::steady_clock::now() < give_up) {
    if (!conn->Write("a").ok()) break;  // reset by the gateway
    auto got = conn->ReadSome(200ms);
    (void)got;
  }
  const bool cut = conn->closed() || !conn->Write("a").ok();
  EXPECT_TRUE(cut) << "a client trickling header bytes was still connected after 20s";
  EXPECT_EQ(Stats().executions, 0u);
}

TEST_F(ProxyTest, UpstreamDyingMidResponseNeverLooksComplete) {
  StartGateway();
  auto res = SendRequest(endpoint_, HttpRequest{.target = "/die-mid-response"});
  if (res.ok()) {
    // Only acceptable if the gateway turned it into an error of its own.
    ExpectProblem(*res, 502, "upstream-unavailable");
  } else {
    SUCCEED() << "client saw " << res.status().ToString();
  }
  // The gateway is unharmed.
  auto after = SendRequest(endpoint_, HttpRequest{.target = "/echo"});
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(after->status, 200);
}

TEST_F(ProxyTest, UpstreamClosingWithoutAnswerIs502AndIsNotRetried) {
  StartGateway();
  auto res = SendRequest(
      endpoint_, HttpRequest{.method = "POST", .target = "/die-before-response", .body = "once"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ExpectProblem(*res, 502, "upstream-unavailable");
  // A POST that reached the upstream must not be sent a second time.
  EXPECT_EQ(Stats().executions, 1u);
}

TEST_F(ProxyTest, HundredMiBUploadStreamsWithBoundedMemory) {
  GatewayOptions options;
  options.max_request_bytes = "200MiB";
  options.upstream_timeout = "60s";
  if (kAsan) {
    // ASan keeps freed memory in quarantine (256 MiB by default); bound it so
    // the high-water mark measures what idemgate holds, not what ASan keeps.
    const char* inherited = std::getenv("ASAN_OPTIONS");
    std::string asan = inherited && *inherited ? std::string(inherited) + ":" : "";
    options.env.push_back(
        {"ASAN_OPTIONS", asan + "quarantine_size_mb=8:thread_local_quarantine_size_kb=256"});
  }
  StartGateway(options);
  const pid_t pid = gateway_->process.pid();
  auto before = ProcStatusKiB(pid, "VmHWM");
  ASSERT_TRUE(before.ok()) << before.status().ToString();

  constexpr std::uint64_t kBytes = 100 * kMiB;
  Sha256 expected;
  std::uint64_t produced = 0;
  HttpRequest req{.method = "POST", .target = "/upload-sha256"};
  req.headers = {{"Content-Type", "application/octet-stream"}};
  req.stream_length = kBytes;
  req.stream = [&](char* out, std::size_t cap) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(cap, kBytes - produced));
    // A different block each time: a byte pattern keyed by the offset.
    for (std::size_t i = 0; i < n; i += 8) {
      const std::uint64_t v = (produced + i) * 0x9E3779B97F4A7C15ull;
      std::memcpy(out + i, &v, std::min<std::size_t>(8, n - i));
    }
    expected.Update(std::string_view(out, n));
    produced += n;
    return n;
  };
  auto res = SendRequest(endpoint_, req, 120s);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ASSERT_EQ(res->status, 200) << res->body;
  auto o = ParseObject(res->body);
  EXPECT_EQ(o["bytes"], kBytes);
  EXPECT_EQ(o["sha256"], json::value(expected.HexDigest()));

  auto hwm = ProcStatusKiB(pid, "VmHWM");
  ASSERT_TRUE(hwm.ok()) << hwm.status().ToString();
  const std::uint64_t hwm_bytes = *hwm * 1024;
  RecordProperty("vm_hwm_kib_before", std::to_string(*before));
  RecordProperty("vm_hwm_kib_after", std::to_string(*hwm));
  if (kAsan) {
    // ASan's shadow memory and allocator make the absolute figure meaningless;
    // what the upload added must still be far below its size.
    EXPECT_LT(hwm_bytes - *before * 1024, 64 * kMiB)
        << "VmHWM before " << *before << " kB, after " << *hwm << " kB";
  } else {
    EXPECT_LT(hwm_bytes, 64 * kMiB) << "VmHWM " << *hwm << " kB after a 100 MiB upload";
  }
}

TEST_F(ProxyTest, SigtermLetsAnInFlightRequestFinishThenExitsZero) {
  StartGateway();
  std::optional<StatusOr<HttpResponse>> result;
  std::thread client(
      [&] { result.emplace(SendRequest(endpoint_, HttpRequest{.target = "/slow?ms=1500"}, 30s)); });
  // Wait until the request has reached the upstream, then ask the gateway to stop.
  const bool reached = PollUntil([&] { return Stats().executions >= 1; }, 10s, 20ms);
  EXPECT_TRUE(reached);
  EXPECT_TRUE(gateway_->process.Signal(SIGTERM).ok());
  client.join();
  ASSERT_TRUE(result.has_value());
  ASSERT_TRUE(result->ok()) << result->status().ToString();
  EXPECT_EQ((*result)->status, 200);
  EXPECT_EQ(ParseObject((*result)->body)["slept_ms"], 1500);
  auto status = gateway_->process.WaitExit(30s);
  ASSERT_TRUE(status.has_value()) << "idemgate still running 30s after SIGTERM";
  EXPECT_TRUE(status->exited) << status->ToString();
  EXPECT_EQ(status->code, 0);
}

class CliTest : public ::testing::Test {
 protected:
  // Runs idemgate with `args`; returns the exit status and everything it printed.
  std::pair<ExitStatus, std::string> Run(const std::vector<std::string>& args) {
    ProcessOptions options;
    options.stdout_path = dir_.Join("cli.out");
    options.stderr_path = dir_.Join("cli.err");
    auto p = Process::Start(IDEMGATE_BIN, args, options);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return {};
    auto status = p->WaitExit(30s);
    EXPECT_TRUE(status.has_value()) << "idemgate did not exit";
    const std::string output =
        ReadFileOrEmpty(dir_.Join("cli.out")) + ReadFileOrEmpty(dir_.Join("cli.err"));
    return {status.value_or(ExitStatus{}), output};
  }

  TempDir dir_;
};

TEST_F(CliTest, CheckConfigAcceptsAGoodFile) {
  auto path =
      WriteConfig(dir_, ConfigYaml(HostPort{"127.0.0.1", 9}, 10, GatewayOptions{}), "good.yaml");
  ASSERT_TRUE(path.ok());
  auto [status, output] = Run({"check-config", *path});
  EXPECT_TRUE(status.exited && status.code == 0) << status.ToString() << "\n" << output;
}

TEST_F(CliTest, CheckConfigNamesFileLineAndKeyOfAnError) {
  const std::string yaml =
      "listen: 127.0.0.1:0\n"
      "store: { kind: memory }\n"
      "bogus_key: 1\n"
      "upstreams:\n"
      "  app: { url: http://127.0.0.1:9 }\n"
      "routes:\n"
      "  - id: all\n"
      "    match: { path_prefix: / }\n"
      "    upstream: app\n";
  auto path = WriteConfig(dir_, yaml, "bad.yaml");
  ASSERT_TRUE(path.ok());
  auto [status, output] = Run({"check-config", *path});
  EXPECT_TRUE(status.exited && status.code == 1) << status.ToString() << "\n" << output;
  EXPECT_NE(output.find("bad.yaml:3:"), std::string::npos) << output;
  EXPECT_NE(output.find("bogus_key"), std::string::npos) << output;

  // A route naming an upstream that does not exist.
  const std::string dangling =
      "listen: 127.0.0.1:0\n"
      "upstreams:\n"
      "  app: { url: http://127.0.0.1:9 }\n"
      "routes:\n"
      "  - id: all\n"
      "    match: { path_prefix: / }\n"
      "    upstream: nowhere\n";
  path = WriteConfig(dir_, dangling, "dangling.yaml");
  ASSERT_TRUE(path.ok());
  std::tie(status, output) = Run({"check-config", *path});
  EXPECT_TRUE(status.exited && status.code == 1) << status.ToString() << "\n" << output;
  EXPECT_NE(output.find("dangling.yaml:"), std::string::npos) << output;
  EXPECT_NE(output.find("nowhere"), std::string::npos) << output;
}

// check-config reads the identity keys and secret files as a start would; a
// secret from an environment variable that is not set where it runs is only
// noted.
TEST_F(CliTest, CheckConfigReadsKeyAndSecretFilesAndNotesUnsetSecrets) {
  const std::string head =
      "listen: 127.0.0.1:0\n"
      "upstreams:\n"
      "  app: { url: http://127.0.0.1:9 }\n"
      "routes:\n"
      "  - id: all\n"
      "    match: { path_prefix: / }\n"
      "    upstream: app\n";
  auto missing_keys = WriteConfig(
      dir_, head + "identity: { mode: api_key, api_key: { keys_file: " + dir_.Join("none.yaml") + " } }\n", "keys.yaml");
  ASSERT_TRUE(missing_keys.ok());
  auto [status, output] = Run({"check-config", *missing_keys});
  EXPECT_TRUE(status.exited && status.code == 1) << status.ToString() << "\n" << output;
  EXPECT_NE(output.find("identity.api_key.keys_file"), std::string::npos) << output;

  ASSERT_TRUE(WriteFile(dir_.Join("short.secret"), "only-20-bytes-long..").ok());
  auto short_secret = WriteConfig(
      dir_, head + "identity: { mode: jwt, jwt: { algorithms: [HS256], secret_file: " + dir_.Join("short.secret") + " } }\n",
      "short.yaml");
  ASSERT_TRUE(short_secret.ok());
  std::tie(status, output) = Run({"check-config", *short_secret});
  EXPECT_TRUE(status.exited && status.code == 1) << status.ToString() << "\n" << output;
  EXPECT_NE(output.find("shorter than 32 bytes"), std::string::npos) << output;

  auto from_env = WriteConfig(
      dir_, head + "identity: { mode: jwt, jwt: { algorithms: [HS256], secret_env: CHECK_CONFIG_UNSET_SECRET } }\n",
      "env.yaml");
  ASSERT_TRUE(from_env.ok());
  std::tie(status, output) = Run({"check-config", *from_env});
  EXPECT_TRUE(status.exited && status.code == 0) << status.ToString() << "\n" << output;
  EXPECT_NE(output.find("note: the environment variable CHECK_CONFIG_UNSET_SECRET is not set here"), std::string::npos)
      << output;
}

TEST_F(CliTest, MissingConfigFileFailsToStart) {
  auto [status, output] = Run({"--config", dir_.Join("no-such-file.yaml")});
  EXPECT_TRUE(status.exited && status.code != 0) << status.ToString();
  EXPECT_NE(output.find("no-such-file.yaml"), std::string::npos) << output;
}

TEST_F(CliTest, VersionAndHelp) {
  auto [status, output] = Run({"--version"});
  EXPECT_TRUE(status.exited && status.code == 0) << status.ToString();
  EXPECT_NE(output.find(IDEMGATE_VERSION_STRING), std::string::npos) << output;
  std::tie(status, output) = Run({"--help"});
  EXPECT_TRUE(status.exited && status.code == 0) << status.ToString();
  EXPECT_NE(output.find("check-config"), std::string::npos) << output;
  // A stop whose grace ran out (requests cut, keys released) exits 0 as well:
  // the usage says so rather than promising 0 only for a clean stop.
  EXPECT_NE(output.find("Exit status: 0 after SIGTERM or SIGINT, whether or not every request\n"
                        "finished within shutdown_grace"),
            std::string::npos)
      << output;
  EXPECT_EQ(output.find("clean stop"), std::string::npos) << output;
}

}  // namespace
}  // namespace idemgate::testing
