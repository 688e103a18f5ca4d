// EmbeddedStore beyond the common contract: durability across restarts and
// crashes, refusing unusable paths, expiry (sweeper, compaction filter, disk
// space) and the committer's batching.
#include "store/embedded/embedded_store.h"

#include "common/clock.h"
#include "core/engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <fstream>
#include <pwd.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "contract/store_helpers.h"
#include "fakes/testing.h"

namespace idemgate::store::embedded {
namespace {

namespace fs = std::filesystem;
using contract::Completion;
using contract::Fingerprint;
using contract::Reservation;
using contract::RunOn;
using core::Record;
using core::ReserveOutcome;
using namespace std::chrono_literals;

std::uint64_t DirBytes(const std::string& dir) {
  std::uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) n += e.file_size();
  }
  return n;
}

class EmbeddedStoreTest : public ::testing::Test {
 protected:
  EmbeddedStore::Options Opts(bool sync = false) const {
    EmbeddedStore::Options o;
    o.path = path_;
    o.sync = sync;
    o.clock = &clock_;
    o.sweep_interval = Duration::zero();
    return o;
  }
  std::unique_ptr<EmbeddedStore> OpenOrDie(EmbeddedStore::Options o) {
    auto store = EmbeddedStore::Open(std::move(o));
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(*store) : nullptr;
  }
  UnixMillis Now() const { return clock_.NowMillis(); }

  template <typename T>
  T Run(core::Task<T> task) {
    return RunOn(io_, std::move(task));
  }

  // Reserves and completes `key` with `retention`; returns the record.
  Record Put(EmbeddedStore& store, const std::string& key, Duration retention,
             std::string body = "body") {
    Record r = Reservation("owner-" + key, Fingerprint(1), Now());
    auto res = Run(store.Reserve(key, r, Now()));
    EXPECT_TRUE(res.ok() && res->outcome == ReserveOutcome::kReserved) << key;
    Record c = Completion(r, Now(), retention, 200, std::move(body));
    Status s = Run(store.Complete(key, r.owner, c));
    EXPECT_TRUE(s.ok()) << s.ToString();
    return c;
  }

  std::optional<Record> Get(EmbeddedStore& store, const std::string& key) {
    auto got = Run(store.Get(key, Now()));
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    return got.ok() ? *got : std::nullopt;
  }

  // A "threadsafe" death test re-runs the test in a fresh process, whose
  // fixture has a directory of its own: the child uses the parent's instead
  // (passed in the environment) and removes its own.
  std::string DeathTestPath() {
    setenv(kDeathTestPathEnv, path_.c_str(), /*overwrite=*/0);
    return getenv(kDeathTestPathEnv);
  }
  void InDeathTestChild() {
    std::error_code ec;
    if (DeathTestPath() != path_) fs::remove_all(dir_.path(), ec);
  }
  void TearDown() override { unsetenv(kDeathTestPathEnv); }
  static constexpr const char* kDeathTestPathEnv = "IDEMGATE_EMBEDDED_DEATH_TEST_PATH";

  Record MustGet(EmbeddedStore& store, const std::string& key) {
    auto got = Get(store, key);
    if (!got) ADD_FAILURE() << "no record under " << key;
    return got.value_or(Record{});
  }

  FakeClock clock_;
  testing::TempDir dir_;
  std::string path_ = dir_.Join("db");
  boost::asio::io_context io_;
};

TEST_F(EmbeddedStoreTest, OperationsQueuedTogetherCommitAsOneWriteAndSeeEachOther) {
  auto store = OpenOrDie(Opts());
  ASSERT_NE(store, nullptr);
  store->HoldCommitsForTesting(true);
  const UnixMillis now = clock_.NowMillis();
  const Record a = contract::Reservation("owner-a", contract::Fingerprint(1), now);
  const Record b = contract::Reservation("owner-b", contract::Fingerprint(2), now);
  std::optional<StatusOr<core::ReserveResult>> first, second, third;
  std::optional<Status> completed;
  std::thread::id io_thread, resumed;
  // Reserve k, complete it, then two more reserves of k: all in one batch, in order.
  auto run = [&]() -> core::Task<void> {
    io_thread = std::this_thread::get_id();
    first.emplace(co_await store->Reserve("k", a, now));
    resumed = std::this_thread::get_id();
  };
  boost::asio::co_spawn(io_, run(), boost::asio::detached);
  boost::asio::co_spawn(io_, [&]() -> core::Task<void> {
    completed.emplace(co_await store->Complete("k", "owner-a", contract::Completion(a, now, Duration::zero(), 200, "body")));
  }, boost::asio::detached);
  boost::asio::co_spawn(io_, [&]() -> core::Task<void> {
    second.emplace(co_await store->Reserve("k", b, now));
  }, boost::asio::detached);
  boost::asio::co_spawn(io_, [&]() -> core::Task<void> {
    third.emplace(co_await store->Reserve("other", b, now));
  }, boost::asio::detached);
  io_.poll();  // every coroutine is now waiting for the committer
  EXPECT_EQ(store->queued_for_testing(), 4u);
  const std::uint64_t commits_before = store->commits();
  store->HoldCommitsForTesting(false);
  io_.restart();
  while (!(first && completed && second && third)) io_.run_one();
  EXPECT_EQ(store->commits(), commits_before + 1);
  ASSERT_TRUE(first->ok());
  EXPECT_EQ((*first)->outcome, core::ReserveOutcome::kReserved);
  EXPECT_TRUE(completed->ok()) << completed->ToString();
  // The completion made earlier in the batch is what the later reserve finds.
  ASSERT_TRUE(second->ok());
  EXPECT_EQ((*second)->outcome, core::ReserveOutcome::kExists);
  ASSERT_TRUE((*second)->existing.has_value());
  EXPECT_EQ((*second)->existing->state, core::RecordState::kCompleted);
  EXPECT_EQ((*second)->existing->response.body, "body");
  ASSERT_TRUE(third->ok());
  EXPECT_EQ((*third)->outcome, core::ReserveOutcome::kReserved);
  // The coroutine resumed on its own thread, not the committer's.
  EXPECT_EQ(resumed, io_thread);
  // And all of it is in the database.
  EXPECT_EQ(MustGet(*store, "k").state, core::RecordState::kCompleted);
  EXPECT_EQ(MustGet(*store, "other").owner, "owner-b");
}

