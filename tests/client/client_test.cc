#include "client/client.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "client/lookup.h"
#include "client/scripted_server.h"
#include "common/ascii.h"
#include "fakes/testing.h"

namespace idemgate::client {
namespace {

using testing::Canned;
using testing::ClosedPort;
using testing::Recorded;
using testing::ScriptedServer;

constexpr std::uint64_t kMaxRandom = std::numeric_limits<std::uint64_t>::max();

// The queue's entries (List), checking that it skipped no row.
StatusOr<std::vector<DeadLetter>> Entries(const DeadLetterQueue& dlq,
                                          std::optional<EntryStatus> status = std::nullopt) {
  auto listing = dlq.List(status);
  if (!listing.ok()) return listing.status();
  EXPECT_TRUE(listing->unreadable.empty()) << listing->unreadable.front().error;
  return std::move(listing->entries);
}

Request Post(const ScriptedServer& server, std::string key = "k-1") {
  Request request;
  request.url = server.Url("/v1/payments?x=1");
  request.headers = {{"Content-Type", "application/json"}, {"X-Trace", "t-1"}};
  request.body = R"({"amount":100})";
  request.key = std::move(key);
  return request;
}

// ---------------------------------------------------------------------------
// SendOnce

TEST(SendOnceTest, SendsTheRequestWithHostLengthConnectionAndKey) {
  ScriptedServer server;
  server.Push(Canned::Answer(201, {{"X-Reply", "yes"}}, "created"));
  auto response = SendOnce(Post(server), Millis(5000));
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 201);
  EXPECT_EQ(response->body, "created");

  const auto requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  const Recorded& got = requests[0];
  EXPECT_EQ(got.method, "POST");
  EXPECT_EQ(got.target, "/v1/payments?x=1");
  EXPECT_EQ(got.body, R"({"amount":100})");
  const std::vector<Header> expected = {
      {"Content-Type", "application/json"},
      {"X-Trace", "t-1"},
      {"Host", "127.0.0.1:" + std::to_string(server.port())},
      {"Content-Length", "14"},
      {"Connection", "close"},
      {"Idempotency-Key", "\"k-1\""},
  };
  EXPECT_EQ(got.headers, expected);
}

// The reason phrase is kept as the server sent it (idemctl -i prints it):
// not replaced by the standard one for the status.
TEST(SendOnceTest, KeepsTheReasonPhraseThatArrived) {
  ScriptedServer server;
  server.Push(Canned::Raw("HTTP/1.1 422 Unprocessable Entity\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"));
  auto response = SendOnce(Post(server), Millis(5000));
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 422);
  EXPECT_EQ(response->reason, "Unprocessable Entity");
}

TEST(SendOnceTest, KeyIsAnEscapedSfStringUnderTheChosenHeader) {
  ScriptedServer server;
  server.Push(Canned::Answer(200));
  Request request = Post(server, R"(a"b\c)");
  request.key_header = "X-Idem";
  request.headers.emplace_back("idempotency-key", "ignored?");
  request.headers.emplace_back("x-idem", R"("a\"b\\c")");  // the same key: one line is sent
  ASSERT_TRUE(SendOnce(request, Millis(5000)).ok());
  const auto got = server.requests().at(0);
  EXPECT_EQ(got.Count("X-Idem"), 1);
  EXPECT_EQ(got.Get("X-Idem"), R"("a\"b\\c")");
  // Only the header named by key_header is the key; others are sent as given.
  EXPECT_EQ(got.Get("Idempotency-Key"), "ignored?");
}

TEST(SendOnceTest, WithoutAKeyNoKeyHeaderIsSent) {
  ScriptedServer server;
  server.Push(Canned::Answer(200));
  ASSERT_TRUE(SendOnce(Post(server, ""), Millis(5000)).ok());
  EXPECT_EQ(server.requests().at(0).Count("Idempotency-Key"), 0);
}

TEST(SendOnceTest, GivenHostAndContentLengthAreKept) {
  ScriptedServer server;
  server.Push(Canned::Answer(200));
  Request request = Post(server);
  request.headers = {{"Host", "api.example.com"}, {"Content-Length", "14"}, {"Connection", "keep-alive"}};
  ASSERT_TRUE(SendOnce(request, Millis(5000)).ok());
  const auto got = server.requests().at(0);
  EXPECT_EQ(got.Count("Host"), 1);
  EXPECT_EQ(got.Get("Host"), "api.example.com");
  EXPECT_EQ(got.Count("Content-Length"), 1);
  EXPECT_EQ(got.Count("Connection"), 1);
  EXPECT_EQ(got.body, R"({"amount":100})");
}

TEST(SendOnceTest, GetWithoutBodyHasNoContentLengthAndPathDefaultsToSlash) {
  ScriptedServer server;
  server.Push(Canned::Answer(200, {}, "hi"));
  Request request;
  request.method = "GET";
  request.url = "http://127.0.0.1:" + std::to_string(server.port());
  auto response = SendOnce(request, Millis(5000));
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->body, "hi");
  const auto got = server.requests().at(0);
  EXPECT_EQ(got.method, "GET");
  EXPECT_EQ(got.target, "/");
  EXPECT_EQ(got.Count("Content-Length"), 0);
  EXPECT_EQ(got.Get("Host"), "127.0.0.1:" + std::to_string(server.port()));
}

TEST(SendOnceTest, EmptyPostStillSaysContentLengthZero) {
  ScriptedServer server;
  server.Push(Canned::Answer(204));
  Request request = Post(server);
  request.body.clear();
  ASSERT_TRUE(SendOnce(request, Millis(5000)).ok());
  EXPECT_EQ(server.requests().at(0).Get("Content-Length"), "0");
}

TEST(SendOnceTest, BinaryBodyGoesThroughUnchanged) {
  ScriptedServer server;
  server.Push(Canned::Answer(200, {}, std::string("r\0s", 3)));
  Request request = Post(server);
  request.body = std::string("\0\x01\xff\r\n\0", 6);
  auto response = SendOnce(request, Millis(5000));
  ASSERT_TRUE(response.ok());
  EXPECT_EQ(response->body, std::string("r\0s", 3));
  EXPECT_EQ(server.requests().at(0).body, request.body);
}

TEST(SendOnceTest, ResponseHeadersAndProblemCode) {
  ScriptedServer server;
  server.Push(Canned::Problem(409, "request-in-flight", {{"Retry-After", "1"}, {"Set-Cookie", "a=1"},
                                                         {"Set-Cookie", "b=2"}}));
  auto response = SendOnce(Post(server), Millis(5000));
  ASSERT_TRUE(response.ok());
  EXPECT_EQ(response->status, 409);
  EXPECT_EQ(response->Header("retry-after"), "1");
  EXPECT_EQ(response->Header("SET-COOKIE"), "a=1");  // the first of two
  EXPECT_EQ(response->Header("X-Missing"), std::nullopt);
  EXPECT_EQ(response->ProblemCode(), "request-in-flight");
}

TEST(SendOnceTest, ProblemCodeNeedsAProblemJsonBodyWithAStringCode) {
  Response r;
  r.body = R"({"code":"key-reused"})";
  EXPECT_EQ(r.ProblemCode(), "");  // no Content-Type
  r.headers = {{"Content-Type", "application/json"}};
  EXPECT_EQ(r.ProblemCode(), "");
  r.headers = {{"content-type", "Application/Problem+JSON ; charset=utf-8"}};
  EXPECT_EQ(r.ProblemCode(), "key-reused");
  r.body = "not json";
  EXPECT_EQ(r.ProblemCode(), "");
  r.body = R"({"code":7})";
  EXPECT_EQ(r.ProblemCode(), "");
  r.body = R"(["code"])";
  EXPECT_EQ(r.ProblemCode(), "");
  r.body = "";
  EXPECT_EQ(r.ProblemCode(), "");
}

TEST(SendOnceTest, SkipsInterimResponsesAndReadsUntilClose) {
  ScriptedServer server;
  server.Push(Canned::Raw("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil eof"));
  auto response = SendOnce(Post(server), Millis(5000));
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, "until eof");
}

TEST(SendOnceTest, HeadResponseHasNoBodyToWaitFor) {
  ScriptedServer server;
  server.Push(Canned::Raw("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"));
  Request request;
  request.method = "HEAD";
  request.url = server.Url("/");
  auto response = SendOnce(request, Millis(5000));
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, "");
}

