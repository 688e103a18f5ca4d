// Every class of bad config yields InvalidArgument with a message that starts
// "bad.yaml:<line>: <key>: " and says what is wrong.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/loader.h"

namespace idemgate::config {
namespace {

// Six lines; text appended to it starts on line 7.
constexpr char kMinimal[] = R"(upstreams:
  app: { url: http://127.0.0.1:9001 }
routes:
  - id: r1
    match: { path_prefix: / }
    upstream: app
)";

// kMinimal's route with an idempotency block; the block's keys start on line 8.
std::string WithIdempotency(std::string_view body) {
  return std::string(kMinimal) + "    idempotency:\n" + std::string(body);
}

// One route `h` whose match is `path` (or another `kind` of match), with
// `extra` (route keys, 4-space indent) after its upstream; the match is on line 5.
std::string HookRoute(std::string_view path, std::string_view extra, std::string_view kind = "path") {
  return "upstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes:\n  - id: h\n    match: { " + std::string(kind) +
         ": \"" + std::string(path) + "\" }\n    upstream: app\n" + std::string(extra);
}

// kMinimal with one webhook endpoint of `provider` in block style; `extra`
// (6-space indent) starts on line 14.
std::string Endpoint(std::string_view provider, std::string_view extra) {
  return std::string(kMinimal) + "webhooks:\n  endpoints:\n    - id: w1\n      tenant: t\n      project: p\n" +
         "      provider: " + std::string(provider) + "\n      secret_env: A\n" + std::string(extra);
}

struct BadConfig {
  std::string name;
  std::string yaml;
  int line;
  std::string key;     // empty: the message has no key part
  std::string detail;  // a substring the message must contain
};

std::vector<BadConfig> BadConfigs() {
  const std::string m = kMinimal;
  // A Redis store with an address, for the cases about its other keys.
  const std::string kRedis = "store:\n  kind: redis\n  redis:\n    addresses: [r:6379]\n";
  return {
      // Unknown keys, at every depth.
      {"UnknownTopLevelKeySuggestsTheNearOne", m + "listn: 127.0.0.1:80\n", 7, "listn",
       "unknown key (did you mean \"listen\"?)"},
      {"UnknownTopLevelKeyListsTheAllowedOnes", m + "frobnicate: 1\n", 7, "frobnicate",
       "allowed here: listen, tls, workers, shutdown_grace"},
      {"UnknownKeyInIdempotency", WithIdempotency("      policy: required\n      retension: 7d\n"),
       9, "routes[0].idempotency.retension", "did you mean \"retention\"?"},
      {"UnknownKeyInUpstream",
       "upstreams:\n  app: { url: http://127.0.0.1:9001, timout: 1s }\nroutes: []\n", 2,
       "upstreams.app.timout", "did you mean \"timeout\"?"},
      {"UnknownKeyInDefaultsFingerprint",
       m + "defaults:\n  idempotency:\n    fingerprint:\n      header: [x-a]\n", 10,
       "defaults.idempotency.fingerprint.header", "did you mean \"headers\"?"},
      {"UnknownKeyInMatch",
       "upstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes:\n  - id: r1\n"
       "    match: { prefix: / }\n    upstream: app\n",
       5, "routes[0].match.prefix", "unknown key"},
      {"UnknownKeyInStoreRedis", m + "store:\n  kind: redis\n  redis:\n    adresses: [a:1]\n", 10,
       "store.redis.adresses", "did you mean \"addresses\"?"},
      {"UnknownKeyInWebhookEndpoint", m + "webhooks:\n  endpoints:\n    - id: w\n      secret: x\n",
       10, "webhooks.endpoints[0].secret", "unknown key"},
      {"MergeKeysAreNotSupported", m + "admin:\n  <<: {listen: 'a:1'}\n", 8, "admin.<<",
       "unknown key"},
      {"DuplicateKey", m + "listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\n", 8, "listen",
       "duplicate key (first at line 7)"},
      {"DuplicateUpstreamName",
       "upstreams:\n  app: { url: http://a:1 }\n  app: { url: http://b:1 }\nroutes: []\n", 3,
       "upstreams.app", "duplicate key (first at line 2)"},

      // Values that do not parse.
      {"BadDuration", WithIdempotency("      retention: 1x\n"), 8,
       "routes[0].idempotency.retention", "invalid duration \"1x\" ("},
      {"DurationWithoutUnit",
       "upstreams:\n  app:\n    url: http://127.0.0.1:9001\n    timeout: 30\nroutes: []\n", 4,
       "upstreams.app.timeout", "invalid duration \"30\""},
      {"NegativeDuration", m + "shutdown_grace: -5s\n", 7, "shutdown_grace", "invalid duration"},
      {"BadSize", m + "limits:\n  max_request_bytes: 10 MiB\n", 8, "limits.max_request_bytes",
       "invalid size \"10 MiB\""},
      {"FractionalSize", WithIdempotency("      max_response_bytes: 1.5MiB\n"), 8,
       "routes[0].idempotency.max_response_bytes", "invalid size \"1.5MiB\""},
      {"NotANumber", m + "workers: many\n", 7, "workers", "expected a whole number"},
      {"NegativeNumber", m + "workers: -1\n", 7, "workers", "expected a whole number (0 or more), got \"-1\""},
      {"NotABool",
       "upstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes:\n  - id: r1\n"
       "    match: { path_prefix: / }\n    upstream: app\n    recovery: yes\n",
       7, "routes[0].recovery", "expected true or false, got \"yes\""},
      {"StringExpectedGotList", m + "listen: [a, b]\n", 7, "listen",
       "expected a string, got a list"},
      {"StringExpectedGotNothing", m + "admin:\n  token_env:\n", 8, "admin.token_env",
       "expected a string, got nothing"},
      {"ListExpected", WithIdempotency("      methods: POST\n"), 8, "routes[0].idempotency.methods",
       "expected a list, got \"POST\""},
      {"MappingExpected", m + "store: embedded\n", 7, "store",
       "expected a mapping, got \"embedded\""},
      {"RoutesMustBeAList", "upstreams:\n  app: { url: http://a:1 }\nroutes:\n  r1: {}\n", 3,
       "routes", "expected a list, got a mapping"},
      {"EmptyRouteItem", m + "  -\n", 3, "routes[1]", "expected a mapping, got nothing"},

      // Unknown enum values.
      {"BadPolicy", WithIdempotency("      policy: sometimes\n"), 8, "routes[0].idempotency.policy",
       "unknown value \"sometimes\" (expected required|optional|webhook|passthrough|prohibited)"},
      {"BadScope", WithIdempotency("      scope: user\n"), 8, "routes[0].idempotency.scope",
       "(expected subject|project|tenant|global)"},
      {"BadInFlight", WithIdempotency("      in_flight: queue\n"), 8,
       "routes[0].idempotency.in_flight", "(expected reject|wait)"},
      {"BadJsonMode", WithIdempotency("      fingerprint: { json: sorted }\n"), 8,
       "routes[0].idempotency.fingerprint.json", "(expected canonical|raw)"},
      {"BadDedup", WithIdempotency("      dedup: both\n"), 8, "routes[0].idempotency.dedup",
       "(expected gateway|upstream)"},
      {"BadForwardKey", WithIdempotency("      forward_key: hashed\n"), 8,
       "routes[0].idempotency.forward_key", "(expected namespaced|raw|none)"},
      {"BadStoreKind", m + "store: { kind: postgres }\n", 7, "store.kind",
       "unknown value \"postgres\" (expected embedded|memory|redis)"},
      {"BadOnError", m + "store: { on_error: retry }\n", 7, "store.on_error",
       "(expected fail_closed|fail_open)"},
      {"BadIdentityMode", m + "identity: { mode: oauth }\n", 7, "identity.mode",
       "(expected none|trusted_headers|jwt|api_key)"},
      {"PolicyIsCaseSensitive", WithIdempotency("      policy: Required\n"), 8,
       "routes[0].idempotency.policy", "unknown value \"Required\""},
      {"BadLogLevel", m + "log:\n  level: verbose\n", 8, "log.level",
       "unknown value \"verbose\" (expected debug|info|warn|error)"},
      {"BadLogFormat", m + "log:\n  format: xml\n", 8, "log.format", "(expected json|text)"},

      // Routes and their references.
      {"UnknownUpstream",
       "upstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes:\n  - id: r1\n"
       "    match: { path_prefix: / }\n    upstream: apx\n",
       6, "routes[0].upstream", "unknown upstream \"apx\" (defined: app)"},
      {"RouteWithoutUpstream",
       "upstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes:\n  - id: r1\n"
       "    match: { path_prefix: / }\n",
       4, "routes[0].upstream", "missing (every route needs an upstream)"},
      {"DuplicateRouteId", m + "  - id: r1\n    match: { path: /x }\n    upstream: app\n", 7,
       "routes[1].id", "duplicate route id \"r1\" (first used at line 4)"},
      {"RouteWithoutId", m + "  - match: { path: /x }\n    upstream: app\n", 7, "routes[1].id",
       "missing (every route needs an id)"},
      {"RouteIdWithColon", m + "  - id: \"a:b\"\n    match: { path: /x }\n    upstream: app\n", 7,
       "routes[1].id", "invalid route id \"a:b\""},
      {"MatchWithBothPathAndPrefix",
       "upstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes:\n  - id: r1\n"
       "    match: { path_prefix: /a, path: /a/b }\n    upstream: app\n",
       5, "routes[0].match", "set only one of path_prefix and path"},
      {"MatchWithNeither",
       "upstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes:\n  - id: r1\n"
       "    match: { methods: [GET] }\n    upstream: app\n",
       5, "routes[0].match", "needs one of path_prefix or path"},
      {"RouteWithoutMatch",
       "upstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes:\n  - id: r1\n"
       "    upstream: app\n",
       4, "routes[0].match", "needs one of path_prefix or path"},
      {"PathWithoutLeadingSlash",
       "upstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes:\n  - id: r1\n"
       "    match:\n      path_prefix: api/v1\n    upstream: app\n",
       6, "routes[0].match.path_prefix", "must start with '/' (got \"api/v1\")"},
      {"BadMatchMethod",
       "upstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes:\n  - id: r1\n"
       "    match:\n      path: /x\n      methods:\n        - GET\n        - \"PO ST\"\n"
       "    upstream: app\n",
       9, "routes[0].match.methods[1]", "invalid method \"PO ST\""},
      {"BadIdempotencyMethod", WithIdempotency("      methods: [POST, \"P/T\"]\n"), 8,
       "routes[0].idempotency.methods[1]", "invalid method \"P/T\""},
      {"EmptyIdempotencyMethods", WithIdempotency("      methods: []\n"), 8,
       "routes[0].idempotency.methods", "must list at least one method"},
      {"ZeroMaxInFlight", m + "    max_in_flight: 0\n", 7, "routes[0].max_in_flight",
       "must be greater than 0"},
      {"RecoveryPathWithoutSlash",
       m + "    recovery: true\n    recovery_upstream_path: attach\n    idempotency: { dedup: upstream }\n", 8,
       "routes[0].recovery_upstream_path", "must start with '/'"},
      // recovery_upstream_path is the target of the upstream's request line.
      {"RecoveryPathWithCrLf",
       m + "    recovery: true\n    recovery_upstream_path: \"/attach/{key}\\r\\nX-Injected: 1\"\n"
           "    idempotency: { dedup: upstream }\n",
       8, "routes[0].recovery_upstream_path",
       "must not contain white space, control characters, '#' or non-ASCII characters (percent-encode them)"},
      {"RecoveryPathWithASpace",
       m + "    recovery: true\n    recovery_upstream_path: \"/attach/{key} HTTP/1.0\"\n"
           "    idempotency: { dedup: upstream }\n",
       8, "routes[0].recovery_upstream_path", "must not contain white space"},
      {"RecoveryPathNotAscii",
       m + "    recovery: true\n    recovery_upstream_path: \"/caf\\xe9/{key}\"\n    idempotency: { dedup: upstream }\n",
       8, "routes[0].recovery_upstream_path", "must not contain white space"},
      // recovery_upstream_path is used only by recovery under dedup: upstream.
      {"RecoveryUpstreamPathWithoutRecovery",
       m + "    recovery_upstream_path: /attach/{key}\n    idempotency: { dedup: upstream }\n", 7,
       "routes[0].recovery_upstream_path", "it needs recovery: true on this route"},
      {"RecoveryUpstreamPathWithoutUpstreamDedup", m + "    recovery: true\n    recovery_upstream_path: /attach/{key}\n",
       8, "routes[0].recovery_upstream_path", "used only with idempotency.dedup: upstream"},
      {"UpstreamDedupWithoutAKey", WithIdempotency("      dedup: upstream\n      forward_key: none\n"), 9,
       "routes[0].idempotency.forward_key", "forward_key: none sends none"},
      {"UpstreamDedupWithARawKeyAcrossScopes",
       WithIdempotency("      dedup: upstream\n      forward_key: raw\n      scope: subject\n"), 9,
       "routes[0].idempotency.forward_key", "callers of different scopes"},
      {"RecoveryPathWithoutTheKey",
       m + "    recovery: true\n    recovery_upstream_path: /att9/static\n    idempotency: { dedup: upstream }\n", 8,
       "routes[0].recovery_upstream_path", "must hold {key}"},
      {"RecoveryPathWithADotDotSegment",
       m + "    recovery: true\n    recovery_upstream_path: /att/../admin/{key}\n    idempotency: { dedup: upstream }\n",
       8, "routes[0].recovery_upstream_path", "must not hold a '.' or '..' segment"},
      {"UpstreamDedupOnPassthrough", WithIdempotency("      policy: passthrough\n      dedup: upstream\n"), 9,
       "routes[0].idempotency.dedup", "dedup: upstream needs policy required, optional or webhook"},
      {"RecoveryOnPassthrough", m + "    recovery: true\n    idempotency: { policy: passthrough }\n", 7,
       "routes[0].recovery", "recovery is not available on policy: passthrough routes"},
      {"UpstreamRecoveryNeedsAPath",
       m + "    recovery: true\n    idempotency: { dedup: upstream }\n", 7, "routes[0].recovery",
       "recovery with dedup: upstream needs recovery_upstream_path"},
      {"NoRoutesKey", "upstreams:\n  app: { url: http://127.0.0.1:9001 }\n", 1, "routes",
       "at least one route is required"},
      {"EmptyRoutes", "upstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes: []\n", 3,
       "routes", "at least one route is required"},
      {"EmptyDocument", "", 1, "routes", "at least one route is required"},
      {"CommentsOnly", "# nothing yet\n", 1, "routes", "at least one route is required"},

      // Upstreams.
      {"ListenerTlsWithoutKey",
       "tls:\n  cert_file: /etc/gateway.pem\nupstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes: []\n", 1,
       "tls.key_file", "missing (a TLS listener needs its private key)"},
      {"AdminTlsWithoutAdminListener",
       "admin:\n  tls: { cert_file: /etc/a.pem, key_file: /etc/a.key }\n"
       "upstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes: []\n", 2,
       "admin.tls", "there is no admin listener to serve over TLS"},
      {"AdminTlsWithoutCertificate",
       "admin:\n  listen: 127.0.0.1:9090\n  tls:\n    key_file: /etc/a.key\n"
       "upstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes: []\n", 3,
       "admin.tls.cert_file", "missing (a TLS listener needs its certificate)"},
      {"ListenerTlsUnknownKey",
       "tls:\n  cert_file: /etc/gateway.pem\n  key_file: /etc/gateway.key\n  ca_file: /etc/ca.pem\n"
       "upstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes: []\n", 4,
       "tls.ca_file", "unknown key"},
      {"UpstreamWithoutScheme", "upstreams:\n  app: { url: \"127.0.0.1:9001\" }\nroutes: []\n", 2,
       "upstreams.app.url", "scheme must be http or https"},
      {"TlsOnPlainUpstream",
       "upstreams:\n  app:\n    url: http://127.0.0.1:9001\n    tls: { ca_file: /etc/ca.pem }\nroutes: []\n", 4,
       "upstreams.app.tls", "only an https upstream takes tls settings"},
      {"TlsCertWithoutKey",
       "upstreams:\n  app:\n    url: https://pay.example\n    tls: { cert_file: /etc/client.pem }\nroutes: []\n", 4,
       "upstreams.app.tls", "cert_file and key_file go together"},
      {"TlsBadServerName",
       "upstreams:\n  app:\n    url: https://10.0.0.5\n    tls:\n      server_name: \"pay example\"\nroutes: []\n", 5,
       "upstreams.app.tls.server_name", "invalid server name \"pay example\""},
      {"TlsUnknownKey",
       "upstreams:\n  app:\n    url: https://pay.example\n    tls:\n      ca_fille: /etc/ca.pem\nroutes: []\n", 5,
       "upstreams.app.tls.ca_fille", "did you mean \"ca_file\"?"},
      {"UpstreamWithBadPort", "upstreams:\n  app:\n    url: http://127.0.0.1:99999\nroutes: []\n",
       3, "upstreams.app.url", "is not a number in 1..65535"},
      {"UpstreamWithoutUrl", "upstreams:\n  app: { timeout: 1s }\nroutes: []\n", 2,
       "upstreams.app.url", "missing (every upstream needs a url)"},
      {"UpstreamZeroTimeout", "upstreams:\n  app: { url: http://a:1, timeout: 0 }\nroutes: []\n", 2,
       "upstreams.app.timeout", "must be greater than 0"},
      {"UpstreamZeroConnections",
       "upstreams:\n  app:\n    url: http://a:1\n    max_connections: 0\nroutes: []\n", 4,
       "upstreams.app.max_connections", "must be greater than 0"},

      // Addresses.
      {"ListenWithoutPort", m + "listen: \"8080\"\n", 7, "listen", "missing port"},
      {"ListenWithBadPort", m + "listen: localhost:http\n", 7, "listen",
       "port \"http\" is not a number in 0..65535"},
      {"AdminListenBad", m + "admin: { listen: \"localhost\" }\n", 7, "admin.listen",
       "expected host:port"},
      // The two listeners cannot both bind one port where their addresses meet.
      {"AdminListenIsListen", m + "listen: 127.0.0.1:8080\nadmin: { listen: 127.0.0.1:8080 }\n", 8, "admin.listen",
       "the admin listener cannot listen where the data listener does (listen: \"127.0.0.1:8080\")"},
      {"AdminListenIsListenByName", m + "listen: LocalHost:8080\nadmin:\n  listen: localhost:8080\n", 9,
       "admin.listen", "cannot listen where the data listener does"},
      {"AdminListenIsListenInAShortIpv4Spelling", m + "listen: 127.0.0.1:8080\nadmin: { listen: 127.1:8080 }\n", 8,
       "admin.listen", "cannot listen where the data listener does"},
      {"AdminListenIsListenAsANumber", m + "listen: 127.0.0.1:8080\nadmin: { listen: 2130706433:8080 }\n", 8,
       "admin.listen", "cannot listen where the data listener does"},
      {"AdminListenIsListenWithAFinalDot", m + "listen: localhost:8080\nadmin: { listen: \"localhost.:8080\" }\n", 8,
       "admin.listen", "cannot listen where the data listener does"},
      {"AdminListenIsListenSpelledOtherwise", m + "listen: \"[::1]:8080\"\nadmin: { listen: \"[0:0::0:1]:8080\" }\n",
       8, "admin.listen", "cannot listen where the data listener does"},
      {"AdminListenUnderAnIpv4Wildcard", m + "listen: 0.0.0.0:8080\nadmin: { listen: 127.0.0.1:8080 }\n", 8,
       "admin.listen",
       "the admin listener cannot listen on \"127.0.0.1:8080\" next to listen: \"0.0.0.0:8080\" (the wildcard "
       "0.0.0.0 takes port 8080 on every IPv4 address); give it another port"},
      {"AdminListenIsAnIpv4Wildcard", m + "listen: 10.1.2.3:8080\nadmin: { listen: 0.0.0.0:8080 }\n", 8,
       "admin.listen", "(the wildcard 0.0.0.0 takes port 8080 on every IPv4 address)"},
      {"AdminListenUnderAnIpv6Wildcard", m + "listen: \"[::]:8080\"\nadmin: { listen: \"[::1]:8080\" }\n", 8,
       "admin.listen", "(the wildcard :: takes port 8080 on every IPv6 address)"},
      // A key of another kind of store would be ignored.
      {"MaxBytesOnTheEmbeddedStore", m + "store:\n  kind: embedded\n  max_bytes: 20KiB\n", 9, "store.max_bytes",
       "only used with store.kind memory (kind is embedded)"},
      {"SyncOnTheMemoryStore", m + "store:\n  kind: memory\n  sync: true\n", 9, "store.sync",
       "only used with store.kind embedded (kind is memory)"},
      {"PathOnTheRedisStore", m + "store:\n  kind: redis\n  path: /tmp/x\n  redis: { addresses: [r:6379] }\n", 9,
       "store.path", "only used with store.kind embedded (kind is redis)"},
      {"RedisBlockOnTheEmbeddedStore", m + "store:\n  redis: { addresses: [r:6379] }\n", 8, "store.redis",
       "only used with store.kind redis (kind is embedded)"},
      {"RedisWithoutAddresses", m + "store:\n  kind: redis\n", 7, "store.redis.addresses",
       "store.kind redis needs at least one address"},
      {"RedisBadAddress", m + "store:\n  kind: redis\n  redis:\n    addresses: [redis]\n", 10,
       "store.redis.addresses[0]", "missing port"},
      {"RedisPortZero", m + "store:\n  kind: redis\n  redis:\n    addresses: [\"r:0\"]\n", 10,
       "store.redis.addresses[0]", "port must be in 1..65535"},
      {"RedisEmptyKeyPrefix", m + kRedis + "    key_prefix: \"\"\n", 11, "store.redis.key_prefix",
       "must not be empty"},
      {"RedisKeyPrefixWithAHashTag", m + kRedis + "    key_prefix: \"{prod}:\"\n", 11,
       "store.redis.key_prefix", "must not contain '{' or '}'"},
      {"RedisKeyPrefixWithASpace", m + kRedis + "    key_prefix: \"prod idg:\"\n", 11,
       "store.redis.key_prefix", "must be visible ASCII"},
      {"RedisKeyPrefixTooLong", m + kRedis + "    key_prefix: " + std::string(65, 'p') + "\n", 11,
       "store.redis.key_prefix", "must be at most 64 bytes"},
      {"RedisUsernameWithoutPassword", m + kRedis + "    username: gateway\n", 11,
       "store.redis.username", "needs store.redis.password_env"},
      {"RedisUsernameWithASpace", m + kRedis + "    username: \"a b\"\n    password_env: P\n", 11,
       "store.redis.username", "must be visible ASCII"},

      // Idempotency ranges and shapes.
      {"ZeroLease", WithIdempotency("      lease: 0\n"), 8, "routes[0].idempotency.lease",
       "must be greater than 0"},
      // Durations the parser takes but that overflow once added to the
      // current time (106751991160d is about the most milliseconds an int64
      // holds): at most 100 years, for every duration key.
      {"HugeRetention", WithIdempotency("      retention: 106751991160d\n"), 8, "routes[0].idempotency.retention",
       "must be at most 36500d (100 years)"},
      {"RetentionJustOverAHundredYears", m + "defaults:\n  idempotency:\n    retention: 36501d\n", 9,
       "defaults.idempotency.retention", "must be at most 36500d (100 years), got 36501d"},
      {"HugeLease", WithIdempotency("      lease: 106751991160d\n"), 8, "routes[0].idempotency.lease",
       "must be at most 36500d"},
      {"HugeWaitTimeout", WithIdempotency("      wait_timeout: 1000000h\n"), 8,
       "routes[0].idempotency.wait_timeout", "must be at most 36500d"},
      {"HugeUpstreamTimeout", "upstreams:\n  app:\n    url: http://a:1\n    timeout: 106751991160d\nroutes: []\n", 4,
       "upstreams.app.timeout", "must be at most 36500d"},
      {"HugeConnectTimeout", "upstreams:\n  app:\n    url: http://a:1\n    connect_timeout: 40000d\nroutes: []\n", 4,
       "upstreams.app.connect_timeout", "must be at most 36500d"},
      {"ZeroMaxConnections", m + "limits:\n  max_connections: 0\n", 8, "limits.max_connections",
       "must be greater than 0"},
      {"NegativeMaxConnections", m + "limits:\n  max_connections: -1\n", 8, "limits.max_connections",
       "expected a whole number"},
      {"HugeIdleTimeout", m + "limits:\n  idle_timeout: 106751991160d\n", 8, "limits.idle_timeout",
       "must be at most 36500d"},
      {"HugeHeaderTimeout", m + "limits:\n  header_timeout: 106751991160d\n", 8, "limits.header_timeout",
       "must be at most 36500d"},
      {"HugeShutdownGrace", m + "shutdown_grace: 106751991160d\n", 7, "shutdown_grace", "must be at most 36500d"},
      {"HugeRedisTimeout", m + "store:\n  kind: redis\n  redis:\n    addresses: [\"r:1\"]\n    timeout: 40000d\n", 11,
       "store.redis.timeout", "must be at most 36500d"},
      // There is no lease renewal: a lease that ends before the upstream
      // must answer lets a retry run a slow write a second time.
      {"LeaseShorterThanTheUpstreamTimeout", WithIdempotency("      lease: 10s\n"), 8, "routes[0].idempotency.lease",
       "lease 10s of route \"r1\" is shorter than the timeout of its upstream \"app\" (30s)"},
      {"DefaultLeaseShorterThanARoutesUpstreamTimeout",
       "upstreams:\n  app: { url: http://127.0.0.1:9001 }\n  fast: { url: http://127.0.0.1:9002, timeout: 5s }\n"
       "defaults:\n  idempotency: { lease: 10s }\nroutes:\n  - id: quick\n    match: { path_prefix: /q }\n"
       "    upstream: fast\n  - id: slow\n    match: { path_prefix: / }\n    upstream: app\n",
       10, "routes[1].idempotency.lease", "of route \"slow\" is shorter than the timeout of its upstream \"app\""},
      // Recovery answers GET requests below the route's prefix.
      {"RecoveryOnARouteThatTakesNoGet",
       "upstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes:\n  - id: pay\n"
       "    match: { path_prefix: /pay, methods: [POST, PATCH] }\n    upstream: app\n    recovery: true\n",
       7, "routes[0].recovery", "route \"pay\" serves recovery (GET .../by-idempotency-key/{key}) but its match.methods"},
      // ... so an exact path has nothing below it to serve, and a prohibited route no outcome.
      {"RecoveryOnAnExactPath",
       "upstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes:\n  - id: pay\n"
       "    match: { path: /pay }\n    upstream: app\n    recovery: true\n",
       7, "routes[0].recovery", "an exact match.path has no room for; match this route with path_prefix"},
      {"RecoveryOnAProhibitedRoute", m + "    recovery: true\n    idempotency: { policy: prohibited }\n", 7,
       "routes[0].recovery", "recovery is not available on policy: prohibited routes"},
      {"ZeroWaitTimeout", WithIdempotency("      wait_timeout: 0s\n"), 8,
       "routes[0].idempotency.wait_timeout", "must be greater than 0"},
      {"ZeroMaxResponseBytes", WithIdempotency("      max_response_bytes: 0\n"), 8,
       "routes[0].idempotency.max_response_bytes", "must be greater than 0"},
      {"DefaultsErrorNamesTheDefaultsLine", m + "defaults:\n  idempotency:\n    wait_timeout: 0\n",
       9, "defaults.idempotency.wait_timeout", "must be greater than 0"},
      {"JsonFieldNotAPointer",
       WithIdempotency("      fingerprint:\n        json_fields: [amount]\n"), 9,
       "routes[0].idempotency.fingerprint.json_fields[0]",
       "invalid JSON Pointer \"amount\": must start with '/'"},
      {"JsonFieldBadEscape",
       WithIdempotency(
           "      fingerprint:\n        json_fields:\n          - /ok\n          - /a~2\n"),
       11, "routes[0].idempotency.fingerprint.json_fields[1]", "'~' must be followed by 0 or 1"},
      {"BadFingerprintHeader", WithIdempotency("      fingerprint: { headers: [\"x y\"] }\n"), 8,
       "routes[0].idempotency.fingerprint.headers[0]", "invalid header name \"x y\""},
      {"BadKeyHeader", WithIdempotency("      header: \"Idempotency Key\"\n"), 8,
       "routes[0].idempotency.header", "invalid header name"},
      {"KeyCharsetWithColon", WithIdempotency("      key: { charset: \"+:\" }\n"), 8,
       "routes[0].idempotency.key.charset", "':' can never be allowed"},
      {"KeyMaxLengthZero", WithIdempotency("      key:\n        max_length: 0\n"), 9,
       "routes[0].idempotency.key.max_length", "must be in 1..4096"},
      {"WebhookWithoutProvider", WithIdempotency("      policy: webhook\n"), 7,
       "routes[0].idempotency.provider", "policy webhook needs a provider"},
      {"UnknownProvider", WithIdempotency("      policy: webhook\n      provider: paypal\n"), 9,
       "routes[0].idempotency.provider", "unknown provider \"paypal\""},
      {"WebhookRouteWithoutPlaceholder", WithIdempotency("      policy: webhook\n      provider: stripe\n"), 5,
       "routes[0].match.path_prefix", "a webhook route's path needs one whole segment {webhook_id}"},
      {"PlaceholderOnNonWebhookRoute", HookRoute("/h/{webhook_id}", ""), 5, "routes[0].match.path",
       "only policy: webhook routes may hold {webhook_id}"},
      {"PlaceholderInsideASegment",
       HookRoute("/h/x{webhook_id}", "    idempotency: { policy: webhook, provider: stripe }\n"), 5,
       "routes[0].match.path", "needs one whole segment"},
      {"TwoPlaceholders",
       HookRoute("/h/{webhook_id}/{webhook_id}", "    idempotency: { policy: webhook, provider: stripe }\n"), 5,
       "routes[0].match.path", "needs one whole segment"},
      {"ZeroPerTenantInFlight", std::string(kMinimal) + "    max_in_flight_per_tenant: 0\n", 7,
       "routes[0].max_in_flight_per_tenant", "must be greater than 0"},
      {"WebhookRouteWithRecovery",
       HookRoute("/h/{webhook_id}", "    recovery: true\n    idempotency: { policy: webhook, provider: stripe }\n",
                 "path_prefix"),
       7, "routes[0].recovery", "recovery is not available on webhook routes"},
      // The id is one whole segment of an exact path: a prefix would take "/h/acme/extra" too.
      {"WebhookRouteWithPathPrefix",
       HookRoute("/h/{webhook_id}", "    idempotency: { policy: webhook, provider: stripe }\n", "path_prefix"), 5,
       "routes[0].match.path_prefix",
       "a webhook route matches an exact path (match: { path: \"/h/{webhook_id}\" })"},
      {"ProviderOnNonWebhookRoute", WithIdempotency("      provider: stripe\n"), 8,
       "routes[0].idempotency.provider", "provider is only used with policy: webhook"},

      // Identity.
      {"JwtWithoutKeys", m + "identity:\n  mode: jwt\n", 7, "identity.jwt",
       "needs keys: public_keys, jwks_file, jwks_url or (HS256) secret_env / secret_file"},
      {"JwksUrlWithAnotherScheme", m + "identity:\n  mode: jwt\n  jwt: { jwks_url: \"ftp://idp/jwks\" }\n", 9,
       "identity.jwt.jwks_url", "invalid URL \"ftp://idp/jwks\": scheme must be http or https"},
      {"JwksUrlWithoutScheme", m + "identity:\n  mode: jwt\n  jwt: { jwks_url: idp.example.com/jwks }\n", 9,
       "identity.jwt.jwks_url", "scheme must be http or https"},
      // The password in user information is not echoed.
      {"JwksUrlWithUserInfo", m + "identity:\n  mode: jwt\n  jwt: { jwks_url: \"https://u:p@idp/jwks\" }\n", 9,
       "identity.jwt.jwks_url", "invalid URL \"https://***@idp/jwks\": user info is not allowed"},
      {"JwksUrlWithoutHost", m + "identity:\n  mode: jwt\n  jwt: { jwks_url: \"https:///jwks\" }\n", 9,
       "identity.jwt.jwks_url", "missing host"},
      {"JwksUrlWithABadPort", m + "identity:\n  mode: jwt\n  jwt: { jwks_url: \"http://idp:99999/jwks\" }\n", 9,
       "identity.jwt.jwks_url", "bad host or port \"idp:99999\""},
      {"JwksUrlWithAFragment", m + "identity:\n  mode: jwt\n  jwt: { jwks_url: \"http://idp/jwks#k\" }\n", 9,
       "identity.jwt.jwks_url", "a fragment is not allowed"},
      {"JwksUrlWithWhiteSpace", m + "identity:\n  mode: jwt\n  jwt: { jwks_url: \"http://idp/my jwks\" }\n", 9,
       "identity.jwt.jwks_url", "contains white space"},
      {"JwksRefreshTooShort",
       m + "identity:\n  mode: jwt\n  jwt: { jwks_url: \"http://idp/jwks\", jwks_refresh: 9s }\n", 9,
       "identity.jwt.jwks_refresh", "must be at least 10s"},
      {"JwksRefreshNotADuration",
       m + "identity:\n  mode: jwt\n  jwt: { jwks_url: \"http://idp/jwks\", jwks_refresh: soon }\n", 9,
       "identity.jwt.jwks_refresh", "invalid duration \"soon\""},
      {"JwksTimeoutZero", m + "identity:\n  mode: jwt\n  jwt: { jwks_url: \"http://idp/jwks\", jwks_timeout: 0 }\n",
       9, "identity.jwt.jwks_timeout", "must be greater than 0"},
      {"JwksCaFileWithAnHttpUrl",
       m + "identity:\n  mode: jwt\n  jwt: { jwks_url: \"http://idp/jwks\", jwks_ca_file: /ca.pem }\n", 9,
       "identity.jwt.jwks_ca_file", "only used with an https jwks_url"},
      {"JwksCaFileWithoutAUrl", m + "identity:\n  mode: jwt\n  jwt: { jwks_file: /k, jwks_ca_file: /ca.pem }\n", 9,
       "identity.jwt.jwks_ca_file", "only used with an https jwks_url"},
      {"JwksUriIsNotAKey", m + "identity:\n  mode: jwt\n  jwt: { jwks_uri: \"http://idp/jwks\" }\n", 9,
       "identity.jwt.jwks_uri", "unknown key (did you mean \"jwks_url\"?)"},
      {"JwtUnknownAlgorithm", m + "identity:\n  mode: jwt\n  jwt: { algorithms: [RS512], jwks_file: /k }\n", 9,
       "identity.jwt.algorithms[0]", "unknown algorithm \"RS512\" (expected RS256|ES256|HS256)"},
      {"JwtHs256WithoutSecret", m + "identity:\n  mode: jwt\n  jwt: { algorithms: [HS256] }\n", 9, "identity.jwt",
       "HS256 needs secret_env or secret_file"},
      {"JwtSecretWithoutHs256", m + "identity:\n  mode: jwt\n  jwt: { jwks_file: /k, secret_env: S }\n", 9,
       "identity.jwt.algorithms", "a shared secret needs HS256 in algorithms"},
      {"JwtKeyAlgorithmNotAllowed",
       m + "identity:\n  mode: jwt\n  jwt: { algorithms: [ES256], public_keys: [ { file: /k.pem } ] }\n", 9,
       "identity.jwt.public_keys[0].alg", "RS256 is not in identity.jwt.algorithms"},
      {"JwtBadSubjectType", m + "identity:\n  mode: jwt\n  jwt: { jwks_file: /k, subject_type: robot }\n", 9,
       "identity.jwt.subject_type", "expected user|service|tenant_member|client (got \"robot\")"},
      {"JwtLeewayTooLong", m + "identity:\n  mode: jwt\n  jwt: { jwks_file: /k, leeway: 1h }\n", 9,
       "identity.jwt.leeway", "must be in 0s..10m"},
      {"JwtSettingsNeedTheirMode", m + "identity:\n  mode: none\n  jwt: { jwks_file: /k }\n", 9, "identity.jwt",
       "only used with identity.mode jwt (mode is none)"},
      {"ApiKeyWithoutFile", m + "identity: { mode: api_key }\n", 7, "identity.api_key.keys_file",
       "missing (identity.mode api_key needs a keys file)"},
      {"ApiKeySettingsNeedTheirMode", m + "identity:\n  mode: jwt\n  api_key: { keys_file: /k }\n", 9,
       "identity.api_key", "only used with identity.mode api_key (mode is jwt)"},
      {"TrustedHeadersNeedTheirMode", m + "identity:\n  trusted_headers: { tenant: X-T }\n", 8,
       "identity.trusted_headers", "only used with identity.mode trusted_headers"},
      {"TrustedHeadersMustDiffer",
       m + "identity:\n  mode: trusted_headers\n  trusted_headers: { tenant: X-A, project: x-a }\n",
       9, "identity.trusted_headers", "three different headers"},
      {"UnknownIdentityKey", m + "identity:\n  mode: none\n  oauth: {}\n", 9, "identity.oauth",
       "unknown key"},

      // Webhook endpoints.
      {"EndpointWithoutSecret",
       m + "webhooks:\n  endpoints:\n    - { id: w1, tenant: t, project: p, provider: stripe }\n",
       9, "webhooks.endpoints[0]", "set exactly one of secret_env and secret_file"},
      {"EndpointWithBothSecrets",
       m + "webhooks:\n  endpoints:\n    - id: w1\n      tenant: t\n      project: p\n"
           "      provider: github\n      secret_env: A\n      secret_file: /b\n",
       9, "webhooks.endpoints[0]", "set exactly one of secret_env and secret_file"},
      {"EndpointWithUnknownProvider",
       m + "webhooks:\n  endpoints:\n    - id: w1\n      tenant: t\n      project: p\n"
           "      provider: paypal\n      secret_env: A\n",
       12, "webhooks.endpoints[0].provider", "unknown provider \"paypal\""},
      {"GenericEndpointWithoutSettings",
       m + "webhooks:\n  endpoints:\n    - { id: g, tenant: t, project: p, provider: generic, secret_env: A }\n",
       9, "webhooks.endpoints[0].generic", "provider generic needs generic:"},
      {"GenericWithTwoIdSources", Endpoint("generic", "      generic: { header: X-S, id_header: X-Id, id_pointer: /id }\n"),
       14, "webhooks.endpoints[0].generic", "set exactly one of id_header, id_pointer and id_form_fields"},
      {"GenericWithoutHeader", Endpoint("generic", "      generic: { id_header: X-Id }\n"), 14,
       "webhooks.endpoints[0].generic.header", "missing"},
      {"GenericUnknownAlgorithm",
       Endpoint("generic", "      generic: { header: X-S, algorithm: md5, id_header: X-Id }\n"), 14,
       "webhooks.endpoints[0].generic.algorithm", "expected sha256 or sha1 (got \"md5\")"},
      {"GenericBadPointer", Endpoint("generic", "      generic: { header: X-S, id_pointer: id }\n"), 14,
       "webhooks.endpoints[0].generic.id_pointer", "invalid JSON Pointer \"id\""},
      {"GenericSettingsOnStripe", Endpoint("stripe", "      generic: { header: X-S, id_header: X-Id }\n"), 14,
       "webhooks.endpoints[0].generic", "only provider generic takes generic settings"},
      {"PublicUrlWithPath", Endpoint("twilio", "      public_url: \"https://hooks.example.com/x\"\n"), 14,
       "webhooks.endpoints[0].public_url", "expected scheme://host[:port]"},
      {"PublicUrlOnStripe", Endpoint("stripe", "      public_url: \"https://hooks.example.com\"\n"), 14,
       "webhooks.endpoints[0].public_url",
       "only providers twilio and twilio_event_streams sign the URL they call, so only they take public_url "
       "(provider is \"stripe\")"},
      {"PublicUrlOnGeneric",
       Endpoint("generic", "      generic: { header: X-S, id_header: X-Id }\n      public_url: \"https://h.example\"\n"),
       15, "webhooks.endpoints[0].public_url", "only they take public_url (provider is \"generic\")"},
      {"PublicUrlWithoutScheme", Endpoint("twilio", "      public_url: hooks.example.com\n"), 14,
       "webhooks.endpoints[0].public_url", "expected scheme://host[:port]"},
      // An endpoint's tenant and project follow the rule of every other
      // tenant and project: they are sent upstream in header lines and
      // become metric labels.
      {"EndpointTenantWithCrLf",
       m + "webhooks:\n  endpoints:\n    - id: w1\n      tenant: \"evil\\r\\nX-Injected: 1\"\n      project: p\n"
           "      provider: stripe\n      secret_env: A\n",
       10, "webhooks.endpoints[0].tenant",
       "expected 1..256 visible ASCII characters (no space, control or non-ASCII character)"},
      {"EndpointProjectWithNul",
       m + "webhooks:\n  endpoints:\n    - id: w1\n      tenant: t\n      project: \"p\\0q\"\n"
           "      provider: stripe\n      secret_env: A\n",
       11, "webhooks.endpoints[0].project", "expected 1..256 visible ASCII characters"},
      {"EndpointTenantNotAscii",
       m + "webhooks:\n  endpoints:\n    - { id: w1, tenant: \"caf\\xe9\", project: p, provider: stripe, "
           "secret_env: A }\n",
       9, "webhooks.endpoints[0].tenant", "expected 1..256 visible ASCII characters (no space, control"},
      {"EndpointProjectWithASpace",
       m + "webhooks:\n  endpoints:\n    - { id: w1, tenant: t, project: \"a b\", provider: stripe, "
           "secret_env: A }\n",
       9, "webhooks.endpoints[0].project", "expected 1..256 visible ASCII characters"},
      {"EndpointTenantTooLong",
       m + "webhooks:\n  endpoints:\n    - { id: w1, tenant: " + std::string(257, 't') +
           ", project: p, provider: stripe, secret_env: A }\n",
       9, "webhooks.endpoints[0].tenant", "expected 1..256 visible ASCII characters, got 257"},
      {"EndpointWithoutProject",
       m + "webhooks:\n  endpoints:\n    - { id: w1, tenant: t, provider: stripe, secret_env: A }\n", 9,
       "webhooks.endpoints[0].project", "missing; expected 1..256 visible ASCII characters"},
      {"DuplicateEndpointId",
       m + "webhooks:\n  endpoints:\n"
           "    - { id: w1, tenant: t, project: p, provider: github, secret_env: A }\n"
           "    - { id: w1, tenant: t, project: p, provider: github, secret_env: B }\n",
       10, "webhooks.endpoints[1].id", "duplicate webhook endpoint id \"w1\""},

      // Other top-level ranges.
      {"TooManyWorkers", m + "workers: 5000\n", 7, "workers", "must be at most 1024"},
      {"ZeroHeaderTimeout", m + "limits: { header_timeout: 0 }\n", 7, "limits.header_timeout",
       "must be greater than 0"},
      {"BadEnvName", m + "admin: { token_env: \"MY-TOKEN\" }\n", 7, "admin.token_env",
       "invalid environment variable name"},

      // YAML itself.
      {"YamlBadIndentation",
       "upstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes:\n  - id: r1\n"
       "    match: { path_prefix: / }\n   upstream: app\n",
       6, "", "YAML syntax error: "},
      {"YamlBadFlowEnd",
       "upstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes:\n  - id: r1\n"
       "    match: { path_prefix: / ]\n",
       5, "", "YAML syntax error: "},
      {"YamlTab", m + "listen: a\n\tb: c\n", 8, "", "YAML syntax error: "},
      // A '{' in a plain value of a flow mapping opens a mapping to YAML.
      {"UnquotedBraceInAFlowMapping",
       "upstreams:\n  app: { url: http://127.0.0.1:9001 }\nroutes:\n  - id: h\n"
       "    match: { path: /h/{webhook_id} }\n    upstream: app\n",
       5, "", "a value holding '{' or '}' must be quoted, e.g. path: \"/webhooks/{webhook_id}\""},
      {"TwoDocuments", m + "---\nlisten: 127.0.0.1:1\n", 8, "", "only one YAML document"},
      // Found by fuzz/config_fuzz.cc: yaml-cpp 0.7's LoadAll loops for ever,
      // allocating, on a document that starts with a comma.
      {"LoneCommaIsASyntaxErrorNotAHang", ",\n", 1, "", "YAML syntax error: unexpected \",\" (column 1)"},
      {"DocumentStartingWithACommaIsASyntaxError", "--- ,a\n", 1, "", "YAML syntax error: unexpected \",\" (column 5)"},
      {"CommaDocumentAfterTheConfig", m + "---\n  ,\n", 8, "", "only one YAML document"},
      {"RootIsAList", "- a\n- b\n", 1, "", "expected a mapping, got a list"},
  };
}

// Keeps gtest from dumping the struct's bytes in failure messages.
void PrintTo(const BadConfig& bad, std::ostream* os) { *os << bad.name; }

class LoaderErrorTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(LoaderErrorTest, NamesFileLineAndKey) {
  const BadConfig& bad = GetParam();
  StatusOr<Config> c = LoadString(bad.yaml, "bad.yaml");
  ASSERT_FALSE(c.ok()) << "loaded:\n" << bad.yaml;
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  const std::string message = c.status().message();
  std::string prefix = "bad.yaml:" + std::to_string(bad.line) + ": ";
  if (!bad.key.empty()) prefix += bad.key + ": ";
  EXPECT_EQ(message.rfind(prefix, 0), 0u) << "want prefix: " << prefix << "\ngot: " << message;
  EXPECT_NE(message.find(bad.detail), std::string::npos)
      << "want: " << bad.detail << "\ngot: " << message;
}

// A mapping keyed by names (here 5,000 upstreams) is indexed as it is read:
// a duplicate at its end names the line of the first use, and the entries
// before it are all there when there is none.
TEST(LoaderLargeMapTest, DuplicateAmongManyNamesIsFoundWithItsFirstLine) {
  std::string yaml = "upstreams:\n";
  for (int i = 0; i < 5000; ++i) {
    yaml += "  u" + std::to_string(i) + ": { url: http://127.0.0.1:" + std::to_string(1000 + i) + " }\n";
  }
  const std::string routes = "routes:\n  - id: r\n    match: { path_prefix: / }\n    upstream: u4999\n";
  StatusOr<Config> ok = LoadString(yaml + routes, "big.yaml");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->upstreams.size(), 5000u);
  EXPECT_EQ(ok->upstreams.at("u1234").port, 2234);

  StatusOr<Config> dup = LoadString(yaml + "  u17: { url: http://127.0.0.1:1 }\n" + routes, "big.yaml");
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().message(), "big.yaml:5002: upstreams.u17: duplicate key (first at line 19)");
}

INSTANTIATE_TEST_SUITE_P(BadConfigs, LoaderErrorTest, ::testing::ValuesIn(BadConfigs()),
                         [](const ::testing::TestParamInfo<BadConfig>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace idemgate::config
