// The idemctl binary's dlq commands on a queue that holds rows it cannot
// read: each is named and skipped, and the others still work.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <chrono>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "client/client.h"
#include "client/scripted_server.h"
#include "fakes/testing.h"

namespace idemgate::client {
namespace {

using namespace std::chrono_literals;
using idemgate::testing::Process;
using idemgate::testing::ProcessOptions;
using idemgate::testing::ReadFileOrEmpty;
using idemgate::testing::TempDir;

struct CliRun {
  int code = -1;
  std::string out;
  std::string err;
};

class IdemctlDlqTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.Join("dlq.sqlite");
    auto dlq = DeadLetterQueue::Open(path_);
    ASSERT_TRUE(dlq.ok()) << dlq.status().ToString();
    for (int i = 1; i <= 3; ++i) {
      Request request;
      request.url = "http://127.0.0.1:9/v1/payments";
      request.headers = {{"Content-Type", "application/json"}};
      request.body = "{}";
      request.key = "order-" + std::to_string(i);
      ASSERT_TRUE((*dlq)->Park(request, "503 Service Unavailable", 3, 503).ok());
    }
    dlq->reset();
    Sql("UPDATE dead_letters SET headers = '{\"Content-Type\": 1}' WHERE id = 2");
  }

  void Sql(const std::string& sql) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
    sqlite3_close(db);
    ASSERT_EQ(rc, SQLITE_OK);
  }

  std::string Status(int id) {
    sqlite3* db = nullptr;
    std::string out;
    if (sqlite3_open(path_.c_str(), &db) == SQLITE_OK) {
      sqlite3_stmt* stmt = nullptr;
      const std::string sql = "SELECT status FROM dead_letters WHERE id = " + std::to_string(id);
      if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK && sqlite3_step(stmt) == SQLITE_ROW) {
        out = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
      }
      sqlite3_finalize(stmt);
    }
    sqlite3_close(db);
    return out;
  }

  CliRun Idemctl(std::vector<std::string> args, std::vector<std::pair<std::string, std::string>> env = {}) {
    static int runs = 0;
    const std::string base = dir_.Join("idemctl-" + std::to_string(++runs));
    ProcessOptions options;
    options.stdout_path = base + ".out";
    options.stderr_path = base + ".err";
    options.env = std::move(env);
    if (std::none_of(options.env.begin(), options.env.end(), [](const auto& v) { return v.first == "IDEMCTL_DLQ"; })) {
      options.env.emplace_back("IDEMCTL_DLQ", path_);
    }
    CliRun run;
    auto process = Process::Start(IDEMCTL_BIN, args, options);
    EXPECT_TRUE(process.ok()) << process.status().ToString();
    if (!process.ok()) return run;
    const auto status = process->WaitExit(60s);
    EXPECT_TRUE(status.has_value() && status->exited) << "idemctl did not finish";
    if (status && status->exited) run.code = status->code;
    run.out = ReadFileOrEmpty(options.stdout_path);
    run.err = ReadFileOrEmpty(options.stderr_path);
    return run;
  }

  TempDir dir_;
  std::string path_;
};

constexpr std::string_view kBadRow =
    "idemctl: dead letter 2 cannot be read: column headers is not a JSON array; skipped\n"
    "idemctl: 1 entry could not be read and is not listed (dlq discard ID drops a pending one)\n";