TEST_F(EmbeddedStoreTest, ReservesOfNewKeysSkipTheCommittersReadOnlyWhenNoLaterBatchWroteTheKey) {
  auto o = Opts();
  o.max_batch = 1;  // one operation per batch: A and B below are committed apart
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  const UnixMillis now = clock_.NowMillis();
  const Record a = contract::Reservation("owner-a", contract::Fingerprint(1), now);
  const Record b = contract::Reservation("owner-b", contract::Fingerprint(2), now);
  store->HoldCommitsForTesting(true);
  // Both find "k" absent before either is committed.
  std::optional<StatusOr<core::ReserveResult>> first, second;
  boost::asio::co_spawn(io_, [&]() -> core::Task<void> {
    first.emplace(co_await store->Reserve("k", a, now));
  }, boost::asio::detached);
  boost::asio::co_spawn(io_, [&]() -> core::Task<void> {
    second.emplace(co_await store->Reserve("k", b, now));
  }, boost::asio::detached);
  io_.poll();
  ASSERT_EQ(store->queued_for_testing(), 2u);
  store->HoldCommitsForTesting(false);
  io_.restart();
  while (!(first && second)) io_.run_one();
  ASSERT_TRUE(first->ok() && second->ok());
  EXPECT_EQ((*first)->outcome, core::ReserveOutcome::kReserved);
  // The second was decided after a batch that wrote "k": the committer read it again.
  EXPECT_EQ((*second)->outcome, core::ReserveOutcome::kExists);
  ASSERT_TRUE((*second)->existing.has_value());
  EXPECT_EQ((*second)->existing->owner, "owner-a");
  EXPECT_EQ(store->rereads_skipped(), 1u);
  // A new key on its own is decided without a second read.
  ASSERT_EQ(Run(store->Reserve("other", a, now))->outcome, core::ReserveOutcome::kReserved);
  EXPECT_EQ(store->rereads_skipped(), 2u);
}

TEST_F(EmbeddedStoreTest, OwnerChecksOfReservationsThisStoreWroteSkipTheRead) {
  const UnixMillis now = Now();
  {
    auto store = OpenOrDie(Opts());
    ASSERT_NE(store, nullptr);
    // Reserved here: Complete checks the owner without reading.
    const Record k = Reservation("owner-k", Fingerprint(1), now);
    ASSERT_EQ(Run(store->Reserve("k", k, now))->outcome, ReserveOutcome::kReserved);
    const Record done = Completion(k, now, 24h, 201, "created");
    Status s = Run(store->Complete("k", "someone-else", done));
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_NE(s.message().find("lease lost"), std::string::npos) << s.ToString();
    EXPECT_EQ(store->owner_reads_skipped(), 1u);
    ASSERT_TRUE(Run(store->Complete("k", "owner-k", done)).ok());
    EXPECT_EQ(store->owner_reads_skipped(), 2u);
    // Completed: forgotten, so the second Complete reads and is refused.
    s = Run(store->Complete("k", "owner-k", done));
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("already completed"), std::string::npos) << s.ToString();
    EXPECT_EQ(store->owner_reads_skipped(), 2u);

    // A takeover replaces the remembered owner: the first owner has lost it.
    const Record first = Reservation("owner-1", Fingerprint(2), now, 1s);
    ASSERT_EQ(Run(store->Reserve("t", first, now))->outcome, ReserveOutcome::kReserved);
    const UnixMillis later = now + 5'000;
    const Record second = Reservation("owner-2", Fingerprint(2), later);
    ASSERT_EQ(Run(store->Reserve("t", second, later))->outcome, ReserveOutcome::kTakenOver);
    s = Run(store->Complete("t", "owner-1", Completion(first, later, 24h, 201, "late")));
    EXPECT_NE(s.message().find("lease lost"), std::string::npos) << s.ToString();
    ASSERT_TRUE(Run(store->Complete("t", "owner-2", Completion(second, later, 24h, 201, "x"))).ok());
    EXPECT_EQ(store->owner_reads_skipped(), 4u);
    auto got = Run(store->Get("t", later));
    ASSERT_TRUE(got.ok() && got->has_value());
    EXPECT_EQ((*got)->owner, "owner-2");

    // Released and purged reservations are forgotten.
    const Record r = Reservation("owner-r", Fingerprint(3), now);
    ASSERT_EQ(Run(store->Reserve("r", r, now))->outcome, ReserveOutcome::kReserved);
    ASSERT_TRUE(Run(store->Release("r", "owner-r")).ok());
    EXPECT_EQ(store->owner_reads_skipped(), 5u);
    EXPECT_EQ(Run(store->Release("r", "owner-r")).code(), StatusCode::kFailedPrecondition);
    const Record q = Reservation("owner-q", Fingerprint(4), now);
    ASSERT_EQ(Run(store->Reserve("q", q, now))->outcome, ReserveOutcome::kReserved);
    ASSERT_EQ(Run(store->Purge("q", core::PurgeMode::kAny, now))->outcome, core::PurgeOutcome::kPurged);
    s = Run(store->Complete("q", "owner-q", Completion(q, now, 24h, 201, "x")));
    EXPECT_NE(s.message().find("not reserved"), std::string::npos) << s.ToString();
    EXPECT_EQ(store->owner_reads_skipped(), 5u);

    // Left in flight across the restart below.
    const Record p = Reservation("owner-p", Fingerprint(5), now);
    ASSERT_EQ(Run(store->Reserve("p", p, now))->outcome, ReserveOutcome::kReserved);
  }
  // A reopened store remembers nothing: the owner check reads the record.
  auto store = OpenOrDie(Opts());
  ASSERT_NE(store, nullptr);
  const Record p = Reservation("owner-p", Fingerprint(5), now);
  Status s = Run(store->Complete("p", "owner-x", Completion(p, now, 24h, 201, "x")));
  EXPECT_NE(s.message().find("lease lost"), std::string::npos) << s.ToString();
  ASSERT_TRUE(Run(store->Complete("p", "owner-p", Completion(p, now, 24h, 201, "x"))).ok());
  EXPECT_EQ(store->owner_reads_skipped(), 0u);
}

TEST_F(EmbeddedStoreTest, BeyondTheRememberedReservationsOwnerChecksRead) {
  EmbeddedStore::Options o = Opts();
  o.remembered_reservations = 2;
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  const UnixMillis now = Now();
  std::vector<Record> reserved;
  for (const char* key : {"a", "b", "c"}) {
    reserved.push_back(Reservation(std::string("owner-") + key, Fingerprint(1), now));
    ASSERT_EQ(Run(store->Reserve(key, reserved.back(), now))->outcome, ReserveOutcome::kReserved);
  }
  // "c" came third: not remembered, read; still decided right.
  EXPECT_NE(Run(store->Release("c", "owner-a")).message().find("not held"), std::string::npos);
  ASSERT_TRUE(Run(store->Complete("c", "owner-c", Completion(reserved[2], now, 24h, 201, "c"))).ok());
  EXPECT_EQ(store->owner_reads_skipped(), 0u);
  ASSERT_TRUE(Run(store->Complete("a", "owner-a", Completion(reserved[0], now, 24h, 201, "a"))).ok());
  EXPECT_EQ(store->owner_reads_skipped(), 1u);
  // Settling "a" made room: a new reservation is remembered again.
  const Record d = Reservation("owner-d", Fingerprint(1), now);
  ASSERT_EQ(Run(store->Reserve("d", d, now))->outcome, ReserveOutcome::kReserved);
  ASSERT_TRUE(Run(store->Release("d", "owner-d")).ok());
  ASSERT_TRUE(Run(store->Release("b", "owner-b")).ok());
  EXPECT_EQ(store->owner_reads_skipped(), 3u);
}

