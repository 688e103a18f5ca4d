#include "client/client.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fakes/testing.h"

namespace idemgate::client {
namespace {

using idemgate::testing::TempDir;

std::int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::unique_ptr<DeadLetterQueue> OpenOrDie(const std::string& path) {
  auto dlq = DeadLetterQueue::Open(path);
  EXPECT_TRUE(dlq.ok()) << dlq.status().ToString();
  return dlq.ok() ? std::move(*dlq) : nullptr;
}

// The queue's entries (List), checking that it skipped no row.
StatusOr<std::vector<DeadLetter>> Entries(const DeadLetterQueue& dlq,
                                          std::optional<EntryStatus> status = std::nullopt) {
  auto listing = dlq.List(status);
  if (!listing.ok()) return listing.status();
  EXPECT_TRUE(listing->unreadable.empty()) << listing->unreadable.front().error;
  return std::move(listing->entries);
}

Request SampleRequest(std::string key = "key-1") {
  Request request;
  request.method = "PUT";
  request.url = "http://billing.internal:8080/v1/invoices/7?dry=0";
  request.headers = {{"Content-Type", "application/octet-stream"},
                     {"X-Trace", "t\"1\\"},
                     {"X-Trace", "second value"},
                     {"X-Unicode", "caf\xc3\xa9"},
                     {"X-Bytes", "\xff\xfe"}};
  request.body = std::string("\0bin\0ary\xff\0", 10);
  request.key = std::move(key);
  request.key_header = "X-Idempotency-Key";
  return request;
}

// Runs `sql` on the file directly, as another program could.
void RawExec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  const std::string message = error != nullptr ? error : "";
  sqlite3_free(error);
  sqlite3_close(db);
  ASSERT_EQ(rc, SQLITE_OK) << message;
}

// The first column of the first row `sql` gives on the database at `path`,
// read without the DLQ code; "" when there is none.
std::string RawSingle(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  std::string out;
  if (sqlite3_open(path.c_str(), &db) == SQLITE_OK) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr) == SQLITE_OK && sqlite3_step(stmt) == SQLITE_ROW) {
      out = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    }
    sqlite3_finalize(stmt);
  }
  sqlite3_close(db);
  return out;
}

TEST(EntryStatusTest, NamesRoundTrip) {
  for (EntryStatus s : {EntryStatus::kPending, EntryStatus::kReplaying, EntryStatus::kReplayed,
                        EntryStatus::kDiscarded}) {
    EXPECT_EQ(EntryStatusFromName(EntryStatusName(s)), s);
  }
  EXPECT_EQ(EntryStatusName(EntryStatus::kPending), "pending");
  EXPECT_EQ(EntryStatusName(EntryStatus::kReplaying), "replaying");
  EXPECT_EQ(EntryStatusName(EntryStatus::kReplayed), "replayed");
  EXPECT_EQ(EntryStatusName(EntryStatus::kDiscarded), "discarded");
  EXPECT_EQ(EntryStatusFromName("Pending"), std::nullopt);
  EXPECT_EQ(EntryStatusFromName(""), std::nullopt);
}

class DlqTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.Join("dlq.sqlite");
    dlq_ = OpenOrDie(path_);
    ASSERT_NE(dlq_, nullptr);
  }

  std::int64_t ParkOrDie(const Request& request, std::string_view error = "503 Service Unavailable",
                         int attempts = 3, int last_status = 503) {
    auto id = dlq_->Park(request, error, attempts, last_status);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : -1;
  }

  TempDir dir_;
  std::string path_;
  std::unique_ptr<DeadLetterQueue> dlq_;
};

TEST_F(DlqTest, ParkGetListRoundTripEveryField) {
  const Request request = SampleRequest();
  const std::int64_t before = NowMs();
  const std::int64_t id = ParkOrDie(request, "connection refused by host:1", 3, 0);
  const std::int64_t after = NowMs();
  ASSERT_GT(id, 0);

  auto check = [&](const DeadLetter& e, bool with_body) {
    EXPECT_EQ(e.id, id);
    EXPECT_EQ(e.request.method, "PUT");
    EXPECT_EQ(e.request.url, request.url);
    EXPECT_EQ(e.request.headers, request.headers);
    EXPECT_EQ(e.request.body, with_body ? request.body : "");  // List leaves bodies out
    EXPECT_EQ(e.request.body.size(), with_body ? 10u : 0u);
    EXPECT_EQ(e.request.key, "key-1");
    EXPECT_EQ(e.request.key_header, "X-Idempotency-Key");
    EXPECT_EQ(e.error, "connection refused by host:1");
    EXPECT_EQ(e.attempts, 3);
    EXPECT_EQ(e.last_status, 0);
    EXPECT_GE(e.created_unix_ms, before);
    EXPECT_LE(e.created_unix_ms, after);
    EXPECT_EQ(e.last_attempt_unix_ms, e.created_unix_ms);
    EXPECT_EQ(e.status, EntryStatus::kPending);
  };
  const auto got = dlq_->Get(id);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  check(*got, true);
  const auto listed = Entries(*dlq_);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), 1u);
  check(listed->front(), false);
}

// A listing prints no body: List does not read them (a queue of large
// bodies is listed without holding them all), yet checks the body column's
// type as Get does.
TEST_F(DlqTest, ListReadsNoBodiesButChecksTheirType) {
  Request request = SampleRequest();
  request.body = std::string(4 * 1024 * 1024, 'b');
  for (int i = 1; i <= 3; ++i) {
    request.key = "big-" + std::to_string(i);
    ASSERT_EQ(ParkOrDie(request), i);
  }
  RawExec(path_, "UPDATE dead_letters SET body = 'as text' WHERE id = 2");
  for (const auto access : {DeadLetterQueue::Access::kExisting, DeadLetterQueue::Access::kRead}) {
    auto dlq = DeadLetterQueue::Open(path_, access);
    ASSERT_TRUE(dlq.ok()) << dlq.status().ToString();
    const auto listing = (*dlq)->List();
    ASSERT_TRUE(listing.ok()) << listing.status().ToString();
    ASSERT_EQ(listing->entries.size(), 3u);
    for (const DeadLetter& e : listing->entries) {
      EXPECT_EQ(e.request.body, "") << e.id;
      EXPECT_EQ(e.request.key, "big-" + std::to_string(e.id));
      EXPECT_EQ(e.request.headers, request.headers);
    }
    EXPECT_TRUE(listing->unreadable.empty());
    EXPECT_EQ((*dlq)->Get(1)->request.body.size(), request.body.size());
    EXPECT_EQ((*dlq)->Get(2)->request.body, "as text");
  }
  // A body of another type is named, as Get names it.
  RawExec(path_, "UPDATE dead_letters SET body = 7 WHERE id = 1; UPDATE dead_letters SET body = 1.5 WHERE id = 3");
  const auto listing = dlq_->List();
  ASSERT_TRUE(listing.ok()) << listing.status().ToString();
  ASSERT_EQ(listing->unreadable.size(), 2u);
  EXPECT_EQ(listing->unreadable[0].error, "dead letter 1 cannot be read: column body is an integer, not a blob");
  EXPECT_EQ(listing->unreadable[0].error, dlq_->Get(1).status().message());
  EXPECT_EQ(listing->unreadable[1].error, "dead letter 3 cannot be read: column body is a real number, not a blob");
  EXPECT_EQ(listing->unreadable[1].error, dlq_->Get(3).status().message());
}

