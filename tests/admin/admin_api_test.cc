#include "admin/admin_api.h"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <exception>
#include <memory>
#include <optional>
#include <tuple>

#include "common/log.h"
#include "fakes/testing.h"
#include "http/problem.h"
#include "store/embedded/embedded_store.h"
#include "store/memory/memory_store.h"
#include "fake_store.h"

namespace idemgate::admin {
namespace {

namespace json = boost::json;
using testing::FakeStore;

constexpr char kToken[] = "s3cret-admin-token";
// 2023-11-14T22:13:20Z
constexpr UnixMillis kNow = 1'700'000'000'000;
const std::string kKey = "t-acme:shop:user:42:payments:order-1";

// Runs `task` to completion on a fresh io_context.
template <typename T>
T RunTask(core::Task<T> task) {
  boost::asio::io_context io;
  std::optional<T> out;
  std::exception_ptr error;
  boost::asio::co_spawn(
      io, [&]() -> core::Task<void> { out.emplace(co_await std::move(task)); },
      [&](std::exception_ptr e) { error = e; });
  io.run();
  if (error) std::rethrow_exception(error);
  return std::move(*out);
}

AdminResponse Call(const AdminApi& api, AdminRequest request) {
  return RunTask(api.Handle(std::move(request)));
}

AdminRequest Req(std::string method, std::string target, std::vector<core::Header> headers = {}) {
  return AdminRequest{std::move(method), std::move(target), std::move(headers)};
}

std::vector<core::Header> Bearer(std::string token) {
  return {{"Authorization", "Bearer " + token}};
}

std::optional<std::string> HeaderOf(const AdminResponse& r, std::string_view name) {
  for (const auto& h : r.headers) {
    if (h.name == name) return h.value;
  }
  return std::nullopt;
}

json::object ProblemOf(const AdminResponse& r) {
  EXPECT_EQ(r.content_type, "application/problem+json");
  return json::parse(r.body).as_object();
}

core::Record CompletedRecord() {
  core::Record r;
  r.state = core::RecordState::kCompleted;
  r.fingerprint = std::string("\x01\x02\xab\xff", 4);
  r.owner = "owner-token-0123456789abcdef";
  r.operation_id = "op-123";
  r.created_ms = kNow - 1000;
  r.lease_expires_ms = kNow + 5000;
  r.expires_ms = kNow + 86'400'000;
  r.response.status = 201;
  r.response.headers = {{"Content-Type", "application/json"}, {"Set-Cookie", "a=1"}};
  r.response.body = R"({"id":"pay_1"})";
  return r;
}

class AdminApiTest : public ::testing::Test {
 protected:
  AdminApi MakeApi(std::string token = kToken) {
    return AdminApi(AdminApi::Options{.token = std::move(token),
                                      .metrics = &metrics_,
                                      .stats = &metrics_.stats(),
                                      .store = &store_,
                                      .clock = &clock_});
  }