class EmbeddedRestartTest : public EmbeddedStoreTest, public ::testing::WithParamInterface<bool> {};

TEST_P(EmbeddedRestartTest, RecordsSurviveARestart) {
  const bool sync = GetParam();
  std::vector<Record> completed;
  std::vector<Record> in_flight;
  {
    auto store = OpenOrDie(Opts(sync));
    ASSERT_NE(store, nullptr);
    std::string binary;
    for (int i = 0; i < 256; ++i) binary.push_back(static_cast<char>(i));
    for (int i = 0; i < 20; ++i) {
      completed.push_back(
          Put(*store, "done-" + std::to_string(i), i % 2 ? 24h : 0ms, binary + std::to_string(i)));
    }
    for (int i = 0; i < 5; ++i) {
      Record r = Reservation("owner-" + std::to_string(i), Fingerprint(i), Now(), 30s);
      auto res = Run(store->Reserve("flight-" + std::to_string(i), r, Now()));
      ASSERT_TRUE(res.ok() && res->outcome == ReserveOutcome::kReserved);
      in_flight.push_back(r);
    }
  }
  auto store = OpenOrDie(Opts(sync));
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 20; ++i) {
    auto got = Get(*store, "done-" + std::to_string(i));
    ASSERT_TRUE(got.has_value()) << i;
    EXPECT_EQ(core::EncodeRecord(*got), core::EncodeRecord(completed[i])) << i;
  }
  for (int i = 0; i < 5; ++i) {
    const std::string key = "flight-" + std::to_string(i);
    auto got = Get(*store, key);
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(*got, in_flight[i]);
    // Still in flight: another request is refused until the lease ends...
    Record retry = Reservation("new-owner", Fingerprint(i), Now());
    auto res = Run(store->Reserve(key, retry, Now()));
    ASSERT_TRUE(res.ok());
    EXPECT_EQ(res->outcome, ReserveOutcome::kExists);
  }
  // ...and taken over once it has, by wall clock.
  clock_.Advance(30s);
  for (int i = 0; i < 5; ++i) {
    const std::string key = "flight-" + std::to_string(i);
    Record retry = Reservation("new-owner", Fingerprint(i), Now());
    auto res = Run(store->Reserve(key, retry, Now()));
    ASSERT_TRUE(res.ok());
    EXPECT_EQ(res->outcome, ReserveOutcome::kTakenOver);
    ASSERT_TRUE(res->existing.has_value());
    EXPECT_EQ(*res->existing, in_flight[i]);
    EXPECT_EQ(
        Run(store->Complete(key, in_flight[i].owner, Completion(in_flight[i], Now(), 24h))).code(),
        StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Run(store->Complete(key, "new-owner", Completion(retry, Now(), 24h))).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Sync, EmbeddedRestartTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Fsync" : "NoFsync"; });

// The child writes and then dies without closing anything (like kill -9):
// with sync off the commits are in the WAL in the OS page cache, which a
// process crash does not lose.
TEST_F(EmbeddedStoreTest, CommitsSurviveAProcessCrash) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = DeathTestPath();
  EXPECT_EXIT(
      {
        InDeathTestChild();
        auto o = Opts(false);
        o.path = path;
        auto store = EmbeddedStore::Open(o);
        if (!store.ok()) {
          std::cerr << store.status().ToString();
          std::_Exit(1);
        }
        boost::asio::io_context io;
        for (int i = 0; i < 50; ++i) {
          const std::string key = "k" + std::to_string(i);
          Record r = Reservation("owner", Fingerprint(i), Now());
          auto res = RunOn(io, (*store)->Reserve(key, r, Now()));
          Status s =
              i < 40
                  ? RunOn(io, (*store)->Complete(key, "owner", Completion(r, Now(), 24h, 200, key)))
                  : Status::Ok();
          if (!res.ok() || !s.ok()) std::_Exit(2);
        }
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
  auto store = OpenOrDie(Opts(false));
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 50; ++i) {
    const std::string key = "k" + std::to_string(i);
    auto got = Get(*store, key);
    ASSERT_TRUE(got.has_value()) << key;
    if (i < 40) {
      EXPECT_EQ(got->state, core::RecordState::kCompleted);
      EXPECT_EQ(got->response.body, key);
    } else {
      EXPECT_EQ(got->state, core::RecordState::kInFlight);
    }
  }
}

// A store.path with no store in it (a new deployment, or a mistyped path
// after a config change) gets a new, empty store, with a warning naming the
// path; an existing store is opened without one.
TEST_F(EmbeddedStoreTest, CreatingANewStoreIsLogged) {
  const std::string log_path = dir_.Join("log.txt");
  const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  SetLogFd(fd);
  {
    auto store = OpenOrDie(Opts());
    ASSERT_NE(store, nullptr);
    EXPECT_TRUE(store->created());
  }
  const std::string first = testing::ReadFileOrEmpty(log_path);
  {
    auto store = OpenOrDie(Opts());
    ASSERT_NE(store, nullptr);
    EXPECT_FALSE(store->created());
  }
  const std::string both = testing::ReadFileOrEmpty(log_path);
  SetLogFd(1);
  ::close(fd);
  EXPECT_NE(first.find("created a new, empty one"), std::string::npos) << first;
  EXPECT_NE(first.find(Opts().path), std::string::npos) << first;
  EXPECT_EQ(both, first);  // the reopen logged nothing of the kind
}

// The path in that warning is lexically normal: a store.path written with
// "." or ".." segments (./idemgate-data, from a relative path made absolute)
// is shown without them.
TEST_F(EmbeddedStoreTest, TheNewStoreWarningShowsANormalPath) {
  const std::string log_path = dir_.Join("log.txt");
  const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  SetLogFd(fd);
  {
    ASSERT_TRUE(fs::create_directories(dir_.Join("sub")));
    EmbeddedStore::Options o = Opts();
    o.path = dir_.Join("sub/.././fresh-store");
    auto store = OpenOrDie(std::move(o));
    ASSERT_NE(store, nullptr);
    EXPECT_TRUE(store->created());
  }
  const std::string log = testing::ReadFileOrEmpty(log_path);
  SetLogFd(1);
  ::close(fd);
  EXPECT_NE(log.find("created a new, empty one"), std::string::npos) << log;
  EXPECT_NE(log.find("\"path\":\"" + dir_.Join("fresh-store") + "\""), std::string::npos) << log;
  EXPECT_EQ(log.find("/./"), std::string::npos) << log;
  EXPECT_EQ(log.find("/../"), std::string::npos) << log;
}

// RocksDB recovers a damaged write-ahead log to its last good record and
// drops the rest, saying so only in its own LOG: the gateway's log says it
// too, since keys written after the damage may run again.
TEST_F(EmbeddedStoreTest, ADamagedWriteAheadLogDroppedAtOpenIsLogged) {
  {
    auto store = OpenOrDie(Opts(/*sync=*/true));
    for (int i = 0; i < 200; ++i) Put(*store, "k" + std::to_string(i), std::chrono::hours(1));
  }
  // The last connection left its records in the log (no flush at close):
  // damage the middle of the newest one.
  fs::path wal;
  for (const auto& e : fs::directory_iterator(path_)) {
    if (e.path().extension() == ".log" && (wal.empty() || e.path() > wal)) wal = e.path();
  }
  ASSERT_FALSE(wal.empty());
  const std::uintmax_t size = fs::file_size(wal);
  ASSERT_GT(size, 4096u);
  {
    std::fstream f(wal, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 2));
    const std::string junk(32, '\x5a');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  const std::string log_path = dir_.Join("log.txt");
  const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  SetLogFd(fd);
  auto store = EmbeddedStore::Open(Opts());
  SetLogFd(1);
  ::close(fd);
  const std::string logged = testing::ReadFileOrEmpty(log_path);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_NE(logged.find("dropped part of a damaged write-ahead log"), std::string::npos) << logged;
  EXPECT_NE(logged.find("dropping"), std::string::npos) << logged;
}

TEST_F(EmbeddedStoreTest, SecondOpenOfAnOpenPathFailsClearly) {
  auto first = OpenOrDie(Opts());
  ASSERT_NE(first, nullptr);
  auto second = EmbeddedStore::Open(Opts());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("already in use"), std::string::npos)
      << second.status().ToString();
  EXPECT_NE(second.status().message().find(path_), std::string::npos);
  // The first instance is unaffected.
  Put(*first, "k", 24h);
  EXPECT_TRUE(Get(*first, "k").has_value());
}

// Another process holding the LOCK file the way RocksDB does (a POSIX write
// lock), i.e. another idemgate on the same path.
TEST_F(EmbeddedStoreTest, OpenFailsWhileAnotherProcessHoldsTheLock) {
  OpenOrDie(Opts()).reset();
  int locked[2], release[2];
  ASSERT_EQ(pipe(locked), 0);
  ASSERT_EQ(pipe(release), 0);
  const std::string lock_path = path_ + "/LOCK";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only async-signal-safe calls after fork.
    close(release[1]);
    int fd = open(lock_path.c_str(), O_RDWR);
    struct flock fl = {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    char ok = (fd >= 0 && fcntl(fd, F_SETLK, &fl) == 0) ? '1' : '0';
    if (write(locked[1], &ok, 1) != 1) _exit(3);
    char c;
    if (read(release[0], &c, 1) < 0) _exit(4);
    _exit(0);
  }
  char ok = 0;
  ASSERT_EQ(read(locked[0], &ok, 1), 1);
  ASSERT_EQ(ok, '1');
  auto store = EmbeddedStore::Open(Opts());
  close(release[1]);
  int wstatus = 0;
  waitpid(child, &wstatus, 0);
  for (int fd : {locked[0], locked[1], release[0]}) close(fd);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(store.status().message().find("another idemgate process"), std::string::npos)
      << store.status().ToString();
  // Once that process is gone the path opens again.
  EXPECT_NE(OpenOrDie(Opts()), nullptr);
}

TEST_F(EmbeddedStoreTest, OpenFailsWhenThePathIsNotADirectory) {
  ASSERT_TRUE(testing::WriteFile(path_, "not a database").ok());
  auto store = EmbeddedStore::Open(Opts());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(store.status().message().find("not a directory"), std::string::npos)
      << store.status().ToString();

  auto o = Opts();
  o.path = path_ + "/below-a-file";
  store = EmbeddedStore::Open(o);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument) << store.status().ToString();
  EXPECT_NE(store.status().message().find(o.path), std::string::npos);
  EXPECT_NE(store.status().message().find("cannot be created: '" + path_ + "' is not a directory"),
            std::string::npos)
      << store.status().ToString();

  o.path = "";
  store = EmbeddedStore::Open(o);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument);
}

