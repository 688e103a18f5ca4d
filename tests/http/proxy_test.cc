// In-process tests of the proxy: http::Server + UpstreamPool + Forward in
// front of a tiny Beast upstream, both on port 0.
#include <gtest/gtest.h>

#include <atomic>
#include <boost/json.hpp>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <string>
#include <thread>

#include "harness.h"
#include "http/headers.h"
#include "http/tls.h"
#include "test_upstream.h"
#include "tls_test_upstream.h"

namespace idemgate::httptest {
namespace {

namespace json = boost::json;
using idemgate::testing::HttpClient;
using idemgate::testing::HttpRequest;
using idemgate::testing::HttpResponse;
using idemgate::testing::PollUntil;
using idemgate::testing::RawConnection;
using idemgate::testing::SendRequest;

constexpr std::uint64_t kMiB = 1024 * 1024;

void ExpectProblem(const HttpResponse& res, int status, const std::string& code) {
  SCOPED_TRACE(res.body);
  EXPECT_EQ(res.status, status);
  EXPECT_EQ(res.Header("Content-Type").value_or(""), "application/problem+json");
  boost::system::error_code ec;
  json::value v = json::parse(res.body, ec);
  ASSERT_FALSE(ec);
  ASSERT_TRUE(v.is_object());
  EXPECT_EQ(v.at("code").as_string(), code);
  EXPECT_EQ(v.at("type").as_string(), "urn:idemgate:problem:" + code);
  EXPECT_EQ(v.at("status").as_int64(), status);
}

// Reads from `conn` until `pred(received)` holds or the peer closes.
std::string ReadUntil(RawConnection& conn, const std::function<bool(const std::string&)>& pred,
                      std::chrono::milliseconds timeout = 10s) {
  std::string got;
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  while (!pred(got) && !conn.closed() && std::chrono::steady_clock::now() < give_up) {
    auto piece = conn.ReadSome(100ms);
    if (piece.ok()) got += *piece;
  }
  return got;
}

std::size_t BodyBytesAfterHead(const std::string& raw) {
  const std::size_t end = raw.find("\r\n\r\n");
  return end == std::string::npos ? 0 : raw.size() - end - 4;
}

// A watchdog tick longer than any test: no deadline fires and idle upstream
// connections are not swept, so what a test sees was found when a request
// took the connection.
http::ServerOptions RareTicks() {
  http::ServerOptions o = Harness::DefaultServerOptions();
  o.tick = std::chrono::hours(1);
  return o;
}

// ForwardRequest::on_complete runs once the upstream's response is whole and
// before its last bytes reach the client (the gateway frees a request's
// admission slot there), and not for a response that breaks off.
TEST(InProcessProxyTest, OnCompleteRunsBeforeTheClientHasTheWholeResponse) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  static std::atomic<int> calls{0};
  calls = 0;
  options.base.on_complete = [](void* arg) { static_cast<std::atomic<int>*>(arg)->fetch_add(1); };
  options.base.on_complete_arg = &calls;
  Harness h(options);
  for (int i = 1; i <= 3; ++i) {
    auto res = SendRequest(h.endpoint(), HttpRequest{.method = "POST", .target = "/echo/x", .body = "b"});
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(calls.load(), i);
  }
  // Streamed in two pieces, the second only once the gate opens: not before.
  RawConnection conn = *RawConnection::Connect(h.endpoint());
  ASSERT_TRUE(conn.Write("GET /gated?n=10&first=5 HTTP/1.1\r\nHost: x\r\n\r\n").ok());
  const std::string head = ReadUntil(conn, [](const std::string& got) { return BodyBytesAfterHead(got) >= 5; });
  ASSERT_EQ(BodyBytesAfterHead(head), 5u) << head;
  EXPECT_EQ(calls.load(), 3);
  upstream.OpenGate();
  const std::string rest = ReadUntil(conn, [&](const std::string& got) { return BodyBytesAfterHead(head + got) >= 10; });
  ASSERT_EQ(BodyBytesAfterHead(head + rest), 10u);
  EXPECT_EQ(calls.load(), 4);
  // A response cut short by the upstream.
  (void)SendRequest(h.endpoint(), HttpRequest{.target = "/die"});
  EXPECT_EQ(calls.load(), 4);
}

TEST(InProcessProxyTest, ForwardsWithHopByHopRemovedAndForwardingHeadersSet) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.target.base_path = "/base";
  Harness h(options);

  HttpRequest req{.method = "POST", .target = "/echo/a?x=1&y=%20"};
  req.headers = {{"Host", "api.example.test"},
                 {"X-Keep", "one"},
                 {"Connection", "keep-alive, X-Drop-Me"},
                 {"X-Drop-Me", "hop"},
                 {"Keep-Alive", "timeout=5"},
                 {"Proxy-Authorization", "Basic eA=="},
                 {"TE", "trailers"},
                 {"X-Keep", "two"},
                 {"X-Forwarded-For", "203.0.113.7"},
                 {"X-Forwarded-Proto", "https"},
                 {"traceparent", "not-a-valid-traceparent"},
                 {"tracestate", "vendor=1"}};
  req.body = "payload";
  auto res = SendRequest(h.endpoint(), req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "payload");

  const SeenRequest seen = upstream.last_echo();
  EXPECT_EQ(seen.method, "POST");
  EXPECT_EQ(seen.target, "/base/echo/a?x=1&y=%20");
  EXPECT_EQ(seen.Values("X-Keep"), (std::vector<std::string>{"one", "two"}));
  EXPECT_EQ(seen.Values("Host"), (std::vector<std::string>{"api.example.test"}));
  for (const char* gone : {"Connection", "X-Drop-Me", "Keep-Alive", "Proxy-Authorization", "TE", "tracestate"}) {
    EXPECT_TRUE(seen.Values(gone).empty()) << gone;
  }
  EXPECT_EQ(seen.Values("X-Forwarded-For"), (std::vector<std::string>{"203.0.113.7, 127.0.0.1"}));
  EXPECT_EQ(seen.Values("X-Forwarded-Proto"), (std::vector<std::string>{"http"}));
  EXPECT_EQ(seen.Values("X-Forwarded-Host"), (std::vector<std::string>{"api.example.test"}));
  const auto traceparent = seen.Values("traceparent");
  ASSERT_EQ(traceparent.size(), 1u);
  EXPECT_TRUE(http::IsValidTraceparent(traceparent[0])) << traceparent[0];
  EXPECT_EQ(seen.Values("Content-Length"), (std::vector<std::string>{"7"}));

  // Response side: hop-by-hop fields and the ones Connection names are gone,
  // repeated Set-Cookie lines kept in order.
  EXPECT_FALSE(res->HasHeader("X-Hop"));
  for (const auto& v : res->Headers("Keep-Alive")) EXPECT_EQ(v.find("77"), std::string::npos);
  EXPECT_EQ(res->Headers("Set-Cookie"), (std::vector<std::string>{"a=1; Path=/", "b=2; HttpOnly"}));
  EXPECT_EQ(res->Header("X-Upstream"), "yes");
}

// The client's own forwarding fields never reach the upstream: Forwarded
// (RFC 7239, read first by Spring's ForwardedHeaderFilter) and X-Real-IP
// would carry a forged host, scheme or address past the gateway's
// X-Forwarded-*, and so would the '_' spellings CGI-style upstreams (WSGI,
// Rack, PHP) read as the real fields. The client's address chain stays in
// X-Forwarded-For; other names with '_' pass.
TEST(InProcessProxyTest, ClientForwardedXRealIpAndUnderscoreSpellingsAreDropped) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  Harness h(options);
  HttpRequest req{.target = "/echo"};
  req.headers = {{"Host", "api.example.test"},
                 {"Forwarded", "for=198.51.100.9;host=evil.example;proto=https"},
                 {"forwarded", "for=198.51.100.10"},
                 {"X-Real-IP", "198.51.100.9"},
                 {"X_Real_IP", "198.51.100.9"},
                 {"x-real_ip", "198.51.100.9"},
                 {"X_Forwarded_For", "198.51.100.9"},
                 {"x_forwarded_host", "evil.example"},
                 {"X_FORWARDED_PROTO", "https"},
                 {"X-Forwarded_Host", "evil.example"},
                 {"X-Forwarded-For", "203.0.113.7"},
                 {"X_Custom_Field", "kept"}};
  auto res = SendRequest(h.endpoint(), req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200);
  const SeenRequest seen = upstream.last_echo();
  for (const auto& [name, value] : seen.headers) {
    std::string folded;
    for (char c : name) folded += c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    EXPECT_TRUE(folded != "forwarded" && folded != "x-real-ip") << name << ": " << value;
    if (folded.starts_with("x-forwarded-")) {
      EXPECT_EQ(name.find('_'), std::string::npos) << name << ": " << value;
    }
  }
  EXPECT_EQ(seen.Values("X-Forwarded-For"), (std::vector<std::string>{"203.0.113.7, 127.0.0.1"}));
  EXPECT_EQ(seen.Values("X-Forwarded-Host"), (std::vector<std::string>{"api.example.test"}));
  EXPECT_EQ(seen.Values("X-Forwarded-Proto"), (std::vector<std::string>{"http"}));
  EXPECT_EQ(seen.Values("X_Custom_Field"), (std::vector<std::string>{"kept"}));
}

// An absolute-form target names the host: its authority is the Host the
// upstream gets (and X-Forwarded-Host), whatever Host lines the client sent
// (RFC 9112 section 3.2.2); the path is forwarded in origin-form. A target
// with user information is refused.
TEST(InProcessProxyTest, AbsoluteFormTargetReplacesTheHostHeader) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  Harness h(options);
  auto conn = RawConnection::Connect(h.endpoint());
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(conn->Write("POST http://api.example.test:8443/echo/a?x=1 HTTP/1.1\r\nHost: other.example\r\n"
                          "Content-Length: 2\r\nConnection: close\r\n\r\nhi")
                  .ok());
  const std::string raw = conn->ReadUntilClosed(10s);
  ASSERT_TRUE(raw.starts_with("HTTP/1.1 200")) << raw;
  const SeenRequest seen = upstream.last_echo();
  EXPECT_EQ(seen.target, "/echo/a?x=1");
  EXPECT_EQ(seen.Values("Host"), (std::vector<std::string>{"api.example.test:8443"}));
  EXPECT_EQ(seen.Values("X-Forwarded-Host"), (std::vector<std::string>{"api.example.test:8443"}));

  auto userinfo = RawConnection::Connect(h.endpoint());
  ASSERT_TRUE(userinfo.ok());
  ASSERT_TRUE(userinfo->Write("GET http://user:pw@api.example.test/echo HTTP/1.1\r\nHost: api.example.test\r\n\r\n").ok());
  auto res = testing::ParseResponse(userinfo->ReadUntilClosed(10s));
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(res->status, 400);
}

