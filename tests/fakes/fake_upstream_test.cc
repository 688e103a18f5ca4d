// Tests of fake_upstream and of the idemgate_testing helpers it is driven by.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <boost/json.hpp>
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

TEST(TestingHelpersTest, PickFreePortIsRefused) {
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  EXPECT_FALSE(RawConnection::Connect(HostPort{"127.0.0.1", *port}).ok());
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

}  // namespace
}  // namespace idemgate::testing
