#include "store/embedded/embedded_store.h"

#include <rocksdb/cache.h>
#include <rocksdb/compaction_filter.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/table_properties_collectors.h>
#include <rocksdb/write_batch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string_view>
#include <system_error>
#include <unordered_set>
#include <utility>
#include <vector>

#include "store/embedded/offload.h"

namespace idemgate::store::embedded {
namespace {

using core::Record;
using core::RecordState;

constexpr char kRecordsFamily[] = "records";
constexpr char kExpiryFamily[] = "expiry";
constexpr char kFormatKey[] = "idemgate:format";
constexpr char kFormatVersion[] = "1";
constexpr char kPingKey[] = "idemgate:ping";
// Expiry entries handled under one set of stripe locks and one write batch.
constexpr std::size_t kSweepChunk = 64;

std::string Where(const std::string& path) { return "embedded store '" + path + "': "; }

void PutBigEndian(std::string* out, UnixMillis ms) {
  auto v = static_cast<std::uint64_t>(ms);
  for (int shift = 56; shift >= 0; shift -= 8)
    out->push_back(static_cast<char>((v >> shift) & 0xff));
}

UnixMillis GetBigEndian(std::string_view in) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<std::uint8_t>(in[i]);
  return static_cast<UnixMillis>(v);
}

// Big-endian so that the byte order of expiry keys is the time order.
std::string ExpiryKey(UnixMillis expires_ms, std::string_view key) {
  std::string out;
  out.reserve(8 + key.size());
  PutBigEndian(&out, expires_ms);
  out.append(key);
  return out;
}

// A records value: 8 bytes big-endian "drop after" time (expires_ms of a
// completed record with a retention, else 0), then core::EncodeRecord. The
// prefix lets the compaction filter decide without decoding the record (and
// copying its body) for every version it compacts.
constexpr std::size_t kValuePrefix = 8;

std::string EncodeValue(const Record& r) {
  std::string out;
  out.reserve(kValuePrefix + core::EncodedSize(r));
  PutBigEndian(&out, r.state == RecordState::kCompleted ? r.expires_ms : 0);
  out.append(core::EncodeRecord(r));
  return out;
}

StatusOr<Record> DecodeValue(std::string_view value) {
  if (value.size() < kValuePrefix) return InvalidArgumentError("record: missing prefix");
  return core::DecodeRecord(value.substr(kValuePrefix));
}

bool ExpiredAt(const Record& r, UnixMillis now) {
  return r.state == RecordState::kCompleted && r.ExpiredAt(now);
}

// Errors of RocksDB calls made while serving requests.
Status FromRocks(const rocksdb::Status& s, std::string_view op) {
  std::string msg = "embedded store: " + std::string(op) + ": " + s.ToString();
  if (s.IsCorruption()) return InternalError(std::move(msg));
  return UnavailableError(std::move(msg));
}

// Errors of DB::Open, with the likely cause spelled out.
Status OpenError(const std::string& path, const rocksdb::Status& s) {
  const std::string msg = s.ToString();
  if (s.IsIOError() && msg.find("LOCK") != std::string::npos) {
    return FailedPreconditionError(Where(path) +
                                   "already in use by another idemgate process or store instance "
                                   "(its RocksDB LOCK file is held): " +
                                   msg);
  }
  if (s.IsCorruption()) return InternalError(Where(path) + "data files are corrupt: " + msg);
  if (msg.find("Permission denied") != std::string::npos) {
    return FailedPreconditionError(Where(path) + "permission denied: " + msg);
  }
  if (s.IsInvalidArgument()) {
    return FailedPreconditionError(Where(path) + "not an idemgate store: " + msg);
  }
  return UnavailableError(Where(path) + "cannot open: " + msg);
}

Status PathError(const std::string& path, std::string_view what, const std::error_code& ec) {
  std::string msg = Where(path) + std::string(what) + ": " + ec.message();
  if (ec == std::errc::permission_denied || ec == std::errc::operation_not_permitted ||
      ec == std::errc::read_only_file_system) {
    return FailedPreconditionError(std::move(msg));
  }
  if (ec == std::errc::not_a_directory) return InvalidArgumentError(std::move(msg));
  return UnavailableError(std::move(msg));
}

// Checks (and creates) the directory so that the common mistakes get a plain
// message before RocksDB sees the path.
Status PreparePath(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) return PathError(path, "cannot access", ec);
  if (fs::exists(st) && !fs::is_directory(st)) {
    return InvalidArgumentError(Where(path) + "exists and is not a directory");
  }
  if (!fs::exists(st)) {
    fs::create_directories(path, ec);
    if (ec) return PathError(path, "cannot create the directory", ec);
  }
  if (::access(path.c_str(), R_OK | W_OK | X_OK) != 0) {
    return PathError(path, "the directory is not readable and writable",
                     std::error_code(errno, std::generic_category()));
  }
  return Status::Ok();
}

