#include "store/memory/memory_store.h"

#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <new>
#include <optional>
#include <vector>

#include "common/log.h"

namespace idemgate::store::memory {

namespace {

constexpr std::size_t kDefaultShards = 64;
// Slots examined by the incremental sweep on every operation of a shard.
constexpr std::size_t kSweepSlotsPerOp = 4;
constexpr std::size_t kMinCapacity = 16;

// One heap block: this header, then the key bytes, then the encoded record.
struct Entry {
  UnixMillis expires_ms;  // when the record is dropped (SweepDeadline); 0: never
  std::uint32_t key_len;
  std::uint32_t value_len;

  char* data() { return reinterpret_cast<char*>(this + 1); }
  const char* data() const { return reinterpret_cast<const char*>(this + 1); }
  std::string_view key() const { return {data(), key_len}; }
  std::string_view value() const { return {data() + key_len, value_len}; }
  std::uint64_t charged() const { return std::uint64_t{key_len} + value_len; }
  bool ExpiredAt(UnixMillis now) const { return expires_ms != 0 && expires_ms <= now; }

  // The record is encoded straight into the block (`value_size` is its
  // core::EncodedSize), with no string in between.
  static Entry* Make(std::string_view key, const core::Record& record, std::size_t value_size,
                     UnixMillis expires_ms) {
    void* raw = ::operator new(sizeof(Entry) + key.size() + value_size);
    Entry* e = new (raw) Entry{expires_ms, static_cast<std::uint32_t>(key.size()),
                               static_cast<std::uint32_t>(value_size)};
    std::memcpy(e->data(), key.data(), key.size());
    core::EncodeRecordInto(record, e->data() + key.size());
    return e;
  }
  static void Free(Entry* e) {
    e->~Entry();
    ::operator delete(static_cast<void*>(e));
  }
};

// The entry's retention end is kept beside its pointer so that the
// incremental sweep scans the slot array without touching the entries
// (one cache miss each).
struct Slot {
  std::uint64_t hash = 0;
  Entry* entry = nullptr;
  UnixMillis expires_ms = 0;  // entry->expires_ms

  bool ExpiredAt(UnixMillis now) const { return expires_ms != 0 && expires_ms <= now; }
};

std::uint64_t HashKey(std::string_view key) {
  // libstdc++'s string hash is a 64-bit Murmur variant; mix once more so the
  // shard (top bits) and the slot (low bits) are independent.
  std::uint64_t h = std::hash<std::string_view>{}(key);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return h;
}

// For an encoded value: when it is dropped. A completed record at the end of
// its retention; an in-flight one kReservationGrace after its lease ends, so
// that a reservation its owner abandoned (a crash, a client that never
// retried) does not hold its bytes forever.
UnixMillis SweepDeadline(const core::Record& r) {
  if (r.state == core::RecordState::kCompleted) return r.expires_ms;
  return r.lease_expires_ms + MemoryStore::kReservationGrace.count();
}

}  // namespace

// A linear-probing hash table of entries with backward-shift deletion.
// Guarded by `mu`; every member is only touched with `mu` held.
class MemoryStore::Shard {
 public:
  Shard() = default;
  ~Shard() {
    for (Slot& s : slots_) {
      if (s.entry != nullptr) Entry::Free(s.entry);
    }
  }

  std::mutex mu;