TEST_F(DlqTest, EmptyBodyAndNoHeaders) {
  Request request;
  request.url = "http://h/";
  request.key = "k";
  const std::int64_t id = ParkOrDie(request, "", 1, 400);
  const auto got = dlq_->Get(id);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->request.body, "");
  EXPECT_TRUE(got->request.headers.empty());
  EXPECT_EQ(got->request.method, "POST");
  EXPECT_EQ(got->request.key_header, "Idempotency-Key");
  EXPECT_EQ(got->error, "");
}

TEST_F(DlqTest, ParkNeedsAKey) {
  const auto id = dlq_->Park(SampleRequest(""), "x", 1, 500);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Entries(*dlq_)->empty());
}

TEST_F(DlqTest, ValuesAreBoundNotSpliced) {
  Request request = SampleRequest("k'); DROP TABLE dead_letters; --");
  request.url = "http://h/'\"";
  const std::int64_t id = ParkOrDie(request, "'; DELETE FROM dead_letters; --");
  const auto got = dlq_->Get(id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->request.key, request.key);
  EXPECT_EQ(got->request.url, request.url);
  EXPECT_EQ(got->error, "'; DELETE FROM dead_letters; --");
  EXPECT_EQ(Entries(*dlq_)->size(), 1u);
}

TEST_F(DlqTest, ListIsOldestFirstAndFiltersByStatus) {
  const std::int64_t a = ParkOrDie(SampleRequest("a"));
  const std::int64_t b = ParkOrDie(SampleRequest("b"));
  const std::int64_t c = ParkOrDie(SampleRequest("c"));
  const std::int64_t d = ParkOrDie(SampleRequest("d"));
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
  EXPECT_LT(c, d);
  ASSERT_TRUE(dlq_->Discard(b).ok());
  ASSERT_TRUE(dlq_->ClaimForReplay(c).ok());
  ASSERT_TRUE(dlq_->ClaimForReplay(d).ok());
  ASSERT_TRUE(dlq_->FinishReplay(d, true, "", 1, 200).ok());

  auto ids = [&](std::optional<EntryStatus> status) {
    std::vector<std::int64_t> out;
    const auto list = Entries(*dlq_, status);
    EXPECT_TRUE(list.ok()) << list.status().ToString();
    if (list.ok()) {
      for (const auto& e : *list) out.push_back(e.id);
    }
    return out;
  };
  EXPECT_EQ(ids(std::nullopt), (std::vector<std::int64_t>{a, b, c, d}));
  EXPECT_EQ(ids(EntryStatus::kPending), (std::vector<std::int64_t>{a}));
  EXPECT_EQ(ids(EntryStatus::kDiscarded), (std::vector<std::int64_t>{b}));
  EXPECT_EQ(ids(EntryStatus::kReplaying), (std::vector<std::int64_t>{c}));
  EXPECT_EQ(ids(EntryStatus::kReplayed), (std::vector<std::int64_t>{d}));
}

TEST_F(DlqTest, ClaimTwiceFailsTheSecondTime) {
  const std::int64_t id = ParkOrDie(SampleRequest());
  const auto first = dlq_->ClaimForReplay(id);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->status, EntryStatus::kReplaying);
  EXPECT_EQ(first->request.key, "key-1");
  EXPECT_EQ(first->request.body, SampleRequest().body);
  const auto second = dlq_->ClaimForReplay(id);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("replaying"), std::string::npos) << second.status().message();
  EXPECT_EQ(dlq_->Get(id)->status, EntryStatus::kReplaying);
}

TEST_F(DlqTest, FinishReplaySuccessMarksReplayed) {
  const std::int64_t id = ParkOrDie(SampleRequest(), "503 Service Unavailable", 3, 503);
  const std::int64_t parked_at = dlq_->Get(id)->last_attempt_unix_ms;
  ASSERT_TRUE(dlq_->ClaimForReplay(id).ok());
  ASSERT_TRUE(dlq_->FinishReplay(id, true, "", 2, 201).ok());
  const auto e = dlq_->Get(id);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->status, EntryStatus::kReplayed);
  EXPECT_EQ(e->attempts, 5);
  EXPECT_EQ(e->last_status, 201);
  EXPECT_EQ(e->error, "");
  EXPECT_GE(e->last_attempt_unix_ms, parked_at);
  // Finished entries cannot be finished, claimed or discarded again.
  EXPECT_EQ(dlq_->FinishReplay(id, true, "", 1, 200).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(dlq_->ClaimForReplay(id).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(dlq_->Discard(id).code(), StatusCode::kFailedPrecondition);
}

TEST_F(DlqTest, FinishReplayFailureGoesBackToPendingWithAttemptsAdded) {
  const std::int64_t id = ParkOrDie(SampleRequest(), "503 Service Unavailable", 3, 503);
  ASSERT_TRUE(dlq_->ClaimForReplay(id).ok());
  ASSERT_TRUE(dlq_->FinishReplay(id, false, "connection refused by x:1", 3, 0).ok());
  const auto e = dlq_->Get(id);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->status, EntryStatus::kPending);
  EXPECT_EQ(e->attempts, 6);
  EXPECT_EQ(e->last_status, 0);
  EXPECT_EQ(e->error, "connection refused by x:1");
  EXPECT_EQ(e->request.key, "key-1");
  // Pending again: claimable again.
  EXPECT_TRUE(dlq_->ClaimForReplay(id).ok());
}

