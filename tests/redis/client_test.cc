#include "store/redis/client.h"

#include <gtest/gtest.h>

#include <set>

#include "fakes/testing.h"
#include "tests/redis/io_thread.h"
#include "tests/redis/redis_server.h"

namespace idemgate::store::redis {
namespace {

using namespace std::chrono_literals;
using testing::IoThread;
using testing::RedisServer;
using testing::WaitUntil;

ClientOptions OptionsFor(const RedisServer& server, Duration timeout = 500ms) {
  ClientOptions o;
  o.seeds.push_back(*ParseAddress(server.address()));
  o.timeout = timeout;
  o.connection.reconnect_min = 10ms;
  o.connection.reconnect_max = 100ms;
  return o;
}

core::Task<StatusOr<Reply>> Cmd(Client& client, std::vector<std::string> args) {
  co_return co_await client.Execute(MakeCommand(args, args.size() > 1 ? 1 : -1));
}

StatusOr<Reply> RunCmd(IoThread& io, Client& client, std::vector<std::string> args) {
  return io.Run(Cmd(client, std::move(args)));
}

int ConnectedClients(RedisServer& server) {
  Reply info = server.Run({"INFO", "clients"});
  const auto at = info.str.find("connected_clients:");
  if (at == std::string::npos) return -1;
  return std::stoi(info.str.substr(at + 18));
}

class RedisClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEMGATE_REQUIRE_REDIS();
    ASSERT_TRUE(server_.Start());
  }
  RedisServer server_;
  IoThread io_;
};

TEST_F(RedisClientTest, RoundTripsBinaryValues) {
  Client client(OptionsFor(server_));
  std::string all_bytes;
  for (int i = 0; i < 256; ++i) all_bytes.push_back(static_cast<char>(i));
  const std::string big(1 << 20, '\r');
  auto set = RunCmd(io_, client, {"SET", "bin", all_bytes});
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(*set, Reply::StatusReply("OK"));
  ASSERT_TRUE(RunCmd(io_, client, {"SET", "big", big}).ok());
  auto get = RunCmd(io_, client, {"GET", "bin"});
  ASSERT_TRUE(get.ok());
  EXPECT_EQ(*get, Reply::String(all_bytes));
  auto get_big = RunCmd(io_, client, {"GET", "big"});
  ASSERT_TRUE(get_big.ok());
  EXPECT_EQ(get_big->str.size(), big.size());
  EXPECT_EQ(get_big->str, big);
  EXPECT_EQ(server_.Run({"GET", "bin"}), Reply::String(all_bytes)) << "oracle sees the same bytes";
  auto missing = RunCmd(io_, client, {"GET", "nope"});
  ASSERT_TRUE(missing.ok());
  EXPECT_TRUE(missing->is_nil());
  auto error = RunCmd(io_, client, {"INCR", "bin"});
  ASSERT_TRUE(error.ok()) << "an error reply is a value";
  EXPECT_TRUE(error->is_error());
}

TEST_F(RedisClientTest, PipelinesManyCommandsOnOneConnectionInOrder) {
  Client client(OptionsFor(server_, 5s));
  IoThread other;
  constexpr int kPerThread = 500;
  auto burst = [&](IoThread& io, int base) {
    std::vector<std::future<StatusOr<Reply>>> futures;
    for (int i = 0; i < kPerThread; ++i) {
      futures.push_back(io.Start(Cmd(client, {"ECHO", "m" + std::to_string(base + i)})));
    }
    return futures;
  };
  auto a = burst(io_, 0);
  auto b = burst(other, 100000);
  auto check = [](std::vector<std::future<StatusOr<Reply>>>& fs, int base) {
    for (int i = 0; i < kPerThread; ++i) {
      auto r = fs[static_cast<std::size_t>(i)].get();
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->str, "m" + std::to_string(base + i));
    }
  };
  check(a, 0);
  check(b, 100000);
  // One connection from the client (plus the oracle's own).
  EXPECT_EQ(ConnectedClients(server_), 2);
}

