#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "http/message.h"

// RFC 9457 problem details for every error the gateway makes (SPEC §4.5):
// Content-Type application/problem+json, body
//   {"type":"urn:idemgate:problem:<code>","title":...,"status":...,
//    "detail":...,"code":"<code>"}
// Thread-safe, pure.
namespace idemgate::http {

enum class ProblemCode {
  // SPEC §4.5
  kMissingKey,           // 400 missing-key
  kInvalidKey,           // 400 invalid-key
  kKeyProhibited,        // 400 key-prohibited
  kKeyReused,            // 422 key-reused
  kRequestInFlight,      // 409 request-in-flight
  kTranslationFailed,    // 400 translation-failed
  kSignatureInvalid,     // 401 signature-invalid
  kUnauthenticated,      // 401 unauthenticated
  kTooManyRequests,      // 429 too-many-requests
  kStoreUnavailable,     // 503 store-unavailable
  kUpstreamUnavailable,  // 502 upstream-unavailable
  kUpstreamTimeout,      // 504 upstream-timeout
  kRequestTooLarge,      // 413 request-too-large
  kNoRoute,              // 404 no-route
  kNotFound,             // 404 not-found
  // Extensions for transport errors the SPEC list does not name.
  kBadRequest,           // 400 bad-request: malformed HTTP
  kHeadersTooLarge,      // 431 headers-too-large
  kUriTooLong,           // 414 uri-too-long: the request target alone passes the header limit
  kRequestTimeout,       // 408 request-timeout: the request body stalled past idle_timeout
  kMethodNotAllowed,     // 405 method-not-allowed: a method a webhook route does not take
  kHttpVersionNotSupported,  // 505 http-version-not-supported: a request line's major version is not 1
  kShuttingDown,         // 503 shutting-down
  kInternal,             // 500 internal-error
};

// "missing-key", "upstream-timeout", ...
std::string_view ProblemCodeName(ProblemCode code);
// The status each code is sent with by default (the table above).
int ProblemDefaultStatus(ProblemCode code);
// A short human title ("Upstream timed out").
std::string_view ProblemTitle(ProblemCode code);

// "urn:idemgate:problem:" + ProblemCodeName(code).
std::string ProblemType(ProblemCode code);

// The JSON body. `status` 0: ProblemDefaultStatus(code).
std::string ProblemJson(ProblemCode code, std::string_view detail, int status = 0);

// A complete problem response: status, Content-Type, Cache-Control: no-store,
// and Retry-After when `retry_after` is set (429, 409, 503).
Response MakeProblem(ProblemCode code, std::string_view detail, int status = 0,
                     std::optional<std::chrono::seconds> retry_after = std::nullopt);

}  // namespace idemgate::http
