#include "store/redis/resp.h"

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <random>

namespace idemgate::store::redis {
namespace {

using Result = RespParser::Result;

std::vector<Reply> ParseAll(RespParser& p) {
  std::vector<Reply> out;
  Reply r;
  while (p.Next(&r) == Result::kReply) out.push_back(std::move(r));
  return out;
}

std::vector<Reply> ParseAll(std::string_view wire) {
  RespParser p;
  p.Feed(wire);
  return ParseAll(p);
}

TEST(RespEncodeTest, CommandIsAnArrayOfBulkStrings) {
  EXPECT_EQ(EncodeCommand({"SET", "k", "v"}), "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n");
  EXPECT_EQ(EncodeCommand({"GET", ""}), "*2\r\n$3\r\nGET\r\n$0\r\n\r\n");
}

TEST(RespEncodeTest, BinaryArgumentsAreLengthPrefixed) {
  const std::string binary("a\r\n\0b", 5);
  EXPECT_EQ(EncodeCommand({"SET", binary}), std::string("*2\r\n$3\r\nSET\r\n$5\r\na\r\n\0b\r\n", 24));
}

// hiredis's own command formatter is the reference: argument lengths across
// every digit boundary, up to 20 arguments, and appending after bytes
// already in the buffer (commands are pipelined into one string).
TEST(RespEncodeTest, MatchesHiredisForEveryLengthAndArgumentCount) {
  std::mt19937 rng(42);
  const std::size_t sizes[] = {0, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 9999, 10000, 123456};
  for (int round = 0; round < 400; ++round) {
    const std::size_t argc = round < 21 ? static_cast<std::size_t>(round) : rng() % 21;
    std::vector<std::string> args;
    for (std::size_t i = 0; i < argc; ++i) {
      std::string a(sizes[rng() % std::size(sizes)], '\0');
      for (char& c : a) c = static_cast<char>(rng());
      args.push_back(std::move(a));
    }
    std::vector<const char*> argv;
    std::vector<std::size_t> argvlen;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      argvlen.push_back(a.size());
    }
    char* formatted = nullptr;
    const long long n = redisFormatCommandArgv(&formatted, static_cast<int>(argc), argv.data(), argvlen.data());
    ASSERT_GE(n, 0);
    const std::string want(formatted, static_cast<std::size_t>(n));
    redisFreeCommand(formatted);
    ASSERT_EQ(EncodeCommand(args), want) << "round " << round;
    std::string pipelined = "*1\r\n$4\r\nPING\r\n";
    AppendCommand(&pipelined, args);
    ASSERT_EQ(pipelined, "*1\r\n$4\r\nPING\r\n" + want) << "round " << round;
  }
}

TEST(RespParserTest, ParsesEveryScalarType) {
  auto replies = ParseAll("+OK\r\n-ERR bad thing\r\n:42\r\n:-7\r\n$5\r\nhello\r\n$0\r\n\r\n$-1\r\n");
  ASSERT_EQ(replies.size(), 7u);
  EXPECT_EQ(replies[0], Reply::StatusReply("OK"));
  EXPECT_EQ(replies[1], Reply::Error("ERR bad thing"));
  EXPECT_EQ(replies[2], Reply::Integer(42));
  EXPECT_EQ(replies[3], Reply::Integer(-7));
  EXPECT_EQ(replies[4], Reply::String("hello"));
  EXPECT_EQ(replies[5], Reply::String(""));
  EXPECT_EQ(replies[6], Reply::Nil());
}

TEST(RespParserTest, BulkStringsAreBinarySafe) {
  const std::string body("\r\n\0\xff$-1\r\n*2", 11);
  std::string wire = "$11\r\n" + body + "\r\n";
  auto replies = ParseAll(wire);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].type, Reply::Type::kString);
  EXPECT_EQ(replies[0].str, body);
}

