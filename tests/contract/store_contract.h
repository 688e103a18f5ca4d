#pragma once

// The contract every core::Store implementation keeps (src/core/store.h), as
// one type-parameterised GoogleTest suite. A test binary instantiates it for
// its stores:
//
//   struct MyFixture {
//     static constexpr const char* kName = "my";  // for FixtureNames
//     // A fresh, empty store using `clock` for its own time keeping; called
//     // once per test on a fresh fixture object, which outlives the store.
//     StatusOr<std::unique_ptr<core::Store>> Make(const Clock& clock);
//   };
//   INSTANTIATE_TYPED_TEST_SUITE_P(My, StoreContractTest, ::testing::Types<MyFixture>,
//                                  FixtureNames);
//
// Link the CMake target idemgate_store_contract for the include path.
//
// Time is a FakeClock that starts at the real current time (so stores that
// hand expiry times to a server see plausible ones) and only moves when a
// test advances it; the `now` passed to Reserve and Get is always the clock's.
// Store operations run as coroutines on an io_context (co_spawn + run).

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <exception>
#include <latch>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "contract/store_helpers.h"
#include "core/record.h"
#include "core/store.h"

namespace idemgate::contract {

using namespace std::chrono_literals;

template <typename Fixture>
class StoreContractTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = fixture_.Make(clock_);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
  }
  void TearDown() override { store_.reset(); }

  UnixMillis Now() const { return clock_.NowMillis(); }
  void Advance(Duration d) { clock_.Advance(d); }

  template <typename T>
  T Run(core::Task<T> task) {
    return RunOn(io_, std::move(task));
  }

  StatusOr<core::ReserveResult> Reserve(const std::string& key, const core::Record& r) {
    return Run(store_->Reserve(key, r, Now()));
  }
  Status Complete(const std::string& key, const std::string& owner, const core::Record& r) {
    return Run(store_->Complete(key, owner, r));
  }
  Status Release(const std::string& key, const std::string& owner) {
    return Run(store_->Release(key, owner));
  }
  StatusOr<std::optional<core::Record>> Get(const std::string& key) {
    return Run(store_->Get(key, Now()));
  }
  StatusOr<core::PurgeResult> Purge(const std::string& key, core::PurgeMode mode = core::PurgeMode::kAny) {
    return Run(store_->Purge(key, mode, Now()));
  }
  // Purges `key` and expects `outcome`, with `state` for what was found.
  void ExpectPurge(const std::string& key, core::PurgeMode mode, core::PurgeOutcome outcome,
                   std::optional<core::RecordState> state = std::nullopt) {
    auto purged = Purge(key, mode);
    ASSERT_TRUE(purged.ok()) << key << ": " << purged.status().ToString();
    EXPECT_EQ(purged->outcome, outcome) << key;
    EXPECT_EQ(purged->state, state) << key;
  }
  std::unique_ptr<core::Watch> MakeWatch(const std::string& key) {
    auto w = Run(store_->WatchKey(key));
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return w.ok() ? std::move(*w) : nullptr;
  }

  // Reserves `key` for `owner` and asserts it was new.
  core::Record ReserveNew(const std::string& key, const std::string& owner, int fp = 1,
                          Duration lease = 60s) {
    core::Record r = Reservation(owner, Fingerprint(fp), Now(), lease);
    auto res = Reserve(key, r);
    EXPECT_TRUE(res.ok()) << res.status().ToString();
    if (res.ok()) {
      EXPECT_EQ(res->outcome, core::ReserveOutcome::kReserved);
    }
    return r;
  }

  // Reserves and completes `key`; returns the completed record.
  core::Record StoreCompleted(const std::string& key, const std::string& owner,
                              Duration retention = 24h, int fp = 1) {
    core::Record c = Completion(ReserveNew(key, owner, fp), Now(), retention);
    Status s = Complete(key, owner, c);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return c;
  }

  // The record under `key`, which must exist and be readable.
  core::Record MustGet(const std::string& key) {
    auto got = Get(key);
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    if (!got.ok() || !got->has_value()) {
      ADD_FAILURE() << "no record under " << key;
      return {};
    }
    return **got;
  }

  void ExpectAbsent(const std::string& key) {
    auto got = Get(key);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_FALSE(got->has_value());
  }

  // Declared in this order so that the store goes before the io_context,
  // the fixture (which may own its directory) and the clock it uses.
  FakeClock clock_{SystemClock::Instance().NowMillis()};
  Fixture fixture_;
  boost::asio::io_context io_;
  std::unique_ptr<core::Store> store_;
};

