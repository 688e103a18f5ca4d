#include "client/client.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <signal.h>
#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <thread>
#include <boost/json.hpp>
#include <exception>
#include <mutex>
#include <new>
#include <system_error>

#include "client/quote.h"

// The dead-letter queue: one SQLite table, `dead_letters`, in WAL mode.
namespace idemgate::client {

namespace {

// How long an operation waits for another connection's lock.
constexpr std::chrono::milliseconds kBusyTimeout{5000};

// The schema this code reads and writes (PRAGMA user_version). Version 2
// added the claim columns; a version 1 file is migrated on open.
constexpr int kSchemaVersion = 2;

constexpr const char* kCreateSchema = R"sql(
CREATE TABLE IF NOT EXISTS dead_letters (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  method TEXT NOT NULL,
  url TEXT NOT NULL,
  headers TEXT NOT NULL,
  body BLOB NOT NULL,
  "key" TEXT NOT NULL,
  key_header TEXT NOT NULL,
  error TEXT NOT NULL,
  attempts INTEGER NOT NULL,
  last_status INTEGER NOT NULL,
  last_attempt_unix_ms INTEGER NOT NULL,
  created_unix_ms INTEGER NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('pending', 'replaying', 'replayed', 'discarded')),
  claim_token TEXT,
  claim_host TEXT,
  claim_pid INTEGER,
  claimed_unix_ms INTEGER,
  claim_until_unix_ms INTEGER
);
CREATE INDEX IF NOT EXISTS dead_letters_status ON dead_letters (status, id);
)sql";

// Version 1 -> 2: who claimed a replaying entry (NULL: unknown).
constexpr const char* kMigrate1To2 = R"sql(
ALTER TABLE dead_letters ADD COLUMN claim_token TEXT;
ALTER TABLE dead_letters ADD COLUMN claim_host TEXT;
ALTER TABLE dead_letters ADD COLUMN claim_pid INTEGER;
ALTER TABLE dead_letters ADD COLUMN claimed_unix_ms INTEGER;
ALTER TABLE dead_letters ADD COLUMN claim_until_unix_ms INTEGER;
)sql";

// SET assignments that forget an entry's claim (it is replaying no more).
constexpr std::string_view kClearClaim =
    "claim_token = NULL, claim_host = NULL, claim_pid = NULL, claimed_unix_ms = NULL, claim_until_unix_ms = NULL";

// Whether a select reads the body, or only its storage type (List: a listing
// prints no body, and the bodies of all entries together may be large;
// SQLite's typeof() does not load the value).
enum class Body { kRead, kTypeOnly };

// "SELECT <the columns ReadEntry expects> FROM dead_letters " + `rest`. A
// version 1 file (`with_claims` false: read, not migrated) has no claim
// columns; they read as NULL.
std::string SelectEntries(std::string_view rest, bool with_claims = true, Body body = Body::kRead) {
  return std::string("SELECT id, method, url, headers, ") + (body == Body::kRead ? "body" : "typeof(body)") +
         ", \"key\", key_header, error, attempts, last_status, last_attempt_unix_ms, created_unix_ms, status, " +
         (with_claims ? "claim_token, claim_host, claim_pid, claimed_unix_ms, claim_until_unix_ms"
                      : "NULL, NULL, NULL, NULL, NULL") +
         " FROM dead_letters " + std::string(rest);
}

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "";
  return name;
}

// True unless process `pid` of this host is known to be gone.
bool ProcessMayBeAlive(std::int64_t pid) {
  if (pid <= 0 || pid > std::numeric_limits<pid_t>::max()) return false;
  if (::kill(static_cast<pid_t>(pid), 0) == 0) return true;
  return errno == EPERM;  // alive, another user's
}

std::int64_t NowUnixMs();

std::int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct DbCloser {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using DbPtr = std::unique_ptr<sqlite3, DbCloser>;

struct StmtFinalizer {
  void operator()(sqlite3_stmt* stmt) const { sqlite3_finalize(stmt); }
};
using StmtPtr = std::unique_ptr<sqlite3_stmt, StmtFinalizer>;

// A Status for SQLite result `rc` while doing `what`.
Status SqliteError(sqlite3* db, int rc, std::string_view what) {
  std::string message = "dead-letter queue: " + std::string(what) + ": ";
  message += db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_CANTOPEN:
    case SQLITE_IOERR:
    case SQLITE_PROTOCOL:
      return UnavailableError(std::move(message));
    case SQLITE_FULL:
    case SQLITE_NOMEM:
      return ResourceExhaustedError(std::move(message));
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT:
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_AUTH:
      return FailedPreconditionError(std::move(message));
    case SQLITE_TOOBIG:
      return InvalidArgumentError(std::move(message));
    default:
      return InternalError(std::move(message));
  }
}

// Runs SQL without parameters or results (schema, pragmas, transactions).
Status Exec(sqlite3* db, const char* sql) {
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return SqliteError(db, rc, sql);
  return Status::Ok();
}