// Runs Open as a user without access to the directory (root would bypass the
// permission bits, so the child drops to nobody first).
TEST_F(EmbeddedStoreTest, OpenFailsWithoutPermission) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  fs::create_directories(path_);
  fs::permissions(dir_.path(), fs::perms::owner_all);
  fs::permissions(path_, fs::perms::none);
  const std::string path = DeathTestPath();
  EXPECT_EXIT(
      {
        InDeathTestChild();
        if (geteuid() == 0) {
          const passwd* nobody = getpwnam("nobody");
          if (!nobody || setgid(nobody->pw_gid) != 0 || setuid(nobody->pw_uid) != 0) std::_Exit(3);
        }
        auto o = Opts();
        o.path = path;
        auto store = EmbeddedStore::Open(o);
        std::cerr << store.status().ToString();
        std::_Exit(!store.ok() && store.status().code() == StatusCode::kFailedPrecondition ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "Permission denied");
  fs::permissions(path_, fs::perms::owner_all);
}

// A store directory that does not exist, in a directory the user cannot
// write: the error names that directory, not the store's, which was never
// made (as OpenFailsWithoutPermission, root drops to nobody first).
TEST_F(EmbeddedStoreTest, OpenNamesTheDirectoryTheStoreCannotBeCreatedIn) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string parent = dir_.Join("read-only");
  fs::create_directories(parent);
  fs::permissions(dir_.path(), fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                   fs::perms::others_read | fs::perms::others_exec);
  fs::permissions(parent, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                              fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  setenv(kDeathTestPathEnv, parent.c_str(), /*overwrite=*/0);
  const std::string in = getenv(kDeathTestPathEnv);
  EXPECT_EXIT(
      {
        if (in != parent) {
          std::error_code ec;
          fs::remove_all(dir_.path(), ec);
        }
        if (geteuid() == 0) {
          const passwd* nobody = getpwnam("nobody");
          if (!nobody || setgid(nobody->pw_gid) != 0 || setuid(nobody->pw_uid) != 0) std::_Exit(3);
        }
        auto o = Opts();
        o.path = in + "/store";
        auto store = EmbeddedStore::Open(o);
        std::cerr << store.status().ToString();
        std::_Exit(!store.ok() && store.status().code() == StatusCode::kFailedPrecondition ? 0 : 1);
      },
      ::testing::ExitedWithCode(0),
      "read-only/store': the store directory cannot be created in '[^']*/read-only': Permission denied");
  fs::permissions(parent, fs::perms::owner_all);
}

TEST_F(EmbeddedStoreTest, OpenFailsOnCorruptFiles) {
  OpenOrDie(Opts()).reset();
  int manifests = 0;
  for (const auto& e : fs::directory_iterator(path_)) {
    if (e.path().filename().string().rfind("MANIFEST-", 0) == 0) {
      ASSERT_TRUE(testing::WriteFile(e.path().string(), std::string(4096, '\x5a')).ok());
      ++manifests;
    }
  }
  ASSERT_GT(manifests, 0);
  auto store = EmbeddedStore::Open(Opts());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kInternal) << store.status().ToString();
  EXPECT_NE(store.status().message().find("corrupt"), std::string::npos);
  EXPECT_NE(store.status().message().find(path_), std::string::npos);

  ASSERT_TRUE(testing::WriteFile(path_ + "/CURRENT", "garbage").ok());
  store = EmbeddedStore::Open(Opts());
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find(path_), std::string::npos) << store.status().ToString();
}

