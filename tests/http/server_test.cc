// The server alone: keep-alive, pipelining, limits, timeouts, drain.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <map>
#include <mutex>

#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <optional>
#include <string>
#include <thread>

#include "fakes/testing.h"
#include "harness.h"
#include "http/problem.h"
#include "http/server.h"
#include "test_upstream.h"

namespace idemgate::httptest {
namespace {

using namespace std::chrono_literals;
using idemgate::testing::HostPort;
using idemgate::testing::HttpClient;
using idemgate::testing::HttpRequest;
using idemgate::testing::PollUntil;
using idemgate::testing::RawConnection;
using idemgate::testing::SendRequest;

// Answers "METHOD path?query" ("GET (as POST) path?query" with a method
// override header); /sleep waits 300 ms first; /body reads the
// body and answers its size; /limited refuses a declared body over 10 bytes
// (413); /silent answers nothing.
class TestHandler final : public http::Handler {
 public:
  http::Task<void> Handle(http::Exchange& ex) override {
    const http::RequestHead& head = ex.head();
    if (head.path == "/sleep") {
      started.fetch_add(1);
      boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor, 300ms);
      co_await timer.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
    }
    if (head.path == "/silent") co_return;
    if (head.path == "/limited" && !ex.SetBodyLimit(10)) {
      co_await ex.Respond(http::MakeProblem(http::ProblemCode::kRequestTooLarge, "limited"));
      co_return;
    }
    if (head.path == "/body") {
      const http::BodyStatus status = co_await ex.ReadBody();
      if (status != http::BodyStatus::kOk) {
        co_await ex.Respond(http::MakeProblem(http::ProblemCode::kRequestTooLarge, "body"));
        co_return;
      }
      // Named, not a braced temporary: GCC 12 miscompiles braced prvalue
      // arguments of a coroutine call inside co_await (double destruction).
      http::Response size;
      size.body = std::to_string(ex.body().size());
      co_await ex.Respond(std::move(size));
      co_return;
    }
    http::Response r;
    r.headers = {{"Content-Type", "text/plain"}, {"Content-Length", "999"}, {"Connection", "bogus"}};
    r.body = std::string(head.method) + " ";
    if (!head.method_override.empty()) r.body += "(as " + std::string(head.effective_method()) + ") ";
    r.body += head.path_and_query;
    co_await ex.Respond(std::move(r));
  }
  void Refused(const http::RefusedRequest& refused) override {
    std::lock_guard lock(mu);
    refusals.emplace_back(refused.reason);
  }
  std::vector<std::string> Refusals() {
    std::lock_guard lock(mu);
    return refusals;
  }

  std::atomic<int> started{0};
  std::mutex mu;
  std::vector<std::string> refusals;  // RefusedRequest::reason, in order
};

// The bodies of the pipelined HTTP/1.1 responses in `raw`, in order; one
// that is not a 200 shows as "not a 200: " and its text.
std::vector<std::string> BodiesOf200s(const std::string& raw) {
  std::vector<std::string> bodies;
  for (std::size_t at = 0; at < raw.size();) {
    std::size_t next = raw.find("HTTP/1.1 ", at + 1);
    if (next == std::string::npos) next = raw.size();
    const std::string one = raw.substr(at, next - at);
    auto res = testing::ParseResponse(one);
    bodies.push_back(res.ok() && res->status == 200 ? res->body : "not a 200: " + one);
    at = next;
  }
  return bodies;
}

class ServerTest : public ::testing::Test {
 protected:
  void Start(http::Limits limits = {}) {
    http::ServerOptions options;
    options.workers = 1;
    options.tick = 20ms;
    options.limits = limits;
    server_.emplace(options);
    auto bound = server_->Listen("127.0.0.1", 0, handler_, true);
    ASSERT_TRUE(bound.ok()) << bound.status().ToString();
    endpoint_ = {"127.0.0.1", bound->port};
    server_->Start();
  }
  void TearDown() override {
    if (server_) server_->Stop(2s);
  }