// The upstream sees exactly one Host. An empty one (RFC 9112 section 3.2: a
// target without an authority) counts as none, so the upstream's own name
// replaces it instead of joining it, and no X-Forwarded-Host is made up;
// an HTTP/1.0 request without Host is treated alike.
TEST(InProcessProxyTest, EmptyHostIsReplacedByTheUpstreamsOwn) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  Harness h(options);
  const std::string own = "127.0.0.1:" + std::to_string(upstream.port());
  for (const char* request : {"GET /echo HTTP/1.1\r\nHost: \r\nConnection: close\r\n\r\n",
                              "GET /echo HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n",
                              "GET /echo HTTP/1.0\r\n\r\n"}) {
    SCOPED_TRACE(request);
    RawConnection conn = *RawConnection::Connect(h.endpoint());
    ASSERT_TRUE(conn.Write(request).ok());
    const std::string raw = conn.ReadUntilClosed(10s);
    ASSERT_TRUE(raw.starts_with("HTTP/1.1 200") || raw.starts_with("HTTP/1.0 200")) << raw;
    const SeenRequest seen = upstream.last_echo();
    EXPECT_EQ(seen.Values("Host"), (std::vector<std::string>{own}));
    EXPECT_TRUE(seen.Values("X-Forwarded-Host").empty());
  }
}

TEST(InProcessProxyTest, ValidTraceparentAndRequestIdPassUnchanged) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  Harness h(options);
  const std::string tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  HttpRequest req{.target = "/echo"};
  req.headers = {{"traceparent", tp}, {"tracestate", "v=1"}, {"X-Request-Id", "abc-123"}};
  auto res = SendRequest(h.endpoint(), req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  const SeenRequest seen = upstream.last_echo();
  EXPECT_EQ(seen.Values("traceparent"), (std::vector<std::string>{tp}));
  EXPECT_EQ(seen.Values("tracestate"), (std::vector<std::string>{"v=1"}));
  EXPECT_EQ(seen.Values("X-Request-Id"), (std::vector<std::string>{"abc-123"}));
  // No client Host on HTTP/1.0 would fall back to the upstream's; with one,
  // X-Forwarded-Host is the client's.
  EXPECT_EQ(seen.Values("X-Forwarded-Host").size(), 1u);

  // The gateway decided to pass them: a client's Connection naming them
  // does not take them from the upstream (the gateway logs that id).
  req.headers.push_back({"Connection", "traceparent, x-request-id, tracestate"});
  res = SendRequest(h.endpoint(), req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  const SeenRequest named = upstream.last_echo();
  EXPECT_EQ(named.Values("traceparent"), (std::vector<std::string>{tp}));
  EXPECT_EQ(named.Values("X-Request-Id"), (std::vector<std::string>{"abc-123"}));
  EXPECT_TRUE(named.Values("tracestate").empty());
}

TEST(InProcessProxyTest, ForwardRequestHeaderChangesApply) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.base.set_headers = {{"Idempotency-Key", "t-_:_:_:r:abc"}, {"X-Tenant-Id", "acme"}};
  options.base.remove_headers = {"X-Remove-Me"};
  options.base.request_id = "generated-id";
  static constexpr std::string_view kStrip[] = {"x-secret"};
  options.base.strip_response_headers = kStrip;
  options.base.add_response_headers = {{"X-Operation-Id", "op_1"}};
  Harness h(options);
  HttpRequest req{.method = "POST", .target = "/echo"};
  req.headers = {{"Idempotency-Key", "abc"}, {"X-Tenant-Id", "forged"}, {"X-Remove-Me", "x"}, {"X-Request-Id", "c"}};
  auto res = SendRequest(h.endpoint(), req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  const SeenRequest seen = upstream.last_echo();
  EXPECT_EQ(seen.Values("Idempotency-Key"), (std::vector<std::string>{"t-_:_:_:r:abc"}));
  EXPECT_EQ(seen.Values("X-Tenant-Id"), (std::vector<std::string>{"acme"}));
  EXPECT_TRUE(seen.Values("X-Remove-Me").empty());
  EXPECT_EQ(seen.Values("X-Request-Id"), (std::vector<std::string>{"generated-id"}));
  EXPECT_FALSE(res->HasHeader("X-Secret"));
  EXPECT_EQ(res->Header("X-Operation-Id"), "op_1");
}

TEST(InProcessProxyTest, StreamsALargeRequestBodyWithoutHoldingIt) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.body_limit = 64 * kMiB;
  Harness h(options);

  constexpr std::size_t kPiece = 1 * kMiB;
  constexpr std::size_t kPieces = 16;
  auto conn = RawConnection::Connect(h.endpoint());
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  ASSERT_TRUE(conn->Write("POST /sink HTTP/1.1\r\nHost: t\r\nContent-Length: " + std::to_string(kPiece * kPieces) +
                          "\r\n\r\n")
                  .ok());
  std::uint64_t hash = Fnv1a({});
  for (std::size_t i = 0; i < kPieces; ++i) {
    const std::string piece = Pattern(kPiece, i * 7);
    hash = Fnv1a(piece, hash);
    ASSERT_TRUE(conn->Write(piece).ok());
    // The upstream sees every byte sent so far before the client sends more:
    // the proxy forwards as it reads instead of collecting the body.
    const std::uint64_t sent = (i + 1) * kPiece;
    ASSERT_TRUE(PollUntil([&] { return upstream.sink_bytes() == sent; }, 10s))
        << "upstream has " << upstream.sink_bytes() << " of " << sent << " bytes";
  }
  const std::string raw = ReadUntil(*conn, [](const std::string& s) { return s.find("fnv=") != std::string::npos &&
                                                                             s.size() > s.find("fnv=") + 19; });
  auto res = testing::ParseResponse(raw);
  ASSERT_TRUE(res.ok()) << res.status().ToString() << raw;
  char expected[96];
  std::snprintf(expected, sizeof(expected), "bytes=%zu fnv=%016llx", kPiece * kPieces,
                static_cast<unsigned long long>(hash));
  EXPECT_EQ(res->body, expected);
}

TEST(InProcessProxyTest, StreamsAResponseAsItArrives) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  Harness h(options);
  constexpr std::size_t kTotal = 4 * kMiB;
  constexpr std::size_t kFirst = 1 * kMiB;
  auto conn = RawConnection::Connect(h.endpoint());
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(conn->Write("GET /gated?n=" + std::to_string(kTotal) + "&first=" + std::to_string(kFirst) +
                          " HTTP/1.1\r\nHost: t\r\n\r\n")
                  .ok());
  // The first part reaches the client while the upstream still holds the rest.
  std::string raw = ReadUntil(*conn, [&](const std::string& s) { return BodyBytesAfterHead(s) >= kFirst; });
  ASSERT_EQ(BodyBytesAfterHead(raw), kFirst);
  upstream.OpenGate();
  raw += ReadUntil(*conn, [&](const std::string& s) { return BodyBytesAfterHead(raw + s) >= kTotal; });
  auto res = testing::ParseResponse(raw);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body.size(), kTotal);
  EXPECT_TRUE(res->body == Pattern(kTotal));
}

TEST(InProcessProxyTest, ChunkedResponseIsRelayedByteForByte) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  Harness h(options);
  HttpClient client(h.endpoint());
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{70000}, std::size_t{3 * kMiB + 5}}) {
    auto res = client.Send(HttpRequest{.target = "/large?n=" + std::to_string(n)});
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(res->body.size(), n);
    EXPECT_TRUE(res->body == Pattern(n));
  }
  EXPECT_EQ(client.connections_opened(), 1);
}

TEST(InProcessProxyTest, CaptureHandsTheWholeResponseToTheObserver) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.capture = true;
  static constexpr std::string_view kStrip[] = {"X-Secret"};
  options.base.strip_response_headers = kStrip;
  Harness h(options);
  HttpRequest req{.method = "POST", .target = "/echo", .body = "captured body"};
  auto res = SendRequest(h.endpoint(), req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->body, "captured body");
  EXPECT_FALSE(res->HasHeader("X-Secret"));

  ASSERT_TRUE(h.handler().WaitForResults(1));
  const auto observers = h.handler().observers();
  ASSERT_EQ(observers.size(), 1u);
  const RecordingObserver& o = observers[0];
  EXPECT_EQ(o.on_response_calls, 1);
  EXPECT_EQ(o.on_finished_calls, 1);
  ASSERT_TRUE(o.captured.has_value());
  const core::StoredResponse& r = o.captured->response;
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "captured body");
  EXPECT_FALSE(r.body_omitted);
  std::vector<std::string> cookies;
  bool upstream_header = false;
  for (const auto& hdr : r.headers) {
    if (http::NameEquals(hdr.name, "Set-Cookie")) cookies.push_back(hdr.value);
    if (http::NameEquals(hdr.name, "X-Upstream")) upstream_header = hdr.value == "yes";
    EXPECT_FALSE(http::IsHopByHop(hdr.name)) << hdr.name;
    EXPECT_FALSE(http::NameEquals(hdr.name, "X-Secret"));
    EXPECT_FALSE(http::NameEquals(hdr.name, "X-Hop"));
  }
  EXPECT_EQ(cookies, (std::vector<std::string>{"a=1; Path=/", "b=2; HttpOnly"}));
  EXPECT_TRUE(upstream_header);
  ASSERT_EQ(o.captured->stripped.size(), 1u);
  EXPECT_EQ(o.captured->stripped[0].value, "s");
  ASSERT_TRUE(o.finished.has_value());
  EXPECT_EQ(o.finished->outcome, http::ForwardOutcome::kCompleted);
  EXPECT_TRUE(o.finished->captured);
  EXPECT_EQ(o.finished->upstream_status, 200);
}

