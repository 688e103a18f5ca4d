#include "config/warnings.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/loader.h"

namespace idemgate::config {
namespace {

Config Load(const std::string& yaml) {
  StatusOr<Config> c = LoadString(yaml, "test.yaml");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? *c : Config{};
}

// The quickstart's shape as it shipped: a 10s grace in front of a 30s upstream
// that a required route stores keys through.
constexpr char kUpstreams[] = R"(upstreams:
  demo: { url: http://127.0.0.1:9001, timeout: 30s }
  fast: { url: http://127.0.0.1:9002, timeout: 5s }
)";

TEST(ShutdownGraceWarningsTest, AGraceBelowTheTimeoutOfAnUpstreamThatStoresKeysIsNamed) {
  const Config c = Load(std::string("shutdown_grace: 10s\n") + kUpstreams + R"(routes:
  - id: payments
    match: { path_prefix: /api/v1/payments }
    upstream: demo
    idempotency: { policy: required }
  - { id: quick, match: { path_prefix: /quick }, upstream: fast }
  - { id: everything-else, match: { path_prefix: / }, upstream: demo }
)");
  const std::vector<std::string> warnings = ShutdownGraceWarnings(c);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0],
            "shutdown_grace 10s is below the timeout 30s of upstream \"demo\", through which routes \"payments\", "
            "\"everything-else\" store keys: on SIGTERM a request still running there when the grace ends has its "
            "key released while the upstream may still run it, and a retry runs it again; set shutdown_grace to "
            "at least 30s or lower the upstream's timeout");
}

TEST(ShutdownGraceWarningsTest, AGraceAtLeastEveryTimeoutIsSilent) {
  // The defaults: a 30s grace and a 30s upstream timeout.
  EXPECT_TRUE(ShutdownGraceWarnings(Load(R"(upstreams:
  app: { url: http://127.0.0.1:9001 }
routes:
  - { id: all, match: { path_prefix: / }, upstream: app }
)")).empty());
  EXPECT_TRUE(ShutdownGraceWarnings(Load(std::string("shutdown_grace: 30s\n") + kUpstreams +
                                         "routes:\n  - { id: all, match: { path_prefix: / }, upstream: demo }\n"))
                  .empty());
}

TEST(ShutdownGraceWarningsTest, RoutesThatStoreNoKeysAreNotLookedAt) {
  // passthrough, prohibited and dedup: upstream keep nothing for SIGTERM to release.
  const Config c = Load(std::string("shutdown_grace: 0\n") + kUpstreams + R"(routes:
  - id: pass
    match: { path_prefix: /pass }
    upstream: demo
    idempotency: { policy: passthrough }
  - id: never
    match: { path_prefix: /never }
    upstream: demo
    idempotency: { policy: prohibited }
  - id: restate
    match: { path_prefix: / }
    upstream: demo
    idempotency: { policy: required, dedup: upstream }
)");
  EXPECT_TRUE(ShutdownGraceWarnings(c).empty());
}

TEST(ShutdownGraceWarningsTest, OneLinePerUpstream) {
  const Config c = Load(std::string("shutdown_grace: 1s\n") + kUpstreams + R"(routes:
  - { id: a, match: { path_prefix: /a }, upstream: fast }
  - { id: b, match: { path_prefix: / }, upstream: demo }
)");
  const std::vector<std::string> warnings = ShutdownGraceWarnings(c);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("timeout 30s of upstream \"demo\", through which route \"b\" stores keys"),
            std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[1].find("shutdown_grace 1s is below the timeout 5s of upstream \"fast\""), std::string::npos)
      << warnings[1];
}

}  // namespace
}  // namespace idemgate::config
