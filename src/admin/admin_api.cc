#include "admin/admin_api.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <algorithm>
#include <array>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>
#include <cctype>
#include <cstdio>
#include <ctime>

#include "admin/prometheus.h"
#include "common/ascii.h"
#include "common/hex.h"
#include "common/log.h"
#include "common/text.h"

namespace idemgate::admin {
namespace {

namespace json = boost::json;

constexpr std::string_view kKeysPrefix = "/admin/keys/";
constexpr std::string_view kJson = "application/json";
constexpr std::string_view kProblemJson = "application/problem+json";
constexpr std::string_view kText = "text/plain; charset=utf-8";
constexpr std::string_view kRealm = "Bearer realm=\"idemgate-admin\"";
// The Allow header of a 405: what the read-only resources take, and what /admin/keys/{key} takes.
constexpr std::string_view kAllowRead = "GET, HEAD";
constexpr std::string_view kAllowKeys = "GET, HEAD, DELETE";
// Characters of the owner token shown by GET /admin/keys; enough to tell
// owners apart in logs, too few to complete someone else's reservation.
constexpr std::size_t kOwnerPrefix = 8;

AdminResponse Respond(int status, std::string_view content_type, std::string body) {
  AdminResponse r;
  r.status = status;
  r.content_type = std::string(content_type);
  r.body = std::move(body);
  r.headers.push_back({"Cache-Control", "no-store"});
  return r;
}

AdminResponse Json(int status, const json::value& value) {
  std::string body = json::serialize(value);
  body += '\n';
  return Respond(status, kJson, std::move(body));
}

// RFC 9457 problem with idemgate's fields (SPEC §4.5).
AdminResponse Problem(int status, std::string_view code, std::string_view title,
                      std::string_view detail) {
  json::object o;
  o["type"] = "urn:idemgate:problem:" + std::string(code);
  o["title"] = title;
  o["status"] = status;
  o["detail"] = detail;
  o["code"] = code;
  std::string body = json::serialize(o);
  body += '\n';
  return Respond(status, kProblemJson, std::move(body));
}

AdminResponse NotFound(std::string_view detail) {
  return Problem(404, "not-found", "Not found", detail);
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::array<unsigned char, SHA256_DIGEST_LENGTH> Digest(std::string_view s) {
  std::array<unsigned char, SHA256_DIGEST_LENGTH> out{};
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), out.data());
  return out;
}



std::string RedactOwner(std::string_view owner) {
  if (owner.empty()) return "";
  bool printable = true;
  for (unsigned char c : owner) printable = printable && c > 0x20 && c < 0x7f;
  const std::string shown = printable ? std::string(owner) : ToHex(owner);
  // Never more than half of it, whatever its length.
  const std::size_t n = std::min(kOwnerPrefix, shown.size() / 2);
  return shown.substr(0, n) + "...";
}

json::value TimeOrNull(UnixMillis millis) {
  if (millis == 0) return nullptr;
  return json::value(FormatRfc3339(millis));
}

// t-{tenant}:{project}:{subject}:{route}:{raw}; the subject may itself hold
// colons ("user:42"), route ids and raw keys never do.
std::optional<json::object> ParseScope(std::string_view key) {
  if (!key.starts_with("t-")) return std::nullopt;
  key.remove_prefix(2);
  std::vector<std::string_view> parts;
  for (std::size_t start = 0;;) {
    const std::size_t colon = key.find(':', start);
    parts.push_back(key.substr(
        start, colon == std::string_view::npos ? std::string_view::npos : colon - start));
    if (colon == std::string_view::npos) break;
    start = colon + 1;
  }
  if (parts.size() < 5) return std::nullopt;
  std::string subject;
  for (std::size_t i = 2; i + 2 < parts.size(); ++i) {
    if (!subject.empty() || i > 2) subject += ':';
    subject.append(parts[i]);
  }
  // The tenant and project as the caller had them: the stored key writes
  // '%' and ':' in them as %25 and %3A, and the value "_" as %5F
  // (core/scope.cc), so decoding is exact; a component that does not decode
  // is shown as it is.
  const auto unescape = [](std::string_view component) {
    StatusOr<std::string> decoded = PercentDecode(component);
    return decoded.ok() ? std::move(*decoded) : std::string(component);
  };
  json::object o;
  o["tenant"] = SanitizeUtf8(unescape(parts[0]));
  o["project"] = SanitizeUtf8(unescape(parts[1]));
  // The subject "_" is written %5F, and one starting with '%' has one more
  // (core/scope.cc).
  if (subject == "%5F") {
    subject = "_";
  } else if (subject.starts_with('%')) {
    subject.erase(0, 1);
  }
  o["subject"] = SanitizeUtf8(subject);
  // A webhook route's keys are kept per endpoint: "{route}/{endpoint}".
  const std::string_view route = parts[parts.size() - 2];
  const std::size_t slash = route.find('/');
  o["route"] = SanitizeUtf8(route.substr(0, slash));
  if (slash != std::string_view::npos) o["webhook_endpoint"] = SanitizeUtf8(route.substr(slash + 1));
  o["raw_key"] = SanitizeUtf8(parts.back());
  return o;
}

// The `force` parameter of DELETE /admin/keys/{key}: false when absent,
// true for `force=true`. Any other value, or `force` given twice, is an
// error. Other parameters are ignored.
StatusOr<bool> ForceParam(std::string_view target) {
  const std::size_t question = target.find('?');
  if (question == std::string_view::npos) return false;
  std::string_view query = target.substr(question + 1);
  bool force = false;
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query.remove_prefix(amp == std::string_view::npos ? query.size() : amp + 1);
    const std::size_t eq = pair.find('=');
    StatusOr<std::string> name = PercentDecode(pair.substr(0, eq));
    if (!name.ok() || *name != "force") continue;
    if (force) return InvalidArgumentError("force is given more than once");
    const std::string_view raw = eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
    StatusOr<std::string> value = PercentDecode(raw);
    if (eq == std::string_view::npos || !value.ok() || *value != "true") {
      return InvalidArgumentError("force takes only the value true (?force=true), not \"" + SanitizeUtf8(raw) +
                                  "\"");
    }
    force = true;
  }
  return force;
}