// A prepared statement with bound parameters (1-based, in order); the first
// failing bind is reported by Step.
class Statement {
 public:
  Statement(sqlite3* db, std::string_view sql) : db_(db) {
    sqlite3_stmt* raw = nullptr;
    rc_ = sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &raw, nullptr);
    stmt_.reset(raw);
  }

  Statement& Text(std::string_view value) {
    Check(sqlite3_bind_text64(stmt_.get(), ++index_, value.data(), value.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
    return *this;
  }
  Statement& Blob(std::string_view value) {
    // A null pointer would bind NULL, not an empty blob.
    static constexpr char kEmpty = 0;
    Check(sqlite3_bind_blob64(stmt_.get(), ++index_, value.empty() ? &kEmpty : value.data(), value.size(),
                              SQLITE_TRANSIENT));
    return *this;
  }
  Statement& Int(std::int64_t value) {
    Check(sqlite3_bind_int64(stmt_.get(), ++index_, value));
    return *this;
  }
  Statement& Null() {
    Check(sqlite3_bind_null(stmt_.get(), ++index_));
    return *this;
  }

  // True with a row, false when done.
  StatusOr<bool> Step() {
    if (rc_ != SQLITE_OK) return SqliteError(db_, rc_, "prepare");
    const int rc = sqlite3_step(stmt_.get());
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqliteError(db_, rc, "step");
  }
  // Steps a statement that returns no rows.
  Status Run() {
    auto row = Step();
    return row.ok() ? Status::Ok() : row.status();
  }

  std::int64_t ColumnInt(int column) const { return sqlite3_column_int64(stmt_.get(), column); }
  int ColumnType(int column) const { return sqlite3_column_type(stmt_.get(), column); }
  std::string ColumnText(int column) const {
    const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(stmt_.get(), column));
    const int size = sqlite3_column_bytes(stmt_.get(), column);
    return text == nullptr ? std::string() : std::string(text, static_cast<std::size_t>(size));
  }
  std::string ColumnBlob(int column) const {
    const auto* data = static_cast<const char*>(sqlite3_column_blob(stmt_.get(), column));
    const int size = sqlite3_column_bytes(stmt_.get(), column);
    return data == nullptr ? std::string() : std::string(data, static_cast<std::size_t>(size));
  }

 private:
  void Check(int rc) {
    if (rc_ == SQLITE_OK && rc != SQLITE_OK) rc_ = rc;
  }

  sqlite3* db_;
  StmtPtr stmt_;
  int rc_ = SQLITE_OK;
  int index_ = 0;
};

// BEGIN IMMEDIATE ... COMMIT, rolled back unless committed.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) { begin_ = Exec(db_, "BEGIN IMMEDIATE"); }
  ~Transaction() {
    if (begin_.ok() && !done_) (void)sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

  const Status& begin_status() const { return begin_; }
  // A failed COMMIT leaves the transaction to the destructor's ROLLBACK.
  Status Commit() {
    Status s = Exec(db_, "COMMIT");
    done_ = s.ok();
    return s;
  }

 private:
  sqlite3* db_;
  Status begin_;
  bool done_ = false;
};

// Headers as a JSON array of [name, value] pairs.
std::string HeadersToJson(const std::vector<Header>& headers) {
  boost::json::array array;
  array.reserve(headers.size());
  for (const auto& [name, value] : headers) {
    boost::json::array pair;
    pair.emplace_back(boost::json::string_view(name));
    pair.emplace_back(boost::json::string_view(value));
    array.emplace_back(std::move(pair));
  }
  return boost::json::serialize(array);
}

StatusOr<std::vector<Header>> HeadersFromJson(std::string_view text) {
  boost::json::parse_options options;
  options.allow_invalid_utf8 = true;  // header values are bytes, stored as given
  boost::system::error_code ec;
  const boost::json::value json = boost::json::parse(text, ec, {}, options);
  if (ec) return InvalidArgumentError("column headers is not JSON (" + ec.message() + ")");
  if (!json.is_array()) return InvalidArgumentError("column headers is not a JSON array");
  std::vector<Header> headers;
  for (const auto& item : json.as_array()) {
    const auto* pair = item.if_array();
    if (pair == nullptr || pair->size() != 2 || !(*pair)[0].is_string() || !(*pair)[1].is_string()) {
      return InvalidArgumentError("column headers holds an item that is not a [name, value] pair of strings");
    }
    headers.emplace_back(std::string((*pair)[0].as_string()), std::string((*pair)[1].as_string()));
  }
  return headers;
}

// The columns SelectEntries gives, by position, for the reasons a row cannot be read.
constexpr std::array<std::string_view, 18> kColumnNames = {
    "id", "method", "url", "headers", "body", "key", "key_header", "error", "attempts", "last_status",
    "last_attempt_unix_ms", "created_unix_ms", "status", "claim_token", "claim_host", "claim_pid",
    "claimed_unix_ms", "claim_until_unix_ms"};

std::string_view TypeName(int type) {
  switch (type) {
    case SQLITE_INTEGER: return "an integer";
    case SQLITE_FLOAT: return "a real number";
    case SQLITE_TEXT: return "text";
    case SQLITE_BLOB: return "a blob";
    default: return "NULL";
  }
}

// Checks the storage type of each column of a row before it is decoded:
// SQLite keeps any value in any column (another program, or a hand edit,
// may have written one), and sqlite3_column_* would quietly convert it.
class RowReader {
 public:
  explicit RowReader(const Statement& row) : row_(row) {}

  // The first problem found, "" when none.
  const std::string& problem() const { return problem_; }