// Drops completed records past their retention while RocksDB compacts, so
// that records the sweeper missed (or whose expiry entry was lost) still
// leave the disk. Dropping a record that is already past retention changes
// nothing observable: every operation treats it as absent. Values without
// the prefix are kept. Stateless apart from the clock, so safe from any compaction thread.
class ExpiredRecordFilter final : public rocksdb::CompactionFilter {
 public:
  explicit ExpiredRecordFilter(const Clock& clock) : clock_(clock) {}

  bool Filter(int /*level*/, const rocksdb::Slice& /*key*/, const rocksdb::Slice& value,
              std::string* /*new_value*/, bool* /*value_changed*/) const override {
    if (value.size() < kValuePrefix) return false;
    const UnixMillis drop_after = GetBigEndian(std::string_view(value.data(), kValuePrefix));
    return drop_after != 0 && drop_after <= clock_.NowMillis();
  }
  const char* Name() const override { return "idemgate.ExpiredRecordFilter"; }

 private:
  const Clock& clock_;
};

// Options for a workload of point lookups and small read-modify-writes with a
// bounded memory footprint: one shared LRU block cache that also holds index
// and filter blocks (so their memory is bounded too), bloom filters on the
// records, a bounded total memtable size, and files full of tombstones (left
// by expiry) compacted early.
rocksdb::DBOptions MakeDbOptions(const EmbeddedStore::Options& o) {
  rocksdb::DBOptions db;
  db.create_if_missing = true;
  db.create_missing_column_families = true;
  db.max_background_jobs = 2;
  db.db_write_buffer_size = 4 * o.write_buffer_bytes;
  db.max_total_wal_size = 4 * o.write_buffer_bytes;
  db.bytes_per_sync = 1 << 20;
  db.max_open_files = 1024;
  db.keep_log_file_num = 3;
  db.max_log_file_size = 8 << 20;
  // File deletions after flush or compaction happen in the background, not in
  // a writer's (possibly I/O) thread.
  db.avoid_unnecessary_blocking_io = true;
  return db;
}

rocksdb::ColumnFamilyOptions MakeFamilyOptions(const std::shared_ptr<rocksdb::Cache>& cache,
                                               bool bloom, std::uint64_t write_buffer) {
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = cache;
  // Index and filters live in the block cache, split into small partitions
  // under a pinned top level: one big index block per file would be evicted
  // by data blocks in its cache shard and re-read on every lookup.
  table.cache_index_and_filter_blocks = true;
  table.cache_index_and_filter_blocks_with_high_priority = true;
  table.pin_l0_filter_and_index_blocks_in_cache = true;
  table.pin_top_level_index_and_filter = true;
  table.index_type = rocksdb::BlockBasedTableOptions::IndexType::kTwoLevelIndexSearch;
  if (bloom) {
    table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
    table.partition_filters = true;
    table.optimize_filters_for_memory = true;
  }
  rocksdb::ColumnFamilyOptions cf;
  cf.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  cf.write_buffer_size = write_buffer;
  cf.max_write_buffer_number = 3;
  cf.level_compaction_dynamic_level_bytes = true;
  cf.table_properties_collector_factories.push_back(
      rocksdb::NewCompactOnDeletionCollectorFactory(10'000, 4'000, 0.5));
  if (bloom) {
    cf.memtable_prefix_bloom_size_ratio = 0.02;
    cf.memtable_whole_key_filtering = true;
  }
  return cf;
}

}  // namespace

