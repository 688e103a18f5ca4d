// The gateway pipeline in process: Server + Gateway + hooks in front of the
// test upstream.
#include "gateway/gateway.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <set>
#include <boost/json.hpp>
#include <thread>

#include "admin/gateway_metrics.h"
#include "common/log.h"
#include "fakes/testing.h"
#include "http/problem.h"
#include "test_upstream.h"

namespace idemgate::gateway {
namespace {

using namespace std::chrono_literals;
using idemgate::testing::HttpClient;
using idemgate::testing::HttpRequest;
using idemgate::testing::HttpResponse;
using idemgate::testing::PollUntil;
using idemgate::testing::SendRequest;
using httptest::TestUpstream;
namespace json = boost::json;

config::Route MakeRoute(std::string id, std::string prefix) {
  config::Route r;
  r.id = std::move(id);
  r.match.path_prefix = std::move(prefix);
  r.upstream = "app";
  return r;
}

config::Config MakeConfig(std::uint16_t port, std::vector<config::Route> routes) {
  config::Config c;
  config::Upstream app;
  app.name = "app";
  app.host = "127.0.0.1";
  app.port = port;
  app.timeout = 10s;
  c.upstreams["app"] = app;
  c.routes = std::move(routes);
  return c;
}

class ObserverLog final : public http::ForwardObserver {
 public:
  explicit ObserverLog(std::atomic<int>* responses, std::atomic<int>* finished, std::atomic<int>* last_status,
                       std::atomic<int>* last_outcome)
      : responses_(responses), finished_(finished), last_status_(last_status), last_outcome_(last_outcome) {}
  http::Task<void> OnResponse(http::CapturedResponse& captured) override {
    last_status_->store(captured.response.status);
    responses_->fetch_add(1);
    co_return;
  }
  http::Task<void> OnFinished(const http::ForwardResult& result) override {
    last_outcome_->store(static_cast<int>(result.outcome));
    if (result.status != 0) last_status_->store(result.status);
    finished_->fetch_add(1);
    co_return;
  }

 private:
  std::atomic<int>* responses_;
  std::atomic<int>* finished_;
  std::atomic<int>* last_status_;
  std::atomic<int>* last_outcome_;
};

// /replay answers itself; everything else is forwarded with a rewritten key
// header and an observer. Wants the body of POSTs.
class TestIdempotencyHook final : public IdempotencyHook {
 public:
  bool WantsBody(RequestContext& ctx) override { return ctx.head->method == "POST"; }
  Task<IdempotencyDecision> Decide(RequestContext& ctx) override {
    decided.fetch_add(1);
    if (ctx.head->path == "/echo/replay") {
      http::Response r;
      r.status = 201;
      // A stored response may hold the original request's id.
      r.headers = {{"Idempotent-Replayed", "true"}, {"Content-Type", "text/plain"}, {"X-Request-Id", "original"}};
      r.body = "stored";
      ctx.log.cache_hit = true;
      co_return IdempotencyDecision::Respond(std::move(r));
    }
    if (ctx.body_buffered) {
      std::lock_guard lock(mu);
      last_body = std::string(ctx.body);
    }
    IdempotencyDecision d = IdempotencyDecision::Forward();
    d.forward.set_headers = {{"Idempotency-Key", "scoped:" + std::string(ctx.route->id)}};
    d.forward.add_response_headers = {{"X-Operation-Id", "op_test"}};
    d.observer = std::make_unique<ObserverLog>(&responses, &finished, &last_status, &last_outcome);
    ctx.log.operation_id = "op_test";
    co_return d;
  }

  std::atomic<int> decided{0};
  std::atomic<int> responses{0};
  std::atomic<int> finished{0};
  std::atomic<int> last_status{0};
  std::atomic<int> last_outcome{-1};
  std::mutex mu;
  std::string last_body;
};

class GatewayTest : public ::testing::Test {
 protected:
  void Start(const config::Config& config, IdempotencyHook* hook = nullptr,
             admin::GatewayMetrics* metrics = nullptr) {
    http::ServerOptions options;
    options.workers = 2;
    options.tick = 20ms;
    options.limits = LimitsFromConfig(config);
    server_.emplace(options);
    GatewayOptions gateway_options;
    gateway_options.workers = server_->worker_count();
    gateway_options.idempotency = hook;
    gateway_options.metrics = metrics;
    auto gateway = Gateway::Create(config, gateway_options);
    ASSERT_TRUE(gateway.ok()) << gateway.status().ToString();
    gateway_ = std::move(*gateway);
    auto bound = server_->Listen("127.0.0.1", 0, *gateway_, true);
    ASSERT_TRUE(bound.ok()) << bound.status().ToString();
    endpoint_ = {"127.0.0.1", bound->port};
    server_->Start();
  }
  void TearDown() override {
    if (server_) server_->Stop(2s);
    if (gateway_) gateway_->ClosePools();
  }

