#include "config/reload_changes.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/loader.h"

namespace idemgate::config {
namespace {

constexpr char kHead[] = R"(identity: { mode: trusted_headers }
upstreams:
  app: { url: http://127.0.0.1:9001 }
)";

Config Load(const std::string& routes, const std::string& rest = "") {
  StatusOr<Config> c = LoadString(std::string(kHead) + "routes:\n" + routes + rest, "test.yaml");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? *c : Config{};
}

constexpr char kPayments[] = "  - { id: payments, match: { path_prefix: /pay }, upstream: app }\n";
constexpr char kRest[] = "  - { id: rest, match: { path_prefix: / }, upstream: app }\n";

TEST(StoredKeyChangesTest, AReloadThatKeepsEveryKeyIsSilent) {
  const Config before = Load(std::string(kPayments) + kRest);
  // Timeouts, retention, in_flight and new routes leave stored keys where they are.
  const Config after = Load(
      "  - id: payments\n    match: { path_prefix: /pay }\n    upstream: app\n"
      "    idempotency: { retention: 1h, in_flight: wait, scope: subject }\n" +
      std::string(kRest) + "  - { id: extra, match: { path_prefix: /x }, upstream: app }\n");
  EXPECT_TRUE(StoredKeyChanges(before, after).empty());
  EXPECT_TRUE(StoredKeyChanges(before, before).empty());
}

TEST(StoredKeyChangesTest, ARenamedOrRemovedRouteIsNamed) {
  const Config before = Load(std::string(kPayments) + kRest);
  const Config after = Load("  - { id: payments-v2, match: { path_prefix: /pay }, upstream: app }\n" +
                            std::string(kRest));
  EXPECT_EQ(StoredKeyChanges(before, after),
            (std::vector<std::string>{"route \"payments\" is gone: the requests stored under it are no longer "
                                      "replayed, and a route under a new id starts with no stored keys"}));
}

TEST(StoredKeyChangesTest, AScopeChangeIsNamedWithBothScopes) {
  const Config before = Load(std::string(kPayments) + kRest);
  const Config after = Load("  - { id: payments, match: { path_prefix: /pay }, upstream: app, "
                            "idempotency: { scope: tenant } }\n" + std::string(kRest));
  const std::vector<std::string> changes = StoredKeyChanges(before, after);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0], "route \"payments\": keys are now scoped by tenant instead of subject: the requests stored "
                        "before are no longer found, and their retries run again");
}

TEST(StoredKeyChangesTest, AnIdentityModeChangeMovesRoutesWithoutAScopeOfTheirOwn) {
  const Config before = Load(std::string(kPayments));
  StatusOr<Config> after = LoadString(
      "identity: { mode: none }\nupstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes:\n" +
          std::string(kPayments), "test.yaml");
  ASSERT_TRUE(after.ok()) << after.status().message();
  const std::vector<std::string> changes = StoredKeyChanges(before, *after);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_NE(changes[0].find("scoped by global instead of subject"), std::string::npos) << changes[0];
}

TEST(StoredKeyChangesTest, AFingerprintChangeAndAPolicyThatStopsDeduplicatingAreNamed) {
  const Config before = Load(std::string(kPayments) + kRest);
  const Config after = Load(
      "  - { id: payments, match: { path_prefix: /pay }, upstream: app, "
      "idempotency: { fingerprint: { json: raw } } }\n"
      "  - { id: rest, match: { path_prefix: / }, upstream: app, idempotency: { policy: passthrough } }\n");
  const std::vector<std::string> changes = StoredKeyChanges(before, after);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_NE(changes[0].find("route \"payments\": idempotency.fingerprint covers other parts"), std::string::npos)
      << changes[0];
  EXPECT_EQ(changes[1], "route \"rest\" no longer deduplicates (policy passthrough): the requests stored under it "
                        "are no longer replayed");
  // Routes that kept no records are not looked at.
  EXPECT_TRUE(StoredKeyChanges(after, Load(std::string(kPayments) +
                                           "  - { id: other, match: { path_prefix: / }, upstream: app }\n"))
                  .size() == 1);
}

TEST(StoredKeyChangesTest, WebhookEndpointsThatMoveOrGoAreNamed) {
  const std::string routes =
      "  - { id: hooks, match: { path: \"/hooks/{webhook_id}\" }, upstream: app, "
      "idempotency: { policy: webhook, provider: stripe } }\n";
  const Config before = Load(routes, "webhooks:\n  endpoints:\n"
                                     "    - { id: a, tenant: acme, project: shop, provider: stripe, secret_env: S }\n"
                                     "    - { id: b, tenant: acme, project: web, provider: stripe, secret_env: S }\n");
  const Config after = Load(routes, "webhooks:\n  endpoints:\n"
                                    "    - { id: a, tenant: acme, project: billing, provider: stripe, secret_env: S }\n");
  EXPECT_EQ(StoredKeyChanges(before, after),
            (std::vector<std::string>{
                "webhook endpoint \"a\" moves from acme/shop to acme/billing: redeliveries of events stored before "
                "are no longer found and run again",
                "webhook endpoint \"b\" is gone: its sender's deliveries get 404, and its stored events are no "
                "longer replayed"}));
}

}  // namespace
}  // namespace idemgate::config