  // Index of the slot holding `key`, or -1.
  std::ptrdiff_t Find(std::uint64_t hash, std::string_view key) const {
    if (slots_.empty()) return -1;
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t i = hash & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.entry == nullptr) return -1;
      if (s.hash == hash && s.entry->key() == key) return static_cast<std::ptrdiff_t>(i);
    }
  }

  Entry* At(std::ptrdiff_t index) const { return slots_[static_cast<std::size_t>(index)].entry; }

  // Swaps the entry at `index` for `e`; returns the old one.
  Entry* ReplaceAt(std::ptrdiff_t index, Entry* e) {
    Slot& s = slots_[static_cast<std::size_t>(index)];
    Entry* old = s.entry;
    s.entry = e;
    s.expires_ms = e->expires_ms;
    NoteExpiry(e->expires_ms);
    return old;
  }

  // Inserts `e` (its key must be absent).
  void Insert(std::uint64_t hash, Entry* e) {
    if ((count_ + 1) * 8 > slots_.size() * 7) Resize(slots_.empty() ? kMinCapacity : slots_.size() * 2);
    Place(hash, e);
    ++count_;
  }

  // Unlinks the entry at `index` and returns it (not freed).
  Entry* EraseAt(std::ptrdiff_t index) {
    const std::size_t mask = slots_.size() - 1;
    std::size_t i = static_cast<std::size_t>(index);
    Entry* removed = slots_[i].entry;
    slots_[i] = Slot{};
    for (std::size_t j = (i + 1) & mask; slots_[j].entry != nullptr; j = (j + 1) & mask) {
      const std::size_t home = slots_[j].hash & mask;
      // Slot j may stay when its home lies cyclically in (i, j].
      const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
      if (stays) continue;
      slots_[i] = slots_[j];
      slots_[j] = Slot{};
      i = j;
    }
    --count_;
    return removed;
  }

  // Examines up to `budget` slots from the sweep cursor and removes the
  // entries past retention at `now`; returns their charged bytes.
  std::uint64_t SweepSome(std::size_t budget, UnixMillis now, std::size_t* removed) {
    std::uint64_t freed = 0;
    if (slots_.empty()) return 0;
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t n = 0; n < budget; ++n) {
      cursor_ &= mask;
      Entry* e = slots_[cursor_].entry;
      if (e != nullptr && slots_[cursor_].ExpiredAt(now)) {
        // Backward shift may move a later entry into this slot; look again.
        EraseAt(static_cast<std::ptrdiff_t>(cursor_));
        freed += e->charged();
        Entry::Free(e);
        ++*removed;
        continue;
      }
      ++cursor_;
    }
    return freed;
  }

  // Full sweeps so far (each scans every slot).
  std::uint64_t full_sweeps() const { return full_sweeps_; }

  // Removes every entry past retention; returns their charged bytes. Scans
  // nothing when no entry can be past retention at `now` (every retention
  // end seen since the last full sweep lies later).
  std::uint64_t SweepAll(UnixMillis now, std::size_t* removed) {
    if (earliest_expiry_ > now) return 0;
    ++full_sweeps_;
    earliest_expiry_ = kNoExpiry;  // recomputed as the kept entries are placed
    std::uint64_t freed = 0;
    std::vector<Entry*> keep;
    keep.reserve(count_);
    for (Slot& s : slots_) {
      if (s.entry == nullptr) continue;
      if (s.entry->ExpiredAt(now)) {
        freed += s.entry->charged();
        Entry::Free(s.entry);
        ++*removed;
      } else {
        keep.push_back(s.entry);
      }
      s = Slot{};
    }
    count_ = keep.size();
    std::size_t capacity = kMinCapacity;
    while (capacity * 7 < count_ * 8 * 2) capacity *= 2;
    if (count_ == 0) {
      slots_.clear();
      slots_.shrink_to_fit();
    } else {
      slots_.assign(capacity, Slot{});
      for (Entry* e : keep) Place(HashKey(e->key()), e);
    }
    cursor_ = 0;
    return freed;
  }

  // Halves the table when it is mostly empty, so swept memory is returned.
  void MaybeShrink() {
    if (slots_.size() > kMinCapacity && count_ * 8 < slots_.size()) Resize(slots_.size() / 2);
  }

 private:
  void Place(std::uint64_t hash, Entry* e) {
    const std::size_t mask = slots_.size() - 1;
    std::size_t i = hash & mask;
    while (slots_[i].entry != nullptr) i = (i + 1) & mask;
    slots_[i] = Slot{hash, e, e->expires_ms};
    NoteExpiry(e->expires_ms);
  }

  void NoteExpiry(UnixMillis expires_ms) {
    if (expires_ms != 0 && expires_ms < earliest_expiry_) earliest_expiry_ = expires_ms;
  }

  void Resize(std::size_t capacity) {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(capacity, Slot{});
    for (const Slot& s : old) {
      if (s.entry != nullptr) Place(s.hash, s.entry);
    }
    cursor_ = 0;
  }

  static constexpr UnixMillis kNoExpiry = std::numeric_limits<UnixMillis>::max();

  std::vector<Slot> slots_;
  std::size_t count_ = 0;
  std::size_t cursor_ = 0;
  // A lower bound of the retention ends of the entries (exact after a full
  // sweep; removals leave it low). Lets a full store skip scanning shards
  // where nothing can have expired: without it every write to a store full of
  // live records would scan every slot of every shard.
  UnixMillis earliest_expiry_ = kNoExpiry;
  std::uint64_t full_sweeps_ = 0;
};

MemoryStore::MemoryStore(std::uint64_t max_bytes, const Clock& clock, std::size_t shards)
    : max_bytes_(max_bytes), clock_(clock) {
  std::size_t n = 1;
  const std::size_t wanted = shards == 0 ? kDefaultShards : shards;
  while (n < wanted) n *= 2;
  shard_mask_ = n - 1;
  shards_ = std::make_unique<Shard[]>(n);
}

