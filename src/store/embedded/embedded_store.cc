#include "store/embedded/embedded_store.h"

#include "common/log.h"

#include <rocksdb/cache.h>
#include <rocksdb/compaction_filter.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/listener.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/table_properties_collectors.h>
#include <rocksdb/write_batch.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <filesystem>
#include <functional>
#include <limits>
#include <string_view>
#include <system_error>
#include <unordered_set>
#include <utility>
#include <vector>

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <unordered_map>

namespace idemgate::store::embedded {
namespace {

using core::Record;
using core::RecordState;

constexpr char kRecordsFamily[] = "records";
constexpr char kExpiryFamily[] = "expiry";
constexpr char kFormatKey[] = "idemgate:format";
constexpr char kFormatVersion[] = "1";
constexpr char kPingKey[] = "idemgate:ping";
// Expiry entries the background sweep handles between two batches of the
// committer, so that a large sweep never holds requests up for long.
constexpr std::size_t kSweepSlice = 512;
// Threads for reads that miss RocksDB's memory (memtables and block cache).
constexpr std::size_t kReaderThreads = 2;
// Batches whose written keys the committer remembers (see StillAbsent).
constexpr std::size_t kRecentBatches = 64;
// DB::Resume after a background error: the first attempt at once, then after
// a wait that starts at the first and doubles after each failed attempt, up to
// the longest.
constexpr std::chrono::milliseconds kFirstResumeWait{100};
constexpr std::chrono::seconds kLongestResumeWait{5};
// How often the committer checks that store.path still is the directory the
// store opened (pings check it every time).
constexpr std::chrono::seconds kDirectoryCheckInterval{1};

std::string Where(const std::string& path) { return "embedded store '" + path + "': "; }

// A path as the log shows it: absolute, its "." and ".." segments resolved
// lexically (./idemgate-data started in /srv reads /srv/idemgate-data).
std::string ShownPath(const std::string& path) {
  std::error_code ec;
  return std::filesystem::absolute(path, ec).lexically_normal().string();
}

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
  PutBigEndian(&out, r.state == RecordState::kCompleted ? r.expires_ms : 0);
  core::AppendEncodedRecord(r, &out);  // sizes `out` once for the whole value
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

// RocksDB's info log (its LOG file), watched while the store opens for the
// lines in which recovery drops part of a damaged write-ahead log: RocksDB
// recovers to the last good record and drops the rest (kPointInTimeRecovery),
// and says so only in LOG. Whatever was written after the damage is gone: a
// completion there leaves its key reserved (it runs again after its lease),
// a reservation there leaves the key unknown. The gateway says so in its own log.
class OpenWatchLogger : public rocksdb::LoggerWrapper {
 public:
  explicit OpenWatchLogger(std::shared_ptr<rocksdb::Logger> target)
      : rocksdb::LoggerWrapper(target.get()), target_(std::move(target)) {}

  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (watching_.load(std::memory_order_relaxed) && level >= rocksdb::InfoLogLevel::WARN_LEVEL) {
      va_list copy;
      va_copy(copy, ap);
      char line[1024];
      const int n = std::vsnprintf(line, sizeof line, format, copy);
      va_end(copy);
      const std::string_view text(line, n < 0 ? 0 : std::min<std::size_t>(static_cast<std::size_t>(n), sizeof line - 1));
      if (text.find("dropping") != std::string_view::npos && text.find(" bytes; ") != std::string_view::npos) {
        std::lock_guard lock(mu_);
        dropped_.emplace_back(text);
      }
    }
    rocksdb::LoggerWrapper::Logv(level, format, ap);
  }
  using rocksdb::LoggerWrapper::Logv;

  // The drop lines seen so far; stops watching.
  std::vector<std::string> StopWatching() {
    watching_.store(false, std::memory_order_relaxed);
    std::lock_guard lock(mu_);
    return std::move(dropped_);
  }

 private:
  std::shared_ptr<rocksdb::Logger> target_;
  std::atomic<bool> watching_{true};
  std::mutex mu_;
  std::vector<std::string> dropped_;
};

// Free and total bytes of the volume holding `path` (free: what an
// unprivileged process may use).
struct VolumeSpace {
  std::uint64_t free = 0;
  std::uint64_t size = 0;
};
std::optional<VolumeSpace> SpaceOf(const std::string& path) {
  struct statvfs st {};
  if (::statvfs(path.c_str(), &st) != 0) return std::nullopt;
  return VolumeSpace{static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize,
                     static_cast<std::uint64_t>(st.f_blocks) * st.f_frsize};
}

// RocksDB's info log, the LOG file in the store's directory, written by the
// store instead of RocksDB's own logger. That logger writes through RocksDB's
// buffered file writer, which remembers a failed write and, in Debian's
// RocksDB 7.8 build (which keeps its assertions), aborts the process on the
// next line logged after it (`Assertion 'sync_without_flush_called_'
// failed`): on a full disk, the first line after one that could not be
// written, at the latest the line RocksDB logs when the store closes. This
// one appends each line to the file as it comes, unbuffered, and drops a line
// it cannot write; the next line is tried again. Like RocksDB's, it moves an
// existing LOG to LOG.old.<microseconds> at open and once LOG reaches
// `max_bytes`, and keeps `keep` files in all (LOG and the newest old ones).
class InfoLog final : public rocksdb::Logger {
 public:
  InfoLog(rocksdb::FileSystem* fs, std::string dir, std::uint64_t max_bytes, std::size_t keep,
          rocksdb::InfoLogLevel level)
      : rocksdb::Logger(level),
        fs_(fs),
        dir_(std::move(dir)),
        max_bytes_(max_bytes),
        keep_(keep) {
    std::lock_guard lock(mu_);
    StartFileLocked();
  }
  ~InfoLog() override {
    if (!closed_) {
      closed_ = true;
      CloseImpl().PermitUncheckedError();
    }
  }

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    const auto now = std::chrono::system_clock::now();
    const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
    const auto micros =
        std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1'000'000;
    std::tm t{};
    ::localtime_r(&seconds, &t);
    char prefix[64];
    const int n = std::snprintf(prefix, sizeof prefix, "%04d/%02d/%02d-%02d:%02d:%02d.%06d %llx ", t.tm_year + 1900,
                                t.tm_mon + 1, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec, static_cast<int>(micros),
                                static_cast<unsigned long long>(::gettid()));
    std::string line(prefix, n > 0 ? static_cast<std::size_t>(n) : 0);
    char body[1024];
    va_list copy;
    va_copy(copy, ap);
    const int m = std::vsnprintf(body, sizeof body, format, copy);
    va_end(copy);
    if (m < 0) return;
    if (static_cast<std::size_t>(m) < sizeof body) {
      line.append(body, static_cast<std::size_t>(m));
    } else {
      const std::size_t start = line.size();
      line.resize(start + static_cast<std::size_t>(m) + 1);
      va_copy(copy, ap);
      std::vsnprintf(line.data() + start, static_cast<std::size_t>(m) + 1, format, copy);
      va_end(copy);
      line.resize(start + static_cast<std::size_t>(m));
    }
    if (line.back() != '\n') line.push_back('\n');