TYPED_TEST_SUITE_P(StoreContractTest);

using core::ReserveOutcome;

TYPED_TEST_P(StoreContractTest, ReserveOnAbsentKeyWritesTheReservation) {
  core::Record r = Reservation("owner-a", Fingerprint(1), this->Now());
  auto res = this->Reserve("k", r);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->outcome, ReserveOutcome::kReserved);
  EXPECT_FALSE(res->existing.has_value());
  EXPECT_EQ(this->MustGet("k"), r);
}

TYPED_TEST_P(StoreContractTest, ReserveOnLiveInFlightKeyReturnsItUntouched) {
  core::Record first = this->ReserveNew("k", "owner-a", 1);
  for (int fp : {1, 2}) {
    auto res = this->Reserve("k", Reservation("owner-b", Fingerprint(fp), this->Now()));
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_EQ(res->outcome, ReserveOutcome::kExists);
    ASSERT_TRUE(res->existing.has_value());
    EXPECT_EQ(*res->existing, first);
  }
  EXPECT_EQ(this->MustGet("k"), first);
}

TYPED_TEST_P(StoreContractTest, ReserveOnCompletedKeyReturnsItUntouched) {
  core::Record done = this->StoreCompleted("k", "owner-a");
  this->Advance(1h);  // long past the lease: completed records are never taken over
  for (int fp : {1, 2}) {
    auto res = this->Reserve("k", Reservation("owner-b", Fingerprint(fp), this->Now()));
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_EQ(res->outcome, ReserveOutcome::kExists);
    ASSERT_TRUE(res->existing.has_value());
    EXPECT_EQ(*res->existing, done);
  }
  EXPECT_EQ(this->MustGet("k"), done);
}

TYPED_TEST_P(StoreContractTest, CompleteByOwnerReplacesTheReservation) {
  core::Record r = this->ReserveNew("k", "owner-a");
  core::Record c = Completion(r, this->Now(), 24h);
  c.response.body_omitted = true;
  c.response.body.clear();
  ASSERT_TRUE(this->Complete("k", "owner-a", c).ok());
  EXPECT_EQ(this->MustGet("k"), c);
}

TYPED_TEST_P(StoreContractTest, CompleteByOwnerWorksAfterTheLeaseEndedIfNobodyTookOver) {
  core::Record r = this->ReserveNew("k", "owner-a", 1, 1s);
  this->Advance(5s);
  core::Record c = Completion(r, this->Now(), 24h);
  ASSERT_TRUE(this->Complete("k", "owner-a", c).ok());
  EXPECT_EQ(this->MustGet("k"), c);
}

TYPED_TEST_P(StoreContractTest, CompleteByAnotherOwnerFailsAndLeavesTheRecord) {
  core::Record r = this->ReserveNew("k", "owner-a");
  Status s = this->Complete(
      "k", "owner-b",
      Completion(Reservation("owner-b", Fingerprint(1), this->Now()), this->Now(), 24h));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_EQ(this->MustGet("k"), r);
}

TYPED_TEST_P(StoreContractTest, CompleteOnAbsentKeyFails) {
  Status s = this->Complete(
      "k", "owner-a",
      Completion(Reservation("owner-a", Fingerprint(1), this->Now()), this->Now(), 24h));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  this->ExpectAbsent("k");
}

TYPED_TEST_P(StoreContractTest, CompleteOnCompletedKeyFailsEvenForItsOwner) {
  core::Record done = this->StoreCompleted("k", "owner-a");
  core::Record again = done;
  again.response.status = 500;
  again.response.body = "second";
  Status s = this->Complete("k", "owner-a", again);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_EQ(this->MustGet("k"), done);
}