// Claims `id` in a child process that then exits: a replay cut short.
void ClaimInAProcessThatDies(const std::string& path, std::int64_t id) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto q = DeadLetterQueue::Open(path);
    ::_exit(q.ok() && (*q)->ClaimForReplay(id, std::chrono::hours(1)).ok() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST_F(DlqTest, ReleaseGivesBackAReplayCutShort) {
  const std::int64_t id = ParkOrDie(SampleRequest());
  // Only a replaying entry can be released.
  EXPECT_EQ(dlq_->Release(id).code(), StatusCode::kFailedPrecondition);
  // The replaying process died; the entry would stay replaying for good.
  ClaimInAProcessThatDies(path_, id);
  const auto claimed = dlq_->Get(id);
  ASSERT_TRUE(claimed.ok() && claimed->claim.has_value());
  EXPECT_NE(claimed->claim->pid, ::getpid());
  ASSERT_TRUE(dlq_->Release(id).ok());
  EXPECT_EQ(dlq_->Get(id)->status, EntryStatus::kPending);
  EXPECT_FALSE(dlq_->Get(id)->claim.has_value());
  EXPECT_TRUE(dlq_->ClaimForReplay(id).ok());
  EXPECT_EQ(dlq_->Release(424242).code(), StatusCode::kNotFound);
}

// Releasing an entry whose replay is still running would let a second replay
// run beside it: refused while the claiming process lives, unless forced.
TEST_F(DlqTest, ReleaseIsRefusedWhileTheReplayingProcessLives) {
  const std::int64_t id = ParkOrDie(SampleRequest());
  const auto claimed = dlq_->ClaimForReplay(id, std::chrono::seconds(30));
  ASSERT_TRUE(claimed.ok());
  ASSERT_TRUE(claimed->claim.has_value());
  EXPECT_EQ(claimed->claim->pid, ::getpid());
  EXPECT_FALSE(claimed->claim->token.empty());
  EXPECT_FALSE(claimed->claim->host.empty());
  EXPECT_GE(claimed->claim->until_unix_ms, claimed->claim->claimed_unix_ms + 30'000);
  auto other = OpenOrDie(path_);
  const Status refused = other->Release(id);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("still running"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find(std::to_string(::getpid())), std::string::npos) << refused.message();
  EXPECT_EQ(dlq_->Get(id)->status, EntryStatus::kReplaying);
  // Forced, the entry is pending again; the first replay's late result is
  // then not recorded, neither over the pending entry nor over a new claim.
  ASSERT_TRUE(other->Release(id, true).ok());
  ASSERT_TRUE(other->ClaimForReplay(id).ok());
  const Status late = dlq_->FinishReplay(id, true, "", 1, 200);
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(late.message().find("not recorded"), std::string::npos) << late.message();
  EXPECT_EQ(dlq_->Get(id)->status, EntryStatus::kReplaying);
  EXPECT_EQ(dlq_->Get(id)->attempts, 3);
  ASSERT_TRUE(other->FinishReplay(id, false, "503", 2, 503).ok());
  EXPECT_EQ(dlq_->Get(id)->status, EntryStatus::kPending);
  EXPECT_EQ(dlq_->Get(id)->attempts, 5);
}

// A claim made on another host cannot be checked from here: it is held until
// the replay's longest run is over.
TEST_F(DlqTest, AClaimFromAnotherHostIsHeldUntilItsReplayCanHaveEnded) {
  const std::int64_t id = ParkOrDie(SampleRequest());
  ASSERT_TRUE(dlq_->ClaimForReplay(id).ok());
  RawExec(path_, "UPDATE dead_letters SET claim_host = 'elsewhere.invalid', claim_pid = 1, claim_until_unix_ms = " +
                     std::to_string(NowMs() + 60'000));
  const Status refused = dlq_->Release(id);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("elsewhere.invalid"), std::string::npos) << refused.message();
  RawExec(path_, "UPDATE dead_letters SET claim_until_unix_ms = " + std::to_string(NowMs() - 1));
  EXPECT_TRUE(dlq_->Release(id).ok());
}

// A queue as idemctl wrote it before claims were recorded (schema 1), with
// one entry left replaying.
constexpr const char* kVersion1Queue = R"sql(
CREATE TABLE dead_letters (
  id INTEGER PRIMARY KEY AUTOINCREMENT, method TEXT NOT NULL, url TEXT NOT NULL, headers TEXT NOT NULL,
  body BLOB NOT NULL, "key" TEXT NOT NULL, key_header TEXT NOT NULL, error TEXT NOT NULL,
  attempts INTEGER NOT NULL, last_status INTEGER NOT NULL, last_attempt_unix_ms INTEGER NOT NULL,
  created_unix_ms INTEGER NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('pending', 'replaying', 'replayed', 'discarded')));
CREATE INDEX dead_letters_status ON dead_letters (status, id);
INSERT INTO dead_letters (method, url, headers, body, "key", key_header, error, attempts, last_status,
  last_attempt_unix_ms, created_unix_ms, status)
  VALUES ('POST', 'http://h/x', '[]', x'', 'k1', 'Idempotency-Key', 'e', 1, 503, 1, 1, 'replaying');
PRAGMA user_version = 1;
)sql";

// A queue written before claims were recorded (schema 1) is migrated; an
// entry it left replaying has no claim and can be released.
TEST(DlqMigrationTest, AVersion1QueueIsMigrated) {
  TempDir dir;
  const std::string path = dir.Join("v1.sqlite");
  RawExec(path, kVersion1Queue);
  auto dlq = OpenOrDie(path);
  ASSERT_NE(dlq, nullptr);
  const auto e = dlq->Get(1);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->status, EntryStatus::kReplaying);
  EXPECT_FALSE(e->claim.has_value());
  EXPECT_TRUE(dlq->Release(1).ok());
  EXPECT_TRUE(dlq->ClaimForReplay(1)->claim.has_value());
}

// How long a replay may run, given by a library user: an enormous one does
// not overflow the claim's end into the past.
TEST_F(DlqTest, AClaimForAnEndlessReplayEndsAtTheEndOfTime) {
  const std::int64_t a = ParkOrDie(SampleRequest("a"));
  const std::int64_t b = ParkOrDie(SampleRequest("b"));
  const auto endless = dlq_->ClaimForReplay(a, Millis::max());
  ASSERT_TRUE(endless.ok()) << endless.status().ToString();
  ASSERT_TRUE(endless->claim.has_value());
  EXPECT_EQ(endless->claim->until_unix_ms, std::numeric_limits<std::int64_t>::max());
  const auto negative = dlq_->ClaimForReplay(b, Millis::min());
  ASSERT_TRUE(negative.ok()) << negative.status().ToString();
  EXPECT_EQ(negative->claim->until_unix_ms, 0);  // unknown
}

TEST_F(DlqTest, FinishReplayNeedsAClaim) {
  const std::int64_t id = ParkOrDie(SampleRequest());
  const Status s = dlq_->FinishReplay(id, true, "", 1, 200);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("pending"), std::string::npos) << s.message();
  EXPECT_EQ(dlq_->Get(id)->status, EntryStatus::kPending);
  EXPECT_EQ(dlq_->Get(id)->attempts, 3);
}

