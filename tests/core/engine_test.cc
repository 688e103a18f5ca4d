#include "core/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/decision.h"
#include "engine_test_util.h"
#include "store/memory/memory_store.h"

namespace idemgate::core {
namespace {

using namespace std::chrono_literals;
using testing::PollUntil;
using testing::RunTask;
using testing::Spawn;

const std::string kKey = "t-_:_:_:payments:k1";
const std::string kFp(32, 'a');
const std::string kOtherFp(32, 'b');

StoredResponse Response(int status, std::string body) {
  StoredResponse r;
  r.status = status;
  r.headers = {{"Content-Type", "application/json"}, {"Set-Cookie", "s=1"}};
  r.body = std::move(body);
  return r;
}

class EngineTest : public ::testing::Test {
 protected:
  KeyedRequest Request(std::string fp = kFp, InFlightMode mode = InFlightMode::kReject) {
    KeyedRequest r;
    r.key = kKey;
    r.fingerprint = std::move(fp);
    r.lease = 30s;
    r.in_flight = mode;
    r.wait_timeout = 30s;
    return r;
  }

  BeginResult Begin(KeyedRequest r) { return RunTask(ctx_, engine_.Begin(std::move(r))); }
  Status Complete(const Reservation& res, StoredResponse resp, Duration retention = 24h) {
    return RunTask(ctx_, engine_.Complete(res, std::move(resp), retention));
  }
  std::optional<Record> Get(const std::string& key) {
    auto r = store_.GetNow(key, clock_.NowMillis());
    EXPECT_TRUE(r.ok());
    return r.ok() ? *r : std::nullopt;
  }

  FakeClock clock_;
  store::memory::MemoryStore store_{64 << 20, clock_};
  Engine engine_{store_, clock_};
  boost::asio::io_context ctx_;
};

// kKey with kFp under a lease of `lease`, in reject mode (the tests of an
// engine of their own, on stores that fail on purpose).
KeyedRequest LeasedRequest(Duration lease) {
  KeyedRequest r;
  r.key = kKey;
  r.fingerprint = kFp;
  r.lease = lease;
  r.wait_timeout = 1s;
  return r;
}

// A memory store seen through the Store interface, every call passed on;
// the fakes below change only what their test needs.
class ForwardingStore : public Store {
 public:
  ForwardingStore(store::memory::MemoryStore& inner, bool failed_writes_may_land)
      : inner_(inner), failed_writes_may_land_(failed_writes_may_land) {}
  Task<StatusOr<ReserveResult>> Reserve(std::string key, Record reservation, UnixMillis now) override {
    co_return co_await inner_.Reserve(std::move(key), std::move(reservation), now);
  }
  Task<Status> Complete(std::string key, std::string owner, Record completed) override {
    co_return co_await inner_.Complete(std::move(key), std::move(owner), std::move(completed));
  }
  Task<Status> Release(std::string key, std::string owner) override {
    co_return co_await inner_.Release(std::move(key), std::move(owner));
  }
  Task<StatusOr<std::optional<Record>>> Get(std::string key, UnixMillis now) override {
    co_return co_await inner_.Get(std::move(key), now);
  }
  Task<StatusOr<PurgeResult>> Purge(std::string key, PurgeMode mode, UnixMillis now) override {
    co_return co_await inner_.Purge(std::move(key), mode, now);
  }
  Task<StatusOr<std::unique_ptr<Watch>>> WatchKey(std::string key) override {
    co_return co_await inner_.WatchKey(std::move(key));
  }
  Task<Status> Ping() override { co_return Status::Ok(); }
  StoreStats Stats() const override { return inner_.Stats(); }
  bool FailedWritesMayLand() const override { return failed_writes_may_land_; }

 protected:
  store::memory::MemoryStore& inner_;

 private:
  bool failed_writes_may_land_;
};

// A store whose Reserve reports a failure after the reservation was written
// (a stalled Redis runs a timed-out script once it resumes).
class LateLandingStore final : public ForwardingStore {
 public:
  LateLandingStore(store::memory::MemoryStore& inner, bool may_land) : ForwardingStore(inner, may_land) {}
  Task<StatusOr<ReserveResult>> Reserve(std::string key, Record reservation, UnixMillis now) override {
    (void)co_await inner_.Reserve(std::move(key), std::move(reservation), now);
    co_return UnavailableError("timed out");
  }
  Task<Status> Release(std::string key, std::string owner) override {
    ++releases;
    co_return co_await inner_.Release(std::move(key), std::move(owner));
  }