TEST(InProcessProxyTest, CaptureOverTheCapOmitsTheBodyButStreamsItAll) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.capture = true;
  options.capture_cap = 1000;
  Harness h(options);
  constexpr std::size_t kBytes = 300000;
  auto res = SendRequest(h.endpoint(), HttpRequest{.target = "/large?n=" + std::to_string(kBytes)});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->body.size(), kBytes);
  EXPECT_TRUE(res->body == Pattern(kBytes));
  ASSERT_TRUE(h.handler().WaitForResults(1));
  const auto observers = h.handler().observers();
  ASSERT_EQ(observers.size(), 1u);
  ASSERT_TRUE(observers[0].captured.has_value());
  EXPECT_TRUE(observers[0].captured->response.body_omitted);
  EXPECT_TRUE(observers[0].captured->response.body.empty());
  EXPECT_EQ(observers[0].captured->response.status, 200);
}

TEST(InProcessProxyTest, BufferedBodyIsForwardedWithContentLength) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.read_body_first = true;
  Harness h(options);
  HttpRequest req{.method = "POST", .target = "/echo", .body = Pattern(200000)};
  req.headers = {{"Transfer-Encoding", "chunked"}};
  auto res = SendRequest(h.endpoint(), req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200);
  const SeenRequest seen = upstream.last_echo();
  EXPECT_TRUE(seen.body == Pattern(200000));
  EXPECT_EQ(seen.Values("Content-Length"), (std::vector<std::string>{"200000"}));
  EXPECT_TRUE(seen.Values("Transfer-Encoding").empty());
}

// A chunked body's trailer fields never reach the upstream as header
// fields: read before the upstream request is written (a buffered body),
// they would otherwise join the header section after every check had run,
// adding a second Host or an identity header.
TEST(InProcessProxyTest, TrailerFieldsOfAChunkedRequestAreDropped) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  for (const bool buffered : {true, false}) {
    SCOPED_TRACE(buffered ? "buffered body" : "streamed body");
    options.read_body_first = buffered;
    Harness h(options);
    auto conn = RawConnection::Connect(h.endpoint());
    ASSERT_TRUE(conn.ok());
    ASSERT_TRUE(conn->Write("POST /echo HTTP/1.1\r\nHost: good.example\r\nTransfer-Encoding: chunked\r\n"
                            "X-Tenant-Id: t1\r\n\r\n"
                            "5\r\nhello\r\n0\r\nHost: evil.example\r\nX-Tenant-Id: victim\r\n"
                            "X-Trailer-Only: 1\r\nConnection: close\r\n\r\n")
                    .ok());
    const std::string raw = ReadUntil(*conn, [](const std::string& s) { return s.ends_with("hello") || s.ends_with("0\r\n\r\n"); });
    EXPECT_TRUE(raw.starts_with("HTTP/1.1 200")) << raw;
    const SeenRequest seen = upstream.last_echo();
    EXPECT_EQ(seen.body, "hello");
    EXPECT_EQ(seen.Values("Host"), (std::vector<std::string>{"good.example"}));
    EXPECT_EQ(seen.Values("X-Forwarded-Host"), (std::vector<std::string>{"good.example"}));
    EXPECT_EQ(seen.Values("X-Tenant-Id"), (std::vector<std::string>{"t1"}));
    EXPECT_TRUE(seen.Values("X-Trailer-Only").empty());
    EXPECT_TRUE(seen.Values("Connection").empty());
    if (buffered) {
      EXPECT_EQ(seen.Values("Content-Length"), (std::vector<std::string>{"5"}));
    }
  }
}

// Beast bounds the header block but not a chunk-size line (with its
// extensions) or the trailer section: a client that never ends one must
// not grow the gateway's read buffer without end.
TEST(InProcessProxyTest, EndlessChunkFramingIs400NotUnboundedBuffering) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  for (const std::string& start : {std::string("5;ext="), std::string("5\r\nhello\r\n0\r\nX-Long: ")}) {
    for (const bool buffered : {true, false}) {
      SCOPED_TRACE(start + (buffered ? " buffered" : " streamed"));
      options.read_body_first = buffered;
      Harness h(options);
      auto conn = RawConnection::Connect(h.endpoint());
      ASSERT_TRUE(conn.ok());
      ASSERT_TRUE(conn->Write("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + start).ok());
      // 8 MiB without a line end: far past the 16 KiB limit; the gateway
      // answers and stops reading long before all of it is sent.
      const std::string piece(64 * 1024, 'a');
      for (int i = 0; i < 128; ++i) {
        if (!conn->Write(piece).ok()) break;
      }
      const std::string raw = conn->ReadUntilClosed(10s);
      EXPECT_TRUE(conn->closed());
      auto res = testing::ParseResponse(raw);
      ASSERT_TRUE(res.ok()) << raw.substr(0, 300);
      EXPECT_EQ(res->status, 400) << raw.substr(0, 300);
    }
  }
}

// A client that ends its side before a streamed body is whole gets 400
// (the body did not arrive), as the gateway answers when a buffered body
// falls short; not the server's fallback 500 for an unanswered request.
TEST(InProcessProxyTest, StreamedBodyCutShortByTheClientIs400) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  Harness h(options);
  for (const std::string& request :
       {std::string("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 13\r\n\r\n{10}"),
        std::string("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel")}) {
    SCOPED_TRACE(request);
    auto conn = RawConnection::Connect(h.endpoint());
    ASSERT_TRUE(conn.ok());
    ASSERT_TRUE(conn->Write(request).ok());
    conn->ShutdownWrite();
    const std::string raw = conn->ReadUntilClosed(10s);
    auto res = testing::ParseResponse(raw);
    ASSERT_TRUE(res.ok()) << raw;
    EXPECT_EQ(res->status, 400) << raw;
    EXPECT_NE(res->body.find("the request body did not arrive"), std::string::npos) << raw;
  }
  ASSERT_TRUE(h.handler().WaitForResults(2));
  for (const auto& result : h.handler().results()) EXPECT_EQ(result.outcome, http::ForwardOutcome::kClientGone);
}

TEST(InProcessProxyTest, ChunkedRequestBodyIsStreamedChunked) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  Harness h(options);
  HttpRequest req{.method = "POST", .target = "/echo", .body = Pattern(150000)};
  req.headers = {{"Transfer-Encoding", "chunked"}};
  auto res = SendRequest(h.endpoint(), req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200);
  const SeenRequest seen = upstream.last_echo();
  EXPECT_TRUE(seen.body == Pattern(150000));
  EXPECT_EQ(seen.Values("Transfer-Encoding"), (std::vector<std::string>{"chunked"}));
}

TEST(InProcessProxyTest, PooledConnectionIsReusedAcrossClientConnections) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  Harness h(options);
  for (int i = 0; i < 6; ++i) {
    auto res = SendRequest(h.endpoint(), HttpRequest{.method = "POST", .target = "/echo", .body = std::to_string(i)});
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_EQ(res->body, std::to_string(i));
  }
  EXPECT_EQ(upstream.requests(), 6);
  EXPECT_EQ(upstream.connections(), 1);
}

// /close answers as if the connection stayed open, then closes it: the pool
// holds a dead connection. The check before every reuse finds it closed, so
// the next request goes out once, on a fresh connection, without a retry.
// (The watchdog ticks too rarely here to find it first, while it is idle.)
TEST(InProcessProxyTest, StaleKeepAliveConnectionCostsNoError) {
  for (const char* method : {"POST", "GET"}) {
    SCOPED_TRACE(method);
    TestUpstream upstream;
    HandlerOptions options;
    options.target = TargetFor(upstream.port());
    Harness h(options, RareTicks());
    auto first = SendRequest(h.endpoint(), HttpRequest{.target = "/close"});
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    EXPECT_EQ(first->body, "closing");
    // The upstream closes right after its answer, but on a slow run (ASan)
    // the close can come after the next request went out: wait for it, so
    // the pooled connection is one an upstream already closed.
    ASSERT_TRUE(PollUntil([&] { return upstream.closed_after_answer() >= 1; }, 10s));
    auto second = SendRequest(h.endpoint(), HttpRequest{.method = method, .target = "/echo", .body = "once"});
    ASSERT_TRUE(second.ok()) << second.status().ToString();
    EXPECT_EQ(second->status, 200);
    EXPECT_EQ(second->body, "once");
    EXPECT_EQ(upstream.requests(), 2);
    EXPECT_EQ(upstream.connections(), 2);
    ASSERT_TRUE(h.handler().WaitForResults(2));
    EXPECT_FALSE(h.handler().results()[1].retried);
  }
}

// An upstream writes bytes on a keep-alive connection after a complete
// response (here a whole second response): they belong to no request. A
// request that would reuse the connection once they are there, however soon
// after the first response, must not take them as its answer: the pooled
// connection is checked before every reuse and dropped. (The watchdog ticks
// too rarely here to drop it first, while it is idle.)
TEST(InProcessProxyTest, BytesArrivingOnAnIdleConnectionAreNeverTakenAsAResponse) {
  for (const char* status : {"200", "204", "304"}) {
    for (const char* method : {"GET", "POST"}) {
      SCOPED_TRACE(std::string(status) + " " + method);
      TestUpstream upstream;
      HandlerOptions options;
      options.target = TargetFor(upstream.port());
      Harness h(options, RareTicks());
      auto first = SendRequest(h.endpoint(), HttpRequest{.target = std::string("/stray?status=") + status});
      ASSERT_TRUE(first.ok()) << first.status().ToString();
      EXPECT_EQ(first->status, std::stoi(status));
      upstream.OpenGate();
      ASSERT_TRUE(PollUntil([&] { return upstream.stray_written() >= 1; }, 10s));
      auto second = SendRequest(h.endpoint(), HttpRequest{.method = method, .target = "/echo", .body = "mine"});
      ASSERT_TRUE(second.ok()) << second.status().ToString();
      EXPECT_EQ(second->status, 200);
      EXPECT_EQ(second->body, "mine");
      EXPECT_EQ(second->Header("X-Upstream"), "yes");
      EXPECT_EQ(upstream.connections(), 2);
    }
  }
}

