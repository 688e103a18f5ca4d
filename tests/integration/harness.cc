#include "integration/harness.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <charconv>
#include <iostream>

namespace idemgate::testing {

namespace json = boost::json;

json::object ParseObject(const std::string& body) {
  boost::system::error_code ec;
  json::value v = json::parse(body, ec);
  if (ec || !v.is_object()) {
    ADD_FAILURE() << "not a JSON object: " << body;
    return {};
  }
  return std::move(v.as_object());
}

void ExpectProblem(const HttpResponse& res, int status, const std::string& code) {
  SCOPED_TRACE("problem response: " + res.body);
  EXPECT_EQ(res.status, status);
  const auto content_type = res.Header("Content-Type").value_or("");
  EXPECT_TRUE(content_type.starts_with("application/problem+json")) << content_type;
  auto o = ParseObject(res.body);
  ASSERT_TRUE(o.contains("type") && o["type"].is_string());
  ASSERT_TRUE(o.contains("title") && o["title"].is_string());
  ASSERT_TRUE(o.contains("status") && o["status"].is_int64());
  ASSERT_TRUE(o.contains("detail") && o["detail"].is_string());
  ASSERT_TRUE(o.contains("code") && o["code"].is_string());
  EXPECT_EQ(o["status"].as_int64(), status);
  EXPECT_FALSE(o["title"].as_string().empty());
  const std::string actual_code(o["code"].as_string());
  EXPECT_EQ(std::string(o["type"].as_string()), "urn:idemgate:problem:" + actual_code);
  if (!code.empty()) {
    EXPECT_EQ(actual_code, code);
  }
}

std::vector<std::string> Values(const std::vector<HeaderField>& headers, std::string_view name) {
  std::vector<std::string> out;
  for (const auto& h : headers) {
    if (IEquals(h.name, name)) out.push_back(h.value);
  }
  return out;
}

std::vector<HeaderField> EchoedHeaders(json::object& echo) {
  std::vector<HeaderField> out;
  if (!echo.contains("headers")) return out;
  for (const auto& h : echo["headers"].as_array()) {
    out.push_back({json::value_to<std::string>(h.as_array()[0]), json::value_to<std::string>(h.as_array()[1])});
  }
  return out;
}

StatusOr<Server> StartFakeUpstream(const TempDir& dir, int threads, std::string_view name) {
  return StartServer(IDEMGATE_FAKE_UPSTREAM_PATH, {"--port", "0", "--threads", std::to_string(threads)},
                     dir.Join(std::string(name) + ".ready"));
}

GatewayProcess::GatewayProcess(Server server, std::string stdout_path, std::string stderr_path)
    : server_(std::move(server)), stdout_path_(std::move(stdout_path)), stderr_path_(std::move(stderr_path)) {
  auto endpoint = server_.Endpoint("listen");
  if (endpoint.ok()) endpoint_ = *endpoint;
}

StatusOr<GatewayProcess> GatewayProcess::Start(const TempDir& dir, const std::string& yaml,
                                               std::vector<std::pair<std::string, std::string>> env,
                                               std::string_view name) {
  const std::string base(name);
  auto config = WriteConfig(dir, yaml, base + ".yaml");
  if (!config.ok()) return config.status();
  ProcessOptions options;
  options.stdout_path = dir.Join(base + ".out");
  options.stderr_path = dir.Join(base + ".err");
  options.env = std::move(env);
  auto server = StartServer(IDEMGATE_BIN, {"--config", *config}, dir.Join(base + ".ready"), options);
  if (!server.ok()) {
    return Status(server.status().code(), server.status().message() + "\nstderr:\n" +
                                              ReadFileOrEmpty(options.stderr_path) + "\nstdout:\n" +
                                              ReadFileOrEmpty(options.stdout_path));
  }
  return GatewayProcess(std::move(*server), options.stdout_path, options.stderr_path);
}

HostPort GatewayProcess::admin() const {
  auto admin = server_.Endpoint("admin");
  EXPECT_TRUE(admin.ok()) << admin.status().ToString();
  return admin.ok() ? *admin : HostPort{};
}

void GatewayProcess::Stop(Millis timeout) {
  if (server_.process.Running()) {
    EXPECT_TRUE(server_.process.Signal(SIGTERM).ok());
  }
  auto status = server_.process.WaitExit(timeout);
  EXPECT_TRUE(status.has_value()) << "idemgate did not exit within " << timeout.count() << "ms of SIGTERM";
  if (status) {
    EXPECT_TRUE(status->exited && status->code == 0) << "idemgate ended with " << status->ToString();
  }
}

void GatewayProcess::DumpLogs(std::size_t max_bytes) const {
  for (const std::string& path : {stdout_path_, stderr_path_}) {
    std::string text = ReadFileOrEmpty(path);
    if (text.size() > max_bytes) text = "..." + text.substr(text.size() - max_bytes);
    std::cerr << "---- " << path << " ----\n" << text << "\n";
  }
}

TempDir* FakeUpstreamSuite::fake_dir_ = nullptr;
Server* FakeUpstreamSuite::fake_ = nullptr;

void FakeUpstreamSuite::StartFake(int threads) {
  fake_dir_ = new TempDir();
  auto fake = StartFakeUpstream(*fake_dir_, threads);
  ASSERT_TRUE(fake.ok()) << fake.status().ToString();
  fake_ = new Server(std::move(*fake));
}

void FakeUpstreamSuite::TearDownTestSuite() {
  delete fake_;
  fake_ = nullptr;
  delete fake_dir_;
  fake_dir_ = nullptr;
}

void FakeUpstreamSuite::SetUp() {
  ASSERT_NE(fake_, nullptr);
  fake_endpoint_ = fake_->Endpoint().value();
  ASSERT_TRUE(ResetFake(fake_endpoint_).ok());
}

void ExpectUpstreamIdentity(const HttpResponse& res, const std::string& tenant, const std::string& project,
                            const std::string& subject) {
  auto echo = ParseObject(res.body);
  const std::vector<HeaderField> seen = EchoedHeaders(echo);
  EXPECT_EQ(Values(seen, "X-Tenant-Id"), (std::vector<std::string>{tenant}));
  EXPECT_EQ(Values(seen, "X-Project-Id"), (std::vector<std::string>{project}));
  EXPECT_EQ(Values(seen, "X-Subject"), (std::vector<std::string>{subject}));
}

std::string GatewayConfigHead(const HostPort& fake, const ConfigHead& head) {
  return "listen: " + head.listen + "\nworkers: 2\nshutdown_grace: 10s\nadmin: " + head.admin +
         "\nstore: " + head.store + "\nidentity: " + head.identity +
         "\nlog: { level: info, format: json }\nupstreams:\n  fake: { url: http://" + fake.ToString() + ", " +
         head.upstream + " }\nroutes:\n";
}

void GatewaySuite::TearDown() {
  if (!gateway_) return;
  if (HasFailure()) gateway_->DumpLogs();
  gateway_->Stop();
  gateway_.reset();
}

void GatewaySuite::StartGateway(const std::string& yaml, std::vector<std::pair<std::string, std::string>> env) {
  auto g = GatewayProcess::Start(dir_, yaml, std::move(env));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  gateway_.emplace(std::move(*g));
}

HttpResponse GatewaySuite::Send(const HttpRequest& req) {
  auto res = SendRequest(gateway_->endpoint(), req);
  EXPECT_TRUE(res.ok()) << res.status().ToString();
  return res.ok() ? *res : HttpResponse{};
}

std::uint64_t GatewaySuite::Executions() {
  auto stats = FetchFakeStats(fake_endpoint_);
  EXPECT_TRUE(stats.ok()) << stats.status().ToString();
  return stats.ok() ? stats->executions : 0;
}

std::string GatewaySuite::Metrics() {
  auto res = SendRequest(gateway_->admin(), HttpRequest{.target = "/metrics"});
  EXPECT_TRUE(res.ok()) << res.status().ToString();
  return res.ok() ? res->body : "";
}

RefusingPort::RefusingPort() {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ADD_FAILURE() << "cannot bind a loopback socket: " << std::strerror(errno);
    return;
  }
  port_ = ntohs(addr.sin_port);
}

RefusingPort::~RefusingPort() {
  if (fd_ >= 0) ::close(fd_);
}

HttpRequest KeyedPost(std::string target, std::string_view key, std::string body) {
  HttpRequest req{.method = "POST", .target = std::move(target)};
  if (!key.empty()) req.headers.push_back({"Idempotency-Key", "\"" + std::string(key) + "\""});
  req.headers.push_back({"Content-Type", "application/json"});
  req.body = std::move(body);
  return req;
}

std::optional<double> MetricValue(std::string_view page, std::string_view series) {
  std::size_t pos = 0;
  while (pos < page.size()) {
    std::size_t end = page.find('\n', pos);
    if (end == std::string_view::npos) end = page.size();
    std::string_view line = page.substr(pos, end - pos);
    pos = end + 1;
    if (line.size() > series.size() && line.starts_with(series) && line[series.size()] == ' ') {
      std::string value(line.substr(series.size() + 1));
      try {
        return std::stod(value);
      } catch (...) {
        return std::nullopt;
      }
    }
  }
  return std::nullopt;
}

}  // namespace idemgate::testing