TEST_F(DlqTest, DiscardOnlyFromPending) {
  const std::int64_t pending = ParkOrDie(SampleRequest("p"));
  const std::int64_t replaying = ParkOrDie(SampleRequest("r"));
  ASSERT_TRUE(dlq_->ClaimForReplay(replaying).ok());

  EXPECT_TRUE(dlq_->Discard(pending).ok());
  EXPECT_EQ(dlq_->Get(pending)->status, EntryStatus::kDiscarded);
  const Status twice = dlq_->Discard(pending);
  EXPECT_EQ(twice.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(twice.message().find("discarded"), std::string::npos) << twice.message();
  const Status busy = dlq_->Discard(replaying);
  EXPECT_EQ(busy.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(busy.message().find("replaying"), std::string::npos) << busy.message();
  EXPECT_EQ(dlq_->Get(replaying)->status, EntryStatus::kReplaying);
  EXPECT_EQ(dlq_->ClaimForReplay(pending).status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(DlqTest, UnknownIdsAreNotFound) {
  ParkOrDie(SampleRequest());
  EXPECT_EQ(dlq_->Get(999).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(dlq_->ClaimForReplay(999).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(dlq_->FinishReplay(999, true, "", 1, 200).code(), StatusCode::kNotFound);
  EXPECT_EQ(dlq_->Discard(999).code(), StatusCode::kNotFound);
  EXPECT_EQ(dlq_->Get(-1).status().code(), StatusCode::kNotFound);
}

TEST_F(DlqTest, ReopeningKeepsEntries) {
  const std::int64_t a = ParkOrDie(SampleRequest("a"));
  const std::int64_t b = ParkOrDie(SampleRequest("b"));
  ASSERT_TRUE(dlq_->Discard(a).ok());
  dlq_.reset();

  auto reopened = OpenOrDie(path_);
  ASSERT_NE(reopened, nullptr);
  const auto list = Entries(*reopened);
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].id, a);
  EXPECT_EQ((*list)[0].status, EntryStatus::kDiscarded);
  EXPECT_EQ((*list)[1].id, b);
  EXPECT_EQ((*list)[1].request.headers, SampleRequest().headers);
  EXPECT_EQ(reopened->Get(b)->request.body, SampleRequest().body);  // List leaves bodies out
  // Ids are never reused, even after the newest row is gone.
  RawExec(path_, "DELETE FROM dead_letters WHERE id = " + std::to_string(b));
  const auto c = reopened->Park(SampleRequest("c"), "e", 1, 500);
  ASSERT_TRUE(c.ok());
  EXPECT_GT(*c, b);
}

TEST_F(DlqTest, UsesWalAndRecordsTheSchemaVersion) {
  EXPECT_EQ(RawSingle(path_, "PRAGMA journal_mode"), "wal");
  EXPECT_EQ(RawSingle(path_, "PRAGMA user_version"), "2");
}

TEST_F(DlqTest, RefusesAFutureSchemaVersion) {
  dlq_.reset();
  RawExec(path_, "PRAGMA user_version = 3");
  const auto opened = DeadLetterQueue::Open(path_);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(opened.status().message().find("3"), std::string::npos) << opened.status().message();
}

// Several processes creating one new queue at the same moment (idemctl
// runs in parallel from a script): switching the new file to WAL is answered
// SQLITE_BUSY at once, without the busy handler, for the losers of the race.
// Each must still open it and park its request.
TEST(DlqOpenTest, ManyProcessesOpeningANewFileAllSucceed) {
  TempDir dir;
  constexpr int kProcesses = 24;
  for (int round = 0; round < 10; ++round) {
    const std::string path = dir.Join("new-" + std::to_string(round) + ".sqlite");
    int go[2];
    ASSERT_EQ(::pipe(go), 0);
    std::vector<pid_t> children;
    for (int i = 0; i < kProcesses; ++i) {
      const pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        ::close(go[1]);
        char c;
        (void)::read(go[0], &c, 1);  // returns at EOF: when the parent closes its end
        auto opened = DeadLetterQueue::Open(path);
        const bool ok = opened.ok() && (*opened)->Park(SampleRequest("k" + std::to_string(i)), "e", 1, 503).ok();
        if (!opened.ok()) std::fprintf(stderr, "%s\n", opened.status().ToString().c_str());
        ::_exit(ok ? 0 : 1);
      }
      children.push_back(pid);
    }
    ::close(go[0]);
    ::close(go[1]);  // every child starts now
    int failed = 0;
    for (pid_t pid : children) {
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, 0), pid);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
    }
    EXPECT_EQ(failed, 0) << "round " << round;
    auto dlq = OpenOrDie(path);
    ASSERT_NE(dlq, nullptr);
    EXPECT_EQ(Entries(*dlq)->size(), static_cast<std::size_t>(kProcesses - failed));
  }
}

// The permission bits of `path`, or -1.
int Mode(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
}

// A new queue holds request headers (Authorization) and bodies: its files
// are its owner's alone, whatever the umask lets through.
TEST(DlqOpenTest, ANewQueueIsItsOwnersAlone) {
  TempDir dir;
  const std::string path = dir.Join("dlq.sqlite");
  const mode_t old_umask = ::umask(022);
  {
    auto dlq = OpenOrDie(path);
    ASSERT_NE(dlq, nullptr);
    ASSERT_TRUE(dlq->Park(SampleRequest(), "e", 1, 503).ok());
    EXPECT_EQ(Mode(path), 0600);
    EXPECT_EQ(Mode(path + "-wal"), 0600);
    EXPECT_EQ(Mode(path + "-shm"), 0600);
  }
  // An existing file keeps its mode (an operator may have shared it).
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  EXPECT_NE(OpenOrDie(path), nullptr);
  EXPECT_EQ(Mode(path), 0640);
  ::umask(old_umask);
}

TEST(DlqOpenTest, RefusesAFileThatIsNotADatabase) {
  TempDir dir;
  const std::string path = dir.Join("junk");
  ASSERT_TRUE(idemgate::testing::WriteFile(path, std::string(4096, 'x')).ok());
  const auto opened = DeadLetterQueue::Open(path);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kFailedPrecondition) << opened.status().ToString();
}

TEST(DlqOpenTest, ReportsAPathThatCannotBeCreated) {
  TempDir dir;
  const auto opened = DeadLetterQueue::Open(dir.Join("missing-dir/dlq.sqlite"));
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kUnavailable) << opened.status().ToString();
  // Named, not just "unable to open database file".
  EXPECT_NE(opened.status().message().find("the directory " + dir.Join("missing-dir") + " does not exist"),
            std::string::npos)
      << opened.status().message();
}