TYPED_TEST_P(StoreContractTest, ReleaseByOwnerDeletesAndTheKeyIsNewAgain) {
  this->ReserveNew("k", "owner-a", 1);
  ASSERT_TRUE(this->Release("k", "owner-a").ok());
  this->ExpectAbsent("k");
  // Any fingerprint may reserve again.
  this->ReserveNew("k", "owner-b", 2);
}

TYPED_TEST_P(StoreContractTest, ReleaseByAnotherOwnerFailsAndLeavesTheRecord) {
  core::Record r = this->ReserveNew("k", "owner-a");
  Status s = this->Release("k", "owner-b");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_EQ(this->MustGet("k"), r);
}

TYPED_TEST_P(StoreContractTest, ReleaseOfCompletedRecordFailsEvenForItsOwner) {
  core::Record done = this->StoreCompleted("k", "owner-a");
  Status s = this->Release("k", "owner-a");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_EQ(this->MustGet("k"), done);
}

TYPED_TEST_P(StoreContractTest, ReleaseOnAbsentKeyFails) {
  Status s = this->Release("k", "owner-a");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  this->ExpectAbsent("k");
}

TYPED_TEST_P(StoreContractTest, GetOfAbsentKeyIsNullopt) {
  this->StoreCompleted("other", "owner-a");
  this->ExpectAbsent("k");
  this->ExpectAbsent("");
  this->ExpectAbsent("othe");
}

TYPED_TEST_P(StoreContractTest, PurgeDeletesWhateverTheState) {
  using core::PurgeMode;
  using core::PurgeOutcome;
  this->ReserveNew("in-flight", "owner-a");
  this->StoreCompleted("completed", "owner-b");
  this->ExpectPurge("in-flight", PurgeMode::kAny, PurgeOutcome::kPurged, core::RecordState::kInFlight);
  this->ExpectPurge("completed", PurgeMode::kAny, PurgeOutcome::kPurged, core::RecordState::kCompleted);
  for (const char* key : {"in-flight", "completed", "never-written"}) {
    this->ExpectAbsent(key);
    this->ExpectPurge(key, PurgeMode::kAny, PurgeOutcome::kAbsent);
    this->ExpectPurge(key, PurgeMode::kUnlessInFlight, PurgeOutcome::kAbsent);
  }
  // The purged reservation's owner can no longer complete it.
  Status s = this->Complete(
      "in-flight", "owner-a",
      Completion(Reservation("owner-a", Fingerprint(1), this->Now()), this->Now(), 24h));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  this->ReserveNew("completed", "owner-c", 2);
}

TYPED_TEST_P(StoreContractTest, PurgeUnlessInFlightLeavesALiveReservation) {
  using core::PurgeMode;
  using core::PurgeOutcome;
  core::Record r = this->ReserveNew("k", "owner-a", 1, 10s);
  this->Advance(10s - 1ms);  // 1 ms of the lease left
  auto refused = this->Purge("k", PurgeMode::kUnlessInFlight);
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_EQ(refused->outcome, PurgeOutcome::kInFlight);
  EXPECT_EQ(refused->state, core::RecordState::kInFlight);
  EXPECT_EQ(refused->lease_expires_ms, r.lease_expires_ms);
  EXPECT_EQ(this->MustGet("k"), r);
  // A retry still finds it in flight, and its owner still completes it.
  auto retry = this->Reserve("k", Reservation("owner-b", Fingerprint(1), this->Now()));
  ASSERT_TRUE(retry.ok()) << retry.status().ToString();
  EXPECT_EQ(retry->outcome, ReserveOutcome::kExists);
  core::Record done = Completion(r, this->Now(), 24h);
  ASSERT_TRUE(this->Complete("k", "owner-a", done).ok());
  EXPECT_EQ(this->MustGet("k"), done);
  // Completed, it is purged.
  this->ExpectPurge("k", PurgeMode::kUnlessInFlight, PurgeOutcome::kPurged, core::RecordState::kCompleted);
  this->ExpectAbsent("k");
}

