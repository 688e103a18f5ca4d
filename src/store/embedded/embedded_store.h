#pragma once

#include <array>
#include <boost/asio/thread_pool.hpp>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/clock.h"
#include "common/status.h"
#include "common/units.h"
#include "core/local_watchers.h"
#include "core/record.h"
#include "core/store.h"

namespace rocksdb {
class DB;
class ColumnFamilyHandle;
class CompactionFilter;
}  // namespace rocksdb

namespace idemgate::store::embedded {

// The durable single-gateway store: records in RocksDB under one directory
// (SPEC §5 `embedded`). Survives restarts and kill -9; with `sync` every
// commit is fsynced and survives power loss as well. See docs/store-embedded.md.
//
// Layout: column family "records" maps the scoped key to an 8-byte expiry
// prefix followed by core::EncodeRecord(record);
// column family "expiry" holds one empty entry per completed record with a
// retention, keyed big-endian(expires_ms) + scoped key, so that expired records
// are found in time order without scanning the records.
//
// Only one EmbeddedStore (in one process) may have a path open at a time; the
// RocksDB LOCK file enforces it, so every writer lives in this object and
// watchers are in-process (core::LocalWatchers).
//
// Thread-safety: every method may be called concurrently from any thread. The
// store must outlive every operation and Watch it handed out.
class EmbeddedStore final : public core::Store {
 public:
  struct Options {
    std::string path;  // directory; created when missing
    // fsync the write-ahead log on every commit (survives power loss).
    bool sync = false;
    // Time source for background expiry (compaction filter and sweeper).
    // nullptr: SystemClock. Must outlive the store.
    const Clock* clock = nullptr;
    // Run RocksDB calls on a dedicated thread pool instead of the caller's
    // thread. Unset: offload exactly when `sync` (an fsync takes milliseconds,
    // a memtable write microseconds; see the measurements in
    // docs/store-embedded.md).
    std::optional<bool> offload;
    std::size_t threads = 4;  // offload pool size
    // Period of the background expiry sweep; zero disables the sweeper thread
    // (SweepExpired can still be called).
    Duration sweep_interval = std::chrono::seconds(1);
    std::size_t sweep_batch = 10'000;  // index entries per sweep call
    std::uint64_t block_cache_bytes = 64ull << 20;
    // One memtable of the records family; total memtable memory is bounded
    // by 4x this.
    std::uint64_t write_buffer_bytes = 16ull << 20;
  };

  // What one SweepExpired call did.
  struct SweepResult {
    std::size_t index_entries = 0;  // expiry entries consumed (== max: call again)
    std::size_t deleted = 0;        // records deleted
  };

  // Opens or creates the store at options.path. Fails (never crashes) with
  // InvalidArgument (empty path, path is not a directory), FailedPrecondition
  // (permission denied, the path is open in another process or another
  // EmbeddedStore, unknown data format), Internal (corrupt files) or
  // Unavailable (other I/O errors); the message names the path and the cause.
  static StatusOr<std::unique_ptr<EmbeddedStore>> Open(Options options);

  // Stops the sweeper, waits for offloaded operations, closes the database.
  ~EmbeddedStore() override;
  EmbeddedStore(const EmbeddedStore&) = delete;
  EmbeddedStore& operator=(const EmbeddedStore&) = delete;

  core::Task<StatusOr<core::ReserveResult>> Reserve(std::string key, core::Record reservation,
                                                    UnixMillis now) override;
  core::Task<Status> Complete(std::string key, std::string owner, core::Record completed) override;
  core::Task<Status> Release(std::string key, std::string owner) override;
  core::Task<StatusOr<std::optional<core::Record>>> Get(std::string key, UnixMillis now) override;
  core::Task<StatusOr<bool>> Purge(std::string key) override;
  core::Task<StatusOr<std::unique_ptr<core::Watch>>> WatchKey(std::string key) override;
  core::Task<Status> Ping() override;
  // keys: RocksDB's estimate for the records family (counts versions and
  // tombstones not yet compacted); bytes: live SST files plus memtables.
  core::StoreStats Stats() const override;

  // Deletes completed records whose retention ended at or before `now`,
  // consuming at most `max` expiry entries (stale entries of replaced or
  // purged records are dropped without touching the record). Blocking; runs on
  // the calling thread. The space is reclaimed by later compactions.
  StatusOr<SweepResult> SweepExpired(UnixMillis now, std::size_t max);
  // Flushes the memtables and compacts both column families fully, so that
  // deleted and expired records leave the disk now. Blocking; for tests and
  // tooling.
  Status CompactAll();
  // Exact number of stored records, including expired ones not yet swept.
  // Iterates the whole store; for tests and tooling.
  StatusOr<std::uint64_t> CountRecords() const;

  const std::string& path() const { return options_.path; }
  bool offloaded() const { return pool_ != nullptr; }

 private:
  static constexpr std::size_t kStripes = 256;

  explicit EmbeddedStore(Options options);
  Status OpenDb();

  // Runs `fn` on the pool when offloading, else inline on the caller's thread.
  template <typename F>
  auto Exec(F fn) -> core::Task<decltype(fn())>;

  // The blocking halves of the Store operations.
  StatusOr<core::ReserveResult> ReserveNow(const std::string& key, core::Record reservation,
                                           UnixMillis now);
  Status CompleteNow(const std::string& key, const std::string& owner, core::Record completed);
  Status ReleaseNow(const std::string& key, const std::string& owner);
  StatusOr<std::optional<core::Record>> GetNow(const std::string& key, UnixMillis now);
  StatusOr<bool> PurgeNow(const std::string& key);
  Status PingNow();

  StatusOr<std::optional<core::Record>> Read(const std::string& key) const;
  std::size_t StripeOf(const std::string& key) const;
  void SweeperLoop();

  Options options_;
  const Clock& clock_;

  // Owned by the database's options; must outlive db_.
  std::unique_ptr<rocksdb::CompactionFilter> filter_;
  std::unique_ptr<rocksdb::DB> db_;
  rocksdb::ColumnFamilyHandle* records_ = nullptr;
  rocksdb::ColumnFamilyHandle* expiry_ = nullptr;
  rocksdb::ColumnFamilyHandle* default_ = nullptr;

  // Serialises the read-modify-write of keys hashing to the same stripe.
  mutable std::array<std::mutex, kStripes> stripes_;
  core::LocalWatchers watchers_;
  std::unique_ptr<boost::asio::thread_pool> pool_;  // null: inline

  std::mutex sweeper_mu_;
  std::condition_variable sweeper_cv_;
  bool stopping_ = false;
  std::thread sweeper_;
};

}  // namespace idemgate::store::embedded
