#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "core/record.h"

// The pure part of the engine: SPEC §4.2 (what to do with a keyed request),
// §4.3 (what is stored) and §4.4 (what a replay looks like). No I/O, no
// clock: time comes in as an argument. Thread-safe.
namespace idemgate::core {

// What a keyed request does while another holds the key (core's own enum;
// the gateway maps config::InFlightMode onto it).
enum class InFlightMode { kReject, kWait };

enum class ActionKind {
  kReserve,         // no live record: reserve atomically, then forward
  kReplay,          // completed, same fingerprint: answer with the stored response
  kKeyReused,       // other fingerprint: 422 key-reused, the record untouched
  kRejectInFlight,  // in flight, lease valid, mode reject: 409 request-in-flight
  kWait,            // in flight, lease valid, mode wait: attach until it lands
  kTakeOver,        // in flight, lease ended, same fingerprint: become the owner
};

// "reserve", "replay", "key_reused", "request_in_flight", "wait", "take_over".
std::string_view ActionKindName(ActionKind kind);

struct Action {
  ActionKind kind = ActionKind::kReserve;
  // kRejectInFlight and kWait: whole seconds until the lease ends, rounded
  // up, at least 1 (the Retry-After value).
  std::chrono::seconds retry_after{0};
  // kKeyReused: the record found was in flight (else completed).
  bool conflict_in_flight = false;
};

// Retry-After for a lease ending at `lease_expires_ms`: ceil of what is left
// in seconds, at least 1.
std::chrono::seconds RetryAfter(UnixMillis lease_expires_ms, UnixMillis now);

// SPEC §4.2. `existing` is what the store holds for the key (nullopt: none);
// a completed record past retention counts as none.
Action Decide(const std::optional<Record>& existing, std::string_view fingerprint, UnixMillis now,
              InFlightMode mode);

// ---------------------------------------------------------------------------
// §4.3: what happens to the reservation once the request ended.

enum class Disposition {
  kStore,    // final: complete the record with the response
  kRelease,  // not final: delete the reservation so a retry runs again
};

// Why a reservation was released; the label of
// idempotency_reservation_released_total{reason}.
enum class ReleaseReason {
  kNone,              // not released
  kServerError,       // 5xx ("server_error")
  kRetryableStatus,   // 408, 409, 425, 429 ("retryable_status")
  kUpstreamConnect,   // could not connect upstream, 502 ("upstream_connect")
  kUpstreamTimeout,   // upstream did not answer in time, 504 ("upstream_timeout")
  kClientGone,        // client left and the upstream could not finish ("client_gone")
  kShutdown,          // the gateway stops ("shutdown")
  kAdmission,         // refused by max_in_flight, 429 ("admission")
  kResponseError,     // the response could not be captured ("response_error")
};

std::string_view ReleaseReasonName(ReleaseReason reason);

struct Classification {
  Disposition disposition = Disposition::kStore;
  ReleaseReason reason = ReleaseReason::kNone;  // set when kRelease
};

// The upstream answered with `status`. Final (kStore): 2xx, 3xx and 4xx
// except 408, 409, 425 and 429; 5xx too when `store_server_errors`; any
// status when the upstream sent the terminal header. Everything else
// (including 1xx and out-of-range statuses) releases.
Classification ClassifyResponse(int status, bool store_server_errors, bool terminal_header_present);

// The upstream exchange did not produce a response.
enum class TransportOutcome {
  kConnectFailed,  // no connection to the upstream
  kTimedOut,       // the upstream did not answer within its timeout
  kClientGone,     // the client disconnected before the upstream answered
  kShutdown,       // the gateway is stopping and cannot finish
};

struct TransportDisposition {
  // True when the gateway should keep the reservation and finish the upstream
  // call anyway, then classify its response (kClientGone): the upstream may
  // already be executing, and its outcome is what a retry must replay.
  bool finish_upstream = false;
  ReleaseReason reason = ReleaseReason::kNone;  // when !finish_upstream: release
  int status = 0;  // the status the client gets (0 when no client is left)
};

// kConnectFailed: release, 502. kTimedOut: release, 504. kShutdown: release,
// 503. kClientGone: finish the upstream call, no status.
TransportDisposition ClassifyTransport(TransportOutcome outcome);

// ---------------------------------------------------------------------------
// §4.4: the replayed response.

inline constexpr std::string_view kDefaultReplayHeader = "Idempotent-Replayed";
inline constexpr std::string_view kOperationIdHeader = "X-Operation-Id";
inline constexpr std::string_view kReplayOmittedHeader = "Idempotency-Replay";

// True for hop-by-hop and framing fields that a replay (or a proxy) does not
// carry over: Connection, Keep-Alive, Proxy-Connection, Transfer-Encoding,
// TE, Trailer, Upgrade, Proxy-Authenticate, Proxy-Authorization and
// Content-Length (the writer frames the replayed body). Case-insensitive.
bool IsHopByHopHeader(std::string_view name);

// The response to send for a completed record at `now`: the stored status,
// headers in order (repeated ones such as Set-Cookie kept) and body, minus
// hop-by-hop fields and fields named in the stored Connection header; a
// stored Content-Length is kept in place (for the writer to frame the body
// there); Date set to `now` where the original had it (added after the stored
// fields when it had none); `<replay_header_name>: true` (a stored field of
// that name is replaced); X-Operation-Id set to the record's operation id
// (kept as stored when the record has none). A record whose body was omitted
// replays with an empty body and `Idempotency-Replay: omitted`.
StoredResponse BuildReplay(const Record& record, std::string_view replay_header_name,
                           UnixMillis now);

// RFC 9110 IMF-fixdate, e.g. "Sun, 06 Nov 1994 08:49:37 GMT".
std::string FormatHttpDate(UnixMillis t);

// ASCII case-insensitive comparison of header names.
bool HeaderNameEquals(std::string_view a, std::string_view b);

}  // namespace idemgate::core