MemoryStore::~MemoryStore() = default;

std::uint64_t MemoryStore::ChargedBytes(std::string_view key, const core::Record& record) {
  return key.size() + core::EncodedSize(record);
}

MemoryStore::Shard& MemoryStore::ShardFor(std::string_view key, std::uint64_t* hash) {
  *hash = HashKey(key);
  return shards_[(*hash >> 40) & shard_mask_];
}

bool MemoryStore::TryCharge(std::int64_t delta) {
  if (delta <= 0) {
    bytes_.fetch_sub(static_cast<std::uint64_t>(-delta), std::memory_order_relaxed);
    return true;
  }
  const auto add = static_cast<std::uint64_t>(delta);
  std::uint64_t cur = bytes_.load(std::memory_order_relaxed);
  do {
    if (add > max_bytes_ || cur > max_bytes_ - add) return false;
  } while (!bytes_.compare_exchange_weak(cur, cur + add, std::memory_order_relaxed));
  return true;
}

void MemoryStore::Uncharge(std::uint64_t bytes) { bytes_.fetch_sub(bytes, std::memory_order_relaxed); }

void MemoryStore::RemoveAt(Shard& shard, std::ptrdiff_t index) {
  Entry* e = shard.EraseAt(index);
  Uncharge(e->charged());
  keys_.fetch_sub(1, std::memory_order_relaxed);
  Entry::Free(e);
}

void MemoryStore::ForceCharge(std::int64_t delta) {
  if (delta >= 0) {
    bytes_.fetch_add(static_cast<std::uint64_t>(delta), std::memory_order_relaxed);
  } else {
    Uncharge(static_cast<std::uint64_t>(-delta));
  }
}

bool MemoryStore::AdmitGrowth(std::int64_t delta, Shard* locked, UnixMillis now) {
  if (TryCharge(delta)) return true;
  std::size_t removed = 0;
  std::uint64_t freed = locked->SweepAll(now, &removed);
  for (std::size_t i = 0; i <= shard_mask_; ++i) {
    Shard& s = shards_[i];
    if (&s == locked) continue;
    // try_lock: the caller holds `locked`, so waiting here could deadlock
    // against a thread sweeping the other way. A busy shard is skipped.
    std::unique_lock lock(s.mu, std::try_to_lock);
    if (!lock.owns_lock()) continue;
    freed += s.SweepAll(now, &removed);
  }
  Uncharge(freed);
  keys_.fetch_sub(removed, std::memory_order_relaxed);
  return TryCharge(delta);
}

StatusOr<core::ReserveResult> MemoryStore::ReserveNow(std::string_view key,
                                                      const core::Record& reservation,
                                                      UnixMillis now) {
  if (reservation.state != core::RecordState::kInFlight) {
    return InvalidArgumentError("memory store: a reservation must be in flight");
  }
  std::uint64_t hash = 0;
  Shard& shard = ShardFor(key, &hash);
  core::ReserveResult result;
  std::lock_guard lock(shard.mu);
  std::size_t swept = 0;
  Uncharge(shard.SweepSome(kSweepSlotsPerOp, now, &swept));
  keys_.fetch_sub(swept, std::memory_order_relaxed);

  std::ptrdiff_t index = shard.Find(hash, key);
  if (index >= 0 && shard.At(index)->ExpiredAt(now)) {
    // Past retention (or an abandoned reservation past its grace): the key is new again.
    RemoveAt(shard, index);
    index = -1;
  }
  std::uint64_t old_charged = 0;
  if (index >= 0) {
    old_charged = shard.At(index)->charged();
    StatusOr<core::Record> existing = core::DecodeRecord(shard.At(index)->value());
    if (!existing.ok()) return InternalError("memory store: " + existing.status().message());
    const bool take_over =
        existing->LeaseEndedAt(now) && existing->fingerprint == reservation.fingerprint;
    result.outcome = take_over ? core::ReserveOutcome::kTakenOver : core::ReserveOutcome::kExists;
    result.existing = std::move(existing).value();
    if (!take_over) return result;
  }

  const std::size_t value_size = core::EncodedSize(reservation);
  const std::uint64_t new_charged = key.size() + value_size;
  if (!AdmitGrowth(static_cast<std::int64_t>(new_charged) - static_cast<std::int64_t>(old_charged),
                   &shard, now)) {
    return ResourceExhaustedError("memory store: max_bytes reached");
  }
  Entry* fresh = Entry::Make(key, reservation, value_size, SweepDeadline(reservation));
  if (index >= 0) {
    // The entry replaced is not past its sweep deadline at `now` (checked
    // above), so the sweep kept it, but it may have moved it.
    Entry::Free(shard.ReplaceAt(shard.Find(hash, key), fresh));
  } else {
    shard.Insert(hash, fresh);
    keys_.fetch_add(1, std::memory_order_relaxed);
  }
  return result;
}