TEST(SendOnceTest, ResolvesHostNames) {
  ScriptedServer server;
  server.Push(Canned::Answer(200));
  Request request = Post(server);
  request.url = "http://localhost:" + std::to_string(server.port()) + "/x";
  auto response = SendOnce(request, Millis(5000));
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(server.requests().at(0).Get("Host"), "localhost:" + std::to_string(server.port()));
}

// In place of the system's name lookup while it lives: one that does not
// answer until released (at the end of the test, or after 10 s), as the
// system resolver does not when its DNS server is unreachable. `on_start`
// runs as a lookup begins.
class HangingLookup {
 public:
  explicit HangingLookup(std::function<void()> on_start = {}) {
    previous_ = internal::ReplaceLookupForTesting(
        [released = released_, on_start = std::move(on_start)](const std::string& host,
                                                                std::uint16_t) -> StatusOr<internal::Endpoints> {
          if (on_start) on_start();
          released.wait_for(std::chrono::seconds(10));
          return UnavailableError("the lookup of " + host + " answered at last");
        });
  }
  ~HangingLookup() {
    internal::ReplaceLookupForTesting(std::move(previous_));
    release_.set_value();
  }
  HangingLookup(const HangingLookup&) = delete;
  HangingLookup& operator=(const HangingLookup&) = delete;

 private:
  std::promise<void> release_;
  std::shared_future<void> released_ = release_.get_future().share();
  internal::Lookup previous_;
};

TEST(SendOnceTest, ANameLookupThatDoesNotAnswerEndsAtTheDeadline) {
  HangingLookup hanging;
  Request request;
  request.url = "http://hangs.invalid:8080/v1/payments";
  request.key = "k-1";
  const auto result = SendOnce(request, Millis(200));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kDeadlineExceeded) << result.status().ToString();
  EXPECT_EQ(result.status().message(), "timed out after 200 ms resolving hangs.invalid");
}

TEST(SendOnceTest, ANameLookupThatDoesNotAnswerIsCutByTheInterruption) {
  Interruption interruption;
  HangingLookup hanging([&interruption] { interruption.Trigger(); });  // Ctrl-C while it hangs
  Request request;
  request.url = "http://hangs.invalid:8080/v1/payments";
  request.key = "k-1";
  const auto result = SendOnce(request, std::chrono::hours(1), {}, &interruption);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kAborted) << result.status().ToString();
  EXPECT_EQ(result.status().message(), "interrupted while resolving hangs.invalid:8080");
}

TEST(SendOnceTest, BadUrlsAreInvalidArguments) {
  for (const char* url : {"", "not a url", "https://", "ftp://127.0.0.1/", "http://", "http:///path",
                          "http://127.0.0.1:99999/", "http://127.0.0.1:0/", "http://user:pw@127.0.0.1/",
                          "//127.0.0.1/", "http://[v1.x]/"}) {
    Request request;
    request.url = url;
    const auto result = SendOnce(request, Millis(1000));
    ASSERT_FALSE(result.ok()) << url;
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument) << url << ": " << result.status().ToString();
  }
}

TEST(SendOnceTest, BadRequestPartsAreInvalidArguments) {
  ScriptedServer server;
  auto check = [&](Request request, const char* what) {
    const auto result = SendOnce(request, Millis(1000));
    ASSERT_FALSE(result.ok()) << what;
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument) << what << ": " << result.status().ToString();
  };
  Request r = Post(server);
  r.method = "PO ST";
  check(r, "method");
  r = Post(server);
  r.headers = {{"Bad Name", "v"}};
  check(r, "header name");
  r = Post(server);
  r.headers = {{"X-Injected", "a\r\nX-Evil: 1"}};
  check(r, "header value");
  r = Post(server);
  r.key = "bad\nkey";
  check(r, "key");
  r = Post(server);
  r.key_header = "";
  check(r, "key header");
  r = Post(server);
  r.headers = {{"Content-Length", "3"}};
  check(r, "content length");
  r = Post(server);
  r.headers = {{"Transfer-Encoding", "chunked"}};
  check(r, "transfer encoding");
  EXPECT_TRUE(server.requests().empty());
}

TEST(SendOnceTest, UrlErrorsNameTheUrlAndWhatIsWrongWithIt) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"http://h/a b", "space"},
      {"http://h/a\tb", "control character"},
      {"http://h/caf\xc3\xa9", "non-ASCII"},
      {"ftp://x", "only http:// and https://"},
      {"127.0.0.1:8080/x", "http://"},
  };
  for (const auto& [url, why] : cases) {
    Request request;
    request.url = url;
    const auto result = SendOnce(request, Millis(1000));
    ASSERT_FALSE(result.ok()) << url;
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument) << url;
    EXPECT_NE(result.status().message().find(why), std::string::npos) << url << ": " << result.status().ToString();
    EXPECT_EQ(result.status().message().find("leftover"), std::string::npos)
        << url << ": " << result.status().ToString();
  }
}

TEST(SendOnceTest, ConnectionRefusedIsUnavailable) {
  Request request;
  request.url = "http://127.0.0.1:" + std::to_string(ClosedPort()) + "/";
  const auto result = SendOnce(request, Millis(2000));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(result.status().message().find("connection refused"), std::string::npos) << result.status().message();
}

TEST(SendOnceTest, CloseWithoutAnswerIsUnavailable) {
  ScriptedServer server;
  server.Push(Canned::Close());
  const auto result = SendOnce(Post(server), Millis(5000));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kUnavailable) << result.status().ToString();
  EXPECT_EQ(server.requests().size(), 1u);
}

TEST(SendOnceTest, TruncatedResponseIsUnavailable) {
  ScriptedServer server;
  server.Push(Canned::Raw("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"));
  const auto result = SendOnce(Post(server), Millis(5000));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kUnavailable) << result.status().ToString();
}

// A chunk-size line that never ends is refused once its bytes pass a bound,
// instead of being buffered for as long as the server sends them.
TEST(SendOnceTest, EndlessChunkExtensionIsRefusedNotBuffered) {
  ScriptedServer server;
  server.Push(Canned::Raw("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=" + std::string(4 << 20, 'a') +
                          "\r\nhello\r\n0\r\n\r\n"));
  const auto result = SendOnce(Post(server), Millis(10000));
  ASSERT_FALSE(result.ok()) << "read a body of " << result->body.size() << " bytes";
  EXPECT_EQ(result.status().code(), StatusCode::kUnavailable) << result.status().ToString();
}

TEST(SendOnceTest, ServerThatNeverAnswersHitsTheDeadline) {
  ScriptedServer server;
  server.Push(Canned::NeverAnswer());
  const auto start = std::chrono::steady_clock::now();
  const auto result = SendOnce(Post(server), Millis(200));
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kDeadlineExceeded) << result.status().ToString();
  EXPECT_GE(elapsed, Millis(190));
  EXPECT_LT(elapsed, Millis(2000));
  EXPECT_EQ(server.requests().size(), 1u);
}

// A timeout too long for the clock (now + timeout overflows it) is no
// deadline at all, not one already passed.
TEST(SendOnceTest, AnEnormousTimeoutIsNoDeadline) {
  for (const Millis timeout : {Millis(9223372036854), Millis::max()}) {
    ScriptedServer server;
    server.Push(Canned::Answer(200, {}, "ok"));
    auto response = SendOnce(Post(server), timeout);
    ASSERT_TRUE(response.ok()) << timeout.count() << ": " << response.status().ToString();
    EXPECT_EQ(response->body, "ok");
  }
}

// An attempt that must end before it starts is refused, rather than sent and
// timed out (which a Client would retry).
TEST(SendOnceTest, ATimeoutUnderOneMillisecondIsRefusedBeforeConnecting) {
  for (const Millis timeout : {Millis(0), Millis(-1), Millis::min()}) {
    ScriptedServer server;
    server.Push(Canned::Answer(200, {}, "ok"));
    const auto result = SendOnce(Post(server), timeout);
    ASSERT_FALSE(result.ok()) << timeout.count();
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument) << result.status().ToString();
    EXPECT_EQ(result.status().message(),
              "timeout " + std::to_string(timeout.count()) + " ms: it must be at least 1 ms");
    EXPECT_TRUE(server.requests().empty());
  }
}

// ---------------------------------------------------------------------------
// Client

// A client whose sleeps are recorded instead of slept, with a fixed random value.
// Runs `sql` on the queue file directly, as another program (or a hand edit) could.
void RawExec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
  sqlite3_close(db);
  ASSERT_EQ(rc, SQLITE_OK) << sql;
}