// A directory with files but no CURRENT (a store that lost it, or anything
// else) is refused and left as it is: creating a store there would make
// RocksDB delete the data files it finds.
TEST_F(EmbeddedStoreTest, OpenRefusesANonEmptyDirectoryWithoutAStore) {
  {
    auto store = OpenOrDie(Opts());
    Put(*store, "k1", std::chrono::hours(1));
  }
  std::vector<std::string> before;
  for (const auto& e : fs::directory_iterator(path_)) before.push_back(e.path().filename().string());
  fs::remove(fs::path(path_) / "CURRENT");
  auto store = EmbeddedStore::Open(Opts());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition) << store.status().ToString();
  EXPECT_NE(store.status().message().find("no CURRENT file"), std::string::npos) << store.status().ToString();
  std::vector<std::string> after;
  for (const auto& e : fs::directory_iterator(path_)) after.push_back(e.path().filename().string());
  std::sort(before.begin(), before.end());
  std::sort(after.begin(), after.end());
  before.erase(std::remove(before.begin(), before.end(), "CURRENT"), before.end());
  EXPECT_EQ(after, before);
  // A foreign file alone is refused the same way; leftovers of a failed
  // first open (LOCK, LOG) are not in the way.
  const std::string other = dir_.Join("other");
  fs::create_directories(other);
  ASSERT_TRUE(testing::WriteFile(other + "/notes.txt", "mine").ok());
  auto o = Opts();
  o.path = other;
  EXPECT_EQ(EmbeddedStore::Open(o).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(fs::exists(other + "/notes.txt"));
  const std::string leftovers = dir_.Join("leftovers");
  fs::create_directories(leftovers);
  ASSERT_TRUE(testing::WriteFile(leftovers + "/LOCK", "").ok());
  ASSERT_TRUE(testing::WriteFile(leftovers + "/LOG", "").ok());
  o.path = leftovers;
  EXPECT_TRUE(EmbeddedStore::Open(o).ok());
}

TEST_F(EmbeddedStoreTest, OpenRefusesAnotherApplicationsRocksDb) {
  {
    rocksdb::Options o;
    o.create_if_missing = true;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(o, path_, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "theirs", "data").ok());
  }
  auto store = EmbeddedStore::Open(Opts());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(store.status().message().find("not an idemgate store"), std::string::npos)
      << store.status().ToString();
  // Nothing was added to it.
  std::vector<std::string> families;
  ASSERT_TRUE(rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), path_, &families).ok());
  EXPECT_EQ(families, std::vector<std::string>{rocksdb::kDefaultColumnFamilyName});
}

TEST_F(EmbeddedStoreTest, UndecodableRecordIsAnInternalError) {
  OpenOrDie(Opts()).reset();
  {
    // Write a broken value under a key, behind the store's back.
    std::vector<rocksdb::ColumnFamilyDescriptor> families = {
        {rocksdb::kDefaultColumnFamilyName, {}}, {"records", {}}, {"expiry", {}}};
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::DBOptions(), path_, families, &handles, &raw).ok());
    ASSERT_TRUE(raw->Put(rocksdb::WriteOptions(), handles[1], "broken", "\x01\x07junk").ok());
    for (auto* h : handles) ASSERT_TRUE(raw->DestroyColumnFamilyHandle(h).ok());
    delete raw;
  }
  auto store = OpenOrDie(Opts());
  ASSERT_NE(store, nullptr);
  auto got = Run(store->Get("broken", Now()));
  EXPECT_EQ(got.status().code(), StatusCode::kInternal);
  auto res = Run(store->Reserve("broken", Reservation("o", Fingerprint(1), Now()), Now()));
  EXPECT_EQ(res.status().code(), StatusCode::kInternal);
  // Purge still removes it, even when sparing what is in flight: its state is unknown.
  auto purged = Run(store->Purge("broken", core::PurgeMode::kUnlessInFlight, Now()));
  ASSERT_TRUE(purged.ok()) << purged.status().ToString();
  EXPECT_EQ(purged->outcome, core::PurgeOutcome::kPurged);
  EXPECT_FALSE(purged->state.has_value());
  EXPECT_FALSE(Get(*store, "broken").has_value());
}

