#include "config/validate.h"

#include <gtest/gtest.h>

#include <limits>

#include "config/address.h"
#include "config/resolve.h"

namespace idemgate::config {
namespace {

using namespace std::chrono_literals;

// A valid config built in code, the way tests elsewhere build theirs.
Config CodeConfig() {
  Config c;
  Upstream app;
  app.name = "app";
  app.url = "http://127.0.0.1:9001";
  EXPECT_TRUE(ParseUpstreamUrl(app.url, &app).ok());
  c.upstreams.emplace("app", app);
  Route r;
  r.id = "orders";
  r.match.path_prefix = "/orders";
  r.upstream = "app";
  r.idempotency = c.defaults;
  c.routes.push_back(r);
  return c;
}

TEST(ValidateTest, AcceptsAValidConfigBuiltInCode) {
  Status s = Validate(CodeConfig());
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(ValidateTest, DefaultConfigNeedsARoute) {
  Status s = Validate(Config{});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "routes: at least one route is required");
}

TEST(ValidateTest, UsesSourceAndRouteLineWhenKnown) {
  Config c = CodeConfig();
  c.source = "gen.yaml";
  c.routes[0].line = 7;
  c.routes[0].upstream = "missing";
  Status s = Validate(c);
  EXPECT_EQ(s.message(),
            "gen.yaml:7: routes[0].upstream: unknown upstream \"missing\" (defined: app)");

  c.routes[0].line = 0;
  EXPECT_EQ(Validate(c).message(),
            "gen.yaml: routes[0].upstream: unknown upstream \"missing\" (defined: app)");
}

TEST(ValidateTest, ExpectsNormalisedMethodsAndHeaders) {
  Config lower_method = CodeConfig();
  lower_method.routes[0].match.methods = {"post"};
  EXPECT_NE(Validate(lower_method).message().find("routes[0].match.methods[0]: invalid method"),
            std::string::npos);

  Config upper_header = CodeConfig();
  upper_header.routes[0].idempotency.fingerprint.headers = {"Content-Type"};
  EXPECT_NE(Validate(upper_header)
                .message()
                .find("routes[0].idempotency.fingerprint.headers[0]: invalid header name"),
            std::string::npos);
}

TEST(ValidateTest, MethodsAndAlgorithmsAreListedOnce) {
  Config methods = CodeConfig();
  methods.routes[0].idempotency.methods = {"POST", "GET", "POST"};
  EXPECT_NE(Validate(methods).message().find("routes[0].idempotency.methods[2]: method \"POST\" is listed twice"),
            std::string::npos)
      << Validate(methods).message();
  Config algorithms = CodeConfig();
  algorithms.identity.mode = IdentityMode::kJwt;
  algorithms.identity.jwt.algorithms = {"HS256", "HS256"};
  algorithms.identity.jwt.secret_env = "JWT_SECRET";
  EXPECT_NE(Validate(algorithms).message().find("identity.jwt.algorithms[1]: algorithm \"HS256\" is listed twice"),
            std::string::npos)
      << Validate(algorithms).message();
}

// Identity header names the gateway uses for something else are refused:
// `Host` as the API key's header would take the Host line from the upstream
// request; a route's key header would make the API key the idempotency key.
TEST(ValidateTest, IdentityHeadersMustNotBeHeadersTheGatewayUsesOtherwise) {
  for (const std::string name : {"Host", "Connection", "x_forwarded_host", "Authorization", "Idempotency-Key"}) {
    Config api = CodeConfig();
    api.identity.mode = IdentityMode::kApiKey;
    api.identity.api_key.keys_file = "/etc/keys.yaml";
    api.identity.api_key.header = name;
    EXPECT_NE(Validate(api).message().find("identity.api_key.header: \"" + name + "\" is a"), std::string::npos)
        << name << ": " << Validate(api).message();
    Config trusted = CodeConfig();
    trusted.identity.mode = IdentityMode::kTrustedHeaders;
    trusted.identity.trusted_headers.project = name;
    EXPECT_NE(Validate(trusted).message().find("identity.trusted_headers.project: \"" + name + "\" is a"),
              std::string::npos)
        << name << ": " << Validate(trusted).message();
  }
  Config custom_key = CodeConfig();
  custom_key.routes[0].idempotency.header = "X-Idem";
  custom_key.identity.mode = IdentityMode::kTrustedHeaders;
  custom_key.identity.trusted_headers.subject = "x-idem";
  EXPECT_NE(Validate(custom_key).message().find("is a route's idempotency key header"), std::string::npos)
      << Validate(custom_key).message();
  Config fine = CodeConfig();
  fine.identity.mode = IdentityMode::kApiKey;
  fine.identity.api_key.keys_file = "/etc/keys.yaml";
  fine.identity.api_key.header = "X-Client-Key";
  EXPECT_TRUE(Validate(fine).ok()) << Validate(fine).message();
}

// Requests are matched after their path is normalised, so a route path
// that is not in that form could never match: refused, naming the form.
TEST(ValidateTest, RoutePathsMustBeInTheFormRequestsAreMatchedIn) {
  Config encoded = CodeConfig();
  encoded.routes[0].match.path_prefix = "/api/%70ayments";
  EXPECT_EQ(Validate(encoded).message(),
            "routes[0].match.path_prefix: must be written as requests are matched: \"/api/payments\", not "
            "\"/api/%70ayments\" (percent-encoded letters, digits and -._~ are decoded, and runs of '/' merged)");

  Config slashes = CodeConfig();
  slashes.routes[0].match.path_prefix.clear();
  slashes.routes[0].match.path = "/api//payments";
  EXPECT_NE(Validate(slashes).message().find("routes[0].match.path: must be written as requests are matched: "
                                             "\"/api/payments\""),
            std::string::npos);
  slashes.merge_slashes = false;
  EXPECT_TRUE(Validate(slashes).ok()) << Validate(slashes).message();

  Config reserved = CodeConfig();
  reserved.routes[0].match.path_prefix = "/files/a%2Fb";  // an encoded '/' stays encoded
  EXPECT_TRUE(Validate(reserved).ok()) << Validate(reserved).message();
}

TEST(ValidateTest, UpstreamMustHaveBeenParsed) {
  Config c = CodeConfig();
  Upstream raw;
  raw.name = "raw";
  raw.url = "http://10.0.0.1:80";
  c.upstreams.emplace("raw", raw);
  Status s = Validate(c);
  EXPECT_NE(s.message().find("upstreams.raw.url: scheme must be http"), std::string::npos)
      << s.message();
}

TEST(ValidateTest, ReportsOnlyTheFirstProblem) {
  Config c = CodeConfig();
  c.listen = "nowhere";
  c.routes[0].upstream = "missing";
  Status s = Validate(c);
  EXPECT_EQ(s.message().rfind("listen: ", 0), 0u) << s.message();
  EXPECT_EQ(s.message().find("missing"), s.message().find("missing port")) << s.message();
}

// The largest duration the parser takes, 106751991160d, overflows once added
// to the current time: records would expire at once. Every duration key is
// bounded by 100 years.
TEST(ValidateTest, DurationsAreAtMostAHundredYears) {
  const Duration hundred_years = std::chrono::hours(24 * 36500);
  const Duration huge = Duration(std::numeric_limits<Duration::rep>::max());
  Config c = CodeConfig();
  c.routes[0].idempotency.retention = hundred_years;
  EXPECT_TRUE(Validate(c).ok()) << Validate(c).message();
  c.routes[0].idempotency.retention = huge;
  EXPECT_EQ(Validate(c).message().rfind("routes[0].idempotency.retention: must be at most 36500d (100 years)", 0), 0u)
      << Validate(c).message();

  Config lease = CodeConfig();
  lease.routes[0].idempotency.lease = huge;
  EXPECT_EQ(Validate(lease).message().rfind("routes[0].idempotency.lease: must be at most 36500d", 0), 0u)
      << Validate(lease).message();
  Config wait = CodeConfig();
  wait.routes[0].idempotency.wait_timeout = huge;
  EXPECT_EQ(Validate(wait).message().rfind("routes[0].idempotency.wait_timeout: must be at most 36500d", 0), 0u)
      << Validate(wait).message();
  Config timeout = CodeConfig();
  timeout.upstreams.at("app").timeout = huge;
  EXPECT_EQ(Validate(timeout).message().rfind("upstreams.app.timeout: must be at most 36500d", 0), 0u)
      << Validate(timeout).message();
  Config idle = CodeConfig();
  idle.limits.idle_timeout = huge;
  EXPECT_EQ(Validate(idle).message().rfind("limits.idle_timeout: must be at most 36500d", 0), 0u)
      << Validate(idle).message();
  Config grace = CodeConfig();
  grace.shutdown_grace = huge;
  EXPECT_EQ(Validate(grace).message().rfind("shutdown_grace: must be at most 36500d", 0), 0u)
      << Validate(grace).message();
}

TEST(ValidateTest, RecoveryNeedsGetAmongTheRoutesMethods) {
  Config c = CodeConfig();
  c.routes[0].recovery = true;
  EXPECT_TRUE(Validate(c).ok()) << Validate(c).message();  // no methods: every method
  c.routes[0].match.methods = {"POST", "GET"};
  EXPECT_TRUE(Validate(c).ok()) << Validate(c).message();
  c.routes[0].match.methods = {"POST"};
  const std::string message = Validate(c).message();
  EXPECT_EQ(message.rfind("routes[0].recovery: route \"orders\" serves recovery", 0), 0u) << message;
  EXPECT_NE(message.find("match.methods do not let GET in"), std::string::npos) << message;
  c.routes[0].recovery = false;
  EXPECT_TRUE(Validate(c).ok()) << Validate(c).message();
}

// Every caller's recovery under dedup: upstream goes to recovery_upstream_path
// with its own scoped key in {key}: without {key} all of them would read one
// resource, and a dot segment would be resolved (by the upstream, or a proxy
// before it) to another path than the one written.
TEST(ValidateTest, RecoveryUpstreamPathNeedsTheKeyAndNoDotSegments) {
  Config c = CodeConfig();
  c.routes[0].recovery = true;
  c.routes[0].idempotency.dedup = DedupMode::kUpstream;
  for (const std::string accepted :
       {"/restate/invocation/{key}/attach", "/a.b/..c/.../{key}", "/x/{key}?from=./..", "/lookup?key={key}",
        "/%2e%2f/{key}"}) {
    c.routes[0].recovery_upstream_path = accepted;
    EXPECT_TRUE(Validate(c).ok()) << accepted << ": " << Validate(c).message();
  }
  c.routes[0].recovery_upstream_path = "/att9/static";
  EXPECT_EQ(Validate(c).message().rfind("routes[0].recovery_upstream_path: must hold {key}", 0), 0u)
      << Validate(c).message();
  for (const std::string refused : {"/a/../{key}", "/a/./{key}", "/{key}/..", "/{key}/.", "/a/%2E%2e/{key}",
                                    "/a/.%2E/{key}", "/a/%2e/{key}", "/{key}/..?x=1", "/x/..;/{key}",
                                    "/x/%2e%2e;x/{key}", "/x/..%3Bx/{key}", "/x\\..\\{key}"}) {
    c.routes[0].recovery_upstream_path = refused;
    EXPECT_EQ(Validate(c).message().rfind("routes[0].recovery_upstream_path: must not hold a '.' or '..' segment", 0),
              0u)
        << refused << ": " << Validate(c).message();
  }
}

// A passthrough route forwards the client's key as sent: an upstream
// deduplicating by it would share every key among all callers, and recovery
// (which scopes the key) could never name it, or without scoping would name
// another caller's.
TEST(ValidateTest, PassthroughRoutesTakeNeitherUpstreamDedupNorRecovery) {
  Config c = CodeConfig();
  c.routes[0].idempotency.policy = Policy::kPassthrough;
  c.routes[0].idempotency.dedup = DedupMode::kUpstream;
  for (ForwardKey forward : {ForwardKey::kNamespaced, ForwardKey::kRaw, ForwardKey::kNone}) {
    c.routes[0].idempotency.forward_key = forward;
    EXPECT_EQ(Validate(c).message().rfind("routes[0].idempotency.dedup: route \"orders\" has policy: passthrough", 0),
              0u)
        << Validate(c).message();
  }
  c.routes[0].recovery = true;
  c.routes[0].recovery_upstream_path = "/attach/{key}";
  EXPECT_EQ(Validate(c).message().rfind("routes[0].recovery: recovery is not available on policy: passthrough", 0),
            0u)
      << Validate(c).message();
  c.routes[0].idempotency.dedup = DedupMode::kGateway;
  c.routes[0].recovery_upstream_path.clear();
  EXPECT_EQ(Validate(c).message().rfind("routes[0].recovery: recovery is not available on policy: passthrough", 0),
            0u)
      << Validate(c).message();
  c.routes[0].recovery = false;
  EXPECT_TRUE(Validate(c).ok()) << Validate(c).message();
}

// Only Twilio signs the URL it calls, so only its providers take a public_url.
TEST(ValidateTest, PublicUrlIsForTwilioEndpointsOnly) {
  Config c = CodeConfig();
  WebhookEndpoint w;
  w.id = "w1";
  w.tenant = "t";
  w.project = "p";
  w.secret_env = "SECRET";
  w.public_url = "https://hooks.example.com:8443";
  c.webhooks.push_back(w);
  for (const std::string provider : {"twilio", "twilio_event_streams"}) {
    c.webhooks[0].provider = provider;
    EXPECT_TRUE(Validate(c).ok()) << provider << ": " << Validate(c).message();
  }
  for (const std::string provider : {"stripe", "github", "standard_webhooks"}) {
    c.webhooks[0].provider = provider;
    EXPECT_EQ(Validate(c).message().rfind("webhooks.endpoints[0].public_url: only providers twilio and ", 0), 0u)
        << Validate(c).message();
  }
  c.webhooks[0].public_url.clear();
  EXPECT_TRUE(Validate(c).ok()) << Validate(c).message();
}

// No lease renewal: a lease shorter than the upstream's timeout (and the
// margin kept before the lease ends) lets a retry take over (and run again)
// a request that is still within its timeout.
TEST(ValidateTest, LeaseMustLastAsLongAsTheUpstreamTimeout) {
  Config c = CodeConfig();
  c.upstreams.at("app").timeout = 30s;
  c.routes[0].idempotency.lease = 29s;
  const std::string message = Validate(c).message();
  EXPECT_EQ(message.rfind("routes[0].idempotency.lease: lease 29s of route \"orders\" is shorter than the timeout "
                          "of its upstream \"app\" (30s)",
                          0),
            0u)
      << message;
  // Nor may it be just as long: a keyed exchange ends a tenth of the lease
  // (at most 1s) before it, and a request is sent only while the upstream's
  // timeout fits in that, which leaves 100ms at least to get a connection.
  c.routes[0].idempotency.lease = 30s;
  EXPECT_NE(Validate(c).message().find("set at least 31100ms"), std::string::npos) << Validate(c).message();
  c.routes[0].idempotency.lease = 31100ms;
  EXPECT_TRUE(Validate(c).ok()) << Validate(c).message();
  c.upstreams.at("app").timeout = 2s;  // below 9s the margin is a tenth of the lease
  c.routes[0].idempotency.lease = 2333ms;
  EXPECT_TRUE(Validate(c).ok()) << Validate(c).message();
  c.routes[0].idempotency.lease = 2332ms;
  EXPECT_NE(Validate(c).message().find("set at least 2333ms"), std::string::npos) << Validate(c).message();
  c.upstreams.at("app").timeout = 30s;
  c.routes[0].idempotency.lease.reset();  // the default: timeout + 5s
  EXPECT_TRUE(Validate(c).ok()) << Validate(c).message();
  // Routes that reserve no key hold no lease: a shorter one (say from
  // defaults) is not refused there.
  c.routes[0].idempotency.lease = 1s;
  for (const Policy policy : {Policy::kPassthrough, Policy::kProhibited}) {
    c.routes[0].idempotency.policy = policy;
    EXPECT_TRUE(Validate(c).ok()) << Validate(c).message();
  }
  c.routes[0].idempotency.policy = Policy::kRequired;
  c.routes[0].idempotency.dedup = DedupMode::kUpstream;
  EXPECT_TRUE(Validate(c).ok()) << Validate(c).message();
  c.routes[0].idempotency.dedup = DedupMode::kGateway;
  EXPECT_FALSE(Validate(c).ok());
}

TEST(ResolveTest, ScopeFollowsIdentityWhenUnset) {
  Idempotency idem;
  Identity none;
  Identity trusted;
  trusted.mode = IdentityMode::kTrustedHeaders;
  EXPECT_EQ(EffectiveScope(idem, none), Scope::kGlobal);
  EXPECT_EQ(EffectiveScope(idem, trusted), Scope::kSubject);
  idem.scope = Scope::kTenant;
  EXPECT_EQ(EffectiveScope(idem, none), Scope::kTenant);
  EXPECT_EQ(EffectiveScope(idem, trusted), Scope::kTenant);
  // A webhook's endpoint names the caller whatever the identity mode.
  Idempotency hook;
  hook.policy = Policy::kWebhook;
  EXPECT_EQ(EffectiveScope(hook, none), Scope::kSubject);
  hook.scope = Scope::kProject;
  EXPECT_EQ(EffectiveScope(hook, none), Scope::kProject);
}

TEST(ResolveTest, LeaseDefaultsToUpstreamTimeoutPlusFiveSeconds) {
  Idempotency idem;
  Upstream u;
  u.timeout = 12s;
  EXPECT_EQ(EffectiveLease(idem, u), 17s);
  idem.lease = 3s;
  EXPECT_EQ(EffectiveLease(idem, u), 3s);
}

}  // namespace
}  // namespace idemgate::config