Status MemoryStore::CompleteNow(std::string_view key, std::string_view owner, core::Record completed) {
  if (completed.state != core::RecordState::kCompleted) {
    return InvalidArgumentError("memory store: a completed record must be completed");
  }
  std::uint64_t hash = 0;
  Shard& shard = ShardFor(key, &hash);
  {
    std::lock_guard lock(shard.mu);
    const UnixMillis now = clock_.NowMillis();
    std::size_t swept = 0;
    Uncharge(shard.SweepSome(kSweepSlotsPerOp, now, &swept));
    keys_.fetch_sub(swept, std::memory_order_relaxed);

    std::ptrdiff_t index = shard.Find(hash, key);
    if (index < 0) return FailedPreconditionError("memory store: key is not reserved");
    const Entry* e = shard.At(index);
    StatusOr<core::RecordOwnership> current = core::PeekOwnership(e->value());
    if (!current.ok()) return InternalError("memory store: " + current.status().message());
    if (current->state != core::RecordState::kInFlight || current->owner != owner || e->ExpiredAt(now)) {
      // Past its sweep deadline the reservation is gone, as after a sweep.
      return FailedPreconditionError("memory store: reservation not held by this owner");
    }
    const std::int64_t old_charged = static_cast<std::int64_t>(e->charged());
    std::size_t value_size = core::EncodedSize(completed);
    if (!AdmitGrowth(static_cast<std::int64_t>(key.size() + value_size) - old_charged, &shard, now)) {
      // The upstream ran the request: refusing the completion would leave
      // the key reserved until its lease ends and then let a retry run it
      // again. The status and headers are kept whatever the room, past
      // max_bytes if need be; that adds at most one such record per
      // reservation in flight, each admitted within max_bytes. The body is
      // dropped as a response over max_response_bytes is (replays answer
      // `Idempotency-Replay: omitted`).
      const std::uint64_t dropped = completed.response.DropBody();
      if (dropped > 0) value_size = core::EncodedSize(completed);
      ForceCharge(static_cast<std::int64_t>(key.size() + value_size) - old_charged);
      if (dropped > 0) {
        bodies_dropped_.fetch_add(1, std::memory_order_relaxed);
        static LogLimiter limiter;
        LogWarn(limiter, "response stored without its body: the memory store is full (store.max_bytes); "
                "replays answer with an empty body and Idempotency-Replay: omitted",
                {{"key", key},
                 {"operation_id", completed.operation_id},
                 {"status", completed.response.status},
                 {"body_bytes", dropped},
                 {"max_bytes", max_bytes_}});
      }
    }
    // The entry is not past its sweep deadline at `now` (checked above), so
    // a sweep kept it, but it may have moved it.
    index = shard.Find(hash, key);
    Entry::Free(shard.ReplaceAt(index, Entry::Make(key, completed, value_size, SweepDeadline(completed))));
  }
  watchers_.Notify(key);
  return Status::Ok();
}

Status MemoryStore::ReleaseNow(std::string_view key, std::string_view owner) {
  std::uint64_t hash = 0;
  Shard& shard = ShardFor(key, &hash);
  {
    std::lock_guard lock(shard.mu);
    std::size_t swept = 0;
    Uncharge(shard.SweepSome(kSweepSlotsPerOp, clock_.NowMillis(), &swept));
    keys_.fetch_sub(swept, std::memory_order_relaxed);

    const std::ptrdiff_t index = shard.Find(hash, key);
    if (index < 0) return FailedPreconditionError("memory store: key is not reserved");
    StatusOr<core::RecordOwnership> current = core::PeekOwnership(shard.At(index)->value());
    if (!current.ok()) return InternalError("memory store: " + current.status().message());
    if (current->state != core::RecordState::kInFlight || current->owner != owner) {
      return FailedPreconditionError("memory store: reservation not held by this owner");
    }
    RemoveAt(shard, index);
    shard.MaybeShrink();
  }
  watchers_.Notify(key);
  return Status::Ok();
}

