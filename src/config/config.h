#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/units.h"

// Plain configuration structs (SPEC §11). Every member carries its documented
// default; the loader (loader.h) only overwrites what the file sets. After
// loading, a Config is validated and then shared read-only.
namespace idemgate::config {

using namespace std::chrono_literals;

inline constexpr std::uint64_t kKiB = 1024;
inline constexpr std::uint64_t kMiB = 1024 * kKiB;

enum class Policy { kRequired, kOptional, kWebhook, kPassthrough, kProhibited };
enum class Scope { kSubject, kProject, kTenant, kGlobal };
enum class InFlightMode { kReject, kWait };
enum class JsonMode { kCanonical, kRaw };
enum class DedupMode { kGateway, kUpstream };
enum class ForwardKey { kNamespaced, kRaw, kNone };
enum class StoreKind { kEmbedded, kMemory, kRedis };
enum class OnError { kFailClosed, kFailOpen };
enum class IdentityMode { kNone, kTrustedHeaders, kJwt, kApiKey };

struct Limits {
  std::uint64_t max_header_bytes = 16 * kKiB;
  std::uint64_t max_request_bytes = 10 * kMiB;
  Duration header_timeout = 10s;
  Duration idle_timeout = 60s;
  // Client connections open at once on the `listen` address, all workers
  // together; one beyond is closed as soon as it is accepted.
  std::uint64_t max_connections = 10000;
};

// TLS on a listener: the `listen` address (a top-level `tls` block) or the
// admin listener (`admin.tls`).
struct ListenerTls {
  std::string cert_file;       // certificate chain (PEM), leaf first
  std::string key_file;        // its private key (PEM)
  std::string client_ca_file;  // when set: clients must present a certificate signed by one of these CAs
  bool configured = false;     // a `tls` block was written
};

struct Admin {
  std::string listen;     // empty: no admin listener
  std::string token_env;  // environment variable holding the bearer token
  ListenerTls tls;        // HTTPS on the admin listener
};

struct Redis {
  std::vector<std::string> addresses;  // host:port
  bool cluster = false;
  std::string username;    // ACL user for AUTH; empty: the default user
  std::string password_env;
  std::string key_prefix = "idemgate:";  // prepended to every Redis key and channel
  Duration timeout = 200ms;
  friend bool operator==(const Redis&, const Redis&) = default;
};

struct Store {
  StoreKind kind = StoreKind::kEmbedded;
  std::string path = "./idemgate-data";
  bool sync = false;
  std::uint64_t max_bytes = 256 * kMiB;  // memory store bound
  OnError on_error = OnError::kFailClosed;
  Redis redis;
  friend bool operator==(const Store&, const Store&) = default;
};

struct TrustedHeaders {
  std::string tenant = "X-Tenant-Id";
  std::string project = "X-Project-Id";
  std::string subject = "X-Subject";
};

// One PEM public key for identity.mode jwt.
struct JwtPublicKey {
  std::string file;
  std::string kid;          // empty: tried for any kid
  std::string alg = "RS256";  // RS256 | ES256
};

// Which token claims name the caller.
struct JwtClaims {
  std::string tenant = "tenant";
  std::string project = "project";
  std::string subject = "sub";
  std::string subject_type;  // a claim holding user|service|tenant_member|client; empty: `subject_type`
};

struct JwtIdentity {
  std::vector<std::string> algorithms = {"RS256", "ES256"};
  std::vector<JwtPublicKey> public_keys;
  std::string jwks_file;
  // Extension of SPEC §6: a JWKS fetched from the identity provider's
  // jwks_uri at start and on reload, then every jwks_refresh and when a
  // token names an unknown kid (gateway/jwks_refresher.h).
  std::string jwks_url;           // http:// or https://; empty: none
  Duration jwks_refresh = 5min;   // at least 10s
  std::string jwks_ca_file;       // https jwks_url: PEM CAs to trust; empty: the system's store
  Duration jwks_timeout = 5s;     // one fetch, connect to last byte
  std::string secret_env;   // HS256 shared secret
  std::string secret_file;
  std::string issuer;       // empty: not checked
  std::string audience;     // empty: not checked
  Duration leeway = 30s;
  bool require_exp = true;
  JwtClaims claims;
  std::string subject_type = "user";
};

struct ApiKeyIdentity {
  std::string keys_file;            // YAML: keys: [{sha256, tenant, project, subject}]
  std::string header = "X-API-Key";  // also accepted: Authorization: Bearer <key>
};

struct Identity {
  IdentityMode mode = IdentityMode::kNone;
  TrustedHeaders trusted_headers;
  JwtIdentity jwt;
  ApiKeyIdentity api_key;
};

// TLS to an https upstream. The server's certificate is always verified,
// against `ca_file` or the system's trust store, and must name the host
// (or `server_name`).
struct UpstreamTls {
  std::string ca_file;      // PEM bundle of trusted CAs; empty: the system's store
  std::string server_name;  // SNI and the name checked in the certificate; empty: the url's host
  std::string cert_file;    // client certificate chain (PEM), for upstreams that require one
  std::string key_file;     // its private key (PEM); set together with cert_file
  bool configured = false;  // a `tls` block was written
};

struct Upstream {
  std::string name;
  std::string url;        // as written
  std::string scheme;     // "http" or "https"
  std::string host;
  std::uint16_t port = 80;  // 443 for https when the url names none
  std::string base_path;  // path prefix prepended to forwarded paths ("" or "/x")
  Duration timeout = 30s;
  Duration connect_timeout = 2s;
  std::uint32_t max_connections = 256;
  // false: a connection per request, closed after its response (Connection:
  // close sent upstream), for upstreams not trusted to frame their responses.
  bool keepalive = true;
  UpstreamTls tls;
};

struct Fingerprint {
  std::vector<std::string> headers = {"content-type"};  // lower-case
  JsonMode json = JsonMode::kCanonical;
  std::vector<std::string> json_fields;  // JSON Pointers
};

struct KeyRules {
  std::size_t max_length = 255;
  std::string charset;  // extra characters allowed beyond [A-Za-z0-9._~-]
};

struct Idempotency {
  Policy policy = Policy::kOptional;
  std::string header = "Idempotency-Key";
  std::vector<std::string> methods = {"POST", "PATCH"};
  std::optional<Scope> scope;  // unset: subject when identity is configured, else global
  Duration retention = 24h;    // 0: until purged
  std::optional<Duration> lease;  // unset: upstream timeout + 5s
  InFlightMode in_flight = InFlightMode::kReject;
  Duration wait_timeout = 30s;
  std::uint64_t max_response_bytes = 1 * kMiB;
  bool store_server_errors = false;
  std::string terminal_header = "Idempotency-Terminal";
  std::string replay_header = "Idempotent-Replayed";
  Fingerprint fingerprint;
  KeyRules key;
  std::string provider;  // webhook routes
  DedupMode dedup = DedupMode::kGateway;
  ForwardKey forward_key = ForwardKey::kNamespaced;
};

struct Match {
  std::string path_prefix;  // exactly one of path_prefix and path is set
  std::string path;
  std::vector<std::string> methods;  // upper-case; empty: every method
};

struct Route {
  std::string id;
  Match match;
  std::string upstream;
  bool recovery = false;
  std::string recovery_upstream_path;
  std::optional<std::uint32_t> max_in_flight;
  std::optional<std::uint32_t> max_in_flight_per_tenant;  // unset: unlimited
  std::optional<std::uint64_t> max_request_bytes;  // unset: limits.max_request_bytes
  Idempotency idempotency;  // defaults.idempotency with the route's keys applied
  int line = 0;             // line of the route in the config file, for messages
};

// How a `generic` webhook sender signs its requests and names its events.
struct GenericWebhook {
  std::string header;              // the signature's header
  std::string algorithm = "sha256";  // sha256 | sha1 (HMAC)
  std::string encoding = "hex";      // hex | base64
  std::string prefix;              // text before the signature in the header, e.g. "sha256="
  // Where the event id is; exactly one is set.
  std::string id_header;
  std::string id_pointer;                   // JSON Pointer into the body
  std::vector<std::string> id_form_fields;  // form fields, joined with '-'
};

struct WebhookEndpoint {
  std::string id;
  std::string tenant;
  std::string project;
  std::string provider;
  std::string secret_env;
  std::string secret_file;
  // Twilio signs the URL it called: "scheme://host[:port]" as the sender
  // sees it, when a proxy in front of the gateway changes them. Empty: from
  // X-Forwarded-Proto / X-Forwarded-Host, else http and Host.
  std::string public_url;
  std::optional<GenericWebhook> generic;  // provider generic only
  // Where the endpoint was written: `file` is webhooks.file as given when the
  // endpoint came from there (empty: inline in the config), `line` its line.
  std::string file;
  int line = 0;
};

struct Metrics {
  bool tenant_labels = true;
};

struct Log {
  std::string level = "info";  // debug, info, warn, error
  std::string format = "json";
};


struct Config {
  std::string source;  // file the config was read from
  std::string listen = "127.0.0.1:8080";
  ListenerTls tls;
  std::uint32_t workers = 0;  // I/O threads; 0: one per core
  Duration shutdown_grace = 30s;
  Limits limits;
  bool merge_slashes = true;  // "//" in a request path is "/" for routing and upstreams
  Admin admin;
  Store store;
  Identity identity;
  std::map<std::string, Upstream> upstreams;
  Idempotency defaults;
  std::vector<Route> routes;
  std::vector<WebhookEndpoint> webhooks;  // webhooks.endpoints, then those of webhooks.file
  std::string webhooks_file;              // webhooks.file as given; empty: none
  Metrics metrics;
  Log log;
};

}  // namespace idemgate::config
