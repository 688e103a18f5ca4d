#include "core/decision.h"

#include <chrono>
#include <limits>
#include <string>
#include <vector>

#include "common/ascii.h"

namespace idemgate::core {

namespace {


std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

bool HeaderNameEquals(std::string_view a, std::string_view b) { return EqualsIgnoreCaseAscii(a, b); }

std::string_view ActionKindName(ActionKind kind) {
  switch (kind) {
    case ActionKind::kReserve: return "reserve";
    case ActionKind::kReplay: return "replay";
    case ActionKind::kKeyReused: return "key_reused";
    case ActionKind::kRejectInFlight: return "request_in_flight";
    case ActionKind::kWait: return "wait";
    case ActionKind::kTakeOver: return "take_over";
  }
  return "unknown";
}

std::chrono::seconds RetryAfter(UnixMillis lease_expires_ms, UnixMillis now) {
  const UnixMillis left = lease_expires_ms - now;
  if (left <= 1000) return std::chrono::seconds(1);
  return std::chrono::seconds((left + 999) / 1000);
}

Action Decide(const std::optional<Record>& existing, std::string_view fingerprint, UnixMillis now,
              InFlightMode mode) {
  Action action;
  if (!existing.has_value()) {
    action.kind = ActionKind::kReserve;
    return action;
  }
  const Record& r = *existing;
  const bool same = r.fingerprint == fingerprint;
  if (r.state == RecordState::kCompleted) {
    if (r.ExpiredAt(now)) {
      action.kind = ActionKind::kReserve;
    } else {
      action.kind = same ? ActionKind::kReplay : ActionKind::kKeyReused;
    }
    return action;
  }
  if (!same) {
    action.kind = ActionKind::kKeyReused;
    action.conflict_in_flight = true;
    return action;
  }
  if (r.LeaseEndedAt(now)) {
    action.kind = ActionKind::kTakeOver;
    return action;
  }
  action.kind = mode == InFlightMode::kWait ? ActionKind::kWait : ActionKind::kRejectInFlight;
  action.retry_after = RetryAfter(r.lease_expires_ms, now);
  return action;
}

std::string_view ReleaseReasonName(ReleaseReason reason) {
  switch (reason) {
    case ReleaseReason::kNone: return "";
    case ReleaseReason::kServerError: return "server_error";
    case ReleaseReason::kRetryableStatus: return "retryable_status";
    case ReleaseReason::kUpstreamConnect: return "upstream_connect";
    case ReleaseReason::kUpstreamTimeout: return "upstream_timeout";
    case ReleaseReason::kClientGone: return "client_gone";
    case ReleaseReason::kShutdown: return "shutdown";
    case ReleaseReason::kAdmission: return "admission";
    case ReleaseReason::kResponseError: return "response_error";
  }
  return "unknown";
}

Classification ClassifyResponse(int status, bool store_server_errors, bool terminal_header_present) {
  const auto store = Classification{Disposition::kStore, ReleaseReason::kNone};
  if (terminal_header_present) return store;
  if (status >= 200 && status <= 399) return store;
  if (status >= 400 && status <= 499) {
    if (status == 408 || status == 409 || status == 425 || status == 429) {
      return {Disposition::kRelease, ReleaseReason::kRetryableStatus};
    }
    return store;
  }
  if (status >= 500 && status <= 599) {
    if (store_server_errors) return store;
    return {Disposition::kRelease, ReleaseReason::kServerError};
  }
  // 1xx as a final status, or nonsense: never worth replaying.
  return {Disposition::kRelease, ReleaseReason::kResponseError};
}

TransportDisposition ClassifyTransport(TransportOutcome outcome) {
  switch (outcome) {
    case TransportOutcome::kConnectFailed:
      return {false, ReleaseReason::kUpstreamConnect, 502};
    case TransportOutcome::kTimedOut:
      return {false, ReleaseReason::kUpstreamTimeout, 504};
    case TransportOutcome::kClientGone:
      return {true, ReleaseReason::kNone, 0};
    case TransportOutcome::kShutdown:
      return {false, ReleaseReason::kShutdown, 503};
  }
  return {false, ReleaseReason::kResponseError, 502};
}

bool IsHopByHopHeader(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "connection", "keep-alive", "proxy-connection",    "transfer-encoding", "te",
      "trailer",    "upgrade",    "proxy-authenticate", "proxy-authorization", "content-length",
  };
  for (std::string_view n : kNames) {
    if (HeaderNameEquals(name, n)) return true;
  }
  return false;
}

StoredResponse BuildReplay(const Record& record, std::string_view replay_header_name,
                           UnixMillis now) {
  const StoredResponse& original = record.response;
  // Fields the original named in Connection are hop-by-hop too (RFC 9110 §7.6.1).
  std::vector<std::string_view> connection_named;
  for (const Header& h : original.headers) {
    if (!HeaderNameEquals(h.name, "connection")) continue;
    std::string_view rest = h.value;
    while (!rest.empty()) {
      const std::size_t comma = rest.find(',');
      const std::string_view token = Trim(rest.substr(0, comma));
      if (!token.empty()) connection_named.push_back(token);
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  const bool set_operation_id = !record.operation_id.empty();

  StoredResponse out;
  out.status = original.status;
  out.headers.reserve(original.headers.size() + 4);
  bool dated = false;
  bool operation_id_set = false;
  for (const Header& h : original.headers) {
    // A record's Content-Length stays where the original had it: the writer
    // frames the body there (and answers HEAD with the length a GET would get).
    if ((IsHopByHopHeader(h.name) && !HeaderNameEquals(h.name, "content-length")) ||
        HeaderNameEquals(h.name, replay_header_name)) {
      continue;
    }
    if (HeaderNameEquals(h.name, "date")) {
      // Refreshed in place; one Date however many the original had.
      if (!dated) out.headers.push_back({h.name, FormatHttpDate(now)});
      dated = true;
      continue;
    }
    if (set_operation_id && HeaderNameEquals(h.name, kOperationIdHeader)) {
      if (!operation_id_set) out.headers.push_back({h.name, record.operation_id});
      operation_id_set = true;
      continue;
    }
    if (original.body_omitted && HeaderNameEquals(h.name, kReplayOmittedHeader)) continue;
    bool named = false;
    for (std::string_view n : connection_named) named = named || HeaderNameEquals(h.name, n);
    if (named) continue;
    // The replay of an omitted body is empty, to HEAD too.
    if (original.body_omitted && HeaderNameEquals(h.name, "content-length")) {
      out.headers.push_back({h.name, "0"});
      continue;
    }
    out.headers.push_back(h);
  }
  if (!dated) out.headers.push_back({"Date", FormatHttpDate(now)});
  if (set_operation_id && !operation_id_set) {
    out.headers.push_back({std::string(kOperationIdHeader), record.operation_id});
  }
  out.headers.push_back({std::string(replay_header_name), "true"});
  if (original.body_omitted) {
    out.headers.push_back({std::string(kReplayOmittedHeader), "omitted"});
  } else {
    out.body = original.body;
  }
  return out;
}

std::string FormatHttpDate(UnixMillis t) {
  static constexpr const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  using std::chrono::days;
  using std::chrono::seconds;
  const seconds whole = std::chrono::floor<seconds>(std::chrono::milliseconds(t));
  // Replays within the same second share the text (one per thread).
  struct Last {
    seconds at{std::numeric_limits<seconds::rep>::min()};
    std::string text;
  };
  thread_local Last last;
  if (whole == last.at) return last.text;

  // Civil date by calendar arithmetic (no gmtime_r, which takes glibc's
  // time zone lock).
  const std::chrono::sys_days day = std::chrono::floor<days>(std::chrono::sys_seconds(whole));
  const std::chrono::year_month_day ymd(day);
  const std::chrono::hh_mm_ss<seconds> time(whole - day.time_since_epoch());
  auto two = [](std::string* out, long v) {
    out->push_back(static_cast<char>('0' + v / 10 % 10));
    out->push_back(static_cast<char>('0' + v % 10));
  };
  std::string out;
  out.reserve(29);
  out.append(kDays[std::chrono::weekday(day).c_encoding()]);
  out.append(", ");
  two(&out, static_cast<unsigned>(ymd.day()));
  out.push_back(' ');
  out.append(kMonths[static_cast<unsigned>(ymd.month()) - 1]);
  out.push_back(' ');
  const int year = static_cast<int>(ymd.year());
  two(&out, year / 100);
  two(&out, year % 100);
  out.push_back(' ');
  two(&out, time.hours().count());
  out.push_back(':');
  two(&out, time.minutes().count());
  out.push_back(':');
  two(&out, time.seconds().count());
  out.append(" GMT");
  last.at = whole;
  last.text = out;
  return out;
}

}  // namespace idemgate::core