TEST_F(EmbeddedStoreTest, RecordsInTheWrongStateAreRejected) {
  auto store = OpenOrDie(Opts());
  ASSERT_NE(store, nullptr);
  Record r = Reservation("o", Fingerprint(1), Now());
  auto res = Run(store->Reserve("k", Completion(r, Now(), 24h), Now()));
  EXPECT_EQ(res.status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(Run(store->Reserve("k", r, Now())).ok());
  EXPECT_EQ(Run(store->Complete("k", "o", r)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MustGet(*store, "k"), r);
}

// Every free file descriptor taken (a flood of idle connections under a low
// `ulimit -n`): RocksDB cannot open its next write-ahead log file, sets a
// background error that it rates fatal and never calls OnErrorRecoveryBegin
// for, and writes stop. Once descriptors are back the store resumes by itself.
TEST_F(EmbeddedStoreTest, WritesResumeByThemselvesAfterFileDescriptorsRanOut) {
  auto o = Opts();
  o.write_buffer_bytes = 256 << 10;  // a memtable switch (a new log file) every few dozen records
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  Put(*store, "before", 1h);

  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = std::min<rlim_t>(saved.rlim_cur, 4096);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> taken;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) taken.push_back(fd);
  Status failed;
  const std::string body(4096, 'x');
  for (int i = 0; i < 10'000 && failed.ok(); ++i) {
    const std::string key = "k" + std::to_string(i);
    Record r = Reservation("o", Fingerprint(1), Now());
    auto res = Run(store->Reserve(key, r, Now()));
    failed = res.ok() ? Run(store->Complete(key, "o", Completion(r, Now(), 1h, 200, body))) : res.status();
  }
  // Attempts to resume while descriptors are still short fail, and writes stay stopped.
  int pings_ok = 0;
  for (int i = 0; i < 4 && !failed.ok(); ++i) {
    std::this_thread::sleep_for(150ms);
    pings_ok += Run(store->Ping()).ok() ? 1 : 0;
  }
  for (int fd : taken) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_FALSE(failed.ok()) << "writes never failed while no file descriptor was free";
  EXPECT_EQ(failed.code(), StatusCode::kUnavailable) << failed.ToString();
  EXPECT_EQ(pings_ok, 0);

  // No restart: a ping (what /readyz does) succeeds again once the store resumed.
  EXPECT_TRUE(testing::PollUntil([&] { return Run(store->Ping()).ok(); }, 30s, 50ms));
  Record after = Put(*store, "after", 1h);
  EXPECT_TRUE(Get(*store, "before").has_value());
  store.reset();
  store = OpenOrDie(Opts());
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(Get(*store, "before").has_value());
  EXPECT_EQ(MustGet(*store, "after"), after);
}

// A file system whose volume can be made full: while `full`, every write to a
// file fails with ENOSPC (RocksDB's IOStatus::NoSpace), as on a full disk;
// with `wal_has_room` as well, writes to write-ahead logs (*.log) still succeed
// (on a real disk: the block at the log's end is allocated already).
class FullDiskFileSystem final : public rocksdb::FileSystemWrapper {
 public:
  FullDiskFileSystem() : rocksdb::FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  const char* Name() const override { return "FullDiskFileSystem"; }

  rocksdb::IOStatus NewWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->NewWritableFile(name, options, result, dbg);
    if (s.ok()) *result = std::make_unique<File>(std::move(*result), *this, name.ends_with(".log"));
    return s;
  }
  rocksdb::IOStatus ReopenWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                       std::unique_ptr<rocksdb::FSWritableFile>* result,
                                       rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->ReopenWritableFile(name, options, result, dbg);
    if (s.ok()) *result = std::make_unique<File>(std::move(*result), *this, name.ends_with(".log"));
    return s;
  }
  // RocksDB's own info logger (FileSystem's default: an EnvLogger on a file
  // from NewWritableFile), on this volume.
  rocksdb::IOStatus NewLogger(const std::string& name, const rocksdb::IOOptions& options,
                              std::shared_ptr<rocksdb::Logger>* result, rocksdb::IODebugContext* dbg) override {
    return rocksdb::FileSystem::NewLogger(name, options, result, dbg);
  }
  // Files RocksDB reuses (recycled logs) are not used by the store.

  std::atomic<bool> full{false};
  std::atomic<bool> wal_has_room{false};

 private:
  class File final : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(std::unique_ptr<rocksdb::FSWritableFile> file, const FullDiskFileSystem& disk, bool wal)
        : rocksdb::FSWritableFileOwnerWrapper(std::move(file)), disk_(disk), wal_(wal) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override {
      if (Full()) return rocksdb::IOStatus::NoSpace("FullDiskFileSystem: no space left on device");
      return target()->Append(data, options, dbg);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                             const rocksdb::DataVerificationInfo& info, rocksdb::IODebugContext* dbg) override {
      if (Full()) return rocksdb::IOStatus::NoSpace("FullDiskFileSystem: no space left on device");
      return target()->Append(data, options, info, dbg);
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset, const rocksdb::IOOptions& options,
                                       rocksdb::IODebugContext* dbg) override {
      if (Full()) return rocksdb::IOStatus::NoSpace("FullDiskFileSystem: no space left on device");
      return target()->PositionedAppend(data, offset, options, dbg);
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset, const rocksdb::IOOptions& options,
                                       const rocksdb::DataVerificationInfo& info,
                                       rocksdb::IODebugContext* dbg) override {
      if (Full()) return rocksdb::IOStatus::NoSpace("FullDiskFileSystem: no space left on device");
      return target()->PositionedAppend(data, offset, options, info, dbg);
    }

   private:
    bool Full() const { return disk_.full.load() && !(wal_ && disk_.wal_has_room.load()); }

    const FullDiskFileSystem& disk_;
    const bool wal_;
  };
};

// A full disk stops writes and nothing more: RocksDB's own info logger (its
// LOG file, written through a buffered file writer) aborted the process in
// Debian's RocksDB build (`Assertion 'sync_without_flush_called_' failed`) on
// the first line it logged after a write to LOG had failed, at the latest when
// the store closed. A failed flush writes a line to LOG and flushes it at once.
TEST_F(EmbeddedStoreTest, AFullDiskNeverAbortsAndWritesResumeOnceThereIsRoomAgain) {
  auto disk = std::make_shared<FullDiskFileSystem>();
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(disk);
  auto o = Opts();
  o.env = env.get();
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 50; ++i) Put(*store, "before" + std::to_string(i), 1h);

  // The memtable's flush fails first (the log still has room): RocksDB logs
  // the error and flushes its LOG at once.
  disk->full = true;
  disk->wal_has_room = true;
  EXPECT_FALSE(store->CompactAll().ok());
  disk->wal_has_room = false;
  Record r = Reservation("o", Fingerprint(1), Now());
  auto reserved = Run(store->Reserve("while-full", r, Now()));
  ASSERT_FALSE(reserved.ok());
  EXPECT_EQ(reserved.status().code(), StatusCode::kUnavailable) << reserved.status().ToString();
  EXPECT_FALSE(Run(store->Ping()).ok());
  EXPECT_TRUE(Get(*store, "before7").has_value());  // reads go on

  // Room again: the store resumes by itself, no restart needed.
  disk->full = false;
  EXPECT_TRUE(testing::PollUntil([&] { return Run(store->Ping()).ok(); }, 30s, 50ms));
  Record after = Put(*store, "after", 1h);

  // Closed while the disk is full (a SIGTERM then): no abort, and what was
  // acknowledged is there after a restart.
  disk->full = true;
  EXPECT_FALSE(Run(store->Reserve("while-full-again", r, Now())).ok());
  store.reset();
  disk->full = false;
  store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(MustGet(*store, "after"), after);
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(Get(*store, "before" + std::to_string(i)).has_value()) << i;
  EXPECT_FALSE(Get(*store, "while-full").has_value());
  EXPECT_FALSE(Get(*store, "while-full-again").has_value());
}

// A completion refused for a full disk is tried again while its lease lasts
// (Store::FailedWritesMayPass): once there is room it lands, so a retry is a
// replay, not a second run after the lease.
TEST_F(EmbeddedStoreTest, ACompletionRefusedForAFullDiskLandsOnceThereIsRoomAgain) {
  auto disk = std::make_shared<FullDiskFileSystem>();
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(disk);
  auto o = Opts();
  o.env = env.get();
  SystemClock clock;
  o.clock = &clock;
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  core::Engine engine{*store, clock};
  core::KeyedRequest request;
  request.key = "paid";
  request.fingerprint = Fingerprint(1);
  request.lease = 10s;
  const core::BeginResult begun = Run(engine.Begin(request));
  ASSERT_EQ(begun.outcome, core::BeginOutcome::kProceed) << begun.status.ToString();

  disk->full = true;
  core::StoredResponse response;
  response.status = 201;
  response.body = "made";
  std::thread room([&] {
    std::this_thread::sleep_for(300ms);
    disk->full = false;
  });
  // Runs the background attempts too, until one lands.
  const Status first = Run(engine.Complete(begun.reservation, response, 1h));
  room.join();
  EXPECT_FALSE(first.ok());
  auto held = Run(store->Get("paid", clock.NowMillis()));
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  ASSERT_TRUE(held->has_value());
  EXPECT_EQ((*held)->state, core::RecordState::kCompleted);
  EXPECT_EQ((*held)->response.body, "made");
}