  FakeClock clock_{kNow};
  FakeStore store_;
  GatewayMetrics metrics_{GatewayMetricsOptions{.tenant_labels = false}};
};

// Sends the log back to stdout and returns the JSON lines written to the
// pipe `fds` meanwhile (`out`: their text).
std::vector<json::object> EndLogCapture(int fds[2], std::string& out) {
  SetLogFd(1);
  ::close(fds[1]);
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  std::vector<json::object> lines;
  std::size_t start = 0;
  for (std::size_t end; (end = out.find('\n', start)) != std::string::npos; start = end + 1) {
    lines.push_back(json::parse(out.substr(start, end - start)).as_object());
  }
  return lines;
}

TEST_F(AdminApiTest, HealthzIsOk) {
  const AdminApi api = MakeApi();
  const AdminResponse r = Call(api, Req("GET", "/healthz"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok");
  EXPECT_EQ(r.content_type, "text/plain; charset=utf-8");
  EXPECT_EQ(HeaderOf(r, "Cache-Control"), "no-store");
}

TEST_F(AdminApiTest, ReadyzFollowsTheStore) {
  AdminApi api = MakeApi();
  AdminResponse r = Call(api, Req("GET", "/readyz"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok");

  store_.Fail(UnavailableError("redis 127.0.0.1:6379: connection refused"));
  r = Call(api, Req("GET", "/readyz"));
  EXPECT_EQ(r.status, 503);
  json::object problem = ProblemOf(r);
  EXPECT_EQ(problem["code"], "store-unavailable");
  EXPECT_EQ(problem["type"], "urn:idemgate:problem:store-unavailable");
  EXPECT_EQ(problem["status"], 503);
  EXPECT_NE(std::string(problem["detail"].as_string()).find("connection refused"),
            std::string::npos);

  store_.Heal();
  api.SetDraining(true);
  r = Call(api, Req("GET", "/readyz"));
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(ProblemOf(r)["code"], "shutting-down");
  api.SetDraining(false);
  EXPECT_EQ(Call(api, Req("GET", "/readyz")).status, 200);
}

TEST_F(AdminApiTest, ReadyzWithoutAStoreIsNotReady) {
  const AdminApi api(AdminApi::Options{.metrics = &metrics_});
  EXPECT_EQ(Call(api, Req("GET", "/readyz")).status, 503);
}

TEST_F(AdminApiTest, MetricsArePrometheusText) {
  metrics_.CacheHit({.route = "payments"}, 200);
  store_.Put(kKey, CompletedRecord());
  metrics_.SetStoreStatsSource([this] { return store_.Stats(); });
  const AdminApi api = MakeApi();
  const AdminResponse r = Call(api, Req("GET", "/metrics"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_NE(r.body.find("idempotency_cache_hit_total{route=\"payments\",status=\"200\"} 1\n"),
            std::string::npos);
  EXPECT_NE(r.body.find("\nidemgate_store_keys 1\n"), std::string::npos);
  metrics_.SetStoreStatsSource(nullptr);
}

TEST_F(AdminApiTest, StatsAreJsonWithStoreFigures) {
  metrics_.RegisterRoute("orders");
  metrics_.CacheHit({.route = "payments"}, 200);
  metrics_.RequestCompleted({.route = "payments"}, 0.01);
  store_.Put(kKey, CompletedRecord());
  const AdminApi api = MakeApi();
  const AdminResponse r = Call(api, Req("GET", "/admin/stats"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "application/json");
  json::value body = json::parse(r.body);
  EXPECT_EQ(body.at("routes").at("payments").at("hits"), 1);
  EXPECT_EQ(body.at("routes").at("payments").at("requests"), 1);
  EXPECT_EQ(body.at("routes").at("orders").at("requests"), 0);
  EXPECT_EQ(body.at("totals").at("hits"), 1);
  EXPECT_EQ(body.at("store").at("keys"), 1);
  EXPECT_GT(body.at("store").at("bytes").to_number<std::uint64_t>(), 0u);
}

TEST_F(AdminApiTest, KeyInspectionNeedsTheToken) {
  store_.Put(kKey, CompletedRecord());
  const AdminApi api = MakeApi();

  AdminResponse r = Call(api, Req("GET", "/admin/keys/" + kKey));
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(ProblemOf(r)["code"], "unauthenticated");
  EXPECT_EQ(HeaderOf(r, "WWW-Authenticate"), "Bearer realm=\"idemgate-admin\"");
  EXPECT_EQ(r.body.find("pay_1"), std::string::npos);

  r = Call(api, Req("GET", "/admin/keys/" + kKey, Bearer("wrong")));
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(HeaderOf(r, "WWW-Authenticate"),
            "Bearer realm=\"idemgate-admin\", error=\"invalid_token\"");

  // A prefix of the right token is wrong too.
  r = Call(api, Req("GET", "/admin/keys/" + kKey, Bearer(std::string(kToken).substr(0, 5))));
  EXPECT_EQ(r.status, 401);

  // Two Authorization headers are refused even if one is right.
  r = Call(api, Req("GET", "/admin/keys/" + kKey,
                    {{"Authorization", std::string("Bearer ") + kToken},
                     {"authorization", "Bearer x"}}));
  EXPECT_EQ(r.status, 401);

  r = Call(api,
           Req("GET", "/admin/keys/" + kKey, {{"Authorization", std::string("Basic ") + kToken}}));
  EXPECT_EQ(r.status, 401);

  // Header name and scheme are case-insensitive.
  r = Call(api, Req("GET", "/admin/keys/" + kKey,
                    {{"authorization", std::string("bearer  ") + kToken + " "}}));
  EXPECT_EQ(r.status, 200);
}

TEST_F(AdminApiTest, KeyCallsAreRefusedWithoutAConfiguredToken) {
  store_.Put(kKey, CompletedRecord());
  const AdminApi api = MakeApi("");
  for (const char* method : {"GET", "DELETE"}) {
    const AdminResponse r = Call(api, Req(method, "/admin/keys/" + kKey, Bearer("")));
    EXPECT_EQ(r.status, 403) << method;
    json::object problem = ProblemOf(r);
    EXPECT_EQ(problem["code"], "forbidden");
    EXPECT_NE(std::string(problem["detail"].as_string()).find("no admin token configured"),
              std::string::npos);
  }
  EXPECT_EQ(store_.size(), 1u);
}

TEST_F(AdminApiTest, GetKeyShowsTheRecord) {
  store_.Put(kKey, CompletedRecord());
  const AdminApi api = MakeApi();
  const AdminResponse r = Call(api, Req("GET", "/admin/keys/" + kKey, Bearer(kToken)));
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "application/json");
  EXPECT_EQ(HeaderOf(r, "Cache-Control"), "no-store");
  json::value v = json::parse(r.body);
  EXPECT_EQ(v.at("key"), json::value(kKey));
  EXPECT_EQ(v.at("scope").at("tenant"), "acme");
  EXPECT_EQ(v.at("scope").at("project"), "shop");
  EXPECT_EQ(v.at("scope").at("subject"), "user:42");
  EXPECT_EQ(v.at("scope").at("route"), "payments");
  EXPECT_EQ(v.at("scope").at("raw_key"), "order-1");
  EXPECT_EQ(v.at("state"), "completed");
  EXPECT_EQ(v.at("fingerprint"), "0102abff");
  EXPECT_EQ(v.at("owner_prefix"), "owner-to...");
  EXPECT_EQ(r.body.find("owner-token-0123"), std::string::npos);
  EXPECT_EQ(v.at("operation_id"), "op-123");
  EXPECT_EQ(v.at("created"), "2023-11-14T22:13:19.000Z");
  EXPECT_TRUE(v.at("lease_expires").is_null());
  EXPECT_EQ(v.at("expires"), "2023-11-15T22:13:20.000Z");
  const json::value& resp = v.at("response");
  EXPECT_EQ(resp.at("status"), 201);
  EXPECT_EQ(resp.at("headers").as_array().size(), 2u);
  EXPECT_EQ(resp.at("headers").at(1).at("name"), "Set-Cookie");
  EXPECT_EQ(resp.at("headers").at(1).at("value"), "a=1");
  EXPECT_EQ(resp.at("body"), R"({"id":"pay_1"})");
  EXPECT_EQ(resp.at("body_base64"), "eyJpZCI6InBheV8xIn0=");
  EXPECT_EQ(resp.at("body_bytes"), 14);
  EXPECT_EQ(resp.at("body_omitted"), false);
}

TEST_F(AdminApiTest, KeyInThePathIsPercentDecoded) {
  // A widened charset lets raw keys hold '%' and '/'.
  const std::string key = "t-_:_:_:files:a%b/c d";
  store_.Put(key, CompletedRecord());
  const AdminApi api = MakeApi();
  AdminResponse r =
      Call(api, Req("GET", "/admin/keys/t-_%3A_%3a_:files:a%25b%2Fc%20d?pretty=1", Bearer(kToken)));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body).at("key"), json::value(key));

  r = Call(api, Req("GET", "/admin/keys/t-x%2", Bearer(kToken)));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(ProblemOf(r)["code"], "invalid-key");
  r = Call(api, Req("GET", "/admin/keys/t-x%zz", Bearer(kToken)));
  EXPECT_EQ(r.status, 400);
}

TEST_F(AdminApiTest, UnknownKeyIs404) {
  const AdminApi api = MakeApi();
  const AdminResponse r = Call(api, Req("GET", "/admin/keys/t-_:_:_:r:missing", Bearer(kToken)));
  EXPECT_EQ(r.status, 404);
  json::object problem = ProblemOf(r);
  EXPECT_EQ(problem["type"], "urn:idemgate:problem:not-found");
  EXPECT_EQ(problem["title"], "Not found");
  EXPECT_EQ(problem["status"], 404);
}

TEST_F(AdminApiTest, DeletePurges) {
  store_.Put(kKey, CompletedRecord());
  const AdminApi api = MakeApi();
  AdminResponse r = Call(api, Req("DELETE", "/admin/keys/" + kKey));
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(store_.size(), 1u);
  r = Call(api, Req("DELETE", "/admin/keys/" + kKey, Bearer("nope")));
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(store_.size(), 1u);

  r = Call(api, Req("DELETE", "/admin/keys/" + kKey, Bearer(kToken)));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body), json::parse(R"({"purged":true,"state":"completed"})"));
  EXPECT_EQ(store_.size(), 0u);

  r = Call(api, Req("DELETE", "/admin/keys/" + kKey, Bearer(kToken)));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body), json::parse(R"({"purged":false})"));
  EXPECT_EQ(Call(api, Req("GET", "/admin/keys/" + kKey, Bearer(kToken))).status, 404);
}

core::Record InFlightRecord() {
  core::Record r;
  r.state = core::RecordState::kInFlight;
  r.fingerprint = std::string(32, '\x11');
  r.owner = "owner-token-0123456789abcdef";
  r.operation_id = "op-7";
  r.created_ms = kNow - 1000;
  r.lease_expires_ms = kNow + 34'500;
  return r;
}

// A key whose request may still run is refused: a retry after the purge
// would run the request a second time beside the original.
TEST_F(AdminApiTest, DeleteRefusesAKeyInFlightUnlessForced) {
  store_.Put(kKey, InFlightRecord());
  const AdminApi api = MakeApi();
  AdminResponse r = Call(api, Req("DELETE", "/admin/keys/" + kKey, Bearer(kToken)));
  EXPECT_EQ(r.status, 409);
  json::object problem = ProblemOf(r);
  EXPECT_EQ(problem["type"], "urn:idemgate:problem:key-in-flight");
  EXPECT_EQ(problem["code"], "key-in-flight");
  EXPECT_EQ(problem["status"], 409);
  const std::string detail(problem["detail"].as_string());
  EXPECT_NE(detail.find("still running"), std::string::npos) << detail;
  EXPECT_NE(detail.find("2023-11-14T22:13:54.500Z"), std::string::npos) << detail;
  EXPECT_NE(detail.find("?force=true"), std::string::npos) << detail;
  EXPECT_NE(detail.find("a second time"), std::string::npos) << detail;
  EXPECT_EQ(HeaderOf(r, "Retry-After"), "35");
  EXPECT_EQ(HeaderOf(r, "Cache-Control"), "no-store");
  EXPECT_EQ(store_.size(), 1u);
  // Other parameters do not force it.
  EXPECT_EQ(Call(api, Req("DELETE", "/admin/keys/" + kKey + "?forced=true&x=force", Bearer(kToken))).status, 409);
  EXPECT_EQ(store_.size(), 1u);

  r = Call(api, Req("DELETE", "/admin/keys/" + kKey + "?x=1&force=true", Bearer(kToken)));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body), json::parse(R"({"purged":true,"state":"in_flight"})"));
  EXPECT_EQ(store_.size(), 0u);
  // Forced, an absent key is still just absent; a completed one is purged with or without force.
  r = Call(api, Req("DELETE", "/admin/keys/" + kKey + "?force=%74rue", Bearer(kToken)));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body), json::parse(R"({"purged":false})"));
  store_.Put(kKey, CompletedRecord());
  r = Call(api, Req("DELETE", "/admin/keys/" + kKey + "?force=true", Bearer(kToken)));
  EXPECT_EQ(json::parse(r.body), json::parse(R"({"purged":true,"state":"completed"})"));
}