// A --dlq that names another program's SQLite database is refused, and the
// database is left as it was (no table added, journal mode unchanged).
TEST(DlqOpenTest, RefusesAnotherProgramsDatabaseAndLeavesItAlone) {
  TempDir dir;
  const std::string path = dir.Join("app.db");
  RawExec(path, "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT); INSERT INTO users VALUES (1, 'a');");
  const auto opened = DeadLetterQueue::Open(path);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kFailedPrecondition) << opened.status().ToString();
  EXPECT_NE(opened.status().message().find("something else"), std::string::npos) << opened.status().message();
  EXPECT_EQ(RawSingle(path, "SELECT group_concat(name) FROM sqlite_master WHERE type = 'table'"), "users");
  EXPECT_EQ(RawSingle(path, "PRAGMA journal_mode"), "delete");
  EXPECT_EQ(RawSingle(path, "PRAGMA user_version"), "0");
  // An empty SQLite file (made by hand, say) is still taken.
  const std::string empty = dir.Join("empty.db");
  RawExec(empty, "PRAGMA user_version = 0");
  EXPECT_TRUE(DeadLetterQueue::Open(empty).ok());
}

// Only kCreate makes a file: reading or changing a queue that is not there
// is NotFound, and leaves nothing behind (a mistyped --dlq).
TEST(DlqOpenTest, OnlyParkingCreatesAQueue) {
  TempDir dir;
  const std::string path = dir.Join("dlq.sqlite");
  for (const auto access : {DeadLetterQueue::Access::kRead, DeadLetterQueue::Access::kExisting}) {
    const auto opened = DeadLetterQueue::Open(path, access);
    ASSERT_FALSE(opened.ok());
    EXPECT_EQ(opened.status().code(), StatusCode::kNotFound) << opened.status().ToString();
    EXPECT_NE(opened.status().message().find("there is none at " + path), std::string::npos)
        << opened.status().message();
    EXPECT_FALSE(std::filesystem::exists(path));
  }
  auto created = OpenOrDie(path);
  ASSERT_NE(created, nullptr);
  ASSERT_TRUE(created->Park(SampleRequest(), "e", 1, 503).ok());
  created.reset();
  auto existing = DeadLetterQueue::Open(path, DeadLetterQueue::Access::kExisting);
  ASSERT_TRUE(existing.ok()) << existing.status().ToString();
  EXPECT_TRUE((*existing)->Discard(1).ok());
}

// Reading changes nothing: a version 1 file is read as it is (its entries
// without claims), not migrated, and writes through a reader fail.
TEST(DlqReadTest, AVersion1QueueIsReadWithoutMigrating) {
  TempDir dir;
  const std::string path = dir.Join("v1.sqlite");
  RawExec(path, kVersion1Queue);
  auto reader = DeadLetterQueue::Open(path, DeadLetterQueue::Access::kRead);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const auto listed = Entries(**reader);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].request.key, "k1");
  EXPECT_EQ((*listed)[0].status, EntryStatus::kReplaying);
  EXPECT_FALSE((*listed)[0].claim.has_value());
  EXPECT_EQ((*reader)->Get(1)->request.url, "http://h/x");
  EXPECT_FALSE((*reader)->Park(SampleRequest(), "e", 1, 503).ok());
  EXPECT_FALSE((*reader)->Release(1).ok());
  EXPECT_EQ(RawSingle(path, "PRAGMA user_version"), "1");
  EXPECT_EQ(RawSingle(path, "SELECT count(*) FROM dead_letters"), "1");
  EXPECT_EQ(RawSingle(path, "SELECT status FROM dead_letters"), "replaying");
}

TEST(DlqReadTest, AnEmptyFileReadsAsAnEmptyQueueAndAnotherProgramsIsRefused) {
  TempDir dir;
  const std::string empty = dir.Join("empty.db");
  RawExec(empty, "PRAGMA user_version = 0");
  auto reader = DeadLetterQueue::Open(empty, DeadLetterQueue::Access::kRead);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_TRUE(Entries(**reader)->empty());
  EXPECT_EQ((*reader)->Get(1).status().code(), StatusCode::kNotFound);
  const std::string app = dir.Join("app.db");
  RawExec(app, "CREATE TABLE users (id INTEGER PRIMARY KEY);");
  const auto refused = DeadLetterQueue::Open(app, DeadLetterQueue::Access::kRead);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("something else"), std::string::npos) << refused.status().message();
}

// Runs `body` in a child process that cannot write `dir` (as nobody when the
// test runs as root, else with the directory made read-only); returns the
// child's exit code (`body`'s result), or -1. `meanwhile` runs in this
// process while the child does.
int AsReaderWithoutWriteAccess(const std::string& dir, const std::function<int()>& body,
                               const std::function<void()>& meanwhile) {
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all | std::filesystem::perms::group_read |
                                        std::filesystem::perms::group_exec | std::filesystem::perms::others_read |
                                        std::filesystem::perms::others_exec);
  const bool root = ::geteuid() == 0;
  if (!root) std::filesystem::permissions(dir, std::filesystem::perms::owner_write, std::filesystem::perm_options::remove);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (root && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(100);
    ::_exit(body());
  }
  if (pid > 0) meanwhile();
  int status = 0;
  const bool waited = pid > 0 && ::waitpid(pid, &status, 0) == pid;
  if (!root) std::filesystem::permissions(dir, std::filesystem::perms::owner_write, std::filesystem::perm_options::add);
  return waited && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A reader without write access to the directory cannot make the WAL index
// (-shm) of an idle queue, so SQLite would refuse it; the queue is then read
// from the main file alone, and a read during which a writer came (a -wal
// file appeared) is refused rather than trusted.
TEST(DlqReadTest, AReaderWithoutWriteAccessReadsAnIdleQueue) {
  TempDir dir;
  const std::string path = dir.Join("dlq.sqlite");
  {
    auto writer = OpenOrDie(path);
    ASSERT_NE(writer, nullptr);
    ASSERT_TRUE(writer->Park(SampleRequest("k-a"), "e", 1, 503).ok());
    ASSERT_TRUE(writer->Park(SampleRequest("k-b"), "e", 2, 502).ok());
  }
  ASSERT_FALSE(std::filesystem::exists(path + "-wal"));  // the last connection checkpointed it away
  ASSERT_FALSE(std::filesystem::exists(path + "-shm"));
  // A new queue is its owner's alone: here its owner lets others read it.
  std::filesystem::permissions(path, std::filesystem::perms::group_read | std::filesystem::perms::others_read,
                               std::filesystem::perm_options::add);
  int to_child[2];
  int to_parent[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(to_parent), 0);
  // The child reads, lets the parent write, and reads again.
  auto read_twice = [&]() -> int {
    ::close(to_child[1]);
    ::close(to_parent[0]);
    auto reader = DeadLetterQueue::Open(path, DeadLetterQueue::Access::kRead);
    if (!reader.ok()) return 1;
    const auto listed = Entries(**reader);
    if (!listed.ok() || listed->size() != 2 || (*listed)[1].request.key != "k-b" ||
        !(*reader)->Get(2).ok() || (*reader)->Get(2)->request.body != SampleRequest().body) {
      return 2;
    }
    char byte = 1;
    if (::write(to_parent[1], &byte, 1) != 1 || ::read(to_child[0], &byte, 1) != 1) return 3;
    if (Entries(**reader).status().code() != StatusCode::kUnavailable) return 4;
    if ((*reader)->Get(1).status().code() != StatusCode::kUnavailable) return 5;
    return 0;
  };
  // Once the child has read once, a writer comes; it stays open (its -wal
  // file present) until the child is done.
  std::unique_ptr<DeadLetterQueue> writer;
  auto write_between = [&] {
    ::close(to_child[0]);
    ::close(to_parent[1]);
    char byte = 0;
    if (::read(to_parent[0], &byte, 1) == 1) {
      writer = OpenOrDie(path);
      if (writer != nullptr) {
        EXPECT_TRUE(writer->Park(SampleRequest("k-c"), "e", 1, 503).ok());
      }
    }
    EXPECT_TRUE(std::filesystem::exists(path + "-wal"));
    (void)!::write(to_child[1], &byte, 1);
    ::close(to_child[1]);
    ::close(to_parent[0]);
  };
  const int code = AsReaderWithoutWriteAccess(dir.path(), read_twice, write_between);
  EXPECT_EQ(code, 0) << "1: not opened, 2: first read wrong, 4/5: a read across a writer was trusted";
}