    std::lock_guard lock(mu_);
    if (shut_) return;
    if (!file_ || bytes_ >= max_bytes_) StartFileLocked();  // also after LOG could not be opened
    if (!file_) return;
    rocksdb::IOStatus s = file_->Append(line, rocksdb::IOOptions(), nullptr);
    if (s.ok()) bytes_ += line.size();
    s.PermitUncheckedError();
  }

  std::size_t GetLogFileSize() const override {
    std::lock_guard lock(mu_);
    return static_cast<std::size_t>(bytes_);
  }

 protected:
  rocksdb::Status CloseImpl() override {
    std::lock_guard lock(mu_);
    shut_ = true;
    if (file_) file_->Close(rocksdb::IOOptions(), nullptr).PermitUncheckedError();
    file_.reset();
    return rocksdb::Status::OK();
  }

 private:
  // Moves LOG (if any) to LOG.old.<microseconds> and starts a new one.
  void StartFileLocked() {
    const rocksdb::IOOptions io;
    if (file_) file_->Close(io, nullptr).PermitUncheckedError();
    file_.reset();
    bytes_ = 0;
    const std::string log = dir_ + "/LOG";
    if (fs_->FileExists(log, io, nullptr).ok()) {
      const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
      if (!fs_->RenameFile(log, dir_ + "/LOG.old." + std::to_string(micros), io, nullptr).ok()) {
        // Keep appending to the old one rather than truncating it.
        std::uint64_t size = 0;
        fs_->GetFileSize(log, io, &size, nullptr).PermitUncheckedError();
        if (fs_->ReopenWritableFile(log, rocksdb::FileOptions(), &file_, nullptr).ok()) {
          bytes_ = size >= max_bytes_ ? 0 : size;  // so that the next move is tried after max_bytes more
        }
        return;
      }
      TrimOldLocked();
    }
    fs_->NewWritableFile(log, rocksdb::FileOptions(), &file_, nullptr).PermitUncheckedError();
  }

  // Deletes all but the newest keep_ - 1 LOG.old.* files: keep_ files with LOG
  // (RocksDB's keep_log_file_num, which its own purge of old files applies too).
  void TrimOldLocked() {
    std::vector<std::string> children;
    if (!fs_->GetChildren(dir_, rocksdb::IOOptions(), &children, nullptr).ok()) return;
    std::vector<std::pair<std::uint64_t, std::string>> old;
    for (const std::string& name : children) {
      if (!name.starts_with("LOG.old.")) continue;
      old.emplace_back(std::strtoull(name.c_str() + 8, nullptr, 10), name);
    }
    const std::size_t kept_old = keep_ > 0 ? keep_ - 1 : 0;
    if (old.size() <= kept_old) return;
    std::sort(old.begin(), old.end());
    for (std::size_t i = 0; i + kept_old < old.size(); ++i) {
      fs_->DeleteFile(dir_ + "/" + old[i].second, rocksdb::IOOptions(), nullptr).PermitUncheckedError();
    }
  }

  rocksdb::FileSystem* const fs_;
  const std::string dir_;
  const std::uint64_t max_bytes_;
  const std::size_t keep_;
  mutable std::mutex mu_;
  std::unique_ptr<rocksdb::FSWritableFile> file_;  // guarded by mu_; null: LOG could not be opened
  std::uint64_t bytes_ = 0;                         // guarded by mu_
  bool shut_ = false;                               // guarded by mu_: closed
};

}  // namespace

// Background errors, as RocksDB's listener reports them to the committer.
struct EmbeddedStore::WriteStop {
  WriteStop(std::string path, std::uint64_t write_buffer_bytes)
      : path(std::move(path)), write_buffer_bytes(write_buffer_bytes) {}

  const std::string path;
  const std::uint64_t write_buffer_bytes;
  // Set with every background error, cleared once DB::Resume succeeded after
  // the last one: the committer's fast check.
  std::atomic<bool> pending{false};
  std::mutex mu;
  std::uint64_t errors = 0;  // guarded by mu: background errors so far
  bool no_space = false;     // guarded by mu: one of them was a full disk
  bool logged = false;       // guarded by mu: "stopped" logged, "resumed" not yet

  void Note(std::string_view source, const rocksdb::Status& error) {
    std::lock_guard lock(mu);
    ++errors;
    if (error.IsNoSpace() || error.subcode() == rocksdb::Status::SubCode::kSpaceLimit) no_space = true;
    pending.store(true, std::memory_order_release);
    if (logged) return;
    logged = true;
    const bool writes = error.severity() >= rocksdb::Status::Severity::kHardError ||
                        error.severity() == rocksdb::Status::kNoError;
    const std::string_view msg =
        writes ? "embedded store: writes stopped after a background error; the store resumes them by itself once "
                 "the cause is gone"
               : "embedded store: compactions stopped after a background error; the store resumes them by itself "
                 "once the cause is gone";
    const std::optional<VolumeSpace> space = no_space ? SpaceOf(path) : std::nullopt;
    if (!space) {
      LogWarn(msg,
              {{"during", source}, {"error", error.ToString()}, {"waits_for_free_space", no_space ? "true" : "false"}});
      return;
    }
    // The free space it waits for (see ResumeFreeBytes), and what there is now.
    LogWarn(msg, {{"during", source},
                  {"error", error.ToString()},
                  {"waits_for_free_space", "true"},
                  {"free_bytes_needed", ResumeFreeBytes(write_buffer_bytes, space->size)},
                  {"free_bytes", space->free}});
  }
};