  int releases = 0;
};

// A reserve that failed but landed would hold the key, for nothing, until
// its lease ends: on a store whose failed writes may land, the engine
// releases it under the request's own owner token. RunTask runs the
// cleanup to its end (at most the 2 s lease).
TEST(EngineOrphanTest, AFailedReserveThatLandsIsReleased) {
  for (const bool may_land : {true, false}) {
    SCOPED_TRACE(may_land);
    FakeClock clock;
    store::memory::MemoryStore memory{64 << 20, clock};
    LateLandingStore store(memory, may_land);
    Engine engine{store, clock};
    boost::asio::io_context ctx;
    const BeginResult begun = RunTask(ctx, engine.Begin(LeasedRequest(2s)));
    EXPECT_EQ(begun.outcome, BeginOutcome::kStoreError);
    auto held = memory.GetNow(kKey, clock.NowMillis());
    ASSERT_TRUE(held.ok());
    EXPECT_EQ(held->has_value(), !may_land);
    EXPECT_EQ(store.releases > 0, may_land);
  }
}

// A store whose first Complete fails: after writing it (a stalled Redis
// that ran a timed-out script once it resumed) or after the reservation was
// lost (a Redis restarted empty). Later calls pass through.
class FailingCompleteStore final : public ForwardingStore {
 public:
  FailingCompleteStore(store::memory::MemoryStore& inner, bool lands) : ForwardingStore(inner, true), lands_(lands) {}
  Task<Status> Complete(std::string key, std::string owner, Record completed) override {
    if (completes_++ > 0) co_return co_await inner_.Complete(std::move(key), std::move(owner), std::move(completed));
    if (lands_) {
      (void)co_await inner_.Complete(std::move(key), std::move(owner), std::move(completed));
    } else {
      (void)inner_.PurgeNow(key);
    }
    co_return UnavailableError("timed out");
  }

 private:
  bool lands_;
  int completes_ = 0;
};

// A completion tried again in the background that finds the reservation
// gone tells the caller so (who counts it as lease_lost); one that finds its
// own earlier attempt landed tells it the response was stored (counted in
// idempotency_stored_total).
TEST(EngineLaterCompletionTest, AReservationLostMeanwhileIsReportedAndALateLandingIsNot) {
  for (const bool lands : {true, false}) {
    SCOPED_TRACE(lands ? "landed late" : "lost");
    FakeClock clock;
    store::memory::MemoryStore memory{64 << 20, clock};
    FailingCompleteStore store(memory, lands);
    Engine engine{store, clock};
    boost::asio::io_context ctx;
    const BeginResult begun = RunTask(ctx, engine.Begin(LeasedRequest(5s)));
    ASSERT_EQ(begun.outcome, BeginOutcome::kProceed);
    std::vector<Engine::LaterOutcome> told;
    auto make = [](void* arg) -> Engine::Later {
      return [told = static_cast<std::vector<Engine::LaterOutcome>*>(arg)](Engine::LaterOutcome o) {
        told->push_back(o);
      };
    };
    const Status first = RunTask(ctx, engine.Complete(begun.reservation, Response(201, "made"), 1h, make, &told));
    EXPECT_EQ(first.code(), StatusCode::kUnavailable);
    ctx.restart();
    ctx.run();  // the background attempts, to their end
    EXPECT_EQ(told, std::vector<Engine::LaterOutcome>{lands ? Engine::LaterOutcome::kStored : Engine::LaterOutcome::kLost});
  }
}

// A store that refuses every Complete until a moment of real time (a Redis
// out of memory until an operator raises maxmemory).
class RefusingUntilStore final : public ForwardingStore {
 public:
  // `may_land`: a refused write may still land (a Redis); else it is only
  // refused, and passes once the store is back (a full disk that frees).
  RefusingUntilStore(store::memory::MemoryStore& inner, std::chrono::steady_clock::time_point until,
                     bool may_land = true)
      : ForwardingStore(inner, may_land), until_(until) {}
  bool FailedWritesMayPass() const override { return true; }
  Task<Status> Complete(std::string key, std::string owner, Record completed) override {
    ++attempts;
    if (std::chrono::steady_clock::now() < until_) co_return UnavailableError("OOM command not allowed");
    co_return co_await inner_.Complete(std::move(key), std::move(owner), std::move(completed));
  }
  int attempts = 0;