// An upstream closes an idle keep-alive connection (a FIN, as at the end of
// its own keep-alive timeout): the gateway closes its side too while the
// connection is still idle, instead of keeping it in CLOSE-WAIT until a
// request would take it; the next request goes out on a fresh connection.
TEST(InProcessProxyTest, IdleConnectionTheUpstreamClosedIsClosedWithoutARequest) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  Harness h(options);
  auto first = SendRequest(h.endpoint(), HttpRequest{.target = "/halfclose"});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->body, "ok");
  ASSERT_TRUE(h.handler().WaitForResults(1));  // the connection is back in the pool
  upstream.OpenGate();
  ASSERT_TRUE(PollUntil([&] { return upstream.half_closed() >= 1; }, 10s));
  EXPECT_TRUE(PollUntil([&] { return upstream.closed_between_requests() >= 1; }, 10s));
  auto second = SendRequest(h.endpoint(), HttpRequest{.method = "POST", .target = "/echo", .body = "fresh"});
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->status, 200);
  EXPECT_EQ(second->body, "fresh");
  EXPECT_EQ(upstream.requests(), 2);
  EXPECT_EQ(upstream.connections(), 2);
  ASSERT_TRUE(h.handler().WaitForResults(2));
  EXPECT_FALSE(h.handler().results()[1].retried);
}

// Bytes an upstream writes on an idle connection get the connection dropped
// while it is idle, not only when a request would take it; the next request
// gets its own response on a fresh connection.
TEST(InProcessProxyTest, IdleConnectionWithBytesNobodyAskedForIsDroppedWithoutARequest) {
  for (const char* status : {"200", "204"}) {
    SCOPED_TRACE(status);
    TestUpstream upstream;
    HandlerOptions options;
    options.target = TargetFor(upstream.port());
    Harness h(options);
    auto first = SendRequest(h.endpoint(), HttpRequest{.target = std::string("/stray?status=") + status});
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    EXPECT_EQ(first->status, std::stoi(status));
    ASSERT_TRUE(h.handler().WaitForResults(1));
    upstream.OpenGate();
    ASSERT_TRUE(PollUntil([&] { return upstream.stray_written() >= 1; }, 10s));
    EXPECT_TRUE(PollUntil([&] { return upstream.closed_between_requests() >= 1; }, 10s));
    auto second = SendRequest(h.endpoint(), HttpRequest{.method = "POST", .target = "/echo", .body = "mine"});
    ASSERT_TRUE(second.ok()) << second.status().ToString();
    EXPECT_EQ(second->status, 200);
    EXPECT_EQ(second->body, "mine");
    EXPECT_EQ(second->Header("X-Upstream"), "yes");
    EXPECT_EQ(upstream.connections(), 2);
  }
}

// An idle connection past the upstream target's idle_timeout is closed
// while idle, not kept open until a request comes.
TEST(InProcessProxyTest, IdleConnectionPastTheIdleTimeoutIsClosedWithoutARequest) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.target.idle_timeout = 50ms;
  Harness h(options);
  auto first = SendRequest(h.endpoint(), HttpRequest{.method = "POST", .target = "/echo", .body = "one"});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->body, "one");
  EXPECT_TRUE(PollUntil([&] { return upstream.closed_between_requests() >= 1; }, 10s));
  auto second = SendRequest(h.endpoint(), HttpRequest{.method = "POST", .target = "/echo", .body = "two"});
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->body, "two");
  EXPECT_EQ(upstream.connections(), 2);
}

// An upstream that answers HEAD with its GET handler writes the body after
// the head, often in a later send, so it may arrive after the next request
// took the connection: the body, which a client can choose (an upload that
// looks like an HTTP response), would then be the next client's response.
// A connection is therefore never reused after a HEAD, nor after a 204 that
// announces content it must not have, nor after a 304 with a length (a GET
// handler's). Here the bytes come only once the next request is already on
// its way.
TEST(InProcessProxyTest, NoConnectionIsReusedAfterAHeadOrA204Or304AnnouncingContent) {
  for (const char* first_request :
       {"HEAD /stray", "GET /stray?status=204&announce=1", "GET /stray?status=304&announce=1"}) {
    SCOPED_TRACE(first_request);
    TestUpstream upstream;
    HandlerOptions options;
    options.target = TargetFor(upstream.port());
    Harness h(options);
    RawConnection conn = *RawConnection::Connect(h.endpoint());
    ASSERT_TRUE(conn.Write(std::string(first_request) + " HTTP/1.1\r\nHost: t\r\n\r\n").ok());
    const std::string head = ReadUntil(conn, [](const std::string& got) { return got.find("\r\n\r\n") != got.npos; });
    const std::string_view first(first_request);
    ASSERT_TRUE(head.starts_with(first.starts_with("HEAD")                ? "HTTP/1.1 200"
                                 : first.find("204") != first.npos ? "HTTP/1.1 204"
                                                                   : "HTTP/1.1 304"))
        << head;
    ASSERT_TRUE(h.handler().WaitForResults(1));
    ASSERT_TRUE(conn.Write("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nmine").ok());
    upstream.OpenGate();
    const std::string rest = ReadUntil(conn, [](const std::string& got) { return got.ends_with("mine"); });
    EXPECT_TRUE(rest.starts_with("HTTP/1.1 200")) << rest;
    EXPECT_NE(rest.find("X-Upstream: yes"), std::string::npos) << rest;
    EXPECT_EQ(rest.find("stray"), std::string::npos) << rest;
    EXPECT_EQ(upstream.connections(), 2);
  }
}

// An upstream that took a request on a reused connection and went away
// without a byte of answer may have acted on it: a POST or PATCH is then
// answered 502 and never sent again (the client decides, under its key),
// while an idempotent method is sent once more on a fresh connection —
// unless it holds a reservation (an observer records its response): a keyed
// request runs at most once whatever its method.
TEST(InProcessProxyTest, RequestLostAfterItWasSentIsSentAgainOnlyWhenIdempotentAndUnkeyed) {
  for (const bool keyed : {false, true}) {
  for (const char* method : {"POST", "PATCH", "GET", "PUT", "DELETE"}) {
    SCOPED_TRACE(std::string(method) + (keyed ? " keyed" : ""));
    TestUpstream upstream;
    HandlerOptions options;
    options.target = TargetFor(upstream.port());
    options.capture = keyed;
    Harness h(options);
    auto warm = SendRequest(h.endpoint(), HttpRequest{.target = "/echo"});  // leaves one pooled connection
    ASSERT_TRUE(warm.ok()) << warm.status().ToString();
    ASSERT_EQ(upstream.connections(), 1);
    auto res = SendRequest(h.endpoint(), HttpRequest{.method = method, .target = "/vanish", .body = "x"});
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    ExpectProblem(*res, 502, "upstream-unavailable");
    const bool again = !keyed && std::string_view(method) != "POST" && std::string_view(method) != "PATCH";
    // The warm-up, then /vanish once, or twice when sent again.
    EXPECT_EQ(upstream.requests(), again ? 3 : 2);
    EXPECT_EQ(upstream.connections(), again ? 2 : 1);
  }
  }
}

// An upstream that reads a method override header runs the request as the
// method it names, one that does not as sent: sent again only when both are
// idempotent.
TEST(InProcessProxyTest, RequestLostAfterItWasSentIsNotSentAgainWhenAnOverrideNamesANonIdempotentMethod) {
  for (const auto& [method, override_to] :
       {std::pair{"GET", "POST"}, std::pair{"PUT", "PATCH"}, std::pair{"POST", "GET"}}) {
    SCOPED_TRACE(std::string(method) + " as " + override_to);
    TestUpstream upstream;
    HandlerOptions options;
    options.target = TargetFor(upstream.port());
    options.capture = true;
    Harness h(options);
    auto warm = SendRequest(h.endpoint(), HttpRequest{.target = "/echo"});  // leaves one pooled connection
    ASSERT_TRUE(warm.ok()) << warm.status().ToString();
    ASSERT_EQ(upstream.connections(), 1);
    auto res = SendRequest(h.endpoint(), HttpRequest{.method = method,
                                                     .target = "/vanish",
                                                     .headers = {{"X-HTTP-Method-Override", override_to}},
                                                     .body = "x"});
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    ExpectProblem(*res, 502, "upstream-unavailable");
    EXPECT_EQ(upstream.requests(), 2);
    EXPECT_EQ(upstream.connections(), 1);
  }
}