TYPED_TEST_P(StoreContractTest, PurgeUnlessInFlightRemovesAReservationWhoseLeaseEnded) {
  using core::PurgeMode;
  using core::PurgeOutcome;
  core::Record r = this->ReserveNew("k", "owner-a", 1, 10s);
  this->Advance(10s);  // lease_expires_ms == now: the lease has ended
  this->ExpectPurge("k", PurgeMode::kUnlessInFlight, PurgeOutcome::kPurged, core::RecordState::kInFlight);
  this->ExpectAbsent("k");
  // As after a takeover, the owner can no longer complete it.
  Status s = this->Complete("k", "owner-a", Completion(r, this->Now(), 24h));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  this->ReserveNew("k", "owner-b", 2);
}

TYPED_TEST_P(StoreContractTest, PurgeAnyRemovesALiveReservation) {
  using core::PurgeMode;
  using core::PurgeOutcome;
  core::Record r = this->ReserveNew("k", "owner-a", 1, 1h);
  this->ExpectPurge("k", PurgeMode::kUnlessInFlight, PurgeOutcome::kInFlight, core::RecordState::kInFlight);
  this->ExpectPurge("k", PurgeMode::kAny, PurgeOutcome::kPurged, core::RecordState::kInFlight);
  this->ExpectAbsent("k");
  Status s = this->Complete("k", "owner-a", Completion(r, this->Now(), 24h));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
}

// The decision and the delete are one step: a purge racing reservations
// never deletes one whose lease lasts (its owner then completes it). A read
// followed by a delete could: one purger reads a completed record, another
// purges it, the owner reserves the key again, and the first deletes that.
TYPED_TEST_P(StoreContractTest, PurgeUnlessInFlightNeverTakesAReservationMadeBesideIt) {
  constexpr int kCompletions = 150;
  std::atomic<bool> stop{false};
  std::atomic<int> completions{0}, lost{0}, errors{0}, purged_in_flight{0}, purged_completed{0};
  const UnixMillis now = this->Now();
  std::latch start(3);
  std::thread owner([&] {
    boost::asio::io_context io;
    start.arrive_and_wait();
    RunOn(io, [&]() -> core::Task<bool> {
      for (int i = 0; completions.load() < kCompletions && i < 1'000'000; ++i) {
        const std::string name = "owner-" + std::to_string(i);
        core::Record r = Reservation(name, Fingerprint(1), now, 1h);
        auto res = co_await this->store_->Reserve("race", r, now);
        if (!res.ok()) {
          errors.fetch_add(1);
          continue;
        }
        if (res->outcome != ReserveOutcome::kReserved) {  // the last completion is not purged yet
          std::this_thread::yield();
          continue;
        }
        Status s = co_await this->store_->Complete("race", name, Completion(r, now, 24h));
        if (s.ok()) {
          completions.fetch_add(1);
        } else if (s.code() == StatusCode::kFailedPrecondition) {
          lost.fetch_add(1);
        } else {
          errors.fetch_add(1);
        }
      }
      stop = true;
      co_return true;
    }());
  });
  std::vector<std::thread> purgers;
  for (int t = 0; t < 2; ++t) {
    purgers.emplace_back([&] {
      boost::asio::io_context io;
      start.arrive_and_wait();
      RunOn(io, [&]() -> core::Task<bool> {
        while (!stop.load()) {
          auto purged = co_await this->store_->Purge("race", core::PurgeMode::kUnlessInFlight, now);
          if (!purged.ok()) {
            errors.fetch_add(1);
          } else if (purged->outcome == core::PurgeOutcome::kPurged) {
            (purged->state == core::RecordState::kCompleted ? purged_completed : purged_in_flight).fetch_add(1);
          }
        }
        co_return true;
      }());
    });
  }
  owner.join();
  for (auto& t : purgers) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(purged_in_flight.load(), 0);
  EXPECT_EQ(lost.load(), 0) << "a live reservation was purged under its owner";
  EXPECT_EQ(completions.load(), kCompletions);
  EXPECT_GT(purged_completed.load(), 0);
}

