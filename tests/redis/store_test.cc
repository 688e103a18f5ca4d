#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <boost/asio/detached.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <algorithm>
#include <thread>
#include <future>
#include <iostream>

#include "core/engine.h"
#include "store/redis/redis_store.h"
#include "tests/redis/io_thread.h"
#include "tests/redis/redis_server.h"
#include "tests/redis/store_test_util.h"

namespace idemgate::store::redis {
namespace {

using namespace std::chrono_literals;
using core::Record;
using core::ReserveOutcome;
using testing::CompletedFrom;
using testing::Fingerprint;
using testing::InFlight;
using testing::IoThread;
using testing::RedisServer;
using testing::WaitUntil;

// calls=N of one command in INFO commandstats.
std::int64_t Calls(RedisServer& server, const std::string& command) {
  Reply info = server.Run({"INFO", "commandstats"});
  const std::string tag = "cmdstat_" + command + ":calls=";
  const auto at = info.str.find(tag);
  if (at == std::string::npos) return 0;
  return std::stoll(info.str.substr(at + tag.size()));
}

class RedisStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEMGATE_REQUIRE_REDIS();
    ASSERT_TRUE(server_.Start());
    store_ = MakeStore();
  }

  std::unique_ptr<RedisStore> MakeStore(Duration timeout = 1s, std::string key_prefix = "idemgate:") {
    RedisStore::Options o;
    o.addresses = {server_.address()};
    o.timeout = timeout;
    o.key_prefix = std::move(key_prefix);
    o.clock = &clock_;
    o.reconnect_min = 10ms;
    o.reconnect_max = 100ms;
    auto s = RedisStore::Connect(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  StatusOr<core::ReserveResult> Reserve(RedisStore& s, const std::string& key, const Record& r) {
    return io_.Run(s.Reserve(key, r, clock_.NowMillis()));
  }
  Status Complete(RedisStore& s, const std::string& key, const std::string& owner, const Record& r) {
    return io_.Run(s.Complete(key, owner, r));
  }
  StatusOr<std::optional<Record>> Get(RedisStore& s, const std::string& key) {
    return io_.Run(s.Get(key, clock_.NowMillis()));
  }

  RedisServer server_;
  FakeClock clock_;
  IoThread io_;
  std::unique_ptr<RedisStore> store_;
};

TEST_F(RedisStoreTest, ReserveWritesAnInFlightRecord) {
  const Record r = InFlight("owner-a", Fingerprint('a'), clock_.NowMillis());
  auto res = Reserve(*store_, "k1", r);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->outcome, ReserveOutcome::kReserved);
  EXPECT_FALSE(res->existing.has_value());

  auto got = Get(*store_, "k1");
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ(**got, r);
  EXPECT_EQ(server_.Run({"GET", store_->RecordKey("k1")}), Reply::String(core::EncodeRecord(r)))
      << "one Redis string per record, EncodeRecord bytes";
}

TEST_F(RedisStoreTest, ReserveOnALiveRecordReturnsItUntouched) {
  const Record first = InFlight("owner-a", Fingerprint('a'), clock_.NowMillis());
  ASSERT_EQ(Reserve(*store_, "k", first)->outcome, ReserveOutcome::kReserved);
  for (char fp : {'a', 'b'}) {
    auto again = Reserve(*store_, "k", InFlight("owner-b", Fingerprint(fp), clock_.NowMillis()));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->outcome, ReserveOutcome::kExists);
    ASSERT_TRUE(again->existing.has_value());
    EXPECT_EQ(*again->existing, first);
  }
  const Record done = CompletedFrom(first, clock_.NowMillis(), 60'000);
  ASSERT_TRUE(Complete(*store_, "k", "owner-a", done).ok());
  auto after = Reserve(*store_, "k", InFlight("owner-c", Fingerprint('a'), clock_.NowMillis()));
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->outcome, ReserveOutcome::kExists);
  EXPECT_EQ(*after->existing, done);
}

TEST_F(RedisStoreTest, ExpiredLeaseIsTakenOverOnlyWithTheSameFingerprint) {
  const Record first = InFlight("owner-a", Fingerprint('a'), clock_.NowMillis(), 1000);
  ASSERT_EQ(Reserve(*store_, "k", first)->outcome, ReserveOutcome::kReserved);
  clock_.Advance(1000ms);  // lease_expires_ms <= now: ended

  auto other = Reserve(*store_, "k", InFlight("owner-x", Fingerprint('x'), clock_.NowMillis()));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->outcome, ReserveOutcome::kExists);

  const Record second = InFlight("owner-b", Fingerprint('a'), clock_.NowMillis());
  auto taken = Reserve(*store_, "k", second);
  ASSERT_TRUE(taken.ok());
  EXPECT_EQ(taken->outcome, ReserveOutcome::kTakenOver);
  ASSERT_TRUE(taken->existing.has_value());
  EXPECT_EQ(*taken->existing, first);
  EXPECT_EQ(**Get(*store_, "k"), second);

  // The old owner lost the lease: its completion must not land.
  Status late = Complete(*store_, "k", "owner-a", CompletedFrom(first, clock_.NowMillis(), 60'000));
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition) << late.ToString();
  EXPECT_EQ(**Get(*store_, "k"), second);
}