namespace {

std::string_view ReasonName(rocksdb::BackgroundErrorReason reason) {
  switch (reason) {
    case rocksdb::BackgroundErrorReason::kFlush: return "flush";
    case rocksdb::BackgroundErrorReason::kCompaction: return "compaction";
    case rocksdb::BackgroundErrorReason::kWriteCallback: return "write";
    case rocksdb::BackgroundErrorReason::kMemTable: return "memtable switch";
    case rocksdb::BackgroundErrorReason::kManifestWrite: return "manifest write";
    case rocksdb::BackgroundErrorReason::kFlushNoWAL: return "flush";
    case rocksdb::BackgroundErrorReason::kManifestWriteNoWAL: return "manifest write";
  }
  return "background work";
}

// Hands RocksDB's background errors to the committer, which resumes the
// database itself (EmbeddedStore::MaybeResume); until then writes fail, and
// reads go on.
//
// RocksDB's own recovery is turned off: it retries on a disk that stays full,
// where the committer waits for room first (MaybeResume). RocksDB only offers
// that recovery (OnErrorRecoveryBegin) for a full disk; every background
// error is reported by OnBackgroundError.
//
// An I/O error that is no full disk (EMFILE while opening the next
// write-ahead log or a table file: a burst of connections under a low
// `ulimit -n`) is rated fatal during a flush, a compaction or a memtable
// switch, and DB::Resume refuses fatal errors: writes would fail until a
// restart. Such an error loses nothing (the memtable switch failed before
// the old log was touched; a failed flush or compaction leaves its inputs),
// so it is rated a hard error, which Resume clears by flushing the memtables
// to new files. Write-ahead log writes, MANIFEST writes, corruption and data
// loss keep RocksDB's rating.
class ResumeListener : public rocksdb::EventListener {
 public:
  explicit ResumeListener(std::shared_ptr<EmbeddedStore::WriteStop> stop) : stop_(std::move(stop)) {}

  void OnBackgroundError(rocksdb::BackgroundErrorReason reason, rocksdb::Status* bg_error) override {
    if (bg_error->ok()) return;
    const bool recoverable_reason = reason == rocksdb::BackgroundErrorReason::kFlush ||
                                    reason == rocksdb::BackgroundErrorReason::kFlushNoWAL ||
                                    reason == rocksdb::BackgroundErrorReason::kCompaction ||
                                    reason == rocksdb::BackgroundErrorReason::kMemTable;
    if (recoverable_reason && bg_error->IsIOError() &&
        bg_error->severity() == rocksdb::Status::Severity::kFatalError) {
      *bg_error = rocksdb::Status(*bg_error, rocksdb::Status::Severity::kHardError);
    }
    stop_->Note(ReasonName(reason), *bg_error);
  }

  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason /*reason*/, rocksdb::Status bg_error,
                            bool* auto_recovery) override {
    bg_error.PermitUncheckedError();
    *auto_recovery = false;
  }

 private:
  std::shared_ptr<EmbeddedStore::WriteStop> stop_;
};

// Errors of DB::Open, with the likely cause spelled out.
Status OpenError(const std::string& path, const rocksdb::Status& s) {
  const std::string msg = s.ToString();
  if (s.IsIOError() && msg.find("LOCK") != std::string::npos && msg.find("Permission denied") != std::string::npos) {
    return FailedPreconditionError(Where(path) + "permission denied on its LOCK file: " + msg);
  }
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

// The nearest ancestor of `path` that exists (the one a store directory
// would be created in); "." for a relative path none of whose parents do.
std::string ExistingParent(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path up = fs::path(path);
  if (!up.has_filename()) up = up.parent_path();  // a trailing '/'
  for (up = up.parent_path(); !up.empty(); up = up.parent_path()) {
    std::error_code ec;
    if (fs::exists(fs::status(up, ec)) || up == up.parent_path()) return up.string();
  }
  return ".";
}

// Why `path`, which does not exist, could not be created: the directory it
// would be made in is named, since that is where the permission is missing.
Status CreateError(const std::string& path, const std::error_code& ec) {
  const std::string parent = ExistingParent(path);
  if (ec == std::errc::not_a_directory) {
    return InvalidArgumentError(Where(path) + "the store directory cannot be created: '" + parent +
                                "' is not a directory");
  }
  return PathError(path, "the store directory cannot be created in '" + parent + "'", ec);
}

// Checks (and creates) the directory so that the common mistakes get a plain
// message before RocksDB sees the path.
Status PreparePath(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  // A parent that is not a directory is for CreateError to name.
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory) {
    return PathError(path, "cannot access", ec);
  }
  if (fs::exists(st) && !fs::is_directory(st)) {
    return InvalidArgumentError(Where(path) + "exists and is not a directory");
  }
  if (!fs::exists(st)) {
    fs::create_directories(path, ec);
    if (ec) return CreateError(path, ec);
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
  // The committer is the only writer: no concurrent memtable inserts to
  // coordinate, and no write group to spin for.
  db.allow_concurrent_memtable_write = false;
  db.enable_write_thread_adaptive_yield = false;
  return db;
}

rocksdb::ColumnFamilyOptions MakeFamilyOptions(const std::shared_ptr<rocksdb::Cache>& cache,
                                               bool bloom, std::uint64_t write_buffer) {
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = cache;
  // Index and filter blocks live in the block cache (so their memory is
  // bounded too), in its high-priority pool so data blocks do not evict them,
  // and pinned for L0 files, which every lookup consults. Whole-file filters
  // and a binary-search index: most lookups are of new keys that exist
  // nowhere, so each lookup probes the filter of every L0 file and level, and
  // partitioned filters (an index lookup before each probe) cost a fifth of
  // the gateway's CPU per request more (docs/store-embedded.md).
  table.cache_index_and_filter_blocks = true;
  table.cache_index_and_filter_blocks_with_high_priority = true;
  table.pin_l0_filter_and_index_blocks_in_cache = true;
  table.pin_top_level_index_and_filter = true;
  table.index_type = rocksdb::BlockBasedTableOptions::IndexType::kTwoLevelIndexSearch;
  if (bloom) {
    table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
    table.optimize_filters_for_memory = true;
  }
  rocksdb::ColumnFamilyOptions cf;
  cf.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  cf.write_buffer_size = write_buffer;
  cf.max_write_buffer_number = 3;
  cf.level_compaction_dynamic_level_bytes = true;
  // Keys arrive in random order, so every L0 file overlaps the whole of the
  // level below and each L0 compaction rewrites that level. Waiting for 8
  // files instead of RocksDB's 4 halves that rewriting; a lookup then probes
  // the filters of up to 8 L0 files, which stay pinned in the block cache.
  // 1M Reserve+Complete pairs: 53k -> 63k pairs/s (docs/store-embedded.md).
  cf.level0_file_num_compaction_trigger = 8;
  // LZ4: stored responses (JSON, repeated headers) compress several-fold,
  // and LZ4 costs the least CPU per byte saved on flushes and compactions.
  cf.compression = rocksdb::kLZ4Compression;
  cf.table_properties_collector_factories.push_back(
      rocksdb::NewCompactOnDeletionCollectorFactory(10'000, 4'000, 0.5));
  if (bloom) {
    cf.memtable_prefix_bloom_size_ratio = 0.02;
    cf.memtable_whole_key_filtering = true;
  }
  return cf;
}

}  // namespace

