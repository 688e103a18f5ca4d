#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/units.h"
#include "config/config.h"
#include "core/decision.h"
#include "core/fingerprint.h"
#include "core/key.h"
#include "core/scope.h"
#include "gateway/admission.h"

// The route table (SPEC §2 step 2): the first route whose match fits wins.
//
// Matching (docs/architecture.md):
//  - `match.path`: the request path equals it exactly, or with one
//    trailing '/' added ("/pay" matches "/pay/"), which most frameworks
//    serve as the same resource: a catch-all route behind it must not get
//    that spelling past the exact route's checks.
//  - `match.path_prefix`: the request path equals the prefix or continues it
//    at a segment boundary: "/api/v1/payments" matches "/api/v1/payments"
//    and "/api/v1/payments/42", never "/api/v1/paymentsX". A trailing '/'
//    on the prefix is ignored ("/api/" behaves as "/api"); "/" matches
//    every path.
//  - A webhook route's path holds one whole segment `{webhook_id}` (SPEC §7):
//    it matches any one non-empty segment there, which names the webhook
//    endpoint ("/hooks/{webhook_id}" matches "/hooks/acme" and "/hooks/acme/",
//    not "/hooks/" nor "/hooks/a/b" for `path`; `path_prefix`, which config
//    validation refuses on webhook routes, would allow "/hooks/a/b").
//  - `match.methods`: when set, the method must be one of them (exact,
//    case-sensitive, as HTTP methods are); a path that fits with another
//    method goes on to the next route.
//  - The path is compared as sent (no percent-decoding); the query string
//    never takes part. Paths with "." or ".." segments are refused before
//    routing (400), so a prefix cannot be sidestepped.
// Immutable after construction; safe to share between threads.
namespace idemgate::gateway {

// A route's `idempotency` settings in the engine's terms, derived once when
// the table is built so the request path converts nothing.
struct RouteIdempotency {
  config::Policy policy = config::Policy::kOptional;
  std::string_view case_name;        // SPEC §4.1 seed name: "REQUIRED_A", "ACCEPTED", ...
  std::string header;                // the key's header name
  std::vector<std::string> methods;  // methods whose keys are handled
  core::ScopeLevel scope = core::ScopeLevel::kGlobal;
  core::KeyRules key;
  core::FingerprintRules fingerprint;
  core::InFlightMode in_flight = core::InFlightMode::kReject;
  Duration lease{0};                 // `lease`, else the upstream's timeout + 5s
  Duration wait_timeout{0};
  Duration retention{0};             // 0: until purged
  std::uint64_t max_response_bytes = 0;
  bool store_server_errors = false;
  std::string terminal_header;
  std::string replay_header;
  // What a forwarded keyed request strips from the upstream's response:
  // terminal_header, replay_header and X-Operation-Id (views into the config).
  std::vector<std::string_view> strip_response_headers;
  config::DedupMode dedup = config::DedupMode::kGateway;
  config::ForwardKey forward_key = config::ForwardKey::kNamespaced;

  // True when keys on requests with `method` are looked at (exact match).
  bool HandlesMethod(std::string_view method) const;
};

// SPEC §4.1: the seed name of each policy.
std::string_view PolicyCaseName(config::Policy policy);

struct RouteEntry {
  enum class Kind { kExact, kPrefix };

  std::string id;
  Kind kind = Kind::kPrefix;
  std::string path;                  // exact path, or prefix without trailing '/' ("" for "/");
                                     // with a webhook id: the part before it, ending in '/'
  bool webhook_id = false;           // the path has a `{webhook_id}` segment
  std::string after_webhook_id;      // the path after that segment ("" or "/...")
  std::vector<std::string> methods;  // empty: every method
  std::size_t upstream_index = 0;    // index into RouteTable::upstreams()
  std::uint64_t max_request_bytes = 0;
  std::shared_ptr<AdmissionCounter> admission;  // null: unlimited
  std::shared_ptr<TenantAdmission> tenant_admission;  // null: no per-tenant limit
  const config::Route* config = nullptr;        // the route's config (owned by the snapshot)
  RouteIdempotency idempotency;

  // True when `path` fits this route's path rule (methods not considered).
  bool MatchesPath(std::string_view request_path) const;
  // The `{webhook_id}` segment of a path that fits; empty when the route has none.
  std::string_view WebhookId(std::string_view request_path) const;
  bool AllowsMethod(std::string_view method) const;
};

class RouteTable {
 public:
  // Builds the table from `config` (which must outlive the table): routes in
  // order, upstream references resolved. `admission` supplies the counter
  // of each route with max_in_flight (shared across reloads by route id).
  static StatusOr<RouteTable> Build(const config::Config& config, AdmissionRegistry& admission);

  // The first route that fits, or null (404 no-route).
  const RouteEntry* Match(std::string_view method, std::string_view path) const;

  const std::vector<RouteEntry>& routes() const { return routes_; }
  // Upstream names in index order (RouteEntry::upstream_index).
  const std::vector<std::string>& upstreams() const { return upstreams_; }

 private:
  std::vector<RouteEntry> routes_;
  std::vector<std::string> upstreams_;
};

}  // namespace idemgate::gateway