 private:
  std::chrono::steady_clock::time_point until_;
};

// The background attempts double their delay, and the last one comes half a
// second before the lease ends even when the doubling would overshoot it:
// with a 1.6 s lease they come about 0.1, 0.3 and 0.7 s after the failure
// and then at 1.1 s, where stopping at the last doubled delay that fits
// (0.7 s) would leave the key to a takeover, and a second run, although the
// store took writes again at 0.9 s.
// Completes a reservation under `lease` on `store`, which refuses writes for
// a while, and runs the background attempts to their end: the response is
// then stored.
void ExpectStoredAfterRefusals(RefusingUntilStore& store, store::memory::MemoryStore& memory, SystemClock& clock,
                               Duration lease) {
  Engine engine{store, clock};
  boost::asio::io_context ctx;
  const BeginResult begun = RunTask(ctx, engine.Begin(LeasedRequest(lease)));
  ASSERT_EQ(begun.outcome, BeginOutcome::kProceed);
  const Status first = RunTask(ctx, engine.Complete(begun.reservation, Response(201, "made"), 1h));
  EXPECT_EQ(first.code(), StatusCode::kUnavailable);
  ctx.restart();
  ctx.run();  // the background attempts, to their end
  auto held = memory.GetNow(kKey, clock.NowMillis());
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(held->has_value());
  EXPECT_EQ((*held)->state, RecordState::kCompleted) << store.attempts << " attempts";
}

TEST(EngineLaterCompletionTest, TheLastAttemptComesHalfASecondBeforeTheLeaseEnds) {
  SystemClock clock;
  store::memory::MemoryStore memory{64 << 20, clock};
  RefusingUntilStore store(memory, std::chrono::steady_clock::now() + 900ms);
  ExpectStoredAfterRefusals(store, memory, clock, 1600ms);
}

// The same on a store whose refused writes never land but pass once it is
// back (the embedded store on a disk that was full): a retry after the
// lease would otherwise run the request again.
TEST(EngineLaterCompletionTest, AStoreWhoseRefusalsPassIsTriedAgainToo) {
  SystemClock clock;
  store::memory::MemoryStore memory{64 << 20, clock};
  RefusingUntilStore store(memory, std::chrono::steady_clock::now() + 300ms, /*may_land=*/false);
  ExpectStoredAfterRefusals(store, memory, clock, 1600ms);
}

TEST_F(EngineTest, FirstRequestProceeds) {
  const BeginResult r = Begin(Request());
  ASSERT_EQ(r.outcome, BeginOutcome::kProceed) << r.status.ToString();
  EXPECT_FALSE(r.taken_over);
  EXPECT_EQ(r.reservation.key, kKey);
  EXPECT_EQ(r.reservation.fingerprint, kFp);
  EXPECT_EQ(r.reservation.owner.size(), 32u);
  EXPECT_EQ(r.reservation.operation_id.size(), 29u);
  EXPECT_TRUE(r.reservation.operation_id.starts_with("op_"));
  const std::optional<Record> held = Get(kKey);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->state, RecordState::kInFlight);
  EXPECT_EQ(held->owner, r.reservation.owner);
  EXPECT_EQ(held->operation_id, r.reservation.operation_id);
  EXPECT_EQ(held->lease_expires_ms, clock_.NowMillis() + 30'000);
}

TEST_F(EngineTest, CompletedSameFingerprintReplaysWithSameOperationId) {
  const BeginResult first = Begin(Request());
  ASSERT_EQ(first.outcome, BeginOutcome::kProceed);
  ASSERT_TRUE(Complete(first.reservation, Response(201, "{\"id\":1}")).ok());

  const BeginResult again = Begin(Request());
  ASSERT_EQ(again.outcome, BeginOutcome::kReplay);
  ASSERT_TRUE(again.record.has_value());
  EXPECT_EQ(again.record->response, Response(201, "{\"id\":1}"));
  EXPECT_EQ(again.record->operation_id, first.reservation.operation_id);
  const StoredResponse replay = BuildReplay(*again.record, kDefaultReplayHeader, clock_.NowMillis());
  bool has_op = false;
  for (const Header& h : replay.headers) {
    if (h.name == kOperationIdHeader) has_op = h.value == first.reservation.operation_id;
  }
  EXPECT_TRUE(has_op);
}

TEST_F(EngineTest, CompletedOtherFingerprintIsKeyReusedAndUntouched) {
  const BeginResult first = Begin(Request());
  ASSERT_TRUE(Complete(first.reservation, Response(200, "ok")).ok());
  const std::optional<Record> before = Get(kKey);

  const BeginResult other = Begin(Request(kOtherFp));
  EXPECT_EQ(other.outcome, BeginOutcome::kKeyReused);
  EXPECT_FALSE(other.conflict_in_flight);
  EXPECT_EQ(Get(kKey), before);
}

TEST_F(EngineTest, InFlightRejectAnswers409WithRetryAfter) {
  const BeginResult first = Begin(Request());
  ASSERT_EQ(first.outcome, BeginOutcome::kProceed);
  clock_.Advance(10'500ms);
  const BeginResult second = Begin(Request());
  EXPECT_EQ(second.outcome, BeginOutcome::kInFlight);
  EXPECT_EQ(second.retry_after, 20s);  // 19.5 s left, rounded up
  EXPECT_FALSE(second.waited);
}

TEST_F(EngineTest, InFlightOtherFingerprintIsKeyReused) {
  ASSERT_EQ(Begin(Request()).outcome, BeginOutcome::kProceed);
  for (InFlightMode mode : {InFlightMode::kReject, InFlightMode::kWait}) {
    const BeginResult other = Begin(Request(kOtherFp, mode));
    EXPECT_EQ(other.outcome, BeginOutcome::kKeyReused);
    EXPECT_TRUE(other.conflict_in_flight);
  }
}

TEST_F(EngineTest, WaitersAllGetTheLandedResponse) {
  const BeginResult owner = Begin(Request());
  ASSERT_EQ(owner.outcome, BeginOutcome::kProceed);

  constexpr int kWaiters = 5;
  std::vector<std::optional<BeginResult>> results(kWaiters);
  for (auto& out : results) Spawn(ctx_, engine_.Begin(Request(kFp, InFlightMode::kWait)), &out);
  ASSERT_TRUE(PollUntil(ctx_, [&] { return store_.watchers() == kWaiters; }));
  for (const auto& r : results) EXPECT_FALSE(r.has_value());

  std::optional<Status> completed;
  Spawn(ctx_, engine_.Complete(owner.reservation, Response(201, "landed"), 24h), &completed);
  ASSERT_TRUE(PollUntil(ctx_, [&] {
    for (const auto& r : results) {
      if (!r.has_value()) return false;
    }
    return completed.has_value();
  }));
  ASSERT_TRUE(completed->ok());
  for (const auto& r : results) {
    ASSERT_EQ(r->outcome, BeginOutcome::kReplay);
    EXPECT_TRUE(r->waited);
    EXPECT_EQ(r->record->response.body, "landed");
    EXPECT_EQ(r->record->operation_id, owner.reservation.operation_id);
  }
  EXPECT_EQ(store_.watchers(), 0u);
}

TEST_F(EngineTest, WaitTimesOutWith409) {
  ASSERT_EQ(Begin(Request()).outcome, BeginOutcome::kProceed);
  KeyedRequest waiting = Request(kFp, InFlightMode::kWait);
  waiting.wait_timeout = 30ms;
  const BeginResult r = Begin(waiting);
  EXPECT_EQ(r.outcome, BeginOutcome::kInFlight);
  EXPECT_TRUE(r.waited);
  EXPECT_GE(r.retry_after, 1s);
  EXPECT_EQ(store_.watchers(), 0u);
}

TEST_F(EngineTest, ZeroWaitTimeoutAnswers409AtOnce) {
  ASSERT_EQ(Begin(Request()).outcome, BeginOutcome::kProceed);
  KeyedRequest waiting = Request(kFp, InFlightMode::kWait);
  waiting.wait_timeout = 0ms;
  EXPECT_EQ(Begin(waiting).outcome, BeginOutcome::kInFlight);
}

TEST_F(EngineTest, WaiterProceedsWhenTheOwnerReleases) {
  const BeginResult owner = Begin(Request());
  std::optional<BeginResult> waiter;
  Spawn(ctx_, engine_.Begin(Request(kFp, InFlightMode::kWait)), &waiter);
  ASSERT_TRUE(PollUntil(ctx_, [&] { return store_.watchers() == 1; }));

  std::optional<Status> released;
  Spawn(ctx_, engine_.Release(owner.reservation), &released);
  ASSERT_TRUE(PollUntil(ctx_, [&] { return waiter.has_value() && released.has_value(); }));
  ASSERT_TRUE(released->ok());
  ASSERT_EQ(waiter->outcome, BeginOutcome::kProceed);
  EXPECT_TRUE(waiter->waited);
  EXPECT_NE(waiter->reservation.owner, owner.reservation.owner);
  EXPECT_EQ(Get(kKey)->owner, waiter->reservation.owner);
}

// An original whose outcome is not stored (a 500 here) shares it before it
// releases the key: its waiters answer with it instead of running the
// request again one after another. The key is left free for retries, and
// nothing of the outcome is kept once its waiters are gone.
TEST_F(EngineTest, WaitersAnswerWithTheOutcomeTheirOriginalShared) {
  const BeginResult owner = Begin(Request());
  std::vector<std::optional<BeginResult>> waiters(3);
  for (auto& w : waiters) Spawn(ctx_, engine_.Begin(Request(kFp, InFlightMode::kWait)), &w);
  ASSERT_TRUE(PollUntil(ctx_, [&] { return store_.watchers() == 3; }));
  EXPECT_EQ(engine_.waited_keys(), 1u);

  engine_.Share(owner.reservation, Response(500, "boom"));
  std::optional<Status> released;
  Spawn(ctx_, engine_.Release(owner.reservation), &released);
  ASSERT_TRUE(PollUntil(ctx_, [&] {
    return released.has_value() && std::all_of(waiters.begin(), waiters.end(), [](const auto& w) { return w.has_value(); });
  }));
  ASSERT_TRUE(released->ok());
  for (const auto& w : waiters) {
    ASSERT_EQ(w->outcome, BeginOutcome::kShared);
    EXPECT_TRUE(w->waited);
    ASSERT_NE(w->shared, nullptr);
    EXPECT_EQ(w->shared->response, Response(500, "boom"));
    EXPECT_EQ(w->shared->operation_id, owner.reservation.operation_id);
  }
  EXPECT_FALSE(Get(kKey).has_value());
  EXPECT_EQ(engine_.waited_keys(), 0u);
  // A retry runs.
  EXPECT_EQ(Begin(Request()).outcome, BeginOutcome::kProceed);
}

// A released key may be taken by another gateway before this one's waiter
// reads it again (Redis): the waiter still answers with what its own holder
// shared, instead of waiting on the new holder and running after it.
TEST_F(EngineTest, AWaiterKeepsItsHoldersOutcomeWhenAnotherTookTheKeyMeanwhile) {
  const BeginResult owner = Begin(Request());
  std::optional<BeginResult> waiter;
  Spawn(ctx_, engine_.Begin(Request(kFp, InFlightMode::kWait)), &waiter);
  ASSERT_TRUE(PollUntil(ctx_, [&] { return store_.watchers() == 1; }));
  engine_.Share(owner.reservation, Response(503, "busy"));
  // Released and taken again before the waiter runs (the io_context is idle).
  ASSERT_TRUE(store_.ReleaseNow(kKey, owner.reservation.owner).ok());
  Record other;
  other.state = RecordState::kInFlight;
  other.fingerprint = kFp;
  other.owner = "someone-elses-owner-token";
  other.operation_id = "op_other";
  other.created_ms = clock_.NowMillis();
  other.lease_expires_ms = clock_.NowMillis() + 30'000;
  ASSERT_TRUE(store_.ReserveNow(kKey, other, clock_.NowMillis()).ok());
  ASSERT_TRUE(PollUntil(ctx_, [&] { return waiter.has_value(); }));
  ASSERT_EQ(waiter->outcome, BeginOutcome::kShared);
  EXPECT_EQ(waiter->shared->response, Response(503, "busy"));
  EXPECT_EQ(Get(kKey)->owner, "someone-elses-owner-token");
}

// Share keeps nothing for a key nobody of this process waits on, and a
// waiter takes only the outcome of the original it waited on: one shared
// earlier by another original is not answered to it.
TEST_F(EngineTest, AWaiterTakesOnlyWhatItsOwnOriginalShared) {
  const BeginResult first = Begin(Request());
  engine_.Share(first.reservation, Response(503, "first"));
  EXPECT_EQ(engine_.waited_keys(), 0u);
  ASSERT_TRUE(RunTask(ctx_, engine_.Release(first.reservation)).ok());

  const BeginResult second = Begin(Request());
  ASSERT_EQ(second.outcome, BeginOutcome::kProceed);
  std::optional<BeginResult> waiter;
  Spawn(ctx_, engine_.Begin(Request(kFp, InFlightMode::kWait)), &waiter);
  ASSERT_TRUE(PollUntil(ctx_, [&] { return store_.watchers() == 1; }));
  engine_.Share(first.reservation, Response(503, "first, again"));  // not the holder it waits on
  std::optional<Status> released;
  Spawn(ctx_, engine_.Release(second.reservation), &released);
  ASSERT_TRUE(PollUntil(ctx_, [&] { return waiter.has_value() && released.has_value(); }));
  EXPECT_EQ(waiter->outcome, BeginOutcome::kProceed);
  EXPECT_EQ(engine_.waited_keys(), 0u);
}

// A waiter woken by the release of an original cut at shutdown must not take
// the key and run the request again while the gateway stops: once its
// `cancelled` holds, Begin gives up and leaves the key free.
TEST_F(EngineTest, CancelledWaiterLeavesAReleasedKeyFree) {
  const BeginResult owner = Begin(Request());
  bool stopping = false;
  KeyedRequest waiting = Request(kFp, InFlightMode::kWait);
  waiting.cancelled = [](const void* flag) { return *static_cast<const bool*>(flag); };
  waiting.cancelled_arg = &stopping;
  std::optional<BeginResult> waiter;
  Spawn(ctx_, engine_.Begin(std::move(waiting)), &waiter);
  ASSERT_TRUE(PollUntil(ctx_, [&] { return store_.watchers() == 1; }));

  stopping = true;
  std::optional<Status> released;
  Spawn(ctx_, engine_.Release(owner.reservation), &released);
  ASSERT_TRUE(PollUntil(ctx_, [&] { return waiter.has_value() && released.has_value(); }));
  ASSERT_TRUE(released->ok());
  EXPECT_EQ(waiter->outcome, BeginOutcome::kCancelled) << BeginOutcomeName(waiter->outcome);
  EXPECT_TRUE(waiter->waited);
  EXPECT_FALSE(Get(kKey).has_value());
}

TEST_F(EngineTest, CancelledRequestDoesNotReserve) {
  bool stopping = true;
  KeyedRequest r = Request();
  r.cancelled = [](const void* flag) { return *static_cast<const bool*>(flag); };
  r.cancelled_arg = &stopping;
  const BeginResult begun = Begin(std::move(r));
  EXPECT_EQ(begun.outcome, BeginOutcome::kCancelled);
  EXPECT_FALSE(begun.waited);
  EXPECT_FALSE(Get(kKey).has_value());
}

// A waiter whose client has gone does not take the key the original
// released: the run would answer nobody. `abandoned` is asked only then,
// not of a request that never waited.
TEST_F(EngineTest, AWaiterWhoseClientIsGoneLeavesAReleasedKeyFree) {
  struct Client {
    bool gone = false;
    mutable int asked = 0;
  };
  auto abandoned = [](const void* c) {
    const auto* client = static_cast<const Client*>(c);
    ++client->asked;
    return client->gone;
  };
  Client first_client;
  KeyedRequest first = Request();
  first.abandoned = abandoned;
  first.cancelled_arg = &first_client;
  const BeginResult owner = Begin(std::move(first));
  ASSERT_EQ(owner.outcome, BeginOutcome::kProceed);
  EXPECT_EQ(first_client.asked, 0);

  Client client;
  KeyedRequest waiting = Request(kFp, InFlightMode::kWait);
  waiting.abandoned = abandoned;
  waiting.cancelled_arg = &client;
  std::optional<BeginResult> waiter;
  Spawn(ctx_, engine_.Begin(std::move(waiting)), &waiter);
  ASSERT_TRUE(PollUntil(ctx_, [&] { return store_.watchers() == 1; }));

  client.gone = true;
  std::optional<Status> released;
  Spawn(ctx_, engine_.Release(owner.reservation), &released);
  ASSERT_TRUE(PollUntil(ctx_, [&] { return waiter.has_value() && released.has_value(); }));
  ASSERT_TRUE(released->ok());
  EXPECT_EQ(waiter->outcome, BeginOutcome::kClientGone) << BeginOutcomeName(waiter->outcome);
  EXPECT_TRUE(waiter->waited);
  EXPECT_GE(client.asked, 1);
  EXPECT_FALSE(Get(kKey).has_value());
}

TEST_F(EngineTest, ReleasedKeyLetsOneOfManyWaitersRunAndTheRestReplayIt) {
  const BeginResult owner = Begin(Request());
  constexpr int kWaiters = 4;
  std::vector<std::optional<BeginResult>> results(kWaiters);
  std::vector<std::optional<Status>> completions(kWaiters);
  // Each waiter that gets to run completes at once, like a fast upstream.
  auto waiter = [this](std::optional<Status>* completion) -> Task<BeginResult> {
    BeginResult r = co_await engine_.Begin(Request(kFp, InFlightMode::kWait));
    if (r.outcome == BeginOutcome::kProceed) {
      completion->emplace(co_await engine_.Complete(r.reservation, Response(200, "second"), 24h));
    }
    co_return r;
  };
  for (int i = 0; i < kWaiters; ++i) Spawn(ctx_, waiter(&completions[i]), &results[i]);
  ASSERT_TRUE(PollUntil(ctx_, [&] { return store_.watchers() == kWaiters; }));

  ASSERT_TRUE(RunTask(ctx_, engine_.Release(owner.reservation)).ok());
  ASSERT_TRUE(PollUntil(ctx_, [&] {
    for (const auto& r : results) {
      if (!r.has_value()) return false;
    }
    return true;
  }));
  int proceeded = 0;
  for (int i = 0; i < kWaiters; ++i) {
    if (results[i]->outcome == BeginOutcome::kProceed) {
      ++proceeded;
      EXPECT_TRUE(completions[i].has_value() && completions[i]->ok());
    } else {
      ASSERT_EQ(results[i]->outcome, BeginOutcome::kReplay);
      EXPECT_EQ(results[i]->record->response.body, "second");
    }
  }
  EXPECT_EQ(proceeded, 1);
}

TEST_F(EngineTest, ReleaseThenRetryProceeds) {
  const BeginResult first = Begin(Request());
  ASSERT_TRUE(RunTask(ctx_, engine_.Release(first.reservation)).ok());
  EXPECT_FALSE(Get(kKey).has_value());
  const BeginResult retry = Begin(Request());
  ASSERT_EQ(retry.outcome, BeginOutcome::kProceed);
  EXPECT_NE(retry.reservation.owner, first.reservation.owner);
  // The first owner's reservation is gone: its release fails now.
  EXPECT_EQ(RunTask(ctx_, engine_.Release(first.reservation)).code(),
            StatusCode::kFailedPrecondition);
}

TEST_F(EngineTest, TakeoverAfterLeaseExpiry) {
  const BeginResult first = Begin(Request());
  clock_.Advance(30s);
  const BeginResult second = Begin(Request());
  ASSERT_EQ(second.outcome, BeginOutcome::kProceed);
  EXPECT_TRUE(second.taken_over);
  ASSERT_TRUE(second.record.has_value());
  EXPECT_EQ(second.record->owner, first.reservation.owner);
  EXPECT_NE(second.reservation.owner, first.reservation.owner);
  EXPECT_EQ(Get(kKey)->owner, second.reservation.owner);
}

TEST_F(EngineTest, ExpiredLeaseOtherFingerprintIsKeyReused) {
  ASSERT_EQ(Begin(Request()).outcome, BeginOutcome::kProceed);
  clock_.Advance(31s);
  const BeginResult other = Begin(Request(kOtherFp));
  EXPECT_EQ(other.outcome, BeginOutcome::kKeyReused);
  EXPECT_TRUE(other.conflict_in_flight);
}

TEST_F(EngineTest, LostOwnersLateCompleteFailsAndLeavesTheRecord) {
  const BeginResult first = Begin(Request());
  clock_.Advance(31s);
  const BeginResult second = Begin(Request());
  ASSERT_TRUE(second.taken_over);
  const std::optional<Record> before = Get(kKey);

  const Status late = Complete(first.reservation, Response(200, "late"));
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Get(kKey), before);
  EXPECT_EQ(RunTask(ctx_, engine_.Release(first.reservation)).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(Get(kKey), before);

  ASSERT_TRUE(Complete(second.reservation, Response(200, "winner")).ok());
  EXPECT_EQ(Complete(first.reservation, Response(200, "late")).code(),
            StatusCode::kFailedPrecondition);
  const BeginResult replay = Begin(Request());
  ASSERT_EQ(replay.outcome, BeginOutcome::kReplay);
  EXPECT_EQ(replay.record->response.body, "winner");
}

TEST_F(EngineTest, CompleteByKeyAndOwner) {
  const BeginResult first = Begin(Request());
  ASSERT_TRUE(RunTask(ctx_, engine_.Complete(kKey, first.reservation.owner, Response(202, "x"), 1h))
                  .ok());
  const std::optional<Record> rec = Get(kKey);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->state, RecordState::kCompleted);
  EXPECT_EQ(rec->operation_id, first.reservation.operation_id);
  EXPECT_EQ(rec->fingerprint, kFp);
  EXPECT_EQ(rec->expires_ms, clock_.NowMillis() + 3'600'000);
  EXPECT_EQ(RunTask(ctx_, engine_.Complete(kKey, "someone-else", Response(202, "x"), 1h)).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(RunTask(ctx_, engine_.Complete("t-_:_:_:r:none", "o", Response(202, "x"), 1h)).code(),
            StatusCode::kFailedPrecondition);
}

TEST_F(EngineTest, RetentionExpiryMakesANewKey) {
  const BeginResult first = Begin(Request());
  ASSERT_TRUE(Complete(first.reservation, Response(200, "old"), 10s).ok());
  clock_.Advance(9'999ms);
  EXPECT_EQ(Begin(Request()).outcome, BeginOutcome::kReplay);
  clock_.Advance(1ms);
  const BeginResult fresh = Begin(Request(kOtherFp));
  ASSERT_EQ(fresh.outcome, BeginOutcome::kProceed);
  EXPECT_FALSE(fresh.taken_over);
}

TEST_F(EngineTest, ZeroRetentionKeepsForever) {
  const BeginResult first = Begin(Request());
  ASSERT_TRUE(Complete(first.reservation, Response(200, "kept"), 0ms).ok());
  EXPECT_EQ(Get(kKey)->expires_ms, 0);
  clock_.Advance(24h * 365);
  EXPECT_EQ(Begin(Request()).outcome, BeginOutcome::kReplay);
}

TEST_F(EngineTest, StoreFullIsAStoreError) {
  store::memory::MemoryStore tiny(16, clock_);
  Engine engine(tiny, clock_);
  const BeginResult r = RunTask(ctx_, engine.Begin(Request()));
  EXPECT_EQ(r.outcome, BeginOutcome::kStoreError);
  EXPECT_EQ(r.status.code(), StatusCode::kResourceExhausted);
}

// A memory store with room for the reservation but not for the response:
// the request ran, so its outcome is stored (without the body) and a retry,
// even after the lease, replays it instead of running the request again.
TEST_F(EngineTest, AResponseTheFullStoreCannotHoldWholeIsReplayedNotRunAgain) {
  store::memory::MemoryStore small(512, clock_);
  Engine engine(small, clock_);
  const BeginResult first = RunTask(ctx_, engine.Begin(Request()));
  ASSERT_EQ(first.outcome, BeginOutcome::kProceed);
  ASSERT_TRUE(RunTask(ctx_, engine.Complete(first.reservation, Response(201, std::string(4096, 'x')), 24h)).ok());
  clock_.Advance(31s);  // past the lease
  const BeginResult retry = RunTask(ctx_, engine.Begin(Request()));
  ASSERT_EQ(retry.outcome, BeginOutcome::kReplay);
  EXPECT_EQ(retry.record->operation_id, first.reservation.operation_id);
  EXPECT_EQ(retry.record->response.status, 201);
  EXPECT_TRUE(retry.record->response.body_omitted);
  EXPECT_TRUE(retry.record->response.body.empty());
  EXPECT_EQ(retry.record->response.headers, Response(201, "").headers);
  EXPECT_EQ(small.Stats().bodies_dropped, 1u);
}

// A memory store whose WatchKey and Get fail (Unavailable) the next
// `fail_watches` / `fail_gets` times (-1: every time).
class FlakyReadStore final : public ForwardingStore {
 public:
  explicit FlakyReadStore(store::memory::MemoryStore& inner) : ForwardingStore(inner, false) {}
  Task<StatusOr<std::optional<Record>>> Get(std::string key, UnixMillis now) override {
    if (Fail(&fail_gets)) {
      ++failed_gets;
      co_return UnavailableError("get: paused");
    }
    co_return co_await inner_.Get(std::move(key), now);
  }
  Task<StatusOr<std::unique_ptr<Watch>>> WatchKey(std::string key) override {
    if (Fail(&fail_watches)) {
      ++failed_watches;
      co_return UnavailableError("watch: paused");
    }
    co_return co_await inner_.WatchKey(std::move(key));
  }

  int fail_gets = 0;
  int fail_watches = 0;
  int failed_gets = 0;
  int failed_watches = 0;

 private:
  static bool Fail(int* left) {
    if (*left == 0) return false;
    if (*left > 0) --*left;
    return true;
  }
};

// A store that fails a moment while a request waits for the original (a
// paused Redis) does not end the wait: the waiter looks again and gets the
// original's response when it lands; the errors are reported for counting.
TEST_F(EngineTest, ShortStoreErrorsWhileWaitingDoNotEndTheWait) {
  FlakyReadStore flaky(store_);
  Engine engine(flaky, clock_);
  const BeginResult owner = RunTask(ctx_, engine.Begin(Request()));
  ASSERT_EQ(owner.outcome, BeginOutcome::kProceed);

  flaky.fail_watches = 1;
  flaky.fail_gets = 2;
  std::optional<BeginResult> waiter;
  Spawn(ctx_, engine.Begin(Request(kFp, InFlightMode::kWait)), &waiter);
  ASSERT_TRUE(PollUntil(ctx_, [&] {
    return waiter.has_value() || (flaky.fail_gets == 0 && store_.watchers() == 1);
  }));
  ASSERT_FALSE(waiter.has_value()) << "the wait ended at a store error";
  EXPECT_EQ(flaky.failed_watches, 1);
  EXPECT_EQ(flaky.failed_gets, 2);

  std::optional<Status> completed;
  Spawn(ctx_, engine.Complete(owner.reservation, Response(201, "landed"), 24h), &completed);
  ASSERT_TRUE(PollUntil(ctx_, [&] { return waiter.has_value() && completed.has_value(); }));
  ASSERT_TRUE(completed->ok());
  ASSERT_EQ(waiter->outcome, BeginOutcome::kReplay);
  EXPECT_TRUE(waiter->waited);
  EXPECT_EQ(waiter->record->operation_id, owner.reservation.operation_id);
  EXPECT_EQ(waiter->wait_watch_errors, 1);
  EXPECT_EQ(waiter->wait_get_errors, 2);
  EXPECT_EQ(store_.watchers(), 0u);
}

// A store that keeps failing until the wait ends: the waiter kept looking
// and answers 409 (SPEC §4.2: after wait_timeout, 409), never a store error
// (under fail_open that would forward the request beside the original).
TEST_F(EngineTest, AStoreFailingUntilTheWaitEndsAnswers409) {
  FlakyReadStore flaky(store_);
  Engine engine(flaky, clock_);
  ASSERT_EQ(RunTask(ctx_, engine.Begin(Request())).outcome, BeginOutcome::kProceed);
  for (int* failing : {&flaky.fail_watches, &flaky.fail_gets}) {
    SCOPED_TRACE(failing == &flaky.fail_gets ? "get" : "watch");
    flaky.fail_watches = flaky.fail_gets = flaky.failed_watches = flaky.failed_gets = 0;
    *failing = -1;
    KeyedRequest waiting = Request(kFp, InFlightMode::kWait);
    waiting.wait_timeout = 200ms;
    const BeginResult r = RunTask(ctx_, engine.Begin(waiting));
    EXPECT_EQ(r.outcome, BeginOutcome::kInFlight);
    EXPECT_TRUE(r.waited);
    EXPECT_GE(r.retry_after, 1s);
    // It looked again after the first error, at least once more at the end.
    EXPECT_GE(flaky.failed_watches + flaky.failed_gets, 2);
    EXPECT_EQ(r.wait_watch_errors, flaky.failed_watches);
    EXPECT_EQ(r.wait_get_errors, flaky.failed_gets);
    EXPECT_EQ(store_.watchers(), 0u);
  }
}

TEST_F(EngineTest, LookupFindsCompletedInFlightAndMissing) {
  EXPECT_EQ(RunTask(ctx_, engine_.Lookup(kKey, 0ms)).outcome, LookupOutcome::kNotFound);
  const BeginResult first = Begin(Request());
  const LookupResult in_flight = RunTask(ctx_, engine_.Lookup(kKey, 0ms));
  EXPECT_EQ(in_flight.outcome, LookupOutcome::kInFlight);
  EXPECT_EQ(in_flight.retry_after, 30s);
  EXPECT_EQ(RunTask(ctx_, engine_.Lookup(kKey, 20ms)).outcome, LookupOutcome::kInFlight);

  std::optional<LookupResult> attached;
  Spawn(ctx_, engine_.Lookup(kKey, 30s), &attached);
  ASSERT_TRUE(PollUntil(ctx_, [&] { return store_.watchers() == 1; }));
  std::optional<Status> done;
  Spawn(ctx_, engine_.Complete(first.reservation, Response(200, "found"), 24h), &done);
  ASSERT_TRUE(PollUntil(ctx_, [&] { return attached.has_value() && done.has_value(); }));
  ASSERT_EQ(attached->outcome, LookupOutcome::kCompleted);
  EXPECT_EQ(attached->record->response.body, "found");
}

TEST(EngineIdsTest, OwnerTokensAndOperationIdsAreWellFormedAndUnique) {
  std::set<std::string> owners;
  std::set<std::string> ops;
  for (int i = 0; i < 1000; ++i) {
    const std::string o = Engine::NewOwnerToken();
    ASSERT_EQ(o.size(), 32u);
    ASSERT_EQ(o.find_first_not_of("0123456789abcdef"), std::string::npos);
    owners.insert(o);
    const std::string op = Engine::NewOperationId(1'700'000'000'000);
    ASSERT_EQ(op.size(), 29u);
    ASSERT_TRUE(op.starts_with("op_"));
    ASSERT_EQ(op.find_first_not_of("0123456789ABCDEFGHJKMNPQRSTVWXYZ", 3), std::string::npos);
    ops.insert(op);
  }
  EXPECT_EQ(owners.size(), 1000u);
  EXPECT_EQ(ops.size(), 1000u);
  // Time-ordered: a later millisecond sorts after.
  EXPECT_LT(Engine::NewOperationId(1'700'000'000'000).substr(0, 13),
            Engine::NewOperationId(1'700'000'000'001).substr(0, 13));
}

}  // namespace
}  // namespace idemgate::core