struct Harness {
  explicit Harness(RetryPolicy policy = {}, std::uint64_t random = kMaxRandom, bool with_dlq = true) {
    if (with_dlq) {
      auto opened = DeadLetterQueue::Open(dir.Join("dlq.sqlite"));
      EXPECT_TRUE(opened.ok()) << opened.status().ToString();
      if (opened.ok()) dlq = std::move(*opened);
    }
    ClientOptions options;
    options.policy = policy;
    options.dlq = dlq.get();
    options.sleep = [this](Millis wait) { sleeps.push_back(wait); };
    options.random = [random] { return random; };
    client = std::make_unique<Client>(std::move(options));
  }

  idemgate::testing::TempDir dir;
  std::unique_ptr<DeadLetterQueue> dlq;
  std::vector<Millis> sleeps;
  std::unique_ptr<Client> client;
  ScriptedServer server;
};

// Every request carried the same sf-string key.
void ExpectSameKey(const std::vector<Recorded>& requests, const std::string& key) {
  for (std::size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(requests[i].Count("Idempotency-Key"), 1) << "attempt " << i + 1;
    EXPECT_EQ(requests[i].Get("Idempotency-Key"), "\"" + key + "\"") << "attempt " << i + 1;
  }
}

TEST(ClientTest, RetriesUntilSuccessUnderOneKey) {
  Harness h;
  h.server.Push(Canned::Answer(503));
  h.server.Push(Canned::Problem(503, "store-unavailable"));
  h.server.Push(Canned::Answer(200, {}, "done"));
  Request request = Post(h.server, "");
  const Outcome out = h.client->Send(request);
  EXPECT_TRUE(out.ok);
  EXPECT_EQ(out.error, "");
  EXPECT_EQ(out.attempts, 3);
  ASSERT_TRUE(out.response.has_value());
  EXPECT_EQ(out.response->status, 200);
  EXPECT_EQ(out.response->body, "done");
  EXPECT_FALSE(out.dead_letter_id.has_value());
  // A fresh v4 key, the same on every attempt.
  const std::regex v4("^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$");
  EXPECT_TRUE(std::regex_match(out.key, v4)) << out.key;
  const auto requests = h.server.requests();
  ASSERT_EQ(requests.size(), 3u);
  ExpectSameKey(requests, out.key);
  for (const auto& r : requests) {
    EXPECT_EQ(r.body, R"({"amount":100})");
    EXPECT_EQ(r.Get("Host"), "127.0.0.1:" + std::to_string(h.server.port()));
    EXPECT_EQ(r.Get("Content-Length"), "14");
  }
  // Two waits at the top of their ranges: base * 2^0, base * 2^1.
  EXPECT_EQ(h.sleeps, (std::vector<Millis>{Millis(250), Millis(500)}));
  // A success is never parked.
  EXPECT_TRUE(Entries(*h.dlq)->empty());
}

TEST(ClientTest, WaitsStayWithinTheBackoffBounds) {
  for (const std::uint64_t random : {std::uint64_t{0}, std::uint64_t{1} << 62, kMaxRandom / 3 * 2, kMaxRandom}) {
    Harness h(RetryPolicy{.max_attempts = 3, .base_delay = Millis(100), .max_delay = Millis(1000)}, random);
    h.server.Push(Canned::Answer(503));
    h.server.Push(Canned::Answer(502));
    h.server.Push(Canned::Answer(200));
    const Outcome out = h.client->Send(Post(h.server));
    ASSERT_TRUE(out.ok);
    ASSERT_EQ(h.sleeps.size(), 2u);
    EXPECT_GE(h.sleeps[0].count(), 0);
    EXPECT_LE(h.sleeps[0].count(), 100);
    EXPECT_GE(h.sleeps[1].count(), 0);
    EXPECT_LE(h.sleeps[1].count(), 200);
    EXPECT_EQ(h.sleeps[0], BackoffDelay(RetryPolicy{.base_delay = Millis(100), .max_delay = Millis(1000)}, 2, random));
  }
}

TEST(ClientTest, GivenKeyIsUsed) {
  Harness h;
  h.server.Push(Canned::Answer(500));
  h.server.Push(Canned::Answer(201));
  const Outcome out = h.client->Send(Post(h.server, "order-77"));
  EXPECT_TRUE(out.ok);
  EXPECT_EQ(out.key, "order-77");
  ExpectSameKey(h.server.requests(), "order-77");
}

TEST(ClientTest, RetryAfterLengthensTheWait) {
  Harness h;
  h.server.Push(Canned::Answer(503, {{"Retry-After", "2"}}));
  h.server.Push(Canned::Answer(200));
  const Outcome out = h.client->Send(Post(h.server));
  EXPECT_TRUE(out.ok);
  ASSERT_EQ(h.sleeps.size(), 1u);
  EXPECT_EQ(h.sleeps[0], Millis(2000));
}

TEST(ClientTest, RetryAfterIsCappedAtMaxDelay) {
  Harness h(RetryPolicy{.max_attempts = 2, .max_delay = Millis(1500)});
  h.server.Push(Canned::Problem(429, "too-many-requests", {{"Retry-After", "60"}}));
  h.server.Push(Canned::Answer(200));
  EXPECT_TRUE(h.client->Send(Post(h.server)).ok);
  EXPECT_EQ(h.sleeps, (std::vector<Millis>{Millis(1500)}));
}

TEST(ClientTest, ShortRetryAfterDoesNotShortenTheBackoff) {
  Harness h;
  h.server.Push(Canned::Answer(503, {{"Retry-After", "0"}}));
  h.server.Push(Canned::Answer(503, {{"Retry-After", "Sun, 06 Nov 1994 08:49:37 GMT"}}));
  h.server.Push(Canned::Answer(200));
  EXPECT_TRUE(h.client->Send(Post(h.server)).ok);
  EXPECT_EQ(h.sleeps, (std::vector<Millis>{Millis(250), Millis(500)}));
}

TEST(ClientTest, RetryAfterDateInTheFuture) {
  Harness h(RetryPolicy{.max_attempts = 2, .max_delay = Millis(60000)}, 0);
  // A whole-second date about 3 s ahead: the wait is between 2 and 3 s.
  const auto at = std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now()) + std::chrono::seconds(3);
  const std::time_t t = std::chrono::system_clock::to_time_t(at);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char date[64];
  ASSERT_GT(std::strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm), 0u);
  h.server.Push(Canned::Answer(503, {{"Retry-After", date}}));
  h.server.Push(Canned::Answer(200));
  EXPECT_TRUE(h.client->Send(Post(h.server)).ok);
  ASSERT_EQ(h.sleeps.size(), 1u);
  EXPECT_GT(h.sleeps[0], Millis(1000)) << date;
  EXPECT_LE(h.sleeps[0], Millis(3000)) << date;
}

TEST(ClientTest, BadRequestIsNotRetriedAndIsParked) {
  Harness h;
  h.server.Push(Canned::Problem(400, "missing-key"));
  Request request = Post(h.server, "k-400");
  const Outcome out = h.client->Send(request);
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.attempts, 1);
  EXPECT_TRUE(h.sleeps.empty());
  EXPECT_EQ(out.error, "400 Bad Request (missing-key)");
  ASSERT_TRUE(out.response.has_value());
  EXPECT_EQ(out.response->status, 400);
  ASSERT_TRUE(out.dead_letter_id.has_value());
  const auto entry = h.dlq->Get(*out.dead_letter_id);
  ASSERT_TRUE(entry.ok()) << entry.status().ToString();
  EXPECT_EQ(entry->status, EntryStatus::kPending);
  EXPECT_EQ(entry->attempts, 1);
  EXPECT_EQ(entry->last_status, 400);
  EXPECT_EQ(entry->error, out.error);
  EXPECT_EQ(entry->request.key, "k-400");
  EXPECT_EQ(entry->request.url, request.url);
  EXPECT_EQ(entry->request.body, request.body);
  EXPECT_EQ(entry->request.headers, request.headers);
}

TEST(ClientTest, KeyReusedIsNotRetried) {
  Harness h;
  h.server.Push(Canned::Problem(422, "key-reused"));
  const Outcome out = h.client->Send(Post(h.server));
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.attempts, 1);
  EXPECT_EQ(h.server.requests().size(), 1u);
  EXPECT_NE(out.error.find("422"), std::string::npos);
  EXPECT_NE(out.error.find("key-reused"), std::string::npos);
  ASSERT_TRUE(out.dead_letter_id.has_value());
  EXPECT_EQ(h.dlq->Get(*out.dead_letter_id)->last_status, 422);
}

