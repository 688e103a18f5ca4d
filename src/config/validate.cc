#include "config/validate.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "common/ascii.h"
#include "common/units.h"
#include "common/request_path.h"
#include "common/text.h"
#include "config/address.h"
#include "config/identity_component.h"
#include "config/line_index.h"
#include "config/names.h"
#include "config/redis_names.h"
#include "config/resolve.h"

namespace idemgate::config {
namespace {

constexpr std::uint32_t kMaxWorkers = 1024;
// The longest duration any key takes (100 years). Durations are added to the
// current time (milliseconds since the epoch in stored records, nanoseconds
// on the steady clock for timeouts); one near the largest number of
// milliseconds a duration can hold (106751991160d) passes the parser but
// overflows there, so a record would expire at once or a timeout fire at
// once.
constexpr Duration kMaxDuration = std::chrono::hours(24 * 36500);
constexpr std::size_t kMaxKeyLength = 4096;

// Characters allowed in ids that end up in stored keys and paths.
bool IsIdChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '~' ||
         c == '-';
}

bool IsId(std::string_view s) { return !s.empty() && std::all_of(s.begin(), s.end(), IsIdChar); }

bool IsEnvName(std::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s.front()))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

// RFC 6901: "/" followed by reference tokens, '~' only as "~0" or "~1".
bool IsJsonPointer(std::string_view s, std::string* why) {
  if (s.empty() || s.front() != '/') {
    *why = "must start with '/'";
    return false;
  }
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '~' && (i + 1 == s.size() || (s[i + 1] != '0' && s[i + 1] != '1'))) {
      *why = "'~' must be followed by 0 or 1";
      return false;
    }
  }
  return true;
}

template <std::size_t N>
bool OneOf(std::string_view value, const std::string_view (&names)[N]) {
  return std::find(std::begin(names), std::end(names), value) != std::end(names);
}

template <std::size_t N>
std::string Join(const std::string_view (&names)[N]) {
  std::string out;
  for (std::string_view n : names) {
    if (!out.empty()) out += '|';
    out += n;
  }
  return out;
}

std::string Quote(std::string_view s) { return "\"" + std::string(s) + "\""; }

// How many whole path segments are exactly kWebhookIdPlaceholder; -1 when
// the placeholder also appears inside a segment.
int WebhookIdSegments(std::string_view path) {
  int whole = 0;
  std::size_t pos = 0;
  while ((pos = path.find(kWebhookIdPlaceholder, pos)) != std::string_view::npos) {
    const std::size_t end = pos + kWebhookIdPlaceholder.size();
    const bool starts = pos > 0 && path[pos - 1] == '/';
    const bool ends = end == path.size() || path[end] == '/';
    if (!starts || !ends) return -1;
    ++whole;
    pos = end;
  }
  const std::size_t braces = static_cast<std::size_t>(std::count(path.begin(), path.end(), '{'));
  return braces == static_cast<std::size_t>(whole) ? whole : -1;
}

// A DNS name for SNI and certificate checks: dot-separated labels of
// letters, digits and '-', each 1..63 characters, 253 at most in all.
bool IsTlsServerName(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  std::size_t label = 0;
  for (char c : name) {
    if (c == '.') {
      if (label == 0) return false;
      label = 0;
      continue;
    }
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
    if (!ok || ++label > 63) return false;
  }
  return label > 0;
}

// "http://host[:port]" or "https://host[:port]": no path, query, user info
// or white space.
bool IsPublicUrl(std::string_view url) {
  std::string_view rest;
  if (url.starts_with("https://")) {
    rest = url.substr(8);
  } else if (url.starts_with("http://")) {
    rest = url.substr(7);
  } else {
    return false;
  }
  if (rest.empty()) return false;
  return std::none_of(rest.begin(), rest.end(), [](char c) {
    const auto uc = static_cast<unsigned char>(c);
    return uc <= 0x20 || uc >= 0x7f || c == '/' || c == '?' || c == '#' || c == '@';
  });
}

// Why `url` cannot be identity.jwt.jwks_url, or "" when it can:
// "http[s]://host[:port][/path][?query]", ASCII without white space, no user
// info or fragment, a port in 1..65535.
std::string JwksUrlProblem(std::string_view url) {
  for (char c : url) {
    const auto uc = static_cast<unsigned char>(c);
    if (uc <= 0x20 || uc >= 0x7f) return "contains white space or a non-ASCII character";
  }
  std::string scheme(url.substr(0, std::min(url.size(), url.find("://"))));
  std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (url.find("://") == std::string_view::npos || (scheme != "http" && scheme != "https")) {
    return "scheme must be http or https";
  }
  const std::string_view rest = url.substr(scheme.size() + 3);
  if (rest.find('#') != std::string_view::npos) return "a fragment is not allowed";
  const std::string_view authority = rest.substr(0, rest.find_first_of("/?"));
  if (authority.find('@') != std::string_view::npos) return "user info is not allowed";
  if (authority.empty()) return "missing host";
  const bool has_port = authority.front() == '['
                            ? authority.find("]:") != std::string_view::npos
                            : authority.find(':') != std::string_view::npos;
  const std::string host_port =
      has_port ? std::string(authority) : std::string(authority) + (scheme == "https" ? ":443" : ":80");
  StatusOr<HostPort> parsed = ParseHostPort(host_port);
  if (!parsed.ok() || parsed->port == 0) return "bad host or port " + Quote(authority);
  return {};
}