// The owner's read (idemctl dlq list) opens the queue to write, writes
// nothing, and as the last connection removes the -wal and -shm files: a
// read-only connection would leave them (0600, the owner's), and a reader
// granted read access to the queue file alone could then not read it.
TEST(DlqReadTest, AnOwnersReadLeavesNoWalOrShmSoAnotherReaderCanRead) {
  TempDir dir;
  const std::string path = dir.Join("dlq.sqlite");
  {
    auto writer = OpenOrDie(path);
    ASSERT_NE(writer, nullptr);
    ASSERT_TRUE(writer->Park(SampleRequest("k-a"), "e", 1, 503).ok());
  }
  {
    auto reader = DeadLetterQueue::Open(path, DeadLetterQueue::Access::kRead);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    ASSERT_EQ(Entries(**reader)->size(), 1u);
    ASSERT_TRUE((*reader)->Get(1).ok());
    EXPECT_FALSE((*reader)->Park(SampleRequest("k-b"), "e", 1, 503).ok());  // it still writes nothing
  }
  EXPECT_FALSE(std::filesystem::exists(path + "-wal"));
  EXPECT_FALSE(std::filesystem::exists(path + "-shm"));
  EXPECT_EQ(RawSingle(path, "SELECT count(*) FROM dead_letters"), "1");
  // Then the owner grants read access to the queue file, as docs/client.md says.
  std::filesystem::permissions(path, std::filesystem::perms::group_read | std::filesystem::perms::others_read,
                               std::filesystem::perm_options::add);
  const int code = AsReaderWithoutWriteAccess(
      dir.path(),
      [&]() -> int {
        auto reader = DeadLetterQueue::Open(path, DeadLetterQueue::Access::kRead);
        if (!reader.ok()) {
          std::fprintf(stderr, "%s\n", reader.status().ToString().c_str());
          return 1;
        }
        const auto listed = Entries(**reader);
        return listed.ok() && listed->size() == 1 && (*listed)[0].request.key == "k-a" ? 0 : 2;
      },
      [] {});
  EXPECT_EQ(code, 0) << "1: not opened, 2: read wrong";
}

// A reader that cannot open the WAL index (-shm) of a queue a writer has
// open is told so, naming the file, rather than sent to the directory.
TEST(DlqReadTest, AShmFileTheReaderCannotOpenIsNamed) {
  TempDir dir;
  const std::string path = dir.Join("dlq.sqlite");
  auto writer = OpenOrDie(path);
  ASSERT_NE(writer, nullptr);
  ASSERT_TRUE(writer->Park(SampleRequest("k-a"), "e", 1, 503).ok());
  ASSERT_TRUE(std::filesystem::exists(path + "-shm"));
  std::filesystem::permissions(path, std::filesystem::perms::group_read | std::filesystem::perms::others_read,
                               std::filesystem::perm_options::add);
  // The writer has it open already; no one else may open it (root's child runs as nobody).
  std::filesystem::permissions(path + "-shm", std::filesystem::perms::none);
  const int code = AsReaderWithoutWriteAccess(
      dir.path(),
      [&]() -> int {
        const auto reader = DeadLetterQueue::Open(path, DeadLetterQueue::Access::kRead);
        if (reader.ok()) return 1;
        const std::string message = reader.status().message();
        std::fprintf(stderr, "%s\n", message.c_str());
        if (message.find(path + "-shm, exists but this user cannot open it: Permission denied") == std::string::npos) {
          return 2;
        }
        return message.find("write access to its directory") == std::string::npos ? 0 : 3;
      },
      [] {});
  std::filesystem::permissions(path + "-shm", std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  EXPECT_EQ(code, 0) << "1: opened, 2: -shm not named, 3: the directory blamed";
  writer.reset();
}

// A queue this user may read but not write: opened to change it (replay,
// discard, release), it is said to be read-only, not "unable to open
// database file".
TEST(DlqOpenTest, AQueueThisUserMayNotWriteIsSaidToBeReadOnly) {
  TempDir dir;
  const std::string path = dir.Join("dlq.sqlite");
  {
    auto writer = OpenOrDie(path);
    ASSERT_NE(writer, nullptr);
    ASSERT_TRUE(writer->Park(SampleRequest("k-a"), "e", 1, 503).ok());
  }
  std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::group_read |
                                         std::filesystem::perms::others_read);
  const int code = AsReaderWithoutWriteAccess(
      dir.path(),
      [&]() -> int {
        for (const auto access : {DeadLetterQueue::Access::kExisting, DeadLetterQueue::Access::kCreate}) {
          const auto opened = DeadLetterQueue::Open(path, access);
          if (opened.ok()) return 1;
          std::fprintf(stderr, "%s\n", opened.status().ToString().c_str());
          if (opened.status().code() != StatusCode::kFailedPrecondition) return 2;
          if (opened.status().message().find(path + " is read-only (this user may not write it)") ==
              std::string::npos) {
            return 3;
          }
        }
        return 0;
      },
      [] {});
  EXPECT_EQ(code, 0) << "1: opened, 2/3: not said to be read-only";
}

