#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "store/redis/resp.h"

struct redisContext;

// Real redis-server processes for tests: free loopback ports, no persistence,
// a private temporary directory, killed (SIGKILL) in the destructor and, as a
// backstop, by the kernel if the test process dies (PR_SET_PDEATHSIG).
namespace idemgate::store::redis::testing {

// True when redis-server and redis-cli are on PATH.
bool RedisInstalled();

// A loopback TCP port that was free a moment ago (bound to port 0, closed).
int PickFreePort();

// Skips the current test when Redis is not installed.
#define IDEMGATE_REQUIRE_REDIS()                                                  \
  do {                                                                            \
    if (!::idemgate::store::redis::testing::RedisInstalled())                     \
      GTEST_SKIP() << "redis-server/redis-cli not installed; skipping";           \
  } while (0)

class RedisServer {
 public:
  struct Options {
    bool cluster = false;
    std::string password;             // --requirepass
    std::vector<std::string> extra;   // more "--name value" arguments
  };

  RedisServer();
  explicit RedisServer(Options options);
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // Starts the server (on the same port as before after a Kill) and waits
  // until it answers PING.
  ::testing::AssertionResult Start();
  // SIGKILL and reap. Idempotent.
  void Kill();
  // SIGSTOP / SIGCONT: a hung server (accepts TCP, never answers).
  void Pause();
  void Resume();

  bool running() const { return pid_ > 0; }
  int port() const { return port_; }
  int bus_port() const { return bus_port_; }  // cluster bus
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  // Runs one command on a private hiredis connection (an oracle independent
  // of the client under test). Transport failures come back as a kError
  // reply starting with "TRANSPORT".
  Reply Run(const std::vector<std::string>& args);

 private:
  void Disconnect();

  Options options_;
  std::filesystem::path dir_;
  int port_ = 0;
  int bus_port_ = 0;
  pid_t pid_ = -1;
  redisContext* ctx_ = nullptr;
};

// A Redis Cluster of `masters` nodes with no replicas, made with
// `redis-cli --cluster create`, and `spares` more cluster-enabled nodes that
// Start starts but that join no cluster (CLUSTER SLOTS: empty) unless
// AddNode or AddReplica adds them (a spare added becomes a node()).
class RedisCluster {
 public:
  explicit RedisCluster(int masters = 3, int spares = 0);
  ~RedisCluster();

  ::testing::AssertionResult Start();
  RedisServer& node(int i) { return *nodes_[static_cast<std::size_t>(i)]; }
  int size() const { return static_cast<int>(nodes_.size()); }
  // The masters' addresses (spares not included).
  std::vector<std::string> addresses() const;
  RedisServer& spare(int i) { return *spares_[static_cast<std::size_t>(i)]; }
  // Index of the node that owns `slot` according to node 0, or -1.
  int OwnerOf(int slot);
  // Moves `slot` (and its keys) from node `from` to node `to`, the way
  // redis-cli --cluster reshard does: SETSLOT IMPORTING/MIGRATING, MIGRATE
  // each key, SETSLOT NODE everywhere. Callbacks run between the steps.
  ::testing::AssertionResult MigrateSlot(int slot, int from, int to);
  // Starts a migration (IMPORTING/MIGRATING) and moves only the given keys,
  // leaving the slot half-migrated (so that the source answers -ASK).
  ::testing::AssertionResult BeginMigration(int slot, int from, int to, const std::vector<std::string>& keys);
  ::testing::AssertionResult FinishMigration(int slot, int from, int to);
  std::string NodeId(int i);
  // Scale-in, as `redis-cli --cluster reshard` then `--cluster del-node` do
  // it: every slot of node `from` (and its keys) moves to node `to`, the
  // other nodes CLUSTER FORGET it, and it gets CLUSTER RESET SOFT. Node
  // `from` keeps running, a cluster node with an empty slot map. Waits
  // until the remaining nodes agree on the map and report cluster_state:ok.
  ::testing::AssertionResult RemoveNode(int from, int to);
  // Scale-out, as `redis-cli --cluster add-node` does it: spare `spare`
  // meets the cluster and becomes node(size() - 1), a master with no slot
  // (MigrateSlot then gives it some). Waits until every node knows it.
  ::testing::AssertionResult AddNode(int spare);
  // AddNode, then the new node replicates node `master`; waits until the
  // master reports it as an online replica.
  ::testing::AssertionResult AddReplica(int spare, int master);
  // CLUSTER FAILOVER on replica node `replica` (a manual failover, every
  // node up); waits until every node names it the master of its slots.
  ::testing::AssertionResult Failover(int replica);

 private:
  std::vector<std::unique_ptr<RedisServer>> nodes_;
  std::vector<std::unique_ptr<RedisServer>> spares_;
  std::vector<int> removed_;
};

// Runs a program with a deadline; output goes to `log`. Returns the exit
// status (or -1 when it had to be killed).
int RunProgram(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
               const std::filesystem::path& log);

}  // namespace idemgate::store::redis::testing