// Once the lease ended the original can no longer store its response (a
// retry could take the key over anyway): the reservation is purged unforced.
TEST_F(AdminApiTest, DeletePurgesAReservationWhoseLeaseEnded) {
  store_.Put(kKey, InFlightRecord());
  const AdminApi api = MakeApi();
  clock_.Advance(std::chrono::milliseconds(34'499));
  EXPECT_EQ(Call(api, Req("DELETE", "/admin/keys/" + kKey, Bearer(kToken))).status, 409);
  clock_.Advance(std::chrono::milliseconds(1));
  const AdminResponse r = Call(api, Req("DELETE", "/admin/keys/" + kKey, Bearer(kToken)));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body), json::parse(R"({"purged":true,"state":"in_flight"})"));
  EXPECT_EQ(store_.size(), 0u);
}

// Past its retention a key is absent to DELETE as it is to GET, over the
// real stores, whichever call comes first and whether or not the store still
// held the record: {"purged": false}, and the purge line says so.
class AdminApiOverStoresTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (std::string_view(GetParam()) == "memory") {
      store_ = std::make_unique<store::memory::MemoryStore>(std::uint64_t{1} << 20, clock_);
    } else {
      store::embedded::EmbeddedStore::Options options;
      options.path = dir_.Join("db");
      options.clock = &clock_;
      options.sweep_interval = Duration::zero();
      auto opened = store::embedded::EmbeddedStore::Open(options);
      ASSERT_TRUE(opened.ok()) << opened.status().ToString();
      store_ = std::move(*opened);
    }
  }

  // Stores `key` as completed, kept for `retention`.
  void StoreCompleted(const std::string& key, Duration retention) {
    core::Record r = InFlightRecord();
    r.created_ms = clock_.NowMillis();
    r.lease_expires_ms = r.created_ms + 30'000;
    StatusOr<core::ReserveResult> reserved = RunTask(store_->Reserve(key, r, clock_.NowMillis()));
    ASSERT_TRUE(reserved.ok() && reserved->outcome == core::ReserveOutcome::kReserved);
    core::Record done = CompletedRecord();
    done.owner = r.owner;
    done.expires_ms = clock_.NowMillis() + retention.count();
    ASSERT_TRUE(RunTask(store_->Complete(key, r.owner, done)).ok());
  }

  idemgate::testing::TempDir dir_;
  FakeClock clock_{kNow};
  std::unique_ptr<core::Store> store_;
  GatewayMetrics metrics_{GatewayMetricsOptions{.tenant_labels = false}};
};

