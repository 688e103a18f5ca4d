#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

// RESP2, the Redis wire protocol: command encoding and an incremental,
// bounded reply parser. Sans-io: nothing here touches a socket.
namespace idemgate::store::redis {

// One reply as sent by the server. Errors from the server (`-ERR ...`) are
// values of type kError, not a failed Status: the caller decides what they mean.
struct Reply {
  enum class Type : std::uint8_t { kString, kStatus, kError, kInteger, kNil, kArray };

  Type type = Type::kNil;
  std::string str;               // kString (binary-safe), kStatus, kError
  std::int64_t integer = 0;      // kInteger
  std::vector<Reply> elements;   // kArray

  static Reply String(std::string s) { return {Type::kString, std::move(s), 0, {}}; }
  static Reply StatusReply(std::string s) { return {Type::kStatus, std::move(s), 0, {}}; }
  static Reply Error(std::string s) { return {Type::kError, std::move(s), 0, {}}; }
  static Reply Integer(std::int64_t v) { return {Type::kInteger, {}, v, {}}; }
  static Reply Nil() { return {}; }
  static Reply Array(std::vector<Reply> e) { return {Type::kArray, {}, 0, std::move(e)}; }

  bool is_error() const { return type == Type::kError; }
  bool is_nil() const { return type == Type::kNil; }
  // kError whose message starts with `prefix` followed by a space or the end
  // ("MOVED 12 h:p" matches "MOVED").
  bool IsErrorCode(std::string_view prefix) const;
  // For logs and test failures: `"abc"`, `(error) ERR x`, `[1, nil]`.
  std::string DebugString() const;

  friend bool operator==(const Reply&, const Reply&) = default;
};

// Appends `args` as one command (an array of bulk strings) to `out`. With
// `arg_offset`, stores where the bytes of args[arg] start in `out`.
void AppendCommand(std::string* out, const std::vector<std::string>& args, std::size_t arg = 0,
                   std::size_t* arg_offset = nullptr);
std::string EncodeCommand(const std::vector<std::string>& args);

// Encodes a reply as a server would (for tests and fakes).
void AppendReply(std::string* out, const Reply& reply);

// Maps a server error reply onto the house Status codes: OOM ->
// ResourceExhausted; LOADING, BUSY, CLUSTERDOWN, TRYAGAIN, MASTERDOWN,
// READONLY, NOAUTH, WRONGPASS -> Unavailable; anything else -> Internal.
Status StatusFromErrorReply(std::string_view error);

// Incremental parser: feed bytes as they arrive, take replies out in order.
// A protocol error (bad type byte, bad length, limits exceeded) is final: the
// stream is out of sync and the connection must be dropped.
// Not thread-safe; one per connection.
class RespParser {
 public:
  struct Limits {
    std::size_t max_bulk = 512u * 1024 * 1024;  // Redis' proto-max-bulk-len default
    std::size_t max_elements = 1u << 24;        // per array
    std::size_t max_depth = 32;                 // nested arrays
    std::size_t max_line = 64u * 1024;          // status/error/length lines
  };

  RespParser() = default;
  explicit RespParser(Limits limits) : limits_(limits) {}

  void Feed(const char* data, std::size_t n);
  void Feed(std::string_view data) { Feed(data.data(), data.size()); }

  enum class Result { kReply, kNeedMore, kError };
  // kReply: `*out` holds the next reply. kNeedMore: feed more bytes.
  // kError: see error(); every later call returns kError too.
  Result Next(Reply* out);

  const std::string& error() const { return error_; }
  // Bytes fed but not yet consumed by a complete reply (for tests).
  std::size_t buffered() const { return buf_.size() - pos_; }
  // Bytes searched for a line's end so far (for tests): an incomplete line
  // is searched only from where the last search stopped, so this stays
  // linear in the bytes fed however they are cut up.
  std::uint64_t bytes_searched() const { return bytes_searched_; }

 private:
  struct Frame {
    Reply array;
    std::size_t expected = 0;
  };

  Result Fail(std::string message);
  // Hands a finished value to the innermost open array, or returns true
  // when it is a complete top-level reply (then moved into *out).
  bool Deliver(Reply value, Reply* out);
  void Compact();

  Limits limits_;
  std::string buf_;
  std::size_t pos_ = 0;
  std::vector<Frame> stack_;
  std::int64_t pending_bulk_ = -1;  // >= 0: waiting for this many bytes + CRLF
  // Bytes after pos_ already known to hold no CR that ends a line.
  std::size_t line_searched_ = 0;
  std::uint64_t bytes_searched_ = 0;
  std::string error_;
};

}  // namespace idemgate::store::redis