TEST(InProcessProxyTest, ConnectRefusedIs502) {
  auto refused = testing::RefusedPort::Make();
  ASSERT_TRUE(refused.ok());
  HandlerOptions options;
  options.target = TargetFor(refused->port());
  options.capture = true;
  Harness h(options);
  auto res = SendRequest(h.endpoint(), HttpRequest{.method = "POST", .target = "/x", .body = "b"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ExpectProblem(*res, 502, "upstream-unavailable");
  // The client learns the upstream's name and why, not its address.
  EXPECT_NE(res->body.find("cannot connect to upstream test"), std::string::npos) << res->body;
  EXPECT_EQ(res->body.find("127.0.0.1"), std::string::npos) << res->body;
  ASSERT_TRUE(h.handler().WaitForResults(1));
  const auto observers = h.handler().observers();
  ASSERT_EQ(observers.size(), 1u);
  EXPECT_EQ(observers[0].on_response_calls, 0);
  ASSERT_TRUE(observers[0].finished.has_value());
  EXPECT_EQ(observers[0].finished->outcome, http::ForwardOutcome::kConnectFailed);
  EXPECT_EQ(observers[0].finished->status, 502);
  // Regression: the observer (the idempotency engine) learnt that no response
  // would come only after the 502 was written, so a client retrying at once
  // could find its key still reserved. It is told before anything is sent.
  EXPECT_EQ(observers[0].on_no_response_calls, 1);
  ASSERT_TRUE(observers[0].no_response.has_value());
  EXPECT_EQ(observers[0].no_response->outcome, http::ForwardOutcome::kConnectFailed);
  EXPECT_FALSE(observers[0].answered_before_no_response);
  // The client connection survives a gateway-made error.
  EXPECT_TRUE(res->keep_alive);
}

// With every connection of the worker's pool busy, the next request waits
// for one, and is woken as soon as one comes back: the connect timeout here
// (60 s) is far beyond the client's (15 s), so a request left to sleep until
// it ran out would fail the client.
TEST(InProcessProxyTest, FullPoolHandsAReturnedConnectionToTheWaitingRequest) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.target.max_connections = 1;
  options.target.connect_timeout = 60s;
  Harness h(options);
  RawConnection holder = *RawConnection::Connect(h.endpoint());
  ASSERT_TRUE(holder.Write("GET /gated?n=10&first=5 HTTP/1.1\r\nHost: x\r\n\r\n").ok());
  const std::string head = ReadUntil(holder, [](const std::string& got) { return BodyBytesAfterHead(got) >= 5; });
  ASSERT_EQ(BodyBytesAfterHead(head), 5u) << head;

  StatusOr<HttpResponse> waiting = Status(StatusCode::kInternal, "not sent");
  std::thread client([&] {
    waiting = SendRequest(h.endpoint(), HttpRequest{.method = "POST", .target = "/echo/x", .body = "queued"}, 15s);
  });
  // The queued request has reached the gateway (its connection is open)
  // while the only upstream connection is still held.
  ASSERT_TRUE(PollUntil([&] { return h.server().open_connections() >= 2; }, 10s));
  EXPECT_EQ(upstream.requests(), 1);
  upstream.OpenGate();
  client.join();
  ASSERT_TRUE(waiting.ok()) << waiting.status().ToString();
  EXPECT_EQ(waiting->status, 200);
  EXPECT_EQ(waiting->body, "queued");
  EXPECT_EQ(upstream.requests(), 2);
  EXPECT_EQ(upstream.connections(), 1);  // the returned connection, not a new one
  const std::string rest = ReadUntil(holder, [&](const std::string& got) { return BodyBytesAfterHead(head + got) >= 10; });
  EXPECT_EQ(BodyBytesAfterHead(head + rest), 10u);
}

// A request that finds the pool busy for longer than the connect timeout is
// answered 502 without a connection beyond the limit.
TEST(InProcessProxyTest, PoolBusyPastTheConnectTimeoutIs502) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.target.max_connections = 1;
  options.target.connect_timeout = 300ms;
  options.capture = true;
  Harness h(options);
  RawConnection holder = *RawConnection::Connect(h.endpoint());
  ASSERT_TRUE(holder.Write("GET /gated?n=10&first=5 HTTP/1.1\r\nHost: x\r\n\r\n").ok());
  const std::string head = ReadUntil(holder, [](const std::string& got) { return BodyBytesAfterHead(got) >= 5; });
  ASSERT_EQ(BodyBytesAfterHead(head), 5u) << head;

  auto res = SendRequest(h.endpoint(), HttpRequest{.method = "POST", .target = "/echo/x", .body = "b"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ExpectProblem(*res, 502, "upstream-unavailable");
  EXPECT_NE(res->body.find("connections of this worker are busy"), std::string::npos) << res->body;
  EXPECT_EQ(upstream.connections(), 1);
  EXPECT_EQ(upstream.requests(), 1);
  upstream.OpenGate();
  const std::string rest = ReadUntil(holder, [&](const std::string& got) { return BodyBytesAfterHead(head + got) >= 10; });
  EXPECT_EQ(BodyBytesAfterHead(head + rest), 10u);
  ASSERT_TRUE(h.handler().WaitForResults(2));
  const auto observers = h.handler().observers();
  ASSERT_EQ(observers.size(), 2u);
  ASSERT_TRUE(observers[0].finished.has_value());
  EXPECT_EQ(observers[0].finished->outcome, http::ForwardOutcome::kConnectFailed);
}

// With a finish_by (a keyed request's lease) the wait for a free pooled
// connection ends once the upstream timeout no longer fits before it, well
// within connect_timeout: the request is answered 502 without being sent,
// since sent later its exchange could outlive the lease.
TEST(InProcessProxyTest, PoolBusyUntilTheTimeoutNoLongerFitsBeforeFinishByIs502) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.target.max_connections = 1;
  options.target.connect_timeout = 30s;
  options.target.timeout = 1s;
  options.capture = true;
  options.base.finish_by = std::chrono::steady_clock::now() + 1300ms;  // sent by 300 ms from now, or not at all
  Harness h(options);
  RawConnection holder = *RawConnection::Connect(h.endpoint());
  ASSERT_TRUE(holder.Write("GET /gated?n=10&first=5 HTTP/1.1\r\nHost: x\r\n\r\n").ok());
  const std::string head = ReadUntil(holder, [](const std::string& got) { return BodyBytesAfterHead(got) >= 5; });
  ASSERT_EQ(BodyBytesAfterHead(head), 5u) << head;

  auto res = SendRequest(h.endpoint(), HttpRequest{.method = "POST", .target = "/echo/x", .body = "b"}, 20s);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ExpectProblem(*res, 502, "upstream-unavailable");
  EXPECT_NE(res->body.find("inside its lease"), std::string::npos) << res->body;
  EXPECT_EQ(upstream.requests(), 1);
  upstream.OpenGate();
  ReadUntil(holder, [&](const std::string& got) { return BodyBytesAfterHead(head + got) >= 10; });
  ASSERT_TRUE(h.handler().WaitForResults(2));
  const auto observers = h.handler().observers();
  ASSERT_EQ(observers.size(), 2u);
  ASSERT_TRUE(observers[0].finished.has_value());
  EXPECT_EQ(observers[0].finished->outcome, http::ForwardOutcome::kConnectFailed);
}

TEST(InProcessProxyTest, SlowUpstreamIs504) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.target.timeout = 200ms;
  Harness h(options);
  auto res = SendRequest(h.endpoint(), HttpRequest{.target = "/slow"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ExpectProblem(*res, 504, "upstream-timeout");
  ASSERT_TRUE(h.handler().WaitForResults(1));
  const auto results = h.handler().results();
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].outcome, http::ForwardOutcome::kTimedOut);
}

// A reset that arrives right behind the last bytes an upstream sent (the
// kernel's queue-length hint counts a FIN but not a reset, and no further
// epoll edge comes) is seen at once, not after the upstream timeout.
TEST(InProcessProxyTest, AnUpstreamResetRightBehindItsBytesIsSeenAtOnce) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.target.timeout = 4s;
  options.capture = true;
  Harness h(options);
  constexpr int kRounds = 6;
  for (int i = 0; i < kRounds; ++i) {
    const std::string target = i % 2 == 0 ? "/reset?at=head" : "/reset?at=body";
    auto conn = RawConnection::Connect(h.endpoint());
    ASSERT_TRUE(conn.ok());
    ASSERT_TRUE(conn->Write("GET " + target + " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").ok());
    (void)conn->ReadUntilClosed(10s);
  }
  ASSERT_TRUE(h.handler().WaitForResults(kRounds));
  for (const auto& r : h.handler().results()) {
    EXPECT_EQ(r.outcome, http::ForwardOutcome::kUpstreamFailed) << http::ForwardOutcomeName(r.outcome);
  }
}

TEST(InProcessProxyTest, UpstreamDyingMidResponseCutsTheClientConnection) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.capture = true;
  Harness h(options);
  auto conn = RawConnection::Connect(h.endpoint());
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(conn->Write("GET /die HTTP/1.1\r\nHost: t\r\n\r\n").ok());
  const std::string raw = conn->ReadUntilClosed(10s);
  EXPECT_TRUE(conn->closed());
  // Either a 502 made before anything was sent, or a response cut short:
  // never a complete 1000-byte body.
  if (raw.starts_with("HTTP/1.1 502")) {
    SUCCEED();
  } else {
    EXPECT_TRUE(raw.starts_with("HTTP/1.1 200")) << raw;
    EXPECT_LT(BodyBytesAfterHead(raw), 1000u);
  }
  ASSERT_TRUE(h.handler().WaitForResults(1));
  const auto observers = h.handler().observers();
  ASSERT_EQ(observers.size(), 1u);
  // The upstream sent its status line: it ran the request. The observer is
  // told the status and headers, the body marked omitted, so that a final
  // status is stored rather than the key released for a second run.
  EXPECT_EQ(observers[0].on_response_calls, 1);
  ASSERT_TRUE(observers[0].captured.has_value());
  EXPECT_EQ(observers[0].captured->response.status, 200);
  EXPECT_TRUE(observers[0].captured->response.body_omitted);
  EXPECT_TRUE(observers[0].captured->response.body.empty());
  ASSERT_TRUE(observers[0].finished.has_value());
  EXPECT_EQ(observers[0].finished->outcome, http::ForwardOutcome::kUpstreamFailed);
}

// A client that reads a large response slowly holds the upstream back (the
// proxy reads it only as fast as the client takes it): that time is not the
// upstream's, so the upstream timeout (1 s here) does not cut a response
// whose client paused for two and a half.
TEST(InProcessProxyTest, ASlowClientDoesNotSpendTheUpstreamTimeout) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.target.timeout = 1s;
  options.capture = true;
  Harness h(options);
  constexpr std::size_t kBytes = 48 * 1024 * 1024;  // far beyond the socket buffers in between
  RawConnection conn = *RawConnection::Connect(h.endpoint());
  ASSERT_TRUE(conn.Write("GET /large?n=" + std::to_string(kBytes) + " HTTP/1.1\r\nHost: t\r\n\r\n").ok());
  std::this_thread::sleep_for(2500ms);
  const std::string raw = ReadUntil(conn, [](const std::string& got) { return got.ends_with("\r\n0\r\n\r\n"); }, 60s);
  EXPECT_TRUE(raw.ends_with("\r\n0\r\n\r\n")) << raw.size() << " bytes";
  ASSERT_TRUE(h.handler().WaitForResults(1));
  const auto results = h.handler().results();
  EXPECT_EQ(results[0].outcome, http::ForwardOutcome::kCompleted);
  EXPECT_EQ(results[0].response_body_bytes, kBytes);
}

