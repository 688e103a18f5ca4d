#include <gtest/gtest.h>

#include <atomic>
#include <iostream>
#include <random>
#include <set>

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
using testing::RedisCluster;
using testing::WaitUntil;

// Reserve, Complete and Get keys of one slot until told to stop.
core::Task<int> MigrationWorker(RedisStore& store, const Clock& clock, int id, std::atomic<bool>& stop,
                                std::atomic<int>& ok, std::atomic<int>& failed) {
  for (int i = 0; !stop.load(); ++i) {
    const std::string key = "{hot}" + std::to_string(id) + "-" + std::to_string(i);
    const Record r = InFlight("w", Fingerprint('h'), clock.NowMillis());
    auto res = co_await store.Reserve(key, r, clock.NowMillis());
    Status s = res.status();
    if (res.ok()) s = co_await store.Complete(key, "w", CompletedFrom(r, clock.NowMillis(), 600'000));
    if (s.ok()) {
      auto got = co_await store.Get(key, clock.NowMillis());
      s = got.ok() && got->has_value() ? Status::Ok() : InternalError("lost " + key);
    }
    if (s.ok()) {
      ok.fetch_add(1);
    } else {
      failed.fetch_add(1);
      std::cerr << "op failed during migration: " << s.ToString() << "\n";
    }
  }
  co_return id;
}

// One 3-master cluster for the whole suite (creating one takes seconds).
class RedisClusterStoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!testing::RedisInstalled()) return;
    cluster_ = new RedisCluster(3);
    started_ = cluster_->Start();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  void SetUp() override {
    IDEMGATE_REQUIRE_REDIS();
    ASSERT_TRUE(started_);
    store_ = MakeStore();
    ASSERT_NE(store_, nullptr);
  }

  std::unique_ptr<RedisStore> MakeStore() {
    RedisStore::Options o;
    o.addresses = {cluster_->node(0).address()};  // one seed; the rest is discovered
    o.cluster = true;
    o.timeout = 2s;
    o.clock = &clock_;
    o.reconnect_min = 10ms;
    o.reconnect_max = 100ms;
    auto s = RedisStore::Connect(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  // Reserve + Complete, returning the first failure.
  Status Store(RedisStore& s, const std::string& key, const std::string& owner) {
    const Record r = InFlight(owner, Fingerprint('c'), clock_.NowMillis());
    auto res = io_.Run(s.Reserve(key, r, clock_.NowMillis()));
    if (!res.ok()) return res.status();
    if (res->outcome != ReserveOutcome::kReserved) return AbortedError("not reserved");
    return io_.Run(s.Complete(key, owner, CompletedFrom(r, clock_.NowMillis(), 600'000)));
  }

  int SlotOf(const std::string& key) { return KeySlot(store_->RecordKey(key)); }

  static RedisCluster* cluster_;
  static ::testing::AssertionResult started_;
  FakeClock clock_;
  IoThread io_;
  std::unique_ptr<RedisStore> store_;
};

RedisCluster* RedisClusterStoreTest::cluster_ = nullptr;
::testing::AssertionResult RedisClusterStoreTest::started_ = ::testing::AssertionFailure() << "not started";

TEST_F(RedisClusterStoreTest, KeySlotAgreesWithClusterKeyslot) {
  std::vector<std::string> keys = {"foo", "bar", "hello", "123456789", "{user1000}.following",
                                   "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "t-acme:_:_:payments:abc",
                                   std::string("bin\0\xff{\x01}", 8)};
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) {
    std::string k;
    const int n = std::uniform_int_distribution<int>(0, 24)(rng);
    for (int j = 0; j < n; ++j) k.push_back("ab{}:-_0123456789xyz"[std::uniform_int_distribution<int>(0, 19)(rng)]);
    keys.push_back(k);
  }
  for (const auto& k : keys) {
    Reply slot = cluster_->node(0).Run({"CLUSTER", "KEYSLOT", k});
    ASSERT_EQ(slot.type, Reply::Type::kInteger) << slot.DebugString();
    EXPECT_EQ(KeySlot(k), slot.integer) << "key '" << k << "'";
  }
}

TEST_F(RedisClusterStoreTest, RecordsLandOnTheMasterOfTheirSlot) {
  ASSERT_TRUE(io_.Run(store_->client().RefreshSlots()).ok());
  const auto moved_before = store_->client().moved_count();
  for (int i = 0; i < 60; ++i) {
    const std::string key = "spread-" + std::to_string(i);
    ASSERT_TRUE(Store(*store_, key, "o").ok()) << key;
    auto got = io_.Run(store_->Get(key, clock_.NowMillis()));
    ASSERT_TRUE(got.ok());
    ASSERT_TRUE(got->has_value());
    EXPECT_EQ((*got)->state, core::RecordState::kCompleted);
    const int owner = cluster_->OwnerOf(SlotOf(key));
    ASSERT_GE(owner, 0);
    EXPECT_EQ(cluster_->node(owner).Run({"EXISTS", store_->RecordKey(key)}).integer, 1) << key;
  }
  for (int n = 0; n < cluster_->size(); ++n) {
    EXPECT_GT(cluster_->node(n).Run({"DBSIZE"}).integer, 0) << "node " << n << " got no key";
  }
  EXPECT_EQ(store_->client().moved_count(), moved_before) << "routed by the slot map, no redirects";
}

TEST_F(RedisClusterStoreTest, FollowsMovedAfterASlotMigration) {
  const std::string key = "moving";
  const Record r = InFlight("o", Fingerprint('m'), clock_.NowMillis());
  ASSERT_EQ(io_.Run(store_->Reserve(key, r, clock_.NowMillis()))->outcome, ReserveOutcome::kReserved);
  const int slot = SlotOf(key);
  const int from = cluster_->OwnerOf(slot);
  const int to = (from + 1) % cluster_->size();
  ASSERT_TRUE(cluster_->MigrateSlot(slot, from, to));
  ASSERT_EQ(cluster_->OwnerOf(slot), to);

  const auto moved_before = store_->client().moved_count();
  Status done = io_.Run(store_->Complete(key, "o", CompletedFrom(r, clock_.NowMillis(), 600'000)));
  ASSERT_TRUE(done.ok()) << done.ToString();
  EXPECT_GT(store_->client().moved_count(), moved_before);
  EXPECT_EQ(cluster_->node(to).Run({"EXISTS", store_->RecordKey(key)}).integer, 1);

  const auto moved_after = store_->client().moved_count();
  for (int i = 0; i < 5; ++i) {
    auto got = io_.Run(store_->Get(key, clock_.NowMillis()));
    ASSERT_TRUE(got.ok());
    EXPECT_EQ((*got)->state, core::RecordState::kCompleted);
  }
  EXPECT_EQ(store_->client().moved_count(), moved_after) << "the map was updated by the first MOVED";
  EXPECT_TRUE(WaitUntil([&] { return store_->client().refresh_count() >= 2; })) << "and refreshed in the background";
}

TEST_F(RedisClusterStoreTest, FollowsAskWhileASlotIsHalfMigrated) {
  // Same hash tag, so the same slot.
  const std::string moved_key = "{ask}moved", new_key = "{ask}new";
  ASSERT_EQ(SlotOf(moved_key), SlotOf(new_key));
  const Record r = InFlight("o", Fingerprint('a'), clock_.NowMillis());
  ASSERT_EQ(io_.Run(store_->Reserve(moved_key, r, clock_.NowMillis()))->outcome, ReserveOutcome::kReserved);
  const int slot = SlotOf(moved_key);
  const int from = cluster_->OwnerOf(slot);
  const int to = (from + 1) % cluster_->size();
  ASSERT_TRUE(cluster_->BeginMigration(slot, from, to, {store_->RecordKey(moved_key)}));

  const auto asks_before = store_->client().ask_count();
  auto got = io_.Run(store_->Get(moved_key, clock_.NowMillis()));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(got->has_value()) << "found on the importing node behind ASKING";
  EXPECT_EQ(**got, r);
  EXPECT_GT(store_->client().ask_count(), asks_before);

  // A new key of a migrating slot is created on the importing node.
  auto res = io_.Run(store_->Reserve(new_key, r, clock_.NowMillis()));
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->outcome, ReserveOutcome::kReserved);
  ASSERT_EQ(cluster_->node(to).Run({"ASKING"}).str, "OK");
  EXPECT_EQ(cluster_->node(to).Run({"EXISTS", store_->RecordKey(new_key)}).integer, 1);
  Status done = io_.Run(store_->Complete(moved_key, "o", CompletedFrom(r, clock_.NowMillis(), 600'000)));
  EXPECT_TRUE(done.ok()) << done.ToString();

  ASSERT_TRUE(cluster_->FinishMigration(slot, from, to));
  auto after = io_.Run(store_->Get(new_key, clock_.NowMillis()));
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after->has_value());
}

TEST_F(RedisClusterStoreTest, OperationsKeepSucceedingWhileTheirSlotMoves) {
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0};
  std::atomic<int> failed{0};
  std::vector<std::future<int>> workers;
  for (int i = 0; i < 4; ++i) workers.push_back(io_.Start(MigrationWorker(*store_, clock_, i, stop, ok, failed)));
  ASSERT_TRUE(WaitUntil([&] { return ok.load() > 100; }));
  const int slot = SlotOf("{hot}");
  const int from = cluster_->OwnerOf(slot);
  const int to = (from + 2) % cluster_->size();
  ASSERT_TRUE(cluster_->MigrateSlot(slot, from, to));
  const int ok_at_move = ok.load();
  EXPECT_TRUE(WaitUntil([&] { return ok.load() > ok_at_move + 100; }));
  stop = true;
  for (auto& w : workers) {
    ASSERT_EQ(w.wait_for(30s), std::future_status::ready);
    w.get();
  }
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(cluster_->OwnerOf(slot), to);
}

TEST_F(RedisClusterStoreTest, WatcherIsWokenByACompletionFromAnotherInstance) {
  auto gateway2 = MakeStore();
  // Pick a key whose slot is not on node 0, where the subscriber connects first.
  std::string key;
  for (int i = 0; key.empty(); ++i) {
    const std::string k = "watched-" + std::to_string(i);
    if (cluster_->OwnerOf(SlotOf(k)) != 0) key = k;
  }
  const Record r = InFlight("g2", Fingerprint('w'), clock_.NowMillis());
  ASSERT_EQ(io_.Run(gateway2->Reserve(key, r, clock_.NowMillis()))->outcome, ReserveOutcome::kReserved);
  auto watch = io_.Run(store_->WatchKey(key));
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  auto changed = io_.Start((*watch)->Changed(30s));
  ASSERT_TRUE(io_.Run(gateway2->Complete(key, "g2", CompletedFrom(r, clock_.NowMillis(), 600'000))).ok());
  EXPECT_TRUE(changed.get());
}

TEST_F(RedisClusterStoreTest, PingsEveryMaster) {
  EXPECT_TRUE(io_.Run(store_->Ping()).ok());
  EXPECT_TRUE(WaitUntil([&] { return store_->Stats().bytes > 0; }, 20s));
}

// Clusters of their own: these tests change the membership.
class RedisClusterMembershipTest : public ::testing::Test {
 protected:
  void SetUp() override { IDEMGATE_REQUIRE_REDIS(); }

  std::unique_ptr<RedisStore> MakeStore(std::vector<std::string> addresses, Duration masters_max_age = 5s) {
    RedisStore::Options o;
    o.addresses = std::move(addresses);
    o.cluster = true;
    o.masters_max_age = masters_max_age;
    o.timeout = 2s;
    o.clock = &clock_;
    o.reconnect_min = 10ms;
    o.reconnect_max = 100ms;
    auto s = RedisStore::Connect(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  // Reserve + Complete, returning the first failure.
  Status Store(RedisStore& s, const std::string& key) {
    const Record r = InFlight("o", Fingerprint('c'), clock_.NowMillis());
    auto res = io_.Run(s.Reserve(key, r, clock_.NowMillis()));
    if (!res.ok()) return res.status();
    if (res->outcome != ReserveOutcome::kReserved) return AbortedError("not reserved");
    return io_.Run(s.Complete(key, "o", CompletedFrom(r, clock_.NowMillis(), 600'000)));
  }

  FakeClock clock_;
  IoThread io_;
};

// A seed that is a cluster node but no member of the cluster answers
// CLUSTER SLOTS with an empty array. Listed first, it must not become the
// slot map (every command would then go to it and get CLUSTERDOWN).
TEST_F(RedisClusterMembershipTest, ASeedWithAnEmptySlotMapDoesNotReplaceTheMap) {
  RedisCluster cluster(3, /*spares=*/1);
  ASSERT_TRUE(cluster.Start());
  ASSERT_TRUE(cluster.spare(0).Run({"CLUSTER", "SLOTS"}).elements.empty());
  auto store = MakeStore({cluster.spare(0).address(), cluster.node(0).address()});
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(io_.Run(store->client().RefreshSlots()).ok());
  for (int i = 0; i < 30; ++i) {
    const std::string key = "seeded-" + std::to_string(i);
    const Status s = Store(*store, key);
    ASSERT_TRUE(s.ok()) << key << ": " << s.ToString();
  }
  EXPECT_TRUE(io_.Run(store->Ping()).ok());
  // The empty node alone: no map to load, and the error says why.
  auto lonely = MakeStore({cluster.spare(0).address()});
  ASSERT_NE(lonely, nullptr);
  const Status refreshed = io_.Run(lonely->client().RefreshSlots());
  EXPECT_EQ(refreshed.code(), StatusCode::kUnavailable);
  EXPECT_NE(refreshed.message().find("serves no slot"), std::string::npos) << refreshed.ToString();
}

// Scale-in: a node's slots are resharded away and the node reset (as
// `redis-cli --cluster del-node` does), but it keeps running with an empty
// slot map. A client whose map still sends slots there gets CLUSTERDOWN from
// it; the refresh that follows must load the map from the other nodes, not
// the empty one, even when that node is a seed and the first master known.
TEST_F(RedisClusterMembershipTest, ANodeResetAfterScaleInDoesNotTakeTheClientDown) {
  RedisCluster cluster(4);
  ASSERT_TRUE(cluster.Start());
  auto store = MakeStore(cluster.addresses());
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(io_.Run(store->client().RefreshSlots()).ok());
  ASSERT_EQ(cluster.OwnerOf(0), 0) << "node 0 serves the first slots: the first master of the map";
  std::vector<std::string> keys;
  for (int i = 0; keys.size() < 10; ++i) {
    // Keys of node 0's slots, which the client's map still sends there.
    std::string key = "scaled-" + std::to_string(i);
    if (cluster.OwnerOf(KeySlot(store->RecordKey(key))) == 0) keys.push_back(std::move(key));
  }
  ASSERT_TRUE(cluster.RemoveNode(0, 1));
  ASSERT_TRUE(cluster.node(0).Run({"CLUSTER", "SLOTS"}).elements.empty());

  std::size_t stored = 0;
  Status last;
  EXPECT_TRUE(WaitUntil(
      [&] {
        while (stored < keys.size()) {
          last = Store(*store, keys[stored]);
          if (!last.ok()) return false;
          ++stored;
        }
        return true;
      },
      10s))
      << stored << " of " << keys.size() << " stored; last error: " << last.ToString();
  for (const auto& key : keys) {
    auto got = io_.Run(store->Get(key, clock_.NowMillis()));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(got->has_value()) << key;
    EXPECT_EQ(cluster.node(1).Run({"EXISTS", store->RecordKey(key)}).integer, 1) << key;
  }
  EXPECT_TRUE(io_.Run(store->Ping()).ok());
}

// Ping answers what keyed commands would: not ready while a master reports
// cluster_state:fail (here: a slot left without a master), though every
// master still answers PING.
TEST_F(RedisClusterMembershipTest, PingFailsWhileTheClusterIsDown) {
  RedisCluster cluster(3);
  ASSERT_TRUE(cluster.Start());
  auto store = MakeStore({cluster.node(0).address()});
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(io_.Run(store->client().RefreshSlots()).ok());
  ASSERT_TRUE(io_.Run(store->Ping()).ok());
  for (int i = 0; i < cluster.size(); ++i) {
    ASSERT_EQ(cluster.node(i).Run({"CLUSTER", "DELSLOTS", "0"}).str, "OK") << i;
  }
  ASSERT_TRUE(WaitUntil([&] {
    return cluster.node(0).Run({"CLUSTER", "INFO"}).str.find("cluster_state:fail") != std::string::npos;
  }));
  const Status down = io_.Run(store->Ping());
  EXPECT_EQ(down.code(), StatusCode::kUnavailable) << down.ToString();
  EXPECT_NE(down.message().find("cluster_state"), std::string::npos) << down.ToString();
  ASSERT_EQ(cluster.node(0).Run({"CLUSTER", "ADDSLOTS", "0"}).str, "OK");  // the others learn it by gossip
  EXPECT_TRUE(WaitUntil([&] { return io_.Run(store->Ping()).ok(); }, 20s));
}

// A manual failover (CLUSTER FAILOVER on a replica, every node up) moves no
// slot and redirects none of the commands Ping runs on every master: the
// demoted master answers CLUSTER INFO as a replica. Ping must still reload the
// slot map and ask the promoted master (here hung, so Ping fails).
TEST_F(RedisClusterMembershipTest, PingAsksTheMasterAManualFailoverPromoted) {
  RedisCluster cluster(3, /*spares=*/1);
  ASSERT_TRUE(cluster.Start());
  auto store = MakeStore({cluster.node(0).address()}, /*masters_max_age=*/0s);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(io_.Run(store->client().RefreshSlots()).ok());
  ASSERT_TRUE(io_.Run(store->Ping()).ok());
  ASSERT_TRUE(cluster.AddReplica(0, /*master=*/1));
  const int promoted = cluster.size() - 1;
  ASSERT_TRUE(cluster.Failover(promoted));
  ASSERT_NE(cluster.node(1).Run({"INFO", "replication"}).str.find("role:slave"), std::string::npos);

  cluster.node(promoted).Pause();
  const Status hung = io_.Run(store->Ping());
  cluster.node(promoted).Resume();
  EXPECT_FALSE(hung.ok()) << "Ping asked the demoted master, not the promoted one";
  Status last;
  EXPECT_TRUE(WaitUntil([&] { return (last = io_.Run(store->Ping())).ok(); }, 20s)) << last.ToString();
}

// Scale-out (a master added, slots moved to it) redirects none of the
// commands Ping and Stats run on every master either: both must reload the
// slot map and include the new master.
TEST_F(RedisClusterMembershipTest, PingAndStatsIncludeAMasterAddedByAScaleOut) {
  RedisCluster cluster(3, /*spares=*/1);
  ASSERT_TRUE(cluster.Start());
  auto store = MakeStore({cluster.node(0).address()}, /*masters_max_age=*/0s);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(io_.Run(store->client().RefreshSlots()).ok());
  std::set<int> slots;
  for (int i = 0; i < 100; ++i) {
    const std::string key = "grown-" + std::to_string(i);
    const Status s = Store(*store, key);
    ASSERT_TRUE(s.ok()) << key << ": " << s.ToString();
    if (i < 20) slots.insert(KeySlot(store->RecordKey(key)));
  }
  ASSERT_TRUE(io_.Run(store->Ping()).ok());
  ASSERT_TRUE(cluster.AddNode(0));
  const int added = cluster.size() - 1;
  for (const int slot : slots) ASSERT_TRUE(cluster.MigrateSlot(slot, cluster.OwnerOf(slot), added)) << slot;
  const std::int64_t on_added = cluster.node(added).Run({"DBSIZE"}).integer;
  ASSERT_GE(on_added, 20);

  std::int64_t total = 0;
  for (int i = 0; i < cluster.size(); ++i) total += cluster.node(i).Run({"DBSIZE"}).integer;
  ASSERT_EQ(total, 100);
  EXPECT_TRUE(WaitUntil([&] { return store->Stats().keys == static_cast<std::uint64_t>(total); }, 20s))
      << "store.keys " << store->Stats().keys << ", the masters hold " << total << " (" << on_added
      << " on the added one)";

  cluster.node(added).Pause();
  const Status hung = io_.Run(store->Ping());
  cluster.node(added).Resume();
  EXPECT_FALSE(hung.ok()) << "Ping did not ask the added master";
}

}  // namespace
}  // namespace idemgate::store::redis