TEST(RespParserTest, ParsesNestedArraysWithNullsAndErrors) {
  auto replies = ParseAll("*4\r\n:1\r\n*2\r\n$1\r\na\r\n$-1\r\n-ERR inner\r\n*-1\r\n*0\r\n");
  ASSERT_EQ(replies.size(), 2u);
  EXPECT_EQ(replies[0], Reply::Array({Reply::Integer(1), Reply::Array({Reply::String("a"), Reply::Nil()}),
                                      Reply::Error("ERR inner"), Reply::Nil()}));
  EXPECT_EQ(replies[1], Reply::Array({}));
}

TEST(RespParserTest, ByteByByteFeedingGivesTheSameReplies) {
  const std::string wire = "*3\r\n$3\r\nfoo\r\n*1\r\n:5\r\n$-1\r\n+PONG\r\n$4\r\n\r\n\r\n\r\n";
  RespParser p;
  std::vector<Reply> got;
  for (char c : wire) {
    p.Feed(&c, 1);
    for (auto& r : ParseAll(p)) got.push_back(std::move(r));
  }
  EXPECT_EQ(got, ParseAll(wire));
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[2], Reply::String("\r\n\r\n"));
  EXPECT_EQ(p.buffered(), 0u);
}

TEST(RespParserTest, IncompleteInputAsksForMore) {
  RespParser p;
  Reply r;
  p.Feed("$10\r\nabc");
  EXPECT_EQ(p.Next(&r), Result::kNeedMore);
  p.Feed("defghij\r");
  EXPECT_EQ(p.Next(&r), Result::kNeedMore);
  p.Feed("\n");
  ASSERT_EQ(p.Next(&r), Result::kReply);
  EXPECT_EQ(r, Reply::String("abcdefghij"));
  EXPECT_EQ(p.Next(&r), Result::kNeedMore);
}

TEST(RespParserTest, ProtocolErrorsAreFinal) {
  for (std::string_view bad : {"?x\r\n", "$abc\r\n", "$-2\r\n", "*-5\r\n", ":12a\r\n", "$3\r\nabcde\r\n",
                               "+OK\rX", "\r\n"}) {
    RespParser p;
    p.Feed(bad);
    Reply r;
    EXPECT_EQ(p.Next(&r), Result::kError) << bad;
    EXPECT_FALSE(p.error().empty());
    p.Feed("+OK\r\n");
    EXPECT_EQ(p.Next(&r), Result::kError) << "must stay failed after " << bad;
  }
}

TEST(RespParserTest, EnforcesLimits) {
  RespParser::Limits limits;
  limits.max_bulk = 8;
  limits.max_elements = 4;
  limits.max_depth = 2;
  limits.max_line = 16;
  Reply r;
  {
    RespParser p(limits);
    p.Feed("$9\r\n");
    EXPECT_EQ(p.Next(&r), Result::kError);
  }
  {
    RespParser p(limits);
    p.Feed("*5\r\n");
    EXPECT_EQ(p.Next(&r), Result::kError);
  }
  {
    RespParser p(limits);
    p.Feed("*1\r\n*1\r\n*1\r\n:1\r\n");
    EXPECT_EQ(p.Next(&r), Result::kError);
  }
  {
    RespParser p(limits);
    p.Feed("+" + std::string(40, 'x'));
    EXPECT_EQ(p.Next(&r), Result::kError);
  }
  {
    RespParser p(limits);
    p.Feed("*2\r\n*1\r\n$8\r\n12345678\r\n:1\r\n");
    ASSERT_EQ(p.Next(&r), Result::kReply);
    EXPECT_EQ(r, Reply::Array({Reply::Array({Reply::String("12345678")}), Reply::Integer(1)}));
  }
}