// ForwardRequest::finish_by (a keyed request's lease) bounds the exchange
// however the time is spent: a response past the read-ahead (the capture
// limit) waits for the slow client, which is cut there, and the observer
// still learns the status (the request ran).
TEST(InProcessProxyTest, FinishByCutsAnExchangeThatWouldOutliveIt) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.target.timeout = 300ms;  // the request is sent only while its timeout fits before finish_by
  options.capture = true;
  options.base.finish_by = std::chrono::steady_clock::now() + 700ms;
  Harness h(options);
  RawConnection conn = *RawConnection::Connect(h.endpoint());
  ASSERT_TRUE(conn.Write("GET /large?n=" + std::to_string(48 * 1024 * 1024) + " HTTP/1.1\r\nHost: t\r\n\r\n").ok());
  std::this_thread::sleep_for(1500ms);
  const std::string raw = ReadUntil(conn, [](const std::string&) { return false; }, 30s);
  EXPECT_TRUE(conn.closed());
  EXPECT_FALSE(raw.ends_with("\r\n0\r\n\r\n"));
  ASSERT_TRUE(h.handler().WaitForResults(1));
  const auto observers = h.handler().observers();
  ASSERT_EQ(observers.size(), 1u);
  EXPECT_EQ(observers[0].on_response_calls, 1);
  ASSERT_TRUE(observers[0].captured.has_value());
  EXPECT_EQ(observers[0].captured->response.status, 200);
  EXPECT_TRUE(observers[0].captured->response.body_omitted);
  ASSERT_TRUE(observers[0].finished.has_value());
  EXPECT_EQ(observers[0].finished->outcome, http::ForwardOutcome::kClientGone);
}

// A response that fits the capture is read ahead of a slow client: the
// relay keeps reading the upstream while the client's socket is full, so the
// observer records the whole response at the upstream's pace, and the client
// that paused past finish_by (the lease) still gets all of it afterwards.
TEST(InProcessProxyTest, AResponseThatFitsTheCaptureIsReadAheadOfASlowClient) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.capture = true;
  constexpr std::size_t kBytes = 16 * 1024 * 1024;  // beyond the socket buffers in between (about 4 MiB here)
  options.capture_cap = 32 * 1024 * 1024;
  options.target.timeout = 1s;  // the request is sent only while its timeout fits before finish_by
  options.base.finish_by = std::chrono::steady_clock::now() + 1500ms;
  Harness h(options);
  RawConnection conn = *RawConnection::Connect(h.endpoint());
  ASSERT_TRUE(conn.Write("GET /large?n=" + std::to_string(kBytes) + " HTTP/1.1\r\nHost: t\r\n\r\n").ok());
  std::this_thread::sleep_for(2500ms);
  const std::string raw = ReadUntil(conn, [](const std::string& got) { return got.ends_with("\r\n0\r\n\r\n"); }, 60s);
  EXPECT_TRUE(raw.ends_with("\r\n0\r\n\r\n")) << raw.size() << " bytes";
  EXPECT_FALSE(conn.closed());
  ASSERT_TRUE(h.handler().WaitForResults(1));
  const auto observers = h.handler().observers();
  ASSERT_EQ(observers.size(), 1u);
  ASSERT_TRUE(observers[0].captured.has_value());
  EXPECT_FALSE(observers[0].captured->response.body_omitted);
  EXPECT_EQ(observers[0].captured->response.body.size(), kBytes);
  ASSERT_TRUE(observers[0].finished.has_value());
  EXPECT_EQ(observers[0].finished->outcome, http::ForwardOutcome::kCompleted);
  EXPECT_EQ(observers[0].finished->response_body_bytes, kBytes);
}

// Without an observer the read-ahead (ForwardRequest::read_ahead_bytes)
// frees the upstream connection from a client that does not read: the only
// connection of the pool serves the next request instead of leaving it 502.
TEST(InProcessProxyTest, ReadAheadHandsTheUpstreamConnectionBackBeforeASlowClientReads) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.target.max_connections = 1;
  options.target.connect_timeout = 300ms;
  constexpr std::size_t kBytes = 16 * 1024 * 1024;
  options.base.read_ahead_bytes = 32 * 1024 * 1024;
  Harness h(options);
  RawConnection holder = *RawConnection::Connect(h.endpoint());
  ASSERT_TRUE(holder.Write("GET /large?n=" + std::to_string(kBytes) + " HTTP/1.1\r\nHost: t\r\n\r\n").ok());
  std::this_thread::sleep_for(500ms);
  auto res = SendRequest(h.endpoint(), HttpRequest{.method = "POST", .target = "/echo/x", .body = "b"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(upstream.connections(), 1);
  const std::string raw = ReadUntil(holder, [](const std::string& got) { return got.ends_with("\r\n0\r\n\r\n"); }, 60s);
  EXPECT_TRUE(raw.ends_with("\r\n0\r\n\r\n")) << raw.size() << " bytes";
}

// A client that reset its connection before the answer: the response finds
// the connection gone, so the exchange reports no status sent (the log says
// null), while the observer still has the upstream's response.
TEST(InProcessProxyTest, AClientThatResetBeforeItsAnswerWasSentNone) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.capture = true;
  Harness h(options);
  RawConnection conn = *RawConnection::Connect(h.endpoint());
  ASSERT_TRUE(conn.Write("GET /late?ms=300 HTTP/1.1\r\nHost: t\r\n\r\n").ok());
  std::this_thread::sleep_for(100ms);  // the request is with the upstream
  conn.Reset();
  ASSERT_TRUE(h.handler().WaitForResults(1));
  const auto observers = h.handler().observers();
  ASSERT_EQ(observers.size(), 1u);
  ASSERT_TRUE(observers[0].captured.has_value());
  EXPECT_EQ(observers[0].captured->response.status, 201);
  ASSERT_TRUE(observers[0].finished.has_value());
  EXPECT_EQ(observers[0].finished->outcome, http::ForwardOutcome::kClientGone);
  EXPECT_EQ(observers[0].finished->status, 0);
  EXPECT_EQ(observers[0].finished->upstream_status, 201);
}

// The upstream's last bytes and its FIN usually arrive together: the
// receive that takes the bytes must not leave the end of the stream unseen
// (the proxy would then wait for the upstream timeout).
TEST(InProcessProxyTest, ResponseEndingWithTheUpstreamConnectionIsRelayedWhole) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.target.timeout = 30s;
  Harness h(options);
  for (int i = 0; i < 5; ++i) {
    auto conn = RawConnection::Connect(h.endpoint());
    ASSERT_TRUE(conn.ok());
    ASSERT_TRUE(conn->Write("GET /eof HTTP/1.1\r\nHost: t\r\n\r\n").ok());
    const auto start = std::chrono::steady_clock::now();
    std::string raw;
    while (raw.find("the body ends where the connection does") == std::string::npos) {
      auto some = conn->ReadSome(10s);
      ASSERT_TRUE(some.ok()) << some.status().ToString() << " after: " << raw;
      ASSERT_FALSE(some->empty()) << "closed early: " << raw;
      raw += *some;
    }
    EXPECT_TRUE(raw.starts_with("HTTP/1.1 200")) << raw;
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  }
}

TEST(InProcessProxyTest, BodyOverTheLimitIs413) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.body_limit = 1000;
  Harness h(options);
  auto res = SendRequest(h.endpoint(), HttpRequest{.method = "POST", .target = "/echo", .body = std::string(2000, 'x')});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 413);
  HttpRequest chunked{.method = "POST", .target = "/echo", .body = std::string(5000, 'y')};
  chunked.headers = {{"Transfer-Encoding", "chunked"}};
  res = SendRequest(h.endpoint(), chunked);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ExpectProblem(*res, 413, "request-too-large");
  EXPECT_EQ(upstream.requests(), 0);
}

TEST(InProcessProxyTest, ExpectContinueIsAnsweredByTheProxy) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  Harness h(options);
  auto conn = RawConnection::Connect(h.endpoint());
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(
      conn->Write("POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n").ok());
  const std::string interim = ReadUntil(*conn, [](const std::string& s) { return s.find("\r\n\r\n") != s.npos; });
  EXPECT_TRUE(interim.starts_with("HTTP/1.1 100 Continue\r\n\r\n")) << interim;
  ASSERT_TRUE(conn->Write("hello").ok());
  const std::string raw = ReadUntil(*conn, [](const std::string& s) { return s.ends_with("hello"); });
  EXPECT_NE(raw.find("200 OK"), std::string::npos) << raw;
  EXPECT_TRUE(upstream.last_echo().Values("Expect").empty());
}

TEST(InProcessProxyTest, HeadResponseCarriesNoBodyFraming) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  Harness h(options);
  auto conn = RawConnection::Connect(h.endpoint());
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(conn->Write("HEAD /large?n=100 HTTP/1.1\r\nHost: t\r\n\r\n").ok());
  std::string raw = ReadUntil(*conn, [](const std::string& s) { return s.find("\r\n\r\n") != s.npos; });
  ASSERT_TRUE(raw.starts_with("HTTP/1.1 200")) << raw;
  // The same connection carries the next exchange, with nothing in between.
  ASSERT_TRUE(conn->Write("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nnext").ok());
  raw += ReadUntil(*conn, [](const std::string& s) { return s.ends_with("next"); });
  const std::size_t first_end = raw.find("\r\n\r\n") + 4;
  EXPECT_TRUE(raw.substr(first_end).starts_with("HTTP/1.1 200")) << raw;
  EXPECT_TRUE(raw.ends_with("next")) << raw;
}

// The upstream's Content-Length lines are not copied as they came: the
// parser accepts forms that clients refuse or read differently (Node's
// client rejects two lines). The client gets one canonical Content-Length,
// and none on a 204; a HEAD or 304 response keeps the length a GET would
// have had.
TEST(InProcessProxyTest, ContentLengthReachesTheClientOnceAndCanonical) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  Harness h(options);
  struct Case {
    std::string request_line;
    std::string status_line;
    std::vector<std::string> lengths;  // the Content-Length lines the client gets
    std::string body;
  };
  const Case cases[] = {
      {"GET /canned/two-lengths", "HTTP/1.1 200 OK", {"5"}, "hello"},
      {"GET /canned/length-list", "HTTP/1.1 200 OK", {"5"}, "hello"},
      {"GET /canned/length-zeros", "HTTP/1.1 200 OK", {"5"}, "hello"},
      {"HEAD /canned/length-list", "HTTP/1.1 200 OK", {"5"}, ""},
      {"GET /canned/204-length", "HTTP/1.1 204 No Content", {}, ""},
      {"GET /canned/304-length", "HTTP/1.1 304 Not Modified", {"7"}, ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.request_line);
    RawConnection conn = *RawConnection::Connect(h.endpoint());
    ASSERT_TRUE(conn.Write(c.request_line + " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").ok());
    const std::string raw = conn.ReadUntilClosed(10s);
    const std::size_t end = raw.find("\r\n\r\n");
    ASSERT_NE(end, std::string::npos) << raw;
    EXPECT_TRUE(raw.starts_with(c.status_line + "\r\n")) << raw;
    std::vector<std::string> lengths;
    for (std::size_t at = raw.find("\r\nContent-Length: "); at < end; at = raw.find("\r\nContent-Length: ", at + 2)) {
      const std::size_t value = at + 18;
      lengths.push_back(raw.substr(value, raw.find("\r\n", value) - value));
    }
    EXPECT_EQ(lengths, c.lengths) << raw;
    EXPECT_EQ(raw.substr(end + 4), c.body);
  }
}

