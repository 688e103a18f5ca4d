#include "store/redis/cluster.h"

#include <random>
#include <string>
#include <vector>

#include "store/redis/client.h"

#include <gtest/gtest.h>

namespace idemgate::store::redis {
namespace {

TEST(Crc16Test, MatchesTheClusterSpecCheckValue) {
  EXPECT_EQ(Crc16("123456789"), 0x31C3);
  EXPECT_EQ(Crc16(""), 0);
}

// A command's slot comes from its routing key, found again in the encoded
// bytes; keys and other arguments may hold "\r\n" and "$".
TEST(CommandSlotTest, IsTheSlotOfTheRoutingArgument) {
  std::mt19937 rng(7);
  const std::string pieces[] = {"a", "\r\n", "$3", "{tag}", "*2", "user:", "\0", "9"};
  for (int round = 0; round < 500; ++round) {
    std::vector<std::string> args(1 + rng() % 8);
    for (std::string& a : args) {
      const int n = static_cast<int>(rng() % 6);
      for (int i = 0; i < n; ++i) a += pieces[rng() % std::size(pieces)];
    }
    const int key_index = static_cast<int>(rng() % args.size());
    const Command routed = MakeCommand(args, key_index);
    ASSERT_EQ(routed.Slot(), KeySlot(args[static_cast<std::size_t>(key_index)])) << "round " << round;
    ASSERT_EQ(routed.encoded->substr(routed.key_offset, routed.key_size), args[static_cast<std::size_t>(key_index)]);
    EXPECT_EQ(MakeCommand(args).Slot(), -1);
    EXPECT_EQ(MakeCommand(args, static_cast<int>(args.size())).Slot(), -1);
  }
}

TEST(KeySlotTest, KnownSlots) {
  // Values as printed by CLUSTER KEYSLOT (also checked live in the cluster test).
  EXPECT_EQ(KeySlot("foo"), 12182);
  EXPECT_EQ(KeySlot("bar"), 5061);
  EXPECT_EQ(KeySlot("hello"), 866);
  EXPECT_EQ(KeySlot("123456789"), 0x31C3 & 16383);
}

TEST(KeySlotTest, HashTags) {
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("user1000"));
  EXPECT_EQ(KeySlot("{user1000}.followers"), KeySlot("{user1000}.following"));
  // Only the first {...} counts, and only when it is not empty.
  EXPECT_EQ(KeySlot("foo{bar}{zap}"), KeySlot("bar"));
  EXPECT_EQ(KeySlot("foo{}{bar}"), Crc16("foo{}{bar}") & 16383);
  EXPECT_EQ(KeySlot("foo{{bar}}zap"), KeySlot("{bar"));
  EXPECT_EQ(KeySlot("foo{bar"), Crc16("foo{bar") & 16383);
  EXPECT_EQ(KeySlot("}{x}"), KeySlot("x"));
}

TEST(AddressTest, Parses) {
  auto a = ParseAddress("127.0.0.1:6379");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 6379);
  EXPECT_EQ(a->ToString(), "127.0.0.1:6379");

  auto v6 = ParseAddress("[::1]:7000");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->ToString(), "[::1]:7000");

  auto bare_v6 = ParseAddress("::1:7000");
  ASSERT_TRUE(bare_v6.ok());
  EXPECT_EQ(bare_v6->host, "::1");
  EXPECT_EQ(bare_v6->port, 7000);

  auto name = ParseAddress("redis.internal:6380");
  ASSERT_TRUE(name.ok());
  EXPECT_EQ(name->host, "redis.internal");
}

TEST(AddressTest, RejectsBadInput) {
  for (const char* bad : {"localhost", ":6379", "h:", "h:0", "h:65536", "h:12ab", "[::1]", "[::1]7000"}) {
    auto a = ParseAddress(bad);
    EXPECT_FALSE(a.ok()) << bad;
    if (!a.ok()) {
      EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
    }
  }
}