TEST_F(RedisStoreTest, CompleteIsACompareAndSetOnTheOwner) {
  const Record r = InFlight("owner-a", Fingerprint('a'), clock_.NowMillis());
  const Record done = CompletedFrom(r, clock_.NowMillis(), 60'000);
  EXPECT_EQ(Complete(*store_, "k", "owner-a", done).code(), StatusCode::kFailedPrecondition) << "absent";

  ASSERT_EQ(Reserve(*store_, "k", r)->outcome, ReserveOutcome::kReserved);
  EXPECT_EQ(Complete(*store_, "k", "owner-b", done).code(), StatusCode::kFailedPrecondition) << "other owner";
  EXPECT_EQ(**Get(*store_, "k"), r) << "untouched";

  ASSERT_TRUE(Complete(*store_, "k", "owner-a", done).ok());
  EXPECT_EQ(**Get(*store_, "k"), done);
  EXPECT_EQ(Complete(*store_, "k", "owner-a", done).code(), StatusCode::kFailedPrecondition) << "completed";

  const auto pttl = server_.Run({"PTTL", store_->RecordKey("k")});
  EXPECT_GT(pttl.integer, 0);
  EXPECT_LE(pttl.integer, 60'000 + 1'000) << "retention TTL plus expiry_grace";
}

TEST_F(RedisStoreTest, CompleteRejectsAnInFlightRecord) {
  const Record r = InFlight("owner-a", Fingerprint('a'), clock_.NowMillis());
  ASSERT_EQ(Reserve(*store_, "k", r)->outcome, ReserveOutcome::kReserved);
  EXPECT_EQ(Complete(*store_, "k", "owner-a", r).code(), StatusCode::kInvalidArgument);
}

TEST_F(RedisStoreTest, TtlsFollowLeaseAndRetention) {
  const Record r = InFlight("owner-a", Fingerprint('a'), clock_.NowMillis(), 30'000);
  ASSERT_EQ(Reserve(*store_, "k", r)->outcome, ReserveOutcome::kReserved);
  const auto in_flight_ttl = server_.Run({"PTTL", store_->RecordKey("k")}).integer;
  EXPECT_GT(in_flight_ttl, 30'000) << "lease plus grace";
  EXPECT_LE(in_flight_ttl, 30'000 + 3'600'000);

  ASSERT_TRUE(Complete(*store_, "k", "owner-a", CompletedFrom(r, clock_.NowMillis(), 0)).ok());
  EXPECT_EQ(server_.Run({"PTTL", store_->RecordKey("k")}).integer, -1) << "retention 0: no TTL";
}

TEST_F(RedisStoreTest, CompletedRecordPastRetentionIsGoneAndReservableAgain) {
  const Record r = InFlight("owner-a", Fingerprint('a'), clock_.NowMillis());
  ASSERT_EQ(Reserve(*store_, "k", r)->outcome, ReserveOutcome::kReserved);
  ASSERT_TRUE(Complete(*store_, "k", "owner-a", CompletedFrom(r, clock_.NowMillis(), 5'000)).ok());
  clock_.Advance(5s);
  auto got = Get(*store_, "k");
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
  auto again = Reserve(*store_, "k", InFlight("owner-b", Fingerprint('z'), clock_.NowMillis()));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->outcome, ReserveOutcome::kReserved);
}

TEST_F(RedisStoreTest, ReleaseDeletesOnlyTheOwnersReservation) {
  const Record r = InFlight("owner-a", Fingerprint('a'), clock_.NowMillis());
  EXPECT_EQ(io_.Run(store_->Release("k", "owner-a")).code(), StatusCode::kFailedPrecondition);
  ASSERT_EQ(Reserve(*store_, "k", r)->outcome, ReserveOutcome::kReserved);
  EXPECT_EQ(io_.Run(store_->Release("k", "owner-b")).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Get(*store_, "k")->has_value());
  EXPECT_TRUE(io_.Run(store_->Release("k", "owner-a")).ok());
  EXPECT_FALSE(Get(*store_, "k")->has_value());

  ASSERT_EQ(Reserve(*store_, "k", r)->outcome, ReserveOutcome::kReserved);
  ASSERT_TRUE(Complete(*store_, "k", "owner-a", CompletedFrom(r, clock_.NowMillis(), 0)).ok());
  EXPECT_EQ(io_.Run(store_->Release("k", "owner-a")).code(), StatusCode::kFailedPrecondition)
      << "a completed record is never released";
  EXPECT_TRUE(Get(*store_, "k")->has_value());
}

TEST_F(RedisStoreTest, PurgeDeletesWhateverIsThere) {
  auto none = io_.Run(store_->Purge("k", core::PurgeMode::kAny, clock_.NowMillis()));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->outcome, core::PurgeOutcome::kAbsent);
  const Record r = InFlight("owner-a", Fingerprint('a'), clock_.NowMillis());
  ASSERT_EQ(Reserve(*store_, "k", r)->outcome, ReserveOutcome::kReserved);
  ASSERT_TRUE(Complete(*store_, "k", "owner-a", CompletedFrom(r, clock_.NowMillis(), 0)).ok());
  auto purged = io_.Run(store_->Purge("k", core::PurgeMode::kAny, clock_.NowMillis()));
  ASSERT_TRUE(purged.ok());
  EXPECT_EQ(purged->outcome, core::PurgeOutcome::kPurged);
  EXPECT_EQ(purged->state, core::RecordState::kCompleted);
  EXPECT_FALSE(Get(*store_, "k")->has_value());
}

// Redis keeps a completed record expiry_grace past its retention (and longer
// when its clock is behind the gateway's): the purge of a record still held
// but past its stored expiry finds it absent, as Get does, and deletes it.
TEST_F(RedisStoreTest, PurgeOfARecordPastRetentionStillHeldFindsNothingAndDeletesIt) {
  const Record r = InFlight("owner-a", Fingerprint('a'), clock_.NowMillis());
  ASSERT_EQ(Reserve(*store_, "k", r)->outcome, ReserveOutcome::kReserved);
  ASSERT_TRUE(Complete(*store_, "k", "owner-a", CompletedFrom(r, clock_.NowMillis(), 60'000)).ok());
  clock_.Advance(60s);  // the fake clock only: Redis holds it for a minute yet
  ASSERT_EQ(server_.Run({"EXISTS", store_->RecordKey("k")}).integer, 1) << "still held by its TTL";
  EXPECT_FALSE(Get(*store_, "k")->has_value());
  auto purged = io_.Run(store_->Purge("k", core::PurgeMode::kUnlessInFlight, clock_.NowMillis()));
  ASSERT_TRUE(purged.ok()) << purged.status().ToString();
  EXPECT_EQ(purged->outcome, core::PurgeOutcome::kAbsent);
  EXPECT_EQ(purged->state, std::nullopt);
  EXPECT_EQ(server_.Run({"EXISTS", store_->RecordKey("k")}).integer, 0);
}

TEST_F(RedisStoreTest, BinaryKeysFingerprintsAndLargeBodiesSurvive) {
  const std::string key = std::string("t-\x01\x02{tag}:\xff ", 11) + std::string(300, 'k');
  Record r = InFlight(std::string("own\0er", 6), std::string("\0\r\n\xff", 4) + std::string(28, '\0'),
                      clock_.NowMillis());
  ASSERT_EQ(Reserve(*store_, key, r)->outcome, ReserveOutcome::kReserved);
  std::string body(1 << 20, '\0');
  for (std::size_t i = 0; i < body.size(); ++i) body[i] = static_cast<char>(i * 31);
  const Record done = CompletedFrom(r, clock_.NowMillis(), 60'000, body);
  ASSERT_TRUE(Complete(*store_, key, r.owner, done).ok());
  auto got = Get(*store_, key);
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ(**got, done);
}

TEST_F(RedisStoreTest, ScriptsRunAsEvalshaAndRecoverFromAFlushedScriptCache) {
  const Record r = InFlight("owner-a", Fingerprint('a'), clock_.NowMillis());
  for (const char* key : {"k1", "k2", "k3", "k4"}) {
    ASSERT_EQ(Reserve(*store_, key, r)->outcome, ReserveOutcome::kReserved);
  }
  EXPECT_TRUE(io_.Run(store_->Release("k1", "owner-a")).ok());  // NOSCRIPT, then EVAL
  EXPECT_TRUE(io_.Run(store_->Release("k2", "owner-a")).ok());  // EVALSHA only
  EXPECT_TRUE(io_.Run(store_->Release("k3", "owner-a")).ok());
  EXPECT_EQ(Calls(server_, "evalsha"), 3);
  EXPECT_EQ(Calls(server_, "eval"), 1);
  ASSERT_TRUE(server_.Run({"SCRIPT", "FLUSH"}).str == "OK");
  EXPECT_TRUE(io_.Run(store_->Release("k4", "owner-a")).ok());
  EXPECT_EQ(Calls(server_, "eval"), 2);
  const auto gets = Calls(server_, "get");
  ASSERT_TRUE(Get(*store_, "k4").ok());
  EXPECT_EQ(Calls(server_, "get"), gets + 1) << "the hit path is one GET";
}

TEST_F(RedisStoreTest, ReserveIsOneSetNxGetUnlessTheRecordFoundMayBeReplaced) {
  const UnixMillis now = clock_.NowMillis();
  const Record a = InFlight("owner-a", Fingerprint('a'), now, 1000);
  const auto sets = Calls(server_, "set");
  // A new key: one SET, no script.
  ASSERT_EQ(Reserve(*store_, "k", a)->outcome, ReserveOutcome::kReserved);
  // A live reservation (another fingerprint, or lease not ended): answered by the same command.
  const Record b = InFlight("owner-b", Fingerprint('b'), now, 1000);
  auto exists = Reserve(*store_, "k", b);
  ASSERT_TRUE(exists.ok());
  EXPECT_EQ(exists->outcome, ReserveOutcome::kExists);
  ASSERT_TRUE(exists->existing.has_value());
  EXPECT_EQ(exists->existing->owner, "owner-a");
  EXPECT_EQ(Calls(server_, "set"), sets + 2);
  EXPECT_EQ(Calls(server_, "evalsha") + Calls(server_, "eval"), 0);
  // An ended lease with the same fingerprint needs the script, which takes it over.
  clock_.Advance(1000ms);
  const Record a2 = InFlight("owner-a2", Fingerprint('a'), clock_.NowMillis(), 1000);
  auto taken = Reserve(*store_, "k", a2);
  ASSERT_TRUE(taken.ok());
  EXPECT_EQ(taken->outcome, ReserveOutcome::kTakenOver);
  EXPECT_GE(Calls(server_, "evalsha") + Calls(server_, "eval"), 1);
  auto got = Get(*store_, "k");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->owner, "owner-a2");
}

TEST_F(RedisStoreTest, CorruptValuesAreInternalErrors) {
  ASSERT_EQ(server_.Run({"SET", store_->RecordKey("bad"), "not a record"}).str, "OK");
  auto got = Get(*store_, "bad");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kInternal);
  auto res = Reserve(*store_, "bad", InFlight("o", Fingerprint('a'), clock_.NowMillis()));
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), StatusCode::kInternal) << res.status().ToString();
  EXPECT_EQ(io_.Run(store_->Release("bad", "o")).code(), StatusCode::kInternal);
  // Purge removes it, even when sparing what is in flight: its state is unknown.
  auto purged = io_.Run(store_->Purge("bad", core::PurgeMode::kUnlessInFlight, clock_.NowMillis()));
  ASSERT_TRUE(purged.ok()) << purged.status().ToString();
  EXPECT_EQ(purged->outcome, core::PurgeOutcome::kPurged);
  EXPECT_FALSE(purged->state.has_value());
  EXPECT_EQ(server_.Run({"EXISTS", store_->RecordKey("bad")}).integer, 0);
}

TEST_F(RedisStoreTest, ConcurrentReservesFromTwoStoresAdmitExactlyOne) {
  auto other = MakeStore();
  IoThread other_io;
  std::vector<std::future<StatusOr<core::ReserveResult>>> futures;
  for (int i = 0; i < 40; ++i) {
    RedisStore& s = i % 2 ? *store_ : *other;
    IoThread& io = i % 2 ? io_ : other_io;
    futures.push_back(io.Start(
        s.Reserve("race", InFlight("owner-" + std::to_string(i), Fingerprint('a'), clock_.NowMillis()),
                  clock_.NowMillis())));
  }
  int reserved = 0, exists = 0;
  for (auto& f : futures) {
    auto r = f.get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (r->outcome == ReserveOutcome::kReserved) ++reserved;
    if (r->outcome == ReserveOutcome::kExists) ++exists;
  }
  EXPECT_EQ(reserved, 1);
  EXPECT_EQ(exists, 39);
}

// Two deployments on one Redis, each with its own store.redis.key_prefix,
// share nothing: the same key is reserved once in each, a completion in one
// is not seen by the other, and the records sit under each prefix.
TEST_F(RedisStoreTest, StoresWithDifferentKeyPrefixesShareNoRecords) {
  auto staging = MakeStore(1s, "staging:");
  ASSERT_NE(staging, nullptr);
  const UnixMillis now = clock_.NowMillis();
  auto a = Reserve(*store_, "k", InFlight("prod-owner", Fingerprint('a'), now));
  auto b = Reserve(*staging, "k", InFlight("staging-owner", Fingerprint('b'), now));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->outcome, ReserveOutcome::kReserved);
  EXPECT_EQ(b->outcome, ReserveOutcome::kReserved) << "the other prefix's reservation must not be seen";
  ASSERT_TRUE(Complete(*staging, "k", "staging-owner", CompletedFrom(InFlight("staging-owner", Fingerprint('b'), now), now,
                                                                       60'000))
                  .ok());
  auto prod = Get(*store_, "k");
  ASSERT_TRUE(prod.ok() && prod->has_value());
  EXPECT_EQ((*prod)->state, core::RecordState::kInFlight) << "still the default prefix's own reservation";
  EXPECT_EQ(server_.Run({"EXISTS", "idemgate:r:k"}).integer, 1);
  EXPECT_EQ(server_.Run({"EXISTS", "staging:r:k"}).integer, 1);
  EXPECT_EQ(server_.Run({"DBSIZE"}).integer, 2);
}

TEST_F(RedisStoreTest, AbandonedReservationIsTakenOverByAnotherInstance) {
  const Record mine = InFlight("gateway-1", Fingerprint('f'), clock_.NowMillis(), 2'000);
  {
    auto gateway1 = MakeStore();
    ASSERT_EQ(Reserve(*gateway1, "job", mine)->outcome, ReserveOutcome::kReserved);
  }  // gateway 1 vanishes without completing or releasing
  auto gateway2 = MakeStore();
  auto early = Reserve(*gateway2, "job", InFlight("gateway-2", Fingerprint('f'), clock_.NowMillis()));
  ASSERT_TRUE(early.ok());
  EXPECT_EQ(early->outcome, ReserveOutcome::kExists) << "lease still running";
  clock_.Advance(2001ms);
  const Record theirs = InFlight("gateway-2", Fingerprint('f'), clock_.NowMillis());
  auto taken = Reserve(*gateway2, "job", theirs);
  ASSERT_TRUE(taken.ok());
  EXPECT_EQ(taken->outcome, ReserveOutcome::kTakenOver);
  EXPECT_EQ(taken->existing->owner, "gateway-1");
  ASSERT_TRUE(Complete(*gateway2, "job", "gateway-2", CompletedFrom(theirs, clock_.NowMillis(), 60'000)).ok());
  EXPECT_EQ((*Get(*store_, "job"))->owner, "gateway-2");
}

TEST_F(RedisStoreTest, WatcherIsWokenByACompletionFromAnotherInstance) {
  auto gateway2 = MakeStore();
  const Record r = InFlight("g2", Fingerprint('a'), clock_.NowMillis());
  ASSERT_EQ(Reserve(*gateway2, "k", r)->outcome, ReserveOutcome::kReserved);
  auto watch = io_.Run(store_->WatchKey("k"));
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  auto changed = io_.Start((*watch)->Changed(30s));
  ASSERT_TRUE(Complete(*gateway2, "k", "g2", CompletedFrom(r, clock_.NowMillis(), 60'000)).ok());
  EXPECT_TRUE(changed.get());
  EXPECT_TRUE(io_.Run((*watch)->Changed(0ms))) << "stays changed";
  EXPECT_EQ((*Get(*store_, "k"))->state, core::RecordState::kCompleted);
}

TEST_F(RedisStoreTest, WatcherIsWokenByReleaseAndPurge) {
  const Record r = InFlight("a", Fingerprint('a'), clock_.NowMillis());
  ASSERT_EQ(Reserve(*store_, "k", r)->outcome, ReserveOutcome::kReserved);
  {
    auto watch = io_.Run(store_->WatchKey("k"));
    ASSERT_TRUE(watch.ok());
    auto changed = io_.Start((*watch)->Changed(30s));
    ASSERT_TRUE(io_.Run(store_->Release("k", "a")).ok());
    EXPECT_TRUE(changed.get());
  }
  ASSERT_EQ(Reserve(*store_, "k", r)->outcome, ReserveOutcome::kReserved);
  auto watch = io_.Run(store_->WatchKey("k"));
  ASSERT_TRUE(watch.ok());
  auto changed = io_.Start((*watch)->Changed(30s));
  ASSERT_EQ(io_.Run(store_->Purge("k", core::PurgeMode::kAny, clock_.NowMillis()))->outcome,
            core::PurgeOutcome::kPurged);
  EXPECT_TRUE(changed.get());
}

TEST_F(RedisStoreTest, WatchWithoutChangeTimesOut) {
  const Record r = InFlight("a", Fingerprint('a'), clock_.NowMillis());
  ASSERT_EQ(Reserve(*store_, "k", r)->outcome, ReserveOutcome::kReserved);
  auto watch = io_.Run(store_->WatchKey("k"));
  ASSERT_TRUE(watch.ok());
  EXPECT_FALSE(io_.Run((*watch)->Changed(300ms)));
}

TEST_F(RedisStoreTest, LostMessageOnlyDelaysTheWaiterPollingSeesTheChange) {
  const Record r = InFlight("a", Fingerprint('a'), clock_.NowMillis());
  ASSERT_EQ(Reserve(*store_, "k", r)->outcome, ReserveOutcome::kReserved);
  auto watch = io_.Run(store_->WatchKey("k"));
  ASSERT_TRUE(watch.ok());
  auto changed = io_.Start((*watch)->Changed(30s));
  // Written behind the store's back: no PUBLISH, only polling can notice.
  const Record done = CompletedFrom(r, clock_.NowMillis(), 0);
  ASSERT_EQ(server_.Run({"SET", store_->RecordKey("k"), core::EncodeRecord(done)}).str, "OK");
  EXPECT_TRUE(changed.get());
}

TEST_F(RedisStoreTest, WatchersShareOneSubscriptionPerKey) {
  const std::string channel = store_->ChannelName("k");
  auto numsub = [&] {
    Reply r = server_.Run({"PUBSUB", "NUMSUB", channel});
    return r.elements.size() == 2 ? r.elements[1].integer : -1;
  };
  {
    auto w1 = io_.Run(store_->WatchKey("k"));
    auto w2 = io_.Run(store_->WatchKey("k"));
    ASSERT_TRUE(w1.ok());
    ASSERT_TRUE(w2.ok());
    EXPECT_EQ(numsub(), 1);
    w1->reset();
    EXPECT_TRUE(WaitUntil([&] { return numsub() == 1; }));
  }
  EXPECT_TRUE(WaitUntil([&] { return numsub() == 0; })) << "unsubscribed after the last watch";
}

TEST_F(RedisStoreTest, WatcherSurvivesARestartOfTheServer) {
  auto watch = io_.Run(store_->WatchKey("k"));
  ASSERT_TRUE(watch.ok());
  server_.Kill();
  ASSERT_TRUE(server_.Start());
  const Record r = InFlight("a", Fingerprint('a'), clock_.NowMillis());
  ASSERT_TRUE(WaitUntil([&] {
    auto res = Reserve(*store_, "k", r);
    return res.ok();
  }));
  EXPECT_TRUE(io_.Run((*watch)->Changed(30s)));
}

TEST_F(RedisStoreTest, PingAndStats) {
  EXPECT_TRUE(io_.Run(store_->Ping()).ok());
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(Reserve(*store_, "s" + std::to_string(i), InFlight("o", Fingerprint('a'), clock_.NowMillis())).ok());
  }
  EXPECT_TRUE(WaitUntil([&] { return store_->Stats().keys >= 10; }, 20s));
  EXPECT_GT(store_->Stats().bytes, 0u);
  server_.Kill();
  Status down = io_.Run(store_->Ping());
  EXPECT_EQ(down.code(), StatusCode::kUnavailable) << down.ToString();
}

// "Killed mid-run": workers keep going while the server dies and comes back.
core::Task<int> Worker(RedisStore& store, const Clock& clock, int id, std::atomic<bool>& stop,
                       std::atomic<int>& ok, std::atomic<int>& down, std::atomic<int>& other,
                       std::atomic<std::int64_t>& slowest_failure_ms) {
  for (int i = 0; !stop.load(); ++i) {
    const std::string key = "w" + std::to_string(id) + "-" + std::to_string(i);
    const Record r = InFlight("o" + std::to_string(id), Fingerprint('w'), clock.NowMillis());
    const auto start = std::chrono::steady_clock::now();
    auto res = co_await store.Reserve(key, r, clock.NowMillis());
    Status s = res.status();
    if (res.ok()) s = co_await store.Complete(key, r.owner, CompletedFrom(r, clock.NowMillis(), 60'000));
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    if (s.ok()) {
      ok.fetch_add(1);
    } else if (s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded ||
               s.code() == StatusCode::kFailedPrecondition) {
      // FailedPrecondition: the reservation died with the server (no persistence).
      down.fetch_add(1);
      std::int64_t prev = slowest_failure_ms.load();
      while (ms > prev && !slowest_failure_ms.compare_exchange_weak(prev, ms)) {
      }
    } else {
      other.fetch_add(1);
      std::cerr << "unexpected: " << s.ToString() << "\n";
    }
  }
  co_return id;
}

TEST_F(RedisStoreTest, ServerKilledMidRunFailsFastAndRecoversAfterRestart) {
  auto store = MakeStore(200ms);
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, down{0}, other{0};
  std::atomic<std::int64_t> slowest{0};
  std::vector<std::future<int>> workers;
  for (int i = 0; i < 16; ++i) {
    workers.push_back(io_.Start(Worker(*store, clock_, i, stop, ok, down, other, slowest)));
  }
  ASSERT_TRUE(WaitUntil([&] { return ok.load() > 200; }));
  server_.Kill();
  ASSERT_TRUE(WaitUntil([&] { return down.load() > 200; })) << "ops fail while the server is gone";
  const int ok_while_down = ok.load();
  ASSERT_TRUE(server_.Start());
  EXPECT_TRUE(WaitUntil([&] { return ok.load() > ok_while_down + 200; })) << "and succeed again after a restart";
  stop = true;
  for (auto& w : workers) {
    ASSERT_EQ(w.wait_for(30s), std::future_status::ready) << "a worker hung";
    w.get();
  }
  EXPECT_EQ(other.load(), 0);
  std::cout << "[ figures ] ok=" << ok.load() << " failed=" << down.load()
            << " slowest failed Reserve+Complete=" << slowest.load() << "ms (timeout 200ms)\n";
}

TEST_F(RedisStoreTest, HungServerGivesDeadlineExceeded) {
  auto store = MakeStore(200ms);
  ASSERT_TRUE(io_.Run(store->Ping()).ok());
  server_.Pause();
  auto res = Reserve(*store, "k", InFlight("o", Fingerprint('a'), clock_.NowMillis()));
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), StatusCode::kDeadlineExceeded) << res.status().ToString();
  server_.Resume();
  EXPECT_TRUE(WaitUntil([&] { return io_.Run(store->Ping()).ok(); }));
}

TEST_F(RedisStoreTest, RecordMemoryUsage) {
  const Record r = InFlight("0123456789abcdef0123456789abcdef", Fingerprint('m'), clock_.NowMillis());
  const std::string key = "t-acme:billing:user:42:payments:4f9c1a2e-8d7b-4c3e-9a51-2b6f0d7e3c18";
  ASSERT_EQ(Reserve(*store_, key, r)->outcome, ReserveOutcome::kReserved);
  Record done = CompletedFrom(r, clock_.NowMillis(), 86'400'000, std::string(200, 'b'));
  done.response.headers = {{"Content-Type", "application/json"},
                           {"Content-Length", "200"},
                           {"X-Request-Id", "9b2f0c1d-2e3f-4a5b-8c7d-1e2f3a4b5c6d"}};
  ASSERT_TRUE(Complete(*store_, key, r.owner, done).ok());
  Reply usage = server_.Run({"MEMORY", "USAGE", store_->RecordKey(key), "SAMPLES", "0"});
  ASSERT_EQ(usage.type, Reply::Type::kInteger) << usage.DebugString();
  const auto encoded = core::EncodedSize(done);
  EXPECT_GT(static_cast<std::size_t>(usage.integer), encoded);
  std::cout << "[ figures ] record with a 200-byte body: encoded " << encoded << " B, MEMORY USAGE "
            << usage.integer << " B (key " << store_->RecordKey(key).size() << " B)\n";
}

TEST(RedisStoreOptionsTest, ValidatesOptions) {
  RedisStore::Options o;
  EXPECT_EQ(RedisStore::Connect(o).status().code(), StatusCode::kInvalidArgument) << "no address";
  o.addresses = {"127.0.0.1:1", "127.0.0.1:2"};
  EXPECT_EQ(RedisStore::Connect(o).status().code(), StatusCode::kInvalidArgument) << "two, not a cluster";
  o.addresses = {"127.0.0.1"};
  EXPECT_EQ(RedisStore::Connect(o).status().code(), StatusCode::kInvalidArgument) << "no port";
  o.addresses = {"127.0.0.1:6379"};
  o.timeout = 0ms;
  EXPECT_EQ(RedisStore::Connect(o).status().code(), StatusCode::kInvalidArgument) << "zero timeout";
  o.timeout = 200ms;
  for (const char* prefix : {"", "{prod}:", "a b", "\x01"}) {
    o.key_prefix = prefix;
    EXPECT_EQ(RedisStore::Connect(o).status().code(), StatusCode::kInvalidArgument) << "key prefix " << prefix;
  }
  o.key_prefix = "idemgate:";
  o.username = "gateway";
  EXPECT_EQ(RedisStore::Connect(o).status().code(), StatusCode::kInvalidArgument) << "a user without a password";
}

TEST(RedisStoreOptionsTest, ReadsThePasswordFromTheNamedVariable) {
  config::Redis cfg;
  cfg.addresses = {"10.0.0.1:6379", "10.0.0.2:6379"};
  cfg.cluster = true;
  cfg.timeout = 150ms;
  cfg.username = "gateway";
  cfg.key_prefix = "staging:";
  cfg.password_env = "IDEMGATE_TEST_REDIS_PASSWORD_UNSET";
  ::unsetenv(cfg.password_env.c_str());
  EXPECT_EQ(RedisStore::OptionsFromConfig(cfg).status().code(), StatusCode::kInvalidArgument);
  ::setenv(cfg.password_env.c_str(), "hunter2", 1);
  auto o = RedisStore::OptionsFromConfig(cfg);
  ::unsetenv(cfg.password_env.c_str());
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->password, "hunter2");
  EXPECT_EQ(o->username, "gateway");
  EXPECT_EQ(o->key_prefix, "staging:");
  EXPECT_EQ(o->addresses, cfg.addresses);
  EXPECT_TRUE(o->cluster);
  EXPECT_EQ(o->timeout, 150ms);
}

class RedisStoreAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEMGATE_REQUIRE_REDIS();
    RedisServer::Options o;
    o.password = "pw";
    server_ = std::make_unique<RedisServer>(o);
    ASSERT_TRUE(server_->Start());
  }
  std::unique_ptr<RedisServer> server_;
  IoThread io_;
};

TEST_F(RedisStoreAuthTest, NeedsThePassword) {
  RedisStore::Options o;
  o.addresses = {server_->address()};
  auto without = RedisStore::Connect(o);
  ASSERT_TRUE(without.ok());
  EXPECT_EQ(io_.Run((*without)->Ping()).code(), StatusCode::kUnavailable);
  o.password = "pw";
  auto with = RedisStore::Connect(o);
  ASSERT_TRUE(with.ok());
  EXPECT_TRUE(io_.Run((*with)->Ping()).ok());
  EXPECT_TRUE(io_.Run((*with)->Purge("x", core::PurgeMode::kAny, SystemClock::Instance().NowMillis())).ok());
}

// An ACL user (store.redis.username) authenticates with its own password
// and is held to its own key pattern: a user allowed only `team-a:*` works
// with that prefix and is refused with any other.
TEST(RedisStoreAclTest, AUserAuthenticatesAndIsHeldToItsKeyPattern) {
  IDEMGATE_REQUIRE_REDIS();
  RedisServer::Options so;
  so.password = "pw";
  so.extra = {"--user", "gateway", "on", ">gw-secret", "~team-a:*", "&team-a:*", "+@all"};
  RedisServer server(so);
  ASSERT_TRUE(server.Start());
  IoThread io;
  RedisStore::Options o;
  o.addresses = {server.address()};
  o.username = "gateway";
  o.password = "gw-secret";
  o.key_prefix = "team-a:";
  auto allowed = RedisStore::Connect(o);
  ASSERT_TRUE(allowed.ok());
  EXPECT_TRUE(io.Run((*allowed)->Ping()).ok());
  auto reserved = io.Run((*allowed)->Reserve("k", InFlight("o", Fingerprint('a'), 1000), 1000));
  ASSERT_TRUE(reserved.ok()) << reserved.status().ToString();
  EXPECT_EQ(reserved->outcome, ReserveOutcome::kReserved);
  EXPECT_EQ(server.Run({"EXISTS", "team-a:r:k"}).integer, 1);

  o.key_prefix = "team-b:";
  auto refused = RedisStore::Connect(o);
  ASSERT_TRUE(refused.ok());
  EXPECT_FALSE(io.Run((*refused)->Reserve("k", InFlight("o", Fingerprint('a'), 1000), 1000)).ok())
      << "the ACL allows team-a:* only";
  o.key_prefix = "team-a:";
  o.password = "wrong";
  auto wrong = RedisStore::Connect(o);
  ASSERT_TRUE(wrong.ok());
  EXPECT_EQ(io.Run((*wrong)->Ping()).code(), StatusCode::kUnavailable);
}

// A gateway worker as the server runs one: attaches to the store on its own
// thread, runs its io_context, detaches on the same thread once stopped.
class AttachedWorker {
 public:
  explicit AttachedWorker(core::Store& store)
      : store_(store), work_(io_.get_executor()), thread_([this] {
          store_.AttachWorker(io_);
          attached_.set_value();
          io_.run();
          store_.DetachWorker(io_);
        }) {
    attached_.get_future().wait();
  }
  ~AttachedWorker() { Stop(); }

  void Stop() {
    if (!thread_.joinable()) return;
    work_.reset();
    io_.stop();
    thread_.join();
  }

  void Spawn(core::Task<void> task) { boost::asio::co_spawn(io_, std::move(task), boost::asio::detached); }

  template <typename T>
  T Run(core::Task<T> task) {
    std::promise<T> done;
    auto result = done.get_future();
    boost::asio::co_spawn(
        io_, [&done, t = std::move(task)]() mutable -> core::Task<void> { done.set_value(co_await std::move(t)); },
        boost::asio::detached);
    return result.get();
  }

 private:
  core::Store& store_;
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::promise<void> attached_;
  std::thread thread_;
};

TEST_F(RedisStoreTest, AnAttachedWorkerRunsItsCommandsOnItsOwnConnection) {
  auto count = [](const std::string& list) { return std::count(list.begin(), list.end(), '\n'); };
  ASSERT_TRUE(Get(*store_, "warm-up").ok());  // the store's own connection is up
  const auto clients_before = count(server_.Run({"CLIENT", "LIST"}).str);
  auto worker = std::make_unique<AttachedWorker>(*store_);
  EXPECT_EQ(store_->attached_workers(), 1u);
  const std::uint64_t shared_before = store_->client().commands();

  const Record r = InFlight("w", Fingerprint('a'), clock_.NowMillis());
  auto reserved = worker->Run(store_->Reserve("k", r, clock_.NowMillis()));
  ASSERT_TRUE(reserved.ok()) << reserved.status().ToString();
  EXPECT_EQ(reserved->outcome, ReserveOutcome::kReserved);
  ASSERT_TRUE(worker->Run(store_->Complete("k", "w", CompletedFrom(r, clock_.NowMillis(), 60'000))).ok());
  auto got = worker->Run(store_->Get("k", clock_.NowMillis()));
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->state, core::RecordState::kCompleted);
  EXPECT_TRUE(worker->Run(store_->Ping()).ok());
  // None of it went through the store's own client (its thread)...
  EXPECT_EQ(store_->client().commands(), shared_before);
  // ...which callers on other threads still use, seeing the same data.
  EXPECT_EQ((*Get(*store_, "k"))->state, core::RecordState::kCompleted);
  EXPECT_GT(store_->client().commands(), shared_before);
  // The worker has a connection of its own.
  EXPECT_EQ(count(server_.Run({"CLIENT", "LIST"}).str), clients_before + 1);

  // A watch made on the worker is woken by a change made elsewhere.
  const Record r2 = InFlight("o", Fingerprint('b'), clock_.NowMillis());
  ASSERT_EQ(Reserve(*store_, "k2", r2)->outcome, ReserveOutcome::kReserved);
  std::promise<bool> woken;
  auto woken_future = woken.get_future();
  std::thread waiter([&] {
    woken.set_value(worker->Run([](RedisStore& s) -> core::Task<bool> {
      auto watch = co_await s.WatchKey("k2");
      if (!watch.ok()) co_return false;
      co_return co_await (*watch)->Changed(30s);
    }(*store_)));
  });
  std::this_thread::sleep_for(100ms);
  ASSERT_TRUE(Complete(*store_, "k2", "o", CompletedFrom(r2, clock_.NowMillis(), 60'000)).ok());
  EXPECT_TRUE(woken_future.get());
  waiter.join();

  // Detaching on stop closes the worker's connection; the store goes on.
  const auto clients_attached = count(server_.Run({"CLIENT", "LIST"}).str);
  worker.reset();
  EXPECT_EQ(store_->attached_workers(), 0u);
  EXPECT_TRUE(WaitUntil([&] { return count(server_.Run({"CLIENT", "LIST"}).str) == clients_attached - 1; }));
  EXPECT_EQ((*Get(*store_, "k"))->state, core::RecordState::kCompleted);
}

// A watch made on a worker ends there, but its subscription is removed on
// the store's client thread, which may get to it only after the worker has
// detached and its io_context is gone: what it releases then must not belong
// to that io_context (under ASan this was a use after free).
TEST_F(RedisStoreTest, AWatchReleasedAfterItsWorkerIsGoneTouchesNothingOfTheWorker) {
  auto worker = std::make_unique<AttachedWorker>(*store_);
  std::unique_ptr<core::Watch> watch;
  ASSERT_TRUE(worker->Run([](RedisStore& s, std::unique_ptr<core::Watch>& out) -> core::Task<bool> {
    auto made = co_await s.WatchKey("left-behind");
    if (!made.ok()) co_return false;
    out = std::move(*made);
    co_return true;
  }(*store_, watch)));

  // Hold the client thread, end the watch on the worker, and let the worker
  // go before the client thread runs the removal posted by the watch.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  boost::asio::post(store_->client().executor(), [released] { released.wait(); });
  EXPECT_TRUE(worker->Run([](std::unique_ptr<core::Watch>& w) -> core::Task<bool> {
    w.reset();
    co_return true;
  }(watch)));
  worker.reset();
  release.set_value();

  // A command through the client thread runs after the removal; a change
  // published on the channel now finds no listener.
  const Record r = InFlight("o", Fingerprint('c'), clock_.NowMillis());
  ASSERT_EQ(Reserve(*store_, "left-behind", r)->outcome, ReserveOutcome::kReserved);
  EXPECT_TRUE(Complete(*store_, "left-behind", "o", CompletedFrom(r, clock_.NowMillis(), 60'000)).ok());
  EXPECT_EQ((*Get(*store_, "left-behind"))->state, core::RecordState::kCompleted);
}

TEST_F(RedisStoreTest, AWorkerStoppedWithACommandOutstandingDetachesCleanly) {
  // The server stops a worker whatever is pending; the worker's client and
  // its connection must go with it, and nothing may touch them afterwards.
  auto worker = std::make_unique<AttachedWorker>(*store_);
  const Record r = InFlight("w", Fingerprint('a'), clock_.NowMillis());
  ASSERT_TRUE(worker->Run(store_->Ping()).ok());  // its connection is up
  server_.Run({"CLIENT", "PAUSE", "700", "ALL"});  // Redis holds every reply
  std::atomic<bool> finished{false};
  worker->Spawn([](RedisStore* s, Record rec, UnixMillis now, std::atomic<bool>* f) -> core::Task<void> {
    (void)co_await s->Reserve("paused", std::move(rec), now);
    *f = true;
  }(store_.get(), r, clock_.NowMillis(), &finished));
  std::this_thread::sleep_for(100ms);  // the command is on the wire
  worker.reset();                      // stop and detach with it outstanding
  EXPECT_FALSE(finished.load());
  EXPECT_EQ(store_->attached_workers(), 0u);
  // The store's own client is unaffected once Redis answers again.
  auto after = Reserve(*store_, "after", r);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(after->outcome, ReserveOutcome::kReserved);
}


// What Redis refuses or holds when it takes no writes: the reserve's write
// fails, and the read that follows decides as the write's reply would have.
class RedisNoWritesTest : public RedisStoreTest {
 protected:
  void SetUp() override {
    RedisStoreTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    nw_ = MakeStore(200ms);
  }

  StatusOr<core::ReserveResult> Reserve(RedisStore& s, const std::string& key, const Record& r) {
    return bg_.Run(s.Reserve(key, r, clock_.NowMillis()));
  }

  // k-done: completed; k-held: in flight with a valid lease; k-ended: in
  // flight, lease ended, same fingerprint as the retries below.
  void StoreRecords(RedisStore& s) {
    done_ = InFlight("owner-done", Fingerprint('a'), clock_.NowMillis());
    ASSERT_EQ(Reserve(s, "k-done", done_)->outcome, ReserveOutcome::kReserved);
    done_ = CompletedFrom(done_, clock_.NowMillis(), 60'000);
    ASSERT_TRUE(Complete(s, "k-done", "owner-done", done_).ok());
    held_ = InFlight("owner-held", Fingerprint('a'), clock_.NowMillis(), 60'000);
    ASSERT_EQ(Reserve(s, "k-held", held_)->outcome, ReserveOutcome::kReserved);
    const Record ended = InFlight("owner-ended", Fingerprint('a'), clock_.NowMillis() - 10'000, 5'000);
    ASSERT_EQ(Reserve(s, "k-ended", ended)->outcome, ReserveOutcome::kReserved);
  }

  core::BeginResult Begin(RedisStore& s, const std::string& key, core::InFlightMode mode,
                          Duration wait = 300ms) {
    core::Engine engine(s, clock_);
    core::KeyedRequest r;
    r.key = key;
    r.fingerprint = Fingerprint('a');
    r.lease = 2s;  // bounds the engine's clean-up after a failed reserve
    r.in_flight = mode;
    r.wait_timeout = wait;
    return bg_.Run(engine.Begin(std::move(r)));
  }

  // Reserves and engine decisions while writes fail with `write_failure`.
  // Begin outcomes other than kStoreError never reach store.on_error: a
  // fail_closed gateway does not answer 503 and a fail_open one does not
  // forward.
  void ExpectDecisionsOnRecords(RedisStore& s, std::vector<StatusCode> write_failures) {
    auto failed_as_the_write = [&](const Status& status) {
      return std::find(write_failures.begin(), write_failures.end(), status.code()) != write_failures.end();
    };
    const Record retry = InFlight("owner-retry", Fingerprint('a'), clock_.NowMillis());
    auto done = Reserve(s, "k-done", retry);
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    EXPECT_EQ(done->outcome, ReserveOutcome::kExists);
    EXPECT_EQ(*done->existing, done_);
    auto held = Reserve(s, "k-held", retry);
    ASSERT_TRUE(held.ok()) << held.status().ToString();
    EXPECT_EQ(held->outcome, ReserveOutcome::kExists);
    EXPECT_EQ(*held->existing, held_);
    // A record the write would have replaced, and no record: the write was needed.
    const Status ended = Reserve(s, "k-ended", retry).status();
    EXPECT_TRUE(failed_as_the_write(ended)) << ended.ToString();
    const Status fresh = Reserve(s, "k-new", retry).status();
    EXPECT_TRUE(failed_as_the_write(fresh)) << fresh.ToString();

    const core::BeginResult replay = Begin(s, "k-done", core::InFlightMode::kReject);
    EXPECT_EQ(replay.outcome, core::BeginOutcome::kReplay) << replay.status.ToString();
    ASSERT_TRUE(replay.record.has_value());
    EXPECT_EQ(replay.record->response.body, done_.response.body);
    const core::BeginResult rejected = Begin(s, "k-held", core::InFlightMode::kReject);
    EXPECT_EQ(rejected.outcome, core::BeginOutcome::kInFlight) << rejected.status.ToString();
    const core::BeginResult waited = Begin(s, "k-held", core::InFlightMode::kWait);
    EXPECT_EQ(waited.outcome, core::BeginOutcome::kInFlight) << waited.status.ToString();
    const core::BeginResult begun = Begin(s, "k-new", core::InFlightMode::kReject);
    EXPECT_EQ(begun.outcome, core::BeginOutcome::kStoreError);
    EXPECT_TRUE(failed_as_the_write(begun.status)) << begun.status.ToString();
  }

  Record done_, held_;
  std::unique_ptr<RedisStore> nw_;  // timeout 200ms
  // Declared after nw_, so joined first: it runs what the engine and the
  // store leave running in the background, which uses nw_.
  IoThread bg_;
};

TEST_F(RedisNoWritesTest, AFullRedisStillReplaysAndRefusesWhatIsInFlight) {
  StoreRecords(*nw_);
  ASSERT_EQ(server_.Run({"CONFIG", "SET", "maxmemory-policy", "noeviction"}).type, Reply::Type::kStatus);
  ASSERT_EQ(server_.Run({"CONFIG", "SET", "maxmemory", "1"}).type, Reply::Type::kStatus);
  ASSERT_TRUE(server_.Run({"SET", "probe", "x"}).IsErrorCode("OOM")) << "writes are refused";
  ExpectDecisionsOnRecords(*nw_, {StatusCode::kResourceExhausted});
  ASSERT_EQ(server_.Run({"CONFIG", "SET", "maxmemory", "0"}).type, Reply::Type::kStatus);
  EXPECT_EQ((*Get(*nw_, "k-held"))->owner, "owner-held") << "nothing was written";
}

TEST_F(RedisNoWritesTest, AReplicaStillReplaysAndRefusesWhatIsInFlight) {
  StoreRecords(*nw_);
  // A replica of a server that is not there: its data stays, writes get
  // READONLY (replica-read-only is the default).
  ASSERT_EQ(server_.Run({"CONFIG", "SET", "replica-serve-stale-data", "yes"}).type, Reply::Type::kStatus);
  ASSERT_EQ(server_.Run({"REPLICAOF", "127.0.0.1", std::to_string(testing::PickFreePort())}).type,
            Reply::Type::kStatus);
  ASSERT_TRUE(server_.Run({"SET", "probe", "x"}).IsErrorCode("READONLY"));
  ExpectDecisionsOnRecords(*nw_, {StatusCode::kUnavailable});
  server_.Run({"REPLICAOF", "NO", "ONE"});
}

// A failover holds writes with CLIENT PAUSE WRITE: the reserve's command
// waits, times out, and every later command on its connection waits behind
// it. The read goes on the client's second connection.
TEST_F(RedisNoWritesTest, WritesHeldByClientPauseStillReplayAndRefuseWhatIsInFlight) {
  StoreRecords(*nw_);
  ASSERT_EQ(server_.Run({"CLIENT", "PAUSE", "60000", "WRITE"}).type, Reply::Type::kStatus);
  // Unavailable: a connection with replies owed for a second is redialled.
  ExpectDecisionsOnRecords(*nw_, {StatusCode::kDeadlineExceeded, StatusCode::kUnavailable});
  ASSERT_EQ(server_.Run({"CLIENT", "UNPAUSE"}).type, Reply::Type::kStatus);
}

// A write held by a pause may run once it ends; if the record it was
// answered with (kExists) went first, it would leave a reservation nobody
// holds. The Release sent behind it on its connection deletes it.
TEST_F(RedisNoWritesTest, AHeldWriteThatLandsAfterTheRecordWentIsReleased) {
  RedisStore* store = nw_.get();
  StoreRecords(*store);
  auto other = MakeStore();
  // Both scripts cached, so that each runs as one command where it was queued.
  ASSERT_TRUE(io_.Run(other->Purge("warm-up", core::PurgeMode::kAny, clock_.NowMillis())).ok());
  ASSERT_EQ(io_.Run(other->Release("warm-up", "nobody")).code(), StatusCode::kFailedPrecondition);
  ASSERT_EQ(server_.Run({"CLIENT", "PAUSE", "60000", "WRITE"}).type, Reply::Type::kStatus);
  // Held first, so it runs first when the pause ends.
  IoThread purger;
  auto purged = purger.Start(other->Purge("k-done", core::PurgeMode::kAny, clock_.NowMillis()));
  std::this_thread::sleep_for(100ms);
  const Record retry = InFlight("owner-retry", Fingerprint('a'), clock_.NowMillis());
  auto res = Reserve(*store, "k-done", retry);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->outcome, ReserveOutcome::kExists);
  ASSERT_EQ(server_.Run({"CLIENT", "UNPAUSE"}).type, Reply::Type::kStatus);
  ASSERT_TRUE(purged.get().ok());
  // The purge ran, then the held SET NX wrote "owner-retry"'s reservation,
  // then the Release deleted it.
  EXPECT_TRUE(WaitUntil([&] { return server_.Run({"EXISTS", store->RecordKey("k-done")}).integer == 0; }))
      << Get(*store, "k-done")->value_or(Record{}).owner;
}

TEST_F(RedisStoreTest, BodiesTooLargeToReadBackInTimeAreStoredOmitted) {
  EXPECT_EQ(RedisStore::MaxBodyBytes(200ms), 6'710'886u);
  EXPECT_EQ(RedisStore::MaxBodyBytes(8s), 256u << 20);
  EXPECT_EQ(RedisStore::MaxBodyBytes(1h), 256u << 20);
  auto store = MakeStore(20ms);
  const std::uint64_t cap = RedisStore::MaxBodyBytes(20ms);
  const Record small = InFlight("o1", Fingerprint('a'), clock_.NowMillis());
  ASSERT_EQ(Reserve(*store, "fits", small)->outcome, ReserveOutcome::kReserved);
  ASSERT_TRUE(Complete(*store, "fits", "o1", CompletedFrom(small, clock_.NowMillis(), 60'000,
                                                           std::string(cap, 'f'))).ok());
  const Record big = InFlight("o2", Fingerprint('a'), clock_.NowMillis());
  ASSERT_EQ(Reserve(*store, "big", big)->outcome, ReserveOutcome::kReserved);
  ASSERT_TRUE(Complete(*store, "big", "o2", CompletedFrom(big, clock_.NowMillis(), 60'000,
                                                          std::string(cap + 1, 'b'))).ok());
  auto fits = Get(*store, "fits");
  ASSERT_TRUE(fits.ok() && fits->has_value()) << fits.status().ToString();
  EXPECT_EQ((*fits)->response.body.size(), cap);
  EXPECT_FALSE((*fits)->response.body_omitted);
  auto got = Get(*store, "big");
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_TRUE((*got)->response.body_omitted);
  EXPECT_EQ((*got)->response.body, "");
  EXPECT_EQ((*got)->response.status, 201);
  EXPECT_EQ(store->Stats().bodies_dropped, 1u);
}

// cluster: true against a server without cluster support: nothing is
// routed to whichever seed answers, and Ping (readiness) says why.
TEST_F(RedisStoreTest, ClusterModeAgainstAStandaloneServerFailsEverythingAlike) {
  RedisStore::Options o;
  o.addresses = {server_.address()};
  o.cluster = true;
  o.timeout = 1s;
  o.clock = &clock_;
  auto store = RedisStore::Connect(o);
  ASSERT_TRUE(store.ok());
  const Status refreshed = io_.Run((*store)->client().RefreshSlots());
  EXPECT_EQ(refreshed.code(), StatusCode::kUnavailable);
  EXPECT_NE(refreshed.message().find("not a cluster node"), std::string::npos) << refreshed.ToString();
  const Status ping = io_.Run((*store)->Ping());
  EXPECT_NE(ping.message().find("not a cluster node"), std::string::npos) << ping.ToString();
  auto res = Reserve(**store, "k", InFlight("o", Fingerprint('a'), clock_.NowMillis()));
  EXPECT_EQ(res.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(res.status().message().find("not a cluster node"), std::string::npos) << res.status().ToString();
  EXPECT_EQ(Get(**store, "k").status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(server_.Run({"DBSIZE"}).integer, 0);
}

}  // namespace
}  // namespace idemgate::store::redis