TEST(ClientTest, RequestInFlightIsRetried) {
  Harness h;
  h.server.Push(Canned::Problem(409, "request-in-flight", {{"Retry-After", "1"}}));
  h.server.Push(Canned::Answer(200));
  const Outcome out = h.client->Send(Post(h.server));
  EXPECT_TRUE(out.ok);
  EXPECT_EQ(out.attempts, 2);
  EXPECT_EQ(h.sleeps, (std::vector<Millis>{Millis(1000)}));
  ExpectSameKey(h.server.requests(), out.key);
}

TEST(ClientTest, OtherConflictIsNotRetried) {
  Harness h;
  h.server.Push(Canned::Problem(409, "version-conflict"));
  const Outcome out = h.client->Send(Post(h.server));
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.attempts, 1);
}

// A 409 without the gateway's request-in-flight code is the upstream's own
// answer (the gateway stores none): another attempt would run it again.
TEST(ClientTest, AConflictWithoutACodeIsNotRetried) {
  Harness h;
  h.server.Push(Canned::Answer(409, {{"Retry-After", "1"}}, "conflict"));
  h.server.Push(Canned::Answer(200));
  const Outcome out = h.client->Send(Post(h.server));
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.attempts, 1);
  EXPECT_EQ(h.server.requests().size(), 1u);
  EXPECT_TRUE(h.sleeps.empty());
  EXPECT_EQ(out.error, "409 Conflict");
  EXPECT_TRUE(out.dead_letter_id.has_value());
}

// A key given only as a line of the key header is the key, on every Send:
// two Sends of one action carry one key (the gateway runs it once), the
// line is not sent twice, and a parked entry records that key.
TEST(ClientTest, AKeyHeaderLineGivesTheKey) {
  for (const std::string value : {"\"mykey-1\"", "mykey-1", " \"mykey-1\"  "}) {
    SCOPED_TRACE(value);
    Harness h(RetryPolicy{.max_attempts = 2});
    h.server.Push(Canned::Answer(503));
    h.server.Push(Canned::Answer(503));
    h.server.Push(Canned::Answer(201));
    Request request = Post(h.server, "");
    request.headers.emplace_back("idempotency-KEY", value);
    ASSERT_TRUE(ValidateRequest(request).ok());
    EXPECT_EQ(*RequestKey(request), "mykey-1");
    const Outcome first = h.client->Send(request);
    EXPECT_FALSE(first.ok);
    EXPECT_EQ(first.key, "mykey-1");
    const Outcome second = h.client->Send(request);
    EXPECT_TRUE(second.ok) << second.error;
    EXPECT_EQ(second.key, "mykey-1");
    const auto requests = h.server.requests();
    ASSERT_EQ(requests.size(), 3u);
    ExpectSameKey(requests, "mykey-1");
    ASSERT_TRUE(first.dead_letter_id.has_value());
    const auto entry = h.dlq->Get(*first.dead_letter_id);
    ASSERT_TRUE(entry.ok()) << entry.status().ToString();
    EXPECT_EQ(entry->request.key, "mykey-1");
    for (const Header& header : entry->request.headers) EXPECT_FALSE(EqualsIgnoreCaseAscii(header.first, "Idempotency-Key"));
  }
}

// SendOnce, too, sends the line's key (as an sf-string) in place of the line.
TEST(SendOnceTest, AKeyHeaderLineGivesTheKey) {
  ScriptedServer server;
  server.Push(Canned::Answer(200));
  Request request = Post(server, "");
  request.headers.emplace_back("Idempotency-Key", "bare-key");
  ASSERT_TRUE(SendOnce(request, Millis(5000)).ok());
  const auto got = server.requests().at(0);
  EXPECT_EQ(got.Count("Idempotency-Key"), 1);
  EXPECT_EQ(got.Get("Idempotency-Key"), "\"bare-key\"");
}