// An IP address written as the listeners bind it: 4 bytes (IPv4) or 16
// (IPv6), empty for a host name. IPv4 in every spelling the resolver takes
// as an address (inet_aton: 127.1, 2130706433, 0x7f000001, 0177.0.0.1).
std::string IpBytes(const std::string& host) {
  unsigned char bytes[16];
  if (in_addr v4{}; ::inet_aton(host.c_str(), &v4) != 0) {
    return std::string(reinterpret_cast<const char*>(&v4.s_addr), 4);
  }
  if (::inet_pton(AF_INET6, host.c_str(), bytes) == 1) return std::string(reinterpret_cast<char*>(bytes), 16);
  return {};
}

// Why the data listener at `listen` and the admin listener at `admin` cannot
// both be bound, or "" when they can (or when only the system can tell). They
// clash on one port (not 0, a free port each) when they name the same host or
// address, or when one is the wildcard of an address family (0.0.0.0, ::) and
// the other an address of that family. IPv6's wildcard against an IPv4
// address depends on the system (net.ipv6.bindv6only), and a host name
// against an address on what it resolves to: neither is refused.
std::string ListenersClash(std::string_view listen, std::string_view admin) {
  StatusOr<HostPort> data = ParseHostPort(listen);
  StatusOr<HostPort> other = ParseHostPort(admin);
  if (!data.ok() || !other.ok() || data->port == 0 || data->port != other->port) return {};
  const std::string a = IpBytes(data->host);
  const std::string b = IpBytes(other->host);
  // A host name's final dot names the same host (localhost. is localhost).
  const auto name = [](std::string_view host) {
    return host.ends_with('.') ? host.substr(0, host.size() - 1) : host;
  };
  const bool same = a.empty() || b.empty() ? EqualsIgnoreCaseAscii(name(data->host), name(other->host)) : a == b;
  auto wildcard = [](const std::string& ip) { return !ip.empty() && ip == std::string(ip.size(), '\0'); };
  const bool covered = !a.empty() && a.size() == b.size() && (wildcard(a) || wildcard(b));
  if (same) {
    return "the admin listener cannot listen where the data listener does (listen: " + Quote(listen) +
           "); give it another port";
  }
  if (covered) {
    const std::string& any = wildcard(a) ? data->host : other->host;
    return "the admin listener cannot listen on " + Quote(admin) + " next to listen: " + Quote(listen) +
           " (the wildcard " + any + " takes port " + std::to_string(data->port) + " on every " +
           (a.size() == 4 ? "IPv4" : "IPv6") + " address); give it another port";
  }
  return {};
}

std::string Index(std::string_view base, std::size_t i) {
  return std::string(base) + "[" + std::to_string(i) + "]";
}

// Records the first failure; later ones are ignored so the message names the
// earliest problem in check order.
class Validator {
 public:
  Validator(const Config& config, const LineIndex& lines) : config_(config), lines_(lines) {}

  Status Run() {
    CheckTop();
    CheckStore();
    CheckIdentity();
    CheckListenerTls(config_.tls, "tls");
    CheckListenerTls(config_.admin.tls, "admin.tls");
    Check(!config_.admin.tls.configured || !config_.admin.listen.empty(), "admin.tls",
          "there is no admin listener to serve over TLS (admin.listen is not set)");
    CheckUpstreams();
    CheckIdempotencyFields("defaults.idempotency", config_.defaults);
    CheckRoutes();
    CheckWebhooks();
    CheckLog();
    return status_;
  }

 private:
  void Fail(const std::string& path, const std::string& message) {
    if (!status_.ok()) return;
    status_ = InvalidArgumentError(Located(config_.source, lines_.Find(path), path, message));
  }

  void Check(bool ok, const std::string& path, const std::string& message) {
    if (!ok) Fail(path, message);
  }

  void CheckPositive(Duration d, const std::string& path) {
    Check(d > Duration::zero(), path, "must be greater than 0");
    CheckNotHuge(d, path);
  }

  void CheckNotHuge(Duration d, const std::string& path) {
    Check(d <= kMaxDuration, path, "must be at most 36500d (100 years), got " + FormatDuration(d));
  }

  void CheckAddress(std::string_view address, const std::string& path, bool port_zero_ok) {
    StatusOr<HostPort> hp = ParseHostPort(address);
    if (!hp.ok()) {
      Fail(path, hp.status().message());
    } else if (!port_zero_ok && hp->port == 0) {
      Fail(path, "invalid address " + Quote(address) + ": port must be in 1..65535");
    }
  }

  void CheckHeaderName(std::string_view name, const std::string& path) {
    Check(IsToken(name), path, "invalid header name " + Quote(name));
  }

