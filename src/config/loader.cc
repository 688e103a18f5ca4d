#include "config/loader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "common/units.h"
#include "config/address.h"
#include "config/line_index.h"
#include "config/names.h"
#include "config/validate.h"
#include "config/yaml_util.h"

namespace idemgate::config {
namespace {

constexpr std::size_t kMaxFileBytes = 16 * kMiB;

// Thrown inside the loader only; LoadString turns it into a Status.
class LoadError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Lets a mapping's key index be searched with a string_view.
struct NameHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view name) const { return std::hash<std::string_view>{}(name); }
};

std::string Child(std::string_view parent, std::string_view key) {
  if (parent.empty()) return std::string(key);
  return std::string(parent) + "." + std::string(key);
}

// A node with the key path that leads to it and the line that names it (the
// line of its key, or of the list item).
struct Field {
  YAML::Node node;
  std::string path;
  int line = 0;
};

// Reads a config file (the main one or webhooks.file) whole: a regular file
// of at most kMaxFileBytes. Errors read "<path>: <what>" (NotFound when the
// file does not exist).
StatusOr<std::string> ReadConfigText(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    std::string message = path + ": cannot open: " + std::strerror(err);
    if (err == ENOENT) return NotFoundError(std::move(message));
    return InvalidArgumentError(std::move(message));
  }
  std::string text;
  struct stat st {};
  std::string error;
  if (::fstat(fd, &st) != 0) {
    error = std::string("cannot stat: ") + std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    error = "not a regular file";
  } else if (static_cast<std::uint64_t>(st.st_size) > kMaxFileBytes) {
    error = "larger than " + FormatSize(kMaxFileBytes);
  } else {
    char buffer[64 * 1024];
    while (true) {
      const ssize_t n = ::read(fd, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        error = std::string("cannot read: ") + std::strerror(errno);
        break;
      }
      if (n == 0) break;
      text.append(buffer, static_cast<std::size_t>(n));
      if (text.size() > kMaxFileBytes) {
        error = "larger than " + FormatSize(kMaxFileBytes);
        break;
      }
    }
  }
  ::close(fd);
  if (!error.empty()) return InvalidArgumentError(path + ": " + error);
  return text;
}

class Loader {
 public:
  explicit Loader(std::string source) : source_(std::move(source)) {}

  Config Load(const YAML::Node& root) {
    Config c;
    c.source = source_;
    const int root_line = std::max(LineOf(root), 1);
    lines_.Set("", root_line);
    Map top(*this, Field{root, "", root_line},
            {"listen", "tls", "workers", "shutdown_grace", "limits", "merge_slashes", "admin", "store",
             "identity", "upstreams", "defaults", "routes", "webhooks", "metrics", "log"});
    if (auto f = top.Get("listen")) c.listen = String(*f);
    if (auto f = top.Get("tls")) LoadListenerTls(*f, &c.tls);
    if (auto f = top.Get("workers")) {
      c.workers = static_cast<std::uint32_t>(Uint(*f, std::numeric_limits<std::uint32_t>::max()));
    }
    if (auto f = top.Get("shutdown_grace")) c.shutdown_grace = Dur(*f);
    if (auto f = top.Get("limits")) LoadLimits(*f, &c.limits);
    if (auto f = top.Get("merge_slashes")) c.merge_slashes = Bool(*f);
    if (auto f = top.Get("admin")) LoadAdmin(*f, &c.admin);
    if (auto f = top.Get("store")) LoadStore(*f, &c.store);
    if (auto f = top.Get("identity")) LoadIdentity(*f, &c.identity);
    if (auto f = top.Get("upstreams")) LoadUpstreams(*f, &c.upstreams);
    if (auto f = top.Get("defaults")) {
      Map defaults(*this, *f, {"idempotency"});
      if (auto idem = defaults.Get("idempotency")) LoadIdempotency(*idem, &c.defaults);
    }
    if (auto f = top.Get("routes")) {
      for (const Field& item : List(*f)) c.routes.push_back(LoadRoute(item, c.defaults));
    }
    if (auto f = top.Get("webhooks")) {
      Map webhooks(*this, *f, {"endpoints", "file"});
      if (auto endpoints = webhooks.Get("endpoints")) {
        for (const Field& item : List(*endpoints)) c.webhooks.push_back(LoadEndpoint(item));
      }
      if (auto file = webhooks.Get("file")) {
        c.webhooks_file = String(*file);
        if (c.webhooks_file.empty()) Fail(*file, "must not be empty (a path to a YAML file with endpoints: [...])");
        LoadEndpointsFile(*file, c.webhooks_file, &c.webhooks);
      }
    }
    if (auto f = top.Get("metrics")) {
      Map metrics(*this, *f, {"tenant_labels"});
      if (auto g = metrics.Get("tenant_labels")) c.metrics.tenant_labels = Bool(*g);
    }
    if (auto f = top.Get("log")) {
      Map log(*this, *f, {"level", "format"});
      if (auto g = log.Get("level")) c.log.level = String(*g);
      if (auto g = log.Get("format")) c.log.format = String(*g);
    }
    return c;
  }