// Lines of the key header that cannot give one key are refused, as idemctl
// refuses them: neither sent nor parked.
TEST(ClientTest, KeyHeaderLinesThatDisagreeAreRefused) {
  Harness h;
  struct Case {
    std::string key;
    std::vector<Header> lines;
    std::string named;
  };
  const std::vector<Case> cases = {
      {"k-1", {{"Idempotency-Key", "\"other\""}}, "differ"},
      {"", {{"Idempotency-Key", "\"a\""}, {"idempotency-key", "\"a\""}}, "two Idempotency-Key headers"},
      {"k-1", {{"Idempotency-Key", "\"k-1\""}, {"Idempotency-Key", "\"k-1\""}}, "two Idempotency-Key headers"},
      {"", {{"Idempotency-Key", "\"\""}}, "the key is empty"},
      {"", {{"Idempotency-Key", ""}}, "the key is empty"},
      {"", {{"Idempotency-Key", "\"a\";p=1"}}, "nothing may follow"},
      {"", {{"Idempotency-Key", "\"a"}}, "no closing quote"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.named);
    Request request = Post(h.server, c.key);
    for (const Header& line : c.lines) request.headers.push_back(line);
    const Status valid = ValidateRequest(request);
    EXPECT_EQ(valid.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(valid.message().find(c.named), std::string::npos) << valid.message();
    const Outcome out = h.client->Send(request);
    EXPECT_EQ(out.attempts, 0);
    EXPECT_EQ(out.validation, valid);
    EXPECT_FALSE(out.dead_letter_id.has_value());
    EXPECT_EQ(SendOnce(request, Millis(5000)).status(), valid);
  }
  EXPECT_TRUE(h.server.requests().empty());
  // The same key in both is one key.
  Request request = Post(h.server, "k-1");
  request.headers.emplace_back("Idempotency-Key", "\"k-1\"");
  EXPECT_TRUE(ValidateRequest(request).ok());
}

// A line of the key header spelled with '_' for '-' (Idempotency_Key) is no
// line of the key header: it gives no key, so a new one would be sent on
// every Send (and the gateway drops the line), and each Send would run.
// Refused, naming the line and the spelling to use, for the default and a
// custom key header, with or without a key.
TEST(ClientTest, AKeyHeaderSpelledWithUnderscoresIsRefused) {
  Harness h;
  struct Case {
    std::string key_header;
    Header line;
    std::string key;
  };
  const std::vector<Case> cases = {
      {"Idempotency-Key", {"Idempotency_Key", "UK1"}, ""},
      {"Idempotency-Key", {"idempotency_key", "\"UK1\""}, "UK1"},
      {"Idempotency-Key", {"IDEMPOTENCY_KEY", "UK1"}, "other"},
      {"X-Idem-Key", {"X_Idem_Key", "UK1"}, ""},
      {"X-Idem-Key", {"x-idem_key", "UK1"}, "UK1"},
      {"X_Idem", {"X-Idem", "UK1"}, ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.line.first);
    Request request = Post(h.server, c.key);
    request.key_header = c.key_header;
    request.headers.push_back(c.line);
    const Status valid = ValidateRequest(request);
    EXPECT_EQ(valid.code(), StatusCode::kInvalidArgument) << valid.ToString();
    EXPECT_NE(valid.message().find("header " + c.line.first), std::string::npos) << valid.message();
    EXPECT_NE(valid.message().find("spell it " + c.key_header), std::string::npos) << valid.message();
    const Outcome out = h.client->Send(request);
    EXPECT_EQ(out.attempts, 0);
    EXPECT_EQ(out.validation.code(), StatusCode::kInvalidArgument);
    EXPECT_FALSE(out.dead_letter_id.has_value());
    EXPECT_EQ(SendOnce(request, Millis(5000)).status(), valid);
  }
  EXPECT_TRUE(h.server.requests().empty());
  // Other names with '_' are left alone.
  Request request = Post(h.server);
  request.headers.emplace_back("X_Trace_Id", "t");
  EXPECT_TRUE(ValidateRequest(request).ok());
}

// A key header that frames the request or belongs to its connection would
// send the key in a second Host or Content-Length line, as Transfer-Encoding,
// and so on: a server refuses that (400) on every attempt, and the request
// would be parked to fail again. Refused before anything is sent.
TEST(ClientTest, AKeyHeaderThatFramesTheRequestIsRefused) {
  Harness h;
  for (const std::string name : {"Host", "host", "Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive",
                                 "TE", "Trailer", "Upgrade", "Expect", "Proxy-Connection", "content_length"}) {
    SCOPED_TRACE(name);
    Request request = Post(h.server);
    request.key_header = name;
    const Status valid = ValidateRequest(request);
    EXPECT_EQ(valid.code(), StatusCode::kInvalidArgument) << valid.ToString();
    EXPECT_NE(valid.message().find("key header " + name), std::string::npos) << valid.message();
    const Outcome out = h.client->Send(request);
    EXPECT_EQ(out.attempts, 0);
    EXPECT_EQ(out.validation, valid);
    EXPECT_FALSE(out.dead_letter_id.has_value());
    EXPECT_EQ(SendOnce(request, Millis(5000)).status(), valid);
    // A Host line would otherwise be taken for the key's line.
    request.key = "";
    request.headers.emplace_back(name, "example.com");
    EXPECT_EQ(ValidateRequest(request).code(), StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(h.server.requests().empty());
  // Other fields may carry the key.
  h.server.Push(Canned::Answer(201));
  Request request = Post(h.server);
  request.headers = {};
  request.key_header = "Content-Type";
  EXPECT_TRUE(ValidateRequest(request).ok());
  const Outcome out = h.client->Send(request);
  EXPECT_TRUE(out.ok) << out.error;
  const auto requests = h.server.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].Count("Host"), 1);
  EXPECT_EQ(requests[0].Get("Content-Type"), "\"k-1\"");
  // Two Content-Length lines are refused as two Host lines are.
  request = Post(h.server);
  request.headers = {{"Content-Length", "14"}, {"content-length", "14"}};
  EXPECT_NE(ValidateRequest(request).message().find("two Content-Length headers"), std::string::npos)
      << ValidateRequest(request).ToString();
}

// A header name or value, a key or a host too long for a header line is an
// InvalidArgument naming the part, as any request that can never be sent.
TEST(ClientTest, PartsTooLongForAHeaderLineAreInvalidArguments) {
  Harness h;
  struct Case {
    Request request;
    std::string named;
  };
  std::vector<Case> cases;
  auto add = [&](std::string named, auto change) {
    Request request = Post(h.server);
    change(request);
    cases.push_back({std::move(request), std::move(named)});
  };
  add("header X-Big has a value of 65534 bytes (at most 65533)",
      [](Request& r) { r.headers.emplace_back("X-Big", std::string(65534, 'v')); });
  add("header X-Big has a value of 100000 bytes",
      [](Request& r) { r.headers.emplace_back("X-Big", std::string(100000, 'v')); });
  add("bytes long (at most 65533)", [](Request& r) { r.headers.emplace_back(std::string(70000, 'N'), "v"); });
  add("the key is 65532 bytes long", [](Request& r) { r.key = std::string(65532, 'k'); });
  add("the key header name is 65534 bytes long", [](Request& r) { r.key_header = std::string(65534, 'K'); });
  add("the URL's host is", [&](Request& r) { r.url = "http://" + std::string(65534, 'h') + "/x"; });
  for (const Case& c : cases) {
    const Status valid = ValidateRequest(c.request);
    EXPECT_EQ(valid.code(), StatusCode::kInvalidArgument) << c.named << ": " << valid.ToString();
    EXPECT_NE(valid.message().find(c.named), std::string::npos) << c.named << ": " << valid.message().substr(0, 200);
    const Outcome out = h.client->Send(c.request);
    EXPECT_EQ(out.attempts, 0) << c.named;
    EXPECT_EQ(out.validation, valid) << c.named;
    EXPECT_FALSE(out.dead_letter_id.has_value()) << c.named;
  }
  EXPECT_TRUE(h.server.requests().empty());
  // The longest value passes.
  Request request = Post(h.server);
  request.headers.emplace_back("X-Big", std::string(65533, 'v'));
  EXPECT_TRUE(ValidateRequest(request).ok());
}

TEST(ClientTest, ExhaustedRetriesAreParked) {
  Harness h(RetryPolicy{.max_attempts = 4});
  for (int i = 0; i < 4; ++i) h.server.Push(Canned::Answer(i < 3 ? 500 : 504));
  Request request = Post(h.server, "k-exhausted");
  const Outcome out = h.client->Send(request);
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.attempts, 4);
  EXPECT_EQ(out.error, "504 Gateway Timeout");
  EXPECT_EQ(h.sleeps.size(), 3u);  // none after the last attempt
  ASSERT_TRUE(out.dead_letter_id.has_value());
  const auto entries = Entries(*h.dlq);
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 1u);
  const DeadLetter& entry = entries->front();
  EXPECT_EQ(entry.id, *out.dead_letter_id);
  EXPECT_EQ(entry.attempts, 4);
  EXPECT_EQ(entry.last_status, 504);
  EXPECT_EQ(entry.error, "504 Gateway Timeout");
  EXPECT_EQ(entry.request.key, "k-exhausted");
  EXPECT_EQ(entry.request.method, "POST");
  EXPECT_EQ(entry.request.key_header, "Idempotency-Key");
  EXPECT_GT(entry.created_unix_ms, 0);
  ExpectSameKey(h.server.requests(), "k-exhausted");
}

TEST(ClientTest, ConnectionRefusedIsRetriedThenParked) {
  Harness h;
  Request request;
  request.url = "http://127.0.0.1:" + std::to_string(ClosedPort()) + "/v1/x";
  request.body = "b";
  const Outcome out = h.client->Send(request);
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.attempts, 3);
  EXPECT_EQ(h.sleeps.size(), 2u);
  EXPECT_FALSE(out.response.has_value());
  EXPECT_NE(out.error.find("connection refused"), std::string::npos) << out.error;
  ASSERT_TRUE(out.dead_letter_id.has_value());
  const auto entry = h.dlq->Get(*out.dead_letter_id);
  ASSERT_TRUE(entry.ok());
  EXPECT_EQ(entry->last_status, 0);
  EXPECT_EQ(entry->attempts, 3);
  EXPECT_EQ(entry->request.key, out.key);
  EXPECT_NE(entry->error.find("connection refused"), std::string::npos);
}

TEST(ClientTest, TransportErrorThenSuccess) {
  Harness h;
  h.server.Push(Canned::Close());
  h.server.Push(Canned::Answer(200));
  const Outcome out = h.client->Send(Post(h.server));
  EXPECT_TRUE(out.ok);
  EXPECT_EQ(out.attempts, 2);
  ExpectSameKey(h.server.requests(), out.key);
}

TEST(ClientTest, LastAttemptWithoutResponseLeavesNoResponse) {
  Harness h(RetryPolicy{.max_attempts = 2});
  h.server.Push(Canned::Answer(503));
  h.server.Push(Canned::Close());
  const Outcome out = h.client->Send(Post(h.server));
  EXPECT_FALSE(out.ok);
  EXPECT_FALSE(out.response.has_value());
  ASSERT_TRUE(out.dead_letter_id.has_value());
  EXPECT_EQ(h.dlq->Get(*out.dead_letter_id)->last_status, 0);
}

TEST(ClientTest, SingleAttemptPolicyNeverSleeps) {
  Harness h(RetryPolicy{.max_attempts = 1});
  h.server.Push(Canned::Answer(503));
  const Outcome out = h.client->Send(Post(h.server));
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.attempts, 1);
  EXPECT_TRUE(h.sleeps.empty());
  EXPECT_TRUE(out.dead_letter_id.has_value());
}

TEST(ClientTest, BadUrlIsNeitherSentNorRetried) {
  Harness h;
  Request request;
  request.url = "ftp://127.0.0.1/";
  const Outcome out = h.client->Send(request);
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.attempts, 0);
  EXPECT_TRUE(h.sleeps.empty());
  EXPECT_EQ(out.validation.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out.error.find("only http:// and https:// are supported"), std::string::npos) << out.error;
}