// RocksDB's info log is written by the store (see InfoLog in the .cc): LOG
// holds this open's lines, and each open moves the previous LOG aside,
// keeping 3 files in all (RocksDB's keep_log_file_num).
TEST_F(EmbeddedStoreTest, TheInfoLogIsInLogWithTheNewestOldOnesKept) {
  for (int i = 0; i < 6; ++i) {
    auto store = OpenOrDie(Opts());
    ASSERT_NE(store, nullptr);
    Put(*store, "k" + std::to_string(i), 1h);
    std::this_thread::sleep_for(2ms);  // distinct LOG.old.<microseconds> names
  }
  int old = 0;
  for (const auto& e : fs::directory_iterator(path_)) {
    if (e.path().filename().string().starts_with("LOG.old.")) ++old;
  }
  EXPECT_EQ(old, 2);
  const std::string log = testing::ReadFileOrEmpty(path_ + "/LOG");
  EXPECT_NE(log.find("RocksDB version"), std::string::npos) << log.substr(0, 500);
  EXPECT_NE(log.find("Shutdown complete"), std::string::npos);
}

// After a full disk the store waits for room before it resumes: twice the
// write buffer, but never more than a quarter of the volume, so that a small
// volume (an 8 MiB tmpfs) resumes by itself too.
TEST(EmbeddedStoreResume, FreeSpaceNeededScalesDownOnSmallVolumes) {
  constexpr std::uint64_t kMiB = 1 << 20;
  EXPECT_EQ(EmbeddedStore::ResumeFreeBytes(16 * kMiB, 100'000 * kMiB), 32 * kMiB);
  EXPECT_EQ(EmbeddedStore::ResumeFreeBytes(64 * kMiB, 100'000 * kMiB), 128 * kMiB);
  EXPECT_EQ(EmbeddedStore::ResumeFreeBytes(1 * kMiB, 100'000 * kMiB), 16 * kMiB);
  EXPECT_EQ(EmbeddedStore::ResumeFreeBytes(16 * kMiB, 128 * kMiB), 32 * kMiB);
  EXPECT_EQ(EmbeddedStore::ResumeFreeBytes(16 * kMiB, 48 * kMiB), 12 * kMiB);
  EXPECT_EQ(EmbeddedStore::ResumeFreeBytes(16 * kMiB, 8 * kMiB), 2 * kMiB);
}

// A store whose directory is removed or moved away while it runs keeps
// writing to files that are gone from store.path: its ping (/readyz) fails
// and it takes no new reservations, saying why; reads go on, and once the
// directory is back everything works again.
TEST_F(EmbeddedStoreTest, ADirectoryMovedAwayWhileOpenFailsPingsAndReservations) {
  auto store = OpenOrDie(Opts());
  ASSERT_NE(store, nullptr);
  Put(*store, "before", 1h);
  ASSERT_TRUE(Run(store->Ping()).ok());

  const std::string moved = path_ + ".moved";
  fs::rename(path_, moved);
  Status ping = Run(store->Ping());
  EXPECT_EQ(ping.code(), StatusCode::kUnavailable) << ping.ToString();
  EXPECT_NE(ping.message().find("removed, renamed or replaced"), std::string::npos) << ping.ToString();
  auto reserved = Run(store->Reserve("new", Reservation("o", Fingerprint(1), Now()), Now()));
  ASSERT_FALSE(reserved.ok());
  EXPECT_EQ(reserved.status().code(), StatusCode::kUnavailable) << reserved.status().ToString();
  EXPECT_TRUE(Get(*store, "before").has_value());
  // A new, empty directory at the path is not the store's either.
  fs::create_directory(path_);
  EXPECT_FALSE(Run(store->Ping()).ok());
  fs::remove(path_);

  fs::rename(moved, path_);
  EXPECT_TRUE(Run(store->Ping()).ok());
  Put(*store, "after", 1h);
}

TEST_F(EmbeddedStoreTest, ADirectoryRemovedWhileOpenStopsReservationsWithoutAPing) {
  auto store = OpenOrDie(Opts());
  ASSERT_NE(store, nullptr);
  Put(*store, "before", 1h);
  fs::remove_all(path_);
  // The committer notices by itself (it looks at least once a second).
  int n = 0;
  Status failed;
  EXPECT_TRUE(testing::PollUntil(
      [&] {
        auto r = Run(store->Reserve("k" + std::to_string(n++), Reservation("o", Fingerprint(1), Now()), Now()));
        failed = r.ok() ? Status::Ok() : r.status();
        return !r.ok();
      },
      10s, 50ms));
  EXPECT_EQ(failed.code(), StatusCode::kUnavailable) << failed.ToString();
  EXPECT_NE(failed.message().find("removed, renamed or replaced"), std::string::npos) << failed.ToString();
  EXPECT_FALSE(Run(store->Ping()).ok());
  store.reset();  // closes without a crash
}

TEST_F(EmbeddedStoreTest, SweepDeletesOnlyCompletedRecordsPastRetention) {
  auto store = OpenOrDie(Opts());
  ASSERT_NE(store, nullptr);
  Put(*store, "short", 1s);
  Record longer = Put(*store, "long", 10s);
  Record forever = Put(*store, "forever", 0ms);
  Record flight = Reservation("o", Fingerprint(1), Now(), 1s);
  ASSERT_TRUE(Run(store->Reserve("flight", flight, Now())).ok());
  // A stale expiry entry: completed with 1 s retention, purged, reserved again.
  Put(*store, "stale", 1s);
  ASSERT_TRUE(Run(store->Purge("stale", core::PurgeMode::kAny, Now())).ok());
  Record again = Reservation("o2", Fingerprint(2), Now(), 1h);
  ASSERT_TRUE(Run(store->Reserve("stale", again, Now())).ok());

  auto swept = store->SweepExpired(Now(), 100);
  ASSERT_TRUE(swept.ok());
  EXPECT_EQ(swept->index_entries, 0u);

  clock_.Advance(2s);
  swept = store->SweepExpired(Now(), 100);
  ASSERT_TRUE(swept.ok()) << swept.status().ToString();
  EXPECT_EQ(swept->index_entries, 2u);  // "short" and the stale entry of "stale"
  EXPECT_EQ(swept->deleted, 1u);
  EXPECT_EQ(*store->CountRecords(), 4u);
  EXPECT_EQ(MustGet(*store, "long"), longer);
  EXPECT_EQ(MustGet(*store, "forever"), forever);
  EXPECT_EQ(MustGet(*store, "flight"), flight);
  EXPECT_EQ(MustGet(*store, "stale"), again);

  clock_.Advance(10s);
  swept = store->SweepExpired(Now(), 100);
  ASSERT_TRUE(swept.ok());
  EXPECT_EQ(swept->deleted, 1u);
  EXPECT_EQ(*store->CountRecords(), 3u);
  EXPECT_FALSE(Get(*store, "long").has_value());
}

TEST_F(EmbeddedStoreTest, SweepConsumesAtMostMaxEntries) {
  auto store = OpenOrDie(Opts());
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 10; ++i) Put(*store, "k" + std::to_string(i), 1s);
  clock_.Advance(1s);
  std::size_t total = 0;
  for (int round = 0; round < 3; ++round) {
    auto swept = store->SweepExpired(Now(), 4);
    ASSERT_TRUE(swept.ok());
    EXPECT_EQ(swept->index_entries, round < 2 ? 4u : 2u);
    total += swept->deleted;
  }
  EXPECT_EQ(total, 10u);
  EXPECT_EQ(*store->CountRecords(), 0u);
}

TEST_F(EmbeddedStoreTest, CompactionDropsExpiredRecordsEvenWithoutASweep) {
  auto store = OpenOrDie(Opts());
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 100; ++i) Put(*store, "k" + std::to_string(i), i < 60 ? 1s : 1h);
  ASSERT_TRUE(store->CompactAll().ok());
  EXPECT_EQ(*store->CountRecords(), 100u);
  clock_.Advance(1s);
  ASSERT_TRUE(store->CompactAll().ok());
  EXPECT_EQ(*store->CountRecords(), 40u);
  // The expiry entries left behind are consumed without touching live records.
  auto swept = store->SweepExpired(Now(), 1000);
  ASSERT_TRUE(swept.ok());
  EXPECT_EQ(swept->index_entries, 60u);
  EXPECT_EQ(swept->deleted, 0u);
  EXPECT_EQ(*store->CountRecords(), 40u);
}

TEST_F(EmbeddedStoreTest, BackgroundSweeperDeletesExpiredRecords) {
  auto o = Opts();
  o.sweep_interval = 5ms;
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 20; ++i) Put(*store, "k" + std::to_string(i), i < 15 ? 1s : 0ms);
  clock_.Advance(1s);
  EXPECT_TRUE(testing::PollUntil([&] { return *store->CountRecords() == 5; }, 20s));
  EXPECT_EQ(*store->CountRecords(), 5u);
}

// A backlog larger than one sweep_batch (expiring writes faster than a batch
// per interval) is worked through in batches that follow each other soon,
// not one batch per sweep_interval: 2 000 entries in batches of 10 would take
// 200 intervals.
TEST_F(EmbeddedStoreTest, BackgroundSweeperWorksThroughABacklogWithoutWaitingAnIntervalPerBatch) {
  auto o = Opts();
  o.sweep_interval = 1s;
  o.sweep_batch = 10;
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 2000; ++i) Put(*store, "k" + std::to_string(i), 1s);
  clock_.Advance(1s);
  EXPECT_TRUE(testing::PollUntil([&] { return *store->CountRecords() == 0; }, 30s, 50ms));
  EXPECT_EQ(*store->CountRecords(), 0u);
}

TEST_F(EmbeddedStoreTest, StatsReportKeysAndBytes) {
  auto store = OpenOrDie(Opts());
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 1000; ++i) Put(*store, "k" + std::to_string(i), 1s, std::string(100, 'x'));
  ASSERT_TRUE(store->CompactAll().ok());
  core::StoreStats stats = store->Stats();
  EXPECT_GE(stats.keys, 900u);
  EXPECT_LE(stats.keys, 1100u);
  EXPECT_GT(stats.bytes, 0u);
  clock_.Advance(1s);
  while (store->SweepExpired(Now(), 1000)->index_entries > 0) {
  }
  ASSERT_TRUE(store->CompactAll().ok());
  EXPECT_EQ(store->Stats().keys, 0u);
}

// Expiry keeps the disk bounded: many short-lived records, then time passes,
// the sweeper deletes them and compaction gives the space back.
TEST_F(EmbeddedStoreTest, ExpiredRecordsLeaveTheDisk) {
  constexpr int kRecords = 200'000;
  auto store = OpenOrDie(Opts());
  ASSERT_NE(store, nullptr);
  // Written from two threads (each with its own io_context) to use both cores.
  std::atomic<int> failures{0};
  const Record reservation = Reservation("o", Fingerprint(1), Now());
  auto writer = [&](int first) {
    boost::asio::io_context io;
    std::mt19937_64 rng(static_cast<std::uint64_t>(first) + 1);
    std::string body(120, '\0');
    RunOn(io, [&]() -> core::Task<void> {
      for (int i = first; i < kRecords; i += 2) {
        const std::string key = "t-a:b:c:route:" + std::to_string(i);
        for (std::size_t at = 0; at + 8 <= body.size(); at += 8) {
          const std::uint64_t word = rng();
          std::memcpy(body.data() + at, &word, 8);
        }
        auto res = co_await store->Reserve(key, reservation, Now());
        Status s =
            co_await store->Complete(key, "o", Completion(reservation, Now(), 1s, 200, body));
        if (!res.ok() || !s.ok()) failures.fetch_add(1);
      }
    }());
  };
  std::thread other(writer, 1);
  writer(0);
  other.join();
  ASSERT_EQ(failures.load(), 0);
  ASSERT_TRUE(store->CompactAll().ok());
  const std::uint64_t keys_before = store->Stats().keys;
  const std::uint64_t bytes_before = DirBytes(path_);
  EXPECT_GE(keys_before, kRecords * 9u / 10);

  clock_.Advance(1s);
  std::size_t deleted = 0;
  for (;;) {
    auto swept = store->SweepExpired(Now(), 50'000);
    ASSERT_TRUE(swept.ok()) << swept.status().ToString();
    deleted += swept->deleted;
    if (swept->index_entries < 50'000) break;
  }
  EXPECT_EQ(deleted, static_cast<std::size_t>(kRecords));
  ASSERT_TRUE(store->CompactAll().ok());
  const std::uint64_t keys_after = store->Stats().keys;
  const std::uint64_t bytes_after = DirBytes(path_);
  std::cout << "records " << kRecords << ": keys " << keys_before << " -> " << keys_after
            << ", bytes on disk " << bytes_before << " -> " << bytes_after << "\n";
  EXPECT_LE(keys_after, kRecords / 1000u);
  EXPECT_EQ(*store->CountRecords(), 0u);
  EXPECT_LT(bytes_after, bytes_before);
}

}  // namespace
}  // namespace idemgate::store::embedded