  TestUpstream upstream_;
  std::optional<http::Server> server_;
  std::unique_ptr<Gateway> gateway_;
  testing::HostPort endpoint_;
};

void ExpectProblem(const HttpResponse& res, int status, const std::string& code) {
  SCOPED_TRACE(res.body);
  EXPECT_EQ(res.status, status);
  EXPECT_EQ(res.Header("Content-Type"), "application/problem+json");
  json::value v = json::parse(res.body);
  EXPECT_EQ(v.at("code").as_string(), code);
}

TEST_F(GatewayTest, UnmatchedPathIs404NoRoute) {
  Start(MakeConfig(upstream_.port(), {MakeRoute("echo", "/echo")}));
  auto res = SendRequest(endpoint_, HttpRequest{.method = "POST", .target = "/elsewhere", .body = "x"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ExpectProblem(*res, 404, "no-route");
  EXPECT_EQ(upstream_.requests(), 0);
}

// Everything written to `fd` so far.
std::string ReadAll(int fd) {
  std::string text;
  char buf[8192];
  ssize_t n;
  off_t off = 0;
  while ((n = ::pread(fd, buf, sizeof(buf), off)) > 0) {
    text.append(buf, static_cast<std::size_t>(n));
    off += n;
  }
  return text;
}

// The request lines in `text`, parsed.
std::vector<json::object> RequestLines(const std::string& text) {
  std::vector<json::object> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    json::value v = json::parse(text.substr(pos, end - pos));
    if (v.at("msg").as_string() == "request") out.push_back(v.as_object());
    pos = end + 1;
  }
  return out;
}

// The log sent to a temporary file at info level while this lives; then
// back to stdout, the file removed.
class LogCapture {
 public:
  LogCapture() : fd_(::mkstemp(path_)) {
    if (fd_ < 0) return;
    SetLogFd(fd_);
    SetLogLevel(LogLevel::kInfo);
  }
  ~LogCapture() {
    SetLogFd(1);
    if (fd_ < 0) return;
    ::close(fd_);
    ::unlink(path_);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  bool ok() const { return fd_ >= 0; }
  std::string Text() const { return ReadAll(fd_); }
  // Polls (up to 5 s) until at least `n` request lines were logged; false
  // if they were not. `lines` holds the request lines read last.
  bool WaitForRequestLines(std::size_t n, std::vector<json::object>& lines) const {
    return PollUntil(
        [&] {
          lines = RequestLines(Text());
          return lines.size() >= n;
        },
        5s);
  }

 private:
  char path_[40] = "/tmp/idemgate-gateway-log-XXXXXX";
  int fd_;
};

TEST_F(GatewayTest, ProxiesAndWritesOneLogLinePerRequest) {
  LogCapture log;
  ASSERT_TRUE(log.ok());
  Start(MakeConfig(upstream_.port(), {MakeRoute("echo", "/echo")}));
  HttpRequest req{.method = "POST", .target = "/echo/x?q=1", .body = "hi"};
  req.headers = {{"X-Request-Id", "req-77"}};
  auto res = SendRequest(endpoint_, req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->body, "hi");
  auto missing = SendRequest(endpoint_, HttpRequest{.target = "/nope"});
  ASSERT_TRUE(missing.ok());
  std::string text;
  const bool two_lines = PollUntil(
      [&] {
        text = log.Text();
        return std::count(text.begin(), text.end(), '\n') >= 2;
      },
      5s);
  ASSERT_TRUE(two_lines) << text;
  // Each line is written once its response went out, by the worker that
  // served it: the second request's line may come first.
  const auto nl = text.find('\n');
  std::string first_line = text.substr(0, nl);
  std::string second_line = text.substr(nl + 1, text.find('\n', nl + 1) - nl - 1);
  if (first_line.find("\"path\":\"/nope\"") != std::string::npos) std::swap(first_line, second_line);
  json::value first = json::parse(first_line);
  EXPECT_EQ(first.at("route").as_string(), "echo");
  EXPECT_EQ(first.at("method").as_string(), "POST");
  EXPECT_EQ(first.at("path").as_string(), "/echo/x");
  EXPECT_EQ(first.at("status").as_int64(), 200);
  EXPECT_EQ(first.at("upstream_status").as_int64(), 200);
  EXPECT_EQ(first.at("request_id").as_string(), "req-77");
  EXPECT_EQ(first.at("outcome").as_string(), "completed");
  EXPECT_EQ(first.at("idempotency_policy").as_string(), "optional");
  json::value second = json::parse(second_line);
  EXPECT_TRUE(second.at("route").is_null());
  EXPECT_EQ(second.at("status").as_int64(), 404);
  EXPECT_EQ(second.at("outcome").as_string(), "no_route");
  EXPECT_EQ(second.at("request_id").as_string().size(), 32u);
  // Each client got the id its line has.
  EXPECT_EQ(res->Header("X-Request-Id"), "req-77");
  EXPECT_EQ(missing->Header("X-Request-Id"), std::string(second.at("request_id").as_string()));
}

// A method override header names the method frameworks run the request as:
// routes are matched by it, while the log keeps the request line's method
// and the upstream gets the request as sent. The request line's method must
// lead to the same route (an upstream that ignores the header runs that
// one), or the request is refused.
TEST_F(GatewayTest, RoutesMatchTheMethodAMethodOverrideHeaderNames) {
  LogCapture log;
  ASSERT_TRUE(log.ok());
  config::Route writes = MakeRoute("writes", "/echo/w");
  writes.match.methods = {"POST", "PUT"};
  config::Route posts = MakeRoute("posts", "/echo");
  posts.match.methods = {"POST"};
  config::Route deletes = MakeRoute("deletes", "/gone");
  deletes.match.methods = {"DELETE"};
  Start(MakeConfig(upstream_.port(), {writes, posts, deletes, MakeRoute("rest", "/echo")}));
  HttpRequest overridden{.method = "PUT", .target = "/echo/w", .body = "hi"};
  overridden.headers = {{"X-HTTP-Method-Override", "POST"}, {"X-Request-Id", "override-1"}};
  auto res = SendRequest(endpoint_, overridden);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "hi");
  HttpRequest plain{.method = "PUT", .target = "/echo/x", .body = "hi"};
  plain.headers = {{"X-Request-Id", "plain-1"}};
  ASSERT_TRUE(SendRequest(endpoint_, plain).ok());
  // PUT /echo/x is for `rest`, POST /echo/x for `posts`: which one runs
  // depends on the upstream, so neither is taken.
  HttpRequest split{.method = "PUT", .target = "/echo/x", .body = "hi"};
  split.headers = {{"X-HTTP-Method-Override", "POST"}};
  auto refused = SendRequest(endpoint_, split);
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  ExpectProblem(*refused, 400, "bad-request");
  EXPECT_NE(refused->body.find("are for different routes"), std::string::npos) << refused->body;
  // A DELETE route does not take a GET that a framework would run as a POST.
  HttpRequest not_delete{.target = "/gone"};
  not_delete.headers = {{"X-Method-Override", "POST"}};
  auto missing = SendRequest(endpoint_, not_delete);
  ASSERT_TRUE(missing.ok()) << missing.status().ToString();
  ExpectProblem(*missing, 404, "no-route");
  EXPECT_NE(missing->body.find("no route matches POST /gone"), std::string::npos) << missing->body;
  std::vector<json::object> lines;
  ASSERT_TRUE(log.WaitForRequestLines(4, lines));
  std::map<std::string, json::object> by_id;
  for (const json::object& line : lines) by_id[std::string(line.at("request_id").as_string())] = line;
  ASSERT_EQ(by_id.count("override-1"), 1u);
  EXPECT_EQ(by_id["override-1"].at("route").as_string(), "writes");
  EXPECT_EQ(by_id["override-1"].at("method").as_string(), "PUT");
  ASSERT_EQ(by_id.count("plain-1"), 1u);
  EXPECT_EQ(by_id["plain-1"].at("route").as_string(), "rest");
}

// Every answer carries the X-Request-Id its log line has, so that a client
// holding any of them can quote it: forwarded, made by a hook (a replay of a
// response that held another id), refused by the gateway (404, 413).
TEST_F(GatewayTest, EveryResponseCarriesTheRequestIdItIsLoggedUnder) {
  TestIdempotencyHook hook;
  auto small = MakeRoute("small", "/small");
  small.max_request_bytes = 1;
  Start(MakeConfig(upstream_.port(), {MakeRoute("echo", "/echo"), small}), &hook);
  HttpRequest with_id{.method = "POST", .target = "/echo/x", .body = "hi"};
  with_id.headers = {{"X-Request-Id", "req-77"}};
  const std::vector<HttpRequest> requests = {
      with_id,
      HttpRequest{.method = "POST", .target = "/echo/x", .body = "hi"},
      HttpRequest{.method = "POST", .target = "/echo/replay", .body = "b"},
      HttpRequest{.target = "/nope"},
      HttpRequest{.method = "POST", .target = "/small", .body = "too long"},
  };
  const std::vector<int> statuses = {200, 200, 201, 404, 413};
  std::set<std::string> ids;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE(requests[i].target);
    auto res = SendRequest(endpoint_, requests[i]);
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_EQ(res->status, statuses[i]);
    const std::vector<std::string> values = res->Headers("X-Request-Id");
    ASSERT_EQ(values.size(), 1u);
    if (i == 0) {
      EXPECT_EQ(values[0], "req-77");
    } else {
      EXPECT_EQ(values[0].size(), 32u) << values[0];
    }
    ids.insert(values[0]);
  }
  EXPECT_EQ(ids.size(), requests.size()) << "an id was answered twice";
  // The upstream was sent the same id as the client got.
  const auto seen = upstream_.last_echo();
  EXPECT_TRUE(ids.contains(seen.Values("X-Request-Id").at(0)));
}

// The value of the series `series` (its exact text) in a Prometheus page.
std::optional<double> CounterValue(const std::string& page, const std::string& series) {
  const std::size_t at = page.find("\n" + series + " ");
  if (at == std::string::npos) return std::nullopt;
  return std::stod(page.substr(at + series.size() + 2));
}

// SPEC §2.9: one log line per request, also for those the server refuses
// before routing (their answer carries the logged request id), and a
// metric for them; a header timeout is counted too (logged at debug only).
// Pins a bug: none of these left a log line or a metric.
TEST_F(GatewayTest, RequestsRefusedBeforeRoutingAreLoggedAndCounted) {
  LogCapture log;
  ASSERT_TRUE(log.ok());
  admin::GatewayMetrics metrics;
  config::Config config = MakeConfig(upstream_.port(), {MakeRoute("echo", "/echo")});
  config.limits.max_header_bytes = 1024;
  config.limits.header_timeout = 200ms;
  Start(config, nullptr, &metrics);

  struct Case {
    std::string bytes;
    int status;
    std::string outcome;
    std::optional<std::string> method;
  };
  const std::vector<Case> cases = {
      {"POST /echo/a HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(2000, 'a') + "\r\nContent-Length: 0\r\n\r\n", 431,
       "headers_too_large", "POST"},
      {"GET /" + std::string(2000, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n", 414, "uri_too_long", std::nullopt},
      {"POST /echo/a HTTP/9.9 bogus\r\nHost: x\r\n\r\n", 400, "bad_request", std::nullopt},
      {"POST /echo/a HTTP/2.0\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 505, "version_not_supported", std::nullopt},
      {"POST /echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400, "bad_request", "POST"},
      {"POST /echo/a HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 400, "bad_request", "POST"},  // no Host
  };
  std::vector<std::string> ids;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.bytes.substr(0, 40));
    auto conn = testing::RawConnection::Connect(endpoint_);
    ASSERT_TRUE(conn.ok()) << conn.status().ToString();
    ASSERT_TRUE(conn->Write(c.bytes).ok());
    auto res = testing::ParseResponse(conn->ReadUntilClosed(5s));
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_EQ(res->status, c.status);
    const std::vector<std::string> id = res->Headers("X-Request-Id");
    ASSERT_EQ(id.size(), 1u);
    ids.push_back(id[0]);
  }
  // A head that stops half way: closed without an answer after header_timeout.
  auto slow = testing::RawConnection::Connect(endpoint_);
  ASSERT_TRUE(slow.ok());
  ASSERT_TRUE(slow->Write("POST /echo/a HTTP/1.1\r\nHost: x\r\n").ok());
  EXPECT_EQ(slow->ReadUntilClosed(5s), "");
  EXPECT_TRUE(slow->closed());

  std::vector<json::object> lines;
  ASSERT_TRUE(log.WaitForRequestLines(cases.size(), lines));
  ASSERT_EQ(lines.size(), cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].outcome);
    const json::object& line = lines[i];
    EXPECT_TRUE(line.at("route").is_null());
    EXPECT_EQ(line.at("status").as_int64(), cases[i].status);
    EXPECT_EQ(line.at("outcome").as_string(), cases[i].outcome);
    EXPECT_EQ(line.at("request_id").as_string(), ids[i]);
    if (cases[i].method) {
      EXPECT_EQ(line.at("method").as_string(), *cases[i].method);
      EXPECT_EQ(line.at("path").as_string(), "/echo/a");
    }
    EXPECT_TRUE(line.at("upstream_ms").is_null());
  }
  const std::string page = metrics.RenderPrometheus();
  EXPECT_EQ(CounterValue(page, R"(idemgate_requests_refused_total{reason="headers_too_large"})"), 1.0) << page;
  EXPECT_EQ(CounterValue(page, R"(idemgate_requests_refused_total{reason="uri_too_long"})"), 1.0);
  EXPECT_EQ(CounterValue(page, R"(idemgate_requests_refused_total{reason="bad_request"})"), 3.0);
  EXPECT_EQ(CounterValue(page, R"(idemgate_requests_refused_total{reason="version_not_supported"})"), 1.0);
  EXPECT_EQ(CounterValue(page, R"(idemgate_requests_refused_total{reason="header_timeout"})"), 1.0);
  EXPECT_EQ(upstream_.requests(), 0);
}

// An upstream exchange that timed out (504) is one the upstream was sent:
// it is in idemgate_upstream_duration_seconds, as its upstream_ms is in the
// log; one that never got a connection (502) is in neither. Pins a bug: only
// exchanges with an upstream status were recorded.
TEST_F(GatewayTest, UpstreamDurationCountsTimeoutsButNotFailedConnects) {
  LogCapture log;
  ASSERT_TRUE(log.ok());
  // A port where connections are refused: bound, never listening.
  const int refusing = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(refusing, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::getsockname(refusing, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  admin::GatewayMetrics metrics;
  auto dead = MakeRoute("dead", "/dead");
  dead.upstream = "dead";
  config::Config config = MakeConfig(upstream_.port(), {MakeRoute("slow", "/slow"), dead});
  config.upstreams["app"].timeout = 200ms;
  config::Upstream down = config.upstreams["app"];
  down.name = "dead";
  down.port = ntohs(addr.sin_port);
  config.upstreams["dead"] = down;
  Start(config, nullptr, &metrics);

  auto timed_out = SendRequest(endpoint_, HttpRequest{.target = "/slow"});
  ASSERT_TRUE(timed_out.ok()) << timed_out.status().ToString();
  EXPECT_EQ(timed_out->status, 504);
  auto refused = SendRequest(endpoint_, HttpRequest{.target = "/dead"});
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_EQ(refused->status, 502);
  ::close(refusing);

  std::vector<json::object> lines;
  ASSERT_TRUE(log.WaitForRequestLines(2, lines));
  for (const json::object& line : lines) {
    SCOPED_TRACE(json::serialize(line));
    if (line.at("route").as_string() == "slow") {
      EXPECT_EQ(line.at("outcome").as_string(), "timed_out");
      EXPECT_GE(line.at("upstream_ms").to_number<double>(), 200.0);
    } else {
      EXPECT_EQ(line.at("outcome").as_string(), "connect_failed");
      EXPECT_TRUE(line.at("upstream_ms").is_null());
    }
  }
  const std::string page = metrics.RenderPrometheus();
  EXPECT_EQ(CounterValue(page, R"(idemgate_upstream_duration_seconds_count{tenant="_",project="_",route="slow"})"),
            1.0)
      << page;
  EXPECT_EQ(CounterValue(page, R"(idemgate_upstream_duration_seconds_count{tenant="_",project="_",route="dead"})")
                .value_or(0),
            0.0);
}

// A request refused before the idempotency step (here 413) is logged with
// its route's policy and that policy's case, never one without the other.
TEST_F(GatewayTest, RefusedRequestsLogTheRoutesCaseWithItsPolicy) {
  LogCapture log;
  ASSERT_TRUE(log.ok());
  auto route = MakeRoute("echo", "/echo");
  route.max_request_bytes = 1;
  Start(MakeConfig(upstream_.port(), {route}));
  auto res = SendRequest(endpoint_, HttpRequest{.method = "POST", .target = "/echo", .body = "too long"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 413);
  std::vector<json::object> lines;
  ASSERT_TRUE(log.WaitForRequestLines(1, lines));
  EXPECT_EQ(lines[0].at("idempotency_policy").as_string(), "optional");
  EXPECT_EQ(lines[0].at("idempotency_case").as_string(), "ACCEPTED") << json::serialize(lines[0]);
}

TEST_F(GatewayTest, RouteBodyLimitIs413) {
  auto route = MakeRoute("echo", "/echo");
  route.max_request_bytes = 10;
  Start(MakeConfig(upstream_.port(), {route}));
  auto res = SendRequest(endpoint_, HttpRequest{.method = "POST", .target = "/echo", .body = std::string(11, 'x')});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ExpectProblem(*res, 413, "request-too-large");
  res = SendRequest(endpoint_, HttpRequest{.method = "POST", .target = "/echo", .body = std::string(10, 'x')});
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(res->status, 200);
}

TEST_F(GatewayTest, IdempotencyHookCanAnswerWithoutTheUpstream) {
  TestIdempotencyHook hook;
  Start(MakeConfig(upstream_.port(), {MakeRoute("echo", "/echo")}), &hook);
  auto res = SendRequest(endpoint_, HttpRequest{.method = "POST", .target = "/echo/replay", .body = "b"});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 201);
  EXPECT_EQ(res->body, "stored");
  EXPECT_EQ(res->Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(upstream_.requests(), 0);
}

TEST_F(GatewayTest, IdempotencyHookForwardsWithChangesAndObservesTheResponse) {
  TestIdempotencyHook hook;
  Start(MakeConfig(upstream_.port(), {MakeRoute("echo", "/echo")}), &hook);
  HttpRequest req{.method = "POST", .target = "/echo", .body = "fingerprint me"};
  req.headers = {{"Idempotency-Key", "raw"}, {"Transfer-Encoding", "chunked"}};
  auto res = SendRequest(endpoint_, req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "fingerprint me");
  EXPECT_EQ(res->Header("X-Operation-Id"), "op_test");
  {
    std::lock_guard lock(hook.mu);
    EXPECT_EQ(hook.last_body, "fingerprint me");
  }
  const auto seen = upstream_.last_echo();
  EXPECT_EQ(seen.Values("Idempotency-Key"), (std::vector<std::string>{"scoped:echo"}));
  EXPECT_EQ(seen.Values("Content-Length"), (std::vector<std::string>{"14"}));
  ASSERT_TRUE(PollUntil([&] { return hook.finished.load() == 1; }, 5s));
  EXPECT_EQ(hook.responses.load(), 1);
  EXPECT_EQ(hook.last_outcome.load(), static_cast<int>(http::ForwardOutcome::kCompleted));
}

TEST_F(GatewayTest, AdmissionRefusesOverMaxInFlightAndTellsTheObserver) {
  TestIdempotencyHook hook;
  auto route = MakeRoute("gated", "/gated");
  route.max_in_flight = 1;
  Start(MakeConfig(upstream_.port(), {route}), &hook);
  std::optional<StatusOr<HttpResponse>> first;
  std::thread holder([&] { first.emplace(SendRequest(endpoint_, HttpRequest{.target = "/gated?n=10&first=5"})); });
  ASSERT_TRUE(PollUntil([&] { return upstream_.requests() == 1; }, 10s));
  auto refused = SendRequest(endpoint_, HttpRequest{.target = "/gated?n=10&first=5"});
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  ExpectProblem(*refused, 429, "too-many-requests");
  EXPECT_EQ(refused->Header("Retry-After"), "1");
  ASSERT_TRUE(PollUntil([&] { return hook.finished.load() == 1; }, 5s));
  EXPECT_EQ(hook.last_outcome.load(), static_cast<int>(http::ForwardOutcome::kNotForwarded));
  EXPECT_EQ(hook.last_status.load(), 429);
  upstream_.OpenGate();
  holder.join();
  ASSERT_TRUE(first.has_value() && first->ok());
  EXPECT_EQ((*first)->status, 200);
  EXPECT_EQ(upstream_.requests(), 1);
  // The slot is free again.
  auto again = SendRequest(endpoint_, HttpRequest{.target = "/gated?n=10&first=5"});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->status, 200);
}

TEST_F(GatewayTest, ReloadSwapsTheRouteTableAndKeepsPools) {
  Start(MakeConfig(upstream_.port(), {MakeRoute("old", "/echo/old")}));
  HttpClient client(endpoint_);
  auto res = client.Send(HttpRequest{.target = "/echo/old"});
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(res->status, 200);
  const auto before = gateway_->snapshot()->version;
  ASSERT_TRUE(gateway_->Reload(MakeConfig(upstream_.port(), {MakeRoute("new", "/echo/new")})).ok());
  EXPECT_GT(gateway_->snapshot()->version, before);
  res = client.Send(HttpRequest{.target = "/echo/old"});
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(res->status, 404);
  res = client.Send(HttpRequest{.target = "/echo/new"});
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(client.connections_opened(), 1);
  // Same upstream settings: the worker's pool and its connection were kept.
  EXPECT_EQ(upstream_.connections(), 1);

  auto broken = MakeConfig(upstream_.port(), {MakeRoute("x", "/x")});
  broken.routes[0].upstream = "missing";
  EXPECT_FALSE(gateway_->Reload(broken).ok());
  res = client.Send(HttpRequest{.target = "/echo/new"});
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(res->status, 200);
}

// A reload that changes only an upstream's keepalive takes effect: its pool
// is replaced, not kept with the old setting.
TEST_F(GatewayTest, AReloadThatChangesKeepaliveReplacesThePool) {
  Start(MakeConfig(upstream_.port(), {MakeRoute("r", "/echo/")}));
  HttpClient client(endpoint_);
  for (int i = 0; i < 2; ++i) ASSERT_EQ(client.Send(HttpRequest{.target = "/echo/a"})->status, 200);
  EXPECT_EQ(upstream_.connections(), 1);
  auto closing = MakeConfig(upstream_.port(), {MakeRoute("r", "/echo/")});
  closing.upstreams["app"].keepalive = false;
  ASSERT_TRUE(gateway_->Reload(closing).ok());
  for (int i = 0; i < 2; ++i) ASSERT_EQ(client.Send(HttpRequest{.target = "/echo/b"})->status, 200);
  EXPECT_EQ(upstream_.connections(), 3);  // a connection of its own for each
  ASSERT_TRUE(gateway_->Reload(MakeConfig(upstream_.port(), {MakeRoute("r", "/echo/")})).ok());
  for (int i = 0; i < 2; ++i) ASSERT_EQ(client.Send(HttpRequest{.target = "/echo/c"})->status, 200);
  EXPECT_EQ(upstream_.connections(), 4);  // pooled again
}

TEST(GatewayConfigTest, UpstreamConnectionsAreSplitAcrossWorkers) {
  config::Upstream u;
  u.name = "u";
  u.max_connections = 256;
  EXPECT_EQ(UpstreamTargetFromConfig(u, 2).max_connections, 128u);
  EXPECT_EQ(UpstreamTargetFromConfig(u, 3).max_connections, 86u);
  u.max_connections = 1;
  EXPECT_EQ(UpstreamTargetFromConfig(u, 4).max_connections, 1u);
  config::Config c;
  c.limits.max_header_bytes = 1234;
  EXPECT_EQ(LimitsFromConfig(c).max_header_bytes, 1234u);
}

}  // namespace
}  // namespace idemgate::gateway