StatusOr<std::optional<core::Record>> MemoryStore::GetNow(std::string_view key, UnixMillis now) {
  std::uint64_t hash = 0;
  Shard& shard = ShardFor(key, &hash);
  std::lock_guard lock(shard.mu);
  std::size_t swept = 0;
  Uncharge(shard.SweepSome(kSweepSlotsPerOp, now, &swept));
  keys_.fetch_sub(swept, std::memory_order_relaxed);

  const std::ptrdiff_t index = shard.Find(hash, key);
  if (index < 0) return std::optional<core::Record>();
  if (shard.At(index)->ExpiredAt(now)) {
    RemoveAt(shard, index);
    shard.MaybeShrink();
    return std::optional<core::Record>();
  }
  StatusOr<core::Record> record = core::DecodeRecord(shard.At(index)->value());
  if (!record.ok()) return InternalError("memory store: " + record.status().message());
  return std::optional<core::Record>(std::move(record).value());
}

core::PurgeResult MemoryStore::PurgeNow(std::string_view key, core::PurgeMode mode, UnixMillis now) {
  std::uint64_t hash = 0;
  Shard& shard = ShardFor(key, &hash);
  core::PurgeResult result;
  {
    std::lock_guard lock(shard.mu);
    const std::ptrdiff_t index = shard.Find(hash, key);
    if (index < 0) return result;
    if (shard.At(index)->ExpiredAt(now)) {
      // Past retention (or an abandoned reservation past its grace) the key
      // is absent, as for Get: reclaimed as Get would, and not purged.
      RemoveAt(shard, index);
      shard.MaybeShrink();
      return result;
    }
    // Decided under the shard lock: no reservation can land between the
    // look and the delete.
    StatusOr<core::Record> record = core::DecodeRecord(shard.At(index)->value());
    if (record.ok()) {
      result.state = record->state;
      if (mode == core::PurgeMode::kUnlessInFlight && record->state == core::RecordState::kInFlight &&
          !record->LeaseEndedAt(now)) {
        result.outcome = core::PurgeOutcome::kInFlight;
        result.lease_expires_ms = record->lease_expires_ms;
        return result;
      }
    }
    RemoveAt(shard, index);
    shard.MaybeShrink();
  }
  watchers_.Notify(key);
  result.outcome = core::PurgeOutcome::kPurged;
  return result;
}

bool MemoryStore::PurgeNow(std::string_view key) {
  return PurgeNow(key, core::PurgeMode::kAny, 0).outcome == core::PurgeOutcome::kPurged;
}

std::uint64_t MemoryStore::full_sweeps() const {
  std::uint64_t n = 0;
  for (std::size_t i = 0; i <= shard_mask_; ++i) {
    std::lock_guard lock(shards_[i].mu);
    n += shards_[i].full_sweeps();
  }
  return n;
}

std::size_t MemoryStore::Sweep(UnixMillis now) {
  std::size_t removed = 0;
  for (std::size_t i = 0; i <= shard_mask_; ++i) {
    Shard& s = shards_[i];
    std::size_t n = 0;
    std::uint64_t freed = 0;
    {
      std::lock_guard lock(s.mu);
      freed = s.SweepAll(now, &n);
    }
    Uncharge(freed);
    keys_.fetch_sub(n, std::memory_order_relaxed);
    removed += n;
  }
  return removed;
}

core::Task<StatusOr<core::ReserveResult>> MemoryStore::Reserve(std::string key,
                                                               core::Record reservation,
                                                               UnixMillis now) {
  co_return ReserveNow(key, reservation, now);
}

core::Task<Status> MemoryStore::Complete(std::string key, std::string owner,
                                         core::Record completed) {
  co_return CompleteNow(key, owner, std::move(completed));
}

core::Task<Status> MemoryStore::Release(std::string key, std::string owner) {
  co_return ReleaseNow(key, owner);
}

core::Task<StatusOr<std::optional<core::Record>>> MemoryStore::Get(std::string key,
                                                                    UnixMillis now) {
  co_return GetNow(key, now);
}

core::Task<StatusOr<core::PurgeResult>> MemoryStore::Purge(std::string key, core::PurgeMode mode, UnixMillis now) {
  co_return PurgeNow(key, mode, now);
}

core::Task<StatusOr<std::unique_ptr<core::Watch>>> MemoryStore::WatchKey(std::string key) {
  co_return co_await watchers_.Make(std::move(key));
}

core::Task<Status> MemoryStore::Ping() { co_return Status::Ok(); }

core::StoreStats MemoryStore::Stats() const {
  return core::StoreStats{keys_.load(std::memory_order_relaxed), bytes_.load(std::memory_order_relaxed),
                          bodies_dropped_.load(std::memory_order_relaxed)};
}

}  // namespace idemgate::store::memory