// A queue file this user may write, in a directory it may not write: SQLite
// cannot make the -wal and -shm files ("attempt to write a readonly
// database"); the directory is named as the cause. A queue file this user may
// not read at all is said to be one, not "unable to open database file".
TEST(DlqOpenTest, AQueueInADirectoryThisUserMayNotWriteOrAFileItMayNotReadIsSaidSo) {
  TempDir dir;
  const std::string path = dir.Join("dlq.sqlite");
  const std::string closed = dir.Join("closed.sqlite");
  for (const std::string& file : {path, closed}) {
    auto writer = OpenOrDie(file);
    ASSERT_NE(writer, nullptr);
    ASSERT_TRUE(writer->Park(SampleRequest("k-a"), "e", 1, 503).ok());
  }
  ASSERT_FALSE(std::filesystem::exists(path + "-wal"));
  std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write |
                                         std::filesystem::perms::others_read | std::filesystem::perms::others_write |
                                         std::filesystem::perms::group_read | std::filesystem::perms::group_write);
  std::filesystem::permissions(closed, std::filesystem::perms::none);
  const int code = AsReaderWithoutWriteAccess(
      dir.path(),
      [&]() -> int {
        for (const auto access : {DeadLetterQueue::Access::kExisting, DeadLetterQueue::Access::kCreate}) {
          const auto opened = DeadLetterQueue::Open(path, access);
          if (opened.ok()) return 1;
          std::fprintf(stderr, "%s\n", opened.status().ToString().c_str());
          if (opened.status().message().find("the directory " + dir.path() + " may not be written by this user") ==
              std::string::npos) {
            return 2;
          }
        }
        for (const auto access : {DeadLetterQueue::Access::kRead, DeadLetterQueue::Access::kExisting}) {
          const auto opened = DeadLetterQueue::Open(closed, access);
          if (opened.ok()) return 3;
          std::fprintf(stderr, "%s\n", opened.status().ToString().c_str());
          if (opened.status().message().find("cannot open " + closed +
                                             ": this user may not read it (Permission denied)") == std::string::npos) {
            return 4;
          }
        }
        return 0;
      },
      [] {});
  std::filesystem::permissions(closed, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  EXPECT_EQ(code, 0) << "1/3: opened, 2: the directory not named, 4: not said to be unreadable";
}

// A directory this user may not enter (root's ~/.local in a user's home,
// say) is said to be one, not to be missing; a directory this user may not
// write is named when a new queue cannot be made in it.
TEST(DlqOpenTest, ADirectoryThisUserCannotEnterOrWriteIsSaidSo) {
  TempDir dir;
  const std::string closed = dir.Join("closed");
  ASSERT_TRUE(std::filesystem::create_directories(closed + "/share/idemctl"));
  std::filesystem::permissions(closed, std::filesystem::perms::none);
  const int code = AsReaderWithoutWriteAccess(
      dir.path(),
      [&]() -> int {
        const std::vector<std::pair<std::string, std::string>> cases = {
            // Below a directory that may not be searched, and in one.
            {closed + "/share/idemctl/dlq.sqlite", "the directory " + closed + "/share/idemctl cannot be entered"},
            {closed + "/dlq.sqlite", "the directory " + closed + " cannot be entered by this user"},
        };
        for (const auto& [path, said] : cases) {
          for (const auto access : {DeadLetterQueue::Access::kCreate, DeadLetterQueue::Access::kExisting,
                                    DeadLetterQueue::Access::kRead}) {
            const auto opened = DeadLetterQueue::Open(path, access);
            if (opened.ok()) return 1;
            std::fprintf(stderr, "%s\n", opened.status().ToString().c_str());
            if (opened.status().code() == StatusCode::kNotFound) return 2;
            if (opened.status().message().find(said) == std::string::npos) return 3;
            if (opened.status().message().find("does not exist") != std::string::npos) return 4;
          }
        }
        const std::string path = dir.Join("new.sqlite");
        const auto created = DeadLetterQueue::Open(path);
        if (created.ok()) return 5;
        std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
        const std::string said = "cannot create " + path + ": the directory " + dir.path() + " may not be written";
        return created.status().message().find(said) == std::string::npos ? 6 : 0;
      },
      [] {});
  std::filesystem::permissions(closed, std::filesystem::perms::owner_all);
  EXPECT_EQ(code, 0) << "1/5: opened, 2: NotFound, 3: not said, 4: said to be missing, 6: directory not named";
}

// Without its directory there is no queue to read or change: NotFound, as
// for a missing file, naming the directory (nothing is created).
TEST(DlqOpenTest, AQueueInAMissingDirectoryIsNotFoundUnlessParking) {
  TempDir dir;
  const std::string path = dir.Join("missing/dlq.sqlite");
  for (const auto access : {DeadLetterQueue::Access::kRead, DeadLetterQueue::Access::kExisting}) {
    const auto opened = DeadLetterQueue::Open(path, access);
    ASSERT_FALSE(opened.ok());
    EXPECT_EQ(opened.status().code(), StatusCode::kNotFound) << opened.status().ToString();
    EXPECT_NE(opened.status().message().find("there is none at " + path + " (the directory " + dir.Join("missing") +
                                             " does not exist)"),
              std::string::npos)
        << opened.status().message();
  }
  EXPECT_FALSE(std::filesystem::exists(dir.Join("missing")));
}

TEST_F(DlqTest, TwoThreadsClaimingOneEntryExactlyOneWins) {
  for (int round = 0; round < 20; ++round) {
    const std::int64_t id = ParkOrDie(SampleRequest("race-" + std::to_string(round)));
    std::atomic<bool> go{false};
    std::atomic<int> wins{0};
    std::atomic<int> refused{0};
    auto claim = [&] {
      while (!go.load()) std::this_thread::yield();
      const auto result = dlq_->ClaimForReplay(id);
      if (result.ok()) {
        ++wins;
      } else if (result.status().code() == StatusCode::kFailedPrecondition) {
        ++refused;
      }
    };
    std::thread t1(claim);
    std::thread t2(claim);
    go = true;
    t1.join();
    t2.join();
    EXPECT_EQ(wins.load(), 1) << "round " << round;
    EXPECT_EQ(refused.load(), 1) << "round " << round;
  }
}

TEST_F(DlqTest, TwoConnectionsClaimingOneEntryExactlyOneWins) {
  auto other = OpenOrDie(path_);
  ASSERT_NE(other, nullptr);
  for (int round = 0; round < 20; ++round) {
    const std::int64_t id = ParkOrDie(SampleRequest("race-" + std::to_string(round)));
    std::atomic<bool> go{false};
    std::atomic<int> wins{0};
    std::atomic<int> refused{0};
    auto claim = [&](DeadLetterQueue* q) {
      while (!go.load()) std::this_thread::yield();
      const auto result = q->ClaimForReplay(id);
      if (result.ok()) {
        ++wins;
      } else if (result.status().code() == StatusCode::kFailedPrecondition) {
        ++refused;
      } else {
        ADD_FAILURE() << result.status().ToString();
      }
    };
    std::thread t1(claim, dlq_.get());
    std::thread t2(claim, other.get());
    go = true;
    t1.join();
    t2.join();
    EXPECT_EQ(wins.load(), 1) << "round " << round;
    EXPECT_EQ(refused.load(), 1) << "round " << round;
  }
}

