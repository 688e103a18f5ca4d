// The store contract suite (store_contract.h) run against every store built
// into this binary. The redis store runs the same suite from its own binary
// in tests/redis, which needs a redis-server.
#include "contract/store_contract.h"

#include <memory>
#include <string>

#include "fakes/testing.h"
#include "store/embedded/embedded_store.h"
#if IDEMGATE_HAVE_MEMORY_STORE
#include "store/memory/memory_store.h"
#endif

namespace idemgate::contract {
namespace {

using store::embedded::EmbeddedStore;

#if IDEMGATE_HAVE_MEMORY_STORE
struct MemoryFixture {
  static constexpr const char* kName = "Memory";
  StatusOr<std::unique_ptr<core::Store>> Make(const Clock& clock) {
    return std::unique_ptr<core::Store>(
        std::make_unique<store::memory::MemoryStore>(std::uint64_t{1} << 30, clock));
  }
};
INSTANTIATE_TYPED_TEST_SUITE_P(Memory, StoreContractTest, ::testing::Types<MemoryFixture>,
                               FixtureNames);
#endif

// Default batching, no background sweeper.
struct EmbeddedInlineFixture {
  static constexpr const char* kName = "Embedded";
  testing::TempDir dir;
  StatusOr<std::unique_ptr<core::Store>> Make(const Clock& clock) {
    EmbeddedStore::Options options;
    options.path = dir.Join("db");
    options.clock = &clock;
    options.sweep_interval = Duration::zero();
    auto store = EmbeddedStore::Open(options);
    if (!store.ok()) return store.status();
    return std::unique_ptr<core::Store>(std::move(*store));
  }
};

// One operation per commit, fsync on, and the background sweeper running
// often, which must change nothing visible.
struct EmbeddedOffloadedFixture {
  static constexpr const char* kName = "EmbeddedSyncUnbatched";
  testing::TempDir dir;
  StatusOr<std::unique_ptr<core::Store>> Make(const Clock& clock) {
    EmbeddedStore::Options options;
    options.path = dir.Join("db");
    options.clock = &clock;
    options.sync = true;
    options.max_batch = 1;
    options.sweep_interval = std::chrono::milliseconds(5);
    auto store = EmbeddedStore::Open(options);
    if (!store.ok()) return store.status();
    return std::unique_ptr<core::Store>(std::move(*store));
  }
};

using EmbeddedFixtures = ::testing::Types<EmbeddedInlineFixture, EmbeddedOffloadedFixture>;
INSTANTIATE_TYPED_TEST_SUITE_P(Embedded, StoreContractTest, EmbeddedFixtures, FixtureNames);

// Redis: instantiated in tests/redis with its own fixture (a redis-server per
// test binary), reusing this suite through the idemgate_store_contract target.

}  // namespace
}  // namespace idemgate::contract