TEST(RedirectTest, ParsesMovedAndAsk) {
  auto moved = ParseRedirect(Reply::Error("MOVED 3999 127.0.0.1:6381"));
  ASSERT_TRUE(moved.has_value());
  EXPECT_EQ(moved->kind, Redirect::Kind::kMoved);
  EXPECT_EQ(moved->slot, 3999);
  EXPECT_EQ(moved->address, (Address{"127.0.0.1", 6381}));

  auto ask = ParseRedirect(Reply::Error("ASK 12182 10.0.0.2:7002"));
  ASSERT_TRUE(ask.has_value());
  EXPECT_EQ(ask->kind, Redirect::Kind::kAsk);
  EXPECT_EQ(ask->slot, 12182);
  EXPECT_EQ(ask->address, (Address{"10.0.0.2", 7002}));

  auto unknown_host = ParseRedirect(Reply::Error("MOVED 1 :7000"));
  ASSERT_TRUE(unknown_host.has_value());
  EXPECT_EQ(unknown_host->address.host, "");
  EXPECT_EQ(unknown_host->address.port, 7000);

  auto v6 = ParseRedirect(Reply::Error("MOVED 1 [::1]:7000"));
  ASSERT_TRUE(v6.has_value());
  EXPECT_EQ(v6->address.host, "::1");
}

TEST(RedirectTest, IgnoresOtherReplies) {
  EXPECT_FALSE(ParseRedirect(Reply::Error("ERR wrong")).has_value());
  EXPECT_FALSE(ParseRedirect(Reply::StatusReply("MOVED 1 a:1")).has_value());
  EXPECT_FALSE(ParseRedirect(Reply::Error("MOVED x a:1")).has_value());
  EXPECT_FALSE(ParseRedirect(Reply::Error("MOVED 16384 a:1")).has_value());
  EXPECT_FALSE(ParseRedirect(Reply::Error("MOVED 1")).has_value());
  EXPECT_FALSE(ParseRedirect(Reply::Error("ASK 1 a:0")).has_value());
}

Reply Node(std::string host, int port, std::string id) {
  return Reply::Array({Reply::String(std::move(host)), Reply::Integer(port), Reply::String(std::move(id)),
                       Reply::Array({})});
}

TEST(ClusterSlotsTest, ParsesMastersAndIgnoresReplicas) {
  const Reply reply = Reply::Array({
      Reply::Array({Reply::Integer(0), Reply::Integer(5460), Node("127.0.0.1", 7000, "a"),
                    Node("127.0.0.1", 7003, "d")}),
      Reply::Array({Reply::Integer(5461), Reply::Integer(10922), Node("", 7001, "b")}),
      Reply::Array({Reply::Integer(10923), Reply::Integer(16383), Node("?", 7002, "c")}),
  });
  auto ranges = ParseClusterSlots(reply, Address{"10.1.1.1", 7000});
  ASSERT_TRUE(ranges.ok()) << ranges.status().ToString();
  ASSERT_EQ(ranges->size(), 3u);
  EXPECT_EQ((*ranges)[0].first, 0);
  EXPECT_EQ((*ranges)[0].last, 5460);
  EXPECT_EQ((*ranges)[0].master, (Address{"127.0.0.1", 7000}));
  EXPECT_EQ((*ranges)[1].master, (Address{"10.1.1.1", 7001})) << "empty host means the queried node's host";
  EXPECT_EQ((*ranges)[2].master, (Address{"10.1.1.1", 7002}));
}

TEST(ClusterSlotsTest, RejectsMalformedReplies) {
  const Address q{"h", 1};
  EXPECT_EQ(ParseClusterSlots(Reply::Error("ERR This instance has cluster support disabled"), q).status().code(),
            StatusCode::kInternal);
  EXPECT_FALSE(ParseClusterSlots(Reply::Integer(1), q).ok());
  EXPECT_FALSE(ParseClusterSlots(Reply::Array({Reply::Array({Reply::Integer(0)})}), q).ok());
  EXPECT_FALSE(
      ParseClusterSlots(Reply::Array({Reply::Array({Reply::Integer(10), Reply::Integer(5), Node("h", 1, "x")})}), q)
          .ok());
  EXPECT_FALSE(ParseClusterSlots(
                   Reply::Array({Reply::Array({Reply::Integer(0), Reply::Integer(16384), Node("h", 1, "x")})}), q)
                   .ok());
  EXPECT_TRUE(ParseClusterSlots(Reply::Array({}), q).ok());
}

}  // namespace
}  // namespace idemgate::store::redis