  TestHandler handler_;
  std::optional<http::Server> server_;
  HostPort endpoint_;
};

TEST_F(ServerTest, KeepAliveServesManyRequestsOnOneConnection) {
  Start();
  HttpClient client(endpoint_);
  for (int i = 0; i < 10; ++i) {
    auto res = client.Send(HttpRequest{.target = "/n" + std::to_string(i) + "?q=1"});
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(res->body, "GET /n" + std::to_string(i) + "?q=1");
    // The handler's framing and Connection fields are replaced by the writer's.
    EXPECT_EQ(res->Header("Content-Length"), std::to_string(res->body.size()));
    EXPECT_TRUE(res->keep_alive);
    EXPECT_TRUE(res->HasHeader("Date"));
  }
  EXPECT_EQ(client.connections_opened(), 1);
}

// limits.max_connections: the connection past the limit (over all workers)
// is closed at once without an answer, while those admitted keep working;
// once one of them closes, a new connection is served again.
TEST(ServerConnectionLimitTest, ConnectionPastTheLimitIsClosedAndTheOthersKeepWorking) {
  class CountingHandler final : public http::Handler {
   public:
    http::Task<void> Handle(http::Exchange& ex) override {
      http::Response r;
      r.body = std::string(ex.head().path);
      co_await ex.Respond(std::move(r));
    }
    void ConnectionRefused() override { refused.fetch_add(1); }
    std::atomic<int> refused{0};
  } handler;
  http::ServerOptions options;
  options.workers = 2;
  options.tick = 20ms;
  options.limits.max_connections = 3;
  http::Server server(options);
  auto bound = server.Listen("127.0.0.1", 0, handler, true);
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  const HostPort endpoint{"127.0.0.1", bound->port};
  server.Start();
  const std::string request = "GET /x HTTP/1.1\r\nHost: x\r\n\r\n";
  auto answered = [&](RawConnection& conn) {
    if (!conn.Write(request).ok()) return false;
    auto got = conn.ReadSome(5s);
    return got.ok() && got->find("HTTP/1.1 200") == 0;
  };
  std::vector<RawConnection> admitted;
  for (int i = 0; i < 3; ++i) {
    auto conn = RawConnection::Connect(endpoint);
    ASSERT_TRUE(conn.ok());
    ASSERT_TRUE(answered(*conn)) << i;  // accepted and served: counted
    admitted.push_back(std::move(*conn));
  }
  auto extra = RawConnection::Connect(endpoint);
  ASSERT_TRUE(extra.ok());
  (void)extra->Write(request);  // may fail: the server may have closed already
  EXPECT_EQ(extra->ReadUntilClosed(5s), "");
  EXPECT_TRUE(extra->closed());
  EXPECT_TRUE(PollUntil([&] { return handler.refused.load() == 1; }, 5s));
  for (RawConnection& conn : admitted) EXPECT_TRUE(answered(conn));

  admitted.front().Close();
  EXPECT_TRUE(PollUntil(
      [&] {
        auto conn = RawConnection::Connect(endpoint);
        return conn.ok() && answered(*conn);
      },
      10s, 50ms));
  server.Stop(2s);
}

TEST_F(ServerTest, PipelinedRequestsAreAnsweredInOrder) {
  Start();
  auto conn = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(conn->Write("GET /sleep HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n"
                          "GET /c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                  .ok());
  const std::string raw = conn->ReadUntilClosed(10s);
  const auto a = raw.find("GET /sleep");
  const auto b = raw.find("GET /b");
  const auto c = raw.find("GET /c");
  ASSERT_NE(a, std::string::npos) << raw;
  ASSERT_NE(b, std::string::npos) << raw;
  ASSERT_NE(c, std::string::npos) << raw;
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
  EXPECT_TRUE(conn->closed());
}

TEST_F(ServerTest, OversizedHeaderBlockIs431AndCloses) {
  http::Limits limits;
  limits.max_header_bytes = 2048;
  Start(limits);
  auto conn = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(conn->Write("GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(4096, 'a') + "\r\n\r\n").ok());
  const std::string raw = conn->ReadUntilClosed(10s);
  EXPECT_TRUE(conn->closed());
  auto res = testing::ParseResponse(raw);
  ASSERT_TRUE(res.ok()) << raw;
  EXPECT_EQ(res->status, 431);
  EXPECT_NE(res->body.find("urn:idemgate:problem:headers-too-large"), std::string::npos);
}

// Found by fuzz/http_request_fuzz.cc: Beast applies its header limit to the
// request line and to the header fields separately, so a request whose
// line and fields were each under the limit got through when it arrived in
// one read (and was refused when it trickled in).
TEST_F(ServerTest, RequestLineCountsTowardsTheHeaderLimit) {
  http::Limits limits;
  limits.max_header_bytes = 2048;
  Start(limits);
  auto conn = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(conn.ok());
  // 1.5 KiB of request line and 1.5 KiB of fields, in one write of 3 KiB.
  ASSERT_TRUE(conn->Write("GET /" + std::string(1500, 'p') + " HTTP/1.1\r\nHost: x\r\nX-Big: " +
                          std::string(1500, 'a') + "\r\n\r\n")
                  .ok());
  const std::string raw = conn->ReadUntilClosed(10s);
  auto res = testing::ParseResponse(raw);
  ASSERT_TRUE(res.ok()) << raw.substr(0, 300);
  EXPECT_EQ(res->status, 431);
}

// Found by fuzz/http_request_fuzz.cc: a chunk-size line longer than the
// header limit was refused only when it arrived over several reads; whole
// in one read, it was parsed.
TEST_F(ServerTest, ChunkLinePastTheHeaderLimitIsRefusedEvenInOneRead) {
  http::Limits limits;
  limits.max_header_bytes = 2048;
  Start(limits);
  auto conn = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(conn->Write("POST /body HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1;ext=" +
                          std::string(3000, 'e') + "\r\nx\r\n0\r\n\r\n")
                  .ok());
  const std::string raw = conn->ReadUntilClosed(10s);
  auto res = testing::ParseResponse(raw);
  ASSERT_TRUE(res.ok()) << raw.substr(0, 300);
  // TestHandler answers 413 for any body it could not read.
  EXPECT_EQ(res->status, 413) << res->body;
}

// Found by fuzz/http_request_fuzz.cc under the ASan preset: Beast before
// 1.86 asserts (a Debug build aborts) when an empty chunked body's last
// chunk arrives as "0\r\n" and then one byte at a time.
TEST_F(ServerTest, LastChunkTricklingInIsRead) {
  Start();
  auto conn = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(conn->Write("POST /body HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n").ok());
  for (const char* byte : {"\r", "\n"}) {
    std::this_thread::sleep_for(50ms);
    ASSERT_TRUE(conn->Write(byte).ok());
  }
  conn->ShutdownWrite();
  const std::string raw = conn->ReadUntilClosed(10s);
  auto res = testing::ParseResponse(raw);
  ASSERT_TRUE(res.ok()) << raw.substr(0, 300);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "0");
}

TEST_F(ServerTest, MalformedRequestsAre400AndClose) {
  Start();
  for (const std::string bytes : {"NOT HTTP AT ALL\r\n\r\n", "GET / HTTP/1.1\r\nHost: x\r\nbad header\r\n\r\n",
                                  "GET / HTTP/1.1\r\n\r\n" /* no Host */,
                                  "GET /a/../b HTTP/1.1\r\nHost: x\r\n\r\n",
                                  "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
                                  // Only the chunked framing is decoded: another coding
                                  // would reach the upstream silently removed.
                                  "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
                                  "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
                                  "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                                  "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                                  "GET * HTTP/1.1\r\nHost: x\r\n\r\n",
                                  // RFC 9112 section 3.2: one Host line, with a valid value.
                                  "GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n",
                                  "GET / HTTP/1.1\r\nHost: \r\nHost: b.example\r\n\r\n",
                                  "GET / HTTP/1.0\r\nHost: a.example\r\nHost: a.example\r\n\r\n",
                                  "GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nHost: b\r\n\r\n",
                                  "GET / HTTP/1.1\r\nHost: a.example, b.example\r\n\r\n",
                                  "GET / HTTP/1.1\r\nHost: x@y z\r\n\r\n"}) {
    SCOPED_TRACE(bytes);
    auto conn = RawConnection::Connect(endpoint_);
    ASSERT_TRUE(conn.ok());
    ASSERT_TRUE(conn->Write(bytes).ok());
    const std::string raw = conn->ReadUntilClosed(10s);
    EXPECT_TRUE(conn->closed());
    auto res = testing::ParseResponse(raw);
    ASSERT_TRUE(res.ok()) << raw;
    EXPECT_EQ(res->status, 400);
    EXPECT_EQ(res->Header("Content-Type"), "application/problem+json");
  }
}

// RFC 9110 section 2.5: a higher minor version of HTTP/1 is served as the
// highest the server speaks, HTTP/1.1 (keep-alive by default); another major
// version is refused with 505.
TEST_F(ServerTest, HigherMinorVersionsAreServedAsHttp11AndOtherMajorsAre505) {
  Start();
  auto conn = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(conn->Write("GET /one HTTP/1.2\r\nHost: x\r\n\r\nGET /two HTTP/1.9\r\nHost: x\r\n\r\n"
                          "GET /three HTTP/1.9\r\nHost: x\r\nConnection: close\r\n\r\n")
                  .ok());
  const std::string raw = conn->ReadUntilClosed(10s);
  EXPECT_TRUE(conn->closed());
  EXPECT_EQ(BodiesOf200s(raw), (std::vector<std::string>{"GET /one", "GET /two", "GET /three"})) << raw;

  // The same however the line arrives: Beast judges the version before the
  // line's end is in.
  for (const std::string_view cut : {"", "\r"}) {
    for (const std::string_view version : {"1.2", "2.0"}) {
      SCOPED_TRACE(std::string(version) + (cut.empty() ? " cut after the version" : " cut after the CR"));
      auto split = RawConnection::Connect(endpoint_);
      ASSERT_TRUE(split.ok());
      ASSERT_TRUE(split->Write("GET /split HTTP/" + std::string(version) + std::string(cut)).ok());
      const auto early = split->ReadSome(200ms);  // nothing yet for a version taken; 505 at once otherwise
      (void)split->Write(std::string("\r\n").substr(cut.size()) + "Host: x\r\nConnection: close\r\n\r\n");
      const std::string answer = (early.ok() ? *early : std::string()) + split->ReadUntilClosed(10s);
      auto res = testing::ParseResponse(answer);
      ASSERT_TRUE(res.ok()) << answer;
      EXPECT_EQ(res->status, version == "1.2" ? 200 : 505) << answer;
      if (version == "1.2") {
        EXPECT_EQ(res->body, "GET /split");
      }
    }
  }

  // A malformed line is a 400 wherever its bytes are cut, not a 505 when the
  // cut falls right after a version of another major.
  for (const std::string line : {"GET / HTTP/2.0x", "GET / HTTP/2.0 HTTP/1.1", "GET / HTTP/1.2 HTTP/2.0"}) {
    for (std::size_t cut = 5; cut < line.size(); ++cut) {
      SCOPED_TRACE(line + " cut at " + std::to_string(cut));
      auto c = RawConnection::Connect(endpoint_);
      ASSERT_TRUE(c.ok());
      ASSERT_TRUE(c->Write(line.substr(0, cut)).ok());
      const auto early = c->ReadSome(50ms);  // the server sees the first part alone
      (void)c->Write(line.substr(cut) + "\r\nHost: x\r\n\r\n");
      const std::string answer = (early.ok() ? *early : std::string()) + c->ReadUntilClosed(10s);
      const std::size_t status_at = answer.find("HTTP/1.1 ");
      ASSERT_NE(status_at, std::string::npos) << answer;
      EXPECT_EQ(answer.substr(status_at + 9, 3), "400") << answer;
    }
  }

  for (const std::string bytes : {"GET / HTTP/2.0\r\nHost: x\r\n\r\n", "GET / HTTP/0.9\r\nHost: x\r\n\r\n",
                                  "GET / HTTP/3.1\r\nHost: x\r\n\r\n"}) {
    SCOPED_TRACE(bytes);
    auto c = RawConnection::Connect(endpoint_);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c->Write(bytes).ok());
    const std::string answer = c->ReadUntilClosed(10s);
    EXPECT_TRUE(c->closed());
    auto res = testing::ParseResponse(answer);
    ASSERT_TRUE(res.ok()) << answer;
    EXPECT_EQ(res->status, 505);
    EXPECT_NE(res->body.find("http-version-not-supported"), std::string::npos) << res->body;
  }
}

// A request answered without its body (a refusal) is answered at once, not
// once its body is in; a small body is read and dropped after the answer,
// so the connection serves the next request.
TEST_F(ServerTest, AnswerWithoutTheBodyDoesNotWaitForItAndTheConnectionIsKept) {
  http::Limits limits;
  limits.idle_timeout = 30s;
  Start(limits);
  auto conn = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(conn->Write("POST /refused HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n").ok());
  // Well within idle_timeout: the answer does not wait for the body.
  auto first = conn->ReadSome(10s);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto res = testing::ParseResponse(*first);
  ASSERT_TRUE(res.ok()) << *first;
  EXPECT_EQ(res->body, "POST /refused");
  EXPECT_TRUE(res->keep_alive);
  ASSERT_TRUE(conn->Write("helloGET /next HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok());
  const std::string rest = conn->ReadUntilClosed(10s);
  auto next = testing::ParseResponse(rest);
  ASSERT_TRUE(next.ok()) << rest;
  EXPECT_EQ(next->body, "GET /next");
}

// RFC 9112 section 2.2: empty lines before a request line are ignored, on a
// new connection and after a request on a kept-alive one (the CRLF some
// clients send after a POST's body); a few of them, not any number.
TEST_F(ServerTest, EmptyLinesBeforeARequestLineAreIgnored) {
  Start();
  auto conn = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(conn->Write("\r\nGET /one HTTP/1.1\r\nHost: x\r\n\r\n"
                          "POST /body HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab\r\n"
                          "\r\n\nGET /three HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                  .ok());
  const std::string raw = conn->ReadUntilClosed(10s);
  EXPECT_TRUE(conn->closed());
  EXPECT_EQ(BodiesOf200s(raw), (std::vector<std::string>{"GET /one", "2", "GET /three"})) << raw;

  auto many = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(many.ok());
  ASSERT_TRUE(many->Write(std::string(20, '\n') + "GET / HTTP/1.1\r\nHost: x\r\n\r\n").ok());
  const std::string answer = many->ReadUntilClosed(10s);
  auto res = testing::ParseResponse(answer);
  ASSERT_TRUE(res.ok()) << answer;
  EXPECT_EQ(res->status, 400);
}

TEST_F(ServerTest, ClientTricklingHeadersIsCutAtHeaderTimeout) {
  http::Limits limits;
  limits.header_timeout = 300ms;
  Start(limits);
  auto conn = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(conn->Write("GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ").ok());
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  while (!conn->closed() && std::chrono::steady_clock::now() < give_up) {
    if (!conn->Write("a").ok()) break;
    (void)conn->ReadSome(50ms);
  }
  EXPECT_TRUE(conn->closed() || !conn->Write("a").ok());
}

TEST_F(ServerTest, IdleKeepAliveConnectionIsClosed) {
  http::Limits limits;
  limits.idle_timeout = 200ms;
  Start(limits);
  auto conn = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(conn->Write("GET /x HTTP/1.1\r\nHost: x\r\n\r\n").ok());
  const std::string raw = conn->ReadUntilClosed(10s);
  EXPECT_TRUE(conn->closed());
  EXPECT_NE(raw.find("GET /x"), std::string::npos);
}

// An empty line after a request (the CRLF some clients send after a body)
// starts no request: the connection stays idle, closed at idle_timeout
// without a refusal, not held to header_timeout as a request's head.
TEST_F(ServerTest, AnEmptyLineAfterARequestLeavesTheConnectionIdle) {
  http::Limits limits;
  limits.idle_timeout = 200ms;
  limits.header_timeout = 30s;
  Start(limits);
  auto conn = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(conn->Write("POST /body HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab\r\n").ok());
  const std::string raw = conn->ReadUntilClosed(10s);  // well before header_timeout
  EXPECT_TRUE(conn->closed());
  EXPECT_NE(raw.find("\r\n\r\n2"), std::string::npos) << raw;
  EXPECT_TRUE(handler_.Refusals().empty());
}

// A client that ends its side after the request (the FIN often arrives
// with the request's bytes) gets its answer and then the close at once, not
// after the idle timeout.
TEST_F(ServerTest, ClientThatHalfClosesAfterItsRequestIsAnsweredAndClosedAtOnce) {
  http::Limits limits;
  limits.idle_timeout = 60s;
  Start(limits);
  for (int i = 0; i < 5; ++i) {
    auto conn = RawConnection::Connect(endpoint_);
    ASSERT_TRUE(conn.ok());
    ASSERT_TRUE(conn->Write("GET /half HTTP/1.1\r\nHost: x\r\n\r\n").ok());
    conn->ShutdownWrite();
    const std::string raw = conn->ReadUntilClosed(5s);
    EXPECT_TRUE(conn->closed()) << raw;
    EXPECT_NE(raw.find("GET /half"), std::string::npos) << raw;
  }
}

TEST_F(ServerTest, HeadResponseHasLengthButNoBody) {
  Start();
  auto conn = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(conn->Write("HEAD /h HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok());
  const std::string raw = conn->ReadUntilClosed(10s);
  EXPECT_NE(raw.find("Content-Length: 7\r\n"), std::string::npos) << raw;
  EXPECT_TRUE(raw.ends_with("\r\n\r\n")) << raw;
}

TEST_F(ServerTest, BodyIsBufferedUpToTheLimit) {
  http::Limits limits;
  limits.max_request_bytes = 100000;
  Start(limits);
  HttpClient client(endpoint_);
  auto res = client.Send(HttpRequest{.method = "POST", .target = "/body", .body = std::string(100000, 'b')});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->body, "100000");
  HttpRequest chunked{.method = "POST", .target = "/body", .body = std::string(100001, 'c')};
  chunked.headers = {{"Transfer-Encoding", "chunked"}};
  res = SendRequest(endpoint_, chunked);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 413);
}

// Sends POST `path` with an 8-byte body one byte every 150 ms (1.2 s in
// all), then reads the answer until the server closes.
std::string SendBodyTrickling(const HostPort& endpoint, const std::string& path) {
  auto conn = RawConnection::Connect(endpoint);
  EXPECT_TRUE(conn.ok());
  if (!conn.ok()) return {};
  EXPECT_TRUE(conn->Write("POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\nConnection: close\r\n\r\n").ok());
  for (const char* byte : {"a", "b", "c", "d", "e", "f", "g", "h"}) {
    std::this_thread::sleep_for(150ms);
    EXPECT_TRUE(conn->Write(byte).ok());
  }
  return conn->ReadUntilClosed(10s);
}

// limits.idle_timeout bounds the time without a byte of the body, not the
// whole body: a client sending one byte every 150 ms under a 700 ms idle
// timeout (1.2 s in all) is read to the end.
TEST_F(ServerTest, BodyTricklingInSteadilyIsNotCutByTheIdleTimeout) {
  http::Limits limits;
  limits.idle_timeout = 700ms;
  Start(limits);
  const std::string raw = SendBodyTrickling(endpoint_, "/body");
  auto res = testing::ParseResponse(raw);
  ASSERT_TRUE(res.ok()) << raw;
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(res->body, "8");
}

// A body that stops arriving for idle_timeout gets 408 request-timeout (the
// handler's own answer to the failed read is not sent), and the connection
// closes.
TEST_F(ServerTest, BodyThatStallsPastTheIdleTimeoutIs408AndCloses) {
  http::Limits limits;
  limits.idle_timeout = 300ms;
  Start(limits);
  auto conn = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(conn.ok());
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(conn->Write("POST /body HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\nab").ok());
  const std::string raw = conn->ReadUntilClosed(10s);
  EXPECT_TRUE(conn->closed());
  EXPECT_GE(std::chrono::steady_clock::now() - start, 300ms);
  auto res = testing::ParseResponse(raw);
  ASSERT_TRUE(res.ok()) << raw;
  EXPECT_EQ(res->status, 408) << res->body;
  EXPECT_EQ(res->Header("Content-Type"), "application/problem+json");
  EXPECT_EQ(res->Header("Connection"), "close");
  EXPECT_NE(res->body.find("urn:idemgate:problem:request-timeout"), std::string::npos) << res->body;
}

// The streamed relay of the proxy reads the body with the same rule: its
// first block (up to 64 KiB, read before the upstream is contacted) too.
TEST(ServerProxyBodyTest, StreamedBodyTricklingInSteadilyIsForwarded) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  http::ServerOptions server_options = Harness::DefaultServerOptions();
  server_options.limits.idle_timeout = 700ms;
  Harness h(options, server_options);
  const std::string raw = SendBodyTrickling(h.endpoint(), "/echo");
  auto res = testing::ParseResponse(raw);
  ASSERT_TRUE(res.ok()) << raw;
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(res->body, "abcdefgh");
}

// A streamed body that stalls, before the upstream was contacted or after
// part of it went there, is answered 408 with Connection: close; an
// observer is told before the answer is written (its key is released).
TEST(ServerProxyBodyTest, StreamedBodyThatStallsIs408AndCloses) {
  TestUpstream upstream;
  HandlerOptions options;
  options.target = TargetFor(upstream.port());
  options.capture = true;
  http::ServerOptions server_options = Harness::DefaultServerOptions();
  server_options.limits.idle_timeout = 300ms;
  Harness h(options, server_options);
  const std::string in_first_block = "ab";
  const std::string past_first_block(100 * 1024, 'x');
  for (const std::string* sent : {&in_first_block, &past_first_block}) {
    SCOPED_TRACE(sent->size());
    auto conn = RawConnection::Connect(h.endpoint());
    ASSERT_TRUE(conn.ok());
    ASSERT_TRUE(conn->Write("POST /sink HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n" + *sent).ok());
    const std::string raw = conn->ReadUntilClosed(10s);
    EXPECT_TRUE(conn->closed());
    auto res = testing::ParseResponse(raw);
    ASSERT_TRUE(res.ok()) << raw.substr(0, 300);
    EXPECT_EQ(res->status, 408) << res->body;
    EXPECT_EQ(res->Header("Connection"), "close");
    EXPECT_NE(res->body.find("urn:idemgate:problem:request-timeout"), std::string::npos) << res->body;
  }
  ASSERT_TRUE(h.handler().WaitForResults(2));
  for (const RecordingObserver& o : h.handler().observers()) {
    EXPECT_EQ(o.on_no_response_calls, 1);
    EXPECT_FALSE(o.answered_before_no_response);
    ASSERT_TRUE(o.finished.has_value());
    EXPECT_EQ(o.finished->status, 408);
    EXPECT_EQ(o.finished->outcome, http::ForwardOutcome::kClientGone);
  }
}

// Sends `bytes` and expects a 400 problem and the connection closed.
void ExpectRefused(const HostPort& endpoint, const std::string& bytes) {
  SCOPED_TRACE(bytes);
  auto conn = RawConnection::Connect(endpoint);
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(conn->Write(bytes).ok());
  const std::string raw = conn->ReadUntilClosed(10s);
  EXPECT_TRUE(conn->closed());
  auto res = testing::ParseResponse(raw);
  ASSERT_TRUE(res.ok()) << raw;
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(res->Header("Content-Type"), "application/problem+json");
}

// Sends `bytes` (one request, which closes) and returns the answer's body,
// expecting a 200.
std::string BodyOf200(const HostPort& endpoint, const std::string& bytes) {
  SCOPED_TRACE(bytes);
  auto conn = RawConnection::Connect(endpoint);
  EXPECT_TRUE(conn.ok());
  if (!conn.ok()) return {};
  EXPECT_TRUE(conn->Write(bytes).ok());
  const std::string raw = conn->ReadUntilClosed(10s);
  auto res = testing::ParseResponse(raw);
  EXPECT_TRUE(res.ok()) << raw;
  if (!res.ok()) return {};
  EXPECT_EQ(res->status, 200) << res->body;
  return res->body;
}

// An absolute-form target's authority replaces Host (and becomes the
// upstream's Host and X-Forwarded-Host): it is held to the rules of a Host
// value, the comma refusal included.
TEST_F(ServerTest, AbsoluteFormAuthorityIsValidatedLikeAHostValue) {
  Start();
  for (const std::string authority :
       {"a,b", "a\"b", "a<b", "a\\b", "[::1", "a:b", ":80", "a b%", "a%zz", "[]"}) {
    ExpectRefused(endpoint_, "GET http://" + authority + "/x HTTP/1.1\r\nHost: good\r\n\r\n");
  }
  for (const std::string authority :
       {"a.example", "a.example:8080", "127.0.0.1:80", "[::1]:8443", "a%2Db"}) {
    EXPECT_EQ(BodyOf200(endpoint_, "GET http://" + authority +
                                       "/x HTTP/1.1\r\nHost: good\r\nConnection: close\r\n\r\n"),
              "GET /x");
  }
}

// "http://h?q" has an empty path, which stands for "/" (RFC 9110 section 4.2.3).
TEST_F(ServerTest, AbsoluteFormWithAnEmptyPathBeforeItsQueryIsForTheRoot) {
  Start();
  EXPECT_EQ(BodyOf200(endpoint_,
                      "POST http://evil?x HTTP/1.1\r\nHost: good\r\nContent-Length: 0\r\n"
                      "Connection: close\r\n\r\n"),
            "POST /?x");
  EXPECT_EQ(
      BodyOf200(endpoint_,
                "GET http://evil:80?a=1&b HTTP/1.1\r\nHost: good\r\nConnection: close\r\n\r\n"),
      "GET /?a=1&b");
  EXPECT_EQ(
      BodyOf200(endpoint_, "GET http://evil? HTTP/1.1\r\nHost: good\r\nConnection: close\r\n\r\n"),
      "GET /?");
}

// A segment that is a dot segment once its ";parameters" are cut (as Tomcat
// and Spring cut them), and a backslash (a '/' to some upstreams), could take
// a request out of the route it matched: refused like "..".
TEST_F(ServerTest, DotSegmentsWithParametersAndBackslashesAre400) {
  Start();
  for (const std::string target :
       {"/x/..;/api/v1/payments", "/x/..;x/y", "/x/.;x/y", "/x/%2e%2E;/y", "/x/%2E.;a=b",
        "/reads\\..\\x", "/a\\b", "/a%5C\\b", "http://h/a\\b"}) {
    ExpectRefused(endpoint_, "GET " + target + " HTTP/1.1\r\nHost: x\r\n\r\n");
  }
  // Parameters on other segments, and a backslash in the query, still pass.
  EXPECT_EQ(
      BodyOf200(endpoint_, "GET /a;b/c..;d/...;e HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
      "GET /a;b/c..;d/...;e");
  EXPECT_EQ(BodyOf200(endpoint_, "GET /x?q=a\\b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
            "GET /x?q=a\\b");
}

// X-HTTP-Method-Override, X-HTTP-Method and X-Method-Override (also with '_'
// for '-') name the method frameworks run the request as: the head carries
// it beside the request line's. One method, agreed on by every such line.
TEST_F(ServerTest, MethodOverrideHeadersAreReadAndRefusedWhenAmbiguous) {
  Start();
  for (const std::string field :
       {"X-HTTP-Method-Override: POST", "x-http-method: POST", "X-Method-Override: POST",
        "X_HTTP_Method_Override: POST", "X-HTTP-Method-Override: POST\r\nX-HTTP-Method: POST"}) {
    EXPECT_EQ(BodyOf200(endpoint_,
                        "GET /x HTTP/1.1\r\nHost: x\r\n" + field + "\r\nConnection: close\r\n\r\n"),
              "GET (as POST) /x");
  }
  EXPECT_EQ(BodyOf200(endpoint_,
                      "GET /x HTTP/1.1\r\nHost: x\r\nX-HTTP-Method-Override: M-SEARCH\r\n"
                      "Connection: close\r\n\r\n"),
            "GET (as M-SEARCH) /x");
  // Other names alike are not override headers.
  EXPECT_EQ(BodyOf200(endpoint_,
                      "GET /x HTTP/1.1\r\nHost: x\r\nX-HTTP-Methods: post\r\n"
                      "X-Method-Overrides: a, b\r\nConnection: close\r\n\r\n"),
            "GET /x");
  for (const std::string fields :
       {"X-HTTP-Method-Override: POST\r\nX-HTTP-Method-Override: DELETE",
        "X-HTTP-Method: POST\r\nX-Method-Override: PUT", "X-HTTP-Method-Override: POST, PUT",
        "X-HTTP-Method-Override: POST PUT", "X-HTTP-Method-Override: post",
        "X-Method-Override: CONNECT", "X-HTTP-Method-Override: ", "X_HTTP_METHOD: Delete"}) {
    ExpectRefused(endpoint_, "GET /x HTTP/1.1\r\nHost: x\r\n" + fields + "\r\n\r\n");
  }
}

// CONNECT asks for a tunnel, which the gateway does not open: refused in any
// target form, never forwarded.
TEST_F(ServerTest, ConnectIs400AndNeverReachesTheHandler) {
  Start();
  for (const std::string target : {"/x", "example.com:443"}) {
    SCOPED_TRACE(target);
    auto conn = RawConnection::Connect(endpoint_);
    ASSERT_TRUE(conn.ok());
    ASSERT_TRUE(conn->Write("CONNECT " + target + " HTTP/1.1\r\nHost: example.com:443\r\n\r\n").ok());
    const std::string raw = conn->ReadUntilClosed(10s);
    auto res = testing::ParseResponse(raw);
    ASSERT_TRUE(res.ok()) << raw;
    EXPECT_EQ(res->status, 400);
    EXPECT_EQ(res->Header("Content-Type"), "application/problem+json");
  }
}

// Methods are case-sensitive, and an upstream that upper-cases them would
// run "post" as a POST that skipped the route's checks: refused, closed.
TEST_F(ServerTest, MethodsWithLowerCaseLettersAre400AndClose) {
  Start();
  for (const std::string method : {"post", "Post", "gET", "m-search"}) {
    SCOPED_TRACE(method);
    auto conn = RawConnection::Connect(endpoint_);
    ASSERT_TRUE(conn.ok());
    ASSERT_TRUE(conn->Write(method + " /x HTTP/1.1\r\nHost: x\r\n\r\n").ok());
    const std::string raw = conn->ReadUntilClosed(10s);
    EXPECT_TRUE(conn->closed());
    auto res = testing::ParseResponse(raw);
    ASSERT_TRUE(res.ok()) << raw;
    EXPECT_EQ(res->status, 400);
    EXPECT_EQ(res->Header("Content-Type"), "application/problem+json");
    EXPECT_EQ(res->body.find("POST /x"), std::string::npos) << res->body;
  }
  // Upper-case tokens that are not well-known methods still pass.
  for (const std::string method : {"M-SEARCH", "PROPFIND", "PURGE_1"}) {
    SCOPED_TRACE(method);
    auto res = SendRequest(endpoint_, HttpRequest{.method = method, .target = "/x"});
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(res->body, method + " /x");
  }
}

// A declared body over the limit is refused at once and the connection
// closes (the body is not read first).
TEST_F(ServerTest, DeclaredBodyOverTheLimitIs413AndCloses) {
  Start();
  auto conn = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(conn->Write("POST /limited HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n" +
                          std::string(20, 'z'))
                  .ok());
  const std::string raw = conn->ReadUntilClosed(10s);
  EXPECT_TRUE(conn->closed());
  auto res = testing::ParseResponse(raw);
  ASSERT_TRUE(res.ok()) << raw;
  EXPECT_EQ(res->status, 413);
  EXPECT_EQ(res->Header("Connection"), "close");
  // Within the limit the connection stays open.
  HttpClient client(endpoint_);
  for (int i = 0; i < 2; ++i) {
    auto ok = client.Send(HttpRequest{.method = "POST", .target = "/limited", .body = "0123456789"});
    ASSERT_TRUE(ok.ok()) << ok.status().ToString();
    EXPECT_EQ(ok->status, 200);
    EXPECT_TRUE(ok->keep_alive);
  }
  EXPECT_EQ(client.connections_opened(), 1);
}

// A request target longer than the header limit is 414, not 431, however
// its bytes arrive; a request line that fits with fields that do not is
// still 431.
TEST_F(ServerTest, RequestTargetPastTheHeaderLimitIs414) {
  http::Limits limits;
  limits.max_header_bytes = 2048;
  Start(limits);
  const std::string request = "GET /" + std::string(4096, 'p') + " HTTP/1.1\r\nHost: x\r\n\r\n";
  for (std::size_t piece : {request.size(), std::size_t{1000}}) {
    SCOPED_TRACE(piece);
    auto conn = RawConnection::Connect(endpoint_);
    ASSERT_TRUE(conn.ok());
    for (std::size_t at = 0; at < request.size(); at += piece) {
      if (!conn->Write(std::string_view(request).substr(at, piece)).ok()) break;
      if (piece < request.size()) std::this_thread::sleep_for(20ms);
    }
    const std::string raw = conn->ReadUntilClosed(10s);
    EXPECT_TRUE(conn->closed());
    auto res = testing::ParseResponse(raw);
    ASSERT_TRUE(res.ok()) << raw.substr(0, 300);
    EXPECT_EQ(res->status, 414);
    EXPECT_NE(res->body.find("urn:idemgate:problem:uri-too-long"), std::string::npos) << res->body;
  }
  auto conn = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(conn->Write("GET /short HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(4096, 'a') + "\r\n\r\n").ok());
  auto res = testing::ParseResponse(conn->ReadUntilClosed(10s));
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(res->status, 431);
}

TEST_F(ServerTest, UnansweredRequestGets500) {
  Start();
  auto res = SendRequest(endpoint_, HttpRequest{.target = "/silent"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 500);
}

TEST_F(ServerTest, StopLetsInFlightRequestsFinishAndClosesIdleConnections) {
  Start();
  auto idle = RawConnection::Connect(endpoint_);
  ASSERT_TRUE(idle.ok());
  std::optional<StatusOr<testing::HttpResponse>> result;
  std::thread client([&] { result.emplace(SendRequest(endpoint_, HttpRequest{.target = "/sleep"})); });
  ASSERT_TRUE(PollUntil([&] { return handler_.started.load() == 1; }, 10s));
  EXPECT_TRUE(server_->Stop(5s));
  client.join();
  ASSERT_TRUE(result.has_value());
  ASSERT_TRUE(result->ok()) << result->status().ToString();
  EXPECT_EQ((*result)->status, 200);
  EXPECT_FALSE((*result)->keep_alive);
  (void)idle->ReadUntilClosed(5s);
  EXPECT_TRUE(idle->closed());
  EXPECT_EQ(server_->open_connections(), 0u);
}

TEST_F(ServerTest, StopAfterGraceCutsWhatIsLeft) {
  Start();
  std::thread client([&] { (void)SendRequest(endpoint_, HttpRequest{.target = "/sleep"}, 10s); });
  ASSERT_TRUE(PollUntil([&] { return handler_.started.load() == 1; }, 10s));
  EXPECT_FALSE(server_->Stop(0ms));
  client.join();
  EXPECT_EQ(server_->open_connections(), 0u);
}

TEST_F(ServerTest, EphemeralPortIsSharedByEveryWorker) {
  http::ServerOptions options;
  options.workers = 3;
  http::Server server(options);
  TestHandler handler;
  auto bound = server.Listen("127.0.0.1", 0, handler, true);
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  EXPECT_NE(bound->port, 0);
  server.Start();
  for (int i = 0; i < 12; ++i) {
    auto res = SendRequest({"127.0.0.1", bound->port}, HttpRequest{.target = "/w"});
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_EQ(res->status, 200);
  }
  EXPECT_TRUE(server.Stop(1s));
}

TEST_F(ServerTest, WorkerHooksRunOnEachWorkerThreadAroundItsLoop) {
  // on_worker_start runs on the worker thread before it serves anything, and
  // Start returns only after every worker ran it (here the hooks take 0, 100
  // and 200 ms, so a worker could serve long before the last one is ready);
  // on_worker_stop runs on the same thread after it stopped, with its
  // io_context still there (stores bind per-thread resources to it).
  struct Seen {
    std::mutex mu;
    std::map<boost::asio::io_context*, std::thread::id> started;
    std::map<boost::asio::io_context*, std::thread::id> stopped;
    std::atomic<int> calls{0};
  } seen;
  http::ServerOptions options;
  options.workers = 3;
  options.on_worker_start = [&seen](boost::asio::io_context& io) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100) * seen.calls.fetch_add(1));
    std::lock_guard lock(seen.mu);
    seen.started[&io] = std::this_thread::get_id();
  };
  options.on_worker_stop = [&seen](boost::asio::io_context& io) {
    EXPECT_TRUE(io.stopped());
    std::lock_guard lock(seen.mu);
    seen.stopped[&io] = std::this_thread::get_id();
  };
  http::Server server(options);
  TestHandler handler;
  auto bound = server.Listen("127.0.0.1", 0, handler, true);
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  server.Start();
  auto res = SendRequest({"127.0.0.1", bound->port}, HttpRequest{.target = "/w"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  {
    std::lock_guard lock(seen.mu);
    EXPECT_EQ(seen.started.size(), 3u);
    EXPECT_TRUE(seen.stopped.empty());
    for (const auto& [io, thread] : seen.started) EXPECT_NE(thread, std::this_thread::get_id());
  }
  EXPECT_TRUE(server.Stop(1s));
  std::lock_guard lock(seen.mu);
  EXPECT_EQ(seen.stopped, seen.started);
}

}  // namespace
}  // namespace idemgate::httptest
