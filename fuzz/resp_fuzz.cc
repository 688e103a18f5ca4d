// RESP2 replies as a Redis server (or anything that answers on its port)
// sends them: RespParser::Feed/Next, and the command encoder. The first byte
// picks the parser limits, how the bytes are cut into Feed calls and the
// argument separator; the rest is the stream. Checked:
// - fed whole or in fuzz-chosen pieces, the parser gives the same replies in
//   the same order and ends the same way (need more, or a final error);
// - every reply is within the limits (bulk and line sizes, array sizes and
//   nesting), and the bytes it leaves buffered are bounded by them, so a
//   peer cannot grow memory past the limits or nest the stack deeper;
// - an error is final and every reply re-encodes (AppendReply) to bytes that
//   parse back to the same reply;
// - the rest, cut at the separator into arguments, encodes (EncodeCommand,
//   AppendCommand after other bytes) to one array of the same bulk strings,
//   with arg_offset pointing at the argument's bytes.

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_target.h"
#include "store/redis/resp.h"

namespace redis = idemgate::store::redis;
using redis::Reply;
using redis::RespParser;

namespace {

struct Outcome {
  std::vector<Reply> replies;
  RespParser::Result end = RespParser::Result::kNeedMore;
};

RespParser::Limits LimitsFor(unsigned variant) {
  RespParser::Limits limits;
  switch (variant) {
    case 1:  // tiny: every limit is within reach of a short input
      limits.max_bulk = 8;
      limits.max_elements = 4;
      limits.max_depth = 2;
      limits.max_line = 8;
      break;
    case 2:
      limits.max_bulk = 200;
      limits.max_elements = 16;
      limits.max_depth = 6;
      limits.max_line = 40;
      break;
    case 3:  // no nesting, the shortest lines
      limits.max_bulk = 0;
      limits.max_elements = 1;
      limits.max_depth = 1;
      limits.max_line = 3;
      break;
    default: break;
  }
  return limits;
}

// Takes every reply out; returns how the parser stopped.
RespParser::Result Drain(RespParser& parser, std::vector<Reply>& replies) {
  for (;;) {
    Reply reply;
    const RespParser::Result r = parser.Next(&reply);
    if (r != RespParser::Result::kReply) return r;
    replies.push_back(std::move(reply));
  }
}

// Checks the limits on a reply at array nesting `depth` (0: top level).
void CheckWithinLimits(const Reply& reply, const RespParser::Limits& limits, std::size_t depth) {
  switch (reply.type) {
    case Reply::Type::kString:
      FUZZ_CHECK(reply.str.size() <= limits.max_bulk);
      break;
    case Reply::Type::kStatus:
    case Reply::Type::kError:
      // The line is the type byte and the text.
      FUZZ_CHECK(reply.str.size() + 1 <= limits.max_line);
      FUZZ_CHECK(reply.str.find('\r') == std::string::npos);
      break;
    case Reply::Type::kArray:
      // Opening an array needs a free level; an empty one opens none, so it
      // may sit one level below the deepest allowed array.
      FUZZ_CHECK(reply.elements.empty() ? depth <= limits.max_depth : depth < limits.max_depth);
      FUZZ_CHECK(reply.elements.size() <= limits.max_elements);
      for (const Reply& e : reply.elements) CheckWithinLimits(e, limits, depth + 1);
      break;
    case Reply::Type::kInteger:
    case Reply::Type::kNil:
      FUZZ_CHECK(reply.str.empty() && reply.elements.empty());
      break;
  }
}

// The array nesting of a reply (a scalar is 0).
std::size_t Depth(const Reply& reply) {
  std::size_t deepest = 0;
  for (const Reply& e : reply.elements) deepest = std::max(deepest, Depth(e));
  return reply.type == Reply::Type::kArray ? deepest + 1 : 0;
}

void CheckEncoding(std::string_view rest, char separator) {
  std::vector<std::string> args;
  for (;;) {
    const std::size_t end = rest.find(separator);
    args.emplace_back(rest.substr(0, end));
    if (end == std::string_view::npos) break;
    rest.remove_prefix(end + 1);
  }
  if (args.size() == 1 && args[0].empty()) args.clear();  // also a command of no arguments

  const std::string wire = redis::EncodeCommand(args);
  std::vector<Reply> strings;
  for (const std::string& a : args) strings.push_back(Reply::String(a));
  const Reply expected = Reply::Array(std::move(strings));
  std::string as_reply;
  redis::AppendReply(&as_reply, expected);
  FUZZ_CHECK(wire == as_reply);  // a command is exactly an array of bulk strings

  RespParser parser;
  parser.Feed(wire);
  Reply got;
  FUZZ_CHECK(parser.Next(&got) == RespParser::Result::kReply);
  FUZZ_CHECK(got == expected);
  FUZZ_CHECK(parser.buffered() == 0);
  FUZZ_CHECK(parser.Next(&got) == RespParser::Result::kNeedMore);

  // Pipelined after other bytes, with the offset of one argument.
  if (args.empty()) return;
  const std::size_t arg = args.size() - 1;
  std::string pipelined = "*1\r\n$4\r\nPING\r\n";
  const std::size_t before = pipelined.size();
  std::size_t offset = 0;
  redis::AppendCommand(&pipelined, args, arg, &offset);
  FUZZ_CHECK(std::string_view(pipelined).substr(before) == wire);
  FUZZ_CHECK(offset >= before && offset + args[arg].size() + 2 <= pipelined.size());
  FUZZ_CHECK(std::string_view(pipelined).substr(offset, args[arg].size()) == args[arg]);
}

}  // namespace