template <typename F>
auto EmbeddedStore::Exec(F fn) -> core::Task<decltype(fn())> {
  if (pool_) co_return co_await RunOnPool(*pool_, std::move(fn));
  co_return fn();
}

EmbeddedStore::EmbeddedStore(Options options)
    : options_(std::move(options)),
      clock_(options_.clock ? *options_.clock : SystemClock::Instance()),
      filter_(std::make_unique<ExpiredRecordFilter>(clock_)) {
  // Offload when fsyncing: a commit then blocks for milliseconds, which must
  // not happen on an I/O thread. Without fsync a commit is a WAL append to the
  // page cache plus a memtable insert (microseconds), and the two thread hops
  // of offloading cost more than they save (docs/store-embedded.md).
  if (options_.offload.value_or(options_.sync)) {
    pool_ = std::make_unique<boost::asio::thread_pool>(std::max<std::size_t>(1, options_.threads));
  }
}

StatusOr<std::unique_ptr<EmbeddedStore>> EmbeddedStore::Open(Options options) {
  if (options.path.empty()) return InvalidArgumentError("embedded store: the path is empty");
  if (Status s = PreparePath(options.path); !s.ok()) return s;
  std::unique_ptr<EmbeddedStore> store(new EmbeddedStore(std::move(options)));
  if (Status s = store->OpenDb(); !s.ok()) return s;
  if (store->options_.sweep_interval.count() > 0) {
    store->sweeper_ = std::thread([raw = store.get()] { raw->SweeperLoop(); });
  }
  return store;
}

Status EmbeddedStore::OpenDb() {
  const std::string& path = options_.path;
  std::error_code ec;
  const bool existed = std::filesystem::exists(std::filesystem::path(path) / "CURRENT", ec);

  if (existed) {
    // Refuse another application's database before Open would add our
    // column families to it.
    std::vector<std::string> names;
    rocksdb::Status s = rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), path, &names);
    if (!s.ok()) return OpenError(path, s);
    for (const char* want : {kRecordsFamily, kExpiryFamily}) {
      if (std::find(names.begin(), names.end(), want) == names.end()) {
        // Listing reads little of the MANIFEST; a read-only open reads all of
        // it and tells a damaged store from a foreign database.
        rocksdb::DB* raw = nullptr;
        s = rocksdb::DB::OpenForReadOnly(rocksdb::Options(), path, &raw);
        std::unique_ptr<rocksdb::DB> probe(raw);
        if (!s.ok()) return OpenError(path, s);
        return FailedPreconditionError(Where(path) +
                                       "holds a RocksDB database that is not an idemgate store");
      }
    }
  }

  rocksdb::LRUCacheOptions cache_options;
  cache_options.capacity = options_.block_cache_bytes;
  cache_options.num_shard_bits = 4;  // 4 MiB shards at 64 MiB: fewer, larger LRUs
  auto cache = rocksdb::NewLRUCache(cache_options);
  rocksdb::ColumnFamilyOptions records =
      MakeFamilyOptions(cache, true, options_.write_buffer_bytes);
  records.compaction_filter = filter_.get();
  rocksdb::ColumnFamilyOptions expiry = MakeFamilyOptions(
      cache, false, std::max<std::uint64_t>(1 << 20, options_.write_buffer_bytes / 4));
  rocksdb::ColumnFamilyOptions small = MakeFamilyOptions(cache, false, 1 << 20);

  std::vector<rocksdb::ColumnFamilyDescriptor> families = {
      {rocksdb::kDefaultColumnFamilyName, small},
      {kRecordsFamily, records},
      {kExpiryFamily, expiry},
  };
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(MakeDbOptions(options_), path, families, &handles, &raw);
  if (!s.ok()) return OpenError(path, s);
  db_.reset(raw);
  default_ = handles[0];
  records_ = handles[1];
  expiry_ = handles[2];

  std::string format;
  s = db_->Get(rocksdb::ReadOptions(), default_, kFormatKey, &format);
  if (s.IsNotFound()) {
    rocksdb::WriteOptions wo;
    wo.sync = true;
    s = db_->Put(wo, default_, kFormatKey, kFormatVersion);
    if (!s.ok()) return OpenError(path, s);
  } else if (!s.ok()) {
    return OpenError(path, s);
  } else if (format != kFormatVersion) {
    return FailedPreconditionError(Where(path) + "unsupported data format version '" + format +
                                   "' (this idemgate reads version " + kFormatVersion + ")");
  }
  return Status::Ok();
}