// Requests that no attempt could send: refused before the first attempt,
// and not parked (a replay would fail the same way).
TEST(ClientTest, RequestsThatCanNeverBeSentAreNeitherSentNorParked) {
  Harness h;
  struct Case {
    Request request;
    std::string named;  // what the error must name
  };
  std::vector<Case> cases;
  auto add = [&](std::string named, auto change) {
    Request request = Post(h.server);
    change(request);
    cases.push_back({std::move(request), std::move(named)});
  };
  add("ftp://x", [](Request& r) { r.url = "ftp://x"; });
  add("space", [&](Request& r) { r.url = h.server.Url("/a b"); });
  add("key header", [](Request& r) { r.key_header = ""; });
  add("Bad Name", [](Request& r) { r.headers.emplace_back("Bad Name", "v"); });
  add("X-Evil", [](Request& r) { r.headers.emplace_back("X-Evil", "a\r\nX-Injected: 1"); });
  add("X-Evil", [](Request& r) { r.headers.emplace_back("X-Evil", "a\nb"); });
  add("X-Ctl", [](Request& r) { r.headers.emplace_back("X-Ctl", "a\x01" "b"); });
  add("X-Ctl", [](Request& r) { r.headers.emplace_back("X-Ctl", "a\x1b[31m"); });
  add("X-Ctl", [](Request& r) { r.headers.emplace_back("X-Ctl", "a\x7f"); });
  add("two Host headers", [](Request& r) {
    r.headers.emplace_back("Host", "a.example");
    r.headers.emplace_back("host", "b.example");
  });
  add("key", [](Request& r) { r.key = "caf\xc3\xa9"; });
  add("key", [](Request& r) { r.key = "bad\nkey"; });
  add("PO ST", [](Request& r) { r.method = "PO ST"; });
  for (const Case& c : cases) {
    const Outcome out = h.client->Send(c.request);
    EXPECT_FALSE(out.ok) << c.named;
    EXPECT_EQ(out.attempts, 0) << c.named;
    EXPECT_FALSE(out.dead_letter_id.has_value()) << c.named << ": " << out.error;
    EXPECT_NE(out.error.find(c.named), std::string::npos) << c.named << ": " << out.error;
    EXPECT_EQ(out.validation.code(), StatusCode::kInvalidArgument) << c.named;
    EXPECT_EQ(out.validation.message(), out.error) << c.named;
    // The same verdict from ValidateRequest alone, before any Send.
    EXPECT_EQ(ValidateRequest(c.request), out.validation) << c.named;
  }
  const auto entries = Entries(*h.dlq);
  ASSERT_TRUE(entries.ok());
  EXPECT_TRUE(entries->empty());
  EXPECT_TRUE(h.sleeps.empty());
  EXPECT_TRUE(h.server.requests().empty());
}

TEST(ClientTest, ValidateRequestAcceptsWhatCanBeSent) {
  ScriptedServer server;
  EXPECT_TRUE(ValidateRequest(Post(server)).ok());
  Request request = Post(server, "");  // no key: no key header needed either
  request.key_header = "";
  EXPECT_TRUE(ValidateRequest(request).ok());
  request.url = "https://example.com/x?y=%20z";  // no TLS file is read
  EXPECT_TRUE(ValidateRequest(request).ok());
  // Anything past the first attempt is not its to judge: a valid request
  // with an sf-string key the default gateway rules would refuse still passes.
  request.key = R"(a"b\c)";
  request.key_header = "X-Idem";
  EXPECT_TRUE(ValidateRequest(request).ok());
  // A tab and bytes past ASCII (obs-text) may be in a value; one Host line may be given.
  request.headers = {{"X-Tab", "a\tb"}, {"X-Latin1", "caf\xe9"}, {"Host", "example.com"}};
  EXPECT_TRUE(ValidateRequest(request).ok());
  EXPECT_TRUE(server.requests().empty());
}

// Each attempt's lookup ends at its timeout: the request is retried, then parked.
TEST(ClientTest, ANameLookupThatDoesNotAnswerIsRetriedThenParked) {
  HangingLookup hanging;
  Harness h(RetryPolicy{.max_attempts = 2, .timeout = Millis(100)});
  Request request = Post(h.server);
  request.url = "http://hangs.invalid/v1/payments";
  const Outcome out = h.client->Send(request);
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.attempts, 2);
  EXPECT_EQ(out.error, "timed out after 100 ms resolving hangs.invalid");
  EXPECT_EQ(h.sleeps.size(), 1u);
  ASSERT_TRUE(out.dead_letter_id.has_value());
  EXPECT_EQ(h.dlq->Get(*out.dead_letter_id)->error, out.error);
}

TEST(ClientTest, WithoutADlqNothingIsParked) {
  Harness h(RetryPolicy{}, kMaxRandom, /*with_dlq=*/false);
  h.server.Push(Canned::Answer(400));
  const Outcome out = h.client->Send(Post(h.server));
  EXPECT_FALSE(out.ok);
  EXPECT_FALSE(out.dead_letter_id.has_value());
  EXPECT_EQ(out.error, "400 Bad Request");
}

TEST(ClientTest, RedirectIsASuccess) {
  Harness h;
  h.server.Push(Canned::Answer(302, {{"Location", "/elsewhere"}}));
  const Outcome out = h.client->Send(Post(h.server));
  EXPECT_TRUE(out.ok);
  EXPECT_EQ(out.attempts, 1);
  EXPECT_EQ(out.response->Header("Location"), "/elsewhere");
}

TEST(ClientTest, TimeoutIsRetriedThenParked) {
  Harness h(RetryPolicy{.max_attempts = 2, .timeout = Millis(50)});
  h.server.Push(Canned::NeverAnswer());
  h.server.Push(Canned::NeverAnswer());
  const Outcome out = h.client->Send(Post(h.server));
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.attempts, 2);
  EXPECT_NE(out.error.find("timed out"), std::string::npos) << out.error;
  ASSERT_TRUE(out.dead_letter_id.has_value());
  EXPECT_EQ(h.dlq->Get(*out.dead_letter_id)->last_status, 0);
}

TEST(ClientTest, OnAttemptReportsEachAttemptAndTheWaitAfterIt) {
  ScriptedServer server;
  server.Push(Canned::Answer(503));
  server.Push(Canned::Answer(201));
  std::vector<AttemptReport> reports;
  Client client(ClientOptions{.policy = RetryPolicy{.base_delay = Millis(100)},
                              .sleep = [](Millis) {},
                              .random = [] { return kMaxRandom; },
                              .on_attempt = [&](const AttemptReport& r) { reports.push_back(r); }});
  EXPECT_TRUE(client.Send(Post(server)).ok);
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].attempt, 1);
  EXPECT_FALSE(reports[0].ok);
  EXPECT_EQ(reports[0].status, 503);
  EXPECT_EQ(reports[0].summary, "503 Service Unavailable");
  EXPECT_EQ(reports[0].wait, Millis(100));
  EXPECT_EQ(reports[1].attempt, 2);
  EXPECT_TRUE(reports[1].ok);
  EXPECT_EQ(reports[1].status, 201);
  EXPECT_EQ(reports[1].summary, "201 Created");
  EXPECT_EQ(reports[1].wait, std::nullopt);

  // A transport error, on the last attempt: no wait after it.
  reports.clear();
  Request refused = Post(server);
  refused.url = "http://127.0.0.1:" + std::to_string(ClosedPort()) + "/";
  Client once(ClientOptions{.policy = RetryPolicy{.max_attempts = 1},
                            .on_attempt = [&](const AttemptReport& r) { reports.push_back(r); }});
  EXPECT_FALSE(once.Send(refused).ok);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].status, 0);
  EXPECT_NE(reports[0].summary.find("connection refused"), std::string::npos) << reports[0].summary;
  EXPECT_EQ(reports[0].wait, std::nullopt);
}

TEST(ClientTest, DefaultSleepAndRandomAreUsable) {
  ScriptedServer server;
  server.Push(Canned::Answer(503));
  server.Push(Canned::Answer(200));
  Client client(ClientOptions{.policy = RetryPolicy{.base_delay = Millis(20), .max_delay = Millis(20)}});
  const auto start = std::chrono::steady_clock::now();
  const Outcome out = client.Send(Post(server));
  EXPECT_TRUE(out.ok);
  EXPECT_EQ(out.attempts, 2);
  EXPECT_LT(std::chrono::steady_clock::now() - start, Millis(2000));
}

// ---------------------------------------------------------------------------
// Interruption (SIGTERM in idemctl)

TEST(InterruptionTest, TriggerEndsASleepAndStays) {
  Interruption interruption;
  EXPECT_FALSE(interruption.triggered());
  EXPECT_FALSE(interruption.SleepFor(Millis(1)));
  std::thread trigger([&] { interruption.Trigger(); });
  EXPECT_TRUE(interruption.SleepFor(std::chrono::hours(1)));
  trigger.join();
  EXPECT_TRUE(interruption.triggered());
  EXPECT_TRUE(interruption.SleepFor(std::chrono::hours(1)));
}

