#include "gateway/route_table.h"

#include <map>

namespace idemgate::gateway {

bool RouteEntry::MatchesPath(std::string_view request_path) const {
  if (kind == Kind::kExact) return request_path == path;
  if (path.empty()) return true;  // "/"
  if (request_path.size() < path.size() || request_path.compare(0, path.size(), path) != 0) return false;
  return request_path.size() == path.size() || request_path[path.size()] == '/';
}

bool RouteEntry::AllowsMethod(std::string_view method) const {
  if (methods.empty()) return true;
  for (const auto& m : methods) {
    if (m == method) return true;
  }
  return false;
}

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
    e.methods = route.match.methods;
    auto it = upstream_index.find(route.upstream);
    if (it == upstream_index.end()) {
      return InvalidArgumentError("route " + route.id + ": unknown upstream " + route.upstream);
    }
    e.upstream_index = it->second;
    e.max_request_bytes = route.max_request_bytes ? *route.max_request_bytes : config.limits.max_request_bytes;
    if (route.max_in_flight) e.admission = admission.Get(route.id, *route.max_in_flight);
    e.config = &route;
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