TYPED_TEST_P(StoreContractTest, LeaseExpiryLetsTheSameFingerprintTakeOver) {
  core::Record first = this->ReserveNew("k", "owner-a", 7, 10s);
  this->Advance(10s - 1ms);
  core::Record early = Reservation("owner-b", Fingerprint(7), this->Now());
  auto res = this->Reserve("k", early);
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(res->outcome, ReserveOutcome::kExists) << "the lease has 1 ms left";

  this->Advance(1ms);  // lease_expires_ms == now: the lease has ended
  core::Record second = Reservation("owner-b", Fingerprint(7), this->Now());
  res = this->Reserve("k", second);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->outcome, ReserveOutcome::kTakenOver);
  ASSERT_TRUE(res->existing.has_value());
  EXPECT_EQ(*res->existing, first);
  EXPECT_EQ(this->MustGet("k"), second);

  // The first owner lost its lease: it can neither complete nor release.
  Status s = this->Complete("k", "owner-a", Completion(first, this->Now(), 24h));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  s = this->Release("k", "owner-a");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_EQ(this->MustGet("k"), second);

  core::Record done = Completion(second, this->Now(), 24h);
  ASSERT_TRUE(this->Complete("k", "owner-b", done).ok());
  EXPECT_EQ(this->MustGet("k"), done);
}

TYPED_TEST_P(StoreContractTest, LeaseExpiryDoesNotLetAnotherFingerprintTakeOver) {
  core::Record first = this->ReserveNew("k", "owner-a", 7, 10s);
  this->Advance(30s);
  auto res = this->Reserve("k", Reservation("owner-b", Fingerprint(8), this->Now()));
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->outcome, ReserveOutcome::kExists);
  ASSERT_TRUE(res->existing.has_value());
  EXPECT_EQ(*res->existing, first);
  EXPECT_EQ(this->MustGet("k"), first);
  // The original owner still holds it.
  ASSERT_TRUE(this->Complete("k", "owner-a", Completion(first, this->Now(), 24h)).ok());
}

TYPED_TEST_P(StoreContractTest, CompletedRecordExpiresAfterRetention) {
  core::Record done = this->StoreCompleted("k", "owner-a", 1000ms);
  this->Advance(999ms);
  EXPECT_EQ(this->MustGet("k"), done);
  this->Advance(1ms);  // expires_ms == now: past retention
  this->ExpectAbsent("k");
  // An expired key is a new key, for any fingerprint.
  core::Record fresh = Reservation("owner-b", Fingerprint(2), this->Now());
  auto res = this->Reserve("k", fresh);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->outcome, ReserveOutcome::kReserved);
  EXPECT_FALSE(res->existing.has_value());
  EXPECT_EQ(this->MustGet("k"), fresh);
}