std::uint64_t EmbeddedStore::ResumeFreeBytes(std::uint64_t write_buffer_bytes, std::uint64_t volume_bytes) {
  return std::min<std::uint64_t>(std::max<std::uint64_t>(16ull << 20, 2 * write_buffer_bytes), volume_bytes / 4);
}

EmbeddedStore::EmbeddedStore(Options options)
    : options_(std::move(options)),
      clock_(options_.clock ? *options_.clock : SystemClock::Instance()),
      filter_(std::make_unique<ExpiredRecordFilter>(clock_)),
      write_stop_(std::make_shared<WriteStop>(options_.path, options_.write_buffer_bytes)) {
  options_.max_batch = std::max<std::size_t>(1, options_.max_batch);
  readers_ = std::make_unique<boost::asio::thread_pool>(kReaderThreads);
}

StatusOr<std::unique_ptr<EmbeddedStore>> EmbeddedStore::Open(Options options) {
  if (options.path.empty()) return InvalidArgumentError("embedded store: the path is empty");
  if (Status s = PreparePath(options.path); !s.ok()) return s;
  std::unique_ptr<EmbeddedStore> store(new EmbeddedStore(std::move(options)));
  if (Status s = store->OpenDb(); !s.ok()) return s;
  store->committer_ = std::thread([raw = store.get()] { raw->CommitterLoop(); });
  return store;
}

Status EmbeddedStore::OpenDb() {
  const std::string& path = options_.path;
  std::error_code ec;
  struct stat dir {};
  if (::stat(path.c_str(), &dir) != 0) {
    return PathError(path, "cannot access", std::error_code(errno, std::generic_category()));
  }
  dir_dev_ = static_cast<std::uint64_t>(dir.st_dev);
  dir_ino_ = static_cast<std::uint64_t>(dir.st_ino);
  const bool existed = std::filesystem::exists(std::filesystem::path(path) / "CURRENT", ec);

  if (!existed) {
    // A store is made only in an empty directory: opened to create a store,
    // RocksDB deletes the data files it finds (those of a store that lost
    // its CURRENT file, say), and every key they held would run again. Only
    // what a failed first open leaves behind may be there.
    for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
      const std::string name = entry.path().filename().string();
      if (name == "LOCK" || name == "LOG" || name.starts_with("LOG.old.") || name == "IDENTITY") continue;
      return FailedPreconditionError(Where(path) + "has no store (no CURRENT file) but is not empty (it holds " +
                                     name +
                                     "): a store is only created in an empty directory, since creating one "
                                     "would delete the data files of a damaged store; move the files away "
                                     "or point store.path at an empty directory");
    }
  }

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
  rocksdb::DBOptions db_options = MakeDbOptions(options_);
  if (options_.env) db_options.env = options_.env;
  db_options.listeners.push_back(std::make_shared<ResumeListener>(write_stop_));
  db_options.max_bgerror_resume_count = 0;
  auto watch = std::make_shared<OpenWatchLogger>(std::make_shared<InfoLog>(
      db_options.env->GetFileSystem().get(), path, db_options.max_log_file_size, db_options.keep_log_file_num,
      db_options.info_log_level));
  db_options.info_log = watch;
  rocksdb::Status s = rocksdb::DB::Open(db_options, path, families, &handles, &raw);
  const std::vector<std::string> dropped = watch->StopWatching();
  if (!s.ok()) return OpenError(path, s);
  db_.reset(raw);
  for (const std::string& line : dropped) {
    LogWarn("embedded store: opening it dropped part of a damaged write-ahead log; what was written after the "
            "damage is lost (keys completed then stay reserved and run again after their lease, keys reserved "
            "then are new)",
            {{"path", ShownPath(path)}, {"rocksdb", line}});
  }
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
  if (!existed) {
    // Said out loud: after a config change, a mistyped path silently starts
    // an empty store, and every key completed in the real one runs again.
    created_ = true;
    LogWarn("embedded store: no store at store.path; created a new, empty one (every key is new to it)",
            {{"path", ShownPath(path)}});
  }
  return Status::Ok();
}

EmbeddedStore::~EmbeddedStore() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (committer_.joinable()) committer_.join();
  readers_->join();
  if (db_) {
    for (auto* h : {expiry_, records_, default_}) {
      if (h) db_->DestroyColumnFamilyHandle(h).PermitUncheckedError();
    }
    db_->Close().PermitUncheckedError();
    db_.reset();
  }
}

// ---------------------------------------------------------------------------
// The committer.

// Resumes whoever waits for a Mutation. Done() is the committer's last touch
// of the Mutation: the waiter may destroy it at once.
class EmbeddedStore::Waiter {
 public:
  virtual ~Waiter() = default;
  virtual void Done() = 0;
};

namespace {

// Resumes an awaiting coroutine on its own executor.
template <typename Handler>
class HandlerWaiter final {
 public:
  explicit HandlerWaiter(Handler handler) : handler_(std::move(handler)) {}
  void Done() {
    auto executor = boost::asio::get_associated_executor(handler_);
    boost::asio::post(executor, std::move(handler_));
  }

 private:
  Handler handler_;
};

}  // namespace

// One operation for the committer: its inputs, then its results.
struct EmbeddedStore::Mutation {
  enum class Kind { kReserve, kComplete, kRelease, kPurge, kPing, kSweep };
  Kind kind = Kind::kPing;
  std::string key;
  std::string owner;   // kComplete, kRelease
  Record record;       // kReserve: the reservation; kComplete: the completed record
  UnixMillis now = 0;  // kReserve, kPurge, kSweep
  std::size_t sweep_max = 0;
  core::PurgeMode purge_mode = core::PurgeMode::kAny;  // kPurge