// RFC 9110 section 15.2: interim responses the gateway did not ask for go on
// to an HTTP/1.1 client (hop-by-hop fields dropped), not to an HTTP/1.0 one;
// an upstream's 100 does not (the gateway answers Expect itself).
TEST(InProcessProxyTest, InterimResponsesGoOnToHttp11Clients) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  Harness h(options);
  {
    RawConnection conn = *RawConnection::Connect(h.endpoint());
    ASSERT_TRUE(conn.Write("GET /canned/early-hints HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").ok());
    const std::string raw = conn.ReadUntilClosed(10s);
    ASSERT_TRUE(raw.starts_with("HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\n"
                                "Link: </a.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\n"))
        << raw;
    EXPECT_EQ(raw.find("X-Hop"), std::string::npos) << raw;
    EXPECT_EQ(raw.find("Content-Length: 7"), std::string::npos) << raw;  // a 1xx has no body
    EXPECT_EQ(raw.find("100 Continue"), std::string::npos) << raw;
    EXPECT_TRUE(raw.ends_with("\r\n\r\nhello")) << raw;
  }
  RawConnection conn = *RawConnection::Connect(h.endpoint());
  ASSERT_TRUE(conn.Write("GET /canned/early-hints HTTP/1.0\r\nHost: t\r\n\r\n").ok());
  const std::string raw = conn.ReadUntilClosed(10s);
  EXPECT_TRUE(raw.starts_with("HTTP/1.0 200 OK\r\n")) << raw;
}

// An interim head the client does not take within idle_timeout may be out in
// part: nothing may follow it, so the final response is not written after
// it and the connection closes (a 200 read as part of a 103's Link field
// would desynchronise the client). Interim heads carry none of the gateway's
// own fields, nor a Content-Length.
TEST(InProcessProxyTest, AnInterimHeadTheClientDoesNotTakeEndsTheConnection) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  http::ServerOptions server = Harness::DefaultServerOptions();
  server.limits.idle_timeout = 300ms;
  Harness h(options, server);
  RawConnection conn = *RawConnection::Connect(h.endpoint());
  ASSERT_TRUE(conn.Write("GET /canned/hint-flood HTTP/1.1\r\nHost: t\r\n\r\n").ok());
  std::this_thread::sleep_for(1500ms);  // reads nothing meanwhile
  const std::string raw = conn.ReadUntilClosed(30s);
  EXPECT_TRUE(conn.closed());
  EXPECT_EQ(raw.find("HTTP/1.1 200"), std::string::npos) << raw.size() << " bytes";
  EXPECT_TRUE(raw.starts_with("HTTP/1.1 103 Early Hints\r\n")) << raw.substr(0, 100);
}

// RFC 9110 section 6.6.1: a response forwarded without Date gets one; the
// upstream's own is passed on as it is, never doubled.
TEST(InProcessProxyTest, ForwardedResponseWithoutDateGetsOne) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  Harness h(options);
  auto plain = SendRequest(h.endpoint(), HttpRequest{.target = "/echo"});
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  const std::vector<std::string> dates = plain->Headers("Date");
  ASSERT_EQ(dates.size(), 1u);
  EXPECT_TRUE(dates[0].ends_with(" GMT")) << dates[0];
  auto dated = SendRequest(h.endpoint(), HttpRequest{.target = "/canned/dated"});
  ASSERT_TRUE(dated.ok()) << dated.status().ToString();
  EXPECT_EQ(dated->Headers("Date"), std::vector<std::string>{"Sun, 06 Nov 1994 08:49:37 GMT"});
}

// RFC 9112 section 6.3: a response with Transfer-Encoding and
// Content-Length is an error; and a coding other than chunked would reach
// the client removed (Transfer-Encoding is hop-by-hop), its body changed.
// Both are 502, and the connection is not reused.
TEST(InProcessProxyTest, ResponseTransferEncodingOtherThanChunkedIs502) {
  for (const char* name : {"gzip-length", "gzip-chunked"}) {
    SCOPED_TRACE(name);
    TestUpstream upstream;
    HandlerOptions options;
    options.target = TargetFor(upstream.port());
    Harness h(options);
    auto res = SendRequest(h.endpoint(), HttpRequest{.target = std::string("/canned/") + name});
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    ExpectProblem(*res, 502, "upstream-unavailable");
    auto next = SendRequest(h.endpoint(), HttpRequest{.method = "POST", .target = "/echo", .body = "x"});
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    EXPECT_EQ(next->body, "x");
    EXPECT_EQ(upstream.connections(), 2);
  }
}

// Status codes outside 100..599 (RFC 9110 section 15) are not relayed.
TEST(InProcessProxyTest, StatusOutsideTheDefinedRangeIs502) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  Harness h(options);
  for (const char* name : {"status-600", "status-999", "status-099"}) {
    SCOPED_TRACE(name);
    auto res = SendRequest(h.endpoint(), HttpRequest{.target = std::string("/canned/") + name});
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    ExpectProblem(*res, 502, "upstream-unavailable");
  }
}

// An upstream that answered with a final status ran the request, even when
// the rest of its head is one the proxy refuses (Content-Length beside
// Transfer-Encoding, a coding other than chunked, two lengths, a block past
// the limit, a bare CR within a line) or breaks off: the client gets 502, and the observer learns
// the status alone, the body marked omitted, as when a body breaks off
// (the idempotency engine then stores a 201 instead of releasing the key
// for a second run). Beast's message starts as 200: only a status line that
// came whole counts, and one that is not final (1xx, 101, outside
// 100..599) is not an answer.
TEST(InProcessProxyTest, AFinalStatusWhoseHeadIsRefusedReachesTheObserverWithoutHeadersOrBody) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.capture = true;
  Harness h(options);
  const std::pair<std::string, int> cases[] = {
      {"/canned/201-length-chunked", 201}, {"/canned/201-gzip-chunked", 201},
      {"/canned/201-two-lengths", 201},    {"/canned/201-huge-head", 201}, {"/canned/201-head-just-over", 201},
      {"/canned/201-bare-cr", 201},        {"/canned/100-then-201-two-lengths", 201}, {"/canned/500-length-chunked", 500},
      {"/reset?at=head", 200},             {"/canned/status-600", 0},
      {"/canned/status-099", 0},           {"/canned/101-upgrade", 0},
  };
  std::size_t n = 0;
  for (const auto& [target, status] : cases) {
    SCOPED_TRACE(target);
    auto res = SendRequest(h.endpoint(), HttpRequest{.method = "POST", .target = target, .body = "x"});
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    ExpectProblem(*res, 502, "upstream-unavailable");
    ASSERT_TRUE(h.handler().WaitForResults(++n));
    const RecordingObserver o = h.handler().observers().back();
    ASSERT_TRUE(o.finished.has_value());
    EXPECT_EQ(o.finished->outcome, http::ForwardOutcome::kUpstreamFailed);
    EXPECT_EQ(o.finished->status, 502);
    EXPECT_EQ(o.finished->upstream_status, status);
    if (status == 0) {
      EXPECT_EQ(o.on_response_calls, 0);
      continue;
    }
    EXPECT_EQ(o.on_response_calls, 1);
    ASSERT_TRUE(o.captured.has_value());
    EXPECT_EQ(o.captured->response.status, status);
    EXPECT_TRUE(o.captured->response.headers.empty());
    EXPECT_TRUE(o.captured->response.body.empty());
    EXPECT_TRUE(o.captured->response.body_omitted);
  }
}

// upstreams.NAME.keepalive: false gives every request a connection of its
// own, announced to the upstream with Connection: close, so that bytes an
// upstream writes late (a second response, the answer to a request it read
// out of a body it ignored) can never be read as another request's response.
TEST(InProcessProxyTest, WithoutKeepaliveEveryRequestHasAConnectionOfItsOwn) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.target.keepalive = false;
  Harness h(options);
  RawConnection conn = *RawConnection::Connect(h.endpoint());
  for (int i = 1; i <= 3; ++i) {
    ASSERT_TRUE(conn.Write("POST /echo/" + std::to_string(i) + " HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\nx").ok());
    const std::string raw = ReadUntil(conn, [](const std::string& got) { return BodyBytesAfterHead(got) >= 1; }, 10s);
    EXPECT_TRUE(raw.starts_with("HTTP/1.1 200 ")) << raw;
    // The client's own connection stays open.
    EXPECT_EQ(raw.find("Connection: close"), std::string::npos) << raw;
    const SeenRequest seen = upstream.last_echo();
    std::vector<std::string> connection;
    for (const auto& [name, value] : seen.headers) {
      if (http::NameEquals(name, "connection")) connection.push_back(value);
    }
    EXPECT_EQ(connection, std::vector<std::string>{"close"});
  }
  EXPECT_EQ(upstream.connections(), 3);
}