// A client with the real sleep, an interruption and a DLQ, sending from its
// own thread.
struct InterruptHarness {
  explicit InterruptHarness(RetryPolicy policy) {
    auto opened = DeadLetterQueue::Open(dir.Join("dlq.sqlite"));
    EXPECT_TRUE(opened.ok()) << opened.status().ToString();
    if (opened.ok()) dlq = std::move(*opened);
    options.policy = policy;
    options.dlq = dlq.get();
    options.interruption = &interruption;
  }

  // Sends Post(server) in another thread, calls `then` in this one, and waits for the outcome.
  template <typename Then>
  Outcome SendAnd(Then then) {
    Outcome out;
    Client client(options);
    std::thread sender([&] { out = client.Send(Post(server)); });
    then();
    sender.join();
    return out;
  }

  idemgate::testing::TempDir dir;
  std::unique_ptr<DeadLetterQueue> dlq;
  Interruption interruption;
  ClientOptions options;
  ScriptedServer server;
};

// Waits for the server to have read `n` requests.
void AwaitRequests(const ScriptedServer& server, std::size_t n) {
  while (server.requests().size() < n) std::this_thread::sleep_for(Millis(1));
}

TEST(ClientInterruptTest, ATriggerEndsTheWaitForTheNextAttemptAndTheRequestIsParked) {
  InterruptHarness h(RetryPolicy{.max_attempts = 3, .max_delay = std::chrono::hours(2)});
  h.server.Push(Canned::Answer(503, {{"Retry-After", "3600"}}));
  h.server.Push(Canned::Answer(201));  // never reached
  std::atomic<bool> waiting = false;
  h.options.random = [&] {  // drawn just before the wait
    waiting = true;
    return kMaxRandom;
  };
  const Outcome out = h.SendAnd([&] {
    while (!waiting) std::this_thread::sleep_for(Millis(1));
    h.interruption.Trigger();
  });
  EXPECT_FALSE(out.ok);
  EXPECT_TRUE(out.interrupted);
  EXPECT_EQ(out.attempts, 1);
  EXPECT_EQ(h.server.requests().size(), 1u);
  EXPECT_EQ(out.error, "interrupted after 1 attempt (the last: 503 Service Unavailable)");
  ASSERT_TRUE(out.dead_letter_id.has_value());
  const auto entry = h.dlq->Get(*out.dead_letter_id);
  ASSERT_TRUE(entry.ok());
  EXPECT_EQ(entry->request.key, "k-1");
  EXPECT_EQ(entry->error, out.error);
  EXPECT_EQ(entry->attempts, 1);
  EXPECT_EQ(entry->last_status, 503);
}

TEST(ClientInterruptTest, ATriggerCutsTheAttemptInProgress) {
  InterruptHarness h(RetryPolicy{.max_attempts = 3, .timeout = std::chrono::hours(1)});
  h.server.Push(Canned::NeverAnswer());
  const Outcome out = h.SendAnd([&] {
    AwaitRequests(h.server, 1);
    h.interruption.Trigger();
  });
  EXPECT_FALSE(out.ok);
  EXPECT_TRUE(out.interrupted);
  EXPECT_EQ(out.attempts, 1);
  EXPECT_FALSE(out.response.has_value());
  // Cut while waiting for the response (or, just possibly, while the write's completion was on its way).
  EXPECT_TRUE(std::regex_match(out.error, std::regex("interrupted while (waiting for the response from|sending to) "
                                                     "127\\.0\\.0\\.1:[0-9]+ \\(attempt 1; the request may "
                                                     "have reached the server\\)")))
      << out.error;
  ASSERT_TRUE(out.dead_letter_id.has_value());
  EXPECT_EQ(h.dlq->Get(*out.dead_letter_id)->error, out.error);
  EXPECT_EQ(h.server.requests().size(), 1u);
}

TEST(ClientInterruptTest, TriggeredBeforeTheFirstAttemptNothingIsSentButTheRequestIsParked) {
  InterruptHarness h(RetryPolicy{});
  h.interruption.Trigger();
  const auto once = SendOnce(Post(h.server), Millis(5000), {}, &h.interruption);
  ASSERT_FALSE(once.ok());
  EXPECT_EQ(once.status().code(), StatusCode::kAborted);
  const Outcome out = h.SendAnd([] {});
  EXPECT_TRUE(out.interrupted);
  EXPECT_EQ(out.attempts, 0);
  EXPECT_EQ(out.error, "interrupted before the first attempt");
  ASSERT_TRUE(out.dead_letter_id.has_value());
  EXPECT_EQ(h.dlq->Get(*out.dead_letter_id)->attempts, 0);
  EXPECT_TRUE(h.server.requests().empty());
}

// Stopped before its first attempt, a replay sent nothing: the entry is put
// back with that error, its last attempt and last status as they were.
TEST(ClientInterruptTest, AReplayInterruptedBeforeItsFirstAttemptKeepsTheLastAttempt) {
  InterruptHarness h(RetryPolicy{});
  const auto id = h.dlq->Park(Post(h.server), "503 Service Unavailable", 3, 503);
  ASSERT_TRUE(id.ok());
  RawExec(h.dir.Join("dlq.sqlite"), "UPDATE dead_letters SET last_attempt_unix_ms = 1000000000000");
  const auto before = h.dlq->Get(*id);
  ASSERT_TRUE(before.ok());
  h.interruption.Trigger();
  Client client(h.options);
  const auto replay = client.Replay(*id);
  ASSERT_TRUE(replay.ok()) << replay.status().ToString();
  EXPECT_TRUE(replay->interrupted);
  EXPECT_EQ(replay->attempts, 0);
  const auto entry = h.dlq->Get(*id);
  ASSERT_TRUE(entry.ok());
  EXPECT_EQ(entry->status, EntryStatus::kPending);
  EXPECT_EQ(entry->error, "interrupted before the first attempt");
  EXPECT_EQ(entry->attempts, 3);
  EXPECT_EQ(entry->last_status, 503);
  EXPECT_EQ(entry->last_attempt_unix_ms, 1000000000000);
  EXPECT_EQ(entry->last_attempt_unix_ms, before->last_attempt_unix_ms);
  EXPECT_TRUE(h.server.requests().empty());
}

TEST(ClientInterruptTest, AnInterruptedReplayPutsTheEntryBack) {
  InterruptHarness h(RetryPolicy{.timeout = std::chrono::hours(1)});
  const auto id = h.dlq->Park(Post(h.server), "503 Service Unavailable", 3, 503);
  ASSERT_TRUE(id.ok());
  h.server.Push(Canned::NeverAnswer());
  Client client(h.options);
  StatusOr<Outcome> replay = InternalError("not run");
  std::thread replayer([&] { replay = client.Replay(*id); });
  AwaitRequests(h.server, 1);
  h.interruption.Trigger();
  replayer.join();
  ASSERT_TRUE(replay.ok()) << replay.status().ToString();
  EXPECT_TRUE(replay->interrupted);
  const auto entry = h.dlq->Get(*id);
  ASSERT_TRUE(entry.ok());
  EXPECT_EQ(entry->status, EntryStatus::kPending);
  EXPECT_EQ(entry->attempts, 4);
  EXPECT_TRUE(entry->error.starts_with("interrupted while ")) << entry->error;
}

// ---------------------------------------------------------------------------
// Replay

TEST(ClientReplayTest, ReplaysUnderTheOriginalKeyAndMarksReplayed) {
  Harness h;
  for (int i = 0; i < 3; ++i) h.server.Push(Canned::Answer(503));
  const Outcome first = h.client->Send(Post(h.server, ""));
  ASSERT_FALSE(first.ok);
  ASSERT_TRUE(first.dead_letter_id.has_value());
  const std::int64_t id = *first.dead_letter_id;

  h.server.Push(Canned::Answer(201, {}, "made"));
  const auto replay = h.client->Replay(id);
  ASSERT_TRUE(replay.ok()) << replay.status().ToString();
  EXPECT_TRUE(replay->ok);
  EXPECT_EQ(replay->key, first.key);
  EXPECT_EQ(replay->attempts, 1);
  EXPECT_EQ(replay->dead_letter_id, id);
  EXPECT_EQ(replay->response->body, "made");

  const auto requests = h.server.requests();
  ASSERT_EQ(requests.size(), 4u);
  ExpectSameKey(requests, first.key);
  EXPECT_EQ(requests[3].body, requests[0].body);
  EXPECT_EQ(requests[3].target, requests[0].target);
  EXPECT_EQ(requests[3].Get("X-Trace"), "t-1");

  const auto entry = h.dlq->Get(id);
  ASSERT_TRUE(entry.ok());
  EXPECT_EQ(entry->status, EntryStatus::kReplayed);
  EXPECT_EQ(entry->attempts, 4);
  EXPECT_EQ(entry->last_status, 201);
  EXPECT_EQ(Entries(*h.dlq)->size(), 1u);

  // A replayed entry cannot be replayed again.
  const auto again = h.client->Replay(id);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("replayed"), std::string::npos) << again.status().message();
}

