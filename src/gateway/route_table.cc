#include "gateway/route_table.h"

#include <algorithm>
#include <map>

#include "config/names.h"
#include "config/resolve.h"

namespace idemgate::gateway {

namespace {

// `rest` continues a prefix `after` at a segment boundary (or equals it).
bool ContinuesAt(std::string_view rest, std::string_view after) {
  if (!rest.starts_with(after)) return false;
  return rest.size() == after.size() || rest[after.size()] == '/';
}

// `request` is `exact`, or `exact` and one trailing slash: the two spellings
// of one resource to most frameworks (Express without strict routing,
// Django's APPEND_SLASH, Spring before 6), so an exact route's checks are
// not left behind by a slash that a catch-all route would take.
bool EqualsExactPath(std::string_view request, std::string_view exact) {
  if (request.size() == exact.size() + 1 && request.back() == '/' && !exact.ends_with('/')) {
    request.remove_suffix(1);
  }
  return request == exact;
}

}  // namespace

std::string_view RouteEntry::WebhookId(std::string_view request_path) const {
  if (!webhook_id || !request_path.starts_with(path)) return {};
  const std::string_view rest = request_path.substr(path.size());
  return rest.substr(0, std::min(rest.find('/'), rest.size()));
}

bool RouteEntry::MatchesPath(std::string_view request_path) const {
  if (webhook_id) {
    const std::string_view id = WebhookId(request_path);
    if (id.empty()) return false;
    const std::string_view rest = request_path.substr(path.size() + id.size());
    return kind == Kind::kExact ? EqualsExactPath(rest, after_webhook_id) : ContinuesAt(rest, after_webhook_id);
  }
  if (kind == Kind::kExact) return EqualsExactPath(request_path, path);
  if (path.empty()) return true;  // "/"
  if (request_path.size() < path.size() || request_path.compare(0, path.size(), path) != 0) return false;
  return request_path.size() == path.size() || request_path[path.size()] == '/';
}

namespace {

// Methods are compared exactly: they are case-sensitive in HTTP.
bool InMethods(const std::vector<std::string>& methods, std::string_view method) {
  return std::find(methods.begin(), methods.end(), method) != methods.end();
}

}  // namespace

bool RouteEntry::AllowsMethod(std::string_view method) const { return methods.empty() || InMethods(methods, method); }

bool RouteIdempotency::HandlesMethod(std::string_view method) const { return InMethods(methods, method); }

std::string_view PolicyCaseName(config::Policy policy) {
  switch (policy) {
    case config::Policy::kRequired: return "REQUIRED_A";
    case config::Policy::kOptional: return "ACCEPTED";
    case config::Policy::kWebhook: return "REQUIRED_B";
    case config::Policy::kPassthrough: return "HANDLER_INTERNAL_C";
    case config::Policy::kProhibited: return "PROHIBITED";
  }
  return "UNKNOWN";
}

namespace {

core::ScopeLevel ToCore(config::Scope scope) {
  switch (scope) {
    case config::Scope::kSubject: return core::ScopeLevel::kSubject;
    case config::Scope::kProject: return core::ScopeLevel::kProject;
    case config::Scope::kTenant: return core::ScopeLevel::kTenant;
    case config::Scope::kGlobal: return core::ScopeLevel::kGlobal;
  }
  return core::ScopeLevel::kGlobal;
}

RouteIdempotency MakeRouteIdempotency(const config::Config& config, const config::Route& route,
                                      const config::Upstream& upstream) {
  const config::Idempotency& in = route.idempotency;
  RouteIdempotency out;
  out.policy = in.policy;
  out.case_name = PolicyCaseName(in.policy);
  out.header = in.header;
  out.methods = in.methods;
  out.scope = ToCore(config::EffectiveScope(in, config.identity));
  out.key.max_length = in.key.max_length;
  out.key.extra_charset = in.key.charset;
  out.fingerprint.headers = in.fingerprint.headers;
  out.fingerprint.json = in.fingerprint.json == config::JsonMode::kRaw ? core::JsonMode::kRaw : core::JsonMode::kCanonical;
  out.fingerprint.json_fields = in.fingerprint.json_fields;
  out.in_flight = in.in_flight == config::InFlightMode::kWait ? core::InFlightMode::kWait : core::InFlightMode::kReject;
  out.lease = config::EffectiveLease(in, upstream);
  out.wait_timeout = in.wait_timeout;
  out.retention = in.retention;
  out.max_response_bytes = in.max_response_bytes;
  out.store_server_errors = in.store_server_errors;
  out.terminal_header = in.terminal_header;
  out.replay_header = in.replay_header;
  // Views into the config, which the snapshot keeps in place (not into `out`, which moves).
  out.strip_response_headers = {in.terminal_header, in.replay_header, core::kOperationIdHeader,
                                core::kReplayOmittedHeader};
  out.dedup = in.dedup;
  out.forward_key = in.forward_key;
  return out;
}

}  // namespace

StatusOr<RouteTable> RouteTable::Build(const config::Config& config, AdmissionRegistry& admission) {
  RouteTable table;
  std::map<std::string, std::size_t> upstream_index;
  for (const auto& [name, upstream] : config.upstreams) {
    (void)upstream;
    upstream_index.emplace(name, table.upstreams_.size());
    table.upstreams_.push_back(name);
  }
  table.routes_.reserve(config.routes.size());
  for (const config::Route& route : config.routes) {
    RouteEntry e;
    e.id = route.id;
    if (!route.match.path.empty()) {
      e.kind = RouteEntry::Kind::kExact;
      e.path = route.match.path;
    } else {
      e.kind = RouteEntry::Kind::kPrefix;
      e.path = route.match.path_prefix;
      while (!e.path.empty() && e.path.back() == '/') e.path.pop_back();
    }
    if (const std::size_t at = e.path.find(config::kWebhookIdPlaceholder); at != std::string::npos) {
      // Validation allows the placeholder only as one whole segment.
      e.webhook_id = true;
      e.after_webhook_id = e.path.substr(at + config::kWebhookIdPlaceholder.size());
      e.path.resize(at);
    }
    e.methods = route.match.methods;
    auto it = upstream_index.find(route.upstream);
    if (it == upstream_index.end()) {
      return InvalidArgumentError("route " + route.id + ": unknown upstream " + route.upstream);
    }
    e.upstream_index = it->second;
    e.max_request_bytes = route.max_request_bytes ? *route.max_request_bytes : config.limits.max_request_bytes;
    if (route.max_in_flight) e.admission = admission.Get(route.id, *route.max_in_flight);
    if (route.max_in_flight_per_tenant) {
      e.tenant_admission = admission.GetPerTenant(route.id, *route.max_in_flight_per_tenant);
    }
    e.config = &route;
    e.idempotency = MakeRouteIdempotency(config, route, config.upstreams.at(route.upstream));
    table.routes_.push_back(std::move(e));
  }
  return table;
}

const RouteEntry* RouteTable::Match(std::string_view method, std::string_view path) const {
  for (const RouteEntry& r : routes_) {
    if (r.MatchesPath(path) && r.AllowsMethod(method)) return &r;
  }
  return nullptr;
}

}  // namespace idemgate::gateway