std::optional<std::string_view> StateName(std::optional<core::RecordState> state) {
  if (!state) return std::nullopt;
  return *state == core::RecordState::kCompleted ? "completed" : "in_flight";
}

AdminResponse StoreFailure(const Status& status) {
  switch (status.code()) {
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
    case StatusCode::kResourceExhausted:
      return Problem(503, "store-unavailable", "Idempotency store unavailable", status.message());
    default:
      return Problem(500, "internal-error", "Internal error", status.ToString());
  }
}

}  // namespace


std::string FormatRfc3339(UnixMillis millis) {
  std::time_t seconds = static_cast<std::time_t>(millis / 1000);
  int ms = static_cast<int>(millis % 1000);
  if (ms < 0) {
    ms += 1000;
    seconds -= 1;
  }
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  return buf;
}


json::object RecordToJson(std::string_view key, const core::Record& record) {
  json::object o;
  o["key"] = SanitizeUtf8(key);
  if (auto scope = ParseScope(key)) o["scope"] = std::move(*scope);
  const bool completed = record.state == core::RecordState::kCompleted;
  o["state"] = completed ? "completed" : "in_flight";
  o["fingerprint"] = ToHex(record.fingerprint);
  o["owner_prefix"] = RedactOwner(record.owner);
  o["operation_id"] = SanitizeUtf8(record.operation_id);
  o["created"] = TimeOrNull(record.created_ms);
  o["lease_expires"] = completed ? json::value(nullptr) : TimeOrNull(record.lease_expires_ms);
  o["expires"] = TimeOrNull(record.expires_ms);
  if (!completed) {
    o["response"] = nullptr;
    return o;
  }
  const core::StoredResponse& response = record.response;
  json::object r;
  r["status"] = response.status;
  json::array headers;
  for (const core::Header& h : response.headers) {
    json::object header;
    header["name"] = SanitizeUtf8(h.name);
    header["value"] = SanitizeUtf8(h.value);
    headers.push_back(std::move(header));
  }
  r["headers"] = std::move(headers);
  r["body_omitted"] = response.body_omitted;
  r["body_bytes"] = response.body.size();
  r["body_base64"] = Base64(response.body);
  if (IsValidUtf8(response.body)) r["body"] = response.body;
  o["response"] = std::move(r);
  return o;
}