  const LineIndex& lines() const { return lines_; }

 private:
  // A mapping whose keys were checked against `allowed` (or any key, for maps
  // keyed by name) and are unique. A null node reads as an empty mapping.
  class Map {
   public:
    Map(Loader& loader, const Field& self, std::initializer_list<std::string_view> allowed,
        bool any_key = false)
        : self_(self) {
      if (self.node.IsNull()) return;
      if (!self.node.IsMap()) {
        loader.Fail(self, "expected a mapping, got " + DescribeNode(self.node));
      }
      for (auto it = self.node.begin(); it != self.node.end(); ++it) {
        const YAML::Node key = it->first;
        const int key_line = LineOf(key) > 0 ? LineOf(key) : self.line;
        if (!key.IsScalar()) {
          loader.Fail(key_line, self.path, "keys must be plain strings, got " + DescribeNode(key));
        }
        const std::string name = key.Scalar();
        const std::string path = Child(self.path, name);
        if (!any_key && std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
          loader.Fail(key_line, path, UnknownKeyMessage(name, std::span<const std::string_view>(allowed.begin(), allowed.size())));
        }
        // A hash index, not a scan of the keys so far: a mapping may be
        // keyed by names (upstreams, API keys) and hold many entries.
        if (const auto [seen, added] = index_.try_emplace(name, entries_.size()); !added) {
          loader.Fail(key_line, path,
                      "duplicate key (first at line " +
                          std::to_string(entries_[seen->second].line) + ")");
        }
        loader.lines_.Set(path, key_line);
        entries_.push_back(Field{it->second, path, key_line});
        names_.push_back(name);
      }
    }

    std::optional<Field> Get(std::string_view name) const {
      const auto it = index_.find(name);
      if (it == index_.end()) return std::nullopt;
      return entries_[it->second];
    }

    const Field& self() const { return self_; }
    const std::vector<std::string>& names() const { return names_; }
    const std::vector<Field>& entries() const { return entries_; }

   private:
    Field self_;
    std::vector<std::string> names_;
    std::vector<Field> entries_;
    std::unordered_map<std::string, std::size_t, NameHash, std::equal_to<>> index_;
  };

  [[noreturn]] void Fail(int line, std::string_view path, std::string_view message) {
    if (line <= 0) line = lines_.Find(path);
    throw LoadError(Located(source_, line, path, message));
  }

  [[noreturn]] void Fail(const Field& f, std::string_view message) {
    Fail(f.line, f.path, message);
  }

  const std::string& Scalar(const Field& f, std::string_view expected) {
    if (!f.node.IsScalar())
      Fail(f, "expected " + std::string(expected) + ", got " + DescribeNode(f.node));
    return f.node.Scalar();
  }

  std::string String(const Field& f) { return Scalar(f, "a string"); }

  bool Bool(const Field& f) {
    const std::string& s = Scalar(f, "true or false");
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
    Fail(f, "expected true or false, got \"" + s + "\"");
  }

