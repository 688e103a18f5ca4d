#pragma once

#include <atomic>
#include <boost/json/fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "admin/gateway_metrics.h"
#include "admin/stats.h"
#include "common/clock.h"
#include "common/request_path.h"
#include "common/status.h"
#include "common/text.h"
#include "core/record.h"
#include "core/store.h"

// The admin API of SPEC §9 as a transport-free handler: the HTTP server
// parses a request on the admin listener, hands it to AdminApi::Handle and
// writes back what it returns. docs/operations.md documents every route.
namespace idemgate::admin {

struct AdminRequest {
  std::string method;  // "GET", "DELETE", ... (case-sensitive, as on the wire)
  std::string target;  // origin-form request target: path and optional query
  std::vector<core::Header> headers;
};

struct AdminResponse {
  int status = 200;
  std::string content_type;
  std::string body;
  // Extra headers besides Content-Type (Cache-Control, WWW-Authenticate, ...).
  std::vector<core::Header> headers;
};

// Routes:
//   GET    /healthz                 200 "ok" while the process serves
//   GET    /readyz                  200 "ok" when Store::Ping is ok and not
//                                   draining, else 503 problem with the reason
//   GET    /metrics                 Prometheus text (version 0.0.4)
//   GET    /admin/stats             per-route statistics as JSON
//   GET    /admin/keys/{stored key} the record as JSON (token required)
//   DELETE /admin/keys/{stored key} purge it: {"purged": true|false, "state": ...} (token
//                                   required); a key still in flight (its lease lasts) is
//                                   refused with 409 key-in-flight unless ?force=true
// HEAD is answered as GET (the same status and headers; the HTTP layer sends
// no body). The stored key in the path is percent-decoded. Another method on
// one of these paths is a 405 problem `method-not-allowed` with an `Allow`
// header; any other path (or a resource whose component is null) is a 404
// problem. Token-protected routes answer 403 when no token is configured,
// 401 (with WWW-Authenticate) when `Authorization: Bearer <token>` is
// missing or wrong. Store failures answer 503 store-unavailable. Every
// response carries `Cache-Control: no-store`.
//
// Thread-safe: Handle may run concurrently on any executors; the store's
// own deadlines bound how long it can take.
class AdminApi {
 public:
  struct Options {
    // Bearer token for key inspection and purge; empty refuses them (403).
    std::string token;
    GatewayMetrics* metrics = nullptr;              // null: /metrics is a 404
    RouteStats* stats = nullptr;                    // null: /admin/stats is a 404
    core::Store* store = nullptr;                   // null: /readyz is 503, keys are 404
    const Clock* clock = &SystemClock::Instance();  // "now" for Store::Get
  };

  // The pointed-to objects must outlive this AdminApi.
  explicit AdminApi(Options options);

  core::Task<AdminResponse> Handle(AdminRequest request) const;

  // While draining (SIGTERM), /readyz answers 503 so load balancers stop
  // sending traffic; everything else keeps working.
  void SetDraining(bool draining) { draining_.store(draining, std::memory_order_relaxed); }

 private:
  enum class Auth { kOk, kNoToken, kMissing, kWrong };
  Auth Authorize(const AdminRequest& request) const;
  core::Task<AdminResponse> Ready() const;
  AdminResponse Stats() const;
  core::Task<AdminResponse> Key(const AdminRequest& request, std::string_view encoded_key) const;

  const Options options_;
  std::atomic<bool> draining_{false};
};

// Helpers, exposed for tests and for idemctl-side formatting (PercentDecode
// is in common/request_path.h).

// "2023-11-14T22:13:20.000Z": UTC, millisecond precision.
std::string FormatRfc3339(UnixMillis millis);

// The JSON shown by GET /admin/keys/{key} (see docs/operations.md). The owner
// token is reduced to a short prefix; the body is given as base64 and, when
// it is valid UTF-8, as text.
boost::json::object RecordToJson(std::string_view key, const core::Record& record);

}  // namespace idemgate::admin
