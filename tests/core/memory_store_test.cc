#include "store/memory/memory_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine_test_util.h"

namespace idemgate::store::memory {
namespace {

using namespace std::chrono_literals;
using core::Record;
using core::RecordState;
using core::ReserveOutcome;
using core::testing::RunTask;

constexpr UnixMillis kT0 = 1'700'000'000'000;

Record Reservation(std::string owner, std::string fp = std::string(32, 'a'),
                   UnixMillis lease_end = kT0 + 30'000) {
  Record r;
  r.state = RecordState::kInFlight;
  r.fingerprint = std::move(fp);
  r.owner = std::move(owner);
  r.operation_id = "op_" + std::string(26, '0');
  r.created_ms = kT0;
  r.lease_expires_ms = lease_end;
  return r;
}

Record Completion(const Record& reservation, UnixMillis expires, std::string body = "hello") {
  Record r = reservation;
  r.state = RecordState::kCompleted;
  r.lease_expires_ms = 0;
  r.expires_ms = expires;
  r.response.status = 200;
  r.response.headers = {{"Content-Type", "text/plain"}};
  r.response.body = std::move(body);
  return r;
}

class MemoryStoreTest : public ::testing::Test {
 protected:
  FakeClock clock_{kT0};
  MemoryStore store_{1 << 20, clock_};
};

TEST_F(MemoryStoreTest, ReserveGetAndStats) {
  const Record res = Reservation("o1");
  auto r = store_.ReserveNow("k", res, kT0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->outcome, ReserveOutcome::kReserved);
  EXPECT_FALSE(r->existing.has_value());
  auto got = store_.GetNow("k", kT0);
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ(**got, res);
  EXPECT_EQ(store_.Stats().keys, 1u);
  EXPECT_EQ(store_.Stats().bytes, MemoryStore::ChargedBytes("k", res));
  EXPECT_FALSE(store_.GetNow("other", kT0)->has_value());
}

TEST_F(MemoryStoreTest, ReserveOnLiveRecordLeavesItUntouched) {
  const Record held = Reservation("o1");
  ASSERT_TRUE(store_.ReserveNow("k", held, kT0).ok());
  auto r = store_.ReserveNow("k", Reservation("o2"), kT0 + 1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->outcome, ReserveOutcome::kExists);
  EXPECT_EQ(r->existing, held);
  EXPECT_EQ(**store_.GetNow("k", kT0), held);
}

TEST_F(MemoryStoreTest, TakeoverOnlyWithEndedLeaseAndSameFingerprint) {
  const Record held = Reservation("o1", std::string(32, 'a'), kT0 + 100);
  ASSERT_TRUE(store_.ReserveNow("k", held, kT0).ok());
  // Other fingerprint: never taken over.
  auto other = store_.ReserveNow("k", Reservation("o2", std::string(32, 'b')), kT0 + 100);
  EXPECT_EQ(other->outcome, ReserveOutcome::kExists);
  // Same fingerprint, lease still valid one millisecond before its end.
  EXPECT_EQ(store_.ReserveNow("k", Reservation("o2"), kT0 + 99)->outcome, ReserveOutcome::kExists);
  auto taken = store_.ReserveNow("k", Reservation("o2"), kT0 + 100);
  ASSERT_TRUE(taken.ok());
  EXPECT_EQ(taken->outcome, ReserveOutcome::kTakenOver);
  EXPECT_EQ(taken->existing, held);
  EXPECT_EQ((*store_.GetNow("k", kT0))->owner, "o2");
  EXPECT_EQ(store_.Stats().keys, 1u);
}

TEST_F(MemoryStoreTest, CompletedPastRetentionIsReservedAgain) {
  const Record res = Reservation("o1");
  ASSERT_TRUE(store_.ReserveNow("k", res, kT0).ok());
  ASSERT_TRUE(store_.CompleteNow("k", "o1", Completion(res, kT0 + 1000)).ok());
  EXPECT_EQ(store_.ReserveNow("k", Reservation("o2"), kT0 + 999)->outcome, ReserveOutcome::kExists);
  auto again = store_.ReserveNow("k", Reservation("o2", std::string(32, 'z')), kT0 + 1000);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->outcome, ReserveOutcome::kReserved);
  EXPECT_EQ((*store_.GetNow("k", kT0 + 1000))->owner, "o2");
  EXPECT_EQ(store_.Stats().keys, 1u);
}

TEST_F(MemoryStoreTest, GetPastRetentionIsAbsentAndReclaims) {
  const Record res = Reservation("o1");
  ASSERT_TRUE(store_.ReserveNow("k", res, kT0).ok());
  ASSERT_TRUE(store_.CompleteNow("k", "o1", Completion(res, kT0 + 1000)).ok());
  EXPECT_TRUE(store_.GetNow("k", kT0 + 999)->has_value());
  EXPECT_FALSE(store_.GetNow("k", kT0 + 1000)->has_value());
  EXPECT_EQ(store_.Stats().keys, 0u);
  EXPECT_EQ(store_.Stats().bytes, 0u);
}

TEST_F(MemoryStoreTest, CompleteIsCompareAndSetOnTheOwner) {
  const Record res = Reservation("o1");
  EXPECT_EQ(store_.CompleteNow("k", "o1", Completion(res, 0)).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store_.ReserveNow("k", res, kT0).ok());
  EXPECT_EQ(store_.CompleteNow("k", "o2", Completion(res, 0)).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(**store_.GetNow("k", kT0), res);
  EXPECT_EQ(store_.CompleteNow("k", "o1", res).code(), StatusCode::kInvalidArgument);

  const Record done = Completion(res, 0);
  ASSERT_TRUE(store_.CompleteNow("k", "o1", done).ok());
  EXPECT_EQ(**store_.GetNow("k", kT0), done);
  EXPECT_EQ(store_.Stats().bytes, MemoryStore::ChargedBytes("k", done));
  // Completing twice fails and leaves the first completion.
  EXPECT_EQ(store_.CompleteNow("k", "o1", Completion(res, 0, "other")).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(**store_.GetNow("k", kT0), done);
}

TEST_F(MemoryStoreTest, CompleteAfterLeaseEndStillWorksWhileNobodyTookOver) {
  const Record res = Reservation("o1", std::string(32, 'a'), kT0 + 10);
  ASSERT_TRUE(store_.ReserveNow("k", res, kT0).ok());
  clock_.Advance(1h);
  EXPECT_TRUE(store_.CompleteNow("k", "o1", Completion(res, 0)).ok());
}

TEST_F(MemoryStoreTest, ReleaseOnlyByOwnerAndOnlyInFlight) {
  const Record res = Reservation("o1");
  EXPECT_EQ(store_.ReleaseNow("k", "o1").code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store_.ReserveNow("k", res, kT0).ok());
  EXPECT_EQ(store_.ReleaseNow("k", "o2").code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(store_.GetNow("k", kT0)->has_value());
  EXPECT_TRUE(store_.ReleaseNow("k", "o1").ok());
  EXPECT_FALSE(store_.GetNow("k", kT0)->has_value());
  EXPECT_EQ(store_.Stats().keys, 0u);
  EXPECT_EQ(store_.Stats().bytes, 0u);

  ASSERT_TRUE(store_.ReserveNow("k", res, kT0).ok());
  ASSERT_TRUE(store_.CompleteNow("k", "o1", Completion(res, 0)).ok());
  EXPECT_EQ(store_.ReleaseNow("k", "o1").code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(store_.GetNow("k", kT0)->has_value());
}

TEST_F(MemoryStoreTest, PurgeRemovesAnyState) {
  EXPECT_FALSE(store_.PurgeNow("k"));
  const Record res = Reservation("o1");
  ASSERT_TRUE(store_.ReserveNow("k", res, kT0).ok());
  EXPECT_TRUE(store_.PurgeNow("k"));
  ASSERT_TRUE(store_.ReserveNow("k", res, kT0).ok());
  ASSERT_TRUE(store_.CompleteNow("k", "o1", Completion(res, 0)).ok());
  EXPECT_TRUE(store_.PurgeNow("k"));
  EXPECT_FALSE(store_.GetNow("k", kT0)->has_value());
  EXPECT_EQ(store_.Stats().keys, 0u);
  EXPECT_EQ(store_.Stats().bytes, 0u);
}

// Past retention, or an abandoned reservation past its grace, a key is
// absent to Purge as it is to Get; the purge reclaims it all the same.
TEST_F(MemoryStoreTest, PurgePastRetentionOrGraceFindsNothingAndReclaims) {
  const Record res = Reservation("o1");
  ASSERT_TRUE(store_.ReserveNow("done", res, kT0).ok());
  ASSERT_TRUE(store_.CompleteNow("done", "o1", Completion(res, kT0 + 1000)).ok());
  ASSERT_TRUE(store_.ReserveNow("abandoned", res, kT0).ok());
  const UnixMillis gone_at = res.lease_expires_ms + MemoryStore::kReservationGrace.count();
  ASSERT_TRUE(store_.ReserveNow("abandoned-too", res, kT0).ok());
  EXPECT_EQ(store_.Stats().keys, 3u);

  core::PurgeResult purged = store_.PurgeNow("done", core::PurgeMode::kUnlessInFlight, kT0 + 1000);
  EXPECT_EQ(purged.outcome, core::PurgeOutcome::kAbsent);
  EXPECT_EQ(purged.state, std::nullopt);
  purged = store_.PurgeNow("abandoned", core::PurgeMode::kAny, gone_at - 1);
  EXPECT_EQ(purged.outcome, core::PurgeOutcome::kPurged);
  EXPECT_EQ(purged.state, RecordState::kInFlight);
  purged = store_.PurgeNow("abandoned-too", core::PurgeMode::kUnlessInFlight, gone_at);
  EXPECT_EQ(purged.outcome, core::PurgeOutcome::kAbsent);
  EXPECT_EQ(purged.state, std::nullopt);
  EXPECT_EQ(store_.Stats().keys, 0u);
  EXPECT_EQ(store_.Stats().bytes, 0u);
}

TEST_F(MemoryStoreTest, ReserveRejectsACompletedRecord) {
  EXPECT_EQ(store_.ReserveNow("k", Completion(Reservation("o"), 0), kT0).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(MemoryStoreBoundTest, FullReserveWritesNothing) {
  FakeClock clock(kT0);
  const Record res = Reservation("o1");
  const std::uint64_t one = MemoryStore::ChargedBytes("k1", res);
  MemoryStore store(2 * one + one / 2, clock);
  ASSERT_TRUE(store.ReserveNow("k1", res, kT0).ok());
  ASSERT_TRUE(store.ReserveNow("k2", res, kT0).ok());
  const core::StoreStats before = store.Stats();
  auto full = store.ReserveNow("k3", res, kT0);
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(store.GetNow("k3", kT0)->has_value());
  EXPECT_EQ(store.Stats().keys, before.keys);
  EXPECT_EQ(store.Stats().bytes, before.bytes);
  // Room comes back when a record goes.
  ASSERT_TRUE(store.ReleaseNow("k1", "o1").ok());
  EXPECT_TRUE(store.ReserveNow("k3", res, kT0).ok());
}

// The request of a reservation ran upstream: its completion is never refused
// for room (a refusal left the key reserved until its lease ended, and a
// retry then ran the request again). What does not fit whole is kept
// without its body, past max_bytes if need be.
TEST(MemoryStoreBoundTest, ACompletionWithoutRoomIsStoredWithoutItsBody) {
  FakeClock clock(kT0);
  const Record res = Reservation("o1");
  const std::uint64_t max_bytes = MemoryStore::ChargedBytes("k", res) + 10;
  MemoryStore store(max_bytes, clock);
  ASSERT_TRUE(store.ReserveNow("k", res, kT0).ok());
  const Record big = Completion(res, 0, std::string(100, 'x'));
  ASSERT_TRUE(store.CompleteNow("k", "o1", big).ok());
  auto got = store.GetNow("k", kT0);
  ASSERT_TRUE(got.ok() && got->has_value());
  Record expected = big;
  expected.response.body.clear();
  expected.response.body_omitted = true;
  EXPECT_EQ(**got, expected);
  EXPECT_EQ(store.Stats().bodies_dropped, 1u);
  EXPECT_EQ(store.Stats().bytes, MemoryStore::ChargedBytes("k", expected));
  EXPECT_GT(store.Stats().bytes, max_bytes);
  // Over max_bytes, nothing more is admitted until room comes back.
  EXPECT_EQ(store.ReserveNow("k2", Reservation("o2"), kT0).status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(store.PurgeNow("k"));
  EXPECT_EQ(store.Stats().bytes, 0u);
  EXPECT_TRUE(store.ReserveNow("k2", Reservation("o2"), kT0).ok());
}

TEST(MemoryStoreBoundTest, ACompletionThatFitsKeepsItsBody) {
  FakeClock clock(kT0);
  const Record res = Reservation("o1");
  const Record done = Completion(res, 0, std::string(100, 'x'));
  MemoryStore store(MemoryStore::ChargedBytes("k", done), clock);
  ASSERT_TRUE(store.ReserveNow("k", res, kT0).ok());
  ASSERT_TRUE(store.CompleteNow("k", "o1", done).ok());
  EXPECT_EQ(**store.GetNow("k", kT0), done);
  EXPECT_EQ(store.Stats().bodies_dropped, 0u);
}

// The repro: the store filled by other records, a reservation still fits but
// its response does not. Every reservation admitted completes; the store
// passes max_bytes by at most their status and headers.
TEST(MemoryStoreBoundTest, ReservationsAdmittedNearTheBoundAllComplete) {
  FakeClock clock(kT0);
  const Record res = Reservation("o1");
  const Record done = Completion(res, 0, std::string(300, 'x'));
  const std::uint64_t max_bytes = 2048;
  MemoryStore store(max_bytes, clock);
  std::vector<std::string> admitted;
  for (int i = 10; i < 40; ++i) {
    const std::string key = "k" + std::to_string(i);
    if (!store.ReserveNow(key, res, kT0).ok()) continue;
    admitted.push_back(key);
    ASSERT_TRUE(store.CompleteNow(key, "o1", done).ok()) << key;
  }
  ASSERT_GT(store.Stats().bodies_dropped, 0u);
  std::uint64_t whole = 0;
  for (const std::string& key : admitted) {
    auto got = store.GetNow(key, kT0);
    ASSERT_TRUE(got.ok() && got->has_value()) << key;
    EXPECT_EQ((*got)->state, RecordState::kCompleted);
    if (!(*got)->response.body_omitted) {
      EXPECT_EQ((*got)->response.body, done.response.body);
      ++whole;
    }
  }
  EXPECT_EQ(whole + store.Stats().bodies_dropped, admitted.size());
  Record slim = done;
  slim.response.body.clear();
  slim.response.body_omitted = true;
  EXPECT_LE(store.Stats().bytes, max_bytes + MemoryStore::ChargedBytes("k10", slim));
}

TEST(MemoryStoreBoundTest, FullStoreSweepsExpiredRecordsFirst) {
  FakeClock clock(kT0);
  const Record res = Reservation("o1");
  const Record done = Completion(res, kT0 + 1000);
  const std::uint64_t per_record = MemoryStore::ChargedBytes("k00", done);
  MemoryStore store(10 * per_record, clock, 4);
  for (int i = 0; i < 10; ++i) {
    const std::string key = "k" + std::to_string(10 + i).substr(0, 2);
    ASSERT_TRUE(store.ReserveNow(key, res, kT0).ok());
    ASSERT_TRUE(store.CompleteNow(key, "o1", done).ok());
  }
  // Needs the room of most records: more than the incremental sweep frees.
  const Record big = Reservation(std::string(6 * per_record, 'o'));
  ASSERT_LT(MemoryStore::ChargedBytes("new", big), 10 * per_record);
  EXPECT_EQ(store.ReserveNow("new", big, kT0).status().code(), StatusCode::kResourceExhausted);
  clock.Set(kT0 + 1000);
  EXPECT_TRUE(store.ReserveNow("new", big, kT0 + 1000).ok());
  EXPECT_EQ(store.Stats().keys, 1u);
  EXPECT_EQ(store.Stats().bytes, MemoryStore::ChargedBytes("new", big));
}

TEST(MemoryStoreBoundTest, FullStoreOfLiveRecordsDoesNotRescanOnEveryWrite) {
  // A store full of records whose retention has not ended: refusing a write
  // must not scan every shard each time (that made each refused request cost
  // a pass over every slot of the store).
  FakeClock clock(kT0);
  const Record res = Reservation("o1");
  const Record done = Completion(res, kT0 + 60'000);
  const std::uint64_t per_record = MemoryStore::ChargedBytes("k000", done);
  MemoryStore store(40 * per_record, clock, 8);
  int stored = 0;
  for (int i = 100; i < 200; ++i) {
    const std::string key = "k" + std::to_string(i);
    if (!store.ReserveNow(key, res, kT0).ok()) break;
    ASSERT_TRUE(store.CompleteNow(key, "o1", done).ok());
    ++stored;
  }
  ASSERT_GT(stored, 30);
  const std::uint64_t scans_when_full = store.full_sweeps();
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(store.ReserveNow("x" + std::to_string(i), res, kT0).status().code(),
              StatusCode::kResourceExhausted);
  }
  EXPECT_EQ(store.full_sweeps(), scans_when_full);
  // Once retention ends, the next write scans, frees and succeeds.
  clock.Set(kT0 + 60'000);
  EXPECT_TRUE(store.ReserveNow("after", res, kT0 + 60'000).ok());
  EXPECT_GT(store.full_sweeps(), scans_when_full);
  EXPECT_FALSE(store.GetNow("k100", kT0 + 60'000)->has_value());
}

TEST(MemoryStoreSweepTest, SweepRemovesOnlyExpiredCompletedRecords) {
  FakeClock clock(kT0);
  MemoryStore store(64 << 20, clock);
  const Record res = Reservation("o", std::string(32, 'a'), kT0 + 10);
  std::uint64_t kept_bytes = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string key = "k" + std::to_string(i);
    ASSERT_TRUE(store.ReserveNow(key, res, kT0).ok());
    if (i % 3 == 0) {
      kept_bytes += MemoryStore::ChargedBytes(key, res);  // stays in flight
      continue;
    }
    const Record done = Completion(res, i % 3 == 1 ? kT0 + 500 : 0);
    ASSERT_TRUE(store.CompleteNow(key, "o", done).ok());
    if (i % 3 == 2) kept_bytes += MemoryStore::ChargedBytes(key, done);
  }
  EXPECT_EQ(store.Sweep(kT0 + 499), 0u);
  EXPECT_EQ(store.Sweep(kT0 + 500), 100u);
  EXPECT_EQ(store.Stats().keys, 200u);
  EXPECT_EQ(store.Stats().bytes, kept_bytes);
  for (int i = 0; i < 300; ++i) {
    EXPECT_EQ(store.GetNow("k" + std::to_string(i), kT0 + 500)->has_value(), i % 3 != 1) << i;
  }
}

// A reservation whose owner never completes nor releases it (a gateway
// killed, a client that never retried) is kept past its lease for a takeover,
// then dropped kReservationGrace later so that its bytes come back.
TEST(MemoryStoreSweepTest, AbandonedReservationsAreDroppedAfterTheirLeaseAndGrace) {
  FakeClock clock(kT0);
  const UnixMillis lease_end = kT0 + 30'000;
  const Record res = Reservation("o1", std::string(32, 'a'), lease_end);
  const std::uint64_t one = MemoryStore::ChargedBytes("k1", res);
  MemoryStore store(3 * one, clock, 4);
  for (const char* key : {"k1", "k2", "k3"}) ASSERT_TRUE(store.ReserveNow(key, res, kT0).ok());
  const UnixMillis dropped_at = lease_end + MemoryStore::kReservationGrace.count();
  // Until the grace ends they hold their bytes: a new key finds no room, and
  // the same request takes an ended lease over.
  EXPECT_EQ(store.ReserveNow("k4", res, dropped_at - 1).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(store.Sweep(dropped_at - 1), 0u);
  const Record taken_res = Reservation("o2", std::string(32, 'a'), dropped_at + 60'000);
  auto taken = store.ReserveNow("k3", taken_res, dropped_at - 1);
  ASSERT_TRUE(taken.ok());
  EXPECT_EQ(taken->outcome, ReserveOutcome::kTakenOver);
  // Past the grace the abandoned ones are gone and their room is back.
  clock.Set(dropped_at);
  const Record fresh_res = Reservation("o1", std::string(32, 'a'), dropped_at + 30'000);
  auto fresh = store.ReserveNow("k4", fresh_res, dropped_at);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fresh->outcome, ReserveOutcome::kReserved);
  EXPECT_FALSE(store.GetNow("k1", dropped_at)->has_value());
  EXPECT_FALSE(store.GetNow("k2", dropped_at)->has_value());
  EXPECT_EQ(store.CompleteNow("k2", "o1", Completion(res, 0)).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.Stats().keys, 2u);  // k3 (taken over, its lease running) and k4
  EXPECT_EQ(store.Stats().bytes,
            MemoryStore::ChargedBytes("k3", taken_res) + MemoryStore::ChargedBytes("k4", fresh_res));
  EXPECT_TRUE(store.GetNow("k3", dropped_at)->has_value());
  // Sweep() drops them the same way, once their own grace has ended.
  const UnixMillis grace = MemoryStore::kReservationGrace.count();
  EXPECT_EQ(store.Sweep(fresh_res.lease_expires_ms + grace - 1), 0u);
  EXPECT_EQ(store.Sweep(taken_res.lease_expires_ms + grace), 2u);
  EXPECT_EQ(store.Stats().keys, 0u);
  EXPECT_EQ(store.Stats().bytes, 0u);
}

TEST(MemoryStoreSweepTest, IncrementalSweepReclaimsWithoutExplicitSweep) {
  FakeClock clock(kT0);
  MemoryStore store(64 << 20, clock, 1);
  const Record res = Reservation("o");
  for (int i = 0; i < 500; ++i) {
    const std::string key = "k" + std::to_string(i);
    ASSERT_TRUE(store.ReserveNow(key, res, kT0).ok());
    ASSERT_TRUE(store.CompleteNow(key, "o", Completion(res, kT0 + 1000)).ok());
  }
  EXPECT_EQ(store.Stats().keys, 500u);
  clock.Advance(1s);
  // Ordinary traffic on other keys reclaims the expired records.
  for (int i = 0; i < 2000 && store.Stats().keys > 0; ++i) {
    ASSERT_TRUE(store.GetNow("absent", clock.NowMillis()).ok());
  }
  EXPECT_EQ(store.Stats().keys, 0u);
  EXPECT_EQ(store.Stats().bytes, 0u);
}

// The hash table against std::map, with many insertions and deletions in one
// shard so that probing chains and backward-shift deletion are exercised.
TEST(MemoryStoreModelTest, RandomOperationsMatchAModel) {
  FakeClock clock(kT0);
  MemoryStore store(64 << 20, clock, 1);
  std::map<std::string, Record> model;
  std::mt19937 rng(42);
  for (int step = 0; step < 40000; ++step) {
    const std::string key = "key-" + std::to_string(rng() % 3000);
    const std::string owner = "o" + std::to_string(rng() % 2);
    switch (rng() % 4) {
      case 0: {
        const Record res = Reservation(owner, std::string(32, 'a'), kT0 + 1'000'000);
        auto r = store.ReserveNow(key, res, kT0);
        ASSERT_TRUE(r.ok());
        if (model.count(key) != 0) {
          ASSERT_EQ(r->outcome, ReserveOutcome::kExists);
        } else {
          ASSERT_EQ(r->outcome, ReserveOutcome::kReserved);
          model[key] = res;
        }
        break;
      }
      case 1: {
        auto it = model.find(key);
        const Record done = Completion(Reservation(owner), 0, std::to_string(step));
        const Status s = store.CompleteNow(key, owner, done);
        const bool should = it != model.end() && it->second.state == RecordState::kInFlight &&
                            it->second.owner == owner;
        ASSERT_EQ(s.ok(), should) << s.ToString();
        if (should) it->second = done;
        break;
      }
      case 2: {
        auto it = model.find(key);
        const bool should = it != model.end() && it->second.state == RecordState::kInFlight &&
                            it->second.owner == owner;
        ASSERT_EQ(store.ReleaseNow(key, owner).ok(), should);
        if (should) model.erase(it);
        break;
      }
      case 3: {
        if (rng() % 4 == 0) {
          ASSERT_EQ(store.PurgeNow(key), model.erase(key) == 1);
        } else {
          auto got = store.GetNow(key, kT0);
          ASSERT_TRUE(got.ok());
          auto it = model.find(key);
          ASSERT_EQ(got->has_value(), it != model.end());
          if (it != model.end()) {
            ASSERT_EQ(**got, it->second);
          }
        }
        break;
      }
    }
  }
  std::uint64_t bytes = 0;
  for (const auto& [k, r] : model) {
    bytes += MemoryStore::ChargedBytes(k, r);
    auto got = store.GetNow(k, kT0);
    ASSERT_TRUE(got->has_value()) << k;
    EXPECT_EQ(**got, r);
  }
  EXPECT_EQ(store.Stats().keys, model.size());
  EXPECT_EQ(store.Stats().bytes, bytes);
}

TEST(MemoryStoreConcurrencyTest, ExactlyOneReservationPerKeyAcrossThreads) {
  FakeClock clock(kT0);
  MemoryStore store(64 << 20, clock);
  constexpr int kThreads = 4;
  constexpr int kKeys = 2000;
  std::atomic<int> reserved{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kKeys; ++i) {
        auto r = store.ReserveNow("k" + std::to_string(i), Reservation("o" + std::to_string(t)), kT0);
        if (r.ok() && r->outcome == ReserveOutcome::kReserved) reserved.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(reserved.load(), kKeys);
  EXPECT_EQ(store.Stats().keys, static_cast<std::uint64_t>(kKeys));
}

class MemoryStoreWatchTest : public ::testing::Test {
 protected:
  // Makes a watch on "k", runs `change`, and reports whether the watch fired.
  bool FiresOn(const std::function<void()>& change) {
    return RunTask(ctx_, [&]() -> core::Task<bool> {
      auto watch = co_await store_.WatchKey("k");
      EXPECT_TRUE(watch.ok());
      change();
      co_return co_await (*watch)->Changed(5s);
    }());
  }

  FakeClock clock_{kT0};
  MemoryStore store_{1 << 20, clock_};
  boost::asio::io_context ctx_;
};

TEST_F(MemoryStoreWatchTest, CompleteReleaseAndPurgeWake) {
  const Record res = Reservation("o1");
  ASSERT_TRUE(store_.ReserveNow("k", res, kT0).ok());
  EXPECT_TRUE(FiresOn([&] { ASSERT_TRUE(store_.CompleteNow("k", "o1", Completion(res, 0)).ok()); }));
  EXPECT_TRUE(FiresOn([&] { ASSERT_TRUE(store_.PurgeNow("k")); }));
  ASSERT_TRUE(store_.ReserveNow("k", res, kT0).ok());
  EXPECT_TRUE(FiresOn([&] { ASSERT_TRUE(store_.ReleaseNow("k", "o1").ok()); }));
  EXPECT_EQ(store_.watchers(), 0u);
}

TEST_F(MemoryStoreWatchTest, TimesOutWithoutChange) {
  const bool fired = RunTask(ctx_, [&]() -> core::Task<bool> {
    auto watch = co_await store_.WatchKey("k");
    co_return co_await (*watch)->Changed(10ms);
  }());
  EXPECT_FALSE(fired);
}

TEST_F(MemoryStoreWatchTest, PingAndAsyncForms) {
  EXPECT_TRUE(RunTask(ctx_, store_.Ping()).ok());
  auto reserved = RunTask(ctx_, store_.Reserve("k", Reservation("o1"), kT0));
  ASSERT_TRUE(reserved.ok());
  EXPECT_EQ(reserved->outcome, ReserveOutcome::kReserved);
  auto got = RunTask(ctx_, store_.Get("k", kT0));
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_TRUE(RunTask(ctx_, store_.Complete("k", "o1", Completion(Reservation("o1"), 0))).ok());
  EXPECT_EQ(RunTask(ctx_, store_.Release("k", "o1")).code(), StatusCode::kFailedPrecondition);
  auto purged = RunTask(ctx_, store_.Purge("k", core::PurgeMode::kUnlessInFlight, kT0));
  ASSERT_TRUE(purged.ok());
  EXPECT_EQ(purged->outcome, core::PurgeOutcome::kPurged);
  EXPECT_EQ(purged->state, core::RecordState::kCompleted);
}

}  // namespace
}  // namespace idemgate::store::memory