  Status status;
  core::ReserveResult reserved;  // kReserve
  core::PurgeResult purged;      // kPurge
  SweepResult swept;             // kSweep
  bool notify = false;           // wake the key's watchers once committed
  // kReserve: the caller found the key absent after batch `absent_as_of`
  // was visible, so only a later batch can have written it.
  std::optional<std::uint64_t> absent_as_of;

  std::unique_ptr<Waiter> waiter;
};

// The changes of one batch, visible to the operations after them.
struct EmbeddedStore::Batch {
  rocksdb::WriteBatch write;
  std::unordered_map<std::string, std::optional<Record>> pending;  // key -> record after this batch
};

core::Task<void> EmbeddedStore::Commit(Mutation& m) {
  namespace asio = boost::asio;
  co_await asio::async_initiate<const asio::use_awaitable_t<>&, void()>(
      [this, &m](auto handler) {
        using Impl = HandlerWaiter<std::decay_t<decltype(handler)>>;
        struct Adapter final : Waiter {
          explicit Adapter(Impl impl) : impl(std::move(impl)) {}
          void Done() override { impl.Done(); }
          Impl impl;
        };
        m.waiter = std::make_unique<Adapter>(Impl(std::move(handler)));
        Enqueue(&m);
      },
      asio::use_awaitable);
}

void EmbeddedStore::CommitAndWait(Mutation& m) {
  // Done() sets the flag under the lock, so the wait below cannot return (and
  // the waiter be destroyed) before Done() has let go of it.
  struct Blocking final : Waiter {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    void Done() override {
      std::lock_guard lock(mu);
      done = true;
      cv.notify_one();
    }
  };
  auto owned = std::make_unique<Blocking>();
  Blocking* waiter = owned.get();
  m.waiter = std::move(owned);
  Enqueue(&m);
  std::unique_lock lock(waiter->mu);
  waiter->cv.wait(lock, [waiter] { return waiter->done; });
}

void EmbeddedStore::Enqueue(Mutation* m) {
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    queue_.push_back(m);
    wake = committer_waiting_;
    committer_waiting_ = false;
  }
  if (wake) cv_.notify_one();
}

void EmbeddedStore::HoldCommitsForTesting(bool hold) {
  {
    std::lock_guard lock(mu_);
    held_ = hold;
  }
  cv_.notify_all();
}

std::size_t EmbeddedStore::queued_for_testing() {
  std::lock_guard lock(mu_);
  return queue_.size();
}

void EmbeddedStore::CommitterLoop() {
  using SteadyClock = std::chrono::steady_clock;
  const bool sweeping = options_.sweep_interval.count() > 0;
  auto next_sweep = SteadyClock::now() + options_.sweep_interval;
  std::size_t sweep_left = 0;  // entries the current background sweep may still consume
  SteadyClock::duration sweep_spent{};  // time the current background sweep has taken so far
  std::vector<Mutation*> ops;
  std::vector<Mutation*> taken;
  std::unique_lock lock(mu_);
  while (true) {
    if ((queue_.empty() || held_) && sweep_left == 0) {
      if (stopping_ && queue_.empty()) break;
      committer_waiting_ = true;
      auto ready = [this] { return (!queue_.empty() && !held_) || stopping_; };
      // Woken for the next sweep, and for the next DB::Resume attempt while
      // writes are stopped.
      const bool resuming = write_stop_->pending.load(std::memory_order_acquire);
      if (!held_ && (sweeping || resuming)) {
        auto until = sweeping ? next_sweep : next_resume_try_;
        if (resuming) until = std::min(until, next_resume_try_);
        cv_.wait_until(lock, until, ready);
      } else {
        cv_.wait(lock, ready);
      }
      committer_waiting_ = false;
    }
    if (held_ && !stopping_) continue;
    // Take at most max_batch operations, oldest first.
    ops.clear();
    if (queue_.size() <= options_.max_batch) {
      ops.swap(queue_);
    } else {
      ops.assign(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(options_.max_batch));
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(options_.max_batch));
    }
    lock.unlock();

    MaybeResume();
    if (const auto now = SteadyClock::now(); now >= next_dir_check_) {
      CheckDirectory();
      next_dir_check_ = now + kDirectoryCheckInterval;
    }
    if (!ops.empty()) CommitBatch(ops);
    if (sweeping && sweep_left == 0 && SteadyClock::now() >= next_sweep) {
      sweep_left = options_.sweep_batch;
    }
    if (sweep_left > 0) {
      Status status;
      const std::size_t slice = std::min(sweep_left, kSweepSlice);
      const auto started = SteadyClock::now();
      const SweepResult r = SweepChunk(clock_.NowMillis(), slice, &status);
      const auto ended = SteadyClock::now();
      sweep_spent += ended - started;
      // Keep going while index entries remain, up to sweep_batch.
      const bool full = status.ok() && r.index_entries == slice;
      sweep_left = full ? sweep_left - slice : 0;
      if (sweep_left == 0) {
        // A sweep that consumed its whole batch leaves a backlog (expiring
        // writes outpace one batch per interval): the next one starts after a
        // pause as long as this one's slices took, so that while a backlog
        // lasts the sweeper takes at most half of the committer's time, and
        // requests queued meanwhile go first. Otherwise wait for the interval.
        next_sweep = ended + (full ? std::min<SteadyClock::duration>(sweep_spent, options_.sweep_interval)
                                   : SteadyClock::duration(options_.sweep_interval));
        sweep_spent = SteadyClock::duration::zero();
      }
    }
    lock.lock();
    if (stopping_) sweep_left = 0;  // the next start sweeps what is left
  }
}

void EmbeddedStore::MaybeResume() {
  if (!write_stop_->pending.load(std::memory_order_acquire)) return;
  const auto now = std::chrono::steady_clock::now();
  if (now < next_resume_try_) return;
  resume_backoff_ = resume_backoff_ == resume_backoff_.zero()
                        ? kFirstResumeWait
                        : std::min<std::chrono::steady_clock::duration>(2 * resume_backoff_, kLongestResumeWait);
  next_resume_try_ = now + resume_backoff_;
  std::uint64_t errors = 0;
  bool no_space = false;
  {
    std::lock_guard lock(write_stop_->mu);
    errors = write_stop_->errors;
    no_space = write_stop_->no_space;
  }
  if (no_space) {
    // Resuming on a disk that is still full would fail at once.
    const std::optional<VolumeSpace> space = SpaceOf(options_.path);
    if (!space || space->free < ResumeFreeBytes(options_.write_buffer_bytes, space->size)) return;
  }
  const rocksdb::Status s = db_->Resume();
  if (!s.ok()) {
    LogDebug("embedded store: resuming writes failed; trying again",
             {{"error", s.ToString()}, {"next_try_ms", std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                        resume_backoff_).count())}});
    return;
  }
  std::lock_guard lock(write_stop_->mu);
  if (write_stop_->errors != errors) return;  // a new error came meanwhile: resume again after the wait
  write_stop_->pending.store(false, std::memory_order_release);
  write_stop_->no_space = false;
  resume_backoff_ = resume_backoff_.zero();
  next_resume_try_ = {};
  if (write_stop_->logged) {
    write_stop_->logged = false;
    LogInfo("embedded store: writes resumed after a background error",
            {{"waited_for_free_space", no_space ? "true" : "false"}});
  }
}