  std::uint64_t Uint(const Field& f, std::uint64_t max) {
    const std::string& s = Scalar(f, "a whole number");
    std::uint64_t value = 0;
    const bool digits =
        !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (!digits || ec != std::errc() || ptr != s.data() + s.size() || value > max) {
      // A type's own limit is no range worth naming (the validation names the real one).
      const bool type_limit =
          max == std::numeric_limits<std::uint32_t>::max() || max == std::numeric_limits<std::uint64_t>::max();
      Fail(f, (type_limit ? std::string("expected a whole number (0 or more)")
                          : "expected a whole number in 0.." + std::to_string(max)) +
                  ", got \"" + s + "\"");
    }
    return value;
  }

  Duration Dur(const Field& f) {
    StatusOr<Duration> d = ParseDuration(Scalar(f, "a duration such as 30s"));
    if (!d.ok()) Fail(f, d.status().message());
    return *d;
  }

  std::uint64_t Size(const Field& f) {
    StatusOr<std::uint64_t> s = ParseSize(Scalar(f, "a size such as 1MiB"));
    if (!s.ok()) Fail(f, s.status().message());
    return *s;
  }

  template <typename E>
  E Enum(const Field& f) {
    const std::string& s = Scalar(f, "one of " + AllowedNames<E>());
    std::optional<E> value = FromName<E>(s);
    if (!value) Fail(f, "unknown value \"" + s + "\" (expected " + AllowedNames<E>() + ")");
    return *value;
  }

  std::vector<Field> List(const Field& f) {
    std::vector<Field> items;
    if (f.node.IsNull()) return items;
    if (!f.node.IsSequence()) Fail(f, "expected a list, got " + DescribeNode(f.node));
    std::size_t i = 0;
    for (const YAML::Node& item : f.node) {
      std::string path = f.path + "[" + std::to_string(i++) + "]";
      // An empty item's mark is where the next token starts, so fall back to the list's line.
      int line = LineOf(item) > 0 && !item.IsNull() ? LineOf(item) : f.line;
      lines_.Set(path, line);
      items.push_back(Field{item, std::move(path), line});
    }
    return items;
  }

  std::vector<std::string> StringList(const Field& f) {
    if (f.node.IsNull()) Fail(f, "expected a list, got nothing");
    std::vector<std::string> out;
    for (const Field& item : List(f)) out.push_back(String(item));
    return out;
  }