  // An identity header must not be one the gateway reads or writes for
  // something else: framing and hop-by-hop fields, Host, the forwarding and
  // tracing fields, Authorization (JWT and api_key read it) and any route's
  // idempotency key header. `Host` as the API key's header, say, would take
  // the Host line from the upstream request and send the key on as
  // X-Forwarded-Host.
  void CheckIdentityHeaderName(std::string_view name, const std::string& path) {
    CheckHeaderName(name, path);
    static constexpr std::string_view kReserved[] = {
        "host",          "content-length",  "transfer-encoding", "connection",        "keep-alive",
        "te",            "trailer",         "upgrade",           "proxy-connection",  "proxy-authorization",
        "expect",        "authorization",   "x-forwarded-for",   "x-forwarded-proto", "x-forwarded-host",
        "x-request-id",  "traceparent",     "tracestate",        "forwarded",         "cookie"};
    for (std::string_view reserved : kReserved) {
      if (EqualsIgnoreCaseDashOrUnderscore(name, reserved)) {
        Check(false, path, Quote(name) + " is a header the gateway uses for something else; pick another name");
        return;
      }
    }
    auto key_header = [&](const Idempotency& i) { return EqualsIgnoreCaseDashOrUnderscore(name, i.header); };
    bool clash = key_header(config_.defaults);
    for (const Route& r : config_.routes) clash = clash || key_header(r.idempotency);
    Check(!clash, path, Quote(name) + " is a route's idempotency key header; pick another name");
  }

  void CheckEnvName(std::string_view name, const std::string& path) {
    if (name.empty()) return;
    Check(IsEnvName(name), path,
          "invalid environment variable name " + Quote(name) + " (letters, digits and '_')");
  }

  void CheckMethods(const std::vector<std::string>& methods, const std::string& path) {
    for (std::size_t i = 0; i < methods.size(); ++i) {
      const std::string& m = methods[i];
      bool upper = std::none_of(m.begin(), m.end(),
                                [](char c) { return std::islower(static_cast<unsigned char>(c)); });
      Check(IsToken(m) && upper, Index(path, i),
            "invalid method " + Quote(m) + " (expected an HTTP method such as POST)");
      Check(std::find(methods.begin(), methods.begin() + static_cast<std::ptrdiff_t>(i), m) ==
                methods.begin() + static_cast<std::ptrdiff_t>(i),
            Index(path, i), "method " + Quote(m) + " is listed twice");
    }
  }

  void CheckProvider(std::string_view provider, const std::string& path) {
    if (provider.empty()) return;
    Check(OneOf(provider, kWebhookProviders), path,
          "unknown provider " + Quote(provider) + " (expected " + Join(kWebhookProviders) + ")");
  }

  void CheckTop() {
    CheckAddress(config_.listen, "listen", /*port_zero_ok=*/true);
    Check(config_.workers <= kMaxWorkers, "workers",
          "must be at most " + std::to_string(kMaxWorkers) + " (0: one per core)");
    Check(config_.shutdown_grace >= Duration::zero(), "shutdown_grace", "must not be negative");
    CheckNotHuge(config_.shutdown_grace, "shutdown_grace");
    const Limits& l = config_.limits;
    Check(l.max_header_bytes > 0, "limits.max_header_bytes", "must be greater than 0");
    Check(l.max_request_bytes > 0, "limits.max_request_bytes", "must be greater than 0");
    CheckPositive(l.header_timeout, "limits.header_timeout");
    CheckPositive(l.idle_timeout, "limits.idle_timeout");
    Check(l.max_connections > 0, "limits.max_connections", "must be greater than 0");
    if (!config_.admin.listen.empty()) {
      CheckAddress(config_.admin.listen, "admin.listen", /*port_zero_ok=*/true);
      const std::string clash = ListenersClash(config_.listen, config_.admin.listen);
      Check(clash.empty(), "admin.listen", clash);
    }
    CheckEnvName(config_.admin.token_env, "admin.token_env");
  }

  void CheckStore() {
    const Store& s = config_.store;
    switch (s.kind) {
      case StoreKind::kEmbedded:
        Check(!s.path.empty(), "store.path", "must not be empty for store.kind embedded");
        break;
      case StoreKind::kMemory:
        Check(s.max_bytes > 0, "store.max_bytes", "must be greater than 0");
        break;
      case StoreKind::kRedis:
        Check(!s.redis.addresses.empty(), "store.redis.addresses",
              "store.kind redis needs at least one address (host:port)");
        break;
    }
    for (std::size_t i = 0; i < s.redis.addresses.size(); ++i) {
      CheckAddress(s.redis.addresses[i], Index("store.redis.addresses", i),
                   /*port_zero_ok=*/false);
    }
    CheckEnvName(s.redis.password_env, "store.redis.password_env");
    if (auto problem = RedisKeyPrefixProblem(s.redis.key_prefix); !problem.empty()) {
      Check(false, "store.redis.key_prefix", std::string(problem));
    }
    if (auto problem = RedisUsernameProblem(s.redis.username); !problem.empty()) {
      Check(false, "store.redis.username", std::string(problem));
    }
    Check(s.redis.username.empty() || !s.redis.password_env.empty(), "store.redis.username",
          "needs store.redis.password_env (Redis authenticates a user with its password)");
    CheckPositive(s.redis.timeout, "store.redis.timeout");
  }