  std::string Text(int column, bool null_ok = false) {
    if (!Expect(column, SQLITE_TEXT, null_ok)) return "";
    return row_.ColumnText(column);
  }
  // The storage type of a column selected as typeof(column): that of Bytes.
  void BytesType(int column) {
    const std::string type = row_.ColumnType(column) == SQLITE_TEXT ? row_.ColumnText(column) : "";
    if (type == "blob" || type == "text") return;
    Fail("column " + std::string(kColumnNames[column]) + " is " +
         (type == "integer" ? "an integer" : type == "real" ? "a real number" : type == "null" ? "NULL" : type) +
         ", not a blob");
  }
  // Bytes: a blob, or text (the same bytes).
  std::string Bytes(int column) {
    const int type = row_.ColumnType(column);
    if (type != SQLITE_BLOB && type != SQLITE_TEXT) {
      Wrong(column, type, "a blob");
      return "";
    }
    return row_.ColumnBlob(column);
  }
  std::int64_t Int(int column, std::int64_t min, std::int64_t max, bool null_ok = false) {
    if (!Expect(column, SQLITE_INTEGER, null_ok)) return 0;
    const std::int64_t value = row_.ColumnInt(column);
    if (value < min || value > max) {
      Fail("column " + std::string(kColumnNames[column]) + " is out of range (" + std::to_string(value) + ")");
      return 0;
    }
    return value;
  }
  bool IsNull(int column) const { return row_.ColumnType(column) == SQLITE_NULL; }
  void Fail(std::string problem) {
    if (problem_.empty()) problem_ = std::move(problem);
  }

 private:
  bool Expect(int column, int type, bool null_ok) {
    const int actual = row_.ColumnType(column);
    if (actual == type) return true;
    if (actual != SQLITE_NULL || !null_ok) Wrong(column, actual, type == SQLITE_TEXT ? "text" : "an integer");
    return false;
  }
  void Wrong(int column, int actual, std::string_view expected) {
    Fail("column " + std::string(kColumnNames[column]) + " is " + std::string(TypeName(actual)) + ", not " +
         std::string(expected));
  }

  const Statement& row_;
  std::string problem_;
};

// Why an entry cannot be read, as List reports it and Get and ClaimForReplay fail with.
Status Unreadable(std::int64_t id, std::string_view why) {
  return FailedPreconditionError("dead letter " + std::to_string(id) + " cannot be read: " + std::string(why));
}

constexpr std::int64_t kIntMin = std::numeric_limits<int>::min();
constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
constexpr std::int64_t kInt64Min = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

// One row selected by SelectEntries; a row with a value of the wrong type or
// range, headers that are not the JSON Park writes, or an unknown status is
// refused (Unreadable), naming the column.
// With Body::kTypeOnly (List) the body is left empty, its type checked all the same.
StatusOr<DeadLetter> ReadEntry(const Statement& row, Body body = Body::kRead) {
  DeadLetter entry;
  entry.id = row.ColumnInt(0);  // INTEGER PRIMARY KEY: always an integer
  RowReader read(row);
  entry.request.method = read.Text(1);
  entry.request.url = read.Text(2);
  const std::string headers_json = read.Text(3);
  if (body == Body::kRead) {
    entry.request.body = read.Bytes(4);
  } else {
    read.BytesType(4);
  }
  entry.request.key = read.Text(5);
  entry.request.key_header = read.Text(6);
  entry.error = read.Text(7);
  entry.attempts = static_cast<int>(read.Int(8, 0, kIntMax));
  entry.last_status = static_cast<int>(read.Int(9, kIntMin, kIntMax));
  entry.last_attempt_unix_ms = read.Int(10, kInt64Min, kInt64Max);
  entry.created_unix_ms = read.Int(11, kInt64Min, kInt64Max);
  const std::string status = read.Text(12);
  if (read.problem().empty()) {
    if (const auto parsed = EntryStatusFromName(status)) {
      entry.status = *parsed;
    } else {
      read.Fail("bad status " + QuoteInput(status));
    }
  }
  if (read.problem().empty()) {
    auto headers = HeadersFromJson(headers_json);
    if (headers.ok()) {
      entry.request.headers = std::move(*headers);
    } else {
      read.Fail(headers.status().message());
    }
  }
  if (read.problem().empty() && entry.status == EntryStatus::kReplaying && !read.IsNull(13)) {
    ReplayClaim claim;
    claim.token = read.Text(13);
    claim.host = read.Text(14, true);
    claim.pid = read.Int(15, kInt64Min, kInt64Max, true);
    claim.claimed_unix_ms = read.Int(16, kInt64Min, kInt64Max, true);
    claim.until_unix_ms = read.Int(17, kInt64Min, kInt64Max, true);
    entry.claim = std::move(claim);
  }
  if (!read.problem().empty()) return Unreadable(entry.id, read.problem());
  return entry;
}

Status UnsupportedVersion(std::int64_t version) {
  return FailedPreconditionError("dead-letter queue: schema version " + std::to_string(version) +
                                 " is not supported (this build knows version " + std::to_string(kSchemaVersion) +
                                 ")");
}

Status ForeignDatabase(const std::string& path, std::string_view more) {
  return FailedPreconditionError("dead-letter queue: " + path +
                                 " is a SQLite database of something else (it has tables but no dead-letter queue)" +
                                 std::string(more));
}

// Creates the schema on a new file; refuses a version this code does not know.
Status Migrate(sqlite3* db) {
  Transaction tx(db);
  if (!tx.begin_status().ok()) return tx.begin_status();
  std::int64_t version = 0;
  {
    Statement query(db, "PRAGMA user_version");
    auto row = query.Step();
    if (!row.ok()) return row.status();
    if (*row) version = query.ColumnInt(0);
  }
  if (version == kSchemaVersion) return tx.Commit();
  if (version == 1) {
    if (Status s = Exec(db, kMigrate1To2); !s.ok()) return s;
    const std::string set_version = "PRAGMA user_version = " + std::to_string(kSchemaVersion);
    if (Status s = Exec(db, set_version.c_str()); !s.ok()) return s;
    return tx.Commit();
  }
  if (version != 0) {
    return UnsupportedVersion(version);
  }
  if (Status s = Exec(db, kCreateSchema); !s.ok()) return s;
  const std::string set_version = "PRAGMA user_version = " + std::to_string(kSchemaVersion);
  if (Status s = Exec(db, set_version.c_str()); !s.ok()) return s;
  return tx.Commit();
}

