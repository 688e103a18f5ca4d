#pragma once

#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fakes/testing.h"

// Shared by the integration tests: the real idemgate binary and fake_upstream
// as child processes on port 0, and assertions on what they answer.
// IDEMGATE_BIN and IDEMGATE_FAKE_UPSTREAM_PATH come from CMake.
namespace idemgate::testing {

// Parses `body` as a JSON object; adds a test failure and returns {} otherwise.
boost::json::object ParseObject(const std::string& body);

// Asserts the RFC 9457 shape of SPEC §4.5 with `status` and, unless empty, `code`.
void ExpectProblem(const HttpResponse& res, int status, const std::string& code);

// Every value of `name` in `headers`, in order.
std::vector<std::string> Values(const std::vector<HeaderField>& headers, std::string_view name);
// The [name, value] pairs fake_upstream's /echo reports, in order.
std::vector<HeaderField> EchoedHeaders(boost::json::object& echo);

// Asserts that fake_upstream's /echo answer `res` saw the caller as exactly
// one X-Tenant-Id, X-Project-Id and X-Subject with these values.
void ExpectUpstreamIdentity(const HttpResponse& res, const std::string& tenant, const std::string& project,
                            const std::string& subject);

// fake_upstream on 127.0.0.1:0 with `threads` I/O threads.
StatusOr<Server> StartFakeUpstream(const TempDir& dir, int threads = 2, std::string_view name = "fake");

// One idemgate process started from a YAML text. Its stdout and stderr go to
// files in `dir`; on failure the tests print their tails (DumpLogs).
class GatewayProcess {
 public:
  // Writes `yaml` to dir/<name>.yaml and starts idemgate on it, waiting for
  // its ready file. `env` is added to the environment.
  static StatusOr<GatewayProcess> Start(const TempDir& dir, const std::string& yaml,
                                        std::vector<std::pair<std::string, std::string>> env = {},
                                        std::string_view name = "idemgate");

  GatewayProcess(GatewayProcess&&) noexcept = default;
  GatewayProcess& operator=(GatewayProcess&&) noexcept = default;

  const HostPort& endpoint() const { return endpoint_; }
  // The admin listener; fails the test when the config had none.
  HostPort admin() const;
  Process& process() { return server_.process; }

  // SIGTERM, then waits up to `timeout`; adds a test failure unless it exits 0.
  void Stop(Millis timeout = 30s);
  // SIGKILL, no shutdown at all.
  void Kill() { server_.process.Kill(); }
  // Prints the last `max_bytes` of its stdout and stderr to stderr.
  void DumpLogs(std::size_t max_bytes = 6000) const;
  // Its stdout so far (the JSON log lines).
  std::string Stdout() const { return ReadFileOrEmpty(stdout_path_); }

 private:
  GatewayProcess(Server server, std::string stdout_path, std::string stderr_path);

  Server server_;
  HostPort endpoint_;
  std::string stdout_path_;
  std::string stderr_path_;
};

// A loopback port where connections are refused for as long as this object
// lives: a socket is bound to it but never listens, so no other process can
// take the port meanwhile (PickFreePort alone leaves that race open).
class RefusingPort {
 public:
  RefusingPort();
  ~RefusingPort();
  RefusingPort(const RefusingPort&) = delete;
  RefusingPort& operator=(const RefusingPort&) = delete;
  std::uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

// A suite whose tests share one fake_upstream, started before the first
// test and stopped after the last; its counters are zeroed before each test.
// Suites that need more in SetUpTestSuite call the base's first.
class FakeUpstreamSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { StartFake(4); }
  static void TearDownTestSuite();
  // Starts the shared fake_upstream with `threads` I/O threads.
  static void StartFake(int threads);
  void SetUp() override;

  static TempDir* fake_dir_;
  static Server* fake_;
  HostPort fake_endpoint_;  // set by SetUp
};

// The top of a test gateway's config, up to and including "routes:": two
// workers, an admin listener, JSON info logs and one upstream `fake`.
struct ConfigHead {
  std::string listen = "127.0.0.1:0";
  std::string admin = "{ listen: 127.0.0.1:0 }";
  std::string store = "{ kind: memory }";
  std::string identity = "{ mode: none }";  // a flow mapping, or a block starting with "\n"
  std::string upstream = "timeout: 10s";    // the fake upstream's keys after its url
};
std::string GatewayConfigHead(const HostPort& fake, const ConfigHead& head = {});

// A FakeUpstreamSuite whose tests each start one gateway (StartGateway) that
// is stopped after the test, its logs printed when the test failed.
class GatewaySuite : public FakeUpstreamSuite {
 protected:
  void TearDown() override;
  // Starts idemgate on `yaml` (with `env` added) as gateway_; fails the test
  // when it does not become ready.
  void StartGateway(const std::string& yaml, std::vector<std::pair<std::string, std::string>> env = {});
  // Sends `req` to the gateway; a failure to get a response fails the test.
  HttpResponse Send(const HttpRequest& req);
  // Requests fake_upstream executed since the test began.
  std::uint64_t Executions();
  // The gateway's /metrics page (the config needs an admin listener).
  std::string Metrics();

  TempDir dir_;
  std::optional<GatewayProcess> gateway_;
};

// A POST with `Idempotency-Key: "<key>"` (no header when `key` is empty),
// Content-Type application/json and `body`.
HttpRequest KeyedPost(std::string target, std::string_view key, std::string body = "{}");

// The value of `metric` (exact series text, e.g.
// `idempotency_cache_hit_total{route="pay",status="200"}`) in a Prometheus
// text page; nullopt when absent.
std::optional<double> MetricValue(std::string_view page, std::string_view series);

}  // namespace idemgate::testing