TEST(ClientReplayTest, FailedReplayGoesBackToPendingAndIsNotParkedAgain) {
  Harness h(RetryPolicy{.max_attempts = 2});
  h.server.Push(Canned::Answer(400));
  const Outcome first = h.client->Send(Post(h.server));
  ASSERT_TRUE(first.dead_letter_id.has_value());
  const std::int64_t id = *first.dead_letter_id;

  h.server.Push(Canned::Answer(503));
  h.server.Push(Canned::Problem(502, "upstream-unavailable"));
  const auto replay = h.client->Replay(id);
  ASSERT_TRUE(replay.ok()) << replay.status().ToString();
  EXPECT_FALSE(replay->ok);
  EXPECT_EQ(replay->attempts, 2);
  EXPECT_EQ(replay->error, "502 Bad Gateway (upstream-unavailable)");

  const auto entries = Entries(*h.dlq);
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 1u);  // not parked a second time
  EXPECT_EQ(entries->front().status, EntryStatus::kPending);
  EXPECT_EQ(entries->front().attempts, 3);
  EXPECT_EQ(entries->front().last_status, 502);
  EXPECT_EQ(entries->front().error, "502 Bad Gateway (upstream-unavailable)");
  ExpectSameKey(h.server.requests(), first.key);

  // Pending again: it can be replayed once more.
  h.server.Push(Canned::Answer(200));
  const auto third = h.client->Replay(id);
  ASSERT_TRUE(third.ok());
  EXPECT_TRUE(third->ok);
  EXPECT_EQ(h.dlq->Get(id)->status, EntryStatus::kReplayed);
  EXPECT_EQ(h.dlq->Get(id)->attempts, 4);
}

TEST(ClientReplayTest, UnknownOrDiscardedEntries) {
  Harness h;
  const auto unknown = h.client->Replay(12345);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);

  h.server.Push(Canned::Answer(400));
  const Outcome first = h.client->Send(Post(h.server));
  ASSERT_TRUE(first.dead_letter_id.has_value());
  ASSERT_TRUE(h.dlq->Discard(*first.dead_letter_id).ok());
  const auto discarded = h.client->Replay(*first.dead_letter_id);
  ASSERT_FALSE(discarded.ok());
  EXPECT_EQ(discarded.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(discarded.status().message().find("discarded"), std::string::npos);
  EXPECT_EQ(h.server.requests().size(), 1u);
}

// An entry parked before Send checked requests (or edited by hand): refused
// without sending, and left pending, unchanged (its last attempt's time
// included: none was made), for `discard`.
TEST(ClientReplayTest, AnEntryThatCanNeverBeSentIsPutBackUntouched) {
  for (const std::string url : {"http://h/a b", "ftp://x"}) {
    SCOPED_TRACE(url);
    Harness h;
    Request request = Post(h.server);
    request.url = url;
    const auto id = h.dlq->Park(request, "bad URL", 1, 503);
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    RawExec(h.dir.Join("dlq.sqlite"), "UPDATE dead_letters SET last_attempt_unix_ms = 1000000000000");
    const auto before = h.dlq->Get(*id);
    ASSERT_TRUE(before.ok());
    const auto replay = h.client->Replay(*id);
    ASSERT_FALSE(replay.ok());
    EXPECT_EQ(replay.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(replay.status().message().find("can never be sent"), std::string::npos) << replay.status().message();
    const auto entry = h.dlq->Get(*id);
    ASSERT_TRUE(entry.ok());
    EXPECT_EQ(entry->status, EntryStatus::kPending);
    EXPECT_FALSE(entry->claim.has_value());
    EXPECT_EQ(entry->attempts, 1);
    EXPECT_EQ(entry->error, "bad URL");
    EXPECT_EQ(entry->last_status, 503);
    EXPECT_EQ(entry->last_attempt_unix_ms, 1000000000000);
    EXPECT_EQ(entry->last_attempt_unix_ms, before->last_attempt_unix_ms);
    EXPECT_TRUE(h.server.requests().empty());
    EXPECT_TRUE(h.dlq->Discard(*id).ok());
  }
}

// A replay whose entry was released (forced) while it ran cannot record its
// result; the outcome it got, the response included, is still given back.
TEST(ClientReplayTest, AnUnrecordedReplayStillGivesItsOutcome) {
  Harness h;
  const auto id = h.dlq->Park(Post(h.server), "503 Service Unavailable", 1, 503);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  h.server.Push(Canned::Answer(201, {}, "made"));
  ClientOptions options;
  options.dlq = h.dlq.get();
  options.on_attempt = [&](const AttemptReport&) { EXPECT_TRUE(h.dlq->Release(*id, /*force=*/true).ok()); };
  Client client(options);
  Outcome unrecorded;
  const auto replay = client.Replay(*id, &unrecorded);
  ASSERT_FALSE(replay.ok());
  EXPECT_EQ(replay.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(replay.status().message().find("was replayed (ok) but the result was not recorded"), std::string::npos)
      << replay.status().message();
  EXPECT_TRUE(unrecorded.ok);
  EXPECT_EQ(unrecorded.attempts, 1);
  ASSERT_TRUE(unrecorded.response.has_value());
  EXPECT_EQ(unrecorded.response->status, 201);
  EXPECT_EQ(unrecorded.response->body, "made");
  // The entry stays as the release left it.
  EXPECT_EQ(h.dlq->Get(*id)->status, EntryStatus::kPending);
  EXPECT_EQ(h.dlq->Get(*id)->attempts, 1);
}

// A policy outside ValidatePolicy's bounds (a library user's mistake) sends
// nothing and parks nothing: no attempt, wait or claim is computed from it.
TEST(ClientTest, APolicyOutOfBoundsIsRefusedBeforeAnythingIsSentOrParked) {
  for (const RetryPolicy& policy : {RetryPolicy{.max_attempts = 0}, RetryPolicy{.max_attempts = 1000000},
                                    RetryPolicy{.base_delay = Millis(-1)}, RetryPolicy{.max_delay = Millis::max()},
                                    RetryPolicy{.timeout = Millis(0)}, RetryPolicy{.timeout = Millis::max()}}) {
    Harness h(policy);
    h.server.Push(Canned::Answer(503));
    const Outcome out = h.client->Send(Post(h.server));
    EXPECT_FALSE(out.ok);
    EXPECT_EQ(out.attempts, 0);
    EXPECT_EQ(out.validation.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(out.error, out.validation.message());
    EXPECT_TRUE(out.error.starts_with("retry policy: ")) << out.error;
    EXPECT_FALSE(out.dead_letter_id.has_value());
    EXPECT_TRUE(Entries(*h.dlq)->empty());
    EXPECT_TRUE(h.server.requests().empty());
    EXPECT_TRUE(h.sleeps.empty());
  }
}

TEST(ClientReplayTest, APolicyOutOfBoundsFailsBeforeTheEntryIsClaimed) {
  for (const RetryPolicy& policy : {RetryPolicy{.max_attempts = std::numeric_limits<int>::max()},
                                    RetryPolicy{.max_delay = Millis::max()}, RetryPolicy{.timeout = Millis::max()}}) {
    Harness h(policy);
    const auto id = h.dlq->Park(Post(h.server), "503 Service Unavailable", 1, 503);
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    const auto replay = h.client->Replay(*id);
    ASSERT_FALSE(replay.ok());
    EXPECT_EQ(replay.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(replay.status().message().starts_with("retry policy: ")) << replay.status().message();
    const auto entry = h.dlq->Get(*id);
    ASSERT_TRUE(entry.ok());
    EXPECT_EQ(entry->status, EntryStatus::kPending);
    EXPECT_FALSE(entry->claim.has_value());
    EXPECT_TRUE(h.server.requests().empty());
  }
}

TEST(ClientReplayTest, WithoutADlq) {
  Harness h(RetryPolicy{}, kMaxRandom, /*with_dlq=*/false);
  const auto replay = h.client->Replay(1);
  ASSERT_FALSE(replay.ok());
  EXPECT_EQ(replay.status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace idemgate::client
