#pragma once

#include <boost/json/fwd.hpp>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "admin/metrics.h"

// Per-route request statistics for `GET /admin/stats` (SPEC §9).
namespace idemgate::admin {

// Live counters of one route; sharded like every Counter, so updates from
// many I/O threads do not contend. What each one counts is documented in
// docs/operations.md ("GET /admin/stats").
struct RouteCounters {
  Counter requests;      // requests matched to the route, whatever happened to them
  Counter hits;          // replays of a completed record
  Counter misses;        // keyed requests that found no record and were forwarded
  Counter waits;         // requests that attached to an in-flight original (in_flight: wait)
  Counter conflicts;     // 409 request-in-flight (including waits that timed out), lost leases
  Counter mismatches;    // 422 key-reused: same key, other fingerprint
  Counter invalid;       // refused for the key: missing, invalid, prohibited, untranslatable
  Counter store_errors;  // store operations that failed
  Counter stored;        // responses written to the store as final
};

// A copy of one route's counters.
struct RouteStatsRow {
  std::string route;
  std::uint64_t requests = 0;
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t waits = 0;
  std::uint64_t conflicts = 0;
  std::uint64_t mismatches = 0;
  std::uint64_t invalid = 0;
  std::uint64_t store_errors = 0;
  std::uint64_t stored = 0;
  friend bool operator==(const RouteStatsRow&, const RouteStatsRow&) = default;
};

// The counters of every route seen. Routes are never removed (a route gone
// after a reload keeps its final numbers). Thread-safe.
class RouteStats {
 public:
  RouteStats();
  ~RouteStats();
  RouteStats(const RouteStats&) = delete;
  RouteStats& operator=(const RouteStats&) = delete;

  // The counters of `route`, created on first use; the reference stays valid
  // for the life of this object. Cheap enough for the request path (a
  // per-thread cache, then a map under a reader lock).
  RouteCounters& ForRoute(std::string_view route);

  // Every route, sorted by route id.
  std::vector<RouteStatsRow> Snapshot() const;
  // Sum over `rows`; its route is "".
  static RouteStatsRow Total(const std::vector<RouteStatsRow>& rows);

  // {"routes": {"<id>": {"requests": n, ...}, ...}, "totals": {...}};
  // routes in id order, fields in RouteStatsRow order.
  boost::json::object ToJson() const;

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };

  const std::uint64_t uid_;
  mutable std::shared_mutex mu_;
  std::unordered_map<std::string, std::unique_ptr<RouteCounters>, Hash, std::equal_to<>> routes_;
};

// One row as a JSON object (without its route id).
boost::json::object RouteStatsRowToJson(const RouteStatsRow& row);

}  // namespace idemgate::admin
