#include "http/problem.h"

#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

namespace idemgate::http {
namespace {

struct ProblemInfo {
  std::string_view name;
  int status;
  std::string_view title;
};

ProblemInfo Info(ProblemCode code) {
  switch (code) {
    case ProblemCode::kMissingKey: return {"missing-key", 400, "Idempotency key missing"};
    case ProblemCode::kInvalidKey: return {"invalid-key", 400, "Invalid idempotency key"};
    case ProblemCode::kKeyProhibited: return {"key-prohibited", 400, "Idempotency key not allowed here"};
    case ProblemCode::kKeyReused: return {"key-reused", 422, "Idempotency key reused with another request"};
    case ProblemCode::kRequestInFlight: return {"request-in-flight", 409, "Request with this key in flight"};
    case ProblemCode::kTranslationFailed: return {"translation-failed", 400, "Webhook id could not be read"};
    case ProblemCode::kSignatureInvalid: return {"signature-invalid", 401, "Invalid webhook signature"};
    case ProblemCode::kUnauthenticated: return {"unauthenticated", 401, "Authentication required"};
    case ProblemCode::kTooManyRequests: return {"too-many-requests", 429, "Too many requests"};
    case ProblemCode::kStoreUnavailable: return {"store-unavailable", 503, "Idempotency store unavailable"};
    case ProblemCode::kUpstreamUnavailable: return {"upstream-unavailable", 502, "Upstream unavailable"};
    case ProblemCode::kUpstreamTimeout: return {"upstream-timeout", 504, "Upstream timed out"};
    case ProblemCode::kRequestTooLarge: return {"request-too-large", 413, "Request body too large"};
    case ProblemCode::kNoRoute: return {"no-route", 404, "No route"};
    case ProblemCode::kNotFound: return {"not-found", 404, "Not found"};
    case ProblemCode::kBadRequest: return {"bad-request", 400, "Malformed request"};
    case ProblemCode::kHeadersTooLarge: return {"headers-too-large", 431, "Request header fields too large"};
    case ProblemCode::kUriTooLong: return {"uri-too-long", 414, "Request target too long"};
    case ProblemCode::kRequestTimeout: return {"request-timeout", 408, "Request body timed out"};
    case ProblemCode::kMethodNotAllowed: return {"method-not-allowed", 405, "Method not allowed"};
    case ProblemCode::kHttpVersionNotSupported:
      return {"http-version-not-supported", 505, "HTTP version not supported"};
    case ProblemCode::kShuttingDown: return {"shutting-down", 503, "Gateway shutting down"};
    case ProblemCode::kInternal: return {"internal-error", 500, "Internal error"};
  }
  return {"internal-error", 500, "Internal error"};
}

constexpr std::string_view kTypePrefix = "urn:idemgate:problem:";

}  // namespace

std::string_view ProblemCodeName(ProblemCode code) { return Info(code).name; }
int ProblemDefaultStatus(ProblemCode code) { return Info(code).status; }
std::string_view ProblemTitle(ProblemCode code) { return Info(code).title; }

std::string ProblemType(ProblemCode code) {
  std::string out(kTypePrefix);
  out += ProblemCodeName(code);
  return out;
}

std::string ProblemJson(ProblemCode code, std::string_view detail, int status) {
  const ProblemInfo info = Info(code);
  boost::json::object o;
  o["type"] = ProblemType(code);
  o["title"] = info.title;
  o["status"] = status != 0 ? status : info.status;
  o["detail"] = detail;
  o["code"] = info.name;
  return boost::json::serialize(o);
}

Response MakeProblem(ProblemCode code, std::string_view detail, int status,
                     std::optional<std::chrono::seconds> retry_after) {
  Response r;
  r.status = status != 0 ? status : ProblemDefaultStatus(code);
  r.headers.reserve(3);
  r.headers.push_back({"Content-Type", "application/problem+json"});
  r.headers.push_back({"Cache-Control", "no-store"});
  if (retry_after) r.headers.push_back({"Retry-After", std::to_string(retry_after->count())});
  r.body = ProblemJson(code, detail, r.status);
  return r;
}

}  // namespace idemgate::http
