#include "store/factory/store_factory.h"

#include <string>
#include <utility>

#include "store/embedded/embedded_store.h"
#if IDEMGATE_HAVE_MEMORY_STORE
#include "store/memory/memory_store.h"
#endif
#if IDEMGATE_HAVE_REDIS_STORE
#include "store/redis/redis_store.h"
#endif

namespace idemgate::store {
namespace {

#if IDEMGATE_HAVE_MEMORY_STORE
constexpr bool kMemoryBuilt = true;
#else
constexpr bool kMemoryBuilt = false;
#endif
#if IDEMGATE_HAVE_REDIS_STORE
constexpr bool kRedisBuilt = true;
#else
constexpr bool kRedisBuilt = false;
#endif

[[maybe_unused]] Status NotBuilt(const char* kind) {
  return FailedPreconditionError(std::string("store.kind ") + kind +
                                 ": this idemgate was built without that store");
}

StatusOr<std::unique_ptr<core::Store>> MakeMemory(const config::Store& config, const Clock& clock) {
#if IDEMGATE_HAVE_MEMORY_STORE
  if (config.max_bytes == 0) return InvalidArgumentError("store.max_bytes must be positive");
  return std::unique_ptr<core::Store>(
      std::make_unique<memory::MemoryStore>(config.max_bytes, clock));
#else
  (void)config;
  (void)clock;
  return NotBuilt("memory");
#endif
}

StatusOr<std::unique_ptr<core::Store>> MakeEmbedded(const config::Store& config,
                                                    const Clock& clock) {
  embedded::EmbeddedStore::Options options;
  options.path = config.path;
  options.sync = config.sync;
  options.clock = &clock;
  auto store = embedded::EmbeddedStore::Open(std::move(options));
  if (!store.ok()) return store.status();
  return std::unique_ptr<core::Store>(std::move(*store));
}

StatusOr<std::unique_ptr<core::Store>> MakeRedis(const config::Store& config, const Clock& clock) {
#if IDEMGATE_HAVE_REDIS_STORE
  auto options = redis::RedisStore::OptionsFromConfig(config.redis);
  if (!options.ok()) return options.status();
  options->clock = &clock;
  auto store = redis::RedisStore::Connect(std::move(*options));
  if (!store.ok()) return store.status();
  return std::unique_ptr<core::Store>(std::move(*store));
#else
  (void)config;
  (void)clock;
  return NotBuilt("redis");
#endif
}

}  // namespace

bool StoreKindBuilt(config::StoreKind kind) {
  switch (kind) {
    case config::StoreKind::kEmbedded:
      return true;
    case config::StoreKind::kMemory:
      return kMemoryBuilt;
    case config::StoreKind::kRedis:
      return kRedisBuilt;
  }
  return false;
}

StatusOr<std::unique_ptr<core::Store>> MakeStore(const config::Store& config, const Clock& clock) {
  switch (config.kind) {
    case config::StoreKind::kMemory:
      return MakeMemory(config, clock);
    case config::StoreKind::kEmbedded:
      return MakeEmbedded(config, clock);
    case config::StoreKind::kRedis:
      return MakeRedis(config, clock);
  }
  return InvalidArgumentError("store.kind: unknown kind");
}

}  // namespace idemgate::store