TEST_F(RedisClientTest, ConcurrentIncrementsAreAllApplied) {
  Client client(OptionsFor(server_, 5s));
  std::vector<std::future<StatusOr<Reply>>> futures;
  for (int i = 0; i < 1000; ++i) futures.push_back(io_.Start(Cmd(client, {"INCR", "counter"})));
  std::set<std::int64_t> seen;
  for (auto& f : futures) {
    auto r = f.get();
    ASSERT_TRUE(r.ok());
    seen.insert(r->integer);
  }
  EXPECT_EQ(seen.size(), 1000u);
  EXPECT_EQ(*seen.begin(), 1);
  EXPECT_EQ(*seen.rbegin(), 1000);
}

TEST_F(RedisClientTest, HungServerGivesDeadlineExceededThenRecovers) {
  Client client(OptionsFor(server_, 200ms));
  ASSERT_TRUE(RunCmd(io_, client, {"PING"}).ok());
  server_.Pause();
  for (int i = 0; i < 3; ++i) {
    auto r = RunCmd(io_, client, {"GET", "k"});
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(r.status().code() == StatusCode::kDeadlineExceeded ||
                r.status().code() == StatusCode::kUnavailable)
        << r.status().ToString();
  }
  server_.Resume();
  EXPECT_TRUE(WaitUntil([&] { return RunCmd(io_, client, {"PING"}).ok(); }));
}

TEST_F(RedisClientTest, KilledServerGivesUnavailableThenRecoversOnRestart) {
  Client client(OptionsFor(server_, 1s));
  ASSERT_TRUE(RunCmd(io_, client, {"SET", "k", "v"}).ok());
  server_.Kill();
  for (int i = 0; i < 5; ++i) {
    auto r = RunCmd(io_, client, {"GET", "k"});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  }
  ASSERT_TRUE(server_.Start());
  EXPECT_TRUE(WaitUntil([&] { return RunCmd(io_, client, {"PING"}).ok(); }));
  auto r = RunCmd(io_, client, {"SET", "k", "again"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
}

TEST_F(RedisClientTest, NoServerAtAllIsUnavailable) {
  auto refused = ::idemgate::testing::RefusedPort::Make();
  ASSERT_TRUE(refused.ok());
  ClientOptions o = OptionsFor(server_);
  o.seeds = {Address{"127.0.0.1", refused->port()}};
  Client client(o);
  auto r = RunCmd(io_, client, {"PING"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("connect"), std::string::npos) << r.status().message();
}

TEST_F(RedisClientTest, ReconnectsAfterTheServerDropsTheConnection) {
  Client client(OptionsFor(server_));
  ASSERT_TRUE(RunCmd(io_, client, {"PING"}).ok());
  Reply killed = server_.Run({"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"});
  ASSERT_EQ(killed.type, Reply::Type::kInteger) << killed.DebugString();
  EXPECT_GE(killed.integer, 1);
  EXPECT_TRUE(WaitUntil([&] { return RunCmd(io_, client, {"PING"}).ok(); }));
}

class RedisAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEMGATE_REQUIRE_REDIS();
    RedisServer::Options o;
    o.password = "s3cret pass";
    server_ = std::make_unique<RedisServer>(o);
    ASSERT_TRUE(server_->Start());
  }
  std::unique_ptr<RedisServer> server_;
  IoThread io_;
};

TEST_F(RedisAuthTest, AuthenticatesWithThePassword) {
  ClientOptions o = OptionsFor(*server_);
  o.connection.password = "s3cret pass";
  Client client(o);
  auto r = RunCmd(io_, client, {"SET", "k", "v"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, Reply::StatusReply("OK"));
}

TEST_F(RedisAuthTest, WrongPasswordIsUnavailable) {
  ClientOptions o = OptionsFor(*server_);
  o.connection.password = "wrong";
  Client client(o);
  auto r = RunCmd(io_, client, {"PING"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("AUTH failed"), std::string::npos) << r.status().message();
}

TEST_F(RedisAuthTest, NoPasswordGetsNoauthReplies) {
  Client client(OptionsFor(*server_));
  auto r = RunCmd(io_, client, {"GET", "k"});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->IsErrorCode("NOAUTH")) << r->DebugString();
}

}  // namespace
}  // namespace idemgate::store::redis
