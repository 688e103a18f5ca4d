#pragma once

#include <memory>

#include "common/clock.h"
#include "common/status.h"
#include "config/config.h"
#include "core/store.h"

namespace idemgate::store {

// Opens the store named by `config.kind` (SPEC §5):
//  - memory: MemoryStore bounded by config.max_bytes;
//  - embedded: EmbeddedStore at config.path, fsyncing each commit when
//    config.sync (see EmbeddedStore::Open for its errors);
//  - redis: RedisStore on config.redis.
// A kind whose library is not part of this build fails with
// FailedPrecondition. `clock` times leases and expiry inside the store and
// must outlive it.
StatusOr<std::unique_ptr<core::Store>> MakeStore(const config::Store& config, const Clock& clock);

// Whether this build can open stores of `kind`.
bool StoreKindBuilt(config::StoreKind kind);

}  // namespace idemgate::store