void EmbeddedStore::CheckDirectory() {
  struct stat now {};
  std::string gone;
  if (::stat(options_.path.c_str(), &now) != 0) {
    gone = std::string("stat: ") + std::strerror(errno);
  } else if (static_cast<std::uint64_t>(now.st_dev) != dir_dev_ ||
             static_cast<std::uint64_t>(now.st_ino) != dir_ino_) {
    gone = "another directory or file is there now";
  }
  if (!gone.empty()) {
    if (!dir_error_.ok()) return;
    dir_error_ = UnavailableError(
        Where(options_.path) + "the directory the store opened was removed, renamed or replaced while open (" + gone +
        "): new reservations are refused, since the store's files are no longer at store.path and what it "
        "writes would be missing at the next start; put the directory back, or restart the gateway (a start "
        "without it creates an empty store: every key is new to it)");
    LogError("embedded store: its directory was removed, renamed or replaced while open; new reservations are "
             "refused and /readyz fails until it is back",
             {{"path", ShownPath(options_.path)}, {"error", gone}});
    return;
  }
  if (dir_error_.ok()) return;
  dir_error_ = Status::Ok();
  LogInfo("embedded store: its directory is back at store.path; reservations are taken again",
          {{"path", ShownPath(options_.path)}});
}

void EmbeddedStore::CommitBatch(const std::vector<Mutation*>& ops) {
  Batch batch;
  for (Mutation* m : ops) {
    if (m->kind != Mutation::Kind::kSweep) Apply(*m, batch);
  }
  if (batch.write.Count() > 0) {
    rocksdb::WriteOptions wo;
    wo.sync = options_.sync;
    rocksdb::Status s = db_->Write(wo, &batch.write);
    commits_.fetch_add(1, std::memory_order_relaxed);
    if (s.ok()) {
      // Remember which keys this batch wrote before publishing its number:
      // a reader that sees the number may rely on the list.
      std::vector<std::uint64_t> hashes;
      hashes.reserve(batch.pending.size());
      for (const auto& [key, record] : batch.pending) {
        hashes.push_back(std::hash<std::string>{}(key));
        RememberOwner(key, record);
      }
      const std::uint64_t seq = batches_applied_.load(std::memory_order_relaxed) + 1;
      recent_writes_.emplace_back(seq, std::move(hashes));
      if (recent_writes_.size() > kRecentBatches) recent_writes_.pop_front();
      batches_applied_.store(seq, std::memory_order_release);
    } else {
      // Operations after a failed change may have decided on it: none of the
      // batch took effect, so each of them fails.
      const Status error = FromRocks(s, "commit");
      // RocksDB reports its background errors to ResumeListener; a failed
      // write it did not report is noted as well, so that the committer tries
      // DB::Resume (which does nothing when writes did not stop).
      if (!write_stop_->pending.load(std::memory_order_acquire)) write_stop_->Note("write", s);
      for (Mutation* m : ops) {
        if (m->kind == Mutation::Kind::kSweep) continue;
        m->status = error;
        m->notify = false;
      }
    }
  }
  committed_ops_.fetch_add(ops.size(), std::memory_order_relaxed);
  // Sweeps requested by SweepExpired run after the batch, with their own writes.
  for (Mutation* m : ops) {
    if (m->kind == Mutation::Kind::kSweep) m->swept = SweepChunk(m->now, m->sweep_max, &m->status);
  }
  for (Mutation* m : ops) {
    if (m->notify) watchers_.Notify(m->key);
    m->waiter->Done();  // the last touch: the waiter may free `m` now
  }
}