EmbeddedStore::~EmbeddedStore() {
  {
    std::lock_guard lock(sweeper_mu_);
    stopping_ = true;
  }
  sweeper_cv_.notify_all();
  if (sweeper_.joinable()) sweeper_.join();
  if (pool_) pool_->join();
  if (db_) {
    for (auto* h : {expiry_, records_, default_}) {
      if (h) db_->DestroyColumnFamilyHandle(h).PermitUncheckedError();
    }
    db_->Close().PermitUncheckedError();
    db_.reset();
  }
}

// Atomicity: every read-modify-write (Reserve, Complete, Release, Purge, and
// the sweeper's re-check) holds the mutex of the key's stripe from its read to
// the end of its write. Every writer of the database lives in this process
// (the LOCK file keeps other processes out), so this is all the isolation the
// contract needs. RocksDB's TransactionDB would give the same guarantee with a
// per-key lock manager, snapshot validation and a two-phase commit on every
// write: more CPU and code for nothing here. The cost of stripes is that two
// keys hashing to one stripe serialise, which is rare with 256 stripes and
// short critical sections. Get takes no lock: a point read is atomic.
std::size_t EmbeddedStore::StripeOf(const std::string& key) const {
  return std::hash<std::string>{}(key) % kStripes;
}

StatusOr<std::optional<Record>> EmbeddedStore::Read(const std::string& key) const {
  rocksdb::PinnableSlice value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), records_, key, &value);
  if (s.IsNotFound()) return std::optional<Record>();
  if (!s.ok()) return FromRocks(s, "read");
  auto record = DecodeValue(std::string_view(value.data(), value.size()));
  if (!record.ok()) {
    return InternalError("embedded store: undecodable record: " + record.status().message());
  }
  return std::optional<Record>(std::move(*record));
}

StatusOr<core::ReserveResult> EmbeddedStore::ReserveNow(const std::string& key, Record reservation,
                                                        UnixMillis now) {
  if (reservation.state != RecordState::kInFlight) {
    return InvalidArgumentError("embedded store: a reservation must be in flight");
  }
  std::lock_guard lock(stripes_[StripeOf(key)]);
  auto current = Read(key);
  if (!current.ok()) return current.status();
  core::ReserveResult result;
  if (current->has_value() && !ExpiredAt(**current, now)) {
    Record& existing = **current;
    const bool take_over =
        existing.LeaseEndedAt(now) && existing.fingerprint == reservation.fingerprint;
    result.outcome = take_over ? core::ReserveOutcome::kTakenOver : core::ReserveOutcome::kExists;
    result.existing = std::move(existing);
    if (!take_over) return result;
  }
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync;
  rocksdb::Status s = db_->Put(wo, records_, key, EncodeValue(reservation));
  if (!s.ok()) return FromRocks(s, "reserve");
  return result;
}

Status EmbeddedStore::CompleteNow(const std::string& key, const std::string& owner,
                                  Record completed) {
  if (completed.state != RecordState::kCompleted) {
    return InvalidArgumentError("embedded store: a completed record must be completed");
  }
  {
    std::lock_guard lock(stripes_[StripeOf(key)]);
    auto current = Read(key);
    if (!current.ok()) return current.status();
    if (!current->has_value()) return FailedPreconditionError("complete: the key is not reserved");
    if ((*current)->state != RecordState::kInFlight) {
      return FailedPreconditionError("complete: the key is already completed");
    }
    if ((*current)->owner != owner) {
      return FailedPreconditionError("complete: the key is held by another owner (lease lost)");
    }
    rocksdb::WriteBatch batch;
    batch.Put(records_, key, EncodeValue(completed));
    if (completed.expires_ms != 0) batch.Put(expiry_, ExpiryKey(completed.expires_ms, key), "");
    rocksdb::WriteOptions wo;
    wo.sync = options_.sync;
    rocksdb::Status s = db_->Write(wo, &batch);
    if (!s.ok()) return FromRocks(s, "complete");
  }
  watchers_.Notify(key);
  return Status::Ok();
}

