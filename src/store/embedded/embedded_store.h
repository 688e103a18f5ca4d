#pragma once

#include <atomic>
#include <boost/asio/thread_pool.hpp>
#include <condition_variable>
#include <deque>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

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
class Env;
struct ReadOptions;
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
// Concurrency: every change (Reserve, Complete, Release, Purge, the expiry
// sweep) is carried out by one committer thread, in arrival order. It takes
// whatever has queued up, decides each operation against the database plus
// the changes made earlier in the same batch, and commits the batch with one
// RocksDB write (one log append, one fsync with `sync`). One writer makes
// each read-modify-write atomic without locks, and the caller's thread never
// blocks on RocksDB. Reads that RocksDB can answer from memory (memtables and
// block cache) run on the caller's thread; a read that would touch the disk
// runs on a small pool of reader threads. Reserve answers at once from such a
// read when it finds a live record it must not replace (a replay, a
// conflict); otherwise the committer decides (its own read then finds the
// blocks cached).
//
// Thread-safety: every method may be called concurrently from any thread;
// coroutines resume on the executor they were awaited on. The store must
// outlive every operation and Watch it handed out.
class EmbeddedStore final : public core::Store {
 public:
  struct Options {
    std::string path;  // directory; created when missing
    // fsync the write-ahead log on every commit (survives power loss).
    bool sync = false;
    // Time source for background expiry (compaction filter and sweeper).
    // nullptr: SystemClock. Must outlive the store.
    const Clock* clock = nullptr;
    // Most operations committed in one RocksDB write.
    std::size_t max_batch = 256;
    // Period of the background expiry sweep; zero disables it (SweepExpired
    // can still be called).
    Duration sweep_interval = std::chrono::seconds(1);
    // Index entries per background sweep. A sweep that consumes all of them
    // (a backlog) is followed by the next after a pause as long as its own
    // sweeping took, so that sweeping keeps up with the writes but takes at
    // most half of the committer's time.
    std::size_t sweep_batch = 10'000;
    std::uint64_t block_cache_bytes = 64ull << 20;
    // One memtable of the records family; total memtable memory is bounded
    // by 4x this.
    std::uint64_t write_buffer_bytes = 16ull << 20;
    // In-flight reservations whose owner the committer remembers, so that
    // their Complete or Release needs no read. Reservations live for one
    // request, so this bounds the memory held by ones never settled (about
    // 150 bytes each), not the requests in flight; beyond it, owner checks
    // read the database.
    std::size_t remembered_reservations = 65'536;
    // The file system RocksDB and the store's info log (LOG) use; nullptr:
    // the local one (rocksdb::Env::Default()). For tests that inject faults.
    // Must outlive the store.
    rocksdb::Env* env = nullptr;
  };

  // Background errors reported by RocksDB, for the committer (defined in the .cc).
  struct WriteStop;

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

  // Commits what is queued, stops the committer, closes the database.
  ~EmbeddedStore() override;
  EmbeddedStore(const EmbeddedStore&) = delete;
  EmbeddedStore& operator=(const EmbeddedStore&) = delete;

  core::Task<StatusOr<core::ReserveResult>> Reserve(std::string key, core::Record reservation,
                                                    UnixMillis now) override;
  core::Task<Status> Complete(std::string key, std::string owner, core::Record completed) override;
  core::Task<Status> Release(std::string key, std::string owner) override;
  core::Task<StatusOr<std::optional<core::Record>>> Get(std::string key, UnixMillis now) override;
  core::Task<StatusOr<core::PurgeResult>> Purge(std::string key, core::PurgeMode mode, UnixMillis now) override;
  core::Task<StatusOr<std::unique_ptr<core::Watch>>> WatchKey(std::string key) override;
  core::Task<Status> Ping() override;
  // keys: RocksDB's estimate for the records family (counts versions and
  // tombstones not yet compacted); bytes: live SST files plus memtables.
  core::StoreStats Stats() const override;
  // A write refused for a full disk or a background error passes once the
  // store takes writes again (EmbeddedStore's recovery), so a failed
  // completion is worth trying again within its lease.
  bool FailedWritesMayPass() const override { return true; }

  // Free bytes the store waits for on the volume after a full disk before it
  // resumes writes: room for the flush that resuming starts with and for the
  // next memtable, twice write_buffer_bytes (at least 16 MiB; 32 MiB by
  // default), so that the disk is not full again at once; but at most a
  // quarter of the volume (`volume_bytes`), so that a small volume resumes too.
  static std::uint64_t ResumeFreeBytes(std::uint64_t write_buffer_bytes, std::uint64_t volume_bytes);

  // True when this Open found no store at the path and made a new, empty one
  // (logged as a warning: a mistyped path means every key is new).
  bool created() const { return created_; }

  // Deletes completed records whose retention ended at or before `now`,
  // consuming at most `max` expiry entries (stale entries of replaced or
  // purged records are dropped without touching the record). Blocking: runs
  // on the committer and waits for it. The space is reclaimed by later
  // compactions.
  StatusOr<SweepResult> SweepExpired(UnixMillis now, std::size_t max);
  // Flushes the memtables and compacts both column families fully, so that
  // deleted and expired records leave the disk now. Blocking; for tests and
  // tooling.
  Status CompactAll();
  // Exact number of stored records, including expired ones not yet swept.
  // Iterates the whole store; for tests and tooling.
  StatusOr<std::uint64_t> CountRecords() const;