// Switches the file to WAL. Changing the journal mode needs the file to
// itself, and SQLite answers SQLITE_BUSY at once when another connection
// holds it, without calling the busy handler: several processes creating one
// new queue at the same moment would otherwise fail all but one. So it is
// tried again, at short jittered intervals, for up to kBusyTimeout like any
// other lock wait. A file already in WAL (the usual case) needs no change.
Status EnableWal(sqlite3* db) {
  const auto deadline = std::chrono::steady_clock::now() + kBusyTimeout;
  std::minstd_rand jitter(static_cast<unsigned>(::getpid()) ^
                          static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  for (;;) {
    {
      Statement mode(db, "PRAGMA journal_mode");
      auto row = mode.Step();
      if (row.ok() && *row && mode.ColumnText(0) == "wal") return Status::Ok();
    }
    const int rc = sqlite3_exec(db, "PRAGMA journal_mode=WAL", nullptr, nullptr, nullptr);
    if (rc == SQLITE_OK) return Status::Ok();
    const int primary = rc & 0xff;
    if ((primary != SQLITE_BUSY && primary != SQLITE_LOCKED) || std::chrono::steady_clock::now() >= deadline) {
      return SqliteError(db, rc, "PRAGMA journal_mode=WAL");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5 + jitter() % 20));
  }
}

// Refuses a SQLite file that holds something other than a dead-letter queue
// (schema version 0 and tables of its own), before anything is changed in it:
// a mistyped --dlq must not add a table, or WAL, to another program's database.
Status CheckNotForeign(sqlite3* db, const std::string& path) {
  // One statement, so one read: another process may create the schema (and
  // set the version with it) between two.
  Statement query(db,
                  "SELECT (SELECT user_version FROM pragma_user_version), "
                  "(SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%')");
  auto row = query.Step();
  if (!row.ok()) return row.status();
  // Version 0 with tables: another program's. Another version is ours, or refused by Migrate.
  if (*row && query.ColumnInt(0) == 0 && query.ColumnInt(1) > 0) {
    return ForeignDatabase(path, "; refusing to add one to it");
  }
  return Status::Ok();
}

// For a file opened to read: what CheckNotForeign and Migrate check, without
// changing anything. Sets `no_table` for a file with no schema yet and
// `with_claims` false for a version 1 file.
Status CheckReadable(sqlite3* db, const std::string& path, bool& no_table, bool& with_claims, int& failed_code) {
  Statement query(db,
                  "SELECT (SELECT user_version FROM pragma_user_version), "
                  "(SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%')");
  auto row = query.Step();
  if (!row.ok()) {
    failed_code = sqlite3_extended_errcode(db);
    return row.status();
  }
  const std::int64_t version = *row ? query.ColumnInt(0) : 0;
  const std::int64_t tables = *row ? query.ColumnInt(1) : 0;
  if (version == 0) {
    if (tables > 0) {
      return ForeignDatabase(path, "");
    }
    no_table = true;
    return Status::Ok();
  }
  if (version != 1 && version != kSchemaVersion) {
    return UnsupportedVersion(version);
  }
  with_claims = version == kSchemaVersion;
  return Status::Ok();
}

// The main file's identity and last change: a read without SQLite's locks is
// good only when no writer touched the file meanwhile.
struct FileStamp {
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  std::int64_t mtime_ns = 0;
  bool operator==(const FileStamp&) const = default;
};

std::optional<FileStamp> Stamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileStamp{st.st_dev, st.st_ino, st.st_size,
                   static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
}

// True when the queue's -wal file holds frames: committed entries may be
// there and not yet in the main file. An empty one (left by a connection
// that could not remove it) holds none. Unknown counts as holding some.
bool WalHoldsFrames(const std::string& path) {
  struct stat st {};
  if (::stat((path + "-wal").c_str(), &st) != 0) return errno != ENOENT;
  return st.st_size > 0;
}

// The directory a file is in, for access(2).
std::string DirectoryOf(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// Why directory `dir` cannot hold a queue, "" when it may: it does not exist
// (`missing` set), is not a directory, or this user may not enter it (EACCES
// on it or on a directory above it: root's directories in a user's home, say).
std::string DirectoryProblem(const std::string& dir, bool& missing) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    missing = err == ENOENT || err == ENOTDIR;
    if (missing) return "the directory " + dir + " does not exist";
    if (err == EACCES) {
      return "the directory " + dir + " cannot be entered by this user (" + std::generic_category().message(err) +
             ": a directory above it may not be searched)";
    }
    return "the directory " + dir + " cannot be used: " + std::generic_category().message(err);
  }
  if (!S_ISDIR(st.st_mode)) return "the directory " + dir + " is not a directory";
  if (::access(dir.c_str(), X_OK) != 0) {
    const int err = errno;
    return "the directory " + dir + " cannot be entered by this user (" + std::generic_category().message(err) + ")";
  }
  return "";
}

// True when this process may read and write the queue file, and its -wal and
// -shm files where they exist, and may make and remove files beside them: a
// connection that may write can then, as the last one to close, checkpoint
// the queue and remove its -wal and -shm files (a read-only one cannot, and
// leaves them behind, which keeps readers without write access out).
bool MayWriteBeside(const std::string& path) {
  if (::access(path.c_str(), R_OK | W_OK) != 0) return false;
  if (::access(DirectoryOf(path).c_str(), W_OK | X_OK) != 0) return false;
  for (const char* suffix : {"-wal", "-shm"}) {
    const std::string file = path + suffix;
    if (::access(file.c_str(), F_OK) == 0 && ::access(file.c_str(), R_OK | W_OK) != 0) return false;
  }
  return true;
}