  static std::vector<std::string> Upper(std::vector<std::string> v) {
    for (std::string& s : v) {
      std::transform(s.begin(), s.end(), s.begin(),
                     [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    }
    return v;
  }

  static std::vector<std::string> Lower(std::vector<std::string> v) {
    for (std::string& s : v) {
      std::transform(s.begin(), s.end(), s.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    }
    return v;
  }

  void LoadLimits(const Field& f, Limits* l) {
    Map m(*this, f, {"max_header_bytes", "max_request_bytes", "header_timeout", "idle_timeout", "max_connections"});
    if (auto g = m.Get("max_header_bytes")) l->max_header_bytes = Size(*g);
    if (auto g = m.Get("max_request_bytes")) l->max_request_bytes = Size(*g);
    if (auto g = m.Get("header_timeout")) l->header_timeout = Dur(*g);
    if (auto g = m.Get("idle_timeout")) l->idle_timeout = Dur(*g);
    if (auto g = m.Get("max_connections")) l->max_connections = Uint(*g, std::numeric_limits<std::uint32_t>::max());
  }

  void LoadAdmin(const Field& f, Admin* a) {
    Map m(*this, f, {"listen", "token_env", "tls"});
    if (auto g = m.Get("listen")) a->listen = String(*g);
    if (auto g = m.Get("token_env")) a->token_env = String(*g);
    if (auto g = m.Get("tls")) LoadListenerTls(*g, &a->tls);
  }

  void LoadListenerTls(const Field& f, ListenerTls* tls) {
    Map t(*this, f, {"cert_file", "key_file", "client_ca_file"});
    tls->configured = true;
    if (auto g = t.Get("cert_file")) tls->cert_file = String(*g);
    if (auto g = t.Get("key_file")) tls->key_file = String(*g);
    if (auto g = t.Get("client_ca_file")) tls->client_ca_file = String(*g);
  }

  void LoadStore(const Field& f, Store* s) {
    Map m(*this, f, {"kind", "path", "sync", "max_bytes", "on_error", "redis"});
    if (auto g = m.Get("kind")) s->kind = Enum<StoreKind>(*g);
    // A key of another kind of store would be ignored (a max_bytes meant as
    // a bound on the embedded store bounds nothing): an error, as the
    // settings of another identity mode are.
    const auto only_for = [&](const Field& g, StoreKind kind) {
      if (s->kind != kind && !g.node.IsNull()) {  // an empty section is one left out
        Fail(g, "only used with store.kind " + std::string(Name(kind)) + " (kind is " + std::string(Name(s->kind)) +
                    ")");
      }
    };
    if (auto g = m.Get("path")) {
      only_for(*g, StoreKind::kEmbedded);
      s->path = String(*g);
    }
    if (auto g = m.Get("sync")) {
      only_for(*g, StoreKind::kEmbedded);
      s->sync = Bool(*g);
    }
    if (auto g = m.Get("max_bytes")) {
      only_for(*g, StoreKind::kMemory);
      s->max_bytes = Size(*g);
    }
    if (auto g = m.Get("on_error")) s->on_error = Enum<OnError>(*g);
    if (auto g = m.Get("redis")) {
      only_for(*g, StoreKind::kRedis);
      Map r(*this, *g, {"addresses", "cluster", "username", "password_env", "key_prefix", "timeout"});
      if (auto h = r.Get("addresses")) s->redis.addresses = StringList(*h);
      if (auto h = r.Get("cluster")) s->redis.cluster = Bool(*h);
      if (auto h = r.Get("username")) s->redis.username = String(*h);
      if (auto h = r.Get("password_env")) s->redis.password_env = String(*h);
      if (auto h = r.Get("key_prefix")) s->redis.key_prefix = String(*h);
      if (auto h = r.Get("timeout")) s->redis.timeout = Dur(*h);
    }
  }

  void LoadIdentity(const Field& f, Identity* id) {
    Map m(*this, f, {"mode", "trusted_headers", "jwt", "api_key"});
    if (auto g = m.Get("mode")) id->mode = Enum<IdentityMode>(*g);
    if (auto g = m.Get("jwt")) {
      if (id->mode != IdentityMode::kJwt) {
        Fail(*g, "only used with identity.mode jwt (mode is " + std::string(Name(id->mode)) + ")");
      }
      JwtIdentity& j = id->jwt;
      Map jm(*this, *g,
             {"algorithms", "public_keys", "jwks_file", "jwks_url", "jwks_refresh", "jwks_ca_file", "jwks_timeout",
              "secret_env", "secret_file", "issuer", "audience", "leeway", "require_exp", "claims", "subject_type"});
      if (auto h = jm.Get("algorithms")) j.algorithms = Upper(StringList(*h));
      if (auto h = jm.Get("public_keys")) {
        for (const Field& item : List(*h)) {
          JwtPublicKey key;
          Map km(*this, item, {"file", "kid", "alg"});
          if (auto k = km.Get("file")) key.file = String(*k);
          if (auto k = km.Get("kid")) key.kid = String(*k);
          if (auto k = km.Get("alg")) key.alg = String(*k);
          j.public_keys.push_back(std::move(key));
        }
      }
      if (auto h = jm.Get("jwks_file")) j.jwks_file = String(*h);
      if (auto h = jm.Get("jwks_url")) j.jwks_url = String(*h);
      if (auto h = jm.Get("jwks_refresh")) j.jwks_refresh = Dur(*h);
      if (auto h = jm.Get("jwks_ca_file")) j.jwks_ca_file = String(*h);
      if (auto h = jm.Get("jwks_timeout")) j.jwks_timeout = Dur(*h);
      if (auto h = jm.Get("secret_env")) j.secret_env = String(*h);
      if (auto h = jm.Get("secret_file")) j.secret_file = String(*h);
      if (auto h = jm.Get("issuer")) j.issuer = String(*h);
      if (auto h = jm.Get("audience")) j.audience = String(*h);
      if (auto h = jm.Get("leeway")) j.leeway = Dur(*h);
      if (auto h = jm.Get("require_exp")) j.require_exp = Bool(*h);
      if (auto h = jm.Get("claims")) {
        Map cm(*this, *h, {"tenant", "project", "subject", "subject_type"});
        if (auto k = cm.Get("tenant")) j.claims.tenant = String(*k);
        if (auto k = cm.Get("project")) j.claims.project = String(*k);
        if (auto k = cm.Get("subject")) j.claims.subject = String(*k);
        if (auto k = cm.Get("subject_type")) j.claims.subject_type = String(*k);
      }
      if (auto h = jm.Get("subject_type")) j.subject_type = String(*h);
    }
    if (auto g = m.Get("api_key")) {
      if (id->mode != IdentityMode::kApiKey) {
        Fail(*g, "only used with identity.mode api_key (mode is " + std::string(Name(id->mode)) + ")");
      }
      Map am(*this, *g, {"keys_file", "header"});
      if (auto h = am.Get("keys_file")) id->api_key.keys_file = String(*h);
      if (auto h = am.Get("header")) id->api_key.header = String(*h);
    }
    if (auto g = m.Get("trusted_headers")) {
      if (id->mode != IdentityMode::kTrustedHeaders) {
        Fail(*g, "only used with identity.mode trusted_headers (mode is " +
                     std::string(Name(id->mode)) + ")");
      }
      Map th(*this, *g, {"tenant", "project", "subject"});
      if (auto h = th.Get("tenant")) id->trusted_headers.tenant = String(*h);
      if (auto h = th.Get("project")) id->trusted_headers.project = String(*h);
      if (auto h = th.Get("subject")) id->trusted_headers.subject = String(*h);
    }
  }

  void LoadUpstreams(const Field& f, std::map<std::string, Upstream>* upstreams) {
    Map all(*this, f, {}, /*any_key=*/true);
    for (std::size_t i = 0; i < all.names().size(); ++i) {
      const Field& entry = all.entries()[i];
      Upstream u;
      u.name = all.names()[i];
      Map m(*this, entry, {"url", "timeout", "connect_timeout", "max_connections", "keepalive", "tls"});
      auto url = m.Get("url");
      if (!url) Fail(entry.line, Child(entry.path, "url"), "missing (every upstream needs a url)");
      u.url = String(*url);
      Status parsed = ParseUpstreamUrl(u.url, &u);
      if (!parsed.ok()) Fail(*url, parsed.message());
      if (auto g = m.Get("timeout")) u.timeout = Dur(*g);
      if (auto g = m.Get("connect_timeout")) u.connect_timeout = Dur(*g);
      if (auto g = m.Get("max_connections")) {
        u.max_connections =
            static_cast<std::uint32_t>(Uint(*g, std::numeric_limits<std::uint32_t>::max()));
      }
      if (auto g = m.Get("keepalive")) u.keepalive = Bool(*g);
      if (auto g = m.Get("tls")) {
        Map t(*this, *g, {"ca_file", "server_name", "cert_file", "key_file"});
        u.tls.configured = true;
        if (auto h = t.Get("ca_file")) u.tls.ca_file = String(*h);
        if (auto h = t.Get("server_name")) u.tls.server_name = String(*h);
        if (auto h = t.Get("cert_file")) u.tls.cert_file = String(*h);
        if (auto h = t.Get("key_file")) u.tls.key_file = String(*h);
      }
      upstreams->emplace(u.name, std::move(u));
    }
  }

  // Applies the keys present in `f` on top of *idem, key by key.
  void LoadIdempotency(const Field& f, Idempotency* idem) {
    Map m(*this, f,
          {"policy", "header", "methods", "scope", "retention", "lease", "in_flight",
           "wait_timeout", "max_response_bytes", "store_server_errors", "terminal_header",
           "replay_header", "fingerprint", "key", "provider", "dedup", "forward_key"});
    if (auto g = m.Get("policy")) idem->policy = Enum<Policy>(*g);
    if (auto g = m.Get("header")) idem->header = String(*g);
    if (auto g = m.Get("methods")) idem->methods = Upper(StringList(*g));
    if (auto g = m.Get("scope")) idem->scope = Enum<Scope>(*g);
    if (auto g = m.Get("retention")) idem->retention = Dur(*g);
    if (auto g = m.Get("lease")) idem->lease = Dur(*g);
    if (auto g = m.Get("in_flight")) idem->in_flight = Enum<InFlightMode>(*g);
    if (auto g = m.Get("wait_timeout")) idem->wait_timeout = Dur(*g);
    if (auto g = m.Get("max_response_bytes")) idem->max_response_bytes = Size(*g);
    if (auto g = m.Get("store_server_errors")) idem->store_server_errors = Bool(*g);
    if (auto g = m.Get("terminal_header")) idem->terminal_header = String(*g);
    if (auto g = m.Get("replay_header")) idem->replay_header = String(*g);
    if (auto g = m.Get("fingerprint")) {
      Map fp(*this, *g, {"headers", "json", "json_fields"});
      if (auto h = fp.Get("headers")) idem->fingerprint.headers = Lower(StringList(*h));
      if (auto h = fp.Get("json")) idem->fingerprint.json = Enum<JsonMode>(*h);
      if (auto h = fp.Get("json_fields")) idem->fingerprint.json_fields = StringList(*h);
    }
    if (auto g = m.Get("key")) {
      Map key(*this, *g, {"max_length", "charset"});
      if (auto h = key.Get("max_length")) idem->key.max_length = Uint(*h, 1u << 20);
      if (auto h = key.Get("charset")) idem->key.charset = String(*h);
    }
    if (auto g = m.Get("provider")) idem->provider = String(*g);
    if (auto g = m.Get("dedup")) idem->dedup = Enum<DedupMode>(*g);
    if (auto g = m.Get("forward_key")) idem->forward_key = Enum<ForwardKey>(*g);
  }

  Route LoadRoute(const Field& f, const Idempotency& defaults) {
    Route r;
    r.line = f.line;
    r.idempotency = defaults;
    if (f.node.IsNull()) Fail(f, "expected a mapping, got nothing");
    Map m(*this, f,
          {"id", "match", "upstream", "recovery", "recovery_upstream_path", "max_in_flight", "max_in_flight_per_tenant",
           "max_request_bytes", "idempotency"});
    if (auto g = m.Get("id")) r.id = String(*g);
    if (auto g = m.Get("match")) {
      Map match(*this, *g, {"path_prefix", "path", "methods"});
      if (auto h = match.Get("path_prefix")) r.match.path_prefix = String(*h);
      if (auto h = match.Get("path")) r.match.path = String(*h);
      if (auto h = match.Get("methods")) r.match.methods = Upper(StringList(*h));
    }
    if (auto g = m.Get("upstream")) r.upstream = String(*g);
    if (auto g = m.Get("recovery")) r.recovery = Bool(*g);
    if (auto g = m.Get("recovery_upstream_path")) r.recovery_upstream_path = String(*g);
    if (auto g = m.Get("max_in_flight")) {
      r.max_in_flight =
          static_cast<std::uint32_t>(Uint(*g, std::numeric_limits<std::uint32_t>::max()));
    }
    if (auto g = m.Get("max_in_flight_per_tenant")) {
      r.max_in_flight_per_tenant =
          static_cast<std::uint32_t>(Uint(*g, std::numeric_limits<std::uint32_t>::max()));
    }
    if (auto g = m.Get("max_request_bytes")) r.max_request_bytes = Size(*g);
    if (auto g = m.Get("idempotency")) LoadIdempotency(*g, &r.idempotency);
    return r;
  }

  // webhooks.file: a YAML file of its own, `endpoints: [...]` as inline. Its
  // messages name that file and its lines; its endpoints are checked on
  // their own here, and against the inline ones by the config's validation.
  void LoadEndpointsFile(const Field& f, const std::string& path, std::vector<WebhookEndpoint>* out) {
    StatusOr<std::string> text = ReadConfigText(path);
    if (!text.ok()) Fail(f, text.status().message());
    StatusOr<YAML::Node> root = ParseYamlDocument(*text, path);
    if (!root.ok()) throw LoadError(root.status().message());
    Loader file(path);
    file.lines_.Set("", std::max(LineOf(*root), 1));
    std::vector<WebhookEndpoint> endpoints;
    Map top(file, Field{*root, "", std::max(LineOf(*root), 1)}, {"endpoints"});
    if (auto list = top.Get("endpoints")) {
      for (const Field& item : file.List(*list)) {
        WebhookEndpoint& w = endpoints.emplace_back(file.LoadEndpoint(item));
        w.file = path;
      }
    }
    Status valid = ValidateWebhookEndpoints(endpoints, path, file.lines());
    if (!valid.ok()) throw LoadError(valid.message());
    out->insert(out->end(), std::make_move_iterator(endpoints.begin()), std::make_move_iterator(endpoints.end()));
  }

  WebhookEndpoint LoadEndpoint(const Field& f) {
    WebhookEndpoint w;
    w.line = f.line;
    if (f.node.IsNull()) Fail(f, "expected a mapping, got nothing");
    Map m(*this, f,
          {"id", "tenant", "project", "provider", "secret_env", "secret_file", "public_url", "generic"});
    if (auto g = m.Get("id")) w.id = String(*g);
    if (auto g = m.Get("tenant")) w.tenant = String(*g);
    if (auto g = m.Get("project")) w.project = String(*g);
    if (auto g = m.Get("provider")) w.provider = String(*g);
    if (auto g = m.Get("secret_env")) w.secret_env = String(*g);
    if (auto g = m.Get("secret_file")) w.secret_file = String(*g);
    if (auto g = m.Get("public_url")) w.public_url = String(*g);
    if (auto g = m.Get("generic")) {
      GenericWebhook& gw = w.generic.emplace();
      Map gm(*this, *g,
             {"header", "algorithm", "encoding", "prefix", "id_header", "id_pointer", "id_form_fields"});
      if (auto h = gm.Get("header")) gw.header = String(*h);
      if (auto h = gm.Get("algorithm")) gw.algorithm = String(*h);
      if (auto h = gm.Get("encoding")) gw.encoding = String(*h);
      if (auto h = gm.Get("prefix")) gw.prefix = String(*h);
      if (auto h = gm.Get("id_header")) gw.id_header = String(*h);
      if (auto h = gm.Get("id_pointer")) gw.id_pointer = String(*h);
      if (auto h = gm.Get("id_form_fields")) gw.id_form_fields = StringList(*h);
    }
    return w;
  }

  std::string source_;
  LineIndex lines_;
};

}  // namespace

StatusOr<Config> LoadString(std::string_view yaml, std::string source_name) {
  Loader loader(source_name);
  try {
    StatusOr<YAML::Node> root = ParseYamlDocument(std::string(yaml), source_name);
    if (!root.ok()) return root.status();
    Config config = loader.Load(*root);
    Status valid = ValidateWithLines(config, loader.lines());
    if (!valid.ok()) return valid;
    return config;
  } catch (const YAML::Exception& e) {
    // A conversion of a node that parsed (none is expected after ParseDocument).
    return InvalidArgumentError(Located(source_name, e.mark.is_null() ? 0 : e.mark.line + 1, "", e.msg));
  } catch (const LoadError& e) {
    return InvalidArgumentError(e.what());
  }
}

StatusOr<Config> LoadFile(const std::string& path) {
  StatusOr<std::string> text = ReadConfigText(path);
  if (!text.ok()) return text.status();
  return LoadString(*text, path);
}

}  // namespace idemgate::config