  const std::string& path() const { return options_.path; }
  // RocksDB writes made by the committer so far (each commits a whole batch).
  std::uint64_t commits() const { return commits_.load(std::memory_order_relaxed); }
  // Operations that went through the committer so far.
  std::uint64_t committed_operations() const { return committed_ops_.load(std::memory_order_relaxed); }
  // Reserves of new keys the committer decided without reading the database
  // again (the caller's read had found the key absent; see Apply).
  std::uint64_t rereads_skipped() const { return rereads_skipped_.load(std::memory_order_relaxed); }
  // Completes and Releases whose owner check the committer answered from the
  // reservations it remembers writing, without reading the database.
  std::uint64_t owner_reads_skipped() const { return owner_reads_skipped_.load(std::memory_order_relaxed); }
  // While held, the committer takes no operations (they queue up); releasing
  // lets it take everything queued as one batch (up to max_batch). For tests
  // of batching.
  void HoldCommitsForTesting(bool hold);
  // Operations waiting for the committer.
  std::size_t queued_for_testing();

 private:
  struct Mutation;
  struct Batch;
  class Waiter;

  explicit EmbeddedStore(Options options);
  Status OpenDb();

  // Hands `m` to the committer and resumes when it is done.
  core::Task<void> Commit(Mutation& m);
  // The same for a thread that may block (SweepExpired).
  void CommitAndWait(Mutation& m);
  void Enqueue(Mutation* m);
  void CommitterLoop();
  void CommitBatch(const std::vector<Mutation*>& ops);
  // Committer only: after a background error, DB::Resume with a backoff (and
  // after a full disk, only once the volume has ResumeFreeBytes free; see
  // ResumeListener in the .cc).
  void MaybeResume();
  // Committer only: whether options_.path still is the directory the store
  // opened (same device and inode); sets dir_error_ and logs a change.
  void CheckDirectory();
  void Apply(Mutation& m, Batch& batch);
  SweepResult SweepChunk(UnixMillis now, std::size_t max, Status* status);

  // The record under `key` in the database (no pending changes).
  StatusOr<std::optional<core::Record>> Read(const std::string& key) const;
  // Committer only; see Mutation::absent_as_of.
  bool StillAbsent(const std::string& key, std::uint64_t as_of) const;
  // Committer only: keeps reserved_owners_ in step after a batch wrote `key`
  // as `after` (nullopt: deleted).
  void RememberOwner(const std::string& key, const std::optional<core::Record>& after);
  // Read() with `ro`; nullopt when `ro` forbids the file read it would need.
  std::optional<StatusOr<std::optional<core::Record>>> ReadWith(const std::string& key,
                                                                const rocksdb::ReadOptions& ro) const;
  // The same from memory only: nullopt when RocksDB would have to read a file.
  std::optional<StatusOr<std::optional<core::Record>>> ReadCached(const std::string& key) const;
  // Read() on a reader thread; resumes on the caller's executor.
  core::Task<StatusOr<std::optional<core::Record>>> ReadOnReader(const std::string& key);
  // ReadCached(), else ReadOnReader().
  core::Task<StatusOr<std::optional<core::Record>>> ReadAnywhere(const std::string& key);

  Options options_;
  bool created_ = false;
  const Clock& clock_;

  // Owned by the database's options; must outlive db_.
  std::unique_ptr<rocksdb::CompactionFilter> filter_;
  std::unique_ptr<rocksdb::DB> db_;
  rocksdb::ColumnFamilyHandle* records_ = nullptr;
  rocksdb::ColumnFamilyHandle* expiry_ = nullptr;
  rocksdb::ColumnFamilyHandle* default_ = nullptr;

  core::LocalWatchers watchers_;
  // Reads that must touch a file run here, in parallel, off the I/O threads
  // and off the committer.
  std::unique_ptr<boost::asio::thread_pool> readers_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Mutation*> queue_;  // guarded by mu_
  bool committer_waiting_ = false;  // guarded by mu_
  bool stopping_ = false;           // guarded by mu_
  bool held_ = false;               // guarded by mu_
  std::thread committer_;
  // Filled by RocksDB's error listener when a background error stopped writes.
  std::shared_ptr<WriteStop> write_stop_;
  // The device and inode of options_.path when the store opened.
  std::uint64_t dir_dev_ = 0;
  std::uint64_t dir_ino_ = 0;
  // Committer only: not ok while options_.path is not the directory the store
  // opened (removed, renamed or replaced): reservations and pings fail with it.
  Status dir_error_;
  // Committer only: the next periodic CheckDirectory.
  std::chrono::steady_clock::time_point next_dir_check_{};
  // Committer only: the next DB::Resume attempt, and the wait after it
  // (100 ms doubling to 5 s while attempts fail).
  std::chrono::steady_clock::time_point next_resume_try_{};
  std::chrono::steady_clock::duration resume_backoff_{};
  std::atomic<std::uint64_t> commits_{0};
  std::atomic<std::uint64_t> committed_ops_{0};
  std::atomic<std::uint64_t> rereads_skipped_{0};
  std::atomic<std::uint64_t> owner_reads_skipped_{0};
  // Batches the committer has written and made visible (release).
  std::atomic<std::uint64_t> batches_applied_{0};
  // Committer only: the hashes of the keys written by each of the latest
  // batches (sequence number, hashes), oldest first.
  std::deque<std::pair<std::uint64_t, std::vector<std::uint64_t>>> recent_writes_;
  // Committer only: key -> owner of the in-flight reservations this store has
  // written and not yet seen completed, released, purged or replaced. An entry
  // is exactly what the database holds for its key (the committer is the only
  // writer, and entries change only after a successful write); a key without
  // an entry is read from the database. At most
  // options_.remembered_reservations entries.
  std::unordered_map<std::string, std::string> reserved_owners_;
};

}  // namespace idemgate::store::embedded
