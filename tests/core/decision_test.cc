#include "core/decision.h"

#include <gtest/gtest.h>

#include <ctime>
#include <random>
#include <string>
#include <vector>

namespace idemgate::core {
namespace {

using std::chrono::seconds;

constexpr UnixMillis kNow = 1'700'000'000'000;
const std::string kFp(32, 'a');
const std::string kOtherFp(32, 'b');

Record InFlight(std::string fp, UnixMillis lease_expires) {
  Record r;
  r.state = RecordState::kInFlight;
  r.fingerprint = std::move(fp);
  r.owner = "owner";
  r.operation_id = "op_1";
  r.created_ms = kNow - 1000;
  r.lease_expires_ms = lease_expires;
  return r;
}

Record Completed(std::string fp, UnixMillis expires) {
  Record r;
  r.state = RecordState::kCompleted;
  r.fingerprint = std::move(fp);
  r.owner = "owner";
  r.operation_id = "op_1";
  r.created_ms = kNow - 1000;
  r.expires_ms = expires;
  r.response.status = 201;
  return r;
}

const InFlightMode kModes[] = {InFlightMode::kReject, InFlightMode::kWait};

// §4.2, row "none".
TEST(DecideTest, NoneReserves) {
  for (InFlightMode mode : kModes) {
    EXPECT_EQ(Decide(std::nullopt, kFp, kNow, mode).kind, ActionKind::kReserve);
  }
}

// §4.2, row "completed", both columns.
TEST(DecideTest, CompletedSameFingerprintReplays) {
  for (InFlightMode mode : kModes) {
    EXPECT_EQ(Decide(Completed(kFp, kNow + 1), kFp, kNow, mode).kind, ActionKind::kReplay);
    EXPECT_EQ(Decide(Completed(kFp, 0), kFp, kNow, mode).kind, ActionKind::kReplay);
  }
}

TEST(DecideTest, CompletedOtherFingerprintIsKeyReused) {
  for (InFlightMode mode : kModes) {
    const Action a = Decide(Completed(kFp, kNow + 1), kOtherFp, kNow, mode);
    EXPECT_EQ(a.kind, ActionKind::kKeyReused);
    EXPECT_FALSE(a.conflict_in_flight);
  }
}

// Retention: a completed record past expires_ms is a new key.
TEST(DecideTest, CompletedPastRetentionIsNone) {
  for (InFlightMode mode : kModes) {
    EXPECT_EQ(Decide(Completed(kFp, kNow), kFp, kNow, mode).kind, ActionKind::kReserve);
    EXPECT_EQ(Decide(Completed(kFp, kNow - 1), kOtherFp, kNow, mode).kind, ActionKind::kReserve);
  }
}

// §4.2, row "in flight, lease valid", same fingerprint, both modes.
TEST(DecideTest, InFlightValidLeaseRejectAnswersRetryAfter) {
  const Action a = Decide(InFlight(kFp, kNow + 4'200), kFp, kNow, InFlightMode::kReject);
  EXPECT_EQ(a.kind, ActionKind::kRejectInFlight);
  EXPECT_EQ(a.retry_after, seconds(5));
}

TEST(DecideTest, InFlightValidLeaseWaitAttaches) {
  const Action a = Decide(InFlight(kFp, kNow + 30'000), kFp, kNow, InFlightMode::kWait);
  EXPECT_EQ(a.kind, ActionKind::kWait);
  EXPECT_EQ(a.retry_after, seconds(30));
}

TEST(DecideTest, RetryAfterIsAtLeastOneSecond) {
  EXPECT_EQ(Decide(InFlight(kFp, kNow + 1), kFp, kNow, InFlightMode::kReject).retry_after,
            seconds(1));
  EXPECT_EQ(RetryAfter(kNow + 1000, kNow), seconds(1));
  EXPECT_EQ(RetryAfter(kNow + 1001, kNow), seconds(2));
  EXPECT_EQ(RetryAfter(kNow - 5000, kNow), seconds(1));
}

// §4.2, row "in flight, lease valid", other fingerprint.
TEST(DecideTest, InFlightValidLeaseOtherFingerprintIsKeyReused) {
  for (InFlightMode mode : kModes) {
    const Action a = Decide(InFlight(kFp, kNow + 5000), kOtherFp, kNow, mode);
    EXPECT_EQ(a.kind, ActionKind::kKeyReused);
    EXPECT_TRUE(a.conflict_in_flight);
  }
}

// §4.2, row "in flight, lease expired".
TEST(DecideTest, InFlightExpiredLeaseSameFingerprintTakesOver) {
  for (InFlightMode mode : kModes) {
    EXPECT_EQ(Decide(InFlight(kFp, kNow), kFp, kNow, mode).kind, ActionKind::kTakeOver);
    EXPECT_EQ(Decide(InFlight(kFp, kNow - 1), kFp, kNow, mode).kind, ActionKind::kTakeOver);
  }
}

TEST(DecideTest, InFlightExpiredLeaseOtherFingerprintIsKeyReused) {
  for (InFlightMode mode : kModes) {
    const Action a = Decide(InFlight(kFp, kNow - 1), kOtherFp, kNow, mode);
    EXPECT_EQ(a.kind, ActionKind::kKeyReused);
    EXPECT_TRUE(a.conflict_in_flight);
  }
}

TEST(DecideTest, LeaseBoundaryIsExclusive) {
  // One millisecond before the end the lease still holds.
  EXPECT_EQ(Decide(InFlight(kFp, kNow + 1), kFp, kNow, InFlightMode::kReject).kind,
            ActionKind::kRejectInFlight);
}

TEST(DecideTest, ActionNames) {
  EXPECT_EQ(ActionKindName(ActionKind::kReserve), "reserve");
  EXPECT_EQ(ActionKindName(ActionKind::kReplay), "replay");
  EXPECT_EQ(ActionKindName(ActionKind::kKeyReused), "key_reused");
  EXPECT_EQ(ActionKindName(ActionKind::kRejectInFlight), "request_in_flight");
  EXPECT_EQ(ActionKindName(ActionKind::kWait), "wait");
  EXPECT_EQ(ActionKindName(ActionKind::kTakeOver), "take_over");
}

// ---------------------------------------------------------------------------
// §4.3

struct ClassifyCase {
  int status;
  Disposition plain;                // store_server_errors false, no terminal header
  Disposition with_server_errors;   // store_server_errors true
  ReleaseReason reason;             // of `plain` when it releases
};

TEST(ClassifyResponseTest, EveryRowOfTheTable) {
  const auto S = Disposition::kStore;
  const auto R = Disposition::kRelease;
  const ClassifyCase cases[] = {
      {200, S, S, ReleaseReason::kNone},
      {201, S, S, ReleaseReason::kNone},
      {204, S, S, ReleaseReason::kNone},
      {301, S, S, ReleaseReason::kNone},
      {304, S, S, ReleaseReason::kNone},
      {400, S, S, ReleaseReason::kNone},
      {404, S, S, ReleaseReason::kNone},
      {408, R, R, ReleaseReason::kRetryableStatus},
      {409, R, R, ReleaseReason::kRetryableStatus},
      {422, S, S, ReleaseReason::kNone},
      {425, R, R, ReleaseReason::kRetryableStatus},
      {429, R, R, ReleaseReason::kRetryableStatus},
      {500, R, S, ReleaseReason::kServerError},
      {502, R, S, ReleaseReason::kServerError},
      {503, R, S, ReleaseReason::kServerError},
      {504, R, S, ReleaseReason::kServerError},
  };
  for (const ClassifyCase& c : cases) {
    SCOPED_TRACE(c.status);
    const Classification plain = ClassifyResponse(c.status, false, false);
    EXPECT_EQ(plain.disposition, c.plain);
    EXPECT_EQ(plain.reason, c.reason);
    const Classification sse = ClassifyResponse(c.status, true, false);
    EXPECT_EQ(sse.disposition, c.with_server_errors);
    if (sse.disposition == Disposition::kStore) {
      EXPECT_EQ(sse.reason, ReleaseReason::kNone);
    }
    // The terminal header makes anything final, with or without the option.
    for (bool store_server_errors : {false, true}) {
      const Classification terminal = ClassifyResponse(c.status, store_server_errors, true);
      EXPECT_EQ(terminal.disposition, Disposition::kStore);
      EXPECT_EQ(terminal.reason, ReleaseReason::kNone);
    }
  }
}

TEST(ClassifyResponseTest, InformationalAndNonsenseStatusesRelease) {
  EXPECT_EQ(ClassifyResponse(101, true, false).disposition, Disposition::kRelease);
  EXPECT_EQ(ClassifyResponse(0, false, false).disposition, Disposition::kRelease);
  EXPECT_EQ(ClassifyResponse(600, true, false).disposition, Disposition::kRelease);
}

TEST(ClassifyTransportTest, Outcomes) {
  const TransportDisposition connect = ClassifyTransport(TransportOutcome::kConnectFailed);
  EXPECT_FALSE(connect.finish_upstream);
  EXPECT_EQ(connect.reason, ReleaseReason::kUpstreamConnect);
  EXPECT_EQ(connect.status, 502);

  const TransportDisposition timeout = ClassifyTransport(TransportOutcome::kTimedOut);
  EXPECT_FALSE(timeout.finish_upstream);
  EXPECT_EQ(timeout.reason, ReleaseReason::kUpstreamTimeout);
  EXPECT_EQ(timeout.status, 504);

  // The upstream call is still finished and its response classified.
  const TransportDisposition gone = ClassifyTransport(TransportOutcome::kClientGone);
  EXPECT_TRUE(gone.finish_upstream);
  EXPECT_EQ(gone.reason, ReleaseReason::kNone);

  const TransportDisposition shutdown = ClassifyTransport(TransportOutcome::kShutdown);
  EXPECT_FALSE(shutdown.finish_upstream);
  EXPECT_EQ(shutdown.reason, ReleaseReason::kShutdown);
  EXPECT_EQ(shutdown.status, 503);
}

TEST(ClassifyTransportTest, ReasonNamesAreDistinct) {
  const ReleaseReason all[] = {
      ReleaseReason::kServerError,     ReleaseReason::kRetryableStatus, ReleaseReason::kUpstreamConnect,
      ReleaseReason::kUpstreamTimeout, ReleaseReason::kClientGone,      ReleaseReason::kShutdown,
      ReleaseReason::kAdmission,       ReleaseReason::kResponseError};
  std::vector<std::string_view> seen;
  for (ReleaseReason r : all) {
    const std::string_view name = ReleaseReasonName(r);
    EXPECT_FALSE(name.empty());
    for (std::string_view s : seen) EXPECT_NE(s, name);
    seen.push_back(name);
  }
}

// ---------------------------------------------------------------------------
// §4.4

Record Original() {
  Record r = Completed(kFp, 0);
  r.operation_id = "op_01HZX";
  r.response.status = 201;
  r.response.headers = {
      {"Content-Type", "application/json"},
      {"Set-Cookie", "a=1; Path=/"},
      {"Date", "Mon, 01 Jan 2024 00:00:00 GMT"},
      {"Connection", "keep-alive, X-Hop"},
      {"X-Hop", "secret"},
      {"Keep-Alive", "timeout=5"},
      {"Transfer-Encoding", "chunked"},
      {"Content-Length", "11"},
      {"Set-Cookie", "b=2; Path=/"},
      {"X-Operation-Id", "op_01HZX"},
      {"Location", "/v1/payments/7"},
      {"Set-Cookie", "c=3"},
  };
  r.response.body = R"({"id":"7"})";
  return r;
}

std::vector<std::string> Values(const StoredResponse& r, std::string_view name) {
  std::vector<std::string> out;
  for (const Header& h : r.headers) {
    if (HeaderNameEquals(h.name, name)) out.push_back(h.value);
  }
  return out;
}

TEST(BuildReplayTest, SameStatusHeadersAndBody) {
  const StoredResponse r = BuildReplay(Original(), "Idempotent-Replayed", kNow);
  EXPECT_EQ(r.status, 201);
  EXPECT_EQ(r.body, R"({"id":"7"})");
  EXPECT_FALSE(r.body_omitted);
  EXPECT_EQ(Values(r, "content-type"), std::vector<std::string>{"application/json"});
  EXPECT_EQ(Values(r, "location"), std::vector<std::string>{"/v1/payments/7"});
}

TEST(BuildReplayTest, RepeatedSetCookieKeptInOrder) {
  const StoredResponse r = BuildReplay(Original(), "Idempotent-Replayed", kNow);
  EXPECT_EQ(Values(r, "Set-Cookie"),
            (std::vector<std::string>{"a=1; Path=/", "b=2; Path=/", "c=3"}));
}

TEST(BuildReplayTest, HopByHopRemoved) {
  const StoredResponse r = BuildReplay(Original(), "Idempotent-Replayed", kNow);
  for (std::string_view name : {"connection", "keep-alive", "transfer-encoding", "x-hop"}) {
    EXPECT_TRUE(Values(r, name).empty()) << name;
  }
  // A record's Content-Length (the original's; a HEAD response's is the
  // length a GET would get) is kept in place for the server, which writes its
  // own there.
  EXPECT_EQ(Values(r, "content-length"), std::vector<std::string>{"11"});
  EXPECT_TRUE(IsHopByHopHeader("Proxy-Authenticate"));
  EXPECT_TRUE(IsHopByHopHeader("TE"));
  EXPECT_TRUE(IsHopByHopHeader("Upgrade"));
  EXPECT_TRUE(IsHopByHopHeader("Trailer"));
  EXPECT_FALSE(IsHopByHopHeader("Set-Cookie"));
}

TEST(BuildReplayTest, DateRefreshed) {
  const StoredResponse r = BuildReplay(Original(), "Idempotent-Replayed", kNow);
  EXPECT_EQ(Values(r, "date"), std::vector<std::string>{FormatHttpDate(kNow)});
  EXPECT_EQ(FormatHttpDate(kNow), "Tue, 14 Nov 2023 22:13:20 GMT");
}

std::vector<std::string> Names(const StoredResponse& r) {
  std::vector<std::string> out;
  for (const Header& h : r.headers) out.push_back(h.name);
  return out;
}

// A replay keeps the original's order: Date and X-Operation-Id are
// refreshed where the original had them, Content-Length stays in place for
// the writer to frame the body there, and only the replay header is added.
TEST(BuildReplayTest, HeaderOrderIsTheOriginals) {
  Record rec = Completed(kFp, 0);
  rec.operation_id = "op_2";
  rec.response.status = 200;
  rec.response.headers = {
      {"Server", "up"},  {"date", "Mon, 01 Jan 2024 00:00:00 GMT"}, {"Set-Cookie", "a=1"}, {"x-MiXed", "v"},
      {"X-Empty", ""},   {"Set-Cookie", "b=2"}, {"Content-Length", "2"}, {"X-Operation-Id", "op_2"},
  };
  rec.response.body = "{}";
  const StoredResponse r = BuildReplay(rec, kDefaultReplayHeader, kNow);
  EXPECT_EQ(Names(r), (std::vector<std::string>{"Server", "date", "Set-Cookie", "x-MiXed", "X-Empty", "Set-Cookie",
                                                "Content-Length", "X-Operation-Id", "Idempotent-Replayed"}));
  EXPECT_EQ(r.headers[1].value, FormatHttpDate(kNow));
  EXPECT_EQ(r.headers[7].value, "op_2");

  // A record without Content-Length (the original was chunked, or an older
  // version stored it) keeps its Date in place; the writer frames the body
  // after the other fields.
  rec.response.headers = {{"Server", "up"}, {"Date", "x"}, {"Set-Cookie", "a=1"}, {"X-Operation-Id", "op_2"}};
  EXPECT_EQ(Names(BuildReplay(rec, kDefaultReplayHeader, kNow)),
            (std::vector<std::string>{"Server", "Date", "Set-Cookie", "X-Operation-Id", "Idempotent-Replayed"}));
  // One without Date or X-Operation-Id gets them after its fields.
  rec.response.headers = {{"Server", "up"}, {"Set-Cookie", "a=1"}};
  EXPECT_EQ(Names(BuildReplay(rec, kDefaultReplayHeader, kNow)),
            (std::vector<std::string>{"Server", "Set-Cookie", "Date", "X-Operation-Id", "Idempotent-Replayed"}));
}

TEST(BuildReplayTest, ReplayHeaderAddedWithConfiguredName) {
  const StoredResponse r = BuildReplay(Original(), "X-Replayed", kNow);
  EXPECT_EQ(Values(r, "x-replayed"), std::vector<std::string>{"true"});
  EXPECT_TRUE(Values(r, "idempotent-replayed").empty());
  const StoredResponse d = BuildReplay(Original(), kDefaultReplayHeader, kNow);
  EXPECT_EQ(Values(d, "Idempotent-Replayed"), std::vector<std::string>{"true"});
}

TEST(BuildReplayTest, StoredReplayHeaderNeverLeaksThrough) {
  // Whatever a stored response carried under the replay header's name (say an
  // upstream echoed a client's "false"), the replay says exactly "true" once.
  Record rec = Original();
  rec.response.headers.push_back({"idempotent-replayed", "false"});
  const StoredResponse r = BuildReplay(rec, "Idempotent-Replayed", kNow);
  EXPECT_EQ(Values(r, "Idempotent-Replayed"), std::vector<std::string>{"true"});
}

TEST(BuildReplayTest, KeepsTheOriginalOperationId) {
  const StoredResponse r = BuildReplay(Original(), "Idempotent-Replayed", kNow);
  EXPECT_EQ(Values(r, "x-operation-id"), std::vector<std::string>{"op_01HZX"});
  Record no_header = Original();
  no_header.response.headers.clear();
  EXPECT_EQ(Values(BuildReplay(no_header, "Idempotent-Replayed", kNow), "X-Operation-Id"),
            std::vector<std::string>{"op_01HZX"});
}

TEST(BuildReplayTest, OmittedBodyReplaysEmptyWithMarker) {
  Record rec = Original();
  rec.response.body.clear();
  rec.response.body_omitted = true;
  const StoredResponse r = BuildReplay(rec, "Idempotent-Replayed", kNow);
  EXPECT_EQ(r.status, 201);
  EXPECT_TRUE(r.body.empty());
  EXPECT_EQ(Values(r, "Idempotency-Replay"), std::vector<std::string>{"omitted"});
  EXPECT_EQ(Values(r, "Idempotent-Replayed"), std::vector<std::string>{"true"});
  // The original's length, kept in place, is the empty body's (a HEAD
  // answered from the record gets the same).
  EXPECT_EQ(Values(r, "Content-Length"), std::vector<std::string>{"0"});
  EXPECT_TRUE(Values(BuildReplay(Original(), "Idempotent-Replayed", kNow), "Idempotency-Replay")
                  .empty());
}

TEST(FormatHttpDateTest, KnownDates) {
  EXPECT_EQ(FormatHttpDate(784111777000), "Sun, 06 Nov 1994 08:49:37 GMT");
  EXPECT_EQ(FormatHttpDate(784111777999), "Sun, 06 Nov 1994 08:49:37 GMT");
  EXPECT_EQ(FormatHttpDate(0), "Thu, 01 Jan 1970 00:00:00 GMT");
  EXPECT_EQ(FormatHttpDate(951782400000), "Tue, 29 Feb 2000 00:00:00 GMT");
  EXPECT_EQ(FormatHttpDate(-1), "Wed, 31 Dec 1969 23:59:59 GMT");
  EXPECT_EQ(FormatHttpDate(4102444800000), "Fri, 01 Jan 2100 00:00:00 GMT");
}

// The text of the last second is kept per thread: a different second, and
// then the first again, must each get their own text.
TEST(FormatHttpDateTest, EachSecondGetsItsOwnText) {
  EXPECT_EQ(FormatHttpDate(784111777000), "Sun, 06 Nov 1994 08:49:37 GMT");
  EXPECT_EQ(FormatHttpDate(784111778000), "Sun, 06 Nov 1994 08:49:38 GMT");
  EXPECT_EQ(FormatHttpDate(784111777500), "Sun, 06 Nov 1994 08:49:37 GMT");
  EXPECT_EQ(FormatHttpDate(784111777500 - 86400000), "Sat, 05 Nov 1994 08:49:37 GMT");
}

// Calendar arithmetic against the C library's gmtime_r over 1970-2200.
TEST(FormatHttpDateTest, MatchesGmtime) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    const std::time_t seconds = static_cast<std::time_t>(rng() % 7258118400ULL);
    std::tm tm{};
    gmtime_r(&seconds, &tm);
    char want[64];
    std::strftime(want, sizeof want, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    ASSERT_EQ(FormatHttpDate(static_cast<UnixMillis>(seconds) * 1000 + static_cast<UnixMillis>(rng() % 1000)), want)
        << seconds;
  }
}

}  // namespace
}  // namespace idemgate::core