TEST_P(AdminApiOverStoresTest, DeleteOfAKeyPastRetentionPurgesNothing) {
  const AdminApi api(AdminApi::Options{
      .token = kToken, .metrics = &metrics_, .stats = &metrics_.stats(), .store = store_.get(), .clock = &clock_});
  const std::string read_first = kKey + "-read-first", purged_first = kKey + "-purged-first";
  StoreCompleted(read_first, std::chrono::milliseconds(1500));
  StoreCompleted(purged_first, std::chrono::milliseconds(1500));
  StoreCompleted(kKey, std::chrono::hours(1));
  clock_.Advance(std::chrono::milliseconds(1500));  // expires == now: past retention

  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  SetLogFd(fds[1]);
  SetLogFormat(LogFormat::kJson);
  SetLogLevel(LogLevel::kInfo);
  EXPECT_EQ(Call(api, Req("GET", "/admin/keys/" + read_first, Bearer(kToken))).status, 404);
  AdminResponse r = Call(api, Req("DELETE", "/admin/keys/" + read_first, Bearer(kToken)));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body), json::parse(R"({"purged":false})"));
  r = Call(api, Req("DELETE", "/admin/keys/" + purged_first, Bearer(kToken)));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body), json::parse(R"({"purged":false})"));
  EXPECT_EQ(Call(api, Req("GET", "/admin/keys/" + purged_first, Bearer(kToken))).status, 404);
  r = Call(api, Req("DELETE", "/admin/keys/" + kKey, Bearer(kToken)));
  EXPECT_EQ(json::parse(r.body), json::parse(R"({"purged":true,"state":"completed"})"));
  std::string out;
  const std::vector<json::object> lines = EndLogCapture(fds, out);
  ASSERT_EQ(lines.size(), 3u) << out;
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(lines[i].at("msg"), "admin purge");
    EXPECT_EQ(lines[i].at("purged"), false) << i;
    EXPECT_TRUE(lines[i].at("state").is_null()) << i;
  }
  EXPECT_EQ(lines[0].at("key").as_string(), read_first);
  EXPECT_EQ(lines[1].at("key").as_string(), purged_first);
  EXPECT_EQ(lines[2].at("purged"), true);
}