// Why a reader without write access cannot open the queue: a -shm file it
// may not open (a writer made it for itself, 0600), or none, and a directory
// it may not make one in.
std::string WhyNoIndex(const std::string& path) {
  const std::string shm = path + "-shm";
  if (::access(shm.c_str(), F_OK) == 0) {
    if (::access(shm.c_str(), R_OK) == 0) return "";
    const int err = errno;
    return " (SQLite's index of its write-ahead log, " + shm + ", exists but this user cannot open it: " +
           std::generic_category().message(err) +
           "; it is there while a process of the queue's owner has the queue open, or was left by one: try again "
           "once none has, or have the owner grant read access to " + path + "-wal and " + shm + " too)";
  }
  return " (reading " + path + " needs write access to its directory, for SQLite's -shm file)";
}

// "file:" + `path` percent-encoded, "?immutable=1": SQLite reads the file
// without locks and without its WAL index.
std::string ImmutableUri(const std::string& path) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string uri = "file:";
  for (char c : std::filesystem::absolute(path).string()) {
    const auto u = static_cast<unsigned char>(c);
    if ((u >= 'A' && u <= 'Z') || (u >= 'a' && u <= 'z') || (u >= '0' && u <= '9') || c == '/' || c == '-' ||
        c == '.' || c == '_' || c == '~') {
      uri.push_back(c);
    } else {
      uri.push_back('%');
      uri.push_back(kHex[u >> 4]);
      uri.push_back(kHex[u & 15]);
    }
  }
  return uri + "?immutable=1";
}

// Runs `body`, turning anything thrown into an error Status.
template <typename Result, typename Body>
Result Guarded(Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("dead-letter queue: out of memory");
  } catch (const std::exception& e) {
    return InternalError(std::string("dead-letter queue: ") + e.what());
  }
}

}  // namespace

std::string_view EntryStatusName(EntryStatus status) {
  switch (status) {
    case EntryStatus::kPending: return "pending";
    case EntryStatus::kReplaying: return "replaying";
    case EntryStatus::kReplayed: return "replayed";
    case EntryStatus::kDiscarded: return "discarded";
  }
  return "unknown";
}

std::optional<EntryStatus> EntryStatusFromName(std::string_view name) {
  for (EntryStatus status :
       {EntryStatus::kPending, EntryStatus::kReplaying, EntryStatus::kReplayed, EntryStatus::kDiscarded}) {
    if (EntryStatusName(status) == name) return status;
  }
  return std::nullopt;
}

// One connection; the mutex keeps each operation's statements (and
// sqlite3_changes) together when threads share the queue.
struct DeadLetterQueue::Impl {
  DbPtr db;
  std::mutex mu;
  // The token of each claim this object made and has not finished.
  std::map<std::int64_t, std::string> claims;
  // Opened to read: a file without the table yet (no entries), or a
  // version 1 file (no claim columns).
  bool no_table = false;
  bool with_claims = true;
  // Set when the file is read without SQLite's locks (see Open): its stamp
  // then, which every read checks afterwards.
  std::string path;
  std::optional<FileStamp> unlocked;

  // After a read without locks: an error when a writer may have changed the
  // file meanwhile (it then has a -wal file, or a new stamp).
  Status CheckUnchanged() const {
    if (!unlocked || (!WalHoldsFrames(path) && Stamp(path) == unlocked)) return Status::Ok();
    return UnavailableError("dead-letter queue: " + path +
                            " was written to while it was read without write access; try again");
  }

  StatusOr<DeadLetter> GetLocked(std::int64_t id) {
    if (no_table) return NotFoundError("no dead letter " + std::to_string(id));
    Statement select(db.get(), SelectEntries("WHERE id = ?", with_claims));
    select.Int(id);
    auto row = select.Step();
    if (!row.ok()) return row.status();
    if (!*row) return NotFoundError("no dead letter " + std::to_string(id));
    return ReadEntry(select);
  }

  // Only an entry's status and claim (all that a status change needs), so
  // that an entry whose request cannot be read can still be discarded or
  // released.
  struct State {
    EntryStatus status = EntryStatus::kPending;
    std::optional<ReplayClaim> claim;
  };
  StatusOr<State> StateLocked(std::int64_t id) {
    if (no_table) return NotFoundError("no dead letter " + std::to_string(id));
    const char* claim = with_claims ? "claim_token, claim_host, claim_pid, claimed_unix_ms, claim_until_unix_ms"
                                    : "NULL, NULL, NULL, NULL, NULL";
    Statement select(db.get(), std::string("SELECT status, ") + claim + " FROM dead_letters WHERE id = ?");
    select.Int(id);
    auto row = select.Step();
    if (!row.ok()) return row.status();
    if (!*row) return NotFoundError("no dead letter " + std::to_string(id));
    const auto status = select.ColumnType(0) == SQLITE_TEXT ? EntryStatusFromName(select.ColumnText(0)) : std::nullopt;
    if (!status) return Unreadable(id, "bad status " + QuoteInput(select.ColumnText(0)));
    State state{.status = *status};
    if (*status == EntryStatus::kReplaying && select.ColumnType(1) != SQLITE_NULL) {
      ReplayClaim claim;
      claim.token = select.ColumnText(1);
      claim.host = select.ColumnText(2);
      claim.pid = select.ColumnInt(3);
      claim.claimed_unix_ms = select.ColumnInt(4);
      claim.until_unix_ms = select.ColumnInt(5);
      state.claim = std::move(claim);
    }
    return state;
  }