// RFC 9112 lets a recipient take a bare LF as a line end (section 2.2), and
// nginx takes that and a status line without the space before an empty
// reason phrase from its upstreams; Beast refuses both. The proxy mends such
// a head before parsing it: the response is relayed and captured whole (its
// body untouched, bare LFs in it included), and the connection is reused.
TEST(InProcessProxyTest, AHeadWithBareLineFeedsOrNoReasonPhraseIsRelayed) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.capture = true;
  Harness h(options);
  const std::pair<std::string, std::string> cases[] = {
      {"/canned/201-bare-lf", "ok"},           {"/canned/201-some-bare-lf", "ok"},
      {"/canned/201-no-reason", "ok"},         {"/canned/201-no-reason-bare-lf", "ok"},
      {"/canned/100-bare-lf-then-201", "ok"},  {"/canned/201-bare-lf-body", "o\nk\r\n\n"},
  };
  RawConnection conn = *RawConnection::Connect(h.endpoint());
  std::size_t n = 0;
  for (const auto& [target, body] : cases) {
    SCOPED_TRACE(target);
    // One client connection for all: the proxy answered each whole.
    ASSERT_TRUE(conn.Write("POST " + target + " HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\nx").ok());
    const std::string raw = ReadUntil(
        conn, [&](const std::string& got) { return got.find("\r\n\r\n") != std::string::npos && got.ends_with(body); },
        10s);
    EXPECT_TRUE(raw.starts_with("HTTP/1.1 201 ")) << raw;
    EXPECT_NE(raw.find("\r\nX-A: b\r\n"), std::string::npos) << raw;
    EXPECT_TRUE(raw.ends_with("\r\n\r\n" + body)) << raw;
    ASSERT_TRUE(h.handler().WaitForResults(++n));
    const RecordingObserver o = h.handler().observers().back();
    ASSERT_TRUE(o.captured.has_value());
    EXPECT_EQ(o.captured->response.status, 201);
    EXPECT_EQ(o.captured->response.body, body);
    EXPECT_FALSE(o.captured->response.body_omitted);
  }
  // The upstream connection was kept and reused throughout.
  EXPECT_EQ(upstream.connections(), 1);
}

// An upstream may answer before it has read the whole request body (an
// early 401 or 413, or a 201 that ignores the body) and then close, which
// fails the proxy's next send. That answer is relayed and captured, not
// replaced by a 502 (which left a keyed request's key free for a second
// run): the client connection closes after it, since the rest of its body
// was not read, and the request is not sent again.
TEST(InProcessProxyTest, AnAnswerBeforeTheWholeBodyIsRelayedWhenTheUpstreamThenCloses) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.capture = true;
  options.body_limit = 64 * kMiB;
  Harness h(options);
  RawConnection conn = *RawConnection::Connect(h.endpoint());
  ASSERT_TRUE(conn.Write("POST /early?status=201&then=close HTTP/1.1\r\nHost: t\r\nContent-Length: " +
                         std::to_string(32 * kMiB) + "\r\n\r\n" + std::string(1024, 'b'))
                  .ok());
  // The body keeps coming in small pieces, each sent upstream on its own,
  // until the proxy stops reading it.
  std::atomic<bool> answered{false};
  std::thread writer([&] {
    for (int i = 0; i < 4000 && !answered; ++i) {
      if (!conn.Write(std::string(1024, 'b')).ok()) break;
      std::this_thread::sleep_for(2ms);
    }
  });
  const std::string raw = ReadUntil(conn, [](const std::string& got) { return got.ends_with("early"); }, 20s);
  answered = true;
  writer.join();
  EXPECT_TRUE(raw.starts_with("HTTP/1.1 201")) << raw;
  EXPECT_NE(raw.find("\r\nConnection: close\r\n"), std::string::npos) << raw;
  EXPECT_TRUE(raw.ends_with("\r\n\r\nearly")) << raw;
  EXPECT_EQ(upstream.requests(), 1);
  ASSERT_TRUE(h.handler().WaitForResults(1));
  const auto observers = h.handler().observers();
  ASSERT_EQ(observers.size(), 1u);
  ASSERT_TRUE(observers[0].captured.has_value());
  EXPECT_EQ(observers[0].captured->response.status, 201);
  EXPECT_EQ(observers[0].captured->response.body, "early");
  EXPECT_FALSE(observers[0].captured->response.body_omitted);
  ASSERT_TRUE(observers[0].finished.has_value());
  EXPECT_EQ(observers[0].finished->outcome, http::ForwardOutcome::kCompleted);
  EXPECT_EQ(observers[0].finished->status, 201);
}

// The same answer from an upstream that then keeps the connection without
// reading (or closes it) while the proxy is still sending a body larger
// than the socket buffers in between: the send, blocked, notices the answer
// instead of waiting out the upstream timeout (504). The client's body was
// read whole first, so its connection stays open; the upstream's is not
// reused.
TEST(InProcessProxyTest, AnAnswerWhileTheUpstreamReadsNoMoreIsNoticedDuringTheSend) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.target.timeout = 5s;
  options.capture = true;
  options.read_body_first = true;
  options.body_limit = 64 * kMiB;
  Harness h(options);
  HttpClient client(h.endpoint());
  int answers = 0;
  for (const char* then : {"wait", "close"}) {
    SCOPED_TRACE(then);
    auto res = client.Send(HttpRequest{.method = "POST", .target = std::string("/early?status=413&then=") + then,
                                       .body = std::string(32 * kMiB, 'b')});
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_EQ(res->status, 413) << res->body;
    EXPECT_EQ(res->body, "early");
    EXPECT_TRUE(res->keep_alive);
    ASSERT_TRUE(h.handler().WaitForResults(++answers));
    const RecordingObserver o = h.handler().observers().back();
    ASSERT_TRUE(o.captured.has_value());
    EXPECT_EQ(o.captured->response.status, 413);
    EXPECT_EQ(o.captured->response.body, "early");
  }
  EXPECT_EQ(client.connections_opened(), 1);
  EXPECT_EQ(upstream.requests(), 2);
  EXPECT_EQ(upstream.connections(), 2);
}

// An interim response that arrives while the request is still going out (a
// server may send 100 Continue unasked) is no answer: the send goes on.
TEST(InProcessProxyTest, AnInterimResponseDuringTheSendDoesNotStopIt) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.target.timeout = 10s;
  options.read_body_first = true;
  options.body_limit = 64 * kMiB;
  Harness h(options);
  const std::string body = Pattern(32 * kMiB);
  auto res = SendRequest(h.endpoint(), HttpRequest{.method = "POST", .target = "/sink?continue=1", .body = body});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200) << res->body;
  char expected[96];
  std::snprintf(expected, sizeof(expected), "bytes=%zu fnv=%016llx", body.size(),
                static_cast<unsigned long long>(Fnv1a(body)));
  EXPECT_EQ(res->body, expected);
}

// The same over TLS: an https upstream that answers while it reads no more
// of a body larger than the socket buffers in between. The TLS send,
// blocked, reads beside the write and notices the answer, as the plain-text
// one does, instead of waiting out the upstream timeout (504). The answer is
// relayed and captured, and the connection it came on is not reused: the
// next request goes on a new one. An interim response during a send that
// the upstream then takes whole does not stop it. An upstream that goes
// away without an answer (the send failing, or the read beside it seeing
// the end) is a 502 at once: no read waits out the timeout for an end
// already seen.
TEST(InProcessProxyTest, AnAnswerWhileAnHttpsUpstreamReadsNoMoreIsNoticedDuringTheSend) {
  idemgate::testing::TempDir dir;
  auto pki = idemgate::testing::MakeTestPki(dir.Join("pki"));
  ASSERT_TRUE(pki.ok()) << pki.status().ToString();
  TlsTestUpstream upstream(pki->server_cert, pki->server_key);
  auto tls = http::MakeUpstreamTls({.ca_file = pki->ca_file});
  ASSERT_TRUE(tls.ok()) << tls.status().ToString();
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.target.tls = *tls;
  options.target.timeout = 5s;
  options.capture = true;
  options.read_body_first = true;
  options.body_limit = 64 * kMiB;
  Harness h(options);
  HttpClient client(h.endpoint());
  int answers = 0;
  for (const char* target : {"/early?status=413", "/early?status=201&continue=1"}) {
    SCOPED_TRACE(target);
    auto res = client.Send(HttpRequest{.method = "POST", .target = target, .body = std::string(16 * kMiB, 'b')});
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    const int status = std::string_view(target).find("413") != std::string_view::npos ? 413 : 201;
    EXPECT_EQ(res->status, status) << res->body;
    EXPECT_EQ(res->body, "early");
    EXPECT_TRUE(res->keep_alive);
    ASSERT_TRUE(h.handler().WaitForResults(++answers));
    const RecordingObserver o = h.handler().observers().back();
    ASSERT_TRUE(o.captured.has_value());
    EXPECT_EQ(o.captured->response.status, status);
    EXPECT_EQ(o.captured->response.body, "early");
    ASSERT_TRUE(o.finished.has_value());
    EXPECT_EQ(o.finished->outcome, http::ForwardOutcome::kCompleted);
  }
  EXPECT_EQ(upstream.requests(), 2);
  EXPECT_EQ(upstream.connections(), 2);

  const std::string body = Pattern(16 * kMiB);
  auto res = client.Send(HttpRequest{.method = "POST", .target = "/sink?continue=1", .body = body});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200) << res->body;
  char expected[96];
  std::snprintf(expected, sizeof(expected), "bytes=%zu fnv=%016llx", body.size(),
                static_cast<unsigned long long>(Fnv1a(body)));
  EXPECT_EQ(res->body, expected);
  EXPECT_EQ(client.connections_opened(), 1);
  EXPECT_EQ(upstream.requests(), 3);
  EXPECT_EQ(upstream.connections(), 3);

  res = client.Send(HttpRequest{.method = "POST", .target = "/reset", .body = body});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ExpectProblem(*res, 502, "upstream-unavailable");
  ASSERT_TRUE(h.handler().WaitForResults(answers + 2));
  const RecordingObserver o = h.handler().observers().back();
  EXPECT_FALSE(o.captured.has_value());
  ASSERT_TRUE(o.finished.has_value());
  EXPECT_EQ(o.finished->outcome, http::ForwardOutcome::kUpstreamFailed);
}

TEST(InProcessProxyTest, TwoWorkersShareNothingAndBothServe) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  http::ServerOptions server_options = Harness::DefaultServerOptions();
  server_options.workers = 2;
  Harness h(options, server_options);
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&] {
      HttpClient client(h.endpoint());
      for (int i = 0; i < 20; ++i) {
        auto res = client.Send(HttpRequest{.method = "POST", .target = "/echo", .body = "x"});
        if (res.ok() && res->status == 200 && res->body == "x") ++ok;
      }
    });
  }
  for (auto& c : clients) c.join();
  EXPECT_EQ(ok.load(), 80);
  // At most one pool per worker, each reusing its connections.
  EXPECT_LE(upstream.connections(), 2 * 4);
}

}  // namespace
}  // namespace idemgate::httptest