IDEMGATE_FUZZ_TARGET(resp) {
  if (size == 0) return 0;
  const std::uint8_t control = data[0];
  const RespParser::Limits limits = LimitsFor(control & 0x03);
  // 0..7 piece sizes follow the control byte; the pieces cycle through them.
  const std::size_t n_sizes = std::min<std::size_t>((control >> 2) & 0x07, size - 1);
  const std::uint8_t* sizes = data + 1;
  const std::string_view stream = idemgate::fuzz::AsView(data + 1 + n_sizes, size - 1 - n_sizes);

  Outcome whole;
  {
    RespParser parser(limits);
    parser.Feed(stream);
    whole.end = Drain(parser, whole.replies);
    FUZZ_CHECK(whole.end != RespParser::Result::kReply);
    if (whole.end == RespParser::Result::kError) {
      FUZZ_CHECK(parser.error().starts_with("resp: "));
      FUZZ_CHECK(parser.buffered() == 0);
      Reply again;
      parser.Feed("+OK\r\n");  // ignored: the stream is out of sync for good
      FUZZ_CHECK(parser.Next(&again) == RespParser::Result::kError);
      FUZZ_CHECK(parser.buffered() == 0);
    } else {
      FUZZ_CHECK(parser.error().empty());
      // Waiting for the rest of one line (the CR may be there already) or of
      // one bulk string and its CRLF: nothing else is kept.
      FUZZ_CHECK(parser.buffered() <= std::max(limits.max_line + 1, limits.max_bulk + 1));
    }
  }

  Outcome split;
  {
    RespParser parser(limits);
    std::size_t at = 0;
    std::size_t i = 0;
    split.end = RespParser::Result::kNeedMore;
    while (at < stream.size() && split.end != RespParser::Result::kError) {
      std::size_t piece = n_sizes == 0 ? 1 : std::max<std::size_t>(1, sizes[i++ % n_sizes]);
      piece = std::min(piece, stream.size() - at);
      parser.Feed(stream.data() + at, piece);
      at += piece;
      split.end = Drain(parser, split.replies);
    }
    if (stream.empty()) split.end = Drain(parser, split.replies);
  }
  FUZZ_CHECK(split.end == whole.end);
  FUZZ_CHECK(split.replies == whole.replies);

  for (const Reply& reply : whole.replies) {
    CheckWithinLimits(reply, limits, 0);
    FUZZ_CHECK(Depth(reply) <= limits.max_depth + 1);
    std::string wire;
    redis::AppendReply(&wire, reply);
    RespParser parser;
    parser.Feed(wire);
    Reply back;
    FUZZ_CHECK(parser.Next(&back) == RespParser::Result::kReply);
    // A nil array (*-1) comes back as the nil bulk string: RESP2 has one nil.
    FUZZ_CHECK(back == reply);
    FUZZ_CHECK(parser.buffered() == 0);
  }

  CheckEncoding(stream, "\n\0 \r,*$:"[control >> 5]);
  return 0;
}
