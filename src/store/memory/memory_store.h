#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "core/local_watchers.h"
#include "core/store.h"

namespace idemgate::store::memory {

// An in-process Store (SPEC §5, `kind: memory`) for tests and ephemeral
// deployments.
//
// Records are kept encoded (core::EncodeRecord) in sharded open-addressing
// hash tables, one mutex per shard, so operations on different keys rarely
// contend. Each entry is one heap block holding the key and the encoded
// record, which keeps the per-record overhead to a few dozen bytes.
//
// Bounded: the store holds `max_bytes` of key bytes plus encoded record
// bytes (core::EncodedSize). A Reserve that would go past it first sweeps
// expired records, and if still too big fails with ResourceExhausted and
// writes nothing. A Complete is never refused for room: its request ran
// upstream, and a refusal would leave the key reserved until its lease ends
// and then let a retry run it again. When the completed record does not fit
// (after a sweep) it is stored without its body (StoredResponse::body_omitted,
// counted in StoreStats::bodies_dropped and logged), and its status and
// headers are charged even past max_bytes. That overshoot is bounded: at most
// one body-less completion per reservation in flight when the store filled,
// and each reservation was admitted within max_bytes; Reserve admits nothing
// more until the bytes fall under max_bytes again.
//
// Completed records past their retention are treated as absent at once and
// reclaimed lazily: when touched, by a few slots examined on every
// operation (an incremental sweep), and by Sweep(). An in-flight record is
// kept while its owner may still complete or release it, and after its
// lease ends so that a retry with the same fingerprint takes it over (and
// one with another fingerprint gets a conflict); kReservationGrace after its
// lease it is dropped like an expired record, so a reservation abandoned for
// good (its gateway killed, its client never retried) gives its bytes back.
// The Redis store drops such reservations after the same grace.
//
// Thread-safe. Operations complete synchronously and resume on the caller's
// executor. Watchers (core::LocalWatchers) are woken by Complete, Release
// and Purge.
class MemoryStore final : public core::Store {
 public:
  // `clock` times the incremental sweep of operations that carry no `now`
  // (Complete, Release; Reserve and Get sweep by their `now`), so callers
  // should pass times from the same clock. It must outlive the store.
  // `shards` 0 picks a default (64).
  MemoryStore(std::uint64_t max_bytes, const Clock& clock, std::size_t shards = 0);
  ~MemoryStore() override;
  MemoryStore(const MemoryStore&) = delete;
  MemoryStore& operator=(const MemoryStore&) = delete;

  core::Task<StatusOr<core::ReserveResult>> Reserve(std::string key, core::Record reservation,
                                                    UnixMillis now) override;
  core::Task<Status> Complete(std::string key, std::string owner, core::Record completed) override;
  core::Task<Status> Release(std::string key, std::string owner) override;
  core::Task<StatusOr<std::optional<core::Record>>> Get(std::string key, UnixMillis now) override;
  core::Task<StatusOr<core::PurgeResult>> Purge(std::string key, core::PurgeMode mode, UnixMillis now) override;
  core::Task<StatusOr<std::unique_ptr<core::Watch>>> WatchKey(std::string key) override;
  core::Task<Status> Ping() override;
  core::StoreStats Stats() const override;

  // Synchronous forms of the operations above, with the same contracts (for
  // callers without a coroutine, e.g. tools and benchmarks).
  StatusOr<core::ReserveResult> ReserveNow(std::string_view key, const core::Record& reservation,
                                           UnixMillis now);
  Status CompleteNow(std::string_view key, std::string_view owner, core::Record completed);
  Status ReleaseNow(std::string_view key, std::string_view owner);
  StatusOr<std::optional<core::Record>> GetNow(std::string_view key, UnixMillis now);
  core::PurgeResult PurgeNow(std::string_view key, core::PurgeMode mode, UnixMillis now);
  // PurgeNow(key, kAny, ...): true when a record existed.
  bool PurgeNow(std::string_view key);

  // Removes every completed record past its retention at `now`, and every
  // in-flight record kReservationGrace past its lease; returns how many were
  // removed.
  std::size_t Sweep(UnixMillis now);

  // How long after its lease an in-flight record is dropped (the Redis
  // store's default reservation_grace).
  static constexpr Duration kReservationGrace = std::chrono::hours(1);

  std::uint64_t max_bytes() const { return max_bytes_; }
  // Shard scans made to free space or by Sweep() so far. A shard is scanned
  // only when one of its records may be past retention (for tests).
  std::uint64_t full_sweeps() const;
  // Watches currently registered (for tests).
  std::size_t watchers() const { return watchers_.size(); }

  // Bytes a record under `key` is charged against max_bytes.
  static std::uint64_t ChargedBytes(std::string_view key, const core::Record& record);

 private:
  class Shard;

  Shard& ShardFor(std::string_view key, std::uint64_t* hash);
  // Adds `delta` to the byte count unless that would pass max_bytes.
  bool TryCharge(std::int64_t delta);
  void Uncharge(std::uint64_t bytes);
  // Removes the entry at `index` of `shard` (whose lock the caller holds):
  // its bytes and key leave the counts, and it is freed.
  void RemoveAt(Shard& shard, std::ptrdiff_t index);
  // Adds `delta` to the byte count even past max_bytes.
  void ForceCharge(std::int64_t delta);
  // Admits a growth of `delta` bytes, sweeping expired records of every shard
  // but `locked` (whose lock the caller holds) when the store is full.
  bool AdmitGrowth(std::int64_t delta, Shard* locked, UnixMillis now);

  const std::uint64_t max_bytes_;
  const Clock& clock_;
  std::size_t shard_mask_;
  std::unique_ptr<Shard[]> shards_;
  std::atomic<std::uint64_t> bytes_{0};
  std::atomic<std::uint64_t> keys_{0};
  std::atomic<std::uint64_t> bodies_dropped_{0};
  core::LocalWatchers watchers_;
};

}  // namespace idemgate::store::memory