// Found by fuzz/resp_fuzz.cc: a line of exactly max_line bytes was refused
// when its CR arrived in one read and its LF in the next.
TEST(RespParserTest, LineOfMaxLengthIsAcceptedWhenItsCrlfArrivesSplit) {
  RespParser::Limits limits;
  limits.max_line = 16;
  const std::string line = "+" + std::string(15, 'x');
  for (const bool split : {false, true}) {
    RespParser p(limits);
    Reply r;
    if (split) {
      p.Feed(line + "\r");
      EXPECT_EQ(p.Next(&r), Result::kNeedMore);
      p.Feed("\n");
    } else {
      p.Feed(line + "\r\n");
    }
    ASSERT_EQ(p.Next(&r), Result::kReply) << "split " << split << ": " << p.error();
    EXPECT_EQ(r, Reply::StatusReply(std::string(15, 'x')));
  }
  RespParser p(limits);
  Reply r;
  p.Feed(line + "x\r");
  EXPECT_EQ(p.Next(&r), Result::kError);
}

TEST(RespParserTest, ALineArrivingByteByByteIsSearchedOnce) {
  // A long status line, then a second reply, fed one byte at a time with a
  // Next() after each: every byte is searched for the line's end about once,
  // not once per read (which was quadratic: ~n²/2 bytes for an n-byte line).
  const std::string line = "+" + std::string(60000, 'a');
  const std::string wire = line + "\r\n:7\r\n";
  RespParser p;
  std::vector<Reply> replies;
  for (const char c : wire) {
    p.Feed(&c, 1);
    Reply r;
    while (p.Next(&r) == Result::kReply) replies.push_back(std::move(r));
  }
  ASSERT_EQ(replies.size(), 2u) << p.error();
  EXPECT_EQ(replies[0], Reply::StatusReply(std::string(60000, 'a')));
  EXPECT_EQ(replies[1], Reply::Integer(7));
  EXPECT_LE(p.bytes_searched(), 2 * wire.size());
  EXPECT_EQ(p.buffered(), 0u);

  // A CR that arrives last is searched again once its LF is there; a CR in
  // the middle of a line still ends it (and fails on the missing LF).
  RespParser q;
  Reply r;
  q.Feed("+ab\r");
  EXPECT_EQ(q.Next(&r), Result::kNeedMore);
  q.Feed("x");
  EXPECT_EQ(q.Next(&r), Result::kError);
  EXPECT_EQ(q.error(), "resp: CR not followed by LF");
}

TEST(RespParserTest, EncodedRepliesRoundTrip) {
  const Reply value = Reply::Array({Reply::String(std::string("\0\1\2", 3)), Reply::Nil(), Reply::Integer(-1),
                                    Reply::StatusReply("QUEUED"), Reply::Error("MOVED 1 h:1"),
                                    Reply::Array({Reply::Array({})})});
  std::string wire;
  AppendReply(&wire, value);
  auto replies = ParseAll(wire);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0], value);
}

// hiredis' own reader as an oracle: random replies, split at random points.
Reply FromHiredis(const redisReply* r) {
  switch (r->type) {
    case REDIS_REPLY_STRING: return Reply::String(std::string(r->str, r->len));
    case REDIS_REPLY_STATUS: return Reply::StatusReply(std::string(r->str, r->len));
    case REDIS_REPLY_ERROR: return Reply::Error(std::string(r->str, r->len));
    case REDIS_REPLY_INTEGER: return Reply::Integer(r->integer);
    case REDIS_REPLY_ARRAY: {
      std::vector<Reply> e;
      for (size_t i = 0; i < r->elements; ++i) e.push_back(FromHiredis(r->element[i]));
      return Reply::Array(std::move(e));
    }
    default: return Reply::Nil();
  }
}