TEST_F(DlqTest, ConcurrentParksGetDistinctIds) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 25;
  std::vector<std::map<std::int64_t, std::string>> parked(kThreads);  // id -> key, per thread
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string key = "t" + std::to_string(t) + "-" + std::to_string(i);
        const auto id = dlq_->Park(SampleRequest(key), "e", 1, 500);
        if (id.ok()) parked[t][*id] = key;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  std::map<std::int64_t, std::string> all;
  for (const auto& m : parked) all.insert(m.begin(), m.end());
  EXPECT_EQ(all.size(), static_cast<std::size_t>(kThreads * kPerThread));  // no id given twice
  const auto list = Entries(*dlq_);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), all.size());
  for (const auto& e : *list) EXPECT_EQ(e.request.key, all[e.id]) << "id " << e.id;
}


// ---------------------------------------------------------------------------
// Rows that cannot be read (written by another program, or edited by hand)

// Parks six entries and spoils four of them, each in another way.
class DlqUnreadableTest : public DlqTest {
 protected:
  void SetUp() override {
    DlqTest::SetUp();
    for (int i = 1; i <= 6; ++i) ASSERT_EQ(ParkOrDie(SampleRequest("k" + std::to_string(i))), i);
    RawExec(path_, "UPDATE dead_letters SET headers = 'not json' WHERE id = 2;"
                   "UPDATE dead_letters SET attempts = 'many' WHERE id = 3;"
                   "UPDATE dead_letters SET headers = '[[\"X-A\", 1]]' WHERE id = 5;"
                   "PRAGMA ignore_check_constraints = ON;"
                   "UPDATE dead_letters SET status = 'lost' WHERE id = 6;");
  }

  static std::string Ids(const std::vector<UnreadableEntry>& unreadable) {
    std::string out;
    for (const auto& u : unreadable) out += std::to_string(u.id) + " ";
    return out;
  }
};

TEST_F(DlqUnreadableTest, ListSkipsAndNamesThemAndListsTheRest) {
  const auto listing = dlq_->List();
  ASSERT_TRUE(listing.ok()) << listing.status().ToString();
  ASSERT_EQ(listing->entries.size(), 2u);
  EXPECT_EQ(listing->entries[0].id, 1);
  EXPECT_EQ(listing->entries[1].id, 4);
  EXPECT_EQ(listing->entries[1].request.headers, SampleRequest().headers);
  ASSERT_EQ(Ids(listing->unreadable), "2 3 5 6 ");
  EXPECT_EQ(listing->unreadable[0].error, "dead letter 2 cannot be read: column headers is not JSON (syntax error)");
  EXPECT_EQ(listing->unreadable[1].error, "dead letter 3 cannot be read: column attempts is text, not an integer");
  EXPECT_EQ(listing->unreadable[2].error,
            "dead letter 5 cannot be read: column headers holds an item that is not a [name, value] pair of strings");
  EXPECT_EQ(listing->unreadable[3].error, "dead letter 6 cannot be read: bad status \"lost\"");

  // Filtered too; a row whose status is unknown matches no filter.
  const auto pending = dlq_->List(EntryStatus::kPending);
  ASSERT_TRUE(pending.ok()) << pending.status().ToString();
  EXPECT_EQ(pending->entries.size(), 2u);
  EXPECT_EQ(Ids(pending->unreadable), "2 3 5 ");

  // The same through a reader.
  auto reader = DeadLetterQueue::Open(path_, DeadLetterQueue::Access::kRead);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const auto read = (*reader)->List();
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->entries.size(), 2u);
  EXPECT_EQ(Ids(read->unreadable), "2 3 5 6 ");
}

TEST_F(DlqUnreadableTest, ValuesOfTheWrongTypeOrRangeAreNamed) {
  RawExec(path_, "UPDATE dead_letters SET last_status = 1.5 WHERE id = 1;"
                 "UPDATE dead_letters SET attempts = -2 WHERE id = 4;");
  EXPECT_EQ(dlq_->Get(1).status().message(),
            "dead letter 1 cannot be read: column last_status is a real number, not an integer");
  EXPECT_EQ(dlq_->Get(4).status().message(), "dead letter 4 cannot be read: column attempts is out of range (-2)");
  RawExec(path_, "UPDATE dead_letters SET last_status = 503, url = x'00ff' WHERE id = 1;"
                 "UPDATE dead_letters SET attempts = 3 WHERE id = 4");
  EXPECT_EQ(dlq_->Get(1).status().message(), "dead letter 1 cannot be read: column url is a blob, not text");
  EXPECT_TRUE(dlq_->Get(4).ok());
}

TEST_F(DlqUnreadableTest, GetAndClaimFailLeavingTheEntryPending) {
  const auto got = dlq_->Get(2);
  EXPECT_EQ(got.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(got.status().message(), "dead letter 2 cannot be read: column headers is not JSON (syntax error)");
  const auto claimed = dlq_->ClaimForReplay(2);
  EXPECT_EQ(claimed.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(claimed.status().message(), got.status().message());
  EXPECT_EQ(RawSingle(path_, "SELECT status || '/' || ifnull(claim_token, 'none') FROM dead_letters WHERE id = 2"),
            "pending/none");
  // The readable entries are claimed as before.
  EXPECT_TRUE(dlq_->ClaimForReplay(1).ok());
}

TEST_F(DlqUnreadableTest, DiscardAndReleaseNeedOnlyTheStatus) {
  EXPECT_TRUE(dlq_->Discard(2).ok());
  EXPECT_EQ(RawSingle(path_, "SELECT status FROM dead_letters WHERE id = 2"), "discarded");
  // Left replaying (by an older idemctl, say), without a claim: released at once.
  RawExec(path_, "UPDATE dead_letters SET status = 'replaying' WHERE id = 3");
  EXPECT_TRUE(dlq_->Release(3).ok());
  EXPECT_EQ(RawSingle(path_, "SELECT status FROM dead_letters WHERE id = 3"), "pending");
  // An unknown status says so, rather than that the entry is missing.
  const Status lost = dlq_->Discard(6);
  EXPECT_EQ(lost.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(lost.message(), "dead letter 6 cannot be read: bad status \"lost\"");
}

TEST_F(DlqUnreadableTest, AReplayOfOneFailsWithoutClaimingIt) {
  Client client(ClientOptions{.dlq = dlq_.get()});
  const auto out = client.Replay(5);
  EXPECT_EQ(out.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(out.status().message().find("dead letter 5 cannot be read"), std::string::npos)
      << out.status().message();
  EXPECT_EQ(RawSingle(path_, "SELECT status FROM dead_letters WHERE id = 5"), "pending");
}

}  // namespace
}  // namespace idemgate::client