TYPED_TEST_P(StoreContractTest, ExpiredRecordCannotBeCompletedOrReleasedAgain) {
  core::Record done = this->StoreCompleted("k", "owner-a", 1s);
  this->Advance(2s);
  EXPECT_EQ(this->Complete("k", "owner-a", done).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(this->Release("k", "owner-a").code(), StatusCode::kFailedPrecondition);
  this->ExpectAbsent("k");
}

// A record past its retention is absent to Purge as it is to Get, whether
// the store still held it or not, and whichever of the two came first: the
// purge finds nothing (no state), and the key stays absent.
TYPED_TEST_P(StoreContractTest, PurgeOfARecordPastRetentionFindsNothing) {
  using core::PurgeMode;
  using core::PurgeOutcome;
  this->StoreCompleted("purged-first", "owner-a", 1500ms);
  this->StoreCompleted("read-first", "owner-b", 1500ms);
  this->StoreCompleted("forced", "owner-c", 1500ms);
  this->StoreCompleted("kept", "owner-d", 1h);
  this->Advance(1500ms);  // expires_ms == now: past retention
  this->ExpectPurge("purged-first", PurgeMode::kUnlessInFlight, PurgeOutcome::kAbsent);
  this->ExpectAbsent("read-first");
  this->ExpectPurge("read-first", PurgeMode::kUnlessInFlight, PurgeOutcome::kAbsent);
  this->ExpectPurge("forced", PurgeMode::kAny, PurgeOutcome::kAbsent);
  for (const char* key : {"purged-first", "read-first", "forced"}) {
    this->ExpectAbsent(key);
    this->ExpectPurge(key, PurgeMode::kAny, PurgeOutcome::kAbsent);
    this->ReserveNew(key, "owner-e", 2);  // a new key, for any fingerprint
  }
  this->ExpectPurge("kept", PurgeMode::kUnlessInFlight, PurgeOutcome::kPurged, core::RecordState::kCompleted);
}

TYPED_TEST_P(StoreContractTest, RetentionZeroKeepsTheRecordForever) {
  core::Record done = this->StoreCompleted("k", "owner-a", 0ms);
  EXPECT_EQ(done.expires_ms, 0);
  this->Advance(std::chrono::hours(24 * 365 * 10));
  EXPECT_EQ(this->MustGet("k"), done);
  auto res = this->Reserve("k", Reservation("owner-b", Fingerprint(1), this->Now()));
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(res->outcome, ReserveOutcome::kExists);
}

TYPED_TEST_P(StoreContractTest, RetentionDoesNotApplyToInFlightRecords) {
  core::Record r = Reservation("owner-a", Fingerprint(1), this->Now(), 1h);
  r.expires_ms = this->Now() + 1000;  // only a completed record's retention counts
  ASSERT_TRUE(this->Reserve("k", r).ok());
  this->Advance(5s);
  EXPECT_EQ(this->MustGet("k"), r);
  auto res = this->Reserve("k", Reservation("owner-b", Fingerprint(2), this->Now()));
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(res->outcome, ReserveOutcome::kExists);
}

TYPED_TEST_P(StoreContractTest, CompleteWakesAWaitingWatcher) {
  core::Record r = this->ReserveNew("k", "owner-a");
  auto watch = this->MakeWatch("k");
  ASSERT_NE(watch, nullptr);
  bool woken = false;
  Status completed;
  // The waiter suspends first; the completion runs while it waits.
  boost::asio::co_spawn(
      this->io_, [&]() -> core::Task<void> { woken = co_await watch->Changed(30s); },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  completed = this->Run(this->store_->Complete("k", "owner-a", Completion(r, this->Now(), 24h)));
  ASSERT_TRUE(completed.ok()) << completed.ToString();
  this->io_.restart();
  this->io_.run();
  EXPECT_TRUE(woken);
}

TYPED_TEST_P(StoreContractTest, ReleaseWakesAWatcher) {
  this->ReserveNew("k", "owner-a");
  auto watch = this->MakeWatch("k");
  ASSERT_NE(watch, nullptr);
  ASSERT_TRUE(this->Release("k", "owner-a").ok());
  EXPECT_TRUE(this->Run(watch->Changed(30s)));
}

TYPED_TEST_P(StoreContractTest, PurgeWakesAWatcher) {
  this->ReserveNew("k", "owner-a");
  auto watch = this->MakeWatch("k");
  ASSERT_NE(watch, nullptr);
  auto purged = this->Purge("k");
  ASSERT_TRUE(purged.ok() && purged->outcome == core::PurgeOutcome::kPurged);
  EXPECT_TRUE(this->Run(watch->Changed(30s)));
}

TYPED_TEST_P(StoreContractTest, AWatchMadeBeforeACompletionNeverMissesIt) {
  // The engine's order: watch, re-read (still in flight), then wait. The
  // completion lands between the re-read and the wait.
  for (int i = 0; i < 20; ++i) {
    const std::string key = "k" + std::to_string(i);
    core::Record r = this->ReserveNew(key, "owner-a");
    auto watch = this->MakeWatch(key);
    ASSERT_NE(watch, nullptr);
    auto still = this->MustGet(key);
    EXPECT_EQ(still.state, core::RecordState::kInFlight);
    ASSERT_TRUE(this->Complete(key, "owner-a", Completion(r, this->Now(), 24h)).ok());
    EXPECT_TRUE(this->Run(watch->Changed(30s))) << key;
    EXPECT_EQ(this->MustGet(key).state, core::RecordState::kCompleted);
  }
}

TYPED_TEST_P(StoreContractTest, AWatchIsWokenByACompletionFromAnotherThread) {
  core::Record r = this->ReserveNew("k", "owner-a");
  auto watch = this->MakeWatch("k");
  ASSERT_NE(watch, nullptr);
  Status completed = InternalError("not run");
  std::thread other([&] {
    boost::asio::io_context io;
    completed = RunOn(io, this->store_->Complete("k", "owner-a", Completion(r, this->Now(), 24h)));
  });
  const bool woken = this->Run(watch->Changed(30s));
  other.join();
  ASSERT_TRUE(completed.ok()) << completed.ToString();
  EXPECT_TRUE(woken);
}

TYPED_TEST_P(StoreContractTest, WatchTimesOutWithoutAChange) {
  this->ReserveNew("k", "owner-a");
  auto watch = this->MakeWatch("k");
  ASSERT_NE(watch, nullptr);
  // A change to another key does not count.
  this->ReserveNew("other", "owner-b");
  ASSERT_TRUE(this->Release("other", "owner-b").ok());
  EXPECT_FALSE(this->Run(watch->Changed(50ms)));
  EXPECT_EQ(this->MustGet("k").state, core::RecordState::kInFlight);
}

TYPED_TEST_P(StoreContractTest, LargeBodyRoundTrips) {
  core::Record r = this->ReserveNew("k", "owner-a");
  std::string body(5 << 20, '\0');
  std::mt19937_64 rng(5);
  for (auto& c : body) c = static_cast<char>(rng());
  core::Record c = Completion(r, this->Now(), 24h, 200, body);
  ASSERT_TRUE(this->Complete("k", "owner-a", c).ok());
  core::Record got = this->MustGet("k");
  EXPECT_EQ(got.response.body.size(), body.size());
  EXPECT_TRUE(got.response.body == body);
  EXPECT_TRUE(got == c);
}

TYPED_TEST_P(StoreContractTest, BinaryBytesRoundTrip) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  const std::string key = std::string("t-\x01:p:s:r:") + "k\x7f\xff";
  core::Record r = Reservation(std::string("own\0er", 6), all.substr(0, 32), this->Now());
  r.operation_id = std::string("op\0\xff", 4);
  auto res = this->Reserve(key, r);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ASSERT_EQ(res->outcome, ReserveOutcome::kReserved);
  EXPECT_EQ(this->MustGet(key), r);
  core::Record c = Completion(r, this->Now(), 24h, 200, all + all);
  c.response.headers.push_back({"X-Binary", std::string("\0\x80\xfe", 3)});
  ASSERT_TRUE(this->Complete(key, r.owner, c).ok());
  EXPECT_EQ(this->MustGet(key), c);
  core::Record empty = Completion(Reservation("o", "", this->Now()), this->Now(), 24h, 204, "");
  empty.response.headers.clear();
  ASSERT_TRUE(this->Reserve("empty", Reservation("o", "", this->Now())).ok());
  ASSERT_TRUE(this->Complete("empty", "o", empty).ok());
  EXPECT_EQ(this->MustGet("empty"), empty);
}

TYPED_TEST_P(StoreContractTest, ManyKeysAreKeptApart) {
  constexpr int kKeys = 10'000;
  auto key = [](int i) { return "t-tenant:project:subject:route:key-" + std::to_string(i); };
  std::vector<core::Record> done(kKeys);
  this->Run([&]() -> core::Task<void> {
    for (int i = 0; i < kKeys; ++i) {
      const std::string owner = "owner-" + std::to_string(i);
      core::Record r = Reservation(owner, Fingerprint(i), this->Now());
      auto res = co_await this->store_->Reserve(key(i), r, this->Now());
      EXPECT_TRUE(res.ok() && res->outcome == ReserveOutcome::kReserved) << i;
      done[i] = Completion(r, this->Now(), 24h, 200, "body-" + std::to_string(i));
      Status s = co_await this->store_->Complete(key(i), owner, done[i]);
      EXPECT_TRUE(s.ok()) << i << " " << s.ToString();
    }
  }());
  int mismatches = 0;
  this->Run([&]() -> core::Task<void> {
    for (int i = 0; i < kKeys; ++i) {
      auto got = co_await this->store_->Get(key(i), this->Now());
      if (!got.ok() || !got->has_value() || **got != done[i]) ++mismatches;
    }
  }());
  EXPECT_EQ(mismatches, 0);
  this->ExpectAbsent(key(kKeys));
  auto purged = this->Purge(key(17));
  ASSERT_TRUE(purged.ok() && purged->outcome == core::PurgeOutcome::kPurged);
  this->ExpectAbsent(key(17));
  EXPECT_EQ(this->MustGet(key(18)), done[18]);
}

TYPED_TEST_P(StoreContractTest, ConcurrentReservesOfOneKeyHaveExactlyOneWinner) {
  constexpr int kThreads = 8;
  constexpr int kKeys = 50;
  std::vector<std::atomic<int>> reserved(kKeys);
  std::vector<std::vector<std::string>> winner_seen(kThreads, std::vector<std::string>(kKeys));
  std::atomic<int> errors{0};
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  const UnixMillis now = this->Now();
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      boost::asio::io_context io;
      start.arrive_and_wait();
      RunOn(io, [&]() -> core::Task<bool> {
        for (int k = 0; k < kKeys; ++k) {
          const std::string owner = "owner-" + std::to_string(t);
          auto res = co_await this->store_->Reserve("race-" + std::to_string(k),
                                                    Reservation(owner, Fingerprint(1), now), now);
          if (!res.ok()) {
            errors.fetch_add(1);
          } else if (res->outcome == ReserveOutcome::kReserved) {
            reserved[k].fetch_add(1);
            winner_seen[t][k] = owner;
          } else if (res->outcome == ReserveOutcome::kExists && res->existing) {
            winner_seen[t][k] = res->existing->owner;
          } else {
            errors.fetch_add(1);
          }
        }
        co_return true;
      }());
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  for (int k = 0; k < kKeys; ++k) {
    EXPECT_EQ(reserved[k].load(), 1) << "key " << k;
    const std::string stored = this->MustGet("race-" + std::to_string(k)).owner;
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(winner_seen[t][k], stored) << "key " << k;
  }
}

TYPED_TEST_P(StoreContractTest, PingSucceeds) {
  Status s = this->Run(this->store_->Ping());
  EXPECT_TRUE(s.ok()) << s.ToString();
}

REGISTER_TYPED_TEST_SUITE_P(
    StoreContractTest, ReserveOnAbsentKeyWritesTheReservation,
    ReserveOnLiveInFlightKeyReturnsItUntouched, ReserveOnCompletedKeyReturnsItUntouched,
    CompleteByOwnerReplacesTheReservation, CompleteByOwnerWorksAfterTheLeaseEndedIfNobodyTookOver,
    CompleteByAnotherOwnerFailsAndLeavesTheRecord, CompleteOnAbsentKeyFails,
    CompleteOnCompletedKeyFailsEvenForItsOwner, ReleaseByOwnerDeletesAndTheKeyIsNewAgain,
    ReleaseByAnotherOwnerFailsAndLeavesTheRecord, ReleaseOfCompletedRecordFailsEvenForItsOwner,
    ReleaseOnAbsentKeyFails, GetOfAbsentKeyIsNullopt, PurgeDeletesWhateverTheState,
    PurgeUnlessInFlightLeavesALiveReservation, PurgeUnlessInFlightRemovesAReservationWhoseLeaseEnded,
    PurgeAnyRemovesALiveReservation, PurgeUnlessInFlightNeverTakesAReservationMadeBesideIt,
    LeaseExpiryLetsTheSameFingerprintTakeOver, LeaseExpiryDoesNotLetAnotherFingerprintTakeOver,
    CompletedRecordExpiresAfterRetention, ExpiredRecordCannotBeCompletedOrReleasedAgain,
    PurgeOfARecordPastRetentionFindsNothing,
    RetentionZeroKeepsTheRecordForever, RetentionDoesNotApplyToInFlightRecords,
    CompleteWakesAWaitingWatcher, ReleaseWakesAWatcher, PurgeWakesAWatcher,
    AWatchMadeBeforeACompletionNeverMissesIt, AWatchIsWokenByACompletionFromAnotherThread,
    WatchTimesOutWithoutAChange, LargeBodyRoundTrips, BinaryBytesRoundTrip, ManyKeysAreKeptApart,
    ConcurrentReservesOfOneKeyHaveExactlyOneWinner, PingSucceeds);

}  // namespace idemgate::contract