Reply RandomReply(std::mt19937& rng, int depth) {
  std::uniform_int_distribution<int> kind(0, depth < 4 ? 5 : 4);
  std::uniform_int_distribution<int> len(0, 40);
  std::uniform_int_distribution<int> byte(0, 255);
  auto text = [&](bool binary) {
    std::string s;
    const int n = len(rng);
    for (int i = 0; i < n; ++i) {
      char c = static_cast<char>(byte(rng));
      if (!binary && (c == '\r' || c == '\n')) c = 'x';
      s.push_back(c);
    }
    return s;
  };
  switch (kind(rng)) {
    case 0: return Reply::String(text(true));
    case 1: return Reply::StatusReply(text(false));
    case 2: return Reply::Error(text(false));
    case 3: return Reply::Integer(std::uniform_int_distribution<std::int64_t>(-1'000'000'000'000, 1'000'000'000'000)(rng));
    case 4: return Reply::Nil();
    default: {
      std::vector<Reply> e;
      const int n = std::uniform_int_distribution<int>(0, 5)(rng);
      for (int i = 0; i < n; ++i) e.push_back(RandomReply(rng, depth + 1));
      return Reply::Array(std::move(e));
    }
  }
}

TEST(RespParserTest, AgreesWithHiredisOnRandomStreams) {
  std::mt19937 rng(20240611);
  for (int round = 0; round < 200; ++round) {
    std::vector<Reply> sent;
    std::string wire;
    const int n = std::uniform_int_distribution<int>(1, 8)(rng);
    for (int i = 0; i < n; ++i) {
      sent.push_back(RandomReply(rng, 0));
      AppendReply(&wire, sent.back());
    }
    RespParser ours;
    redisReader* theirs = redisReaderCreate();
    std::vector<Reply> got_ours, got_theirs;
    std::size_t pos = 0;
    while (pos < wire.size()) {
      const std::size_t chunk =
          std::min<std::size_t>(wire.size() - pos, std::uniform_int_distribution<std::size_t>(1, 64)(rng));
      ours.Feed(wire.data() + pos, chunk);
      ASSERT_EQ(redisReaderFeed(theirs, wire.data() + pos, chunk), REDIS_OK);
      pos += chunk;
      for (auto& r : ParseAll(ours)) got_ours.push_back(std::move(r));
      void* reply = nullptr;
      while (redisReaderGetReply(theirs, &reply) == REDIS_OK && reply != nullptr) {
        got_theirs.push_back(FromHiredis(static_cast<redisReply*>(reply)));
        freeReplyObject(reply);
        reply = nullptr;
      }
    }
    redisReaderFree(theirs);
    ASSERT_EQ(got_ours, sent) << "round " << round;
    ASSERT_EQ(got_theirs, sent) << "round " << round;
  }
}

TEST(RespErrorTest, ErrorCodesMapToStatus) {
  EXPECT_EQ(StatusFromErrorReply("OOM command not allowed").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(StatusFromErrorReply("LOADING Redis is loading").code(), StatusCode::kUnavailable);
  EXPECT_EQ(StatusFromErrorReply("CLUSTERDOWN The cluster is down").code(), StatusCode::kUnavailable);
  EXPECT_EQ(StatusFromErrorReply("NOAUTH Authentication required.").code(), StatusCode::kUnavailable);
  EXPECT_EQ(StatusFromErrorReply("BUSY Redis is busy running a script").code(), StatusCode::kUnavailable);
  EXPECT_EQ(StatusFromErrorReply("ERR unknown command").code(), StatusCode::kInternal);
  EXPECT_NE(StatusFromErrorReply("ERR unknown command").message().find("ERR unknown command"), std::string::npos);
}

TEST(RespErrorTest, IsErrorCodeMatchesWholeFirstWord) {
  EXPECT_TRUE(Reply::Error("MOVED 1 a:1").IsErrorCode("MOVED"));
  EXPECT_TRUE(Reply::Error("NOSCRIPT").IsErrorCode("NOSCRIPT"));
  EXPECT_FALSE(Reply::Error("MOVEDX 1").IsErrorCode("MOVED"));
  EXPECT_FALSE(Reply::StatusReply("MOVED 1 a:1").IsErrorCode("MOVED"));
}

}  // namespace
}  // namespace idemgate::store::redis