// Decides one operation against the database and the batch's earlier
// changes, and adds its own change to the batch.
void EmbeddedStore::Apply(Mutation& m, Batch& batch) {
  // A store whose directory is gone takes no new reservations (what it wrote
  // would be lost at the next start), and its ping says why.
  if (m.kind == Mutation::Kind::kPing) CheckDirectory();
  if ((m.kind == Mutation::Kind::kReserve || m.kind == Mutation::Kind::kPing) && !dir_error_.ok()) {
    m.status = dir_error_;
    return;
  }
  auto pending = m.key.empty() ? batch.pending.end() : batch.pending.find(m.key);
  std::optional<Record> current;
  bool undecodable = false;  // kPurge: `current` stands for a record that cannot be decoded
  // Complete and Release only compare the state and owner: from a change
  // earlier in the batch, else from the reservations the committer remembers,
  // else by peeking at the stored bytes instead of decoding them.
  const bool owner_check = m.kind == Mutation::Kind::kComplete || m.kind == Mutation::Kind::kRelease;
  const bool owner_unchanged_in_batch = owner_check && pending == batch.pending.end();
  std::optional<core::RecordState> held_state;
  bool held_by_owner = false;
  auto remembered = owner_unchanged_in_batch ? reserved_owners_.find(m.key) : reserved_owners_.end();
  if (remembered != reserved_owners_.end()) {
    // This store wrote the reservation and nothing has replaced it since.
    held_state = RecordState::kInFlight;
    held_by_owner = remembered->second == m.owner;
    owner_reads_skipped_.fetch_add(1, std::memory_order_relaxed);
  } else if (owner_unchanged_in_batch) {
    rocksdb::PinnableSlice value;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), records_, m.key, &value);
    if (!s.ok() && !s.IsNotFound()) {
      m.status = FromRocks(s, "read");
      return;
    }
    if (s.ok()) {
      auto peek = value.size() < kValuePrefix
                      ? StatusOr<core::RecordOwnership>(InvalidArgumentError("record: missing prefix"))
                      : core::PeekOwnership(std::string_view(value.data(), value.size()).substr(kValuePrefix));
      if (!peek.ok()) {
        m.status = InternalError("embedded store: undecodable record: " + peek.status().message());
        return;
      }
      held_state = peek->state;
      held_by_owner = peek->owner == m.owner;
    }
  } else if (owner_check) {
    if (pending->second) {
      held_state = pending->second->state;
      held_by_owner = pending->second->owner == m.owner;
    }
  } else if (m.kind != Mutation::Kind::kPing) {
    if (pending != batch.pending.end()) {
      current = pending->second;
    } else if (m.absent_as_of && StillAbsent(m.key, *m.absent_as_of)) {
      rereads_skipped_.fetch_add(1, std::memory_order_relaxed);
    } else {
      auto read = Read(m.key);
      if (!read.ok()) {
        // Purge removes what is there even when it cannot be decoded.
        const bool undecodable_purge =
            m.kind == Mutation::Kind::kPurge && read.status().code() == StatusCode::kInternal;
        if (!undecodable_purge) {
          m.status = read.status();
          return;
        }
        current = Record{};
        undecodable = true;
      } else {
        current = std::move(*read);
      }
    }
  }
  auto set = [&](std::optional<Record> after) {
    if (pending != batch.pending.end()) {
      pending->second = std::move(after);
    } else {
      batch.pending.emplace(m.key, std::move(after));
    }
  };

  switch (m.kind) {
    case Mutation::Kind::kReserve: {
      if (m.record.state != RecordState::kInFlight) {
        m.status = InvalidArgumentError("embedded store: a reservation must be in flight");
        return;
      }
      if (current && !ExpiredAt(*current, m.now)) {
        const bool take_over = current->LeaseEndedAt(m.now) && current->fingerprint == m.record.fingerprint;
        m.reserved.outcome = take_over ? core::ReserveOutcome::kTakenOver : core::ReserveOutcome::kExists;
        m.reserved.existing = std::move(current);
        if (!take_over) return;
      }
      batch.write.Put(records_, m.key, EncodeValue(m.record));
      set(std::move(m.record));
      return;
    }
    case Mutation::Kind::kComplete: {
      if (m.record.state != RecordState::kCompleted) {
        m.status = InvalidArgumentError("embedded store: a completed record must be completed");
        return;
      }
      if (!held_state) {
        m.status = FailedPreconditionError("complete: the key is not reserved");
        return;
      }
      if (*held_state != RecordState::kInFlight) {
        m.status = FailedPreconditionError("complete: the key is already completed");
        return;
      }
      if (!held_by_owner) {
        m.status = FailedPreconditionError("complete: the key is held by another owner (lease lost)");
        return;
      }
      batch.write.Put(records_, m.key, EncodeValue(m.record));
      if (m.record.expires_ms != 0) batch.write.Put(expiry_, ExpiryKey(m.record.expires_ms, m.key), "");
      set(std::move(m.record));
      m.notify = true;
      return;
    }
    case Mutation::Kind::kRelease:
      if (!held_state || *held_state != RecordState::kInFlight || !held_by_owner) {
        m.status = FailedPreconditionError("release: the key is not held by this owner");
        return;
      }
      batch.write.Delete(records_, m.key);
      set(std::nullopt);
      m.notify = true;
      return;
    case Mutation::Kind::kPurge:
      if (!current) return;
      if (!undecodable && ExpiredAt(*current, m.now)) {
        // Past retention the key is absent, as for Get: nothing is purged,
        // though the record leaves now rather than at the next sweep.
        batch.write.Delete(records_, m.key);
        set(std::nullopt);
        return;
      }
      if (!undecodable) {
        m.purged.state = current->state;
        // Decided here, on the committer, against what the batch sees: no
        // reservation can be written between this look and the delete.
        if (m.purge_mode == core::PurgeMode::kUnlessInFlight && current->state == RecordState::kInFlight &&
            !current->LeaseEndedAt(m.now)) {
          m.purged.outcome = core::PurgeOutcome::kInFlight;
          m.purged.lease_expires_ms = current->lease_expires_ms;
          return;
        }
      }
      batch.write.Delete(records_, m.key);
      set(std::nullopt);
      m.purged.outcome = core::PurgeOutcome::kPurged;
      m.notify = true;
      return;
    case Mutation::Kind::kPing:
      // A small write: fails when RocksDB stopped writes after a background
      // error (disk full, I/O error), which a read would not show.
      batch.write.Put(default_, kPingKey, "");
      return;
    case Mutation::Kind::kSweep:
      return;
  }
}

// Committer only, after `key` was written as `after`.
void EmbeddedStore::RememberOwner(const std::string& key, const std::optional<Record>& after) {
  if (after && after->state == RecordState::kInFlight) {
    auto it = reserved_owners_.find(key);
    if (it != reserved_owners_.end()) {
      it->second = after->owner;
    } else if (reserved_owners_.size() < options_.remembered_reservations) {
      reserved_owners_.emplace(key, after->owner);
    }
  } else {
    reserved_owners_.erase(key);
  }
}

// True when no batch after `as_of` wrote `key` (by hash, so a collision only
// costs a read), as far as the remembered batches go back.
bool EmbeddedStore::StillAbsent(const std::string& key, std::uint64_t as_of) const {
  const std::uint64_t applied = batches_applied_.load(std::memory_order_relaxed);
  if (applied == as_of) return true;
  if (recent_writes_.empty() || recent_writes_.front().first > as_of + 1) return false;  // forgotten
  const std::uint64_t hash = std::hash<std::string>{}(key);
  for (auto it = recent_writes_.rbegin(); it != recent_writes_.rend() && it->first > as_of; ++it) {
    if (std::find(it->second.begin(), it->second.end(), hash) != it->second.end()) return false;
  }
  return true;
}

StatusOr<std::optional<Record>> EmbeddedStore::Read(const std::string& key) const {
  // A read that may touch files never comes back Incomplete.
  return *ReadWith(key, rocksdb::ReadOptions());
}

std::optional<StatusOr<std::optional<Record>>> EmbeddedStore::ReadCached(const std::string& key) const {
  rocksdb::ReadOptions ro;
  ro.read_tier = rocksdb::kBlockCacheTier;  // Incomplete instead of a file read
  return ReadWith(key, ro);
}