INSTANTIATE_TEST_SUITE_P(Stores, AdminApiOverStoresTest, ::testing::Values("memory", "embedded"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

TEST_F(AdminApiTest, StoreFailuresAre503) {
  store_.Put(kKey, CompletedRecord());
  store_.Fail(UnavailableError("store down"));
  const AdminApi api = MakeApi();
  for (const char* method : {"GET", "DELETE"}) {
    const AdminResponse r = Call(api, Req(method, "/admin/keys/" + kKey, Bearer(kToken)));
    EXPECT_EQ(r.status, 503) << method;
    EXPECT_EQ(ProblemOf(r)["code"], "store-unavailable");
  }
  store_.Fail(InternalError("corrupt record"));
  EXPECT_EQ(Call(api, Req("GET", "/admin/keys/" + kKey, Bearer(kToken))).status, 500);
}

// The admin listener's failed store operations are counted like the
// request path's, under the route label "(admin)": /readyz's ping, a key
// read and a purge.
TEST_F(AdminApiTest, AdminStoreFailuresAreCountedByOperation) {
  store_.Fail(UnavailableError("store down"));
  const AdminApi api = MakeApi();
  EXPECT_EQ(Call(api, Req("GET", "/readyz")).status, 503);
  EXPECT_EQ(Call(api, Req("GET", "/readyz")).status, 503);
  EXPECT_EQ(Call(api, Req("GET", "/admin/keys/" + kKey, Bearer(kToken))).status, 503);
  EXPECT_EQ(Call(api, Req("DELETE", "/admin/keys/" + kKey, Bearer(kToken))).status, 503);
  const std::string text = metrics_.RenderPrometheus();
  EXPECT_NE(text.find("idempotency_store_errors_total{route=\"(admin)\",op=\"ping\"} 2\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("idempotency_store_errors_total{route=\"(admin)\",op=\"get\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("idempotency_store_errors_total{route=\"(admin)\",op=\"purge\"} 1\n"), std::string::npos);
  EXPECT_EQ(json::parse(Call(api, Req("GET", "/admin/stats")).body).as_object().at("routes").as_object().size(), 0u)
      << "in no route's stats";
}

// Every purge, and every call refused for its token, leaves a log line; the
// token presented never appears in it.
TEST_F(AdminApiTest, PurgesAndRefusedCallsAreLogged) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  SetLogFd(fds[1]);
  SetLogFormat(LogFormat::kJson);
  SetLogLevel(LogLevel::kInfo);
  store_.Put(kKey, CompletedRecord());
  const AdminApi api = MakeApi();
  EXPECT_EQ(Call(api, Req("DELETE", "/admin/keys/" + kKey, Bearer(kToken))).status, 200);
  store_.Put(kKey, InFlightRecord());
  EXPECT_EQ(Call(api, Req("DELETE", "/admin/keys/" + kKey, Bearer(kToken))).status, 409);
  EXPECT_EQ(Call(api, Req("DELETE", "/admin/keys/" + kKey + "?force=true", Bearer(kToken))).status, 200);
  EXPECT_EQ(Call(api, Req("GET", "/admin/keys/" + kKey, Bearer("guess-1"))).status, 401);
  EXPECT_EQ(Call(api, Req("DELETE", "/admin/keys/" + kKey + "?x=1")).status, 401);
  std::string out;
  const std::vector<json::object> lines = EndLogCapture(fds, out);
  ASSERT_EQ(lines.size(), 5u) << out;
  EXPECT_EQ(lines[0].at("msg"), "admin purge");
  EXPECT_EQ(lines[0].at("key").as_string(), kKey);
  EXPECT_EQ(lines[0].at("purged"), true);
  EXPECT_EQ(lines[0].at("state"), "completed");
  EXPECT_EQ(lines[0].at("forced"), false);
  // Refused: the key is in flight.
  EXPECT_EQ(lines[1].at("msg"), "admin purge");
  EXPECT_EQ(lines[1].at("purged"), false);
  EXPECT_EQ(lines[1].at("state"), "in_flight");
  EXPECT_EQ(lines[1].at("forced"), false);
  EXPECT_EQ(lines[2].at("msg"), "admin purge");
  EXPECT_EQ(lines[2].at("purged"), true);
  EXPECT_EQ(lines[2].at("state"), "in_flight");
  EXPECT_EQ(lines[2].at("forced"), true);
  EXPECT_EQ(lines[3].at("msg"), "admin call refused");
  EXPECT_EQ(lines[3].at("reason"), "invalid_token");
  EXPECT_EQ(lines[3].at("method"), "GET");
  EXPECT_EQ(lines[4].at("reason"), "missing_token");
  EXPECT_EQ(lines[4].at("path").as_string(), "/admin/keys/" + kKey);
  EXPECT_EQ(out.find("guess-1"), std::string::npos);
}

TEST_F(AdminApiTest, DeleteRefusesAForceOtherThanTrue) {
  store_.Put(kKey, InFlightRecord());
  const AdminApi api = MakeApi();
  for (const char* query : {"?force=1", "?force=false", "?force=TRUE", "?force", "?force=", "?force=true&force=true",
                            "?force=%zz", "?x=1&%66orce=yes"}) {
    const AdminResponse r = Call(api, Req("DELETE", "/admin/keys/" + kKey + query, Bearer(kToken)));
    EXPECT_EQ(r.status, 400) << query;
    EXPECT_EQ(ProblemOf(r)["code"], "bad-request") << query;
    EXPECT_NE(std::string(ProblemOf(r)["detail"].as_string()).find("force"), std::string::npos) << query;
  }
  EXPECT_EQ(store_.size(), 1u);
  // The token is checked first.
  EXPECT_EQ(Call(api, Req("DELETE", "/admin/keys/" + kKey + "?force=1")).status, 401);
  EXPECT_EQ(Call(api, Req("DELETE", "/admin/keys/" + kKey + "?force=1", Bearer("nope"))).status, 401);
  // A read takes no force and ignores it.
  EXPECT_EQ(Call(api, Req("GET", "/admin/keys/" + kKey + "?force=1", Bearer(kToken))).status, 200);
  EXPECT_EQ(store_.size(), 1u);
}

TEST_F(AdminApiTest, InFlightRecordAndTheStoreLifecycle) {
  const AdminApi api = MakeApi();
  core::Record reservation;
  reservation.fingerprint = std::string(32, '\x11');
  reservation.owner = "abcdef";
  reservation.operation_id = "op-9";
  reservation.created_ms = kNow;
  reservation.lease_expires_ms = kNow + 35'000;
  StatusOr<core::ReserveResult> reserved = RunTask(store_.Reserve(kKey, reservation, kNow));
  ASSERT_TRUE(reserved.ok());
  EXPECT_EQ(reserved->outcome, core::ReserveOutcome::kReserved);

  AdminResponse r = Call(api, Req("GET", "/admin/keys/" + kKey, Bearer(kToken)));
  ASSERT_EQ(r.status, 200);
  json::value v = json::parse(r.body);
  EXPECT_EQ(v.at("state"), "in_flight");
  EXPECT_EQ(v.at("owner_prefix"), "abc...");  // never more than half of a short token
  EXPECT_EQ(v.at("lease_expires"), "2023-11-14T22:13:55.000Z");
  EXPECT_TRUE(v.at("expires").is_null());
  EXPECT_TRUE(v.at("response").is_null());

  core::Record completed = reservation;
  completed.response.status = 200;
  completed.response.body = std::string("\xff\xfe\x00\x01", 4);  // not UTF-8
  completed.expires_ms = 0;
  const Status done = RunTask(store_.Complete(kKey, "abcdef", completed));
  ASSERT_TRUE(done.ok()) << done.ToString();

  r = Call(api, Req("GET", "/admin/keys/" + kKey, Bearer(kToken)));
  ASSERT_EQ(r.status, 200);
  v = json::parse(r.body);
  EXPECT_EQ(v.at("state"), "completed");
  EXPECT_TRUE(v.at("expires").is_null());  // kept until purged
  EXPECT_EQ(v.at("response").at("body_base64"), "//4AAQ==");
  EXPECT_FALSE(v.at("response").as_object().contains("body"));
}

TEST_F(AdminApiTest, EverythingElseIs404) {
  const AdminApi api = MakeApi();
  for (const auto& [method, target] : std::vector<std::pair<std::string, std::string>>{
           {"GET", "/"},
           {"GET", "/nope"},
           {"POST", "/nope"},
           {"HEAD", "/nope"},
           {"GET", "/healthz/extra"},
           {"GET", "/admin/keys/"},
           {"GET", "/admin/keys"},
           {"DELETE", "/admin/keys"},
           {"GET", "/admin/statsx"},
       }) {
    const AdminResponse r = Call(api, Req(method, target, Bearer(kToken)));
    EXPECT_EQ(r.status, 404) << method << " " << target;
    EXPECT_EQ(ProblemOf(r)["code"], "not-found") << method << " " << target;
    EXPECT_FALSE(HeaderOf(r, "Allow").has_value()) << method << " " << target;
  }
  // A HEAD's answer is a GET's without the body: the same body length.
  EXPECT_EQ(Call(api, Req("HEAD", "/nope")).body, Call(api, Req("GET", "/nope")).body);
}

// Load balancers probe with HEAD: every GET resource answers it as GET (the HTTP layer drops the body).
TEST_F(AdminApiTest, HeadIsAnsweredLikeGet) {
  AdminApi api = MakeApi();
  store_.Put(kKey, CompletedRecord());
  for (const std::string target : {"/healthz", "/readyz", "/metrics", "/admin/stats", "/healthz?probe=1"}) {
    const AdminResponse get = Call(api, Req("GET", target));
    const AdminResponse head = Call(api, Req("HEAD", target));
    EXPECT_EQ(head.status, 200) << target;
    EXPECT_EQ(head.status, get.status) << target;
    EXPECT_EQ(head.content_type, get.content_type) << target;
    EXPECT_EQ(HeaderOf(head, "Cache-Control"), "no-store") << target;
  }
  EXPECT_EQ(Call(api, Req("HEAD", "/healthz")).body, "ok");
  // Readiness follows the store and the drain for HEAD too.
  store_.Fail(UnavailableError("down"));
  EXPECT_EQ(Call(api, Req("HEAD", "/readyz")).status, 503);
  store_.Heal();
  api.SetDraining(true);
  const AdminResponse draining = Call(api, Req("HEAD", "/readyz"));
  EXPECT_EQ(draining.status, 503);
  EXPECT_EQ(ProblemOf(draining)["code"], "shutting-down");
  EXPECT_EQ(Call(api, Req("HEAD", "/healthz")).status, 200);
  // A key: the token is still needed.
  EXPECT_EQ(Call(api, Req("HEAD", "/admin/keys/" + kKey)).status, 401);
  EXPECT_EQ(Call(api, Req("HEAD", "/admin/keys/" + kKey, Bearer(kToken))).status, 200);
  EXPECT_EQ(Call(api, Req("HEAD", "/admin/keys/t-nope", Bearer(kToken))).status, 404);
  EXPECT_EQ(store_.size(), 1u);
}

// A known path with a method it does not take is 405 with Allow (RFC 9110 §15.5.6), not 404.
TEST_F(AdminApiTest, OtherMethodsOnKnownPathsAre405WithAllow) {
  const AdminApi api = MakeApi();
  for (const auto& [method, target, allow] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"POST", "/healthz", "GET, HEAD"},
           {"PUT", "/readyz", "GET, HEAD"},
           {"OPTIONS", "/readyz", "GET, HEAD"},
           {"DELETE", "/metrics", "GET, HEAD"},
           {"POST", "/admin/stats?x=1", "GET, HEAD"},
           {"get", "/healthz", "GET, HEAD"},
           {"PUT", "/admin/keys/" + kKey, "GET, HEAD, DELETE"},
           {"POST", "/admin/keys/" + kKey, "GET, HEAD, DELETE"},
       }) {
    const AdminResponse r = Call(api, Req(method, target, Bearer(kToken)));
    EXPECT_EQ(r.status, 405) << method << " " << target;
    EXPECT_EQ(HeaderOf(r, "Allow"), allow) << method << " " << target;
    EXPECT_EQ(HeaderOf(r, "Cache-Control"), "no-store") << method << " " << target;
    json::object problem = ProblemOf(r);
    EXPECT_EQ(problem["code"], "method-not-allowed") << method << " " << target;
    EXPECT_EQ(problem["type"], "urn:idemgate:problem:method-not-allowed");
    EXPECT_EQ(problem["status"], 405);
  }
  // The method is refused before the token is looked at, and nothing is touched.
  store_.Put(kKey, CompletedRecord());
  EXPECT_EQ(Call(api, Req("PUT", "/admin/keys/" + kKey)).status, 405);
  EXPECT_EQ(store_.size(), 1u);
}

TEST_F(AdminApiTest, MissingComponentsAre404) {
  const AdminApi api(AdminApi::Options{.token = kToken});
  EXPECT_EQ(Call(api, Req("GET", "/metrics")).status, 404);
  EXPECT_EQ(Call(api, Req("GET", "/admin/stats")).status, 404);
  EXPECT_EQ(Call(api, Req("GET", "/admin/keys/" + kKey, Bearer(kToken))).status, 404);
  // Not there at all: 404 whatever the method.
  EXPECT_EQ(Call(api, Req("DELETE", "/metrics")).status, 404);
  EXPECT_EQ(Call(api, Req("HEAD", "/admin/stats")).status, 404);
  EXPECT_EQ(Call(api, Req("PUT", "/admin/keys/" + kKey, Bearer(kToken))).status, 404);
  EXPECT_EQ(Call(api, Req("GET", "/healthz")).status, 200);
  EXPECT_EQ(Call(api, Req("HEAD", "/healthz")).status, 200);
}

TEST(PercentDecode, DecodesEscapesAndKeepsTheRest) {
  EXPECT_EQ(PercentDecode("a%3Ab%3ac").value(), "a:b:c");
  EXPECT_EQ(PercentDecode("%25%2F+x").value(), "%/+x");
  EXPECT_EQ(PercentDecode("").value(), "");
  EXPECT_EQ(PercentDecode("%00").value(), std::string(1, '\0'));
  for (const char* bad : {"%", "%4", "a%g0", "%%"}) {
    auto r = PercentDecode(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(FormatRfc3339, UtcWithMilliseconds) {
  EXPECT_EQ(FormatRfc3339(0), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(FormatRfc3339(kNow + 42), "2023-11-14T22:13:20.042Z");
  EXPECT_EQ(FormatRfc3339(951'782'400'999), "2000-02-29T00:00:00.999Z");
  EXPECT_EQ(FormatRfc3339(-1), "1969-12-31T23:59:59.999Z");
}

TEST(IsValidUtf8, AcceptsWellFormedRejectsTheRest) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xc3"));              // truncated
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong
  EXPECT_FALSE(IsValidUtf8("\xe0\x80\xaf"));      // overlong
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xff"));
  EXPECT_FALSE(
      IsValidUtf8("a\x80"
                  "b"));  // stray continuation
}

TEST(RecordToJson, SanitizesBytesThatAreNotUtf8) {
  core::Record record = CompletedRecord();
  record.response.headers = {{"X-Raw", "caf\xe9"}};
  const json::object o = RecordToJson("t-a:b:c:r:k", record);
  EXPECT_EQ(o.at("response").at("headers").at(0).at("value"), "caf\xEF\xBF\xBD");
}

TEST(RecordToJson, ScopeShowsTheCallersComponents) {
  const core::Record record = CompletedRecord();
  // Escaped components are shown as the caller had them, and a webhook
  // route's endpoint apart from the route.
  const json::object escaped = RecordToJson("t-a%253Ab:p%3A1:service:webhook-ingest:hooks/acme-live:stripe-evt_1", record);
  EXPECT_EQ(escaped.at("scope").at("tenant"), "a%3Ab");
  EXPECT_EQ(escaped.at("scope").at("project"), "p:1");
  EXPECT_EQ(escaped.at("scope").at("subject"), "service:webhook-ingest");
  EXPECT_EQ(escaped.at("scope").at("route"), "hooks");
  EXPECT_EQ(escaped.at("scope").at("webhook_endpoint"), "acme-live");
  EXPECT_EQ(escaped.at("scope").at("raw_key"), "stripe-evt_1");
  EXPECT_FALSE(RecordToJson("t-_:_:_:api:k", record).at("scope").as_object().contains("webhook_endpoint"));
  // The value "_" is written %5F (a component left out is "_"), and a
  // subject starting with '%' has one more.
  const json::object underscores = RecordToJson("t-%5F:%5F:%5F:api:k", record);
  EXPECT_EQ(underscores.at("scope").at("tenant"), "_");
  EXPECT_EQ(underscores.at("scope").at("project"), "_");
  EXPECT_EQ(underscores.at("scope").at("subject"), "_");
  EXPECT_EQ(RecordToJson("t-a:b:%%5F:api:k", record).at("scope").at("subject"), "%5F");
  // A key that is not in the scoped form has no "scope".
  EXPECT_FALSE(RecordToJson("plain", record).contains("scope"));
}

}  // namespace
// RFC 9457 section 3.1.3: a problem type's title does not change from one
// occurrence to the next, so the admin listener's problems carry the data
// listener's titles for the codes both answer with. (Last in the file: its
// refused calls use up the rate-limited "admin call refused" lines that
// PurgesAndRefusedCallsAreLogged counts when the whole binary runs.)
TEST_F(AdminApiTest, ProblemTitlesAreTheDataListenersForTheSameCode) {
  AdminApi api = MakeApi();
  const auto expect_title = [](const AdminResponse& r, http::ProblemCode code) {
    json::object problem = ProblemOf(r);
    const auto text = [&](const char* member) { return std::string_view(problem[member].as_string()); };
    EXPECT_EQ(text("code"), http::ProblemCodeName(code));
    EXPECT_EQ(text("type"), http::ProblemType(code));
    EXPECT_EQ(text("title"), http::ProblemTitle(code)) << json::serialize(problem);
  };
  expect_title(Call(api, Req("GET", "/admin/keys/t-_:_:_:r:missing", Bearer(kToken))), http::ProblemCode::kNotFound);
  expect_title(Call(api, Req("GET", "/admin/keys/" + kKey)), http::ProblemCode::kUnauthenticated);
  expect_title(Call(api, Req("GET", "/admin/keys/" + kKey, Bearer("wrong"))), http::ProblemCode::kUnauthenticated);
  expect_title(Call(api, Req("POST", "/healthz")), http::ProblemCode::kMethodNotAllowed);
  expect_title(Call(api, Req("DELETE", "/admin/keys/" + kKey + "?force=maybe", Bearer(kToken))),
               http::ProblemCode::kBadRequest);
  store_.Fail(UnavailableError("store down"));
  expect_title(Call(api, Req("GET", "/readyz")), http::ProblemCode::kStoreUnavailable);
  expect_title(Call(api, Req("GET", "/admin/keys/" + kKey, Bearer(kToken))), http::ProblemCode::kStoreUnavailable);
  store_.Fail(InternalError("corrupt record"));
  expect_title(Call(api, Req("GET", "/admin/keys/" + kKey, Bearer(kToken))), http::ProblemCode::kInternal);
  store_.Heal();
  api.SetDraining(true);
  expect_title(Call(api, Req("GET", "/readyz")), http::ProblemCode::kShuttingDown);
}

}  // namespace idemgate::admin