  // Runs a guarded status change (`update` binds `id` last and requires
  // `from`); when it changes nothing, says why: NotFound or the current status.
  Status Transition(Statement& update, std::int64_t id, EntryStatus from) {
    if (Status s = update.Run(); !s.ok()) return s;
    if (sqlite3_changes(db.get()) == 1) return Status::Ok();
    auto current = StateLocked(id);
    if (!current.ok()) return current.status();
    return FailedPreconditionError("dead letter " + std::to_string(id) + " is " +
                                   std::string(EntryStatusName(current->status)) + ", not " +
                                   std::string(EntryStatusName(from)));
  }
};

DeadLetterQueue::DeadLetterQueue(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeadLetterQueue::~DeadLetterQueue() = default;

// Opens the file (serialized mode), sets WAL and the busy timeout, checks the
// schema; opened to read, only checks it.
StatusOr<std::unique_ptr<DeadLetterQueue>> DeadLetterQueue::Open(const std::string& path, Access access) {
  return Guarded<StatusOr<std::unique_ptr<DeadLetterQueue>>>([&]() -> StatusOr<std::unique_ptr<DeadLetterQueue>> {
    // SQLite says only "unable to open database file" for a directory that
    // is missing or cannot be entered. Only parking creates a queue: without
    // its directory there is none to read or change.
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) {
      bool missing = false;
      if (const std::string why = DirectoryProblem(parent.string(), missing); !why.empty()) {
        if (missing && access != Access::kCreate) {
          return NotFoundError("dead-letter queue: there is none at " + path + " (" + why + ")");
        }
        return UnavailableError("dead-letter queue: cannot open " + path + ": " + why);
      }
    }
    // Only parking creates a queue: a mistyped --dlq given to list or replay
    // must not leave an empty file behind.
    if (access != Access::kCreate) {
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0) {
        const int err = errno;
        if (err == ENOENT) {
          return NotFoundError("dead-letter queue: there is none at " + path + " (nothing has been parked there)");
        }
        return UnavailableError("dead-letter queue: cannot open " + path + ": " + std::generic_category().message(err));
      }
    }
    if (access == Access::kCreate) {
      // A new queue is its owner's alone (0600), as are the -wal and -shm
      // files SQLite makes beside it (they take the main file's mode): it
      // holds request headers and bodies. SQLite would make it 0644. An
      // empty file is a new database to SQLite; another process making it
      // first (EEXIST) is fine.
      const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
      const int err = errno;
      if (fd >= 0) {
        ::close(fd);
      } else if (err == EACCES) {
        return FailedPreconditionError("dead-letter queue: cannot create " + path + ": the directory " +
                                       DirectoryOf(path) + " may not be written by this user (" +
                                       std::generic_category().message(err) + ")");
      }
    }
    // A reader that may write opens the file to write, and writes nothing
    // (query_only): as the last connection to close it then checkpoints the
    // queue and removes its -wal and -shm files, which a read-only connection
    // would leave behind (and a reader without write access could then not
    // read the queue).
    const bool read_only = access == Access::kRead && !MayWriteBeside(path);
    sqlite3* raw = nullptr;
    const int flags = SQLITE_OPEN_FULLMUTEX | (read_only                   ? SQLITE_OPEN_READONLY
                                               : access == Access::kCreate ? SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE
                                                                           : SQLITE_OPEN_READWRITE);
    const int rc = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
    DbPtr db(raw);
    if (rc != SQLITE_OK) {
      // SQLite says only "unable to open database file".
      if (::access(path.c_str(), R_OK) != 0 && errno == EACCES) {
        return FailedPreconditionError("dead-letter queue: cannot open " + path +
                                       ": this user may not read it (Permission denied)");
      }
      return SqliteError(raw, rc, "open " + path);
    }
    sqlite3_extended_result_codes(db.get(), 1);
    sqlite3_busy_timeout(db.get(), static_cast<int>(kBusyTimeout.count()));
    if (access != Access::kRead && sqlite3_db_readonly(db.get(), "main") == 1) {
      // SQLite opens a file it may not write read-only; every change would fail.
      return FailedPreconditionError("dead-letter queue: " + path +
                                     " is read-only (this user may not write it), so it cannot be changed");
    }
    auto impl = std::make_unique<Impl>();
    if (access == Access::kRead && !read_only) {
      if (Status s = Exec(db.get(), "PRAGMA query_only = 1"); !s.ok()) return s;
    }
    if (access == Access::kRead) {
      int code = SQLITE_OK;
      Status s = CheckReadable(db.get(), path, impl->no_table, impl->with_claims, code);
      const bool no_index = (code & 0xff) == SQLITE_READONLY || (code & 0xff) == SQLITE_CANTOPEN;
      if (!s.ok() && no_index && !WalHoldsFrames(path)) {
        // A WAL file that no connection has open has no index (-shm), and a
        // reader may create one only where it may write. With no -wal file
        // every committed entry is in the main file, so it is read as it
        // is, without locks, and each read checks afterwards that no writer
        // came meanwhile (Impl::CheckUnchanged).
        impl->path = path;
        impl->unlocked = Stamp(path);
        if (!impl->unlocked) return UnavailableError("dead-letter queue: cannot stat " + path);
        db.reset();
        raw = nullptr;
        const int reopened = sqlite3_open_v2(ImmutableUri(path).c_str(), &raw,
                                             SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_FULLMUTEX, nullptr);
        db.reset(raw);
        if (reopened != SQLITE_OK) return SqliteError(raw, reopened, "open " + path);
        sqlite3_extended_result_codes(db.get(), 1);
        s = CheckReadable(db.get(), path, impl->no_table, impl->with_claims, code);
        if (s.ok()) s = impl->CheckUnchanged();
      }
      if (!s.ok()) return no_index ? FailedPreconditionError(s.message() + WhyNoIndex(path)) : s;
    } else {
      Status s = CheckNotForeign(db.get(), path);
      if (s.ok()) s = EnableWal(db.get());
      if (s.ok()) s = Migrate(db.get());
      // SQLite says only "unable to open database file" (Unavailable), or
      // "attempt to write a readonly database" for a file this user may write
      // whose -wal and -shm files it cannot make.
      const bool readonly = (sqlite3_errcode(db.get()) & 0xff) == SQLITE_READONLY;
      if (!s.ok() && (s.code() == StatusCode::kUnavailable || readonly) &&
          ::access(DirectoryOf(path).c_str(), W_OK | X_OK) != 0) {
        return FailedPreconditionError(s.message() + " (the directory " + DirectoryOf(path) +
                                       " may not be written by this user, and SQLite keeps the queue's -wal and "
                                       "-shm files there)");
      }
      if (!s.ok()) return s;
    }
    impl->db = std::move(db);
    return std::unique_ptr<DeadLetterQueue>(new DeadLetterQueue(std::move(impl)));
  });
}