Status EmbeddedStore::ReleaseNow(const std::string& key, const std::string& owner) {
  {
    std::lock_guard lock(stripes_[StripeOf(key)]);
    auto current = Read(key);
    if (!current.ok()) return current.status();
    if (!current->has_value() || (*current)->state != RecordState::kInFlight ||
        (*current)->owner != owner) {
      return FailedPreconditionError("release: the key is not held by this owner");
    }
    rocksdb::WriteOptions wo;
    wo.sync = options_.sync;
    rocksdb::Status s = db_->Delete(wo, records_, key);
    if (!s.ok()) return FromRocks(s, "release");
  }
  watchers_.Notify(key);
  return Status::Ok();
}

StatusOr<std::optional<Record>> EmbeddedStore::GetNow(const std::string& key, UnixMillis now) {
  auto current = Read(key);
  if (!current.ok()) return current.status();
  if (current->has_value() && ExpiredAt(**current, now)) return std::optional<Record>();
  return current;
}

StatusOr<bool> EmbeddedStore::PurgeNow(const std::string& key) {
  {
    std::lock_guard lock(stripes_[StripeOf(key)]);
    rocksdb::PinnableSlice value;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), records_, key, &value);
    if (s.IsNotFound()) return false;
    if (!s.ok()) return FromRocks(s, "purge");
    rocksdb::WriteOptions wo;
    wo.sync = options_.sync;
    s = db_->Delete(wo, records_, key);
    if (!s.ok()) return FromRocks(s, "purge");
  }
  watchers_.Notify(key);
  return true;
}

Status EmbeddedStore::PingNow() {
  // A small unsynced write: fails when RocksDB stopped writes after a
  // background error (disk full, I/O error), which a read would not show.
  rocksdb::Status s = db_->Put(rocksdb::WriteOptions(), default_, kPingKey, "");
  if (!s.ok()) return FromRocks(s, "ping");
  return Status::Ok();
}

core::Task<StatusOr<core::ReserveResult>> EmbeddedStore::Reserve(std::string key,
                                                                 Record reservation,
                                                                 UnixMillis now) {
  co_return co_await Exec([&] { return ReserveNow(key, std::move(reservation), now); });
}

core::Task<Status> EmbeddedStore::Complete(std::string key, std::string owner, Record completed) {
  co_return co_await Exec([&] { return CompleteNow(key, owner, std::move(completed)); });
}

core::Task<Status> EmbeddedStore::Release(std::string key, std::string owner) {
  co_return co_await Exec([&] { return ReleaseNow(key, owner); });
}

core::Task<StatusOr<std::optional<Record>>> EmbeddedStore::Get(std::string key, UnixMillis now) {
  co_return co_await Exec([&] { return GetNow(key, now); });
}

core::Task<StatusOr<bool>> EmbeddedStore::Purge(std::string key) {
  co_return co_await Exec([&] { return PurgeNow(key); });
}

core::Task<StatusOr<std::unique_ptr<core::Watch>>> EmbeddedStore::WatchKey(std::string key) {
  co_return co_await watchers_.Make(std::move(key));
}

core::Task<Status> EmbeddedStore::Ping() {
  co_return co_await Exec([&] { return PingNow(); });
}

core::StoreStats EmbeddedStore::Stats() const {
  std::uint64_t keys = 0, sst = 0, mem = 0;
  db_->GetIntProperty(records_, rocksdb::DB::Properties::kEstimateNumKeys, &keys);
  db_->GetIntProperty(records_, rocksdb::DB::Properties::kLiveSstFilesSize, &sst);
  db_->GetIntProperty(records_, rocksdb::DB::Properties::kCurSizeAllMemTables, &mem);
  return {keys, sst + mem};
}