TEST_F(IdemctlDlqTest, ListShowsTheOtherEntriesNamesTheBadRowAndExits1) {
  const CliRun text = Idemctl({"dlq", "list"});
  EXPECT_EQ(text.code, 1) << text.err;
  EXPECT_EQ(text.err, kBadRow);
  EXPECT_NE(text.out.find("\torder-1\t"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("\torder-3\t"), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("\torder-2\t"), std::string::npos) << text.out;

  const CliRun pending = Idemctl({"dlq", "list", "--status", "pending"});
  EXPECT_EQ(pending.code, 1);
  EXPECT_EQ(pending.err, kBadRow);

  const CliRun json = Idemctl({"dlq", "list", "--json"});
  EXPECT_EQ(json.code, 1) << json.err;
  EXPECT_EQ(json.err, kBadRow);
  boost::system::error_code ec;
  const boost::json::value listed = boost::json::parse(json.out, ec);
  ASSERT_FALSE(ec) << json.out;
  ASSERT_TRUE(listed.is_array());
  ASSERT_EQ(listed.as_array().size(), 2u);
  EXPECT_EQ(listed.as_array()[0].at("id"), 1);
  EXPECT_EQ(listed.as_array()[1].at("id"), 3);

  // Once it is fixed (or gone), the list is whole again, and exit 0.
  Sql("DELETE FROM dead_letters WHERE id = 2");
  const CliRun clean = Idemctl({"dlq", "list"});
  EXPECT_EQ(clean.code, 0) << clean.err;
  EXPECT_EQ(clean.err, "");
}

TEST_F(IdemctlDlqTest, EveryOtherCommandOnTheBadRowSaysWhyAndLeavesItUsable) {
  const CliRun show = Idemctl({"dlq", "show", "2"});
  EXPECT_EQ(show.code, 1);
  EXPECT_EQ(show.err, "idemctl: dead letter 2 cannot be read: column headers is not a JSON array\n");
  const CliRun replay = Idemctl({"dlq", "replay", "2", "--attempts", "1"});
  EXPECT_EQ(replay.code, 1);
  EXPECT_EQ(replay.err, show.err);
  EXPECT_EQ(Status(2), "pending");  // not left replaying
  const CliRun discard = Idemctl({"dlq", "discard", "2"});
  EXPECT_EQ(discard.code, 0) << discard.err;
  EXPECT_EQ(Status(2), "discarded");
  // The readable entries are untouched by it.
  const CliRun other = Idemctl({"dlq", "show", "3"});
  EXPECT_EQ(other.code, 0) << other.err;
}

// list and show by the queue's owner leave no -wal or -shm file behind
// (which would keep a reader granted read access to the queue file out).
TEST_F(IdemctlDlqTest, ReadsLeaveNoWalOrShmBehind) {
  EXPECT_EQ(Idemctl({"dlq", "list"}).code, 1);  // the bad row
  EXPECT_EQ(Idemctl({"dlq", "show", "1"}).code, 0);
  EXPECT_EQ(Idemctl({"dlq", "list", "--json", "--status", "pending"}).code, 1);
  EXPECT_FALSE(std::filesystem::exists(path_ + "-wal"));
  EXPECT_FALSE(std::filesystem::exists(path_ + "-shm"));
}

// A relative HOME is ignored, as a relative XDG_DATA_HOME is: then there is
// no default queue, and idemctl says so (send sends nothing).
TEST_F(IdemctlDlqTest, ARelativeHomeGivesNoDefaultQueue) {
  // Relative to the current directory (idemctl's and this test's): nothing may be made there.
  const std::string home = "idemctl-test-relative-home-" + std::to_string(::getpid());
  const std::vector<std::pair<std::string, std::string>> env = {
      {"IDEMCTL_DLQ", ""}, {"XDG_DATA_HOME", "relative-data"}, {"HOME", home}};
  const std::string expected = "no default dead-letter queue: HOME is the relative path \"" + home + "\"";
  const CliRun list = Idemctl({"dlq", "list"}, env);
  EXPECT_EQ(list.code, 1) << list.err;
  EXPECT_NE(list.err.find(expected), std::string::npos) << list.err;
  const CliRun send = Idemctl({"send", "-k", "order-9", "-d", "{}", "http://127.0.0.1:9/v1/payments"}, env);
  EXPECT_EQ(send.code, 3) << send.err;
  EXPECT_NE(send.err.find(expected), std::string::npos) << send.err;
  EXPECT_NE(send.err.find("nothing was sent"), std::string::npos) << send.err;
  const bool made = std::filesystem::exists(home);
  std::filesystem::remove_all(home);
  EXPECT_FALSE(made);
  // XDG_DATA_HOME unset (or empty): the message says so, not that it is not an absolute path.
  const CliRun unset = Idemctl({"dlq", "list"}, {{"IDEMCTL_DLQ", ""}, {"XDG_DATA_HOME", ""}, {"HOME", home}});
  EXPECT_EQ(unset.code, 1) << unset.err;
  EXPECT_NE(unset.err.find(expected + ", which is ignored (as a relative XDG_DATA_HOME is), and XDG_DATA_HOME is "
                                      "not set; give the queue with --dlq FILE or IDEMCTL_DLQ"),
            std::string::npos)
      << unset.err;
  EXPECT_NE(list.err.find("XDG_DATA_HOME is the relative path \"relative-data\""), std::string::npos) << list.err;
  // An empty HOME is an unset one: the queue is ./idemctl-dlq.sqlite.
  const CliRun empty = Idemctl({"dlq", "list"}, {{"IDEMCTL_DLQ", ""}, {"XDG_DATA_HOME", ""}, {"HOME", ""}});
  EXPECT_EQ(empty.code, 0) << empty.err;
  EXPECT_NE(empty.err.find("there is none at idemctl-dlq.sqlite "), std::string::npos) << empty.err;
  // With an absolute XDG_DATA_HOME, HOME is not needed.
  const std::string data = dir_.Join("data");
  const CliRun xdg = Idemctl({"dlq", "list"}, {{"IDEMCTL_DLQ", ""}, {"XDG_DATA_HOME", data}, {"HOME", "relative"}});
  EXPECT_EQ(xdg.code, 0) << xdg.err;
  EXPECT_NE(xdg.err.find(data + "/idemctl/dlq.sqlite"), std::string::npos) << xdg.err;
}

// Text from the server or the queue file reaches the terminal escaped: a
// tab, newline or escape sequence in a problem's code (the failure summary,
// -v's attempt lines, dlq list's ERROR column) or in a parked key breaks no
// line or row and sends the terminal nothing. JSON output escapes it as JSON.
TEST_F(IdemctlDlqTest, ServerAndQueueTextIsEscapedOnTheTerminal) {
  Sql("DELETE FROM dead_letters WHERE id = 2");
  Sql("UPDATE dead_letters SET \"key\" = 'ord' || char(10) || 'er-3', error = 'e' || char(13) || 'f' WHERE id = 3");
  testing::ScriptedServer server;
  const std::string code = "bad\tcode\nX\x1b[2J\xc2\x9b" "1m";
  server.Push(testing::Canned::Problem(400, code));
  const CliRun sent = Idemctl({"send", "-v", "-k", "esc-1", "-d", "{}", "--attempts", "1", server.Url("/v1/x")});
  EXPECT_EQ(sent.code, 1) << sent.err;
  const std::string escaped = "bad\\tcode\\nX\\x1b[2J\\u009b1m";
  EXPECT_NE(sent.err.find("idemctl: attempt 1: 400 Bad Request (" + escaped + ")\n"), std::string::npos) << sent.err;
  EXPECT_NE(sent.err.find("idemctl: key esc-1, 1 attempt, failed: 400 Bad Request (" + escaped + "); parked"),
            std::string::npos)
      << sent.err;
  EXPECT_EQ(std::count(sent.err.begin(), sent.err.end(), '\n'), 2) << sent.err;

  const CliRun list = Idemctl({"dlq", "list"});
  EXPECT_EQ(list.code, 0) << list.err;
  for (const char raw : {'\x1b', '\r', '\x9b'}) EXPECT_EQ(list.out.find(raw), std::string::npos) << list.out;
  EXPECT_NE(list.out.find("\tord\\ner-3\te\\rf\t"), std::string::npos) << list.out;
  EXPECT_NE(list.out.find("\tesc-1\t400 Bad Request (" + escaped + ")\t"), std::string::npos) << list.out;
  // The header and three rows, of nine columns each.
  std::vector<std::string> lines;
  for (std::size_t start = 0, end; (end = list.out.find('\n', start)) != std::string::npos; start = end + 1) {
    lines.push_back(list.out.substr(start, end - start));
  }
  ASSERT_EQ(lines.size(), 4u) << list.out;
  for (const std::string& line : lines) EXPECT_EQ(std::count(line.begin(), line.end(), '\t'), 8) << line;

  // JSON keeps the text itself, escaped as JSON.
  const CliRun json = Idemctl({"dlq", "list", "--json"});
  EXPECT_EQ(json.code, 0) << json.err;
  const boost::json::value listed = boost::json::parse(json.out);
  EXPECT_EQ(listed.as_array()[1].at("key").as_string(), "ord\ner-3");
  EXPECT_EQ(listed.as_array()[2].at("error").as_string(), "400 Bad Request (" + code + ")");
}

// The usage lines name every option a command takes.
TEST_F(IdemctlDlqTest, HelpNamesJsonForListAndShow) {
  const CliRun help = Idemctl({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("idemctl dlq list [--status S] [--json]\n"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("idemctl dlq show ID [--json] "), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("a 409 without the code request-in-flight"), std::string::npos) << help.out;
}

}  // namespace
}  // namespace idemgate::client