std::optional<StatusOr<std::optional<Record>>> EmbeddedStore::ReadWith(const std::string& key,
                                                                        const rocksdb::ReadOptions& ro) const {
  using Result = StatusOr<std::optional<Record>>;
  rocksdb::PinnableSlice value;
  rocksdb::Status s = db_->Get(ro, records_, key, &value);
  if (s.IsIncomplete()) return std::nullopt;
  if (s.IsNotFound()) return Result(std::optional<Record>());
  if (!s.ok()) return Result(FromRocks(s, "read"));
  auto record = DecodeValue(std::string_view(value.data(), value.size()));
  if (!record.ok()) return Result(InternalError("embedded store: undecodable record: " + record.status().message()));
  return Result(std::optional<Record>(std::move(*record)));
}

core::Task<StatusOr<std::optional<Record>>> EmbeddedStore::ReadOnReader(const std::string& key) {
  namespace asio = boost::asio;
  auto caller = co_await asio::this_coro::executor;
  // Binding the token to the pool's executor moves the coroutine there; a
  // plain post(pool, use_awaitable) would resume on the caller's executor.
  co_await asio::post(asio::bind_executor(readers_->get_executor(), asio::use_awaitable));
  auto result = Read(key);
  co_await asio::post(asio::bind_executor(caller, asio::use_awaitable));
  co_return result;
}

core::Task<StatusOr<std::optional<Record>>> EmbeddedStore::ReadAnywhere(const std::string& key) {
  if (auto cached = ReadCached(key)) co_return std::move(*cached);
  co_return co_await ReadOnReader(key);
}

// ---------------------------------------------------------------------------
// The Store operations.

core::Task<StatusOr<core::ReserveResult>> EmbeddedStore::Reserve(std::string key, Record reservation,
                                                                 UnixMillis now) {
  // A live record that may not be replaced answers without the committer:
  // the answer is the state at this read (replays and conflicts take this path).
  const std::uint64_t visible = batches_applied_.load(std::memory_order_acquire);
  auto read = co_await ReadAnywhere(key);
  if (read.ok() && read->has_value()) {
    Record& existing = **read;
    const bool replaceable = ExpiredAt(existing, now) ||
                             (existing.LeaseEndedAt(now) && existing.fingerprint == reservation.fingerprint);
    if (!replaceable) {
      core::ReserveResult result;
      result.outcome = core::ReserveOutcome::kExists;
      result.existing = std::move(existing);
      co_return result;
    }
  }
  Mutation m;
  if (read.ok() && !read->has_value()) m.absent_as_of = visible;
  m.kind = Mutation::Kind::kReserve;
  m.key = std::move(key);
  m.record = std::move(reservation);
  m.now = now;
  co_await Commit(m);
  if (!m.status.ok()) co_return m.status;
  co_return std::move(m.reserved);
}

core::Task<Status> EmbeddedStore::Complete(std::string key, std::string owner, Record completed) {
  Mutation m;
  m.kind = Mutation::Kind::kComplete;
  m.key = std::move(key);
  m.owner = std::move(owner);
  m.record = std::move(completed);
  co_await Commit(m);
  co_return m.status;
}

core::Task<Status> EmbeddedStore::Release(std::string key, std::string owner) {
  Mutation m;
  m.kind = Mutation::Kind::kRelease;
  m.key = std::move(key);
  m.owner = std::move(owner);
  co_await Commit(m);
  co_return m.status;
}

core::Task<StatusOr<std::optional<Record>>> EmbeddedStore::Get(std::string key, UnixMillis now) {
  auto read = co_await ReadAnywhere(key);
  if (!read.ok()) co_return read.status();
  std::optional<Record>& found = *read;
  if (found && ExpiredAt(*found, now)) found.reset();
  co_return std::move(found);
}

core::Task<StatusOr<core::PurgeResult>> EmbeddedStore::Purge(std::string key, core::PurgeMode mode, UnixMillis now) {
  Mutation m;
  m.kind = Mutation::Kind::kPurge;
  m.key = std::move(key);
  m.purge_mode = mode;
  m.now = now;
  co_await Commit(m);
  if (!m.status.ok()) co_return m.status;
  co_return m.purged;
}

core::Task<StatusOr<std::unique_ptr<core::Watch>>> EmbeddedStore::WatchKey(std::string key) {
  co_return co_await watchers_.Make(std::move(key));
}

core::Task<Status> EmbeddedStore::Ping() {
  Mutation m;
  m.kind = Mutation::Kind::kPing;
  co_await Commit(m);
  co_return m.status;
}

core::StoreStats EmbeddedStore::Stats() const {
  std::uint64_t keys = 0, sst = 0, mem = 0;
  db_->GetIntProperty(records_, rocksdb::DB::Properties::kEstimateNumKeys, &keys);
  db_->GetIntProperty(records_, rocksdb::DB::Properties::kLiveSstFilesSize, &sst);
  db_->GetIntProperty(records_, rocksdb::DB::Properties::kCurSizeAllMemTables, &mem);
  return {keys, sst + mem};
}

StatusOr<EmbeddedStore::SweepResult> EmbeddedStore::SweepExpired(UnixMillis now, std::size_t max) {
  Mutation m;
  m.kind = Mutation::Kind::kSweep;
  m.now = now;
  m.sweep_max = max;
  CommitAndWait(m);
  if (!m.status.ok()) return m.status;
  return m.swept;
}

// Runs on the committer, so nothing else changes a record between its re-read
// and its deletion. Expiry entries are hints: a record is deleted only if it
// is still a completed record past retention (it may have been purged,
// reserved or completed again since); the entry is deleted either way.
// Unsynced: a lost sweep is simply redone after a restart.
EmbeddedStore::SweepResult EmbeddedStore::SweepChunk(UnixMillis now, std::size_t max, Status* status) {
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
    if (!it->status().ok()) {
      *status = FromRocks(it->status(), "sweep");
      return result;
    }
  }
  if (entries.empty()) return result;

  rocksdb::WriteBatch batch;
  std::unordered_set<std::string> deleted;
  for (const std::string& entry : entries) {
    std::string key = entry.substr(8);
    batch.Delete(expiry_, entry);
    if (deleted.count(key)) continue;
    auto current = Read(key);
    if (current.ok() && current->has_value() && ExpiredAt(**current, now)) {
      batch.Delete(records_, key);
      deleted.insert(std::move(key));
    }
  }
  rocksdb::Status s = db_->Write(rocksdb::WriteOptions(), &batch);
  if (!s.ok()) {
    *status = FromRocks(s, "sweep");
    return result;
  }
  result.index_entries = entries.size();
  result.deleted = deleted.size();
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

}  // namespace idemgate::store::embedded