StatusOr<EmbeddedStore::SweepResult> EmbeddedStore::SweepExpired(UnixMillis now, std::size_t max) {
  SweepResult result;
  if (max == 0) return result;
  const UnixMillis bound = now == std::numeric_limits<UnixMillis>::max() ? now : now + 1;
  const std::string upper = ExpiryKey(bound, "");
  rocksdb::Slice upper_slice(upper);
  rocksdb::ReadOptions ro;
  ro.iterate_upper_bound = &upper_slice;

  std::vector<std::string> entries;
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, expiry_));
    for (it->SeekToFirst(); it->Valid() && entries.size() < max; it->Next()) {
      entries.push_back(it->key().ToString());
    }
    if (!it->status().ok()) return FromRocks(it->status(), "sweep");
  }

  // Expiry entries are hints: the record is re-read under its stripe lock and
  // deleted only if it is still a completed record past retention (it may
  // have been purged, re-reserved or completed again since). Stripes are
  // locked in ascending order; other operations hold one stripe at a time,
  // so this cannot deadlock. Unsynced: a lost sweep is redone after restart.
  for (std::size_t begin = 0; begin < entries.size(); begin += kSweepChunk) {
    const std::size_t end = std::min(entries.size(), begin + kSweepChunk);
    std::vector<std::size_t> stripes;
    for (std::size_t i = begin; i < end; ++i) {
      stripes.push_back(StripeOf(entries[i].substr(8)));
    }
    std::sort(stripes.begin(), stripes.end());
    stripes.erase(std::unique(stripes.begin(), stripes.end()), stripes.end());
    std::vector<std::unique_lock<std::mutex>> locks;
    locks.reserve(stripes.size());
    for (std::size_t stripe : stripes) locks.emplace_back(stripes_[stripe]);

    rocksdb::WriteBatch batch;
    std::unordered_set<std::string> deleted;
    for (std::size_t i = begin; i < end; ++i) {
      std::string key = entries[i].substr(8);
      batch.Delete(expiry_, entries[i]);
      if (deleted.count(key)) continue;
      auto current = Read(key);
      if (current.ok() && current->has_value() && ExpiredAt(**current, now)) {
        batch.Delete(records_, key);
        deleted.insert(std::move(key));
      }
    }
    rocksdb::Status s = db_->Write(rocksdb::WriteOptions(), &batch);
    if (!s.ok()) return FromRocks(s, "sweep");
    result.index_entries += end - begin;
    result.deleted += deleted.size();
  }
  return result;
}

Status EmbeddedStore::CompactAll() {
  rocksdb::FlushOptions flush;
  flush.wait = true;
  rocksdb::Status s = db_->Flush(flush, {records_, expiry_});
  if (!s.ok()) return FromRocks(s, "flush");
  rocksdb::CompactRangeOptions compact;
  compact.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  for (auto* family : {records_, expiry_}) {
    s = db_->CompactRange(compact, family, nullptr, nullptr);
    if (!s.ok()) return FromRocks(s, "compact");
  }
  return Status::Ok();
}

StatusOr<std::uint64_t> EmbeddedStore::CountRecords() const {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), records_));
  std::uint64_t n = 0;
  for (it->SeekToFirst(); it->Valid(); it->Next()) ++n;
  if (!it->status().ok()) return FromRocks(it->status(), "count");
  return n;
}

void EmbeddedStore::SweeperLoop() {
  std::unique_lock lock(sweeper_mu_);
  while (!sweeper_cv_.wait_for(lock, options_.sweep_interval, [this] { return stopping_; })) {
    lock.unlock();
    bool more = true;
    while (more) {
      auto swept = SweepExpired(clock_.NowMillis(), options_.sweep_batch);
      more = swept.ok() && swept->index_entries == options_.sweep_batch;
      std::lock_guard check(sweeper_mu_);
      if (stopping_) more = false;
    }
    lock.lock();
  }
}

}  // namespace idemgate::store::embedded