AdminApi::AdminApi(Options options) : options_(std::move(options)) {}

AdminApi::Auth AdminApi::Authorize(const AdminRequest& request) const {
  if (options_.token.empty()) return Auth::kNoToken;
  const core::Header* found = nullptr;
  for (const core::Header& h : request.headers) {
    if (!EqualsIgnoreCaseAscii(h.name, "authorization")) continue;
    if (found != nullptr) return Auth::kWrong;  // two Authorization headers
    found = &h;
  }
  if (found == nullptr) return Auth::kMissing;
  std::string_view value = Trim(found->value);
  const std::size_t space = value.find_first_of(" \t");
  if (space == std::string_view::npos || !EqualsIgnoreCaseAscii(value.substr(0, space), "bearer"))
    return Auth::kWrong;
  const std::string_view presented = Trim(value.substr(space));
  // Digests first: equal lengths for CRYPTO_memcmp, and no length leak.
  const auto want = Digest(options_.token);
  const auto got = Digest(presented);
  return CRYPTO_memcmp(want.data(), got.data(), want.size()) == 0 ? Auth::kOk : Auth::kWrong;
}

core::Task<AdminResponse> AdminApi::Handle(AdminRequest request) const {
  const std::string_view target = request.target;
  const std::string_view path = target.substr(0, target.find('?'));
  // HEAD is answered as GET; the HTTP layer sends the head only (load balancer probes use it).
  const bool get = request.method == "GET" || request.method == "HEAD";
  const bool keys = path.starts_with(kKeysPrefix) && path.size() > kKeysPrefix.size() && options_.store != nullptr;

  // The methods the resource at `path` takes; empty when there is none.
  std::string_view allow;
  if (path == "/healthz" || path == "/readyz" || (path == "/metrics" && options_.metrics != nullptr) ||
      (path == "/admin/stats" && options_.stats != nullptr)) {
    allow = kAllowRead;
  } else if (keys) {
    allow = kAllowKeys;
  }
  if (allow.empty()) {
    // A HEAD's answer is a GET's without the body, Content-Length included:
    // the detail names GET for both.
    co_return NotFound("no admin resource at " + SanitizeUtf8(get ? std::string_view("GET") : request.method) + " " +
                       SanitizeUtf8(path));
  }

  if (path == "/healthz" && get) co_return Respond(200, kText, "ok");
  if (path == "/readyz" && get) co_return co_await Ready();
  if (path == "/metrics" && get) co_return Respond(200, kPrometheusContentType, options_.metrics->RenderPrometheus());
  if (path == "/admin/stats" && get) co_return Stats();
  if (keys && (get || request.method == "DELETE")) co_return co_await Key(request, path.substr(kKeysPrefix.size()));
  AdminResponse r = Problem(405, "method-not-allowed", "Method not allowed",
                            SanitizeUtf8(path) + " does not take " + SanitizeUtf8(request.method) + "; it takes " +
                                std::string(allow));
  r.headers.push_back({"Allow", std::string(allow)});
  co_return r;
}

core::Task<AdminResponse> AdminApi::Ready() const {
  if (draining_.load(std::memory_order_relaxed)) {
    co_return Problem(503, "shutting-down", "Gateway shutting down", "the gateway is draining");
  }
  if (options_.store == nullptr) {
    co_return Problem(503, "store-unavailable", "Idempotency store unavailable", "no store configured");
  }
  const Status status = co_await options_.store->Ping();
  if (!status.ok()) {
    if (options_.metrics != nullptr) options_.metrics->AdminStoreError(StoreOp::kPing);
    co_return Problem(503, "store-unavailable", "Idempotency store unavailable", "store: " + status.ToString());
  }
  co_return Respond(200, kText, "ok");
}

AdminResponse AdminApi::Stats() const {
  json::object body = options_.stats->ToJson();
  if (options_.store != nullptr) {
    const core::StoreStats s = options_.store->Stats();
    json::object store;
    store["keys"] = s.keys;
    store["bytes"] = s.bytes;
    store["bodies_dropped"] = s.bodies_dropped;
    body["store"] = std::move(store);
  }
  return Json(200, body);
}