// Inserts a pending entry; the key is required, since a replay must carry it.
StatusOr<std::int64_t> DeadLetterQueue::Park(const Request& request, std::string_view error, int attempts,
                                             int last_status) {
  return Guarded<StatusOr<std::int64_t>>([&]() -> StatusOr<std::int64_t> {
    if (request.key.empty()) return InvalidArgumentError("dead-letter queue: a parked request needs its key");
    if (attempts < 0) return InvalidArgumentError("dead-letter queue: negative attempts");
    const std::string headers = HeadersToJson(request.headers);
    const std::int64_t now = NowUnixMs();
    std::lock_guard lock(impl_->mu);
    Statement insert(impl_->db.get(),
                     "INSERT INTO dead_letters (method, url, headers, body, \"key\", key_header, error, attempts, "
                     "last_status, last_attempt_unix_ms, created_unix_ms, status) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id");
    insert.Text(request.method)
        .Text(request.url)
        .Text(headers)
        .Blob(request.body)
        .Text(request.key)
        .Text(request.key_header)
        .Text(error)
        .Int(attempts)
        .Int(last_status)
        .Int(now)
        .Int(now)
        .Text(EntryStatusName(EntryStatus::kPending));
    auto row = insert.Step();
    if (!row.ok()) return row.status();
    if (!*row) return InternalError("dead-letter queue: insert returned no id");
    const std::int64_t id = insert.ColumnInt(0);
    if (Status s = insert.Run(); !s.ok()) return s;  // finishes the statement
    return id;
  });
}

// All entries (or those with `status`) by id, without their bodies; a row
// that cannot be read is skipped and named, so that one bad row hides no other.
StatusOr<DeadLetterListing> DeadLetterQueue::List(std::optional<EntryStatus> status) const {
  return Guarded<StatusOr<DeadLetterListing>>([&]() -> StatusOr<DeadLetterListing> {
    std::lock_guard lock(impl_->mu);
    DeadLetterListing listing;
    if (impl_->no_table) return listing;
    Statement select(impl_->db.get(),
                     SelectEntries(status ? "WHERE status = ? ORDER BY id" : "ORDER BY id", impl_->with_claims,
                                   Body::kTypeOnly));
    if (status) select.Text(EntryStatusName(*status));
    for (;;) {
      auto row = select.Step();
      if (!row.ok()) return row.status();
      if (!*row) {
        if (Status s = impl_->CheckUnchanged(); !s.ok()) return s;
        return listing;
      }
      auto entry = ReadEntry(select, Body::kTypeOnly);
      if (entry.ok()) {
        listing.entries.push_back(std::move(*entry));
      } else if (entry.status().code() == StatusCode::kFailedPrecondition) {
        listing.unreadable.push_back(UnreadableEntry{.id = select.ColumnInt(0), .error = entry.status().message()});
      } else {
        return entry.status();
      }
    }
  });
}

StatusOr<DeadLetter> DeadLetterQueue::Get(std::int64_t id) const {
  return Guarded<StatusOr<DeadLetter>>([&]() -> StatusOr<DeadLetter> {
    std::lock_guard lock(impl_->mu);
    auto entry = impl_->GetLocked(id);
    if (Status s = impl_->CheckUnchanged(); !s.ok()) return s;
    return entry;
  });
}

// pending -> replaying in one guarded UPDATE that records the claim, then
// the row as claimed.
StatusOr<DeadLetter> DeadLetterQueue::ClaimForReplay(std::int64_t id, Millis longest) {
  return Guarded<StatusOr<DeadLetter>>([&]() -> StatusOr<DeadLetter> {
    const std::string token = NewKeyV4();  // random, this claim's own
    const std::int64_t now = NowUnixMs();
    std::lock_guard lock(impl_->mu);
    // One transaction: an entry that cannot be read is not left claimed.
    Transaction tx(impl_->db.get());
    if (!tx.begin_status().ok()) return tx.begin_status();
    Statement update(impl_->db.get(),
                     "UPDATE dead_letters SET status = ?, claim_token = ?, claim_host = ?, claim_pid = ?, "
                     "claimed_unix_ms = ?, claim_until_unix_ms = ? WHERE id = ? AND status = ?");
    update.Text(EntryStatusName(EntryStatus::kReplaying))
        .Text(token)
        .Text(HostName())
        .Int(::getpid())
        .Int(now)
        .Int(longest.count() <= 0 ? 0 : longest.count() > kInt64Max - now ? kInt64Max : now + longest.count())
        .Int(id)
        .Text(EntryStatusName(EntryStatus::kPending));
    if (Status s = impl_->Transition(update, id, EntryStatus::kPending); !s.ok()) return s;
    auto entry = impl_->GetLocked(id);
    if (!entry.ok()) return entry.status();
    if (Status s = tx.Commit(); !s.ok()) return s;
    impl_->claims[id] = token;
    return entry;
  });
}

