// The store contract suite (tests/contract/store_contract.h) against
// RedisStore on real servers: a standalone redis-server and a one-node Redis
// Cluster (all slots on one master: the cluster code path, routing by slot
// map, without the cost of creating a three-node cluster per test process;
// tests/redis/cluster_store_test.cc covers three nodes).
#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "contract/store_contract.h"
#include "store/redis/redis_store.h"
#include "tests/redis/redis_server.h"

namespace idemgate::contract {
namespace {

using store::redis::RedisStore;
using store::redis::Reply;
using store::redis::testing::RedisServer;

// The servers, each started on first use (a cluster node only becomes
// writable 2 s after it starts, a cost the standalone tests need not pay) and
// killed when the test binary ends; every test skips when Redis is not
// installed.
class RedisServers : public ::testing::Environment {
 public:
  void SetUp() override {
    if (!store::redis::testing::RedisInstalled()) GTEST_SKIP() << "redis-server/redis-cli not installed; skipping";
  }
  void TearDown() override {
    standalone.reset();
    cluster_node.reset();
  }

  static StatusOr<RedisServer*> Standalone() {
    if (!standalone) {
      auto server = std::make_unique<RedisServer>();
      auto started = server->Start();
      if (!started) return UnavailableError(started.message());
      standalone = std::move(server);
    }
    return standalone.get();
  }

  // A one-node cluster holding every slot.
  static StatusOr<RedisServer*> ClusterNode() {
    if (!cluster_node) {
      RedisServer::Options o;
      o.cluster = true;
      auto server = std::make_unique<RedisServer>(o);
      auto started = server->Start();
      if (!started) return UnavailableError(started.message());
      Reply added = server->Run({"CLUSTER", "ADDSLOTSRANGE", "0", "16383"});
      if (added.str != "OK") return InternalError("CLUSTER ADDSLOTSRANGE: " + added.DebugString());
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (server->Run({"CLUSTER", "INFO"}).str.find("cluster_state:ok") == std::string::npos) {
        if (std::chrono::steady_clock::now() > deadline) return UnavailableError("cluster never became ok");
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      cluster_node = std::move(server);
    }
    return cluster_node.get();
  }

 private:
  static inline std::unique_ptr<RedisServer> standalone;
  static inline std::unique_ptr<RedisServer> cluster_node;
};

const auto* const kServers = ::testing::AddGlobalTestEnvironment(new RedisServers);

StatusOr<std::unique_ptr<core::Store>> MakeRedisStore(StatusOr<RedisServer*> started, bool cluster,
                                                      const Clock& clock) {
  if (!started.ok()) return started.status();
  RedisServer* server = *started;
  Reply flushed = server->Run({"FLUSHALL"});
  if (flushed.str != "OK") return InternalError("FLUSHALL: " + flushed.DebugString());
  RedisStore::Options o;
  o.addresses = {server->address()};
  o.cluster = cluster;
  o.clock = &clock;
  o.timeout = std::chrono::seconds(2);
  auto store = RedisStore::Connect(o);
  if (!store.ok()) return store.status();
  return std::unique_ptr<core::Store>(std::move(*store));
}

struct RedisStandaloneFixture {
  static constexpr const char* kName = "RedisStandalone";
  StatusOr<std::unique_ptr<core::Store>> Make(const Clock& clock) {
    return MakeRedisStore(RedisServers::Standalone(), false, clock);
  }
};

struct RedisClusterFixture {
  static constexpr const char* kName = "RedisCluster";
  StatusOr<std::unique_ptr<core::Store>> Make(const Clock& clock) {
    return MakeRedisStore(RedisServers::ClusterNode(), true, clock);
  }
};

using RedisFixtures = ::testing::Types<RedisStandaloneFixture, RedisClusterFixture>;
INSTANTIATE_TYPED_TEST_SUITE_P(Redis, StoreContractTest, RedisFixtures, FixtureNames);

}  // namespace
}  // namespace idemgate::contract