core::Task<AdminResponse> AdminApi::Key(const AdminRequest& request,
                                        std::string_view encoded_key) const {
  const Auth auth = Authorize(request);
  if (auth != Auth::kOk) {
    // Refused calls leave a trace (a token being guessed shows), without
    // what was presented.
    static LogLimiter limiter;
    LogWarn(limiter, "admin call refused",
            {{"method", SanitizeUtf8(request.method)},
             {"path", SanitizeUtf8(request.target.substr(0, request.target.find('?')))},
             {"reason", auth == Auth::kNoToken ? "no_token_configured"
                        : auth == Auth::kMissing ? "missing_token"
                                                 : "invalid_token"}});
  }
  switch (auth) {
    case Auth::kOk:
      break;
    case Auth::kNoToken:
      co_return Problem(
          403, "forbidden", "Forbidden",
          "no admin token configured: set the environment variable named by admin.token_env");
    case Auth::kMissing: {
      AdminResponse r = Problem(401, "unauthenticated", "Authentication required",
                                "this call needs Authorization: Bearer <admin token>");
      r.headers.push_back({"WWW-Authenticate", std::string(kRealm)});
      co_return r;
    }
    case Auth::kWrong: {
      AdminResponse r =
          Problem(401, "unauthenticated", "Authentication required", "the admin token is not valid");
      r.headers.push_back({"WWW-Authenticate", std::string(kRealm) + ", error=\"invalid_token\""});
      co_return r;
    }
  }

  StatusOr<std::string> key = PercentDecode(encoded_key);
  if (!key.ok()) co_return Problem(400, "invalid-key", "Invalid idempotency key", key.status().message());

  if (request.method == "DELETE") {
    StatusOr<bool> force = ForceParam(request.target);
    if (!force.ok()) co_return Problem(400, "bad-request", "Malformed request", force.status().message());
    // Unless forced, the store refuses (atomically, in the same step as the
    // delete) a reservation whose lease lasts: its request may still be
    // running, and a retry after the purge would run it a second time.
    const UnixMillis now = options_.clock->NowMillis();
    StatusOr<core::PurgeResult> purged = co_await options_.store->Purge(
        *key, *force ? core::PurgeMode::kAny : core::PurgeMode::kUnlessInFlight, now);
    if (!purged.ok()) {
      if (options_.metrics != nullptr) options_.metrics->AdminStoreError(StoreOp::kPurge);
      static LogLimiter limiter;
      LogWarn(limiter, "admin purge failed", {{"key", SanitizeUtf8(*key)}, {"error", purged.status().ToString()}});
      co_return StoreFailure(purged.status());
    }
    const bool removed = purged->outcome == core::PurgeOutcome::kPurged;
    // Purging a key in flight can let a retry run beside the original
    // (docs/operations.md): every purge is logged, a refused one too
    // (purged false, state in_flight).
    LogInfo("admin purge", {{"key", SanitizeUtf8(*key)},
                            {"purged", removed},
                            {"state", StateName(purged->state)},
                            {"forced", *force}});
    if (purged->outcome == core::PurgeOutcome::kInFlight) {
      const UnixMillis lease_end = purged->lease_expires_ms;
      AdminResponse r = Problem(
          409, "key-in-flight", "Key in flight",
          "the request under this key is still running (its lease ends at " + FormatRfc3339(lease_end) +
              "); purging it now would let a retry run the request a second time beside the original. "
              "Purge it after the lease ends, or add ?force=true to purge it anyway, at that risk");
      const std::int64_t seconds = std::max<std::int64_t>(1, (lease_end - now + 999) / 1000);
      r.headers.push_back({"Retry-After", std::to_string(seconds)});
      co_return r;
    }
    json::object body;
    body["purged"] = removed;
    if (removed && purged->state) body["state"] = *StateName(purged->state);
    co_return Json(200, body);
  }

  StatusOr<std::optional<core::Record>> record =
      co_await options_.store->Get(*key, options_.clock->NowMillis());
  if (!record.ok()) {
    if (options_.metrics != nullptr) options_.metrics->AdminStoreError(StoreOp::kGet);
    co_return StoreFailure(record.status());
  }
  if (!record->has_value()) co_return NotFound("no record for this key");
  co_return Json(200, RecordToJson(*key, **record));
}

}  // namespace idemgate::admin
