#include "admin/stats.h"

#include <algorithm>
#include <boost/json/object.hpp>
#include <mutex>

namespace idemgate::admin {

RouteStats::RouteStats() : uid_(detail::NextUid()) {}
RouteStats::~RouteStats() = default;

RouteCounters& RouteStats::ForRoute(std::string_view route) {
  std::string& key = detail::LookupKey(uid_);
  key.append(route);
  if (void* cached = detail::CachedLookup(key)) return *static_cast<RouteCounters*>(cached);
  RouteCounters* counters = nullptr;
  {
    std::shared_lock lock(mu_);
    auto it = routes_.find(route);
    if (it != routes_.end()) counters = it->second.get();
  }
  if (counters == nullptr) {
    std::unique_lock lock(mu_);
    auto [it, inserted] = routes_.try_emplace(std::string(route));
    if (inserted) it->second = std::make_unique<RouteCounters>();
    counters = it->second.get();
  }
  detail::CacheLookup(key, counters);
  return *counters;
}

std::vector<RouteStatsRow> RouteStats::Snapshot() const {
  std::vector<RouteStatsRow> rows;
  {
    std::shared_lock lock(mu_);
    rows.reserve(routes_.size());
    for (const auto& [route, c] : routes_) {
      RouteStatsRow row;
      row.route = route;
      row.requests = c->requests.Value();
      row.hits = c->hits.Value();
      row.misses = c->misses.Value();
      row.waits = c->waits.Value();
      row.conflicts = c->conflicts.Value();
      row.mismatches = c->mismatches.Value();
      row.invalid = c->invalid.Value();
      row.store_errors = c->store_errors.Value();
      row.stored = c->stored.Value();
      rows.push_back(std::move(row));
    }
  }
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.route < b.route; });
  return rows;
}

RouteStatsRow RouteStats::Total(const std::vector<RouteStatsRow>& rows) {
  RouteStatsRow total;
  for (const auto& r : rows) {
    total.requests += r.requests;
    total.hits += r.hits;
    total.misses += r.misses;
    total.waits += r.waits;
    total.conflicts += r.conflicts;
    total.mismatches += r.mismatches;
    total.invalid += r.invalid;
    total.store_errors += r.store_errors;
    total.stored += r.stored;
  }
  return total;
}

boost::json::object RouteStatsRowToJson(const RouteStatsRow& row) {
  boost::json::object o;
  o["requests"] = row.requests;
  o["hits"] = row.hits;
  o["misses"] = row.misses;
  o["waits"] = row.waits;
  o["conflicts"] = row.conflicts;
  o["mismatches"] = row.mismatches;
  o["invalid"] = row.invalid;
  o["store_errors"] = row.store_errors;
  o["stored"] = row.stored;
  return o;
}

boost::json::object RouteStats::ToJson() const {
  const std::vector<RouteStatsRow> rows = Snapshot();
  boost::json::object routes;
  for (const auto& row : rows) routes[row.route] = RouteStatsRowToJson(row);
  boost::json::object out;
  out["routes"] = std::move(routes);
  out["totals"] = RouteStatsRowToJson(Total(rows));
  return out;
}

}  // namespace idemgate::admin