  void CheckIdentity() {
    const Identity& id = config_.identity;
    if (id.mode == IdentityMode::kJwt) {
      CheckJwt(id.jwt);
      return;
    }
    if (id.mode == IdentityMode::kApiKey) {
      Check(!id.api_key.keys_file.empty(), "identity.api_key.keys_file",
            "missing (identity.mode api_key needs a keys file)");
      CheckIdentityHeaderName(id.api_key.header, "identity.api_key.header");
      return;
    }
    if (id.mode != IdentityMode::kTrustedHeaders) return;
    const TrustedHeaders& th = id.trusted_headers;
    CheckIdentityHeaderName(th.tenant, "identity.trusted_headers.tenant");
    CheckIdentityHeaderName(th.project, "identity.trusted_headers.project");
    CheckIdentityHeaderName(th.subject, "identity.trusted_headers.subject");
    auto lower = [](std::string s) {
      std::transform(s.begin(), s.end(), s.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      return s;
    };
    std::set<std::string> names = {lower(th.tenant), lower(th.project), lower(th.subject)};
    Check(names.size() == 3, "identity.trusted_headers",
          "tenant, project and subject must be three different headers");
  }

  void CheckJwt(const JwtIdentity& j) {
    const std::string path = "identity.jwt";
    Check(!j.algorithms.empty(), path + ".algorithms", "must list at least one of RS256, ES256, HS256");
    for (std::size_t i = 0; i < j.algorithms.size(); ++i) {
      Check(OneOf(j.algorithms[i], kJwtAlgorithms), Index(path + ".algorithms", i),
            "unknown algorithm " + Quote(j.algorithms[i]) + " (expected " + Join(kJwtAlgorithms) + ")");
      Check(std::find(j.algorithms.begin(), j.algorithms.begin() + static_cast<std::ptrdiff_t>(i), j.algorithms[i]) ==
                j.algorithms.begin() + static_cast<std::ptrdiff_t>(i),
            Index(path + ".algorithms", i), "algorithm " + Quote(j.algorithms[i]) + " is listed twice");
    }
    const auto allowed = [&j](std::string_view alg) {
      return std::find(j.algorithms.begin(), j.algorithms.end(), alg) != j.algorithms.end();
    };
    for (std::size_t i = 0; i < j.public_keys.size(); ++i) {
      const JwtPublicKey& k = j.public_keys[i];
      const std::string key_path = Index(path + ".public_keys", i);
      Check(!k.file.empty(), key_path + ".file", "missing (a PEM public key file)");
      Check(k.alg == "RS256" || k.alg == "ES256", key_path + ".alg",
            "expected RS256 or ES256 (got " + Quote(k.alg) + ")");
      Check(allowed(k.alg), key_path + ".alg", k.alg + " is not in identity.jwt.algorithms");
    }
    Check(j.secret_env.empty() || j.secret_file.empty(), path, "set at most one of secret_env and secret_file");
    CheckEnvName(j.secret_env, path + ".secret_env");
    const bool secret = !j.secret_env.empty() || !j.secret_file.empty();
    if (secret) Check(allowed("HS256"), path + ".algorithms", "a shared secret needs HS256 in algorithms");
    if (allowed("HS256")) Check(secret, path, "HS256 needs secret_env or secret_file");
    Check(secret || !j.public_keys.empty() || !j.jwks_file.empty() || !j.jwks_url.empty(), path,
          "needs keys: public_keys, jwks_file, jwks_url or (HS256) secret_env / secret_file");
    if (!j.jwks_url.empty()) {
      const std::string problem = JwksUrlProblem(j.jwks_url);
      Check(problem.empty(), path + ".jwks_url",
            "invalid URL " + Quote(RedactUrl(j.jwks_url)) + ": " + problem +
                " (expected http://host[:port]/path or https://host[:port]/path)");
    }
    Check(j.jwks_ca_file.empty() || StartsWithIgnoreCaseAscii(j.jwks_url, "https://"), path + ".jwks_ca_file",
          "only used with an https jwks_url");
    Check(j.jwks_refresh >= std::chrono::seconds(10), path + ".jwks_refresh", "must be at least 10s");
    CheckNotHuge(j.jwks_refresh, path + ".jwks_refresh");
    CheckPositive(j.jwks_timeout, path + ".jwks_timeout");
    Check(j.leeway >= Duration::zero() && j.leeway <= std::chrono::minutes(10), path + ".leeway",
          "must be in 0s..10m");
    Check(OneOf(j.subject_type, kSubjectTypes), path + ".subject_type",
          "expected " + Join(kSubjectTypes) + " (got " + Quote(j.subject_type) + ")");
    Check(!j.claims.tenant.empty(), path + ".claims.tenant", "must name a claim");
    Check(!j.claims.project.empty(), path + ".claims.project", "must name a claim");
    Check(!j.claims.subject.empty(), path + ".claims.subject", "must name a claim");
  }

  void CheckListenerTls(const ListenerTls& tls, const std::string& path) {
    if (!tls.configured) return;
    Check(!tls.cert_file.empty(), path + ".cert_file", "missing (a TLS listener needs its certificate)");
    Check(!tls.key_file.empty(), path + ".key_file", "missing (a TLS listener needs its private key)");
  }

  void CheckUpstreams() {
    for (const auto& [name, u] : config_.upstreams) {
      const std::string path = "upstreams." + name;
      Check(IsId(name), path,
            "invalid upstream name " + Quote(name) + " (letters, digits, '.', '_', '~', '-')");
      Check(u.scheme == "http" || u.scheme == "https", path + ".url",
            "scheme must be http or https (got " + Quote(u.scheme) + " from url " + Quote(u.url) + ")");
      if (u.tls.configured) {
        Check(u.scheme == "https", path + ".tls",
              "only an https upstream takes tls settings (url " + Quote(u.url) + ")");
        Check(u.tls.cert_file.empty() == u.tls.key_file.empty(), path + ".tls",
              "cert_file and key_file go together (a client certificate needs its key)");
        Check(u.tls.server_name.empty() || IsTlsServerName(u.tls.server_name), path + ".tls.server_name",
              "invalid server name " + Quote(u.tls.server_name) + " (a DNS name: letters, digits, '-' and '.')");
      }
      Check(!u.host.empty(), path + ".url", "missing host (url " + Quote(u.url) + ")");
      Check(u.port != 0, path + ".url", "port must be in 1..65535");
      Check(u.base_path.empty() || (u.base_path.front() == '/' && u.base_path.back() != '/'),
            path + ".url",
            "base path " + Quote(u.base_path) + " must start with '/' and not end with '/'");
      CheckPositive(u.timeout, path + ".timeout");
      CheckPositive(u.connect_timeout, path + ".connect_timeout");
      Check(u.max_connections > 0, path + ".max_connections", "must be greater than 0");
    }
  }

  // Checks that hold for each idempotency block alone (defaults or a route's).
  void CheckIdempotencyFields(const std::string& path, const Idempotency& idem) {
    CheckHeaderName(idem.header, path + ".header");
    Check(!idem.methods.empty(), path + ".methods",
          "must list at least one method (use policy: passthrough to leave a route alone)");
    CheckMethods(idem.methods, path + ".methods");
    Check(idem.retention >= Duration::zero(), path + ".retention", "must not be negative");
    CheckNotHuge(idem.retention, path + ".retention");
    if (idem.lease) CheckPositive(*idem.lease, path + ".lease");
    CheckPositive(idem.wait_timeout, path + ".wait_timeout");
    Check(idem.max_response_bytes > 0, path + ".max_response_bytes", "must be greater than 0");
    CheckHeaderName(idem.terminal_header, path + ".terminal_header");
    CheckHeaderName(idem.replay_header, path + ".replay_header");
    const std::string fp = path + ".fingerprint";
    for (std::size_t i = 0; i < idem.fingerprint.headers.size(); ++i) {
      const std::string& h = idem.fingerprint.headers[i];
      bool lower = std::none_of(h.begin(), h.end(),
                                [](char c) { return std::isupper(static_cast<unsigned char>(c)); });
      Check(IsToken(h) && lower, Index(fp + ".headers", i),
            "invalid header name " + Quote(h) + " (expected a lower-case header name)");
    }
    for (std::size_t i = 0; i < idem.fingerprint.json_fields.size(); ++i) {
      std::string why;
      const std::string& f = idem.fingerprint.json_fields[i];
      if (!IsJsonPointer(f, &why)) {
        Fail(Index(fp + ".json_fields", i),
             "invalid JSON Pointer " + Quote(f) + ": " + why + " (e.g. /amount)");
      }
    }
    Check(idem.key.max_length >= 1 && idem.key.max_length <= kMaxKeyLength,
          path + ".key.max_length", "must be in 1.." + std::to_string(kMaxKeyLength));
    for (char c : idem.key.charset) {
      const auto uc = static_cast<unsigned char>(c);
      if (c == ':') {
        Fail(path + ".key.charset", "':' can never be allowed in a key (it separates scopes)");
      } else if (uc <= 0x20 || uc >= 0x7f) {
        Fail(path + ".key.charset",
             "only visible ASCII characters may be added (no space, control or non-ASCII)");
      }
    }
    CheckProvider(idem.provider, path + ".provider");
  }

  void CheckRoutes() {
    Check(!config_.routes.empty(), "routes", "at least one route is required");
    std::map<std::string, std::size_t> seen;
    for (std::size_t i = 0; i < config_.routes.size(); ++i) {
      const Route& r = config_.routes[i];
      const std::string path = Index("routes", i);
      Check(IsId(r.id), path + ".id",
            r.id.empty()
                ? std::string("missing (every route needs an id)")
                : "invalid route id " + Quote(r.id) + " (letters, digits, '.', '_', '~', '-')");
      auto [it, inserted] = seen.emplace(r.id, i);
      if (!inserted && !r.id.empty()) {
        const Route& first = config_.routes[it->second];
        std::string where =
            first.line > 0 ? "line " + std::to_string(first.line) : Index("routes", it->second);
        Fail(path + ".id", "duplicate route id " + Quote(r.id) + " (first used at " + where + ")");
      }
      CheckMatch(path + ".match", r.match);
      if (r.upstream.empty()) {
        Fail(path + ".upstream", "missing (every route needs an upstream)");
      } else if (!config_.upstreams.contains(r.upstream)) {
        std::string known;
        for (const auto& [name, u] : config_.upstreams) known += (known.empty() ? "" : ", ") + name;
        Fail(path + ".upstream", "unknown upstream " + Quote(r.upstream) +
                                     " (defined: " + (known.empty() ? "none" : known) + ")");
      }
      if (!r.recovery_upstream_path.empty()) {
        const std::string& p = r.recovery_upstream_path;
        Check(p.front() == '/', path + ".recovery_upstream_path", "must start with '/'");
        // It is the request line's target as written: a space, CR or LF
        // would end the target there and start header lines of its own.
        Check(std::none_of(p.begin(), p.end(),
                           [](char c) {
                             const auto uc = static_cast<unsigned char>(c);
                             return uc <= 0x20 || uc >= 0x7f || c == '#';
                           }),
              path + ".recovery_upstream_path", "must not contain white space, control characters, '#' or non-ASCII "
                                                "characters (percent-encode them)");
        // Without {key} every caller's recovery of any key would read one
        // resource; a dot segment would be resolved by the upstream (or a
        // proxy before it) to another path than the one written.
        Check(p.find("{key}") != std::string::npos, path + ".recovery_upstream_path",
              "must hold {key} (replaced by the key the upstream was sent), or every recovery would read the same "
              "upstream resource");
        // As the data path's (a request with one is refused): also with
        // ;parameters ("..;x"), and no backslash, which some upstreams read as '/'.
        const std::string_view upstream_path = std::string_view(p).substr(0, p.find('?'));
        Check(!HasDotSegment(upstream_path) && upstream_path.find('\\') == std::string_view::npos,
              path + ".recovery_upstream_path",
              "must not hold a '.' or '..' segment (also as \"..;x\" or percent-encoded) or a backslash (write the "
              "path it stands for)");
      }
      if (r.max_in_flight) {
        Check(*r.max_in_flight > 0, path + ".max_in_flight", "must be greater than 0");
      }
      if (r.max_in_flight_per_tenant) {
        Check(*r.max_in_flight_per_tenant > 0, path + ".max_in_flight_per_tenant", "must be greater than 0");
      }
      if (r.max_request_bytes) {
        Check(*r.max_request_bytes > 0, path + ".max_request_bytes", "must be greater than 0");
      }
      const std::string idem_path = path + ".idempotency";
      const Idempotency& idem = r.idempotency;
      CheckIdempotencyFields(idem_path, idem);
      if (idem.policy == Policy::kWebhook) {
        Check(!idem.provider.empty(), idem_path + ".provider",
              "policy webhook needs a provider (" + Join(kWebhookProviders) + ")");
      } else {
        Check(idem.provider.empty(), idem_path + ".provider",
              "provider is only used with policy: webhook (policy is " +
                  std::string(Name(idem.policy)) + ")");
      }
      const std::string& match_path = r.match.path.empty() ? r.match.path_prefix : r.match.path;
      const std::string match_key = path + (r.match.path.empty() ? ".match.path_prefix" : ".match.path");
      const int placeholders = WebhookIdSegments(match_path);
      if (idem.policy == Policy::kWebhook) {
        Check(placeholders == 1, match_key,
              "a webhook route's path needs one whole segment " + std::string(kWebhookIdPlaceholder) +
                  " (e.g. /webhooks/stripe/" + std::string(kWebhookIdPlaceholder) + ")");
        Check(!r.recovery, path + ".recovery", "recovery is not available on webhook routes");
        Check(r.match.path_prefix.empty(), path + ".match.path_prefix",
              "a webhook route matches an exact path (match: { path: " + Quote(r.match.path_prefix) +
                  " }); path_prefix would take every path below its " + std::string(kWebhookIdPlaceholder) +
                  " segment too");
      } else {
        Check(match_path.find('{') == std::string::npos && match_path.find('}') == std::string::npos, match_key,
              "only policy: webhook routes may hold " + std::string(kWebhookIdPlaceholder) +
                  " (other paths match as written, without '{' or '}')");
      }
      if (r.recovery && !r.match.methods.empty()) {
        Check(std::find(r.match.methods.begin(), r.match.methods.end(), "GET") != r.match.methods.end(),
              path + ".recovery",
              "route " + Quote(r.id) + " serves recovery (GET .../by-idempotency-key/{key}) but its " +
                  "match.methods do not let GET in (add GET, or leave methods empty for every method)");
      }
      // There is no lease renewal: a reservation whose lease ends before
      // the upstream must answer can be taken over by a retry while the
      // original still runs, and the write runs twice. A keyed request is
      // sent only while the upstream timeout fits in what is left of its
      // lease less the margin (LeaseMargin), so the lease must also leave
      // time to get a connection (LeastLease). Only routes that reserve
      // keys hold leases.
      const bool reserves = StoresKeys(idem);
      if (reserves && idem.lease && config_.upstreams.contains(r.upstream)) {
        const Upstream& u = config_.upstreams.at(r.upstream);
        const Duration least = LeastLease(u.timeout);
        Check(*idem.lease >= least, path + ".idempotency.lease",
              "lease " + FormatDuration(*idem.lease) + " of route " + Quote(r.id) +
                  " is shorter than the timeout of its upstream " + Quote(r.upstream) + " (" +
                  FormatDuration(u.timeout) + ") plus the margin a keyed exchange keeps before its lease ends " +
                  "(a tenth of the lease, at most 1s) and 100ms to get an upstream connection: a retry could " +
                  "take over a request still running and run it twice; set at least " + FormatDuration(least) +
                  " (more leaves time to wait for a free upstream connection), or leave lease unset " +
                  "(the upstream's timeout + 5s)");
      }
      if (r.recovery && idem.policy != Policy::kWebhook) {
        // Recovery answers GET {path_prefix}/by-idempotency-key/{key}: below
        // an exact path there is nothing to answer, and a prohibited route
        // keeps no outcome to answer with.
        Check(r.match.path.empty(), path + ".recovery",
              "recovery serves GET {path_prefix}/by-idempotency-key/{key}, which an exact match.path has no room "
              "for; match this route with path_prefix (or remove recovery)");
        Check(idem.policy != Policy::kProhibited && idem.policy != Policy::kPassthrough, path + ".recovery",
              "recovery is not available on policy: " + std::string(Name(idem.policy)) +
                  " routes (their writes are not deduplicated under a scoped key, so there is no outcome of the "
                  "caller's own to recover)");
      }
      if (r.recovery && idem.dedup == DedupMode::kUpstream) {
        Check(!r.recovery_upstream_path.empty(), path + ".recovery",
              "recovery with dedup: upstream needs recovery_upstream_path");
      }
      // recovery_upstream_path is where recovery requests go when the upstream
      // deduplicates; anywhere else it would be ignored.
      if (!r.recovery_upstream_path.empty()) {
        Check(r.recovery, path + ".recovery_upstream_path",
              "recovery_upstream_path is where recovery requests are sent under dedup: upstream; it needs "
              "recovery: true on this route (and idempotency.dedup: upstream), or remove it");
        Check(idem.dedup == DedupMode::kUpstream, path + ".recovery_upstream_path",
              "recovery_upstream_path is used only with idempotency.dedup: upstream (under dedup: gateway recovery "
              "answers from the store); set dedup: upstream on this route, or remove it");
      }
      // Under dedup: upstream the key the upstream is sent is the only
      // deduplication there is, and the only scoping.
      const bool keyed_policy =
          idem.policy == Policy::kRequired || idem.policy == Policy::kOptional || idem.policy == Policy::kWebhook;
      // A passthrough route forwards the client's key as sent: the upstream
      // would deduplicate unscoped keys, shared by every caller.
      Check(idem.dedup != DedupMode::kUpstream || idem.policy != Policy::kPassthrough, idem_path + ".dedup",
            "route " + Quote(r.id) + " has policy: passthrough, which forwards the client's key as sent, unvalidated " +
                "and unscoped; dedup: upstream needs policy required, optional or webhook (the gateway validates " +
                "and scopes the key the upstream deduplicates by), or set dedup: gateway");
      if (idem.dedup == DedupMode::kUpstream && keyed_policy) {
        Check(idem.forward_key != ForwardKey::kNone, idem_path + ".forward_key",
              "route " + Quote(r.id) + " leaves deduplication to its upstream (dedup: upstream), which " +
                  "deduplicates by the key it is sent; forward_key: none sends none, so nothing would be " +
                  "deduplicated (use namespaced)");
        const bool one_scope = idem.scope ? *idem.scope == Scope::kGlobal : config_.identity.mode == IdentityMode::kNone;
        Check(idem.forward_key != ForwardKey::kRaw || one_scope, idem_path + ".forward_key",
              "route " + Quote(r.id) + " leaves deduplication to its upstream (dedup: upstream); with " +
                  "forward_key: raw, callers of different scopes who pick the same key would share one " +
                  "key there (and read each other's outcome through recovery); use namespaced, or scope: global");
      }
    }
  }

  void CheckMatch(const std::string& path, const Match& m) {
    if (m.path_prefix.empty() == m.path.empty()) {
      Fail(path, m.path.empty() ? "needs one of path_prefix or path"
                                : "set only one of path_prefix and path");
      return;
    }
    const bool prefix = !m.path_prefix.empty();
    const std::string& p = prefix ? m.path_prefix : m.path;
    const std::string key = path + (prefix ? ".path_prefix" : ".path");
    Check(p.front() == '/', key, "must start with '/' (got " + Quote(p) + ")");
    Check(std::none_of(p.begin(), p.end(),
                       [](char c) {
                         const auto uc = static_cast<unsigned char>(c);
                         return uc <= 0x20 || uc >= 0x7f || c == '?' || c == '#';
                       }),
          key, "must not contain white space, '?', '#' or non-ASCII characters");
    // Request paths are normalised before they are matched, so a route
    // written otherwise could never match.
    if (PathNeedsNormalizing(p, config_.merge_slashes)) {
      std::string normal;
      NormalizePath(p, config_.merge_slashes, normal);
      Fail(key, "must be written as requests are matched: " + Quote(normal) + ", not " + Quote(p) +
                    " (percent-encoded letters, digits and -._~ are decoded" +
                    (config_.merge_slashes ? ", and runs of '/' merged)" : ")"));
    }
    CheckMethods(m.methods, path + ".methods");
  }

  // The config's endpoints: those written inline are checked here; those of
  // webhooks.file were checked when that file was read (RunEndpointsFile), so
  // only their ids are compared with the inline ones.
  void CheckWebhooks() {
    std::map<std::string, std::string, std::less<>> ids;  // id -> where it was first defined
    std::size_t inline_index = 0;
    std::size_t file_index = 0;
    for (const WebhookEndpoint& w : config_.webhooks) {
      if (w.file.empty()) {
        const std::string path = Index("webhooks.endpoints", inline_index++);
        CheckEndpoint(w, path);
        Check(w.id.empty() || ids.emplace(w.id, path).second, path + ".id",
              "duplicate webhook endpoint id " + Quote(w.id));
        continue;
      }
      const std::string path = Index("endpoints", file_index++);
      const auto [first, added] = ids.emplace(w.id, path);
      if (!added && status_.ok()) {
        status_ = InvalidArgumentError(Located(w.file, w.line, path + ".id",
                                               "duplicate webhook endpoint id " + Quote(w.id) + " (also in " +
                                                   config_.source + ", " + first->second + ")"));
      }
    }
  }

 public:
  // The endpoints of a webhooks.file, held in config_.webhooks of a Config
  // whose source is that file, with keys under "endpoints".
  Status RunEndpointsFile() {
    std::set<std::string> ids;
    for (std::size_t i = 0; i < config_.webhooks.size(); ++i) {
      const WebhookEndpoint& w = config_.webhooks[i];
      const std::string path = Index("endpoints", i);
      CheckEndpoint(w, path);
      Check(w.id.empty() || ids.insert(w.id).second, path + ".id", "duplicate webhook endpoint id " + Quote(w.id));
    }
    return status_;
  }

 private:
  void CheckEndpoint(const WebhookEndpoint& w, const std::string& path) {
    Check(IsId(w.id), path + ".id",
          w.id.empty() ? std::string("missing")
                       : "invalid id " + Quote(w.id) + " (letters, digits, '.', '_', '~', '-')");
    // The endpoint's tenant and project are its callers' (X-Tenant-Id and
    // X-Project-Id upstream, metric labels, the namespaced key): the rule of
    // every other source of them.
    CheckIdentityComponent(w.tenant, path + ".tenant");
    CheckIdentityComponent(w.project, path + ".project");
    Check(!w.provider.empty(), path + ".provider", "missing (" + Join(kWebhookProviders) + ")");
    CheckProvider(w.provider, path + ".provider");
    Check(w.secret_env.empty() != w.secret_file.empty(), path,
          "set exactly one of secret_env and secret_file");
    CheckEnvName(w.secret_env, path + ".secret_env");
    if (!w.public_url.empty()) {
      // Only Twilio signs the URL it calls; any other provider would ignore it.
      Check(w.provider == "twilio" || w.provider == "twilio_event_streams", path + ".public_url",
            "only providers twilio and twilio_event_streams sign the URL they call, so only they take public_url "
            "(provider is " + Quote(w.provider) + ")");
      Check(IsPublicUrl(w.public_url), path + ".public_url",
            "expected scheme://host[:port] with scheme http or https and no path (got " + Quote(w.public_url) +
                ")");
    }
    if (w.provider == "generic") {
      if (!w.generic) {
        Fail(path + ".generic", "provider generic needs generic: {header, id_header | id_pointer | id_form_fields}");
      } else {
        CheckGeneric(*w.generic, path + ".generic");
      }
    } else if (w.generic) {
      Fail(path + ".generic", "only provider generic takes generic settings (provider is " + Quote(w.provider) + ")");
    }
  }

  void CheckIdentityComponent(std::string_view value, const std::string& path) {
    if (IsIdentityComponent(value)) return;
    std::string message = "expected 1.." + std::to_string(kMaxIdentityComponentLength) + " visible ASCII characters";
    if (value.empty()) {
      message = "missing; " + message;
    } else if (value.size() > kMaxIdentityComponentLength) {
      message += ", got " + std::to_string(value.size());
    } else {
      message += " (no space, control or non-ASCII character)";
    }
    Fail(path, message);
  }

  void CheckGeneric(const GenericWebhook& g, const std::string& path) {
    Check(!g.header.empty(), path + ".header", "missing (the header that carries the signature)");
    if (!g.header.empty()) CheckHeaderName(g.header, path + ".header");
    Check(g.algorithm == "sha256" || g.algorithm == "sha1", path + ".algorithm",
          "expected sha256 or sha1 (got " + Quote(g.algorithm) + ")");
    Check(g.encoding == "hex" || g.encoding == "base64", path + ".encoding",
          "expected hex or base64 (got " + Quote(g.encoding) + ")");
    const int sources = (g.id_header.empty() ? 0 : 1) + (g.id_pointer.empty() ? 0 : 1) +
                        (g.id_form_fields.empty() ? 0 : 1);
    Check(sources == 1, path, "set exactly one of id_header, id_pointer and id_form_fields");
    if (!g.id_header.empty()) CheckHeaderName(g.id_header, path + ".id_header");
    std::string why;
    if (!g.id_pointer.empty() && !IsJsonPointer(g.id_pointer, &why)) {
      Fail(path + ".id_pointer", "invalid JSON Pointer " + Quote(g.id_pointer) + ": " + why + " (e.g. /id)");
    }
    for (std::size_t i = 0; i < g.id_form_fields.size(); ++i) {
      Check(!g.id_form_fields[i].empty(), Index(path + ".id_form_fields", i), "must not be empty");
    }
  }

  void CheckLog() {
    Check(OneOf(config_.log.level, kLogLevels), "log.level",
          "unknown value " + Quote(config_.log.level) + " (expected " + Join(kLogLevels) + ")");
    Check(OneOf(config_.log.format, kLogFormats), "log.format",
          "unknown value " + Quote(config_.log.format) + " (expected " + Join(kLogFormats) + ")");
  }

  const Config& config_;
  const LineIndex& lines_;
  Status status_;
};

}  // namespace

Status ValidateWithLines(const Config& config, const LineIndex& lines) {
  return Validator(config, lines).Run();
}

Status ValidateWebhookEndpoints(const std::vector<WebhookEndpoint>& endpoints, const std::string& source,
                                const LineIndex& lines) {
  Config file;
  file.source = source;
  file.webhooks = endpoints;
  return Validator(file, lines).RunEndpointsFile();
}

Status Validate(const Config& config) {
  LineIndex lines;
  for (std::size_t i = 0; i < config.routes.size(); ++i) {
    lines.Set(Index("routes", i), config.routes[i].line);
  }
  return ValidateWithLines(config, lines);
}

}  // namespace idemgate::config