// replaying -> replayed or pending, recording the replay's attempts and result
// (and, when it made any, the time of the last).
Status DeadLetterQueue::FinishReplay(std::int64_t id, bool replayed, std::string_view error, int attempts,
                                     int last_status) {
  return Guarded<Status>([&]() -> Status {
    if (attempts < 0) return InvalidArgumentError("dead-letter queue: negative attempts");
    std::lock_guard lock(impl_->mu);
    // Only under this object's own claim: a replay whose entry was released
    // (and perhaps claimed by another replay) must not write over it.
    const auto mine = impl_->claims.find(id);
    Statement update(impl_->db.get(),
                     "UPDATE dead_letters SET status = ?, error = ?, attempts = attempts + ?, last_status = ?, "
                     "last_attempt_unix_ms = ifnull(?, last_attempt_unix_ms), " +
                         std::string(kClearClaim) + " WHERE id = ? AND status = ? AND claim_token IS ?");
    update.Text(EntryStatusName(replayed ? EntryStatus::kReplayed : EntryStatus::kPending))
        .Text(error)
        .Int(attempts)
        .Int(last_status);
    // No attempt made (a request that can never be sent, a replay stopped
    // before its first attempt): the last attempt is still the one before.
    if (attempts > 0) {
      update.Int(NowUnixMs());
    } else {
      update.Null();
    }
    update.Int(id).Text(EntryStatusName(EntryStatus::kReplaying));
    if (mine != impl_->claims.end()) {
      update.Text(mine->second);
    } else {
      update.Null();
    }
    Status s = impl_->Transition(update, id, EntryStatus::kReplaying);
    if (s.code() == StatusCode::kFailedPrecondition) {
      auto current = impl_->StateLocked(id);
      if (current.ok() && current->status == EntryStatus::kReplaying) {
        s = FailedPreconditionError("dead letter " + std::to_string(id) +
                                    " was released from this replay and claimed again; its result was not recorded");
      } else if (current.ok() && mine != impl_->claims.end()) {
        s = FailedPreconditionError("dead letter " + std::to_string(id) + " was released from this replay (it is " +
                                    std::string(EntryStatusName(current->status)) +
                                    " now); its result was not recorded");
      }
    }
    if (mine != impl_->claims.end()) impl_->claims.erase(mine);
    return s;
  });
}

// pending -> discarded.
Status DeadLetterQueue::Discard(std::int64_t id) {
  return Guarded<Status>([&]() -> Status {
    std::lock_guard lock(impl_->mu);
    Statement update(impl_->db.get(), "UPDATE dead_letters SET status = ? WHERE id = ? AND status = ?");
    update.Text(EntryStatusName(EntryStatus::kDiscarded)).Int(id).Text(EntryStatusName(EntryStatus::kPending));
    return impl_->Transition(update, id, EntryStatus::kPending);
  });
}

// replaying -> pending, unless the claimant may still be running (read and
// changed in one transaction, so the claim checked is the claim released).
Status DeadLetterQueue::Release(std::int64_t id, bool force) {
  return Guarded<Status>([&]() -> Status {
    std::lock_guard lock(impl_->mu);
    Transaction tx(impl_->db.get());
    if (!tx.begin_status().ok()) return tx.begin_status();
    auto current = impl_->StateLocked(id);
    if (!current.ok()) return current.status();
    if (current->status == EntryStatus::kReplaying && current->claim && !force) {
      const ReplayClaim& c = *current->claim;
      const std::string who = "dead letter " + std::to_string(id) + " is being replayed by process " +
                              std::to_string(c.pid) + " on host " + (c.host.empty() ? "?" : c.host) + " (claimed " +
                              FormatUtcTime(c.claimed_unix_ms) + ")";
      if (c.host == HostName()) {
        if (c.pid == ::getpid() || ProcessMayBeAlive(c.pid)) {
          return FailedPreconditionError(who +
                                         ", which is still running: release it only once that process is gone "
                                         "(or force it, if that process is not a replay)");
        }
      } else if (c.until_unix_ms == 0 || NowUnixMs() < c.until_unix_ms) {
        return FailedPreconditionError(
            who + ", which cannot be checked from this host and may run until " +
            (c.until_unix_ms == 0 ? std::string("an unknown time") : FormatUtcTime(c.until_unix_ms)) +
            ": release it once that replay is over (or force it)");
      }
    }
    Statement update(impl_->db.get(),
                     "UPDATE dead_letters SET status = ?, " + std::string(kClearClaim) +
                         " WHERE id = ? AND status = ?");
    update.Text(EntryStatusName(EntryStatus::kPending)).Int(id).Text(EntryStatusName(EntryStatus::kReplaying));
    if (Status s = impl_->Transition(update, id, EntryStatus::kReplaying); !s.ok()) return s;
    return tx.Commit();
  });
}

std::string FormatUtcTime(std::int64_t unix_ms) {
  const std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace idemgate::client
