#include "store/factory/store_factory.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <string>

#include "contract/store_helpers.h"
#include "fakes/testing.h"
#include "store/embedded/embedded_store.h"

namespace idemgate::store {
namespace {

using contract::Completion;
using contract::Fingerprint;
using contract::Reservation;
using contract::RunOn;

// Reserve, complete and read back one key: the store is usable.
void ExpectUsable(core::Store& store, const Clock& clock) {
  boost::asio::io_context io;
  const UnixMillis now = clock.NowMillis();
  core::Record r = Reservation("owner", Fingerprint(1), now);
  auto reserved = RunOn(io, store.Reserve("k", r, now));
  ASSERT_TRUE(reserved.ok()) << reserved.status().ToString();
  EXPECT_EQ(reserved->outcome, core::ReserveOutcome::kReserved);
  core::Record c = Completion(r, now, std::chrono::hours(1));
  ASSERT_TRUE(RunOn(io, store.Complete("k", "owner", c)).ok());
  auto got = RunOn(io, store.Get("k", now));
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ(**got, c);
}

TEST(StoreFactoryTest, MakesAnEmbeddedStoreAtThePath) {
  FakeClock clock;
  testing::TempDir dir;
  config::Store cfg;
  cfg.kind = config::StoreKind::kEmbedded;
  cfg.path = dir.Join("data");
  auto store = MakeStore(cfg, clock);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto* embedded = dynamic_cast<embedded::EmbeddedStore*>(store->get());
  ASSERT_NE(embedded, nullptr);
  EXPECT_EQ(embedded->path(), cfg.path);
  ExpectUsable(**store, clock);
  EXPECT_TRUE(std::filesystem::is_directory(cfg.path));
}

TEST(StoreFactoryTest, SyncEmbeddedStoreWorks) {
  FakeClock clock;
  testing::TempDir dir;
  config::Store cfg;
  cfg.kind = config::StoreKind::kEmbedded;
  cfg.path = dir.Join("data");
  cfg.sync = true;
  auto store = MakeStore(cfg, clock);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto* embedded = dynamic_cast<embedded::EmbeddedStore*>(store->get());
  ASSERT_NE(embedded, nullptr);
  ExpectUsable(**store, clock);
}

TEST(StoreFactoryTest, EmbeddedOpenErrorsReachTheCaller) {
  FakeClock clock;
  testing::TempDir dir;
  ASSERT_TRUE(testing::WriteFile(dir.Join("file"), "x").ok());
  config::Store cfg;
  cfg.kind = config::StoreKind::kEmbedded;
  cfg.path = dir.Join("file");
  auto store = MakeStore(cfg, clock);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(store.status().message().find(cfg.path), std::string::npos);
}

TEST(StoreFactoryTest, MakesAMemoryStoreWhenBuilt) {
  FakeClock clock;
  config::Store cfg;
  cfg.kind = config::StoreKind::kMemory;
  cfg.max_bytes = 1 << 20;
  auto store = MakeStore(cfg, clock);
  if (!StoreKindBuilt(config::StoreKind::kMemory)) {
    ASSERT_FALSE(store.ok());
    EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
    return;
  }
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ExpectUsable(**store, clock);
  cfg.max_bytes = 0;
  store = MakeStore(cfg, clock);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument);
}

TEST(StoreFactoryTest, AStoreKindNotBuiltIsAClearError) {
  EXPECT_TRUE(StoreKindBuilt(config::StoreKind::kEmbedded));
  for (auto kind : {config::StoreKind::kMemory, config::StoreKind::kRedis}) {
    if (StoreKindBuilt(kind)) continue;
    FakeClock clock;
    config::Store cfg;
    cfg.kind = kind;
    auto store = MakeStore(cfg, clock);
    ASSERT_FALSE(store.ok());
    EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(store.status().message().find("built without"), std::string::npos)
        << store.status().ToString();
  }
}

}  // namespace
}  // namespace idemgate::store
