#include "config/loader.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <string>
#include <utility>

#include "config/names.h"
#include "config/resolve.h"

namespace idemgate::config {
namespace {

using namespace std::chrono_literals;

// SPEC §11, verbatim.
constexpr char kSpecExample[] = R"(listen: 127.0.0.1:8080
admin: { listen: 127.0.0.1:9090, token_env: IDEMGATE_ADMIN_TOKEN }
store: { kind: embedded, path: ./idemgate-data, on_error: fail_closed }
identity: { mode: none }
upstreams:
  app: { url: http://127.0.0.1:9001, timeout: 30s, max_connections: 256 }
defaults:
  idempotency:
    policy: optional
    methods: [POST, PATCH]
    retention: 24h
    in_flight: reject          # or wait
    wait_timeout: 30s
    max_response_bytes: 1MiB
routes:
  - id: payments
    match: { path_prefix: /api/v1/payments, methods: [POST, GET] }
    upstream: app
    recovery: true
    idempotency: { policy: required, retention: 7d, scope: subject }
  - id: everything-else
    match: { path_prefix: / }
    upstream: app
)";

constexpr char kMinimal[] = R"(upstreams:
  app: { url: http://127.0.0.1:9001 }
routes:
  - id: r1
    match: { path_prefix: / }
    upstream: app
)";

Config MustLoad(std::string_view yaml) {
  StatusOr<Config> c = LoadString(yaml, "test.yaml");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? *c : Config{};
}

TEST(LoaderTest, SpecExampleLoadsWithItsValues) {
  Config c = MustLoad(kSpecExample);
  EXPECT_EQ(c.source, "test.yaml");
  EXPECT_EQ(c.listen, "127.0.0.1:8080");
  EXPECT_EQ(c.admin.listen, "127.0.0.1:9090");
  EXPECT_EQ(c.admin.token_env, "IDEMGATE_ADMIN_TOKEN");
  EXPECT_EQ(c.store.kind, StoreKind::kEmbedded);
  EXPECT_EQ(c.store.path, "./idemgate-data");
  EXPECT_EQ(c.store.on_error, OnError::kFailClosed);
  EXPECT_EQ(c.identity.mode, IdentityMode::kNone);

  ASSERT_EQ(c.upstreams.size(), 1u);
  const Upstream& app = c.upstreams.at("app");
  EXPECT_EQ(app.name, "app");
  EXPECT_EQ(app.url, "http://127.0.0.1:9001");
  EXPECT_EQ(app.scheme, "http");
  EXPECT_EQ(app.host, "127.0.0.1");
  EXPECT_EQ(app.port, 9001);
  EXPECT_EQ(app.base_path, "");
  EXPECT_EQ(app.timeout, 30s);
  EXPECT_EQ(app.max_connections, 256u);
  EXPECT_TRUE(app.keepalive);

  EXPECT_EQ(c.defaults.policy, Policy::kOptional);
  EXPECT_EQ(c.defaults.methods, (std::vector<std::string>{"POST", "PATCH"}));
  EXPECT_EQ(c.defaults.retention, 24h);
  EXPECT_EQ(c.defaults.in_flight, InFlightMode::kReject);
  EXPECT_EQ(c.defaults.wait_timeout, 30s);
  EXPECT_EQ(c.defaults.max_response_bytes, 1u * kMiB);

  ASSERT_EQ(c.routes.size(), 2u);
  const Route& payments = c.routes[0];
  EXPECT_EQ(payments.id, "payments");
  EXPECT_EQ(payments.line, 16);
  EXPECT_EQ(payments.match.path_prefix, "/api/v1/payments");
  EXPECT_EQ(payments.match.path, "");
  EXPECT_EQ(payments.match.methods, (std::vector<std::string>{"POST", "GET"}));
  EXPECT_EQ(payments.upstream, "app");
  EXPECT_TRUE(payments.recovery);
  EXPECT_EQ(payments.idempotency.policy, Policy::kRequired);
  EXPECT_EQ(payments.idempotency.retention, 7 * 24h);
  EXPECT_EQ(payments.idempotency.scope, Scope::kSubject);
  EXPECT_EQ(payments.idempotency.wait_timeout, 30s);
  EXPECT_EQ(payments.idempotency.methods, (std::vector<std::string>{"POST", "PATCH"}));

  const Route& rest = c.routes[1];
  EXPECT_EQ(rest.id, "everything-else");
  EXPECT_EQ(rest.line, 21);
  EXPECT_EQ(rest.match.path_prefix, "/");
  EXPECT_TRUE(rest.match.methods.empty());
  EXPECT_FALSE(rest.recovery);
  EXPECT_EQ(rest.idempotency.policy, Policy::kOptional);
  EXPECT_EQ(rest.idempotency.retention, 24h);
  EXPECT_FALSE(rest.idempotency.scope.has_value());
}

TEST(LoaderTest, OmittedKeysKeepTheirDocumentedDefaults) {
  Config c = MustLoad(kMinimal);
  EXPECT_EQ(c.listen, "127.0.0.1:8080");
  EXPECT_EQ(c.workers, 0u);
  EXPECT_EQ(c.shutdown_grace, 30s);
  EXPECT_EQ(c.limits.max_header_bytes, 16u * kKiB);
  EXPECT_EQ(c.limits.max_request_bytes, 10u * kMiB);
  EXPECT_EQ(c.limits.header_timeout, 10s);
  EXPECT_EQ(c.limits.idle_timeout, 60s);
  EXPECT_EQ(c.limits.max_connections, 10000u);
  EXPECT_TRUE(c.merge_slashes);
  EXPECT_EQ(c.admin.listen, "");
  EXPECT_EQ(c.store.kind, StoreKind::kEmbedded);
  EXPECT_EQ(c.store.path, "./idemgate-data");
  EXPECT_FALSE(c.store.sync);
  EXPECT_EQ(c.store.max_bytes, 256u * kMiB);
  EXPECT_EQ(c.store.on_error, OnError::kFailClosed);
  EXPECT_TRUE(c.store.redis.addresses.empty());
  EXPECT_EQ(c.store.redis.timeout, 200ms);
  EXPECT_EQ(c.store.redis.key_prefix, "idemgate:");
  EXPECT_EQ(c.store.redis.username, "");
  EXPECT_EQ(c.identity.mode, IdentityMode::kNone);
  EXPECT_TRUE(c.webhooks.empty());
  EXPECT_TRUE(c.metrics.tenant_labels);
  EXPECT_EQ(c.log.level, "info");
  EXPECT_EQ(c.log.format, "json");

  const Upstream& app = c.upstreams.at("app");
  EXPECT_EQ(app.timeout, 30s);
  EXPECT_EQ(app.connect_timeout, 2s);
  EXPECT_EQ(app.max_connections, 256u);

  ASSERT_EQ(c.routes.size(), 1u);
  const Route& r = c.routes[0];
  EXPECT_EQ(r.line, 4);
  EXPECT_FALSE(r.recovery);
  EXPECT_FALSE(r.max_in_flight.has_value());
  EXPECT_FALSE(r.max_request_bytes.has_value());
  const Idempotency& idem = r.idempotency;
  EXPECT_EQ(idem.policy, Policy::kOptional);
  EXPECT_EQ(idem.header, "Idempotency-Key");
  EXPECT_EQ(idem.methods, (std::vector<std::string>{"POST", "PATCH"}));
  EXPECT_FALSE(idem.scope.has_value());
  EXPECT_EQ(idem.retention, 24h);
  EXPECT_FALSE(idem.lease.has_value());
  EXPECT_EQ(idem.in_flight, InFlightMode::kReject);
  EXPECT_EQ(idem.wait_timeout, 30s);
  EXPECT_EQ(idem.max_response_bytes, 1u * kMiB);
  EXPECT_FALSE(idem.store_server_errors);
  EXPECT_EQ(idem.terminal_header, "Idempotency-Terminal");
  EXPECT_EQ(idem.replay_header, "Idempotent-Replayed");
  EXPECT_EQ(idem.fingerprint.headers, (std::vector<std::string>{"content-type"}));
  EXPECT_EQ(idem.fingerprint.json, JsonMode::kCanonical);
  EXPECT_TRUE(idem.fingerprint.json_fields.empty());
  EXPECT_EQ(idem.key.max_length, 255u);
  EXPECT_EQ(idem.key.charset, "");
  EXPECT_EQ(idem.provider, "");
  EXPECT_EQ(idem.dedup, DedupMode::kGateway);
  EXPECT_EQ(idem.forward_key, ForwardKey::kNamespaced);

  EXPECT_EQ(EffectiveScope(idem, c.identity), Scope::kGlobal);
  EXPECT_EQ(EffectiveLease(idem, app), 35s);
  EXPECT_EQ(EffectiveMaxRequestBytes(r, c.limits), 10u * kMiB);
}

TEST(LoaderTest, RouteIdempotencyOverridesDefaultsKeyByKey) {
  Config c = MustLoad(R"(upstreams:
  app: { url: http://127.0.0.1:9001, timeout: 10s }
defaults:
  idempotency:
    policy: required
    retention: 1h
    in_flight: wait
    wait_timeout: 5s
    fingerprint: { headers: [Content-Type, X-Account], json: raw, json_fields: [/a] }
    key: { max_length: 100, charset: "+" }
routes:
  - id: overridden
    match: { path: /orders }
    upstream: app
    idempotency:
      retention: 0
      lease: 12s
      fingerprint: { json: canonical }
      key: { charset: "+/" }
  - id: inherited
    match: { path_prefix: /other }
    upstream: app
)");
  ASSERT_EQ(c.routes.size(), 2u);
  const Idempotency& o = c.routes[0].idempotency;
  EXPECT_EQ(o.policy, Policy::kRequired);
  EXPECT_EQ(o.retention, 0s);
  EXPECT_EQ(o.lease, 12s);
  EXPECT_EQ(o.in_flight, InFlightMode::kWait);
  EXPECT_EQ(o.wait_timeout, 5s);
  EXPECT_EQ(o.fingerprint.headers, (std::vector<std::string>{"content-type", "x-account"}));
  EXPECT_EQ(o.fingerprint.json, JsonMode::kCanonical);
  EXPECT_EQ(o.fingerprint.json_fields, (std::vector<std::string>{"/a"}));
  EXPECT_EQ(o.key.max_length, 100u);
  EXPECT_EQ(o.key.charset, "+/");

  const Idempotency& i = c.routes[1].idempotency;
  EXPECT_EQ(i.retention, 1h);
  EXPECT_FALSE(i.lease.has_value());
  EXPECT_EQ(i.fingerprint.json, JsonMode::kRaw);
  EXPECT_EQ(i.key.charset, "+");
  EXPECT_EQ(c.routes[0].match.path, "/orders");
  EXPECT_EQ(c.routes[0].match.path_prefix, "");
}

TEST(LoaderTest, ListsReplaceRatherThanAppend) {
  Config c = MustLoad(R"(upstreams:
  app: { url: http://127.0.0.1:9001 }
defaults:
  idempotency: { methods: [POST, PATCH, PUT] }
routes:
  - id: r1
    match: { path_prefix: / }
    upstream: app
    idempotency: { methods: [put] }
)");
  EXPECT_EQ(c.defaults.methods, (std::vector<std::string>{"POST", "PATCH", "PUT"}));
  EXPECT_EQ(c.routes[0].idempotency.methods, (std::vector<std::string>{"PUT"}));
}

TEST(LoaderTest, NormalisesMethodsHeadersAndUpstreamUrls) {
  Config c = MustLoad(R"(upstreams:
  api: { url: "http://backend.internal/api/v1/" }
  v6: { url: "http://[::1]:8081" }
routes:
  - id: r1
    match: { path_prefix: /, methods: [post, Get] }
    upstream: api
    idempotency:
      methods: [post]
      fingerprint: { headers: [X-Request-Hash, Content-Type] }
)");
  const Upstream& api = c.upstreams.at("api");
  EXPECT_EQ(api.host, "backend.internal");
  EXPECT_EQ(api.port, 80);
  EXPECT_EQ(api.base_path, "/api/v1");
  const Upstream& v6 = c.upstreams.at("v6");
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.port, 8081);
  const Route& r = c.routes[0];
  EXPECT_EQ(r.match.methods, (std::vector<std::string>{"POST", "GET"}));
  EXPECT_EQ(r.idempotency.methods, (std::vector<std::string>{"POST"}));
  EXPECT_EQ(r.idempotency.fingerprint.headers,
            (std::vector<std::string>{"x-request-hash", "content-type"}));
}

TEST(LoaderTest, HttpsUpstreamsReadTheirTlsSettings) {
  Config c = MustLoad(R"(upstreams:
  pay:
    url: https://payments.internal/v2
    tls:
      ca_file: /etc/idemgate/ca.pem
      server_name: payments.example
      cert_file: /etc/idemgate/client.pem
      key_file: /etc/idemgate/client.key
  system: { url: "https://api.example:8443" }
routes:
  - { id: r1, match: { path_prefix: /a }, upstream: pay }
  - { id: r2, match: { path_prefix: /b }, upstream: system }
)");
  const Upstream& pay = c.upstreams.at("pay");
  EXPECT_EQ(pay.scheme, "https");
  EXPECT_EQ(pay.port, 443);
  EXPECT_EQ(pay.base_path, "/v2");
  EXPECT_TRUE(pay.tls.configured);
  EXPECT_EQ(pay.tls.ca_file, "/etc/idemgate/ca.pem");
  EXPECT_EQ(pay.tls.server_name, "payments.example");
  EXPECT_EQ(pay.tls.cert_file, "/etc/idemgate/client.pem");
  EXPECT_EQ(pay.tls.key_file, "/etc/idemgate/client.key");
  const Upstream& system = c.upstreams.at("system");
  EXPECT_EQ(system.scheme, "https");
  EXPECT_EQ(system.port, 8443);
  EXPECT_FALSE(system.tls.configured);
  EXPECT_TRUE(system.tls.ca_file.empty());
}

TEST(LoaderTest, TheListenerTlsBlockIsRead) {
  Config c = MustLoad(R"(listen: 0.0.0.0:8443
tls:
  cert_file: /etc/idemgate/gateway.pem
  key_file: /etc/idemgate/gateway.key
  client_ca_file: /etc/idemgate/clients-ca.pem
upstreams:
  app: { url: http://127.0.0.1:9001 }
routes:
  - { id: r1, match: { path_prefix: / }, upstream: app }
)");
  EXPECT_TRUE(c.tls.configured);
  EXPECT_EQ(c.tls.cert_file, "/etc/idemgate/gateway.pem");
  EXPECT_EQ(c.tls.key_file, "/etc/idemgate/gateway.key");
  EXPECT_EQ(c.tls.client_ca_file, "/etc/idemgate/clients-ca.pem");
  EXPECT_FALSE(MustLoad(kMinimal).tls.configured);
  EXPECT_FALSE(c.admin.tls.configured);

  Config admin = MustLoad(R"(admin:
  listen: 127.0.0.1:9443
  tls: { cert_file: /etc/idemgate/admin.pem, key_file: /etc/idemgate/admin.key }
upstreams:
  app: { url: http://127.0.0.1:9001 }
routes:
  - { id: r1, match: { path_prefix: / }, upstream: app }
)");
  EXPECT_TRUE(admin.admin.tls.configured);
  EXPECT_EQ(admin.admin.tls.cert_file, "/etc/idemgate/admin.pem");
  EXPECT_EQ(admin.admin.tls.key_file, "/etc/idemgate/admin.key");
  EXPECT_FALSE(admin.tls.configured);
}

// identity.jwt.jwks_* (an extension of SPEC §6).
TEST(LoaderTest, JwtJwksUrlSettingsAreReadAndDefaulted) {
  const std::string head = std::string(kMinimal) + "identity:\n  mode: jwt\n  jwt:\n";
  Config c = MustLoad(head +
                      "    jwks_url: https://idp.example.com/.well-known/jwks.json?tenant=a\n"
                      "    jwks_refresh: 1h\n"
                      "    jwks_ca_file: /etc/idemgate/idp-ca.pem\n"
                      "    jwks_timeout: 1500ms\n");
  const JwtIdentity& j = c.identity.jwt;
  EXPECT_EQ(j.jwks_url, "https://idp.example.com/.well-known/jwks.json?tenant=a");
  EXPECT_EQ(j.jwks_refresh, 1h);
  EXPECT_EQ(j.jwks_ca_file, "/etc/idemgate/idp-ca.pem");
  EXPECT_EQ(j.jwks_timeout, 1500ms);
  EXPECT_TRUE(j.public_keys.empty());  // a jwks_url alone is enough keys
  EXPECT_TRUE(j.jwks_file.empty());

  // Defaults; and the URL next to the other key sources.
  Config d = MustLoad(head + "    jwks_url: \"http://[::1]:8081/jwks\"\n    jwks_file: /k.json\n"
                             "    public_keys: [ { file: /k.pem } ]\n");
  EXPECT_EQ(d.identity.jwt.jwks_url, "http://[::1]:8081/jwks");
  EXPECT_EQ(d.identity.jwt.jwks_refresh, 5min);
  EXPECT_EQ(d.identity.jwt.jwks_timeout, 5s);
  EXPECT_TRUE(d.identity.jwt.jwks_ca_file.empty());
  EXPECT_EQ(d.identity.jwt.jwks_file, "/k.json");
  EXPECT_TRUE(MustLoad(head + "    jwks_url: HTTPS://IDP.example.com\n    jwks_refresh: 10s\n"
                              "    jwks_ca_file: /ca.pem\n")
                  .identity.jwt.jwks_url.starts_with("HTTPS://"));
  EXPECT_TRUE(MustLoad(kMinimal).identity.jwt.jwks_url.empty());
}

// The keys of the embedded and memory stores, each with its own kind.
TEST(LoaderTest, StoreKeysOfEachKindAreRead) {
  Config embedded = MustLoad(std::string(kMinimal) + "store: { kind: embedded, path: /var/lib/idg, sync: true }\n");
  EXPECT_EQ(embedded.store.path, "/var/lib/idg");
  EXPECT_TRUE(embedded.store.sync);
  Config memory = MustLoad(std::string(kMinimal) + "store: { kind: memory, max_bytes: 1GiB }\n");
  EXPECT_EQ(memory.store.max_bytes, 1024u * kMiB);
  // An empty section of another kind is one left out.
  EXPECT_EQ(MustLoad(std::string(kMinimal) + "store:\n  kind: memory\n  redis:\n").store.kind, StoreKind::kMemory);
}

TEST(LoaderTest, EverySectionIsRead) {
  Config c = MustLoad(R"(listen: 0.0.0.0:0
workers: 4
shutdown_grace: 0
limits: { max_header_bytes: 8KiB, max_request_bytes: 2MB, header_timeout: 5s, idle_timeout: 2m, max_connections: 500 }
merge_slashes: false
admin: { listen: "[::1]:9090", token_env: ADMIN_TOKEN }
store:
  kind: redis
  on_error: fail_open
  redis:
    addresses: [10.0.0.1:6379, "redis-2:6380"]
    cluster: true
    username: gateway
    password_env: REDIS_PASSWORD
    key_prefix: "staging:idg:"
    timeout: 150ms
identity:
  mode: trusted_headers
  trusted_headers: { tenant: X-Org, subject: X-User }
upstreams:
  app: { url: http://127.0.0.1:9001, timeout: 10s, connect_timeout: 500ms, max_connections: 32, keepalive: false }
  restate: { url: http://127.0.0.1:8080 }
routes:
  - id: pay
    match: { path_prefix: /pay }
    upstream: app
    max_in_flight: 100
    max_in_flight_per_tenant: 10
    max_request_bytes: 64KiB
    idempotency:
      policy: prohibited
      header: X-Idem
      scope: tenant
      store_server_errors: true
      terminal_header: X-Final
      replay_header: X-Replayed
      max_response_bytes: 4MiB
      forward_key: raw
  - id: hooks
    match: { path: "/hooks/{webhook_id}", methods: [POST] }
    upstream: app
    idempotency: { policy: webhook, provider: generic, forward_key: none }
  - id: workflows
    match: { path_prefix: /restate }
    upstream: restate
    recovery: true
    recovery_upstream_path: /restate/invocation/{service}/{handler}/{key}/attach
    idempotency: { dedup: upstream, policy: required }
webhooks:
  endpoints:
    - { id: gh1, tenant: acme, project: infra, provider: github, secret_file: /run/secrets/gh }
    - { id: st1, tenant: acme, project: billing, provider: stripe, secret_env: STRIPE_SECRET }
    - id: tw1
      tenant: acme
      project: sms
      provider: twilio
      secret_env: TWILIO_TOKEN
      public_url: "https://hooks.example.com:8443"
    - id: p1
      tenant: acme
      project: partners
      provider: generic
      secret_env: P1
      generic:
        header: X-Sig
        algorithm: sha1
        encoding: base64
        prefix: "v1="
        id_form_fields: [order, attempt]
metrics: { tenant_labels: false }
log: { level: debug, format: text }
)");
  EXPECT_EQ(c.listen, "0.0.0.0:0");
  EXPECT_EQ(c.workers, 4u);
  EXPECT_EQ(c.shutdown_grace, 0s);
  EXPECT_EQ(c.limits.max_header_bytes, 8u * kKiB);
  EXPECT_EQ(c.limits.max_request_bytes, 2'000'000u);
  EXPECT_EQ(c.limits.header_timeout, 5s);
  EXPECT_EQ(c.limits.idle_timeout, 2min);
  EXPECT_EQ(c.limits.max_connections, 500u);
  EXPECT_FALSE(c.merge_slashes);
  EXPECT_EQ(c.admin.listen, "[::1]:9090");
  EXPECT_EQ(c.admin.token_env, "ADMIN_TOKEN");
  EXPECT_EQ(c.store.kind, StoreKind::kRedis);
  EXPECT_EQ(c.store.on_error, OnError::kFailOpen);
  EXPECT_EQ(c.store.redis.addresses, (std::vector<std::string>{"10.0.0.1:6379", "redis-2:6380"}));
  EXPECT_TRUE(c.store.redis.cluster);
  EXPECT_EQ(c.store.redis.password_env, "REDIS_PASSWORD");
  EXPECT_EQ(c.store.redis.username, "gateway");
  EXPECT_EQ(c.store.redis.key_prefix, "staging:idg:");
  EXPECT_EQ(c.store.redis.timeout, 150ms);
  EXPECT_EQ(c.identity.mode, IdentityMode::kTrustedHeaders);
  EXPECT_EQ(c.identity.trusted_headers.tenant, "X-Org");
  EXPECT_EQ(c.identity.trusted_headers.project, "X-Project-Id");
  EXPECT_EQ(c.identity.trusted_headers.subject, "X-User");
  const Upstream& app = c.upstreams.at("app");
  EXPECT_EQ(app.timeout, 10s);
  EXPECT_EQ(app.connect_timeout, 500ms);
  EXPECT_EQ(app.max_connections, 32u);
  EXPECT_FALSE(app.keepalive);

  ASSERT_EQ(c.routes.size(), 3u);
  const Route& pay = c.routes[0];
  EXPECT_EQ(pay.max_in_flight, 100u);
  EXPECT_EQ(pay.max_in_flight_per_tenant, 10u);
  EXPECT_EQ(pay.max_request_bytes, 64u * kKiB);
  EXPECT_EQ(pay.idempotency.policy, Policy::kProhibited);
  EXPECT_EQ(pay.idempotency.header, "X-Idem");
  EXPECT_EQ(pay.idempotency.scope, Scope::kTenant);
  EXPECT_TRUE(pay.idempotency.store_server_errors);
  EXPECT_EQ(pay.idempotency.terminal_header, "X-Final");
  EXPECT_EQ(pay.idempotency.replay_header, "X-Replayed");
  EXPECT_EQ(pay.idempotency.max_response_bytes, 4u * kMiB);
  EXPECT_EQ(pay.idempotency.forward_key, ForwardKey::kRaw);
  EXPECT_EQ(EffectiveMaxRequestBytes(pay, c.limits), 64u * kKiB);
  EXPECT_EQ(EffectiveLease(pay.idempotency, app), 15s);

  const Route& hooks = c.routes[1];
  EXPECT_EQ(hooks.match.path, "/hooks/{webhook_id}");
  EXPECT_EQ(hooks.idempotency.policy, Policy::kWebhook);
  EXPECT_EQ(hooks.idempotency.provider, "generic");
  EXPECT_EQ(EffectiveScope(hooks.idempotency, c.identity), Scope::kSubject);
  EXPECT_EQ(hooks.idempotency.forward_key, ForwardKey::kNone);

  const Route& workflows = c.routes[2];
  EXPECT_TRUE(workflows.recovery);
  EXPECT_EQ(workflows.recovery_upstream_path,
            "/restate/invocation/{service}/{handler}/{key}/attach");
  EXPECT_EQ(workflows.idempotency.dedup, DedupMode::kUpstream);
  EXPECT_EQ(workflows.idempotency.forward_key, ForwardKey::kNamespaced);
  EXPECT_EQ(workflows.idempotency.policy, Policy::kRequired);

  ASSERT_EQ(c.webhooks.size(), 4u);
  EXPECT_EQ(c.webhooks[0].id, "gh1");
  EXPECT_EQ(c.webhooks[0].tenant, "acme");
  EXPECT_EQ(c.webhooks[0].project, "infra");
  EXPECT_EQ(c.webhooks[0].provider, "github");
  EXPECT_EQ(c.webhooks[0].secret_file, "/run/secrets/gh");
  EXPECT_EQ(c.webhooks[1].secret_env, "STRIPE_SECRET");
  EXPECT_FALSE(c.webhooks[1].generic.has_value());
  EXPECT_EQ(c.webhooks[2].public_url, "https://hooks.example.com:8443");
  ASSERT_TRUE(c.webhooks[3].generic.has_value());
  const GenericWebhook& g = *c.webhooks[3].generic;
  EXPECT_EQ(g.header, "X-Sig");
  EXPECT_EQ(g.algorithm, "sha1");
  EXPECT_EQ(g.encoding, "base64");
  EXPECT_EQ(g.prefix, "v1=");
  EXPECT_TRUE(g.id_header.empty());
  EXPECT_TRUE(g.id_pointer.empty());
  EXPECT_EQ(g.id_form_fields, (std::vector<std::string>{"order", "attempt"}));
  EXPECT_FALSE(c.metrics.tenant_labels);
  EXPECT_EQ(c.log.level, "debug");
  EXPECT_EQ(c.log.format, "text");
}

TEST(LoaderTest, AnchorsAndAliasesAreExpanded) {
  Config c = MustLoad(R"(upstreams:
  app: &app_upstream { url: http://127.0.0.1:9001, timeout: 3s }
  copy: *app_upstream
routes:
  - id: r1
    match: { path_prefix: / }
    upstream: copy
)");
  EXPECT_EQ(c.upstreams.at("copy").timeout, 3s);
  EXPECT_EQ(c.upstreams.at("copy").port, 9001);
}

TEST(LoaderTest, LoadFileUsesThePathAsSource) {
  const std::string path = ::testing::TempDir() + "/idemgate_loader_test.yaml";
  {
    std::ofstream out(path);
    out << kMinimal;
  }
  StatusOr<Config> c = LoadFile(path);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->source, path);
  EXPECT_EQ(c->routes.size(), 1u);

  {
    std::ofstream out(path);
    out << kMinimal << "bogus: 1\n";
  }
  StatusOr<Config> bad = LoadFile(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().rfind(path + ":7: bogus: unknown key", 0), 0u)
      << bad.status().message();
  std::remove(path.c_str());
}

TEST(LoaderTest, LoadFileReportsMissingAndUnreadableFiles) {
  const std::string missing = ::testing::TempDir() + "/idemgate_no_such_config.yaml";
  StatusOr<Config> c = LoadFile(missing);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c.status().message().rfind(missing + ": cannot open", 0), 0u) << c.status().message();

  StatusOr<Config> dir = LoadFile(::testing::TempDir());
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("not a regular file"), std::string::npos)
      << dir.status().message();
}

// A file under the test's temporary directory, removed when the test ends.
class TempFile {
 public:
  TempFile(const std::string& name, std::string_view text) : path_(::testing::TempDir() + "/" + name) {
    std::ofstream out(path_);
    out << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(LoaderTest, WebhooksFileEndpointsFollowTheInlineOnes) {
  TempFile endpoints("idemgate_webhooks_ok.yaml", R"(# endpoints kept apart from the config
endpoints:
  - id: gh-acme
    tenant: acme
    project: infra
    provider: github
    secret_env: GH_SECRET
  - { id: tw-acme, tenant: acme, project: sms, provider: twilio, secret_file: /run/secrets/tw,
      public_url: "https://hooks.example.com" }
)");
  Config c = MustLoad(std::string(kMinimal) + "webhooks:\n  endpoints:\n    - { id: st, tenant: t, project: p, "
                      "provider: stripe, secret_env: ST }\n  file: " + endpoints.path() + "\n");
  EXPECT_EQ(c.webhooks_file, endpoints.path());
  ASSERT_EQ(c.webhooks.size(), 3u);
  EXPECT_EQ(c.webhooks[0].id, "st");
  EXPECT_TRUE(c.webhooks[0].file.empty());
  EXPECT_EQ(c.webhooks[1].id, "gh-acme");
  EXPECT_EQ(c.webhooks[1].tenant, "acme");
  EXPECT_EQ(c.webhooks[1].provider, "github");
  EXPECT_EQ(c.webhooks[1].secret_env, "GH_SECRET");
  EXPECT_EQ(c.webhooks[1].file, endpoints.path());
  EXPECT_EQ(c.webhooks[1].line, 3);
  EXPECT_EQ(c.webhooks[2].id, "tw-acme");
  EXPECT_EQ(c.webhooks[2].secret_file, "/run/secrets/tw");
  EXPECT_EQ(c.webhooks[2].public_url, "https://hooks.example.com");
  EXPECT_EQ(c.webhooks[2].line, 8);

  // An empty file holds no endpoints.
  TempFile empty("idemgate_webhooks_empty.yaml", "");
  EXPECT_TRUE(MustLoad(std::string(kMinimal) + "webhooks:\n  file: " + empty.path() + "\n").webhooks.empty());
}

TEST(LoaderTest, WebhooksFileErrorsNameThatFileAndItsLine) {
  auto error = [](const std::string& file_text, const std::string& inline_endpoints = "") {
    TempFile endpoints("idemgate_webhooks_bad.yaml", file_text);
    StatusOr<Config> c = LoadString(std::string(kMinimal) + "webhooks:\n" + inline_endpoints +
                                        "  file: " + endpoints.path() + "\n",
                                    "test.yaml");
    EXPECT_FALSE(c.ok());
    std::string message = c.ok() ? std::string() : c.status().message();
    const std::string prefix = endpoints.path() + ":";
    EXPECT_EQ(message.rfind(prefix, 0), 0u) << message;
    return message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
  };
  // Unknown key, at its own line.
  EXPECT_EQ(error("endpoints:\n  - id: w\n    tenant: t\n    secret: x\n"),
            "4: endpoints[0].secret: unknown key (allowed here: id, tenant, project, provider, secret_env, "
            "secret_file, public_url, generic)");
  // A check of the endpoint's values (validation), at the key's line.
  EXPECT_EQ(error("endpoints:\n  - id: w\n    tenant: t\n    project: p\n    provider: paypal\n"
                  "    secret_env: S\n"),
            "5: endpoints[0].provider: unknown provider \"paypal\" "
            "(expected stripe|github|twilio|twilio_event_streams|generic|standard_webhooks)");
  // Two endpoints of the file with one id.
  EXPECT_EQ(error("endpoints:\n  - { id: w, tenant: t, project: p, provider: stripe, secret_env: S }\n"
                  "  - { id: w, tenant: t, project: q, provider: stripe, secret_env: S }\n"),
            "3: endpoints[1].id: duplicate webhook endpoint id \"w\"");
  // An id of the file that an inline endpoint already has.
  EXPECT_EQ(error("\nendpoints:\n  - { id: w, tenant: t, project: p, provider: stripe, secret_env: S }\n",
                  "  endpoints:\n    - { id: w, tenant: t, project: p, provider: github, secret_env: G }\n"),
            "3: endpoints[0].id: duplicate webhook endpoint id \"w\" (also in test.yaml, webhooks.endpoints[0])");
  // A tenant or project that is not 1..256 visible ASCII characters, as in
  // the config itself.
  EXPECT_EQ(error("endpoints:\n  - id: w\n    tenant: \"evil\\r\\nX-Injected: 1\"\n    project: p\n"
                  "    provider: stripe\n    secret_env: S\n"),
            "3: endpoints[0].tenant: expected 1..256 visible ASCII characters (no space, control or non-ASCII "
            "character)");
  EXPECT_EQ(error("endpoints:\n  - { id: w, tenant: t, project: \"p\\0\", provider: stripe, secret_env: S }\n"),
            "2: endpoints[0].project: expected 1..256 visible ASCII characters (no space, control or non-ASCII "
            "character)");
  EXPECT_EQ(error("endpoints:\n  - { id: w, tenant: \"t\xff\", project: p, provider: stripe, secret_env: S }\n"),
            "2: endpoints[0].tenant: expected 1..256 visible ASCII characters (no space, control or non-ASCII "
            "character)");
  // Syntax errors, other top-level keys and other shapes.
  EXPECT_EQ(error("endpoints:\n  - id: [\n").rfind("3: YAML syntax error", 0), 0u);
  EXPECT_EQ(error("routes: []\n"), "1: routes: unknown key (allowed here: endpoints)");
  EXPECT_EQ(error("- id: w\n"), "1: expected a mapping, got a list");
}

// Any 1..256 visible ASCII characters make an endpoint's tenant or project,
// as they make a caller's.
TEST(LoaderTest, EndpointTenantAndProjectAreVisibleAscii) {
  const std::string tenant(256, 't');
  Config c = MustLoad(std::string(kMinimal) + "webhooks:\n  endpoints:\n    - { id: w, tenant: " + tenant +
                      ", project: \"p:1/~!\", provider: stripe, secret_env: S }\n");
  ASSERT_EQ(c.webhooks.size(), 1u);
  EXPECT_EQ(c.webhooks[0].tenant, tenant);
  EXPECT_EQ(c.webhooks[0].project, "p:1/~!");
}

// The data and admin listeners may share a port where their addresses do not
// meet, or where only the system can tell whether they do.
TEST(LoaderTest, ListenersMayShareAPortOnAddressesThatDoNotMeet) {
  for (const auto& [listen, admin] : std::initializer_list<std::pair<std::string, std::string>>{
           {"127.0.0.1:8080", "127.0.0.2:8080"},
           {"0.0.0.0:8080", "\"[::1]:8080\""},
           {"\"[::]:8080\"", "127.0.0.1:8080"},  // IPv4 too unless net.ipv6.bindv6only
           {"localhost:8080", "127.0.0.1:8080"},  // as the name resolves
           {"127.0.0.1:0", "127.0.0.1:0"},        // a free port each
           {"0.0.0.0:8080", "0.0.0.0:9090"}}) {
    StatusOr<Config> c =
        LoadString(std::string(kMinimal) + "listen: " + listen + "\nadmin: { listen: " + admin + " }\n", "test.yaml");
    EXPECT_TRUE(c.ok()) << listen << " and " << admin << ": " << c.status().message();
  }
}

TEST(LoaderTest, WebhooksFileThatCannotBeReadIsAnErrorOfTheConfig) {
  const std::string missing = ::testing::TempDir() + "/idemgate_no_such_webhooks.yaml";
  StatusOr<Config> c = LoadString(std::string(kMinimal) + "webhooks:\n  file: " + missing + "\n", "test.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "test.yaml:8: webhooks.file: " + missing + ": cannot open: No such file or directory");

  StatusOr<Config> dir =
      LoadString(std::string(kMinimal) + "webhooks:\n  file: " + ::testing::TempDir() + "\n", "test.yaml");
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("not a regular file"), std::string::npos) << dir.status().message();

  StatusOr<Config> empty = LoadString(std::string(kMinimal) + "webhooks:\n  file: \"\"\n", "test.yaml");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().message().rfind("test.yaml:8: webhooks.file: must not be empty", 0), 0u)
      << empty.status().message();
}

TEST(NamesTest, NameAndFromNameAreInverses) {
  auto round_trip = [](auto tag) {
    using E = decltype(tag);
    for (const auto& [value, name] : EnumNames<E>::kNames) {
      EXPECT_EQ(Name(value), name);
      EXPECT_EQ(FromName<E>(name), value);
    }
    EXPECT_FALSE(FromName<E>("no-such-value").has_value());
  };
  round_trip(Policy{});
  round_trip(Scope{});
  round_trip(InFlightMode{});
  round_trip(JsonMode{});
  round_trip(DedupMode{});
  round_trip(ForwardKey{});
  round_trip(StoreKind{});
  round_trip(OnError{});
  round_trip(IdentityMode{});
  EXPECT_EQ(AllowedNames<OnError>(), "fail_closed|fail_open");
  EXPECT_FALSE(FromName<Policy>("Required").has_value());
}

}  // namespace
}  // namespace idemgate::config
